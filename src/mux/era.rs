//! Protocol eras (DESIGN §12): what a host speaking MCP 2026-07-28 gets
//! from mcpd over a server speaking the 2025 era (the handshake).
//!
//! MCP 2026-07-28 has no `initialize`: every request carries its version,
//! its client's capabilities and, if it wants log messages, a log level,
//! in `params._meta`; `server/discover` tells what the server is; results
//! say what they are (`resultType`) and who made them; a server that needs
//! the client's input answers `input_required` and the client retries
//! with the answers; `subscriptions/listen` replaces `resources/subscribe`
//! and the unsolicited `list_changed` notifications.
//!
//! Pure, like the router: no I/O, no clock (instants are passed in), no
//! randomness (the nonce of [`Inputs`] is). The sessions' core
//! (`mux::session`, its `modern` and `upstream` parts) asks here:
//!
//! - [`claims`], [`check`]: whether a host's request is of the modern
//!   era, and whether mcpd can serve it (version, capabilities, level);
//! - [`strip_reserved`]: the request as a 2025 server must see it;
//! - [`discover_result`], [`complete`], [`list_answer`]: what a modern
//!   host is answered, from the server's `initialize` result and answers;
//! - [`Inputs`] and [`input_required`]: a server→client request a modern
//!   host's call caused becomes an `input_required` result, and the host's
//!   retry answers it (`requestState` minted and checked here, bound to
//!   the session that got it, used once, expiring);
//! - [`Listens`]: `subscriptions/listen` streams and what reaches each;
//! - [`CacheHint`]: a list's `ttlMs` and `cacheScope`, when it is read
//!   again and what a host is told of it;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use foldhash::HashMap;
use serde_json::{Map, Value, json};

use super::error::ErrorCode;
use super::message::{Message, RequestId};
use super::method::Method;
use super::route::{Caps, Level};
use super::scan;

/// The revision without the handshake.
pub const MODERN: &str = "2026-07-28";

/// The modern revisions mcpd serves hosts.
pub const MODERN_VERSIONS: [&str; 1] = [MODERN];

/// `_meta` keys of a modern request, and of results and notifications.
pub const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
pub const CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
pub const CLIENT_INFO_KEY: &str = "io.modelcontextprotocol/clientInfo";
pub const LOG_LEVEL_KEY: &str = "io.modelcontextprotocol/logLevel";
pub const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";
pub const SUBSCRIPTION_ID_KEY: &str = "io.modelcontextprotocol/subscriptionId";

/// The `_meta` prefix MCP reserves for itself (a 2025 server knows none
/// of its keys).
pub const RESERVED_PREFIX: &str = "io.modelcontextprotocol/";

/// The tasks extension's identifier (MCP 2026-07-28), where 2025 servers
/// declared `capabilities.tasks`.
/// Revisions of the 2025 era a host may negotiate by `initialize`, oldest
/// first; a host asking for another gets the newest it speaks
/// (`session::PROTOCOL_VERSION`), as the specification says.
pub const HOST_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// Which era a host session speaks, fixed by its first request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// It opened with `initialize` (2024-11-05 … 2025-11-25).
    Legacy,
    /// It sent `server/discover` or a request with the modern `_meta`.
    Modern,
}

/// Every version mcpd serves hosts, newest first: the modern ones, then
/// those of the handshake.
pub fn supported_versions() -> Vec<&'static str> {
    MODERN_VERSIONS
        .into_iter()
        .chain(HOST_VERSIONS.into_iter().rev())
        .collect()
}

/// The `_meta` object of a request's params, parsed (none: absent or not
/// an object).
pub fn meta_of(message: &Message) -> Option<Map<String, Value>> {
    let raw = match message.inner("params", "_meta") {
        Ok(raw) => raw.map(str::to_owned),
        Err(_) => message
            .params()
            .and_then(|p| p.get("_meta").map(Value::to_string)),
    };
    match serde_json::from_str(&raw?) {
        Ok(Value::Object(meta)) => Some(meta),
        _ => None,
    }
}

/// Whether a request claims the modern era: its `_meta` names a protocol
/// version. A quick look first: most messages of a 2025 session do not
/// hold the key's text at all.
pub fn claims(message: &Message) -> bool {
    // One prebuilt searcher for every message of a 2025 session (a key
    // spelled with escapes is not looked for: such a request is not
    // taken for a modern one).
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(VERSION_KEY));
    // `V` of `protocolVersion`: a capital, rare in params.
    const PIVOT: usize = VERSION_KEY.len() - "ersion".len() - 1;
    debug_assert_eq!(VERSION_KEY.as_bytes()[PIVOT], b'V');
    message.raw("params").is_some_and(|raw| {
        super::message::holds(raw.as_bytes(), VERSION_KEY.as_bytes(), PIVOT, &KEY)
    }) && meta_of(message).is_some_and(|m| m.contains_key(VERSION_KEY))
}

/// What mcpd reads of a modern request's `_meta`.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMeta {
    /// What its client can answer, for this request alone.
    pub caps: Caps,
    /// The level of log messages it wants while it is in flight (none: no
    /// log messages at all).
    pub level: Option<Level>,
}

/// The answer to request `id` that asked for version `requested`, which
/// mcpd does not serve on this path: [`ErrorCode::UnsupportedVersion`]
/// with what it does serve.
pub fn unsupported(id: &Value, requested: &str, supported: &[&str]) -> Value {
    ErrorCode::UnsupportedVersion
        .error(format!(
            "unsupported protocol version {requested:?} (mcpd serves {supported:?})"
        ))
        .with_data(json!({"requested": requested, "supported": supported}))
        .to_value(id)
}

/// Whether mcpd can serve modern request `id` whose `_meta` is `meta`:
/// a version it speaks, capabilities declared (an object; `{}` declares
/// none), a known log level if one is asked for. Else the error answer.
pub fn check(id: &RequestId, meta: Option<&Map<String, Value>>) -> Result<RequestMeta, Value> {
    let id = id.to_value();
    let invalid = |why: String| ErrorCode::InvalidParams.response(&id, why);
    let Some(meta) = meta else {
        return Err(invalid(format!(
            "a request of MCP {MODERN} needs params._meta with {VERSION_KEY} and {CAPABILITIES_KEY}"
        )));
    };
    let version = match meta.get(VERSION_KEY) {
        Some(Value::String(version)) => version,
        Some(_) => return Err(invalid(format!("_meta {VERSION_KEY} must be a string"))),
        None => {
            return Err(invalid(format!(
                "a request of MCP {MODERN} needs _meta {VERSION_KEY}"
            )));
        }
    };
    if !MODERN_VERSIONS.contains(&version.as_str()) {
        return Err(unsupported(&id, version, &supported_versions()));
    }
    let caps = match meta.get(CAPABILITIES_KEY) {
        Some(caps @ Value::Object(_)) => Caps::of(caps),
        Some(_) => {
            return Err(invalid(format!(
                "_meta {CAPABILITIES_KEY} must be an object"
            )));
        }
        None => {
            return Err(invalid(format!(
                "a request of MCP {MODERN} needs _meta {CAPABILITIES_KEY} ({{}} declares none)"
            )));
        }
    };
    let level = match meta.get(LOG_LEVEL_KEY) {
        None | Some(Value::Null) => None,
        Some(Value::String(word)) => match word.parse::<Level>() {
            Ok(level) => Some(level),
            Err(why) => return Err(invalid(format!("_meta {LOG_LEVEL_KEY}: {why}"))),
        },
        Some(_) => return Err(invalid(format!("_meta {LOG_LEVEL_KEY} must be a string"))),
    };
    Ok(RequestMeta { caps, level })
}

/// Takes the reserved `_meta` keys out of a modern request, which a 2025
/// server must not see (it may refuse them, or act on a version it does
/// not speak); everything else of `_meta` (a progress token, extensions'
/// keys) stays, and a `_meta` left empty goes. Found by a scan, the
/// members copied as text; only keys with escapes need a parser.
pub fn strip_reserved(message: &mut Message) {
    let Some(raw) = message.raw("params") else {
        return;
    };
    match without_reserved(raw) {
        Ok(Some(params)) => message.set_json("params", params),
        Ok(None) => {}
        Err(()) => strip_parsed(message),
    }
}

/// The params text `params` without the reserved `_meta` keys; `None` if
/// it has none; `Err` where only a parser can tell.
fn without_reserved(params: &str) -> Result<Option<String>, ()> {
    let spans = scan::object(params.as_bytes()).ok_or(())?;
    if spans.iter().any(|s| s.escaped) {
        return Err(());
    }
    let key = |s: &scan::Span| &params[s.key.0..s.key.1];
    let value = |s: &scan::Span| &params[s.value.0..s.value.1];
    let Some(last) = spans.iter().rposition(|s| key(s) == "_meta") else {
        return Ok(None);
    };
    let meta = value(&spans[last]);
    let Some(members) = scan::object(meta.as_bytes()) else {
        // Not an object: nothing of MCP's in it.
        return Ok(None);
    };
    if members.iter().any(|s| s.escaped) {
        return Err(());
    }
    let meta_key = |s: &scan::Span| &meta[s.key.0..s.key.1];
    if !members
        .iter()
        .any(|m| meta_key(m).starts_with(RESERVED_PREFIX))
    {
        return Ok(None);
    }
    let kept: Vec<String> = members
        .iter()
        .filter(|m| !meta_key(m).starts_with(RESERVED_PREFIX))
        .map(|m| format!("\"{}\":{}", meta_key(m), &meta[m.value.0..m.value.1]))
        .collect();
    let mut out: Vec<String> = Vec::with_capacity(spans.len());
    for (at, span) in spans.iter().enumerate() {
        if key(span) == "_meta" {
            if at == last && !kept.is_empty() {
                out.push(format!("\"_meta\":{{{}}}", kept.join(",")));
            }
        } else {
            out.push(format!("\"{}\":{}", key(span), value(span)));
        }
    }
    Ok(Some(format!("{{{}}}", out.join(","))))
}

/// [`strip_reserved`] for params only a parser can read.
fn strip_parsed(message: &mut Message) {
    let Some(mut params) = message.params() else {
        return;
    };
    let Some(meta) = params.get_mut("_meta").and_then(Value::as_object_mut) else {
        return;
    };
    meta.retain(|key, _| !key.starts_with(RESERVED_PREFIX));
    if meta.is_empty()
        && let Some(params) = params.as_object_mut()
    {
        params.remove("_meta");
    }
    message.set("params", &params);
}

/// The server's capabilities as a modern host reads them: `tools.listChanged`
/// (mcpd tells hosts when the published tools change), and the tasks of
/// 2025 as the tasks extension.
pub fn modern_capabilities(init: &Value) -> Value {
    let mut caps = init["capabilities"].clone();
    if !caps.is_object() {
        caps = json!({});
    }
    if let Some(tools) = caps.get_mut("tools").and_then(Value::as_object_mut) {
        tools.insert("listChanged".into(), json!(true));
    }
    if let Some(tasks) = caps.as_object_mut().and_then(|c| c.remove("tasks")) {
        caps["extensions"][TASKS_EXTENSION] = tasks;
    }
    caps
}

/// The answer to `server/discover`, from the server's `initialize` result
/// `init`: what it is and can do, every version mcpd serves, and the
/// caching hints of a server that gives none (stale at once, for this
/// caller alone).
pub fn discover_result(init: &Value) -> Value {
    let mut result = json!({
        "resultType": "complete",
        "supportedVersions": supported_versions(),
        "capabilities": modern_capabilities(init),
        "ttlMs": 0,
        "cacheScope": "private",
        "_meta": {SERVER_INFO_KEY: init["serverInfo"]},
    });
    if let Some(instructions) = init.get("instructions").filter(|i| i.is_string()) {
        result["instructions"] = instructions.clone();
    }
    result
}

/// What mcpd keeps of a server of MCP 2026-07-28 that answered
/// `server/discover` with `discovered`: what an `initialize` result holds
/// (`protocolVersion` 2026-07-28, `capabilities`, `serverInfo` from the
/// result's `_meta`, `instructions`), so that every host, of either era,
/// is answered from it.
pub fn init_of_discover(discovered: &Value) -> Value {
    let mut init = json!({
        "protocolVersion": MODERN,
        "capabilities": discovered["capabilities"],
        "serverInfo": discovered["_meta"][SERVER_INFO_KEY],
    });
    if let Some(instructions) = discovered.get("instructions").filter(|i| i.is_string()) {
        init["instructions"] = instructions.clone();
    }
    if init["serverInfo"].is_null() {
        init["serverInfo"] = json!({"name": "", "version": ""});
    }
    init
}

/// Whether the server that answered with `init` speaks MCP 2026-07-28.
pub fn is_modern(init: &Value) -> bool {
    init["protocolVersion"] == MODERN
}

/// The JSON text of the server's identity, as results carry it.
pub fn server_info(init: &Value) -> String {
    init.get("serverInfo")
        .map_or_else(|| "{}".to_owned(), Value::to_string)
}

/// Object text `object` with member `key` (JSON text, quoted) set to
/// `value` (JSON text) first.
fn prepend(object: &str, key: &str, value: &str) -> String {
    prepend_members(object, &format!("{key}:{value}"))
}

/// Object text `object` with `members` (JSON text of members: `"k":v,…`)
/// first.
fn prepend_members(object: &str, members: &str) -> String {
    let inner = object.trim_start().strip_prefix('{').unwrap_or("}");
    let empty = inner.trim_start().starts_with('}');
    let comma = if empty { "" } else { "," };
    format!("{{{members}{comma}{inner}")
}

/// Adds `members` (JSON text of members: `"k":v,…`) to the `_meta` of a
/// request's params, as text: a 2025 host's `_meta` on its way to a
/// server of MCP 2026-07-28. Its own keys come after, so a parser reads
/// its own where both name one.
pub fn add_meta(message: &mut Message, members: &str) {
    let text = match (message.raw("params"), message.inner("params", "_meta")) {
        (None, _) => format!("{{\"_meta\":{{{members}}}}}"),
        (Some(raw), Ok(Some(meta))) if meta.trim_start().starts_with('{') => {
            let at = meta.as_ptr() as usize - raw.as_ptr() as usize;
            let new = prepend_members(meta, members);
            format!("{}{new}{}", &raw[..at], &raw[at + meta.len()..])
        }
        (Some(raw), Ok(None)) if raw.trim_start().starts_with('{') => {
            prepend_members(raw, &format!("\"_meta\":{{{members}}}"))
        }
        _ => {
            // Params only a parser can read (or not an object).
            let mut params = message
                .params()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            if !params["_meta"].is_object() {
                params["_meta"] = json!({});
            }
            if let (Some(meta), Ok(Value::Object(ours))) = (
                params["_meta"].as_object_mut(),
                serde_json::from_str::<Value>(&format!("{{{members}}}")),
            ) {
                for (key, value) in ours {
                    meta.entry(key).or_insert(value);
                }
            }
            message.set("params", &params);
            return;
        }
    };
    message.set_json("params", text);
}

/// Makes a server's answer (`result`) to a modern host's request what a
/// modern answer is: `resultType` (`complete`, unless the server said),
/// `_meta` with the server's identity (`info`, JSON text), and for a list
/// (`cacheable`) the caching hints. Errors pass as they are.
pub fn complete(message: &mut Message, info: &str, cacheable: bool) {
    if !message.has("result") {
        return;
    }
    let Ok([kind, meta, ttl, scope]) =
        message.inners("result", ["resultType", "_meta", "ttlMs", "cacheScope"])
    else {
        // Only a parser can tell (a key with escapes, or not an object).
        complete_parsed(message, info, cacheable);
        return;
    };
    let info_key = format!("\"{SERVER_INFO_KEY}\"");
    let (has_kind, has_ttl, has_scope) = (kind.is_some(), ttl.is_some(), scope.is_some());
    let Some(raw) = message.raw("result") else {
        return;
    };
    let mut text = match meta {
        // It names its server already (a modern upstream's answer).
        Some(meta) if meta.contains(SERVER_INFO_KEY) => raw.to_owned(),
        Some(meta) if meta.trim_start().starts_with('{') => {
            // The server's own `_meta`, with the identity added.
            let at = meta.as_ptr() as usize - raw.as_ptr() as usize;
            let new = prepend(meta, &info_key, info);
            format!("{}{new}{}", &raw[..at], &raw[at + meta.len()..])
        }
        Some(_) => {
            complete_parsed(message, info, cacheable);
            return;
        }
        None => prepend(raw, "\"_meta\"", &format!("{{{info_key}:{info}}}")),
    };
    if cacheable && !has_scope {
        text = prepend(&text, "\"cacheScope\"", "\"private\"");
    }
    if cacheable && !has_ttl {
        text = prepend(&text, "\"ttlMs\"", "0");
    }
    if !has_kind {
        text = prepend(&text, "\"resultType\"", "\"complete\"");
    }
    message.set_json("result", text);
}

/// [`complete`] for a result only a parser can read.
fn complete_parsed(message: &mut Message, info: &str, cacheable: bool) {
    let Some(Value::Object(mut result)) = message.get::<Value>("result") else {
        return;
    };
    let info: Value = serde_json::from_str(info).unwrap_or(Value::Null);
    result
        .entry("resultType")
        .or_insert_with(|| json!("complete"));
    if cacheable {
        result.entry("ttlMs").or_insert_with(|| json!(0));
        result
            .entry("cacheScope")
            .or_insert_with(|| json!("private"));
    }
    let meta = result.entry("_meta").or_insert_with(|| json!({}));
    if let Some(meta) = meta.as_object_mut() {
        meta.entry(SERVER_INFO_KEY).or_insert(info);
    }
    message.set("result", &Value::Object(result));
}

/// Whether a request's answer carries caching hints (a list, a read).
pub fn cacheable(method: &str) -> bool {
    let method = Method::parse(method);
    method.is_list() || method == Method::ResourcesRead
}

/// The answer to modern list request `id` from a kept list (as
/// `session::list_answer`), with what a modern result carries: `ttlMs`
/// and `cacheScope` as `fresh` says (what the server said of the list,
/// TTL counted down; "private" and 0 when it said nothing).
pub fn list_answer(id: &RequestId, key: &str, list: &str, info: &str, fresh: Fresh) -> Vec<u8> {
    let (ttl, scope) = (fresh.ttl_ms, fresh.scope());
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"{key}\":{list},\"resultType\":\"complete\",\"ttlMs\":{ttl},\"cacheScope\":\"{scope}\",\"_meta\":{{\"{SERVER_INFO_KEY}\":{info}}}}}}}\n"
    )
    .into_bytes()
}

/// The least time between two reads of a list that its server (of MCP
/// 2026-07-28) says may be kept for less, `ttlMs` 0 included: hosts'
/// requests never make it a storm of re-reads (as a `list_changed` storm
/// is read at most every 100 ms, DESIGN §3, invariant 10).
pub const MIN_LIST_TTL: Duration = Duration::from_millis(100);

/// A list's caching hints (MCP 2026-07-28): how long it may be kept
/// (`ttlMs`) and by whom (`cacheScope`), as its server said them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheHint {
    /// `ttlMs`; None when not said (or not a whole number of
    /// milliseconds): kept until the server says `list_changed`.
    pub ttl: Option<Duration>,
    /// `cacheScope` is "public" (anything else is "private").
    pub public: bool,
}

impl CacheHint {
    /// The hints of a list page's `result`.
    pub fn of(result: &Value) -> Self {
        Self {
            ttl: result
                .get("ttlMs")
                .and_then(Value::as_u64)
                .map(Duration::from_millis),
            public: result.get("cacheScope").and_then(Value::as_str) == Some("public"),
        }
    }

    /// The hints of a list read in several pages, this one's and `next`'s:
    /// the shorter TTL, public only if both are.
    #[must_use]
    pub fn and(self, next: Self) -> Self {
        let ttl = match (self.ttl, next.ttl) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Self {
            ttl,
            public: self.public && next.public,
        }
    }

    /// When a list whose read completed at `read` is read again, on the
    /// next request for it: its TTL later, and never sooner than
    /// [`MIN_LIST_TTL`]; None when the server said no TTL (or one past
    /// what an instant can hold).
    pub fn stale_at(self, read: Instant) -> Option<Instant> {
        self.ttl
            .and_then(|ttl| read.checked_add(ttl.max(MIN_LIST_TTL)))
    }

    /// What a host is told of the list at `now`, if it was read at `read`.
    pub fn fresh(self, read: Instant, now: Instant) -> Fresh {
        let left = self
            .ttl
            .and_then(|ttl| read.checked_add(ttl))
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
        Fresh {
            ttl_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
            public: self.public,
        }
    }
}

/// A kept list's caching hints as a modern host is answered them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fresh {
    /// `ttlMs`: what is left of the server's TTL (0: ask again).
    pub ttl_ms: u64,
    /// `cacheScope` "public".
    pub public: bool,
}

impl Fresh {
    /// `cacheScope`.
    pub fn scope(self) -> &'static str {
        if self.public { "public" } else { "private" }
    }
}

/// The requests whose answer may be `input_required`.
pub fn may_need_input(method: &str) -> bool {
    matches!(
        Method::parse(method),
        Method::ToolsCall | Method::PromptsGet | Method::ResourcesRead
    )
}

/// The capability a server→client request needs of the client, as
/// [`ErrorCode::MissingCapability`]'s `requiredCapabilities` names it.
pub fn required_capability(method: &str) -> Option<&'static str> {
    Method::parse(method).capability()
}

/// Whether a client with `caps` can answer server→client request `method`.
pub fn can_answer(caps: Caps, method: &str) -> bool {
    caps.answers(Method::parse(method)).unwrap_or(false)
}

/// The answer to request `id` whose server needs `method` of a client
/// that did not declare the capability.
pub fn missing_capability(id: &Value, method: &str) -> Value {
    let capability = required_capability(method).unwrap_or("experimental");
    ErrorCode::MissingCapability
        .error(format!(
            "the server needs the client capability {capability} ({method}) for this request"
        ))
        .with_data(json!({"requiredCapabilities": {capability: {}}}))
        .to_value(id)
}

/// Server→client requests one call may have waiting for its host.
pub const MAX_ASKS: usize = 16;

/// A server→client request waiting for a modern host's input.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// The id the router gave it for this host (its answer goes back
    /// with this id through the router).
    pub down: u64,
    /// `method` and `params`, as `inputRequests` holds it.
    pub request: Value,
    /// The host was shown it (in an `input_required` result).
    pub shown: bool,
}

impl Ask {
    /// Its key in `inputRequests` / `inputResponses`.
    pub fn key(&self) -> String {
        self.down.to_string()
    }
}

/// The server→client request `message` as an [`Ask`] (id `down`).
pub fn ask(down: u64, message: &Message) -> Ask {
    let mut request = json!({"method": message.method().unwrap_or_default()});
    if let Some(params) = message.params() {
        request["params"] = params;
    }
    Ask {
        down,
        request,
        shown: false,
    }
}

/// The `input_required` result showing `asks` (each is marked shown),
/// whose retry must carry `state`.
pub fn input_required(asks: &mut [Ask], state: &str, info: &str) -> Value {
    let mut requests = Map::new();
    for ask in asks.iter_mut() {
        ask.shown = true;
        requests.insert(ask.key(), ask.request.clone());
    }
    let info: Value = serde_json::from_str(info).unwrap_or(Value::Null);
    json!({
        "resultType": "input_required",
        "inputRequests": requests,
        "requestState": state,
        "_meta": {SERVER_INFO_KEY: info},
    })
}

/// How a parked call ended while its host was away.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// The server answered it (its upstream id still on it).
    Answered(Message),
    /// The upstream ended.
    Lost,
    /// Not sent upstream yet: it only carried questions the server asked
    /// before it came (an instance's server asks its host for `roots/list`
    /// once it is told of them), and the retry sends it, as the host's
    /// request, once they are answered.
    Unsent(Message),
}

/// A modern host's call answered `input_required` and open upstream,
/// waiting for the host's retry.
#[derive(Debug)]
pub struct Parked<C> {
    /// Its upstream id.
    pub up: u64,
    /// Its method (a retry must be of the same).
    pub method: String,
    /// Server→client requests it caused, not answered yet.
    pub asks: Vec<Ask>,
    /// How it ended, if it did before the retry.
    pub settled: Option<Settled>,
    /// The session layer's own (the call's accounting).
    pub call: C,
    /// When its `requestState` stops being valid.
    pub deadline: Instant,
    /// Its capabilities and log level, as its first request declared.
    pub meta: RequestMeta,
}

/// Whether `state` is of the shape mcpd mints (a server's own states go
/// to the server).
pub fn minted(state: &str) -> bool {
    state.starts_with("mcpd:")
}

/// Why a retry's `requestState` is refused.
pub const STALE: &str =
    "requestState is not one mcpd gave this session, was used already, or expired";

/// The calls of one modern host session parked for its input, by the
/// `requestState` each was given. A state is the session's alone (a
/// state of another session, or made up, is unknown here), used once,
/// and valid until its deadline.
#[derive(Debug)]
pub struct Inputs<C> {
    /// Random, per session: a state from another session or daemon never
    /// matches.
    nonce: u128,
    minted: u64,
    parked: HashMap<String, Parked<C>>,
}

impl<C> Inputs<C> {
    pub fn new(nonce: u128) -> Self {
        Self {
            nonce,
            minted: 0,
            parked: HashMap::default(),
        }
    }

    /// How many calls are parked.
    pub fn len(&self) -> usize {
        self.parked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parked.is_empty()
    }

    /// Parks `parked`; returns the state its retry must carry (see
    /// [`minted`]).
    pub fn park(&mut self, parked: Parked<C>) -> String {
        self.minted += 1;
        let state = format!("mcpd:{:032x}:{}", self.nonce, self.minted);
        self.parked.insert(state.clone(), parked);
        state
    }

    /// The call parked with `state`.
    pub fn get(&mut self, state: &str) -> Option<&mut Parked<C>> {
        self.parked.get_mut(state)
    }

    /// The parked call of upstream id `up`.
    pub fn by_up(&mut self, up: u64) -> Option<&mut Parked<C>> {
        self.parked.values_mut().find(|p| p.up == up)
    }

    /// The parked call that waits for the answer to server→client request
    /// `down`.
    pub fn with_ask(&mut self, down: u64) -> Option<&mut Parked<C>> {
        self.parked
            .values_mut()
            .find(|p| p.asks.iter().any(|a| a.down == down))
    }

    /// The call parked most recently (the likeliest cause of a server
    /// request none of the host's open calls can have caused).
    pub fn latest(&mut self) -> Option<&mut Parked<C>> {
        self.parked.values_mut().max_by_key(|p| p.up)
    }

    /// The parked call whose retry `method` carries `state`, taken (a
    /// state is used once); refused if unknown, expired at `now`, or of
    /// another method (then it stays).
    pub fn take(&mut self, state: &str, method: &str, now: Instant) -> Result<Parked<C>, String> {
        let parked = self.parked.get(state).ok_or_else(|| STALE.to_owned())?;
        if parked.deadline <= now {
            return Err(STALE.to_owned());
        }
        if parked.method != method {
            return Err(format!(
                "requestState belongs to a {} request, not {method}",
                parked.method
            ));
        }
        Ok(self.parked.remove(state).expect("looked up"))
    }

    /// The calls whose deadline passed at `now`, taken.
    pub fn expired(&mut self, now: Instant) -> Vec<Parked<C>> {
        let states: Vec<String> = self
            .parked
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(s, _)| s.clone())
            .collect();
        states
            .into_iter()
            .filter_map(|s| self.parked.remove(&s))
            .collect()
    }

    /// The earliest deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.parked.values().map(|p| p.deadline).min()
    }

    /// Every parked call, taken (the session ends).
    pub fn drain(&mut self) -> Vec<Parked<C>> {
        self.parked.drain().map(|(_, p)| p).collect()
    }
}

/// The answers of a retry's `inputResponses` to `asks`: (router id, the
/// result) for each ask it answers; the asks it does not answer are
/// returned.
pub fn answers(asks: Vec<Ask>, responses: &Map<String, Value>) -> (Vec<(u64, Value)>, Vec<Ask>) {
    let mut answered = Vec::new();
    let mut missing = Vec::new();
    for ask in asks {
        match responses.get(&ask.key()) {
            Some(result) if ask.shown => answered.push((ask.down, result.clone())),
            _ => missing.push(ask),
        }
    }
    (answered, missing)
}

/// What a `subscriptions/listen` opts in to (`notifications`), as mcpd
/// honours it for a server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub tools: bool,
    pub resources: bool,
    pub prompts: bool,
    pub uris: BTreeSet<String>,
}

/// Listen streams one host session may hold open.
pub const MAX_LISTENS: usize = 16;

impl Filter {
    /// What `requested` (a `SubscriptionFilter`) opts in to, of what the
    /// server (`init`) offers: `tools` always (mcpd tells hosts when the
    /// published tools change), the others if the server says it tells.
    pub fn honoured(requested: &Value, init: &Value) -> Result<Self, String> {
        if !requested.is_object() {
            return Err("subscriptions/listen needs `notifications` (an object)".into());
        }
        let asked = |key: &str| requested.get(key) == Some(&json!(true));
        let offers =
            |capability: &str, what: &str| init["capabilities"][capability][what] == json!(true);
        let mut uris = BTreeSet::new();
        match requested.get("resourceSubscriptions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                for uri in list {
                    let uri = uri
                        .as_str()
                        .ok_or("resourceSubscriptions must be a list of URIs")?;
                    uris.insert(uri.to_owned());
                }
            }
            Some(_) => return Err("resourceSubscriptions must be a list of URIs".into()),
        }
        if !uris.is_empty() && !offers("resources", "subscribe") {
            // Not honoured: omitted from the acknowledgement.
            uris.clear();
        }
        Ok(Self {
            tools: asked("toolsListChanged"),
            resources: asked("resourcesListChanged") && offers("resources", "listChanged"),
            prompts: asked("promptsListChanged") && offers("prompts", "listChanged"),
            uris,
        })
    }

    /// As a `SubscriptionFilter`.
    pub fn to_value(&self) -> Value {
        let mut filter = Map::new();
        for (key, on) in [
            ("toolsListChanged", self.tools),
            ("resourcesListChanged", self.resources),
            ("promptsListChanged", self.prompts),
        ] {
            if on {
                filter.insert(key.into(), json!(true));
            }
        }
        if !self.uris.is_empty() {
            filter.insert("resourceSubscriptions".into(), json!(self.uris));
        }
        Value::Object(filter)
    }

    /// Whether notification `method` (about `uri`, for an update) is one
    /// this stream opted in to.
    pub fn wants(&self, method: Method, uri: Option<&str>) -> bool {
        match method {
            Method::ToolsListChanged => self.tools,
            Method::ResourcesListChanged => self.resources,
            Method::PromptsListChanged => self.prompts,
            Method::ResourcesUpdated => uri.is_some_and(|u| self.uris.contains(u)),
            _ => false,
        }
    }
}

/// The notifications only a listen stream carries to a modern host.
pub fn streamed(method: &str) -> bool {
    matches!(
        Method::parse(method),
        Method::ToolsListChanged
            | Method::ResourcesListChanged
            | Method::PromptsListChanged
            | Method::ResourcesUpdated
    )
}

/// Notification `message` tagged for the listen stream `id`.
pub fn tagged(message: &Message, id: &RequestId) -> Message {
    let mut params = message.params().unwrap_or_else(|| json!({}));
    if !params.is_object() {
        params = json!({});
    }
    if !params["_meta"].is_object() {
        params["_meta"] = json!({});
    }
    params["_meta"][SUBSCRIPTION_ID_KEY] = id.to_value();
    let mut tagged = message.clone();
    tagged.set("params", &params);
    tagged
}

/// The acknowledgement that opens listen stream `id`: what of its filter
/// mcpd honours.
pub fn acknowledged(id: &RequestId, filter: &Filter) -> Value {
    json!({
        "jsonrpc": "2.0",
        "method": Method::SubscriptionsAcknowledged.as_str(),
        "params": {
            "notifications": filter.to_value(),
            "_meta": {SUBSCRIPTION_ID_KEY: id.to_value()},
        },
    })
}

/// The listen streams of one modern host session.
#[derive(Debug, Default)]
pub struct Listens {
    streams: Vec<(RequestId, Filter)>,
}

impl Listens {
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// Opens stream `id`.
    pub fn open(&mut self, id: RequestId, filter: Filter) {
        self.streams.push((id, filter));
    }

    /// Whether stream `id` is open.
    pub fn has(&self, id: &RequestId) -> bool {
        self.streams.iter().any(|(s, _)| s == id)
    }

    /// Closes stream `id` (the host cancelled it): the URIs no other
    /// stream of the session listens to.
    pub fn close(&mut self, id: &RequestId) -> Option<Vec<String>> {
        let at = self.streams.iter().position(|(s, _)| s == id)?;
        let (_, filter) = self.streams.remove(at);
        Some(
            filter
                .uris
                .into_iter()
                .filter(|uri| !self.streams.iter().any(|(_, f)| f.uris.contains(uri)))
                .collect(),
        )
    }

    /// Every stream closed: the URIs they listened to.
    pub fn close_all(&mut self) -> Vec<String> {
        let uris: BTreeSet<String> = self.streams.drain(..).flat_map(|(_, f)| f.uris).collect();
        uris.into_iter().collect()
    }

    /// Whether a stream of the session listens to `uri` already.
    pub fn listens_to(&self, uri: &str) -> bool {
        self.streams.iter().any(|(_, f)| f.uris.contains(uri))
    }

    /// What notification `message` becomes for this session: one copy per
    /// stream that opted in to it, tagged with the stream's id.
    pub fn fan_out(&self, message: &Message) -> Vec<Message> {
        let method = message.method_kind().unwrap_or(Method::Other);
        let uri = (method == Method::ResourcesUpdated)
            .then(|| {
                message
                    .params()
                    .and_then(|p| p.get("uri").and_then(Value::as_str).map(str::to_owned))
            })
            .flatten();
        self.streams
            .iter()
            .filter(|(_, f)| f.wants(method, uri.as_deref()))
            .map(|(id, _)| tagged(message, id))
            .collect()
    }
}

/// Whether `uri` is one of URI template `template`'s (RFC 6570): its
/// literal parts, in order, with anything between them where the
/// template has an expression.
pub fn template_matches(template: &str, uri: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        literals.push(&rest[..open]);
        match rest[open..].find('}') {
            Some(close) => rest = &rest[open + close + 1..],
            None => return template == uri,
        }
    }
    literals.push(rest);
    if literals.len() == 1 {
        return template == uri;
    }
    let (first, last) = (literals[0], literals[literals.len() - 1]);
    let Some(mut tail) = uri.strip_prefix(first) else {
        return false;
    };
    if tail.len() < last.len() || !tail.ends_with(last) {
        return false;
    }
    tail = &tail[..tail.len() - last.len()];
    for literal in &literals[1..literals.len() - 1] {
        match tail.find(literal) {
            Some(at) => tail = &tail[at + literal.len()..],
            None => return false,
        }
    }
    true
}

/// How long a modern host has to retry a call answered `input_required`
/// before the server's requests get an error and the call is cancelled.
pub const INPUT_TIMEOUT: Duration = Duration::from_secs(300);
