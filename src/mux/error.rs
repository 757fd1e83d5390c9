//! The JSON-RPC error codes and the one builder of error responses.
//!
//! [`ErrorCode`] names every code mcpd writes, and every code it reads by
//! meaning in a server's answer: JSON-RPC 2.0's own, the one of JSON-RPC's
//! implementation-defined server-error range that mcpd uses, and MCP's.
//! This file is the only place a code is written as a number:
//! `tests/docs.rs` fails on a `-32xxx` in the code of any other file under
//! `src/`. A code received is read back with [`ErrorCode::from_i64`].
//!
//! [`RpcError`] (code, message, optional `data`) is the one builder of
//! JSON-RPC error responses. It writes the response as a line of JSON text
//! directly ([`RpcError::write_line`], for the paths that write bytes: the
//! bridge's ledger, the HTTP endpoint), or makes it a `Value` or a
//! [`Message`] for the paths that route one; both have the members in the
//! order serde_json writes a `Value`'s (`error`, `id`, `jsonrpc`; within
//! `error`: `code`, `data`, `message`), so an error reads the same,
//! byte for byte, whichever path wrote it.

use std::borrow::Cow;
use std::io::Write;

use serde_json::{Map, Value};

use super::message::{Message, RequestId};

/// A JSON-RPC error code mcpd writes, or reads by meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i64)]
pub enum ErrorCode {
    /// JSON-RPC: the line is not JSON, or not one JSON-RPC object.
    ParseError = -32700,
    /// JSON-RPC: not a valid request here (a second `initialize`, a
    /// request before `initialize`, an id in use, too many in flight, a
    /// message over the line limit, a batch, an unknown HTTP session or
    /// target).
    InvalidRequest = -32600,
    /// JSON-RPC: no such method, or nobody can answer it (a host without
    /// the capability, a list the server does not offer, a method an
    /// aggregate does not route).
    MethodNotFound = -32601,
    /// JSON-RPC: invalid params (a filtered tool, a missing `uri`, a tool
    /// or prompt an aggregate does not know, a modern request's `_meta`).
    InvalidParams = -32602,
    /// JSON-RPC: internal error (the host or unit that was asked went
    /// away, a server's answer over the line limit, too many waiting).
    InternalError = -32603,
    /// JSON-RPC's implementation-defined server-error range, its first
    /// code: mcpd cannot bring the request to a server now. The outage
    /// error of DESIGN §3 (the server is not running, the daemon went
    /// away), and the HTTP endpoint's refusals of the same kind (the unit
    /// ended the session or does not read, a revoked token, too many
    /// sessions or requests in flight).
    ServerDown = -32000,
    /// MCP: the resource asked for does not exist. Servers answer it to
    /// `resources/read`; an aggregate answers it for a URI no unit serves;
    /// D-Bus reads it as invalid arguments.
    ResourceNotFound = -32002,
    /// MCP 2026-07-28: an HTTP request's `Mcp-Method`,
    /// `MCP-Protocol-Version` or `Mcp-Name` header does not match its body.
    HeaderMismatch = -32020,
    /// MCP 2026-07-28: the server needs a client capability the request
    /// did not declare; `data.requiredCapabilities` names it.
    MissingCapability = -32021,
    /// MCP 2026-07-28: a protocol version not served here; `data` says
    /// which was `requested` and which are `supported`.
    UnsupportedVersion = -32022,
}

impl ErrorCode {
    /// Every code, in the order above.
    pub const ALL: [ErrorCode; 10] = [
        ErrorCode::ParseError,
        ErrorCode::InvalidRequest,
        ErrorCode::MethodNotFound,
        ErrorCode::InvalidParams,
        ErrorCode::InternalError,
        ErrorCode::ServerDown,
        ErrorCode::ResourceNotFound,
        ErrorCode::HeaderMismatch,
        ErrorCode::MissingCapability,
        ErrorCode::UnsupportedVersion,
    ];

    /// The number on the wire.
    pub const fn code(self) -> i64 {
        self as i64
    }

    /// The code `code` is, if mcpd names it (a server's answer read).
    pub fn from_i64(code: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.code() == code)
    }

    /// The error with this code and `message` (no `data` yet).
    pub fn error<'a>(self, message: impl Into<Cow<'a, str>>) -> RpcError<'a> {
        RpcError {
            code: self,
            message: message.into(),
            data: None,
        }
    }

    /// The error response to request `id` (`null` when the request's id
    /// could not be read): `self.error(message).to_value(id)`.
    pub fn response(self, id: &Value, message: impl Into<String>) -> Value {
        self.error(message.into()).to_value(id)
    }
}

/// One JSON-RPC error: its code, its message and, if any, its `data`.
/// The only builder of error responses (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError<'a> {
    pub code: ErrorCode,
    pub message: Cow<'a, str>,
    pub data: Option<Value>,
}

impl RpcError<'_> {
    /// It with `data`.
    #[must_use]
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// Appends the response to the request whose id is the JSON text `id`
    /// (as serde_json writes it: a [`RequestId`]'s; `None`: `null`) to
    /// `out`, as one line, newline included. Written as text, no `Value`
    /// made; the same bytes as [`RpcError::to_value`] serialized.
    pub fn write_line(&self, id: Option<&str>, out: &mut Vec<u8>) {
        out.reserve(self.message.len() + 72);
        // Writing to a `Vec` does not fail.
        let _ = write!(out, "{{\"error\":{{\"code\":{}", self.code.code());
        if let Some(data) = &self.data {
            out.extend_from_slice(b",\"data\":");
            // A `Value` always serializes.
            let _ = serde_json::to_writer(&mut *out, data);
        }
        out.extend_from_slice(b",\"message\":");
        // A string always serializes.
        let _ = serde_json::to_writer(&mut *out, self.message.as_ref());
        out.extend_from_slice(b"},\"id\":");
        out.extend_from_slice(id.unwrap_or("null").as_bytes());
        out.extend_from_slice(b",\"jsonrpc\":\"2.0\"}\n");
    }

    /// [`RpcError::write_line`] into a line of its own.
    pub fn line(&self, id: Option<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_line(id, &mut out);
        out
    }

    /// The response to request `id` as a `Value` (`null`: an id that
    /// could not be read).
    pub fn to_value(&self, id: &Value) -> Value {
        let mut error = Map::new();
        error.insert("code".into(), self.code.code().into());
        if let Some(data) = &self.data {
            error.insert("data".into(), data.clone());
        }
        error.insert("message".into(), self.message.as_ref().into());
        let mut response = Map::new();
        response.insert("error".into(), Value::Object(error));
        response.insert("id".into(), id.clone());
        response.insert("jsonrpc".into(), "2.0".into());
        Value::Object(response)
    }

    /// The response to request `id` (`None`: `null`) as a message to
    /// route.
    pub fn to_message(&self, id: Option<&RequestId>) -> Message {
        let id = id.map_or(Value::Null, RequestId::to_value);
        Message::from(self.to_value(&id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_code_reads_back_and_is_named_once() {
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_i64(code.code()), Some(code));
        }
        let mut numbers = ErrorCode::ALL.map(ErrorCode::code).to_vec();
        numbers.sort_unstable();
        numbers.dedup();
        assert_eq!(numbers.len(), ErrorCode::ALL.len());
        assert_eq!(ErrorCode::from_i64(-32001), None);
        let codes = [
            ErrorCode::ParseError,
            ErrorCode::InvalidRequest,
            ErrorCode::MethodNotFound,
            ErrorCode::InvalidParams,
            ErrorCode::InternalError,
        ]
        .map(ErrorCode::code);
        assert_eq!(codes, [-32700, -32600, -32601, -32602, -32603]);
    }

    #[test]
    fn a_line_is_its_value_serialized_byte_for_byte() {
        let data = json!({"supported": ["b", "a"], "requested": "x\u{1}"});
        let errors = [
            ErrorCode::ServerDown.error("gone \"now\"\n"),
            ErrorCode::UnsupportedVersion
                .error(String::from("ünïcode"))
                .with_data(data),
            ErrorCode::ParseError.error(""),
        ];
        let ids = [None, Some("7"), Some("\"a\""), Some("-3")];
        for error in &errors {
            for id in ids {
                let value = error
                    .to_value(&id.map_or(Value::Null, |id| serde_json::from_str(id).expect("id")));
                let mut expected = serde_json::to_vec(&value).expect("json");
                expected.push(b'\n');
                let line = error.line(id);
                assert_eq!(
                    String::from_utf8_lossy(&line),
                    String::from_utf8_lossy(&expected)
                );
                let message = error.to_message(
                    id.map(|id| {
                        RequestId::of(&serde_json::from_str(id).expect("id")).expect("an id")
                    })
                    .as_ref(),
                );
                assert_eq!(message.line(), expected);
            }
        }
    }

    #[test]
    fn the_shorthand_is_the_builder() {
        let value = ErrorCode::ServerDown.response(&json!("a"), "gone");
        assert_eq!(
            value,
            json!({"jsonrpc": "2.0", "id": "a", "error": {"code": -32000, "message": "gone"}})
        );
        assert_eq!(
            ErrorCode::ServerDown.error("gone").line(Some("\"a\"")),
            b"{\"error\":{\"code\":-32000,\"message\":\"gone\"},\"id\":\"a\",\"jsonrpc\":\"2.0\"}\n"
        );
    }
}
