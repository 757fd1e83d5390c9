//! The private socket's accept loop: one zbus peer-to-peer connection per
//! client, with every object registered before its handshake ends.
//!
//! An accept that fails (most often: the daemon is out of file
//! descriptors) is retried with backoff, never in a loop that spins, and
//! each kind of failure is logged once per streak; a peer released by the
//! [`Hub`] frees an fd, so the loop then retries at once. A client that
//! does not finish the authentication handshake within
//! [`HANDSHAKE_TIMEOUT`] is dropped (dbus-daemon's `auth_timeout` does the
//! same).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::net::UnixListener;

use super::hub::{Hub, Who};

/// How long a client may take to authenticate.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// The first wait after a failed accept; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between two accepts that fail.
pub const MAX_BACKOFF: Duration = Duration::from_millis(6400);

/// A run of failed accepts: what has been logged, and the next wait.
#[derive(Debug, Default)]
struct Streak {
    failures: u64,
    logged: Vec<io::ErrorKind>,
    backoff: Option<Duration>,
    /// The wait before the last one (restored by [`Streak::woken`]).
    previous: Option<Duration>,
}

impl Streak {
    /// Records a failure; returns how long to wait before the next accept
    /// and whether this kind of failure is new in this streak.
    fn failed(&mut self, error: &io::Error) -> (Duration, bool) {
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
    fn woken(&mut self) {
        self.backoff = self.previous;
    }
}

/// What a failed accept means, for the log.
fn describe(error: &io::Error) -> String {
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

/// Accepts clients on `listener` until the task is aborted or the hub is
/// gone.
pub async fn accept_loop(listener: UnixListener, socket: PathBuf, hub: Weak<Hub>) {
    let mut streak: Option<Streak> = None;
    loop {
        let accepted = listener.accept().await;
        let Some(live) = hub.upgrade() else { return };
        match accepted {
            Ok((stream, _)) => {
                if let Some(s) = streak.take() {
                    tracing::info!(
                        target: "mcpd::dbus",
                        "accepting clients on {} again after {} failed accepts",
                        socket.display(),
                        s.failures
                    );
                }
                let who = match stream.peer_cred() {
                    Ok(cred) => Who::Private {
                        pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
                        uid: Some(cred.uid()),
                    },
                    Err(_) => Who::Private {
                        pid: None,
                        uid: None,
                    },
                };
                tokio::spawn(serve(stream, who, live));
            }
            Err(error) => {
                let (wait, new) = streak.get_or_insert_default().failed(&error);
                if new {
                    tracing::warn!(
                        target: "mcpd::dbus",
                        "cannot accept clients on {}: {}; retrying with backoff (up to {} between tries)",
                        socket.display(),
                        describe(&error),
                        humantime::format_duration(MAX_BACKOFF)
                    );
                }
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = live.peer_released() => {
                        if let Some(s) = streak.as_mut() {
                            s.woken();
                        }
                    }
                }
            }
        }
    }
}

/// The handshake and registration of one accepted client.
async fn serve(stream: tokio::net::UnixStream, who: Who, hub: Arc<Hub>) {
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(e) => {
            tracing::warn!(target: "mcpd::dbus", "{who}: cannot take over the socket: {e}");
            return;
        }
    };
    // Objects are registered before the handshake completes, so the
    // client's first call finds them.
    let builder = zbus::connection::Builder::unix_stream(stream)
        .p2p()
        .server(zbus::Guid::generate());
    let (builder, served) = hub.serving(builder);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, builder.build()).await {
        Ok(Ok(conn)) => hub.add(conn, who, served).await,
        Ok(Err(e)) => tracing::debug!(target: "mcpd::dbus", "{who}: handshake failed: {e}"),
        Err(_) => tracing::warn!(
            target: "mcpd::dbus",
            "{who}: no handshake within {}; dropping the connection",
            humantime::format_duration(HANDSHAKE_TIMEOUT)
        ),
    }
}

/// Binds the private socket at `path`, replacing a stale one.
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

    #[test]
    fn an_fd_shortage_is_named_as_such() {
        let emfile = io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error());
        assert!(describe(&emfile).starts_with("out of file descriptors: the daemon's limit of "));
        let enfile = io::Error::from_raw_os_error(rustix::io::Errno::NFILE.raw_os_error());
        assert!(describe(&enfile).contains("system's file table is full"));
    }
}
