//! The MCP hosts mcpd imports from and connects: where each keeps its
//! servers on Linux, and how an entry reads (DESIGN §11).
//!
//! Sources, from each host's own documentation:
//! - Claude Desktop: <https://modelcontextprotocol.io/docs/develop/connect-local-servers>
//!   (`mcpServers` with `command`, `args`, `env`; the Linux path is the
//!   app's Electron user-data directory, `~/.config/Claude`, which the docs
//!   do not spell out; no interpolation).
//! - Claude Code: <https://code.claude.com/docs/en/mcp> (user scope: the
//!   top-level `mcpServers` of `~/.claude.json`; local scope:
//!   `projects["/abs/path"].mcpServers` there; project scope `.mcp.json`;
//!   `type` `stdio` | `http` | `streamable-http` | `sse` | `ws`, a `url`
//!   needs a `type`; `${VAR}` and `${VAR:-default}`; per-project
//!   `disabledMcpServers`).
//! - Cursor: <https://cursor.com/docs/mcp> (`~/.cursor/mcp.json`,
//!   `.cursor/mcp.json`; `command`, `args`, `env`, `envFile`, or `url` and
//!   `headers`; `${env:NAME}`, `${userHome}`, `${workspaceFolder}`,
//!   `${workspaceFolderBasename}`, `${pathSeparator}`, `${/}`).
//! - VS Code: <https://code.visualstudio.com/docs/copilot/reference/mcp-configuration>
//!   (`servers` in the profile's `mcp.json`, `~/.config/Code/User/mcp.json`,
//!   and `.vscode/mcp.json`; `type` `stdio` | `http` | `sse`; `envFile`;
//!   `${input:id}` prompts; `${env:NAME}`, `${workspaceFolder}`,
//!   `${userHome}`; JSON with comments; the old `settings.json` `mcp`
//!   block is migrated by VS Code 1.102 and not read here).
//! - Windsurf: <https://docs.windsurf.com/windsurf/cascade/mcp>
//!   (`~/.codeium/windsurf/mcp_config.json`, `mcpServers`; `serverUrl` or
//!   `url`; `${env:NAME}` (empty when unset), `${file:PATH}`; the UI's
//!   `"disabled": true`).
//! - Gemini CLI: <https://geminicli.com/docs/tools/mcp-server> and
//!   <https://geminicli.com/docs/reference/configuration>
//!   (`~/.gemini/settings.json`, `.gemini/settings.json`; `mcpServers` with
//!   `command`, `args`, `env`, `cwd`, or `httpUrl` (Streamable HTTP) /
//!   `url` (SSE) and `headers`; `$VAR`, `${VAR}`, `${VAR:-default}`;
//!   `includeTools`, `excludeTools` (excluded wins); `mcp.excluded`; JSON
//!   with comments).
//! - Codex CLI: <https://developers.openai.com/codex/mcp> and
//!   `openai/codex` `docs/config.md` (`$CODEX_HOME/config.toml`, by
//!   default `~/.codex/config.toml`, and a trusted project's
//!   `.codex/config.toml`; `[mcp_servers.NAME]` with `command`, `args`,
//!   `env`, `env_vars`, `cwd`, or `url`, `bearer_token_env_var`,
//!   `http_headers`, `env_http_headers`; `enabled = false`;
//!   `enabled_tools`, `disabled_tools` (applied after it); no
//!   interpolation).

use std::path::{Path, PathBuf};

use serde_json::Value;

/// An MCP host application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Host {
    ClaudeDesktop,
    ClaudeCode,
    Cursor,
    VsCode,
    Windsurf,
    Gemini,
    Codex,
}

/// How a host expands variables in its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// None: every `$` is literal.
    Plain,
    /// `${VAR}`, `${VAR:-default}` (Claude Code).
    Shell,
    /// `$VAR` too (Gemini CLI).
    ShellBare,
    /// `${env:NAME}`, `${userHome}`, `${workspaceFolder}`, `${input:id}`,
    /// … (Cursor, VS Code).
    Editor,
    /// `${env:NAME}` (empty when unset), `${file:PATH}` (Windsurf).
    Windsurf,
}

impl Host {
    pub const ALL: [Host; 7] = [
        Host::ClaudeDesktop,
        Host::ClaudeCode,
        Host::Cursor,
        Host::VsCode,
        Host::Windsurf,
        Host::Gemini,
        Host::Codex,
    ];

    /// As `mcpctl import` and `connect` name it.
    pub fn name(self) -> &'static str {
        match self {
            Host::ClaudeDesktop => "claude-desktop",
            Host::ClaudeCode => "claude-code",
            Host::Cursor => "cursor",
            Host::VsCode => "vscode",
            Host::Windsurf => "windsurf",
            Host::Gemini => "gemini",
            Host::Codex => "codex",
        }
    }

    pub fn by_name(name: &str) -> Option<Host> {
        Host::ALL.into_iter().find(|h| h.name() == name)
    }

    pub fn syntax(self) -> Syntax {
        match self {
            Host::ClaudeDesktop | Host::Codex => Syntax::Plain,
            Host::ClaudeCode => Syntax::Shell,
            Host::Gemini => Syntax::ShellBare,
            Host::Cursor | Host::VsCode => Syntax::Editor,
            Host::Windsurf => Syntax::Windsurf,
        }
    }

    /// The key of the object that holds the servers (JSON hosts).
    fn servers_key(self) -> &'static str {
        match self {
            Host::VsCode => "servers",
            _ => "mcpServers",
        }
    }

    /// Its files on Linux: the user's first (the one `connect` edits),
    /// then the project's in `project`.
    pub fn files(self, dirs: &Dirs) -> Vec<PathBuf> {
        let home = &dirs.home;
        let config = &dirs.config;
        let project = &dirs.project;
        match self {
            Host::ClaudeDesktop => vec![config.join("Claude/claude_desktop_config.json")],
            Host::ClaudeCode => vec![home.join(".claude.json"), project.join(".mcp.json")],
            Host::Cursor => vec![
                home.join(".cursor/mcp.json"),
                project.join(".cursor/mcp.json"),
            ],
            Host::VsCode => vec![
                config.join("Code/User/mcp.json"),
                project.join(".vscode/mcp.json"),
            ],
            Host::Windsurf => vec![home.join(".codeium/windsurf/mcp_config.json")],
            Host::Gemini => vec![
                home.join(".gemini/settings.json"),
                project.join(".gemini/settings.json"),
            ],
            Host::Codex => vec![
                dirs.codex.join("config.toml"),
                project.join(".codex/config.toml"),
            ],
        }
    }

    /// The host whose file `path` is, from its name and place, or from
    /// what it holds (`servers` is VS Code's key).
    pub fn detect(path: &Path, text: &str) -> Host {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let parent = path
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("");
        match (parent, name) {
            (_, "claude_desktop_config.json") => Host::ClaudeDesktop,
            (_, ".claude.json" | ".mcp.json") => Host::ClaudeCode,
            (".cursor", _) => Host::Cursor,
            (".vscode", _) => Host::VsCode,
            (".gemini", _) => Host::Gemini,
            (_, "mcp_config.json") => Host::Windsurf,
            _ if name.ends_with(".toml") => Host::Codex,
            _ => {
                let vscode = parse_json(text)
                    .ok()
                    .is_some_and(|v| v.get("servers").is_some() && v.get("mcpServers").is_none());
                if vscode {
                    Host::VsCode
                } else {
                    Host::ClaudeDesktop
                }
            }
        }
    }
}

/// Where a user's files are.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub home: PathBuf,
    /// `$XDG_CONFIG_HOME`, or `~/.config`.
    pub config: PathBuf,
    /// `$CODEX_HOME`, or `~/.codex`.
    pub codex: PathBuf,
    /// The project (the working directory) for project-level files.
    pub project: PathBuf,
}

/// A server as a host wrote it, its variables not yet expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its name in the host's file.
    pub name: String,
    pub host: Host,
    pub file: PathBuf,
    /// The directory `${workspaceFolder}` and relative paths mean: the
    /// project a project-level file (or a Claude Code local-scope entry)
    /// belongs to; the home directory for a user-level one.
    pub base: PathBuf,
    pub server: Server,
    /// Turned off in the host (not imported).
    pub disabled: bool,
    /// The host's own filter of the server's tools.
    pub tools: Tools,
}

/// Which of a server's tools a host lets its model use: Gemini CLI's
/// `includeTools`/`excludeTools`, Codex's `enabled_tools`/`disabled_tools`
/// (tool names; the exclusion wins in both, as in a unit's `tools`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tools {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
}

/// What an entry runs or reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Server {
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<String>,
        env_file: Option<String>,
        /// Variables passed through from the host's environment (Codex
        /// `env_vars`).
        pass: Vec<String>,
    },
    Remote {
        url: String,
        sse: bool,
        headers: Vec<(String, HeaderValue)>,
        /// The host logs in to it itself (DESIGN §17, "Adoption").
        oauth: Option<HostOAuth>,
    },
    /// Neither: why it cannot be imported.
    Unusable(String),
}

/// A remote entry the host authorizes itself with OAuth: Claude Code's
/// `oauth` key (`clientId`, `callbackPort`, `scopes`), Gemini CLI's
/// `oauth` key (`clientId`, `scopes`) or `authProviderType`. Its client
/// secret, if any, is in the host's keychain, never in the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostOAuth {
    pub client_id: Option<String>,
    /// The fixed loopback port the provider registered for its redirect.
    pub redirect_port: Option<u16>,
    /// Space-separated.
    pub scope: Option<String>,
}

/// The host's own OAuth of a JSON entry, if it has one.
fn host_oauth(host: Host, value: &Value) -> Option<HostOAuth> {
    let oauth = value.get("oauth");
    let provider = value.get("authProviderType").and_then(Value::as_str);
    let own = match host {
        Host::ClaudeCode => oauth.is_some_and(Value::is_object),
        // Gemini CLI: `oauth` (not `"enabled": false`), or
        // `authProviderType` `dynamic_discovery` (its Google ones are
        // refused by the caller).
        Host::Gemini => {
            oauth.is_some_and(|o| o.get("enabled").and_then(Value::as_bool) != Some(false))
                || provider == Some("dynamic_discovery")
        }
        _ => false,
    };
    if !own {
        return None;
    }
    let oauth = oauth.unwrap_or(&Value::Null);
    let scope = match oauth.get("scopes") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(a)) => Some(
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    }
    .filter(|s| !s.trim().is_empty());
    Some(HostOAuth {
        client_id: oauth
            .get("clientId")
            .and_then(Value::as_str)
            .map(str::to_owned),
        redirect_port: oauth
            .get("callbackPort")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0),
        scope,
    })
}

/// A remote entry's header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValue {
    /// Written in the file (variables not yet expanded).
    Text(String),
    /// From an environment variable of the host's (Codex), with a prefix
    /// (`Bearer `).
    Env { var: String, prefix: &'static str },
}

/// A host file that is not what its format says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// JSON as the hosts accept it: comments and trailing commas allowed
/// (VS Code and Gemini CLI document comments; strict JSON passes too).
fn parse_json(text: &str) -> Result<Value, FileError> {
    let options = jsonc_parser::ParseOptions {
        allow_comments: true,
        allow_loose_object_property_names: false,
        allow_trailing_commas: true,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        ..Default::default()
    };
    match jsonc_parser::parse_to_serde_value::<Value>(text, &options) {
        Ok(value) => Ok(value),
        Err(e) => {
            let (line, column) = line_column(text, e.range().start);
            Err(FileError {
                line,
                column,
                message: e.kind().to_string(),
            })
        }
    }
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// What `${workspaceFolder}` and relative paths mean in `host`'s file
/// `path`: the home directory for a user-level file, else the project the
/// file belongs to.
pub fn base_of(host: Host, path: &Path, dirs: &Dirs) -> PathBuf {
    let user_level = host.files(dirs).first().is_some_and(|f| f == path);
    if user_level || matches!(host, Host::ClaudeDesktop | Host::Windsurf) {
        dirs.home.clone()
    } else {
        project_of(path)
    }
}

/// The entries of `host`'s file `path` (its text `text`), relative to `base`
/// ([`base_of`]).
pub fn read(host: Host, path: &Path, text: &str, base: &Path) -> Result<Vec<Entry>, FileError> {
    if host == Host::Codex {
        return read_codex(path, text, base);
    }
    let root = parse_json(text)?;
    let mut entries = Vec::new();
    let mut from = |servers: &Value, base: &Path, disabled: &[String]| {
        if let Some(servers) = servers.as_object() {
            for (name, value) in servers {
                let mut entry = json_entry(host, name, value);
                entry.disabled |= disabled.contains(name);
                entries.push(Entry {
                    name: name.clone(),
                    host,
                    file: path.to_owned(),
                    base: base.to_owned(),
                    ..entry
                });
            }
        }
    };
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let excluded = match host {
        // `mcp.excluded`, and the older flat `excludeMcpServers`.
        Host::Gemini => {
            let mut names = strings(root.get("mcp").and_then(|m| m.get("excluded")));
            names.extend(strings(root.get("excludeMcpServers")));
            names
        }
        _ => Vec::new(),
    };
    if let Some(servers) = root.get(host.servers_key()) {
        from(servers, base, &excluded);
    }
    if host == Host::ClaudeCode
        && let Some(projects) = root.get("projects").and_then(Value::as_object)
    {
        // Local scope: each project's own servers.
        for (dir, project) in projects {
            if let Some(servers) = project.get("mcpServers") {
                let disabled = strings(project.get("disabledMcpServers"));
                from(servers, Path::new(dir), &disabled);
            }
        }
    }
    Ok(entries)
}

/// The project a project-level file belongs to: the directory holding
/// `.vscode/`, `.cursor/`, … or the file (`.mcp.json`).
fn project_of(path: &Path) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let hidden = dir
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.'));
    if hidden {
        dir.parent().unwrap_or(dir).to_owned()
    } else {
        dir.to_owned()
    }
}

fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn pairs(value: Option<&Value>) -> Vec<(String, String)> {
    value
        .and_then(Value::as_object)
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| text_of(v).map(|v| (k.clone(), v)))
                .collect()
        })
        .unwrap_or_default()
}

/// One JSON entry (its name and place are filled in by the caller).
fn json_entry(host: Host, name: &str, value: &Value) -> Entry {
    let get = |key: &str| value.get(key);
    let string = |key: &str| get(key).and_then(Value::as_str).map(str::to_owned);
    let texts = |key: &str| -> Vec<String> {
        get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(text_of).collect())
            .unwrap_or_default()
    };
    let kind = string("type").or_else(|| string("transport"));
    let disabled = get("disabled").and_then(Value::as_bool) == Some(true)
        || get("enabled").and_then(Value::as_bool) == Some(false);
    let http_url = string("httpUrl").or_else(|| string("serverUrl"));
    let server = if !value.is_object() {
        Server::Unusable("the entry is not an object".into())
    } else if let Some(command) = string("command") {
        Server::Stdio {
            command,
            args: texts("args"),
            env: pairs(get("env")),
            cwd: string("cwd"),
            env_file: string("envFile"),
            pass: Vec::new(),
        }
    } else if let Some(provider) =
        string("authProviderType").filter(|p| host == Host::Gemini && p != "dynamic_discovery")
    {
        Server::Unusable(format!(
            "it logs in with Google credentials (authProviderType {provider}), which mcpd cannot"
        ))
    } else if let Some(url) = http_url.clone().or_else(|| string("url")) {
        let sse = match kind.as_deref() {
            Some("sse") => true,
            Some("ws") => {
                return unusable(
                    host,
                    name,
                    "it uses the WebSocket transport, which mcpd does not speak",
                );
            }
            // Gemini CLI: `url` alone is an SSE endpoint, `httpUrl` HTTP.
            None if host == Host::Gemini => http_url.is_none(),
            _ => false,
        };
        Server::Remote {
            url,
            sse,
            headers: pairs(get("headers"))
                .into_iter()
                .map(|(k, v)| (k, HeaderValue::Text(v)))
                .collect(),
            oauth: host_oauth(host, value),
        }
    } else {
        Server::Unusable("it has no command and no url".into())
    };
    let tools = match host {
        Host::Gemini => Tools {
            allow: texts("includeTools"),
            deny: texts("excludeTools"),
        },
        _ => Tools::default(),
    };
    Entry {
        name: name.to_owned(),
        host,
        file: PathBuf::new(),
        base: PathBuf::new(),
        server,
        disabled,
        tools,
    }
}

fn unusable(host: Host, name: &str, why: &str) -> Entry {
    Entry {
        name: name.to_owned(),
        host,
        file: PathBuf::new(),
        base: PathBuf::new(),
        server: Server::Unusable(why.into()),
        disabled: false,
        tools: Tools::default(),
    }
}

/// Codex's `[mcp_servers.NAME]` tables.
fn read_codex(path: &Path, text: &str, base: &Path) -> Result<Vec<Entry>, FileError> {
    let doc: toml_edit::DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
        let (line, column) = e
            .span()
            .map_or((1, 1), |span| line_column(text, span.start));
        FileError {
            line,
            column,
            message: e.message().trim().to_owned(),
        }
    })?;
    let mut entries = Vec::new();
    let Some(servers) = doc.get("mcp_servers").and_then(|s| s.as_table_like()) else {
        return Ok(entries);
    };
    for (name, item) in servers.iter() {
        let table = item.as_table_like();
        let get = |key: &str| table.and_then(|t| t.get(key));
        let string = |key: &str| get(key).and_then(|v| v.as_str()).map(str::to_owned);
        let strings = |key: &str| -> Vec<String> {
            get(key)
                .and_then(|v| v.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let map = |key: &str| -> Vec<(String, String)> {
            get(key)
                .and_then(|v| v.as_table_like())
                .map(|t| {
                    t.iter()
                        .filter_map(|(k, v)| v.as_str().map(|v| (k.to_owned(), v.to_owned())))
                        .collect()
                })
                .unwrap_or_default()
        };
        let server = if table.is_none() {
            Server::Unusable("the entry is not a table".into())
        } else if let Some(command) = string("command") {
            Server::Stdio {
                command,
                args: strings("args"),
                env: map("env"),
                cwd: string("cwd"),
                env_file: None,
                pass: strings("env_vars"),
            }
        } else if let Some(url) = string("url") {
            let mut headers: Vec<(String, HeaderValue)> = map("http_headers")
                .into_iter()
                .map(|(k, v)| (k, HeaderValue::Text(v)))
                .collect();
            for (header, var) in map("env_http_headers") {
                headers.push((header, HeaderValue::Env { var, prefix: "" }));
            }
            if let Some(var) = string("bearer_token_env_var") {
                headers.push((
                    "Authorization".into(),
                    HeaderValue::Env {
                        var,
                        prefix: "Bearer ",
                    },
                ));
            }
            Server::Remote {
                url,
                sse: false,
                headers,
                oauth: None,
            }
        } else {
            Server::Unusable("it has no command and no url".into())
        };
        entries.push(Entry {
            name: name.to_owned(),
            host: Host::Codex,
            file: path.to_owned(),
            base: base.to_owned(),
            server,
            disabled: get("enabled").and_then(|v| v.as_bool()) == Some(false),
            tools: Tools {
                allow: strings("enabled_tools"),
                deny: strings("disabled_tools"),
            },
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_point_at_line_and_column() {
        let e = parse_json("{\n  \"mcpServers\": {\n    \"a\": {,}\n}").expect_err("bad");
        assert_eq!((e.line, e.column), (3, 11), "{e:?}");
        let e = read_codex(
            Path::new("/c.toml"),
            "[mcp_servers.x]\ncommand = \n",
            Path::new("/"),
        )
        .expect_err("bad");
        assert_eq!(e.line, 2, "{e:?}");
    }

    #[test]
    fn hosts_are_recognised_by_their_files() {
        let table = [
            (
                "/h/.config/Claude/claude_desktop_config.json",
                "{}",
                Host::ClaudeDesktop,
            ),
            ("/h/.claude.json", "{}", Host::ClaudeCode),
            ("/p/.mcp.json", "{}", Host::ClaudeCode),
            ("/h/.cursor/mcp.json", "{}", Host::Cursor),
            ("/p/.vscode/mcp.json", "{}", Host::VsCode),
            ("/h/.codeium/windsurf/mcp_config.json", "{}", Host::Windsurf),
            ("/h/.gemini/settings.json", "{}", Host::Gemini),
            ("/h/.codex/config.toml", "", Host::Codex),
            ("/tmp/x.json", "{\"servers\": {}}", Host::VsCode),
            ("/tmp/x.json", "{\"mcpServers\": {}}", Host::ClaudeDesktop),
        ];
        for (path, text, host) in table {
            assert_eq!(Host::detect(Path::new(path), text), host, "{path}");
        }
    }
}
