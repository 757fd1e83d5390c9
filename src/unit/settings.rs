//! The daemon's own settings file, `mcpd.kdl` (DESIGN §15): KDL 2 read
//! with the unit files' diagnostics (`path:line:col`, a caret, "did you
//! mean"). Pure but for [`read`], which reads the file.
//!
//! Its sections are `http { }`, the HTTP endpoint, and `telemetry { }`,
//! OpenTelemetry export (DESIGN §18):
//!
//! ```kdl
//! http {
//!     listen "127.0.0.1:8737"
//!     listen "[::1]:8737"
//!     auth "token"            // or "none": only when every listen is loopback
//!     max-sessions 256
//!     max-sessions-per-token 64  // a quarter of max-sessions by default
//!     allow-origin "https://app.example"
//! }
//! telemetry {
//!     otlp "http://127.0.0.1:4318"   // OTLP over HTTP/protobuf
//!     header "x-api-key" "…"         // sent with every export
//!     sample-ratio 1.0
//!     service-name "mcpd"
//! }
//! ```
//!
//! No file, or no `http` section: no endpoint; no `telemetry` section: no
//! telemetry (no socket, no cost). Every rule is judged here,
//! so a [`Settings`] that exists is valid; `auth "none"` with a listen
//! that is not loopback is refused naming that listen's line (fail
//! closed).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use core::net::SocketAddr;
use kdl::{KdlDocument, KdlNode, KdlValue};
use miette::SourceSpan;

use super::diag::{LoadError, Problem};
use super::instance::Instance;

/// Where `listen` is when the `http` section names none.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8737";
/// `max-sessions` when not given (DESIGN §15).
pub const DEFAULT_MAX_SESSIONS: usize = 256;
/// The most `max-sessions` may say.
pub const MAX_MAX_SESSIONS: usize = 65_536;
/// The share of `max-sessions` one token may hold when
/// `max-sessions-per-token` is not given: one in this many (at least 1).
pub const DEFAULT_TOKEN_SHARE: usize = 4;
/// The most `listen` and `allow-origin` lines.
pub const MAX_LISTEN: usize = 64;
pub const MAX_ORIGINS: usize = 256;
/// The largest settings file read.
pub const MAX_FILE: usize = 1 << 20;

/// The keys of the file, for "did you mean" and the man-page test.
pub const SECTIONS: &[&str] = &["http", "telemetry", "oauth"];
pub const HTTP_KEYS: &[&str] = &[
    "listen",
    "auth",
    "max-sessions",
    "max-sessions-per-token",
    "allow-origin",
];
pub const TELEMETRY_KEYS: &[&str] = &["otlp", "header", "sample-ratio", "service-name"];

/// Where `otlp` is when the `telemetry` section names none: the
/// OpenTelemetry default for OTLP over HTTP.
pub const DEFAULT_OTLP: &str = "http://127.0.0.1:4318";
/// `service-name` when not given.
pub const DEFAULT_SERVICE_NAME: &str = "mcpd";
/// The most `header` lines, and the longest `service-name`.
pub const MAX_HEADERS: usize = 64;
pub const MAX_SERVICE_NAME: usize = 255;
pub const OAUTH_KEYS: &[&str] = &["client-metadata-url"];

/// What `mcpd.kdl` says (valid: every rule was judged when it was read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// The HTTP endpoint; `None`: no endpoint.
    pub http: Option<HttpSettings>,
    /// OpenTelemetry export; `None`: none.
    pub telemetry: Option<TelemetrySettings>,
    /// mcpd as an OAuth client (DESIGN §17).
    pub oauth: Option<OAuthSettings>,
}

/// The `oauth { }` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthSettings {
    /// mcpd's Client ID Metadata Document: an https:// URL with a path.
    pub client_metadata_url: String,
}

/// The `telemetry { }` section (DESIGN §18).
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetrySettings {
    /// The collector's OTLP/HTTP base URL (`/v1/traces` and `/v1/metrics`
    /// are appended), http or https.
    pub otlp: url::Url,
    /// Sent with every export (an API key): never logged.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The share of traces started by mcpd that are recorded, 0 to 1 (a
    /// host's sampled flag decides for its own traces).
    pub sample_ratio: f64,
    pub service_name: String,
}

impl Eq for TelemetrySettings {}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            otlp: url::Url::parse(DEFAULT_OTLP).expect("a valid URL"),
            headers: Vec::new(),
            sample_ratio: 1.0,
            service_name: DEFAULT_SERVICE_NAME.into(),
        }
    }
}

/// The `http { }` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// At least one; no duplicates.
    pub listen: Vec<SocketAddr>,
    pub auth: Auth,
    /// 1..=[`MAX_MAX_SESSIONS`].
    pub max_sessions: usize,
    /// The sessions one token may hold (`auth "token"`); `None`: a
    /// [`DEFAULT_TOKEN_SHARE`]th of `max_sessions` ([`HttpSettings::per_token`]).
    pub max_sessions_per_token: Option<usize>,
    /// Origins (`scheme://host[:port]`, lowercase) a browser may call from
    /// besides loopback ones.
    pub allow_origin: Vec<String>,
}

impl Default for HttpSettings {
    /// An empty `http { }` (and a socket-activated endpoint without one).
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().ok().into_iter().collect(),
            auth: Auth::Token,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_sessions_per_token: None,
            allow_origin: Vec::new(),
        }
    }
}

impl HttpSettings {
    /// The sessions (and stateless requests in flight) one token may hold
    /// at once: `max-sessions-per-token`, else a [`DEFAULT_TOKEN_SHARE`]th
    /// of `max-sessions`; never more than `max-sessions`.
    pub fn per_token(&self) -> usize {
        self.max_sessions_per_token
            .unwrap_or((self.max_sessions / DEFAULT_TOKEN_SHARE).max(1))
            .min(self.max_sessions)
    }
}

/// How a request to the endpoint is authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// `Authorization: Bearer TOKEN`, a token of `mcpctl token new`.
    Token,
    /// Nobody is asked: only when every `listen` is loopback.
    None,
}

impl Auth {
    pub fn as_str(self) -> &'static str {
        match self {
            Auth::Token => "token",
            Auth::None => "none",
        }
    }
}

/// The settings file of `instance` by default: `/etc/mcpd/mcpd.kdl`, or
/// `$XDG_CONFIG_HOME/mcpd/mcpd.kdl` (`~/.config` without it); `None` for a
/// user with neither an absolute `XDG_CONFIG_HOME` nor `HOME`.
pub fn default_path(
    instance: Instance,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    match instance {
        Instance::System => Some(PathBuf::from("/etc/mcpd/mcpd.kdl")),
        Instance::User => {
            let absolute = |var: &str| env(var).map(PathBuf::from).filter(|p| p.is_absolute());
            absolute("XDG_CONFIG_HOME")
                .or_else(|| absolute("HOME").map(|h| h.join(".config")))
                .map(|base| base.join("mcpd/mcpd.kdl"))
        }
    }
}

/// Reads `path`: `Ok(None)` when it does not exist and `required` is false
/// (the default path); any other problem names the file.
pub fn read(path: &Path, required: bool) -> Result<Option<Settings>, LoadError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let read = std::fs::File::open(path)
        .and_then(|file| file.take(MAX_FILE as u64 + 1).read_to_end(&mut bytes));
    match read {
        Ok(n) if n > MAX_FILE => Err(LoadError::new(
            path.to_owned(),
            vec![Problem::file(
                path,
                format!("settings file is larger than {} KiB", MAX_FILE >> 10),
            )],
        )),
        Ok(_) => parse_bytes(path, bytes).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Ok(None),
        Err(e) => Err(LoadError::new(
            path.to_owned(),
            vec![Problem::file(
                path,
                format!("cannot read settings file: {}", super::diag::io_text(&e)),
            )],
        )),
    }
}

/// Judges the bytes of a settings file.
pub fn parse_bytes(path: &Path, bytes: Vec<u8>) -> Result<Settings, LoadError> {
    let text: Arc<str> = match String::from_utf8(bytes) {
        Ok(text) => Arc::from(text),
        Err(e) => {
            let offset = e.utf8_error().valid_up_to();
            let lossy: Arc<str> = Arc::from(String::from_utf8_lossy(e.as_bytes()).into_owned());
            let problem = Problem::at(
                path,
                &lossy,
                (offset, 1).into(),
                "settings file is not valid UTF-8",
                "invalid byte",
            );
            return Err(LoadError::new(path.to_owned(), vec![problem]));
        }
    };
    parse(path, &text)
}

/// Judges a settings file's text; every problem is reported, in file order.
pub fn parse(path: &Path, text: &Arc<str>) -> Result<Settings, LoadError> {
    let doc = KdlDocument::parse_v2(text).map_err(|e| {
        LoadError::new(
            path.to_owned(),
            vec![super::load::kdl_problem(path, text, &e)],
        )
    })?;
    let mut judge = Judge {
        path,
        text,
        problems: Vec::new(),
    };
    let mut settings = Settings::default();
    let mut http_at: Option<SourceSpan> = None;
    let mut telemetry_at: Option<SourceSpan> = None;
    let mut oauth_at: Option<SourceSpan> = None;
    for node in doc.nodes() {
        let name = node.name().value();
        match name {
            "telemetry" => {
                if let Some(first) = telemetry_at {
                    judge.push(
                        Problem::at(
                            path,
                            text,
                            node.name().span(),
                            "`telemetry` is given twice",
                            "second `telemetry` section",
                        )
                        .with_related(first, "first given here"),
                    );
                    continue;
                }
                telemetry_at = Some(node.name().span());
                if !node.entries().is_empty() {
                    judge.at(
                        node.entries()[0].span(),
                        "`telemetry` takes no arguments, only a block",
                        "unexpected argument",
                        Some("write `telemetry { otlp \"http://127.0.0.1:4318\" }`"),
                    );
                }
                settings.telemetry = judge.telemetry(node);
            }
            "oauth" => {
                if let Some(first) = oauth_at {
                    judge.push(
                        Problem::at(
                            path,
                            text,
                            node.name().span(),
                            "`oauth` is given twice",
                            "second `oauth` section",
                        )
                        .with_related(first, "first given here"),
                    );
                    continue;
                }
                oauth_at = Some(node.name().span());
                settings.oauth = judge.oauth(node);
            }
            "http" => {
                if let Some(first) = http_at {
                    judge.push(
                        Problem::at(
                            path,
                            text,
                            node.name().span(),
                            "`http` is given twice",
                            "second `http` section",
                        )
                        .with_related(first, "first given here"),
                    );
                    continue;
                }
                http_at = Some(node.name().span());
                if !node.entries().is_empty() {
                    judge.at(
                        node.entries()[0].span(),
                        "`http` takes no arguments, only a block",
                        "unexpected argument",
                        Some("write `http { listen \"127.0.0.1:8737\" }`"),
                    );
                }
                settings.http = judge.http(node);
            }
            other => {
                let help = super::syntax::did_you_mean(other, SECTIONS)
                    .map(|s| format!("did you mean `{s}`?"))
                    .unwrap_or_else(|| {
                        "the settings file has three sections: `http { }`, `telemetry { }` and `oauth { }`".into()
                    });
                judge.at(
                    node.name().span(),
                    &format!("unknown section `{other}`"),
                    "unknown section",
                    Some(&help),
                );
            }
        }
    }
    if judge.problems.is_empty() {
        Ok(settings)
    } else {
        Err(LoadError::new(path.to_owned(), judge.problems))
    }
}

struct Judge<'a> {
    path: &'a Path,
    text: &'a Arc<str>,
    problems: Vec<Problem>,
}

impl Judge<'_> {
    fn push(&mut self, problem: Problem) {
        self.problems.push(problem);
    }

    fn at(&mut self, span: SourceSpan, message: &str, label: &str, help: Option<&str>) {
        let mut problem = Problem::at(self.path, self.text, span, message, label);
        if let Some(help) = help {
            problem = problem.with_help(help);
        }
        self.problems.push(problem);
    }

    /// The one argument of a key, or a problem.
    fn argument<'n>(
        &mut self,
        node: &'n KdlNode,
        key: &str,
        example: &str,
    ) -> Option<&'n KdlValue> {
        if let Some(children) = node.children() {
            self.at(
                children.span(),
                &format!("`{key}` takes no block"),
                "unexpected block",
                Some(&format!("write `{key} {example}`")),
            );
            return None;
        }
        if let Some(property) = node.entries().iter().find(|e| e.name().is_some()) {
            self.at(
                property.span(),
                &format!("`{key}` takes no properties"),
                "unexpected property",
                Some(&format!("write `{key} {example}`")),
            );
            return None;
        }
        match node.entries() {
            [one] => Some(one.value()),
            [] => {
                self.at(
                    node.name().span(),
                    &format!("`{key}` needs a value"),
                    "no value",
                    Some(&format!("write `{key} {example}`")),
                );
                None
            }
            [_, second, ..] => {
                self.at(
                    second.span(),
                    &format!("`{key}` takes one value"),
                    "extra value",
                    Some(&format!(
                        "write one `{key}` line per value: `{key} {example}`"
                    )),
                );
                None
            }
        }
    }

    fn telemetry(&mut self, node: &KdlNode) -> Option<TelemetrySettings> {
        let before = self.problems.len();
        let mut settings = TelemetrySettings::default();
        let mut seen: Vec<(&str, SourceSpan)> = Vec::new();
        let empty = KdlDocument::new();
        for child in node.children().unwrap_or(&empty).nodes() {
            let key = child.name().value();
            let span = child.name().span();
            if key != "header" && TELEMETRY_KEYS.contains(&key) {
                if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
                    let first = *first;
                    self.push(
                        Problem::at(
                            self.path,
                            self.text,
                            span,
                            format!("`{key}` is given twice"),
                            "second value",
                        )
                        .with_related(first, "first given here"),
                    );
                    continue;
                }
                seen.push((key, span));
            }
            match key {
                "otlp" => {
                    let Some(value) = self.argument(child, key, "\"http://127.0.0.1:4318\"") else {
                        continue;
                    };
                    let at = child.entries()[0].span();
                    match value.as_string().map(otlp_url) {
                        Some(Ok(url)) => settings.otlp = url,
                        Some(Err(why)) => self.at(
                            at,
                            &format!("`otlp` {why}"),
                            "not an OTLP/HTTP URL",
                            Some("write the collector's OTLP/HTTP address, without /v1/traces: `otlp \"http://127.0.0.1:4318\"`"),
                        ),
                        None => self.at(at, "`otlp` takes a string", "not a string", Some("write `otlp \"http://127.0.0.1:4318\"`")),
                    }
                }
                "header" => {
                    let example = "\"x-api-key\" \"VALUE\"";
                    if child.children().is_some()
                        || child.entries().len() != 2
                        || child.entries().iter().any(|e| e.name().is_some())
                    {
                        self.at(
                            span,
                            "`header` takes two strings: a name and a value",
                            "not NAME VALUE",
                            Some(&format!("write `header {example}`")),
                        );
                        continue;
                    }
                    let (name, value) = (&child.entries()[0], &child.entries()[1]);
                    let parsed_name = name
                        .value()
                        .as_string()
                        .and_then(|n| http::HeaderName::from_bytes(n.as_bytes()).ok());
                    let Some(parsed_name) = parsed_name else {
                        self.at(
                            name.span(),
                            "`header` name is not an HTTP header name",
                            "not a header name",
                            Some(&format!("write `header {example}`")),
                        );
                        continue;
                    };
                    let parsed_value = value
                        .value()
                        .as_string()
                        .and_then(|v| http::HeaderValue::from_str(v).ok());
                    // The value is not quoted back: it may be a secret.
                    let Some(mut parsed_value) = parsed_value else {
                        self.at(
                            value.span(),
                            "`header` value is not a string an HTTP header can carry (visible ASCII and spaces)",
                            "not a header value",
                            None,
                        );
                        continue;
                    };
                    parsed_value.set_sensitive(true);
                    if settings.headers.len() == MAX_HEADERS {
                        self.at(
                            span,
                            &format!("more than {MAX_HEADERS} `header` lines"),
                            "one too many",
                            None,
                        );
                        continue;
                    }
                    settings.headers.push((parsed_name, parsed_value));
                }
                "sample-ratio" => {
                    let Some(value) = self.argument(child, key, "1.0") else {
                        continue;
                    };
                    let at = child.entries()[0].span();
                    let ratio = value
                        .as_float()
                        .or_else(|| value.as_integer().map(|n| n as f64));
                    match ratio {
                        Some(r) if (0.0..=1.0).contains(&r) => settings.sample_ratio = r,
                        _ => self.at(
                            at,
                            "`sample-ratio` is a number from 0 to 1",
                            "out of range",
                            Some("write `sample-ratio 1.0` (every trace) or `sample-ratio 0.1` (one in ten)"),
                        ),
                    }
                }
                "service-name" => {
                    let Some(value) = self.argument(child, key, "\"mcpd\"") else {
                        continue;
                    };
                    let at = child.entries()[0].span();
                    match value.as_string() {
                        Some(name)
                            if !name.trim().is_empty()
                                && name.len() <= MAX_SERVICE_NAME
                                && !name.chars().any(char::is_control) =>
                        {
                            settings.service_name = name.to_owned();
                        }
                        _ => self.at(
                            at,
                            &format!("`service-name` is a string of 1 to {MAX_SERVICE_NAME} bytes, no control characters"),
                            "not a service name",
                            Some("write `service-name \"mcpd\"`"),
                        ),
                    }
                }
                other => {
                    let help = super::syntax::did_you_mean(other, TELEMETRY_KEYS)
                        .map(|s| format!("did you mean `{s}`?"))
                        .unwrap_or_else(|| {
                            format!(
                                "the `telemetry` section knows {}",
                                TELEMETRY_KEYS.join(", ")
                            )
                        });
                    self.at(
                        span,
                        &format!("unknown key `{other}` in `telemetry`"),
                        "unknown key",
                        Some(&help),
                    );
                }
            }
        }
        (self.problems.len() == before).then_some(settings)
    }

    /// `oauth { client-metadata-url "https://…" }`.
    fn oauth(&mut self, node: &KdlNode) -> Option<OAuthSettings> {
        let before = self.problems.len();
        let mut url = None;
        let empty = KdlDocument::new();
        for child in node.children().unwrap_or(&empty).nodes() {
            let key = child.name().value();
            if key != "client-metadata-url" {
                let help = super::syntax::did_you_mean(key, OAUTH_KEYS)
                    .map(|s| format!("did you mean `{s}`?"))
                    .unwrap_or_else(|| "the `oauth` section knows client-metadata-url".into());
                self.at(
                    child.name().span(),
                    &format!("unknown key `{key}` in `oauth`"),
                    "unknown key",
                    Some(&help),
                );
                continue;
            }
            let example = "\"https://example.org/mcpd/client.json\"";
            let Some(value) = self.argument(child, key, example) else {
                continue;
            };
            let at = child.entries()[0].span();
            let ok = value
                .as_string()
                .and_then(|t| url::Url::parse(t).ok())
                .filter(|u| u.scheme() == "https" && u.has_host() && u.path() != "/");
            match ok {
                Some(u) => url = Some(u.to_string()),
                None => self.at(
                    at,
                    "`client-metadata-url` is an https:// URL with a path (a Client ID Metadata Document)",
                    "not an https:// URL with a path",
                    Some(&format!("write `client-metadata-url {example}`")),
                ),
            }
        }
        if self.problems.len() > before {
            return None;
        }
        match url {
            Some(client_metadata_url) => Some(OAuthSettings {
                client_metadata_url,
            }),
            None => {
                self.at(
                    node.name().span(),
                    "`oauth` needs `client-metadata-url`",
                    "no client-metadata-url",
                    Some("write `oauth { client-metadata-url \"https://example.org/mcpd/client.json\" }`"),
                );
                None
            }
        }
    }

    fn http(&mut self, node: &KdlNode) -> Option<HttpSettings> {
        let before = self.problems.len();
        let mut listen: Vec<(SocketAddr, SourceSpan)> = Vec::new();
        let mut auth: Option<(Auth, SourceSpan)> = None;
        let mut max_sessions: Option<(usize, SourceSpan)> = None;
        let mut per_token: Option<(usize, SourceSpan)> = None;
        let mut allow_origin: Vec<String> = Vec::new();
        let empty = KdlDocument::new();
        for child in node.children().unwrap_or(&empty).nodes() {
            let key = child.name().value();
            let span = child.name().span();
            let single = |judge: &mut Self, seen: Option<SourceSpan>| {
                if let Some(first) = seen {
                    judge.push(
                        Problem::at(
                            judge.path,
                            judge.text,
                            span,
                            format!("`{key}` is given twice"),
                            "second value",
                        )
                        .with_related(first, "first given here"),
                    );
                    return false;
                }
                true
            };
            match key {
                "listen" => {
                    let Some(value) = self.argument(child, key, "\"127.0.0.1:8737\"") else {
                        continue;
                    };
                    let at = child.entries()[0].span();
                    let Some(text) = value.as_string() else {
                        self.at(
                            at,
                            "`listen` takes a string: an address and a port",
                            "not a string",
                            Some("write `listen \"127.0.0.1:8737\"` or `listen \"[::1]:8737\"`"),
                        );
                        continue;
                    };
                    match text.parse::<SocketAddr>() {
                        Ok(addr) => {
                            if let Some((_, first)) = listen.iter().find(|(a, _)| *a == addr) {
                                let first = *first;
                                self.push(
                                    Problem::at(self.path, self.text, at, format!("`listen` names {addr} twice"), "second time")
                                        .with_related(first, "first here"),
                                );
                            } else if listen.len() == MAX_LISTEN {
                                self.at(at, &format!("more than {MAX_LISTEN} `listen` lines"), "one too many", None);
                            } else {
                                listen.push((addr, at));
                            }
                        }
                        Err(_) => self.at(
                            at,
                            &format!("`listen` {text:?} is not an address and a port"),
                            "not ADDRESS:PORT",
                            Some("write an IP address and a port: `listen \"127.0.0.1:8737\"`, `listen \"[::1]:8737\"`, `listen \"0.0.0.0:8737\"` (host names are not resolved)"),
                        ),
                    }
                }
                "auth" => {
                    if !single(self, auth.map(|(_, s)| s)) {
                        continue;
                    }
                    let Some(value) = self.argument(child, key, "\"token\"") else {
                        continue;
                    };
                    let at = child.entries()[0].span();
                    match value.as_string() {
                        Some("token") => auth = Some((Auth::Token, at)),
                        Some("none") => auth = Some((Auth::None, at)),
                        _ => self.at(
                            at,
                            "`auth` is \"token\" or \"none\"",
                            "unknown",
                            Some("write `auth \"token\"` (the default) or, for loopback only, `auth \"none\"`"),
                        ),
                    }
                }
                "max-sessions" => {
                    if !single(self, max_sessions.map(|(_, s)| s)) {
                        continue;
                    }
                    let Some(value) = self.argument(child, key, "256") else {
                        continue;
                    };
                    let at = child.entries()[0].span();
                    match value.as_integer() {
                        Some(n) if (1..=MAX_MAX_SESSIONS as i128).contains(&n) => {
                            max_sessions = Some((n as usize, at));
                        }
                        _ => self.at(
                            at,
                            &format!(
                                "`max-sessions` is a whole number from 1 to {MAX_MAX_SESSIONS}"
                            ),
                            "out of range",
                            Some("write `max-sessions 256`"),
                        ),
                    }
                }
                "max-sessions-per-token" => {
                    if !single(self, per_token.map(|(_, s)| s)) {
                        continue;
                    }
                    let Some(value) = self.argument(child, key, "64") else {
                        continue;
                    };
                    let at = child.entries()[0].span();
                    match value.as_integer() {
                        Some(n) if (1..=MAX_MAX_SESSIONS as i128).contains(&n) => {
                            per_token = Some((n as usize, at));
                        }
                        _ => self.at(
                            at,
                            &format!(
                                "`max-sessions-per-token` is a whole number from 1 to {MAX_MAX_SESSIONS}"
                            ),
                            "out of range",
                            Some("write `max-sessions-per-token 64`"),
                        ),
                    }
                }
                "allow-origin" => {
                    let Some(value) = self.argument(child, key, "\"https://app.example\"") else {
                        continue;
                    };
                    let at = child.entries()[0].span();
                    match value.as_string().map(origin) {
                        Some(Ok(o)) if allow_origin.len() < MAX_ORIGINS => {
                            if !allow_origin.contains(&o) {
                                allow_origin.push(o);
                            }
                        }
                        Some(Ok(_)) => self.at(at, &format!("more than {MAX_ORIGINS} `allow-origin` lines"), "one too many", None),
                        Some(Err(why)) => self.at(
                            at,
                            &format!("`allow-origin` {why}"),
                            "not an origin",
                            Some("write a browser origin: a scheme, a host and perhaps a port, no path: `allow-origin \"https://app.example\"`"),
                        ),
                        None => self.at(at, "`allow-origin` takes a string", "not a string", Some("write `allow-origin \"https://app.example\"`")),
                    }
                }
                other => {
                    let help = super::syntax::did_you_mean(other, HTTP_KEYS)
                        .map(|s| format!("did you mean `{s}`?"))
                        .unwrap_or_else(|| {
                            format!("the `http` section knows {}", HTTP_KEYS.join(", "))
                        });
                    self.at(
                        span,
                        &format!("unknown key `{other}` in `http`"),
                        "unknown key",
                        Some(&help),
                    );
                }
            }
        }
        let auth_value = auth.map_or(Auth::Token, |(a, _)| a);
        if let Some((Auth::None, auth_at)) = auth {
            for (addr, at) in &listen {
                if !addr.ip().is_loopback() {
                    self.push(
                        Problem::at(
                            self.path,
                            self.text,
                            *at,
                            format!("`auth \"none\"` with `listen` {addr}, which is not loopback: anyone who reaches it would use every server"),
                            "not loopback",
                        )
                        .with_related(auth_at, "no authentication asked here")
                        .with_help("use `auth \"token\"` (and `mcpctl token new`), or listen on 127.0.0.1 or [::1] only"),
                    );
                }
            }
        }
        if self.problems.len() > before {
            return None;
        }
        let listen = if listen.is_empty() {
            DEFAULT_LISTEN.parse().ok().into_iter().collect()
        } else {
            listen.into_iter().map(|(a, _)| a).collect()
        };
        Some(HttpSettings {
            listen,
            auth: auth_value,
            max_sessions: max_sessions.map_or(DEFAULT_MAX_SESSIONS, |(n, _)| n),
            max_sessions_per_token: per_token.map(|(n, _)| n),
            allow_origin,
        })
    }
}

/// An OTLP/HTTP base URL: http or https, a host, no query, fragment or
/// user; or why `text` is not one.
pub fn otlp_url(text: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{text:?} is not an http or https URL"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{text:?} has no host"));
    }
    if url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(format!("{text:?} has a query, a fragment or a user"));
    }
    if url.path().trim_end_matches('/').ends_with("/v1/traces")
        || url.path().trim_end_matches('/').ends_with("/v1/metrics")
    {
        return Err(format!(
            "{text:?} names a signal's path: give the base address, mcpd appends /v1/traces and /v1/metrics"
        ));
    }
    Ok(url)
}

/// A browser origin as it is compared: `scheme://host[:port]`, lowercase,
/// no default port; or why `text` is not one.
pub fn origin(text: &str) -> Result<String, String> {
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{text:?} is not an http or https origin"));
    }
    let Some(host) = url.host_str() else {
        return Err(format!("{text:?} has no host"));
    };
    if url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
    {
        return Err(format!(
            "{text:?} is more than an origin (a path, a query or a user)"
        ));
    }
    Ok(match url.port() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(text: &str) -> Result<Settings, String> {
        let text: Arc<str> = Arc::from(text);
        parse(Path::new("/etc/mcpd/mcpd.kdl"), &text).map_err(|e| e.to_string())
    }

    #[test]
    fn no_http_section_is_no_endpoint_and_an_empty_one_the_defaults() {
        assert_eq!(
            judge(""),
            Ok(Settings {
                http: None,
                telemetry: None,
                oauth: None,
            })
        );
        let http = judge("http {}\n").expect("valid").http.expect("http");
        assert_eq!(
            http.listen,
            ["127.0.0.1:8737".parse::<SocketAddr>().expect("addr")]
        );
        assert_eq!(http.auth, Auth::Token);
        assert_eq!(http.max_sessions, DEFAULT_MAX_SESSIONS);
        assert_eq!(http.per_token(), DEFAULT_MAX_SESSIONS / DEFAULT_TOKEN_SHARE);
        assert!(http.allow_origin.is_empty());
    }

    #[test]
    fn every_key_is_read() {
        let http = judge(
            "http {\n    listen \"127.0.0.1:0\"\n    listen \"[::1]:8737\"\n    auth \"none\"\n    max-sessions 3\n    max-sessions-per-token 2\n    allow-origin \"HTTPS://App.Example:8443\"\n}\n",
        )
        .expect("valid")
        .http
        .expect("http");
        assert_eq!(http.listen.len(), 2);
        assert_eq!(http.auth, Auth::None);
        assert_eq!(http.max_sessions, 3);
        assert_eq!(http.per_token(), 2);
        assert_eq!(http.allow_origin, ["https://app.example:8443"]);
    }

    #[test]
    fn auth_none_on_a_public_address_is_refused_naming_the_listen_line() {
        let e = judge("http {\n    listen \"127.0.0.1:1\"\n    listen \"0.0.0.0:8737\"\n    auth \"none\"\n}\n")
            .expect_err("fail closed");
        assert!(
            e.starts_with("/etc/mcpd/mcpd.kdl:3:12: `auth \"none\"` with `listen` 0.0.0.0:8737"),
            "{e}"
        );
    }

    #[test]
    fn problems_are_located_with_hints() {
        let e = judge("htp {}\nhttp {\n    lisen \"x\"\n    listen \"localhost:80\"\n    max-sessions 0\n    auth \"basic\"\n    allow-origin \"https://a.example/path\"\n}\n")
            .expect_err("invalid");
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 6, "{e}");
        assert!(
            lines[0].starts_with("/etc/mcpd/mcpd.kdl:1:1: unknown section `htp`"),
            "{e}"
        );
        assert!(
            lines[1].starts_with("/etc/mcpd/mcpd.kdl:3:5: unknown key `lisen`"),
            "{e}"
        );
        assert!(
            lines[2].contains(":4:12: `listen` \"localhost:80\" is not an address"),
            "{e}"
        );
        assert!(
            lines[3].contains(":5:18: `max-sessions` is a whole number"),
            "{e}"
        );
        assert!(lines[4].contains(":6:10: `auth` is"), "{e}");
        assert!(
            lines[5].contains(
                ":7:18: `allow-origin` \"https://a.example/path\" is more than an origin"
            ),
            "{e}"
        );
        let text: Arc<str> = Arc::from("http {\n    lisen \"x\"\n}\n");
        let report = parse(Path::new("m.kdl"), &text)
            .expect_err("invalid")
            .render(crate::unit::Style::Plain);
        assert!(report.contains("did you mean `listen`?"), "{report}");
        let e = judge("http {\n    allow-origin \"https://a.example/path\"\n    auth \"none\"\n    auth \"token\"\n}\nhttp {}\n").expect_err("invalid");
        assert!(
            e.contains(":2:18: `allow-origin` \"https://a.example/path\" is more than an origin"),
            "{e}"
        );
        assert!(e.contains(":4:5: `auth` is given twice"), "{e}");
        assert!(e.contains(":6:1: `http` is given twice"), "{e}");
    }

    #[test]
    fn telemetry_is_off_unless_given_and_every_key_is_read() {
        assert_eq!(judge("http {}\n").expect("valid").telemetry, None);
        let empty = judge("telemetry {}\n")
            .expect("valid")
            .telemetry
            .expect("on");
        assert_eq!(empty, TelemetrySettings::default());
        assert_eq!(empty.otlp.as_str(), "http://127.0.0.1:4318/");
        let t = judge("telemetry {\n    otlp \"https://otel.example:4318/base\"\n    header \"x-api-key\" \"s3cret\"\n    header \"x-b\" \"2\"\n    sample-ratio 0.25\n    service-name \"mcpd-a\"\n}\n")
            .expect("valid")
            .telemetry
            .expect("on");
        assert_eq!(t.otlp.as_str(), "https://otel.example:4318/base");
        assert_eq!(t.headers.len(), 2);
        assert_eq!(t.headers[0].0.as_str(), "x-api-key");
        assert_eq!(t.sample_ratio, 0.25);
        assert_eq!(t.service_name, "mcpd-a");
        assert_eq!(
            judge("telemetry {\n    sample-ratio 0\n}\n")
                .expect("valid")
                .telemetry
                .expect("on")
                .sample_ratio,
            0.0
        );
    }

    #[test]
    fn telemetry_problems_are_located_and_secrets_not_repeated() {
        let e = judge("telemetry {\n    otlp \"ftp://x\"\n    sample-ratio 1.5\n    header \"bad name\" \"v\"\n    header \"k\" \"sec\\nret\"\n    header \"only\"\n    service-name \"\"\n    sampel-ratio 1\n    otlp \"http://127.0.0.1:4318/v1/traces\"\n}\ntelemetry {}\n")
            .expect_err("invalid");
        let lines: Vec<&str> = e.lines().collect();
        assert!(
            lines[0].contains(":2:10: `otlp` \"ftp://x\" is not an http or https URL"),
            "{e}"
        );
        assert!(
            lines[1].contains(":3:18: `sample-ratio` is a number from 0 to 1"),
            "{e}"
        );
        assert!(
            lines[2].contains(":4:12: `header` name is not an HTTP header name"),
            "{e}"
        );
        assert!(
            lines[3].contains(":5:16: `header` value is not a string"),
            "{e}"
        );
        assert!(lines[4].contains(":6:5: `header` takes two strings"), "{e}");
        assert!(
            lines[5].contains(":7:18: `service-name` is a string"),
            "{e}"
        );
        assert!(
            lines[6].contains(":8:5: unknown key `sampel-ratio` in `telemetry`"),
            "{e}"
        );
        assert!(lines[7].contains(":9:5: `otlp` is given twice"), "{e}");
        assert!(
            lines[8].contains(":11:1: `telemetry` is given twice"),
            "{e}"
        );
        assert_eq!(lines.len(), 9, "{e}");
        assert!(
            !e.contains("sec"),
            "a header's value is never repeated: {e}"
        );
        let e = judge("telemetry {\n    otlp \"http://c:4318/v1/traces\"\n}\n")
            .expect_err("a signal's path");
        assert!(e.contains("give the base address"), "{e}");
    }

    #[test]
    fn the_oauth_section_names_an_https_client_metadata_document() {
        let oauth = judge("oauth { client-metadata-url \"https://example.org/mcpd.json\"; }\n")
            .expect("valid")
            .oauth
            .expect("oauth");
        assert_eq!(oauth.client_metadata_url, "https://example.org/mcpd.json");
        for (text, expected) in [
            (
                "oauth { client-metadata-url \"http://example.org/m.json\"; }",
                "is an https:// URL with a path",
            ),
            (
                "oauth { client-metadata-url \"https://example.org/\"; }",
                "is an https:// URL with a path",
            ),
            (
                "oauth { client-metadata-uri \"https://example.org/m\"; }",
                "1:9: unknown key `client-metadata-uri` in `oauth`",
            ),
            ("oauth { }", "`oauth` needs `client-metadata-url`"),
        ] {
            let error = judge(text).expect_err(text);
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn default_paths() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.into())
        };
        assert_eq!(
            default_path(Instance::System, env(&[])),
            Some(PathBuf::from("/etc/mcpd/mcpd.kdl"))
        );
        assert_eq!(
            default_path(Instance::User, env(&[("HOME", "/home/u")])),
            Some(PathBuf::from("/home/u/.config/mcpd/mcpd.kdl"))
        );
        assert_eq!(
            default_path(
                Instance::User,
                env(&[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "/x")])
            ),
            Some(PathBuf::from("/x/mcpd/mcpd.kdl"))
        );
        assert_eq!(default_path(Instance::User, env(&[("HOME", "rel")])), None);
    }
}
