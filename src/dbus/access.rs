//! What the interfaces share, and a leaf of `dbus/` (it imports none of
//! its siblings): the bus name and object paths, the `org.mcpd1.Error.*`
//! errors, who may call a mutating method ([`authorize`]) and who called
//! ([`caller`], cached per bus name in [`Callers`]), the private socket's
//! path and a host session's socket pair.

use std::path::{Path, PathBuf};

use zbus::Connection;
use zbus::OwnedObjectPath;

use crate::model::{Shared, UnitError, UnitView};
use crate::supervisor::Caller;
use crate::unit::Instance;

/// The well-known bus name.
pub const BUS_NAME: &str = "org.mcpd1";
/// The manager's object path.
pub const MANAGER_PATH: &str = "/org/mcpd1";

/// `org.mcpd1.Error.*`
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.mcpd1.Error")]
pub enum Error {
    #[zbus(error)]
    ZBus(zbus::Error),
    NoSuchServer(String),
    InvalidArguments(String),
    /// The message says the state and when the next retry is.
    NotRunning(String),
    ToolFailed(String),
    AccessDenied(String),
    /// A login could not be begun or completed (DESIGN §17): the message
    /// names the check or the request that failed.
    AuthFailed(String),
}

impl Error {
    /// What went wrong, in words: the daemon's own message for its errors
    /// (and for other D-Bus errors that carry one), else the transport's.
    pub fn message(&self) -> String {
        match self {
            Error::NoSuchServer(m)
            | Error::InvalidArguments(m)
            | Error::NotRunning(m)
            | Error::ToolFailed(m)
            | Error::AccessDenied(m)
            | Error::AuthFailed(m) => m.clone(),
            Error::ZBus(zbus::Error::MethodError(name, message, _)) => {
                message.clone().unwrap_or_else(|| name.to_string())
            }
            Error::ZBus(e) => format!("D-Bus: {e}"),
        }
    }

    /// Whether the daemon answered at all (an `org.mcpd1.Error.*` or
    /// another D-Bus error reply), rather than the connection failing.
    pub fn is_reply(&self) -> bool {
        !matches!(self, Error::ZBus(e) if !matches!(e, zbus::Error::MethodError(..)))
    }
}

/// systemd's `bus_label_escape`: letters and digits stay (a leading digit
/// does not), everything else becomes `_` and two lowercase hex digits.
pub fn bus_label_escape(label: &str) -> String {
    if label.is_empty() {
        return "_".into();
    }
    let mut out = String::with_capacity(label.len());
    for (i, b) in label.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (b.is_ascii_digit() && i > 0) {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    out
}

/// The object path of server `name` (any name: a unit whose file name is
/// not a valid unit name is still listed, with its load error).
pub fn server_path(name: &str) -> OwnedObjectPath {
    let path = format!("{MANAGER_PATH}/server/{}", bus_label_escape(name));
    // An escaped label is letters, digits and `_`, never empty: always a
    // valid path element.
    OwnedObjectPath::from(zbus::ObjectPath::from_string_unchecked(path))
}

/// Bus callers' credentials by unique name (never reused while the bus
/// runs), so a client's calls after its first cost no lookup.
#[derive(Debug, Default)]
pub(crate) struct Callers(std::sync::Mutex<std::collections::HashMap<String, Caller>>);

/// Bus callers remembered at most; the cache starts over beyond.
const MAX_CACHED_CALLERS: usize = 1024;

impl From<UnitError> for Error {
    /// A name no unit has is `NoSuchServer`; a unit that never loaded
    /// cannot be acted on, `InvalidArguments`.
    fn from(e: UnitError) -> Self {
        match e {
            UnitError::NoSuchServer(_) => Error::NoSuchServer(e.to_string()),
            UnitError::Invalid { .. } => Error::InvalidArguments(e.to_string()),
        }
    }
}

/// The reason shown for a unit that has never loaded: its first problem.
pub(crate) fn invalid_reason(unit: &UnitView) -> String {
    let first = unit
        .load_error
        .as_deref()
        .and_then(|e| e.lines().next())
        .unwrap_or_default();
    format!("invalid unit file: {first}")
}

/// A host session's socket pair: the daemon's end as the session's link,
/// the caller's to return (`Attach`, `AttachGroup`, `AttachUnits`).
pub(crate) fn session_socket() -> Result<(crate::supervisor::HostLink, zbus::OwnedFd), Error> {
    let failed = |e: std::io::Error| {
        Error::ZBus(zbus::Error::Failure(format!(
            "cannot make a socket for the session: {e}"
        )))
    };
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(failed)?;
    ours.set_nonblocking(true).map_err(failed)?;
    let stream = tokio::net::UnixStream::from_std(ours).map_err(failed)?;
    let link = crate::supervisor::HostLink::Socket {
        stream,
        pending: Vec::new(),
    };
    Ok((link, std::os::fd::OwnedFd::from(theirs).into()))
}

/// Whether the caller of a mutating method may make it: anyone on a user
/// instance (its bus and socket are the user's own); on the system
/// instance root or a member of group `mcpd`, from the caller's credentials.
pub(crate) async fn authorize(
    shared: &Shared,
    conn: &Connection,
    header: &zbus::message::Header<'_>,
) -> Result<(), Error> {
    if shared.instance == Instance::User {
        return Ok(());
    }
    // Only the bus vouches for a sender name; on the private socket a peer
    // writes its own header, so only SO_PEERCRED counts there.
    let sender = header.sender().filter(|_| conn.is_bus());
    let uid = match sender {
        Some(sender) => {
            let dbus = bus_daemon(conn).await?;
            Some(
                dbus.get_connection_unix_user(sender.clone().into())
                    .await
                    .map_err(|e| Error::AccessDenied(format!("cannot identify the caller: {e}")))?,
            )
        }
        // Peer-to-peer: the socket's peer credentials.
        None => conn.peer_creds().await.ok().and_then(|c| c.unix_user_id()),
    };
    crate::sockets::may_control_async(shared.instance, uid)
        .await
        .map_err(Error::AccessDenied)
}

/// How long finding a bus caller's credentials may take before the call
/// is accounted to an unknown caller.
const CALLER_LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Who sent `header`: the bus's credentials of the sender, or the private
/// socket's `SO_PEERCRED`; unknown parts are `None`.
pub(crate) async fn caller(
    callers: &Callers,
    conn: &Connection,
    header: &zbus::message::Header<'_>,
) -> Caller {
    tokio::time::timeout(CALLER_LOOKUP_TIMEOUT, lookup_caller(callers, conn, header))
        .await
        .unwrap_or_default()
}

/// The bus daemon's own interface, without the property cache and match
/// rules a default proxy sets up (round trips of their own).
async fn bus_daemon(conn: &Connection) -> zbus::Result<zbus::fdo::DBusProxy<'_>> {
    zbus::fdo::DBusProxy::builder(conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
}

async fn lookup_caller(
    callers: &Callers,
    conn: &Connection,
    header: &zbus::message::Header<'_>,
) -> Caller {
    // As in `authorize`: a sender name means something only on the bus.
    match header.sender().filter(|_| conn.is_bus()) {
        Some(sender) => {
            let known = callers
                .0
                .lock()
                .ok()
                .and_then(|c| c.get(sender.as_str()).cloned());
            if let Some(caller) = known {
                return caller;
            }
            let creds = match bus_daemon(conn).await {
                Ok(dbus) => dbus
                    .get_connection_credentials(sender.clone().into())
                    .await
                    .ok(),
                Err(_) => None,
            };
            let caller = Caller {
                uid: creds.as_ref().and_then(|c| c.unix_user_id()),
                pid: creds.as_ref().and_then(|c| c.process_id()),
                ..Caller::default()
            };
            if creds.is_some()
                && let Ok(mut callers) = callers.0.lock()
            {
                if callers.len() >= MAX_CACHED_CALLERS {
                    callers.clear();
                }
                callers.insert(sender.to_string(), caller.clone());
            }
            caller
        }
        None => match conn.peer_creds().await {
            Ok(c) => Caller {
                uid: c.unix_user_id(),
                pid: c.process_id(),
                ..Caller::default()
            },
            Err(_) => Caller::default(),
        },
    }
}

/// The private socket's path in a runtime directory.
pub fn private_socket(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("private")
}

/// The bus an instance is served on, in words: `system` or `session`.
pub(crate) fn bus_kind(instance: Instance) -> &'static str {
    match instance {
        Instance::System => "system",
        Instance::User => "session",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_like_systemd() {
        assert_eq!(bus_label_escape("github"), "github");
        assert_eq!(bus_label_escape("my-server"), "my_2dserver");
        assert_eq!(bus_label_escape("a_b"), "a_5fb");
        assert_eq!(bus_label_escape("0day"), "_30day");
        assert_eq!(bus_label_escape(""), "_");
        assert_eq!(
            server_path("my-server").as_str(),
            "/org/mcpd1/server/my_2dserver"
        );
    }
}
