//! The pure routing core of host sessions (DESIGN §8): many host sessions,
//! one upstream session per generation.
//!
//! No I/O, no tasks, no clock: the session layer hands [`Router`] every
//! JSON-RPC message a host or the server sends (already read, as a
//! [`Message`]: its members' text, so unknown methods and fields pass
//! unchanged and what is not rewritten is not parsed) and sends the
//! [`Out`]s it returns. The router intervenes only where sharing
//! one upstream demands it:
//!
//! - request ids and progress tokens are rewritten per host, so answers,
//!   `notifications/progress` and `notifications/cancelled` reach exactly
//!   the host they belong to;
//! - server→client requests (`sampling/createMessage`, `elicitation/create`,
//!   `roots/list`) go to the host that caused them: the only host with a
//!   request in flight, else the most recent caller among those in flight,
//!   else the most recent caller; it must have declared the capability, or
//!   the server gets a JSON-RPC error saying why;
//! - `logging/setLevel` is per host: the upstream gets the most verbose level
//!   any host asked for, each host only messages at its own level;
//! - `resources/subscribe` is reference-counted per URI and
//!   `notifications/resources/updated` reaches only subscribed hosts;
//! - a host that detaches has its requests cancelled upstream, its
//!   subscriptions released and the requests it was asked to answer failed;
//! - an upstream that ends fails every request in flight at once
//!   ([`Out::Down`] for the session layer to answer with the §3 error) and,
//!   once re-established, gets the subscriptions and log level replayed;
//! - a task a host's request created is that host's alone ([`super::tasks`]):
//!   hosts know tasks by ids of mcpd's, a host's `tasks/*` request naming
//!   another's task is refused, a task's status and the server's questions about it reach
//!   only its host, `tasks/list` lists a host its own, and a host that
//!   detaches has its tasks cancelled;
//! - while the session layer says the upstream is coming ([`Router::hold`]:
//!   an on-demand server starting on first use, DESIGN §9), requests are
//!   held instead of failed, and sent in order once it is ready (or failed
//!   when the start fails).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use foldhash::HashMap;
use serde_json::{Value, json};

use super::error::ErrorCode;
use super::message::{Message, RequestId};
use super::method::Method;
use super::tasks::{Tasks, rename_tasks};

/// A host session, numbered by the session layer.
pub type HostId = u64;

/// URIs one host session may be subscribed to at once.
pub const MAX_SUBSCRIPTIONS: usize = 1024;

/// URIs the sessions of one unit may be subscribed to at once, together.
pub const MAX_URIS: usize = 16384;

/// The longest URI a host may subscribe to, in bytes (the counts above
/// bound subscriptions only if each is small).
pub const MAX_URI: usize = 8192;

/// What a host declared it can answer, from its `initialize`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    pub sampling: bool,
    pub elicitation: bool,
    pub roots: bool,
}

impl Owner {
    /// The host a request is of (in flight or parked).
    fn host(&self) -> Option<HostId> {
        match self {
            Owner::Host { host, .. } | Owner::Parked { host } => Some(*host),
            Owner::Mcpd | Owner::Own => None,
        }
    }
}

impl Caps {
    /// Every capability: a host whose capabilities are judged per request
    /// (MCP 2026-07-28) by the session layer, not here.
    pub const ALL: Caps = Caps {
        sampling: true,
        elicitation: true,
        roots: true,
    };

    /// From the `capabilities` object of a host's `initialize` params.
    pub fn from_initialize(params: &Value) -> Self {
        Self::of(&params["capabilities"])
    }

    /// From a `capabilities` object (a host's `initialize`, or a request's
    /// `io.modelcontextprotocol/clientCapabilities`).
    pub fn of(caps: &Value) -> Self {
        Self {
            sampling: caps.get("sampling").is_some(),
            elicitation: caps.get("elicitation").is_some(),
            roots: caps.get("roots").is_some(),
        }
    }

    /// Whether a host with these capabilities can answer `method`; `None`
    /// for a method no capability gates (`ping`; [`Method::capability`]).
    pub fn answers(self, method: Method) -> Option<bool> {
        match method {
            Method::SamplingCreateMessage => Some(self.sampling),
            Method::ElicitationCreate => Some(self.elicitation),
            Method::RootsList => Some(self.roots),
            _ => None,
        }
    }
}

/// MCP log levels (RFC 5424), most verbose first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Debug,
    Info,
    Notice,
    Warning,
    Error,
    Critical,
    Alert,
    Emergency,
}

impl Level {
    pub const ALL: [Level; 8] = [
        Level::Debug,
        Level::Info,
        Level::Notice,
        Level::Warning,
        Level::Error,
        Level::Critical,
        Level::Alert,
        Level::Emergency,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Notice => "notice",
            Level::Warning => "warning",
            Level::Error => "error",
            Level::Critical => "critical",
            Level::Alert => "alert",
            Level::Emergency => "emergency",
        }
    }
}

impl FromStr for Level {
    type Err = String;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        Level::ALL
            .into_iter()
            .find(|l| l.as_str() == word)
            .ok_or_else(|| format!("unknown log level {word:?}"))
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A host that has not set a level gets messages from this level up once
/// another host has changed the upstream's level (before that, everything
/// the server sends, as if it were alone).
pub const DEFAULT_LEVEL: Level = Level::Info;

/// Where a message goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// To the server, on the upstream session.
    Server(Message),
    /// To one host session.
    Host(HostId, Message),
    /// The upstream is not established: answer the host's request `id`
    /// with the outage error (state and next retry, DESIGN §3).
    Down { host: HostId, id: Value },
    /// The server's answer to mcpd's own request [`Router::request`] `id`.
    Answer(u64, Message),
    /// The end of upstream request `up` of host `host`, parked
    /// ([`Router::park`]) while the host supplies input: the server's
    /// answer, or none (the upstream ended).
    Parked {
        host: HostId,
        up: u64,
        answer: Option<Message>,
    },
    /// mcpd's own request `id` gets no answer: the upstream is not
    /// established, or ended.
    Unanswered(u64),
}

/// Who is waiting for the answer to an upstream request.
#[derive(Debug, Clone, PartialEq)]
enum Owner {
    Host {
        host: HostId,
        id: RequestId,
    },
    /// A request of host `host` the host has had an answer to already
    /// (an `input_required` result, MCP 2026-07-28): still open upstream,
    /// answered to the host's retry ([`Router::resume`]).
    Parked {
        host: HostId,
    },
    /// mcpd's own request (a replayed subscription, an aggregated level):
    /// the answer goes nowhere.
    Mcpd,
    /// mcpd's own request whose answer it waits for ([`Out::Answer`]).
    Own,
}

#[derive(Debug, Clone, PartialEq)]
struct Pending {
    owner: Owner,
    /// The upstream progress token of the request, if it had one.
    token: Option<u64>,
    /// The log level the request asked for (MCP 2026-07-28: per request).
    level: Option<Level>,
    /// A host's `tasks/list` (MCP 2025-11-25): its answer lists the
    /// host's own tasks only.
    lists_tasks: bool,
}

/// A server→client request handed to a host.
#[derive(Debug, Clone, PartialEq)]
struct Asked {
    /// The server's own id for it.
    server_id: RequestId,
    method: String,
}

#[derive(Debug, Clone, Default)]
struct Host {
    caps: Caps,
    level: Option<Level>,
    /// When this host last sent a request (a router-wide sequence number).
    last_call: u64,
    /// Its requests in flight upstream.
    busy: usize,
    /// The URIs it is subscribed to.
    subscribed: usize,
    /// Its log level is per request (MCP 2026-07-28), not per session:
    /// it gets log messages only while it has a request in flight that
    /// asked for them, at or above that request's level.
    by_request: bool,
    /// Its requests in flight that asked for a log level, per level.
    levels: [u32; 8],
}

/// The routing state of one unit's host sessions.
#[derive(Debug, Default)]
pub struct Router {
    hosts: BTreeMap<HostId, Host>,
    /// The upstream session is established.
    up: bool,
    next_id: u64,
    calls: u64,
    /// Upstream request id → who waits for the answer.
    pending: HashMap<u64, Pending>,
    /// (host, the host's id) → upstream request id.
    inflight: HashMap<(HostId, RequestId), u64>,
    /// Upstream progress token → the host's own token.
    tokens: HashMap<u64, (HostId, Value)>,
    /// (host, the id we gave the host) → the server's request.
    asked: HashMap<(HostId, u64), Asked>,
    /// Subscribed URIs and who subscribed.
    subscriptions: BTreeMap<String, BTreeSet<HostId>>,
    /// The level last sent upstream.
    upstream_level: Option<Level>,
    /// Requests in flight that asked for a log level, per level.
    levels: [u32; 8],
    /// The server sends log messages only for requests that asked (MCP
    /// 2026-07-28): every host gets them only while a request of its that
    /// asked is in flight.
    logs_by_request: bool,
    /// Requests are held while the upstream is down ([`Router::hold`]).
    hold: bool,
    /// Held requests, in arrival order: upstream id, rewritten message.
    held: Vec<(u64, Message)>,
    /// Whose task each of the server's tasks is (of this generation).
    tasks: Tasks<HostId>,
    /// An emptied list of what to send, its room kept for the next
    /// message's ([`Router::recycle`]): no allocation per message.
    spare: Vec<Out>,
}

fn response(id: &Value, result: Value) -> Message {
    json!({"jsonrpc": "2.0", "id": id, "result": result}).into()
}

/// `notifications/cancelled` of upstream request `up`, for the server.
fn cancelled(up: u64, reason: &str) -> Out {
    Out::Server(
        json!({
            "jsonrpc": "2.0",
            "method": Method::Cancelled.as_str(),
            "params": {"requestId": up, "reason": reason},
        })
        .into(),
    )
}

fn error(id: &Value, code: ErrorCode, message: impl Into<String>) -> Message {
    code.response(id, message).into()
}

/// The value at `path` (object keys) in `value`: `Value::pointer` without
/// its escapes, which cost allocations on every message.
pub fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| v.get(key))
}

/// Sets `params.key` (`params` as [`param`] read them); a message whose
/// params are not an object is left as it is (a lookup through it found
/// nothing to rewrite anyway).
fn set_param(msg: &mut Message, params: Option<Value>, key: &str, value: Value) {
    if let Some(mut params) = params
        && let Some(object) = params.as_object_mut()
    {
        object.insert(key.to_owned(), value);
        msg.set("params", &params);
    }
}

/// `params.key` of `msg` (null if absent), and the params parsed: for the
/// few messages whose params are read or rewritten.
fn param(msg: &Message, key: &str) -> (Option<Value>, Value) {
    let params = msg.params();
    let value = params
        .as_ref()
        .and_then(|p| p.get(key))
        .cloned()
        .unwrap_or(Value::Null);
    (params, value)
}

/// Who wrote a message whose task ids are renamed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// A host: a task id spelled with escapes is still found (a host must
    /// not reach another's task by spelling its id's key oddly).
    Host,
    /// The server: its text is searched for `taskId` as it is (an answer
    /// may be megabytes; a server that escapes its keys hides its own ids
    /// from the renaming, which a host's later use of them then fails).
    Server,
}

/// [`rename_tasks`] on a [`Message`]: its `params` and `result` are parsed
/// only when their text may name a task, and set again only when renamed.
/// `false`: a task id may not pass (the message is unchanged).
fn rename_message_tasks(
    msg: &mut Message,
    side: Side,
    rename: impl FnMut(&str) -> Option<String>,
) -> bool {
    // Built once: a searcher made per message costs more than the search.
    static TASK_ID: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new("taskId"));
    let names = |part: &str| match side {
        Side::Host => msg.may_hold(part, "taskId"),
        // `I`, a capital: rare in a result's text.
        Side::Server => msg
            .raw(part)
            .is_some_and(|raw| super::message::holds(raw.as_bytes(), b"taskId", 4, &TASK_ID)),
    };
    let parts: [(&str, bool); 2] = [("params", names("params")), ("result", names("result"))];
    if parts.iter().all(|(_, named)| !named) {
        return true;
    }
    let parts = parts
        .iter()
        .filter(|(_, named)| *named)
        .map(|(part, _)| *part);
    let mut value = Value::Object(
        parts
            .clone()
            .filter_map(|part| Some((part.to_owned(), msg.get::<Value>(part)?)))
            .collect(),
    );
    let before = value.clone();
    if !rename_tasks(&mut value, rename) {
        return false;
    }
    if value != before {
        for part in parts {
            if let Some(v) = value.get(part) {
                msg.set(part, v);
            }
        }
    }
    true
}

impl Router {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many host sessions are attached.
    pub fn sessions(&self) -> usize {
        self.hosts.len()
    }

    /// A host session whose `initialize` declared `caps`.
    pub fn attach(&mut self, host: HostId, caps: Caps) {
        self.hosts.insert(
            host,
            Host {
                caps,
                ..Host::default()
            },
        );
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends mcpd's own request upstream (its answer is dropped).
    fn own_request(&mut self, method: Method, params: Value, out: &mut Vec<Out>) {
        let id = self.fresh_id();
        self.pending.insert(
            id,
            Pending {
                owner: Owner::Mcpd,
                token: None,
                level: None,
                lists_tasks: false,
            },
        );
        out.push(Out::Server(
            json!({"jsonrpc": "2.0", "id": id, "method": method.as_str(), "params": params}).into(),
        ));
    }

    /// mcpd's own request `method` upstream, whose answer comes back as
    /// [`Out::Answer`] with the returned id (or [`Out::Unanswered`]); held
    /// (nothing to send yet) while the upstream is down and held for.
    pub fn request(&mut self, method: &str, params: Value) -> (u64, Vec<Out>) {
        let id = self.fresh_id();
        if !self.up && !self.hold {
            return (id, vec![Out::Unanswered(id)]);
        }
        self.pending.insert(
            id,
            Pending {
                owner: Owner::Own,
                token: None,
                level: None,
                lists_tasks: false,
            },
        );
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        (id, self.send_or_hold(id, msg.into()))
    }

    /// Sends `msg` (upstream id `id`) now, or holds it until the upstream
    /// is ready.
    fn send_or_hold(&mut self, id: u64, msg: Message) -> Vec<Out> {
        if self.up {
            vec![Out::Server(msg)]
        } else {
            self.held.push((id, msg));
            Vec::new()
        }
    }

    /// Whether requests made while the upstream is down wait for it
    /// (`true`: it is being started for them) or fail at once. Turning it
    /// off fails the requests held so far.
    pub fn hold(&mut self, on: bool) -> Vec<Out> {
        self.hold = on;
        if on || self.up {
            return Vec::new();
        }
        let held: Vec<u64> = self.held.drain(..).map(|(id, _)| id).collect();
        let mut out = Vec::new();
        for up in held {
            match self.forget(up).map(|p| p.owner) {
                Some(Owner::Host { host, id }) => out.push(Out::Down {
                    host,
                    id: id.to_value(),
                }),
                Some(Owner::Own) => out.push(Out::Unanswered(up)),
                Some(Owner::Mcpd | Owner::Parked { .. }) | None => {}
            }
        }
        out
    }

    /// Requests are held for the upstream.
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether any host has a request in flight upstream (or held).
    pub fn hosts_busy(&self) -> bool {
        self.hosts.values().any(|h| h.busy > 0)
    }

    /// mcpd no longer waits for its own request `id`: the server is told
    /// to stop working on it.
    pub fn cancel(&mut self, id: u64) -> Vec<Out> {
        match self.pending.get(&id) {
            Some(Pending {
                owner: Owner::Own, ..
            }) => {
                self.forget(id);
                vec![cancelled(id, "the caller left")]
            }
            _ => Vec::new(),
        }
    }

    /// The log level host `host` asked for with `logging/setLevel`.
    pub fn level(&self, host: HostId) -> Option<Level> {
        self.hosts.get(&host).and_then(|h| h.level)
    }

    /// Whether the server sends log messages only for the requests that
    /// asked for them (a server of MCP 2026-07-28): then each host gets
    /// them only while one of its requests that asked is in flight, at or
    /// above its level.
    pub fn logs_by_request(&mut self, on: bool) {
        self.logs_by_request = on;
    }

    /// Whose request upstream request `up` is: a host's, and its own id.
    pub fn owner(&self, up: u64) -> Option<(HostId, &RequestId)> {
        match &self.pending.get(&up)?.owner {
            Owner::Host { host, id } => Some((*host, id)),
            _ => None,
        }
    }

    /// The server's own id of the request sent host `host` as `down`.
    pub fn asked(&self, host: HostId, down: u64) -> Option<&RequestId> {
        self.asked.get(&(host, down)).map(|a| &a.server_id)
    }

    /// How many requests of host `host` are in flight upstream.
    pub fn in_flight(&self, host: HostId) -> usize {
        self.hosts.get(&host).map_or(0, |h| h.busy)
    }

    /// Requests in flight upstream (or held, or parked) of every host;
    /// mcpd's own (list reads, replayed subscriptions, probes) are not
    /// counted: a host's bound is the hosts' alone.
    pub fn requests(&self) -> usize {
        self.hosts.values().map(|h| h.busy).sum()
    }

    /// Why host `host` may not subscribe to `uri` now, if it may not:
    /// at most [`MAX_SUBSCRIPTIONS`] URIs per host and [`MAX_URIS`] per
    /// unit (a subscription held already is no new one).
    fn refuse_subscription(&self, host: HostId, uri: &str) -> Option<String> {
        if uri.len() > MAX_URI {
            return Some(format!(
                "a URI of {} bytes is too long to subscribe to (at most {MAX_URI})",
                uri.len()
            ));
        }
        let subscribers = self.subscriptions.get(uri);
        if subscribers.is_some_and(|s| s.contains(&host)) {
            return None;
        }
        if self
            .hosts
            .get(&host)
            .is_some_and(|h| h.subscribed >= MAX_SUBSCRIPTIONS)
        {
            return Some(format!(
                "too many subscriptions (at most {MAX_SUBSCRIPTIONS} per session)"
            ));
        }
        if subscribers.is_none() && self.subscriptions.len() >= MAX_URIS {
            return Some(format!(
                "too many subscriptions on this server (at most {MAX_URIS} URIs for all its sessions)"
            ));
        }
        None
    }

    /// Whether host `host` has a request `id` in flight (or held): a
    /// request reusing it is refused.
    pub fn in_use(&self, host: HostId, id: &RequestId) -> bool {
        self.inflight.contains_key(&(host, id.clone()))
    }

    /// The most verbose level any host asked for.
    fn wanted_level(&self) -> Option<Level> {
        let by_request = Level::ALL
            .into_iter()
            .find(|l| self.levels[*l as usize] > 0);
        self.hosts
            .values()
            .filter_map(|h| h.level)
            .chain(by_request)
            .min()
    }

    /// Tells the server the aggregated level when it changed.
    /// Once no host asks for a level any more, the server is set back to
    /// [`DEFAULT_LEVEL`] (a debug level nobody reads would flood the
    /// session for nothing).
    fn sync_level(&mut self, out: &mut Vec<Out>) {
        let wanted = match self.wanted_level() {
            Some(level) => Some(level),
            None => self.upstream_level.map(|_| DEFAULT_LEVEL),
        };
        if wanted.is_some() && wanted != self.upstream_level {
            self.upstream_level = wanted;
            if self.up
                && let Some(level) = wanted
            {
                self.own_request(
                    Method::LoggingSetLevel,
                    json!({"level": level.as_str()}),
                    out,
                );
            }
        }
    }

    /// Request `method` of host `host`, whose id `id` the caller read
    /// already (as [`Router::from_host`] would, without reading it again).
    pub fn request_from(
        &mut self,
        host: HostId,
        id: RequestId,
        method: &str,
        msg: Message,
    ) -> Vec<Out> {
        let mut msg = msg;
        let mut out = std::mem::take(&mut self.spare);
        if self.hosts.contains_key(&host) {
            self.host_request(host, (method, id, None), &mut msg, &mut out);
        }
        out
    }

    /// A host whose capabilities and log level are per request (MCP
    /// 2026-07-28): the session layer judges its capabilities for each
    /// server→client request, so the router hands it every one it caused.
    pub fn attach_by_request(&mut self, host: HostId) {
        self.hosts.insert(
            host,
            Host {
                caps: Caps::ALL,
                by_request: true,
                ..Host::default()
            },
        );
    }

    /// Request `method` of host `host` (as [`Router::request_from`]) that
    /// asked for log messages from `level` up while it is in flight.
    pub fn request_logged(
        &mut self,
        host: HostId,
        (id, method, level): (RequestId, &str, Option<Level>),
        msg: Message,
    ) -> Vec<Out> {
        let mut msg = msg;
        let mut out = std::mem::take(&mut self.spare);
        if self.hosts.contains_key(&host) {
            self.host_request(host, (method, id, level), &mut msg, &mut out);
        }
        out
    }

    /// Host `host` has had its answer to request `id` from mcpd (an
    /// `input_required` result) while the request stays open upstream:
    /// the id is the host's to use again, and the server's answer comes
    /// as [`Out::Parked`] unless [`Router::resume`] gives it an id again.
    /// Returns the upstream id.
    pub fn park(&mut self, host: HostId, id: &RequestId) -> Option<u64> {
        let up = self.inflight.remove(&(host, id.clone()))?;
        if let Some(p) = self.pending.get_mut(&up) {
            p.owner = Owner::Parked { host };
        }
        Some(up)
    }

    /// Parked upstream request `up` of host `host` is the host's request
    /// `id` again (its retry): the server's answer goes to it. False if
    /// `up` is not parked for `host` or `id` is in use.
    pub fn resume(&mut self, host: HostId, up: u64, id: RequestId) -> bool {
        if self.in_use(host, &id) {
            return false;
        }
        match self.pending.get_mut(&up) {
            Some(p) if p.owner == (Owner::Parked { host }) => {
                p.owner = Owner::Host {
                    host,
                    id: id.clone(),
                };
                self.inflight.insert((host, id), up);
                true
            }
            _ => false,
        }
    }

    /// Parked upstream request `up` will never be asked for again (its
    /// host did not retry in time): the server is told to stop.
    pub fn abandon(&mut self, up: u64, reason: &str) -> Vec<Out> {
        let parked = matches!(
            self.pending.get(&up),
            Some(Pending {
                owner: Owner::Parked { .. },
                ..
            })
        );
        let mut out = Vec::new();
        if parked {
            self.forget(up);
            if self.up {
                out.push(cancelled(up, reason));
            }
            self.sync_level(&mut out);
        }
        out
    }

    /// Host `host` listens for updates of `uri` (MCP 2026-07-28
    /// `subscriptions/listen`), counted with the hosts' `resources/subscribe`:
    /// the server is subscribed by mcpd when it is the first. Why not, if
    /// it may not.
    pub fn subscribe(&mut self, host: HostId, uri: &str) -> Result<Vec<Out>, String> {
        if let Some(why) = self.refuse_subscription(host, uri) {
            return Err(why);
        }
        let mut out = Vec::new();
        let subscribers = self.subscriptions.entry(uri.to_owned()).or_default();
        if subscribers.insert(host) {
            let first = subscribers.len() == 1;
            if let Some(h) = self.hosts.get_mut(&host) {
                h.subscribed += 1;
            }
            if first && self.up {
                self.own_request(Method::ResourcesSubscribe, json!({"uri": uri}), &mut out);
            }
        }
        Ok(out)
    }

    /// Host `host` no longer listens for updates of `uri`: the server is
    /// unsubscribed by mcpd when it was the last.
    pub fn unsubscribe(&mut self, host: HostId, uri: &str) -> Vec<Out> {
        let mut out = Vec::new();
        let Some(subscribers) = self.subscriptions.get_mut(uri) else {
            return out;
        };
        if subscribers.remove(&host) {
            if let Some(h) = self.hosts.get_mut(&host) {
                h.subscribed = h.subscribed.saturating_sub(1);
            }
            if subscribers.is_empty() {
                self.subscriptions.remove(uri);
                if self.up {
                    self.own_request(Method::ResourcesUnsubscribe, json!({"uri": uri}), &mut out);
                }
            }
        }
        out
    }

    /// Takes back a list of what to send, emptied, for its room (a
    /// large one is let go).
    pub fn recycle(&mut self, mut out: Vec<Out>) {
        out.clear();
        if out.capacity() <= 16 && out.capacity() > self.spare.capacity() {
            self.spare = out;
        }
    }

    /// A message from host `host`.
    pub fn from_host(&mut self, host: HostId, msg: impl Into<Message>) -> Vec<Out> {
        let mut msg = msg.into();
        let mut out = std::mem::take(&mut self.spare);
        if !self.hosts.contains_key(&host) {
            return out;
        }
        // JSON-RPC allows a null id only in error responses; MCP ids are
        // strings or numbers.
        let null_id = msg.raw("id") == Some("null");
        let id = msg.request_id();
        let method = msg.method().map(|m| m.into_owned());
        if null_id && method.is_some() {
            out.push(Out::Host(
                host,
                error(
                    &Value::Null,
                    ErrorCode::InvalidRequest,
                    "a request id must be a string or a number",
                ),
            ));
            return out;
        }
        match (method, id) {
            // A request.
            (Some(name), Some(id)) => {
                self.host_request(host, (&name, id, None), &mut msg, &mut out);
            }
            // A notification.
            (Some(name), None) => self.host_notification(host, &name, &mut msg, &mut out),
            // The answer to a server→client request we handed this host.
            (None, Some(id)) => {
                let asked = id
                    .as_u64()
                    .and_then(|down| self.asked.remove(&(host, down)));
                if let Some(asked) = asked {
                    msg.set_id(asked.server_id);
                    out.push(Out::Server(msg));
                }
                // An answer to a request nobody made: dropped.
            }
            (None, None) => out.push(Out::Host(
                host,
                error(
                    &Value::Null,
                    ErrorCode::InvalidRequest,
                    "a message needs a method or an id",
                ),
            )),
        }
        out
    }

    fn host_request(
        &mut self,
        host: HostId,
        (name, id, level): (&str, RequestId, Option<Level>),
        msg: &mut Message,
        out: &mut Vec<Out>,
    ) {
        if self.in_use(host, &id) {
            out.push(Out::Host(
                host,
                error(
                    &id.to_value(),
                    ErrorCode::InvalidRequest,
                    format!("request id {id} is already in use"),
                ),
            ));
            return;
        }
        self.calls += 1;
        if let Some(h) = self.hosts.get_mut(&host) {
            h.last_call = self.calls;
        }
        let method = Method::parse(name);
        match method {
            Method::Ping => {
                out.push(Out::Host(host, response(&id.to_value(), json!({}))));
                return;
            }
            Method::LoggingSetLevel => {
                let (_, level) = param(msg, "level");
                let level = level.as_str().map(Level::from_str);
                match level {
                    Some(Ok(level)) => {
                        if let Some(h) = self.hosts.get_mut(&host) {
                            h.level = Some(level);
                        }
                        self.sync_level(out);
                        out.push(Out::Host(host, response(&id.to_value(), json!({}))));
                    }
                    _ => out.push(Out::Host(
                        host,
                        error(
                            &id.to_value(),
                            ErrorCode::InvalidParams,
                            "logging/setLevel needs a valid `level`",
                        ),
                    )),
                }
                return;
            }
            Method::ResourcesSubscribe | Method::ResourcesUnsubscribe => {
                let (_, uri) = param(msg, "uri");
                let Some(uri) = uri.as_str().map(str::to_owned) else {
                    out.push(Out::Host(
                        host,
                        error(
                            &id.to_value(),
                            ErrorCode::InvalidParams,
                            format!("{name} needs a `uri`"),
                        ),
                    ));
                    return;
                };
                let subscribing = method == Method::ResourcesSubscribe;
                if subscribing && let Some(why) = self.refuse_subscription(host, &uri) {
                    let refusal = error(&id.to_value(), ErrorCode::InvalidRequest, why);
                    out.push(Out::Host(host, refusal));
                    return;
                }
                let subscribers = self.subscriptions.entry(uri.clone()).or_default();
                let (changed, forward) = if subscribing {
                    let added = subscribers.insert(host);
                    (added, added && subscribers.len() == 1)
                } else {
                    let removed = subscribers.remove(&host);
                    let last = subscribers.is_empty();
                    if last {
                        self.subscriptions.remove(&uri);
                    }
                    (removed, removed && last)
                };
                if changed && let Some(h) = self.hosts.get_mut(&host) {
                    if subscribing {
                        h.subscribed += 1;
                    } else {
                        h.subscribed = h.subscribed.saturating_sub(1);
                    }
                }
                if !(forward && self.up) {
                    // Shared, or replayed when the upstream is back.
                    out.push(Out::Host(host, response(&id.to_value(), json!({}))));
                    return;
                }
            }
            _ => {}
        }
        // A task is named by the id its host knows: the server's own, or
        // refused when it is no task of this host's. Only `tasks/*`
        // requests name one (a host's other requests pass as they are:
        // the server's ids, which no host is given, are all they could
        // reach another's task by).
        let mut unknown = None;
        if name.starts_with("tasks/")
            && !rename_message_tasks(msg, Side::Host, |down| {
                let up = self.tasks.to_server(host, down).map(str::to_owned);
                if up.is_none() {
                    unknown = Some(down.to_owned());
                }
                up
            })
        {
            let why = format!(
                "no task `{}` of this session's: it is over, forgotten after the server restarted, or another session's",
                unknown.unwrap_or_default()
            );
            out.push(Out::Host(
                host,
                error(&id.to_value(), ErrorCode::InvalidParams, why),
            ));
            return;
        }
        if !self.up && !self.hold {
            out.push(Out::Down {
                host,
                id: id.to_value(),
            });
            return;
        }
        let up_id = self.fresh_id();
        let token = if msg.may_hold("params", "progressToken") {
            self.own_token(host, msg)
        } else {
            None
        };
        self.inflight.insert((host, id.clone()), up_id);
        if let Some(h) = self.hosts.get_mut(&host) {
            h.busy += 1;
            if let Some(level) = level {
                h.levels[level as usize] += 1;
            }
        }
        if let Some(level) = level {
            self.levels[level as usize] += 1;
            // Told before the request, on the same pipe.
            self.sync_level(out);
        }
        self.pending.insert(
            up_id,
            Pending {
                owner: Owner::Host { host, id },
                token,
                level,
                lists_tasks: method == Method::TasksList,
            },
        );
        msg.set_number("id", up_id);
        let sent = self.send_or_hold(up_id, std::mem::take(msg));
        out.extend(sent);
    }

    fn host_notification(
        &mut self,
        host: HostId,
        name: &str,
        msg: &mut Message,
        out: &mut Vec<Out>,
    ) {
        match Method::parse(name) {
            // The upstream was initialized by mcpd.
            Method::Initialized => {}
            Method::Cancelled => {
                let (params, theirs) = param(msg, "requestId");
                let theirs = RequestId::of(&theirs);
                if let Some(up) = theirs.and_then(|id| self.inflight.get(&(host, id)).copied()) {
                    // The server will not answer a cancelled request (and
                    // a held one is never sent).
                    self.forget(up);
                    if self.up {
                        set_param(msg, params, "requestId", json!(up));
                        out.push(Out::Server(std::mem::take(msg)));
                    }
                }
            }
            _ => {
                if self.up {
                    out.push(Out::Server(std::mem::take(msg)));
                }
            }
        }
    }

    /// Gives the progress token in `msg` (from `host`) one of mcpd's
    /// own, kept to route the server's progress back: set in the text
    /// where a scan can tell where it is (as SDKs write it), else in the
    /// parsed params.
    fn own_token(&mut self, host: HostId, msg: &mut Message) -> Option<u64> {
        let mut token = None;
        let set = msg.set_meta_number("progressToken", |theirs| {
            // Checked when the line was read; a number serde_json cannot
            // hold (`1e400`) leaves the request as it is, as a failed
            // parse of the params does below.
            let theirs: Value = serde_json::from_str(theirs).ok()?;
            token = Some(self.keep_token(host, theirs));
            token
        });
        if set.is_ok() {
            return token;
        }
        let mut params = msg.params()?;
        let theirs = at(&params, &["_meta", "progressToken"]).cloned()?;
        let ours = self.keep_token(host, theirs);
        params["_meta"]["progressToken"] = json!(ours);
        msg.set("params", &params);
        Some(ours)
    }

    /// One of mcpd's own numbers for `host`'s progress token `theirs`,
    /// kept to route the server's progress back.
    fn keep_token(&mut self, host: HostId, theirs: Value) -> u64 {
        let ours = self.fresh_id();
        self.tokens.insert(ours, (host, theirs));
        ours
    }

    /// Drops upstream request `up` and its progress token.
    fn forget(&mut self, up: u64) -> Option<Pending> {
        let pending = self.pending.remove(&up)?;
        if !self.up {
            self.held.retain(|(id, _)| *id != up);
        }
        if let Some(token) = pending.token {
            self.tokens.remove(&token);
        }
        if let Owner::Host { host, id } = &pending.owner {
            self.inflight.remove(&(*host, id.clone()));
        }
        if let Some(host) = pending.owner.host()
            && let Some(h) = self.hosts.get_mut(&host)
        {
            h.busy = h.busy.saturating_sub(1);
            if let Some(level) = pending.level {
                h.levels[level as usize] = h.levels[level as usize].saturating_sub(1);
            }
        }
        if let Some(level) = pending.level {
            self.levels[level as usize] = self.levels[level as usize].saturating_sub(1);
        }
        Some(pending)
    }

    /// A message from the server on the upstream session.
    pub fn from_server(&mut self, msg: impl Into<Message>) -> Vec<Out> {
        let mut msg = msg.into();
        let mut out = std::mem::take(&mut self.spare);
        if msg.raw("id") == Some("null") {
            // Not a request (MCP ids are strings or numbers), and an error
            // about something unparseable belongs to nobody.
            return out;
        }
        let method = msg.method().map(|m| m.into_owned());
        match method {
            // An answer: its id is one mcpd gave, an integer (read as
            // text, made into no RequestId).
            None => {
                let Some(up) = msg.raw("id").and_then(|raw| raw.parse::<u64>().ok()) else {
                    return out;
                };
                let pending = self.forget(up);
                let level = pending.as_ref().and_then(|p| p.level);
                let lists_tasks = pending.as_ref().is_some_and(|p| p.lists_tasks);
                match pending.map(|p| p.owner) {
                    Some(Owner::Host { host, id }) => {
                        self.tasks_for(host, &mut msg, lists_tasks);
                        msg.set_id(id);
                        out.push(Out::Host(host, msg));
                    }
                    Some(Owner::Parked { host }) => {
                        self.tasks_for(host, &mut msg, false);
                        out.push(Out::Parked {
                            host,
                            up,
                            answer: Some(msg),
                        });
                    }
                    Some(Owner::Own) => out.push(Out::Answer(up, msg)),
                    Some(Owner::Mcpd) | None => {}
                }
                if level.is_some() {
                    // The request that asked for the level is done.
                    self.sync_level(&mut out);
                }
            }
            Some(name) => match msg.request_id() {
                Some(id) => self.server_request(&name, id, msg, &mut out),
                None => self.server_notification(Method::parse(&name), msg, &mut out),
            },
        }
        out
    }

    /// Who answers a server→client request `method`: see the module docs.
    fn answerer(&self, (name, method): (&str, Method)) -> Result<HostId, String> {
        let busy: BTreeSet<HostId> = self
            .pending
            .values()
            .filter_map(|p| p.owner.host())
            .collect();
        let capable = |h: &HostId| {
            self.hosts
                .get(h)
                .is_some_and(|host| host.caps.answers(method) != Some(false))
        };
        let latest = |hosts: &mut dyn Iterator<Item = HostId>| {
            hosts.max_by_key(|h| self.hosts.get(h).map_or(0, |host| host.last_call))
        };
        // A host with a request in flight caused it: one of them answers,
        // never an idle host.
        let cause = match busy.len() {
            0 => None,
            1 => busy.first().copied(),
            _ => Some(
                latest(&mut busy.iter().copied().filter(capable))
                    .ok_or_else(|| {
                        format!(
                            "none of the hosts with a request in flight declared the capability {name} needs"
                        )
                    })?,
            ),
        };
        match cause {
            Some(host) if capable(&host) => Ok(host),
            Some(host) => Err(format!(
                "the host whose request caused {name} (session {host}) did not declare the capability"
            )),
            None => latest(&mut self.hosts.keys().copied().filter(capable)).ok_or_else(|| {
                if self.hosts.is_empty() {
                    format!("no host is attached to answer {name}")
                } else {
                    format!("no attached host declared the capability {name} needs")
                }
            }),
        }
    }

    fn server_request(&mut self, name: &str, id: RequestId, mut msg: Message, out: &mut Vec<Out>) {
        let method = Method::parse(name);
        if method == Method::Ping {
            out.push(Out::Server(response(&id.to_value(), json!({}))));
            return;
        }
        // A question about a task goes to the task's host, and to no
        // other when that host cannot answer it.
        let answerer = match self.task_owner(&mut msg) {
            None => self.answerer((name, method)),
            Some(Some(host)) => match self.hosts.get(&host) {
                Some(h) if h.caps.answers(method) != Some(false) => Ok(host),
                _ => Err(format!(
                    "the host whose task {name} is about (session {host}) did not declare the capability"
                )),
            },
            Some(None) => Err(format!("{name} is about a task no attached host has")),
        };
        match answerer {
            Ok(host) => {
                let down = self.fresh_id();
                self.asked.insert(
                    (host, down),
                    Asked {
                        server_id: id,
                        method: name.to_owned(),
                    },
                );
                msg.set("id", &down);
                out.push(Out::Host(host, msg));
            }
            Err(why) => out.push(Out::Server(error(
                &id.to_value(),
                ErrorCode::MethodNotFound,
                why,
            ))),
        }
    }

    fn server_notification(&mut self, method: Method, mut msg: Message, out: &mut Vec<Out>) {
        // A task's status, or a log message about one: its host's alone
        // (progress and cancellations are routed by token and id).
        if !matches!(method, Method::Progress | Method::Cancelled)
            && let Some(owner) = self.task_owner(&mut msg)
        {
            if let Some(host) = owner {
                out.push(Out::Host(host, msg));
            }
            return;
        }
        match method {
            Method::Progress => {
                let (params, token) = param(&msg, "progressToken");
                let owner = token.as_u64().and_then(|t| self.tokens.get(&t)).cloned();
                if let Some((host, theirs)) = owner {
                    set_param(&mut msg, params, "progressToken", theirs);
                    out.push(Out::Host(host, msg));
                }
            }
            Method::Cancelled => {
                // The server withdraws a request it handed a host.
                let (params, theirs) = param(&msg, "requestId");
                let theirs = RequestId::of(&theirs);
                let found = self
                    .asked
                    .iter()
                    .find_map(|(key, a)| (Some(&a.server_id) == theirs.as_ref()).then_some(*key));
                if let Some((host, down)) = found {
                    self.asked.remove(&(host, down));
                    set_param(&mut msg, params, "requestId", json!(down));
                    out.push(Out::Host(host, msg));
                }
            }
            Method::LogMessage => {
                let (_, level) = param(&msg, "level");
                let level = level.as_str().map(Level::from_str);
                let floor_default = self.upstream_level.map(|_| DEFAULT_LEVEL);
                for (id, host) in &self.hosts {
                    if host.by_request || self.logs_by_request {
                        // Only while a request of its asked, at or above
                        // the most verbose level its requests asked for.
                        let asked = Level::ALL
                            .into_iter()
                            .find(|l| host.levels[*l as usize] > 0);
                        let shown = match (&level, asked) {
                            (_, None) => false,
                            (Some(Ok(level)), Some(floor)) => *level >= floor,
                            (_, Some(_)) => true,
                        };
                        if shown {
                            out.push(Out::Host(*id, msg.clone()));
                        }
                        continue;
                    }
                    let floor = host.level.or(floor_default);
                    let shown = match (&level, floor) {
                        (_, None) => true,
                        (Some(Ok(level)), Some(floor)) => *level >= floor,
                        // An unknown level: pass it on.
                        (_, Some(_)) => true,
                    };
                    if shown {
                        out.push(Out::Host(*id, msg.clone()));
                    }
                }
            }
            Method::ResourcesUpdated => {
                let (_, uri) = param(&msg, "uri");
                let uri = uri.as_str().unwrap_or_default();
                for host in self.subscriptions.get(uri).into_iter().flatten() {
                    out.push(Out::Host(*host, msg.clone()));
                }
            }
            // list_changed and everything else reach every host.
            _ => {
                for host in self.hosts.keys() {
                    out.push(Out::Host(*host, msg.clone()));
                }
            }
        }
    }

    /// The server's answer to `host`: the tasks it names become `host`'s,
    /// under ids of mcpd's; of a `tasks/list`, only `host`'s are kept.
    fn tasks_for(&mut self, host: HostId, msg: &mut Message, lists_tasks: bool) {
        rename_message_tasks(msg, Side::Server, |up| Some(self.tasks.created(host, up)));
        if lists_tasks
            && msg.raw("result").is_some()
            && let Some(mut result) = msg.get::<Value>("result")
            && let Some(tasks) = result.get_mut("tasks").and_then(Value::as_array_mut)
        {
            tasks.retain_mut(|task| {
                let mine = task["taskId"]
                    .as_str()
                    .and_then(|up| self.tasks.to_host(up))
                    .filter(|(owner, _)| *owner == host)
                    .map(|(_, down)| down.to_owned());
                match mine {
                    Some(down) => {
                        task["taskId"] = Value::String(down);
                        true
                    }
                    None => false,
                }
            });
            msg.set("result", &result);
        }
    }

    /// Whose task the server's message `msg` names: None if it names
    /// none; Some(None) if it names one no host has (it goes nowhere);
    /// else the host, `msg` renamed for it.
    fn task_owner(&self, msg: &mut Message) -> Option<Option<HostId>> {
        let mut owner: Option<Option<HostId>> = None;
        let mut named = false;
        let renamed = rename_message_tasks(msg, Side::Server, |up| {
            named = true;
            match self.tasks.to_host(up) {
                Some((host, down)) if owner.is_none_or(|o| o == Some(host)) => {
                    owner = Some(Some(host));
                    Some(down.to_owned())
                }
                _ => {
                    owner = Some(None);
                    None
                }
            }
        });
        if !named {
            return None;
        }
        Some(if renamed { owner.flatten() } else { None })
    }

    /// Host `host` is gone: its requests are cancelled upstream, its
    /// subscriptions released, the requests it was asked to answer failed.
    pub fn detach(&mut self, host: HostId) -> Vec<Out> {
        let mut out = Vec::new();
        if self.hosts.remove(&host).is_none() {
            return out;
        }
        let mut mine: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.owner.host() == Some(host))
            .map(|(up, _)| *up)
            .collect();
        mine.sort_unstable();
        for up in mine {
            self.forget(up);
            if self.up {
                out.push(cancelled(up, "the host disconnected"));
            }
        }
        let mut asked: Vec<(HostId, u64)> = self
            .asked
            .keys()
            .filter(|(h, _)| *h == host)
            .copied()
            .collect();
        asked.sort_unstable();
        for key in asked {
            if let Some(a) = self.asked.remove(&key) {
                out.push(Out::Server(error(
                    &a.server_id.to_value(),
                    ErrorCode::InternalError,
                    format!("the host asked to answer {} disconnected", a.method),
                )));
            }
        }
        let released: Vec<String> = self
            .subscriptions
            .iter_mut()
            .filter_map(|(uri, hosts)| {
                (hosts.remove(&host) && hosts.is_empty()).then(|| uri.clone())
            })
            .collect();
        for uri in released {
            self.subscriptions.remove(&uri);
            if self.up {
                self.own_request(Method::ResourcesUnsubscribe, json!({"uri": uri}), &mut out);
            }
        }
        // Nobody can read its tasks' results any more.
        let mut tasks = self.tasks.detach(host);
        tasks.sort_unstable();
        for up in tasks {
            if self.up {
                self.own_request(Method::TasksCancel, json!({"taskId": up}), &mut out);
            }
        }
        self.sync_level(&mut out);
        out
    }

    /// The upstream session ended: every host request in flight is failed
    /// now, server→client requests are void.
    pub fn upstream_lost(&mut self) -> Vec<Out> {
        self.up = false;
        self.held.clear();
        // The next generation knows none of this one's tasks.
        self.tasks = Tasks::default();
        let mut failed: Vec<(HostId, RequestId)> = Vec::new();
        let mut own: Vec<u64> = Vec::new();
        let mut parked: Vec<(HostId, u64)> = Vec::new();
        for (up, p) in self.pending.drain() {
            match p.owner {
                Owner::Host { host, id } => failed.push((host, id)),
                Owner::Parked { host } => parked.push((host, up)),
                Owner::Own => own.push(up),
                Owner::Mcpd => {}
            }
        }
        failed.sort_unstable();
        own.sort_unstable();
        parked.sort_unstable();
        self.inflight.clear();
        self.tokens.clear();
        self.levels = [0; 8];
        for h in self.hosts.values_mut() {
            h.busy = 0;
            h.levels = [0; 8];
        }
        let mut asked: Vec<(HostId, u64)> = self.asked.drain().map(|(key, _)| key).collect();
        asked.sort_unstable();
        own.into_iter()
            .map(Out::Unanswered)
            .chain(failed.into_iter().map(|(host, id)| Out::Down {
                host,
                id: id.to_value(),
            }))
            // Calls parked for their host's input: their retry gets the
            // outage error.
            .chain(parked.into_iter().map(|(host, up)| Out::Parked {
                host,
                up,
                answer: None,
            }))
            // Questions the server asked hosts are void: say so, so no
            // dialog waits for an answer that would be dropped.
            .chain(asked.into_iter().map(|(host, down)| {
                Out::Host(
                    host,
                    json!({
                        "jsonrpc": "2.0",
                        "method": Method::Cancelled.as_str(),
                        "params": {"requestId": down, "reason": "the server connection was lost"},
                    })
                    .into(),
                )
            }))
            .collect()
    }

    /// A new upstream session is established: subscriptions and the log
    /// level are replayed on it.
    pub fn upstream_ready(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        self.up = true;
        let uris: Vec<String> = self.subscriptions.keys().cloned().collect();
        for uri in uris {
            self.own_request(Method::ResourcesSubscribe, json!({"uri": uri}), &mut out);
        }
        self.upstream_level = None;
        self.sync_level(&mut out);
        // What waited for it, in order.
        out.extend(self.held.drain(..).map(|(_, msg)| Out::Server(msg)));
        out
    }
}
