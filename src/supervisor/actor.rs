//! The actor: one task per unit that owns its [`Machine`], its generations'
//! resources and its read model.
//!
//! It waits (no polling) on operator commands, events from its generations'
//! tasks (connected, closed, exited, list_changed, sync done) and the
//! machine's earliest named deadline; feeds them to the machine; performs the
//! effects; and publishes the [`Status`] on a `watch` channel. Tool-list
//! syncs are serialized here: one in flight at a time, a burst of
//! `list_changed` coalesces into one more sync after it.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use rmcp::Peer;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool};
use rmcp::service::ClientCacheConfig;
use rmcp::service::{QuitReason, RunningServiceCancellationToken, ServiceError};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::unit::UnitSpec;

use super::launch::{Client, ConnectError, GenClient, SharedLauncher, transport_error_text};
use super::machine::{Effect, Event, Gen, Machine, State, Timer, ToolList, View};
use super::{CallError, Status};

/// What the handle asks of the actor.
#[derive(Debug)]
pub(crate) enum Command {
    Start,
    Stop,
    Restart,
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
}

/// What the generations' tasks report.
#[derive(Debug)]
pub(crate) enum Internal {
    Connected {
        generation: Gen,
        result: Result<(Box<Client>, Vec<Tool>), ConnectError>,
    },
    Closed {
        generation: Gen,
        error: String,
    },
    Exited {
        generation: Gen,
        status: super::machine::ExitStatus,
    },
    ListChanged {
        generation: Gen,
    },
    Synced {
        generation: Gen,
        result: Result<Vec<Tool>, String>,
    },
}

/// A generation's live resources.
#[derive(Default)]
struct Resources {
    pid: Option<u32>,
    connect: Option<JoinHandle<()>>,
    peer: Option<Peer<RoleClient>>,
    cancel: Option<RunningServiceCancellationToken>,
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
    gens: HashMap<Gen, Resources>,
    /// The one tool sync in flight, if any.
    sync: Option<(Gen, JoinHandle<()>)>,
    /// A list_changed arrived while a sync (or the initial list) was in flight.
    sync_dirty: bool,
    exiting: bool,
    last_logged: Option<(State, String, bool)>,
    clock: Clock,
}

/// The current instant, on tokio's clock (so paused-time tests apply).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Maps machine instants to wall-clock time from one fixed reference, so
/// the same instant always maps to the same time (and an unchanged read
/// model compares equal).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    instant: Instant,
    wall: SystemTime,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            instant: now(),
            wall: SystemTime::now(),
        }
    }

    pub(crate) fn wall(&self, at: Instant) -> SystemTime {
        if at >= self.instant {
            self.wall + (at - self.instant)
        } else {
            self.wall - (self.instant - at)
        }
    }
}

pub(crate) fn status_of(view: &View, clock: &Clock) -> Status {
    view.clone().at(|at| clock.wall(at))
}

/// When a request failed because the connection is gone, why.
fn broken_connection(e: &ServiceError) -> Option<String> {
    match e {
        ServiceError::TransportSend(e) => {
            Some(format!("request failed: {}", transport_error_text(e)))
        }
        ServiceError::TransportClosed => Some("the server closed the connection".into()),
        _ => None,
    }
}

/// Waits for the machine's deadline; returns which timer it was.
async fn sleep_until(deadline: Option<(Timer, Instant)>) -> Timer {
    match deadline {
        Some((timer, at)) => {
            tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            timer
        }
        None => std::future::pending().await,
    }
}

fn describe_quit(reason: &Result<QuitReason, tokio::task::JoinError>) -> String {
    match reason {
        Ok(QuitReason::Closed) => "the server closed the connection".into(),
        Ok(QuitReason::Cancelled) => "the connection was closed by mcpd".into(),
        Ok(QuitReason::JoinError(e)) | Err(e) => format!("the connection task failed: {e}"),
        Ok(other) => format!("the connection ended: {other:?}"),
    }
}

impl Actor {
    pub(crate) fn new(
        name: &str,
        spec: UnitSpec,
        launcher: SharedLauncher,
        commands: mpsc::UnboundedReceiver<Command>,
        status: watch::Sender<Status>,
    ) -> Self {
        let (internal_tx, internal_rx) = mpsc::unbounded_channel();
        let machine = Machine::new(name, &spec, now());
        Self {
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
            exiting: false,
            last_logged: None,
            clock: Clock::new(),
        }
    }

    pub(crate) async fn run(mut self) {
        self.publish();
        loop {
            let deadline = self.machine.deadline();
            tokio::select! {
                command = self.commands.recv() => match command {
                    Some(command) => self.command(command).await,
                    // Every handle is gone: nobody can stop us later.
                    None => {
                        self.exiting = true;
                        self.step(Event::Stop).await;
                    }
                },
                Some(event) = self.internal_rx.recv() => self.internal(event).await,
                timer = sleep_until(deadline) => self.step(Event::Deadline(timer)).await,
            }
            self.publish();
            if self.exiting && self.machine.is_settled() {
                break;
            }
        }
        // Quiescent: no generation is active; drop whatever is left.
        for (_, res) in self.gens.drain() {
            if let Some(cancel) = res.cancel {
                cancel.cancel();
            }
            if let Some(connect) = res.connect {
                connect.abort();
            }
        }
    }

    async fn command(&mut self, command: Command) {
        match command {
            Command::Start => self.step(Event::Start).await,
            Command::Stop => self.step(Event::Stop).await,
            Command::Restart => self.step(Event::Restart).await,
            Command::Apply { spec, restart } => {
                self.spec = (*spec).clone();
                self.step(Event::Apply { spec, restart }).await;
            }
            Command::Call {
                name,
                arguments,
                timeout,
                reply,
            } => self.call(name, arguments, timeout, reply),
            Command::Shutdown => {
                self.exiting = true;
                self.step(Event::Stop).await;
            }
        }
    }

    fn call(
        &mut self,
        name: String,
        arguments: Option<JsonObject>,
        timeout: Duration,
        reply: oneshot::Sender<Result<CallToolResult, CallError>>,
    ) {
        let current = self.machine.established().and_then(|generation| {
            let peer = self.gens.get(&generation)?.peer.clone()?;
            Some((generation, peer))
        });
        let Some((generation, peer)) = current else {
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
        let listed = self.machine.server_lists(&name);
        if listed == Some(false) {
            let _ = reply.send(Err(CallError::NoSuchTool {
                server: self.name.clone(),
                tool: name,
            }));
            return;
        }
        let events = self.internal_tx.clone();
        tokio::spawn(async move {
            let mut reply = reply;
            let mut params = CallToolRequestParams::new(name);
            if let Some(arguments) = arguments {
                params = params.with_arguments(arguments);
            }
            let call = tokio::select! {
                call = tokio::time::timeout(timeout, peer.call_tool(params)) => call,
                // The caller is gone (a D-Bus client that disconnected):
                // dropping the call sends the server `notifications/cancelled`.
                () = reply.closed() => return,
            };
            let result = match call {
                Err(_) => Err(CallError::Timeout(timeout)),
                Ok(Ok(result)) => Ok(result),
                Ok(Err(ServiceError::McpError(e))) => Err(CallError::Rejected {
                    code: e.code.0,
                    message: e.message.into_owned(),
                }),
                Ok(Err(e)) => match broken_connection(&e) {
                    // The connection is broken, not the call: an HTTP
                    // transport reports nothing else when its server dies.
                    Some(error) => {
                        let _ = events.send(Internal::Closed {
                            generation,
                            error: error.clone(),
                        });
                        Err(CallError::Failed(error))
                    }
                    None => Err(CallError::Failed(e.to_string())),
                },
            };
            let _ = reply.send(result);
        });
    }

    async fn internal(&mut self, event: Internal) {
        match event {
            Internal::Connected { generation, result } => match result {
                Ok((client, tools)) => {
                    if self.machine.current() != Some(generation) {
                        // Too late: that generation is already being taken down.
                        client.cancellation_token().cancel();
                        return;
                    }
                    let client = *client;
                    let res = self.gens.entry(generation).or_default();
                    res.peer = Some(client.peer().clone());
                    res.cancel = Some(client.cancellation_token());
                    let instructions = client
                        .peer_info()
                        .and_then(|info| info.instructions.clone());
                    let tx = self.internal_tx.clone();
                    tokio::spawn(async move {
                        let reason = client.waiting().await;
                        let _ = tx.send(Internal::Closed {
                            generation,
                            error: describe_quit(&reason),
                        });
                    });
                    self.step(Event::Established {
                        generation,
                        tools: ToolList::from(tools),
                        instructions,
                    })
                    .await;
                    self.resync_if_dirty(generation);
                }
                Err(ConnectError::Closed(error)) => {
                    self.step(Event::Closed { generation, error }).await;
                }
                Err(ConnectError::Failed(error)) => {
                    self.step(Event::ConnectFailed { generation, error }).await;
                }
            },
            Internal::Closed { generation, error } => {
                self.step(Event::Closed { generation, error }).await
            }
            Internal::Exited { generation, status } => {
                if let Some(pid) = self.gens.remove(&generation).and_then(|r| r.pid) {
                    self.launcher.reaped(pid);
                }
                self.step(Event::Exited { generation, status }).await;
            }
            Internal::ListChanged { generation } => {
                if self.machine.current() != Some(generation) {
                    return;
                }
                if self.sync.is_none() && self.machine.established() == Some(generation) {
                    self.start_sync(generation);
                } else {
                    // Coalesce: one more sync once the current one is done.
                    self.sync_dirty = true;
                }
            }
            Internal::Synced { generation, result } => {
                if self.sync.as_ref().is_some_and(|(g, _)| *g == generation) {
                    self.sync = None;
                }
                if let Ok(tools) = result {
                    self.step(Event::ToolsSynced {
                        generation,
                        tools: ToolList::from(tools),
                    })
                    .await;
                }
                self.resync_if_dirty(generation);
            }
        }
    }

    /// One more sync if a list_changed arrived while the last was running.
    fn resync_if_dirty(&mut self, generation: Gen) {
        if self.sync_dirty && self.machine.established() == Some(generation) {
            self.sync_dirty = false;
            self.start_sync(generation);
        }
    }

    fn start_sync(&mut self, generation: Gen) {
        let Some(peer) = self.gens.get(&generation).and_then(|r| r.peer.clone()) else {
            return;
        };
        let tx = self.internal_tx.clone();
        let task = tokio::spawn(async move {
            let result = match peer.list_all_tools().await {
                Ok(tools) => Ok(tools),
                Err(e) => {
                    if let Some(error) = broken_connection(&e) {
                        let _ = tx.send(Internal::Closed { generation, error });
                    }
                    Err(e.to_string())
                }
            };
            let _ = tx.send(Internal::Synced { generation, result });
        });
        self.sync = Some((generation, task));
    }

    /// Feeds an event and performs the effects, including the events the
    /// effects themselves produce.
    async fn step(&mut self, event: Event) {
        let mut queue = VecDeque::from([event]);
        while let Some(event) = queue.pop_front() {
            for effect in self.machine.step(event, now()) {
                self.effect(effect, &mut queue).await;
            }
        }
    }

    async fn effect(&mut self, effect: Effect, queue: &mut VecDeque<Event>) {
        match effect {
            Effect::Spawn { generation } => {
                self.sync_dirty = false;
                let client = GenClient::new(
                    generation,
                    self.internal_tx.clone(),
                    self.spec.roots().to_vec(),
                );
                match self.launcher.launch(&self.spec, generation, client) {
                    Ok(launched) => {
                        let tx = self.internal_tx.clone();
                        let connect = launched.connect;
                        let task = tokio::spawn(async move {
                            let result = async {
                                let client = connect.await?;
                                // rmcp caches list answers and, by default,
                                // serves a stale list when a re-fetch fails:
                                // a supervisor must see the failure.
                                client
                                    .peer()
                                    .set_response_cache_config(ClientCacheConfig::disabled())
                                    .await;
                                let tools = client.list_all_tools().await.map_err(|e| {
                                    let message = format!("tools/list failed: {e}");
                                    if matches!(e, ServiceError::TransportClosed) {
                                        ConnectError::Closed(message)
                                    } else {
                                        ConnectError::Failed(message)
                                    }
                                })?;
                                Ok((Box::new(client), tools))
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
                                ..Resources::default()
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
            Effect::Disconnect { generation } => {
                // Quiesce: cancel the client and wait for the generation's
                // in-flight connect and sync to finish.
                if let Some(res) = self.gens.get_mut(&generation) {
                    res.peer = None;
                    if let Some(cancel) = res.cancel.take() {
                        cancel.cancel();
                    }
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
        match view.state {
            State::Running => {
                let tools = view.tools.len();
                let pid = view
                    .main_pid
                    .map(|p| format!("pid {p}, "))
                    .unwrap_or_default();
                if matches!(previous, Some(State::Retrying | State::Reconnecting)) {
                    let retries = match view.attempt {
                        1 => "1 retry".to_owned(),
                        n => format!("{n} retries"),
                    };
                    tracing::info!(target: "mcpd::supervisor", mcpd_server = %name, generation, "running again ({pid}{tools} tools) after {retries}");
                } else {
                    tracing::info!(target: "mcpd::supervisor", mcpd_server = %name, generation, "running ({pid}{tools} tools)");
                }
            }
            State::Retrying | State::Reconnecting => match view.next_retry {
                Some(at) => {
                    // Rounded up to the millisecond: the delay as scheduled.
                    let wait = at.saturating_duration_since(now());
                    let wait = Duration::from_millis(
                        u64::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(u64::MAX),
                    );
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
            state => {
                tracing::info!(target: "mcpd::supervisor", mcpd_server = %name, generation, "{state}");
            }
        }
    }
}
