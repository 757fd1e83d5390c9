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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::Supervisor;
use crate::mux::session::lanes::Agreement;
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
    /// A lane was established once: the server speaks the handshake.
    established: AtomicBool,
    /// A lane could not establish its first generation: the server does
    /// not speak the handshake; 2025 hosts are translated from now on.
    refused: AtomicBool,
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

    /// Whether a lane could not establish its first generation, or failed
    /// for good: the server does not speak the handshake after all, and
    /// 2025 hosts are translated on the unit's own upstream.
    pub(crate) fn failed(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
            || self
                .get()
                .is_some_and(|lane| lane.state() == super::State::Failed)
    }

    /// Whether `lane` serves hosts: it is running, within `bound` (its
    /// first start), or was established once (an outage of its own then
    /// answers its hosts as any unit's does). One that never was is
    /// stopped, and the unit refuses lanes from now on.
    pub(crate) async fn serves(&self, lane: &Supervisor, bound: Duration) -> bool {
        use super::State;
        if self.established.load(Ordering::Relaxed) {
            return true;
        }
        let mut status = lane.subscribe();
        let settled =
            status.wait_for(|s| !matches!(s.state, State::Stopped | State::Starting | State::Idle));
        let running = matches!(
            tokio::time::timeout(bound, settled).await,
            Ok(Ok(s)) if s.state == State::Running
        );
        if running {
            self.established.store(true, Ordering::Relaxed);
            return true;
        }
        if self.established.load(Ordering::Relaxed) {
            return true;
        }
        tracing::warn!(target: "mcpd::supervisor", mcpd_server = %lane.name(), "the server does not establish a session of MCP {LANE_VERSION} ({}); its 2025 hosts are translated on the unit's own upstream", lane.status().last_error.unwrap_or_default());
        self.refused.store(true, Ordering::Relaxed);
        let stopping = self.running.lock().ok().and_then(|mut r| {
            let same = r
                .as_ref()
                .is_some_and(|r| r.supervisor.name() == lane.name());
            if same { r.take() } else { None }
        });
        if let Some(r) = stopping {
            let _ = r.stop.send(());
        }
        false
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
        let watcher = self.watch(lane.clone(), task, spec.lane_idle_stop(), unit, stopped);
        *running = Some(Running {
            supervisor: lane.clone(),
            attached: 1,
            stop,
            watcher,
        });
        drop(running);
        Some(lane)
    }

    /// Shuts `lane` down `idle_stop` after its last host left (none
    /// attached, none attached by the unit meanwhile), or once `stopped`
    /// is sent or dropped; its calls stay the unit's (`unit`). Meanwhile
    /// its lists are compared with the unit's ([`agree`]).
    fn watch(
        self: &Arc<Self>,
        lane: Supervisor,
        task: JoinHandle<()>,
        idle_stop: Duration,
        unit: &Supervisor,
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
        };
        let counters = Arc::clone(&unit.counters);
        let agreeing = agree(Side::of(unit), Side::of(&lane));
        tokio::spawn(async move {
            tokio::select! {
                () = idle => {
                    tracing::info!(target: "mcpd::supervisor", mcpd_server = %lane.name(), "stopping the lane: its last host left {}s ago", idle_stop.as_secs_f64());
                }
                _ = stopped => {}
                () = agreeing => {}
            }
            let calls = lane.clone();
            lane.shutdown(task).await;
            counters.add(calls.counters());
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
        async move {
            if let Some(r) = running {
                let _ = r.stop.send(());
                let _ = r.watcher.await;
            }
        }
    }
}

/// What [`agree`] watches of one lane: receivers and a shared read of
/// its lists, which keep neither lane's supervisor alive.
struct Side {
    name: String,
    status: tokio::sync::watch::Receiver<super::Status>,
    serials: tokio::sync::watch::Receiver<[u64; 3]>,
    kept: super::sessions::Lists,
}

impl Side {
    fn of(supervisor: &Supervisor) -> Self {
        Self {
            name: supervisor.name().to_owned(),
            status: supervisor.subscribe(),
            serials: supervisor.subscribe_lists(),
            kept: supervisor.sessions.kept(),
        }
    }
}

/// Kept list `index` of `kept`, as published.
fn kept(kept: &super::sessions::Lists, index: usize) -> Option<Arc<str>> {
    kept.lock().ok()?.get(index).cloned().flatten()
}

/// Compares the lists `lane` reads with those its `unit` reads while both
/// run (DESIGN §12: the unit's published lists are its own lane's, one
/// list whichever lane read it): a difference is logged, a warning naming
/// the list and the lanes, once per change ([`Agreement`]). Never ends
/// while the lane runs.
async fn agree(mut own: Side, mut other: Side) {
    use super::State;
    let mut agreement = Agreement::default();
    loop {
        let mut differ = Vec::new();
        {
            let (a, b) = (
                own.status.borrow_and_update(),
                other.status.borrow_and_update(),
            );
            let (a_kept, b_kept) = (
                *own.serials.borrow_and_update(),
                *other.serials.borrow_and_update(),
            );
            if a.state == State::Running && b.state == State::Running {
                if agreement.differs(0, (a.tools_serial, b.tools_serial), a.tools == b.tools) {
                    let names = |t: &super::ToolList| -> Vec<String> {
                        t.names().map(str::to_owned).collect()
                    };
                    let (x, y) = (names(&a.tools), names(&b.tools));
                    differ.push((0, format!(" ({})", apart(&own.name, &x, &other.name, &y))));
                }
                for (i, serials) in a_kept.into_iter().zip(b_kept).enumerate() {
                    let (x, y) = (kept(&own.kept, i), kept(&other.kept, i));
                    // Not read by both yet: nothing to compare.
                    if x.is_none() || y.is_none() {
                        continue;
                    }
                    if agreement.differs(i + 1, serials, x == y) {
                        differ.push((i + 1, String::new()));
                    }
                }
            }
        }
        for (list, how) in differ {
            tracing::warn!(target: "mcpd::supervisor", mcpd_server = %own.name, "the {} of lanes {} ({}) and {} ({LANE_VERSION}) differ{how}: hosts of each era get their lane's, D-Bus and mcpctl the unit's", Agreement::LISTS[list], own.name, crate::mux::era::MODERN, other.name);
        }
        let gone = tokio::select! {
            r = own.status.changed() => r.is_err(),
            r = other.status.changed() => r.is_err(),
            r = own.serials.changed() => r.is_err(),
            r = other.serials.changed() => r.is_err(),
        };
        if gone {
            break;
        }
    }
    std::future::pending::<()>().await;
}

/// How two lanes' tool names differ, for the warning: the names only one
/// lists (at most [`NAMED`] each), or that the names are the same.
fn apart(a: &str, a_names: &[String], b: &str, b_names: &[String]) -> String {
    let only = |of: &[String], not: &[String]| -> Vec<String> {
        let names: Vec<String> = of.iter().filter(|n| !not.contains(n)).cloned().collect();
        let more = names.len().saturating_sub(NAMED);
        let mut shown: Vec<String> = names.into_iter().take(NAMED).collect();
        if more > 0 {
            shown.push(format!("{more} more"));
        }
        shown
    };
    let (x, y) = (only(a_names, b_names), only(b_names, a_names));
    if x.is_empty() && y.is_empty() {
        return "same names, other fields".to_owned();
    }
    let side = |name: &str, names: Vec<String>| {
        if names.is_empty() {
            None
        } else {
            Some(format!("only {name}: {}", names.join(", ")))
        }
    };
    [side(a, x), side(b, y)]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
}

/// Tool names a warning names at most, per lane.
const NAMED: usize = 8;
