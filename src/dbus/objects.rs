//! `org.freedesktop.DBus.ObjectManager` at `/org/mcpd1`: the server
//! objects and their properties on request, and `InterfacesAdded` /
//! `InterfacesRemoved` when a connection gains or loses one.
//!
//! zbus's own `fdo::ObjectManager` announces every object under it when a
//! connection is built: each private-socket client (every `mcpctl` run)
//! made the daemon read all properties of every server, the whole tool
//! list of each included, however little the client then asked for. This
//! one says nothing at connection set-up: a client that wants every object
//! asks `GetManagedObjects`, and the signals follow units as they come and
//! go ([`super::Hub`]).

use std::collections::HashMap;
use std::sync::Arc;

use zbus::fdo::ManagedObjects;
use zbus::names::{InterfaceName, OwnedInterfaceName};
use zbus::object_server::{Interface, SignalEmitter};
use zbus::{Connection, ObjectPath, ObjectServer, OwnedVariant, interface};

use crate::model::Shared;

use super::access::{MANAGER_PATH, server_path};
use super::server::Server;

/// The object manager of one connection.
#[derive(Debug)]
pub struct ObjectManager {
    shared: Arc<Shared>,
}

impl ObjectManager {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

/// `org.mcpd1.Server` and its properties (as `GetAll` gives them) of the
/// server object at `path` on `conn`; None when it is not served there.
async fn server_properties(
    server: &ObjectServer,
    conn: &Connection,
    path: &ObjectPath<'_>,
) -> zbus::fdo::Result<Option<HashMap<String, OwnedVariant>>> {
    let Ok(iref) = server.interface::<_, Server>(path).await else {
        return Ok(None);
    };
    let iface = iref.get().await;
    let properties = iface
        .get_all(server, conn, None, iref.signal_emitter())
        .await?;
    Ok(Some(properties))
}

#[interface(
    name = "org.freedesktop.DBus.ObjectManager",
    introspection_docs = false
)]
impl ObjectManager {
    /// Every server object served on this connection, with the
    /// properties of its interface.
    async fn get_managed_objects(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(connection)] conn: &Connection,
    ) -> zbus::fdo::Result<ManagedObjects> {
        let mut objects = ManagedObjects::new();
        for name in self.shared.names() {
            let path = server_path(&name);
            if let Some(properties) = server_properties(server, conn, &path).await? {
                let interface = OwnedInterfaceName::from(Server::name());
                objects.insert(path, HashMap::from([(interface, properties)]));
            }
        }
        Ok(objects)
    }

    #[zbus(signal)]
    async fn interfaces_added(
        emitter: &SignalEmitter<'_>,
        object_path: ObjectPath<'_>,
        interfaces_and_properties: HashMap<InterfaceName<'_>, HashMap<String, OwnedVariant>>,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn interfaces_removed(
        emitter: &SignalEmitter<'_>,
        object_path: ObjectPath<'_>,
        interfaces: &[InterfaceName<'_>],
    ) -> zbus::Result<()>;
}

/// `InterfacesAdded` on `conn` for server `name`, just served there.
pub(crate) async fn added(conn: &Connection, name: &str) -> zbus::Result<()> {
    let path = server_path(name);
    let properties = server_properties(conn.object_server(), conn, &path).await?;
    let Some(properties) = properties else {
        return Ok(());
    };
    let emitter = SignalEmitter::new(conn, MANAGER_PATH)?;
    ObjectManager::interfaces_added(
        &emitter,
        path.as_ref(),
        HashMap::from([(Server::name(), properties)]),
    )
    .await
}

/// `InterfacesRemoved` on `conn` for server `name`, just withdrawn there.
pub(crate) async fn removed(conn: &Connection, name: &str) -> zbus::Result<()> {
    let emitter = SignalEmitter::new(conn, MANAGER_PATH)?;
    ObjectManager::interfaces_removed(&emitter, server_path(name).as_ref(), &[Server::name()]).await
}
