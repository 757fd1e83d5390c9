//! Host sessions of MCP 2026-07-28 over a 2025 upstream (DESIGN §12):
//! what the session task does for a host that speaks the modern era,
//! with the pure translation of `mux::era`.
//!
//! - `server/discover` is answered from the server's `initialize` result
//!   (kept through outages and in the on-demand cache);
//! - each request is checked (version, capabilities, log level), loses
//!   the reserved `_meta` keys, and goes the way a 2025 host's does, with
//!   its log level counted for as long as it is in flight;
//! - every answer says what it is (`resultType`) and who made it;
//! - a server→client request one of its calls caused becomes that call's
//!   `input_required` answer; the retry answers the server's request and
//!   gets the call's own answer (the upstream call stays open meanwhile);
//! - an instance's server (DESIGN §13) that asks while none of its host's
//!   calls is open (`roots/list`, once told of its host's roots) has its
//!   question held until the host's next call, which is answered
//!   `input_required` with it before it goes upstream, so a 2026-07-28
//!   host's roots reach its instance as a 2025 host's do;
//! - `subscriptions/listen` streams are served from the hosts'
//!   reference-counted subscriptions and mcpd's own `list_changed`.

use std::time::Instant;

use foldhash::HashMap;
use serde_json::{Map, Value, json};

use super::super::era::{self, Filter, Inputs, Listens, Parked, RequestMeta, Settled};
use super::super::error::ErrorCode;
use super::super::lists::List;
use super::super::message::{Message, RequestId};
use super::super::method::Method;
use super::super::route::HostId;
use super::super::wire::line;
use super::classify::Outcome;
use super::{Call, Core, Level, Out, Publish, Waiting};

/// What mcpd keeps of a host session that speaks MCP 2026-07-28.
#[derive(Debug)]
pub(super) struct Modern {
    /// Its requests in flight: their method, and what their `_meta`
    /// declared (their answers are made modern by it; a server→client
    /// request is judged by the capabilities of the call that caused it).
    open: HashMap<RequestId, Open>,
    /// Requests it sent, counted (the most recent open call caused a
    /// server→client request).
    sent: u64,
    /// Its calls answered `input_required`, waiting for its retry.
    inputs: Inputs<Option<Call>>,
    /// Questions of its instance's server asked while none of its calls
    /// was open, held (until when) for its next call to carry; at most
    /// `era::MAX_ASKS`.
    held: Vec<(era::Ask, Instant)>,
    listens: Listens,
}

#[derive(Debug)]
struct Open {
    method: String,
    meta: RequestMeta,
    seq: u64,
}

impl Modern {
    /// A session whose `requestState`s carry `nonce`.
    fn new(nonce: u128) -> Self {
        Self {
            open: HashMap::default(),
            sent: 0,
            inputs: Inputs::new(nonce),
            held: Vec::new(),
            listens: Listens::default(),
        }
    }

    /// Request `id` is answered by mcpd itself.
    pub(super) fn close(&mut self, id: &RequestId) {
        self.open.remove(id);
    }

    /// The earliest deadline of its parked calls and held questions.
    pub(super) fn deadline(&self) -> Option<Instant> {
        let held = self.held.iter().map(|(_, until)| *until).min();
        self.inputs.deadline().into_iter().chain(held).min()
    }

    /// The session is gone: its parked calls, abandoned (the router
    /// withdraws them upstream).
    pub(super) fn gone(&mut self) -> Vec<Call> {
        self.inputs
            .drain()
            .into_iter()
            .filter_map(|parked| parked.call)
            .collect()
    }
}

impl Core {
    /// Host `host` speaks MCP 2026-07-28 from now on (its first modern
    /// request was accepted).
    fn become_modern(&mut self, host: HostId) {
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        if h.modern.is_some() {
            return;
        }
        let nonce = (self.nonces)();
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        h.modern = Some(Box::new(Modern::new(nonce)));
        h.initialized = true;
        h.uninitialized = None;
        self.router.attach_by_request(host);
        self.out(Out::Publish(Publish::Version(era::MODERN, true)));
        let text = format!("host session speaks MCP {}", era::MODERN);
        self.log(Level::Debug, Some(host), text);
        self.arm();
    }

    /// The server's identity as modern results carry it.
    pub(super) fn server_info(&self) -> String {
        self.init
            .as_deref()
            .map_or_else(|| "{}".to_owned(), era::server_info)
    }

    /// `server/discover` (`id`) of host `host`: answered from the server's
    /// `initialize` result, kept through outages (and in the on-demand
    /// cache); before the first generation, once it is established.
    pub(super) fn discover(&mut self, host: HostId, id: &RequestId, message: &Message) {
        if let Some(meta) = era::meta_of(message)
            && meta.contains_key(era::VERSION_KEY)
            && let Err(refusal) = era::check(id, Some(&meta))
        {
            self.send(host, refusal);
            return;
        }
        if let Some(caps) =
            era::meta_of(message).and_then(|m| m.get(era::CAPABILITIES_KEY).cloned())
        {
            // For an instance's upstream to declare (DESIGN §13).
            self.declare(caps);
        }
        if let Some(h) = self.hosts.get_mut(&host) {
            // It opened its session: not one that says nothing.
            h.uninitialized = None;
        }
        if let Some(text) = self.cannot_open() {
            self.send(host, ErrorCode::ServerDown.response(&id.to_value(), text));
            self.release_held(host);
            return;
        }
        let Some(init) = self.init.clone() else {
            self.open_later(host, Waiting::discover(id.to_value()));
            return;
        };
        self.become_modern(host);
        let answer =
            json!({"jsonrpc": "2.0", "id": id.to_value(), "result": era::discover_result(&init)});
        self.answered(host, id);
        self.send_bytes(host, line(&answer));
        self.release_held(host);
    }

    /// A request of host `host` that claims MCP 2026-07-28 (or any request
    /// of a modern session).
    pub(super) fn modern_request(
        &mut self,
        host: HostId,
        id: RequestId,
        method: String,
        mut message: Message,
    ) {
        let meta = era::meta_of(&message);
        if self.settings.instance
            && let Some(caps) = meta.as_ref().and_then(|m| m.get(era::CAPABILITIES_KEY))
            && self.declared.is_none()
        {
            // A host with no discovery: its first request's capabilities
            // are what its instance's upstream declares (DESIGN §13).
            self.declare(caps.clone());
        }
        let meta = match era::check(&id, meta.as_ref()) {
            Ok(meta) => meta,
            Err(refusal) => {
                self.send(host, refusal);
                return;
            }
        };
        let opening = self.hosts.get(&host).is_some_and(|h| !h.initialized);
        if opening && let Some(text) = self.cannot_open() {
            // Its first request opens its session: on a unit that cannot
            // serve, it gets why (not an empty tool list).
            if let Some(h) = self.hosts.get_mut(&host) {
                h.uninitialized = None;
            }
            self.send(host, ErrorCode::ServerDown.response(&id.to_value(), text));
            return;
        }
        self.become_modern(host);
        let kind = Method::parse(&method);
        match kind {
            Method::Ping => {
                self.send(
                    host,
                    json!({"jsonrpc": "2.0", "id": id.to_value(), "result": {}}),
                );
                return;
            }
            Method::SubscriptionsListen => {
                self.listen(host, id, &message);
                return;
            }
            Method::Initialize
            | Method::LoggingSetLevel
            | Method::ResourcesSubscribe
            | Method::ResourcesUnsubscribe => {
                let why = format!("{method} is not a method of MCP {}", era::MODERN);
                self.send(
                    host,
                    ErrorCode::MethodNotFound.response(&id.to_value(), why),
                );
                return;
            }
            _ => {}
        }
        let retry = era::may_need_input(&method) && message.may_hold("params", "requestState");
        let params = if retry { message.params() } else { None };
        let modern_upstream = self.modern_upstream();
        if let Some(state) = params
            .as_ref()
            .and_then(|p| p.get("requestState"))
            .and_then(Value::as_str)
            // A state of the server's own goes to it, as it is.
            .filter(|state| !modern_upstream || era::minted(state))
        {
            self.retry(host, id, &method, state, params.as_ref());
            return;
        }
        if era::may_need_input(&method) && self.modern_mut(host).is_some_and(|m| !m.held.is_empty())
        {
            self.carry_held(host, id, method, message, meta);
            return;
        }
        if !modern_upstream {
            // A server of MCP 2026-07-28 gets the host's own _meta.
            era::strip_reserved(&mut message);
        }
        if kind == Method::ToolsList {
            let info = self.server_info();
            let fresh = self.tools_asked();
            let bytes = era::list_answer(&id, "tools", &self.facts.tools, &info, fresh);
            self.answered(host, &id);
            self.send_bytes(host, bytes);
            return;
        }
        let level = meta.level;
        if let Some(m) = self.modern_mut(host) {
            m.sent += 1;
            let seq = m.sent;
            m.open.insert(
                id.clone(),
                Open {
                    method: method.clone(),
                    meta,
                    seq,
                },
            );
        }
        if !self.answer_list(host, &id, kind) {
            self.host_request(host, (&method, kind), id, message, level);
        }
    }

    fn modern_mut(&mut self, host: HostId) -> Option<&mut Modern> {
        self.hosts
            .get_mut(&host)
            .and_then(|h| h.modern.as_deref_mut())
    }

    /// What `message`, on its way to modern host `host`, becomes: an
    /// answer made modern; a server→client request the `input_required`
    /// answer of the call that caused it; a listen stream's notification
    /// one copy per stream that opted in to it. `None`: sent already, or
    /// not for this host.
    pub(super) fn for_modern(&mut self, host: HostId, mut message: Message) -> Option<Message> {
        let method = message.method().map(|m| m.into_owned());
        match method {
            None => {
                let id = message.request_id();
                let open = id.and_then(|id| self.modern_mut(host)?.open.remove(&id));
                let cacheable = open.as_ref().is_some_and(|o| era::cacheable(&o.method));
                era::complete(&mut message, &self.server_info(), cacheable);
                Some(message)
            }
            Some(method) if message.has("id") => {
                self.ask(host, &method, &message);
                None
            }
            Some(method) if era::streamed(&method) => {
                let copies = self
                    .hosts
                    .get(&host)
                    .and_then(|h| h.modern.as_ref())
                    .map(|m| m.listens.fan_out(&message))
                    .unwrap_or_default();
                for copy in copies {
                    self.send_plain(host, copy);
                }
                None
            }
            Some(method) if Method::parse(&method) == Method::Cancelled => {
                // The server withdraws a request it made: the host was
                // shown it in an `input_required` result at most, and its
                // retry's answer to it is dropped.
                let down = message
                    .params()
                    .and_then(|p| p.get("requestId").and_then(Value::as_u64));
                if let (Some(down), Some(m)) = (down, self.modern_mut(host))
                    && let Some(parked) = m.inputs.with_ask(down)
                {
                    parked.asks.retain(|a| a.down != down);
                }
                None
            }
            Some(_) => Some(message),
        }
    }

    /// Server→client request `message` (`method`, its id the router's for
    /// this host) caused by one of modern host `host`'s calls: the call
    /// is answered `input_required`, the server's request waits for the
    /// host's retry.
    fn ask(&mut self, host: HostId, method: &str, message: &Message) {
        let Some(down) = message.request_id().and_then(|id| id.as_u64()) else {
            return;
        };
        let (until, instance) = (
            self.now + self.tunables.input_timeout,
            self.settings.instance,
        );
        let Some(m) = self.modern_mut(host) else {
            return;
        };
        // The call that caused it: its most recent open call that can be
        // answered `input_required`, else its most recent parked call.
        let cause = m
            .open
            .iter()
            .filter(|(_, o)| era::may_need_input(&o.method))
            .max_by_key(|(_, o)| o.seq)
            .map(|(id, o)| (id.clone(), o.meta.caps));
        let Some((call, caps)) = cause else {
            let ask = era::ask(down, message);
            let refusal = match m.inputs.latest() {
                Some(parked) if parked.asks.len() < era::MAX_ASKS => {
                    parked.asks.push(ask);
                    return;
                }
                Some(_) => format!(
                    "too many {method} requests for one call (at most {})",
                    era::MAX_ASKS
                ),
                // An instance's server has this host alone: its next call
                // carries the question.
                None if instance && m.held.len() < era::MAX_ASKS => {
                    m.held.push((ask, until));
                    self.arm();
                    return;
                }
                None if instance => format!(
                    "too many {method} requests waiting for the host's next call (at most {})",
                    era::MAX_ASKS
                ),
                None => format!("no request of the host that could carry {method} is in flight"),
            };
            self.refuse_ask(host, down, &refusal);
            return;
        };
        let open = m.open.remove(&call).expect("found above");
        if !era::can_answer(caps, method) {
            // ErrorCode::MissingCapability to the host's call; the server's request fails, and
            // the call it was made for is withdrawn.
            self.refuse_ask(
                host,
                down,
                &format!("the host's request did not declare the capability {method} needs"),
            );
            if let Some(up) = self.router.park(host, &call) {
                let outs = self
                    .router
                    .abandon(up, "the host lacks a capability the call needs");
                self.deliver(outs, None);
            }
            if let Some(ended) = self
                .hosts
                .get_mut(&host)
                .and_then(|h| h.calls.remove(&call))
            {
                self.out(Out::Call {
                    host,
                    call: ended,
                    outcome: Outcome::Failed(format!(
                        "the host did not declare the capability {method} needs"
                    )),
                });
            }
            self.answered(host, &call);
            self.send_bytes(
                host,
                line(&era::missing_capability(&call.to_value(), method)),
            );
            return;
        }
        let Some(up) = self.router.park(host, &call) else {
            self.refuse_ask(host, down, "the call that caused it is no longer in flight");
            return;
        };
        self.show_asks(host, &call, up, open, vec![era::ask(down, message)]);
    }

    /// Call `call` of host `host` (upstream `up`, parked in the router) is
    /// answered `input_required` with `asks`, and waits for its retry.
    fn show_asks(
        &mut self,
        host: HostId,
        call: &RequestId,
        up: u64,
        open: Open,
        asks: Vec<era::Ask>,
    ) {
        let deadline = self.now + self.tunables.input_timeout;
        let info = self.server_info();
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        let record = h.calls.remove(call);
        let Some(m) = h.modern.as_deref_mut() else {
            return;
        };
        let state = m.inputs.park(Parked {
            up,
            method: open.method,
            asks,
            settled: None,
            call: record,
            deadline,
            meta: open.meta,
        });
        let parked = m.inputs.by_up(up).expect("parked above");
        let result = era::input_required(&mut parked.asks, &state, &info);
        self.answered(host, call);
        self.send_bytes(
            host,
            line(&json!({"jsonrpc": "2.0", "id": call.to_value(), "result": result})),
        );
        self.arm();
    }

    /// Call `id` (`method`, `message` as the host sent it) of host `host`
    /// carries the questions its instance's server asked while none of its
    /// calls was open: it is answered `input_required` with them and kept,
    /// not sent upstream; its retry answers them and sends it.
    fn carry_held(
        &mut self,
        host: HostId,
        id: RequestId,
        method: String,
        message: Message,
        meta: RequestMeta,
    ) {
        let deadline = self.now + self.tunables.input_timeout;
        let info = self.server_info();
        let Some(m) = self.modern_mut(host) else {
            return;
        };
        let asks: Vec<era::Ask> = m.held.drain(..).map(|(ask, _)| ask).collect();
        let state = m.inputs.park(Parked {
            // Not upstream: no upstream id is 0 (the router counts from 1).
            up: 0,
            method,
            asks,
            settled: Some(Settled::Unsent(message)),
            call: None,
            deadline,
            meta,
        });
        let Some(parked) = m.inputs.get(&state) else {
            return;
        };
        let result = era::input_required(&mut parked.asks, &state, &info);
        self.answered(host, &id);
        self.send_bytes(
            host,
            line(&json!({"jsonrpc": "2.0", "id": id.to_value(), "result": result})),
        );
        self.arm();
    }

    /// The server's request `down` (the router's id for host `host`) gets
    /// error `why` instead of the host's answer.
    fn refuse_ask(&mut self, host: HostId, down: u64, why: &str) {
        let refusal = ErrorCode::InternalError.response(&json!(down), why);
        let outs = self.router.from_host(host, refusal);
        self.deliver(outs, None);
    }

    /// Host `host`'s retry `id` of a call answered `input_required`,
    /// carrying `state`: its `inputResponses` answer the server's
    /// requests, and it gets the call's answer (or the next questions).
    fn retry(
        &mut self,
        host: HostId,
        id: RequestId,
        method: &str,
        state: &str,
        params: Option<&Value>,
    ) {
        let now = self.now;
        let Some(m) = self.modern_mut(host) else {
            return;
        };
        let parked = match m.inputs.take(state, method, now) {
            Ok(parked) => parked,
            Err(why) => {
                self.send(host, ErrorCode::InvalidParams.response(&id.to_value(), why));
                return;
            }
        };
        let empty = Map::new();
        let responses = params
            .and_then(|p| p.get("inputResponses"))
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let Parked {
            up,
            method: call_method,
            asks,
            settled,
            call,
            meta,
            ..
        } = parked;
        let (answered, missing) = era::answers(asks, responses);
        for (down, result) in answered {
            let outs = self.router.from_host(
                host,
                json!({"jsonrpc": "2.0", "id": down, "result": result}),
            );
            self.deliver(outs, None);
        }
        if let Some(Settled::Unsent(mut message)) = settled {
            // Questions it left unanswered wait for its next call again;
            // the call itself goes now, as the host sent it.
            let until = self.now + self.tunables.input_timeout;
            if let Some(m) = self.modern_mut(host) {
                m.held.extend(missing.into_iter().map(|ask| (ask, until)));
            }
            message.set_id(id.clone());
            self.modern_request(host, id, call_method, message);
            return;
        }
        let seq = self.modern_mut(host).map_or(0, |m| {
            m.sent += 1;
            m.sent
        });
        let open = Open {
            method: call_method,
            meta,
            seq,
        };
        match settled {
            Some(Settled::Answered(mut answer)) => {
                for ask in missing {
                    self.refuse_ask(host, ask.down, "the call was answered without it");
                }
                answer.set_json("id", id.as_json().to_owned());
                self.reopen(host, &id, open, call);
                self.send_message(host, answer);
            }
            Some(Settled::Lost | Settled::Unsent(_)) => {
                self.reopen(host, &id, open, call);
                let text = self.down_text(None);
                self.send(host, ErrorCode::ServerDown.response(&id.to_value(), text));
            }
            None => {
                if !self.router.resume(host, up, id.clone()) {
                    let outs = self
                        .router
                        .abandon(up, "the host's retry could not take it");
                    self.deliver(outs, None);
                    let refusal = ErrorCode::InvalidRequest
                        .response(&id.to_value(), format!("request id {id} is already in use"));
                    self.send(host, refusal);
                    return;
                }
                self.reopen(host, &id, open, call);
                if !missing.is_empty() {
                    // Questions it has not answered (or not seen): asked
                    // again, at once.
                    self.park_again(host, &id, up, missing);
                }
            }
        }
    }

    /// Call `id` of host `host` is open again (its retry), with its
    /// accounting.
    fn reopen(&mut self, host: HostId, id: &RequestId, open: Open, call: Option<Call>) {
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        if let Some(call) = call {
            h.calls.insert(id.clone(), call);
        }
        if let Some(m) = h.modern.as_deref_mut() {
            m.open.insert(id.clone(), open);
        }
    }

    /// Retry `id` of host `host` (upstream `up`) is answered
    /// `input_required` again, with `asks`.
    fn park_again(&mut self, host: HostId, id: &RequestId, up: u64, asks: Vec<era::Ask>) {
        if self.router.park(host, id).is_none() {
            return;
        }
        let Some(open) = self.modern_mut(host).and_then(|m| m.open.remove(id)) else {
            return;
        };
        self.show_asks(host, id, up, open, asks);
    }

    /// Parked call `up` of host `host` ended before the host's retry: the
    /// retry gets how.
    pub(super) fn parked_ended(&mut self, host: HostId, up: u64, answer: Option<Message>) {
        if let Some(m) = self.modern_mut(host)
            && let Some(parked) = m.inputs.by_up(up)
        {
            parked.settled = Some(answer.map_or(Settled::Lost, Settled::Answered));
        }
    }

    /// Calls whose host did not retry in time: the server's requests get
    /// an error and the calls are withdrawn.
    pub(super) fn inputs_expired(&mut self) {
        let at = self.now;
        let mut hosts: Vec<HostId> = self
            .hosts
            .iter()
            .filter(|(_, h)| {
                h.modern
                    .as_ref()
                    .and_then(|m| m.deadline())
                    .is_some_and(|d| d <= at)
            })
            .map(|(host, _)| *host)
            .collect();
        hosts.sort_unstable();
        for host in hosts {
            let held: Vec<era::Ask> = self
                .modern_mut(host)
                .map(|m| {
                    let (gone, kept) = m.held.drain(..).partition(|(_, until)| *until <= at);
                    m.held = kept;
                    gone.into_iter().map(|(ask, _)| ask).collect()
                })
                .unwrap_or_default();
            for ask in held {
                self.refuse_ask(host, ask.down, "the host made no call to carry it in time");
            }
            let expired = self
                .modern_mut(host)
                .map(|m| m.inputs.expired(at))
                .unwrap_or_default();
            for parked in expired {
                let text = format!(
                    "the input a {} of session {host} needs was not supplied within {:?}: the call is withdrawn",
                    parked.method, self.tunables.input_timeout
                );
                self.log(Level::Info, Some(host), text);
                for ask in &parked.asks {
                    self.refuse_ask(host, ask.down, "the host did not supply the input in time");
                }
                if parked.settled.is_none() {
                    let outs = self
                        .router
                        .abandon(parked.up, "the host did not supply the input in time");
                    self.deliver(outs, None);
                }
                if let Some(call) = parked.call {
                    self.out(Out::Call {
                        host,
                        call,
                        outcome: Outcome::Failed(
                            "the host did not supply the input in time".into(),
                        ),
                    });
                }
            }
        }
    }

    /// `subscriptions/listen` (`id`) of host `host`: acknowledged with what
    /// mcpd honours of it, then the stream's notifications, tagged with
    /// its id, until the host cancels it.
    fn listen(&mut self, host: HostId, id: RequestId, message: &Message) {
        let refuse = |why: String| ErrorCode::InvalidParams.response(&id.to_value(), why);
        let Some(init) = self.init.clone() else {
            let text = self.down_text(None);
            self.send(host, ErrorCode::ServerDown.response(&id.to_value(), text));
            return;
        };
        let requested = message
            .params()
            .and_then(|p| p.get("notifications").cloned())
            .unwrap_or(Value::Null);
        let filter = match Filter::honoured(&requested, &init) {
            Ok(filter) => filter,
            Err(why) => return self.send(host, refuse(why)),
        };
        let Some(m) = self.modern_mut(host) else {
            return;
        };
        if m.listens.len() >= era::MAX_LISTENS {
            let why = format!(
                "too many listen streams (at most {} per session)",
                era::MAX_LISTENS
            );
            return self.send(
                host,
                ErrorCode::InvalidRequest.response(&id.to_value(), why),
            );
        }
        if m.listens.has(&id) {
            let why = format!("request id {id} is already in use");
            return self.send(
                host,
                ErrorCode::InvalidRequest.response(&id.to_value(), why),
            );
        }
        if let Some(unknown) = filter.uris.iter().find(|uri| !self.resource_known(uri)) {
            let why = format!(
                "no resource or resource template of server {} has the URI {unknown:?}",
                self.name
            );
            return self.send(host, refuse(why));
        }
        let mut outs = Vec::new();
        let mut taken = Vec::new();
        for uri in &filter.uris {
            let held = self
                .hosts
                .get(&host)
                .and_then(|h| h.modern.as_ref())
                .is_some_and(|m| m.listens.listens_to(uri));
            if held {
                continue;
            }
            match self.router.subscribe(host, uri) {
                Ok(more) => {
                    outs.extend(more);
                    taken.push(uri.clone());
                }
                Err(why) => {
                    for uri in taken {
                        outs.extend(self.router.unsubscribe(host, &uri));
                    }
                    self.deliver(outs, None);
                    return self.send(
                        host,
                        ErrorCode::InvalidRequest.response(&id.to_value(), why),
                    );
                }
            }
        }
        self.deliver(outs, None);
        let ack = era::acknowledged(&id, &filter);
        if let Some(m) = self.modern_mut(host) {
            m.listens.open(id, filter);
        }
        self.send_bytes(host, line(&ack));
    }

    /// Host `host` cancelled request `id`: true if it was a listen stream
    /// (closed now; nothing goes upstream).
    pub(super) fn cancel_listen(&mut self, host: HostId, id: &RequestId) -> bool {
        let Some(released) = self.modern_mut(host).and_then(|m| m.listens.close(id)) else {
            return false;
        };
        let mut outs = Vec::new();
        for uri in released {
            outs.extend(self.router.unsubscribe(host, &uri));
        }
        self.deliver(outs, None);
        true
    }

    /// Whether `uri` is one the server lists, or one of its templates' (or
    /// its lists are not read yet: nothing to judge it by).
    fn resource_known(&self, uri: &str) -> bool {
        if self.cached(List::Resources).is_none() && self.cached(List::Templates).is_none() {
            return true;
        }
        let listed = |kind: List, key: &str| -> Vec<String> {
            self.cached(kind)
                .and_then(|list| serde_json::from_str::<Vec<Value>>(&list).ok())
                .unwrap_or_default()
                .iter()
                .filter_map(|r| r.get(key).and_then(Value::as_str).map(str::to_owned))
                .collect()
        };
        listed(List::Resources, "uri").iter().any(|u| u == uri)
            || listed(List::Templates, "uriTemplate")
                .iter()
                .any(|t| era::template_matches(t, uri))
    }

    /// List-changed notice `method` for modern host `host`: to each of its
    /// listen streams that opted in to it.
    pub(super) fn notice_modern(&mut self, host: HostId, method: &str) {
        let notice = Message::from(json!({"jsonrpc": "2.0", "method": method}));
        let copies = self
            .hosts
            .get(&host)
            .and_then(|h| h.modern.as_ref())
            .map(|m| m.listens.fan_out(&notice))
            .unwrap_or_default();
        for copy in copies {
            self.send_plain(host, copy);
        }
    }
}
