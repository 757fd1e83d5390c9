//! The actor: one task per unit that owns its [`Machine`], its generations'
//! resources and its read model.
//!
//! It waits (no polling) on operator commands, events from its generations'
//! tasks (connected, closed, exited, list_changed, sync done) and the
//! machine's earliest named deadline; feeds them to the machine; performs the
//! effects; and publishes the [`Status`] on a `watch` channel. Tool-list
//! syncs are serialized here: one in flight at a time, a burst of
//! `list_changed` coalesces into one more sync after it.
//!
//! Syncs begin at least `SYNC_SPACING` apart, so a `list_changed` storm costs
//! a few reads a second. The machine's probes are sent through the unit's
//! host sessions (`ping`, or `server/discover` to a server of 2026-07-28),
//! bounded by `health.timeout`; an error answer counts as alive. The
//! actor's own requests (tool syncs, D-Bus `CallTool`) go through the host
//! sessions too. For an on-demand unit it reads the cache when armed, steps
//! `Demand` for a D-Bus call that finds it idle (after the filter and "no
//! such tool" checks, which never start it), and writes the cache, one
//! write at a time and only when it changed, once an established
//! generation's lists are all read. An instance's actor reports what its
//! generation learned to its unit's actor (`Command::Learned`), which adopts
//! the newest instance's lists as the unit's.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use std::sync::Arc;

use rmcp::model::{CallToolResult, JsonObject};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::unit::UnitSpec;

use super::accounting::Counters;
use super::cache::CacheFile;
use super::clock::{Clock, now};
use super::events::Internal;
use super::launch::{ConnectError, SharedLauncher};
use super::machine::{Effect, Event, Gen, Machine, State, Timer, View};
use super::sessions::{Sessions, Settings};
use super::status::{CallError, Status};
use super::upstream::{self, Handshake};
use crate::mux::lists::List;
use crate::mux::method::Method;

/// What the handle asks of the actor.
#[derive(Debug)]
pub(crate) enum Command {
    /// The daemon loaded the unit ([`Event::Arm`]).
    Arm,
    Start,
    Stop,
    Restart,
    /// A login completed ([`Event::LoggedIn`]).
    LoggedIn,
    Apply {
        spec: Box<UnitSpec>,
        restart: bool,
    },
    Call {
        name: String,
        arguments: Option<JsonObject>,
        timeout: Duration,
        reply: oneshot::Sender<Result<CallToolResult, CallError>>,
    },
    /// Stop, wait until quiescent, then end the actor.
    Shutdown,
    /// Instance `n` of this per-host unit learnt these lists (None: it
    /// has ended); the newest instance's are the unit's (DESIGN §13).
    Learned {
        n: u32,
        learned: Option<Arc<Learned>>,
    },
}

/// What an established generation of a per-host unit's instance says:
/// its `initialize` result, its tools (before the unit's filter), its
/// instructions and its resource, template and prompt lists. Shared
/// (`Arc`s) with the instance that learnt it.
#[derive(Debug, PartialEq)]
pub(crate) struct Learned {
    init: Arc<Value>,
    tools: super::machine::ToolList,
    instructions: Option<String>,
    lists: [Option<Arc<str>>; 3],
}

/// An instance's way to tell its unit what it learnt: its number and
/// the unit's actor (held weakly: an instance does not keep its unit's
/// actor alive), and what it told last.
struct Reporter {
    n: u32,
    unit: mpsc::WeakUnboundedSender<Command>,
    last: Option<Arc<Learned>>,
}

impl Reporter {
    fn send(&self, learned: Option<Arc<Learned>>) {
        if let Some(unit) = self.unit.upgrade() {
            let _ = unit.send(Command::Learned { n: self.n, learned });
        }
    }
}

/// A generation's live resources (its connection, once established,
/// belongs to the host sessions).
#[derive(Default)]
struct Resources {
    pid: Option<u32>,
    connect: Option<JoinHandle<()>>,
}

pub(crate) struct Actor {
    name: String,
    spec: UnitSpec,
    machine: Machine,
    launcher: SharedLauncher,
    /// Operator commands from the handle(s).
    commands: mpsc::UnboundedReceiver<Command>,
    /// Events from generation tasks; the sender is cloned into each task.
    internal_tx: mpsc::UnboundedSender<Internal>,
    internal_rx: mpsc::UnboundedReceiver<Internal>,
    /// The read model, for every subscriber.
    status: watch::Sender<Status>,
    /// The host sessions, and the established generation's connection.
    sessions: Sessions,
    gens: HashMap<Gen, Resources>,
    /// The one tool sync in flight, if any.
    sync: Option<(Gen, JoinHandle<()>)>,
    /// A list_changed arrived while a sync (or the initial list) was in
    /// flight, or too soon after the last sync began.
    sync_dirty: bool,
    /// When the last sync began: the next waits [`SYNC_SPACING`].
    sync_began: Option<Instant>,
    /// The throttled sync waits until then.
    sync_at: Option<Instant>,
    exiting: bool,
    last_logged: Option<(State, String, bool)>,
    /// The generation whose error answer to `ping` was logged.
    ping_refused: Option<Gen>,
    clock: Clock,
    /// Where on-demand units keep their caches (DESIGN §9); None: nowhere.
    cache_dir: Option<std::path::PathBuf>,
    cache: Cache,
    /// A per-host unit's instances' lists, by instance number: the
    /// newest's are published as the unit's (DESIGN §13).
    learned: std::collections::BTreeMap<u32, Arc<Learned>>,
    /// The lists published from there last, with the tool and list
    /// serials they left: another change (the unit's own generation's
    /// lists) has them published again.
    adopted: Option<(Arc<Learned>, u64, [u64; 3])>,
    /// An instance's: where it tells its unit what it learnt.
    report: Option<Reporter>,
}

/// The cache of an on-demand unit, and its writes: one at a time, the
/// newest state written after the one in flight, an unchanged one not
/// at all.
struct Cache {
    /// The unit's file, while it is on demand.
    file: Option<CacheFile>,
    /// The established generation's `initialize` result.
    init: Option<Arc<Value>>,
    /// The digest of the text last written (or read), or being written.
    written: Option<u64>,
    /// A write is in flight.
    busy: bool,
    /// The state changed while it was.
    dirty: bool,
    /// The sessions' list serials, and the generation whose lists they
    /// have all read: a state is written only once it is this
    /// generation's, never one with the lists of the last.
    lists: watch::Receiver<[u64; 3]>,
    listed: watch::Receiver<Gen>,
}

/// Waits for a change of the sessions' lists (or for ever once they end).
async fn lists_changed(cache: &mut Cache) {
    let changed = tokio::select! {
        changed = cache.lists.changed() => changed,
        changed = cache.listed.changed() => changed,
    };
    if changed.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A unit's login and its summary's changes.
type LoginWatch = Option<(
    Arc<super::oauth::Login>,
    watch::Receiver<super::oauth::Summary>,
)>;

/// Waits until the login is lost (its token refused or forgotten), or
/// for ever for a unit without one.
async fn login_lost(login: &mut LoginWatch) {
    let Some((_, summary)) = login else {
        return std::future::pending().await;
    };
    loop {
        // Only a login held and then lost: a failed login's note changes
        // the summary of a unit that held none.
        let held = summary.borrow_and_update().logged_in;
        if summary.changed().await.is_err() {
            return std::future::pending().await;
        }
        if held && !summary.borrow().logged_in {
            return;
        }
    }
}

/// Tool-list re-syncs of one server begin at least this far apart: a
/// `list_changed` storm costs ten reads a second (DESIGN §3, invariant 10).
pub(crate) const SYNC_SPACING: Duration = Duration::from_millis(100);

pub(crate) fn status_of(view: &View, clock: &Clock) -> Status {
    view.clone().at(|at| clock.wall(at))
}

/// Waits until `at`, or for ever.
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// Waits for the machine's deadline; returns which timer it was.
async fn sleep_until(deadline: Option<(Timer, Instant)>) -> Timer {
    match deadline {
        Some((timer, at)) => {
            super::clock::sleep_until(at).await;
            timer
        }
        None => std::future::pending().await,
    }
}

impl Actor {
    pub(crate) fn new(
        name: &str,
        spec: UnitSpec,
        launcher: SharedLauncher,
        commands: mpsc::UnboundedReceiver<Command>,
        status: watch::Sender<Status>,
        counters: Arc<Counters>,
        cache_dir: Option<std::path::PathBuf>,
    ) -> Self {
        let (internal_tx, internal_rx) = mpsc::unbounded_channel();
        let machine = Machine::new(name, &spec, now());
        let sessions = Sessions::spawn(
            name,
            status.subscribe(),
            internal_tx.clone(),
            counters,
            Settings::of(&spec),
        );
        let cache = Cache {
            file: Self::cache_file(cache_dir.as_deref(), name, &spec),
            init: None,
            written: None,
            busy: false,
            dirty: false,
            lists: sessions.changes(),
            listed: sessions.listed(),
        };
        Self {
            cache_dir,
            cache,
            sessions,
            name: name.to_owned(),
            spec,
            machine,
            launcher,
            commands,
            internal_tx,
            internal_rx,
            status,
            gens: HashMap::new(),
            sync: None,
            sync_dirty: false,
            sync_began: None,
            sync_at: None,
            exiting: false,
            last_logged: None,
            ping_refused: None,
            clock: Clock::new(),
            learned: std::collections::BTreeMap::new(),
            adopted: None,
            report: None,
        }
    }

    /// This actor runs instance `n` of the per-host unit whose actor
    /// `unit` reaches: what it learns is told there.
    pub(crate) fn reporting(mut self, n: u32, unit: &mpsc::UnboundedSender<Command>) -> Self {
        self.report = Some(Reporter {
            n,
            unit: unit.downgrade(),
            last: None,
        });
        self
    }

    /// An on-demand unit's cache file.
    fn cache_file(dir: Option<&std::path::Path>, name: &str, spec: &UnitSpec) -> Option<CacheFile> {
        let dir = dir?;
        spec.activation()
            .idle_stop()
            .map(|_| CacheFile::new(dir, name, spec))
    }

    /// The handle to this unit's host sessions.
    pub(crate) fn sessions(&self) -> Sessions {
        self.sessions.clone()
    }

    pub(crate) async fn run(mut self) {
        self.publish();
        let mut login: LoginWatch = None;
        loop {
            let deadline = self.machine.deadline();
            let now = self.launcher.login();
            if now.as_ref().map(Arc::as_ptr) != login.as_ref().map(|(l, _)| Arc::as_ptr(l)) {
                login = now.map(|l| {
                    let summary = l.subscribe();
                    (l, summary)
                });
            }
            tokio::select! {
                () = login_lost(&mut login) => {
                    // The refresh token refused (`invalid_grant`) or the
                    // login forgotten: no retry, a login.
                    if let Some(generation) = self.machine.current() {
                        let scopes = Vec::new();
                        self.step(Event::NeedsLogin { generation, scopes }).await;
                    }
                }
                command = self.commands.recv() => match command {
                    Some(command) => self.command(command).await,
                    // Every handle is gone: nobody can stop us later.
                    None => {
                        self.exiting = true;
                        self.step(Event::Stop).await;
                    }
                },
                Some(event) = self.internal_rx.recv() => self.internal(event).await,
                () = lists_changed(&mut self.cache), if self.cache.file.is_some() || self.report.is_some() => self.save_cache(),
                () = sleep_until_opt(self.sync_at) => {
                    self.sync_at = None;
                    if let Some(generation) = self.machine.established() {
                        self.resync_if_dirty(generation);
                    }
                }
                timer = sleep_until(deadline) => {
                    if matches!(timer, Timer::Probe | Timer::ProbeTimeout)
                        && let Some(generation) = self.machine.established()
                    {
                        // Any message since counts: the probe may not be due.
                        let at = self.sessions.heard();
                        self.step(Event::Heard { generation, at }).await;
                    }
                    self.step(Event::Deadline(timer)).await;
                }
            }
            self.adopt();
            self.publish();
            if self.exiting && self.machine.is_settled() {
                break;
            }
        }
        if let Some(report) = &self.report {
            report.send(None);
        }
        // Quiescent: no generation is active; drop whatever is left.
        for (_, res) in self.gens.drain() {
            if let Some(connect) = res.connect {
                connect.abort();
            }
        }
    }

    async fn command(&mut self, command: Command) {
        match command {
            Command::Arm => {
                let cached = self.restore().await;
                self.step(Event::Arm { cached }).await;
            }
            Command::Start => self.step(Event::Start).await,
            Command::Stop => self.step(Event::Stop).await,
            Command::Restart => self.step(Event::Restart).await,
            Command::LoggedIn => self.step(Event::LoggedIn).await,
            Command::Apply { spec, restart } => {
                self.spec = (*spec).clone();
                self.launcher.configure(&spec);
                self.sessions.configure(Settings::of(&spec));
                let file = Self::cache_file(self.cache_dir.as_deref(), &self.name, &spec);
                if file != self.cache.file {
                    self.cache.file = file;
                    self.cache.written = None;
                }
                self.step(Event::Apply { spec, restart }).await;
                // Now on demand: what runs is worth keeping.
                self.save_cache();
            }
            Command::Call {
                name,
                arguments,
                timeout,
                reply,
            } => self.call(name, arguments, timeout, reply).await,
            Command::Shutdown => {
                self.exiting = true;
                self.step(Event::Stop).await;
            }
            Command::Learned { n, learned } => match learned {
                Some(learned) => {
                    self.learned.insert(n, learned);
                }
                None => {
                    self.learned.remove(&n);
                }
            },
        }
    }

    /// Publishes a per-host unit's newest instance's lists as the unit's
    /// (DESIGN §13): its tools and instructions through the machine, its
    /// other lists and `initialize` result through the sessions, and into
    /// the on-demand cache. Again when they changed since, or something
    /// else (the unit's own generation) published lists; never to a
    /// stopped unit. With no instance, what was published last stays.
    fn adopt(&mut self) {
        let Some(newest) = self.learned.values().next_back() else {
            return;
        };
        if self.machine.state() == State::Stopped {
            return;
        }
        let serials = (self.machine.tools_serial(), *self.cache.lists.borrow());
        if let Some((last, tools, lists)) = &self.adopted
            && Arc::ptr_eq(last, newest)
            && (*tools, *lists) == serials
        {
            return;
        }
        let newest = Arc::clone(newest);
        let cached = super::machine::Cached {
            tools: newest.tools.clone(),
            instructions: newest.instructions.clone(),
        };
        // No effects: published, nothing else.
        let effects = self.machine.step(Event::Learned { cached }, now());
        debug_assert!(effects.is_empty());
        self.sessions
            .adopt(Arc::clone(&newest.init), newest.lists.clone());
        self.adopted = Some((
            newest,
            self.machine.tools_serial(),
            *self.cache.lists.borrow(),
        ));
        self.save_cache();
    }

    /// An instance tells its unit what its established generation says,
    /// once all its lists are read and whenever they change.
    fn report(&mut self) {
        let Some(report) = &self.report else {
            return;
        };
        let (Some(init), Some(generation)) = (&self.cache.init, self.machine.established()) else {
            return;
        };
        if *self.cache.listed.borrow() != generation {
            return;
        }
        let learned = Learned {
            init: Arc::clone(init),
            tools: self.machine.server_tools().clone(),
            instructions: self.machine.instructions().map(str::to_owned),
            lists: List::KEPT.map(|kind| self.sessions.list(kind)),
        };
        if report.last.as_deref() == Some(&learned) {
            return;
        }
        let learned = Arc::new(learned);
        report.send(Some(Arc::clone(&learned)));
        if let Some(report) = &mut self.report {
            report.last = Some(learned);
        }
    }

    async fn call(
        &mut self,
        name: String,
        arguments: Option<JsonObject>,
        timeout: Duration,
        reply: oneshot::Sender<Result<CallToolResult, CallError>>,
    ) {
        if reply.is_closed() {
            // The caller left before the call could start.
            return;
        }
        if let Some(why) = self.spec.tool_filter().why_not(&name) {
            let _ = reply.send(Err(CallError::Filtered {
                server: self.name.clone(),
                tool: name,
                why,
            }));
            return;
        }
        if self.machine.server_lists(&name) == Some(false) {
            let _ = reply.send(Err(CallError::NoSuchTool {
                server: self.name.clone(),
                tool: name,
            }));
            return;
        }
        if self.machine.established().is_none() {
            // A first use starts an idle on-demand server; the call waits
            // for it in the sessions.
            self.step(Event::Demand).await;
        }
        if self.machine.established().is_none() && !self.machine.will_serve() {
            let view = self.machine.view();
            let _ = reply.send(Err(CallError::NotRunning {
                server: self.name.clone(),
                state: view.state,
                reason: view.reason,
                attempt: view.attempt,
                max_attempts: view.max_attempts,
                next_retry: view.next_retry.map(|at| self.clock.wall(at)),
            }));
            return;
        };
        let sessions = self.sessions.clone();
        tokio::spawn(async move {
            let mut reply = reply;
            let mut params = json!({"name": name});
            if let Some(arguments) = arguments {
                params["arguments"] = Value::Object(arguments);
            }
            let call = tokio::select! {
                call = tokio::time::timeout(timeout, sessions.request(Method::ToolsCall.as_str(), params)) => call,
                // The caller is gone (a D-Bus client that disconnected):
                // dropping the call sends the server `notifications/cancelled`.
                () = reply.closed() => return,
            };
            let result = match call {
                Err(_) => Err(CallError::Timeout(timeout)),
                Ok(Err(why)) => Err(CallError::Failed(why)),
                Ok(Ok(answer)) => CallError::result_of(answer).and_then(|result| {
                    serde_json::from_value::<CallToolResult>(result).map_err(|e| {
                        CallError::Failed(format!("the answer is not a tool result: {e}"))
                    })
                }),
            };
            let _ = reply.send(result);
        });
    }

    async fn internal(&mut self, event: Internal) {
        match event {
            Internal::Connected { generation, result } => match result {
                Ok(handshake) => {
                    if self.machine.current() != Some(generation) {
                        // Too late: that generation is already being taken
                        // down (dropping the handshake closes its wire).
                        return;
                    }
                    let Handshake {
                        wire,
                        init,
                        tools,
                        dirty,
                        tools_hint,
                    } = *handshake;
                    self.sessions.tools_read(tools_hint);
                    let instructions = init["instructions"].as_str().map(str::to_owned);
                    self.cache.init = Some(Arc::clone(&init));
                    let probe = if crate::mux::era::is_modern(&init) {
                        Method::ServerDiscover
                    } else {
                        Method::Ping
                    }
                    .as_str();
                    self.step(Event::Established {
                        generation,
                        tools,
                        instructions,
                        probe,
                    })
                    .await;
                    if self.machine.established() == Some(generation) {
                        // Hosts are answered from the published lists: they
                        // must be out before the sessions see the server.
                        self.publish();
                        self.sessions.up(generation, wire, init);
                        self.sync_dirty |= dirty;
                        self.resync_if_dirty(generation);
                        self.save_cache();
                    }
                }
                Err(_) if let Some(scopes) = self.step_up().await => {
                    self.step(Event::NeedsLogin { generation, scopes }).await;
                }
                Err(ConnectError::Closed(error) | ConnectError::Failed(error))
                    if self.token_refused(&error).await =>
                {
                    let scopes = Vec::new();
                    self.step(Event::NeedsLogin { generation, scopes }).await;
                }
                Err(ConnectError::Closed(error)) => {
                    self.step(Event::Closed { generation, error }).await;
                }
                Err(ConnectError::Failed(error)) => {
                    self.step(Event::ConnectFailed { generation, error }).await;
                }
                Err(ConnectError::NeedsLogin) => {
                    let scopes = Vec::new();
                    self.step(Event::NeedsLogin { generation, scopes }).await;
                }
            },
            // A request met `403 insufficient_scope` (DESIGN §17
            // "Step-up") or a `401` no refresh cured, and the wire ended: a
            // login is needed, not a retry.
            Internal::Closed { generation, .. } if let Some(scopes) = self.step_up().await => {
                self.step(Event::NeedsLogin { generation, scopes }).await
            }
            Internal::Closed { generation, error } => {
                if self.token_refused(&error).await {
                    let scopes = Vec::new();
                    self.step(Event::NeedsLogin { generation, scopes }).await
                } else {
                    self.step(Event::Closed { generation, error }).await
                }
            }
            Internal::Exited { generation, status } => {
                if let Some(pid) = self.gens.remove(&generation).and_then(|r| r.pid) {
                    self.launcher.reaped(pid);
                }
                self.step(Event::Exited { generation, status }).await;
            }
            Internal::ListChanged {
                generation,
                pending,
            } => {
                pending.store(false, std::sync::atomic::Ordering::Release);
                if self.machine.current() != Some(generation) {
                    return;
                }
                // Coalesce: one more sync once the current one is done and
                // the spacing has passed.
                self.sync_dirty = true;
                self.resync_if_dirty(generation);
            }
            Internal::Synced { generation, result } => {
                if self.sync.as_ref().is_some_and(|(g, _)| *g == generation) {
                    self.sync = None;
                }
                match result {
                    // The server changed its list while it was being read
                    // (page by page): what was read may mix both lists.
                    // Only a read no list_changed overtook is published.
                    Ok(_) if self.sync_dirty => {}
                    Ok(tools) => {
                        self.step(Event::ToolsSynced { generation, tools }).await;
                        self.sessions.tools_synced(self.machine.tools_serial());
                        self.save_cache();
                    }
                    Err(e) => {
                        tracing::warn!(target: "mcpd::supervisor", mcpd_server = %self.name, generation, "re-reading the tool list failed: {e}; keeping the list read before");
                        self.step(Event::ListFailed {
                            generation,
                            error: e.to_string(),
                        })
                        .await;
                    }
                }
                self.resync_if_dirty(generation);
            }
            Internal::ListFailed { generation, error } => {
                self.step(Event::ListFailed { generation, error }).await;
            }
            Internal::Demand => self.step(Event::Demand).await,
            Internal::CacheStored { digest, result } => {
                self.cache.busy = false;
                match result {
                    Ok(()) => self.cache.written = Some(digest),
                    Err(e) => {
                        tracing::warn!(target: "mcpd::supervisor", mcpd_server = %self.name, "cannot keep the server's lists for when it is idle: {e}");
                    }
                }
                if std::mem::take(&mut self.cache.dirty) {
                    self.save_cache();
                }
            }
            Internal::Probed {
                generation,
                probe,
                rtt,
                refused,
            } => {
                if let Some(error) = refused
                    && self.ping_refused != Some(generation)
                {
                    // It answered, so it is alive; say so once.
                    self.ping_refused = Some(generation);
                    tracing::warn!(target: "mcpd::supervisor", mcpd_server = %self.name, generation, "the server answers ping with an error ({error}); counted as alive");
                }
                self.step(Event::ProbeAnswered {
                    generation,
                    probe,
                    rtt,
                })
                .await;
            }
        }
    }

    /// An on-demand unit's cached lists, handed to its sessions; a cache
    /// that cannot be read is warned about and the lists learnt again.
    /// Read and parsed on the blocking pool: a large catalog's cache is
    /// megabytes, and the daemon's one runtime thread serves every unit.
    /// Whether `error` is the server refusing a token just refreshed
    /// (a `401` after rmcp's refresh): the login is marked lost.
    async fn token_refused(&self, error: &str) -> bool {
        if !error.contains(super::oauth::TOKEN_REFUSED) {
            return false;
        }
        let Some(login) = self.launcher.login() else {
            return false;
        };
        login.refused().await;
        true
    }

    async fn restore(&mut self) -> Option<super::machine::Cached> {
        let file = self.cache.file.clone()?;
        let loaded = tokio::task::spawn_blocking(move || file.load())
            .await
            .unwrap_or_else(|e| Err(format!("reading the cache failed: {e}")));
        match loaded {
            Ok(Some(restored)) => {
                self.cache.written = Some(restored.digest);
                self.sessions.restore(restored.init, restored.lists);
                Some(restored.cached)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(target: "mcpd::supervisor", mcpd_server = %self.name, "{e}; starting the server to learn its lists");
                None
            }
        }
    }

    /// Writes an on-demand unit's cache when what its established
    /// generation said differs from what was written.
    fn save_cache(&mut self) {
        self.report();
        let text = if let Some(newest) = self.learned.values().next_back() {
            // A per-host unit's lists are its newest instance's.
            let Some(file) = &self.cache.file else {
                return;
            };
            if self.cache.busy {
                self.cache.dirty = true;
                return;
            }
            file.render(&newest.init, &newest.tools, &newest.lists)
        } else {
            let (Some(file), Some(init)) = (&self.cache.file, &self.cache.init) else {
                return;
            };
            let Some(generation) = self.machine.established() else {
                // Lists are kept or withdrawn now, not learnt.
                return;
            };
            if *self.cache.listed.borrow() != generation {
                // Its lists are still being read: what the sessions hold may
                // be the last generation's.
                return;
            }
            if self.cache.busy {
                self.cache.dirty = true;
                return;
            }
            let lists = List::KEPT.map(|kind| self.sessions.list(kind));
            file.render(init, self.machine.server_tools(), &lists)
        };
        let Some(file) = &self.cache.file else {
            return;
        };
        let digest = super::cache::digest(&text);
        if self.cache.written == Some(digest) {
            return;
        }
        self.cache.busy = true;
        let file = file.clone();
        let tx = self.internal_tx.clone();
        tokio::task::spawn_blocking(move || {
            let result = file.store(&text);
            let _ = tx.send(Internal::CacheStored { digest, result });
        });
    }

    /// One more sync if a list_changed arrived while the last was running,
    /// once [`SYNC_SPACING`] has passed since it began.
    fn resync_if_dirty(&mut self, generation: Gen) {
        if !self.sync_dirty || self.sync.is_some() || self.machine.established() != Some(generation)
        {
            return;
        }
        let now = now();
        if let Some(began) = self.sync_began
            && now < began + SYNC_SPACING
        {
            self.sync_at = Some(began + SYNC_SPACING);
            return;
        }
        self.sync_dirty = false;
        self.start_sync(generation);
    }

    fn start_sync(&mut self, generation: Gen) {
        self.sync_began = Some(now());
        self.sync_at = None;
        let sessions = self.sessions.clone();
        let tx = self.internal_tx.clone();
        let timeout = self.spec.startup_timeout();
        let task = tokio::spawn(async move {
            let result = sessions.read_list(List::Tools, timeout).await;
            let _ = tx.send(Internal::Synced { generation, result });
        });
        self.sync = Some((generation, task));
    }

    /// Whether the unit's login needs a person since its last one (DESIGN
    /// §17): a `401` a refresh did not cure, or a `403 insufficient_scope`
    /// (a step-up), whose scopes are named.
    async fn step_up(&self) -> Option<Vec<String>> {
        let login = self.launcher.login()?;
        let scopes = login.login_needed()?;
        if scopes.is_empty() {
            // A 401 no refresh cured: the login is lost, as
            // [`token_refused`](Self::token_refused) says.
            login.refused().await;
        }
        Some(scopes)
    }

    /// Feeds an event and performs the effects, including the events the
    /// effects themselves produce.
    async fn step(&mut self, event: Event) {
        self.step_at(event, now()).await;
    }

    /// [`step`](Self::step) with the instant the event happened at (the
    /// events its effects produce happen when they do).
    async fn step_at(&mut self, event: Event, at: Instant) {
        let mut queue = VecDeque::from([event]);
        let mut at = Some(at);
        while let Some(event) = queue.pop_front() {
            let now = at.take().unwrap_or_else(now);
            for effect in self.machine.step(event, now) {
                self.effect(effect, &mut queue).await;
            }
        }
    }

    async fn effect(&mut self, effect: Effect, queue: &mut VecDeque<Event>) {
        match effect {
            Effect::Spawn { generation } => {
                self.sync_dirty = false;
                match self.launcher.launch(&self.spec, generation).await {
                    Ok(launched) => {
                        let tx = self.internal_tx.clone();
                        let connect = launched.connect;
                        let roots = self.spec.roots().to_vec();
                        let list_timeout = self.spec.startup_timeout();
                        // An HTTP server is probed only when the unit pins
                        // 2026-07-28 (rmcp's client then sends each
                        // request's Mcp-Method, Mcp-Name and Mcp-Param-*
                        // headers, from the tools' x-mcp-header); "auto"
                        // speaks the handshake's era to it, as before:
                        // whether rmcp's client can fall back to a
                        // session after starting without one is untested.
                        let protocol = match (self.spec.transport(), self.spec.protocol()) {
                            (crate::unit::Transport::Http(_), crate::unit::Protocol::Modern) => {
                                crate::unit::Protocol::Modern
                            }
                            (crate::unit::Transport::Http(_), _) => crate::unit::Protocol::Legacy,
                            (crate::unit::Transport::Stdio(_), protocol) => protocol,
                        };
                        let name = self.name.clone();
                        // An instance of a per-host unit declares exactly
                        // its host's capabilities (DESIGN §13).
                        let declared = (self.spec.sessions() == crate::unit::Sessions::Instance)
                            .then(|| self.sessions.declared().unwrap_or_else(|| json!({})));
                        let task = tokio::spawn(async move {
                            let result = async {
                                let wire = connect.await?;
                                let who = (protocol, name.as_ref());
                                upstream::handshake(wire, &roots, list_timeout, who, declared)
                                    .await
                                    .map(Box::new)
                            }
                            .await;
                            let _ = tx.send(Internal::Connected { generation, result });
                        });
                        if let Some(exit) = launched.exit {
                            let tx = self.internal_tx.clone();
                            tokio::spawn(async move {
                                let status = exit.await;
                                let _ = tx.send(Internal::Exited { generation, status });
                            });
                        }
                        self.gens.insert(
                            generation,
                            Resources {
                                pid: launched.pid,
                                connect: Some(task),
                            },
                        );
                        queue.push_back(Event::Spawned {
                            generation,
                            pid: launched.pid,
                        });
                    }
                    Err(error) => queue.push_back(Event::SpawnFailed { generation, error }),
                }
            }
            Effect::Signal { generation, signal } => {
                if let Some(pid) = self.gens.get(&generation).and_then(|r| r.pid) {
                    self.launcher.signal(pid, signal);
                }
            }
            Effect::Settle { generation, cutoff } => {
                // The sessions let go of the upstream now if it is idle;
                // gone (the unit is ending), nothing holds it either.
                let (at, busy) = self
                    .sessions
                    .settle(generation, cutoff)
                    .await
                    .unwrap_or((cutoff, false));
                queue.push_back(Event::Used {
                    generation,
                    at,
                    busy,
                });
            }
            Effect::Probe { generation, probe } => {
                let sessions = self.sessions.clone();
                let tx = self.internal_tx.clone();
                let timeout = self.spec.health().timeout();
                tokio::spawn(async move {
                    let sent = now();
                    // Unanswered in time, it is the machine's miss; the
                    // ping is cancelled upstream.
                    if let Ok(Ok(answer)) = tokio::time::timeout(timeout, sessions.probe()).await {
                        let refused = answer
                            .get("error")
                            .map(|e| e["message"].as_str().unwrap_or("no message").to_owned());
                        let _ = tx.send(Internal::Probed {
                            generation,
                            probe,
                            rtt: now().saturating_duration_since(sent),
                            refused,
                        });
                    }
                });
            }
            Effect::Disconnect { generation, lost } => {
                // Quiesce: close the connection and wait for the
                // generation's in-flight connect and sync to finish.
                self.sessions.down(generation, lost);
                if let Some(res) = self.gens.get_mut(&generation) {
                    if let Some(connect) = res.connect.take() {
                        connect.abort();
                        let _ = connect.await;
                    }
                    if res.pid.is_none() {
                        self.gens.remove(&generation);
                    }
                }
                if let Some((g, task)) = self.sync.take() {
                    if g == generation {
                        task.abort();
                        let _ = task.await;
                    } else {
                        self.sync = Some((g, task));
                    }
                }
                self.sync_dirty = false;
                self.sync_at = None;
            }
        }
    }

    /// Publishes the read model if it changed, and logs state transitions.
    fn publish(&mut self) {
        let view = self.machine.view();
        self.log_transition(&view);
        let status = status_of(&view, &self.clock);
        self.status.send_if_modified(|current| {
            if *current == status {
                false
            } else {
                *current = status;
                true
            }
        });
    }

    fn log_transition(&mut self, view: &View) {
        if view.settling {
            // Wait for the final word: the exit status may refine the reason.
            return;
        }
        let key = (view.state, view.reason.clone(), view.next_retry.is_some());
        if self.last_logged.as_ref() == Some(&key) {
            return;
        }
        let previous = self.last_logged.replace(key).map(|(s, _, _)| s);
        if previous.is_none() && view.state == State::Stopped {
            // The initial state of a new supervisor is not news.
            return;
        }
        let name = &self.name;
        let generation = view.generation;
        if crate::telemetry::on() && previous != Some(view.state) {
            use crate::telemetry::metrics::Counter;
            let unit = || ("mcpd.unit", name.to_string());
            crate::telemetry::count(
                Counter::StateChanges,
                vec![unit(), ("mcpd.state", view.state.as_str().to_owned())],
            );
            if view.state == State::Running
                && matches!(previous, Some(State::Retrying | State::Reconnecting))
            {
                crate::telemetry::count(Counter::Restarts, vec![unit()]);
            }
        }
        match view.state {
            State::Running => {
                let tools = crate::words::count(view.tools.len() as u64, "tool");
                let pid = view
                    .main_pid
                    .map(|p| format!("pid {p}, "))
                    .unwrap_or_default();
                if matches!(previous, Some(State::Retrying | State::Reconnecting)) {
                    let retries = match view.attempt {
                        1 => "1 retry".to_owned(),
                        n => format!("{n} retries"),
                    };
                    tracing::info!(target: "mcpd::supervisor", mcpd_server = %name, generation, "running again ({pid}{tools}) after {retries}");
                } else {
                    tracing::info!(target: "mcpd::supervisor", mcpd_server = %name, generation, "running ({pid}{tools})");
                }
            }
            State::Retrying | State::Reconnecting => match view.retry_delay {
                Some(wait) => {
                    // The delay as scheduled: the log line is written once
                    // the process is reaped, which may be a moment later.
                    tracing::warn!(
                        target: "mcpd::supervisor", mcpd_server = %name, generation,
                        "{}; retry {}/{} in {}", view.reason, view.attempt, view.max_attempts,
                        humantime::format_duration(wait)
                    );
                }
                None if previous != Some(view.state) => {
                    tracing::warn!(target: "mcpd::supervisor", mcpd_server = %name, generation, "{}", view.reason);
                }
                None => {}
            },
            State::Failed => {
                tracing::error!(target: "mcpd::supervisor", mcpd_server = %name, generation, "{}", view.reason);
            }
            State::Idle => {
                tracing::info!(target: "mcpd::supervisor", mcpd_server = %name, generation, "idle ({})", view.reason);
            }
            State::NeedsLogin => {
                tracing::warn!(target: "mcpd::supervisor", mcpd_server = %name, generation, "{}", view.reason);
            }
            state => {
                tracing::info!(target: "mcpd::supervisor", mcpd_server = %name, generation, "{state}");
            }
        }
    }
}
