//! `org.mcpd1.Manager` at `/org/mcpd1`, and its client proxy.
//!
//! `Stop` and `Restart` also take an instance of a per-host unit: `NAME@N`
//! for a host's (`Stop` answers once it is gone) and `NAME@uid-UID` for a
//! D-Bus caller's (stopped and kept, started again by its next call).
//! `AttachGroup` and `AttachUnits` attach an aggregate (`crate::aggregate`).

use std::sync::Arc;

use tokio::sync::oneshot;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};
use zbus::{ObjectPath, OwnedObjectPath};

use crate::model::Control;

use crate::model::Shared;

use crate::mux::aggregate::Target;
use crate::unit::{InstanceName, InstanceOf};

use super::access::{
    Callers, Error, authorize, caller, invalid_reason, server_path, session_socket,
};

/// One row of `ListServers`, `(ssssuo)` on the wire.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, zbus::zvariant::Type,
)]
pub struct ServerRow {
    pub name: String,
    pub description: String,
    /// One of the state words ([`crate::supervisor::State`]).
    pub state: String,
    pub reason: String,
    pub tools: u32,
    pub path: OwnedObjectPath,
}

/// The manager object.
#[derive(Debug)]
pub struct Manager {
    shared: Arc<Shared>,
    callers: Arc<Callers>,
}

impl Manager {
    pub(crate) fn new(shared: Arc<Shared>, callers: Arc<Callers>) -> Self {
        Self { shared, callers }
    }

    /// An aggregate host session over `target` (DESIGN §14): the
    /// caller's end of its socket. Allowed as `Attach`.
    async fn attach_to(
        &self,
        target: Target,
        header: &Header<'_>,
        conn: &Connection,
    ) -> Result<zbus::OwnedFd, Error> {
        authorize(&self.shared, conn, header).await?;
        let who = caller(&self.callers, conn, header).await;
        let (link, theirs) = session_socket()?;
        crate::aggregate::attach(&self.shared, target, link, who).map_err(Error::NoSuchServer)?;
        Ok(theirs)
    }

    fn supervisor(&self, name: &str) -> Result<crate::supervisor::Supervisor, Error> {
        Ok(self.shared.supervisor(name)?)
    }
}

/// `NAME@N` or `NAME@uid-UID` (DESIGN §13): an instance of a per-host
/// unit, by its name.
fn instance_of(name: &str) -> Option<InstanceName> {
    name.parse().ok()
}

#[interface(name = "org.mcpd1.Manager")]
impl Manager {
    /// Every server: name, description, state, reason, tool count, path.
    async fn list_servers(&self) -> Vec<ServerRow> {
        let units = self
            .shared
            .units
            .read()
            .map(|u| u.clone())
            .unwrap_or_default();
        units
            .into_iter()
            .map(|(name, unit)| {
                let (state, reason, tools) = match &unit.supervisor {
                    Some(s) => {
                        let status = s.status();
                        (
                            status.state.as_str().to_owned(),
                            status.reason,
                            status.tools.len(),
                        )
                    }
                    None => ("stopped".to_owned(), invalid_reason(&unit), 0),
                };
                let path = server_path(&name);
                ServerRow {
                    name,
                    description: unit.description.unwrap_or_default(),
                    state,
                    reason,
                    tools: u32::try_from(tools).unwrap_or(u32::MAX),
                    path,
                }
            })
            .collect()
    }

    /// The object path of server `name`.
    async fn get_server(&self, name: &str) -> Result<OwnedObjectPath, Error> {
        self.shared.unit(name)?;
        Ok(server_path(name))
    }

    async fn start(
        &self,
        name: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), Error> {
        authorize(&self.shared, conn, &header).await?;
        if let Some(InstanceName { unit, .. }) = instance_of(name) {
            return Err(Error::InvalidArguments(format!(
                "an instance of {unit} starts when a host attaches, not by itself"
            )));
        }
        self.supervisor(name)?.start();
        Ok(())
    }

    async fn stop(
        &self,
        name: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), Error> {
        authorize(&self.shared, conn, &header).await?;
        if let Some(InstanceName { unit, of }) = instance_of(name) {
            let supervisor = self.supervisor(unit.as_str())?;
            let stopped = match of {
                InstanceOf::Host(n) => supervisor.stop_instance(n),
                InstanceOf::Caller(uid) => supervisor.stop_caller(uid),
            };
            let stopped = stopped.ok_or_else(|| Error::NoSuchServer(name.to_owned()))?;
            // Answered once the instance is gone, as its host was told.
            let _ = stopped.await;
            return Ok(());
        }
        self.supervisor(name)?.stop();
        Ok(())
    }

    async fn restart(
        &self,
        name: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), Error> {
        authorize(&self.shared, conn, &header).await?;
        if let Some(InstanceName { unit, of }) = instance_of(name) {
            let supervisor = self.supervisor(unit.as_str())?;
            let instance = match of {
                InstanceOf::Host(n) => supervisor.instance(n),
                InstanceOf::Caller(uid) => supervisor.caller_instance(uid),
            };
            instance
                .ok_or_else(|| Error::NoSuchServer(name.to_owned()))?
                .restart();
            return Ok(());
        }
        self.supervisor(name)?.restart();
        Ok(())
    }

    /// One host session over the units of group `group` (`all`: every
    /// unit), their tools and prompts named `UNIT__NAME` (DESIGN §14).
    async fn attach_group(
        &self,
        group: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<zbus::OwnedFd, Error> {
        let target = Target::parse(&format!("@{group}")).map_err(Error::InvalidArguments)?;
        self.attach_to(target, &header, conn).await
    }

    /// One host session over the units `names` (DESIGN §14).
    async fn attach_units(
        &self,
        names: Vec<String>,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<zbus::OwnedFd, Error> {
        if names.iter().any(|n| n.starts_with('@') || n.contains('+')) {
            return Err(Error::InvalidArguments(
                "AttachUnits takes unit names; AttachGroup takes a group".into(),
            ));
        }
        let target = Target::of_args(&names).map_err(Error::InvalidArguments)?;
        self.attach_to(target, &header, conn).await
    }

    /// Rescans the unit files now; returns (unit, what changed) pairs.
    async fn reload(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<(String, String)>, Error> {
        authorize(&self.shared, conn, &header).await?;
        let (reply, diff) = oneshot::channel();
        self.shared
            .control
            .send(Control::Reload { reply: Some(reply) })
            .map_err(|_| Error::ToolFailed("the daemon is shutting down".into()))?;
        let diff = diff
            .await
            .map_err(|_| Error::ToolFailed("the daemon is shutting down".into()))?;
        Ok(diff
            .0
            .into_iter()
            .map(|(name, change)| (name, change.word().to_owned()))
            .collect())
    }

    /// The HTTP endpoint (DESIGN §15): the addresses it listens on (none
    /// when it does not serve) and its open sessions.
    async fn http_endpoint(&self) -> (Vec<String>, u32) {
        let view = self.shared.http.lock().ok().and_then(|h| h.clone());
        let view = view.unwrap_or_default();
        (
            view.listen,
            u32::try_from(view.sessions).unwrap_or(u32::MAX),
        )
    }

    /// Telemetry (DESIGN §18): whether it is on, and the spans exported
    /// and dropped (a full queue, a failed or slow export) since the
    /// daemon started.
    async fn telemetry(&self) -> (bool, u64, u64) {
        let stats = crate::telemetry::stats();
        (stats.on, stats.exported, stats.dropped)
    }

    #[zbus(signal)]
    pub async fn server_added(
        emitter: &SignalEmitter<'_>,
        name: &str,
        path: ObjectPath<'_>,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    pub async fn server_removed(
        emitter: &SignalEmitter<'_>,
        name: &str,
        path: ObjectPath<'_>,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    pub async fn reloaded(emitter: &SignalEmitter<'_>) -> zbus::Result<()>;

    #[zbus(property)]
    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_owned()
    }

    /// "system" or "user".
    #[zbus(property)]
    fn instance(&self) -> String {
        self.shared.instance.as_str().to_owned()
    }

    /// The unit search path, highest priority first.
    #[zbus(property)]
    fn unit_paths(&self) -> Vec<String> {
        self.shared
            .unit_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect()
    }
}

/// Client side of `org.mcpd1.Manager` (mcpctl uses it); see
/// [`super::client`] for connecting.
pub mod client {
    use crate::dbus::access::Error;

    #[zbus::proxy(
        interface = "org.mcpd1.Manager",
        default_service = "org.mcpd1",
        default_path = "/org/mcpd1"
    )]
    pub trait Manager {
        fn list_servers(&self) -> Result<Vec<super::ServerRow>, Error>;
        fn get_server(&self, name: &str) -> Result<zbus::OwnedObjectPath, Error>;
        fn start(&self, name: &str) -> Result<(), Error>;
        fn stop(&self, name: &str) -> Result<(), Error>;
        fn restart(&self, name: &str) -> Result<(), Error>;
        fn reload(&self) -> Result<Vec<(String, String)>, Error>;
        fn attach_group(&self, group: &str) -> Result<zbus::OwnedFd, Error>;
        fn attach_units(&self, names: &[&str]) -> Result<zbus::OwnedFd, Error>;
        fn http_endpoint(&self) -> Result<(Vec<String>, u32), Error>;
        fn telemetry(&self) -> Result<(bool, u64, u64), Error>;
        #[zbus(signal)]
        fn server_added(&self, name: String, path: zbus::OwnedObjectPath) -> zbus::Result<()>;
        #[zbus(signal)]
        fn server_removed(&self, name: String, path: zbus::OwnedObjectPath) -> zbus::Result<()>;
        #[zbus(signal)]
        fn reloaded(&self) -> zbus::Result<()>;
        #[zbus(property)]
        fn version(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn instance(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn unit_paths(&self) -> Result<Vec<String>, Error>;
    }
}

pub use client::ManagerProxy;
