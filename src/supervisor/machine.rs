//! The pure state machine of one server: `step(event, now) → effects`.
//!
//! No I/O, no clock, no tasks: the actor feeds it events (operator commands,
//! generation events, the passing of its own deadline) with the current
//! instant, and performs the effects it returns. Everything DESIGN §3 promises
//! is decided here and table-tested:
//!
//! - one process at a time: a generation's successor is only started once
//!   the generation has no live process ([`Event::Exited`]); SIGTERM, then
//!   SIGKILL after `stop-timeout`, then fail closed ([`State::Failed`], never
//!   a second process) if even that leaves it unreaped;
//! - generations fence: events of any generation but the current are inert;
//! - backoff `min(initial·2^(k−1), max)` starts once the failed generation is
//!   reaped; retries are counted per outage; an outage ends only after a
//!   retry stays established for the stability window (`max-delay`);
//! - the first failure signal of a generation decides its fate, later ones
//!   (a connect error racing the child's exit) only complete the cleanup,
//!   so a generation schedules at most one retry;
//! - the published tool list survives an outage and is withdrawn only on
//!   final failure or stop; publishing an equal list changes nothing.
//!
//! - liveness (invariant 9): an established generation is probed only
//!   after `health.interval` of silence from the server; a probe answered
//!   within `health.timeout` (or any other message) is life, and
//!   `health.failures` misses in a row end the generation. The actor sends
//!   the pings and reports when the server was last heard from; the
//!   machine counts and decides.
//!
//! Deadlines have names ([`Timer`]: startup timeout, stability window,
//! probe, probe timeout, kill grace, retry); which are armed follows from
//! the phase. The actor
//! sleeps until the earliest ([`Machine::deadline`]) and then sends
//! [`Event::Deadline`] naming it; a timer that is no longer armed, or not
//! yet due, changes nothing.
//!
//! On-demand units (DESIGN §9) and idleness are decided here too.
//! `Event::Arm` (the daemon loaded the unit) starts an always unit, and
//! makes an on-demand one `idle` with the lists of its cache or starts it
//! to learn them; `Event::Demand` (a first use) starts an idle unit, or one
//! being stopped for idleness once it is gone. An established on-demand
//! generation arms `IdleStop` `idle-stop` after its last use; when it
//! passes the machine asks for the last use (`Effect::Settle`, with its
//! cutoff) and does not arm it again until `Event::Used` answers. `idle` is
//! the one rule of idleness, which the machine applies to that answer.
//! `will_serve` says whether a request may wait for the server instead of
//! failing. A hang-up (stdout closed, the HTTP session gone) gets
//! `stop-timeout` to exit on its own, so its exit status can become the
//! reason. The published tools are the server's through the unit's `tools`
//! filter, applied again in place when only the filter changes. `Timing` is
//! taken from a spec in one place, for `Machine::new` and `Event::Apply`.

use std::fmt;
use std::time::{Duration, Instant};

use crate::unit::{HealthPolicy, ReconnectPolicy, ToolFilter, UnitSpec};

/// A generation number: 1 for the first attempt, never reused.
pub type Gen = u64;

pub use super::tools::ToolList;

/// The observable state (DESIGN §3); the words are the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    Starting,
    Running,
    /// An on-demand unit with no process, waiting for its first use
    /// (DESIGN §9).
    Idle,
    Retrying,
    Reconnecting,
    Failed,
    Stopping,
    Stopped,
    /// An HTTP unit with `oauth` and no usable token (DESIGN §17): no
    /// generation runs, no retry budget is spent; a completed login
    /// ([`Event::LoggedIn`]) starts it.
    NeedsLogin,
}

impl State {
    /// Every state, in the order summaries list them (healthy first).
    pub const ALL: [State; 9] = [
        State::Running,
        State::Idle,
        State::Starting,
        State::Retrying,
        State::Reconnecting,
        State::NeedsLogin,
        State::Failed,
        State::Stopping,
        State::Stopped,
    ];

    /// On its way somewhere: neither settled nor failed.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            State::Starting | State::Retrying | State::Reconnecting | State::Stopping
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Idle => "idle",
            State::Retrying => "retrying",
            State::Reconnecting => "reconnecting",
            State::Failed => "failed",
            State::Stopping => "stopping",
            State::Stopped => "stopped",
            State::NeedsLogin => "needs-login",
        }
    }
}

impl std::str::FromStr for State {
    type Err = String;

    /// The state word, as D-Bus and `mcpctl` show it.
    fn from_str(word: &str) -> Result<Self, Self::Err> {
        State::ALL
            .into_iter()
            .find(|s| s.as_str() == word)
            .ok_or_else(|| format!("unknown state {word:?}"))
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
    /// The kernel's OOM killer killed a process of the server (its
    /// cgroup's `memory.events` counted an `oom_kill`).
    OutOfMemory,
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(c) => write!(f, "exited with status {c}"),
            ExitStatus::Signal(s) => match signal_name(*s) {
                Some(name) => write!(f, "killed by signal {s} ({name})"),
                None => write!(f, "killed by signal {s}"),
            },
            ExitStatus::OutOfMemory => f.write_str("killed by the OOM killer"),
        }
    }
}

fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => return None,
    })
}

/// Which signal to send a generation's process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

/// A named deadline of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    /// `startup-timeout` for a generation to establish.
    Startup,
    /// The stability window (`max-delay`) a retry must stay established
    /// for to end its outage.
    Stable,
    /// `stop-timeout` while a process is taken down: before SIGTERM (it
    /// hung up), before SIGKILL, before failing closed.
    KillGrace,
    /// The backoff before the next retry.
    Retry,
    /// `health.interval` of silence from an established server: probe it.
    Probe,
    /// `health.timeout` for the probe in flight.
    ProbeTimeout,
    /// `idle-stop` after the last use of an established on-demand
    /// generation.
    IdleStop,
}

/// The timing rules of a unit as the machine applies them, taken from its
/// spec in one place for [`Machine::new`] and [`Event::Apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    pub policy: ReconnectPolicy,
    pub startup_timeout: Duration,
    pub stop_timeout: Duration,
    /// Generations run a process (stdio) that must be reaped.
    pub uses_process: bool,
    pub health: HealthPolicy,
    /// `idle-stop` of an on-demand unit; None: it runs always.
    pub idle_stop: Option<Duration>,
}

impl From<&UnitSpec> for Timing {
    fn from(spec: &UnitSpec) -> Self {
        Self {
            policy: spec.reconnect(),
            startup_timeout: spec.startup_timeout(),
            stop_timeout: spec.stop_timeout(),
            uses_process: matches!(spec.transport(), crate::unit::Transport::Stdio(_)),
            health: spec.health(),
            idle_stop: spec.activation().idle_stop(),
        }
    }
}

/// What an on-demand unit's cache (DESIGN §9) says of its last
/// established generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cached {
    /// The server's tools (before the unit's filter).
    pub tools: ToolList,
    pub instructions: Option<String>,
}

/// What the machine is told.
#[derive(Debug, Clone)]
pub enum Event {
    /// The daemon loaded the unit: an always unit starts; an on-demand
    /// unit with `cached` lists waits for its first use (`idle`), without
    /// starts once to learn them.
    Arm { cached: Option<Cached> },
    /// A request needs the server (DESIGN §9): an idle unit starts, one
    /// stopping because it was idle starts again once stopped.
    Demand,
    /// When the server was last used (a request sent or answered), and
    /// whether a request is in flight: reported for [`Effect::Settle`],
    /// and it decides a settle under way.
    Used {
        generation: Gen,
        at: Instant,
        busy: bool,
    },
    /// Operator: start with a fresh budget if stopped or failed.
    Start,
    /// Operator: stop; tools are withdrawn once the process is gone.
    Stop,
    /// Operator: stop if running, then start with a fresh budget.
    Restart,
    /// A new unit spec. `restart` says whether it changes how the server
    /// runs (a new generation) or only metadata (applied in place).
    Apply { spec: Box<UnitSpec>, restart: bool },
    /// The generation's process exists (None: no process, e.g. HTTP).
    Spawned { generation: Gen, pid: Option<u32> },
    /// The generation could not even be started (no process exists).
    SpawnFailed { generation: Gen, error: String },
    /// `initialize` and a complete `tools/list` finished; `instructions`
    /// are what the server's `initialize` answer said; `probe` is the
    /// request the liveness probes send (`ping`, or `server/discover` to
    /// a server of 2026-07-28, which has no ping).
    Established {
        generation: Gen,
        tools: ToolList,
        instructions: Option<String>,
        probe: &'static str,
    },
    /// Connecting failed (an error answer, a protocol error): the process,
    /// if any, is sent SIGTERM at once.
    ConnectFailed { generation: Gen, error: String },
    /// The MCP session ended: the server hung up (stdout closed, HTTP
    /// session gone), before or after `initialize`. A process is given
    /// `stop-timeout` to exit on its own before SIGTERM.
    Closed { generation: Gen, error: String },
    /// The generation found no usable login (no token, or a refresh
    /// token the authorization server rejected): the unit waits for one
    /// in `needs-login`, spending no retry (DESIGN §17); `scopes` are
    /// those a `403 insufficient_scope` asked for (a step-up), if any.
    NeedsLogin {
        generation: Gen,
        scopes: Vec<String>,
    },
    /// A login completed: a unit that needs one starts afresh.
    LoggedIn,
    /// The generation's process was reaped.
    Exited { generation: Gen, status: ExitStatus },
    /// A `notifications/tools/list_changed` re-sync finished.
    ToolsSynced { generation: Gen, tools: ToolList },
    /// A list of the established generation could not be read (a re-sync
    /// of the tools, a resource, template or prompt list): the server
    /// goes on serving what was read before, and the error is its last.
    ListFailed { generation: Gen, error: String },
    /// The server's newest message (answers to probes aside) arrived at
    /// `at`: it is alive. The actor reports it before a probe deadline.
    Heard { generation: Gen, at: Instant },
    /// Probe number `probe` was answered, after `rtt`.
    ProbeAnswered {
        generation: Gen,
        probe: u64,
        rtt: Duration,
    },
    /// The named timer's deadline ([`Machine::deadline`]) has passed.
    Deadline(Timer),
    /// Lists learnt elsewhere: a per-host unit's newest instance's
    /// (DESIGN §13), published (through the unit's filter) as the unit's
    /// own, as a cache is; nothing else changes. A stopped unit ignores
    /// them (its lists are withdrawn).
    Learned { cached: Cached },
}

/// What the actor must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Start generation `generation`: spawn the process (or open the session) and
    /// connect; report `Spawned`/`SpawnFailed`, then `Established` or
    /// `ConnectFailed`, and later `Closed` and `Exited`.
    Spawn { generation: Gen },
    /// Signal the generation's process group.
    Signal { generation: Gen, signal: Signal },
    /// Close the generation's client and cancel its in-flight work (connect,
    /// tool sync); wait for them to finish. `lost` is the failure that ended
    /// it (`None` for a stop): what requests in flight are answered with.
    Disconnect {
        generation: Gen,
        lost: Option<String>,
    },
    /// Send the server an MCP `ping`; report [`Event::ProbeAnswered`] with
    /// `probe` if it is answered.
    Probe { generation: Gen, probe: u64 },
    /// An on-demand unit's `idle-stop` deadline passed: ask the sessions
    /// when the server was last used and whether a request is in flight,
    /// and report it ([`Event::Used`]), which decides. The sessions let go
    /// of the upstream in the same step if it is [`idle`] since `cutoff`,
    /// so that no request reaches a server being stopped.
    Settle { generation: Gen, cutoff: Instant },
}

/// The one rule of idleness, which the machine applies to what the
/// sessions report and the sessions apply as they report it.
pub use crate::mux::session::idle;

/// The reason of `needs-login`, and what every call is answered with
/// (DESIGN §17).
pub fn needs_login(name: &str) -> String {
    needs_login_with(name, &[])
}

/// The reason of `needs-login` after a `403 insufficient_scope` (DESIGN
/// §17 "Step-up"): `server NAME needs a login with scope X Y: run mcpctl
/// auth login NAME`, the scopes the server asked for named.
pub fn needs_login_with(name: &str, scopes: &[String]) -> String {
    if scopes.is_empty() {
        return format!("server {name} needs a login: run mcpctl auth login {name}");
    }
    format!(
        "server {name} needs a login with scope {}: run mcpctl auth login {name}",
        scopes.join(" ")
    )
}

/// What the next generation after a failure will be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Retry number `k` of the current outage.
    Retry(u32),
    /// No further attempts (budget exhausted or reconnect disabled).
    GiveUp,
}

/// What follows once an ending generation's process is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    Recover(Verdict),
    Stop,
    /// Stopped for being idle: `idle`, lists kept.
    Idle,
    /// Start afresh (restart, changed unit): a new generation, a fresh budget.
    Fresh,
    /// Wait for a login (`needs-login`), lists kept.
    Login,
}

/// How far taking a process down has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// No signal sent: waiting for a process that is already exiting.
    Nothing,
    Term,
    Kill,
}

/// The current generation and its process.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Generation {
    generation: Gen,
    pid: Option<u32>,
    /// A process exists that has not been reaped.
    alive: bool,
    established: bool,
    /// Which retry of the outage this is (0: not a retry).
    retry: u32,
}

/// What the probes of an established generation know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Liveness {
    /// The request each probe sends (named in the reason of a loss).
    method: &'static str,
    /// The last sign of life: established, a message, an answered probe.
    heard: Instant,
    /// The probe in flight: its number and when it was sent.
    probe: Option<(u64, Instant)>,
    /// Probes unanswered in a row.
    missed: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Stopped, or failed with nothing left running.
    Idle,
    /// A generation is connecting or established.
    Active {
        g: Generation,
        started: Instant,
        /// While established during an outage: when the outage ends.
        stable_at: Option<Instant>,
        /// Once established.
        live: Option<Liveness>,
        /// The last use (an on-demand unit idles `idle-stop` after it):
        /// when it was established, or a request was last sent or
        /// answered.
        used: Instant,
        /// Its `idle-stop` deadline passed and [`Effect::Settle`] asked
        /// for its last use: idle if unused since this cutoff.
        settling: Option<Instant>,
    },
    /// A generation is being taken down.
    Ending {
        g: Generation,
        then: Then,
        kill: Sent,
        deadline: Option<Instant>,
        /// The failure was "the session closed": the exit status, once
        /// known, says more and replaces it.
        closed: bool,
    },
    /// Waiting to start retry `retry`.
    Backoff {
        retry: u32,
        at: Instant,
        /// The delay `at` was scheduled with.
        delay: Duration,
    },
    /// A process survived SIGKILL: failed closed, nothing will be started
    /// until it is reaped or the operator insists.
    Stuck { g: Generation },
}

/// A snapshot of everything observable: the machine's view with its own
/// instants, and (as [`crate::supervisor::Status`], `View<SystemTime>`) the
/// supervisor's read model, the same type with wall-clock times
/// ([`View::at`]).
#[derive(Debug, Clone, PartialEq)]
pub struct View<T = Instant> {
    pub state: State,
    /// Starts with `connection failed:`/`connection lost:`/`stop failed:` when
    /// something went wrong; empty otherwise.
    pub reason: String,
    /// The newest generation number (0 before the first start).
    pub generation: Gen,
    /// Retry number of the current outage (0 when not in an outage).
    pub attempt: u32,
    pub max_attempts: u32,
    /// When the pending retry starts.
    pub next_retry: Option<T>,
    /// The pending retry's delay, as it was scheduled.
    pub retry_delay: Option<Duration>,
    /// When `state` last changed.
    pub since: T,
    pub main_pid: Option<u32>,
    pub last_exit: Option<ExitStatus>,
    pub last_error: Option<String>,
    /// The published tool list (kept during an outage).
    pub tools: ToolList,
    /// The generation that published `tools`.
    pub tools_generation: Gen,
    /// Increases exactly when the published tool list changes.
    pub tools_serial: u64,
    /// Automatic restarts (retries started), like systemd's `NRestarts`.
    pub restarts: u32,
    /// The `instructions` the server sent in its `initialize` answer (the
    /// newest established generation's).
    pub instructions: Option<String>,
    /// A failed generation's process is still being waited for: the state
    /// and reason are decided, but the reason may still be refined by the
    /// exit status and the retry time is not known yet.
    pub settling: bool,
    pub health: Health<T>,
}

/// What the liveness probes found (DESIGN §3, invariant 9).
#[derive(Debug, Clone, PartialEq)]
pub struct Health<T = Instant> {
    /// `health.enabled`.
    pub enabled: bool,
    /// Probes of the established generation unanswered in a row.
    pub missed: u32,
    /// The established generation's newest answered probe: its round
    /// trip, and when it was answered.
    pub last_ping: Option<(Duration, T)>,
}

impl<T> View<T> {
    /// The same view with its times mapped by `time` (instants to wall
    /// clock).
    pub fn at<U>(self, time: impl Fn(T) -> U) -> View<U> {
        View {
            state: self.state,
            reason: self.reason,
            generation: self.generation,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            next_retry: self.next_retry.map(&time),
            retry_delay: self.retry_delay,
            since: time(self.since),
            main_pid: self.main_pid,
            last_exit: self.last_exit,
            last_error: self.last_error,
            tools: self.tools,
            tools_generation: self.tools_generation,
            tools_serial: self.tools_serial,
            restarts: self.restarts,
            instructions: self.instructions,
            settling: self.settling,
            health: Health {
                enabled: self.health.enabled,
                missed: self.health.missed,
                last_ping: self.health.last_ping.map(|(rtt, at)| (rtt, time(at))),
            },
        }
    }
}

/// One server's supervisor state.
#[derive(Debug, Clone)]
pub struct Machine {
    name: String,
    timing: Timing,
    last_gen: Gen,
    phase: Phase,
    /// Retries started in the current outage; None outside an outage.
    outage: Option<u32>,
    state: State,
    reason: String,
    since: Instant,
    last_exit: Option<ExitStatus>,
    last_error: Option<String>,
    /// The published tools: what the server listed, through `filter`.
    tools: ToolList,
    /// What the server listed last.
    server_tools: ToolList,
    filter: ToolFilter,
    tools_generation: Gen,
    tools_serial: u64,
    restarts: u32,
    instructions: Option<String>,
    /// Probes sent, for their numbers.
    probes: u64,
    /// The established generation's newest answered probe.
    last_ping: Option<(Duration, Instant)>,
}

impl Machine {
    /// A stopped machine for unit `name`; send [`Event::Start`] to start it.
    /// A per-host unit's instance (DESIGN §13) begins `idle`: its host's
    /// `initialize` ([`Event::Demand`]) starts it, so that its upstream
    /// declares that host's capabilities.
    pub fn new(name: &str, spec: &UnitSpec, now: Instant) -> Self {
        let instance = spec.sessions() == crate::unit::Sessions::Instance;
        Self {
            name: name.to_owned(),
            timing: Timing::from(spec),
            last_gen: 0,
            phase: Phase::Idle,
            outage: None,
            state: if instance {
                State::Idle
            } else {
                State::Stopped
            },
            reason: if instance {
                "waiting for its host".into()
            } else {
                String::new()
            },
            since: now,
            last_exit: None,
            last_error: None,
            tools: ToolList::default(),
            server_tools: ToolList::default(),
            filter: spec.tool_filter().clone(),
            tools_generation: 0,
            tools_serial: 0,
            restarts: 0,
            instructions: None,
            probes: 0,
            last_ping: None,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// Nothing is running or being taken down: stopped, or failed (possibly
    /// with an unkillable process left behind, which nothing can help).
    pub fn is_settled(&self) -> bool {
        matches!(self.phase, Phase::Idle | Phase::Stuck { .. })
    }

    /// The current generation, while one is connecting, established or ending.
    pub fn current(&self) -> Option<Gen> {
        match &self.phase {
            Phase::Active { g, .. } | Phase::Ending { g, .. } | Phase::Stuck { g } => {
                Some(g.generation)
            }
            Phase::Idle | Phase::Backoff { .. } => None,
        }
    }

    /// The current generation if it is established and not ending: the one
    /// tool calls and syncs go to.
    pub fn established(&self) -> Option<Gen> {
        match &self.phase {
            Phase::Active { g, .. } if g.established => Some(g.generation),
            _ => None,
        }
    }

    /// What the server listed last (before the unit's filter).
    pub fn server_tools(&self) -> &ToolList {
        &self.server_tools
    }

    /// The `instructions` published.
    pub fn instructions(&self) -> Option<&str> {
        self.instructions.as_deref()
    }

    /// Increases exactly when the published tool list changes.
    pub fn tools_serial(&self) -> u64 {
        self.tools_serial
    }

    /// Whether the server lists tool `name` (before the unit's filter);
    /// `None` while it lists none (a server that lists nothing may still
    /// take calls).
    pub fn server_lists(&self, name: &str) -> Option<bool> {
        (!self.server_tools.is_empty()).then(|| self.server_tools.contains(name))
    }

    /// The earliest armed timer: when the machine next needs
    /// [`Event::Deadline`], and with which name.
    pub fn deadline(&self) -> Option<(Timer, Instant)> {
        self.armed().into_iter().flatten().min_by_key(|(_, at)| *at)
    }

    /// Every armed timer: the phase's, and an established generation's
    /// probe and idle-stop timers.
    fn armed(&self) -> [Option<(Timer, Instant)>; 3] {
        match &self.phase {
            Phase::Active {
                g,
                started,
                stable_at,
                live,
                used,
                settling,
            } => {
                if g.established {
                    let health = self.timing.health;
                    let probe = live.filter(|_| health.enabled()).map(|l| match l.probe {
                        Some((_, sent)) => (Timer::ProbeTimeout, sent + health.timeout()),
                        None => (Timer::Probe, l.heard + health.interval()),
                    });
                    let idle = self
                        .timing
                        .idle_stop
                        .filter(|_| settling.is_none())
                        .map(|after| (Timer::IdleStop, *used + after));
                    [stable_at.map(|at| (Timer::Stable, at)), probe, idle]
                } else {
                    [
                        Some((Timer::Startup, *started + self.timing.startup_timeout)),
                        None,
                        None,
                    ]
                }
            }
            Phase::Ending { deadline, .. } => {
                [deadline.map(|at| (Timer::KillGrace, at)), None, None]
            }
            Phase::Backoff { at, .. } => [Some((Timer::Retry, *at)), None, None],
            Phase::Idle | Phase::Stuck { .. } => [None, None, None],
        }
    }

    /// When `timer` is due, if it is armed.
    fn due(&self, timer: Timer) -> Option<Instant> {
        self.armed()
            .into_iter()
            .flatten()
            .find(|(armed, _)| *armed == timer)
            .map(|(_, at)| at)
    }

    pub fn view(&self) -> View {
        let (attempt, pending, main_pid) = match &self.phase {
            // Once the stability window has ended the outage, no retry counts.
            Phase::Active { g, .. } => (
                if self.outage.is_some() { g.retry } else { 0 },
                None,
                g.pid.filter(|_| g.alive),
            ),
            Phase::Ending { g, then, .. } => {
                let attempt = match then {
                    Then::Recover(Verdict::Retry(k)) => *k,
                    _ => g.retry,
                };
                (attempt, None, g.pid.filter(|_| g.alive))
            }
            Phase::Backoff { retry, at, delay } => (*retry, Some((*at, *delay)), None),
            Phase::Stuck { g } => (g.retry, None, g.pid),
            Phase::Idle => (self.outage.unwrap_or(0), None, None),
        };
        View {
            state: self.state,
            reason: self.reason.clone(),
            generation: self.last_gen,
            attempt,
            max_attempts: self.timing.policy.max_attempts(),
            next_retry: pending.map(|(at, _)| at),
            retry_delay: pending.map(|(_, delay)| delay),
            since: self.since,
            main_pid,
            last_exit: self.last_exit,
            last_error: self.last_error.clone(),
            tools: self.tools.clone(),
            tools_generation: self.tools_generation,
            tools_serial: self.tools_serial,
            restarts: self.restarts,
            instructions: self.instructions.clone(),
            settling: matches!(
                self.phase,
                Phase::Ending {
                    then: Then::Recover(_),
                    ..
                }
            ),
            health: Health {
                enabled: self.timing.health.enabled(),
                missed: match &self.phase {
                    Phase::Active { live: Some(l), .. } => l.missed,
                    _ => 0,
                },
                last_ping: self.last_ping,
            },
        }
    }

    /// Feeds one event; returns what the actor must do, in order.
    pub fn step(&mut self, event: Event, now: Instant) -> Vec<Effect> {
        let mut fx = Vec::new();
        match event {
            Event::Arm { cached } => self.arm(cached, now, &mut fx),
            Event::Learned { cached } => {
                if self.state != State::Stopped {
                    self.instructions = cached.instructions;
                    self.show(cached.tools);
                }
            }
            Event::Demand => self.demand(now, &mut fx),
            Event::Used {
                generation,
                at,
                busy,
            } => {
                if let Phase::Active {
                    g, used, settling, ..
                } = &mut self.phase
                    && g.generation == generation
                {
                    // A request in flight is use until it is answered.
                    *used = (*used).max(if busy { now } else { at });
                    if let Some(cutoff) = settling.take()
                        && idle(*used, busy, cutoff)
                    {
                        self.set_state(State::Stopping, String::new(), now);
                        self.end(Then::Idle, false, None, now, &mut fx);
                    }
                }
            }
            Event::Start => self.start(now, &mut fx),
            Event::Stop => self.stop(now, &mut fx),
            Event::Restart => self.restart(now, &mut fx),
            Event::Apply { spec, restart } => {
                self.timing = Timing::from(&*spec);
                if *spec.tool_filter() != self.filter {
                    // Applied in place: the published list follows at once.
                    self.filter = spec.tool_filter().clone();
                    self.show(self.server_tools.clone());
                }
                // A stopped unit stays stopped; a failed one gets a new chance.
                if restart && self.state != State::Stopped {
                    self.restart(now, &mut fx);
                } else if self.timing.idle_stop.is_none() {
                    // No longer on demand: an always unit runs, also one
                    // being stopped for idleness (once it is gone).
                    match &mut self.phase {
                        Phase::Idle if self.state == State::Idle => self.start(now, &mut fx),
                        Phase::Ending { then, .. } if *then == Then::Idle => *then = Then::Fresh,
                        _ => {}
                    }
                }
            }
            Event::Spawned { generation, pid } => {
                if let Phase::Active { g, .. } = &mut self.phase
                    && g.generation == generation
                {
                    g.pid = pid;
                    g.alive = pid.is_some();
                }
            }
            Event::SpawnFailed { generation, error } => {
                if let Phase::Active { g, .. } = &mut self.phase
                    && g.generation == generation
                {
                    g.alive = false;
                    g.pid = None;
                    self.fail(error, false, now, &mut fx);
                }
            }
            Event::Established {
                generation,
                tools,
                instructions,
                probe,
            } => {
                if let Phase::Active {
                    g,
                    stable_at,
                    live,
                    used,
                    ..
                } = &mut self.phase
                    && g.generation == generation
                    && !g.established
                {
                    g.established = true;
                    *used = now;
                    *live = Some(Liveness {
                        method: probe,
                        heard: now,
                        probe: None,
                        missed: 0,
                    });
                    self.last_ping = None;
                    self.instructions = instructions;
                    if self.outage.is_some() {
                        *stable_at = Some(now + self.timing.policy.max_delay());
                    }
                    self.publish(generation, tools);
                    self.set_state(State::Running, String::new(), now);
                }
            }
            Event::ConnectFailed { generation, error } => {
                if self.is_active(generation) {
                    self.fail(error, false, now, &mut fx);
                }
            }
            Event::Closed { generation, error } => {
                if self.is_active(generation) {
                    self.fail(error, true, now, &mut fx);
                }
            }
            Event::NeedsLogin { generation, scopes } => {
                if self.is_active(generation) {
                    let reason = needs_login_with(&self.name, &scopes);
                    self.last_error = Some(reason.clone());
                    self.set_state(State::NeedsLogin, reason, now);
                    self.end(Then::Login, false, None, now, &mut fx);
                }
            }
            Event::LoggedIn => {
                if self.state == State::NeedsLogin && self.phase == Phase::Idle {
                    self.last_error = None;
                    self.begin_fresh(now, &mut fx);
                }
            }
            Event::Exited { generation, status } => self.exited(generation, status, now, &mut fx),
            Event::ToolsSynced { generation, tools } => {
                if self.established() == Some(generation) {
                    self.publish(generation, tools);
                }
            }
            Event::ListFailed { generation, error } => {
                if self.established() == Some(generation) {
                    self.last_error = Some(error);
                }
            }
            Event::Heard { generation, at } => {
                if let Some(live) = self.live(generation)
                    && at > live.heard
                {
                    live.heard = at;
                    if live.probe.is_some_and(|(_, sent)| at >= sent) {
                        // It spoke while probed: alive, whatever the ping.
                        live.probe = None;
                        live.missed = 0;
                    }
                }
            }
            Event::ProbeAnswered {
                generation,
                probe,
                rtt,
            } => {
                if let Some(live) = self.live(generation)
                    && live.probe.is_some_and(|(n, _)| n == probe)
                {
                    live.probe = None;
                    live.missed = 0;
                    live.heard = live.heard.max(now);
                    self.last_ping = Some((rtt, now));
                }
                // Otherwise it came after its timeout: a miss already.
            }
            Event::Deadline(timer) => self.deadline_passed(timer, now, &mut fx),
        }
        fx
    }

    /// The liveness of `generation`, if it is established.
    fn live(&mut self, generation: Gen) -> Option<&mut Liveness> {
        match &mut self.phase {
            Phase::Active {
                g, live: Some(l), ..
            } if g.generation == generation => Some(l),
            _ => None,
        }
    }

    /// Sends the next probe of the established generation.
    fn probe(&mut self, now: Instant, fx: &mut Vec<Effect>) {
        let probe = self.probes + 1;
        if let Phase::Active {
            g, live: Some(l), ..
        } = &mut self.phase
        {
            self.probes = probe;
            l.probe = Some((probe, now));
            fx.push(Effect::Probe {
                generation: g.generation,
                probe,
            });
        }
    }

    fn is_active(&self, generation: Gen) -> bool {
        matches!(&self.phase, Phase::Active { g, .. } if g.generation == generation)
    }

    fn set_state(&mut self, state: State, reason: String, now: Instant) {
        if state != self.state {
            self.since = now;
        }
        self.state = state;
        self.reason = reason;
    }

    fn publish(&mut self, generation: Gen, tools: ToolList) {
        self.tools_generation = generation;
        self.show(tools);
    }

    /// Publishes the server's `tools` through the filter; an equal list
    /// changes nothing.
    fn show(&mut self, tools: ToolList) {
        let shown = tools.filtered(|name| self.filter.allows(name));
        self.server_tools = tools;
        if shown != self.tools {
            self.tools = shown;
            self.tools_serial += 1;
        }
    }

    fn withdraw_tools(&mut self) {
        self.server_tools = ToolList::default();
        if !self.tools.is_empty() {
            self.tools = ToolList::default();
            self.tools_serial += 1;
        }
    }

    /// Starts a new generation: `retry` 0 for a first start.
    fn begin(&mut self, retry: u32, now: Instant, fx: &mut Vec<Effect>) {
        self.last_gen += 1;
        let generation = self.last_gen;
        self.phase = Phase::Active {
            g: Generation {
                generation,
                pid: None,
                alive: self.timing.uses_process,
                established: false,
                retry,
            },
            started: now,
            stable_at: None,
            live: None,
            settling: None,
            used: now,
        };
        if retry == 0 {
            self.set_state(State::Starting, String::new(), now);
        }
        fx.push(Effect::Spawn { generation });
    }

    /// A fresh start: new budget, new generation.
    fn begin_fresh(&mut self, now: Instant, fx: &mut Vec<Effect>) {
        self.outage = None;
        self.begin(0, now, fx);
    }

    /// Takes the current generation down (because of `lost`, if it failed);
    /// `then` follows once it is gone.
    fn end(
        &mut self,
        then: Then,
        closed: bool,
        lost: Option<String>,
        now: Instant,
        fx: &mut Vec<Effect>,
    ) {
        let g = match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Active { g, .. } => g,
            other => {
                self.phase = other;
                return;
            }
        };
        fx.push(Effect::Disconnect {
            generation: g.generation,
            lost,
        });
        if !g.alive {
            self.phase = Phase::Ending {
                g,
                then,
                kill: Sent::Nothing,
                deadline: None,
                closed,
            };
            self.finish(now, fx);
        } else if closed {
            // The server hung up: it is most likely exiting on its own. Give
            // it stop-timeout before SIGTERM, so its exit status is its own.
            self.phase = Phase::Ending {
                g,
                then,
                kill: Sent::Nothing,
                deadline: Some(now + self.timing.stop_timeout),
                closed,
            };
        } else {
            fx.push(Effect::Signal {
                generation: g.generation,
                signal: Signal::Term,
            });
            self.phase = Phase::Ending {
                g,
                then,
                kill: Sent::Term,
                deadline: Some(now + self.timing.stop_timeout),
                closed,
            };
        }
    }

    /// The first failure signal of the active generation decides what comes next.
    fn fail(&mut self, error: String, closed: bool, now: Instant, fx: &mut Vec<Effect>) {
        let established = match &self.phase {
            Phase::Active { g, .. } => g.established,
            _ => return,
        };
        let verdict = self.verdict();
        let state = match verdict {
            Verdict::GiveUp => State::Failed,
            Verdict::Retry(_) if established => State::Reconnecting,
            Verdict::Retry(_) => State::Retrying,
        };
        let reason = self.describe(established, &error, verdict);
        self.last_error = Some(error.clone());
        self.set_state(state, reason, now);
        self.end(Then::Recover(verdict), closed, Some(error), now, fx);
    }

    /// Retry (counting it against the outage's budget) or give up.
    fn verdict(&mut self) -> Verdict {
        if !self.timing.policy.enabled() {
            return Verdict::GiveUp;
        }
        let used = self.outage.unwrap_or(0);
        if used >= self.timing.policy.max_attempts() {
            self.outage = Some(used);
            return Verdict::GiveUp;
        }
        self.outage = Some(used + 1);
        Verdict::Retry(used + 1)
    }

    /// The reason text of DESIGN §3's vocabulary.
    fn describe(&self, established: bool, error: &str, verdict: Verdict) -> String {
        let prefix = if established {
            "connection lost"
        } else {
            "connection failed"
        };
        let name = &self.name;
        match verdict {
            Verdict::Retry(_) => format!("{prefix}: {error}"),
            Verdict::GiveUp if !self.timing.policy.enabled() => format!(
                "{prefix}: {error}; reconnect is disabled, run `mcpctl restart {name}` to start it again"
            ),
            Verdict::GiveUp => {
                let retries = match self.timing.policy.max_attempts() {
                    1 => "1 retry".to_owned(),
                    n => format!("{n} retries"),
                };
                format!(
                    "{prefix}: {error}; gave up after {retries}, run `mcpctl restart {name}` to try again"
                )
            }
        }
    }

    /// The ending generation's process is gone: do what was decided.
    fn finish(&mut self, now: Instant, fx: &mut Vec<Effect>) {
        let Phase::Ending { then, .. } = self.phase else {
            return;
        };
        match then {
            Then::Recover(Verdict::Retry(retry)) => {
                let delay = self.timing.policy.delay(retry);
                self.phase = Phase::Backoff {
                    retry,
                    at: now + delay,
                    delay,
                };
            }
            Then::Recover(Verdict::GiveUp) => {
                self.phase = Phase::Idle;
                self.withdraw_tools();
            }
            Then::Stop => {
                self.phase = Phase::Idle;
                self.withdraw_tools();
                self.set_state(State::Stopped, String::new(), now);
            }
            Then::Idle => {
                // Its lists stay published: they are answered from here
                // (and the cache) until the next use starts it.
                self.phase = Phase::Idle;
                self.outage = None;
                let after = self.timing.idle_stop.unwrap_or_default();
                self.set_state(
                    State::Idle,
                    format!("stopped after {} idle", humantime::format_duration(after)),
                    now,
                );
            }
            Then::Fresh => self.begin_fresh(now, fx),
            Then::Login => {
                self.phase = Phase::Idle;
                self.outage = None;
            }
        }
    }

    fn exited(&mut self, generation: Gen, status: ExitStatus, now: Instant, fx: &mut Vec<Effect>) {
        match &mut self.phase {
            Phase::Active { g, .. } if g.generation == generation => {
                self.last_exit = Some(status);
                g.alive = false;
                self.fail(format!("process {status}"), false, now, fx);
            }
            Phase::Ending {
                g,
                closed,
                then,
                kill,
                ..
            } if g.generation == generation => {
                self.last_exit = Some(status);
                g.alive = false;
                if let (true, Sent::Nothing, Then::Recover(verdict)) = (*closed, *kill, *then) {
                    // It hung up and exited on its own: the exit status says
                    // more than "the server closed the connection".
                    *closed = false;
                    let established = g.established;
                    let error = format!("process {status}");
                    self.reason = self.describe(established, &error, verdict);
                    self.last_error = Some(error);
                }
                self.finish(now, fx);
            }
            Phase::Stuck { g } if g.generation == generation => {
                // Finally reaped: still failed, but free to start again.
                self.last_exit = Some(status);
                self.phase = Phase::Idle;
            }
            _ => {}
        }
    }

    fn deadline_passed(&mut self, timer: Timer, now: Instant, fx: &mut Vec<Effect>) {
        if self.due(timer).is_none_or(|at| now < at) {
            return;
        }
        let stop_timeout = self.timing.stop_timeout;
        match (timer, &mut self.phase) {
            (Timer::Stable, Phase::Active { stable_at, .. }) => {
                // Stayed up for the stability window: the outage is over.
                *stable_at = None;
                self.outage = None;
            }
            (Timer::Probe, Phase::Active { .. }) => self.probe(now, fx),
            (Timer::IdleStop, Phase::Active { g, settling, .. }) => {
                // Idle only if the sessions saw no use since either: they
                // tell (Event::Used), and let go of the upstream at once
                // if it is, by the same rule (`idle`).
                let after = self.timing.idle_stop.unwrap_or_default();
                let cutoff = now.checked_sub(after).unwrap_or(now);
                *settling = Some(cutoff);
                fx.push(Effect::Settle {
                    generation: g.generation,
                    cutoff,
                });
            }
            (
                Timer::ProbeTimeout,
                Phase::Active {
                    live: Some(live), ..
                },
            ) => {
                live.probe = None;
                live.missed += 1;
                let health = self.timing.health;
                if live.missed >= health.failures() {
                    let probes = match health.failures() {
                        1 => "1 probe".to_owned(),
                        n => format!("{n} probes"),
                    };
                    let error = format!(
                        "no answer to {} ({probes}, {} each)",
                        live.method,
                        humantime::format_duration(health.timeout())
                    );
                    self.fail(error, false, now, fx);
                } else {
                    // Missed: the next probe goes at once.
                    self.probe(now, fx);
                }
            }
            (Timer::Startup, Phase::Active { .. }) => {
                let error = format!(
                    "startup-timeout ({}) expired before initialize and tools/list completed",
                    humantime::format_duration(self.timing.startup_timeout)
                );
                self.fail(error, false, now, fx);
            }
            (
                Timer::KillGrace,
                Phase::Ending {
                    g, kill, deadline, ..
                },
            ) => match kill {
                Sent::Nothing => {
                    *kill = Sent::Term;
                    *deadline = Some(now + stop_timeout);
                    fx.push(Effect::Signal {
                        generation: g.generation,
                        signal: Signal::Term,
                    });
                }
                Sent::Term => {
                    *kill = Sent::Kill;
                    *deadline = Some(now + stop_timeout);
                    fx.push(Effect::Signal {
                        generation: g.generation,
                        signal: Signal::Kill,
                    });
                }
                Sent::Kill => {
                    let g = g.clone();
                    let pid = g.pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
                    let reason = format!(
                        "stop failed: process {pid} did not exit after SIGKILL; not starting another until it does"
                    );
                    self.last_error = Some(reason.clone());
                    self.phase = Phase::Stuck { g };
                    self.withdraw_tools();
                    self.set_state(State::Failed, reason, now);
                }
            },
            (Timer::Retry, Phase::Backoff { retry, .. }) => {
                let retry = *retry;
                self.restarts = self.restarts.saturating_add(1);
                self.begin(retry, now, fx);
            }
            // `due` found the timer armed, so the phase matches it.
            _ => {}
        }
    }

    fn arm(&mut self, cached: Option<Cached>, now: Instant, fx: &mut Vec<Effect>) {
        if !(self.phase == Phase::Idle && self.state == State::Stopped) {
            return;
        }
        match (self.timing.idle_stop, cached) {
            (Some(_), Some(cached)) => {
                self.instructions = cached.instructions;
                self.publish(0, cached.tools);
                self.set_state(State::Idle, "waiting for first use".into(), now);
            }
            // Always, or on demand with nothing known yet: start (and
            // learn the lists, then idle).
            _ => self.begin_fresh(now, fx),
        }
    }

    fn demand(&mut self, now: Instant, fx: &mut Vec<Effect>) {
        match &mut self.phase {
            Phase::Idle if self.state == State::Idle => self.begin_fresh(now, fx),
            Phase::Ending { then, .. } if *then == Then::Idle => *then = Then::Fresh,
            _ => {}
        }
    }

    /// Whether a request made now will reach the server once its start
    /// (on demand, or already under way) is done: it may wait for it
    /// instead of failing (DESIGN §9).
    pub fn will_serve(&self) -> bool {
        self.timing.idle_stop.is_some()
            && match &self.phase {
                // Not a retry: an outage's requests fail at once (§3).
                Phase::Active { .. } => matches!(self.state, State::Starting | State::Running),
                Phase::Ending { then, .. } => *then == Then::Fresh,
                Phase::Idle => self.state == State::Idle,
                Phase::Backoff { .. } | Phase::Stuck { .. } => false,
            }
    }

    fn start(&mut self, now: Instant, fx: &mut Vec<Effect>) {
        match &mut self.phase {
            Phase::Idle => self.begin_fresh(now, fx),
            Phase::Ending { then, .. } if matches!(*then, Then::Stop | Then::Idle) => {
                *then = Then::Fresh
            }
            Phase::Stuck { .. } => self.insist(Then::Fresh, now, fx),
            _ => {}
        }
    }

    fn stop(&mut self, now: Instant, fx: &mut Vec<Effect>) {
        match &mut self.phase {
            Phase::Active { .. } => {
                self.set_state(State::Stopping, String::new(), now);
                self.end(Then::Stop, false, None, now, fx);
            }
            Phase::Ending { then, .. } => {
                *then = Then::Stop;
                self.set_state(State::Stopping, String::new(), now);
            }
            Phase::Backoff { .. } | Phase::Idle => {
                self.phase = Phase::Idle;
                self.outage = None;
                self.withdraw_tools();
                self.set_state(State::Stopped, String::new(), now);
            }
            // Nothing can be done about an unkillable process; stay failed.
            Phase::Stuck { .. } => {}
        }
    }

    fn restart(&mut self, now: Instant, fx: &mut Vec<Effect>) {
        match &mut self.phase {
            Phase::Active { .. } => {
                self.set_state(State::Stopping, String::new(), now);
                self.end(Then::Fresh, false, None, now, fx);
            }
            Phase::Ending { then, .. } => {
                *then = Then::Fresh;
                self.set_state(State::Stopping, String::new(), now);
            }
            Phase::Backoff { .. } | Phase::Idle => self.begin_fresh(now, fx),
            Phase::Stuck { .. } => self.insist(Then::Fresh, now, fx),
        }
    }

    /// The operator wants a stuck process gone: SIGKILL again and wait.
    fn insist(&mut self, then: Then, now: Instant, fx: &mut Vec<Effect>) {
        let Phase::Stuck { g } = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        fx.push(Effect::Signal {
            generation: g.generation,
            signal: Signal::Kill,
        });
        self.phase = Phase::Ending {
            g,
            then,
            kill: Sent::Kill,
            deadline: Some(now + self.timing.stop_timeout),
            closed: false,
        };
        self.set_state(State::Stopping, String::new(), now);
    }
}
