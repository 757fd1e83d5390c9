//! The daemon's sockets (the private D-Bus socket, the attach socket):
//! who may control the daemon through them, their modes, binding, and
//! the one accept loop both run, with its backoff when accepts fail.
//! Shared by `dbus` and `daemon`, so both say the same (and knows no
//! zbus: what a client is served is the caller's).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;

use crate::unit::Instance;

/// The group whose members may control a system instance.
pub const CONTROL_GROUP: &str = "mcpd";

/// Whether `uid` may control `instance`'s daemon (start, stop, call tools,
/// attach host sessions): anyone for a user instance (its socket is the
/// user's alone), root and members of [`CONTROL_GROUP`] for the system
/// instance; the refusal says who may.
pub fn may_control(instance: Instance, uid: Option<u32>) -> Result<(), String> {
    if instance == Instance::User {
        return Ok(());
    }
    let Some(uid) = uid else {
        return Err("cannot identify the caller".into());
    };
    if uid == 0 || in_control_group(uid) {
        Ok(())
    } else {
        Err(format!(
            "uid {uid} may not control mcpd: only root and members of group {CONTROL_GROUP} may"
        ))
    }
}

/// [`may_control`] from async code: the group lookup (NSS: files, LDAP,
/// sssd…) may block, so it runs on the blocking pool, not on a worker that
/// serves every session; the user instance and root need no lookup.
pub async fn may_control_async(instance: Instance, uid: Option<u32>) -> Result<(), String> {
    if instance == Instance::User || uid == Some(0) {
        return may_control(instance, uid);
    }
    tokio::task::spawn_blocking(move || may_control(instance, uid))
        .await
        .unwrap_or_else(|e| Err(format!("cannot check the caller: {e}")))
}

/// Whether `uid` belongs to [`CONTROL_GROUP`] (as its primary group or a
/// supplementary one).
pub fn in_control_group(uid: u32) -> bool {
    let Ok(Some(group)) = nix::unistd::Group::from_name(CONTROL_GROUP) else {
        return false;
    };
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return false;
    };
    if user.gid == group.gid || group.mem.contains(&user.name) {
        return true;
    }
    std::ffi::CString::new(user.name)
        .ok()
        .and_then(|name| nix::unistd::getgrouplist(&name, user.gid).ok())
        .is_some_and(|groups| groups.contains(&group.gid))
}

/// Mode 0600 for a user instance; 0660 with group `mcpd` (when it exists)
/// for the system instance. A socket whose mode cannot be set is not
/// served (it could be open to everyone).
pub fn secure_socket(path: &Path, instance: Instance) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = match instance {
        Instance::User => 0o600,
        Instance::System => {
            if let Ok(Some(group)) = nix::unistd::Group::from_name(CONTROL_GROUP) {
                match std::os::unix::fs::chown(path, Some(0), Some(group.gid.as_raw())) {
                    Ok(()) => 0o660,
                    Err(e) => {
                        tracing::warn!(target: "mcpd::daemon", "cannot give {} to group {CONTROL_GROUP}: {e}", path.display());
                        0o600
                    }
                }
            } else {
                0o600
            }
        }
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The first wait after a failed accept; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two accepts that fail.
pub const MAX_BACKOFF: Duration = Duration::from_millis(6400);

/// A run of failed accepts: what has been logged, and the next wait.
#[derive(Debug, Default)]
pub struct Streak {
    pub failures: u64,
    logged: Vec<io::ErrorKind>,
    backoff: Option<Duration>,
    /// The wait before the last one (restored by [`Streak::woken`]).
    previous: Option<Duration>,
}

impl Streak {
    /// Records a failure; returns how long to wait before the next accept
    /// and whether this kind of failure is new in this streak.
    pub fn failed(&mut self, error: &io::Error) -> (Duration, bool) {
        self.failures += 1;
        let new = !self.logged.contains(&error.kind());
        if new {
            self.logged.push(error.kind());
        }
        let wait = self
            .backoff
            .map_or(FIRST_BACKOFF, |last| (last * 2).min(MAX_BACKOFF));
        self.previous = self.backoff;
        self.backoff = Some(wait);
        (wait, new)
    }

    /// The wait was cut short because a peer freed an fd: a retry that
    /// fails again is not a reason to wait longer next time.
    pub fn woken(&mut self) {
        self.backoff = self.previous;
    }
}

/// What a failed accept means, for the log.
pub fn describe(error: &io::Error) -> String {
    match error.raw_os_error() {
        Some(n) if n == rustix::io::Errno::MFILE.raw_os_error() => {
            let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
            format!(
                "out of file descriptors: the daemon's limit of {limit} open files is used up ({error})"
            )
        }
        Some(n) if n == rustix::io::Errno::NFILE.raw_os_error() => {
            format!("out of file descriptors: the system's file table is full ({error})")
        }
        _ => error.to_string(),
    }
}

/// Whose socket an accept loop serves: the log target of its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    /// `mcpd::daemon` (the attach socket).
    Daemon,
    /// `mcpd::dbus` (the private socket).
    Dbus,
}

/// A tracing event under the target of a [`Log`] (tracing wants a
/// constant target, hence one call per target).
macro_rules! log_as {
    ($log:expr, $level:ident, $($arg:tt)+) => {
        match $log {
            Log::Daemon => tracing::$level!(target: "mcpd::daemon", $($arg)+),
            Log::Dbus => tracing::$level!(target: "mcpd::dbus", $($arg)+),
        }
    };
}

/// Accepts clients on `listener` (bound at `path`) until the task is
/// aborted or `owner` is gone, handing each to `serve` with the owner
/// (which spawns what serves it). The loop holds its owner weakly, so it
/// keeps nothing alive. An accept that fails (most often: the daemon is
/// out of file descriptors) is retried after the [`Streak`]'s backoff,
/// [`FIRST_BACKOFF`] doubling to [`MAX_BACKOFF`], or as soon as `freed`
/// is notified (a client's descriptor was given back), and each kind of
/// failure is logged once per streak: the loop never spins.
pub async fn accept_loop<T: ?Sized>(
    listener: UnixListener,
    path: PathBuf,
    log: Log,
    owner: Weak<T>,
    freed: Option<Arc<Notify>>,
    mut serve: impl FnMut(UnixStream, Arc<T>),
) {
    let mut streak: Option<Streak> = None;
    loop {
        let accepted = listener.accept().await;
        let Some(live) = owner.upgrade() else {
            return;
        };
        match accepted {
            Ok((stream, _)) => {
                if let Some(s) = streak.take() {
                    log_as!(
                        log,
                        info,
                        "accepting clients on {} again after {} failed accepts",
                        path.display(),
                        s.failures
                    );
                }
                serve(stream, live);
            }
            Err(error) => {
                drop(live);
                let (wait, new) = streak.get_or_insert_default().failed(&error);
                if new {
                    log_as!(
                        log,
                        warn,
                        "cannot accept clients on {}: {}; retrying with backoff (up to {} between tries)",
                        path.display(),
                        describe(&error),
                        humantime::format_duration(MAX_BACKOFF)
                    );
                }
                let released = async {
                    match &freed {
                        Some(freed) => freed.notified().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = released => {
                        if let Some(s) = streak.as_mut() {
                            s.woken();
                        }
                    }
                }
            }
        }
    }
}

/// Binds a socket at `path`, replacing a stale one.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_each_kind_is_new_once() {
        let mut streak = Streak::default();
        let emfile = io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        let other = io::Error::other("boom");
        let mut waits = Vec::new();
        let mut news = Vec::new();
        for e in [
            &emfile, &emfile, &other, &emfile, &emfile, &other, &emfile, &emfile,
        ] {
            let (wait, new) = streak.failed(e);
            waits.push(wait.as_millis());
            news.push(new);
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 6400, 6400]);
        assert_eq!(news, [true, false, true, false, false, false, false, false]);
        assert_eq!(streak.failures, 8);
        // a wake-up by a released peer does not count as a longer wait
        streak.woken();
        assert_eq!(streak.failed(&emfile).0.as_millis(), 6400);
        let mut fresh = Streak::default();
        fresh.failed(&emfile);
        fresh.failed(&emfile);
        fresh.woken();
        assert_eq!(fresh.failed(&emfile).0.as_millis(), 200);
    }

    #[tokio::test]
    async fn the_accept_loop_serves_each_client_and_ends_with_its_owner() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("socket");
        let listener = bind(&path).expect("bind");
        let owner = Arc::new("owner");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(accept_loop(
            listener,
            path.clone(),
            Log::Daemon,
            Arc::downgrade(&owner),
            None,
            move |stream: UnixStream, owner: Arc<&str>| {
                let _ = tx.send((stream, *owner));
            },
        ));
        let _client = UnixStream::connect(&path).await.expect("connect");
        let (_served, by) = rx.recv().await.expect("served");
        assert_eq!(by, "owner");
        drop(owner);
        // The next client finds the owner gone: the loop ends unserved.
        let _late = UnixStream::connect(&path).await.expect("connect");
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the loop ends")
            .expect("no panic");
        assert!(rx.recv().await.is_none(), "no second client served");
    }

    #[test]
    fn an_fd_shortage_is_named_as_such() {
        let emfile = io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        assert!(describe(&emfile).starts_with("out of file descriptors: the daemon's limit of "));
        let enfile = io::Error::from_raw_os_error(rustix::io::Errno::NFILE.raw_os_error());
        assert!(describe(&enfile).contains("system's file table is full"));
    }
}
