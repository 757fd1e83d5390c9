//! The client side of `org.mcpd1`: reaching a daemon (the private socket
//! first, since it works with no bus, else the instance's bus) and the
//! proxies, whose methods return this module's [`Error`] so callers match
//! variants (`Error::NoSuchServer`), never D-Bus names or zbus types.

use zbus::Connection;

use crate::unit::Instance;

use super::access::{BUS_NAME, Error, bus_kind, private_socket, server_path};
use super::manager::ManagerProxy;
use super::server::ServerProxy;

/// How long `mcpctl` waits for the daemon to finish the D-Bus handshake on
/// its private socket (a daemon out of file descriptors leaves clients
/// queued on the socket).
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why no daemon could be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Neither the private socket nor the bus answered.
    #[error(
        "cannot reach mcpd ({} instance): {private}; {bus}{}",
        instance.as_str(),
        hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default()
    )]
    Unreachable {
        instance: Instance,
        /// What the private socket said ("no daemon at PATH").
        private: String,
        /// What the bus said ("no bus: …", "the session bus has no org.mcpd1").
        bus: String,
        /// The other instance is running (`use --user`).
        hint: Option<String>,
    },
    /// A connection exists but the manager does not answer on it.
    #[error("{0}")]
    Manager(Error),
}

/// A connection to one daemon instance.
#[derive(Debug)]
pub struct Client {
    conn: Connection,
    pub manager: ManagerProxy<'static>,
}

/// A p2p connection to the private socket of `instance`, or why there is
/// none.
async fn private(instance: Instance) -> Result<Connection, String> {
    let socket = private_socket(&instance.runtime_dir());
    let stream = std::os::unix::net::UnixStream::connect(&socket)
        .map_err(|_| format!("no daemon at {}", socket.display()))?;
    let handshake = zbus::connection::Builder::unix_stream(stream).p2p().build();
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(format!(
            "the daemon at {} failed the handshake: {e}",
            socket.display()
        )),
        Err(_) => Err(format!(
            "the daemon at {} did not answer within {} (is it out of file descriptors?)",
            socket.display(),
            humantime::format_duration(HANDSHAKE_TIMEOUT)
        )),
    }
}

/// When `instance` cannot be reached but the other instance of this user
/// runs: say so (as root, `mcpctl` defaults to the system instance).
async fn other_instance(instance: Instance) -> Option<String> {
    let (other, flag) = match instance {
        Instance::System => (Instance::User, "--user"),
        Instance::User => (Instance::System, "--system"),
    };
    let _reachable = private(other).await.ok()?;
    Some(format!(
        "no {} instance is running, but a {} instance is: use {flag}",
        instance.as_str(),
        other.as_str()
    ))
}

impl Client {
    /// Connects to `instance`'s daemon.
    pub async fn connect(instance: Instance) -> Result<Self, ConnectError> {
        let conn = match private(instance).await {
            Ok(conn) => conn,
            Err(private) => {
                let bus = match instance {
                    Instance::System => zbus::connection::Builder::system(),
                    Instance::User => zbus::connection::Builder::session(),
                };
                match bus.build().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        return Err(ConnectError::Unreachable {
                            instance,
                            private,
                            bus: format!("no bus: {e}"),
                            hint: other_instance(instance).await,
                        });
                    }
                }
            }
        };
        let manager = ManagerProxy::new(&conn)
            .await
            .map_err(|e| ConnectError::Manager(e.into()))?;
        // On a bus without mcpd the first call says so; check now, so the
        // caller gets one clear error and the other instance's hint.
        if conn.is_bus()
            && let Err(e) = manager.version().await
        {
            return Err(match other_instance(instance).await {
                Some(hint) => ConnectError::Unreachable {
                    instance,
                    private: format!(
                        "no daemon at {}",
                        private_socket(&instance.runtime_dir()).display()
                    ),
                    bus: format!("the {} bus has no {}", bus_kind(instance), BUS_NAME),
                    hint: Some(hint),
                },
                None => ConnectError::Manager(e),
            });
        }
        Ok(Self { conn, manager })
    }

    /// The server `name` (`Error::NoSuchServer` if there is none), with
    /// property caching off: every read is the daemon's current value.
    /// A new host session on server `name` (`Attach`): a stream socket
    /// speaking MCP with the daemon, which outlives this client.
    /// A host session of `name`: a unit, or an aggregate written as
    /// `mcpctl bridge` takes it (`@GROUP`, `@all`, `A+B`).
    pub async fn attach(&self, name: &str) -> Result<std::os::fd::OwnedFd, Error> {
        use crate::mux::aggregate::Target;
        let fd = match Target::parse(name).map_err(Error::InvalidArguments)? {
            Target::Unit(name) => self.server(&name).await?.attach().await?,
            Target::Group(group) => self.manager.attach_group(&group).await?,
            Target::All => self.manager.attach_group("all").await?,
            Target::Units(names) => {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                self.manager.attach_units(&names).await?
            }
        };
        Ok(fd.into())
    }

    pub async fn server(&self, name: &str) -> Result<ServerProxy<'static>, Error> {
        self.manager.get_server(name).await?;
        Ok(ServerProxy::builder(&self.conn)
            .path(server_path(name))
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?)
    }
}
