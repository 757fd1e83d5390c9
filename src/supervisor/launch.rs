//! Starting a generation: a child process (stdio) or a session (HTTP), and
//! the rmcp client connected to it.
//!
//! The actor only sees the [`Launcher`] trait, so its tests can launch
//! in-process fakes; [`SystemLauncher`] is the real one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use super::transport::StdioTransport;
use crate::unit::{HttpSpec, StdioSpec, Transport, UnitSpec};

use super::actor::Internal;
use super::logs::LogRing;
use super::machine::{ExitStatus, Gen, Signal};
use super::process::{self, Host};

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A connected MCP client of one generation.
pub type Client = RunningService<RoleClient, GenClient>;

/// A started generation.
pub struct Launched {
    /// The process (group leader) of a stdio generation.
    pub pid: Option<u32>,
    /// Resolves once `initialize` has completed.
    pub connect: BoxFuture<Result<Client, ConnectError>>,
    /// Resolves once the process is reaped; None when there is no process.
    pub exit: Option<BoxFuture<ExitStatus>>,
}

impl std::fmt::Debug for Launched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launched")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Why connecting to a generation failed; the machine treats the two kinds
/// differently (a hang-up gives the process time to exit on its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectError {
    /// The server hung up (EOF, a closed pipe, a closed session).
    Closed(String),
    /// The server answered wrongly, or the request failed.
    Failed(String),
}

impl ConnectError {
    /// What went wrong, for the reason text.
    pub fn message(&self) -> &str {
        match self {
            ConnectError::Closed(m) | ConnectError::Failed(m) => m,
        }
    }

    /// From rmcp's handshake error over HTTP: a failed request says why
    /// (refused, 401, TLS); the transport's own error chain is kept, the
    /// wrapper's type names are not.
    pub fn initialize_http(e: &rmcp::service::ClientInitializeError) -> Self {
        ConnectError::Failed(match e {
            rmcp::service::ClientInitializeError::TransportError { error, .. } => {
                format!("initialize failed: {}", transport_error_text(error))
            }
            other => format!("initialize failed: {other}"),
        })
    }

    /// From rmcp's handshake error over a pipe: failing to write is a hang-up.
    pub fn initialize(e: &rmcp::service::ClientInitializeError) -> Self {
        match e {
            // Reading EOF or writing into a closed pipe: the server hung up.
            rmcp::service::ClientInitializeError::ConnectionClosed(_)
            | rmcp::service::ClientInitializeError::TransportError { .. } => {
                ConnectError::Closed("the server closed the connection during initialize".into())
            }
            other => ConnectError::Failed(format!("initialize failed: {other}")),
        }
    }
}

/// What went wrong in a transport, without rmcp's wrapper type names.
pub fn transport_error_text(error: &rmcp::transport::DynamicTransportError) -> String {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    // rmcp wraps the HTTP client's error without exposing it as a source;
    // unwrap it to reach "connection refused" and the like.
    let text = match error
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        Some(StreamableHttpError::Client(inner)) => chain(inner),
        _ => chain(error.error.as_ref()),
    };
    text.trim_end_matches([':', ' ']).to_owned()
}

/// An error and its causes, `a: b: c`, skipping causes already quoted.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

/// Starts generations and signals their processes.
pub trait Launcher: Send + Sync + 'static {
    /// Starts generation `generation` of `spec`; `client` is the handler its MCP
    /// client must use. An error means nothing was started.
    fn launch(
        &self,
        spec: &UnitSpec,
        generation: Gen,
        client: GenClient,
    ) -> Result<Launched, String>;
    /// Signals the process group led by `pid`.
    fn signal(&self, pid: u32, signal: Signal);
    /// The process `pid` was reaped: clean up what is left of its group.
    fn reaped(&self, pid: u32);
}

/// The rmcp client handler of one generation: forwards
/// `notifications/tools/list_changed` to the actor, tagged with the generation.
#[derive(Debug, Clone)]
pub struct GenClient {
    generation: Gen,
    events: mpsc::UnboundedSender<Internal>,
    /// The unit's `roots`: declared, and answered to `roots/list`.
    roots: Vec<String>,
}

impl GenClient {
    pub(crate) fn new(
        generation: Gen,
        events: mpsc::UnboundedSender<Internal>,
        roots: Vec<String>,
    ) -> Self {
        Self {
            generation,
            events,
            roots,
        }
    }
}

impl ClientHandler for GenClient {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.events.send(Internal::ListChanged {
            generation: self.generation,
        });
    }

    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        if !self.roots.is_empty() {
            #[allow(deprecated)]
            let roots = rmcp::model::RootsCapabilities::default();
            capabilities.roots = Some(roots);
        }
        ClientConfig::new(
            capabilities,
            Implementation::new("mcpd", env!("CARGO_PKG_VERSION")),
        )
    }

    // Roots are deprecated by the newest MCP revision (SEP-2577) but are what
    // servers speaking 2025-06-18 and 2025-11-25 ask for.
    #[allow(deprecated)]
    async fn list_roots(
        &self,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ListRootsResult, rmcp::ErrorData> {
        Ok(rmcp::model::ListRootsResult::new(
            self.roots
                .iter()
                .map(|uri| rmcp::model::Root::new(uri.clone()))
                .collect(),
        ))
    }
}

/// Launches real children and HTTP sessions.
#[derive(Debug, Clone)]
pub struct SystemLauncher {
    name: String,
    host: Host,
    logs: LogRing,
}

impl SystemLauncher {
    /// A launcher for unit `name`; child stderr lines go to `logs` and the log.
    pub fn new(name: &str, host: Host, logs: LogRing) -> Self {
        Self {
            name: name.to_owned(),
            host,
            logs,
        }
    }

    fn stdio(
        &self,
        spec: &StdioSpec,
        generation: Gen,
        client: GenClient,
    ) -> Result<Launched, String> {
        let plan = process::plan(spec, &self.host, &|var| std::env::var_os(var))?;
        let mut child = process::spawn(&plan)
            .map_err(|e| format!("cannot start {}: {e}", plan.program.display()))?;
        let pid = child.id();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("child has no stdio pipes".into());
        };
        let transport = StdioTransport::new(stdout, stdin)
            .map_err(|e| format!("cannot read the server's stdout: {e}"))?;
        let name = self.name.clone();
        let logs = self.logs.clone();
        tokio::spawn(async move {
            // Small: most servers write little to stderr, and there is one
            // of these per server.
            let mut reader = tokio::io::BufReader::with_capacity(1024, stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf);
                        let line = line.trim_end_matches(['\n', '\r']);
                        tracing::info!(target: "mcpd::server", mcpd_server = %name, generation = generation, "{line}");
                        logs.push(line);
                    }
                }
            }
        });
        let connect: BoxFuture<Result<Client, ConnectError>> = Box::pin(async move {
            client
                .serve(transport)
                .await
                .map_err(|e| ConnectError::initialize(&e))
        });
        let exit: BoxFuture<ExitStatus> = Box::pin(async move {
            use std::os::unix::process::ExitStatusExt;
            match child.wait().await {
                Ok(status) => match (status.code(), status.signal()) {
                    (Some(code), _) => ExitStatus::Code(code),
                    (None, Some(sig)) => ExitStatus::Signal(sig),
                    (None, None) => ExitStatus::Code(-1),
                },
                // Cannot wait: treat as gone rather than blocking forever.
                Err(_) => ExitStatus::Code(-1),
            }
        });
        Ok(Launched {
            pid,
            connect,
            exit: Some(exit),
        })
    }

    fn http(&self, spec: &HttpSpec, client: GenClient) -> Result<Launched, String> {
        install_crypto_provider();
        let mut headers = std::collections::HashMap::new();
        for (name, value) in spec.headers() {
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("header {name}: invalid name"))?;
            let mut value = http::HeaderValue::from_str(value.expose())
                .map_err(|_| format!("header {name}: invalid value"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(spec.url().as_str())
            .custom_headers(headers);
        let transport = StreamableHttpClientTransport::from_config(config);
        let connect: BoxFuture<Result<Client, ConnectError>> = Box::pin(async move {
            client
                .serve(transport)
                .await
                .map_err(|e| ConnectError::initialize_http(&e))
        });
        Ok(Launched {
            pid: None,
            connect,
            exit: None,
        })
    }
}

/// rustls needs a process-wide crypto provider; we build with ring only.
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

impl Launcher for SystemLauncher {
    fn launch(
        &self,
        spec: &UnitSpec,
        generation: Gen,
        client: GenClient,
    ) -> Result<Launched, String> {
        match spec.transport() {
            Transport::Stdio(stdio) => self.stdio(stdio, generation, client),
            Transport::Http(http) => self.http(http, client),
        }
    }

    fn signal(&self, pid: u32, signal: Signal) {
        process::signal_group(pid, signal);
    }

    fn reaped(&self, pid: u32) {
        // Grandchildren left in the group would outlive their server.
        process::signal_group(pid, Signal::Kill);
    }
}

/// A launcher shared between supervisors.
pub type SharedLauncher = Arc<dyn Launcher>;
