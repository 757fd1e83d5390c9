//! A shared unit's 2025 lane (DESIGN §12): the second upstream of a stdio
//! server that speaks both eras. The unit's own generation speaks
//! 2026-07-28 to it; a host that opens with `initialize` is served by a
//! second process of the unit, `NAME@2025-11-25`, pinned to the handshake
//! ([`UnitSpec::for_lane`]), so the server itself elicits and samples
//! for that host as it would directly.
//!
//! The lane is a whole supervisor (an actor, its machine, its host
//! sessions), as a per-host unit's instance is (`instances`): its
//! generations, backoff, budget, health probes, limits, sandbox and
//! containment are its own by construction (its cgroup is beside the
//! unit's: `Launcher::lane`). It is made and started when the first 2025
//! host attaches (that host's `initialize` waits for its first
//! generation), and a watcher shuts it down `idle-stop` after its last
//! host left ([`UnitSpec::lane_idle_stop`]); a host that attaches
//! meanwhile keeps it. Which lane serves a host is decided by
//! `mux::session::lanes`; the unit's handle peeks at the host's first line
//! and asks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::Supervisor;
use super::accounting::Counters;
use crate::unit::UnitSpec;

/// The lane's version, as its name and `mcpctl status` show it.
pub const LANE_VERSION: &str = crate::mux::session::PROTOCOL_VERSION;

struct Running {
    supervisor: Supervisor,
    /// Host sessions attached to it by the unit, ever: a watcher that
    /// saw none attached stops it only if this did not change meanwhile.
    attached: u64,
    /// Sent or dropped: the watcher shuts the lane down now.
    stop: oneshot::Sender<()>,
    watcher: JoinHandle<()>,
}

/// A shared unit's lanes beside its own generation (one, the 2025 one).
#[derive(Default)]
pub(crate) struct Lanes {
    running: Mutex<Option<Running>>,
    /// Raised whenever the lane comes or goes.
    changed: watch::Sender<u64>,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes").finish_non_exhaustive()
    }
}

impl Lanes {
    /// The running lane, if any.
    pub(crate) fn get(&self) -> Option<Supervisor> {
        let running = self.running.lock().ok()?;
        running.as_ref().map(|r| r.supervisor.clone())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether the lane failed (its retries exhausted): the server does
    /// not speak the handshake after all, and 2025 hosts are translated
    /// on the unit's own upstream while it stays so.
    pub(crate) fn failed(&self) -> bool {
        self.get()
            .is_some_and(|lane| lane.state() == super::State::Failed)
    }

    /// The lane of `unit` to attach a host to, made and started now if
    /// there is none (`spec`: the unit's, as last applied); None when the
    /// unit's launcher cannot make one.
    pub(crate) fn take(self: &Arc<Self>, unit: &Supervisor, spec: &UnitSpec) -> Option<Supervisor> {
        let mut running = self.running.lock().ok()?;
        if let Some(r) = running.as_mut() {
            r.attached += 1;
            return Some(r.supervisor.clone());
        }
        let name = format!("{}@{LANE_VERSION}", unit.name());
        let launcher = unit.launcher.lane(&name)?;
        let (lane, task) =
            Supervisor::spawn(&name, spec.for_lane(), launcher, unit.logs.clone(), None);
        lane.arm();
        tracing::info!(target: "mcpd::supervisor", mcpd_server = %unit.name(), "lane {name} for hosts of MCP {LANE_VERSION}");
        let (stop, stopped) = oneshot::channel();
        let watcher = self.watch(
            lane.clone(),
            task,
            spec.lane_idle_stop(),
            Arc::clone(&unit.counters),
            stopped,
        );
        *running = Some(Running {
            supervisor: lane.clone(),
            attached: 1,
            stop,
            watcher,
        });
        drop(running);
        self.bump();
        Some(lane)
    }

    /// Shuts `lane` down `idle_stop` after its last host left (none
    /// attached, none attached by the unit meanwhile), or once `stopped`
    /// is sent or dropped; its calls stay the unit's (`unit`).
    fn watch(
        self: &Arc<Self>,
        lane: Supervisor,
        task: JoinHandle<()>,
        idle_stop: Duration,
        unit: Arc<Counters>,
        stopped: oneshot::Receiver<()>,
    ) -> JoinHandle<()> {
        let lanes = Arc::clone(self);
        let mut presence = lane.sessions.presence();
        let idle = async move {
            loop {
                let ever = match presence
                    .wait_for(|(ever, now)| *ever > 0 && *now == 0)
                    .await
                {
                    Ok(now) => now.0,
                    Err(_) => break,
                };
                let attached = lanes.attached();
                tokio::select! {
                    () = tokio::time::sleep(idle_stop) => {}
                    changed = presence.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        continue;
                    }
                }
                if lanes.end_if(attached, *presence.borrow() == (ever, 0)) {
                    break;
                }
            }
            lanes.bump();
        };
        tokio::spawn(async move {
            tokio::select! {
                () = idle => {
                    tracing::info!(target: "mcpd::supervisor", mcpd_server = %lane.name(), "stopping the lane: its last host left {}s ago", idle_stop.as_secs_f64());
                }
                _ = stopped => {}
            }
            let counters = lane.clone();
            lane.shutdown(task).await;
            unit.add(counters.counters());
        })
    }

    /// Forgets the lane if the unit attached no host to it since
    /// `attached` was read and none is attached (`idle`): whether it did.
    fn end_if(&self, attached: Option<u64>, idle: bool) -> bool {
        let Ok(mut running) = self.running.lock() else {
            return true;
        };
        if idle && running.as_ref().map(|r| r.attached) == attached {
            *running = None;
            return true;
        }
        false
    }

    fn attached(&self) -> Option<u64> {
        let running = self.running.lock().ok()?;
        running.as_ref().map(|r| r.attached)
    }

    /// Shuts the lane down now (the unit goes, or the daemon ends); the
    /// future ends once it has stopped.
    pub(crate) fn stop(&self) -> impl Future<Output = ()> + use<> {
        let running = self.running.lock().ok().and_then(|mut r| r.take());
        self.bump();
        async move {
            if let Some(r) = running {
                let _ = r.stop.send(());
                let _ = r.watcher.await;
            }
        }
    }
}
