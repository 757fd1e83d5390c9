//! mcpd's own MCP client on a generation's [`Wire`]: the handshake that
//! establishes a generation (`initialize`, `notifications/initialized`, the
//! complete tool list), before the wire is handed to the host sessions.
//!
//! The upstream client declares `sampling`, `elicitation` and `roots`, so a
//! server lists the tools that need them; hosts answer those requests
//! through their sessions (DESIGN §8).

use std::sync::Arc;

use serde_json::{Value, json};

use super::launch::ConnectError;
use crate::mux::wire::Wire;

/// The revision mcpd asks servers for (the server may answer with an older
/// one it speaks; mcpd accepts whatever it answers).
pub const PROTOCOL_VERSION: &str = "2025-11-25";

/// Revisions host sessions may negotiate, oldest first; a host asking for
/// another gets [`PROTOCOL_VERSION`], as the specification says.
pub const HOST_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The capabilities mcpd's upstream client declares.
pub fn client_capabilities() -> Value {
    json!({
        "sampling": {},
        "elicitation": {"form": {}, "url": {}},
        "roots": {"listChanged": true},
    })
}

/// A generation that completed its handshake.
#[derive(Debug)]
pub struct Handshake {
    pub wire: Wire,
    /// The server's `initialize` result, as it sent it.
    pub init: Arc<Value>,
    /// Every tool, from every page of `tools/list`.
    pub tools: Vec<Value>,
    /// A `list_changed` arrived during the handshake.
    pub dirty: bool,
}

/// Answers a `roots/list` from the unit's `roots` (or the empty list: no
/// host is attached during the handshake).
pub fn roots_result(roots: &[String]) -> Value {
    json!({"roots": roots.iter().map(|uri| json!({"uri": uri})).collect::<Vec<_>>()})
}

struct Client<'a> {
    wire: &'a mut Wire,
    roots: &'a [String],
    next: u64,
    dirty: bool,
}

impl Client<'_> {
    /// Sends request `method` and waits for its answer, answering what the
    /// server asks meanwhile. `what` names the step for errors.
    async fn request(
        &mut self,
        method: &str,
        params: Value,
        what: &str,
    ) -> Result<Value, ConnectError> {
        self.next += 1;
        let id = self.next;
        let closed =
            || ConnectError::Closed(format!("the server closed the connection during {what}"));
        self.wire
            .tx
            .send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).into())
            .map_err(|_| closed())?;
        loop {
            let message = match self.wire.rx.recv().await {
                None => return Err(closed()),
                Some(Err(why)) => {
                    return Err(ConnectError::Failed(format!("{what} failed: {why}")));
                }
                // The handshake's few messages, parsed whole.
                Some(Ok(message)) => message.to_value(),
            };
            match (
                message.get("method").and_then(Value::as_str),
                message.get("id"),
            ) {
                (None, Some(answer)) if answer.as_u64() == Some(id) => {
                    if let Some(result) = message.get("result") {
                        return Ok(result.clone());
                    }
                    let error = &message["error"];
                    let text = error["message"]
                        .as_str()
                        .unwrap_or("no result and no error");
                    return Err(ConnectError::Failed(match error["code"].as_i64() {
                        Some(code) => format!("{what} failed: {text} ({code})"),
                        None => format!("{what} failed: {text}"),
                    }));
                }
                (Some(asked), Some(their_id)) => {
                    let reply = match asked {
                        "ping" => json!({"jsonrpc": "2.0", "id": their_id, "result": {}}),
                        "roots/list" => {
                            json!({"jsonrpc": "2.0", "id": their_id, "result": roots_result(self.roots)})
                        }
                        _ => json!({"jsonrpc": "2.0", "id": their_id, "error": {
                            "code": -32601,
                            "message": format!("mcpd cannot answer {asked} before the server is initialized"),
                        }}),
                    };
                    let _ = self.wire.tx.send(reply.into());
                }
                (Some("notifications/tools/list_changed"), None) => self.dirty = true,
                // Answers to nothing, log messages, progress: nobody waits.
                _ => {}
            }
        }
    }
}

/// Runs the handshake on `wire`.
pub async fn handshake(mut wire: Wire, roots: &[String]) -> Result<Handshake, ConnectError> {
    let mut client = Client {
        wire: &mut wire,
        roots,
        next: 0,
        dirty: false,
    };
    let init = client
        .request(
            "initialize",
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": client_capabilities(),
                "clientInfo": {"name": "mcpd", "version": env!("CARGO_PKG_VERSION")},
            }),
            "initialize",
        )
        .await?;
    if !init.is_object() || !init["protocolVersion"].is_string() {
        return Err(ConnectError::Failed(
            "initialize failed: the answer has no protocolVersion".into(),
        ));
    }
    client
        .wire
        .tx
        .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).into())
        .map_err(|_| {
            ConnectError::Closed("the server closed the connection during initialize".into())
        })?;
    let mut tools = Vec::new();
    if init["capabilities"].get("tools").is_some() {
        let mut cursor: Option<Value> = None;
        loop {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let mut page = client.request("tools/list", params, "tools/list").await?;
            match page.get_mut("tools").map(Value::take) {
                Some(Value::Array(items)) => tools.extend(items),
                _ => {
                    return Err(ConnectError::Failed(
                        "tools/list failed: the answer has no tools array".into(),
                    ));
                }
            }
            match page.get("nextCursor") {
                Some(next) if !next.is_null() => {
                    if cursor.as_ref() == Some(next) {
                        return Err(ConnectError::Failed(
                            "tools/list failed: the server repeated its cursor".into(),
                        ));
                    }
                    cursor = Some(next.clone());
                }
                _ => break,
            }
        }
    }
    let dirty = client.dirty;
    Ok(Handshake {
        wire,
        init: Arc::new(init),
        tools,
        dirty,
    })
}
