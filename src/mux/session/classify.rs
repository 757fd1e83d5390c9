//! What one line of a host is to its session, and the answers mcpd makes
//! itself (DESIGN §8): the [`Core`](super::Core) asks here first, before
//! it routes, holds or answers.
//!
//! - [`classify`]: what a host's line is to its session — held behind its
//!   `initialize`, refused (garbage, too long, before `initialize`, a
//!   second `initialize`), answered by mcpd (`initialize`, an early
//!   `ping`, `tools/list`), a request that may be answered from a kept
//!   list or go upstream, a cancellation, or routed as it is;
//! - [`initialize_result`]: the answer to a host's `initialize`, from the
//!   server's own result with the version negotiated for that host
//!   ([`negotiate`]) and `tools.listChanged` set (mcpd tells hosts when
//!   the published tools change);
//! - [`replay_notices`]: what a host whose `initialize` was replayed to a
//!   new daemon is told instead of its answer;
//! - [`list_answer`]: a list request answered from the list kept;
//! - [`counts_as_use`]: which requests are a use of the server (its
//!   `idle-stop`);
//! - [`outcome_of`] and [`tool_name`]: how a `tools/call` is accounted.

use serde_json::{Value, json};

use super::super::era::{self, Era};
use super::super::error::ErrorCode;
use super::super::message::{Message, RequestId};
use super::super::method::Method;
use super::super::shape;
use super::super::wire::{Frame, MAX_LINE};

/// The revision mcpd asks servers for (the server may answer with an older
/// one it speaks; mcpd accepts whatever it answers), and answers hosts
/// that ask for one it does not know.
pub const PROTOCOL_VERSION: &str = "2025-11-25";

/// Revisions host sessions may negotiate (kept with the eras' versions).
pub use super::super::era::HOST_VERSIONS;

/// Messages one host may send while its `initialize` waits for the first
/// generation: a host that sends more is detached.
pub const BACKLOG: usize = 64;

/// Where a host's session stands when a line of its arrives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostState {
    /// Its `initialize` was answered, or it speaks MCP 2026-07-28.
    pub initialized: bool,
    /// The era it speaks, once its first request fixed it.
    pub era: Option<Era>,
    /// Its `initialize` waits for the first generation.
    pub waiting: bool,
    /// How many lines it sent meanwhile are held.
    pub held: usize,
}

/// What a host's line is to its session.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Pipelined behind its waiting `initialize`: kept, handled in order
    /// once that is answered.
    Hold,
    /// It sent more than [`BACKLOG`] lines before its `initialize` was
    /// answered: detach it, with this reason.
    Overflow(&'static str),
    /// Answer it with this error response (and nothing else).
    Refuse(Value),
    /// Its `initialize` (`id`), to answer from the server's result.
    Initialize(RequestId),
    /// `server/discover` (`id`), answered by mcpd from the server's
    /// result (MCP 2026-07-28).
    Discover(RequestId),
    /// A request of MCP 2026-07-28 (it claims the era, or the session
    /// speaks it): checked and translated for a 2025 server.
    Modern { id: RequestId, method: String },
    /// A `ping` before `initialize`: answered by mcpd.
    Pong(RequestId),
    /// A notification before `initialize`: dropped.
    Ignore,
    /// `tools/list` (`id`): answered from the published list.
    ToolsList(RequestId),
    /// A request (`id`, `method`): answered from a list mcpd keeps if it is
    /// one, else sent upstream. (An MCP method's name is not copied.)
    Request {
        id: RequestId,
        method: std::borrow::Cow<'static, str>,
    },
    /// `notifications/cancelled` of its request `request` (when it names
    /// one): nobody answers that request now; routed on.
    Cancelled { request: Option<RequestId> },
    /// Anything else (answers to the server's requests, notifications):
    /// routed as it is.
    Route,
}

/// What `frame`, a line of a host in state `state`, is to its session.
pub fn classify(frame: &Frame, state: HostState) -> Step {
    if state.waiting {
        return if state.held < BACKLOG {
            Step::Hold
        } else {
            Step::Overflow("it sent too much before its initialize was answered")
        };
    }
    let message = match frame {
        Frame::Message(message) => message,
        Frame::Garbage(why) => {
            return Step::Refuse(ErrorCode::ParseError.response(&Value::Null, why));
        }
        Frame::TooLong(id) => {
            let id = id.as_ref().map_or(Value::Null, RequestId::to_value);
            return Step::Refuse(ErrorCode::InvalidRequest.response(
                &id,
                format!("a message longer than {MAX_LINE} bytes was dropped"),
            ));
        }
    };
    if let Some(refusal) = invalid(message) {
        return Step::Refuse(refusal);
    }
    let name = message.method();
    let method = name.as_deref().map(|name| (name, Method::parse(name)));
    let id = message.request_id();
    let legacy = state.era == Some(Era::Legacy);
    let modern = state.era == Some(Era::Modern);
    match (method, id) {
        (Some((_, Method::Initialize)), Some(id)) if modern => {
            let params = message.params().unwrap_or(Value::Null);
            let asked = params["protocolVersion"].as_str().unwrap_or_default();
            Step::Refuse(era::unsupported(&id.to_value(), asked, &era::MODERN_VERSIONS))
        }
        (Some((_, Method::Initialize)), Some(id)) if state.initialized => Step::Refuse(
            ErrorCode::InvalidRequest
                .response(&id.to_value(), "the session is already initialized"),
        ),
        (Some((_, Method::Initialize)), Some(id)) => Step::Initialize(id),
        (Some((_, method)), Some(id)) if legacy && (method == Method::ServerDiscover || era::claims(message)) => {
            Step::Refuse(ErrorCode::InvalidRequest.response(
                &id.to_value(),
                format!("this session began with initialize (MCP 2025): a request of MCP {} cannot join it; open a new session without initialize", era::MODERN),
            ))
        }
        (Some((_, Method::ServerDiscover)), Some(id)) => Step::Discover(id),
        (Some((_, Method::Ping)), Some(id)) if !state.initialized || modern => Step::Pong(id),
        (Some((name, _)), Some(id)) if modern || (!legacy && era::claims(message)) => Step::Modern {
            id,
            method: name.to_owned(),
        },
        (Some(_), Some(id)) if !state.initialized => Step::Refuse(
            ErrorCode::InvalidRequest.response(&id.to_value(), format!(
                "send initialize first (MCP 2025), or server/discover or requests with _meta {} (MCP {})",
                era::VERSION_KEY, era::MODERN
            )),
        ),
        (Some(_), None) if !state.initialized => Step::Ignore,
        (Some((_, Method::ToolsList)), Some(id)) => Step::ToolsList(id),
        (Some((name, method)), Some(id)) => Step::Request {
            id,
            method: known_method(name, method),
        },
        (Some((_, Method::Cancelled)), None) => Step::Cancelled {
            request: message
                .params()
                .and_then(|p| p.get("requestId").and_then(RequestId::of)),
        },
        _ => Step::Route,
    }
}

/// `name` (parsed: `method`), borrowed from the method table if it is
/// there (the most usual), else copied.
fn known_method(name: &str, method: Method) -> std::borrow::Cow<'static, str> {
    match method {
        Method::Other => std::borrow::Cow::Owned(name.to_owned()),
        known => std::borrow::Cow::Borrowed(known.as_str()),
    }
}

/// Messages waiting for a host past which it is behind: notifications for
/// it are dropped until it catches up (a quarter of what detaches it).
pub const BEHIND_MESSAGES: usize = 1024;

/// Bytes waiting for a host past which it is behind.
pub const BEHIND_BYTES: usize = 8 << 20;

/// Whether a host with `backlog` (messages, bytes) waiting is behind.
pub fn behind(backlog: (usize, usize)) -> bool {
    backlog.0 >= BEHIND_MESSAGES || backlog.1 >= BEHIND_BYTES
}

/// Whether notification `message` may be dropped for a host that is
/// behind: any but `notifications/cancelled` (the server withdrawing a
/// request it made of the host, which the host must hear of).
pub fn may_drop(message: &Message) -> bool {
    message.method_kind() != Some(Method::Cancelled)
}

/// What a host that was behind is told once it caught up: how many
/// notifications it did not get.
pub fn dropped_notice(dropped: u64) -> Value {
    let what = if dropped == 1 {
        "notification"
    } else {
        "notifications"
    };
    json!({
        "jsonrpc": "2.0",
        "method": Method::LogMessage.as_str(),
        "params": {
            "level": "warning",
            "logger": "mcpd",
            "data": format!("mcpd dropped {dropped} {what} for this session while it was behind"),
        },
    })
}

/// The members of a JSON-RPC 2.0 message: requests and notifications
/// (`jsonrpc`, `id`, `method`, `params`) and responses (`result`, `error`).
pub const MEMBERS: [&str; 6] = ["jsonrpc", "id", "method", "params", "result", "error"];

/// Drops the members of a host's message that JSON-RPC 2.0 does not have
/// (a server may refuse, or silently drop, a message that has them, and
/// the host would wait for ever); returns their keys.
pub fn strip(message: &mut Message) -> Vec<String> {
    if message.only_json_rpc_members() {
        return Vec::new();
    }
    message.retain(|key| MEMBERS.contains(&key))
}

/// Why a host's message is not a valid JSON-RPC 2.0 message, as the
/// error answer to it: `jsonrpc` must be `"2.0"`, and the message of the
/// shape [`shape::check`] asks (an id that can be answered, no JSON-RPC
/// member twice, `params` an object, nesting bounded).
fn invalid(message: &Message) -> Option<Value> {
    if message.raw("jsonrpc") != Some("\"2.0\"") {
        let id = shape::id_ok(message.raw("id").unwrap_or("null"))
            .then(|| message.request_id())
            .flatten()
            .map_or(Value::Null, |id| id.to_value());
        return Some(ErrorCode::InvalidRequest.response(&id, "jsonrpc must be \"2.0\""));
    }
    let flaw = shape::check(message)?;
    let id = if flaw.keeps_id() {
        message.request_id().map_or(Value::Null, |id| id.to_value())
    } else {
        Value::Null
    };
    Some(flaw.code().response(&id, flaw.why()))
}

/// The version a host asking for `asked` gets.
pub fn negotiate(asked: &str) -> &'static str {
    HOST_VERSIONS
        .into_iter()
        .find(|v| *v == asked)
        .unwrap_or(PROTOCOL_VERSION)
}

/// The answer to a host's `initialize` with `params`: the server's own
/// result `init`, with the version negotiated for this host, and
/// `tools.listChanged` (mcpd tells hosts when the published tools
/// change, after an outage too, whether or not the server does).
pub fn initialize_result(init: &Value, params: &Value) -> Value {
    let asked = params["protocolVersion"].as_str().unwrap_or_default();
    let mut result = init.clone();
    result["protocolVersion"] = json!(negotiate(asked));
    if let Some(tools) = result
        .pointer_mut("/capabilities/tools")
        .and_then(Value::as_object_mut)
    {
        tools.insert("listChanged".into(), json!(true));
    }
    result
}

/// What a host whose `initialize` was replayed (mcpd restarted while it
/// was attached) is told instead of its answer: every list it may hold
/// could have changed.
pub fn replay_notices(init: &Value) -> Vec<&'static str> {
    let mut notices = vec![Method::ToolsListChanged.as_str()];
    for (capability, method) in [
        ("resources", Method::ResourcesListChanged),
        ("prompts", Method::PromptsListChanged),
    ] {
        if init["capabilities"][capability]["listChanged"] == json!(true) {
            notices.push(method.as_str());
        }
    }
    notices
}

/// The answer to list request `id` from a kept list: `key` is the
/// result's member (`tools`, `resources`, …), `list` the list's JSON
/// array text, copied as it is.
pub fn list_answer(id: &RequestId, key: &str, list: &str) -> Vec<u8> {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"{key}\":{list}}}}}\n").into_bytes()
}

/// Whether a host's request `method` is a use of the server (and so
/// postpones its `idle-stop`): anything but pings and the session's own
/// settings.
pub fn counts_as_use(method: &str) -> bool {
    uses_server(Method::parse(method))
}

/// [`counts_as_use`], of a method parsed.
pub(super) fn uses_server(method: Method) -> bool {
    !matches!(
        method,
        Method::Ping
            | Method::LoggingSetLevel
            | Method::ResourcesSubscribe
            | Method::ResourcesUnsubscribe
    )
}

/// How a tool call ended, for its accounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// The tool answered with `isError`.
    ErrorResult,
    /// No result: why.
    Failed(String),
    /// The caller went away before the answer (the call was cancelled).
    Abandoned,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Ok => f.write_str("ok"),
            Outcome::ErrorResult => f.write_str("error result"),
            Outcome::Failed(why) => write!(f, "failed: {why}"),
            Outcome::Abandoned => f.write_str("cancelled: the caller left"),
        }
    }
}

/// How an answer to a `tools/call` ends its accounting.
pub fn outcome_of(message: &Message) -> Outcome {
    if let Some(error) = message.get::<Value>("error") {
        return Outcome::Failed(
            error["message"]
                .as_str()
                .unwrap_or("an error without a message")
                .to_owned(),
        );
    }
    // Looked for only if the result may be one: it holds the key
    // followed by `true` (at any depth; without escapes, the only way to
    // spell it), and then found by a scan (nothing parsed), or, where only
    // a parser can tell, read as a Value reads it.
    let is_error = message
        .raw("result")
        .is_some_and(|raw| may_be_true(raw.as_bytes(), b"\"isError\""))
        && match message.inner("result", "isError") {
            Ok(is_error) => is_error == Some("true"),
            Err(_) => message
                .get::<Value>("result")
                .is_some_and(|r| r["isError"] == true),
        };
    if is_error {
        Outcome::ErrorResult
    } else {
        Outcome::Ok
    }
}

/// The name `params` (a `tools/call`'s, checked JSON) gives as its first
/// member, a string without escapes, when nothing after it could name
/// another (its text holds no `"name"` and no `\u` escape): the name
/// without a scan of the arguments (SDKs write the name first). `None`:
/// the scan tells.
fn first_name_alone(params: &str) -> Option<&str> {
    static NAME: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new("\"name\""));
    let ws = |t: &str| t.trim_start_matches([' ', '\t', '\n', '\r']).len();
    let rest = params.strip_prefix('{')?;
    let rest = &rest[rest.len() - ws(rest)..];
    let rest = rest.strip_prefix("\"name\"")?;
    let rest = &rest[rest.len() - ws(rest)..];
    let rest = rest.strip_prefix(':')?;
    let rest = &rest[rest.len() - ws(rest)..];
    let rest = rest.strip_prefix('"')?;
    let end = rest.find(['"', '\\'])?;
    let (name, after) = rest.split_at(end);
    let after = after.as_bytes();
    (after[0] == b'"'
        && !super::super::message::holds(after, b"\"name\"", 3, &NAME)
        && !memchr::memchr_iter(b'\\', after).any(|at| after.get(at + 1) == Some(&b'u')))
    .then_some(name)
}

/// Whether a JSON value's text `raw` may hold member `key` (quoted) set
/// to `true` at any depth: it holds the key followed by a colon and
/// `true` (JSON whitespace around the colon), or a `\u` escape, which
/// could spell the key otherwise. A quoted key can be nothing else: in
/// a string, a quote is escaped.
fn may_be_true(raw: &[u8], key: &[u8]) -> bool {
    let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let skip = |at: usize| at + raw[at..].iter().take_while(|b| ws(b)).count();
    // One search for a byte of the key (its first capital, rare in text)
    // and for backslashes, as `Message::may_hold` does.
    let pivot = key.iter().position(u8::is_ascii_uppercase).unwrap_or(0);
    memchr::memchr2_iter(key[pivot], b'\\', raw).any(|at| {
        if raw[at] == b'\\' {
            return raw.get(at + 1) == Some(&b'u');
        }
        let Some(start) = at.checked_sub(pivot) else {
            return false;
        };
        if !raw[start..].starts_with(key) {
            return false;
        }
        let colon = skip(start + key.len());
        raw.get(colon) == Some(&b':') && raw[skip(colon + 1)..].starts_with(b"true")
    })
}

/// The tool a `tools/call`'s params name (the arguments are skipped, not
/// parsed into values). The filter judges the name the server will read:
/// of a repeated `name`, the last, as a `Value` (and most parsers) reads
/// it.
pub fn tool_name(message: &Message) -> String {
    if let Some(name) = message.raw("params").and_then(first_name_alone) {
        return name.to_owned();
    }
    let name = match message.inner("params", "name") {
        Ok(name) => name.map(
            |raw| match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
                Some(plain) if !plain.contains('\\') => plain.to_owned(),
                _ => serde_json::from_str::<String>(raw).unwrap_or_default(),
            },
        ),
        Err(_) => message
            .params()
            .and_then(|p| p.get("name").and_then(Value::as_str).map(str::to_owned)),
    };
    name.unwrap_or_default()
}

/// Why a call of `tool` of server `server` is refused: the unit's
/// `tools` block filters it out (`why`).
pub fn filtered(server: &str, tool: &str, why: &str) -> String {
    format!("tool {tool} of server {server} is filtered out by its unit's `tools` block: {why}")
}
