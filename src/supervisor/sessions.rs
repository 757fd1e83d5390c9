//! Host sessions (DESIGN §8): the task, one per unit, that runs the pure
//! [`Router`] between every attached host and the upstream session of the
//! unit's current generation.
//!
//! Each host is a stream socket (from `Attach`) speaking newline-delimited
//! JSON-RPC, with a reader task (at most [`BACKLOG`] messages queued here
//! per host, so a flooding host waits on itself) and a writer task (a
//! bounded queue: a host that stops reading is detached, never waited
//! for). The upstream is the [`Wire`] the actor hands over once a
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
//! - requests while the upstream is down get the outage error (§3).
//!
//! mcpd's own requests (tool syncs, D-Bus `CallTool`) go through the same
//! router ([`Sessions::request`]), so their ids never collide with hosts'.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use crate::mux::route::{self, Caps, HostId, Out, Router};
use crate::mux::wire::{Frame, Incoming, Lines, MAX_LINE, Wire, line};
use crate::unit::ToolFilter;

use super::accounting::{Caller, Counters, Outcome, Record};
use super::actor::Internal;
use super::machine::{Gen, State};
use super::upstream::{HOST_VERSIONS, PROTOCOL_VERSION, roots_result};
use super::{CallError, Status};

/// Messages read from one host and not yet routed: the reader waits for
/// the router beyond this.
pub const BACKLOG: usize = 64;

/// Messages queued for one host: a host this far behind is not reading,
/// and is detached.
pub const QUEUE: usize = 4096;

/// Requests one host may have in flight upstream.
pub const MAX_IN_FLIGHT: usize = 1024;

/// JSON-RPC: the line is not JSON.
const PARSE_ERROR: i64 = -32700;
/// JSON-RPC: invalid params.
const INVALID_PARAMS: i64 = -32602;
/// The server is not reachable (an implementation-defined server error).
const SERVER_DOWN: i64 = -32000;

#[derive(Debug)]
enum Input {
    Attach {
        stream: UnixStream,
        caller: Caller,
    },
    Host {
        host: HostId,
        frame: Frame,
        _permit: OwnedSemaphorePermit,
    },
    HostGone {
        host: HostId,
    },
    Up {
        generation: Gen,
        wire: Wire,
        init: Arc<Value>,
    },
    Down {
        generation: Gen,
    },
    Configure {
        filter: ToolFilter,
        roots: Vec<String>,
    },
    Request {
        token: u64,
        method: String,
        params: Value,
        reply: oneshot::Sender<Result<Value, String>>,
    },
    Cancel {
        token: u64,
    },
}

/// The handle to a unit's host sessions.
#[derive(Debug, Clone)]
pub(crate) struct Sessions {
    tx: mpsc::UnboundedSender<Input>,
    tokens: Arc<AtomicU64>,
    count: Arc<AtomicUsize>,
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
        filter: ToolFilter,
        roots: Vec<String>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));
        let serial = status.borrow().tools_serial;
        let task = Task {
            name: Arc::from(name),
            input: tx.downgrade(),
            router: Router::new(),
            hosts: HashMap::new(),
            next_host: 0,
            upstream: None,
            init: None,
            waiting: Vec::new(),
            own: HashMap::new(),
            tokens: HashMap::new(),
            status,
            serial,
            events,
            counters,
            filter,
            roots,
            count: Arc::clone(&count),
            doomed: Vec::new(),
        };
        tokio::spawn(task.run(rx));
        Self {
            tx,
            tokens: Arc::new(AtomicU64::new(0)),
            count,
        }
    }

    /// A new host session on `stream`, made by `caller`.
    pub(crate) fn attach(&self, stream: UnixStream, caller: Caller) {
        let _ = self.tx.send(Input::Attach { stream, caller });
    }

    /// How many host sessions are attached.
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

    /// Generation `generation` is being taken down.
    pub(crate) fn down(&self, generation: Gen) {
        let _ = self.tx.send(Input::Down { generation });
    }

    /// The unit's tool filter and roots changed.
    pub(crate) fn configure(&self, filter: ToolFilter, roots: Vec<String>) {
        let _ = self.tx.send(Input::Configure { filter, roots });
    }

    /// mcpd's own request upstream: the server's whole answer (a `result`
    /// or an `error` member), or why there is none. Dropping the future
    /// cancels the request upstream.
    pub(crate) async fn request(&self, method: &str, params: Value) -> Result<Value, String> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let sent = self.tx.send(Input::Request {
            token,
            method: method.to_owned(),
            params,
            reply,
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

    /// Every item of a paginated list (`tools/list`: `key` "tools").
    pub(crate) async fn list_all(&self, method: &str, key: &str) -> Result<Vec<Value>, String> {
        let mut items = Vec::new();
        let mut cursor: Option<Value> = None;
        loop {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let mut answer = self.request(method, params).await?;
            let Some(mut page) = answer.get_mut("result").map(Value::take) else {
                return Err(format!(
                    "{method} failed: {}",
                    answer["error"]["message"].as_str().unwrap_or("no result")
                ));
            };
            match page.get_mut(key).map(Value::take) {
                Some(Value::Array(page_items)) => items.extend(page_items),
                _ => return Err(format!("{method} failed: the answer has no {key} array")),
            }
            match page.get("nextCursor") {
                Some(next) if !next.is_null() && cursor.as_ref() != Some(next) => {
                    cursor = Some(next.clone());
                }
                _ => return Ok(items),
            }
        }
    }
}

/// One attached host.
struct Host {
    out: mpsc::Sender<Vec<u8>>,
    /// Dropped with the host: stops its reader.
    _kill: oneshot::Sender<()>,
    caller: Caller,
    /// Answered its `initialize`.
    initialized: bool,
    /// What it sent while its `initialize` waits for the first
    /// generation, handled in order once it is answered.
    held: Vec<Frame>,
    /// Its `tools/call`s in flight, by its request id (as JSON text).
    calls: HashMap<String, Record>,
}

struct Upstream {
    generation: Gen,
    tx: mpsc::UnboundedSender<Value>,
    rx: mpsc::UnboundedReceiver<Incoming>,
}

struct Task {
    name: Arc<str>,
    /// For new hosts' readers; weak, so the task ends with its handles.
    input: mpsc::WeakUnboundedSender<Input>,
    router: Router,
    hosts: HashMap<HostId, Host>,
    next_host: HostId,
    upstream: Option<Upstream>,
    /// The server's `initialize` result (the newest generation's).
    init: Option<Arc<Value>>,
    /// Hosts whose `initialize` waits for the first generation.
    waiting: Vec<(HostId, Value, Value)>,
    /// mcpd's own requests: upstream id → who waits.
    own: HashMap<u64, (u64, oneshot::Sender<Result<Value, String>>)>,
    /// Their tokens → upstream id.
    tokens: HashMap<u64, u64>,
    status: watch::Receiver<Status>,
    /// The tools serial hosts were last told about.
    serial: u64,
    events: mpsc::UnboundedSender<Internal>,
    counters: Arc<Counters>,
    filter: ToolFilter,
    roots: Vec<String>,
    count: Arc<AtomicUsize>,
    /// Hosts to detach once the current message is handled.
    doomed: Vec<(HostId, &'static str)>,
}

fn error(id: &Value, code: i64, message: impl Into<String>) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}})
}

async fn next_incoming(upstream: &mut Option<Upstream>) -> (Gen, Option<Incoming>) {
    match upstream {
        Some(up) => (up.generation, up.rx.recv().await),
        None => std::future::pending().await,
    }
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Input>) {
        loop {
            tokio::select! {
                input = rx.recv() => match input {
                    Some(input) => self.input(input),
                    None => break,
                },
                (generation, incoming) = next_incoming(&mut self.upstream) => match incoming {
                    Some(Ok(message)) => self.on_server(message),
                    Some(Err(why)) => self.lost(generation, format!("request failed: {why}")),
                    None => self.lost(generation, "the server closed the connection".into()),
                },
                changed = self.status.changed() => match changed {
                    Ok(()) => self.status_changed(),
                    // The actor has ended: so have its sessions.
                    Err(_) => break,
                },
            }
            while let Some((host, why)) = self.doomed.pop() {
                self.detach(host, Some(why));
            }
        }
    }

    fn input(&mut self, input: Input) {
        match input {
            Input::Attach { stream, caller } => self.attach(stream, caller),
            Input::Host { host, frame, .. } => self.on_host(host, frame),
            Input::HostGone { host } => self.detach(host, None),
            Input::Up {
                generation,
                wire,
                init,
            } => self.up(generation, wire, init),
            Input::Down { generation } => {
                if self
                    .upstream
                    .as_ref()
                    .is_some_and(|u| u.generation == generation)
                {
                    self.upstream = None;
                    let outs = self.router.upstream_lost();
                    self.deliver(outs, None);
                }
            }
            Input::Configure { filter, roots } => {
                self.filter = filter;
                self.roots = roots;
            }
            Input::Request {
                token,
                method,
                params,
                reply,
            } => {
                let (id, out) = self.router.request(&method, params);
                self.own.insert(id, (token, reply));
                self.tokens.insert(token, id);
                self.deliver(vec![out], None);
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

    fn attach(&mut self, stream: UnixStream, caller: Caller) {
        let Some(input) = self.input.upgrade() else {
            return;
        };
        self.next_host += 1;
        let host = self.next_host;
        let (read, write) = stream.into_split();
        let (out, queue) = mpsc::channel(QUEUE);
        let (kill, killed) = oneshot::channel();
        tokio::spawn(read_host(host, Lines::new(read), input, killed));
        tokio::spawn(write_host(queue, write));
        self.hosts.insert(
            host,
            Host {
                out,
                _kill: kill,
                caller,
                initialized: false,
                held: Vec::new(),
                calls: HashMap::new(),
            },
        );
        self.count.store(self.hosts.len(), Ordering::Relaxed);
        tracing::debug!(target: "mcpd::sessions", mcpd_server = %self.name, host, uid = ?caller.uid, pid = ?caller.pid, "host session attached");
    }

    fn detach(&mut self, host: HostId, why: Option<&str>) {
        let Some(gone) = self.hosts.remove(&host) else {
            return;
        };
        if let Some(why) = why {
            tracing::warn!(target: "mcpd::sessions", mcpd_server = %self.name, host, pid = ?gone.caller.pid, "detaching host session {host}: {why}");
        }
        self.waiting.retain(|(h, _, _)| *h != host);
        self.count.store(self.hosts.len(), Ordering::Relaxed);
        // Its calls in flight are dropped: logged as abandoned.
        drop(gone);
        let outs = self.router.detach(host);
        self.deliver(outs, None);
    }

    /// Queues `bytes` for `host`; a host whose queue is full is detached.
    fn send_bytes(&mut self, host: HostId, bytes: Vec<u8>) {
        let Some(h) = self.hosts.get(&host) else {
            return;
        };
        match h.out.try_send(bytes) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.doomed.push((host, "it stopped reading its messages"));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.doomed.push((host, "its connection failed"));
            }
        }
    }

    fn send(&mut self, host: HostId, message: &Value) {
        // A response ends a call being accounted.
        if message.get("method").is_none()
            && let Some(id) = message.get("id")
            && let Some(h) = self.hosts.get_mut(&host)
            && let Some(mut record) = h.calls.remove(&id.to_string())
        {
            record.finish(outcome_of(message));
        }
        self.send_bytes(host, line(message));
    }

    /// What a request gets while the upstream is not established.
    fn down_text(&self, lost: Option<&str>) -> String {
        if let Some(why) = lost {
            return format!("server {}: connection lost: {why}", self.name);
        }
        let s = self.status.borrow();
        if s.state == State::Running {
            return format!("server {} is reconnecting", self.name);
        }
        CallError::NotRunning {
            server: self.name.to_string(),
            state: s.state,
            reason: s.reason.clone(),
            attempt: s.attempt,
            max_attempts: s.max_attempts,
            next_retry: s.next_retry,
        }
        .to_string()
    }

    fn deliver(&mut self, outs: Vec<Out>, lost: Option<&str>) {
        for out in outs {
            match out {
                Out::Server(message) => {
                    if let Some(up) = &self.upstream {
                        let _ = up.tx.send(message);
                    }
                }
                Out::Host(host, message) => self.send(host, &message),
                Out::Down { host, id } => {
                    let text = self.down_text(lost);
                    self.send(host, &error(&id, SERVER_DOWN, text));
                }
                Out::Answer(id, message) => {
                    if let Some((token, reply)) = self.own.remove(&id) {
                        self.tokens.remove(&token);
                        let _ = reply.send(Ok(message));
                    }
                }
                Out::Unanswered(id) => {
                    if let Some((token, reply)) = self.own.remove(&id) {
                        self.tokens.remove(&token);
                        let _ = reply.send(Err(self.down_text(lost)));
                    }
                }
            }
        }
    }

    fn up(&mut self, generation: Gen, wire: Wire, init: Arc<Value>) {
        self.upstream = Some(Upstream {
            generation,
            tx: wire.tx,
            rx: wire.rx,
        });
        self.init = Some(init);
        let outs = self.router.upstream_ready();
        self.deliver(outs, None);
        for (host, id, params) in std::mem::take(&mut self.waiting) {
            self.initialize(host, &id, &params);
        }
    }

    fn lost(&mut self, generation: Gen, why: String) {
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
        if serial != self.serial {
            self.serial = serial;
            let changed = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
            let ready: Vec<HostId> = self
                .hosts
                .iter()
                .filter(|(_, h)| h.initialized)
                .map(|(id, _)| *id)
                .collect();
            let bytes = line(&changed);
            for host in ready {
                self.send_bytes(host, bytes.clone());
            }
        }
        if matches!(state, State::Failed | State::Stopped) && !self.waiting.is_empty() {
            let text = self.down_text(None);
            for (host, id, _) in std::mem::take(&mut self.waiting) {
                self.send(host, &error(&id, SERVER_DOWN, text.clone()));
                // What it sent meanwhile is answered (as uninitialized).
                let held = self
                    .hosts
                    .get_mut(&host)
                    .map(|h| std::mem::take(&mut h.held))
                    .unwrap_or_default();
                for frame in held {
                    self.on_host(host, frame);
                }
            }
        }
    }

    /// Answers host `host`'s `initialize` with the server's own result.
    fn initialize(&mut self, host: HostId, id: &Value, params: &Value) {
        let Some(init) = self.init.clone() else {
            let state = self.status.borrow().state;
            if matches!(state, State::Failed | State::Stopped | State::Stopping) {
                let text = self.down_text(None);
                self.send(host, &error(id, SERVER_DOWN, text));
            } else {
                // Answered once the first generation is established.
                self.waiting.push((host, id.clone(), params.clone()));
            }
            return;
        };
        let asked = params["protocolVersion"].as_str().unwrap_or_default();
        let version = if HOST_VERSIONS.contains(&asked) {
            asked
        } else {
            PROTOCOL_VERSION
        };
        let mut result = (*init).clone();
        result["protocolVersion"] = json!(version);
        // mcpd tells hosts when the published tools change (after an
        // outage too), whether or not the server does.
        if let Some(tools) = result
            .pointer_mut("/capabilities/tools")
            .and_then(Value::as_object_mut)
        {
            tools.insert("listChanged".into(), json!(true));
        }
        if let Some(h) = self.hosts.get_mut(&host) {
            h.initialized = true;
        }
        self.router.attach(host, Caps::from_initialize(params));
        self.send(host, &json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    fn on_host(&mut self, host: HostId, frame: Frame) {
        let waiting = self.waiting.iter().any(|(h, _, _)| *h == host);
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        if waiting {
            // Pipelined behind its initialize (a bridge replaying one).
            if h.held.len() < BACKLOG {
                h.held.push(frame);
            } else {
                self.doomed
                    .push((host, "it sent too much before its initialize was answered"));
            }
            return;
        }
        let message = match frame {
            Frame::Message(message) => message,
            Frame::Garbage(why) => {
                self.send(host, &error(&Value::Null, PARSE_ERROR, why));
                return;
            }
            Frame::TooLong => {
                self.send(
                    host,
                    &error(
                        &Value::Null,
                        route::INVALID_REQUEST,
                        format!("a message longer than {MAX_LINE} bytes was dropped"),
                    ),
                );
                return;
            }
        };
        let method = message.get("method").and_then(Value::as_str);
        let id = message.get("id").filter(|id| !id.is_null()).cloned();
        let initialized = h.initialized;
        match (method, id) {
            (Some("initialize"), Some(id)) => {
                if initialized {
                    self.send(
                        host,
                        &error(
                            &id,
                            route::INVALID_REQUEST,
                            "the session is already initialized",
                        ),
                    );
                } else {
                    let params = message.get("params").cloned().unwrap_or(Value::Null);
                    self.initialize(host, &id, &params);
                }
            }
            (Some("ping"), Some(id)) if !initialized => {
                self.send(host, &json!({"jsonrpc": "2.0", "id": id, "result": {}}));
            }
            (Some(_), Some(id)) if !initialized => {
                self.send(
                    host,
                    &error(&id, route::INVALID_REQUEST, "send initialize first"),
                );
            }
            (Some(_), None) if !initialized => {}
            (Some("tools/list"), Some(id)) => {
                let bytes = {
                    let s = self.status.borrow();
                    format!(
                        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"tools\":{}}}}}\n",
                        s.tools.json()
                    )
                    .into_bytes()
                };
                self.send_bytes(host, bytes);
            }
            (Some(name), Some(id)) => {
                let name = name.to_owned();
                self.host_request(host, &name, id, message);
            }
            (Some("notifications/cancelled"), None) => {
                let theirs = message.pointer("/params/requestId").map(Value::to_string);
                if let Some(theirs) = theirs
                    && let Some(h) = self.hosts.get_mut(&host)
                    && let Some(mut record) = h.calls.remove(&theirs)
                {
                    record.finish(Outcome::Failed("cancelled by the host".into()));
                }
                let outs = self.router.from_host(host, message);
                self.deliver(outs, None);
            }
            _ => {
                let outs = self.router.from_host(host, message);
                self.deliver(outs, None);
            }
        }
    }

    fn host_request(&mut self, host: HostId, name: &str, id: Value, message: Value) {
        if self.router.in_flight(host) >= MAX_IN_FLIGHT {
            self.send(
                host,
                &error(
                    &id,
                    route::INVALID_REQUEST,
                    format!("too many requests in flight (at most {MAX_IN_FLIGHT} per session)"),
                ),
            );
            return;
        }
        if name == "tools/call" {
            let tool = message
                .pointer("/params/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if let Some(why) = self.filter.why_not(&tool) {
                let text = CallError::Filtered {
                    server: self.name.to_string(),
                    tool,
                    why,
                }
                .to_string();
                self.send(host, &error(&id, INVALID_PARAMS, text));
                return;
            }
            let key = id.to_string();
            if let Some(h) = self.hosts.get_mut(&host)
                && !h.calls.contains_key(&key)
            {
                let mut record = Record::new(&self.name, &tool, &self.counters);
                record.caller = h.caller;
                h.calls.insert(key, record);
            }
        }
        let outs = self.router.from_host(host, message);
        self.deliver(outs, None);
    }

    fn on_server(&mut self, message: Value) {
        let method = message.get("method").and_then(Value::as_str);
        let has_id = message.get("id").is_some_and(|id| !id.is_null());
        match method {
            Some("notifications/tools/list_changed") if !has_id => {
                // Hosts hear of it once mcpd has re-synced (status_changed).
                if let Some(up) = &self.upstream {
                    let _ = self.events.send(Internal::ListChanged {
                        generation: up.generation,
                    });
                }
                return;
            }
            Some("roots/list") if has_id && !self.roots.is_empty() => {
                let answer = json!({"jsonrpc": "2.0", "id": message["id"], "result": roots_result(&self.roots)});
                if let Some(up) = &self.upstream {
                    let _ = up.tx.send(answer);
                }
                return;
            }
            Some("notifications/message") => self.journal(&message),
            _ => {}
        }
        let outs = self.router.from_server(message);
        self.deliver(outs, None);
    }

    /// A server's log message also goes to the journal.
    fn journal(&self, message: &Value) {
        let params = &message["params"];
        let level = params["level"].as_str().unwrap_or("info");
        let logger = params["logger"].as_str().unwrap_or_default();
        let data = match &params["data"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
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
}

/// How an answer to a `tools/call` ends its accounting.
fn outcome_of(message: &Value) -> Outcome {
    if let Some(error) = message.get("error") {
        return Outcome::Failed(
            error["message"]
                .as_str()
                .unwrap_or("an error without a message")
                .to_owned(),
        );
    }
    if message.pointer("/result/isError") == Some(&Value::Bool(true)) {
        Outcome::ErrorResult
    } else {
        Outcome::Ok
    }
}

async fn read_host(
    host: HostId,
    mut lines: Lines<tokio::net::unix::OwnedReadHalf>,
    input: mpsc::UnboundedSender<Input>,
    mut killed: oneshot::Receiver<()>,
) {
    let permits = Arc::new(Semaphore::new(BACKLOG));
    loop {
        let frame = tokio::select! {
            frame = lines.next() => frame,
            _ = &mut killed => return,
        };
        let Some(frame) = frame else { break };
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            _ = &mut killed => return,
        };
        if input
            .send(Input::Host {
                host,
                frame,
                _permit: permit,
            })
            .is_err()
        {
            return;
        }
    }
    let _ = input.send(Input::HostGone { host });
}

async fn write_host(
    mut queue: mpsc::Receiver<Vec<u8>>,
    mut write: tokio::net::unix::OwnedWriteHalf,
) {
    let mut batch = Vec::new();
    while queue.recv_many(&mut batch, 64).await > 0 {
        for bytes in batch.drain(..) {
            if write.write_all(&bytes).await.is_err() {
                return;
            }
        }
    }
    let _ = write.shutdown().await;
}
