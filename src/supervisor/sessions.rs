//! The driver of a unit's host sessions (DESIGN §8): one task per unit
//! that reads every attached host and the upstream of the unit's current
//! generation, feeds what they send to the pure [`Core`]
//! (`mux::session`), and carries out what the core says: writes to the
//! hosts and the server, the actor's notices, the call log, a bridge's
//! ledger and control lines, the journal, and what the unit's handle
//! publishes (lists, versions, presence).
//!
//! Each host is a stream socket (from `Attach`) speaking newline-delimited
//! JSON-RPC, read by this task itself (a [`HostReader`] among all hosts'
//! readers, polled only when its host sent something: a message costs no
//! task switch and no channel on its way) and written through an
//! [`Outbox`]: what the socket takes is written at once, the rest queued
//! (at most [`QUEUE`] messages and [`QUEUE_BYTES`]: a host that stops
//! reading is detached, never waited for). A notification for a host past
//! `session::behind` is dropped and counted, and the host told how many
//! once it caught up (DESIGN §3, invariant 10). The upstream is the
//! [`Wire`] the actor hands over once a generation's handshake is done,
//! and takes back when it ends.
//!
//! [`HostReader`]: crate::mux::host::HostReader

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot, watch};

use crate::mux::attach::Control;
use crate::mux::era;
use crate::mux::host::{Event, HoldReading, HostLink, HostOut, Reader, Readers, StopReading};
use crate::mux::ledger::Ledger;
use crate::mux::lists::{List, ListError, Why};
use crate::mux::message::Message;
use crate::mux::method::Method;
use crate::mux::route::HostId;
use crate::mux::session::{
    self, Arrival, Core, Facts, Kind, Level, Notice, Out, Publish, Purpose, Tunables, UnitState,
};
use crate::mux::wire::Frame;
use crate::mux::wire::{Outbox, Refused, Wire, line};
use crate::telemetry::{self, Tracer, Transport};
use crate::unit::RateLimit;

use super::Status;
use super::accounting::{Caller, Counters, Record};
use super::clock::now;
use super::events::Internal;
use super::logs::{self, Limiter};
use super::machine::{Gen, State};
use super::upstream::{Paged, Pages};

pub use crate::mux::session::{
    INITIALIZE_TIMEOUT, MAX_IN_FLIGHT, MAX_SESSIONS, MAX_UNIT_IN_FLIGHT, QUEUE, QUEUE_BYTES,
};

/// How long what was queued for a host whose stdio was handed over may
/// take to be written once its session ended; its bridge takes the stdio
/// back only then, so their lines never interleave.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// [`INITIALIZE_TIMEOUT`], or what the daemon was told.
static INITIALIZE_TIMEOUT_MS: AtomicU64 = AtomicU64::new(INITIALIZE_TIMEOUT.as_millis() as u64);

/// Sets how long a host session may take to send `initialize`
/// (`MCPD_INITIALIZE_TIMEOUT`, read by the daemon's binary): 1 ms to 1 h.
pub fn set_initialize_timeout(timeout: Duration) -> Result<(), String> {
    if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(3600) {
        return Err("between 1ms and 1h".into());
    }
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    INITIALIZE_TIMEOUT_MS.store(ms, Ordering::Relaxed);
    Ok(())
}

/// How long a host session may take to send `initialize` (or its first
/// request): [`INITIALIZE_TIMEOUT`], or what the daemon was told.
pub(crate) fn initialize_timeout() -> Duration {
    Duration::from_millis(INITIALIZE_TIMEOUT_MS.load(Ordering::Relaxed))
}

/// The tunables the daemon was given: [`set_initialize_timeout`], and
/// `MCPD_INPUT_TIMEOUT` (seconds) for a modern host's retry of a call
/// answered `input_required`.
fn tunables() -> Tunables {
    let input_timeout = std::env::var("MCPD_INPUT_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(era::INPUT_TIMEOUT, Duration::from_secs_f64);
    Tunables {
        initialize_timeout: Duration::from_millis(INITIALIZE_TIMEOUT_MS.load(Ordering::Relaxed)),
        input_timeout,
    }
}

/// A random nonce for a modern session's `requestState`s.
fn nonce() -> u128 {
    let mut bytes = [0u8; 16];
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        // Still unique per session with the counter; only unguessability
        // across sessions is lost, and states are looked up per session.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        return seed ^ u128::from(std::process::id());
    }
    u128::from_le_bytes(bytes)
}

#[derive(Debug)]
enum Input {
    Attach {
        link: HostLink,
        caller: Caller,
        /// Its `initialize` is refused with this (a per-host unit at its
        /// `max-instances`).
        refused: Option<Arc<str>>,
    },
    Up {
        generation: Gen,
        wire: Wire,
        init: Arc<Value>,
    },
    Down {
        generation: Gen,
        lost: Option<String>,
    },
    Configure(Settings),
    Request {
        token: u64,
        method: String,
        params: Value,
        reply: oneshot::Sender<Result<Message, String>>,
        purpose: Purpose,
    },
    /// An idle on-demand unit's lists, as its last generation left them.
    Restore {
        init: Arc<Value>,
        lists: [Option<Arc<str>>; 3],
    },
    /// A per-host unit's lists, learnt from its newest instance.
    Adopt {
        init: Arc<Value>,
        lists: [Option<Arc<str>>; 3],
    },
    /// When the server was last used, and whether a request is in flight.
    Settle {
        generation: Gen,
        cutoff: Instant,
        reply: oneshot::Sender<(Instant, bool)>,
    },
    Cancel {
        token: u64,
    },
    /// The tools were read at this instant, with these caching hints.
    ToolsRead(era::CacheHint, Instant),
    /// A re-sync of the tools is published, as this tools serial.
    ToolsSynced(u64),
    /// Every host session ends, told why (an instance of a per-host unit
    /// was stopped).
    EndAll(String),
}

/// What the host sessions take from the unit's spec: the core's settings,
/// and the `log-rate-limit` the driver applies to the server's log
/// messages and garbage.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    core: session::Settings,
    log_rate_limit: Option<RateLimit>,
    /// How the server is reached, for telemetry's `network.transport`.
    upstream: Transport,
}

impl Settings {
    pub(crate) fn of(spec: &crate::unit::UnitSpec) -> Self {
        let instance = spec.sessions() == crate::unit::Sessions::Instance;
        Self {
            core: session::Settings {
                filter: spec.tool_filter().clone(),
                roots: spec.roots().to_vec(),
                // An instance starts for its host's first request, as an
                // on-demand unit does for anyone's.
                on_demand: spec.activation().idle_stop().is_some() || instance,
                list_timeout: spec.startup_timeout(),
                max_request_size: spec.max_request_size(),
                instance,
            },
            log_rate_limit: spec.log_rate_limit(),
            upstream: match spec.transport() {
                crate::unit::Transport::Stdio(_) => Transport::Pipe,
                crate::unit::Transport::Http(_) => Transport::Tcp,
            },
        }
    }
}

/// The handle to a unit's host sessions.
#[derive(Debug, Clone)]
pub(crate) struct Sessions {
    tx: mpsc::UnboundedSender<Input>,
    tokens: Arc<AtomicU64>,
    count: Arc<AtomicUsize>,
    /// (host sessions ever attached, attached now).
    presence: watch::Receiver<(u64, usize)>,
    /// The capabilities of the last host `initialize`, for an instance's
    /// upstream to declare.
    declared: Declared,
    versions: Arc<Versions>,
    protocol: Arc<std::sync::Mutex<(Option<Arc<str>>, session::lanes::Upstream)>>,
    lists: Lists,
    /// Serials of the three lists, raised when one changes.
    changes: watch::Receiver<[u64; 3]>,
    /// The newest generation whose lists have all been read.
    listed: watch::Receiver<Gen>,
    heard: Arc<Heard>,
}

/// Attached host sessions per protocol version (the modern one, then
/// those of the handshake, newest first), as the unit's handle reads them.
#[derive(Debug, Default)]
struct Versions {
    counts: [AtomicUsize; 1 + session::HOST_VERSIONS.len()],
}

impl Versions {
    fn slot(version: &str) -> Option<usize> {
        era::supported_versions().iter().position(|v| *v == version)
    }

    fn attached(&self, version: &str) {
        if let Some(at) = Self::slot(version) {
            self.counts[at].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn detached(&self, version: &str) {
        if let Some(at) = Self::slot(version) {
            let _ = self.counts[at]
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    fn counts(&self) -> Vec<(&'static str, usize)> {
        era::supported_versions()
            .into_iter()
            .zip(&self.counts)
            .map(|(v, n)| (v, n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// The capabilities a host declared in its `initialize`.
type Declared = Arc<std::sync::Mutex<Option<Value>>>;

/// When the server last sent a message (answers to probes aside): one
/// store per message, read only when a probe is due.
#[derive(Debug)]
struct Heard {
    base: Instant,
    /// Nanoseconds after `base`.
    after: AtomicU64,
}

impl Heard {
    fn new() -> Self {
        Self {
            base: now(),
            after: AtomicU64::new(0),
        }
    }

    /// The server sent a message at `at`.
    fn at(&self, at: Instant) {
        let after = at.saturating_duration_since(self.base).as_nanos();
        self.after
            .store(u64::try_from(after).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn get(&self) -> Instant {
        self.base + std::time::Duration::from_nanos(self.after.load(Ordering::Relaxed))
    }
}

/// Cancels mcpd's own request upstream when its caller stops waiting.
struct CancelOnDrop<'a> {
    sessions: &'a Sessions,
    token: u64,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.sessions.tx.send(Input::Cancel { token: self.token });
        }
    }
}

impl Sessions {
    pub(crate) fn spawn(
        name: &str,
        status: watch::Receiver<Status>,
        events: mpsc::UnboundedSender<Internal>,
        counters: Arc<Counters>,
        settings: Settings,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));
        let versions = Arc::new(Versions::default());
        let protocol = Arc::new(std::sync::Mutex::new((
            None,
            session::lanes::Upstream::Unknown,
        )));
        let lists = Lists::default();
        let (changes_tx, changes) = watch::channel([0; 3]);
        let (listed_tx, listed) = watch::channel(0);
        let heard = Arc::new(Heard::new());
        let (presence_tx, presence) = watch::channel((0, 0));
        let declared = Declared::default();
        let name: Arc<str> = Arc::from(name);
        let mut tools = (u64::MAX, Arc::from("[]"));
        let facts = facts_of(&name, &status.borrow(), &mut tools);
        let core = Core::new(
            &name,
            settings.core,
            tunables(),
            facts,
            Box::new(nonce),
            now(),
        );
        let task = Task {
            core,
            tracer: Tracer::new(Arc::clone(&name), settings.upstream),
            name,
            readers: Readers::new(),
            io: HashMap::default(),
            upstream: None,
            tools,
            fresh: status.clone(),
            status,
            events,
            counters,
            log_limit: Limiter::new(settings.log_rate_limit),
            list_changed: Arc::default(),
            replies: HashMap::default(),
            armed: None,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            doomed: Vec::new(),
            count: Arc::clone(&count),
            presence: presence_tx,
            declared: Arc::clone(&declared),
            versions: Arc::clone(&versions),
            protocol: Arc::clone(&protocol),
            lists: Arc::clone(&lists),
            changes: changes_tx,
            listed: listed_tx,
            heard: Arc::clone(&heard),
        };
        tokio::spawn(task.run(rx));
        Self {
            tx,
            tokens: Arc::new(AtomicU64::new(0)),
            count,
            presence,
            declared,
            versions,
            protocol,
            lists,
            changes,
            listed,
            heard,
        }
    }

    /// The newest generation whose resource, template and prompt lists
    /// have all been read (or failed to be) since its handshake.
    pub(crate) fn listed(&self) -> watch::Receiver<Gen> {
        self.listed.clone()
    }

    /// When the server last sent a message other than an answer to a
    /// probe (its handshake included).
    pub(crate) fn heard(&self) -> Instant {
        self.heard.get()
    }

    /// A liveness probe: MCP `ping`, its whole answer. The caller bounds
    /// the wait; dropping it cancels the ping.
    pub(crate) async fn probe(&self) -> Result<Value, String> {
        self.send_request(Method::Ping.as_str(), json!({}), Purpose::Probe)
            .await
            .map(|answer| answer.to_value())
    }

    /// When the server was last used (a request of a host or a client
    /// sent or answered), and whether one is in flight. Unused since
    /// `cutoff` (the `idle-stop` deadline passed), generation
    /// `generation`'s upstream is let go in the same step, so that nothing
    /// is sent to a server about to be stopped: what comes next waits for
    /// the next start.
    pub(crate) async fn settle(&self, generation: Gen, cutoff: Instant) -> Option<(Instant, bool)> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Input::Settle {
                generation,
                cutoff,
                reply,
            })
            .ok()?;
        answer.await.ok()
    }

    /// An idle on-demand unit's `initialize` result and lists, from its
    /// cache: answered to hosts until its server runs.
    pub(crate) fn restore(&self, init: Arc<Value>, lists: [Option<Arc<str>>; 3]) {
        let _ = self.tx.send(Input::Restore { init, lists });
    }

    /// A per-host unit's `initialize` result and lists, learnt from its
    /// newest instance (DESIGN §13): published as the unit's.
    pub(crate) fn adopt(&self, init: Arc<Value>, lists: [Option<Arc<str>>; 3]) {
        let _ = self.tx.send(Input::Adopt { init, lists });
    }

    /// The serials of the resource, template and prompt lists (indexed as
    /// [`List::KEPT`]): each rises when its list changes.
    pub(crate) fn changes(&self) -> watch::Receiver<[u64; 3]> {
        self.changes.clone()
    }

    /// A list as published (a JSON array), if the server offers it and it
    /// has been read.
    pub(crate) fn list(&self, kind: List) -> Option<Arc<str>> {
        self.lists.lock().ok()?[kind.index()].clone()
    }

    /// The kept lists as published, shared (reading them keeps no
    /// session alive).
    pub(crate) fn kept(&self) -> Lists {
        Arc::clone(&self.lists)
    }

    /// A new host session on `link`, made by `caller`.
    pub(crate) fn attach(&self, link: HostLink, caller: Caller) {
        let _ = self.tx.send(Input::Attach {
            link,
            caller,
            refused: None,
        });
    }

    /// A host session whose `initialize` is refused with `why` (a
    /// per-host unit at its `max-instances`): nothing else happens.
    pub(crate) fn attach_refused(&self, link: HostLink, caller: Caller, why: Arc<str>) {
        let _ = self.tx.send(Input::Attach {
            link,
            caller,
            refused: Some(why),
        });
    }

    /// Ends every host session, telling each (a bridge exits with it).
    pub(crate) fn end_all(&self, why: String) {
        let _ = self.tx.send(Input::EndAll(why));
    }

    /// (host sessions ever attached, attached now), as they change.
    pub(crate) fn presence(&self) -> watch::Receiver<(u64, usize)> {
        self.presence.clone()
    }

    /// The capabilities the last host's `initialize` declared.
    pub(crate) fn declared(&self) -> Option<Value> {
        self.declared.lock().ok().and_then(|d| d.clone())
    }

    /// How many host sessions are attached.
    /// Attached sessions per protocol version, newest first (those that
    /// have not fixed one yet are not counted).
    pub(crate) fn versions(&self) -> Vec<(&'static str, usize)> {
        self.versions.counts()
    }

    /// The protocol version the server speaks (its last generation's, or
    /// the on-demand cache's), if known.
    pub(crate) fn protocol(&self) -> Option<Arc<str>> {
        self.protocol.lock().ok().and_then(|p| p.0.clone())
    }

    /// Which eras the server speaks (its last generation's, or the
    /// on-demand cache's), if known.
    pub(crate) fn upstream(&self) -> session::lanes::Upstream {
        self.protocol
            .lock()
            .map_or(session::lanes::Upstream::Unknown, |p| p.1)
    }

    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Generation `generation` is established on `wire`.
    pub(crate) fn up(&self, generation: Gen, wire: Wire, init: Arc<Value>) {
        let _ = self.tx.send(Input::Up {
            generation,
            wire,
            init,
        });
    }

    /// Generation `generation` is being taken down, because of `lost` if it
    /// failed: requests in flight are answered with that (the exit may be
    /// noticed before the connection's end is read).
    pub(crate) fn down(&self, generation: Gen, lost: Option<String>) {
        let _ = self.tx.send(Input::Down { generation, lost });
    }

    /// The unit's settings changed.
    pub(crate) fn configure(&self, settings: Settings) {
        let _ = self.tx.send(Input::Configure(settings));
    }

    /// A request upstream on a client's behalf: the server's whole answer
    /// (a `result` or an `error` member), or why there is none. It waits
    /// while an on-demand server starts. Dropping the future cancels the
    /// request upstream.
    pub(crate) async fn request(&self, method: &str, params: Value) -> Result<Value, String> {
        self.send_request(method, params, Purpose::Use)
            .await
            .map(|answer| answer.to_value())
    }

    async fn send_request(
        &self,
        method: &str,
        params: Value,
        purpose: Purpose,
    ) -> Result<Message, String> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let sent = self.tx.send(Input::Request {
            token,
            method: method.to_owned(),
            params,
            reply,
            purpose,
        });
        if sent.is_err() {
            return Err("the server's sessions have ended".into());
        }
        let mut guard = CancelOnDrop {
            sessions: self,
            token,
            armed: true,
        };
        let answer = answer.await;
        guard.armed = false;
        answer.unwrap_or_else(|_| Err("the server's sessions have ended".into()))
    }

    /// The tools were read now (at the handshake, or again), with these
    /// caching hints.
    pub(crate) fn tools_read(&self, hint: era::CacheHint) {
        let _ = self.tx.send(Input::ToolsRead(hint, now()));
    }

    /// A re-sync of the tools is published, as tools serial `serial`.
    pub(crate) fn tools_synced(&self, serial: u64) {
        let _ = self.tx.send(Input::ToolsSynced(serial));
    }

    /// Every page of `list`, read again (a re-sync after `list_changed`)
    /// by the list reader: complete within `timeout`, or an error naming
    /// the list and the bound. Dropping the future cancels the page in
    /// flight upstream.
    pub(crate) async fn read_list(
        &self,
        list: List,
        timeout: Duration,
    ) -> Result<crate::supervisor::tools::ToolList, ListError> {
        let (mut pages, mut params) = Pages::new(list, timeout);
        loop {
            let answer = self.send_request(list.method(), params, Purpose::Sync);
            match pages.next(answer).await {
                Paged::Ask(next) => params = next,
                Paged::Done(items) => {
                    if list == List::Tools {
                        self.tools_read(pages.hint());
                    }
                    return Ok(items);
                }
                Paged::Asking(why) => {
                    let why = Why::Lost(why);
                    return Err(ListError { list, why });
                }
                Paged::Failed(e) => return Err(e),
            }
        }
    }
}

/// The lists as JSON arrays, shared with the D-Bus side.
pub(crate) type Lists = Arc<std::sync::Mutex<[Option<Arc<str>>; 3]>>;

/// What the core needs of the unit's status; the tools' JSON is copied
/// only when they changed since `kept` (their serial and JSON).
fn facts_of(name: &str, status: &Status, kept: &mut (u64, Arc<str>)) -> Facts {
    let state = match status.state {
        // Not started yet: the daemon starts each unit as it loads it,
        // after its sockets are up, so a host that came first waits for
        // the start rather than hear the unit is stopped.
        State::Stopped if status.generation == 0 => UnitState::Starting,
        State::Starting => UnitState::Starting,
        State::Running => UnitState::Running,
        State::Idle => UnitState::Idle,
        State::Retrying => UnitState::Retrying,
        State::Reconnecting => UnitState::Reconnecting,
        State::Failed => UnitState::Failed,
        State::Stopping => UnitState::Stopping,
        State::Stopped => UnitState::Stopped,
        State::NeedsLogin => UnitState::NeedsLogin,
    };
    if kept.0 != status.tools_serial {
        *kept = (status.tools_serial, Arc::from(status.tools.json()));
    }
    Facts {
        state,
        tools_serial: status.tools_serial,
        tools: Arc::clone(&kept.1),
        not_running: super::CallError::not_running(name, status).to_string(),
    }
}

/// One attached host's I/O.
struct HostIo {
    out: HostOut,
    /// The bridge's socket, for a host whose stdio was handed over.
    control: Option<Outbox<OwnedWriteHalf>>,
    /// Its requests read and not answered, for its bridge.
    ledger: Option<Box<Ledger>>,
    /// Dropped with the host: stops its reader.
    _reader: StopReading,
    /// Holds its reader back while the server has not read enough of
    /// what it sent (`Out::Slow`).
    hold: HoldReading,
    caller: Caller,
    /// Notifications not sent to it while it was behind, not told yet.
    dropped: u64,
}

impl Drop for HostIo {
    fn drop(&mut self) {
        // The bridge's socket closes, giving it the host's stdio back, only
        // once every byte queued for the host is written (a host that reads
        // nothing for FLUSH_TIMEOUT loses the rest).
        let Some(control) = self.control.take() else {
            return;
        };
        let writer = self.out.writer();
        // Dropped as the runtime itself goes: the process is ending.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            if let Some(mut writer) = writer
                && tokio::time::timeout(FLUSH_TIMEOUT, &mut writer)
                    .await
                    .is_err()
            {
                writer.abort();
            }
            drop(control);
        });
    }
}

struct Upstream {
    generation: Gen,
    tx: crate::mux::wire::Sender,
    /// Woken as what waits for the server is written.
    drained: Arc<tokio::sync::Notify>,
    /// Dropped with the upstream: stops its reader.
    _reader: StopReading,
}

struct Task {
    core: Core,
    /// The unit's spans in flight (DESIGN §18): fed only while
    /// `telemetry::on()`.
    tracer: Tracer,
    name: Arc<str>,
    /// Every host's reader and the upstream's: each polled only once
    /// woken, so a message costs a poll of its own reader alone.
    readers: Readers,
    io: HashMap<HostId, HostIo>,
    upstream: Option<Upstream>,
    status: watch::Receiver<Status>,
    /// The serial and JSON of the tools last handed to the core.
    tools: (u64, Arc<str>),
    /// The status again, to hand the core the newest facts before each
    /// input (seen apart from `status`, whose changes are handled).
    fresh: watch::Receiver<Status>,
    events: mpsc::UnboundedSender<Internal>,
    counters: Arc<Counters>,
    /// The unit's `log-rate-limit`, for the server's log messages and its
    /// lines of garbage.
    log_limit: Limiter,
    /// A `tools/list_changed` notice is on its way to the actor.
    list_changed: Arc<AtomicBool>,
    /// Who waits for mcpd's own requests, by token.
    replies: HashMap<u64, oneshot::Sender<Result<Message, String>>>,
    /// The deadline the timer is armed for.
    armed: Option<Instant>,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// Hosts whose link refused a message, to detach.
    doomed: Vec<(HostId, &'static str)>,
    count: Arc<AtomicUsize>,
    presence: watch::Sender<(u64, usize)>,
    declared: Declared,
    versions: Arc<Versions>,
    protocol: Arc<std::sync::Mutex<(Option<Arc<str>>, session::lanes::Upstream)>>,
    lists: Lists,
    changes: watch::Sender<[u64; 3]>,
    listed: watch::Sender<Gen>,
    heard: Arc<Heard>,
}

/// Waits for the unit's status to change: owning its receiver, so that
/// the wait is made once per change rather than once per message.
async fn status_change(
    mut status: watch::Receiver<Status>,
) -> (Result<(), watch::error::RecvError>, watch::Receiver<Status>) {
    let changed = status.changed().await;
    (changed, status)
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Input>) {
        // In a set of one: polled only once woken (a pending watch
        // wait, polled again, takes its waiter list's lock).
        let mut status_changed = futures_util::stream::FuturesUnordered::new();
        status_changed.push(status_change(self.status.clone()));
        // An instance of a per-host unit begins idle (no change of status
        // to wait for): its host's first request is held.
        let facts = self.facts();
        self.core.status(facts, now());
        self.perform();
        loop {
            // While a host is held back, the upstream's queue is watched
            // as it drains.
            let drained = self
                .upstream
                .as_ref()
                .filter(|_| self.core.slowed())
                .map(|u| Arc::clone(&u.drained));
            tokio::select! {
                () = async {
                    if let Some(drained) = &drained {
                        drained.notified().await;
                    }
                }, if drained.is_some() => {
                    self.waiting();
                }
                input = rx.recv() => match input {
                    Some(input) => {
                        self.refresh();
                        self.input(input);
                    }
                    None => break,
                },
                Some(event) = self.readers.next_event(), if !self.readers.is_empty() => {
                    self.refresh();
                    self.event(event);
                }
                () = &mut self.timer, if self.armed.is_some() => {
                    self.armed = None;
                    self.refresh();
                    self.core.tick(now());
                }
                Some((changed, status)) = status_changed.next() => match changed {
                    Ok(()) => {
                        status_changed.push(status_change(status));
                        let facts = self.facts();
                        self.core.status(facts, now());
                    }
                    // The actor has ended: so have its sessions.
                    Err(_) => break,
                },
            }
            self.perform();
        }
        rx.close();
        // Lines read (a read may hold several) and not handled yet.
        let mut queued = Vec::new();
        for reader in self.readers.iter_mut() {
            reader.buffered(&mut queued);
        }
        self.core.closing(queued);
        self.perform();
    }

    fn event(&mut self, event: Event) {
        match event {
            Event::Host(host, Some(frame)) => {
                if telemetry::on()
                    && let Frame::Message(message) = &frame
                {
                    let version = self.core.host_version(host);
                    self.tracer.from_host(host, message, version);
                }
                self.core.host_frame(host, frame, now())
            }
            Event::Host(host, None) => self.core.detached(host, None, now()),
            Event::Server(generation, incoming, garbage) => {
                if let Some((lines, why)) = garbage {
                    self.garbage(lines, &why);
                }
                if self
                    .upstream
                    .as_ref()
                    .is_none_or(|u| u.generation != generation)
                {
                    return;
                }
                match incoming {
                    Some(Ok(message)) => {
                        if telemetry::on() {
                            self.tracer.from_server(&message);
                        }
                        self.core.server_message(message, now())
                    }
                    Some(Err(why)) => {
                        let why = format!("request failed: {why}");
                        self.core.lost(generation, why, now());
                    }
                    None => {
                        let why = "the server closed the connection".into();
                        self.core.lost(generation, why, now());
                    }
                }
            }
        }
    }

    /// Hands the core the unit's newest facts, if they changed since it
    /// was last handed them: a decision is made by the newest state, as
    /// the unit's handle shows it, whether or not its change has been
    /// handled.
    fn refresh(&mut self) {
        self.waiting();
        if self.fresh.has_changed().unwrap_or(false) {
            let facts = {
                let status = self.fresh.borrow_and_update();
                facts_of(&self.name, &status, &mut self.tools)
            };
            self.core.refresh(facts);
        }
    }

    /// Tells the core how much of what it sent the server still waits.
    fn waiting(&mut self) {
        if let Some(up) = &self.upstream {
            self.core.server_waiting(up.tx.waiting());
        }
    }

    /// The unit's status as the core needs it (marked seen).
    fn facts(&mut self) -> Facts {
        let status = self.status.borrow_and_update();
        facts_of(&self.name, &status, &mut self.tools)
    }

    fn input(&mut self, input: Input) {
        let at = now();
        match input {
            Input::Attach {
                link,
                caller,
                refused,
            } => self.attach(link, caller, refused),
            Input::Up {
                generation,
                wire,
                init,
            } => {
                let (reader, stop) = Reader::server(generation, wire.rx);
                self.readers.push(reader);
                self.upstream = Some(Upstream {
                    generation,
                    drained: wire.tx.drained(),
                    tx: wire.tx,
                    _reader: stop,
                });
                self.core.up(generation, init, at);
            }
            Input::Down { generation, lost } => self.core.down(generation, lost, at),
            Input::Configure(settings) => {
                self.log_limit.set(settings.log_rate_limit);
                self.core.configure(settings.core, at);
            }
            Input::Request {
                token,
                method,
                params,
                reply,
                purpose,
            } => {
                if purpose == Purpose::Use && self.status.has_changed().unwrap_or(false) {
                    // A request made just after a start (a D-Bus caller's
                    // instance started for it) is held or refused by the
                    // newest state, not by one this task has yet to see.
                    let facts = self.facts();
                    self.core.status(facts, at);
                }
                self.replies.insert(token, reply);
                self.core.request(token, &method, params, purpose, at);
            }
            Input::Restore { init, lists } => self.core.restore(init, lists),
            Input::Adopt { init, lists } => self.core.adopt(init, lists),
            Input::Settle {
                generation,
                cutoff,
                reply,
            } => {
                let answer = self.core.settle(generation, cutoff, at);
                let _ = reply.send(answer);
            }
            Input::EndAll(why) => self.core.end_all(&why, at),
            Input::Cancel { token } => {
                self.replies.remove(&token);
                self.core.cancel(token, at);
            }
            Input::ToolsRead(hint, read) => self.core.tools_read(hint, read),
            Input::ToolsSynced(serial) => self.core.tools_synced(serial),
        }
    }

    fn attach(&mut self, link: HostLink, caller: Caller, refused: Option<Arc<str>>) {
        let host = self.core.next_host();
        let who = caller.to_string();
        let pausable = link.pausable();
        self.tracer.attach(host, transport(&link, &caller));
        let opened = link.open(host, QUEUE, QUEUE_BYTES);
        self.readers.push(opened.reader);
        let arrival = Arrival {
            replay: opened.replay,
            bridged: opened.control.is_some(),
            ledger: opened.ledger.is_some(),
            refused,
            pausable,
        };
        self.io.insert(
            host,
            HostIo {
                out: opened.out,
                control: opened.control,
                ledger: opened.ledger,
                _reader: opened.stop,
                hold: opened.hold,
                caller,
                dropped: 0,
            },
        );
        tracing::debug!(target: "mcpd::sessions", mcpd_server = %self.name, host, "host session attached by {who}");
        self.core.attach(host, arrival, now());
    }

    /// Carries out what the core said, in order; hosts whose link refused
    /// a message are detached, and what that says carried out in turn.
    fn perform(&mut self) {
        loop {
            let mut outs = self.core.take();
            if outs.is_empty() {
                // Its room goes back: a message's outputs allocate nothing.
                self.core.recycle(outs);
                break;
            }
            for out in outs.drain(..) {
                self.carry_out(out);
            }
            self.core.recycle(outs);
            // What was written at once is no longer waiting.
            self.waiting();
            if !self.doomed.is_empty() {
                let at = now();
                for (host, why) in std::mem::take(&mut self.doomed) {
                    self.core.detached(host, Some(why), at);
                }
            }
        }
        let deadline = self.core.deadline();
        if deadline != self.armed {
            self.armed = deadline;
            if let Some(at) = deadline {
                self.timer
                    .as_mut()
                    .reset(tokio::time::Instant::from_std(at));
            }
        }
    }

    fn carry_out(&mut self, out: Out) {
        match out {
            Out::Host {
                host,
                mut message,
                kind,
                modern,
            } => {
                if telemetry::on() {
                    let asked = message
                        .request_id()
                        .and_then(|id| id.as_u64())
                        .and_then(|down| self.core.asked(host, down));
                    self.tracer.to_host(host, &mut message, asked);
                }
                self.send_host(host, message, kind, modern)
            }
            Out::Bytes(host, mut bytes) => {
                if telemetry::on() {
                    self.tracer.bytes_to_host(host, &mut bytes);
                }
                if let Some(io) = self.io.get(&host) {
                    let sent = io.out.send(bytes);
                    self.sent(host, sent);
                }
            }
            Out::Server(mut message) => {
                if let Some(up) = &self.upstream {
                    if telemetry::on() {
                        let owner = message
                            .request_id()
                            .and_then(|id| id.as_u64())
                            .and_then(|id| self.core.owner(id));
                        let version = self.protocol.lock().ok().and_then(|p| p.0.clone());
                        self.tracer
                            .to_server(&mut message, owner, version.as_deref());
                    }
                    let _ = up.tx.send(message);
                }
            }
            Out::Release => {
                self.upstream = None;
                if telemetry::on() {
                    self.tracer.released();
                }
            }
            Out::Reply { token, answer } => {
                if let Some(reply) = self.replies.remove(&token) {
                    let _ = reply.send(answer);
                }
            }
            Out::Ended { host, why, counted } => {
                self.tracer.detach(host);
                self.ended(host, why, counted)
            }
            Out::Remember { host, initialize } => {
                if let Some(control) = self.io.get(&host).and_then(|io| io.control.as_ref()) {
                    let _ =
                        control.send(crate::mux::attach::line(&Control::Initialize(initialize)));
                }
            }
            Out::Ledger { host, id, record } => {
                if let Some(ledger) = self.io.get_mut(&host).and_then(|io| io.ledger.as_mut()) {
                    if record {
                        ledger.record(&id);
                    } else {
                        ledger.clear(&id);
                    }
                }
            }
            Out::Call {
                host,
                call,
                outcome,
            } => {
                let caller = self
                    .io
                    .get(&host)
                    .map(|io| io.caller.clone())
                    .unwrap_or_default();
                let mut record =
                    Record::started(&self.name, call.tool, &self.counters, caller, call.started);
                record.finish(outcome);
            }
            Out::Notice(notice) => self.notice(notice),
            Out::Heard(at) => self.heard.at(at),
            Out::Log { level, host, text } => {
                let name = &self.name;
                match (level, host) {
                    (Level::Debug, Some(host)) => {
                        tracing::debug!(target: "mcpd::sessions", mcpd_server = %name, host, "{text}")
                    }
                    (Level::Debug, None) => {
                        tracing::debug!(target: "mcpd::sessions", mcpd_server = %name, "{text}")
                    }
                    (Level::Info, Some(host)) => {
                        tracing::info!(target: "mcpd::sessions", mcpd_server = %name, host, "{text}")
                    }
                    (Level::Info, None) => {
                        tracing::info!(target: "mcpd::sessions", mcpd_server = %name, "{text}")
                    }
                    (Level::Warn, Some(host)) => {
                        tracing::warn!(target: "mcpd::sessions", mcpd_server = %name, host, "{text}")
                    }
                    (Level::Warn, None) => {
                        tracing::warn!(target: "mcpd::sessions", mcpd_server = %name, "{text}")
                    }
                }
            }
            Out::ServerLog(message) => self.journal(&message),
            Out::Blame { why, whose } => self.blame(&why, &whose),
            Out::Publish(publish) => self.publish(publish),
            Out::Slow { host, slow } => {
                if let Some(io) = self.io.get(&host) {
                    io.hold.hold(slow);
                    if slow {
                        self.counters.host_slowed();
                    }
                }
            }
            Out::Shed { request, .. } => self.counters.host_shed(request),
        }
    }

    /// Sends `message` to `host`. A notification for a host that is
    /// behind (past `session::behind`) is dropped and counted, if it may
    /// be (answers and requests never are); once the host has caught up,
    /// it is told how many before its next message.
    fn send_host(&mut self, host: HostId, message: Message, kind: Kind, modern: bool) {
        let Some(io) = self.io.get_mut(&host) else {
            return;
        };
        let notification = kind == Kind::Notification;
        if notification || io.dropped > 0 {
            let behind = session::behind(io.out.backlog());
            if behind && notification && session::may_drop(&message) {
                io.dropped += 1;
                self.counters.notification_dropped();
                if telemetry::on() {
                    telemetry::count(
                        telemetry::metrics::Counter::DroppedNotifications,
                        vec![("mcpd.unit", self.name.to_string())],
                    );
                }
                return;
            }
            if !behind && io.dropped > 0 {
                let notice = session::dropped_notice(std::mem::take(&mut io.dropped));
                // A modern host gets log messages only for requests that
                // ask.
                if !modern {
                    let sent = io.out.send(line(&notice));
                    self.sent(host, sent);
                }
            }
        }
        let Some(io) = self.io.get(&host) else {
            return;
        };
        let sent = message.with_line(|line| io.out.send_slice(line));
        self.sent(host, sent);
    }

    /// A host whose queue refused a message is detached.
    fn sent(&mut self, host: HostId, sent: Result<(), Refused>) {
        match sent {
            Ok(()) => {}
            Err(Refused::Full) => {
                self.doomed.push((host, "it stopped reading its messages"));
            }
            Err(Refused::Closed) => {
                self.doomed.push((host, "its connection failed"));
            }
        }
    }

    /// Host session `host` ended (see [`Out::Ended`]).
    fn ended(&mut self, host: HostId, why: Option<String>, counted: bool) {
        let Some(gone) = self.io.remove(&host) else {
            return;
        };
        if let Some(why) = &why {
            tracing::warn!(target: "mcpd::sessions", mcpd_server = %self.name, host, pid = ?gone.caller.pid, "detaching host session {host}: {why}");
            if counted {
                self.counters.host_detached();
            }
        }
        // The host sees its session end at once, whatever its writer task
        // still waits to write. A bridge is told why, and exits.
        gone.out.shutdown();
        if let Some(control) = &gone.control {
            let _ = control.send(crate::mux::attach::line(&Control::End(why)));
        }
    }

    fn notice(&mut self, notice: Notice) {
        let internal = match notice {
            Notice::Closed { generation, error } => Internal::Closed { generation, error },
            Notice::Demand => Internal::Demand,
            Notice::ListFailed { generation, error } => Internal::ListFailed { generation, error },
            Notice::ToolsChanged { generation } => {
                // One notice at a time: a storm wakes the actor once per
                // notice it takes, not once per notification.
                if self.list_changed.swap(true, Ordering::AcqRel) {
                    return;
                }
                Internal::ListChanged {
                    generation,
                    pending: Arc::clone(&self.list_changed),
                }
            }
        };
        let _ = self.events.send(internal);
    }

    fn publish(&mut self, publish: Publish) {
        match publish {
            Publish::List(kind, list) => {
                if let Ok(mut lists) = self.lists.lock() {
                    lists[kind.index()] = list;
                }
                self.changes
                    .send_modify(|serials| serials[kind.index()] += 1);
            }
            Publish::Listed(generation) => {
                self.listed.send_replace(generation);
            }
            Publish::Protocol(protocol, upstream) => {
                if let Ok(mut kept) = self.protocol.lock() {
                    *kept = (protocol, upstream);
                }
            }
            Publish::Declared(caps) => {
                if let Ok(mut declared) = self.declared.lock() {
                    *declared = Some(caps);
                }
            }
            Publish::Version(version, true) => self.versions.attached(version),
            Publish::Version(version, false) => self.versions.detached(version),
            Publish::Presence { attached, arrived } => {
                self.count.store(attached, Ordering::Relaxed);
                self.presence.send_modify(|(ever, now)| {
                    if arrived {
                        *ever += 1;
                    }
                    *now = attached;
                });
            }
        }
    }

    /// The server wrote `lines` lines that are not JSON-RPC messages (the
    /// last one not because of `why`): counted, and logged within the
    /// unit's `log-rate-limit` (its connection fails past `GARBAGE_RUN` in
    /// a row).
    fn garbage(&mut self, lines: u64, why: &str) {
        self.counters.garbage(lines);
        let admit = self.log_limit.admit_n(lines, now());
        if let Some(until) = admit.reached {
            let line = logs::reached_line("its lines of garbage", until);
            tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{line}");
        }
        if let Some(n) = admit.suppressed {
            let line = logs::suppressed_line(n, self.log_limit.limit());
            tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{line}");
        }
        if admit.log {
            match lines {
                1 => {
                    tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "a line on the server's stdout is not a JSON-RPC message: {why}")
                }
                n => {
                    tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{n} lines on the server's stdout are not JSON-RPC messages (the last: {why})")
                }
            }
        }
    }

    /// A server's log message also goes to the journal.
    /// The unit's `log-rate-limit` applies, as to its stderr: past it,
    /// messages are counted and the count reported once the window ends.
    fn journal(&mut self, message: &Message) {
        // Its cost: what the line logged takes (cut to `logs::MAX_LINE`).
        let size = message.with_line(<[u8]>::len).min(logs::MAX_LINE);
        let admit = self.log_limit.admit_sized(size, now());
        if let Some(until) = admit.reached {
            let line = logs::reached_line("its log messages", until);
            tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{line}");
        }
        if let Some(n) = admit.suppressed {
            let line = logs::suppressed_line(n, self.log_limit.limit());
            tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{line}");
        }
        if !admit.log {
            return;
        }
        let params = message.params().unwrap_or(Value::Null);
        let level = params["level"].as_str().unwrap_or("info");
        let logger = params["logger"].as_str().unwrap_or_default();
        let data = match &params["data"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        // A message of 256 KiB is logged as its first 4 KiB and its size.
        let data = logs::clip(&data, logs::MAX_LINE);
        let name = &self.name;
        match level {
            "debug" => {
                tracing::debug!(target: "mcpd::server", mcpd_server = %name, mcpd_logger = logger, "{data}")
            }
            "info" | "notice" => {
                tracing::info!(target: "mcpd::server", mcpd_server = %name, mcpd_logger = logger, "{data}")
            }
            "warning" => {
                tracing::warn!(target: "mcpd::server", mcpd_server = %name, mcpd_logger = logger, "{data}")
            }
            _ => {
                tracing::error!(target: "mcpd::server", mcpd_server = %name, mcpd_logger = logger, "{level}: {data}")
            }
        }
    }

    /// The server failed (`why`) with host requests in flight: says whose,
    /// so that a host whose requests bring a shared server down can be
    /// found (a process and user id for each session).
    fn blame(&self, why: &str, whose: &[(HostId, usize)]) {
        let mut whose: Vec<String> = whose
            .iter()
            .map(|(host, n)| {
                let mut who = format!("session {host}");
                if let Some(io) = self.io.get(host) {
                    let caller = &io.caller;
                    if caller.token.is_some() || caller.peer.is_some() {
                        who.push_str(&format!(" ({caller})"));
                    } else if let Some(pid) = caller.pid {
                        who.push_str(&format!(" (pid {pid}"));
                        if let Some(uid) = caller.uid {
                            who.push_str(&format!(", uid {uid}"));
                        }
                        who.push(')');
                    }
                }
                format!("{who}: {n}")
            })
            .collect();
        whose.sort();
        tracing::warn!(target: "mcpd::sessions", mcpd_server = %self.name, "the server failed ({why}) with requests in flight from {}", whose.join("; "));
    }
}

/// The `network.transport` of a host's spans (telemetry), by its link.
fn transport(link: &HostLink, caller: &Caller) -> Transport {
    match link {
        HostLink::Stdio { .. } => Transport::Pipe,
        HostLink::Socket { .. } => Transport::Unix,
        // An HTTP client's request without a session.
        HostLink::Memory(_) if caller.peer.is_some() => Transport::Tcp,
        HostLink::Memory(_) => Transport::Inproc,
        HostLink::Direct { .. } => Transport::Tcp,
        HostLink::Peeked(inner, _) => transport(inner, caller),
    }
}
