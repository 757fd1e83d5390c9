//! The private socket's accept loop: one zbus peer-to-peer connection per
//! client, with every object registered before its handshake ends.
//!
//! The loop is the daemon's one accept loop
//! ([`crate::sockets::accept_loop`]): an accept that fails (most often:
//! the daemon is out of file descriptors) is retried with backoff, never
//! in a loop that spins, and each kind of failure is logged once per
//! streak; a peer released by the [`Hub`] frees an fd, so the loop then
//! retries at once. A client that
//! does not finish the authentication handshake within
//! [`HANDSHAKE_TIMEOUT`] is dropped (dbus-daemon's `auth_timeout` does the
//! same).

use std::path::PathBuf;
use std::sync::{Arc, Weak};

use tokio::net::{UnixListener, UnixStream};

use crate::sockets::Log;

use super::hub::{Hub, Who};

/// How long a client may take to authenticate.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Accepts clients on `listener` until the task is aborted or the hub is
/// gone (the daemon's one accept loop, [`crate::sockets::accept_loop`]);
/// a failed accept is retried early when the hub releases a peer.
pub async fn accept_loop(listener: UnixListener, socket: PathBuf, hub: Weak<Hub>) {
    let Some(released) = hub.upgrade().map(|live| live.released()) else {
        return;
    };
    let serve_peer = |stream: UnixStream, hub: Arc<Hub>| {
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
        tokio::spawn(serve(stream, who, hub));
    };
    crate::sockets::accept_loop(listener, socket, Log::Dbus, hub, Some(released), serve_peer).await;
}

/// The handshake and registration of one accepted client.
async fn serve(stream: UnixStream, who: Who, hub: Arc<Hub>) {
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
