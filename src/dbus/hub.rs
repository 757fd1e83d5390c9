//! [`Hub`]: every live connection the objects are served on, and the
//! fan-out of signals and property changes to them.
//!
//! A connection is a *peer*: the bus connection (one, however many bus
//! clients there are) or one private-socket client. A private peer is
//! released the moment its socket closes — the client disconnected, or
//! sent something zbus cannot read, which stops zbus's reader for good —
//! so its objects, its fd and its place in the fan-out go with it at once,
//! not at the next signal. A send that fails retires the peer too, with a
//! warning naming it; nothing sent to a peer is dropped silently.
//!
//! The fan-out sends peer by peer, each send bounded by `SEND_TIMEOUT`: a
//! slow peer can delay the others by up to that long (a per-peer queue would
//! not).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use zbus::Connection;
use zbus::object_server::SignalEmitter;

use crate::model::{Change, Diff};
use crate::supervisor::ListKind;

use super::manager::Manager;
use super::objects::{self, ObjectManager};
use super::server::{self, Server};
use crate::model::Shared;

use super::access::{Callers, MANAGER_PATH, server_path};

/// How long one send to one peer may take. A client that stops reading
/// (a suspended `mcpctl bridge`) fills its socket and would hold up the
/// fan-out to everyone else; past this it is retired instead.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Bounds one send; a send that does not finish in time is an error.
async fn bounded(send: impl Future<Output = zbus::Result<()>>) -> zbus::Result<()> {
    match tokio::time::timeout(SEND_TIMEOUT, send).await {
        Ok(result) => result,
        Err(_) => Err(zbus::Error::InputOutput(Arc::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the peer did not take the message within {}",
                humantime::format_duration(SEND_TIMEOUT)
            ),
        )))),
    }
}

/// Who is at the other end of a connection, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// The system or session bus (every bus client shares it).
    Bus,
    /// A client of the private socket, by its `SO_PEERCRED`.
    Private { pid: Option<u32>, uid: Option<u32> },
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who::Bus => f.write_str("the bus"),
            Who::Private {
                pid: Some(pid),
                uid,
            } => {
                write!(f, "private client pid {pid}")?;
                match uid {
                    Some(uid) => write!(f, " (uid {uid})"),
                    None => Ok(()),
                }
            }
            Who::Private { pid: None, .. } => f.write_str("private client (pid unknown)"),
        }
    }
}

/// One live connection.
#[derive(Debug, Clone)]
struct Peer {
    conn: Connection,
    who: Who,
}

/// The task forwarding one supervisor's status changes, and that
/// supervisor's channel (to tell whether a unit still has the same one).
#[derive(Debug)]
struct Watcher {
    task: JoinHandle<()>,
    status: tokio::sync::watch::Receiver<crate::supervisor::Status>,
}

/// Every live connection the objects are served on.
#[derive(Debug)]
pub struct Hub {
    shared: Arc<Shared>,
    /// The bus callers' credentials, which every server object shares.
    callers: Arc<Callers>,
    /// Live peers by a number never reused.
    peers: Mutex<BTreeMap<u64, Peer>>,
    next_id: AtomicU64,
    /// Per server: the task forwarding its status changes as signals.
    watchers: Mutex<BTreeMap<String, Watcher>>,
    /// Woken whenever a peer is released: its fd is free again, so an
    /// accept loop starved of fds may retry at once.
    released: Arc<Notify>,
}

impl Hub {
    pub fn new(shared: Arc<Shared>) -> Arc<Self> {
        let hub = Arc::new(Self {
            shared,
            callers: Arc::default(),
            peers: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            watchers: Mutex::new(BTreeMap::new()),
            released: Arc::new(Notify::new()),
        });
        for name in hub.shared.names() {
            hub.watch(&name);
        }
        hub
    }

    /// How many connections are live (the bus counts once).
    pub fn len(&self) -> usize {
        self.peers.lock().map(|p| p.len()).unwrap_or_default()
    }

    /// Whether no connection is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Notified whenever a peer is released (a permit is kept when no
    /// one waits), for the accept loop to retry a failed accept at once.
    pub fn released(&self) -> Arc<Notify> {
        Arc::clone(&self.released)
    }

    fn snapshot(&self) -> Vec<(u64, Peer)> {
        self.peers
            .lock()
            .map(|p| p.iter().map(|(id, peer)| (*id, peer.clone())).collect())
            .unwrap_or_default()
    }

    /// Adds a connection to the fan-out. `served` are the servers
    /// [`Hub::serving`] registered on it: a reload between then and now
    /// (during the handshake) is caught up here, with the object manager's
    /// signals a live connection gets. A private peer is released
    /// as soon as its socket closes; the bus connection stays for the
    /// daemon's life (its loss is logged when a send fails).
    pub async fn add(self: &Arc<Self>, conn: Connection, who: Who, served: Vec<String>) {
        let now = self.shared.names();
        for name in now.iter().filter(|n| !served.contains(n)) {
            let at = async {
                conn.object_server()
                    .at(
                        server_path(name),
                        Server::new(name, Arc::clone(&self.shared), Arc::clone(&self.callers)),
                    )
                    .await?;
                objects::added(&conn, name).await
            };
            if let Err(e) = at.await {
                tracing::warn!(target: "mcpd::dbus", "{who}: cannot serve {name}: {e}");
            }
        }
        for name in served.iter().filter(|n| !now.contains(n)) {
            let remove = async {
                conn.object_server()
                    .remove::<Server, _>(server_path(name))
                    .await?;
                objects::removed(&conn, name).await
            };
            if let Err(e) = remove.await {
                tracing::warn!(target: "mcpd::dbus", "{who}: cannot withdraw {name}: {e}");
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut peers) = self.peers.lock() {
            peers.insert(
                id,
                Peer {
                    conn: conn.clone(),
                    who,
                },
            );
        }
        tracing::debug!(target: "mcpd::dbus", "{who} connected");
        if who == Who::Bus {
            return;
        }
        // The task holds the connection only until it closes, and the hub
        // not at all: a daemon shutting down is not kept alive by clients.
        let hub: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            conn.closed().await;
            drop(conn);
            if let Some(hub) = hub.upgrade() {
                hub.release(id, "disconnected");
            }
        });
    }

    /// Forgets peer `id`; the connection (and its fd, and its objects) go
    /// when the last clone is dropped, which is now unless a method call of
    /// that peer is still finishing.
    fn release(&self, id: u64, why: &str) {
        let peer = self.peers.lock().ok().and_then(|mut p| p.remove(&id));
        if let Some(peer) = peer {
            tracing::debug!(target: "mcpd::dbus", "{} {why}", peer.who);
            drop(peer);
            // One stored permit: a release between a failed accept and the
            // accept loop's wait is not missed.
            self.released.notify_one();
        }
    }

    /// A send to peer `id` failed: warn, and retire a private peer (a bus
    /// connection is kept unless it is closed).
    fn failed(&self, id: u64, peer: &Peer, what: &str, error: &zbus::Error) {
        if peer.who == Who::Bus && !peer.conn.is_closed() {
            tracing::warn!(target: "mcpd::dbus", "cannot send {what} on the bus: {error}");
            return;
        }
        tracing::warn!(
            target: "mcpd::dbus",
            "cannot send {what} to {}: {error}; dropping the connection",
            peer.who
        );
        let conn = peer.conn.clone();
        self.release(id, "dropped");
        // Closing shuts the socket even if a clone is still held somewhere.
        tokio::spawn(async move {
            let _closed = conn.close().await;
        });
    }

    /// Reports the outcome of a send to peer `id`: a failure retires it.
    fn sent(&self, id: u64, peer: &Peer, what: &str, result: zbus::Result<()>) {
        if let Err(e) = result {
            self.failed(id, peer, what, &e);
        }
    }

    /// A connection builder that serves the manager, the object manager and
    /// every server from its first message on; with the names it serves
    /// (for [`Hub::add`]).
    pub fn serving<'b>(
        &self,
        builder: zbus::connection::Builder<'b>,
    ) -> (zbus::connection::Builder<'b>, Vec<String>) {
        let mut builder = builder
            .serve_at(MANAGER_PATH, ObjectManager::new(Arc::clone(&self.shared)))
            .serve_at(
                MANAGER_PATH,
                Manager::new(Arc::clone(&self.shared), Arc::clone(&self.callers)),
            );
        let names = self.shared.names();
        for name in &names {
            builder = builder.serve_at(
                server_path(name),
                Server::new(name, Arc::clone(&self.shared), Arc::clone(&self.callers)),
            );
        }
        (builder, names)
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
                    self.unit_properties(name).await;
                }
                Change::Changed { .. } => {
                    self.watch(name);
                    self.unit_properties(name).await;
                }
                Change::Unchanged => {}
            }
        }
        for (id, peer) in self.snapshot() {
            let sent = bounded(async {
                Manager::reloaded(&SignalEmitter::new(&peer.conn, MANAGER_PATH)?).await
            })
            .await;
            self.sent(id, &peer, "Reloaded", sent);
        }
    }

    /// PropertiesChanged for what a reload changes, everywhere.
    async fn unit_properties(&self, name: &str) {
        for (id, peer) in self.snapshot() {
            let sent = bounded(server::emit_unit_properties(&peer.conn, name)).await;
            self.sent(id, &peer, "property changes", sent);
        }
    }

    /// Serves server `name` on every connection that lacks it, announcing
    /// it there; a unit known before (invalid until now, or served from the
    /// connection's start) is not announced twice.
    async fn added(self: &Arc<Self>, name: &str) {
        let path = server_path(name);
        for (id, peer) in self.snapshot() {
            let sent = bounded(async {
                let existing = peer
                    .conn
                    .object_server()
                    .at(
                        &path,
                        Server::new(name, Arc::clone(&self.shared), Arc::clone(&self.callers)),
                    )
                    .await?;
                // `None`: served now; `Some`: it was there already.
                if existing.is_none() {
                    objects::added(&peer.conn, name).await?;
                    let emitter = SignalEmitter::new(&peer.conn, MANAGER_PATH)?;
                    Manager::server_added(&emitter, name, path.as_ref()).await?;
                }
                Ok(())
            })
            .await;
            self.sent(id, &peer, "ServerAdded", sent);
        }
        self.watch(name);
    }

    async fn removed(self: &Arc<Self>, name: &str) {
        if let Some(watcher) = self.watchers.lock().ok().and_then(|mut w| w.remove(name)) {
            watcher.task.abort();
        }
        let path = server_path(name);
        for (id, peer) in self.snapshot() {
            let sent = bounded(async {
                peer.conn.object_server().remove::<Server, _>(&path).await?;
                objects::removed(&peer.conn, name).await?;
                let emitter = SignalEmitter::new(&peer.conn, MANAGER_PATH)?;
                Manager::server_removed(&emitter, name, path.as_ref()).await
            })
            .await;
            self.sent(id, &peer, "ServerRemoved", sent);
        }
    }

    /// Forwards the status changes of server `name`. A unit that keeps its
    /// supervisor (a change applied in place or by a restart) keeps its
    /// watcher: a new one would start from the current status and miss a
    /// change made between the apply and now (a tool filter's new list).
    fn watch(self: &Arc<Self>, name: &str) {
        let Ok(unit) = self.shared.unit(name) else {
            return;
        };
        let Some(supervisor) = unit.supervisor else {
            return;
        };
        let status = supervisor.subscribe();
        let same = self.watchers.lock().ok().is_some_and(|w| {
            w.get(name)
                .is_some_and(|old| old.status.same_channel(&status) && !old.task.is_finished())
        });
        if same {
            return;
        }
        let hub = Arc::downgrade(self);
        let owned = name.to_owned();
        let task = tokio::spawn(async move {
            let mut rx = supervisor.subscribe();
            let mut last = rx.borrow_and_update().clone();
            let mut lists = supervisor.subscribe_lists();
            let mut last_lists = *lists.borrow_and_update();
            let mut instances = supervisor.subscribe_instances();
            instances.borrow_and_update();
            // Without a login: a channel that never changes.
            let (_never, never) = tokio::sync::watch::channel(Default::default());
            let login_of = |s: &crate::supervisor::Supervisor| {
                s.login().map_or_else(|| never.clone(), |l| l.subscribe())
            };
            let mut auth = login_of(&supervisor);
            auth.borrow_and_update();
            loop {
                tokio::select! {
                    changed = auth.changed() => {
                        if changed.is_err() {
                            // The login was replaced (a changed unit):
                            // follow the new one.
                            auth = login_of(&supervisor);
                        }
                        auth.borrow_and_update();
                        let Some(hub) = hub.upgrade() else { return };
                        for (id, peer) in hub.snapshot() {
                            let sent = bounded(server::emit_auth_changed(&peer.conn, &owned)).await;
                            hub.sent(id, &peer, "auth changes", sent);
                        }
                    }
                    changed = instances.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        instances.borrow_and_update();
                        let Some(hub) = hub.upgrade() else { return };
                        for (id, peer) in hub.snapshot() {
                            let sent = bounded(server::emit_instances_changed(&peer.conn, &owned)).await;
                            hub.sent(id, &peer, "instance changes", sent);
                        }
                    }
                    changed = rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let now = rx.borrow_and_update().clone();
                        let Some(hub) = hub.upgrade() else { return };
                        for (id, peer) in hub.snapshot() {
                            let sent = bounded(server::emit_changes(&peer.conn, &owned, &last, &now)).await;
                            hub.sent(id, &peer, "status changes", sent);
                        }
                        last = now;
                    }
                    changed = lists.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        let now = *lists.borrow_and_update();
                        let Some(hub) = hub.upgrade() else { return };
                        let mut which: Vec<&str> = ListKind::KEPT
                            .into_iter()
                            .filter(|k| now[k.index()] != last_lists[k.index()])
                            .map(ListKind::which)
                            .collect();
                        which.dedup();
                        let generation = last.generation;
                        for (id, peer) in hub.snapshot() {
                            for list in &which {
                                let sent = bounded(server::emit_list_changed(&peer.conn, &owned, generation, list)).await;
                                hub.sent(id, &peer, "ListChanged", sent);
                            }
                        }
                        last_lists = now;
                    }
                }
            }
        });
        if let Ok(mut watchers) = self.watchers.lock()
            && let Some(old) = watchers.insert(name.to_owned(), Watcher { task, status })
        {
            old.task.abort();
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        if let Ok(watchers) = self.watchers.get_mut() {
            for (_, watcher) in std::mem::take(watchers) {
                watcher.task.abort();
            }
        }
    }
}
