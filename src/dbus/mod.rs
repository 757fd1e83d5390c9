//! The D-Bus API `org.mcpd1` (DESIGN §5): the only code that knows zbus.
//!
//! The same objects are served on the bus (system bus for the system
//! instance, session bus for a user instance) when one is reachable, and
//! always peer-to-peer on the private socket in the runtime directory (one
//! connection per client, each with its own object registrations). Signals
//! and property changes fan out to every live connection ([`Hub`]).
//!
//! Interfaces are thin adapters: they hold the daemon's read model of the
//! units ([`crate::model::Shared`]) and turn calls into supervisor commands or daemon
//! control messages; errors map to `org.mcpd1.Error.*`.

mod access;
pub mod client;
mod hub;
mod listener;
mod manager;
mod objects;
mod server;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use access::bus_kind;

use tokio::task::JoinHandle;

use crate::model::Shared;
use crate::unit::Instance;

pub use crate::sockets::{FIRST_BACKOFF, MAX_BACKOFF};
pub use access::{BUS_NAME, Error, MANAGER_PATH, bus_label_escape, private_socket, server_path};
pub use client::{Client, ConnectError};
pub use hub::{Hub, SEND_TIMEOUT, Who};
pub use listener::HANDSHAKE_TIMEOUT;
pub use manager::{Manager, ManagerProxy, ServerRow};
pub use server::{Server, ServerProxy, ToolRow};

pub use crate::sockets::CONTROL_GROUP;

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

/// The running D-Bus service.
#[derive(Debug)]
pub struct Service {
    pub hub: Arc<Hub>,
    accept: JoinHandle<()>,
    socket: PathBuf,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.accept.abort();
        if let Err(e) = std::fs::remove_file(&self.socket) {
            tracing::warn!(target: "mcpd::dbus", "cannot remove {}: {e}", self.socket.display());
        }
    }
}

impl Service {
    /// Serves the objects on the private socket, and on the bus unless
    /// `no_bus`; a bus that cannot be reached is a warning.
    pub async fn start(
        shared: Arc<Shared>,
        runtime_dir: &Path,
        no_bus: bool,
    ) -> Result<Self, StartError> {
        let hub = Hub::new(Arc::clone(&shared));
        let socket = private_socket(runtime_dir);
        let listener = crate::sockets::bind(&socket).map_err(|source| StartError::Socket {
            path: socket.clone(),
            source,
        })?;
        crate::sockets::secure_socket(&socket, shared.instance).map_err(|source| {
            StartError::Socket {
                path: socket.clone(),
                source,
            }
        })?;
        let accept = tokio::spawn(listener::accept_loop(
            listener,
            socket.clone(),
            Arc::downgrade(&hub),
        ));

        if !no_bus {
            let builder = match shared.instance {
                Instance::System => zbus::connection::Builder::system(),
                Instance::User => zbus::connection::Builder::session(),
            };
            let (builder, served) = hub.serving(builder);
            match builder.build().await {
                Ok(conn) => match conn.request_name(BUS_NAME).await {
                    Ok(()) => {
                        tracing::info!(target: "mcpd::dbus", "serving {BUS_NAME} on the {} bus", bus_kind(shared.instance));
                        hub.add(conn, Who::Bus, served).await;
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
            accept,
            socket,
        })
    }
}
