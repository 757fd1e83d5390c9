//! What a host's message must look like before anything of it reaches a
//! server: one answer per request, and only MCP's shapes forwarded
//! (issue 55, D6 and D7).
//!
//! [`check`] is asked of every message a host sends, on every path: the
//! host-session core's classify (the bridge, D-Bus `Attach`, HTTP
//! sessions and stateless requests alike) and the HTTP endpoint before it
//! counts a request in flight. A message it refuses is answered by mcpd
//! with [`Flaw::code`] and never forwarded:
//!
//! - an `id` that is neither a string nor an integer that reads back as
//!   the same text (`true`, `{}`, `[]`, `1.5`, `2^200`, `-0`): no answer
//!   could carry it back, so it is answered to `id: null`;
//! - a JSON-RPC member given twice (two `id`s: which one is answered?);
//! - `params` that is not an object (every MCP method's params are one;
//!   `null` is taken as absent);
//! - a value nested deeper than [`MAX_DEPTH`] (serde_json's own limit,
//!   and more than any MCP message needs): a server with a recursive
//!   parser dies of it, and takes every other host's calls with it.
//!
//! Pure: text in, verdict out; one pass over the nested members' bytes
//! (strings skipped by `memchr`).

use super::error::ErrorCode;
use super::message::Message;

/// How deep a host's message may nest, its own object counted: as
/// serde_json's default recursion limit.
pub const MAX_DEPTH: usize = 128;

/// Why a host's message is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// Its `id` is neither a string nor an integer that round-trips.
    Id,
    /// A JSON-RPC member (`id`, `method`, `params`, …) comes twice.
    Repeated,
    /// Its `params` is not an object.
    Params,
    /// It nests deeper than [`MAX_DEPTH`].
    TooDeep,
}

impl Flaw {
    /// The JSON-RPC error code it is answered with.
    pub fn code(self) -> ErrorCode {
        match self {
            Flaw::Params => ErrorCode::InvalidParams,
            Flaw::Id | Flaw::Repeated | Flaw::TooDeep => ErrorCode::InvalidRequest,
        }
    }

    /// Why, for the host.
    pub fn why(self) -> String {
        match self {
            Flaw::Id => "a request id must be a string or an integer (64 bits)".into(),
            Flaw::Repeated => "a JSON-RPC member (id, method, params, …) is given twice".into(),
            Flaw::Params => "params must be an object".into(),
            Flaw::TooDeep => format!("a message may nest at most {MAX_DEPTH} levels deep"),
        }
    }

    /// Whether its answer may carry the message's id (else `null`).
    pub fn keeps_id(self) -> bool {
        matches!(self, Flaw::Params | Flaw::TooDeep)
    }
}

/// The first flaw of `message`, a host's, if it has one.
pub fn check(message: &Message) -> Option<Flaw> {
    if message.repeated() && repeats_a_json_rpc_member(message) {
        return Some(Flaw::Repeated);
    }
    if let Some(raw) = message.raw("id")
        && !id_ok(raw)
    {
        return Some(Flaw::Id);
    }
    if message.has("method")
        && let Some(raw) = message.raw("params")
        && !(raw.starts_with('{') || raw == "null")
    {
        return Some(Flaw::Params);
    }
    let deep = message
        .members()
        .any(|(_, value)| !within(value.as_bytes(), MAX_DEPTH - 1));
    deep.then_some(Flaw::TooDeep)
}

/// Whether one of the JSON-RPC members came twice (the message says a
/// key was repeated; which, is read from its text again: rare).
fn repeats_a_json_rpc_member(message: &Message) -> bool {
    let text = message.source();
    let Some(spans) = super::scan::object(text.as_bytes()) else {
        return true;
    };
    let mut seen = 0u8;
    for span in spans {
        let key = if span.escaped {
            // `"\u0069d"` is `id`.
            match serde_json::from_str::<String>(&text[span.key.0 - 1..span.key.1 + 1]) {
                Ok(key) => std::borrow::Cow::Owned(key),
                Err(_) => return true,
            }
        } else {
            std::borrow::Cow::Borrowed(&text[span.key.0..span.key.1])
        };
        let Some(k) = ["id", "method", "params", "result", "error", "jsonrpc"]
            .iter()
            .position(|known| *known == key)
        else {
            continue;
        };
        if seen & (1 << k) != 0 {
            return true;
        }
        seen |= 1 << k;
    }
    false
}

/// Whether `raw`, an `id`'s JSON text, is one mcpd can answer: `null`, a
/// string, or an integer whose text is what an `i64` or `u64` of it
/// writes (no fraction, exponent, `-0` or leading zero; within 64 bits).
pub fn id_ok(raw: &str) -> bool {
    if raw == "null" || raw.starts_with('"') {
        return true;
    }
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    if raw.starts_with('-') {
        raw.parse::<i64>()
            .is_ok_and(|n| n != 0 && n.to_string() == raw)
    } else {
        raw.parse::<u64>().is_ok_and(|n| n.to_string() == raw)
    }
}

/// Whether the JSON text `value` (valid JSON) nests at most `max` levels
/// (`1` and `"x"` nest 0, `[]` 1, `{"a":[1]}` 2).
pub fn within(value: &[u8], max: usize) -> bool {
    // Scalars (most members) at once.
    if !matches!(value.first(), Some(b'{' | b'[')) {
        return true;
    }
    let mut depth = 0usize;
    let mut at = 0;
    while at < value.len() {
        match value[at] {
            b'"' => {
                // To the closing quote: past each escape's next byte.
                at += 1;
                loop {
                    match memchr::memchr2(b'"', b'\\', &value[at..]) {
                        Some(i) if value[at + i] == b'\\' => at += i + 2,
                        Some(i) => {
                            at += i;
                            break;
                        }
                        None => return true,
                    }
                }
            }
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        at += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flaw(text: &str) -> Option<Flaw> {
        check(&Message::parse(text.as_bytes()).expect("a message"))
    }

    #[test]
    fn ids_that_cannot_be_answered_are_flawed() {
        for ok in [
            "1",
            "0",
            "-1",
            "\"a\"",
            "\"\"",
            "null",
            "18446744073709551615",
            "-9223372036854775808",
        ] {
            assert!(id_ok(ok), "{ok}");
        }
        for bad in [
            "true",
            "false",
            "{}",
            "[]",
            "1.5",
            "1.0",
            "1e3",
            "-0",
            "01",
            "18446744073709551616",
            "-9223372036854775809",
            "1606938044258990275541962092341162602522202993782792835301376",
        ] {
            assert!(!id_ok(bad), "{bad}");
        }
    }

    #[test]
    fn a_table_of_messages_and_their_flaws() {
        let deep = |n: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"x","arguments":{{"a":{}1{}}}}}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        // The message, params, arguments: three levels before the arrays.
        let cases: Vec<(String, Option<Flaw>)> = vec![
            (r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.into(), None),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"x"}}"#.into(),
                None,
            ),
            (r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":null}"#.into(), None),
            (r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.into(), None),
            (r#"{"jsonrpc":"2.0","id":7,"result":[1,2]}"#.into(), None),
            (r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#.into(), Some(Flaw::Id)),
            (r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#.into(), Some(Flaw::Id)),
            (r#"{"jsonrpc":"2.0","id":[],"method":"ping"}"#.into(), Some(Flaw::Id)),
            (
                r#"{"jsonrpc":"2.0","id":1606938044258990275541962092341162602522202993782792835301376,"method":"ping"}"#.into(),
                Some(Flaw::Id),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#.into(),
                Some(Flaw::Repeated),
            ),
            (
                r#"{"jsonrpc":"2.0","\u0069d":1,"id":2,"method":"ping"}"#.into(),
                Some(Flaw::Repeated),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"ping","x":1,"x":2}"#.into(),
                None,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}"#.into(),
                Some(Flaw::Params),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#.into(),
                Some(Flaw::Params),
            ),
            (
                r#"{"jsonrpc":"2.0","method":"notifications/progress","params":3}"#.into(),
                Some(Flaw::Params),
            ),
            (deep(MAX_DEPTH - 3), None),
            (deep(MAX_DEPTH - 2), Some(Flaw::TooDeep)),
            (deep(100_000), Some(Flaw::TooDeep)),
            // Brackets in strings are not nesting.
            (
                format!(
                    r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"a":"{}\"[{{"}}}}"#,
                    "[".repeat(1000)
                ),
                None,
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(flaw(&text), expected, "{text:.200}");
        }
    }

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert!(within(b"1", 0));
        assert!(within(b"[]", 1));
        assert!(!within(b"[]", 0));
        assert!(within(br#"{"a":[1]}"#, 2));
        assert!(!within(br#"{"a":[1]}"#, 1));
        assert!(within(br#"["[[[\"[[[", 1]"#, 1));
        assert!(within(br#"[{}, {}, [], []]"#, 2));
    }
}
