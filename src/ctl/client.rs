//! Reaching the daemon: the private socket first (it works with no bus),
//! else the instance's bus. Everything goes through the D-Bus proxies.

use std::path::PathBuf;

use crate::daemon::lock::runtime_dir;
use crate::dbus::{ManagerProxy, ServerProxy, private_socket, server_path};
use crate::unit::Instance;

use super::exit;

/// A failure with its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlError {
    pub message: String,
    pub code: u8,
}

impl CtlError {
    pub fn failure(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: exit::FAILURE,
        }
    }
}

impl std::fmt::Display for CtlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Maps a D-Bus error to a message and exit code (4 for NoSuchServer).
pub fn dbus_error(e: zbus::Error) -> CtlError {
    match e {
        zbus::Error::MethodError(name, message, _) => {
            let message = message.unwrap_or_else(|| name.to_string());
            let code = if name.as_str() == "org.mcpd1.Error.NoSuchServer" {
                exit::NO_SUCH_SERVER
            } else {
                exit::FAILURE
            };
            CtlError { message, code }
        }
        other => CtlError::failure(format!("D-Bus: {other}")),
    }
}

/// A connection to one daemon instance.
#[derive(Debug)]
pub struct Client {
    conn: zbus::Connection,
    pub manager: ManagerProxy<'static>,
}

impl Client {
    /// Connects to `instance`'s daemon.
    pub async fn connect(instance: Instance) -> Result<Self, CtlError> {
        let socket: PathBuf = private_socket(&runtime_dir(instance, |v| std::env::var_os(v)));
        let private = match std::os::unix::net::UnixStream::connect(&socket) {
            Ok(stream) => zbus::connection::Builder::unix_stream(stream)
                .p2p()
                .build()
                .await
                .ok(),
            Err(_) => None,
        };
        let conn = match private {
            Some(conn) => conn,
            None => {
                let bus = match instance {
                    Instance::System => zbus::connection::Builder::system(),
                    Instance::User => zbus::connection::Builder::session(),
                };
                bus.build().await.map_err(|e| {
                    CtlError::failure(format!(
                        "cannot reach mcpd ({} instance): no daemon at {}, and no bus: {e}",
                        instance.as_str(),
                        socket.display()
                    ))
                })?
            }
        };
        let manager = ManagerProxy::new(&conn).await.map_err(dbus_error)?;
        Ok(Self { conn, manager })
    }

    /// The server `name`; exit code 4 if there is none.
    pub async fn server(&self, name: &str) -> Result<ServerProxy<'static>, CtlError> {
        self.manager.get_server(name).await.map_err(dbus_error)?;
        ServerProxy::builder(&self.conn)
            .path(server_path(name))
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(dbus_error)
    }
}
