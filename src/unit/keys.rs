//! The unit vocabulary, each key defined once: where it may appear, how its
//! value is read, how drop-ins merge it, and the [`Field`] its errors name.
//!
//! The reader ([`super::syntax`]) dispatches on this table, checks
//! duplicates and merges layers by it; [`Field::key`] names keys from it;
//! [`super::vocabulary`] lists it (the man-page test and "did you mean"
//! use that). Adding a key is a row here (and its [`Field`] variant), its
//! draft field (read in `Layer::into_draft`) and its rule in
//! [`super::spec`].

/// Where a key may appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Block {
    /// The top level of a unit file.
    Top,
    Stdio,
    Http,
    Reconnect,
    Health,
    Limits,
    Sandbox,
    Tools,
    Credentials,
    /// `oauth { }`, inside `http` (DESIGN §17).
    OAuth,
}

impl Block {
    /// The block's key (`stdio`), none for the top level.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Block::Top => None,
            Block::Stdio => Some("stdio"),
            Block::Http => Some("http"),
            Block::Reconnect => Some("reconnect"),
            Block::Health => Some("health"),
            Block::Limits => Some("limits"),
            Block::Sandbox => Some("sandbox"),
            Block::Tools => Some("tools"),
            Block::Credentials => Some("credentials"),
            Block::OAuth => Some("oauth"),
        }
    }

    /// "in `stdio`", "at the top level".
    pub fn here(self) -> String {
        match self.name() {
            Some(b) => format!("in `{b}`"),
            None => "at the top level".into(),
        }
    }

    /// "the `stdio` block", "the top level".
    pub fn home(self) -> String {
        match self.name() {
            Some(b) => format!("the `{b}` block"),
            None => "the top level".into(),
        }
    }
}

/// How a key's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `key { … }`: no arguments, the settings of `inner` inside. Without a
    /// block, `required` reports "needs a block"; otherwise the spec says
    /// what is missing.
    Block { inner: Block, required: bool },
    /// `http "URL" { … }`: one string argument, then optionally the
    /// settings of `inner`.
    Endpoint { inner: Block },
    /// One string.
    String,
    /// One string that is a path.
    Path,
    /// One or more strings.
    Strings,
    /// One duration string ("30s").
    Duration,
    /// `#true` or `#false`.
    Bool,
    /// One integer.
    Integer,
    /// `NAME="value"` properties.
    Env,
    /// A name and a value (never echoed: usually a credential).
    Header,
    /// A line count and a duration (`10000 "30s"`), or `#false`.
    RateLimit,
    /// A size in bytes: an integer, or a string with a K/M/G/T suffix
    /// (powers of 1024, as systemd reads them).
    Size,
    /// Two strings: a name and what it stands for (`load "NAME" "PATH"`).
    Pair,
    /// `credential="NAME"`: one property naming a credential (§16).
    CredentialRef,
}

/// How a later layer (a drop-in) combines with an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// Set once per file; a later layer replaces it.
    Replace,
    /// May repeat; every value is kept, in order.
    Append,
    /// May repeat; a value already there is not added again.
    AppendUnique,
    /// May repeat; entries are replaced by name.
    ByName,
}

/// A key of the unit vocabulary, used to point errors at their origin.
///
/// It is defined here, beside the table that names each field's key, so
/// the vocabulary needs nothing of the spec judge that reports with it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// The unit as a whole (e.g. no transport at all).
    Unit,
    Description,
    Stdio,
    Command,
    WorkingDirectory,
    Env(String),
    EnvFile(usize),
    PassEnv(usize),
    User,
    Http,
    Url,
    HttpEnvFile(usize),
    Header(usize),
    ReconnectEnabled,
    InitialDelay,
    MaxDelay,
    MaxAttempts,
    HealthEnabled,
    HealthInterval,
    HealthTimeout,
    HealthFailures,
    MemoryMax,
    TasksMax,
    CpuWeight,
    Nofile,
    Core,
    Sandbox,
    ReadOnlyPaths(usize),
    ReadWritePaths(usize),
    Network,
    LogRateLimit,
    StartupTimeout,
    StopTimeout,
    MaxRequestSize,
    Protocol,
    Start,
    IdleStop,
    Sessions,
    MaxInstances,
    Roots(usize),
    Group(usize),
    Alias,
    ToolsAllow(usize),
    ToolsDeny(usize),
    Credentials,
    CredentialLoad(usize),
    CredentialImport(usize),
    CredentialEncrypted(usize),
    CredentialEnv(usize),
    OAuth,
    OAuthClientId,
    OAuthClientSecret,
    OAuthScope,
    OAuthRedirectPort,
    OAuthGrant,
}

impl Field {
    /// The key as written in a unit file, e.g. `reconnect.max-delay`
    /// (from the vocabulary table, [`KEYS`]).
    pub fn key(&self) -> String {
        match self {
            Field::Unit => "unit".into(),
            Field::Env(name) => format!("stdio.env {name}"),
            Field::Url => "http".into(),
            other => of(other).map_or_else(|| "unit".into(), |k| k.path()),
        }
    }
}

/// One key of the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub block: Block,
    pub name: &'static str,
    pub kind: Kind,
    pub merge: Merge,
    /// What errors about the key name (for repeatable keys, the variant
    /// with index 0 stands for every index); none for a block that is only
    /// a container (`reconnect`).
    pub field: Option<Field>,
    /// A value to show in "write `key …`" hints.
    pub example: &'static str,
}

impl Key {
    /// The key as errors name it: `reconnect.max-delay`, `description`.
    pub fn path(&self) -> String {
        match self.block.name() {
            Some(block) => format!("{block}.{}", self.name),
            None => self.name.to_owned(),
        }
    }

    /// Whether `path` (as [`Key::path`] writes it) names this key; no
    /// allocation.
    pub fn is(&self, path: &str) -> bool {
        match self.block.name() {
            Some(block) => path
                .strip_prefix(block)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|name| name == self.name),
            None => path == self.name,
        }
    }

    /// Whether the key may be given more than once in a file.
    pub fn repeatable(&self) -> bool {
        self.merge != Merge::Replace
    }
}

const fn key(
    block: Block,
    name: &'static str,
    kind: Kind,
    merge: Merge,
    field: Option<Field>,
    example: &'static str,
) -> Key {
    Key {
        block,
        name,
        kind,
        merge,
        field,
        example,
    }
}

use Block::{Credentials, Health, Http, Limits, OAuth, Reconnect, Sandbox, Stdio, Tools, Top};
use Merge::{Append, AppendUnique, ByName, Replace};

/// Every key, in the order the man page documents them.
pub const KEYS: &[Key] = &[
    key(
        Top,
        "description",
        Kind::String,
        Replace,
        Some(Field::Description),
        "\"What this server does\"",
    ),
    key(
        Top,
        "stdio",
        Kind::Block {
            inner: Stdio,
            required: false,
        },
        Replace,
        Some(Field::Stdio),
        "{ command \"/path/to/server\" }",
    ),
    key(
        Top,
        "http",
        Kind::Endpoint { inner: Http },
        Replace,
        Some(Field::Http),
        "\"https://host/mcp\"",
    ),
    key(
        Top,
        "reconnect",
        Kind::Block {
            inner: Reconnect,
            required: true,
        },
        Replace,
        None,
        "{ … }",
    ),
    key(
        Top,
        "health",
        Kind::Block {
            inner: Health,
            required: true,
        },
        Replace,
        None,
        "{ interval \"30s\"; }",
    ),
    key(
        Top,
        "limits",
        Kind::Block {
            inner: Limits,
            required: true,
        },
        Replace,
        None,
        "{ nofile 1024; }",
    ),
    key(
        Top,
        "sandbox",
        Kind::Block {
            inner: Sandbox,
            required: false,
        },
        Replace,
        Some(Field::Sandbox),
        "{ network \"none\"; }",
    ),
    key(
        Top,
        "log-rate-limit",
        Kind::RateLimit,
        Replace,
        Some(Field::LogRateLimit),
        "10000 \"30s\"",
    ),
    key(
        Top,
        "startup-timeout",
        Kind::Duration,
        Replace,
        Some(Field::StartupTimeout),
        "\"30s\"",
    ),
    key(
        Top,
        "stop-timeout",
        Kind::Duration,
        Replace,
        Some(Field::StopTimeout),
        "\"30s\"",
    ),
    key(
        Top,
        "max-request-size",
        Kind::Size,
        Replace,
        Some(Field::MaxRequestSize),
        "\"1M\"",
    ),
    key(
        Top,
        "protocol",
        Kind::String,
        Replace,
        Some(Field::Protocol),
        "\"auto\"",
    ),
    key(
        Top,
        "start",
        Kind::String,
        Replace,
        Some(Field::Start),
        "\"on-demand\"",
    ),
    key(
        Top,
        "idle-stop",
        Kind::Duration,
        Replace,
        Some(Field::IdleStop),
        "\"10m\"",
    ),
    key(
        Top,
        "sessions",
        Kind::String,
        Replace,
        Some(Field::Sessions),
        "\"per-host\"",
    ),
    key(
        Top,
        "max-instances",
        Kind::Integer,
        Replace,
        Some(Field::MaxInstances),
        "16",
    ),
    key(
        Top,
        "group",
        Kind::Strings,
        AppendUnique,
        Some(Field::Group(0)),
        "\"dev\"",
    ),
    key(
        Top,
        "alias",
        Kind::String,
        Replace,
        Some(Field::Alias),
        "\"gh\"",
    ),
    key(
        Top,
        "roots",
        Kind::Strings,
        AppendUnique,
        Some(Field::Roots(0)),
        "\"file:///srv/repo\"",
    ),
    key(
        Top,
        "tools",
        Kind::Block {
            inner: Tools,
            required: true,
        },
        Replace,
        None,
        "{ deny \"delete_*\" }",
    ),
    key(
        Top,
        "credentials",
        Kind::Block {
            inner: Credentials,
            required: false,
        },
        Replace,
        Some(Field::Credentials),
        "{ load \"gh\" \"/etc/mcpd/gh.token\"; }",
    ),
    key(
        Credentials,
        "load",
        Kind::Pair,
        ByName,
        Some(Field::CredentialLoad(0)),
        "\"gh\" \"/etc/mcpd/gh.token\"",
    ),
    key(
        Credentials,
        "import",
        Kind::Strings,
        AppendUnique,
        Some(Field::CredentialImport(0)),
        "\"github.*\"",
    ),
    key(
        Credentials,
        "load-encrypted",
        Kind::Pair,
        ByName,
        Some(Field::CredentialEncrypted(0)),
        "\"gh\" \"/etc/mcpd/gh.cred\"",
    ),
    key(
        Credentials,
        "env",
        Kind::Pair,
        ByName,
        Some(Field::CredentialEnv(0)),
        "\"GITHUB_TOKEN\" \"gh\"",
    ),
    key(
        Tools,
        "allow",
        Kind::Strings,
        AppendUnique,
        Some(Field::ToolsAllow(0)),
        "\"read_*\" \"search\"",
    ),
    key(
        Tools,
        "deny",
        Kind::Strings,
        AppendUnique,
        Some(Field::ToolsDeny(0)),
        "\"delete_*\"",
    ),
    key(
        Stdio,
        "command",
        Kind::Strings,
        Replace,
        Some(Field::Command),
        "\"/usr/bin/server\" \"--flag\"",
    ),
    key(
        Stdio,
        "working-directory",
        Kind::Path,
        Replace,
        Some(Field::WorkingDirectory),
        "\"/var/lib/server\"",
    ),
    key(
        Stdio,
        "env",
        Kind::Env,
        ByName,
        Some(Field::Env(String::new())),
        "GITHUB_HOST=\"github.com\"",
    ),
    key(
        Stdio,
        "env-file",
        Kind::Path,
        Append,
        Some(Field::EnvFile(0)),
        "\"/etc/mcpd/server.env\"",
    ),
    key(
        Stdio,
        "pass-env",
        Kind::Strings,
        AppendUnique,
        Some(Field::PassEnv(0)),
        "\"HTTPS_PROXY\"",
    ),
    key(
        Stdio,
        "user",
        Kind::String,
        Replace,
        Some(Field::User),
        "\"mcp-server\"",
    ),
    key(
        Http,
        "env-file",
        Kind::Path,
        Append,
        Some(Field::HttpEnvFile(0)),
        "\"/etc/mcpd/server.env\"",
    ),
    key(
        Http,
        "header",
        Kind::Header,
        ByName,
        Some(Field::Header(0)),
        "\"Authorization\" \"Bearer …\"",
    ),
    key(
        Http,
        "oauth",
        Kind::Block {
            inner: OAuth,
            required: false,
        },
        Replace,
        Some(Field::OAuth),
        "{ client-id \"mcpd\"; }",
    ),
    key(
        OAuth,
        "client-id",
        Kind::String,
        Replace,
        Some(Field::OAuthClientId),
        "\"mcpd-client\"",
    ),
    key(
        OAuth,
        "client-secret",
        Kind::CredentialRef,
        Replace,
        Some(Field::OAuthClientSecret),
        "credential=\"NAME\"",
    ),
    key(
        OAuth,
        "scope",
        Kind::String,
        Replace,
        Some(Field::OAuthScope),
        "\"repo read:org\"",
    ),
    key(
        OAuth,
        "redirect-port",
        Kind::Integer,
        Replace,
        Some(Field::OAuthRedirectPort),
        "3118",
    ),
    key(
        OAuth,
        "grant",
        Kind::String,
        Replace,
        Some(Field::OAuthGrant),
        "\"authorization-code\"",
    ),
    key(
        Reconnect,
        "enabled",
        Kind::Bool,
        Replace,
        Some(Field::ReconnectEnabled),
        "#true",
    ),
    key(
        Reconnect,
        "initial-delay",
        Kind::Duration,
        Replace,
        Some(Field::InitialDelay),
        "\"30s\"",
    ),
    key(
        Reconnect,
        "max-delay",
        Kind::Duration,
        Replace,
        Some(Field::MaxDelay),
        "\"30s\"",
    ),
    key(
        Reconnect,
        "max-attempts",
        Kind::Integer,
        Replace,
        Some(Field::MaxAttempts),
        "10",
    ),
    key(
        Limits,
        "memory-max",
        Kind::Size,
        Replace,
        Some(Field::MemoryMax),
        "\"512M\"",
    ),
    key(
        Limits,
        "tasks-max",
        Kind::Integer,
        Replace,
        Some(Field::TasksMax),
        "64",
    ),
    key(
        Limits,
        "cpu-weight",
        Kind::Integer,
        Replace,
        Some(Field::CpuWeight),
        "100",
    ),
    key(
        Limits,
        "nofile",
        Kind::Integer,
        Replace,
        Some(Field::Nofile),
        "1024",
    ),
    key(Limits, "core", Kind::Size, Replace, Some(Field::Core), "0"),
    key(
        Sandbox,
        "read-only-paths",
        Kind::Strings,
        AppendUnique,
        Some(Field::ReadOnlyPaths(0)),
        "\"/srv/data\"",
    ),
    key(
        Sandbox,
        "read-write-paths",
        Kind::Strings,
        AppendUnique,
        Some(Field::ReadWritePaths(0)),
        "\"/var/lib/server\"",
    ),
    key(
        Sandbox,
        "network",
        Kind::String,
        Replace,
        Some(Field::Network),
        "\"none\"",
    ),
    key(
        Health,
        "enabled",
        Kind::Bool,
        Replace,
        Some(Field::HealthEnabled),
        "#true",
    ),
    key(
        Health,
        "interval",
        Kind::Duration,
        Replace,
        Some(Field::HealthInterval),
        "\"30s\"",
    ),
    key(
        Health,
        "timeout",
        Kind::Duration,
        Replace,
        Some(Field::HealthTimeout),
        "\"10s\"",
    ),
    key(
        Health,
        "failures",
        Kind::Integer,
        Replace,
        Some(Field::HealthFailures),
        "3",
    ),
];

/// The key `name` in `block`.
pub fn lookup(block: Block, name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.block == block && k.name == name)
}

/// The names of the keys of `block`.
pub fn names(block: Block) -> Vec<&'static str> {
    KEYS.iter()
        .filter(|k| k.block == block)
        .map(|k| k.name)
        .collect()
}

/// The key named by `path` (`reconnect.max-delay`).
pub fn by_path(path: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.is(path))
}

/// The key a field belongs to (repeatable fields by variant).
pub fn of(field: &Field) -> Option<&'static Key> {
    KEYS.iter().find(|k| {
        k.field
            .as_ref()
            .is_some_and(|f| std::mem::discriminant(f) == std::mem::discriminant(field))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_is_a_key_and_every_field_names_one_key() {
        for block in [
            Stdio,
            Http,
            Reconnect,
            Health,
            Limits,
            Sandbox,
            Tools,
            Credentials,
            OAuth,
        ] {
            let name = block.name().expect("a nested block has a name");
            let row = lookup(Top, name)
                .or_else(|| lookup(Http, name))
                .expect("the block is a key of the top level or of `http`");
            assert!(matches!(
                row.kind,
                Kind::Block { inner, .. } | Kind::Endpoint { inner } if inner == block
            ));
        }
        for key in KEYS {
            assert_eq!(by_path(&key.path()), Some(key));
            assert!(!key.is(&format!("x{}", key.path())));
        }
        for (i, a) in KEYS.iter().enumerate() {
            for b in &KEYS[i + 1..] {
                assert!(
                    !(a.block == b.block && a.name == b.name),
                    "{} twice",
                    a.path()
                );
                if let (Some(fa), Some(fb)) = (&a.field, &b.field) {
                    assert_ne!(
                        std::mem::discriminant(fa),
                        std::mem::discriminant(fb),
                        "{} and {} name the same field",
                        a.path(),
                        b.path()
                    );
                }
            }
        }
    }
}
