//! Host sessions (DESIGN §8): the task, one per unit, that runs the pure
//! [`Router`] between every attached host and the upstream session of the
//! unit's current generation.
//!
//! Each host is a stream socket (from `Attach`) speaking newline-delimited
//! JSON-RPC, read by this task itself (a [`HostReader`] among all hosts'
//! readers, polled only when its host sent something: a message costs no
//! task switch and no channel on its way) and written through an
//! [`Outbox`]: what the socket takes is written at once, the rest queued
//! (at most [`QUEUE`] messages and [`QUEUE_BYTES`]: a host that stops
//! reading is detached, never waited for). The upstream is the [`Wire`] the actor hands over once a
//! generation's handshake is done, and takes back when it ends. What the
//! router does not decide is done here, where the unit's state is known:
//!
//! - `initialize` is answered by mcpd with the server's own result and the
//!   negotiated protocol version (waiting for the first generation while
//!   the server is starting);
//! - `tools/list` is answered from the published list (the unit's filter
//!   applied, kept through outages), and hosts get `list_changed` once it
//!   changed, after mcpd re-synced it;
//! - `tools/call` of a filtered tool is refused; every call is accounted;
//! - `roots/list` is answered from the unit's `roots` when it has any;
//! - requests while the upstream is down get the outage error (§3), but
//!   those that need an on-demand unit's server (DESIGN §9: anything but
//!   `initialize`, the lists, `ping` and the session's own settings) are
//!   held while it starts, and start it when it is idle; an idle server's
//!   lists and `initialize` are answered from what its last generation
//!   said (restored from the cache after a daemon restart);
//! - the unit's last use (a request sent or answered) is kept for its
//!   `idle-stop`.
//!
//! mcpd's own requests (tool syncs, D-Bus `CallTool`) go through the same
//! router ([`Sessions::request`]), so their ids never collide with hosts'.
//!
//! This file holds the handle and the task's state and loop; `hosts` a
//! host's side (attach, send, what a host sends); `opening` how a session opens (`initialize`, a waiting discovery, the
//! deadline, the count per version); `lists` the kept lists and their
//! reads, `server` what the task does with the upstream's own messages
//! (re-syncs, roots, the journal, garbage, blame); `modern` a host of MCP
//! 2026-07-28, `upstream_era` a server of it.

mod hosts;
mod lists;
mod modern;
mod opening;
mod server;
mod upstream_era;

use lists::Cache;
use opening::{Versions, Waiting};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot, watch};

use crate::mux::era::{self};
use crate::mux::error::ErrorCode;
use crate::mux::host::{Event, HostLink, HostOut, Reader, Readers, StopReading};
use crate::mux::ledger::Ledger;
use crate::mux::lists::{List, ListError, Why};
use crate::mux::message::{Message, RequestId};
use crate::mux::route::{HostId, Router};
use crate::mux::wire::{Frame, Outbox, Wire, line};
use crate::unit::ToolFilter;

use super::Status;
use super::accounting::{Caller, Counters, Record};
use super::clock::now;
use super::events::Internal;
use super::logs::Limiter;
use super::machine::{self, Gen, State};
use super::upstream::{Paged, Pages};
use crate::unit::RateLimit;

/// Messages queued for one host: a host this far behind is not reading,
/// and is detached.
pub const QUEUE: usize = 4096;

/// Bytes queued for one host behind the message being written: a host
/// this far behind is not reading (300 answers of 8 MiB once held the
/// daemon at 4 GB), and is detached.
pub const QUEUE_BYTES: usize = 32 << 20;

/// How long what was queued for a host whose stdio was handed over may
/// take to be written once its session ended; its bridge takes the stdio
/// back only then, so their lines never interleave.
pub const FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Requests one host may have in flight upstream.
pub const MAX_IN_FLIGHT: usize = 1024;

/// Requests all the host sessions of one unit may have in flight upstream
/// together.
pub const MAX_UNIT_IN_FLIGHT: usize = 4096;

/// Host sessions one unit may have at once.
pub const MAX_SESSIONS: usize = 512;

/// How long a host session may take to send `initialize` after it
/// attached (`MCPD_INITIALIZE_TIMEOUT`): a connection that says nothing is
/// not kept for ever.
pub const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(30);

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

fn initialize_timeout() -> Duration {
    Duration::from_millis(INITIALIZE_TIMEOUT_MS.load(Ordering::Relaxed))
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
    /// A per-host unit's lists, learnt from its newest instance: they
    /// replace what is kept (the `initialize` result too, unless a
    /// generation of the unit's own is up).
    Adopt {
        init: Arc<Value>,
        lists: [Option<Arc<str>>; 3],
    },
    /// When the server was last used, and whether a request is in flight;
    /// with neither since `cutoff`, generation `generation` is idle: the
    /// sessions stop sending to it at once.
    Settle {
        generation: Gen,
        cutoff: Instant,
        reply: oneshot::Sender<(Instant, bool)>,
    },
    Cancel {
        token: u64,
    },
    /// Every host session ends, told why (an instance of a per-host unit
    /// was stopped).
    EndAll(String),
}

/// What the host sessions take from the unit's spec.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// `tools { allow …; deny …; }`.
    pub filter: ToolFilter,
    /// `roots`, answered to the server's `roots/list`.
    pub roots: Vec<String>,
    /// `start "on-demand"`: requests wait for the server to start.
    pub on_demand: bool,
    /// `startup-timeout`: how long a read of a list may take.
    pub list_timeout: Duration,
    /// `log-rate-limit`, for the server's `notifications/message`.
    pub log_rate_limit: Option<RateLimit>,
    /// `max-request-size`: the largest request a host may send.
    pub max_request_size: u64,
    /// The sessions of one instance of a per-host unit (DESIGN §13): the
    /// upstream declares its host's capabilities, and a host that
    /// declared `roots` is asked for them by the server.
    pub instance: bool,
}

impl Settings {
    pub(crate) fn of(spec: &crate::unit::UnitSpec) -> Self {
        Self {
            filter: spec.tool_filter().clone(),
            roots: spec.roots().to_vec(),
            // An instance starts for its host's first request, as an
            // on-demand unit does for anyone's.
            on_demand: spec.activation().idle_stop().is_some()
                || spec.sessions() == crate::unit::Sessions::Instance,
            list_timeout: spec.startup_timeout(),
            log_rate_limit: spec.log_rate_limit(),
            max_request_size: spec.max_request_size(),
            instance: spec.sessions() == crate::unit::Sessions::Instance,
        }
    }
}

/// What mcpd's own request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// On a client's behalf (D-Bus `CallTool`, `ReadResource`): a use of
    /// the server, held while an on-demand server starts.
    Use,
    /// mcpd's own bookkeeping (a tool-list sync).
    Sync,
    /// A liveness probe: its answer is not a sign of life (the machine
    /// judges it by its timeout).
    Probe,
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
    protocol: Arc<std::sync::Mutex<Option<Arc<str>>>>,
    lists: Lists,
    /// Serials of the three lists, raised when one changes.
    changes: watch::Receiver<[u64; 3]>,
    /// The newest generation whose lists have all been read.
    listed: watch::Receiver<Gen>,
    heard: Arc<Heard>,
    tools_fresh: ToolsFresh,
}

/// The tools' caching hints (`ttlMs`, `cacheScope` of a server of MCP
/// 2026-07-28) and when they were read (or last asked to be read again):
/// set by the reads, which run outside the task; the task's hosts'
/// `tools/list` asks for a re-read once the TTL passed.
type ToolsFresh = Arc<std::sync::Mutex<Option<(era::CacheHint, Instant)>>>;

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

    fn now(&self) {
        self.at(now());
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
        let protocol = Arc::new(std::sync::Mutex::new(None));
        let lists = Lists::default();
        let (changes_tx, changes) = watch::channel([0; 3]);
        let (listed_tx, listed) = watch::channel(0);
        let serial = status.borrow().tools_serial;
        let heard = Arc::new(Heard::new());
        let tools_fresh = ToolsFresh::default();
        let (presence_tx, presence) = watch::channel((0, 0));
        let declared = Declared::default();
        let task = Task {
            presence: presence_tx,
            declared: Arc::clone(&declared),
            instance: settings.instance,
            heard: Arc::clone(&heard),
            tools_fresh: Arc::clone(&tools_fresh),
            list_changed: Arc::default(),
            list_timeout: settings.list_timeout,
            log_limit: Limiter::new(settings.log_rate_limit),
            max_request_size: settings.max_request_size,
            deadline: None,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            name: Arc::from(name),
            readers: Readers::new(),
            router: Router::new(),
            hosts: HashMap::default(),
            next_host: 0,
            upstream: None,
            init: None,
            waiting: Vec::new(),
            versions: Arc::clone(&versions),
            protocol: Arc::clone(&protocol),
            listened: Default::default(),
            listen: None,
            next_listen: 0,
            next_down: 0,
            replaying: false,
            modern_up: false,
            own: HashMap::default(),
            lists: Arc::clone(&lists),
            changes: changes_tx,
            listed: listed_tx,
            reading_for: None,
            caches: Default::default(),
            tokens: HashMap::default(),
            status,
            serial,
            events,
            counters,
            filter: settings.filter,
            roots: settings.roots,
            on_demand: settings.on_demand,
            used: now(),
            count: Arc::clone(&count),
            doomed: Vec::new(),
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
            tools_fresh,
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
        self.send_request("ping", json!({}), Purpose::Probe)
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
        self.protocol.lock().ok().and_then(|p| p.clone())
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
        if let Ok(mut fresh) = self.tools_fresh.lock() {
            *fresh = Some((hint, now()));
        }
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

/// Who waits for the answer to mcpd's own request.
enum Waiter {
    Caller(u64, oneshot::Sender<Result<Message, String>>),
    /// A client's request (a use of the server).
    Use(u64, oneshot::Sender<Result<Message, String>>),
    /// A liveness probe's caller.
    Probe(u64, oneshot::Sender<Result<Message, String>>),
    Page(List),
}

/// One attached host.
struct Host {
    out: HostOut,
    /// The bridge's socket, for a host whose stdio was handed over.
    control: Option<Outbox<OwnedWriteHalf>>,
    /// The id of a replayed `initialize`, whose answer the host must not
    /// see.
    swallow: Option<Value>,
    /// Dropped with the host: stops its reader.
    _reader: StopReading,
    caller: Caller,
    /// Answered its `initialize`.
    initialized: bool,
    /// What it sent while its `initialize` waits for the first
    /// generation, handled in order once it is answered.
    held: Vec<Frame>,
    /// Its `tools/call`s in flight, by its request id (as JSON text).
    calls: HashMap<RequestId, Record>,
    /// Its requests read and not answered, for its bridge (stdio handed
    /// over).
    ledger: Option<Box<Ledger>>,
    /// Notifications not sent to it while it was behind, not told yet.
    dropped: u64,
    /// When it attached, until it sends `initialize`: it has
    /// [`initialize_timeout`] to.
    uninitialized: Option<Instant>,
    /// It speaks MCP 2026-07-28: what mcpd keeps for that.
    modern: Option<Box<modern::Modern>>,
    /// It speaks MCP 2025: what mcpd keeps to translate its requests for
    /// a server of MCP 2026-07-28.
    translated: Option<Box<upstream_era::Translated>>,
    /// The version its session speaks, once fixed (counted in
    /// [`Versions`]).
    version: Option<&'static str>,
    /// Its `initialize` is refused with this (`Sessions::attach_refused`).
    refused: Option<Arc<str>>,
}

impl Drop for Host {
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
    /// Dropped with the upstream: stops its reader.
    _reader: StopReading,
}

struct Task {
    name: Arc<str>,
    /// Every host's reader and the upstream's: each polled only once
    /// woken, so a message costs a poll of its own reader alone.
    readers: Readers,
    router: Router,
    hosts: HashMap<HostId, Host>,
    next_host: HostId,
    upstream: Option<Upstream>,
    /// The server's `initialize` result (the newest generation's).
    init: Option<Arc<Value>>,
    /// Hosts whose `initialize` (or `server/discover`) waits for the
    /// first generation.
    waiting: Vec<Waiting>,
    /// Attached sessions per protocol version.
    versions: Arc<Versions>,
    /// The protocol version the server speaks (of its last generation).
    protocol: Arc<std::sync::Mutex<Option<Arc<str>>>>,
    /// A modern server: what mcpd's listen stream holds, its id, and the
    /// ids mcpd gave its streams and its questions to 2025 hosts.
    listened: upstream_era::Listened,
    listen: Option<String>,
    next_listen: u64,
    next_down: u64,
    /// The router's replayed subscriptions are being taken in (one listen
    /// stream once they are all in).
    replaying: bool,
    /// The server (of `init`) speaks MCP 2026-07-28.
    modern_up: bool,
    /// mcpd's own requests: upstream id → who waits.
    own: HashMap<u64, Waiter>,
    /// The resource, template and prompt lists (`List`), and their reads.
    lists: Lists,
    changes: watch::Sender<[u64; 3]>,
    listed: watch::Sender<Gen>,
    /// The generation whose first reads of the lists are under way.
    reading_for: Option<Gen>,
    caches: [Cache; 3],
    /// Their tokens → upstream id.
    tokens: HashMap<u64, u64>,
    status: watch::Receiver<Status>,
    /// The tools serial hosts were last told about.
    serial: u64,
    events: mpsc::UnboundedSender<Internal>,
    counters: Arc<Counters>,
    filter: ToolFilter,
    roots: Vec<String>,
    /// `start "on-demand"`: requests wait for the server to start.
    on_demand: bool,
    /// The last use: a request of a host or client sent or answered.
    used: Instant,
    count: Arc<AtomicUsize>,
    presence: watch::Sender<(u64, usize)>,
    declared: Declared,
    /// The sessions of a per-host unit's instance (`Settings::instance`).
    instance: bool,
    /// Hosts to detach once the current message is handled.
    doomed: Vec<(HostId, &'static str)>,
    heard: Arc<Heard>,
    tools_fresh: ToolsFresh,
    /// A `tools/list_changed` notice is on its way to the actor.
    list_changed: Arc<std::sync::atomic::AtomicBool>,
    /// How long a read of a list may take (`startup-timeout`).
    list_timeout: Duration,
    /// The unit's `log-rate-limit`, for the server's log messages.
    log_limit: Limiter,
    /// The unit's `max-request-size`.
    max_request_size: u64,
    /// The earliest deadline of the list reads under way and of the
    /// hosts that have not sent `initialize` yet, and its timer (armed
    /// only while there is one).
    deadline: Option<Instant>,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
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
        self.update_hold();
        loop {
            tokio::select! {
                input = rx.recv() => match input {
                    Some(input) => self.input(input),
                    None => break,
                },
                Some(event) = self.readers.next_event(), if !self.readers.is_empty() => match event {
                    Event::Host(host, Some(frame)) => {
                        self.record(host, &frame);
                        self.on_host(host, frame);
                    }
                    Event::Host(host, None) => self.detach(host, None),
                    Event::Server(generation, incoming, garbage) => {
                        if let Some((lines, why)) = garbage {
                            self.garbage(lines, &why);
                        }
                        if self.upstream.as_ref().is_some_and(|u| u.generation == generation) {
                            match incoming {
                                Some(Ok(message)) => self.on_server(message),
                                Some(Err(why)) => {
                                    self.lost(generation, format!("request failed: {why}"));
                                }
                                None => {
                                    self.lost(generation, "the server closed the connection".into());
                                }
                            }
                        }
                    }
                },
                () = &mut self.timer, if self.deadline.is_some() => {
                    self.deadline = None;
                    self.lists_expired();
                    self.uninitialized_expired();
                    self.inputs_expired();
                    self.arm();
                }
                Some((changed, status)) = status_changed.next() => match changed {
                    Ok(()) => {
                        status_changed.push(status_change(status));
                        self.status_changed();
                    }
                    // The actor has ended: so have its sessions.
                    Err(_) => break,
                },
            }
            while let Some((host, why)) = self.doomed.pop() {
                self.detach(host, Some(why));
            }
        }
        self.closing(rx);
    }

    /// The unit is gone (or the daemon stopping): what hosts sent that was
    /// not handled yet gets the outage error, not silence.
    fn closing(&mut self, mut rx: mpsc::UnboundedReceiver<Input>) {
        rx.close();
        // Lines read (a read may hold several) and not handled yet.
        let mut queued = Vec::new();
        for reader in self.readers.iter_mut() {
            reader.buffered(&mut queued);
        }
        let held: Vec<(HostId, Frame)> = self
            .hosts
            .iter_mut()
            .flat_map(|(host, h)| std::mem::take(&mut h.held).into_iter().map(|f| (*host, f)))
            .collect();
        let waiting: Vec<(HostId, Value)> = std::mem::take(&mut self.waiting)
            .into_iter()
            .map(|w| (w.host, w.id))
            .collect();
        let text = self.down_text(None);
        for (host, id) in waiting {
            self.send(host, ErrorCode::ServerDown.response(&id, text.clone()));
        }
        for (host, frame) in held.into_iter().chain(queued) {
            if let Frame::Message(message) = frame
                && message.has("method")
                && let Some(id) = message.id().filter(|id| !id.is_null())
            {
                self.send(host, ErrorCode::ServerDown.response(&id, text.clone()));
            }
        }
    }

    fn input(&mut self, input: Input) {
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
            } => self.up(generation, wire, init),
            Input::Down { generation, lost } => {
                if self
                    .upstream
                    .as_ref()
                    .is_some_and(|u| u.generation == generation)
                {
                    self.upstream = None;
                    if let Some(why) = &lost {
                        self.blame(why);
                    }
                    let outs = self.router.upstream_lost();
                    self.deliver(outs, lost.as_deref());
                }
            }
            Input::Configure(settings) => {
                self.list_timeout = settings.list_timeout;
                self.log_limit.set(settings.log_rate_limit);
                self.max_request_size = settings.max_request_size;
                self.filter = settings.filter;
                self.roots = settings.roots;
                self.on_demand = settings.on_demand;
                self.instance = settings.instance;
                self.update_hold();
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
                    self.status_changed();
                }
                if purpose != Purpose::Use && self.upstream.is_none() {
                    // Bookkeeping is for a running server: it never waits
                    // for (or causes) a start.
                    let _ = reply.send(Err(self.down_text(None)));
                    return;
                }
                let waiter = match purpose {
                    Purpose::Use => {
                        self.used = now();
                        Waiter::Use(token, reply)
                    }
                    Purpose::Sync => Waiter::Caller(token, reply),
                    Purpose::Probe => Waiter::Probe(token, reply),
                };
                let (id, outs) = self.router.request(&method, params);
                self.own.insert(id, waiter);
                self.tokens.insert(token, id);
                self.deliver(outs, None);
                self.demand_if_held();
            }
            Input::Restore { init, lists } => {
                if self.init.is_none() {
                    self.set_init(init);
                }
                for (kind, list) in List::KEPT.into_iter().zip(lists) {
                    if list.is_some() && self.cached(kind).is_none() {
                        self.set_list(kind, list);
                    }
                }
            }
            Input::Adopt { init, lists } => {
                if self.upstream.is_none() {
                    self.set_init(init);
                }
                for (kind, list) in List::KEPT.into_iter().zip(lists) {
                    self.set_list(kind, list);
                }
            }
            Input::Settle {
                generation,
                cutoff,
                reply,
            } => {
                let busy = self.router.hosts_busy()
                    || self.own.values().any(|w| matches!(w, Waiter::Use(..)));
                if machine::idle(self.used, busy, cutoff)
                    && self
                        .upstream
                        .as_ref()
                        .is_some_and(|u| u.generation == generation)
                {
                    // Idle: the machine stops it now. Only mcpd's own
                    // bookkeeping can be in flight; it is not worth a start.
                    self.upstream = None;
                    let outs = self.router.upstream_lost();
                    self.deliver(outs, Some("the server is stopping after idle-stop"));
                }
                let _ = reply.send((self.used, busy));
            }
            Input::EndAll(why) => {
                let hosts: Vec<HostId> = self.hosts.keys().copied().collect();
                for host in hosts {
                    self.end(host, Some(&why), false);
                }
            }
            Input::Cancel { token } => {
                if let Some(id) = self.tokens.remove(&token) {
                    self.own.remove(&id);
                    let outs = self.router.cancel(id);
                    self.deliver(outs, None);
                }
            }
        }
    }

    fn up(&mut self, generation: Gen, wire: Wire, init: Arc<Value>) {
        let (reader, stop) = Reader::server(generation, wire.rx);
        self.readers.push(reader);
        self.upstream = Some(Upstream {
            generation,
            tx: wire.tx,
            _reader: stop,
        });
        let offered: Vec<List> = List::KEPT
            .into_iter()
            .filter(|k| init["capabilities"].get(k.capability()).is_some())
            .collect();
        self.set_init(init);
        // The actor published this generation's tools before handing it
        // over: hosts attached already are told now if they differ; hosts
        // answered from now on have them.
        let serial = self.status.borrow().tools_serial;
        if serial != self.serial {
            self.serial = serial;
            self.broadcast("notifications/tools/list_changed");
        }
        let modern = self.modern_upstream();
        self.router.logs_by_request(modern);
        if modern {
            self.listen = None;
            self.listened.clear();
            self.replaying = true;
        }
        let outs = self.router.upstream_ready();
        self.deliver(outs, None);
        if modern {
            self.replaying = false;
            self.listen_upstream();
        }
        for kind in List::KEPT {
            if offered.contains(&kind) {
                self.read_list(kind, false);
            } else if self.set_list(kind, None).is_some_and(|old| &*old != "[]") {
                // This generation offers it no more.
                self.broadcast(kind.changed());
            }
        }
        self.reading_for = Some(generation);
        self.check_listed();
        for waiting in std::mem::take(&mut self.waiting) {
            self.opened(waiting);
        }
        self.ask_roots();
    }

    /// An instance's server (DESIGN §13) was given no roots in its
    /// handshake (its host had not been answered yet): once its host
    /// declared `roots`, the server is told they changed, and asks the
    /// host itself.
    fn ask_roots(&mut self) {
        let declared = self
            .declared
            .lock()
            .ok()
            .is_some_and(|d| d.as_ref().is_some_and(|c| c.get("roots").is_some()));
        if !(self.instance && declared && self.roots.is_empty()) {
            return;
        }
        if let Some(up) = &self.upstream {
            let notice = json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
            let _ = up.tx.send(notice.into());
        }
    }

    /// The server's `initialize` result (or discovery, kept as one) of the
    /// newest generation, and the version it speaks for `ProtocolVersion`.
    fn set_init(&mut self, init: Arc<Value>) {
        if let Ok(mut protocol) = self.protocol.lock() {
            *protocol = init["protocolVersion"].as_str().map(Arc::from);
        }
        self.modern_up = era::is_modern(&init);
        self.init = Some(init);
    }

    fn lost(&mut self, generation: Gen, why: String) {
        self.blame(&why);
        self.upstream = None;
        let _ = self.events.send(Internal::Closed {
            generation,
            error: why.clone(),
        });
        let outs = self.router.upstream_lost();
        self.deliver(outs, Some(&why));
    }

    fn status_changed(&mut self) {
        let (serial, state) = {
            let s = self.status.borrow_and_update();
            (s.tools_serial, s.state)
        };
        self.update_hold();
        if serial != self.serial {
            self.serial = serial;
            self.broadcast("notifications/tools/list_changed");
        }
        if matches!(state, State::Failed | State::Stopped) {
            // Withdrawn with the tools.
            for kind in List::KEPT {
                self.caches[kind.index()] = Cache::default();
                let old = self.set_list(kind, None);
                if old.is_some_and(|l| &*l != "[]") {
                    self.broadcast(kind.changed());
                }
            }
        }
        if matches!(state, State::Failed | State::Stopped) && !self.waiting.is_empty() {
            for w in std::mem::take(&mut self.waiting) {
                if w.discover {
                    let text = self.down_text(None);
                    self.send(w.host, ErrorCode::ServerDown.response(&w.id, text));
                    self.release_held(w.host);
                } else {
                    self.refuse_initialize(w.host, &w.id, &w.params);
                }
            }
        }
    }

    /// Sends notification `method` to every initialized host (a modern
    /// host: on each of its listen streams that opted in to it).
    fn broadcast(&mut self, method: &str) {
        let bytes = line(&json!({"jsonrpc": "2.0", "method": method}));
        let ready: Vec<(HostId, bool)> = self
            .hosts
            .iter()
            .filter(|(_, h)| h.initialized)
            .map(|(id, h)| (*id, h.modern.is_some()))
            .collect();
        for (host, modern) in ready {
            if modern {
                self.notice_modern(host, method);
            } else {
                self.send_bytes(host, bytes.clone());
            }
        }
    }

    /// Arms the task's timer for the earliest deadline: of the list reads
    /// under way, and of the hosts that have not sent `initialize` (none:
    /// disarmed).
    fn arm(&mut self) {
        let reads = self.caches.iter().filter_map(Cache::deadline);
        let timeout = initialize_timeout();
        let hosts = self
            .hosts
            .values()
            .filter_map(|h| h.uninitialized.map(|since| since + timeout));
        let inputs = self
            .hosts
            .values()
            .filter_map(|h| h.modern.as_ref().and_then(|m| m.deadline()));
        let deadline = reads.chain(hosts).chain(inputs).min();
        if deadline != self.deadline {
            self.deadline = deadline;
            if let Some(at) = deadline {
                self.timer
                    .as_mut()
                    .reset(tokio::time::Instant::from_std(at));
            }
        }
    }

    /// Requests are held while an on-demand unit's server is idle,
    /// starting, or stopping (to be started again): they are sent once it
    /// is up, and fail with the outage error once it cannot be (its start
    /// failed, or it was stopped).
    fn update_hold(&mut self) {
        let state = self.status.borrow().state;
        let hold = self.on_demand
            && matches!(
                state,
                State::Idle | State::Starting | State::Running | State::Stopping
            );
        let outs = self.router.hold(hold);
        self.deliver(outs, None);
    }

    /// A request waits for an idle server: ask the actor to start it
    /// (a start under way already is left alone).
    fn demand_if_held(&mut self) {
        if self.upstream.is_none() && self.router.holding() {
            let _ = self.events.send(Internal::Demand);
        }
    }
}
