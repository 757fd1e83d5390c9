//! `mcpctl bridge NAME`: a stdio MCP server that forwards to a server the
//! daemon manages, so any MCP host can use it by launching this command.
//!
//! `tools/list` and `tools/call` go to the daemon over D-Bus; the daemon's
//! `ToolsChanged` becomes `notifications/tools/list_changed`. While the
//! managed server is in backoff, calls return the daemon's error as an
//! `isError` result and the bridge stays up; when the daemon restarts, the
//! bridge reconnects to it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use tokio::sync::Mutex;

use crate::dbus::{Client, Error, ServerProxy};
use crate::unit::Instance;

use super::client::CtlError;
use super::exit;

/// The daemon connection, replaced when the daemon restarts.
struct Link {
    _client: Client,
    server: ServerProxy<'static>,
}

#[derive(Clone)]
struct Bridge {
    name: String,
    instance: Instance,
    link: Arc<Mutex<Option<Link>>>,
    /// The managed server's own `initialize` instructions.
    instructions: String,
}

async fn connect(instance: Instance, name: &str) -> Result<Link, CtlError> {
    let client = Client::connect(instance).await?;
    let server = client.server(name).await?;
    Ok(Link {
        _client: client,
        server,
    })
}

fn error_result(message: String) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(message)]).into()
}

impl Bridge {
    /// The current link's proxy, connecting (again) if needed.
    async fn server(&self) -> Result<ServerProxy<'static>, CtlError> {
        let mut link = self.link.lock().await;
        if link.is_none() {
            *link = Some(connect(self.instance, &self.name).await?);
        }
        link.as_ref()
            .map(|l| l.server.clone())
            .ok_or_else(|| CtlError::failure("not connected"))
    }

    async fn forget(&self) {
        *self.link.lock().await = None;
    }
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new(
            format!("mcpd:{}", self.name),
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(self.instructions.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        for attempt in 0..2 {
            let server = self
                .server()
                .await
                .map_err(|e| ErrorData::internal_error(e.message, None))?;
            match server.list_tools().await {
                Ok(json) => {
                    let tools: Vec<Tool> = serde_json::from_str(&json).map_err(|e| {
                        ErrorData::internal_error(format!("bad tool list from mcpd: {e}"), None)
                    })?;
                    return Ok(ListToolsResult::with_all_items(tools));
                }
                Err(e) if e.is_reply() => {
                    return Err(ErrorData::internal_error(e.message(), None));
                }
                Err(e) if attempt == 1 => {
                    return Err(ErrorData::internal_error(
                        format!("mcpd: {}", e.message()),
                        None,
                    ));
                }
                // The daemon went away: reconnect once.
                Err(_) => self.forget().await,
            }
        }
        Err(ErrorData::internal_error("mcpd is not reachable", None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request
            .arguments
            .as_ref()
            .map(|a| serde_json::Value::Object(a.clone()).to_string())
            .unwrap_or_default();
        for attempt in 0..2 {
            let server = match self.server().await {
                Ok(server) => server,
                Err(e) => return Ok(error_result(format!("mcpd is not reachable: {e}"))),
            };
            match server.call_tool(&request.name, &arguments).await {
                Ok(json) => {
                    let result: CallToolResult = serde_json::from_str(&json).map_err(|e| {
                        ErrorData::internal_error(format!("bad result from mcpd: {e}"), None)
                    })?;
                    return Ok(result.into());
                }
                Err(Error::InvalidArguments(message)) => {
                    return Err(ErrorData::invalid_params(message, None));
                }
                // NotRunning, ToolFailed, AccessDenied: the daemon's words.
                Err(e) if e.is_reply() => return Ok(error_result(e.message())),
                Err(e) if attempt == 1 => {
                    return Ok(error_result(format!(
                        "mcpd is not reachable: {}",
                        e.message()
                    )));
                }
                Err(_) => self.forget().await,
            }
        }
        Ok(error_result("mcpd is not reachable".into()))
    }
}

/// Serves `name` on stdin/stdout until the host closes stdin.
pub async fn run(instance: Instance, name: &str) -> Result<u8, CtlError> {
    // Fail early (exit 4) for a server that does not exist.
    let first = connect(instance, name).await?;
    let instructions = first.server.instructions().await.unwrap_or_default();
    let instructions = if instructions.is_empty() {
        format!("Tools of the MCP server \"{name}\", kept running by mcpd.")
    } else {
        instructions
    };
    let bridge = Bridge {
        name: name.to_owned(),
        instance,
        link: Arc::new(Mutex::new(Some(first))),
        instructions,
    };
    let service = bridge
        .clone()
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| CtlError::failure(format!("MCP handshake with the host failed: {e}")))?;
    let peer = service.peer().clone();
    let forward = tokio::spawn(async move {
        let mut delay = Duration::from_millis(100);
        loop {
            if let Ok(server) = bridge.server().await {
                if let Ok(mut changes) = server.receive_tool_list_changed().await {
                    delay = Duration::from_millis(100);
                    while changes.next().await.is_some() {
                        if peer.notify_tool_list_changed().await.is_err() {
                            return;
                        }
                    }
                }
                // The daemon went away; after reconnecting the list may differ.
                bridge.forget().await;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
            if let Ok(server) = bridge.server().await
                && server.name().await.is_ok()
                && peer.notify_tool_list_changed().await.is_err()
            {
                return;
            }
        }
    });
    let _ = service.waiting().await;
    forward.abort();
    Ok(exit::OK)
}
