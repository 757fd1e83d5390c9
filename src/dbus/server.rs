//! `org.mcpd1.Server` at `/org/mcpd1/server/<escaped name>`, and its proxy.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

use crate::supervisor::{CallError, ListKind, Status};

use crate::model::Shared;
use crate::mux::error::ErrorCode;
use crate::mux::method::Method;

use super::access::{
    Callers, Error, authorize, caller, invalid_reason, server_path, session_socket,
};

/// A tool as published, `(sss)` on the wire.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, zbus::zvariant::Type,
)]
pub struct ToolRow {
    pub name: String,
    pub description: String,
    /// The input schema as JSON.
    pub input_schema: String,
}

/// How long a `CallTool` may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// One server object.
#[derive(Debug)]
pub struct Server {
    name: String,
    shared: Arc<Shared>,
    /// The bus callers known so far (one cache for every object).
    callers: Arc<Callers>,
}

fn usec(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The tools of a status as `a(sss)`.
pub fn tool_rows(status: &Status) -> Vec<ToolRow> {
    status
        .tools
        .tools()
        .iter()
        .map(|t| ToolRow {
            name: t.name.to_string(),
            description: t.description.as_deref().unwrap_or_default().to_owned(),
            input_schema: serde_json::to_string(&*t.input_schema).unwrap_or_else(|_| "{}".into()),
        })
        .collect()
}

impl Server {
    pub(crate) fn new(name: &str, shared: Arc<Shared>, callers: Arc<Callers>) -> Self {
        Self {
            name: name.to_owned(),
            shared,
            callers,
        }
    }

    /// The status, or None for a unit that never loaded.
    fn status(&self) -> Option<Status> {
        self.shared
            .unit(&self.name)
            .ok()?
            .supervisor
            .map(|s| s.status())
    }

    /// What the server's processes use now: read on the blocking pool
    /// (a `/proc` read per process of its cgroup), off the daemon's one
    /// runtime thread.
    async fn usage(&self) -> Option<crate::supervisor::cgroup::Usage> {
        let supervisor = self.shared.supervisor(&self.name).ok()?;
        tokio::task::spawn_blocking(move || supervisor.usage())
            .await
            .ok()
            .flatten()
    }

    /// A per-host unit's instances, each with what its processes use:
    /// read on the blocking pool, as [`Self::usage`].
    async fn instance_views(&self) -> Vec<crate::supervisor::InstanceView> {
        let Ok(supervisor) = self.shared.supervisor(&self.name) else {
            return Vec::new();
        };
        tokio::task::spawn_blocking(move || supervisor.instances())
            .await
            .unwrap_or_default()
    }

    fn supervisor(&self) -> Result<crate::supervisor::Supervisor, Error> {
        Ok(self.shared.supervisor(&self.name)?)
    }

    /// The unit's login, or why it has none.
    fn login(&self) -> Result<std::sync::Arc<crate::supervisor::oauth::Login>, Error> {
        self.supervisor()?.login().ok_or_else(|| {
            Error::InvalidArguments(format!(
                "server {} has no login: its unit has no `oauth` block",
                self.name
            ))
        })
    }

    fn list(&self, kind: ListKind) -> String {
        self.shared
            .supervisor(&self.name)
            .ok()
            .and_then(|s| s.list(kind))
            .map_or_else(|| "[]".to_owned(), |l| l.to_string())
    }

    /// Who serves a call of this caller: the unit, or for a per-host
    /// unit the caller's own instance (DESIGN §13), which needs the
    /// caller's uid first.
    async fn serving(
        &self,
        conn: &Connection,
        header: &Header<'_>,
    ) -> Result<crate::supervisor::Supervisor, Error> {
        let supervisor = self.supervisor()?;
        if !supervisor.is_per_host() {
            return Ok(supervisor);
        }
        let who = caller(&self.callers, conn, header).await;
        Ok(supervisor.for_caller(who.uid).await)
    }

    /// A request to the running server (or the caller's instance of a
    /// per-host unit); its result as JSON.
    async fn ask(
        &self,
        method: &str,
        params: serde_json::Value,
        conn: &Connection,
        header: &Header<'_>,
    ) -> Result<String, Error> {
        let supervisor = self.serving(conn, header).await?;
        if !supervisor.serves() {
            return Err(Error::NotRunning(supervisor.not_running().to_string()));
        }
        match supervisor.request(method, params, CALL_TIMEOUT).await {
            Ok(result) => Ok(result.to_string()),
            Err(CallError::Rejected { code, message })
                if matches!(
                    ErrorCode::from_i64(code.into()),
                    Some(
                        ErrorCode::InvalidParams
                            | ErrorCode::MethodNotFound
                            | ErrorCode::ResourceNotFound
                    )
                ) =>
            {
                Err(Error::InvalidArguments(message))
            }
            Err(e) => Err(Error::ToolFailed(e.to_string())),
        }
    }
}

/// Runs a login's work (requests to an authorization server, bounded by
/// `oauth`'s timeouts) as a task of its own, which the D-Bus method only
/// awaits: a slow authorization server holds no D-Bus task, and a caller
/// that goes away does not cut a token exchange in half.
async fn off_the_bus<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
) -> Result<T, String> {
    tokio::spawn(work)
        .await
        .unwrap_or_else(|e| Err(format!("the login's task ended: {e}")))
}

/// `arguments_json`: a JSON object, or nothing.
fn arguments_object(
    arguments_json: &str,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, Error> {
    if arguments_json.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<serde_json::Value>(arguments_json) {
        Ok(serde_json::Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(Error::InvalidArguments(
            "arguments must be a JSON object".into(),
        )),
        Err(e) => Err(Error::InvalidArguments(format!(
            "arguments are not valid JSON: {e}"
        ))),
    }
}

#[interface(name = "org.mcpd1.Server")]
impl Server {
    #[zbus(property)]
    fn name(&self) -> String {
        self.name.clone()
    }

    #[zbus(property)]
    fn description(&self) -> String {
        self.shared
            .unit(&self.name)
            .ok()
            .and_then(|u| u.description)
            .unwrap_or_default()
    }

    /// starting, running, retrying, reconnecting, failed, stopping, stopped.
    #[zbus(property)]
    fn state(&self) -> String {
        self.status()
            .map_or("stopped", |s| s.state.as_str())
            .to_owned()
    }

    #[zbus(property)]
    fn reason(&self) -> String {
        match self.shared.unit(&self.name) {
            Ok(unit) => match &unit.supervisor {
                Some(s) => s.status().reason,
                None => invalid_reason(&unit),
            },
            Err(_) => String::new(),
        }
    }

    #[zbus(property)]
    fn generation(&self) -> u64 {
        self.status().map_or(0, |s| s.generation)
    }

    #[zbus(property)]
    fn attempt(&self) -> u32 {
        self.status().map_or(0, |s| s.attempt)
    }

    #[zbus(property)]
    fn max_attempts(&self) -> u32 {
        self.status().map_or(0, |s| s.max_attempts)
    }

    /// CLOCK_REALTIME microseconds of the pending retry; 0 when none.
    #[zbus(property, name = "NextRetryUSec")]
    fn next_retry_usec(&self) -> u64 {
        self.status().and_then(|s| s.next_retry).map_or(0, usec)
    }

    /// CLOCK_REALTIME microseconds of the last state change.
    #[zbus(property)]
    fn state_change_timestamp(&self) -> u64 {
        self.status().map_or(0, |s| usec(s.since))
    }

    #[zbus(property, name = "MainPID")]
    fn main_pid(&self) -> u32 {
        self.status().and_then(|s| s.main_pid).unwrap_or(0)
    }

    #[zbus(property)]
    fn unit_path(&self) -> String {
        self.shared
            .unit(&self.name)
            .map(|u| u.path.display().to_string())
            .unwrap_or_default()
    }

    /// Why the unit's files do not load (file:line:col: message lines).
    #[zbus(property)]
    fn load_error(&self) -> String {
        self.shared
            .unit(&self.name)
            .ok()
            .and_then(|u| u.load_error)
            .unwrap_or_default()
    }

    /// How the server's process last ended ("exited with status 1",
    /// "killed by signal 9 (SIGKILL)"); empty before any exit.
    #[zbus(property)]
    fn last_exit_status(&self) -> String {
        self.status()
            .and_then(|s| s.last_exit)
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    /// The error that ended the last failed generation (kept after it
    /// recovers); empty when none has failed.
    #[zbus(property)]
    fn last_error(&self) -> String {
        self.status().and_then(|s| s.last_error).unwrap_or_default()
    }

    /// Automatic restarts (retries) since the daemon loaded the unit, as
    /// systemd's `NRestarts`; operator restarts do not count.
    #[zbus(property)]
    fn restarts(&self) -> u32 {
        self.status().map_or(0, |s| s.restarts)
    }

    /// Whether the server is probed for liveness (`health.enabled`).
    #[zbus(property)]
    fn health_enabled(&self) -> bool {
        self.status().is_some_and(|s| s.health.enabled)
    }

    /// Probes of the established generation unanswered in a row.
    #[zbus(property)]
    fn probes_missed(&self) -> u32 {
        self.status().map_or(0, |s| s.health.missed)
    }

    /// The round trip of the established generation's newest answered
    /// probe, in µs; 0 before one. Not signalled (it changes with every
    /// probe): read it when needed.
    #[zbus(property(emits_changed_signal = "false"), name = "LastPingUSec")]
    fn last_ping_usec(&self) -> u64 {
        self.status()
            .and_then(|s| s.health.last_ping)
            .map_or(0, |(rtt, _)| {
                u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX).max(1)
            })
    }

    /// When that probe was answered, µs since the epoch; 0 before one. Not
    /// signalled.
    #[zbus(property(emits_changed_signal = "false"))]
    fn last_ping_timestamp(&self) -> u64 {
        self.status()
            .and_then(|s| s.health.last_ping)
            .map_or(0, |(_, at)| usec(at))
    }

    /// How the server's processes are contained: "cgroup DIR" or "process
    /// group"; empty for an HTTP server.
    #[zbus(property(emits_changed_signal = "false"))]
    fn containment(&self) -> String {
        self.shared
            .supervisor(&self.name)
            .map(|s| s.containment())
            .unwrap_or_default()
    }

    /// How the server's last generation was confined ("landlock v7,
    /// network none"); empty when the unit has no `sandbox`.
    #[zbus(property(emits_changed_signal = "false"))]
    fn sandbox(&self) -> String {
        self.shared
            .supervisor(&self.name)
            .map(|s| s.sandbox())
            .unwrap_or_default()
    }

    /// What the server's last start was given, by name and size ("gh (40
    /// B), db (1 file)"), never a value; empty when nothing.
    #[zbus(property(emits_changed_signal = "false"))]
    fn credentials(&self) -> String {
        self.shared
            .supervisor(&self.name)
            .map(|s| s.credentials())
            .unwrap_or_default()
    }

    /// The unit's `start`: "always" or "on-demand".
    #[zbus(property(emits_changed_signal = "false"))]
    fn activation(&self) -> String {
        self.shared
            .supervisor(&self.name)
            .map(|s| s.activation().as_str().to_owned())
            .unwrap_or_default()
    }

    /// An on-demand unit's `idle-stop` in microseconds; 0 for an always
    /// unit.
    #[zbus(property(emits_changed_signal = "false"), name = "IdleStopUSec")]
    fn idle_stop_usec(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .ok()
            .and_then(|s| s.activation().idle_stop())
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    /// Threads of the server's processes now (its cgroup's); `u64::MAX`
    /// when not known (not running, or no cgroup). Not signalled.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn tasks_current(&self) -> u64 {
        self.usage().await.map_or(u64::MAX, |u| u.tasks)
    }

    /// Bytes resident in the server's processes now (the sum of their
    /// RSS); `u64::MAX` when not known. Not signalled.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn memory_current(&self) -> u64 {
        self.usage().await.map_or(u64::MAX, |u| u.memory)
    }

    /// CPU time of everything that ran in the server's cgroup this
    /// generation, in ns; `u64::MAX` when not known. Not signalled.
    #[zbus(property(emits_changed_signal = "false"), name = "CPUUsageNSec")]
    async fn cpu_usage_nsec(&self) -> u64 {
        self.usage()
            .await
            .and_then(|u| u.cpu)
            .map_or(u64::MAX, |d| {
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
            })
    }

    /// Tool calls made (from D-Bus and bridges) since the daemon loaded the
    /// unit. Not signalled: read it when needed.
    #[zbus(property(emits_changed_signal = "false"))]
    fn calls(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .map_or(0, |s| s.totals().calls())
    }

    /// Of [`Calls`](Self::calls), those that produced no result or an
    /// `isError` result.
    #[zbus(property(emits_changed_signal = "false"))]
    fn failed_calls(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .map_or(0, |s| s.totals().failed())
    }

    /// Host sessions detached since the daemon loaded the unit for
    /// misbehaving (not reading their messages, sending too much before
    /// `initialize`, a failed connection). Not signalled.
    #[zbus(property(emits_changed_signal = "false"))]
    fn detached_sessions(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .map_or(0, |s| s.totals().detached())
    }

    /// Notifications not sent to host sessions that were behind (each
    /// such session is told how many once it caught up). Not signalled.
    #[zbus(property(emits_changed_signal = "false"))]
    fn dropped_notifications(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .map_or(0, |s| s.totals().dropped())
    }

    /// Times a host session was read no more for a while because the
    /// server had not read enough of what it sent (back-pressure: the
    /// host's own writes waited). Not signalled.
    #[zbus(property(emits_changed_signal = "false"))]
    fn slowed_sessions(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .map_or(0, |s| s.totals().slowed())
    }

    /// Notifications of host sessions dropped, not sent to a server that
    /// was not reading, past the session's share of what may wait for it.
    /// Not signalled.
    #[zbus(property(emits_changed_signal = "false"))]
    fn dropped_host_notifications(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .map_or(0, |s| s.totals().shed())
    }

    /// Requests of host sessions refused for the same reason. Not
    /// signalled.
    #[zbus(property(emits_changed_signal = "false"))]
    fn refused_host_requests(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .map_or(0, |s| s.totals().refused())
    }

    /// Lines the server wrote to its standard output that were not
    /// JSON-RPC messages. Not signalled.
    #[zbus(property(emits_changed_signal = "false"))]
    fn garbage_lines(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .map_or(0, |s| s.totals().garbage_lines())
    }

    /// The `instructions` of the server's `initialize` answer.
    #[zbus(property)]
    fn instructions(&self) -> String {
        self.status()
            .and_then(|s| s.instructions)
            .unwrap_or_default()
    }

    /// The published tools: name, description, input schema (JSON).
    #[zbus(property)]
    fn tools(&self) -> Vec<ToolRow> {
        self.status().map(|s| tool_rows(&s)).unwrap_or_default()
    }

    async fn start(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), Error> {
        authorize(&self.shared, conn, &header).await?;
        self.supervisor()?.start();
        Ok(())
    }

    async fn stop(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), Error> {
        authorize(&self.shared, conn, &header).await?;
        self.supervisor()?.stop();
        Ok(())
    }

    async fn restart(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), Error> {
        authorize(&self.shared, conn, &header).await?;
        self.supervisor()?.restart();
        Ok(())
    }

    /// Begins a login (DESIGN §17) whose redirect goes to `redirect_uri`
    /// (mcpctl's loopback listener); returns the URL to open. The daemon
    /// keeps the PKCE verifier and `state`; only this caller may complete
    /// it. Access as `Restart`.
    async fn auth_begin(
        &self,
        redirect_uri: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, Error> {
        authorize(&self.shared, conn, &header).await?;
        let redirect = url::Url::parse(redirect_uri)
            .ok()
            .filter(|u| u.scheme() == "http" && crate::unit::spec::is_loopback_host(u));
        if redirect.is_none() {
            return Err(Error::InvalidArguments(format!(
                "the redirect URI {redirect_uri:?} is not http:// on a loopback address"
            )));
        }
        let login = self.login()?;
        let uid = caller(&self.callers, conn, &header).await.uid;
        let supervisor = self.supervisor()?;
        let redirect_uri = redirect_uri.to_owned();
        // Off the D-Bus task: the secret is read on the blocking pool and
        // the authorization server is waited for by a task of its own.
        let begun = off_the_bus(async move {
            let secret = tokio::task::spawn_blocking(move || supervisor.client_secret())
                .await
                .map_err(|e| e.to_string())??;
            login
                .begin(&redirect_uri, uid.unwrap_or(u32::MAX), secret)
                .await
                .map_err(|e| e.to_string())
        });
        begun
            .await
            .map_err(|e| Error::AuthFailed(format!("login to {} failed: {e}", self.name)))
    }

    /// Completes the login this caller began with the redirect its
    /// listener received (the whole URL); the daemon checks it, exchanges
    /// the code and keeps the tokens, and a unit in `needs-login` starts.
    async fn auth_complete(
        &self,
        redirect_url: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), Error> {
        authorize(&self.shared, conn, &header).await?;
        let login = self.login()?;
        let uid = caller(&self.callers, conn, &header).await.uid;
        let redirect_url = redirect_url.to_owned();
        off_the_bus(async move {
            login
                .complete(&redirect_url, uid.unwrap_or(u32::MAX))
                .await
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| Error::AuthFailed(format!("login to {} failed: {e}", self.name)))?;
        self.supervisor()?.logged_in();
        Ok(())
    }

    /// Forgets the unit's login: its tokens are revoked where the
    /// authorization server offers it (RFC 7009, bounded), removed
    /// whatever came of that, and the unit restarts into `needs-login`.
    /// Returns what became of the revocation (empty when not offered).
    async fn auth_logout(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, Error> {
        authorize(&self.shared, conn, &header).await?;
        let login = self.login()?;
        let supervisor = self.supervisor()?;
        let restart = supervisor.clone();
        let note = off_the_bus(async move {
            let secret = tokio::task::spawn_blocking(move || supervisor.client_secret())
                .await
                .map_err(|e| e.to_string())?
                .ok()
                .flatten();
            login
                .logout_revoking(secret)
                .await
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| Error::AuthFailed(format!("logout of {} failed: {e}", self.name)))?;
        restart.restart();
        Ok(note)
    }

    /// The unit's login (DESIGN §17): empty for a unit without `oauth`,
    /// `needs login`, or `OAuth (ISSUER), logged in, scopes …`. Never a
    /// token.
    #[zbus(property)]
    fn auth(&self) -> String {
        self.shared
            .supervisor(&self.name)
            .ok()
            .and_then(|s| s.login())
            .map(|l| l.summary().text())
            .unwrap_or_default()
    }

    /// When the login's access token expires, µs since the epoch; 0 when
    /// unknown or logged out. Signalled with `Auth`'s changes.
    #[zbus(property, name = "AuthExpiresUSec")]
    fn auth_expires_usec(&self) -> u64 {
        self.shared
            .supervisor(&self.name)
            .ok()
            .and_then(|s| s.login())
            .and_then(|l| l.summary().expires)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    /// The port `mcpctl auth login` listens on for the redirect
    /// (`oauth.redirect-port`; 0: any).
    #[zbus(property(emits_changed_signal = "false"))]
    fn auth_redirect_port(&self) -> u16 {
        self.shared
            .supervisor(&self.name)
            .ok()
            .and_then(|s| s.login())
            .map_or(0, |l| l.redirect_port())
    }

    /// The full MCP tool objects, as a JSON array.
    fn list_tools(&self) -> String {
        self.status()
            .map(|s| s.tools.json().to_owned())
            .unwrap_or_else(|| "[]".into())
    }

    /// Calls a tool; `arguments_json` is a JSON object (or empty). Returns
    /// the MCP `CallToolResult` as JSON, `isError` results included.
    async fn call_tool(
        &self,
        name: &str,
        arguments_json: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, Error> {
        authorize(&self.shared, conn, &header).await?;
        let arguments = arguments_object(arguments_json)?;
        let supervisor = self.serving(conn, &header).await?;
        // A caller that disconnects abandons its call: the call is dropped
        // (which cancels it upstream) instead of holding the connection, its
        // fd and its objects until the server answers or CALL_TIMEOUT passes.
        // A peer of the private socket is known from SO_PEERCRED at once:
        // learnt before the call, so a call it abandons a moment later is
        // still accounted to it. A bus caller costs a round trip to the bus,
        // learnt while the call runs.
        let who = if conn.is_bus() {
            futures_util::future::Either::Left(caller(&self.callers, conn, &header))
        } else {
            futures_util::future::Either::Right(std::future::ready(
                caller(&self.callers, conn, &header).await,
            ))
        };
        let call = tokio::select! {
            call = supervisor.call_tool(
                name,
                arguments,
                CALL_TIMEOUT,
                who,
            ) => call,
            () = conn.closed() => {
                tracing::debug!(
                    target: "mcpd::dbus",
                    "CallTool {}.{name}: the caller disconnected; call cancelled",
                    self.name
                );
                return Err(Error::ToolFailed("the caller disconnected".into()));
            }
        };
        match call {
            Ok(result) => {
                serde_json::to_string(&result).map_err(|e| Error::ToolFailed(e.to_string()))
            }
            Err(e @ CallError::NotRunning { .. }) => Err(Error::NotRunning(e.to_string())),
            Err(e @ (CallError::NoSuchTool { .. } | CallError::Filtered { .. })) => {
                Err(Error::InvalidArguments(e.to_string()))
            }
            // invalid params, no such method/tool
            Err(CallError::Rejected { code, message })
                if matches!(
                    ErrorCode::from_i64(code.into()),
                    Some(ErrorCode::InvalidParams | ErrorCode::MethodNotFound)
                ) =>
            {
                Err(Error::InvalidArguments(message))
            }
            Err(e) => Err(Error::ToolFailed(e.to_string())),
        }
    }

    /// The server's resources (MCP `Resource` objects) as a JSON array.
    fn list_resources(&self) -> String {
        self.list(ListKind::Resources)
    }

    /// The server's resource templates as a JSON array.
    fn list_resource_templates(&self) -> String {
        self.list(ListKind::Templates)
    }

    /// The server's prompts as a JSON array.
    fn list_prompts(&self) -> String {
        self.list(ListKind::Prompts)
    }

    /// Reads resource `uri`: the MCP `ReadResourceResult` as JSON.
    async fn read_resource(
        &self,
        uri: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, Error> {
        authorize(&self.shared, conn, &header).await?;
        self.ask(
            Method::ResourcesRead.as_str(),
            serde_json::json!({"uri": uri}),
            conn,
            &header,
        )
        .await
    }

    /// Gets prompt `name` with a JSON object of arguments (or an empty
    /// string): the MCP `GetPromptResult` as JSON.
    async fn get_prompt(
        &self,
        name: &str,
        arguments_json: &str,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, Error> {
        authorize(&self.shared, conn, &header).await?;
        let mut params = serde_json::json!({"name": name});
        if let Some(arguments) = arguments_object(arguments_json)? {
            params["arguments"] = serde_json::Value::Object(arguments);
        }
        self.ask(Method::PromptsGet.as_str(), params, conn, &header)
            .await
    }

    /// A new host session (DESIGN §8): a connected stream socket on which
    /// the caller speaks MCP (newline-delimited JSON-RPC) with mcpd, which
    /// multiplexes it onto the server's one upstream session. Allowed as
    /// `CallTool`; the session's calls are accounted to the caller.
    async fn attach(
        &self,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<zbus::OwnedFd, Error> {
        authorize(&self.shared, conn, &header).await?;
        let supervisor = self.supervisor()?;
        let who = caller(&self.callers, conn, &header).await;
        let (link, theirs) = session_socket()?;
        supervisor.attach(link, who);
        Ok(theirs)
    }

    /// A per-host unit's instances (DESIGN §13): number, state, main PID
    /// (0: none), and the PID and uid of the host it serves (`u32::MAX`:
    /// not known); empty for a shared unit. The instance of one uid's
    /// D-Bus calls (`NAME@uid-UID`) is numbered 0, with host PID 0 and
    /// that uid.
    #[zbus(property)]
    async fn instances(&self) -> Vec<(u32, String, u32, u32, u32)> {
        self.instance_views()
            .await
            .iter()
            .map(instance_row)
            .collect()
    }

    /// `max-instances` of a per-host unit; 0 for a shared one.
    #[zbus(property(emits_changed_signal = "false"))]
    fn max_instances(&self) -> u32 {
        self.shared
            .supervisor(&self.name)
            .ok()
            .and_then(|s| s.max_instances())
            .unwrap_or(0)
    }

    /// Every instance of a per-host unit in full, as a JSON array of
    /// objects (`name`, `n`, `state`, `pid`, `host_pid`, `host_uid`,
    /// `since_usec`, `calls`, `memory`; absent values null; a D-Bus
    /// caller's instance has `n` 0 and no `host_pid`).
    async fn list_instances(&self) -> String {
        let instances = self.instance_views().await;
        let rows: Vec<serde_json::Value> = instances
            .iter()
            .map(|i| {
                serde_json::json!({
                    "name": i.of().name_in(&self.name),
                    "n": i.n,
                    "state": i.state.to_string(),
                    "pid": i.pid,
                    "host_pid": i.host.pid,
                    "host_uid": i.host.uid,
                    // An HTTP session's token name and client address.
                    "host_token": i.host.token.as_deref(),
                    "host_address": i.host.peer.map(|p| p.to_string()),
                    "since_usec": usec(i.since),
                    "calls": i.calls,
                    "memory": i.memory,
                })
            })
            .collect();
        serde_json::Value::Array(rows).to_string()
    }

    /// Host sessions attached now.
    #[zbus(property(emits_changed_signal = "false"))]
    fn sessions(&self) -> u32 {
        self.shared
            .supervisor(&self.name)
            .map_or(0, |s| u32::try_from(s.sessions()).unwrap_or(u32::MAX))
    }

    /// The protocol version mcpd speaks with the server: `2026-07-28` when
    /// it answered `server/discover` as a server of that version, else the
    /// one its `initialize` answer named; empty before the first start.
    #[zbus(property(emits_changed_signal = "false"))]
    fn protocol_version(&self) -> String {
        self.shared
            .supervisor(&self.name)
            .map(|s| s.protocol_version())
            .unwrap_or_default()
    }

    /// The upstreams serving the unit's hosts (DESIGN §12): its own
    /// generation's, then the second process a server of both eras runs
    /// for hosts of the 2025 handshake while it has one; each as (protocol
    /// version, main PID or 0, host sessions attached).
    #[zbus(property(emits_changed_signal = "false"))]
    fn lanes(&self) -> Vec<(String, u32, u32)> {
        self.shared
            .supervisor(&self.name)
            .map(|s| {
                s.lanes()
                    .into_iter()
                    .map(|l| {
                        let hosts = u32::try_from(l.hosts).unwrap_or(u32::MAX);
                        (l.version, l.pid.unwrap_or(0), hosts)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Host sessions attached now per protocol version they speak, newest
    /// version first (sessions that have not sent their first request
    /// yet are not counted).
    #[zbus(property(emits_changed_signal = "false"))]
    fn session_versions(&self) -> Vec<(String, u32)> {
        self.shared
            .supervisor(&self.name)
            .map(|s| {
                s.session_versions()
                    .into_iter()
                    .map(|(v, n)| (v.to_owned(), u32::try_from(n).unwrap_or(u32::MAX)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The groups the unit is in (`group`, DESIGN §14).
    #[zbus(property(emits_changed_signal = "false"))]
    fn groups(&self) -> Vec<String> {
        self.shared
            .unit(&self.name)
            .map(|u| u.groups)
            .unwrap_or_default()
    }

    /// The prefix of its tools and prompts in an aggregate: its `alias`,
    /// else its name.
    #[zbus(property(emits_changed_signal = "false"))]
    fn prefix(&self) -> String {
        self.shared
            .unit(&self.name)
            .ok()
            .and_then(|u| u.alias)
            .unwrap_or_else(|| self.name.clone())
    }

    /// The last `n` lines the server wrote to stderr.
    fn recent_logs(&self, n: u32) -> Vec<String> {
        self.shared
            .unit(&self.name)
            .ok()
            .and_then(|u| u.supervisor)
            .map(|s| s.logs().tail(n as usize))
            .unwrap_or_default()
    }

    /// A published list changed: `which` is `tools`, `resources` (the
    /// resources or their templates) or `prompts`.
    #[zbus(signal, name = "ListChanged")]
    pub async fn list_changed(
        emitter: &SignalEmitter<'_>,
        generation: u64,
        which: &str,
    ) -> zbus::Result<()>;

    /// Emitted exactly when the published tool list changes.
    #[zbus(signal, name = "ToolsChanged")]
    pub async fn tool_list_changed(
        emitter: &SignalEmitter<'_>,
        generation: u64,
        tools: Vec<ToolRow>,
    ) -> zbus::Result<()>;
}

/// Emits PropertiesChanged for what differs between two statuses, and
/// ToolsChanged when the published list changed. A server no longer served
/// on `conn` (removed meanwhile) is not an error; a failed send is.
pub(crate) async fn emit_changes(
    conn: &Connection,
    name: &str,
    old: &Status,
    new: &Status,
) -> zbus::Result<()> {
    let Some(iref) = served(conn, name).await else {
        return Ok(());
    };
    let iface = iref.get().await;
    let em = iref.signal_emitter();
    if old.state != new.state {
        iface.state_changed(em).await?;
    }
    if old.reason != new.reason {
        iface.reason_changed(em).await?;
    }
    if old.generation != new.generation {
        iface.generation_changed(em).await?;
    }
    if old.attempt != new.attempt {
        iface.attempt_changed(em).await?;
    }
    if old.max_attempts != new.max_attempts {
        iface.max_attempts_changed(em).await?;
    }
    if old.next_retry != new.next_retry {
        iface.next_retry_u_sec_changed(em).await?;
    }
    if old.since != new.since {
        iface.state_change_timestamp_changed(em).await?;
    }
    if old.restarts != new.restarts {
        iface.restarts_changed(em).await?;
    }
    if old.health.enabled != new.health.enabled {
        iface.health_enabled_changed(em).await?;
    }
    if old.health.missed != new.health.missed {
        iface.probes_missed_changed(em).await?;
    }
    if old.last_exit != new.last_exit {
        iface.last_exit_status_changed(em).await?;
    }
    if old.last_error != new.last_error {
        iface.last_error_changed(em).await?;
    }
    if old.instructions != new.instructions {
        iface.instructions_changed(em).await?;
    }
    if old.main_pid != new.main_pid {
        iface.main_p_i_d_changed(em).await?;
    }
    if old.tools_serial != new.tools_serial {
        iface.tools_changed(em).await?;
        Server::tool_list_changed(em, new.tools_generation, tool_rows(new)).await?;
        Server::list_changed(em, new.tools_generation, "tools").await?;
    }
    Ok(())
}

/// Server `name`'s object on `conn`, if it is still served there.
async fn served(
    conn: &Connection,
    name: &str,
) -> Option<zbus::object_server::InterfaceRef<Server>> {
    conn.object_server()
        .interface::<_, Server>(server_path(name))
        .await
        .ok()
}

/// Emits `ListChanged(generation, which)` for server `name`.
pub(crate) async fn emit_list_changed(
    conn: &Connection,
    name: &str,
    generation: u64,
    which: &str,
) -> zbus::Result<()> {
    let Some(iref) = served(conn, name).await else {
        return Ok(());
    };
    Server::list_changed(iref.signal_emitter(), generation, which).await
}

/// Emits PropertiesChanged for `Instances`.
/// Emits PropertiesChanged for `Auth` and `AuthExpiresUSec`.
pub(crate) async fn emit_auth_changed(conn: &Connection, name: &str) -> zbus::Result<()> {
    let Some(iref) = served(conn, name).await else {
        return Ok(());
    };
    let iface = iref.get().await;
    iface.auth_changed(iref.signal_emitter()).await?;
    iface
        .auth_expires_u_sec_changed(iref.signal_emitter())
        .await
}

pub(crate) async fn emit_instances_changed(conn: &Connection, name: &str) -> zbus::Result<()> {
    let Some(iref) = served(conn, name).await else {
        return Ok(());
    };
    let iface = iref.get().await;
    iface.instances_changed(iref.signal_emitter()).await
}

/// `Instances`' row of one instance.
fn instance_row(i: &crate::supervisor::InstanceView) -> (u32, String, u32, u32, u32) {
    // A D-Bus caller's instance serves no host process.
    let host_pid = if i.n == 0 { Some(0) } else { i.host.pid };
    (
        i.n,
        i.state.to_string(),
        i.pid.unwrap_or(0),
        host_pid.unwrap_or(u32::MAX),
        i.host.uid.unwrap_or(u32::MAX),
    )
}

/// Emits PropertiesChanged for what a reload may change.
pub(crate) async fn emit_unit_properties(conn: &Connection, name: &str) -> zbus::Result<()> {
    let Some(iref) = served(conn, name).await else {
        return Ok(());
    };
    let iface = iref.get().await;
    let em = iref.signal_emitter();
    iface.description_changed(em).await?;
    iface.unit_path_changed(em).await?;
    iface.load_error_changed(em).await
}

/// Client side of `org.mcpd1.Server`; see [`super::client`] for connecting.
pub mod client {
    use crate::dbus::access::Error;

    #[zbus::proxy(interface = "org.mcpd1.Server", default_service = "org.mcpd1")]
    pub trait Server {
        fn start(&self) -> Result<(), Error>;
        fn stop(&self) -> Result<(), Error>;
        fn restart(&self) -> Result<(), Error>;
        fn list_tools(&self) -> Result<String, Error>;
        fn list_resources(&self) -> Result<String, Error>;
        fn list_resource_templates(&self) -> Result<String, Error>;
        fn list_prompts(&self) -> Result<String, Error>;
        fn read_resource(&self, uri: &str) -> Result<String, Error>;
        fn get_prompt(&self, name: &str, arguments_json: &str) -> Result<String, Error>;
        fn call_tool(&self, name: &str, arguments_json: &str) -> Result<String, Error>;
        fn recent_logs(&self, n: u32) -> Result<Vec<String>, Error>;
        fn attach(&self) -> Result<zbus::OwnedFd, Error>;
        fn list_instances(&self) -> Result<String, Error>;
        fn auth_begin(&self, redirect_uri: &str) -> Result<String, Error>;
        fn auth_complete(&self, redirect_url: &str) -> Result<(), Error>;
        fn auth_logout(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn auth(&self) -> Result<String, Error>;
        #[zbus(property, name = "AuthExpiresUSec")]
        fn auth_expires_usec(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn auth_redirect_port(&self) -> Result<u16, Error>;
        #[zbus(property)]
        fn instances(&self) -> Result<Vec<(u32, String, u32, u32, u32)>, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn max_instances(&self) -> Result<u32, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn sessions(&self) -> Result<u32, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn session_versions(&self) -> Result<Vec<(String, u32)>, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn protocol_version(&self) -> Result<String, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn lanes(&self) -> Result<Vec<(String, u32, u32)>, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn groups(&self) -> Result<Vec<String>, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn prefix(&self) -> Result<String, Error>;
        #[zbus(signal, name = "ListChanged")]
        fn list_changed(&self, generation: u64, which: String) -> zbus::Result<()>;
        #[zbus(signal, name = "ToolsChanged")]
        fn tool_list_changed(
            &self,
            generation: u64,
            tools: Vec<super::ToolRow>,
        ) -> zbus::Result<()>;
        #[zbus(property)]
        fn name(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn description(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn state(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn reason(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn generation(&self) -> Result<u64, Error>;
        #[zbus(property)]
        fn attempt(&self) -> Result<u32, Error>;
        #[zbus(property)]
        fn max_attempts(&self) -> Result<u32, Error>;
        #[zbus(property, name = "NextRetryUSec")]
        fn next_retry_usec(&self) -> Result<u64, Error>;
        #[zbus(property)]
        fn state_change_timestamp(&self) -> Result<u64, Error>;
        #[zbus(property, name = "MainPID")]
        fn main_pid(&self) -> Result<u32, Error>;
        #[zbus(property)]
        fn unit_path(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn load_error(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn last_exit_status(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn last_error(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn restarts(&self) -> Result<u32, Error>;
        #[zbus(property)]
        fn health_enabled(&self) -> Result<bool, Error>;
        #[zbus(property)]
        fn probes_missed(&self) -> Result<u32, Error>;
        #[zbus(property(emits_changed_signal = "false"), name = "LastPingUSec")]
        fn last_ping_usec(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn last_ping_timestamp(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn containment(&self) -> Result<String, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn sandbox(&self) -> Result<String, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn credentials(&self) -> Result<String, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn activation(&self) -> Result<String, Error>;
        #[zbus(property(emits_changed_signal = "false"), name = "IdleStopUSec")]
        fn idle_stop_usec(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn tasks_current(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn memory_current(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"), name = "CPUUsageNSec")]
        fn cpu_usage_nsec(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn calls(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn failed_calls(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn detached_sessions(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn dropped_notifications(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn slowed_sessions(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn dropped_host_notifications(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn refused_host_requests(&self) -> Result<u64, Error>;
        #[zbus(property(emits_changed_signal = "false"))]
        fn garbage_lines(&self) -> Result<u64, Error>;
        #[zbus(property)]
        fn instructions(&self) -> Result<String, Error>;
        #[zbus(property)]
        fn tools(&self) -> Result<Vec<super::ToolRow>, Error>;
    }
}

pub use client::ServerProxy;
