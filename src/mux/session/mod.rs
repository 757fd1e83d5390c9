//! The host sessions of a unit, as a pure core (DESIGN §8): every decision
//! about the hosts attached to one unit and the upstream of its current
//! generation, as a function of the core's state, one input, the time it
//! is handed and the unit's facts, returning [`Out`]s. No I/O, no tasks,
//! no clock, no randomness: the driver (`supervisor::sessions`) reads the
//! hosts' and the server's lines, feeds them in, and carries out what
//! comes back (writes to a host or the server, the actor's notices, the
//! call log, the ledger of a handed-over bridge, the journal).
//!
//! What the router ([`route`](super::route)) does not decide is decided
//! here, where the unit's state is known:
//!
//! - `initialize` is answered by mcpd with the server's own result and the
//!   negotiated protocol version (waiting for the first generation while
//!   the server is starting: [`opening`]);
//! - `tools/list` is answered from the published list (the unit's filter
//!   applied, kept through outages), and hosts get `list_changed` once it
//!   changed, after mcpd re-synced it;
//! - the resource, template and prompt lists are read by the list reader
//!   and answered from what is kept ([`lists`]);
//! - `tools/call` of a filtered tool is refused; every call is accounted
//!   ([`Out::Call`]);
//! - `roots/list` is answered from the unit's `roots` when it has any;
//! - requests while the upstream is down get the outage error (§3), but
//!   those that need an on-demand unit's server (DESIGN §9) are held while
//!   it starts, and start it when it is idle ([`Notice::Demand`]);
//! - a host of MCP 2026-07-28 ([`modern`]) and a server of it
//!   ([`upstream`]) each get their era;
//! - bounds: [`MAX_SESSIONS`] per unit, [`MAX_IN_FLIGHT`] requests per
//!   host and [`MAX_UNIT_IN_FLIGHT`] per unit, `max-request-size`, the
//!   `initialize` deadline, [`BACKLOG`] lines held per host, and what
//!   waits toward the server ([`toward`]: a host slowed, then shed, past
//!   its share).
//!
//! mcpd's own requests (tool syncs, D-Bus `CallTool`, probes) go through
//! the same router ([`Core::request`]), so their ids never collide with
//! hosts'. [`classify`] says what a host's line is to its session.

mod classify;
mod hosts;
pub mod lanes;
mod lists;
mod modern;
mod opening;
mod server;
pub mod toward;
pub mod upstream;

pub use classify::*;

use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use serde_json::{Value, json};

use super::era;
use super::error::ErrorCode;
use super::lists::List;
use super::message::{Message, RequestId};
use super::method::Method;
use super::route::{HostId, Router};
use super::wire::Frame;
use crate::unit::ToolFilter;

use lists::Cache;
use opening::Waiting;

/// A generation of the unit's server (the supervisor's count of starts).
pub type Gen = u64;

/// Messages queued for one host: a host this far behind is not reading,
/// and is detached.
pub const QUEUE: usize = 4096;

/// Bytes queued for one host behind the message being written: a host
/// this far behind is not reading (300 answers of 8 MiB once held the
/// daemon at 4 GB), and is detached.
pub const QUEUE_BYTES: usize = 32 << 20;

/// Requests one host may have in flight upstream.
pub const MAX_IN_FLIGHT: usize = 1024;

/// Requests all the host sessions of one unit may have in flight upstream
/// together.
pub const MAX_UNIT_IN_FLIGHT: usize = 4096;

/// Host sessions one unit may have at once.
pub const MAX_SESSIONS: usize = 512;

/// How long a host session may take to send `initialize` after it
/// attached, unless the daemon was told otherwise: a connection that says
/// nothing is not kept for ever.
pub const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a server last used at `used`, with a request in flight or not
/// (`busy`), is idle at `cutoff` (the instant its `idle-stop` deadline
/// passed, less `idle-stop`): the one rule of idleness, which the
/// supervisor's machine applies to what the sessions report and the
/// sessions apply as they report it ([`Core::settle`]).
pub fn idle(used: Instant, busy: bool, cutoff: Instant) -> bool {
    !busy && used <= cutoff
}

/// The state of the unit as the sessions need it (its supervisor's
/// `State`, said again here, below the supervisor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitState {
    Starting,
    Running,
    Idle,
    Retrying,
    Reconnecting,
    Failed,
    Stopping,
    Stopped,
    /// No usable login (DESIGN §17): requests are answered at once with
    /// the login hint; the kept lists stay.
    NeedsLogin,
}

/// What the sessions know of their unit besides their own state,
/// refreshed by the driver as the unit's status changes.
#[derive(Debug, Clone)]
pub struct Facts {
    pub state: UnitState,
    /// Raised each time the published tools change.
    pub tools_serial: u64,
    /// The published tools, a JSON array (the unit's filter applied).
    pub tools: Arc<str>,
    /// Why a call cannot be made now, as the unit's status says it
    /// (its state, last error and next retry).
    pub not_running: String,
}

impl Default for Facts {
    fn default() -> Self {
        Self {
            state: UnitState::Stopped,
            tools_serial: 0,
            tools: Arc::from("[]"),
            not_running: String::new(),
        }
    }
}

/// What the host sessions take from the unit's spec.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `tools { allow …; deny …; }`.
    pub filter: ToolFilter,
    /// `roots`, answered to the server's `roots/list`.
    pub roots: Vec<String>,
    /// `start "on-demand"`: requests wait for the server to start.
    pub on_demand: bool,
    /// `startup-timeout`: how long a read of a list may take.
    pub list_timeout: Duration,
    /// `max-request-size`: the largest request a host may send.
    pub max_request_size: u64,
    /// The sessions of one instance of a per-host unit (DESIGN §13): the
    /// upstream declares its host's capabilities, and a host that
    /// declared `roots` is asked for them by the server.
    pub instance: bool,
}

/// The daemon's tunables the sessions apply.
#[derive(Debug, Clone, Copy)]
pub struct Tunables {
    /// How long a host may take to send `initialize` once attached.
    pub initialize_timeout: Duration,
    /// How long a modern host has to retry a call answered
    /// `input_required`.
    pub input_timeout: Duration,
}

impl Default for Tunables {
    fn default() -> Self {
        Self {
            initialize_timeout: INITIALIZE_TIMEOUT,
            input_timeout: era::INPUT_TIMEOUT,
        }
    }
}

/// What mcpd's own request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// On a client's behalf (D-Bus `CallTool`, `ReadResource`): a use of
    /// the server, held while an on-demand server starts.
    Use,
    /// mcpd's own bookkeeping (a tool-list sync).
    Sync,
    /// A liveness probe: its answer is not a sign of life (the machine
    /// judges it by its timeout).
    Probe,
}

/// Who waits for the answer to mcpd's own request.
#[derive(Debug)]
enum Waiter {
    /// A request of mcpd's (`Purpose`), answered to its token.
    Own(Purpose, u64),
    /// A page of a kept list.
    Page(List),
}

/// A `tools/call` being made: accounted when it ends ([`Out::Call`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub tool: String,
    pub started: Instant,
}

/// How a host arrives.
#[derive(Debug, Default)]
pub struct Arrival {
    /// An `initialize` of an earlier session (the daemon restarted under
    /// its bridge): handled first, its answer not sent.
    pub replay: Option<Value>,
    /// Its stdio was handed over to the daemon: its bridge keeps its
    /// `initialize` (to replay) and is told why the session ends.
    pub bridged: bool,
    /// Its requests read and not answered are kept in a ledger, for its
    /// bridge.
    pub ledger: bool,
    /// Its `initialize` is refused with this (a per-host unit at its
    /// `max-instances`): nothing else happens.
    pub refused: Option<Arc<str>>,
    /// It can be made to wait ([`Out::Slow`]): its link is a descriptor
    /// whose writer blocks once the daemon stops reading it.
    pub pausable: bool,
}

/// How a message to a host is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An answer, or a request of the server's: never dropped.
    Kept,
    /// A notification: dropped (and counted) while the host is behind,
    /// if it may be.
    Notification,
}

/// The level of a journal line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// What the actor is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Generation `generation`'s connection was lost.
    Closed { generation: Gen, error: String },
    /// A request waits for the server (DESIGN §9): start it.
    Demand,
    /// A kept list of generation `generation` could not be read (the
    /// sessions logged it).
    ListFailed { generation: Gen, error: String },
    /// The tools are to be read again (the server said `list_changed`, or
    /// their TTL passed).
    ToolsChanged { generation: Gen },
}

/// What the sessions publish for the unit's handle (D-Bus, `status`).
#[derive(Debug, Clone, PartialEq)]
pub enum Publish {
    /// A kept list (`List::KEPT`), as a JSON array, or none.
    List(List, Option<Arc<str>>),
    /// Every list of generation `Gen` has been read (or failed to be).
    Listed(Gen),
    /// The protocol version the server speaks, and which eras
    /// (DESIGN §12: whether it gets a lane per era).
    Protocol(Option<Arc<str>>, lanes::Upstream),
    /// The capabilities a host declared (for an instance's upstream).
    Declared(Value),
    /// A host session fixed its protocol version (`true`) or ended with
    /// one (`false`).
    Version(&'static str, bool),
    /// Host sessions attached now, and whether one just arrived.
    Presence { attached: usize, arrived: bool },
}

/// An output of the core, carried out by the driver in order.
#[derive(Debug)]
pub enum Out {
    /// A message to host `host`, made for its era.
    Host {
        host: HostId,
        message: Message,
        kind: Kind,
        /// The host speaks MCP 2026-07-28 (no log notice of dropped
        /// notifications: it asks for log messages per request).
        modern: bool,
    },
    /// A line mcpd made, to host `host`.
    Bytes(HostId, Vec<u8>),
    /// A message to the server of the current generation.
    Server(Message),
    /// The upstream is let go (lost, down, or idle): its reader stops.
    Release,
    /// The answer to mcpd's own request `token`, or why there is none.
    Reply {
        token: u64,
        answer: Result<Message, String>,
    },
    /// Host session `host` ended: because of `why` if it is not its own
    /// doing, `counted` among the detached sessions if it misbehaved. A
    /// bridge is told why.
    Ended {
        host: HostId,
        why: Option<String>,
        counted: bool,
    },
    /// A bridge keeps its host's `initialize`, to replay it to a new
    /// daemon.
    Remember {
        host: HostId,
        initialize: Value,
    },
    /// Host `host`'s request (its id's JSON text) is recorded in its
    /// bridge's ledger (`true`), or cleared from it.
    Ledger {
        host: HostId,
        id: Box<str>,
        record: bool,
    },
    /// A call of host `host` ended so.
    Call {
        host: HostId,
        call: Call,
        outcome: Outcome,
    },
    /// Tell the actor.
    Notice(Notice),
    /// The server sent a sign of life at this instant.
    Heard(Instant),
    /// A line for the journal (`target: mcpd::sessions`).
    Log {
        level: Level,
        host: Option<HostId>,
        text: String,
    },
    /// The server's log message (`notifications/message`), for the
    /// journal within the unit's `log-rate-limit`.
    ServerLog(Message),
    /// The server failed (`why`) with requests of these hosts in flight
    /// (how many each): logged with who they are.
    Blame {
        why: String,
        whose: Vec<(HostId, usize)>,
    },
    Publish(Publish),
    /// Host `host` is to be read no more (`true`) until told otherwise:
    /// enough of what it sent waits toward the server ([`toward`]).
    Slow {
        host: HostId,
        slow: bool,
    },
    /// Host `host`'s notification was dropped (`request` false), or its
    /// request refused, past its share of what may wait toward the server.
    Shed {
        host: HostId,
        request: bool,
    },
}

/// One attached host, without its I/O.
#[derive(Debug)]
struct Host {
    /// The id of a replayed `initialize`, whose answer the host must not
    /// see.
    swallow: Option<Value>,
    bridged: bool,
    ledger: bool,
    /// Answered its `initialize`.
    initialized: bool,
    /// What it sent while its `initialize` waits for the first
    /// generation, handled in order once it is answered.
    held: Vec<Frame>,
    /// Its `tools/call`s in flight, by its request id.
    calls: HashMap<RequestId, Call>,
    /// When it attached, until it sends `initialize`.
    uninitialized: Option<Instant>,
    /// It speaks MCP 2026-07-28: what mcpd keeps for that.
    modern: Option<Box<modern::Modern>>,
    /// It speaks MCP 2025: what mcpd keeps to translate its requests for
    /// a server of MCP 2026-07-28.
    translated: Option<Box<upstream::Translated>>,
    /// The version its session speaks, once fixed.
    version: Option<&'static str>,
    /// Its `initialize` is refused with this.
    refused: Option<Arc<str>>,
    /// It can be made to wait ([`Out::Slow`]).
    pausable: bool,
    /// Notifications dropped and requests refused since it was last let
    /// through ([`toward`]): said in the journal once it is.
    shed: Option<(u64, u64)>,
}

/// The decision state of a unit's host sessions.
pub struct Core {
    name: Arc<str>,
    router: Router,
    hosts: HashMap<HostId, Host>,
    next_host: HostId,
    /// The generation whose upstream is established.
    upstream: Option<Gen>,
    /// The server's `initialize` result (the newest generation's).
    init: Option<Arc<Value>>,
    /// Hosts whose `initialize` (or `server/discover`) waits for the
    /// first generation.
    waiting: Vec<Waiting>,
    /// A modern server: what mcpd's listen stream holds, its id, and the
    /// ids mcpd gave its streams and its questions to 2025 hosts.
    listened: upstream::Listened,
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
    /// Their tokens → upstream id.
    tokens: HashMap<u64, u64>,
    /// The resource, template and prompt lists, as published.
    lists: [Option<Arc<str>>; 3],
    /// Their reads.
    caches: [Cache; 3],
    /// The generation whose first reads of the lists are under way.
    reading_for: Option<Gen>,
    /// The tools' caching hints and when they were read (or last asked to
    /// be read again).
    tools_fresh: Option<(era::CacheHint, Instant)>,
    /// The capabilities of the last host `initialize`.
    declared: Option<Value>,
    facts: Facts,
    /// The tools serial hosts were last told about.
    serial: u64,
    /// The server said its tools changed, and the re-sync that follows is
    /// not done: hosts hear `list_changed` once it is, whether or not the
    /// list it read differs (as they would from the server directly).
    tools_owed: bool,
    settings: Settings,
    tunables: Tunables,
    /// A source of nonces for modern sessions' `requestState`s.
    nonces: Box<dyn FnMut() -> u128 + Send>,
    /// The last use: a request of a host or client sent or answered.
    used: Instant,
    /// The time of the input being handled.
    now: Instant,
    /// Hosts to detach once the current message is handled.
    doomed: Vec<(HostId, &'static str)>,
    /// What waits toward the server, by host.
    toward: toward::Toward,
    /// The host whose message is being handled ([`toward::MCPD`] for
    /// mcpd's own): what is sent the server meanwhile is counted as its.
    sender: HostId,
    /// The earliest deadline of the list reads under way, of the hosts
    /// that have not sent `initialize` yet and of parked calls.
    deadline: Option<Instant>,
    outs: Vec<Out>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("name", &self.name)
            .field("hosts", &self.hosts.len())
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

impl Core {
    /// The sessions of unit `name`, with no host and no upstream, at `now`.
    pub fn new(
        name: &str,
        settings: Settings,
        tunables: Tunables,
        facts: Facts,
        nonces: Box<dyn FnMut() -> u128 + Send>,
        now: Instant,
    ) -> Self {
        Self {
            name: Arc::from(name),
            router: Router::new(),
            hosts: HashMap::default(),
            next_host: 0,
            upstream: None,
            init: None,
            waiting: Vec::new(),
            listened: Default::default(),
            listen: None,
            next_listen: 0,
            next_down: 0,
            replaying: false,
            modern_up: false,
            own: HashMap::default(),
            tokens: HashMap::default(),
            lists: Default::default(),
            caches: Default::default(),
            reading_for: None,
            tools_fresh: None,
            declared: None,
            serial: facts.tools_serial,
            tools_owed: false,
            facts,
            settings,
            tunables,
            nonces,
            used: now,
            now,
            doomed: Vec::new(),
            toward: toward::Toward::default(),
            sender: toward::MCPD,
            deadline: None,
            outs: Vec::new(),
        }
    }

    /// What the inputs handled since the last call produced, in order.
    pub fn take(&mut self) -> Vec<Out> {
        std::mem::take(&mut self.outs)
    }

    /// Hands back an emptied vector of outputs, for its room.
    pub fn recycle(&mut self, mut outs: Vec<Out>) {
        if self.outs.is_empty() {
            outs.clear();
            self.outs = outs;
        }
    }

    fn out(&mut self, out: Out) {
        match &out {
            Out::Server(message) => self.toward.sent(self.sender, message.received()),
            Out::Release => {
                // Nothing waits for a new upstream: every slowed host is
                // read again.
                self.outs.push(out);
                self.toward.clear();
                self.resume_slowed();
                return;
            }
            _ => {}
        }
        self.outs.push(out);
    }

    /// The upstream's queue holds `messages` (the one being written
    /// included), as the driver reads it before each input and after
    /// carrying out outputs: hosts slowed until then are read again once
    /// half of theirs is written.
    pub fn server_waiting(&mut self, messages: usize) {
        if self.toward.waiting(messages) {
            self.resume_slowed();
        }
    }

    /// Whether a host is slowed, waiting for the upstream's queue to
    /// drain (the driver then tells the core as it drains).
    pub fn slowed(&self) -> bool {
        self.toward.any_slowed()
    }

    /// Messages and bytes waiting toward the server, as the core counts
    /// them.
    pub fn toward_server(&self) -> (usize, usize) {
        self.toward.total()
    }

    fn resume_slowed(&mut self) {
        let mut go = Vec::new();
        self.toward.resume(&mut go);
        for host in go {
            if self.hosts.contains_key(&host) {
                self.outs.push(Out::Slow { host, slow: false });
            }
        }
    }

    fn log(&mut self, level: Level, host: Option<HostId>, text: String) {
        self.out(Out::Log { level, host, text });
    }

    /// The earliest instant [`Core::tick`] is due, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// When the server was last used.
    pub fn used(&self) -> Instant {
        self.used
    }

    /// How many host sessions are attached.
    pub fn hosts(&self) -> usize {
        self.hosts.len()
    }

    /// The generation whose upstream is established, if one is.
    pub fn upstream(&self) -> Option<Gen> {
        self.upstream
    }

    /// Whose request upstream request `up` is: a host's, and the id it
    /// gave it (for the driver's telemetry).
    pub fn owner(&self, up: u64) -> Option<(HostId, &RequestId)> {
        self.router.owner(up)
    }

    /// The server's id of the request mcpd sent host `host` as `down`, if
    /// it was one of the server's (for the driver's telemetry).
    pub fn asked(&self, host: HostId, down: u64) -> Option<&RequestId> {
        self.router.asked(host, down)
    }

    /// The protocol version host `host`'s session speaks, once fixed.
    pub fn host_version(&self, host: HostId) -> Option<&'static str> {
        self.hosts.get(&host).and_then(|h| h.version)
    }

    /// The id the next host will have.
    pub fn next_host(&self) -> HostId {
        self.next_host + 1
    }

    /// The unit's settings changed.
    pub fn configure(&mut self, settings: Settings, now: Instant) {
        self.now = now;
        self.settings = settings;
        self.update_hold();
    }

    /// The unit's facts are now `facts`, its change not handled yet (the
    /// driver hands in the newest facts before each input, so that every
    /// decision is made by the unit's newest state; [`Core::status`]
    /// handles the change itself).
    pub fn refresh(&mut self, facts: Facts) {
        self.facts = facts;
    }

    /// The unit's status changed (`facts`): hosts are told of changed
    /// tools, lists are withdrawn from a unit that failed or stopped, and
    /// requests held or let go.
    pub fn status(&mut self, facts: Facts, now: Instant) {
        self.now = now;
        self.facts = facts;
        self.status_changed();
    }

    /// The tools were read at `at` with these caching hints.
    pub fn tools_read(&mut self, hint: era::CacheHint, at: Instant) {
        self.tools_fresh = Some((hint, at));
    }

    /// A re-sync of the tools is published, as tools serial `serial`. If
    /// the server had said they changed, hosts hear `list_changed` now
    /// when the list came back as they have it (a list that differs is
    /// told by [`Core::status_changed`] once the serial reaches it), so
    /// one `list_changed` of the server's is one to hosts; a re-read of
    /// mcpd's own (a TTL that passed) tells them only of a list that
    /// differs.
    pub fn tools_synced(&mut self, serial: u64) {
        if std::mem::take(&mut self.tools_owed) && serial == self.serial {
            self.broadcast(Method::ToolsListChanged);
        }
    }

    /// Generation `generation` is established; its server's `initialize`
    /// result is `init`.
    pub fn up(&mut self, generation: Gen, init: Arc<Value>, now: Instant) {
        self.now = now;
        self.upstream = Some(generation);
        let offered: Vec<List> = List::KEPT
            .into_iter()
            .filter(|k| init["capabilities"].get(k.capability()).is_some())
            .collect();
        self.set_init(init);
        // The actor published this generation's tools before handing it
        // over: hosts attached already are told now if they differ; hosts
        // answered from now on have them.
        let serial = self.facts.tools_serial;
        self.tools_owed = false;
        if serial != self.serial {
            self.serial = serial;
            self.broadcast(Method::ToolsListChanged);
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
                self.broadcast(kind.notification());
            }
        }
        self.reading_for = Some(generation);
        self.check_listed();
        for waiting in std::mem::take(&mut self.waiting) {
            self.opened(waiting);
        }
        self.ask_roots();
        self.settle_doomed();
    }

    /// Generation `generation` is being taken down, because of `lost` if
    /// it failed: requests in flight are answered with that.
    pub fn down(&mut self, generation: Gen, lost: Option<String>, now: Instant) {
        self.now = now;
        if self.upstream == Some(generation) {
            self.upstream = None;
            self.out(Out::Release);
            if let Some(why) = &lost {
                self.blame(why);
            }
            let outs = self.router.upstream_lost();
            self.deliver(outs, lost.as_deref());
        }
        self.settle_doomed();
    }

    /// Generation `generation`'s connection failed or ended (`why`).
    pub fn lost(&mut self, generation: Gen, why: String, now: Instant) {
        self.now = now;
        self.blame(&why);
        self.upstream = None;
        self.out(Out::Release);
        self.out(Out::Notice(Notice::Closed {
            generation,
            error: why.clone(),
        }));
        let outs = self.router.upstream_lost();
        self.deliver(outs, Some(&why));
        self.settle_doomed();
    }

    /// mcpd's own request `method` (`token`, for `purpose`).
    pub fn request(
        &mut self,
        token: u64,
        method: &str,
        params: Value,
        purpose: Purpose,
        now: Instant,
    ) {
        self.now = now;
        if purpose != Purpose::Use && self.upstream.is_none() {
            // Bookkeeping is for a running server: it never waits for (or
            // causes) a start.
            let answer = Err(self.down_text(None));
            self.out(Out::Reply { token, answer });
            return;
        }
        if purpose == Purpose::Use {
            self.used = now;
        }
        let (id, outs) = self.router.request(method, params);
        self.own.insert(id, Waiter::Own(purpose, token));
        self.tokens.insert(token, id);
        self.deliver(outs, None);
        self.demand_if_held();
        self.settle_doomed();
    }

    /// mcpd's own request `token` is no longer waited for: cancelled
    /// upstream.
    pub fn cancel(&mut self, token: u64, now: Instant) {
        self.now = now;
        if let Some(id) = self.tokens.remove(&token) {
            self.own.remove(&id);
            let outs = self.router.cancel(id);
            self.deliver(outs, None);
        }
        self.settle_doomed();
    }

    /// An idle on-demand unit's `initialize` result and lists, from its
    /// cache: answered to hosts until its server runs.
    pub fn restore(&mut self, init: Arc<Value>, lists: [Option<Arc<str>>; 3]) {
        if self.init.is_none() {
            self.set_init(init);
        }
        for (kind, list) in List::KEPT.into_iter().zip(lists) {
            if list.is_some() && self.cached(kind).is_none() {
                self.set_list(kind, list);
            }
        }
    }

    /// A per-host unit's lists, learnt from its newest instance: they
    /// replace what is kept (the `initialize` result too, unless a
    /// generation of the unit's own is up).
    pub fn adopt(&mut self, init: Arc<Value>, lists: [Option<Arc<str>>; 3]) {
        if self.upstream.is_none() {
            self.set_init(init);
        }
        for (kind, list) in List::KEPT.into_iter().zip(lists) {
            self.set_list(kind, list);
        }
    }

    /// When the server was last used, and whether a request is in flight;
    /// with neither since `cutoff` (the rule of the machine's `idle`),
    /// generation `generation` is idle: the sessions stop sending to it
    /// at once.
    pub fn settle(&mut self, generation: Gen, cutoff: Instant, now: Instant) -> (Instant, bool) {
        self.now = now;
        let busy = self.router.hosts_busy()
            || self
                .own
                .values()
                .any(|w| matches!(w, Waiter::Own(Purpose::Use, _)));
        if idle(self.used, busy, cutoff) && self.upstream == Some(generation) {
            // Idle: the machine stops it now. Only mcpd's own bookkeeping
            // can be in flight; it is not worth a start.
            self.upstream = None;
            self.out(Out::Release);
            let outs = self.router.upstream_lost();
            self.deliver(outs, Some("the server is stopping after idle-stop"));
        }
        self.settle_doomed();
        (self.used, busy)
    }

    /// Every host session ends, told `why`.
    pub fn end_all(&mut self, why: &str, now: Instant) {
        self.now = now;
        let hosts: Vec<HostId> = self.hosts.keys().copied().collect();
        for host in hosts {
            self.end(host, Some(why), false);
        }
    }

    /// The timer fired at `now`: list reads, hosts that sent no
    /// `initialize` and parked calls past their deadline.
    pub fn tick(&mut self, now: Instant) {
        self.now = now;
        self.deadline = None;
        self.lists_expired();
        self.uninitialized_expired();
        self.inputs_expired();
        self.arm();
        self.settle_doomed();
    }

    /// The unit is gone (or the daemon stopping): what hosts sent that was
    /// not handled yet (`queued`, read and not handled) gets the outage
    /// error, not silence; calls in flight are abandoned.
    pub fn closing(&mut self, queued: Vec<(HostId, Frame)>) {
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
        let mut hosts: Vec<HostId> = self.hosts.keys().copied().collect();
        hosts.sort_unstable();
        for host in hosts {
            self.abandon_calls(host);
        }
    }

    /// An instance's server (DESIGN §13) was given no roots in its
    /// handshake (its host had not been answered yet): once its host
    /// declared `roots`, the server is told they changed, and asks the
    /// host itself.
    fn ask_roots(&mut self) {
        let declared = self
            .declared
            .as_ref()
            .is_some_and(|c| c.get("roots").is_some());
        if !(self.settings.instance && declared && self.settings.roots.is_empty()) {
            return;
        }
        if self.upstream.is_some() {
            let notice = json!({"jsonrpc": "2.0", "method": Method::RootsListChanged.as_str()});
            self.out(Out::Server(notice.into()));
        }
    }

    /// The server's `initialize` result (or discovery, kept as one) of the
    /// newest generation, and the version it speaks for `ProtocolVersion`.
    fn set_init(&mut self, init: Arc<Value>) {
        let protocol = init["protocolVersion"].as_str().map(Arc::from);
        let upstream = lanes::Upstream::of(Some(&init));
        self.out(Out::Publish(Publish::Protocol(protocol, upstream)));
        self.modern_up = era::is_modern(&init);
        self.init = Some(init);
    }

    /// The capabilities a host declared.
    fn declare(&mut self, caps: Value) {
        self.declared = Some(caps.clone());
        self.out(Out::Publish(Publish::Declared(caps)));
    }

    fn status_changed(&mut self) {
        let (serial, state) = (self.facts.tools_serial, self.facts.state);
        self.update_hold();
        if serial != self.serial {
            self.serial = serial;
            self.tools_owed = false;
            self.broadcast(Method::ToolsListChanged);
        }
        if matches!(state, UnitState::Failed | UnitState::Stopped) {
            // Withdrawn with the tools.
            for kind in List::KEPT {
                self.caches[kind.index()] = Cache::default();
                let old = self.set_list(kind, None);
                if old.is_some_and(|l| &*l != "[]") {
                    self.broadcast(kind.notification());
                }
            }
        }
        if let Some(text) = self.cannot_open().filter(|_| !self.waiting.is_empty()) {
            // Their start failed or the unit gave up: told now, not after
            // every retry.
            for w in std::mem::take(&mut self.waiting) {
                if w.discover {
                    self.send(w.host, ErrorCode::ServerDown.response(&w.id, text.clone()));
                    self.release_held(w.host);
                } else {
                    self.refuse_initialize(w.host, &w.id, &w.params);
                }
            }
        }
        self.settle_doomed();
    }

    /// Sends notification `method` to every initialized host (a modern
    /// host: on each of its listen streams that opted in to it).
    fn broadcast(&mut self, method: Method) {
        let method = method.as_str();
        let bytes = super::wire::line(&json!({"jsonrpc": "2.0", "method": method}));
        let mut ready: Vec<(HostId, bool)> = self
            .hosts
            .iter()
            .filter(|(_, h)| h.initialized)
            .map(|(id, h)| (*id, h.modern.is_some()))
            .collect();
        ready.sort_unstable();
        for (host, modern) in ready {
            if modern {
                self.notice_modern(host, method);
            } else {
                self.send_bytes(host, bytes.clone());
            }
        }
    }

    /// Sets the deadline for the earliest of the list reads under way, the
    /// hosts that have not sent `initialize` and the parked calls (none:
    /// no deadline).
    fn arm(&mut self) {
        let reads = self.caches.iter().filter_map(Cache::deadline);
        let timeout = self.tunables.initialize_timeout;
        let hosts = self
            .hosts
            .values()
            .filter_map(|h| h.uninitialized.map(|since| since + timeout));
        let inputs = self
            .hosts
            .values()
            .filter_map(|h| h.modern.as_ref().and_then(|m| m.deadline()));
        self.deadline = reads.chain(hosts).chain(inputs).min();
    }

    /// Requests are held while an on-demand unit's server is idle,
    /// starting, or stopping (to be started again): they are sent once it
    /// is up, and fail with the outage error once it cannot be (its start
    /// failed, or it was stopped).
    fn update_hold(&mut self) {
        let hold = self.settings.on_demand
            && matches!(
                self.facts.state,
                UnitState::Idle | UnitState::Starting | UnitState::Running | UnitState::Stopping
            );
        let outs = self.router.hold(hold);
        self.deliver(outs, None);
    }

    /// A request waits for an idle server: ask the actor to start it
    /// (a start under way already is left alone).
    fn demand_if_held(&mut self) {
        if self.upstream.is_none() && self.router.holding() {
            self.out(Out::Notice(Notice::Demand));
        }
    }

    /// Hosts found misbehaving while the input was handled are detached.
    fn settle_doomed(&mut self) {
        while let Some((host, why)) = self.doomed.pop() {
            self.detach(host, Some(why));
        }
    }
}
