//! A server of MCP 2026-07-28 upstream (DESIGN §12): what the session task
//! does so that every host, of either era, gets what it speaks.
//!
//! - every request on its way upstream carries the modern `_meta`: a
//!   2025 host's capabilities, identity and log level (from its
//!   `initialize` and `logging/setLevel`), mcpd's own for mcpd's requests;
//!   a modern host's request keeps its own;
//! - the hosts' subscriptions (reference-counted by the router, whose
//!   `resources/subscribe` and `unsubscribe` are taken here) and mcpd's
//!   need of `list_changed` are one `subscriptions/listen` of mcpd's,
//!   opened again when what it listens to changes, and with each
//!   generation; `logging/setLevel` never goes upstream (the level goes in
//!   each request), and liveness probes are `server/discover`;
//! - an `input_required` answer to a 2025 host becomes the requests it
//!   holds, sent to that host as server→client requests; once it answered
//!   them all, mcpd retries upstream with its answers and the server's
//!   `requestState`, for as many rounds as the server asks.

use std::collections::BTreeSet;

use foldhash::HashMap;
use serde_json::{Map, Value, json};

use super::super::era;
use super::super::error::ErrorCode;
use super::super::message::{Message, RequestId};
use super::super::method::Method;
use super::super::route::{Caps, HostId, Level};
use super::super::wire::line;
use super::{Core, Out};

/// What mcpd declares it can answer to a server (its own requests'
/// capabilities, and an upstream's handshake).
pub fn client_capabilities() -> Value {
    json!({
        "sampling": {},
        "elicitation": {"form": {}, "url": {}},
        "roots": {"listChanged": true},
    })
}

/// The `_meta` of mcpd's own requests to a server of MCP 2026-07-28.
pub fn mcpd_meta() -> Value {
    json!({
        era::VERSION_KEY: era::MODERN,
        era::CAPABILITIES_KEY: client_capabilities(),
        era::CLIENT_INFO_KEY: {"name": "mcpd", "version": env!("CARGO_PKG_VERSION")},
    })
}

/// `params` with mcpd's `_meta` (its own keys kept).
pub fn with_mcpd_meta(mut params: Value) -> Value {
    if !params.is_object() {
        params = json!({});
    }
    let meta = &mut params["_meta"];
    if !meta.is_object() {
        *meta = json!({});
    }
    if let (Some(meta), Value::Object(ours)) = (meta.as_object_mut(), mcpd_meta()) {
        meta.extend(ours);
    }
    params
}

/// The answer to a server's `roots/list` from the unit's `roots`.
pub fn roots_result(roots: &[String]) -> Value {
    json!({"roots": roots.iter().map(|uri| json!({"uri": uri})).collect::<Vec<_>>()})
}

/// What a 2025 host needs when its server speaks MCP 2026-07-28.
#[derive(Debug, Default)]
pub(super) struct Translated {
    /// The `_meta` members its requests carry upstream (its capabilities
    /// and identity, from its `initialize`), as JSON text.
    meta: String,
    /// What it declared it can answer.
    caps: Caps,
    /// Its requests in flight that may be answered `input_required`: what
    /// to retry.
    sent: HashMap<RequestId, Sent>,
    /// Requests mcpd made of it for an `input_required` answer: their id
    /// → the request of its they are for, and their key.
    asked: HashMap<String, (RequestId, String)>,
    /// Its requests waiting for its answers to what mcpd asked.
    retries: HashMap<RequestId, Retry>,
}

#[derive(Debug)]
struct Sent {
    method: String,
    message: Message,
    level: Option<Level>,
}

#[derive(Debug)]
struct Retry {
    sent: Sent,
    state: Option<Value>,
    /// Each key of the server's `inputRequests`, with the host's answer
    /// once it gave it.
    answers: Map<String, Value>,
    waiting: usize,
}

/// Questions mcpd may have waiting for one host at once.
const MAX_ASKED: usize = 1024;

impl Translated {
    /// For a host whose `initialize` had `params`.
    pub(super) fn of_initialize(params: &Value) -> Self {
        let caps = params
            .get("capabilities")
            .filter(|c| c.is_object())
            .cloned()
            .unwrap_or_else(|| json!({}));
        let mut meta = format!(
            "\"{}\":\"{}\",\"{}\":{caps}",
            era::VERSION_KEY,
            era::MODERN,
            era::CAPABILITIES_KEY
        );
        if let Some(info) = params.get("clientInfo").filter(|i| i.is_object()) {
            meta.push_str(&format!(",\"{}\":{info}", era::CLIENT_INFO_KEY));
        }
        Self {
            meta,
            caps: Caps::from_initialize(params),
            ..Self::default()
        }
    }
}

impl Translated {
    /// Whether anything is kept for a request of its in flight.
    pub(super) fn keeps_any(&self) -> bool {
        !self.sent.is_empty()
    }

    /// Its request `id` was cancelled: nothing of it is kept (questions
    /// asked for it are left to its answers, which are then dropped).
    pub(super) fn cancelled(&mut self, id: &RequestId) {
        self.sent.remove(id);
        if self.retries.remove(id).is_some() {
            self.asked.retain(|_, (r, _)| r != id);
        }
    }
}

/// `message` with `meta` (JSON text of members) and the log level in its
/// params' `_meta` (a 2025 host's request going to a modern server).
fn with_meta(message: &mut Message, meta: &str, level: Option<Level>) {
    match level {
        Some(level) => era::add_meta(
            message,
            &format!("{meta},\"{}\":\"{}\"", era::LOG_LEVEL_KEY, level.as_str()),
        ),
        None => era::add_meta(message, meta),
    }
}

impl Core {
    /// Whether the server of the current (or last) generation speaks MCP
    /// 2026-07-28.
    pub(super) fn modern_upstream(&self) -> bool {
        self.modern_up
    }

    /// A 2025 host's request `message` (`method`, `id`) on its way to a
    /// modern server: its `_meta`, and what to retry it with if it is
    /// answered `input_required`.
    pub(super) fn meta_for_modern_server(
        &mut self,
        host: HostId,
        id: &RequestId,
        method: &str,
        message: &mut Message,
    ) {
        let level = self.router.level(host);
        let Some(t) = self
            .hosts
            .get_mut(&host)
            .and_then(|h| h.translated.as_deref_mut())
        else {
            return;
        };
        with_meta(message, &t.meta, level);
        if era::may_need_input(method) {
            t.sent.insert(
                id.clone(),
                Sent {
                    method: method.to_owned(),
                    message: message.clone(),
                    level,
                },
            );
        }
    }

    /// A message on its way to a modern server, made what it must be:
    /// mcpd's own requests with mcpd's `_meta`; the router's
    /// subscriptions taken into mcpd's listen stream, its log levels
    /// dropped (both answered here); `ping` as `server/discover`. `None`:
    /// not for the server.
    pub(super) fn for_modern_server(&mut self, mut message: Message) -> Option<Message> {
        let method = message.method().map(|m| m.into_owned());
        let id = message.raw("id").map(str::to_owned);
        let (Some(method), Some(id)) = (method, id) else {
            // Notifications and answers pass (there is no
            // roots/list_changed any more).
            let gone = message.method_kind() == Some(Method::RootsListChanged);
            return (!gone).then_some(message);
        };
        match Method::parse(&method) {
            kind @ (Method::ResourcesSubscribe
            | Method::ResourcesUnsubscribe
            | Method::LoggingSetLevel) => {
                if kind != Method::LoggingSetLevel
                    && let Some(uri) = message
                        .params()
                        .and_then(|p| p.get("uri").and_then(Value::as_str).map(str::to_owned))
                {
                    let changed = if kind == Method::ResourcesSubscribe {
                        self.listened.insert(uri)
                    } else {
                        self.listened.remove(&uri)
                    };
                    if changed && !self.replaying {
                        self.listen_upstream();
                    }
                }
                // Answered as the server would have.
                let answer = json!({"jsonrpc": "2.0", "id": serde_json::from_str::<Value>(&id).unwrap_or(Value::Null), "result": {}});
                let outs = self.router.from_server(answer);
                self.deliver(outs, None);
                None
            }
            Method::Ping => {
                message.set("method", &Method::ServerDiscover.as_str());
                message.set("params", &with_mcpd_meta(json!({})));
                Some(message)
            }
            _ => {
                if !message.may_hold("params", era::VERSION_KEY) {
                    let mut params = with_mcpd_meta(message.params().unwrap_or_else(|| json!({})));
                    if method.starts_with("tasks/") {
                        // mcpd's own `tasks/cancel` of a task whose host
                        // left: it speaks the tasks extension there (and
                        // only there: its own calls never become tasks).
                        params["_meta"][era::CAPABILITIES_KEY]["extensions"]
                            [era::TASKS_EXTENSION] = json!({});
                    }
                    message.set("params", &params);
                }
                Some(message)
            }
        }
    }

    /// (Re)opens mcpd's listen stream on a modern server: the list changes
    /// it offers and the URIs hosts are subscribed to; the stream before
    /// is cancelled.
    pub(super) fn listen_upstream(&mut self) {
        let Some(init) = self.init.clone() else {
            return;
        };
        if self.upstream.is_none() {
            return;
        }
        if let Some(old) = self.listen.take() {
            self.out(Out::Server(
                json!({"jsonrpc": "2.0", "method": Method::Cancelled.as_str(),
                       "params": {"requestId": old, "reason": "listening anew"}})
                .into(),
            ));
        }
        self.next_listen += 1;
        let id = format!("mcpd-listen-{}", self.next_listen);
        let offers =
            |capability: &str, what: &str| init["capabilities"][capability][what] == json!(true);
        let mut filter = json!({"toolsListChanged": true});
        if offers("resources", "listChanged") {
            filter["resourcesListChanged"] = json!(true);
        }
        if offers("prompts", "listChanged") {
            filter["promptsListChanged"] = json!(true);
        }
        if offers("resources", "subscribe") && !self.listened.is_empty() {
            filter["resourceSubscriptions"] = json!(self.listened.iter().collect::<Vec<_>>());
        }
        let request = json!({"jsonrpc": "2.0", "id": id, "method": Method::SubscriptionsListen.as_str(),
            "params": with_mcpd_meta(json!({"notifications": filter}))});
        self.out(Out::Server(request.into()));
        self.listen = Some(id);
    }

    /// Answer `message` to 2025 host `host` from a modern server: an
    /// `input_required` one becomes requests to the host (`None`: nothing
    /// to send now); any other ends what was kept to retry it.
    pub(super) fn answer_of_modern_server(
        &mut self,
        host: HostId,
        message: Message,
    ) -> Option<Message> {
        let Some(id) = message.request_id() else {
            return Some(message);
        };
        let Some(t) = self
            .hosts
            .get_mut(&host)
            .and_then(|h| h.translated.as_deref_mut())
        else {
            return Some(message);
        };
        let Some(sent) = t.sent.remove(&id) else {
            return Some(message);
        };
        if !message.may_hold("result", "input_required") {
            return Some(message);
        }
        let result = message.get::<Value>("result").unwrap_or(Value::Null);
        if result["resultType"] != "input_required" {
            return Some(message);
        }
        let requests = result["inputRequests"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let state = result.get("requestState").cloned();
        // A question it declared no capability for: ErrorCode::MissingCapability, as the server
        // would have answered a modern host.
        if let Some(method) = requests
            .values()
            .filter_map(|r| r["method"].as_str())
            .find(|m| !era::can_answer(t.caps, m))
        {
            return Some(era::missing_capability(&id.to_value(), method).into());
        }
        if t.asked.len() + requests.len() > MAX_ASKED {
            let why = format!("too many questions waiting for this host (at most {MAX_ASKED})");
            return Some(
                ErrorCode::InternalError
                    .response(&id.to_value(), why)
                    .into(),
            );
        }
        let mut questions = Vec::new();
        for (key, request) in &requests {
            self.next_down += 1;
            let down = format!("mcpd-input-{}", self.next_down);
            let mut question = json!({"jsonrpc": "2.0", "id": down, "method": request["method"]});
            if let Some(params) = request.get("params") {
                question["params"] = params.clone();
            }
            t.asked.insert(down, (id.clone(), key.clone()));
            questions.push(question);
        }
        if questions.is_empty() {
            // Only a state: retried at once with it.
            let retry = Retry {
                sent,
                state,
                answers: Map::new(),
                waiting: 0,
            };
            self.retry_upstream(host, id, retry);
            return None;
        }
        t.retries.insert(
            id,
            Retry {
                sent,
                state,
                answers: Map::new(),
                waiting: questions.len(),
            },
        );
        for question in questions {
            self.send_bytes(host, line(&question));
        }
        None
    }

    /// A 2025 host's answer to a question mcpd asked it for an
    /// `input_required` answer: true if it was one (taken here).
    pub(super) fn answered_input(&mut self, host: HostId, message: &Message) -> bool {
        let Some(id) = message
            .raw("id")
            .and_then(|raw| serde_json::from_str::<String>(raw).ok())
        else {
            return false;
        };
        let Some(t) = self
            .hosts
            .get_mut(&host)
            .and_then(|h| h.translated.as_deref_mut())
        else {
            return false;
        };
        let Some((request, key)) = t.asked.remove(&id) else {
            return false;
        };
        let Some(retry) = t.retries.get_mut(&request) else {
            return true;
        };
        if let Some(error) = message.get::<Value>("error") {
            // Refused: the request ends with why.
            t.retries.remove(&request);
            t.asked.retain(|_, (r, _)| *r != request);
            let why = format!(
                "the host refused what the server asked: {}",
                error["message"].as_str().unwrap_or("an error")
            );
            self.send(
                host,
                ErrorCode::InternalError.response(&request.to_value(), why),
            );
            return true;
        }
        retry
            .answers
            .insert(key, message.get::<Value>("result").unwrap_or(Value::Null));
        retry.waiting = retry.waiting.saturating_sub(1);
        if retry.waiting == 0
            && let Some(retry) = t.retries.remove(&request)
        {
            self.retry_upstream(host, request, retry);
        }
        true
    }

    /// Retries host `host`'s request `id` upstream with the answers and
    /// the server's state.
    fn retry_upstream(&mut self, host: HostId, id: RequestId, retry: Retry) {
        let Retry {
            sent,
            state,
            answers,
            ..
        } = retry;
        let mut params = sent.message.params().unwrap_or_else(|| json!({}));
        if let Some(params) = params.as_object_mut() {
            if answers.is_empty() {
                params.remove("inputResponses");
            } else {
                params.insert("inputResponses".into(), Value::Object(answers));
            }
            match state {
                Some(state) => params.insert("requestState".into(), state),
                None => params.remove("requestState"),
            };
        }
        let mut message = sent.message;
        message.set("params", &params);
        if let Some(t) = self
            .hosts
            .get_mut(&host)
            .and_then(|h| h.translated.as_deref_mut())
        {
            t.sent.insert(
                id.clone(),
                Sent {
                    method: sent.method.clone(),
                    message: message.clone(),
                    level: sent.level,
                },
            );
        }
        let outs = self
            .router
            .request_logged(host, (id, &sent.method, sent.level), message);
        self.deliver(outs, None);
    }
}

/// The URIs mcpd's listen stream holds.
pub(super) type Listened = BTreeSet<String>;
