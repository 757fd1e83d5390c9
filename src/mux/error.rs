//! The JSON-RPC errors mcpd writes itself, each once: [`ErrorCode`] names
//! the code and builds the response, so no code is written as a number
//! anywhere else.

use serde_json::{Value, json};

/// A JSON-RPC error code mcpd answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// -32700: the line is not JSON (or not one JSON-RPC object).
    ParseError,
    /// -32600: not a valid request here (a second `initialize`, a request
    /// before `initialize`, an id in use, too many in flight, a message
    /// over the line limit).
    InvalidRequest,
    /// -32601: no such method, or nobody can answer it (a host without
    /// the capability, a list the server does not offer).
    MethodNotFound,
    /// -32602: invalid params (a filtered tool, a missing `uri`).
    InvalidParams,
    /// -32603: internal error (the host that was asked went away).
    InternalError,
    /// -32000, implementation-defined: the server is not reachable (the
    /// outage error of DESIGN §3).
    ServerDown,
}

impl ErrorCode {
    /// The number on the wire.
    pub const fn code(self) -> i64 {
        match self {
            ErrorCode::ParseError => -32700,
            ErrorCode::InvalidRequest => -32600,
            ErrorCode::MethodNotFound => -32601,
            ErrorCode::InvalidParams => -32602,
            ErrorCode::InternalError => -32603,
            ErrorCode::ServerDown => -32000,
        }
    }

    /// The error response to request `id` (`null` when the request's id
    /// could not be read).
    pub fn response(self, id: &Value, message: impl Into<String>) -> Value {
        json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": self.code(), "message": message.into()},
        })
    }

    /// [`ErrorCode::response`] as a line, for a request whose id is
    /// known only as its JSON text `id` (the bridge's ledger).
    pub fn line(self, id: &str, message: &str) -> String {
        let message = Value::from(message);
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{{\"code\":{},\"message\":{message}}}}}\n",
            self.code()
        )
    }
}

/// MCP: the resource asked for does not exist (servers answer it to
/// `resources/read`; mcpd reads it, never writes it).
pub const RESOURCE_NOT_FOUND: i64 = -32002;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_and_its_line_say_the_same() {
        let value = ErrorCode::ServerDown.response(&json!("a"), "gone \"now\"");
        let line = ErrorCode::ServerDown.line("\"a\"", "gone \"now\"");
        assert_eq!(serde_json::from_str::<Value>(&line).expect("json"), value);
        assert!(line.ends_with('\n'));
        assert_eq!(value["error"]["code"], -32000);
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
}
