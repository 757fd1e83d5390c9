//! A host's entry → a unit file and its env-file (DESIGN §11). Pure: the
//! caller hands in how to look up variables and read files.
//!
//! Secrets never land in a unit: every `env` value and every header value
//! goes to the instance's credstore, one file `UNIT.VAR` each, which the
//! unit references (`credentials { import …; env … }`, `header …
//! credential=`; DESIGN §16), or with `--env-file` to the env-file, which
//! the unit names (`env-file`, `header … env=`).
//! A value that is only `${KEY}` for its own key becomes `pass-env KEY`.
//! Variables elsewhere (command, arguments, URL) are not expanded into a
//! unit: such an entry is refused with the reason, unless the variable is
//! unset and has a default.

use std::path::{Path, PathBuf};

use super::hosts::{Entry, HeaderValue, Host, Server, Syntax};

/// A converted entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The unit file's text.
    pub unit: String,
    /// The env-file's `NAME=value` pairs; empty: the unit has none.
    pub secrets: Vec<(String, String)>,
    /// Why each of `secrets` is one ([`secret_because`]), in their order.
    pub because: Vec<&'static str>,
    /// The unit has `oauth { }`: the host logged in to the server itself,
    /// and mcpd needs its own login (`mcpctl auth login NAME`).
    pub login: bool,
}

impl Imported {
    /// The env-file's text (mode 0600 is the writer's).
    pub fn env_file(&self, unit: &str, host: Host) -> String {
        let mut out = format!(
            "# Secrets of unit {unit}, imported by `mcpctl import` from {}.\n",
            host.name()
        );
        for (k, v) in &self.secrets {
            // Quoted whole: the env-file reader strips one pair of quotes.
            out.push_str(&format!("{k}=\"{v}\"\n"));
        }
        out
    }
}

/// What conversion may look at.
pub struct Lookup<'a> {
    /// The importing user's environment.
    pub var: &'a dyn Fn(&str) -> Option<String>,
    /// A file's contents (`${file:PATH}`).
    pub file: &'a dyn Fn(&Path) -> Option<String>,
    pub home: &'a Path,
}

impl std::fmt::Debug for Lookup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookup")
            .field("home", &self.home)
            .finish_non_exhaustive()
    }
}

/// A unit name for a host's entry name: `[A-Za-z0-9][A-Za-z0-9_-]{0,63}`,
/// other characters mapped to `-` (`@scope/server` → `scope-server`).
pub fn unit_name(name: &str) -> Option<String> {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut out = String::new();
    for c in mapped.trim_start_matches(['-', '_']).chars() {
        // No runs of dashes from mapped characters.
        if !(c == '-' && out.ends_with('-')) {
            out.push(c);
        }
    }
    let out: String = out.trim_end_matches('-').chars().take(64).collect();
    (!out.is_empty()).then_some(out)
}

/// The comment that says which entry a unit was imported from: its first
/// line, by which `connect` knows the unit again.
pub fn origin(host: Host, file: &Path, entry: &str) -> String {
    format!(
        "{ORIGIN}{} ({}, entry {}).",
        host.name(),
        one_line(&file.display().to_string()),
        kdl(entry)
    )
}

const ORIGIN: &str = "// Imported by `mcpctl import` from ";

/// Where `unit` (its text) was imported from: `HOST (FILE, entry "NAME")`.
pub fn origin_of(unit: &str) -> Option<&str> {
    unit.lines()
        .find_map(|l| l.strip_prefix(ORIGIN))
        .map(|o| o.trim_end_matches('.'))
}

/// A unit's text without the lines that say where it came from (its
/// origin and description): what it runs.
fn body(unit: &str) -> Vec<&str> {
    unit.lines()
        .filter(|l| !l.starts_with(ORIGIN) && !l.starts_with("description "))
        .collect()
}

/// Whether `imported` runs the same server as the unit `unit` whose
/// env-file is `env` (their origins aside).
pub fn same_server(imported: &Imported, unit: &str, env: Option<&str>) -> bool {
    let secrets: Vec<(String, String)> = env
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.to_owned(), v.to_owned())
        })
        .collect();
    body(&imported.unit) == body(unit) && imported.secrets == secrets
}

/// A piece of a value as the host would expand it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Var {
        name: String,
        default: Option<String>,
        /// Windsurf: an unset variable is empty.
        empty: bool,
    },
    File(String),
    Input(String),
}

/// Splits `value` by `host`'s variable syntax.
fn pieces(syntax: Syntax, value: &str, base: &Path, home: &Path) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        text.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if syntax == Syntax::Plain {
            text.push('$');
            rest = after;
            continue;
        }
        if let Some(body) = after.strip_prefix('{') {
            let Some(end) = body.find('}') else {
                text.push('$');
                rest = after;
                continue;
            };
            let inner = &body[..end];
            rest = &body[end + 1..];
            let piece = match (syntax, inner.split_once(':')) {
                (Syntax::Editor | Syntax::Windsurf, Some(("env", name))) => Piece::Var {
                    name: name.to_owned(),
                    default: None,
                    empty: syntax == Syntax::Windsurf,
                },
                (Syntax::Windsurf, Some(("file", path))) => Piece::File(path.to_owned()),
                (Syntax::Editor, Some(("input", id))) => Piece::Input(id.to_owned()),
                (Syntax::Editor, None) => Piece::Text(match inner {
                    "userHome" => home.display().to_string(),
                    "workspaceFolder" => base.display().to_string(),
                    "workspaceFolderBasename" => base
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    "pathSeparator" | "/" => "/".into(),
                    other => return Err(format!("it uses ${{{other}}}, which mcpd cannot expand")),
                }),
                (Syntax::Shell | Syntax::ShellBare, _) => {
                    let (name, default) = match inner.split_once(":-") {
                        Some((name, default)) => (name, Some(default.to_owned())),
                        None => (inner, None),
                    };
                    Piece::Var {
                        name: name.to_owned(),
                        default,
                        empty: false,
                    }
                }
                _ => return Err(format!("it uses ${{{inner}}}, which mcpd cannot expand")),
            };
            if let Piece::Text(t) = piece {
                text.push_str(&t);
                continue;
            }
            if !text.is_empty() {
                out.push(Piece::Text(std::mem::take(&mut text)));
            }
            out.push(piece);
        } else if syntax == Syntax::ShellBare
            && after.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if !text.is_empty() {
                out.push(Piece::Text(std::mem::take(&mut text)));
            }
            out.push(Piece::Var {
                name: after[..end].to_owned(),
                default: None,
                empty: false,
            });
            rest = &after[end..];
        } else {
            text.push('$');
            rest = after;
        }
    }
    text.push_str(rest);
    if !text.is_empty() || out.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

/// Where a value is, for reasons.
struct Place<'a> {
    what: &'a str,
    host: Host,
}

/// The value as the host would run it, where it may hold a secret (env,
/// headers): variables from the importing environment, files read now.
fn secret(pieces: &[Piece], at: &Place<'_>, lookup: &Lookup<'_>) -> Result<String, String> {
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Var {
                name,
                default,
                empty,
            } => match ((lookup.var)(name), default) {
                (Some(value), _) => out.push_str(&value),
                (None, Some(default)) => out.push_str(default),
                (None, None) if *empty => {}
                (None, None) => {
                    return Err(format!(
                        "{} uses ${{{name}}}, which is not set here: set it and import again",
                        at.what
                    ));
                }
            },
            Piece::File(path) => {
                let path = match path.strip_prefix("~/") {
                    Some(rest) => lookup.home.join(rest),
                    None => PathBuf::from(path),
                };
                let text = (lookup.file)(&path).ok_or_else(|| {
                    format!("{} reads {}, which cannot be read", at.what, path.display())
                })?;
                out.push_str(text.trim());
            }
            Piece::Input(id) => {
                return Err(format!(
                    "{} asks for ${{input:{id}}} when {} starts it; write the value into the env-file by hand",
                    at.what,
                    at.host.name()
                ));
            }
        }
    }
    Ok(out)
}

/// The value where a unit holds it in the clear (command, arguments, URL,
/// paths): only text, and defaults of unset variables.
fn plain(pieces: &[Piece], at: &Place<'_>, lookup: &Lookup<'_>) -> Result<String, String> {
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Var {
                name,
                default: Some(default),
                ..
            } if (lookup.var)(name).is_none() => out.push_str(default),
            Piece::Var { name, .. } => {
                return Err(format!(
                    "{} uses ${{{name}}}; a unit does not expand variables there (it could hold a secret): move it into `env`",
                    at.what
                ));
            }
            Piece::File(_) | Piece::Input(_) => {
                return Err(format!(
                    "{} takes a value {} fills in at start; mcpd cannot",
                    at.what,
                    at.host.name()
                ));
            }
        }
    }
    Ok(out)
}

/// A KDL 2 string literal.
pub fn kdl(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || kdl_disallowed(c) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Characters KDL 2 takes as newlines or forbids in a document.
fn kdl_disallowed(c: char) -> bool {
    matches!(
        c,
        '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}' | '\u{feff}'
    )
}

/// A comment's text on one line.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || kdl_disallowed(c) {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// An env variable's name as a property key: bare, unless KDL reserves
/// it (`true`, `null`, …).
fn env_key(name: &str) -> String {
    if matches!(name, "true" | "false" | "null" | "inf" | "nan") {
        kdl(name)
    } else {
        name.to_owned()
    }
}

/// An env-file variable for header `name`: `Authorization` → `AUTHORIZATION`.
fn header_var(name: &str, taken: &[(String, String)]) -> String {
    let mut var: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    if var.starts_with(|c: char| c.is_ascii_digit()) || var.is_empty() {
        var.insert(0, '_');
    }
    let mut candidate = var.clone();
    let mut n = 2;
    while taken.iter().any(|(k, _)| *k == candidate) {
        candidate = format!("{var}_{n}");
        n += 1;
    }
    candidate
}

/// Why the value `value` of `name` (an env variable or a header) is a
/// secret, which goes to the env-file; `None`: it is not, and stays in the
/// unit where `mcpctl status` shows it (`MEMORY_FILE_PATH`, `LOG_LEVEL`).
/// `indirect`: the host filled it in from a variable or a file, which the
/// user kept out of the host's file.
pub fn secret_because(name: &str, value: &str, indirect: bool) -> Option<&'static str> {
    let upper = name.to_ascii_uppercase();
    let secretive = upper.split(['_', '-']).any(|part| {
        matches!(
            part,
            "PASS" | "PWD" | "AUTH" | "AUTHORIZATION" | "COOKIE" | "SESSION" | "JWT" | "DSN"
        ) || [
            "KEY",
            "TOKEN",
            "SECRET",
            "PASSWORD",
            "PASSWD",
            "CREDENTIAL",
            "CREDENTIALS",
            "PRIVATE",
        ]
        .iter()
        .any(|word| part.ends_with(word))
    });
    // A path made from a variable (`${HOME}/.local/…`) is a path, not a
    // secret; anything else read from a variable or file may be one.
    let path = value.starts_with('/') && !value.contains(char::is_whitespace);
    if indirect {
        return (secretive || !path).then_some("from a variable or file");
    }
    if secretive {
        return Some("its name");
    }
    // Well-known token prefixes, credentials in a URL, or a long random run.
    const PREFIXES: &[&str] = &[
        "ghp_",
        "gho_",
        "ghu_",
        "ghs_",
        "ghr_",
        "github_pat_",
        "glpat-",
        "sk-",
        "sk_",
        "rk_",
        "xoxb-",
        "xoxp-",
        "xoxa-",
        "xapp-",
        "AKIA",
        "ASIA",
        "AIza",
        "ya29.",
        "eyJ",
        "npm_",
        "pypi-",
        "hf_",
        "dop_v1_",
        "Bearer ",
        "Basic ",
    ];
    let userinfo = value
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?', '#']).next())
        .is_some_and(|authority| authority.contains(':') && authority.contains('@'));
    let random = value.len() >= 24
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+/=_-".contains(c))
        && value.chars().any(|c| c.is_ascii_digit())
        && value.chars().any(|c| c.is_ascii_alphabetic())
        && !value.starts_with('/');
    (PREFIXES.iter().any(|p| value.starts_with(p)) || userinfo || random)
        .then_some("its value's shape")
}

/// Programs that fetch their server on first start: give them time.
const FETCHERS: &[&str] = &["npx", "uvx", "bunx", "pnpx", "pipx", "docker", "podman"];

/// Where a converted unit's secrets are kept.
#[derive(Debug, Clone, Copy)]
pub enum Keep<'a> {
    /// In this env-file (`--env-file`).
    EnvFile(&'a Path),
    /// In the credstore, as `UNIT.VAR` for unit `unit`.
    Credstore { unit: &'a str },
}

impl Keep<'_> {
    /// The credential a secret `var` is kept as (credstore only).
    pub fn credential(&self, var: &str) -> Option<String> {
        match self {
            Keep::EnvFile(_) => None,
            Keep::Credstore { unit } => Some(format!("{unit}.{var}")),
        }
    }
}

/// The `credentials` block that references `secrets` from the credstore,
/// with an `env` line for each of `env` (a stdio unit's variables).
fn credentials_block(keep: Keep<'_>, secrets: &[(String, String)], env: bool) -> Vec<String> {
    let names: Vec<String> = secrets
        .iter()
        .filter_map(|(var, _)| keep.credential(var))
        .collect();
    if names.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![
        "credentials {".to_owned(),
        format!(
            "    import {}",
            names.iter().map(|n| kdl(n)).collect::<Vec<_>>().join(" ")
        ),
    ];
    if env {
        for ((var, _), name) in secrets.iter().zip(&names) {
            lines.push(format!("    env {} {}", kdl(var), kdl(name)));
        }
    }
    lines.push("}".to_owned());
    lines
}

/// Converts `entry` into a unit whose secrets are kept as `keep` says.
pub fn convert(entry: &Entry, keep: Keep<'_>, lookup: &Lookup<'_>) -> Result<Imported, String> {
    let head = vec![
        origin(entry.host, &entry.file, &entry.name),
        format!(
            "description {}",
            kdl(&format!(
                "{}, imported from {}",
                entry.name,
                entry.host.name()
            ))
        ),
    ];
    convert_as(entry, keep, lookup, head)
}

/// [`convert`], the unit's text beginning with `head` (what it is and
/// where it came from) instead: `mcpctl add` writes an entry given on
/// its command line so.
pub fn convert_as(
    entry: &Entry,
    keep: Keep<'_>,
    lookup: &Lookup<'_>,
    head: Vec<String>,
) -> Result<Imported, String> {
    let syntax = entry.host.syntax();
    let split = |value: &str| pieces(syntax, value, &entry.base, lookup.home);
    let place = |what: &'static str| Place {
        what,
        host: entry.host,
    };
    let absolute = |path: String| -> String {
        let joined = entry.base.join(&path);
        // `./x` and `x/./y` without the dots.
        let clean: PathBuf = joined
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect();
        clean.display().to_string()
    };
    let mut secrets: Vec<(String, String)> = Vec::new();
    let mut because = Vec::new();
    let mut lines = head;
    match &entry.server {
        Server::Unusable(why) => return Err(why.clone()),
        Server::Stdio {
            command,
            args,
            env,
            cwd,
            env_file: host_env_file,
            pass,
        } => {
            let mut command = plain(&split(command)?, &place("its command"), lookup)?;
            if command.contains('/') {
                command = absolute(command);
            }
            let mut words = vec![kdl(&command)];
            for arg in args {
                words.push(kdl(&plain(&split(arg)?, &place("an argument"), lookup)?));
            }
            let mut pass_env: Vec<String> = pass.clone();
            let mut plain_env = Vec::new();
            for (key, value) in env {
                if !crate::unit::spec::is_env_name(key) {
                    return Err(format!(
                        "its env names \"{key}\", which is not a valid variable name"
                    ));
                }
                let parts = split(value)?;
                if let [
                    Piece::Var {
                        name,
                        default: None,
                        ..
                    },
                ] = parts.as_slice()
                    && name == key
                {
                    // `KEY: ${KEY}`: the daemon's own value, as the host's.
                    pass_env.push(key.clone());
                    continue;
                }
                let value = secret(&parts, &place("its env"), lookup)?;
                let indirect = parts.iter().any(|p| !matches!(p, Piece::Text(_)));
                match secret_because(key, &value, indirect) {
                    Some(why) => {
                        secrets.push((key.clone(), value));
                        because.push(why);
                    }
                    None => plain_env.push(format!("{}={}", env_key(key), kdl(&value))),
                }
            }
            lines.push("stdio {".into());
            lines.push(format!("    command {}", words.join(" ")));
            if let Some(cwd) = cwd {
                let cwd = absolute(plain(&split(cwd)?, &place("its cwd"), lookup)?);
                lines.push(format!("    working-directory {}", kdl(&cwd)));
            }
            if !plain_env.is_empty() {
                lines.push(format!("    env {}", plain_env.join(" ")));
            }
            if let Some(file) = host_env_file {
                let file = absolute(plain(&split(file)?, &place("its envFile"), lookup)?);
                lines.push(format!("    env-file {}", kdl(&file)));
            }
            if let (false, Keep::EnvFile(env_file)) = (secrets.is_empty(), keep) {
                lines.push(format!(
                    "    env-file {}",
                    kdl(&env_file.display().to_string())
                ));
            }
            if !pass_env.is_empty() {
                let names: Vec<String> = pass_env.iter().map(|n| kdl(n)).collect();
                lines.push(format!("    pass-env {}", names.join(" ")));
            }
            lines.push("}".into());
            lines.extend(credentials_block(keep, &secrets, true));
            let program = Path::new(&command)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            if FETCHERS.contains(&program) {
                lines.push("// It fetches the server on first start.".into());
                lines.push("startup-timeout \"2m\"".into());
            }
        }
        Server::Remote {
            url,
            sse,
            headers,
            oauth,
        } => {
            if *sse {
                return Err(
                    "it uses the SSE transport, which mcpd does not speak (Streamable HTTP only)"
                        .into(),
                );
            }
            let url = plain(&split(url)?, &place("its url"), lookup)?;
            let mut header_lines = Vec::new();
            for (name, value) in headers {
                let (value, indirect) = match value {
                    HeaderValue::Text(text) => {
                        let parts = split(text)?;
                        let indirect = parts.iter().any(|p| !matches!(p, Piece::Text(_)));
                        (secret(&parts, &place("a header"), lookup)?, indirect)
                    }
                    HeaderValue::Env { var, prefix } => match (lookup.var)(var) {
                        Some(value) => (format!("{prefix}{value}"), true),
                        None => {
                            return Err(format!(
                                "its header {name} comes from {var}, which is not set here: set it and import again"
                            ));
                        }
                    },
                };
                let Some(why) = secret_because(name, &value, indirect) else {
                    header_lines.push(format!("    header {} {}", kdl(name), kdl(&value)));
                    continue;
                };
                let var = header_var(name, &secrets);
                header_lines.push(match keep.credential(&var) {
                    Some(credential) => {
                        format!("    header {} credential={}", kdl(name), kdl(&credential))
                    }
                    None => format!("    header {} env={}", kdl(name), kdl(&var)),
                });
                secrets.push((var, value));
                because.push(why);
            }
            if let Some(oauth) = oauth {
                // The host's client kept: a provider that registered it
                // (with its fixed callback port) knows no other.
                let keys: Vec<String> = [
                    oauth
                        .client_id
                        .as_ref()
                        .map(|id| format!("client-id {}", kdl(id))),
                    oauth.scope.as_ref().map(|s| format!("scope {}", kdl(s))),
                    oauth.redirect_port.map(|p| format!("redirect-port {p}")),
                ]
                .into_iter()
                .flatten()
                .collect();
                header_lines.push(if keys.is_empty() {
                    "    oauth {}".to_owned()
                } else {
                    format!("    oauth {{ {}; }}", keys.join("; "))
                });
            }
            if header_lines.is_empty() {
                lines.push(format!("http {}", kdl(&url)));
            } else {
                lines.push(format!("http {} {{", kdl(&url)));
                if let (false, Keep::EnvFile(env_file)) = (secrets.is_empty(), keep) {
                    lines.push(format!(
                        "    env-file {}",
                        kdl(&env_file.display().to_string())
                    ));
                }
                lines.extend(header_lines);
                lines.push("}".into());
                lines.extend(credentials_block(keep, &secrets, false));
            }
        }
    }
    let tools = &entry.tools;
    if !tools.allow.is_empty() || !tools.deny.is_empty() {
        lines.push(format!(
            "// {}'s own filter of the server's tools.",
            entry.host.name()
        ));
        lines.push("tools {".into());
        for (key, names) in [("allow", &tools.allow), ("deny", &tools.deny)] {
            if !names.is_empty() {
                let names: Vec<String> = names.iter().map(|n| kdl(n)).collect();
                lines.push(format!("    {key} {}", names.join(" ")));
            }
        }
        lines.push("}".into());
    }
    for (key, value) in &secrets {
        if matches!(keep, Keep::Credstore { .. }) {
            if value.contains('\0') {
                return Err(format!(
                    "the value of {key} holds a NUL byte, which no variable can"
                ));
            }
        } else if value.contains(['\n', '\r', '\0']) {
            return Err(format!(
                "the value of {key} spans lines, which an env-file cannot hold"
            ));
        }
    }
    lines.push(String::new());
    Ok(Imported {
        unit: lines.join("\n"),
        secrets,
        because,
        login: matches!(&entry.server, Server::Remote { oauth: Some(_), .. }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_become_unit_names() {
        let table = [
            ("github", Some("github")),
            ("@scope/server", Some("scope-server")),
            ("My Server (local)", Some("My-Server-local")),
            ("__x", Some("x")),
            ("/// ", None),
        ];
        for (name, want) in table {
            assert_eq!(unit_name(name).as_deref(), want, "{name}");
        }
        assert_eq!(unit_name(&"a".repeat(80)).map(|n| n.len()), Some(64));
    }

    #[test]
    fn each_host_expands_its_own_syntax() {
        let base = Path::new("/p");
        let home = Path::new("/h");
        let var = |n: &str| Piece::Var {
            name: n.into(),
            default: None,
            empty: false,
        };
        let t = |s: &str| Piece::Text(s.into());
        assert_eq!(
            pieces(Syntax::Plain, "${A}", base, home),
            Ok(vec![t("${A}")])
        );
        assert_eq!(
            pieces(Syntax::Shell, "Bearer ${TOKEN}", base, home),
            Ok(vec![t("Bearer "), var("TOKEN")])
        );
        assert_eq!(
            pieces(Syntax::Shell, "${URL:-https://x}/mcp", base, home),
            Ok(vec![
                Piece::Var {
                    name: "URL".into(),
                    default: Some("https://x".into()),
                    empty: false
                },
                t("/mcp")
            ])
        );
        assert_eq!(pieces(Syntax::Shell, "$A", base, home), Ok(vec![t("$A")]));
        assert_eq!(
            pieces(Syntax::ShellBare, "$A-b", base, home),
            Ok(vec![var("A"), t("-b")])
        );
        assert_eq!(
            pieces(Syntax::Editor, "${workspaceFolder}/x ${env:K}", base, home),
            Ok(vec![t("/p/x "), var("K")])
        );
        assert_eq!(
            pieces(Syntax::Editor, "${input:key}", base, home),
            Ok(vec![Piece::Input("key".into())])
        );
        assert!(pieces(Syntax::Editor, "${command:x}", base, home).is_err());
        assert_eq!(
            pieces(Syntax::Windsurf, "${file:~/t}", base, home),
            Ok(vec![Piece::File("~/t".into())])
        );
    }

    #[test]
    fn only_secrets_go_to_the_env_file_and_each_says_why() {
        let name = Some("its name");
        let shape = Some("its value's shape");
        let table = [
            (
                "MEMORY_FILE_PATH",
                "/home/u/.local/share/memory.json",
                false,
                None,
            ),
            ("LOG_LEVEL", "debug", false, None),
            ("GITHUB_HOST", "github.com", false, None),
            ("X-Client", "codex", false, None),
            ("API_KEY", "value", false, name),
            ("GITHUB_PERSONAL_ACCESS_TOKEN", "x", false, name),
            ("OPENAI_APIKEY", "x", false, name),
            ("DB_PASSWORD", "x", false, name),
            ("Authorization", "Bearer x", false, name),
            ("STRIPE_SECRET", "x", false, name),
            ("KEYBOARD_LAYOUT", "fr", false, None),
            ("GH", "ghp_0123456789abcdef", false, shape),
            ("DATABASE_URL", "postgres://me:hunter2@db/app", false, shape),
            ("DATABASE_URL", "postgres://db/app", false, None),
            ("SEED", "q8Z0vX3nR7tL1mK9pB5wY2cJ", false, shape),
            ("REGION", "eu-west-1", false, None),
            ("HOME_DIR", "x", true, Some("from a variable or file")),
            // `${HOME}/…`: a path, whatever variable made it.
            ("MEMORY_FILE_PATH", "/home/u/memory.json", true, None),
            ("DB_PASSWORD", "/x", true, Some("from a variable or file")),
        ];
        for (key, value, indirect, want) in table {
            assert_eq!(secret_because(key, value, indirect), want, "{key}={value}");
        }
    }

    #[test]
    fn strings_are_kdl_literals() {
        assert_eq!(kdl("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
        assert_eq!(kdl("a\u{2028}b\u{feff}"), "\"a\\u{2028}b\\u{feff}\"");
        assert_eq!(one_line("/x\u{2028}y\nz"), "/x y z");
    }
}
