//! What `mcpctl connect` will do, decided in one place (DESIGN §11): the
//! host's file and everything known about the instance's units in, a
//! [`ConnectPlan`] out (the file's new text, each entry's unit and why,
//! the entries left alone and why, the record to keep, whether to keep a
//! backup). Pure: `ctl::import` reads the files before and writes and
//! prints the plan after.

use std::path::{Path, PathBuf};

use super::connect::{self, Auth, Record, Via};
use super::convert::{self, Lookup};
use super::hosts::{Entry, Host};
use super::pair::{self, Unit};

/// What `connect` is given.
pub struct ConnectInput<'a> {
    pub host: Host,
    /// The host's user-level file (for messages) and its text.
    pub file: &'a Path,
    pub text: &'a str,
    /// The file's user-level entries, as `import` read them.
    pub entries: &'a [Entry],
    /// The instance's units, and its name.
    pub units: &'a [Unit],
    pub instance: &'a str,
    /// The other instance's units and name, to say "use --user" when the
    /// entries are its units.
    pub other_units: &'a [Unit],
    pub other: &'a str,
    /// The units named on the command line (none: every entry that has
    /// one), or the group to serve as one entry, with its units.
    pub names: &'a [String],
    pub group: Option<(&'a str, &'a [String])>,
    pub lookup: &'a Lookup<'a>,
    /// `mcpctl bridge UNIT` of this instance, and of the other.
    pub bridge: &'a dyn Fn(&str) -> Vec<String>,
    pub other_bridge: &'a dyn Fn(&str) -> Vec<String>,
    /// What each rewritten entry sets for the bridge to find its daemon.
    pub vars: &'a [(String, String)],
    /// The record of an earlier `connect` of this file, if any.
    pub earlier: Option<Record>,
    /// Where the instance's units are looked for (named when a unit is
    /// not there).
    pub unit_dirs: &'a [std::path::PathBuf],
    /// The file did not exist: `connect` makes it (from `text`, empty),
    /// and `disconnect` removes it again.
    pub created: bool,
    /// `connect --http`: the entries reach mcpd's HTTP endpoint instead
    /// of running the bridge.
    pub http: Option<Http<'a>>,
    /// Whether a unit needs a login (`oauth` and none yet, DESIGN §17):
    /// its entry is left to the host, which is logged in, unless `force`.
    pub needs_login: &'a dyn Fn(&str) -> bool,
    pub force: bool,
}

/// Where mcpd's HTTP endpoint is, for `connect --http`.
#[derive(Debug, Clone, Copy)]
pub struct Http<'a> {
    /// `http://ADDR`, an address of the endpoint's `listen`.
    pub base: &'a str,
    /// Whether it asks for tokens (`auth "token"`).
    pub tokens: bool,
    /// The directory the tokens' files go into (the user's, 0700).
    pub dir: &'a Path,
}

/// A token `connect --http` makes for one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// `connect-HOST-UNIT`, `connect-HOST-GROUP.group`.
    pub name: String,
    pub scope: crate::tokens::Scope,
    /// The file (0600) the host reads it from, or the user exports it
    /// from.
    pub file: PathBuf,
    /// What the file holds: the token alone, or (Claude Code's
    /// `headersHelper`) the headers as JSON.
    pub headers_json: bool,
    /// The environment variable the host's entry names, which the user
    /// must set from `file` (hosts that reference only variables).
    pub var: Option<String>,
}

impl Token {
    /// The file's contents for `token`.
    pub fn contents(&self, token: &str) -> String {
        if self.headers_json {
            serde_json::json!({ "Authorization": format!("Bearer {token}") }).to_string()
        } else {
            token.to_owned()
        }
    }
}

/// `path` quoted for a POSIX shell.
fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}

/// The token, URL and reference of entry `target` (a unit, or `@GROUP`)
/// of `host` at `http`.
fn http_entry(host: Host, target: &str, http: &Http<'_>) -> Result<(Via, Option<Token>), String> {
    let url = format!("{}/mcp/{target}", http.base);
    if !http.tokens {
        return Ok((Via::Http { url, auth: None }, None));
    }
    let (name, scope) = match target.strip_prefix('@') {
        Some(group) => (
            format!("connect-{}-{group}.group", host.name()),
            crate::tokens::Scope::Group(group.to_owned()),
        ),
        None => (
            format!("connect-{}-{target}", host.name()),
            crate::tokens::Scope::Units(vec![target.to_owned()]),
        ),
    };
    let file = http.dir.join(&name);
    let var: String = "MCPD_TOKEN_"
        .chars()
        .chain(name["connect-".len()..].chars().map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        }))
        .collect();
    let (auth, var) = match host {
        Host::ClaudeDesktop => unreachable!("refused before"),
        // Its `headersHelper` runs a command: the file, read when it
        // connects.
        Host::ClaudeCode => (Auth::Helper(format!("cat {}", shell_quote(&file))), None),
        // `${file:PATH}`: the file, read when it connects.
        Host::Windsurf => {
            let path = file.display().to_string();
            if path.contains('}') {
                return Err(format!(
                    "{path}: a path with `}}` cannot be a ${{file:…}} reference"
                ));
            }
            (Auth::Header(format!("Bearer ${{file:{path}}}")), None)
        }
        Host::Cursor | Host::VsCode => (Auth::Header(format!("Bearer ${{env:{var}}}")), Some(var)),
        Host::Gemini => (Auth::Header(format!("Bearer ${{{var}}}")), Some(var)),
        Host::Codex => (Auth::EnvVar(var.clone()), Some(var)),
    };
    let token = Token {
        name,
        scope,
        file,
        headers_json: host == Host::ClaudeCode,
        var,
    };
    Ok((
        Via::Http {
            url,
            auth: Some(auth),
        },
        Some(token),
    ))
}

impl std::fmt::Debug for ConnectInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectInput")
            .field("host", &self.host)
            .field("file", &self.file)
            .field("names", &self.names)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// What `connect` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectPlan {
    /// The host's file as it will be.
    pub text: String,
    /// Each entry rewritten: its name, what it bridges (a unit, or
    /// `@GROUP`) and why.
    pub servers: Vec<(String, String, &'static str)>,
    /// One line for each entry left alone, and why.
    pub left: Vec<String>,
    /// What is kept beside the file to undo it.
    pub record: Record,
    /// Whether the file as it is now is the backup to keep (the first
    /// `connect`; a later one keeps the first's backup).
    pub backup: bool,
    /// With `--http`: each rewritten entry's URL, and the tokens to make
    /// (made before the file is written; an earlier token of the same
    /// name is replaced).
    pub urls: Vec<(String, String)>,
    pub tokens: Vec<Token>,
}

/// What `connect` will do with `input`, or why it cannot.
pub fn connect(input: ConnectInput<'_>) -> Result<ConnectPlan, String> {
    let host = input.host;
    if input.http.is_some() && host == Host::ClaudeDesktop {
        return Err(format!(
            "{}: Claude Desktop's config file has no URL form (it adds remote servers in its Connectors settings): connect it without --http, through the bridge",
            input.file.display()
        ));
    }
    let paired: Vec<(&Entry, pair::Pairing)> = input
        .entries
        .iter()
        .map(|e| (e, pair::pair(e, input.units, input.lookup, input.bridge)))
        .collect();
    let mut servers: Vec<(String, String, &'static str)> = Vec::new();
    let mut left = Vec::new();
    if let Some((group, members)) = input.group {
        if members.is_empty() {
            return Err(format!(
                "no unit of the {} instance is in group {group}",
                input.instance
            ));
        }
        // The host's own entries of those units would serve them twice.
        for (entry, pairing) in &paired {
            if let Ok((unit, _)) = pairing
                && members.contains(unit)
                && entry.name != group
            {
                left.push(format!(
                    "{}: {} is also unit {unit} of group {group}: remove it from {} (or the host has its tools twice)",
                    host.name(),
                    entry.name,
                    input.file.display()
                ));
            }
        }
        servers.push((group.to_owned(), format!("@{group}"), "the group"));
    } else if input.names.is_empty() {
        for (entry, pairing) in &paired {
            match pairing {
                Ok((unit, how)) => servers.push((entry.name.clone(), unit.clone(), how.says())),
                Err(why) => left.push(format!("{}: {} left alone: {why}", host.name(), entry.name)),
            }
        }
        if servers.is_empty() {
            let there = paired.iter().any(|(e, _)| {
                pair::pair(e, input.other_units, input.lookup, input.other_bridge).is_ok()
            });
            return Err(format!(
                "none of the servers in {} is a unit of the {} instance: {}",
                input.file.display(),
                input.instance,
                if there {
                    use_other("they are units", input.other)
                } else {
                    format!("run `mcpctl import {}` first", host.name())
                }
            ));
        }
    } else {
        for unit in input.names {
            if !input.units.iter().any(|u| u.name == *unit) {
                let there = input.other_units.iter().any(|u| u.name == *unit);
                let dirs: Vec<String> = input
                    .unit_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect();
                return Err(format!(
                    "no unit {unit} in the {} instance's unit directories ({}){}",
                    input.instance,
                    dirs.join(", "),
                    if there {
                        format!("; {}", use_other("it is a unit", input.other))
                    } else {
                        format!(
                            "; a daemon started with --units DIR serves units connect cannot see: give the host `mcpctl bridge {unit}` by hand (README, \"Use with your MCP host\")"
                        )
                    }
                ));
            }
            let ours = paired.iter().find_map(|(e, p)| match p {
                Ok((u, how)) if u == unit => Some((e.name.clone(), how.says())),
                _ => None,
            });
            if let Some((entry, why)) = ours {
                servers.push((entry, unit.clone(), why));
                continue;
            }
            // An entry of that name that is another server is not replaced.
            if let Some((entry, _)) = paired.iter().find(|(e, _)| e.name == *unit) {
                return Err(format!(
                    "{}: entry {} is not the server of unit {unit}{}; `mcpctl import {}` makes a unit of it",
                    input.file.display(),
                    entry.name,
                    input
                        .units
                        .iter()
                        .find(|u| u.name == *unit)
                        .and_then(|u| convert::origin_of(&u.text))
                        .map(|o| format!(" (imported from {o})"))
                        .unwrap_or_default(),
                    host.name()
                ));
            }
            servers.push((unit.clone(), unit.clone(), "added"));
        }
    }
    if !input.force {
        // The host's own entry keeps the host's login; the bridge would
        // answer every call with "needs a login".
        servers.retain(|(entry, unit, _)| {
            let skip = !unit.starts_with('@') && (input.needs_login)(unit);
            if skip {
                left.push(skipped(host, entry, unit));
            }
            !skip
        });
        if servers.is_empty() {
            return Err(left.join("\n"));
        }
    }
    let pairs: Vec<(String, String)> = servers
        .iter()
        .map(|(e, u, _)| (e.clone(), u.clone()))
        .collect();
    let mut vias = Vec::new();
    let mut urls = Vec::new();
    let mut tokens = Vec::new();
    for (entry, target) in &pairs {
        let via = match &input.http {
            Some(http) => {
                let (via, token) = http_entry(host, target, http)?;
                if let Via::Http { url, .. } = &via {
                    urls.push((entry.clone(), url.clone()));
                }
                tokens.extend(token);
                via
            }
            None => Via::Bridge((input.bridge)(target)),
        };
        vias.push((target.clone(), via));
    }
    let via = |target: &str| {
        vias.iter()
            .find(|(t, _)| t == target)
            .map(|(_, v)| v.clone())
            .expect("each target planned")
    };
    let text = connect::connect_via(host, input.text, &pairs, &via, input.vars)
        .map_err(|e| format!("{}: {e}", input.file.display()))?;
    // Byte for byte only while nobody else changed the file: edits made
    // between two connects are kept by disconnect's merge.
    let exact = input
        .earlier
        .as_ref()
        .is_none_or(|r| !r.connected.is_empty() && r.connected == input.text);
    let backup = input.earlier.is_none();
    let created = input.created || input.earlier.as_ref().is_some_and(|r| r.created);
    let (mut all, mut all_urls, mut all_tokens) = input
        .earlier
        .map(|r| (r.servers, r.urls, r.tokens))
        .unwrap_or_default();
    for server in &pairs {
        if !all.contains(server) {
            all.push(server.clone());
        }
    }
    // What this connect wrote replaces what an earlier one wrote of the
    // same entries; their earlier tokens stay recorded, to be revoked.
    all_urls.retain(|(entry, _)| !pairs.iter().any(|(e, _)| e == entry));
    all_urls.extend(urls.iter().cloned());
    for token in &tokens {
        all_tokens.retain(|(name, _)| *name != token.name);
        all_tokens.push((token.name.clone(), token.file.clone()));
    }
    let record = Record {
        servers: all,
        connected: if exact { text.clone() } else { String::new() },
        urls: all_urls,
        tokens: all_tokens,
        created,
    };
    Ok(ConnectPlan {
        text,
        servers,
        left,
        record,
        backup,
        urls,
        tokens,
    })
}

/// What `connect` says of an entry left alone because its unit needs a
/// login.
pub fn skipped(host: Host, entry: &str, unit: &str) -> String {
    format!(
        "{}: skipped {entry}: needs a login: run mcpctl auth login {unit}, then connect again (--force connects it anyway)",
        host.name()
    )
}

/// What to say when the units are `other`'s (`they are units`, `it is a
/// unit`), as `status` says it.
pub fn use_other(they: &str, other: &str) -> String {
    format!("{they} of the {other} instance: use --{other}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn unit(name: &str, text: &str) -> Unit {
        Unit {
            name: name.into(),
            path: PathBuf::from(format!("/units/{name}.kdl")),
            text: text.into(),
            env: None,
        }
    }

    fn bridge(name: &str) -> Vec<String> {
        vec![
            "/usr/bin/mcpctl".into(),
            "--user".into(),
            "bridge".into(),
            name.into(),
        ]
    }

    fn other_bridge(name: &str) -> Vec<String> {
        vec![
            "/usr/bin/mcpctl".into(),
            "--system".into(),
            "bridge".into(),
            name.into(),
        ]
    }

    /// Plans `connect` of Gemini's `text` against `units`.
    fn plan(
        text: &str,
        units: &[Unit],
        names: &[String],
        group: Option<(&str, &[String])>,
        earlier: Option<Record>,
    ) -> Result<ConnectPlan, String> {
        plan_with(text, units, names, group, earlier, &|_| false, false)
    }

    /// [`plan`], these units needing a login, with `--force` or not.
    fn plan_with(
        text: &str,
        units: &[Unit],
        names: &[String],
        group: Option<(&str, &[String])>,
        earlier: Option<Record>,
        needs_login: &dyn Fn(&str) -> bool,
        force: bool,
    ) -> Result<ConnectPlan, String> {
        let file = Path::new("/home/u/.gemini/settings.json");
        let base = Path::new("/home/u");
        let entries = super::super::hosts::read(Host::Gemini, file, text, base).expect("read");
        let var = |_: &str| None;
        let read = |_: &Path| None;
        let lookup = Lookup {
            var: &var,
            file: &read,
            home: base,
        };
        connect(ConnectInput {
            host: Host::Gemini,
            file,
            text,
            entries: &entries,
            units,
            instance: "user",
            other_units: &[],
            other: "system",
            names,
            group,
            lookup: &lookup,
            bridge: &bridge,
            other_bridge: &other_bridge,
            vars: &[],
            earlier,
            unit_dirs: &[],
            created: false,
            http: None,
            needs_login,
            force,
        })
    }

    #[test]
    fn an_entry_whose_unit_needs_a_login_is_left_to_the_host_unless_forced() {
        let origin = |entry: &str| {
            convert::origin(
                Host::Gemini,
                Path::new("/home/u/.gemini/settings.json"),
                entry,
            )
        };
        let units = [
            unit(
                "t",
                &format!(
                    "{}\nstdio {{ command \"uvx\" \"mcp-server-time\"; }}\n",
                    origin("time")
                ),
            ),
            unit(
                "linear",
                &format!(
                    "{}\nhttp \"https://mcp.linear.app/mcp\" {{ oauth {{}} }}\n",
                    origin("linear")
                ),
            ),
        ];
        let text = r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"]}, "linear": {"httpUrl": "https://mcp.linear.app/mcp", "oauth": {"enabled": true}}}}"#;
        let login = |u: &str| u == "linear";
        let p = plan_with(text, &units, &[], None, None, &login, false).expect("plan");
        assert_eq!(p.servers.len(), 1, "{p:?}");
        assert_eq!(p.servers[0].1, "t");
        assert_eq!(
            p.left,
            [
                "gemini: skipped linear: needs a login: run mcpctl auth login linear, then connect again (--force connects it anyway)"
            ]
        );
        // The host's own entry stays as it was.
        assert!(
            p.text
                .contains("\"httpUrl\": \"https://mcp.linear.app/mcp\""),
            "{}",
            p.text
        );
        let forced = plan_with(text, &units, &[], None, None, &login, true).expect("plan");
        assert_eq!(forced.servers.len(), 2, "{forced:?}");
        assert!(forced.left.is_empty());
        // Named alone: nothing to connect, and why.
        let e = plan_with(text, &units, &["linear".into()], None, None, &login, false)
            .expect_err("nothing to connect");
        assert!(e.contains("skipped linear: needs a login"), "{e}");
    }

    const TIMES: &str = r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Asia/Tokyo"], "timeout": 30000}}}"#;

    /// Unit `t`, imported from Gemini's `time`.
    fn imported() -> [Unit; 1] {
        let origin = convert::origin(
            Host::Gemini,
            Path::new("/home/u/.gemini/settings.json"),
            "time",
        );
        [unit(
            "t",
            &format!("{origin}\nstdio {{ command \"uvx\" \"mcp-server-time\"; }}\n"),
        )]
    }

    #[test]
    fn an_entry_is_paired_with_the_unit_imported_from_it_never_by_name_alone() {
        let origin = convert::origin(
            Host::Gemini,
            Path::new("/home/u/.gemini/settings.json"),
            "time",
        );
        let units = [
            // Claude Code's `time`, another server of the same name.
            unit(
                "time",
                "// imported from claude-code (/home/u/.claude.json, entry \"time\")\nstdio { command \"uvx\" \"mcp-server-time\" \"--local-timezone\" \"Europe/Paris\"; }\n",
            ),
            unit(
                "time-gemini",
                &format!(
                    "{origin}\nstdio {{ command \"uvx\" \"mcp-server-time\" \"--local-timezone\" \"Asia/Tokyo\"; }}\n"
                ),
            ),
        ];
        let planned = plan(TIMES, &units, &[], None, None).expect("plan");
        assert_eq!(
            planned.servers,
            [(
                "time".to_owned(),
                "time-gemini".to_owned(),
                "imported from this entry"
            )]
        );
        assert!(planned.backup);
        assert_eq!(planned.record.connected, planned.text);
        // Naming the unit that only shares the entry's name is refused.
        let named = plan(TIMES, &units, &["time".to_owned()], None, None);
        assert!(
            named
                .as_ref()
                .is_err_and(|e| e.contains("entry time is not the server of unit time")),
            "{named:?}"
        );
        // With no unit for it: refused, saying to import first.
        let none = plan(TIMES, &units[..1], &[], None, None);
        assert!(
            none.as_ref()
                .is_err_and(|e| e.contains("run `mcpctl import gemini` first")),
            "{none:?}"
        );
    }

    #[test]
    fn the_hosts_own_keys_stay_and_a_group_is_one_entry() {
        let units = imported();
        let planned = plan(TIMES, &units, &[], None, None).expect("plan");
        let value: serde_json::Value =
            jsonc_parser::parse_to_serde_value(&planned.text, &Default::default()).expect("json");
        assert_eq!(value["mcpServers"]["time"]["timeout"], 30000);
        assert_eq!(value["mcpServers"]["time"]["args"][2], "t");

        let members = ["t".to_owned()];
        let planned = plan(TIMES, &units, &[], Some(("dev", &members)), None).expect("plan");
        assert_eq!(
            planned.servers,
            [("dev".to_owned(), "@dev".to_owned(), "the group")]
        );
        assert!(
            planned.left[0].starts_with("gemini: time is also unit t of group dev"),
            "{:?}",
            planned.left
        );
        let empty: [String; 0] = [];
        assert!(plan(TIMES, &units, &[], Some(("dev", &empty)), None).is_err());
    }

    #[test]
    fn each_host_gets_its_url_and_a_reference_to_its_token() {
        let dir = Path::new("/home/u/.config/mcpd/connect");
        let http = Http {
            base: "http://127.0.0.1:8737",
            tokens: true,
            dir,
        };
        let (via, token) = http_entry(Host::Cursor, "time", &http).expect("cursor");
        let token = token.expect("a token");
        assert_eq!(
            via,
            Via::Http {
                url: "http://127.0.0.1:8737/mcp/time".into(),
                auth: Some(Auth::Header("Bearer ${env:MCPD_TOKEN_CURSOR_TIME}".into())),
            }
        );
        assert_eq!(token.name, "connect-cursor-time");
        assert_eq!(
            token.scope,
            crate::tokens::Scope::Units(vec!["time".into()])
        );
        assert_eq!(token.file, dir.join("connect-cursor-time"));
        assert_eq!(token.var.as_deref(), Some("MCPD_TOKEN_CURSOR_TIME"));
        assert_eq!(token.contents("mcpd_x"), "mcpd_x");
        // A group: its own name and scope.
        let (via, token) = http_entry(Host::ClaudeCode, "@dev", &http).expect("claude-code");
        let token = token.expect("a token");
        assert_eq!(token.name, "connect-claude-code-dev.group");
        assert_eq!(token.scope, crate::tokens::Scope::Group("dev".into()));
        assert!(token.var.is_none());
        assert_eq!(
            token.contents("mcpd_x"),
            r#"{"Authorization":"Bearer mcpd_x"}"#
        );
        assert_eq!(
            via,
            Via::Http {
                url: "http://127.0.0.1:8737/mcp/@dev".into(),
                auth: Some(Auth::Helper(
                    "cat '/home/u/.config/mcpd/connect/connect-claude-code-dev.group'".into()
                )),
            }
        );
        // auth "none": no token, no header.
        let open = Http {
            tokens: false,
            ..http
        };
        assert_eq!(
            http_entry(Host::Codex, "time", &open).expect("codex"),
            (
                Via::Http {
                    url: "http://127.0.0.1:8737/mcp/time".into(),
                    auth: None
                },
                None
            )
        );
        // A quote in the path stays quoted for the shell.
        assert_eq!(shell_quote(Path::new("/a'b")), r#"'/a'\''b'"#);
    }

    #[test]
    fn a_second_connect_keeps_the_first_backup_and_merges_the_record() {
        let units = imported();
        let first = plan(TIMES, &units, &[], None, None).expect("plan");
        let again = plan(&first.text, &units, &[], None, Some(first.record.clone())).expect("plan");
        assert!(!again.backup, "the first connect's backup is the original");
        assert_eq!(again.record.servers, first.record.servers);
        assert_eq!(again.record.connected, again.text, "nobody else changed it");
        // The host edited the file between two connects: no byte-for-byte
        // undo any more.
        let edited = first.text.replace("30000", "60000");
        let merged = plan(&edited, &units, &[], None, Some(first.record)).expect("plan");
        assert!(merged.record.connected.is_empty());
    }
}
