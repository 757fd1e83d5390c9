//! Per-host instances (DESIGN §13): each host session of a unit with
//! `sessions "per-host"` gets an instance `NAME@N` of its own.
//!
//! An instance is a whole supervisor (an actor, its machine, its host
//! sessions), spawned by the unit's handle with the unit's spec made for
//! one host ([`UnitSpec::for_instance`](crate::unit::UnitSpec::for_instance))
//! and its own launcher ([`Launcher::instance`](super::launch::Launcher::instance):
//! its cgroup `…/servers/NAME/N`). So generations, backoff, budget,
//! health probes, limits, sandbox and containment are an instance's own
//! by construction, and only the unit's handle knows its instances. The
//! instance waits, `idle`, for its host's `initialize`, whose
//! capabilities its upstream declares; a watcher task shuts it down once
//! its host has left (SIGTERM at once, SIGKILL after `stop-timeout`), or
//! when the unit stops, restarts or goes. `N` counts from 1 and is never
//! reused while the daemon runs.
//!
//! An instance's machine begins `idle`; its host's `initialize` is held and
//! demands the start, so the upstream declares the capabilities that
//! `initialize` declared; a host of MCP 2026-07-28 declares them in its
//! discovery or its first request's `_meta` instead. A host over
//! `max-instances` is attached to the unit's own sessions refused, and has
//! everything it asks refused naming the limit. The unit's published lists
//! (D-Bus `Tools`, `mcpctl tools`, the cache) are its newest running
//! instance's, reported by that instance's actor; with none running, what
//! was adopted last stays.
//!
//! D-Bus `CallTool`, `ReadResource` and `GetPrompt` on a per-host unit go to
//! an instance per caller uid, `NAME@uid-UID` (`UnitSpec::for_caller`: on
//! demand with the unit's `idle-stop`), kept by the unit's handle, listed
//! after the hosts' with number 0, not counted against `max-instances`, and
//! not reporting lists (they are declared for no host). The unit's counters
//! add its running instances' and keep those of gone ones.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::SystemTime;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::Supervisor;
use super::accounting::{Caller, Counters};
use super::machine::State;
use super::status::Status;
use crate::unit::InstanceOf;

/// One instance as status and D-Bus show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceView {
    /// Its number: the instance is `NAME@N`; 0 for the instance of the
    /// D-Bus calls of one uid, `NAME@uid-UID` (its uid is `host.uid`).
    pub n: u32,
    pub state: State,
    pub pid: Option<u32>,
    /// Who attached the host session it serves; a D-Bus caller's
    /// instance has the uid alone (its calls come from any process of
    /// that user).
    pub host: Caller,
    /// When its state last changed.
    pub since: SystemTime,
    /// Its host's tool calls.
    pub calls: u64,
    /// Bytes its processes hold, where the containment tells.
    pub memory: Option<u64>,
}

impl InstanceView {
    /// Which instance this is: a host's (`NAME@N`), or, numbered 0, a
    /// D-Bus caller's (`NAME@uid-UID`; an unknown uid is `u32::MAX`).
    pub fn of(&self) -> InstanceOf {
        if self.n == 0 {
            InstanceOf::Caller(self.host.uid.unwrap_or(u32::MAX))
        } else {
            InstanceOf::Host(self.n)
        }
    }
}

struct Running {
    supervisor: Supervisor,
    host: Caller,
    /// Dropped or sent: the watcher shuts the instance down (sent: its
    /// host is detached first, told this).
    stop: Option<oneshot::Sender<String>>,
    /// Ends once the instance has stopped.
    watcher: Option<JoinHandle<()>>,
}

/// A per-host unit's instances.
#[derive(Debug)]
pub(crate) struct Instances {
    /// The last `N` given.
    last: AtomicU32,
    running: Mutex<BTreeMap<u32, Running>>,
    /// Raised whenever an instance comes, goes or changes state.
    changed: watch::Sender<u64>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("supervisor", &self.supervisor.name())
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

impl Default for Instances {
    fn default() -> Self {
        Self {
            last: AtomicU32::new(0),
            running: Mutex::default(),
            changed: watch::Sender::new(0),
        }
    }
}

impl Instances {
    /// How many run (or wait for their host, or stop).
    pub(crate) fn len(&self) -> usize {
        self.running.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// The next instance number.
    pub(crate) fn next(&self) -> u32 {
        self.last.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A receiver that sees every instance come, go or change state.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(crate) fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Raises [`subscribe`](Self::subscribe) whenever the state or pid
    /// of `instance` (what `Instances` rows say of it) changes, until its
    /// actor ends; the task holds `instances` that long.
    pub(crate) fn follow(self: &std::sync::Arc<Self>, instance: &Supervisor) -> JoinHandle<()> {
        let mut status = instance.subscribe();
        let instances = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            let row = |s: &Status| (s.state, s.main_pid);
            let mut last = row(&status.borrow_and_update());
            while status.changed().await.is_ok() {
                let now = row(&status.borrow_and_update());
                if now != last {
                    last = now;
                    instances.bump();
                }
            }
        })
    }

    /// Instance `n` (`supervisor`, with its actor `task`) serves `host`
    /// from now on, until its host has left (its sessions, ever attached,
    /// are all gone) or it is told to stop.
    pub(crate) fn run(
        self: &std::sync::Arc<Self>,
        n: u32,
        supervisor: Supervisor,
        task: JoinHandle<()>,
        host: Caller,
        unit: std::sync::Arc<Counters>,
    ) {
        let (stop, stopped) = oneshot::channel::<String>();
        let mut presence = supervisor.sessions.presence();
        let follow = self.follow(&supervisor);
        let instances = std::sync::Arc::clone(self);
        let instance = supervisor.clone();
        let watcher = tokio::spawn(async move {
            let gone = presence.wait_for(|(ever, now)| *ever > 0 && *now == 0);
            tokio::select! {
                _ = gone => {}
                why = stopped => {
                    if let Ok(why) = why {
                        instance.sessions.end_all(why);
                    }
                }
            }
            let counters = instance.clone();
            instance.shutdown(task).await;
            let _ = follow.await;
            if let Ok(mut running) = instances.running.lock() {
                running.remove(&n);
                // Its counts stay the unit's.
                unit.add(counters.counters());
            }
            instances.bump();
        });
        if let Ok(mut running) = self.running.lock() {
            running.insert(
                n,
                Running {
                    supervisor,
                    host,
                    stop: Some(stop),
                    watcher: Some(watcher),
                },
            );
        }
        self.bump();
    }

    /// Every instance, by number.
    pub(crate) fn views(&self) -> Vec<InstanceView> {
        let Ok(running) = self.running.lock() else {
            return Vec::new();
        };
        running
            .iter()
            .map(|(n, r)| {
                let status = r.supervisor.status();
                InstanceView {
                    n: *n,
                    state: status.state,
                    pid: status.main_pid,
                    host: r.host.clone(),
                    since: status.since,
                    calls: r.supervisor.counters().calls(),
                    memory: r.supervisor.usage().map(|u| u.memory),
                }
            })
            .collect()
    }

    /// Instance `n`'s supervisor.
    pub(crate) fn get(&self, n: u32) -> Option<Supervisor> {
        let running = self.running.lock().ok()?;
        running.get(&n).map(|r| r.supervisor.clone())
    }

    /// Host sessions attached to the instances.
    pub(crate) fn sessions(&self) -> usize {
        let Ok(running) = self.running.lock() else {
            return 0;
        };
        running.values().map(|r| r.supervisor.sessions()).sum()
    }

    /// Every instance's supervisor.
    pub(crate) fn all(&self) -> Vec<Supervisor> {
        let Ok(running) = self.running.lock() else {
            return Vec::new();
        };
        running.values().map(|r| r.supervisor.clone()).collect()
    }

    /// Stops instance `n`, detaching its host told `why`; None when there
    /// is no such instance. The handle ends once it has stopped.
    pub(crate) fn stop(&self, n: u32, why: String) -> Option<JoinHandle<()>> {
        let mut running = self.running.lock().ok()?;
        let r = running.get_mut(&n)?;
        if let Some(stop) = r.stop.take() {
            let _ = stop.send(why);
        }
        r.watcher.take()
    }

    /// Stops every instance, detaching their hosts told `why` (none: the
    /// daemon ends, their bridges attach again to the next one); the
    /// future ends once all have stopped.
    pub(crate) fn stop_all(&self, why: Option<&str>) -> impl Future<Output = ()> + use<> {
        let watchers: Vec<JoinHandle<()>> = match self.running.lock() {
            Ok(mut running) => running
                .values_mut()
                .filter_map(|r| {
                    if let (Some(stop), Some(why)) = (r.stop.take(), why) {
                        let _ = stop.send(why.to_owned());
                    }
                    r.watcher.take()
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        async move {
            for watcher in watchers {
                let _ = watcher.await;
            }
        }
    }
}
