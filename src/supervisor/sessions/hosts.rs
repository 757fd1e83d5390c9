//! A host's side of the sessions task: attaching and ending a host, what
//! is sent to it (answers, notifications, the outage error; a host too
//! far behind is detached), and what it sends (`on_host`: its requests
//! routed, accounted, filtered and held while an on-demand server
//! starts).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use foldhash::HashMap;
use serde_json::{Value, json};

use crate::mux::attach::Control;
use crate::mux::era::Era;
use crate::mux::error::ErrorCode;
use crate::mux::host::{HostLink, Opened};
use crate::mux::message::{Message, RequestId};
use crate::mux::route::{HostId, Level, Out};
use crate::mux::session::{self, HostState, Outcome, Step};
use crate::mux::wire::{Frame, Refused, line};

use super::super::CallError;
use super::super::accounting::{Caller, Record};
use super::super::clock::now;
use super::super::machine::State;
use super::{
    Host, MAX_IN_FLIGHT, MAX_SESSIONS, MAX_UNIT_IN_FLIGHT, QUEUE, QUEUE_BYTES, Task, Waiter,
    upstream_era,
};

impl Task {
    pub(super) fn attach(&mut self, link: HostLink, caller: Caller, refused: Option<Arc<str>>) {
        let who = caller.to_string();
        self.next_host += 1;
        let host = self.next_host;
        let Opened {
            reader,
            stop,
            out,
            control,
            replay,
            ledger,
        } = link.open(host, QUEUE, QUEUE_BYTES);
        self.readers.push(reader);
        self.hosts.insert(
            host,
            Host {
                out,
                control,
                swallow: None,
                _reader: stop,
                caller,
                initialized: false,
                held: Vec::new(),
                calls: HashMap::default(),
                ledger,
                dropped: 0,
                uninitialized: Some(now()),
                modern: None,
                translated: None,
                version: None,
                refused,
            },
        );
        self.count.store(self.hosts.len(), Ordering::Relaxed);
        let attached = self.hosts.len();
        self.presence
            .send_modify(|(ever, now)| (*ever, *now) = (*ever + 1, attached));
        tracing::debug!(target: "mcpd::sessions", mcpd_server = %self.name, host, "host session attached by {who}");
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
            self.on_host(host, Frame::Message(replay.into()));
        }
    }

    /// Ends host session `host`: it left (`why` none), or misbehaved.
    pub(super) fn detach(&mut self, host: HostId, why: Option<&str>) {
        self.end(host, why, true);
    }

    /// Ends host session `host`, because of `why` if it is not its own
    /// doing, which is `counted` among the detached sessions if it
    /// misbehaved.
    pub(super) fn end(&mut self, host: HostId, why: Option<&str>, counted: bool) {
        let Some(gone) = self.hosts.remove(&host) else {
            return;
        };
        if let Some(why) = why {
            tracing::warn!(target: "mcpd::sessions", mcpd_server = %self.name, host, pid = ?gone.caller.pid, "detaching host session {host}: {why}");
            if counted {
                self.counters.host_detached();
            }
        }
        self.waiting.retain(|w| w.host != host);
        self.count.store(self.hosts.len(), Ordering::Relaxed);
        let attached = self.hosts.len();
        self.presence.send_modify(|(_, now)| *now = attached);
        if let Some(version) = gone.version {
            self.versions.detached(version);
        }
        let mut gone = gone;
        if let Some(modern) = gone.modern.as_deref_mut() {
            Self::modern_gone(modern);
        }
        // The host sees its session end at once, whatever its writer task
        // still waits to write; its calls in flight are dropped (logged as
        // abandoned). A bridge is told why, and exits.
        gone.out.shutdown();
        if let Some(control) = &gone.control {
            let _ = control.send(crate::mux::attach::line(&Control::End(
                why.map(str::to_owned),
            )));
        }
        drop(gone);
        let outs = self.router.detach(host);
        self.deliver(outs, None);
    }

    /// Queues `bytes` for `host`; a host whose queue is full is detached.
    pub(super) fn send_bytes(&mut self, host: HostId, bytes: Vec<u8>) {
        let Some(h) = self.hosts.get(&host) else {
            return;
        };
        let sent = h.out.send(bytes);
        self.sent(host, sent);
    }

    /// Queues `message` for `host` as [`Task::send_bytes`] does, its line
    /// made in the thread's buffer (copied only if it must wait).
    pub(super) fn send_line(&mut self, host: HostId, message: &Message) {
        let Some(h) = self.hosts.get(&host) else {
            return;
        };
        let sent = message.with_line(|line| h.out.send_slice(line));
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

    /// `host`'s request `id` is answered by bytes mcpd made (the answer
    /// is sent after): its bridge need not answer it.
    pub(super) fn answered(&mut self, host: HostId, id: &RequestId) {
        if let Some(ledger) = self.hosts.get_mut(&host).and_then(|h| h.ledger.as_mut()) {
            ledger.clear(id.as_json());
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
                    .is_some_and(upstream_era::Translated::keeps_any))
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
        if let Some(h) = self.hosts.get_mut(&host) {
            let notification = !answer && !message.has("id");
            if (notification || h.dropped > 0) && self.behind(host, notification, &message) {
                return;
            }
        }
        // A response ends a call being accounted: logged once the host
        // has it, so the log write is not on the answer's way.
        let mut record = None;
        if answer
            && let Some(h) = self.hosts.get_mut(&host)
            && (!h.calls.is_empty() || h.ledger.is_some())
            && let Some(key) = message.id_text()
        {
            record = h.calls.remove(key.as_ref());
            if let Some(ledger) = &mut h.ledger {
                ledger.clear(&key);
            }
        }
        self.send_line(host, &message);
        if let Some(mut record) = record {
            record.finish(session::outcome_of(&message));
        }
    }

    /// Fan-out to a host that is behind (DESIGN §3, invariant 10): a
    /// notification for a host whose queue is past `session::behind` is
    /// dropped and counted (answers and requests never are); once it has
    /// caught up, it is told how many before its next message. Returns
    /// whether `message` was dropped.
    pub(super) fn behind(&mut self, host: HostId, notification: bool, message: &Message) -> bool {
        let Some(h) = self.hosts.get_mut(&host) else {
            return false;
        };
        let behind = session::behind(h.out.backlog());
        if behind && notification && session::may_drop(message) {
            h.dropped += 1;
            self.counters.notification_dropped();
            return true;
        }
        if !behind && h.dropped > 0 {
            let notice = session::dropped_notice(std::mem::take(&mut h.dropped));
            // A modern host gets log messages only for requests that ask.
            if h.modern.is_none() {
                self.send_bytes(host, line(&notice));
            }
        }
        false
    }

    /// What a request gets while the upstream is not established.
    pub(super) fn down_text(&self, lost: Option<&str>) -> String {
        if let Some(why) = lost {
            return format!("server {}: connection lost: {why}", self.name);
        }
        let s = self.status.borrow();
        if s.state == State::Running {
            return format!("server {} is reconnecting", self.name);
        }
        CallError::not_running(&self.name, &s).to_string()
    }

    pub(super) fn deliver(&mut self, outs: Vec<Out>, lost: Option<&str>) {
        let mut outs = outs;
        for out in outs.drain(..) {
            match out {
                Out::Server(message) => {
                    let message = if self.modern_upstream() {
                        match self.for_modern_server(message) {
                            Some(message) => message,
                            None => continue,
                        }
                    } else {
                        message
                    };
                    if let Some(up) = &self.upstream {
                        let _ = up.tx.send(message);
                    }
                }
                Out::Host(host, message) => self.send_message(host, message),
                Out::Parked { host, up, answer } => self.parked_ended(host, up, answer),
                Out::Down { host, id } => {
                    let text = self.down_text(lost);
                    self.send(host, ErrorCode::ServerDown.response(&id, text));
                }
                Out::Answer(id, message) => match self.own.remove(&id) {
                    Some(Waiter::Use(token, reply)) => {
                        self.used = now();
                        self.tokens.remove(&token);
                        let _ = reply.send(Ok(message));
                    }
                    Some(Waiter::Caller(token, reply) | Waiter::Probe(token, reply)) => {
                        self.tokens.remove(&token);
                        let _ = reply.send(Ok(message));
                    }
                    Some(Waiter::Page(kind)) => self.page(kind, id, &message),
                    None => {}
                },
                Out::Unanswered(id) => match self.own.remove(&id) {
                    Some(
                        Waiter::Caller(token, reply)
                        | Waiter::Use(token, reply)
                        | Waiter::Probe(token, reply),
                    ) => {
                        self.tokens.remove(&token);
                        let _ = reply.send(Err(self.down_text(lost)));
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
    pub(super) fn record(&mut self, host: HostId, frame: &Frame) {
        if let Frame::Message(message) = frame
            && let Some(ledger) = self.hosts.get_mut(&host).and_then(|h| h.ledger.as_mut())
            && message.has("method")
            && let Some(id) = message.id_text()
        {
            ledger.record(&id);
        }
    }

    pub(super) fn on_host(&mut self, host: HostId, mut frame: Frame) {
        if let Frame::Message(message) = &mut frame {
            let dropped = session::strip(message);
            if !dropped.is_empty() {
                tracing::debug!(target: "mcpd::sessions", mcpd_server = %self.name, host, "dropped members JSON-RPC does not have: {}", dropped.join(", "));
            }
            // max-request-size, for whatever a host sends the server.
            let size = u64::try_from(message.received()).unwrap_or(u64::MAX);
            if size > self.max_request_size {
                let bound = format!(
                    "over the max-request-size of server {} ({} bytes)",
                    self.name, self.max_request_size
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
                        tracing::debug!(target: "mcpd::sessions", mcpd_server = %self.name, host, "dropped a notification of {size} bytes, {bound}");
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
        let step = session::classify(&frame, state);
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
                let bytes = session::list_answer(&id, "tools", self.status.borrow().tools.json());
                self.answered(host, &id);
                self.send_bytes(host, bytes);
            }
            Step::Request { id, method } => {
                if !self.answer_list(host, &id, &method) {
                    self.host_request(host, &method, id, message, None);
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
                    if let Some(ledger) = &mut h.ledger {
                        ledger.clear(request.as_json());
                    }
                    if let Some(m) = h.modern.as_deref_mut() {
                        m.close(&request);
                    }
                    if let Some(t) = h.translated.as_deref_mut() {
                        t.cancelled(&request);
                    }
                    if let Some(mut record) = h.calls.remove(&request) {
                        record.finish(Outcome::Failed("cancelled by the host".into()));
                    }
                }
                let outs = self.router.from_host(host, message);
                self.deliver(outs, None);
            }
            Step::Route => {
                if !message.has("method") && self.answered_input(host, &message) {
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
        name: &str,
        id: RequestId,
        message: Message,
        level: Option<Level>,
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
        if name == "tools/call" {
            let tool = session::tool_name(&message);
            if let Some(why) = self.filter.why_not(&tool) {
                let text = CallError::Filtered {
                    server: self.name.to_string(),
                    tool,
                    why,
                }
                .to_string();
                self.send(
                    host,
                    ErrorCode::InvalidParams.response(&id.to_value(), text),
                );
                return;
            }
            let Some(h) = self.hosts.get_mut(&host) else {
                return;
            };
            let mut record = Record::new(&self.name, tool, &self.counters);
            record.caller = h.caller.clone();
            h.calls.insert(id.clone(), record);
        }
        if session::counts_as_use(name) {
            self.used = now();
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
