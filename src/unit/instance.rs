//! Which daemon instance: one per machine or one per user, with the facts
//! that follow from it for the daemon and `mcpctl` alike (the default
//! instance, its runtime directory, the rules its units are loaded under),
//! so that both sides always find the same daemon.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Which daemon instance: one per machine, or one per user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instance {
    System,
    User,
}

impl Instance {
    pub fn as_str(self) -> &'static str {
        match self {
            Instance::System => "system",
            Instance::User => "user",
        }
    }

    /// System when running as root, else user (DESIGN §4).
    pub fn by_default() -> Self {
        if rustix::process::geteuid().is_root() {
            Instance::System
        } else {
            Instance::User
        }
    }

    /// The runtime directory (lock, private socket) of this instance as
    /// seen from this process's environment; see [`runtime_dir`].
    pub fn runtime_dir(self) -> PathBuf {
        runtime_dir(
            self,
            |var| std::env::var_os(var),
            rustix::process::geteuid().as_raw(),
            owned_dir,
        )
    }

    /// This instance's runtime directory as this process sees it, when a
    /// host that starts `mcpctl bridge` with only [`HOST_DEFAULT_ENV`]
    /// would look elsewhere (`XDG_RUNTIME_DIR` or `MCPD_RUNTIME_DIR` set to
    /// another place, no `/run/user/UID`).
    pub fn runtime_dir_hidden_from_hosts(self) -> Option<PathBuf> {
        let here = self.runtime_dir();
        let hosts = runtime_dir(
            self,
            |var| {
                HOST_DEFAULT_ENV
                    .contains(&var)
                    .then(|| std::env::var_os(var))
                    .flatten()
            },
            rustix::process::geteuid().as_raw(),
            owned_dir,
        );
        (here != hosts).then_some(here)
    }

    /// The state directory (on-demand caches) of this instance as seen
    /// from this process's environment; see [`state_dir`].
    pub fn state_dir(self) -> PathBuf {
        state_dir(self, |var| std::env::var_os(var))
    }

    /// The credstore of this instance (DESIGN §16) as seen from this
    /// process's environment; see [`credstore`].
    pub fn credstore(self) -> PathBuf {
        credstore(self, |var| std::env::var_os(var))
    }

    /// The rules units are loaded under by this instance's daemon, run as
    /// this process's user.
    pub fn load_context(self) -> Context {
        let uid = rustix::process::geteuid().as_raw();
        let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name);
        Context {
            instance: Some(self),
            own_user: Some((uid, name)),
        }
    }
}

/// Where a unit is loaded: rules that depend on the daemon, not the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// The instance that will run the unit; None (as `mcpctl verify` without
    /// `--user`/`--system`) checks only what holds everywhere.
    pub instance: Option<Instance>,
    /// The user the daemon runs as: its uid and, when known, its name.
    pub own_user: Option<(u32, Option<String>)>,
}

/// What the official MCP SDKs give a stdio server they spawn (Python
/// `get_default_environment`, TypeScript `getDefaultEnvironment`): all a
/// host's `mcpctl bridge` may have to find its daemon with.
pub const HOST_DEFAULT_ENV: [&str; 6] = ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"];

/// Whether `dir` is a directory owned by `uid`.
fn owned_dir(dir: &Path, uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == uid)
}

/// `/run/mcpd` for the system instance; `$XDG_RUNTIME_DIR/mcpd` for a user
/// instance. Without `XDG_RUNTIME_DIR` (a host that spawns `mcpctl bridge`
/// with a minimal environment, as the official MCP SDKs do) a user instance
/// uses `/run/user/UID/mcpd` when `/run/user/UID` is a directory the user
/// owns (where systemd-logind puts it, and where libsystemd looks), else
/// `$TMPDIR/mcpd-UID`. `MCPD_RUNTIME_DIR` overrides all of these (several
/// daemons on one machine, tests). `owned(dir, uid)` says whether `dir` is a
/// directory owned by `uid`.
pub fn runtime_dir(
    instance: Instance,
    env: impl Fn(&str) -> Option<OsString>,
    uid: u32,
    owned: impl Fn(&Path, u32) -> bool,
) -> PathBuf {
    let absolute = |var: &str| env(var).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(dir) = absolute("MCPD_RUNTIME_DIR") {
        return dir;
    }
    match instance {
        Instance::System => PathBuf::from("/run/mcpd"),
        Instance::User => {
            if let Some(dir) = absolute("XDG_RUNTIME_DIR") {
                return dir.join("mcpd");
            }
            let logind = PathBuf::from(format!("/run/user/{uid}"));
            if owned(&logind, uid) {
                return logind.join("mcpd");
            }
            let tmp = absolute("TMPDIR").unwrap_or_else(|| PathBuf::from("/tmp"));
            tmp.join(format!("mcpd-{uid}"))
        }
    }
}

/// The file in an instance's state directory naming the runtime directory
/// of its running daemon, so that a bridge that found no daemon where it
/// looked can say where one runs.
pub const RUNTIME_BREADCRUMB: &str = "runtime-dir";

/// `/var/lib/mcpd` for the system instance; `$XDG_STATE_HOME/mcpd` (else
/// `~/.local/state/mcpd`) for a user instance. systemd's
/// `$STATE_DIRECTORY` (from `StateDirectory=mcpd`, its first entry) wins
/// over both, and `MCPD_STATE_DIR` over everything (tests, several daemons).
/// The credstore `credentials { import … }` looks in first and `mcpctl
/// credential` and `mcpctl import` write (DESIGN §16):
/// `/etc/mcpd/credstore` for the system instance,
/// `$XDG_CONFIG_HOME/mcpd/credstore` (else `~/.config/mcpd/credstore`) for
/// a user instance.
pub fn credstore(instance: Instance, env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let absolute = |var: &str| env(var).map(PathBuf::from).filter(|p| p.is_absolute());
    match instance {
        Instance::System => PathBuf::from("/etc/mcpd/credstore"),
        Instance::User => absolute("XDG_CONFIG_HOME")
            .or_else(|| absolute("HOME").map(|h| h.join(".config")))
            .unwrap_or_else(|| PathBuf::from("/nonexistent/.config"))
            .join("mcpd/credstore"),
    }
}

pub fn state_dir(instance: Instance, env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let absolute = |var: &str| env(var).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(dir) = absolute("MCPD_STATE_DIR") {
        return dir;
    }
    let systemd = env("STATE_DIRECTORY")
        .and_then(|v| {
            v.to_str()
                .and_then(|v| v.split(':').next())
                .map(PathBuf::from)
        })
        .filter(|p| p.is_absolute());
    if let Some(dir) = systemd {
        return dir;
    }
    match instance {
        Instance::System => PathBuf::from("/var/lib/mcpd"),
        Instance::User => absolute("XDG_STATE_HOME")
            .or_else(|| absolute("HOME").map(|home| home.join(".local/state")))
            .unwrap_or_else(|| {
                std::env::temp_dir().join(format!(
                    "mcpd-state-{}",
                    rustix::process::geteuid().as_raw()
                ))
            })
            .join("mcpd"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_dirs() {
        /// instance, environment, want
        type Case = (
            Instance,
            &'static [(&'static str, &'static str)],
            &'static str,
        );
        let cases: [Case; 7] = [
            (Instance::System, &[], "/var/lib/mcpd"),
            (
                Instance::System,
                &[("STATE_DIRECTORY", "/var/lib/mcpd:/x")],
                "/var/lib/mcpd",
            ),
            (
                Instance::System,
                &[("MCPD_STATE_DIR", "/s"), ("STATE_DIRECTORY", "/x")],
                "/s",
            ),
            (
                Instance::User,
                &[("HOME", "/home/a")],
                "/home/a/.local/state/mcpd",
            ),
            (
                Instance::User,
                &[("HOME", "/home/a"), ("XDG_STATE_HOME", "/st")],
                "/st/mcpd",
            ),
            (
                Instance::User,
                &[
                    ("STATE_DIRECTORY", "/home/a/.local/state/mcpd"),
                    ("XDG_STATE_HOME", "/st"),
                ],
                "/home/a/.local/state/mcpd",
            ),
            // relative values are ignored
            (
                Instance::User,
                &[
                    ("HOME", "/home/a"),
                    ("XDG_STATE_HOME", "st"),
                    ("MCPD_STATE_DIR", "s"),
                ],
                "/home/a/.local/state/mcpd",
            ),
        ];
        for (instance, vars, want) in cases {
            let env = |var: &str| {
                vars.iter()
                    .find(|(k, _)| *k == var)
                    .map(|(_, v)| OsString::from(v))
            };
            assert_eq!(
                state_dir(instance, env),
                PathBuf::from(want),
                "{instance:?} {vars:?}"
            );
        }
    }

    #[test]
    fn runtime_dirs() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |var: &str| {
                vars.iter()
                    .find(|(k, _)| *k == var)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let none = |_: &Path, _: u32| false;
        let logind = |dir: &Path, uid: u32| dir == Path::new("/run/user/1000") && uid == 1000;
        /// instance, environment, whether /run/user/1000 is the user's, want
        type Case = (
            Instance,
            &'static [(&'static str, &'static str)],
            bool,
            &'static str,
        );
        let cases: [Case; 7] = [
            (Instance::System, &[], true, "/run/mcpd"),
            (Instance::System, &[("MCPD_RUNTIME_DIR", "/x")], false, "/x"),
            (
                Instance::User,
                &[("XDG_RUNTIME_DIR", "/run/user/1000")],
                false,
                "/run/user/1000/mcpd",
            ),
            // no XDG_RUNTIME_DIR: logind's directory when the user owns it
            (Instance::User, &[], true, "/run/user/1000/mcpd"),
            (
                Instance::User,
                &[("TMPDIR", "/var/tmp")],
                false,
                "/var/tmp/mcpd-1000",
            ),
            (Instance::User, &[], false, "/tmp/mcpd-1000"),
            // relative values are ignored
            (
                Instance::User,
                &[("XDG_RUNTIME_DIR", "run"), ("MCPD_RUNTIME_DIR", "x")],
                true,
                "/run/user/1000/mcpd",
            ),
        ];
        for (instance, vars, has_logind, want) in cases {
            let got = if has_logind {
                runtime_dir(instance, env(vars), 1000, logind)
            } else {
                runtime_dir(instance, env(vars), 1000, none)
            };
            assert_eq!(got, PathBuf::from(want), "{instance:?} {vars:?}");
        }
    }
}
