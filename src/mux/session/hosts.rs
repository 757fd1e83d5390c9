//! A host's side of the sessions: attaching and ending a host, what is
//! sent to it (answers, notifications, the outage error), and what it
//! sends (`on_host`: its requests routed, accounted, filtered and held
//! while an on-demand server starts).

use foldhash::HashMap;
use serde_json::{Value, json};

use super::super::era::Era;
use super::super::error::ErrorCode;
use super::super::message::{Message, RequestId};
use super::super::method::Method;
use super::super::route::{HostId, Level as LogLevel, Out as RouteOut};
use super::super::wire::{Frame, line};
use super::classify::{self, HostState, Outcome, Step};
use std::time::Instant;

use super::{
    Arrival, Call, Core, Host, Kind, Level, MAX_IN_FLIGHT, MAX_SESSIONS, MAX_UNIT_IN_FLIGHT, Out,
    Publish, Purpose, UnitState, Waiter, upstream,
};

impl Core {
    /// Host session `host` (the id [`Core::next_host`] gave) attached, as
    /// `arrival` says, at `now`.
    pub fn attach(&mut self, host: HostId, arrival: Arrival, now: Instant) {
        self.now = now;
        self.next_host = self.next_host.max(host);
        let Arrival {
            replay,
            bridged,
            ledger,
            refused,
            pausable,
        } = arrival;
        self.hosts.insert(
            host,
            Host {
                swallow: None,
                bridged,
                ledger,
                initialized: false,
                held: Vec::new(),
                calls: HashMap::default(),
                uninitialized: Some(now),
                modern: None,
                translated: None,
                version: None,
                refused,
                pausable,
                shed: None,
            },
        );
        let attached = self.hosts.len();
        self.out(Out::Publish(Publish::Presence {
            attached,
            arrived: true,
        }));
        if self.hosts.len() > MAX_SESSIONS {
            let why = format!(
                "too many sessions on server {} (at most {MAX_SESSIONS})",
                self.name
            );
            let refusal = ErrorCode::InvalidRequest.response(&Value::Null, &why);
            self.send(host, refusal);
            self.end(host, Some(&why), false);
            return;
        }
        self.arm();
        if let Some(replay) = replay {
            // The host initialized an earlier session (mcpd restarted):
            // this one is initialized the same way, silently.
            if let Some(h) = self.hosts.get_mut(&host) {
                h.swallow = Some(replay.get("id").cloned().unwrap_or(Value::Null));
            }
            self.sender = host;
            self.on_host(host, Frame::Message(replay.into()));
            self.sender = super::toward::MCPD;
        }
        self.settle_doomed();
    }

    /// Host `host` sent `frame` (read at `now`).
    pub fn host_frame(&mut self, host: HostId, frame: Frame, now: Instant) {
        self.now = now;
        self.record(host, &frame);
        self.sender = host;
        self.on_host(host, frame);
        self.sender = super::toward::MCPD;
        if self.hosts.get(&host).is_some_and(|h| h.pausable) && self.toward.slow(host) {
            // Back-pressure: its own writes wait until the server has
            // read what it sent.
            self.out(Out::Slow { host, slow: true });
        }
        self.settle_doomed();
    }

    /// Whether `host`'s `message` may go to the server now; if not, it is
    /// counted ([`Out::Shed`]), and the first of a run said in the
    /// journal.
    fn admitted(&mut self, host: HostId, message: &Message, request: bool) -> bool {
        let admit = self
            .toward
            .admit(host, message.received(), self.hosts.len());
        let (waiting, bytes) = self.toward.total();
        let name = self.name.clone();
        let Some(h) = self.hosts.get_mut(&host) else {
            return false;
        };
        if admit == super::toward::Admit::Pass {
            if let Some((dropped, refused)) = h.shed.take() {
                let text = format!(
                    "server {name} reads again what this session sends: {dropped} of its notifications were dropped and {refused} of its requests refused meanwhile"
                );
                self.log(Level::Info, Some(host), text);
            }
            return true;
        }
        let first = h.shed.is_none();
        let shed = h.shed.get_or_insert((0, 0));
        if request {
            shed.1 += 1;
        } else {
            shed.0 += 1;
        }
        if first {
            let text = format!(
                "server {name} is not reading what it is sent ({waiting} messages, {bytes} bytes wait for it): dropping this session's notifications and refusing its requests past its share until it does"
            );
            self.log(Level::Warn, Some(host), text);
        }
        self.out(Out::Shed { host, request });
        false
    }

    /// Host session `host` ended: it left (`why` none), or its link
    /// failed or fell behind (`why`).
    pub fn detached(&mut self, host: HostId, why: Option<&str>, now: Instant) {
        self.now = now;
        self.detach(host, why);
        self.settle_doomed();
    }

    /// Ends host session `host`: it left (`why` none), or misbehaved.
    pub(super) fn detach(&mut self, host: HostId, why: Option<&str>) {
        self.end(host, why, true);
    }

    /// Ends host session `host`, because of `why` if it is not its own
    /// doing, which is `counted` among the detached sessions if it
    /// misbehaved.
    pub(super) fn end(&mut self, host: HostId, why: Option<&str>, counted: bool) {
        if !self.hosts.contains_key(&host) {
            return;
        }
        self.toward.left(host);
        // Its calls in flight are dropped (logged as abandoned).
        self.abandon_calls(host);
        let Some(gone) = self.hosts.remove(&host) else {
            return;
        };
        self.waiting.retain(|w| w.host != host);
        let attached = self.hosts.len();
        self.out(Out::Publish(Publish::Presence {
            attached,
            arrived: false,
        }));
        if let Some(version) = gone.version {
            self.out(Out::Publish(Publish::Version(version, false)));
        }
        // The host sees its session end at once, whatever its writer
        // still waits to write. A bridge is told why, and exits.
        self.out(Out::Ended {
            host,
            why: why.map(str::to_owned),
            counted: counted && why.is_some(),
        });
        let outs = self.router.detach(host);
        self.deliver(outs, None);
    }

    /// Host `host`'s calls in flight (and parked) end unanswered.
    pub(super) fn abandon_calls(&mut self, host: HostId) {
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        let mut calls: Vec<Call> = h.calls.drain().map(|(_, call)| call).collect();
        if let Some(modern) = h.modern.as_deref_mut() {
            calls.extend(modern.gone());
        }
        for call in calls {
            self.out(Out::Call {
                host,
                call,
                outcome: Outcome::Abandoned,
            });
        }
    }

    /// Queues `bytes` (a line mcpd made) for `host`.
    pub(super) fn send_bytes(&mut self, host: HostId, bytes: Vec<u8>) {
        if self.hosts.contains_key(&host) {
            self.out(Out::Bytes(host, bytes));
        }
    }

    /// Queues `message` for `host`, dropped while the host is behind if it
    /// is a notification that may be.
    fn send_line(&mut self, host: HostId, message: Message, kind: Kind) {
        let Some(h) = self.hosts.get(&host) else {
            return;
        };
        let modern = h.modern.is_some();
        self.out(Out::Host {
            host,
            message,
            kind,
            modern,
        });
    }

    /// `host`'s request `id` is answered by bytes mcpd made (the answer
    /// is sent after): its bridge need not answer it.
    pub(super) fn answered(&mut self, host: HostId, id: &RequestId) {
        if self.hosts.get(&host).is_some_and(|h| h.ledger) {
            self.out(Out::Ledger {
                host,
                id: id.as_json().into(),
                record: false,
            });
        }
    }

    /// Sends a message mcpd made to a host.
    pub(super) fn send(&mut self, host: HostId, message: Value) {
        self.send_message(host, Message::from(message));
    }

    pub(super) fn send_message(&mut self, host: HostId, message: Message) {
        let modern_host = self.hosts.get(&host).is_some_and(|h| h.modern.is_some());
        let message = if modern_host {
            match self.for_modern(host, message) {
                Some(message) => message,
                None => return,
            }
        } else if !message.has("method")
            && (self.modern_up
                || self
                    .hosts
                    .get(&host)
                    .and_then(|h| h.translated.as_deref())
                    .is_some_and(upstream::Translated::keeps_any))
        {
            // Also after the server stopped speaking 2026-07-28: what was
            // kept for the request goes with its answer.
            match self.answer_of_modern_server(host, message) {
                Some(message) => message,
                None => return,
            }
        } else {
            message
        };
        self.send_plain(host, message);
    }

    /// Sends `message` to `host` as it is (made modern already, for a
    /// modern host).
    pub(super) fn send_plain(&mut self, host: HostId, message: Message) {
        let answer = !message.has("method");
        if let Some(h) = self.hosts.get_mut(&host)
            && h.swallow.is_some()
            && answer
            && message.id() == h.swallow
        {
            // The answer to a replayed `initialize`: the host had its own
            // long ago; it is told what may have changed instead.
            h.swallow = None;
            self.replayed(host);
            return;
        }
        let notification = !answer && !message.has("id");
        // A response ends a call being accounted: logged once the host
        // has it, so the log write is not on the answer's way.
        let mut ended = None;
        if answer
            && let Some(h) = self.hosts.get_mut(&host)
            && (!h.calls.is_empty() || h.ledger)
            && let Some(key) = message.id_text()
        {
            ended = h.calls.remove(key.as_ref());
            if h.ledger {
                self.outs.push(Out::Ledger {
                    host,
                    id: key.as_ref().into(),
                    record: false,
                });
            }
        }
        let outcome = ended.as_ref().map(|_| classify::outcome_of(&message));
        let kind = if notification {
            Kind::Notification
        } else {
            Kind::Kept
        };
        self.send_line(host, message, kind);
        if let (Some(call), Some(outcome)) = (ended, outcome) {
            self.out(Out::Call {
                host,
                call,
                outcome,
            });
        }
    }

    /// What a request gets while the upstream is not established.
    pub(super) fn down_text(&self, lost: Option<&str>) -> String {
        if let Some(why) = lost {
            return format!("server {}: connection lost: {why}", self.name);
        }
        if self.facts.state == UnitState::Running {
            return format!("server {} is reconnecting", self.name);
        }
        self.facts.not_running.clone()
    }

    pub(super) fn deliver(&mut self, outs: Vec<RouteOut>, lost: Option<&str>) {
        let mut outs = outs;
        for out in outs.drain(..) {
            match out {
                RouteOut::Server(message) => {
                    let message = if self.modern_upstream() {
                        match self.for_modern_server(message) {
                            Some(message) => message,
                            None => continue,
                        }
                    } else {
                        message
                    };
                    if self.upstream.is_some() {
                        self.out(Out::Server(message));
                    }
                }
                RouteOut::Host(host, message) => self.send_message(host, message),
                RouteOut::Parked { host, up, answer } => self.parked_ended(host, up, answer),
                RouteOut::Down { host, id } => {
                    let text = self.down_text(lost);
                    self.send(host, ErrorCode::ServerDown.response(&id, text));
                }
                RouteOut::Answer(id, message) => match self.own.remove(&id) {
                    Some(Waiter::Own(purpose, token)) => {
                        if purpose == Purpose::Use {
                            self.used = self.now;
                        }
                        self.tokens.remove(&token);
                        self.out(Out::Reply {
                            token,
                            answer: Ok(message),
                        });
                    }
                    Some(Waiter::Page(kind)) => self.page(kind, id, &message),
                    None => {}
                },
                RouteOut::Unanswered(id) => match self.own.remove(&id) {
                    Some(Waiter::Own(_, token)) => {
                        self.tokens.remove(&token);
                        let answer = Err(self.down_text(lost));
                        self.out(Out::Reply { token, answer });
                    }
                    Some(Waiter::Page(kind)) => self.page_unanswered(kind),
                    None => {}
                },
            }
        }
        self.router.recycle(outs);
    }

    /// A request read from `host` is the daemon's to answer from now on
    /// (handled at once or held): if the daemon dies first, the host's
    /// bridge answers it from the ledger.
    fn record(&mut self, host: HostId, frame: &Frame) {
        if let Frame::Message(message) = frame
            && self.hosts.get(&host).is_some_and(|h| h.ledger)
            && message.has("method")
            && let Some(id) = message.id_text()
        {
            self.out(Out::Ledger {
                host,
                id: id.as_ref().into(),
                record: true,
            });
        }
    }

    pub(super) fn on_host(&mut self, host: HostId, mut frame: Frame) {
        if let Frame::Message(message) = &mut frame {
            let dropped = classify::strip(message);
            if !dropped.is_empty() {
                let text = format!(
                    "dropped members JSON-RPC does not have: {}",
                    dropped.join(", ")
                );
                self.log(Level::Debug, Some(host), text);
            }
            // max-request-size, for whatever a host sends the server.
            let size = u64::try_from(message.received()).unwrap_or(u64::MAX);
            let max = self.settings.max_request_size;
            if size > max {
                let bound = format!(
                    "over the max-request-size of server {} ({max} bytes)",
                    self.name
                );
                match (message.has("method"), message.request_id()) {
                    // A request: refused, never sent.
                    (true, Some(id)) => {
                        let why = format!("a request of {size} bytes is {bound}");
                        self.send(
                            host,
                            ErrorCode::InvalidRequest.response(&id.to_value(), why),
                        );
                        return;
                    }
                    // A notification: dropped.
                    (true, None) => {
                        let text = format!("dropped a notification of {size} bytes, {bound}");
                        self.log(Level::Debug, Some(host), text);
                        return;
                    }
                    // An answer to the server's request: the server gets an
                    // error in its place.
                    (false, Some(id)) => {
                        let why = format!("the host's answer of {size} bytes is {bound}");
                        *message = ErrorCode::InternalError
                            .response(&id.to_value(), why)
                            .into();
                    }
                    (false, None) => {}
                }
            }
        }
        let waiting = self.waiting.iter().any(|w| w.host == host);
        let Some(h) = self.hosts.get_mut(&host) else {
            return;
        };
        let era = if h.modern.is_some() {
            Some(Era::Modern)
        } else if h.initialized {
            Some(Era::Legacy)
        } else {
            None
        };
        let state = HostState {
            era,
            initialized: h.initialized,
            waiting,
            held: h.held.len(),
        };
        let step = classify::classify(&frame, state);
        let Frame::Message(message) = frame else {
            match step {
                Step::Refuse(refusal) => self.send(host, refusal),
                // Refused in its turn, once the initialize is answered.
                Step::Hold => h.held.push(frame),
                Step::Overflow(why) => self.doomed.push((host, why)),
                _ => {}
            }
            return;
        };
        if let Some(why) = h.refused.clone() {
            // A host over its per-host unit's `max-instances`: whatever
            // it asks is refused, naming the limit.
            if message.method().is_some()
                && let Some(id) = message.request_id()
            {
                self.answered(host, &id);
                self.send(
                    host,
                    ErrorCode::InvalidRequest.response(&id.to_value(), &*why),
                );
            }
            return;
        }
        match step {
            // Pipelined behind its initialize (a bridge replaying one).
            Step::Hold => h.held.push(Frame::Message(message)),
            Step::Overflow(why) => self.doomed.push((host, why)),
            Step::Refuse(refusal) => self.send(host, refusal),
            Step::Initialize(id) => {
                h.uninitialized = None;
                let params = message.params().unwrap_or(Value::Null);
                self.initialize(host, &id.to_value(), &params);
            }
            Step::Discover(id) => self.discover(host, &id, &message),
            Step::Modern { id, method } => self.modern_request(host, id, method, message),
            Step::Pong(id) => {
                self.send(
                    host,
                    json!({"jsonrpc": "2.0", "id": id.to_value(), "result": {}}),
                );
            }
            Step::Ignore => {}
            Step::ToolsList(id) => {
                self.tools_asked();
                let bytes = classify::list_answer(&id, "tools", &self.facts.tools);
                self.answered(host, &id);
                self.send_bytes(host, bytes);
            }
            Step::Request { id, method: name } => {
                let method = Method::parse(&name);
                if !self.answer_list(host, &id, method) {
                    self.host_request(host, (&name, method), id, message, None);
                }
            }
            Step::Cancelled { request } => {
                if let Some(request) = &request
                    && self.cancel_listen(host, request)
                {
                    return;
                }
                if let Some(request) = request
                    && let Some(h) = self.hosts.get_mut(&host)
                {
                    // A cancelled request gets no answer, from anyone.
                    let ledger = h.ledger;
                    if let Some(m) = h.modern.as_deref_mut() {
                        m.close(&request);
                    }
                    if let Some(t) = h.translated.as_deref_mut() {
                        t.cancelled(&request);
                    }
                    let ended = h.calls.remove(&request);
                    if ledger {
                        self.answered(host, &request);
                    }
                    if let Some(call) = ended {
                        self.out(Out::Call {
                            host,
                            call,
                            outcome: Outcome::Failed("cancelled by the host".into()),
                        });
                    }
                }
                let outs = self.router.from_host(host, message);
                self.deliver(outs, None);
            }
            Step::Route => {
                if !message.has("method") && self.answered_input(host, &message) {
                    return;
                }
                if message.has("method")
                    && self.upstream.is_some()
                    && !self.admitted(host, &message, false)
                {
                    return;
                }
                let outs = self.router.from_host(host, message);
                self.deliver(outs, None);
            }
        }
    }

    pub(super) fn host_request(
        &mut self,
        host: HostId,
        (name, method): (&str, Method),
        id: RequestId,
        message: Message,
        level: Option<LogLevel>,
    ) {
        if self.router.in_flight(host) >= MAX_IN_FLIGHT {
            self.send(
                host,
                ErrorCode::InvalidRequest.response(
                    &id.to_value(),
                    format!("too many requests in flight (at most {MAX_IN_FLIGHT} per session)"),
                ),
            );
            return;
        }
        if self.router.requests() >= MAX_UNIT_IN_FLIGHT {
            let refusal = ErrorCode::InvalidRequest.response(
                &id.to_value(),
                format!(
                    "too many requests in flight on server {} (at most {MAX_UNIT_IN_FLIGHT} for all its sessions)",
                    self.name
                ),
            );
            self.send(host, refusal);
            return;
        }
        if self.router.in_use(host, &id) {
            // Refused here, not by the router, and written as it is: an
            // answer with this id would end the record of the call that
            // holds it.
            let refusal = ErrorCode::InvalidRequest
                .response(&id.to_value(), format!("request id {id} is already in use"));
            self.answered(host, &id);
            self.send_bytes(host, line(&refusal));
            return;
        }
        if self.upstream.is_some() && !self.admitted(host, &message, true) {
            let (waiting, bytes) = self.toward.total();
            let why = format!(
                "server {} is not reading what it is sent ({waiting} messages, {bytes} bytes wait for it): this session's request is refused past its share",
                self.name
            );
            self.send(host, ErrorCode::ServerDown.response(&id.to_value(), why));
            return;
        }
        if method == Method::ToolsCall {
            let tool = classify::tool_name(&message);
            if let Some(why) = self.settings.filter.why_not(&tool) {
                let text = classify::filtered(&self.name, &tool, &why);
                self.send(
                    host,
                    ErrorCode::InvalidParams.response(&id.to_value(), text),
                );
                return;
            }
            let started = self.now;
            let Some(h) = self.hosts.get_mut(&host) else {
                return;
            };
            h.calls.insert(id.clone(), Call { tool, started });
        }
        if classify::uses_server(method) {
            self.used = self.now;
        }
        let mut message = message;
        let mut level = level;
        if self.modern_up && self.hosts.get(&host).is_some_and(|h| h.modern.is_none()) {
            self.meta_for_modern_server(host, &id, name, &mut message);
            // Its level goes with the request, and its log messages come
            // for the request alone.
            level = self.router.level(host);
        }
        let outs = self.router.request_logged(host, (id, name, level), message);
        self.deliver(outs, None);
        self.demand_if_held();
    }
}
