//! A unit's spans: what its host-session driver (`supervisor::sessions`)
//! read and wrote, made spans. One server span per host request, from
//! its arrival to its answer (or cancellation, or the host's end); one
//! client span per request sent upstream for it, its child, whose
//! `traceparent` the request carries in `params._meta`. A request the
//! server makes (elicitation, sampling, roots) is a server span of its
//! own, child of the `traceparent` in its `_meta` or else of the client
//! span of the host's request that caused it, and the request mcpd sends
//! a host for it (or for a 2026-07-28 server's `input_required` answer)
//! a client span beneath, whose `traceparent` the host is sent. The
//! durations go into the conventions' histograms whether or not a trace is
//! sampled. Bounded: [`MAX_OPEN`] requests of each side and direction in
//! flight are traced.

use std::sync::Arc;
use std::time::Instant;

use foldhash::HashMap;
use serde_json::Value as Json;

use super::context::{self, SpanContext};
use super::metrics::Histogram;
use super::{Span, SpanKind, Value};
use crate::mux::message::{Message, RequestId};
use crate::mux::method::Method;
use crate::mux::route::HostId;

/// Requests in flight traced per side and unit; more are not traced.
pub const MAX_OPEN: usize = 8192;

/// How a peer is reached (`network.transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// stdio: a bridged host's, a server process's.
    Pipe,
    /// A Unix socket (D-Bus `Attach`, the attach socket).
    Unix,
    /// HTTP: the endpoint's hosts, an HTTP server.
    Tcp,
    /// Within the daemon (an aggregate's member session).
    Inproc,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Pipe => "pipe",
            Transport::Unix => "unix",
            Transport::Tcp => "tcp",
            Transport::Inproc => "inproc",
        }
    }
}

#[derive(Debug)]
struct Open {
    context: SpanContext,
    parent: Option<[u8; 8]>,
    tracestate: Option<String>,
    method: String,
    /// `gen_ai.tool.name` or `gen_ai.prompt.name`, and the name.
    target: Option<(&'static str, String)>,
    uri: Option<String>,
    id: String,
    transport: Transport,
    version: Option<String>,
    /// The host whose request it is (an upstream request's), or that it
    /// was sent to or caused by (a server→client request's).
    host: Option<HostId>,
    /// Its parent came in its own `_meta` (a server→client request's).
    meta_parent: bool,
    start: u64,
    started: Instant,
}

/// A unit's spans in flight.
#[derive(Debug)]
pub struct Tracer {
    unit: Arc<str>,
    /// Host requests (server spans).
    hosts: HashMap<(HostId, RequestId), Open>,
    /// mcpd's requests to the server (client spans), by mcpd's id.
    ups: HashMap<u64, Open>,
    /// The server's requests to mcpd (server spans), by the server's id.
    downs: HashMap<RequestId, Open>,
    /// mcpd's requests to hosts (client spans), by host and mcpd's id.
    asks: HashMap<(HostId, RequestId), Open>,
    transports: HashMap<HostId, Transport>,
    upstream: Transport,
    /// The server's protocol version, as last seen.
    upstream_version: Option<String>,
}

impl Tracer {
    /// Unit `unit`'s, whose server is reached over `upstream`.
    pub fn new(unit: Arc<str>, upstream: Transport) -> Self {
        Self {
            unit,
            hosts: HashMap::default(),
            ups: HashMap::default(),
            downs: HashMap::default(),
            asks: HashMap::default(),
            transports: HashMap::default(),
            upstream,
            upstream_version: None,
        }
    }

    /// Host `host` attached over `transport`.
    pub fn attach(&mut self, host: HostId, transport: Transport) {
        self.transports.insert(host, transport);
    }

    /// Host `host` is gone: its requests' spans end.
    pub fn detach(&mut self, host: HostId) {
        self.transports.remove(&host);
        if self.asks.keys().any(|(h, _)| *h == host) {
            let ids: Vec<RequestId> = self
                .asks
                .keys()
                .filter(|(h, _)| *h == host)
                .map(|(_, id)| id.clone())
                .collect();
            for id in ids {
                if let Some(open) = self.asks.remove(&(host, id)) {
                    self.end(
                        open,
                        SpanKind::Client,
                        None,
                        Some(("cancelled".into(), "the host session ended".into())),
                    );
                }
            }
        }
        if !self.hosts.keys().any(|(h, _)| *h == host) {
            return;
        }
        let ids: Vec<RequestId> = self
            .hosts
            .keys()
            .filter(|(h, _)| *h == host)
            .map(|(_, id)| id.clone())
            .collect();
        for id in ids {
            if let Some(open) = self.hosts.remove(&(host, id)) {
                self.end(
                    open,
                    SpanKind::Server,
                    None,
                    Some(("cancelled".into(), "the host session ended".into())),
                );
            }
        }
    }

    /// A message host `host` sent, before the core has it. `version`: its
    /// session's protocol version, if fixed.
    pub fn from_host(&mut self, host: HostId, message: &Message, version: Option<&str>) {
        let Some(method) = message.method() else {
            // An answer to a request mcpd sent the host.
            if !self.asks.is_empty()
                && let Some(id) = message.request_id()
                && let Some(open) = self.asks.remove(&(host, id))
            {
                let error = outcome(message);
                self.end(open, SpanKind::Client, None, error);
            }
            return;
        };
        let Some(id) = message.request_id() else {
            if Method::parse(&method) == Method::Cancelled {
                self.cancelled(host, message);
            }
            return;
        };
        if self.hosts.len() >= MAX_OPEN || self.hosts.contains_key(&(host, id.clone())) {
            return;
        }
        let [name, meta, uri] = message
            .inners("params", ["name", "_meta", "uri"])
            .unwrap_or_default();
        let string = |text: Option<&str>| text.and_then(|t| serde_json::from_str::<String>(t).ok());
        let meta: Option<Json> = meta.and_then(|t| serde_json::from_str(t).ok());
        let parent = meta
            .as_ref()
            .and_then(|m| m["traceparent"].as_str())
            .and_then(SpanContext::parse);
        let tracestate = parent.and(
            meta.as_ref()
                .and_then(|m| m["tracestate"].as_str())
                .and_then(context::tracestate)
                .map(str::to_owned),
        );
        let kind = Method::parse(&method);
        let target = match kind {
            Method::ToolsCall => string(name).map(|n| ("gen_ai.tool.name", n)),
            Method::PromptsGet => string(name).map(|n| ("gen_ai.prompt.name", n)),
            _ => None,
        };
        let uri = if kind == Method::ResourcesRead {
            string(uri)
        } else {
            None
        };
        let trace_id = parent.map_or_else(super::fresh_id, |p| p.trace_id);
        let ratio = super::sample_ratio().unwrap_or(0.0);
        let open = Open {
            context: SpanContext {
                trace_id,
                span_id: super::fresh_id(),
                sampled: context::decide(parent.as_ref(), ratio, &trace_id),
            },
            parent: parent.map(|p| p.span_id),
            tracestate,
            method: method.into_owned(),
            target,
            uri,
            id: id.as_json().trim_matches('"').to_owned(),
            transport: self
                .transports
                .get(&host)
                .copied()
                .unwrap_or(Transport::Pipe),
            // A modern host says its version in each request.
            version: version.map(str::to_owned).or_else(|| {
                meta.as_ref()
                    .and_then(|m| m["io.modelcontextprotocol/protocolVersion"].as_str())
                    .map(str::to_owned)
            }),
            host: Some(host),
            meta_parent: parent.is_some(),
            start: super::now_nanos(),
            started: Instant::now(),
        };
        self.hosts.insert((host, id), open);
    }

    /// A message mcpd sends host `host`: an answer ends its request's
    /// span; a request (the server's, whose id was `asked`, or mcpd's own
    /// for an `input_required` answer) gets a client span, whose
    /// `traceparent` it carries from now on.
    pub fn to_host(&mut self, host: HostId, message: &mut Message, asked: Option<&RequestId>) {
        if message.has("method") {
            self.ask(host, message, asked);
            return;
        }
        if self.hosts.is_empty() {
            return;
        }
        let Some(id) = message.request_id() else {
            return;
        };
        if let Some(open) = self.hosts.remove(&(host, id)) {
            let error = outcome(message);
            self.end(open, SpanKind::Server, None, error);
        }
    }

    /// A line mcpd made for host `host` (an answer of its own, or a
    /// question for an `input_required` answer, which gets its
    /// `traceparent`: the line is written again then).
    pub fn bytes_to_host(&mut self, host: HostId, bytes: &mut Vec<u8>) {
        if !self.hosts.keys().any(|(h, _)| *h == host) {
            return;
        }
        if let Ok(mut message) = Message::parse(bytes) {
            let request = message.has("method");
            self.to_host(host, &mut message, None);
            if request {
                *bytes = message.line();
            }
        }
    }

    /// mcpd sends host `host` request `message`: a client span, child of
    /// the server's request it carries (`asked`: the server's id) or else
    /// of the host's most recent request in flight.
    fn ask(&mut self, host: HostId, message: &mut Message, asked: Option<&RequestId>) {
        let Some(id) = message.request_id() else {
            return;
        };
        if self.asks.len() >= MAX_OPEN {
            return;
        }
        let Some(method) = message.method().map(|m| m.into_owned()) else {
            return;
        };
        // The server's request now has its host: if it did not name its
        // parent, the cause is that host's request upstream.
        if let Some(down) = asked.and_then(|s| self.downs.get(s))
            && !down.meta_parent
            && down.host != Some(host)
            && let Some(cause) = latest(&self.ups, |o| o.host == Some(host))
        {
            let (context, parent) = (cause.context, cause.context.span_id);
            if let Some(down) = asked.and_then(|s| self.downs.get_mut(s)) {
                down.context = SpanContext {
                    span_id: down.context.span_id,
                    ..context
                };
                down.parent = Some(parent);
                down.host = Some(host);
            }
        }
        let parent = match asked.and_then(|s| self.downs.get(s)) {
            Some(down) => Some(down),
            None => latest(&self.hosts, |o| o.host == Some(host)),
        };
        let context = match parent {
            Some(p) => SpanContext {
                span_id: super::fresh_id(),
                ..p.context
            },
            None => root(),
        };
        let open = Open {
            context,
            parent: parent.map(|p| p.context.span_id),
            tracestate: parent.and_then(|p| p.tracestate.clone()),
            method,
            target: None,
            uri: None,
            id: id.as_json().trim_matches('"').to_owned(),
            transport: self
                .transports
                .get(&host)
                .copied()
                .unwrap_or(Transport::Pipe),
            version: latest(&self.hosts, |o| o.host == Some(host)).and_then(|o| o.version.clone()),
            host: Some(host),
            meta_parent: false,
            start: super::now_nanos(),
            started: Instant::now(),
        };
        inject(message, &open);
        self.asks.insert((host, id), open);
    }

    fn cancelled(&mut self, host: HostId, message: &Message) {
        let Ok([Some(id)]) = message.inners("params", ["requestId"]) else {
            return;
        };
        let Some(id) = serde_json::from_str::<Json>(id)
            .ok()
            .as_ref()
            .and_then(RequestId::of)
        else {
            return;
        };
        if let Some(open) = self.hosts.remove(&(host, id)) {
            self.end(
                open,
                SpanKind::Server,
                None,
                Some(("cancelled".into(), "the host cancelled it".into())),
            );
        }
    }

    /// mcpd sends `message` to the server. A request made for a host's
    /// (`owner`: the host and its id) gets a client span, child of the
    /// host's, whose `traceparent` it carries from now on. `version`: the
    /// server's protocol version.
    pub fn to_server(
        &mut self,
        message: &mut Message,
        owner: Option<(HostId, &RequestId)>,
        version: Option<&str>,
    ) {
        if let Some(version) = version
            && self.upstream_version.as_deref() != Some(version)
        {
            self.upstream_version = Some(version.to_owned());
        }
        let Some((host, id)) = owner else {
            match message.method_kind() {
                Some(Method::Cancelled) => self.up_cancelled(message),
                // mcpd answers a request of the server's.
                None if !self.downs.is_empty() => {
                    if let Some(open) = message.request_id().and_then(|id| self.downs.remove(&id)) {
                        let error = outcome(message);
                        self.end(open, SpanKind::Server, None, error);
                    }
                }
                _ => {}
            }
            return;
        };
        let Some(up) = message.request_id().and_then(|id| id.as_u64()) else {
            return;
        };
        let Some(parent) = self.hosts.get(&(host, id.clone())) else {
            return;
        };
        if self.ups.len() >= MAX_OPEN {
            return;
        }
        let context = SpanContext {
            span_id: super::fresh_id(),
            ..parent.context
        };
        let open = Open {
            context,
            parent: Some(parent.context.span_id),
            tracestate: parent.tracestate.clone(),
            method: parent.method.clone(),
            target: parent.target.clone(),
            uri: parent.uri.clone(),
            id: up.to_string(),
            transport: self.upstream,
            version: version.map(str::to_owned),
            host: Some(host),
            meta_parent: false,
            start: super::now_nanos(),
            started: Instant::now(),
        };
        inject(message, &open);
        self.ups.insert(up, open);
    }

    fn up_cancelled(&mut self, message: &Message) {
        let Ok([Some(id)]) = message.inners("params", ["requestId"]) else {
            return;
        };
        if let Some(open) = id.parse::<u64>().ok().and_then(|up| self.ups.remove(&up)) {
            self.end(
                open,
                SpanKind::Client,
                None,
                Some(("cancelled".into(), "cancelled".into())),
            );
        }
    }

    /// A message of the server's, before the core has it: an answer ends
    /// its request's span; a request of its own begins a server span.
    pub fn from_server(&mut self, message: &Message) {
        if message.has("method") {
            self.server_request(message);
            return;
        }
        if self.ups.is_empty() {
            return;
        }
        let Some(up) = message.request_id().and_then(|id| id.as_u64()) else {
            return;
        };
        if let Some(open) = self.ups.remove(&up) {
            let error = outcome(message);
            self.end(open, SpanKind::Client, None, error);
        }
    }

    /// The server's request `message` (elicitation, sampling, roots):
    /// a server span, child of the `traceparent` of its `_meta`, or else
    /// of the most recent upstream request in flight (the host it goes to
    /// may name a better one: [`Tracer::to_host`]).
    fn server_request(&mut self, message: &Message) {
        let Some(id) = message.request_id() else {
            return;
        };
        if self.downs.len() >= MAX_OPEN || self.downs.contains_key(&id) {
            return;
        }
        let Some(method) = message.method().map(|m| m.into_owned()) else {
            return;
        };
        let meta: Option<Json> = message
            .inners("params", ["_meta"])
            .ok()
            .and_then(|[meta]| meta)
            .and_then(|t| serde_json::from_str(t).ok());
        let theirs = meta
            .as_ref()
            .and_then(|m| m["traceparent"].as_str())
            .and_then(SpanContext::parse);
        let cause = latest(&self.ups, |_| true);
        let (context, parent, tracestate) = match (theirs, cause) {
            (Some(p), _) => (
                SpanContext {
                    span_id: super::fresh_id(),
                    ..p
                },
                Some(p.span_id),
                meta.as_ref()
                    .and_then(|m| m["tracestate"].as_str())
                    .and_then(context::tracestate)
                    .map(str::to_owned),
            ),
            (None, Some(c)) => (
                SpanContext {
                    span_id: super::fresh_id(),
                    ..c.context
                },
                Some(c.context.span_id),
                c.tracestate.clone(),
            ),
            (None, None) => (root(), None, None),
        };
        let open = Open {
            context,
            parent,
            tracestate,
            method,
            target: None,
            uri: None,
            id: id.as_json().trim_matches('"').to_owned(),
            transport: self.upstream,
            version: self.upstream_version.clone(),
            host: cause.and_then(|c| c.host).filter(|_| theirs.is_none()),
            meta_parent: theirs.is_some(),
            start: super::now_nanos(),
            started: Instant::now(),
        };
        self.downs.insert(id, open);
    }

    /// The upstream is gone: its requests' spans end.
    pub fn released(&mut self) {
        for (_, open) in std::mem::take(&mut self.downs) {
            self.end(
                open,
                SpanKind::Server,
                None,
                Some(("closed".into(), "the server's connection ended".into())),
            );
        }
        for (_, open) in std::mem::take(&mut self.ups) {
            self.end(
                open,
                SpanKind::Client,
                None,
                Some(("closed".into(), "the server's connection ended".into())),
            );
        }
    }

    fn end(&self, open: Open, kind: SpanKind, _at: Option<u64>, error: Option<(String, String)>) {
        let seconds = open.started.elapsed().as_secs_f64();
        let mut metric: Vec<(&'static str, String)> = vec![
            ("mcp.method.name", open.method.clone()),
            ("network.transport", open.transport.as_str().into()),
            ("mcpd.unit", self.unit.to_string()),
        ];
        if let Some(version) = &open.version {
            metric.push(("mcp.protocol.version", version.clone()));
        }
        if let Some((key, name)) = &open.target {
            metric.push((key, name.clone()));
        }
        if let Some((kind, _)) = &error {
            metric.push(("error.type", kind.clone()));
        }
        let histogram = match kind {
            SpanKind::Server => Histogram::Server,
            SpanKind::Client => Histogram::Client,
        };
        if !open.context.sampled {
            super::record(histogram, seconds, metric);
            return;
        }
        let mut attributes: Vec<(&'static str, Value)> = metric
            .iter()
            .map(|(k, v)| (*k, Value::Text(v.clone())))
            .collect();
        super::record(histogram, seconds, metric);
        attributes.push(("jsonrpc.request.id", Value::Text(open.id)));
        if open
            .target
            .as_ref()
            .is_some_and(|(k, _)| *k == "gen_ai.tool.name")
        {
            attributes.push(("gen_ai.operation.name", Value::Text("execute_tool".into())));
        }
        if let Some(uri) = open.uri {
            attributes.push(("mcp.resource.uri", Value::Text(uri)));
        }
        let name = match &open.target {
            Some((_, target)) => format!("{} {target}", open.method),
            None => open.method,
        };
        super::finish(Span {
            context: open.context,
            parent: open.parent,
            tracestate: open.tracestate,
            name,
            kind,
            start: open.start,
            end: super::now_nanos(),
            attributes,
            error: error.map(|(_, why)| why),
        });
    }
}

/// The most recently begun of `open` that `filter` keeps.
fn latest<K>(open: &HashMap<K, Open>, filter: impl Fn(&Open) -> bool) -> Option<&Open> {
    open.values()
        .filter(|o| filter(o))
        .max_by_key(|o| (o.start, o.started))
}

/// A new trace's root context, sampled by the ratio.
fn root() -> SpanContext {
    let trace_id = super::fresh_id();
    let ratio = super::sample_ratio().unwrap_or(0.0);
    SpanContext {
        trace_id,
        span_id: super::fresh_id(),
        sampled: context::decide(None, ratio, &trace_id),
    }
}

/// An answer's failure, as `error.type` and a message: a JSON-RPC error's
/// code, or `tool_error` for a tool's result marked `isError`.
fn outcome(message: &Message) -> Option<(String, String)> {
    if let Some(error) = message.get::<Json>("error") {
        let code = error["code"].as_i64().unwrap_or(0);
        let text = error["message"].as_str().unwrap_or_default().to_owned();
        return Some((code.to_string(), text));
    }
    match message.inners("result", ["isError"]) {
        Ok([Some("true")]) => Some(("tool_error".into(), "the tool reported an error".into())),
        _ => None,
    }
}

/// Writes `open`'s `traceparent` (and the host's `tracestate`) into the
/// request's `params._meta`.
fn inject(message: &mut Message, open: &Open) {
    let mut params = message
        .params()
        .unwrap_or_else(|| Json::Object(Default::default()));
    let Some(object) = params.as_object_mut() else {
        return;
    };
    let meta = object
        .entry("_meta")
        .or_insert_with(|| Json::Object(Default::default()));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    meta.insert(
        "traceparent".into(),
        Json::String(open.context.traceparent()),
    );
    match &open.tracestate {
        Some(state) => {
            meta.insert("tracestate".into(), Json::String(state.clone()));
        }
        None => {
            meta.remove("tracestate");
        }
    }
    message.set("params", &params);
}
