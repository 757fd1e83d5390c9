//! The 2026-07-28 wire of the endpoint (DESIGN §15): what a request sent
//! without a session as MCP 2026-07-28 is checked for before a unit sees
//! it, and the HTTP status its answer goes with. Pure: no I/O, no tokio;
//! `endpoint` applies it.
//!
//! A request is *sent as 2026-07-28* when it has no session and is
//! `server/discover`, or its `_meta` names a protocol version, or its
//! `MCP-Protocol-Version` header names one that is not of 2025
//! ([`sent_as_modern`]). Such a request is checked as the spec's
//! transport says, first failure wins ([`refusal`]):
//! 1. a method 2026-07-28 removed (`initialize`, `ping`,
//!    `logging/setLevel`, `resources/subscribe`/`unsubscribe`):
//!    `404` with `-32601`;
//! 2. `_meta` without the version or the capabilities (or not objects and
//!    strings): `400` with `-32602`;
//! 3. `Mcp-Method`, `MCP-Protocol-Version`, `Mcp-Name` (and any of them
//!    sent twice) that disagree with the body: `400` with `-32020`;
//! 4. a version mcpd does not serve: `400` with `-32022`;
//! 5. for `tools/call`, each `Mcp-Param-NAME` header against the argument
//!    the tool's `inputSchema` marks `"x-mcp-header": "NAME"`
//!    ([`param_mismatch`]): present together and equal (after the
//!    `=?base64?…?=` form is decoded, strictly), or absent together; a
//!    value a header may not hold is a mismatch: `400` with `-32020`.
//!
//! An answer to such a request that goes as one JSON body gets the status
//! its error code has in the spec ([`status_of`]): `400` for `-32700`,
//! `-32600`, `-32602`, `-32020`, `-32021`, `-32022`; `404` for `-32601`;
//! else `200`. A 2025 session's answers are always `200`.

use serde_json::{Map, Value};

use crate::mux::era;
use crate::mux::error::ErrorCode;
use crate::mux::message::Message;
use crate::mux::method::Method;

/// The methods MCP 2026-07-28 removed: sent as 2026-07-28, `404` with
/// `-32601`.
pub const REMOVED: [Method; 5] = [
    Method::Initialize,
    Method::Ping,
    Method::LoggingSetLevel,
    Method::ResourcesSubscribe,
    Method::ResourcesUnsubscribe,
];

/// The headers a request of 2026-07-28 routes by, each at most once.
pub const ROUTING: [&str; 3] = ["mcp-protocol-version", "mcp-method", "mcp-name"];

/// The prefix of the headers that mirror a tool's arguments
/// (`x-mcp-header`), lowercase as hyper keeps names.
pub const PARAM_PREFIX: &str = "mcp-param-";

/// The annotation in a tool's `inputSchema` naming an argument's header.
pub const X_MCP_HEADER: &str = "x-mcp-header";

/// The `retry:` field (milliseconds) of the priming event each SSE
/// stream of the endpoint starts with (SEP-1699): how long a client
/// waits before it reconnects with `Last-Event-ID`.
pub const RETRY_MS: u64 = 1000;

/// What a refusal is: the HTTP status and the JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: u16,
    pub code: ErrorCode,
    pub message: String,
    pub data: Option<Value>,
}

impl Refusal {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Refusal {
            status: status_of_code(code.code()),
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The error answer to request `id` (its JSON text), one line.
    pub fn line(&self, id: Option<&str>) -> Vec<u8> {
        let mut error = self.code.error(self.message.as_str());
        if let Some(data) = &self.data {
            error = error.with_data(data.clone());
        }
        error.line(id)
    }
}

/// The header values a check reads: lowercase name, value, in the order
/// sent (a name twice is two entries).
pub type Headers<'a> = [(&'a str, &'a [u8])];

fn header<'a>(headers: &Headers<'a>, name: &str) -> Option<&'a [u8]> {
    headers.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// Whether a request without a session is sent as MCP 2026-07-28 (module
/// docs).
pub fn sent_as_modern(headers: &Headers<'_>, message: &Message) -> bool {
    if message.method_kind() == Some(Method::ServerDiscover) || era::claims(message) {
        return true;
    }
    header(headers, "mcp-protocol-version").is_some_and(|v| {
        let v = String::from_utf8_lossy(v);
        !era::HOST_VERSIONS.contains(&v.trim())
    })
}

/// The refusal of request `message`, sent as 2026-07-28 without a
/// session, before any unit sees it (module docs, steps 1 to 4); `None`:
/// it goes on. Step 5 is [`param_mismatch`]'s (it needs the tool).
pub fn refusal(headers: &Headers<'_>, message: &Message) -> Option<Refusal> {
    let method = message.method()?;
    if REMOVED.contains(&Method::parse(&method)) {
        return Some(Refusal::new(
            ErrorCode::MethodNotFound,
            format!("{method} is not a method of MCP {}", era::MODERN),
        ));
    }
    let id = message.request_id()?;
    let meta = era::meta_of(message);
    let checked = era::check(&id, meta.as_ref());
    let unsupported = match checked {
        Ok(_) => None,
        Err(answer) => {
            let error = &answer["error"];
            let code = error["code"].as_i64().and_then(ErrorCode::from_i64)?;
            let refusal = Refusal {
                status: status_of_code(code.code()),
                code,
                message: error["message"].as_str().unwrap_or_default().to_owned(),
                data: error.get("data").cloned(),
            };
            // A bad envelope is told first; an unsupported version after
            // the headers (a client that disagrees with itself is told so).
            if code != ErrorCode::UnsupportedVersion {
                return Some(refusal);
            }
            Some(refusal)
        }
    };
    if let Some(why) = header_mismatch(headers, message, meta.as_ref()) {
        return Some(Refusal::new(ErrorCode::HeaderMismatch, why));
    }
    unsupported
}

/// The routing headers against the body: what disagrees.
fn header_mismatch(
    headers: &Headers<'_>,
    message: &Message,
    meta: Option<&Map<String, Value>>,
) -> Option<String> {
    for name in ROUTING {
        if headers.iter().filter(|(n, _)| *n == name).count() > 1 {
            return Some(format!("the {name} header is sent more than once"));
        }
    }
    let text = |name: &str| header(headers, name).and_then(|v| std::str::from_utf8(v).ok());
    let version = meta.and_then(|m| m.get(era::VERSION_KEY)?.as_str());
    if version.is_none() || text("mcp-protocol-version").map(str::trim) != version {
        return Some(
            "the MCP-Protocol-Version header does not match the request's protocol version".into(),
        );
    }
    let method = message.method()?;
    if text("mcp-method").map(str::trim) != Some(method.as_ref()) {
        return Some("the Mcp-Method header does not match the request's method".into());
    }
    let key = match Method::parse(&method) {
        Method::ToolsCall | Method::PromptsGet => "name",
        Method::ResourcesRead => "uri",
        _ => return None,
    };
    let params = message.params()?;
    let body = params.get(key)?.as_str()?;
    let named = text("mcp-name").and_then(|v| decode_header_value(v.trim()));
    (named.as_deref() != Some(body))
        .then(|| format!("the Mcp-Name header does not match the request's {key}"))
}

/// A header value as sent: plain, or `=?base64?…?=` (standard alphabet,
/// padded, canonical) for text a header cannot carry; `None` for a
/// malformed one.
pub fn decode_header_value(value: &str) -> Option<String> {
    let Some(payload) = value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    else {
        return Some(value.to_owned());
    };
    let bytes = payload.as_bytes();
    if bytes.len() % 4 != 0 {
        return None;
    }
    let pad = bytes.iter().rev().take_while(|b| **b == b'=').count();
    if pad > 2 {
        return None;
    }
    let mut bits: u32 = 0;
    let mut count = 0;
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for &c in &bytes[..bytes.len() - pad] {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    // Canonical: the bits left over are zero (the encoder writes no other).
    if bits != 0 {
        return None;
    }
    String::from_utf8(out).ok()
}

/// The arguments a tool's `inputSchema` mirrors in headers: each
/// property reached from the root by `properties` alone with an
/// `x-mcp-header` token, its path and type. `None` when an annotation is
/// not valid (not a token, not on a string, integer or boolean, a token
/// twice): a client drops such a tool and sends no headers for it, so
/// nothing is checked.
pub fn mirrored(schema: &Value) -> Option<Vec<(Vec<String>, String, String)>> {
    let mut out = Vec::new();
    let mut stack: Vec<(Vec<String>, &Value)> = vec![(Vec::new(), schema)];
    // A schema is a tree of bounded depth (a JSON value parsed); its
    // `properties` chains are walked without recursion.
    while let Some((path, node)) = stack.pop() {
        let Some(node) = node.as_object() else {
            continue;
        };
        if let Some(token) = node.get(X_MCP_HEADER) {
            let token = token.as_str()?;
            let kind = node.get("type").and_then(Value::as_str)?;
            let token_chars = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if path.is_empty()
                || token.is_empty()
                || !token.chars().all(token_chars)
                || !["string", "integer", "boolean"].contains(&kind)
                || out
                    .iter()
                    .any(|(_, t, _): &(Vec<String>, String, String)| t.eq_ignore_ascii_case(token))
            {
                return None;
            }
            out.push((path.clone(), token.to_owned(), kind.to_owned()));
        }
        if let Some(Value::Object(properties)) = node.get("properties") {
            for (name, sub) in properties {
                let mut sub_path = path.clone();
                sub_path.push(name.clone());
                stack.push((sub_path, sub));
            }
        }
    }
    Some(out)
}

/// A `tools/call`'s `Mcp-Param-*` headers against its `arguments` and
/// the tool's `inputSchema`: what disagrees (module docs, step 5).
pub fn param_mismatch(
    schema: &Value,
    arguments: Option<&Value>,
    headers: &Headers<'_>,
) -> Option<String> {
    let mirrored = mirrored(schema)?;
    for (path, token, kind) in mirrored {
        let name = format!("{PARAM_PREFIX}{}", token.to_ascii_lowercase());
        let shown = format!("Mcp-Param-{token}");
        let mut sent = headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(&name))
            .map(|(_, v)| *v);
        let raw = sent.next();
        if raw.is_some() && sent.next().is_some() {
            return Some(format!("the {shown} header is sent more than once"));
        }
        let argument = path.join(".");
        let mut value = arguments;
        for key in &path {
            value = value.and_then(|v| v.get(key));
        }
        let value = value.filter(|v| !v.is_null());
        let rendered = value.and_then(|v| match v {
            Value::Bool(b) => Some(b.to_string()),
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        });
        let (Some(value), Some(rendered)) = (value, rendered) else {
            if raw.is_some() {
                return Some(format!(
                    "the {shown} header is sent but the request has no argument {argument:?} it could mirror"
                ));
            }
            continue;
        };
        let Some(raw) = raw else {
            return Some(format!(
                "the {shown} header is missing but the request's argument {argument:?} is there"
            ));
        };
        let Some(decoded) = std::str::from_utf8(raw)
            .ok()
            .filter(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .and_then(|v| decode_header_value(v.trim()))
        else {
            return Some(format!(
                "the {shown} header holds characters a header may not (or malformed =?base64?…?=)"
            ));
        };
        if !matches(&kind, value, &rendered, &decoded) {
            return Some(format!(
                "the {shown} header does not match the request's argument {argument:?}"
            ));
        }
    }
    None
}

/// Whether a decoded header value is its argument: an integer compares as
/// a number (`42` is `42.0`), anything else as the text a client writes.
fn matches(kind: &str, value: &Value, rendered: &str, decoded: &str) -> bool {
    if kind == "integer"
        && let Some(n) = value.as_f64().filter(|n| n.fract() == 0.0)
    {
        let (whole, fraction) = decoded.split_once('.').unwrap_or((decoded, ""));
        let digits = whole.strip_prefix('-').unwrap_or(whole);
        if !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && fraction.bytes().all(|b| b == b'0')
        {
            return whole.parse::<f64>().is_ok_and(|w| w == n);
        }
    }
    decoded == rendered
}

/// The HTTP status of a JSON-RPC error code on the 2026-07-28 wire.
pub fn status_of_code(code: i64) -> u16 {
    match ErrorCode::from_i64(code) {
        Some(ErrorCode::MethodNotFound) => 404,
        Some(
            ErrorCode::ParseError
            | ErrorCode::InvalidRequest
            | ErrorCode::InvalidParams
            | ErrorCode::HeaderMismatch
            | ErrorCode::MissingCapability
            | ErrorCode::UnsupportedVersion,
        ) => 400,
        _ => 200,
    }
}

/// The HTTP status of an answer line sent as one JSON body to a request
/// sent as 2026-07-28: its error code's ([`status_of_code`]), `200` for a
/// result.
pub fn status_of(line: &[u8]) -> u16 {
    let Ok(message) = Message::parse(line.strip_suffix(b"\n").unwrap_or(line)) else {
        return 200;
    };
    message
        .raw("error")
        .and_then(|raw| serde_json::from_str::<Value>(raw).ok())
        .and_then(|error| error["code"].as_i64())
        .map_or(200, status_of_code)
}

/// The priming event an SSE stream starts with (SEP-1699): the id a
/// client resumes from (`STREAM-SEQ`, the stream's place before its
/// first event), empty data, and the `retry:` field.
pub fn priming((stream, seq): (u64, u64)) -> Vec<u8> {
    format!("id: {stream}-{seq}\nretry: {RETRY_MS}\ndata: \n\n").into_bytes()
}

/// The stream and place of an SSE event's `id: STREAM-SEQ` line.
pub fn event_id(event: &[u8]) -> Option<(u64, u64)> {
    let rest = event.strip_prefix(b"id: ")?;
    let end = memchr::memchr(b'\n', rest)?;
    let text = std::str::from_utf8(&rest[..end]).ok()?;
    super::session::parse_event_id(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

    fn message(text: &str) -> Message {
        Message::parse(text.as_bytes()).expect("a message")
    }

    /// Header lines as a case sends them.
    type Pairs<'a> = &'a [(&'a str, &'a str)];
    /// A refusal's status and code, or none.
    type Refused = Option<(u16, i64)>;

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> Vec<(&'a str, &'a [u8])> {
        pairs.iter().map(|(n, v)| (*n, v.as_bytes())).collect()
    }

    #[test]
    fn what_is_sent_as_2026_07_28() {
        let modern =
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{{META}}}}}"#);
        let plain = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        let discover = r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}"#;
        let cases: [(&str, Pairs, bool); 6] = [
            (&modern, &[], true),
            (discover, &[], true),
            (plain, &[], false),
            (plain, &[("mcp-protocol-version", "2025-11-25")], false),
            (plain, &[("mcp-protocol-version", "2026-07-28")], true),
            (plain, &[("mcp-protocol-version", "v999.0.0")], true),
        ];
        for (text, pairs, expected) in cases {
            assert_eq!(
                sent_as_modern(&headers(pairs), &message(text)),
                expected,
                "{text} {pairs:?}"
            );
        }
    }

    /// Each refusal of the ladder, in its order: (body, headers, status,
    /// code); `None`: it goes on.
    #[test]
    fn the_ladder_refuses_with_the_status_and_code_of_the_spec() {
        let good = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
        ];
        let call = |params: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{params}}}"#)
        };
        let ok = call(&format!(r#"{{"name":"echo",{META}}}"#));
        let no_meta = call(r#"{"name":"echo"}"#);
        let no_caps = call(
            r#"{"name":"echo","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
        );
        let v999 = call(
            r#"{"name":"echo","_meta":{"io.modelcontextprotocol/protocolVersion":"v999","io.modelcontextprotocol/clientCapabilities":{}}}"#,
        );
        let ping = format!(r#"{{"jsonrpc":"2.0","id":7,"method":"ping","params":{{{META}}}}}"#);
        let v999_headers = [
            ("mcp-protocol-version", "v999"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
        ];
        let twice = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
        ];
        let other_name = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "get-env"),
        ];
        let base64_name = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?ZWNobw==?="),
        ];
        let unpadded_name = [
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?ZWNobw?="),
        ];
        let cases: [(&str, Pairs, Refused); 10] = [
            (&ok, &good, None),
            (&ok, &base64_name, None),
            (&ping, &good, Some((404, -32601))),
            (&no_meta, &good, Some((400, -32602))),
            (&no_caps, &good, Some((400, -32602))),
            (&ok, &twice, Some((400, -32020))),
            (&ok, &other_name, Some((400, -32020))),
            (&ok, &unpadded_name, Some((400, -32020))),
            // The version the headers and the body agree on is not served.
            (&v999, &v999_headers, Some((400, -32022))),
            // They disagree: told first.
            (&v999, &good, Some((400, -32020))),
        ];
        for (body, pairs, expected) in cases {
            let got = refusal(&headers(pairs), &message(body)).map(|r| (r.status, r.code.code()));
            assert_eq!(got, expected, "{body} {pairs:?}");
        }
        for removed in REMOVED.map(Method::as_str) {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{removed}","params":{{{META}}}}}"#);
            let got = refusal(&headers(&[]), &message(&body)).map(|r| (r.status, r.code.code()));
            assert_eq!(got, Some((404, -32601)), "{removed}");
        }
    }

    #[test]
    fn header_values_may_come_in_base64_strictly() {
        let cases = [
            ("echo", Some("echo")),
            ("=?base64?aMOpbGxv?=", Some("héllo")),
            ("=?base64?SGVsbG8=?=", Some("Hello")),
            // Padding missing, characters outside the alphabet, bits left.
            ("=?base64?SGVsbG8?=", None),
            ("=?base64?SGVs!!!bG8=?=", None),
            ("=?base64?a*b?=", None),
            ("=?base64?SGVsbG9=?=", None),
            // Without both ends it is the text itself.
            ("=?base64?SGVsbG8=", Some("=?base64?SGVsbG8=")),
        ];
        for (value, expected) in cases {
            assert_eq!(decode_header_value(value).as_deref(), expected, "{value}");
        }
    }

    #[test]
    fn mcp_param_headers_are_checked_against_the_arguments_they_mirror() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "count": {"type": "integer", "x-mcp-header": "Count"},
            "dry": {"type": "boolean", "x-mcp-header": "Dry"},
            "text": {"type": "string"}
        }});
        let args = json!({"region": "eu-west", "count": 42, "dry": true, "text": "x"});
        let all = [
            ("mcp-param-region", "eu-west"),
            ("mcp-param-count", "42"),
            ("mcp-param-dry", "true"),
        ];
        let cases: [(&Value, Pairs, bool); 8] = [
            (&args, &all, true),
            (
                &args,
                &[
                    ("mcp-param-region", "=?base64?ZXUtd2VzdA==?="),
                    ("mcp-param-count", "42.0"),
                    ("mcp-param-dry", "true"),
                ],
                true,
            ),
            // Missing, different, malformed, sent twice.
            (&args, &all[1..], false),
            (
                &args,
                &[
                    ("mcp-param-region", "us-east"),
                    ("mcp-param-count", "42"),
                    ("mcp-param-dry", "true"),
                ],
                false,
            ),
            (
                &args,
                &[
                    ("mcp-param-region", "=?base64?ZXUtd2VzdA?="),
                    ("mcp-param-count", "42"),
                    ("mcp-param-dry", "true"),
                ],
                false,
            ),
            (
                &args,
                &[
                    ("mcp-param-region", "eu-west"),
                    ("mcp-param-region", "eu-west"),
                    ("mcp-param-count", "42"),
                    ("mcp-param-dry", "true"),
                ],
                false,
            ),
            // A header with no argument to mirror.
            (&json!({}), &all[..1], false),
            (&json!({}), &[], true),
        ];
        for (arguments, pairs, passes) in cases {
            let got = param_mismatch(&schema, Some(arguments), &headers(pairs));
            assert_eq!(got.is_none(), passes, "{arguments} {pairs:?}: {got:?}");
        }
        // An annotation that is not valid: nothing is checked.
        let bad = json!({"properties": {"n": {"type": "number", "x-mcp-header": "N"}}});
        assert_eq!(param_mismatch(&bad, Some(&json!({"n": 1})), &[]), None);
        let not_a_header = &[("mcp-param-region", "\u{e9}")];
        assert!(param_mismatch(&schema, Some(&args), &headers(not_a_header)).is_some());
    }

    #[test]
    fn an_answers_status_is_its_error_codes() {
        let cases = [
            (r#"{"jsonrpc":"2.0","id":1,"result":{}}"#, 200),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"x"}}"#,
                404,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32021,"message":"x"}}"#,
                400,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"x"}}"#,
                400,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"x"}}"#,
                200,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"x"}}"#,
                200,
            ),
        ];
        for (line, status) in cases {
            assert_eq!(status_of(format!("{line}\n").as_bytes()), status, "{line}");
        }
    }

    #[test]
    fn a_priming_event_names_the_place_to_resume_from() {
        let event = priming((3, 0));
        assert_eq!(event, b"id: 3-0\nretry: 1000\ndata: \n\n");
        assert_eq!(event_id(&event), Some((3, 0)));
        assert_eq!(event_id(b"event: message\ndata: {}\n\n"), None);
    }
}
