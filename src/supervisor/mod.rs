//! The supervisor: one actor per unit keeping one MCP server alive.
//!
//! [`Supervisor::spawn`] starts the actor (stopped; call [`Supervisor::start`])
//! and returns a cloneable handle. The handle sends commands and reads the
//! published [`Status`]; only the actor changes a server's state.
//!
//! Reading order: [`machine`] (the pure state machine: every rule of DESIGN
//! §3), `status` (what the handle reads: [`Status`], [`CallError`]),
//! `actor` (the task that runs it), [`launch`] (children and HTTP
//! sessions, as raw JSON-RPC wires; [`http`], rmcp's Streamable HTTP
//! transport adapted to a wire), [`upstream`] (mcpd's handshake on a
//! wire), `sessions` (the host sessions multiplexed onto the established
//! wire), [`process`] (environment, credentials, process groups),
//! [`cgroup`] (containment), [`sandbox`] (confinement),
//! [`envfile`], [`logs`].

pub mod accounting;
mod actor;
pub mod cache;
pub mod cgroup;
mod clock;
pub mod credentials;
pub mod envfile;
mod events;
pub mod http;
mod instances;
mod lanes;
pub mod launch;
pub mod logs;
pub mod machine;
pub mod oauth;
pub mod process;
pub mod sandbox;
mod sessions;
mod status;
pub mod tools;
pub mod upstream;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolResult, JsonObject};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::mux::era::Era;
use crate::mux::session::lanes as era_lanes;
use crate::unit::{InstanceOf, UnitSpec};

pub use crate::mux::host::{HostInput, HostLink, HostOutput};
pub use crate::mux::lists::List as ListKind;
pub use accounting::{Caller, Counters};
pub use instances::InstanceView;
pub use launch::{Launcher, SharedLauncher, SystemLauncher};
pub use logs::LogRing;
pub use machine::{ExitStatus, Gen, State, Timer, Timing, ToolList};
pub use sessions::{
    INITIALIZE_TIMEOUT, MAX_IN_FLIGHT, MAX_SESSIONS, MAX_UNIT_IN_FLIGHT, set_initialize_timeout,
};
pub use status::{CallError, Status};

use actor::{Actor, Command};

/// How long a finished call waits for its caller's identity (for the log)
/// before it answers anyway.
pub const CALLER_GRACE: Duration = Duration::from_millis(100);

/// A per-host unit's instances for D-Bus callers: uid → the instance and
/// its actor.
type CallerInstances = std::collections::BTreeMap<u32, (Supervisor, JoinHandle<()>)>;

/// A handle to one server's supervisor. Cheap to clone.
#[derive(Clone)]
pub struct Supervisor {
    name: Arc<str>,
    sessions: sessions::Sessions,
    commands: mpsc::UnboundedSender<Command>,
    status: watch::Receiver<Status>,
    logs: LogRing,
    counters: Arc<Counters>,
    launcher: SharedLauncher,
    /// `start` and `idle-stop`, as last applied.
    activation: Arc<std::sync::Mutex<crate::unit::Activation>>,
    /// The spec as last applied: a per-host unit's instances are made of
    /// it (DESIGN §13).
    spec: Arc<std::sync::Mutex<UnitSpec>>,
    /// A per-host unit's instances (none for a shared unit).
    instances: Arc<instances::Instances>,
    /// A per-host unit's instances for D-Bus callers, by uid (DESIGN §13).
    callers: Arc<std::sync::Mutex<CallerInstances>>,
    /// A shared unit's 2025 lane, while it has one (DESIGN §12).
    lanes: Arc<lanes::Lanes>,
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("name", &self.name)
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

impl Supervisor {
    /// Starts the actor for unit `name` (stopped until [`arm`](Self::arm)
    /// or [`start`](Self::start)). An on-demand unit keeps its cache in
    /// `cache_dir` (none: it learns its lists at every daemon start). The
    /// task ends after [`shutdown`](Self::shutdown) or once every handle
    /// is dropped, in both cases after stopping the server.
    pub fn spawn(
        name: &str,
        spec: UnitSpec,
        launcher: SharedLauncher,
        logs: LogRing,
        cache_dir: Option<std::path::PathBuf>,
    ) -> (Self, JoinHandle<()>) {
        Self::spawn_reporting(name, spec, launcher, logs, cache_dir, None)
    }

    /// [`spawn`](Self::spawn), for instance `n` of the per-host unit
    /// `unit` when `instance_of` says so: what it learns is told to the
    /// unit, whose lists are its newest instance's (DESIGN §13).
    fn spawn_reporting(
        name: &str,
        spec: UnitSpec,
        launcher: SharedLauncher,
        logs: LogRing,
        cache_dir: Option<std::path::PathBuf>,
        instance_of: Option<(u32, &Supervisor)>,
    ) -> (Self, JoinHandle<()>) {
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let initial = actor::status_of(
            &machine::Machine::new(name, &spec, std::time::Instant::now()).view(),
            &clock::Clock::new(),
        );
        let (status_tx, status_rx) = watch::channel(initial);
        let counters = Arc::<Counters>::default();
        launcher.configure(&spec);
        let activation = Arc::new(std::sync::Mutex::new(spec.activation()));
        let kept = Arc::new(std::sync::Mutex::new(spec.clone()));
        let actor = Actor::new(
            name,
            spec,
            Arc::clone(&launcher),
            commands_rx,
            status_tx,
            Arc::clone(&counters),
            cache_dir,
        );
        let actor = match instance_of {
            Some((n, unit)) => actor.reporting(n, &unit.commands),
            None => actor,
        };
        let sessions = actor.sessions();
        let task = tokio::spawn(actor.run());
        (
            Self {
                name: Arc::from(name),
                sessions,
                commands: commands_tx,
                status: status_rx,
                logs,
                counters,
                launcher,
                activation,
                spec: kept,
                instances: Arc::default(),
                callers: Arc::default(),
                lanes: Arc::default(),
            },
            task,
        )
    }

    /// How the server's processes are contained ("cgroup DIR", "process
    /// group"; empty for HTTP).
    pub fn containment(&self) -> String {
        self.launcher.containment()
    }

    /// How the last generation was sandboxed ("landlock v7, network
    /// none"); empty when it was not.
    pub fn sandbox(&self) -> String {
        self.launcher.sandbox()
    }

    /// What the last generation was given: credential names and sizes
    /// ("gh (40 B), db (1 file)"), never a value; empty when nothing.
    pub fn credentials(&self) -> String {
        self.launcher.credentials()
    }

    /// What its processes use now, where the containment tells.
    pub fn usage(&self) -> Option<cgroup::Usage> {
        self.launcher.usage()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The daemon loaded the unit: an always unit starts; an on-demand one
    /// becomes `idle` with its cached lists, or starts once to learn them
    /// (DESIGN §9).
    pub fn arm(&self) {
        let _ = self.commands.send(Command::Arm);
    }

    /// Starts the server with a fresh retry budget if it is stopped or
    /// failed (an idle on-demand server too: now).
    pub fn start(&self) {
        let _ = self.commands.send(Command::Start);
        if let Some(lane) = self.lanes.get() {
            lane.start();
        }
    }

    /// The unit's login (DESIGN §17): an HTTP unit with `oauth`.
    pub fn login(&self) -> Option<Arc<oauth::Login>> {
        self.launcher.login()
    }

    /// The client secret the unit's `oauth.client-secret` names, read
    /// from its credentials now (DESIGN §16).
    pub fn client_secret(&self) -> Result<Option<String>, String> {
        let spec = self
            .spec
            .lock()
            .map(|s| s.clone())
            .map_err(|e| e.to_string())?;
        self.launcher.oauth_secret(&spec)
    }

    /// A login completed: a unit in `needs-login` starts.
    pub fn logged_in(&self) {
        let _ = self.commands.send(Command::LoggedIn);
    }

    /// Stops the server; its tools are withdrawn once its process is gone.
    /// A per-host unit's instances stop too, detaching their hosts.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
        let why = format!("server {} was stopped", self.name);
        drop(self.instances.stop_all(Some(&why)));
        for instance in self.callers_all() {
            instance.stop();
        }
        if let Some(lane) = self.lanes.get() {
            lane.stop();
        }
    }

    /// Stops the server if it runs, then starts it with a fresh budget;
    /// every instance of a per-host unit restarts the same way, under the
    /// unit's spec as last applied (a reload changes the instances that
    /// come next; a restart, those that run too: DESIGN §13).
    pub fn restart(&self) {
        let _ = self.commands.send(Command::Restart);
        let spec = self.spec.lock().ok().map(|s| s.clone());
        let spec = spec.filter(|s| s.sessions().is_per_host());
        for instance in self.instances.all() {
            if let Some(spec) = &spec {
                instance.apply(spec.for_instance(), false);
            }
            instance.restart();
        }
        for instance in self.callers_all() {
            if let Some(spec) = &spec {
                instance.apply(spec.for_caller(), false);
            }
            instance.restart();
        }
        if let Some(lane) = self.lanes.get() {
            if let Ok(spec) = self.spec.lock() {
                lane.apply(spec.for_lane(), false);
            }
            lane.restart();
        }
    }

    /// Applies a changed unit. With `restart`, a running (or failed) server
    /// starts a new generation under the new spec; without, only the
    /// policy and metadata change.
    pub fn apply(&self, spec: UnitSpec, restart: bool) {
        if let Ok(mut activation) = self.activation.lock() {
            *activation = spec.activation();
        }
        // Instances attached from now on are of the new spec; those
        // running keep theirs (DESIGN §13).
        if let Ok(mut kept) = self.spec.lock() {
            *kept = spec.clone();
        }
        if let Some(lane) = self.lanes.get() {
            lane.apply(spec.for_lane(), restart);
        }
        let _ = self.commands.send(Command::Apply {
            spec: Box::new(spec),
            restart,
        });
    }

    /// Calls a tool on the current generation for `caller` (resolved while
    /// the call runs: finding a bus client's credentials is a round trip of
    /// its own; a call that ends first waits for it at most
    /// [`CALLER_GRACE`]). Fails at once, naming the state, retry and next retry
    /// time, when the server is not running. Every call is counted and
    /// logged ([`accounting`]).
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        timeout: Duration,
        caller: impl Future<Output = Caller>,
    ) -> Result<CallToolResult, CallError> {
        // Counted and logged however the call ends, even when the caller's
        // future is dropped mid-call (a D-Bus client that disconnects). Who
        // called is learnt while the call runs; the answer never waits for
        // it.
        let mut record = accounting::Record::new(&self.name, name, &self.counters);
        let call = self.send_call(name, arguments, timeout);
        tokio::pin!(call, caller);
        let mut known = false;
        let result = loop {
            tokio::select! {
                biased;
                who = &mut caller, if !known => {
                    record.caller = who;
                    known = true;
                }
                result = &mut call => break result,
            }
        };
        if !known {
            // The lookup is local (SO_PEERCRED) or cached for a bus client
            // after its first call: it is done within moments, and a call
            // that ended first (a server that is not running) waits for
            // it that long at most.
            if let Ok(who) = tokio::time::timeout(CALLER_GRACE, &mut caller).await {
                record.caller = who;
            }
        }
        record.finish(match &result {
            Ok(r) if r.is_error == Some(true) => accounting::Outcome::ErrorResult,
            Ok(_) => accounting::Outcome::Ok,
            Err(e) => accounting::Outcome::Failed(e.to_string()),
        });
        result
    }

    async fn send_call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
        timeout: Duration,
    ) -> Result<CallToolResult, CallError> {
        let (reply, answer) = oneshot::channel();
        let sent = self.commands.send(Command::Call {
            name: name.to_owned(),
            arguments,
            timeout,
            reply,
        });
        let gone = || CallError::Failed(format!("the supervisor of {} has ended", self.name));
        if sent.is_err() {
            return Err(gone());
        }
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    /// A new host session (DESIGN §8) on `link` (a connected stream
    /// socket, or a host's own stdio), speaking newline-delimited
    /// JSON-RPC, made by `caller`.
    /// A host session of a per-host unit gets an instance of its own
    /// (DESIGN §13), or, with `max-instances` running, an error to its
    /// `initialize`. Where the era a host opens with decides which
    /// upstream serves it (a stdio server of `protocol "auto"`: a lane
    /// per era, DESIGN §12; an instance in its host's era), its first
    /// line is read ahead first (within [`INITIALIZE_TIMEOUT`]).
    pub fn attach(&self, link: HostLink, caller: Caller) {
        let spec = self.spec.lock().ok().map(|s| s.clone());
        let Some(spec) = spec else {
            self.sessions.attach(link, caller);
            return;
        };
        let eras = spec.protocol() == crate::unit::Protocol::Auto
            && matches!(spec.transport(), crate::unit::Transport::Stdio(_));
        if !eras {
            self.attach_in(link, caller, spec, None);
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let (link, first) = link.peek(sessions::initialize_timeout()).await;
            let era = era_lanes::opening(&first);
            let lane = era_lanes::lane(spec.protocol(), true, this.upstream(), era);
            if lane == era_lanes::Lane::Wait && !spec.sessions().is_per_host() {
                // Known once the unit's first generation is up (or its
                // start failed): within `startup-timeout`.
                let mut status = this.subscribe();
                let known = status.wait_for(|s| {
                    !matches!(s.state, State::Starting | State::Stopped)
                        || this.upstream() != era_lanes::Upstream::Unknown
                });
                let _ = tokio::time::timeout(spec.startup_timeout(), known).await;
            }
            this.attach_in(link, caller, spec, era);
        });
    }

    /// What the unit's own upstream speaks, as its sessions know it.
    fn upstream(&self) -> era_lanes::Upstream {
        match self.sessions.upstream() {
            era_lanes::Upstream::Both if self.lanes.failed() => era_lanes::Upstream::Modern,
            upstream => upstream,
        }
    }

    /// [`attach`](Self::attach), the host's era known (`era`; None: its
    /// first line claimed none, or it does not matter).
    fn attach_in(&self, link: HostLink, caller: Caller, spec: UnitSpec, era: Option<Era>) {
        let Some(max) = spec.sessions().max_instances() else {
            let stdio = matches!(spec.transport(), crate::unit::Transport::Stdio(_));
            match era_lanes::lane(spec.protocol(), stdio, self.upstream(), era) {
                era_lanes::Lane::Legacy => match self.lanes.take(self, &spec) {
                    Some(lane) => {
                        // The host waits for the lane's first generation
                        // (bounded by `startup-timeout`); a lane that
                        // cannot establish one says the server does not
                        // speak the handshake after all: the host is
                        // translated on the unit's own upstream instead.
                        let this = self.clone();
                        let bound = spec.startup_timeout() + Duration::from_secs(5);
                        tokio::spawn(async move {
                            if this.lanes.serves(&lane, bound).await {
                                lane.sessions.attach(link, caller);
                            } else {
                                this.sessions.attach(link, caller);
                            }
                        });
                    }
                    None => self.sessions.attach(link, caller),
                },
                era_lanes::Lane::Own | era_lanes::Lane::Wait => self.sessions.attach(link, caller),
            }
            return;
        };
        if self.instances.len() >= max as usize {
            let why = format!(
                "server {} runs an instance per host and all {max} are in use (max-instances {max})",
                self.name
            );
            tracing::warn!(target: "mcpd::supervisor", mcpd_server = %self.name, "refusing a host ({caller}): {why}");
            self.sessions.attach_refused(link, caller, Arc::from(why));
            return;
        }
        let n = self.instances.next();
        let of = InstanceOf::Host(n);
        let Some(launcher) = self.launcher.instance(of) else {
            self.sessions.attach(link, caller);
            return;
        };
        let name = of.name_in(&self.name);
        let protocol = era_lanes::instance_protocol(spec.protocol(), self.upstream(), era);
        let (instance, task) = Supervisor::spawn_reporting(
            &name,
            spec.for_instance().with_protocol(protocol),
            launcher,
            self.logs.clone(),
            None,
            Some((n, self)),
        );
        tracing::info!(target: "mcpd::supervisor", mcpd_server = %self.name, "instance {name} for a host ({caller})");
        instance.sessions.attach(link, caller.clone());
        self.instances
            .run(n, instance, task, caller, Arc::clone(&self.counters));
    }

    /// Who serves a D-Bus call (`CallTool`, `ReadResource`, `GetPrompt`)
    /// of user `uid`: for a per-host unit, an instance of that uid's own
    /// (`NAME@uid-UID`, on demand, stopped after `idle-stop`; never a
    /// host's, DESIGN §13), made at its first call; else the unit itself.
    /// One made now, or started again after an operator stopped it, is
    /// returned once its actor took that (bounded): a request that looks
    /// at its state first (`ReadResource`, `GetPrompt`) finds it starting,
    /// not stopped.
    pub async fn for_caller(&self, uid: Option<u32>) -> Supervisor {
        let (instance, woken) = self.caller(uid);
        if woken {
            let mut status = instance.subscribe();
            let started = status.wait_for(|s| s.state != State::Stopped);
            let _ = tokio::time::timeout(Duration::from_secs(5), started).await;
        }
        instance
    }

    /// [`for_caller`](Self::for_caller)'s instance, and whether it was
    /// made or started just now.
    fn caller(&self, uid: Option<u32>) -> (Supervisor, bool) {
        let spec = self.spec.lock().ok().map(|s| s.clone());
        let Some(spec) = spec.filter(|s| s.sessions().is_per_host()) else {
            return (self.clone(), false);
        };
        let uid = uid.unwrap_or(u32::MAX);
        let Ok(mut callers) = self.callers.lock() else {
            return (self.clone(), false);
        };
        if let Some((instance, _)) = callers.get(&uid) {
            // Stopped by an operator (`mcpctl stop NAME@uid-UID`): the
            // next call is a first use again.
            let stopped = instance.state() == State::Stopped;
            if stopped {
                instance.start();
            }
            return (instance.clone(), stopped);
        }
        let of = InstanceOf::Caller(uid);
        let Some(launcher) = self.launcher.instance(of) else {
            return (self.clone(), false);
        };
        let name = of.name_in(&self.name);
        let (instance, task) =
            Supervisor::spawn(&name, spec.for_caller(), launcher, self.logs.clone(), None);
        instance.arm();
        tracing::info!(target: "mcpd::supervisor", mcpd_server = %self.name, uid, "instance {name} for D-Bus calls");
        callers.insert(uid, (instance.clone(), task));
        // Shown in `Instances` like a host's, from now on.
        drop(self.instances.follow(&instance));
        self.instances.bump();
        (instance, true)
    }

    /// A per-host unit's instances (DESIGN §13): its hosts', by number,
    /// then those of its D-Bus callers, by uid (numbered 0).
    pub fn instances(&self) -> Vec<InstanceView> {
        let mut views = self.instances.views();
        if let Ok(callers) = self.callers.lock() {
            views.extend(callers.iter().map(|(uid, (instance, _))| {
                let status = instance.status();
                InstanceView {
                    n: 0,
                    state: status.state,
                    pid: status.main_pid,
                    host: Caller {
                        uid: Some(*uid).filter(|u| *u != u32::MAX),
                        ..Caller::default()
                    },
                    since: status.since,
                    calls: instance.counters().calls(),
                    memory: instance.usage().map(|u| u.memory),
                }
            }));
        }
        views
    }

    /// Instance `n` of a per-host unit.
    pub fn instance(&self, n: u32) -> Option<Supervisor> {
        self.instances.get(n)
    }

    /// Stops instance `n`, detaching its host with an error that says
    /// so; None when there is no such instance. The instance is gone once
    /// the returned handle ends.
    pub fn stop_instance(&self, n: u32) -> Option<JoinHandle<()>> {
        let why = format!(
            "instance {} was stopped",
            InstanceOf::Host(n).name_in(&self.name)
        );
        self.instances.stop(n, why)
    }

    /// The instance of user `uid`'s D-Bus calls, if it has one.
    pub fn caller_instance(&self, uid: u32) -> Option<Supervisor> {
        let callers = self.callers.lock().ok()?;
        callers.get(&uid).map(|(instance, _)| instance.clone())
    }

    /// Stops the instance of user `uid`'s D-Bus calls (its next call
    /// starts it again); None when it has none. It has stopped once the
    /// returned handle ends.
    pub fn stop_caller(&self, uid: u32) -> Option<JoinHandle<()>> {
        let instance = self.caller_instance(uid)?;
        let mut status = instance.subscribe();
        instance.stop();
        Some(tokio::spawn(async move {
            let _ = status.wait_for(|s| s.state == State::Stopped).await;
        }))
    }

    /// `max-instances` of a per-host unit; None for a shared one.
    pub fn max_instances(&self) -> Option<u32> {
        self.spec.lock().ok()?.sessions().max_instances()
    }

    /// Whether the unit, as last applied, runs an instance per host
    /// session ([`Sessions::is_per_host`](crate::unit::Sessions::is_per_host)).
    pub fn is_per_host(&self) -> bool {
        self.spec.lock().is_ok_and(|s| s.sessions().is_per_host())
    }

    /// The instances serving D-Bus callers.
    fn callers_all(&self) -> Vec<Supervisor> {
        self.callers
            .lock()
            .map(|c| c.values().map(|(s, _)| s.clone()).collect())
            .unwrap_or_default()
    }

    /// A receiver that sees every instance come, go or change state.
    pub fn subscribe_instances(&self) -> watch::Receiver<u64> {
        self.instances.subscribe()
    }

    /// How many host sessions are attached.
    pub fn sessions(&self) -> usize {
        self.sessions.count()
            + self.instances.sessions()
            + self.lanes.get().map_or(0, |lane| lane.sessions())
    }

    /// The protocol version the server speaks (its last generation's, or
    /// the on-demand cache's); empty if not known yet.
    pub fn protocol_version(&self) -> String {
        self.sessions
            .protocol()
            .map(|p| p.to_string())
            .unwrap_or_default()
    }

    /// Host sessions attached per protocol version, newest first (its
    /// lanes' too).
    pub fn session_versions(&self) -> Vec<(&'static str, usize)> {
        let mut versions = self.sessions.versions();
        if let Some(lane) = self.lanes.get() {
            for (version, n) in lane.sessions.versions() {
                match versions.iter_mut().find(|(v, _)| *v == version) {
                    Some((_, m)) => *m += n,
                    None => versions.push((version, n)),
                }
            }
            let order = crate::mux::era::supported_versions();
            versions.sort_by_key(|(v, _)| order.iter().position(|o| o == v));
        }
        versions
    }

    /// The upstreams serving the unit's hosts (DESIGN §12): its own
    /// generation's, then its 2025 lane while it has one; each as the
    /// protocol version spoken, the main PID (none while not running),
    /// and the host sessions attached to it. Empty before the version is
    /// known.
    pub fn lanes(&self) -> Vec<LaneView> {
        let own = LaneView {
            version: self.protocol_version(),
            pid: self.status.borrow().main_pid,
            hosts: self.sessions.count(),
        };
        let mut lanes = Vec::new();
        if !own.version.is_empty() {
            lanes.push(own);
        }
        if let Some(lane) = self.lanes.get() {
            lanes.push(LaneView {
                version: lanes::LANE_VERSION.to_owned(),
                pid: lane.status.borrow().main_pid,
                hosts: lane.sessions.count(),
            });
        }
        lanes
    }

    /// The server's resources, resource templates or prompts as a JSON
    /// array, kept like the tools (through outages, withdrawn when it fails
    /// or stops); None when it does not offer them or they were not read.
    pub fn list(&self, kind: ListKind) -> Option<Arc<str>> {
        self.sessions.list(kind)
    }

    /// Whether a request made now is answered by the server: it runs, or
    /// it is on demand and starts for it (or is starting already).
    pub fn serves(&self) -> bool {
        let state = self.status.borrow().state;
        state == State::Running
            || (self.activation().idle_stop().is_some()
                && matches!(state, State::Idle | State::Starting | State::Stopping))
    }

    /// When the server runs: always, or on demand with its `idle-stop`.
    pub fn activation(&self) -> crate::unit::Activation {
        self.activation.lock().map(|a| *a).unwrap_or_default()
    }

    /// The error a request gets now that the server is not running.
    pub fn not_running(&self) -> CallError {
        CallError::not_running(&self.name, &self.status())
    }

    /// The serials of the resource, template and prompt lists (indexed as
    /// [`ListKind::KEPT`]): each rises when its list changes.
    pub fn subscribe_lists(&self) -> watch::Receiver<[u64; 3]> {
        self.sessions.changes()
    }

    /// A request of mcpd's own to the running server (`resources/read`,
    /// `prompts/get`): its `result`, or why there is none.
    pub async fn request(
        &self,
        method: &str,
        params: serde_json::Value,
        timeout: Duration,
    ) -> Result<serde_json::Value, CallError> {
        let answer = tokio::time::timeout(timeout, self.sessions.request(method, params))
            .await
            .map_err(|_| CallError::Timeout(timeout))?
            .map_err(CallError::Failed)?;
        CallError::result_of(answer)
    }

    /// The server's call counters (a per-host unit's own server's alone:
    /// see [`totals`](Self::totals)).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The unit's call counters: a per-host unit's include those of its
    /// instances, gone and running (DESIGN §13).
    pub fn totals(&self) -> Counters {
        let totals = Counters::default();
        totals.add(&self.counters);
        for instance in self.instances.all().into_iter().chain(self.callers_all()) {
            totals.add(instance.counters());
        }
        totals
    }

    /// The current read model.
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// The state of the read model, without copying the rest of it.
    pub fn state(&self) -> State {
        self.status.borrow().state
    }

    /// A receiver that sees every change of the read model.
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// The server's recent stderr lines.
    pub fn logs(&self) -> &LogRing {
        &self.logs
    }

    /// Stops the server and waits until it is quiescent, then ends the actor.
    pub async fn shutdown(self, task: JoinHandle<()>) {
        let instances = self.instances.stop_all(None);
        let callers: Vec<_> = self
            .callers
            .lock()
            .map(|mut c| std::mem::take(&mut *c).into_values().collect())
            .unwrap_or_default();
        let callers = futures_util::future::join_all(
            callers
                .into_iter()
                .map(|(instance, task)| Box::pin(instance.shutdown(task))),
        );
        let unit = async {
            let _ = self.commands.send(Command::Shutdown);
            let _ = task.await;
        };
        let lanes = self.lanes.stop();
        tokio::join!(unit, instances, callers, lanes);
    }
}

/// One upstream of a unit as status and D-Bus `Lanes` show it (DESIGN
/// §12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneView {
    /// The protocol version spoken on it.
    pub version: String,
    /// Its process, while one runs.
    pub pid: Option<u32>,
    /// Host sessions attached to it.
    pub hosts: usize,
}

/// A shared, ready-to-use system launcher for unit `name`.
pub fn system_launcher(name: &str, host: process::Host, logs: LogRing) -> SharedLauncher {
    Arc::new(SystemLauncher::new(name, host, logs))
}
