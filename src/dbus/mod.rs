//! The D-Bus API `org.mcpd1` (DESIGN §5): the only code that knows zbus.
//!
//! The same objects are served on the bus (system bus for the system
//! instance, session bus for a user instance) when one is reachable, and
//! always peer-to-peer on the private socket in the runtime directory (one
//! connection per client, each with its own object registrations). Signals
//! and property changes fan out to every live connection ([`Hub`]).
//!
//! Interfaces are thin adapters: they hold the shared read model of the
//! units ([`Shared`]) and turn calls into supervisor commands or daemon
//! control messages; errors map to `org.mcpd1.Error.*`.

mod manager;
mod server;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zbus::Connection;
use zbus::OwnedObjectPath;

use crate::daemon::{Change, Control, Diff, UnitView};
use crate::unit::Instance;

pub use manager::{Manager, ManagerProxy};
pub use server::{Server, ServerProxy};

/// The well-known bus name.
pub const BUS_NAME: &str = "org.mcpd1";
/// The manager's object path.
pub const MANAGER_PATH: &str = "/org/mcpd1";
/// The group whose members may control a system instance.
pub const CONTROL_GROUP: &str = "mcpd";

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

/// The object path of server `name`.
pub fn server_path(name: &str) -> OwnedObjectPath {
    let path = format!("{MANAGER_PATH}/server/{}", bus_label_escape(name));
    // Escaped labels are always valid path elements.
    OwnedObjectPath::try_from(path).unwrap_or_else(|_| {
        OwnedObjectPath::from(zbus::ObjectPath::from_static_str_unchecked(
            "/org/mcpd1/server/_",
        ))
    })
}

/// What every interface reads and acts through.
#[derive(Debug)]
pub struct Shared {
    pub instance: Instance,
    pub unit_dirs: Vec<PathBuf>,
    /// The units as the daemon last loaded them.
    pub units: RwLock<BTreeMap<String, UnitView>>,
    /// Reloads go to the daemon's loop.
    pub control: mpsc::UnboundedSender<Control>,
}

impl Shared {
    pub fn unit(&self, name: &str) -> Result<UnitView, Error> {
        self.units
            .read()
            .ok()
            .and_then(|u| u.get(name).cloned())
            .ok_or_else(|| Error::NoSuchServer(format!("no server named {name}")))
    }

    /// The supervisor of `name`; a unit that never loaded has none.
    pub fn supervisor(&self, name: &str) -> Result<crate::supervisor::Supervisor, Error> {
        let unit = self.unit(name)?;
        unit.supervisor.ok_or_else(|| {
            Error::InvalidArguments(format!(
                "unit {name} is invalid and cannot run: {}",
                unit.load_error.unwrap_or_default()
            ))
        })
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
    let uid = match header.sender() {
        Some(sender) => {
            let dbus = zbus::fdo::DBusProxy::new(conn).await?;
            dbus.get_connection_unix_user(sender.clone().into())
                .await
                .map_err(|e| Error::AccessDenied(format!("cannot identify the caller: {e}")))?
        }
        // Peer-to-peer: the socket's peer credentials.
        None => conn
            .peer_creds()
            .await
            .ok()
            .and_then(|c| c.unix_user_id())
            .ok_or_else(|| Error::AccessDenied("cannot identify the caller".into()))?,
    };
    if uid == 0 || in_control_group(uid) {
        Ok(())
    } else {
        Err(Error::AccessDenied(format!(
            "uid {uid} may not control mcpd: only root and members of group {CONTROL_GROUP} may"
        )))
    }
}

fn in_control_group(uid: u32) -> bool {
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

/// Every live connection the objects are served on.
#[derive(Debug)]
pub struct Hub {
    shared: Arc<Shared>,
    connections: Mutex<Vec<Connection>>,
    /// Per server: the task forwarding its status changes as signals.
    watchers: Mutex<BTreeMap<String, JoinHandle<()>>>,
}

/// Why the D-Bus service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot create the private socket {}: {source}", path.display())]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("D-Bus: {0}")]
    ZBus(#[from] zbus::Error),
}

impl Hub {
    pub fn connections(&self) -> Vec<Connection> {
        self.connections
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
    }

    fn add_connection(&self, conn: Connection) {
        if let Ok(mut conns) = self.connections.lock() {
            conns.push(conn);
        }
    }

    /// A connection builder that serves the manager, the object manager and
    /// every server from its first message on.
    fn serving<'b>(&self, builder: zbus::connection::Builder<'b>) -> zbus::connection::Builder<'b> {
        let mut builder = builder
            .serve_at(MANAGER_PATH, zbus::fdo::ObjectManager)
            .serve_at(MANAGER_PATH, Manager::new(Arc::clone(&self.shared)));
        let names: Vec<String> = self
            .shared
            .units
            .read()
            .map(|u| u.keys().cloned().collect())
            .unwrap_or_default();
        for name in names {
            builder = builder.serve_at(
                server_path(&name),
                Server::new(&name, Arc::clone(&self.shared)),
            );
        }
        builder
    }

    /// Applies a reload's diff: objects and signals for added and removed
    /// servers, property changes for changed ones, then `Reloaded`.
    pub async fn apply(self: &Arc<Self>, diff: &Diff) {
        for (name, change) in &diff.0 {
            match change {
                Change::Added => self.added(name).await,
                Change::Removed => self.removed(name).await,
                Change::Invalid(_) => {
                    // A unit first seen invalid is listed (stopped, with its
                    // LoadError), so it gets its object and ServerAdded too.
                    self.added(name).await;
                    for conn in self.connections() {
                        server::emit_unit_properties(&conn, name).await;
                    }
                }
                Change::Changed { .. } => {
                    self.watch(name);
                    for conn in self.connections() {
                        server::emit_unit_properties(&conn, name).await;
                    }
                }
                Change::Unchanged => {}
            }
        }
        for conn in self.connections() {
            let _ = manager::Manager::reloaded(
                &zbus::object_server::SignalEmitter::new(&conn, MANAGER_PATH).expect("static path"),
            )
            .await;
        }
    }

    /// Serves server `name` on every connection that lacks it, announcing
    /// it there; a unit known before (invalid until now, or served from the
    /// connection's start) is not announced twice.
    async fn added(self: &Arc<Self>, name: &str) {
        let path = server_path(name);
        for conn in self.connections() {
            let fresh = conn
                .object_server()
                .at(&path, Server::new(name, Arc::clone(&self.shared)))
                .await
                // `None`: served now; `Some`: it was there already.
                .is_ok_and(|existing| existing.is_none());
            if fresh
                && let Ok(emitter) = zbus::object_server::SignalEmitter::new(&conn, MANAGER_PATH)
            {
                let _ = Manager::server_added(&emitter, name, path.as_ref()).await;
            }
        }
        self.watch(name);
    }

    async fn removed(self: &Arc<Self>, name: &str) {
        if let Some(watcher) = self.watchers.lock().ok().and_then(|mut w| w.remove(name)) {
            watcher.abort();
        }
        let path = server_path(name);
        for conn in self.connections() {
            let _ = conn.object_server().remove::<Server, _>(&path).await;
            if let Ok(emitter) = zbus::object_server::SignalEmitter::new(&conn, MANAGER_PATH) {
                let _ = Manager::server_removed(&emitter, name, path.as_ref()).await;
            }
        }
    }

    /// (Re)starts forwarding the status changes of server `name`.
    fn watch(self: &Arc<Self>, name: &str) {
        let Ok(unit) = self.shared.unit(name) else {
            return;
        };
        let Some(supervisor) = unit.supervisor else {
            return;
        };
        let hub = Arc::clone(self);
        let owned = name.to_owned();
        let task = tokio::spawn(async move {
            let mut rx = supervisor.subscribe();
            let mut last = rx.borrow_and_update().clone();
            while rx.changed().await.is_ok() {
                let now = rx.borrow_and_update().clone();
                for conn in hub.connections() {
                    server::emit_changes(&conn, &owned, &last, &now).await;
                }
                last = now;
            }
        });
        if let Ok(mut watchers) = self.watchers.lock()
            && let Some(old) = watchers.insert(name.to_owned(), task)
        {
            old.abort();
        }
    }
}

/// The running D-Bus service.
#[derive(Debug)]
pub struct Service {
    pub hub: Arc<Hub>,
    _accept: JoinHandle<()>,
    socket: PathBuf,
}

impl Drop for Service {
    fn drop(&mut self) {
        self._accept.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The private socket's path in a runtime directory.
pub fn private_socket(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("private")
}

impl Service {
    /// Serves the objects on the private socket, and on the bus unless
    /// `no_bus`; a bus that cannot be reached is a warning.
    pub async fn start(
        shared: Arc<Shared>,
        runtime_dir: &Path,
        no_bus: bool,
    ) -> Result<Self, StartError> {
        let hub = Arc::new(Hub {
            shared: Arc::clone(&shared),
            connections: Mutex::new(Vec::new()),
            watchers: Mutex::new(BTreeMap::new()),
        });
        let names: Vec<String> = shared
            .units
            .read()
            .map(|u| u.keys().cloned().collect())
            .unwrap_or_default();
        for name in &names {
            hub.watch(name);
        }

        let socket = private_socket(runtime_dir);
        let _ = std::fs::remove_file(&socket);
        let listener =
            tokio::net::UnixListener::bind(&socket).map_err(|source| StartError::Socket {
                path: socket.clone(),
                source,
            })?;
        secure_socket(&socket, shared.instance);
        let accept_hub = Arc::clone(&hub);
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let hub = Arc::clone(&accept_hub);
                tokio::spawn(async move {
                    let Ok(stream) = stream.into_std() else {
                        return;
                    };
                    // Objects are registered before the handshake completes,
                    // so the client's first call finds them.
                    let builder = zbus::connection::Builder::unix_stream(stream)
                        .p2p()
                        .server(zbus::Guid::generate());
                    let conn = hub.serving(builder).build().await;
                    match conn {
                        Ok(conn) => hub.add_connection(conn),
                        Err(e) => {
                            tracing::debug!(target: "mcpd::dbus", "private connection failed: {e}")
                        }
                    }
                });
            }
        });

        if !no_bus {
            let builder = match shared.instance {
                Instance::System => zbus::connection::Builder::system(),
                Instance::User => zbus::connection::Builder::session(),
            };
            let bus = hub.serving(builder).build().await;
            match bus {
                Ok(conn) => match conn.request_name(BUS_NAME).await {
                    Ok(()) => {
                        tracing::info!(target: "mcpd::dbus", "serving {BUS_NAME} on the {} bus", bus_kind(shared.instance));
                        hub.add_connection(conn);
                    }
                    Err(e) => {
                        tracing::warn!(target: "mcpd::dbus", "cannot own {BUS_NAME} on the {} bus: {e}", bus_kind(shared.instance))
                    }
                },
                Err(e) => tracing::warn!(
                    target: "mcpd::dbus",
                    "no {} bus ({e}); serving only on {}",
                    bus_kind(shared.instance),
                    socket.display()
                ),
            }
        }
        Ok(Self {
            hub,
            _accept: accept,
            socket,
        })
    }
}

fn bus_kind(instance: Instance) -> &'static str {
    match instance {
        Instance::System => "system",
        Instance::User => "session",
    }
}

/// Mode 0600 for a user instance; 0660 with group `mcpd` (when it exists)
/// for the system instance.
fn secure_socket(path: &Path, instance: Instance) {
    use std::os::unix::fs::PermissionsExt;
    let mode = match instance {
        Instance::User => 0o600,
        Instance::System => {
            if let Ok(Some(group)) = nix::unistd::Group::from_name(CONTROL_GROUP) {
                let _ = std::os::unix::fs::chown(path, Some(0), Some(group.gid.as_raw()));
                0o660
            } else {
                0o600
            }
        }
    };
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
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
