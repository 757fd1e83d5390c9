//! The validated unit specification: what a unit file means, with no spans.
//!
//! [`UnitSpec::new`] is the only way to build a [`UnitSpec`], and it judges
//! every bound and cross-field rule of DESIGN §2 itself, whether the draft came
//! from a file or from code. So a `UnitSpec` that exists is valid: the
//! supervisor never re-checks it. Errors name the [`Field`] they concern; the
//! syntax layer maps fields back to file locations.

mod judge;

use judge::Judge;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

// Defined beside the vocabulary table that names each field's key; named
// here too, where errors are built with it, so `unit::spec::Field` keeps
// working.
pub use super::keys::Field;

/// Default `reconnect.initial-delay`.
pub const DEFAULT_INITIAL_DELAY: Duration = Duration::from_millis(500);
/// Default `reconnect.max-delay` (also the stability window).
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(30);
/// Default `reconnect.max-attempts`: retries per outage.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// Default `startup-timeout`.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `stop-timeout`.
pub const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Default and largest `max-request-size`: the line limit of every
/// message mcpd reads (16 MiB).
pub const MAX_REQUEST_SIZE: u64 = 16 << 20;

/// Smallest `max-request-size`.
pub const MIN_REQUEST_SIZE: u64 = 1 << 10;
/// Default `idle-stop` of an on-demand unit.
pub const DEFAULT_IDLE_STOP: Duration = Duration::from_secs(600);

/// Default `max-instances` of a per-host unit (DESIGN §13).
pub const DEFAULT_MAX_INSTANCES: u32 = 16;
/// Largest `max-instances`.
pub const MAX_INSTANCES: u32 = 1024;

/// Default `health.interval`: silence before a probe.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(30);
/// Default `health.timeout`: how long a probe waits for its answer.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `health.failures`: consecutive unanswered probes that end a
/// generation.
pub const DEFAULT_HEALTH_FAILURES: u32 = 3;
/// Most `health.failures` accepted.
pub const MAX_HEALTH_FAILURES: u32 = 100;
/// Default `log-rate-limit`: journald's `RateLimitBurst=` and
/// `RateLimitIntervalSec=`.
pub const DEFAULT_LOG_RATE_LIMIT: RateLimit = RateLimit {
    lines: 10_000,
    interval: Duration::from_secs(30),
};
/// Most lines per interval `log-rate-limit` accepts.
pub const MAX_LOG_RATE_LINES: u32 = 1_000_000;

/// Shortest duration any key accepts.
pub const MIN_DURATION: Duration = Duration::from_millis(1);
/// Longest duration any key accepts.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
/// Longest `description`, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;

/// HTTP headers the MCP transport sets itself; a unit may not override them.
pub const TRANSPORT_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// Variables of the daemon's own service manager: never given to a server,
/// neither by `env` nor by `pass-env`.
pub const SERVICE_MANAGER_ENV: &[&str] = &[
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
];

/// A validated unit: one MCP server and how to supervise it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    description: Option<String>,
    transport: Transport,
    reconnect: ReconnectPolicy,
    health: HealthPolicy,
    limits: Limits,
    /// `sandbox { … }`; None: the server runs unconfined.
    sandbox: Option<Sandbox>,
    /// None: `log-rate-limit #false`.
    log_rate_limit: Option<RateLimit>,
    startup_timeout: Duration,
    stop_timeout: Duration,
    /// The largest request a host may send the server, in bytes.
    max_request_size: u64,
    /// `protocol`: the era spoken with the server.
    protocol: Protocol,
    /// `start` and `idle-stop`.
    activation: Activation,
    /// `sessions` and `max-instances` (DESIGN §13).
    sessions: Sessions,
    /// `file://` URIs answered to the server's `roots/list`.
    roots: Vec<String>,
    /// `group`: the groups a host reaches the unit in (DESIGN §14).
    groups: Vec<String>,
    /// `alias`: the unit's prefix in an aggregate instead of its name.
    alias: Option<String>,
    /// `tools { allow …; deny … }`.
    tool_filter: ToolFilter,
    /// `credentials { … }` (DESIGN §16); empty: none.
    credentials: CredentialsSpec,
}

/// Which of a server's tools are published and may be called: a tool
/// matching a `deny` glob is not; with `allow` globs, only a tool matching
/// one is. Deny wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolFilter {
    allow: Vec<String>,
    deny: Vec<String>,
}

impl ToolFilter {
    /// Tools matching a glob of `allow` (every tool, if none) and none of
    /// `deny`.
    pub fn new(allow: Vec<String>, deny: Vec<String>) -> Self {
        Self { allow, deny }
    }

    /// No filter: every tool.
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Whether tool `name` is published and callable.
    pub fn allows(&self, name: &str) -> bool {
        self.why_not(name).is_none()
    }

    /// Why tool `name` is filtered out, if it is.
    pub fn why_not(&self, name: &str) -> Option<String> {
        let matches = |glob: &String| wildmatch::WildMatch::new(glob).matches(name);
        if let Some(glob) = self.deny.iter().find(|g| matches(g)) {
            return Some(format!("it matches deny \"{glob}\""));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(matches) {
            let globs: Vec<String> = self.allow.iter().map(|g| format!("\"{g}\"")).collect();
            return Some(format!("it matches no allow ({})", globs.join(", ")));
        }
        None
    }
}

/// The era mcpd speaks with a unit's server (`protocol`, DESIGN §12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    /// `protocol "auto"` (or `"lanes"`, the word of the opt-in that it
    /// replaces): `server/discover` first, `initialize` if the server does
    /// not answer it as a 2026-07-28 server; a stdio server of both eras
    /// serves each host in its own era (a second process, a lane, for the
    /// hosts of the 2025 handshake: DESIGN §12).
    #[default]
    Auto,
    /// `protocol "legacy"`: `initialize` only (MCP 2025): for a server of
    /// both eras whose tools ask in the middle of a call (push-style
    /// sampling, elicitation, roots), which 2026-07-28 has no channel for.
    Legacy,
    /// `protocol "2026-07-28"`: a server that does not speak it fails to
    /// establish.
    Modern,
}

impl Protocol {
    /// As the unit file writes it.
    pub fn word(self) -> &'static str {
        match self {
            Protocol::Auto => "auto",
            Protocol::Legacy => "legacy",
            Protocol::Modern => "2026-07-28",
        }
    }

    fn from_word(word: &str) -> Option<Self> {
        if word == "lanes" {
            // Lanes were opt-in under this word before they were `auto`'s:
            // unit files that wrote it keep their meaning.
            return Some(Protocol::Auto);
        }
        [Protocol::Auto, Protocol::Legacy, Protocol::Modern]
            .into_iter()
            .find(|p| p.word() == word)
    }
}

/// When the server runs (`start`, DESIGN §9).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Activation {
    /// `start "always"`: from when the unit is loaded until it is stopped.
    #[default]
    Always,
    /// `start "on-demand"`: on first use, stopped after `idle_stop` with
    /// nothing in flight and nothing asked.
    OnDemand { idle_stop: Duration },
}

impl Activation {
    /// The `start` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Activation::Always => "always",
            Activation::OnDemand { .. } => "on-demand",
        }
    }

    /// `idle-stop` of an on-demand unit.
    pub fn idle_stop(self) -> Option<Duration> {
        match self {
            Activation::Always => None,
            Activation::OnDemand { idle_stop } => Some(idle_stop),
        }
    }
}

/// Whether host sessions share one server process (`sessions`, DESIGN
/// §13).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Sessions {
    /// `sessions "shared"`: every host session on one upstream.
    #[default]
    Shared,
    /// `sessions "per-host"`: an instance `NAME@N` per host session, at
    /// most `max_instances` at once.
    PerHost { max_instances: u32 },
    /// One instance of a per-host unit ([`UnitSpec::for_instance`]; never
    /// read from a file): its sessions are its one host's.
    Instance,
}

impl Sessions {
    /// The `sessions` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Sessions::Shared => "shared",
            Sessions::PerHost { .. } | Sessions::Instance => "per-host",
        }
    }

    /// Whether the unit runs an instance per host session
    /// (`sessions "per-host"`): true of the unit, false of one of its
    /// instances ([`Sessions::Instance`]) and of a shared unit. Every
    /// "is this unit per-host?" asks this.
    pub fn is_per_host(self) -> bool {
        matches!(self, Sessions::PerHost { .. })
    }

    /// `max-instances` of a per-host unit.
    pub fn max_instances(self) -> Option<u32> {
        match self {
            Sessions::Shared | Sessions::Instance => None,
            Sessions::PerHost { max_instances } => Some(max_instances),
        }
    }
}

/// How to reach the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio(StdioSpec),
    Http(HttpSpec),
}

/// A child process speaking MCP over its stdin/stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioSpec {
    program: String,
    args: Vec<String>,
    working_directory: Option<PathBuf>,
    env: BTreeMap<String, String>,
    env_files: Vec<PathBuf>,
    pass_env: Vec<String>,
    user: Option<String>,
}

/// A Streamable HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSpec {
    url: url::Url,
    env_files: Vec<PathBuf>,
    headers: Vec<(String, HeaderValue)>,
    oauth: Option<OAuthSpec>,
}

/// How mcpd logs in to a server that needs it (DESIGN §17): `oauth { }`.
/// Everything left out is discovered from the server and its
/// authorization server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OAuthSpec {
    /// A pre-registered client (else CIMD, else dynamic registration).
    pub client_id: Option<String>,
    /// The credential (DESIGN §16) holding the client's secret: its name.
    pub client_secret: Option<String>,
    /// The scopes asked for, space-separated (else the server's hint, else
    /// what it supports).
    pub scope: Option<String>,
    /// The loopback port `mcpctl auth login` listens on for the redirect
    /// (else an ephemeral one).
    pub redirect_port: Option<u16>,
    pub grant: Grant,
}

/// `oauth.grant`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Grant {
    /// A person logs in (`mcpctl auth login`).
    #[default]
    AuthorizationCode,
    /// Machine to machine: the daemon fetches its tokens itself.
    ClientCredentials,
}

impl Grant {
    pub const WORDS: [&'static str; 2] = ["authorization-code", "client-credentials"];

    pub fn as_str(self) -> &'static str {
        match self {
            Grant::AuthorizationCode => Self::WORDS[0],
            Grant::ClientCredentials => Self::WORDS[1],
        }
    }
}

impl OAuthSpec {
    fn judge(judge: &mut Judge, url: Option<&url::Url>, draft: OAuthDraft) -> Self {
        let grant = match draft.grant.as_deref() {
            None | Some("authorization-code") => Grant::AuthorizationCode,
            Some("client-credentials") => Grant::ClientCredentials,
            Some(other) => {
                judge
                    .fail(
                        Field::OAuthGrant,
                        format!("`oauth.grant`: unknown grant \"{other}\""),
                    )
                    .help = Some(format!(
                    "write `grant \"{}\"` or `grant \"{}\"`",
                    Grant::WORDS[0],
                    Grant::WORDS[1]
                ));
                Grant::AuthorizationCode
            }
        };
        if let Some(id) = &draft.client_id
            && (id.is_empty() || id.chars().any(char::is_control))
        {
            judge.fail(
                Field::OAuthClientId,
                "`oauth.client-id`: a client id is a non-empty string without control characters",
            );
        }
        if let Some(name) = &draft.client_secret {
            if !is_credential_name(name) {
                judge.fail(
                    Field::OAuthClientSecret,
                    format!("`oauth.client-secret`: \"{name}\" is not a credential name"),
                );
            } else if draft.client_id.is_none() {
                judge
                    .fail(
                        Field::OAuthClientSecret,
                        "`oauth.client-secret` belongs to a pre-registered client: it needs `client-id`",
                    )
                    .help = Some("add `client-id \"ID\"` to the `oauth` block".into());
            }
        }
        if let Some(scope) = &draft.scope
            && (scope.split_whitespace().next().is_none()
                || scope
                    .chars()
                    .any(|c| c.is_control() || c == '"' || c == '\\'))
        {
            judge.fail(
                Field::OAuthScope,
                "`oauth.scope`: scopes are words separated by spaces (RFC 6749 §3.3)",
            );
        }
        let redirect_port = draft.redirect_port.and_then(|port| {
            let ok = u16::try_from(port).ok().filter(|p| *p > 0);
            if ok.is_none() {
                judge.fail(
                    Field::OAuthRedirectPort,
                    format!("`oauth.redirect-port`: {port} is not a port (1 to 65535)"),
                );
            }
            ok
        });
        if grant == Grant::ClientCredentials
            && (draft.client_id.is_none() || draft.client_secret.is_none())
        {
            judge
                .fail(
                    Field::OAuthGrant,
                    "`oauth.grant \"client-credentials\"` needs `client-id` and `client-secret`",
                )
                .help = Some(
                "add `client-id \"ID\"` and `client-secret credential=\"NAME\"` to the `oauth` block"
                    .into(),
            );
        }
        if grant == Grant::ClientCredentials && draft.redirect_port.is_some() {
            judge.fail(
                Field::OAuthRedirectPort,
                "`oauth.redirect-port` is for a login in a browser; `grant \"client-credentials\"` has none",
            );
        }
        if let Some(url) = url
            && url.scheme() == "http"
            && !is_loopback_host(url)
        {
            judge
                .fail(
                    Field::OAuth,
                    format!(
                        "`oauth`: tokens are never sent over plain http:// to a host that is not loopback ({})",
                        url.host_str().unwrap_or_default()
                    ),
                )
                .help = Some("use the server's https:// URL".into());
        }
        Self {
            client_id: draft.client_id,
            client_secret: draft.client_secret,
            scope: draft.scope,
            redirect_port,
            grant,
        }
    }
}

/// Whether `url`'s host is loopback: `localhost`, 127.0.0.0/8, `::1`.
pub fn is_loopback_host(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => {
            d.eq_ignore_ascii_case("localhost") || d.to_ascii_lowercase().ends_with(".localhost")
        }
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// A request header's value: written in the unit, a variable of the
/// unit's `env-file`s, or one of its credentials, read at each connect
/// (DESIGN §11, §16: secrets stay out of unit files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValue {
    Literal(Secret),
    Env(String),
    /// `credential="gh" format="Bearer {}"`: the credential's value put
    /// where `format` has `{}`.
    Credential {
        name: String,
        format: String,
    },
}

/// An unchecked header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderDraft {
    Value(String),
    Env(String),
    Credential {
        credential: String,
        format: Option<String>,
    },
}

/// Where `format` puts a header credential's value.
pub const CREDENTIAL_PLACEHOLDER: &str = "{}";

/// The variable a server finds its credentials directory in.
pub const CREDENTIALS_DIRECTORY: &str = "CREDENTIALS_DIRECTORY";

/// `credentials { … }` (DESIGN §16): what a server is given at each start,
/// by reference. The values are read by the supervisor, never here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialsSpec {
    sources: Vec<Credential>,
    import: Vec<String>,
    env: Vec<(String, String)>,
}

/// One `load` or `load-encrypted` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// Its name in the credentials directory.
    pub name: String,
    /// Absolute: a file, or (not encrypted) a directory of files.
    pub path: PathBuf,
    /// A `systemd-creds encrypt` file, decrypted at each start.
    pub encrypted: bool,
}

/// An unchecked `credentials` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialsDraft {
    /// `load "NAME" "PATH"`.
    pub load: Vec<(String, String)>,
    /// `import "GLOB"`.
    pub import: Vec<String>,
    /// `load-encrypted "NAME" "PATH"`.
    pub load_encrypted: Vec<(String, String)>,
    /// `env "VAR" "NAME"`.
    pub env: Vec<(String, String)>,
}

impl From<&str> for HeaderDraft {
    fn from(value: &str) -> Self {
        HeaderDraft::Value(value.to_owned())
    }
}

/// A value that is never shown: `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

/// The bounded exponential backoff of DESIGN §3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    enabled: bool,
    initial_delay: Duration,
    max_delay: Duration,
    max_attempts: u32,
}

/// Liveness probes (DESIGN §3, invariant 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    enabled: bool,
    interval: Duration,
    timeout: Duration,
    failures: u32,
}

/// At most `lines` stderr lines per `interval` reach the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub lines: u32,
    pub interval: Duration,
}

/// One broken rule of a draft.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The key at fault.
    pub field: Field,
    /// What is wrong, lowercase, naming the key.
    pub message: String,
    /// A second key involved in a cross-field rule.
    pub related: Option<Field>,
    /// How to fix it.
    pub help: Option<String>,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SpecError {}

/// An unchecked unit, as read from a file or built by code. Every field left
/// `None` takes its documented default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitDraft {
    pub description: Option<String>,
    pub stdio: Option<StdioDraft>,
    pub http: Option<HttpDraft>,
    pub reconnect: ReconnectDraft,
    pub health: HealthDraft,
    pub limits: LimitsDraft,
    /// `sandbox`: Some when the block is given (even empty).
    pub sandbox: Option<SandboxDraft>,
    /// `credentials`: Some when the block is given (even empty).
    pub credentials: Option<CredentialsDraft>,
    /// `log-rate-limit`: `Some(None)` is `#false`; the count is checked here.
    pub log_rate_limit: Option<Option<(i128, Duration)>>,
    pub startup_timeout: Option<Duration>,
    pub stop_timeout: Option<Duration>,
    /// `max-request-size`, in bytes (checked here).
    pub max_request_size: Option<i128>,
    /// `protocol`: "auto", "legacy" or "2026-07-28".
    pub protocol: Option<String>,
    /// `start`: "always" or "on-demand".
    pub start: Option<String>,
    pub idle_stop: Option<Duration>,
    /// `sessions`: "shared" or "per-host".
    pub sessions: Option<String>,
    /// `max-instances` (checked here).
    pub max_instances: Option<i128>,
    /// `roots`: file:// URIs.
    pub roots: Vec<String>,
    /// `group`: group names.
    pub groups: Vec<String>,
    /// `alias`: a unit name.
    pub alias: Option<String>,
    /// `tools.allow` globs.
    pub tools_allow: Vec<String>,
    /// `tools.deny` globs.
    pub tools_deny: Vec<String>,
}

/// An unchecked `stdio` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StdioDraft {
    /// Program then arguments.
    pub command: Vec<String>,
    pub working_directory: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub env_files: Vec<PathBuf>,
    pub pass_env: Vec<String>,
    pub user: Option<String>,
}

/// An unchecked `http` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpDraft {
    pub url: String,
    pub env_files: Vec<PathBuf>,
    pub headers: Vec<(String, HeaderDraft)>,
    /// `oauth { }`: the server needs a login (DESIGN §17).
    pub oauth: Option<OAuthDraft>,
}

/// An unchecked `oauth` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OAuthDraft {
    pub client_id: Option<String>,
    /// The name of the credential holding the client secret.
    pub client_secret: Option<String>,
    pub scope: Option<String>,
    pub redirect_port: Option<i128>,
    pub grant: Option<String>,
}

/// An unchecked `reconnect` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconnectDraft {
    pub enabled: Option<bool>,
    pub initial_delay: Option<Duration>,
    pub max_delay: Option<Duration>,
    pub max_attempts: Option<i128>,
}

/// An unchecked `limits` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitsDraft {
    /// Bytes.
    pub memory_max: Option<i128>,
    pub tasks_max: Option<i128>,
    pub cpu_weight: Option<i128>,
    pub nofile: Option<i128>,
    /// Bytes.
    pub core: Option<i128>,
}

/// Resource limits of a stdio server (DESIGN §10): cgroup controls and
/// rlimits. Each is enforced or the start fails; none is ever dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// `memory.max`, bytes.
    pub memory_max: Option<u64>,
    /// `pids.max`.
    pub tasks_max: Option<u64>,
    /// `cpu.weight`, 1..10000.
    pub cpu_weight: Option<u64>,
    /// `RLIMIT_NOFILE`, soft and hard.
    pub nofile: Option<u64>,
    /// `RLIMIT_CORE`, soft and hard, bytes (0: no core dumps).
    pub core: Option<u64>,
}

impl Limits {
    /// Whether any needs a cgroup controller.
    pub fn needs_cgroup(&self) -> bool {
        self.memory_max.is_some() || self.tasks_max.is_some() || self.cpu_weight.is_some()
    }
}

/// An unchecked `sandbox` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxDraft {
    pub read_only_paths: Vec<String>,
    pub read_write_paths: Vec<String>,
    pub network: Option<String>,
}

/// The confinement of a stdio server (DESIGN §10). What it may read besides
/// `read_only` (system directories, its program's prefix, its working
/// directory) is the supervisor's to work out at each start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    /// Readable (and executable) besides the defaults; absolute.
    pub read_only: Vec<PathBuf>,
    /// The only writable places besides the private `TMPDIR`; absolute.
    pub read_write: Vec<PathBuf>,
    pub network: Network,
}

/// `sandbox.network`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Network {
    /// No network at all: an empty network namespace.
    None,
    /// A private loopback only.
    Loopback,
    /// The host's network (no confinement).
    #[default]
    Host,
}

impl Network {
    pub const ALL: [Network; 3] = [Network::None, Network::Loopback, Network::Host];

    /// As written in a unit.
    pub fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Loopback => "loopback",
            Network::Host => "host",
        }
    }
}

/// An unchecked `health` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthDraft {
    pub enabled: Option<bool>,
    pub interval: Option<Duration>,
    pub timeout: Option<Duration>,
    pub failures: Option<i128>,
}

/// `[A-Za-z_][A-Za-z0-9_]*`
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A user name (`[A-Za-z0-9._][A-Za-z0-9._-]*`, at most 32 chars) or a numeric uid.
fn is_user_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 32
        && matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// An RFC 9110 token.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
}

impl UnitSpec {
    /// Validates a draft. All broken rules are returned at once.
    pub fn new(draft: UnitDraft) -> Result<Self, Vec<SpecError>> {
        let mut judge = Judge::default();

        if let Some(description) = &draft.description {
            if description.chars().any(char::is_control) {
                judge.fail(
                    Field::Description,
                    "`description` must be one line without control characters",
                );
            } else if description.chars().count() > MAX_DESCRIPTION_CHARS {
                judge.fail(
                    Field::Description,
                    format!("`description` is longer than {MAX_DESCRIPTION_CHARS} characters"),
                );
            }
        }

        let transport = match (draft.stdio, draft.http) {
            (Some(stdio), None) => Some(Transport::Stdio(StdioSpec::judge(&mut judge, stdio))),
            (None, Some(http)) => HttpSpec::judge(&mut judge, http).map(Transport::Http),
            (Some(_), Some(_)) => {
                let e = judge.fail(
                    Field::Http,
                    "a unit has exactly one transport, but both `stdio` and `http` are given",
                );
                e.related = Some(Field::Stdio);
                e.help =
                    Some("keep either the `stdio { … }` block or the `http \"URL\"` node".into());
                None
            }
            (None, None) => {
                judge
                    .fail(
                        Field::Unit,
                        "no transport: expected a `stdio` or an `http` node",
                    )
                    .help = Some(
                    "add `stdio { command \"/path/to/server\" }` or `http \"https://host/mcp\"`"
                        .into(),
                );
                None
            }
        };

        let reconnect = ReconnectPolicy::judge(&mut judge, draft.reconnect);
        let health = HealthPolicy::judge(&mut judge, draft.health);
        let limits = judge.limits(draft.limits);
        if matches!(transport, Some(Transport::Http(_))) && limits != Limits::default() {
            judge.fail(
                Field::Http,
                "`limits` applies to the processes of a stdio server; an `http` unit has none",
            );
        }
        let sandbox = draft.sandbox.map(|d| judge.sandbox(d));
        if matches!(transport, Some(Transport::Http(_))) && sandbox.is_some() {
            judge.fail(
                Field::Sandbox,
                "`sandbox` confines the processes of a stdio server; an `http` unit has none",
            );
        }
        let log_rate_limit = judge.rate_limit(draft.log_rate_limit);
        let startup_timeout = judge.duration(
            Field::StartupTimeout,
            draft.startup_timeout,
            DEFAULT_STARTUP_TIMEOUT,
        );
        let stop_timeout =
            judge.duration(Field::StopTimeout, draft.stop_timeout, DEFAULT_STOP_TIMEOUT);
        let max_request_size = match draft.max_request_size {
            None => MAX_REQUEST_SIZE,
            Some(n) => match u64::try_from(n) {
                Ok(n) if (MIN_REQUEST_SIZE..=MAX_REQUEST_SIZE).contains(&n) => n,
                _ => {
                    judge.fail(
                        Field::MaxRequestSize,
                        format!(
                            "`max-request-size` must be between 1K and 16M (the line limit), got {n} bytes"
                        ),
                    );
                    MAX_REQUEST_SIZE
                }
            },
        };
        let sessions = judge.sessions(draft.sessions.as_deref(), draft.max_instances);
        let activation = judge.activation(
            draft.start.as_deref(),
            draft.idle_stop,
            sessions != Sessions::Shared,
        );
        let protocol = match draft.protocol.as_deref() {
            None => Protocol::default(),
            Some(word) => Protocol::from_word(word).unwrap_or_else(|| {
                judge
                    .fail(
                        Field::Protocol,
                        format!("`protocol`: \"{word}\" is not a protocol"),
                    )
                    .help = Some("write \"auto\", \"legacy\" or \"2026-07-28\"".into());
                Protocol::default()
            }),
        };

        let credentials = draft
            .credentials
            .map(|d| judge.credentials(d))
            .unwrap_or_default();
        judge.credential_uses(&credentials, transport.as_ref());

        let roots = judge.roots(draft.roots);
        let groups = judge.groups(draft.groups);
        if let Some(alias) = &draft.alias
            && let Err(e) = super::name::UnitName::new(alias)
        {
            judge.fail(Field::Alias, format!("`alias`: {e}")).help =
                Some("an alias is written as a unit name: letters, digits, `-` and `_`".into());
        }
        let tool_filter = ToolFilter {
            allow: judge.globs(Field::ToolsAllow, draft.tools_allow),
            deny: judge.globs(Field::ToolsDeny, draft.tools_deny),
        };

        match transport {
            Some(transport) => judge.finish(Self {
                description: draft.description,
                transport,
                reconnect,
                health,
                limits,
                sandbox,
                log_rate_limit,
                startup_timeout,
                stop_timeout,
                max_request_size,
                protocol,
                activation,
                sessions,
                roots,
                groups,
                alias: draft.alias,
                tool_filter,
                credentials,
            }),
            None => Err(judge.errors),
        }
    }

    /// The one-line description, if the unit has one.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    pub fn reconnect(&self) -> ReconnectPolicy {
        self.reconnect
    }

    pub fn health(&self) -> HealthPolicy {
        self.health
    }

    /// Resource limits of the server's processes.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// How the server is confined; None: not at all.
    pub fn sandbox(&self) -> Option<&Sandbox> {
        self.sandbox.as_ref()
    }

    /// How many stderr lines reach the log; None: all of them.
    pub fn log_rate_limit(&self) -> Option<RateLimit> {
        self.log_rate_limit
    }

    /// `initialize` plus a complete `tools/list` must finish within this.
    pub fn startup_timeout(&self) -> Duration {
        self.startup_timeout
    }

    /// SIGTERM to the process group, then SIGKILL after this.
    pub fn stop_timeout(&self) -> Duration {
        self.stop_timeout
    }

    /// `max-request-size`: the largest request a host may send the server,
    /// in bytes (at most the line limit).
    pub fn max_request_size(&self) -> u64 {
        self.max_request_size
    }

    /// The era mcpd speaks with the server (DESIGN §12).
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// When the server runs: always, or on demand (DESIGN §9).
    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// Whether hosts share one server or get an instance each (DESIGN
    /// §13).
    pub fn sessions(&self) -> Sessions {
        self.sessions
    }

    /// The spec an instance of this per-host unit runs (DESIGN §13): the
    /// unit's, started for its host at once and never stopped for
    /// idleness (it stops when its host leaves).
    pub fn for_instance(&self) -> UnitSpec {
        UnitSpec {
            activation: Activation::Always,
            sessions: Sessions::Instance,
            ..self.clone()
        }
    }

    /// The spec of the instance a per-host unit runs for the D-Bus calls
    /// of one uid (DESIGN §13): on demand, stopped after the unit's
    /// `idle-stop`.
    pub fn for_caller(&self) -> UnitSpec {
        let idle_stop = self.activation.idle_stop().unwrap_or(DEFAULT_IDLE_STOP);
        UnitSpec {
            activation: Activation::OnDemand { idle_stop },
            sessions: Sessions::Shared,
            ..self.clone()
        }
    }

    /// The spec of a shared unit's 2025 lane (DESIGN §12): the unit's,
    /// pinned to the handshake, started when its first host attaches (and
    /// stopped `idle-stop` after its last one left: [`Self::lane_idle_stop`]).
    pub fn for_lane(&self) -> UnitSpec {
        UnitSpec {
            activation: Activation::Always,
            protocol: Protocol::Legacy,
            ..self.clone()
        }
    }

    /// How long a lane (DESIGN §12) stays after its last host left: the
    /// unit's `idle-stop`, or its default for a unit that runs always.
    pub fn lane_idle_stop(&self) -> Duration {
        self.activation.idle_stop().unwrap_or(DEFAULT_IDLE_STOP)
    }

    /// This spec with `protocol` (an instance in its host's era, DESIGN
    /// §12 and §13).
    pub fn with_protocol(mut self, protocol: Protocol) -> UnitSpec {
        self.protocol = protocol;
        self
    }

    /// Which tools are published and callable.
    pub fn tool_filter(&self) -> &ToolFilter {
        &self.tool_filter
    }

    /// The roots mcpd answers to the server's `roots/list` (normalized
    /// `file://` URIs); empty: mcpd declares no `roots` capability.
    pub fn roots(&self) -> &[String] {
        &self.roots
    }

    /// The groups the unit is in (`group`, DESIGN §14).
    pub fn groups(&self) -> &[String] {
        &self.groups
    }

    /// `alias`: what replaces the unit's name in an aggregate's prefix.
    pub fn alias(&self) -> Option<&str> {
        self.alias.as_deref()
    }

    /// What the server is given at each start (DESIGN §16).
    pub fn credentials(&self) -> &CredentialsSpec {
        &self.credentials
    }
}

impl CredentialsSpec {
    /// No credentials at all.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty() && self.import.is_empty()
    }

    /// `load` and `load-encrypted` lines, in order.
    pub fn sources(&self) -> &[Credential] {
        &self.sources
    }

    /// `import` globs, matched against the names in the credstores.
    pub fn import(&self) -> &[String] {
        &self.import
    }

    /// `env "VAR" "NAME"` lines.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Whether `name` may be delivered: named by a `load` line or matched
    /// by an `import` glob.
    pub fn names(&self, name: &str) -> bool {
        self.sources.iter().any(|c| c.name == name)
            || self
                .import
                .iter()
                .any(|g| wildmatch::WildMatch::new(g).matches(name))
    }
}

/// A credential's name: a file name (systemd's rule), at most 255 bytes.
pub fn is_credential_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.chars().any(char::is_control)
}

impl StdioSpec {
    fn judge(judge: &mut Judge, draft: StdioDraft) -> Self {
        let mut command = draft.command.into_iter();
        let program = command.next().unwrap_or_default();
        let args: Vec<String> = command.collect();
        if program.is_empty() {
            judge
                .fail(
                    Field::Command,
                    "`stdio.command` needs at least the program to run",
                )
                .help = Some("write `command \"/usr/bin/server\" \"--flag\"`".into());
        } else if program.contains('/') && !program.starts_with('/') {
            judge.fail(
                Field::Command,
                format!(
                    "`stdio.command`: program \"{program}\" must be an absolute path or a bare name looked up in PATH"
                ),
            );
        }
        judge.no_nul(Field::Command, &program);
        for arg in &args {
            judge.no_nul(Field::Command, arg);
        }
        if let Some(dir) = &draft.working_directory {
            judge.absolute_path(Field::WorkingDirectory, dir);
        }
        for (name, value) in &draft.env {
            judge.env_name(Field::Env(name.clone()), name);
            judge.no_nul(Field::Env(name.clone()), value);
        }
        for (i, path) in draft.env_files.iter().enumerate() {
            judge.absolute_path(Field::EnvFile(i), path);
        }
        for (i, name) in draft.pass_env.iter().enumerate() {
            judge.env_name(Field::PassEnv(i), name);
        }
        if let Some(user) = &draft.user
            && !is_user_name(user)
        {
            judge.fail(
                Field::User,
                format!("`stdio.user`: \"{user}\" is not a valid user name or uid"),
            );
        }
        Self {
            program,
            args,
            working_directory: draft.working_directory,
            env: draft.env,
            env_files: draft.env_files,
            pass_env: draft.pass_env,
            user: draft.user,
        }
    }

    /// The program: an absolute path, or a bare name looked up in PATH.
    pub fn program(&self) -> &str {
        &self.program
    }

    pub fn args(&self) -> &[String] {
        &self.args
    }

    pub fn working_directory(&self) -> Option<&Path> {
        self.working_directory.as_deref()
    }

    /// Variables set by the unit itself.
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// `KEY=VALUE` files read at every spawn, in order.
    pub fn env_files(&self) -> &[PathBuf] {
        &self.env_files
    }

    /// Variables copied from the daemon's environment.
    pub fn pass_env(&self) -> &[String] {
        &self.pass_env
    }

    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }
}

impl HttpSpec {
    fn judge(judge: &mut Judge, draft: HttpDraft) -> Option<Self> {
        let url = match url::Url::parse(&draft.url) {
            Err(_) if draft.url.is_empty() => {
                judge.fail(Field::Url, "`http` needs a URL").help =
                    Some("write `http \"https://host/mcp\"`".into());
                None
            }
            Ok(url) if !url.username().is_empty() || url.password().is_some() => {
                // Never echo the URL: it holds a credential.
                judge.fail(Field::Url, "`http`: the URL contains credentials").help = Some(
                    "credentials in a URL would be shown by status and logs; use `header \"Authorization\" \"…\"`"
                        .into(),
                );
                None
            }
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Some(url),
            Ok(url) => {
                judge.fail(
                    Field::Url,
                    format!(
                        "`http`: \"{}\" is not an http:// or https:// URL with a host",
                        url.as_str()
                    ),
                );
                None
            }
            Err(e) => {
                judge.fail(
                    Field::Url,
                    format!("`http`: \"{}\" is not a URL: {e}", draft.url),
                );
                None
            }
        };
        let mut headers = Vec::with_capacity(draft.headers.len());
        for (i, (name, value)) in draft.headers.into_iter().enumerate() {
            if !is_header_name(&name) {
                judge.fail(
                    Field::Header(i),
                    format!("`http.header`: \"{name}\" is not a valid header name"),
                );
            } else if TRANSPORT_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                judge.fail(
                    Field::Header(i),
                    format!("`http.header`: \"{name}\" is set by the MCP transport and cannot be overridden"),
                );
            }
            let value = match value {
                HeaderDraft::Value(value) => {
                    if value.chars().any(|c| c.is_control() && c != '\t') {
                        // The value is a secret: say what is wrong without showing it.
                        judge.fail(
                            Field::Header(i),
                            format!("`http.header`: the value of \"{name}\" contains a control character"),
                        );
                    }
                    HeaderValue::Literal(Secret(value))
                }
                HeaderDraft::Env(var) => {
                    if !is_env_name(&var) {
                        judge.fail(
                            Field::Header(i),
                            format!("`http.header`: env=\"{var}\" is not a valid environment variable name"),
                        );
                    } else if draft.env_files.is_empty() {
                        judge.fail(
                            Field::Header(i),
                            format!("`http.header`: \"{name}\" takes its value from {var} in an `env-file`, but the `http` block has none"),
                        )
                        .help = Some("add `env-file \"/path/to/NAME.env\"` holding `VAR=value`".into());
                    }
                    HeaderValue::Env(var)
                }
                HeaderDraft::Credential { credential, format } => {
                    let format = format.unwrap_or_else(|| CREDENTIAL_PLACEHOLDER.into());
                    if format.matches(CREDENTIAL_PLACEHOLDER).count() != 1 {
                        judge
                            .fail(
                                Field::Header(i),
                                format!("`http.header`: the format of \"{name}\" must hold `{{}}` once, where the credential goes"),
                            )
                            .help = Some("write `format=\"Bearer {}\"`".into());
                    } else if format.chars().any(|c| c.is_control() && c != '\t') {
                        judge.fail(
                            Field::Header(i),
                            format!("`http.header`: the format of \"{name}\" contains a control character"),
                        );
                    }
                    HeaderValue::Credential {
                        name: credential,
                        format,
                    }
                }
            };
            headers.push((name, value));
        }
        for (i, path) in draft.env_files.iter().enumerate() {
            judge.absolute_path(Field::HttpEnvFile(i), path);
        }
        let oauth = draft
            .oauth
            .map(|o| OAuthSpec::judge(judge, url.as_ref(), o));
        if oauth.is_some()
            && let Some(i) = headers
                .iter()
                .position(|(name, _)| name.eq_ignore_ascii_case("authorization"))
        {
            judge
                .fail(
                    Field::Header(i),
                    "`http.header \"Authorization\"` and `oauth` both say how to authenticate",
                )
                .help = Some("the login's token is the Authorization header: drop the header or the `oauth` block".into());
        }
        Some(Self {
            url: url?,
            env_files: draft.env_files,
            headers,
            oauth,
        })
    }

    /// `oauth { }`: the server needs a login (DESIGN §17).
    pub fn oauth(&self) -> Option<&OAuthSpec> {
        self.oauth.as_ref()
    }

    pub fn url(&self) -> &url::Url {
        &self.url
    }

    /// Extra request headers; values are secrets.
    pub fn headers(&self) -> &[(String, HeaderValue)] {
        &self.headers
    }

    /// Files of `KEY=VALUE` lines that `header … env=` values come from.
    pub fn env_files(&self) -> &[PathBuf] {
        &self.env_files
    }
}

impl HealthPolicy {
    /// Builds a policy, judging every bound (see [`UnitSpec::new`]).
    pub fn new(draft: HealthDraft) -> Result<Self, Vec<SpecError>> {
        let mut judge = Judge::default();
        let policy = Self::judge(&mut judge, draft);
        judge.finish(policy)
    }

    fn judge(judge: &mut Judge, draft: HealthDraft) -> Self {
        let interval = judge.duration(
            Field::HealthInterval,
            draft.interval,
            DEFAULT_HEALTH_INTERVAL,
        );
        // A shorter interval than the default timeout lowers the default.
        let timeout = match draft.timeout {
            None => DEFAULT_HEALTH_TIMEOUT.min(interval),
            given => judge.duration(Field::HealthTimeout, given, DEFAULT_HEALTH_TIMEOUT),
        };
        if timeout > interval {
            let e = judge.fail(
                Field::HealthTimeout,
                format!(
                    "`health.timeout` ({}) is longer than `health.interval` ({})",
                    humantime::format_duration(timeout),
                    humantime::format_duration(interval),
                ),
            );
            e.related = Some(Field::HealthInterval);
            e.help = Some(
                "a probe is sent after `interval` of silence and waits `timeout` for its answer"
                    .into(),
            );
        }
        let failures = match draft.failures {
            None => DEFAULT_HEALTH_FAILURES,
            Some(n) => match u32::try_from(n) {
                Ok(n) if (1..=MAX_HEALTH_FAILURES).contains(&n) => n,
                _ => {
                    judge
                        .fail(
                            Field::HealthFailures,
                            format!(
                                "`health.failures` must be between 1 and {MAX_HEALTH_FAILURES}, got {n}"
                            ),
                        )
                        .help = Some("to never probe, write `enabled #false` instead".into());
                    DEFAULT_HEALTH_FAILURES
                }
            },
        };
        Self {
            enabled: draft.enabled.unwrap_or(true),
            interval,
            timeout,
            failures,
        }
    }

    /// Whether the server is probed at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Silence from the server before a probe.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// How long a probe waits for its answer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Consecutive unanswered probes that end the generation.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: DEFAULT_HEALTH_INTERVAL,
            timeout: DEFAULT_HEALTH_TIMEOUT,
            failures: DEFAULT_HEALTH_FAILURES,
        }
    }
}

impl ReconnectPolicy {
    /// Builds a policy, judging every bound (see [`UnitSpec::new`]).
    pub fn new(draft: ReconnectDraft) -> Result<Self, Vec<SpecError>> {
        let mut judge = Judge::default();
        let policy = Self::judge(&mut judge, draft);
        judge.finish(policy)
    }

    fn judge(judge: &mut Judge, draft: ReconnectDraft) -> Self {
        let initial_delay = judge.duration(
            Field::InitialDelay,
            draft.initial_delay,
            DEFAULT_INITIAL_DELAY,
        );
        let max_delay = judge.duration(Field::MaxDelay, draft.max_delay, DEFAULT_MAX_DELAY);
        if initial_delay > max_delay {
            let e = judge.fail(
                Field::InitialDelay,
                format!(
                    "`reconnect.initial-delay` ({}) is longer than `reconnect.max-delay` ({})",
                    humantime::format_duration(initial_delay),
                    humantime::format_duration(max_delay),
                ),
            );
            e.related = Some(Field::MaxDelay);
            e.help = Some(
                "the first retry waits initial-delay, later ones double up to max-delay".into(),
            );
        }
        let max_attempts = match draft.max_attempts {
            None => DEFAULT_MAX_ATTEMPTS,
            Some(n) => match u32::try_from(n) {
                Ok(n) if n >= 1 => n,
                _ => {
                    judge
                        .fail(
                            Field::MaxAttempts,
                            format!(
                                "`reconnect.max-attempts` must be between 1 and {}, got {n}",
                                u32::MAX
                            ),
                        )
                        .help = Some("to never retry, write `enabled #false` instead".into());
                    DEFAULT_MAX_ATTEMPTS
                }
            },
        };
        Self {
            enabled: draft.enabled.unwrap_or(true),
            initial_delay,
            max_delay,
            max_attempts,
        }
    }

    /// Whether a failed or lost server is retried at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn initial_delay(&self) -> Duration {
        self.initial_delay
    }

    /// The longest wait, and the stability window that ends an outage.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// Retries per outage (the first start is not a retry).
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The wait before retry `k` (1-based): `min(initial·2^(k−1), max)`.
    pub fn delay(&self, retry: u32) -> Duration {
        let exponent = retry.saturating_sub(1).min(63);
        let factor = 1u64 << exponent;
        self.initial_delay
            .checked_mul(u32::try_from(factor).unwrap_or(u32::MAX))
            .map_or(self.max_delay, |d| d.min(self.max_delay))
    }
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            initial_delay: DEFAULT_INITIAL_DELAY,
            max_delay: DEFAULT_MAX_DELAY,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }
}

impl Secret {
    /// The secret itself, for the transport only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio() -> StdioDraft {
        StdioDraft {
            command: vec!["/bin/true".into()],
            ..StdioDraft::default()
        }
    }

    fn draft() -> UnitDraft {
        UnitDraft {
            stdio: Some(stdio()),
            ..UnitDraft::default()
        }
    }

    fn fields(result: Result<UnitSpec, Vec<SpecError>>) -> Vec<Field> {
        result
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let spec = UnitSpec::new(draft()).expect("valid");
        let r = spec.reconnect();
        assert!(r.enabled());
        assert_eq!(r.initial_delay(), Duration::from_millis(500));
        assert_eq!(r.max_delay(), Duration::from_secs(30));
        assert_eq!(r.max_attempts(), 10);
        assert_eq!(spec.startup_timeout(), Duration::from_secs(30));
        assert_eq!(spec.stop_timeout(), Duration::from_secs(5));
    }

    #[test]
    fn default_schedule_adds_up_to_151_5_seconds() {
        let r = ReconnectPolicy::default();
        let waits: Vec<f64> = (1..=10).map(|k| r.delay(k).as_secs_f64()).collect();
        assert_eq!(
            waits,
            [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]
        );
        assert_eq!(waits.iter().sum::<f64>(), 151.5);
        assert_eq!(r.delay(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn code_cannot_build_an_invalid_policy() {
        let bad = ReconnectDraft {
            initial_delay: Some(Duration::from_secs(60)),
            max_delay: Some(Duration::from_secs(1)),
            max_attempts: Some(0),
            enabled: None,
        };
        let errors = ReconnectPolicy::new(bad).expect_err("invalid");
        let fields: Vec<_> = errors.iter().map(|e| e.field.clone()).collect();
        assert_eq!(fields, [Field::InitialDelay, Field::MaxAttempts]);
        assert_eq!(errors[0].related, Some(Field::MaxDelay));
        let zero = ReconnectDraft {
            initial_delay: Some(Duration::ZERO),
            ..ReconnectDraft::default()
        };
        assert!(ReconnectPolicy::new(zero).is_err());
    }

    #[test]
    fn code_cannot_build_an_invalid_unit() {
        assert_eq!(fields(UnitSpec::new(UnitDraft::default())), [Field::Unit]);
        let both = UnitDraft {
            http: Some(HttpDraft {
                url: "http://127.0.0.1:1/mcp".into(),
                headers: vec![],
                ..Default::default()
            }),
            ..draft()
        };
        assert_eq!(fields(UnitSpec::new(both)), [Field::Http]);
        let relative = UnitDraft {
            stdio: Some(StdioDraft {
                command: vec!["bin/server".into()],
                working_directory: Some("relative".into()),
                env: [("1BAD".to_string(), "x".to_string())].into(),
                ..StdioDraft::default()
            }),
            stop_timeout: Some(Duration::from_secs(100_000)),
            ..UnitDraft::default()
        };
        assert_eq!(
            fields(UnitSpec::new(relative)),
            [
                Field::Command,
                Field::WorkingDirectory,
                Field::Env("1BAD".into()),
                Field::StopTimeout
            ]
        );
    }

    #[test]
    fn header_values_are_never_shown() {
        let spec = UnitSpec::new(UnitDraft {
            http: Some(HttpDraft {
                url: "https://mcp.example.com/mcp".into(),
                headers: vec![("Authorization".into(), "Bearer hunter2".into())],
                env_files: vec![],
                oauth: None,
            }),
            ..UnitDraft::default()
        })
        .expect("valid");
        let shown = format!("{spec:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<redacted>"));
        let bad = UnitSpec::new(UnitDraft {
            http: Some(HttpDraft {
                url: "https://mcp.example.com/mcp".into(),
                headers: vec![("X-Token".into(), "hunter2\n".into())],
                env_files: vec![],
                oauth: None,
            }),
            ..UnitDraft::default()
        })
        .expect_err("control character");
        assert!(!bad[0].message.contains("hunter2"));
    }
}
