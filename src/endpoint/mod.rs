//! The HTTP endpoint (DESIGN §15): the managed servers over MCP's
//! Streamable HTTP (2025-11-25 sessions), served with hyper 1 on the
//! addresses of `mcpd.kdl`'s `http { }` (`unit::settings`).
//!
//! `/mcp/NAME` is unit NAME, `/mcp/@GROUP`, `/mcp/@all` and `/mcp/A+B`
//! aggregates (DESIGN §14). A POSTed `initialize` opens a session
//! ([`session`]: a host session of the unit, attached as the bridge's
//! are) named by `Mcp-Session-Id`; its requests are answered by SSE (or
//! JSON, for a client that accepts only JSON), GET opens the session's
//! server→client stream (with `Last-Event-ID`, resumes a stream:
//! [`session`]), DELETE ends it; an unknown or ended session is
//! `404`. Bad input is refused before it reaches a unit: an `Origin` that
//! is neither loopback nor allowed (`403`), a body over [`MAX_BODY`]
//! (`413`), headers or a body slower than [`read_timeout`] (the
//! connection is closed, `408`), more than `max-sessions` or a token's
//! `max-sessions-per-token` (`503`; a token at its share first gives up
//! its longest-idle session: [`Inner::make_room`]), JSON that does not
//! parse (`400` with a JSON-RPC parse error), a message of a shape the
//! unit would refuse or a server choke on (`400`, `mux::shape`: answered
//! here, never counted in flight).
//!
//! Imports neither `daemon` nor `dbus`: the daemon starts it and hands it
//! each reload's settings ([`Endpoint::apply`]).
//!
//! Tokens: with `auth "token"` the bearer token is looked up by its SHA-256
//! among `tokens.json`'s (`crate::tokens`), else `401`; a connection keeps
//! the `Authorization` header it last bore and its hash (`Seen`), so the same
//! header is not hashed again. A token whose scope does not reach every unit
//! of the path is `403`. Refusals are logged with the remote address, at most
//! `AUDIT_LINES` per `AUDIT_WINDOW`. A session is its token's; the sessions
//! of a token that went or expired are ended (`reload_tokens`, at every
//! reload; `expiry_sweep`, which sleeps until the next expiry).
//!
//! A request of MCP 2026-07-28 without a session is checked against its
//! `Mcp-Method`, `MCP-Protocol-Version` and `Mcp-Name` headers and served by
//! a host session of its own, ended by its answer (not on a per-host unit:
//! an error naming the 2025 versions, so a client in `auto` mode opens a
//! session); an `input_required` answer keeps that session, parked by its
//! `requestState` for the retry with the same token.

mod auth;
mod conn;
pub mod modern;
mod post;
pub mod session;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::model::Shared;
use crate::mux::aggregate::Target;
use crate::mux::error::ErrorCode;
use crate::mux::message::Message;
use crate::mux::method::Method as McpMethod;
use crate::supervisor::{Caller, HostLink};
use crate::unit::settings::HttpSettings;
use auth::Seen;
use conn::{BodyError, Stalled, budgeted, busy, read_body, stalled};
use post::post;
use session::{IdleWatch, Item, Session};

/// The largest request body (as a unit's `max-request-size` default and
/// the lines of host sessions).
pub const MAX_BODY: usize = 16 << 20;
/// Connections served at once; more are closed as they are accepted.
pub const MAX_CONNECTIONS: usize = 1024;
/// The bytes of request bodies being read and of answers being written,
/// over every connection: past it a request is `503` (issue 55, D4).
pub const BUDGET: usize = 256 << 20;
/// The session header.
pub const SESSION_HEADER: &str = "mcp-session-id";

static READ_TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// How long a client may take to send a request's headers, and then its
/// body: 10 s, or `MCPD_HTTP_READ_TIMEOUT` (read by the binary).
pub fn read_timeout() -> Duration {
    READ_TIMEOUT
        .get()
        .copied()
        .unwrap_or(Duration::from_secs(10))
}

/// Sets [`read_timeout`] (once, before the endpoint starts).
pub fn set_read_timeout(timeout: Duration) -> Result<(), String> {
    if timeout.is_zero() || timeout > Duration::from_secs(3600) {
        return Err("must be between 1ms and 1h".into());
    }
    READ_TIMEOUT
        .set(timeout)
        .map_err(|_| "already set".to_owned())
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The endpoint while it serves; dropping it stops listening and ends
/// every session.
#[derive(Debug)]
pub struct Endpoint {
    inner: Arc<Inner>,
    listeners: Vec<(SocketAddr, JoinHandle<()>)>,
    /// Serving the service manager's sockets: `listen` is not used.
    activated: bool,
}

#[derive(Debug)]
struct Inner {
    shared: std::sync::Weak<Shared>,
    /// Each request takes the current settings (an `Arc`: no copy).
    settings: RwLock<Arc<HttpSettings>>,
    sessions: Mutex<HashMap<String, Handle>>,
    connections: Arc<tokio::sync::Semaphore>,
    /// [`BUDGET`], in bytes.
    budget: Arc<tokio::sync::Semaphore>,
    /// The token file (`tokens::path` of the state directory) and its
    /// tokens by hash, as last read.
    tokens_file: std::path::PathBuf,
    tokens: RwLock<HashMap<String, Arc<crate::tokens::Entry>>>,
    /// The token file's modification time when it was last read: a token
    /// not known is looked for in the file only when it changed since.
    tokens_read: Mutex<Option<std::time::SystemTime>>,
    /// One look at the token file at a time for unknown tokens
    /// ([`Inner::minted_since`]).
    tokens_check: tokio::sync::Mutex<()>,
    /// When the file was last looked at for an unknown token.
    tokens_looked: Mutex<Option<std::time::Instant>>,
    /// One reload of the token file at a time ([`Endpoint::reload_tokens`]),
    /// and whether one waits for its turn.
    tokens_reload: tokio::sync::Mutex<()>,
    tokens_queued: std::sync::atomic::AtomicBool,
    /// When each token was last used (`mcpctl token list`).
    usage: Arc<crate::tokens::Usage>,
    /// The addresses served, for the read model's `HttpView`.
    addrs: RwLock<Vec<SocketAddr>>,
    /// Moves when the tokens change: stateless requests in flight check
    /// theirs again.
    epoch: tokio::sync::watch::Sender<u64>,
    /// Stateless requests in flight (counted against `max-sessions`).
    stateless: Arc<std::sync::atomic::AtomicUsize>,
    /// Of those, each token's (counted against its share,
    /// `max-sessions-per-token`); a token with none is not kept.
    stateless_of: Mutex<HashMap<String, usize>>,
    /// Stateless requests answered `input_required`, by `requestState`:
    /// their sessions, waiting for the retry, and the token they came with.
    parked: Mutex<HashMap<String, Parked>>,
    /// Refusals are logged at most [`AUDIT_LINES`] per [`AUDIT_WINDOW`]
    /// (a scanner cannot flood the journal); the rest are counted.
    audit: Mutex<crate::supervisor::logs::Limiter>,
    /// The sessions' idle ends ([`session::idle_sweep`]).
    idle: Arc<IdleWatch>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Its idle sweep ends.
        self.idle.stop();
    }
}

/// The refusals (401, 403) logged per window, and the window.
pub const AUDIT_LINES: u32 = 100;
pub const AUDIT_WINDOW: Duration = Duration::from_secs(10);

/// A parked call's session (its retry goes there) and its token's hash.
type Parked = (mpsc::Sender<session::Once>, Option<String>);

/// A session as the HTTP side reaches it.
#[derive(Debug, Clone)]
struct Handle {
    /// The path's name (`NAME`, `@GROUP`): a session is used only there.
    target: String,
    session: Arc<Session>,
    /// The hash of the token it was opened with (`auth "token"`): every
    /// request of the session must bear it.
    token: Option<String>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        for (_, accept) in &self.listeners {
            accept.abort();
        }
        let sessions = self
            .inner
            .sessions
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        for handle in sessions.into_values() {
            handle.session.end("the endpoint stopped");
        }
    }
}

impl Endpoint {
    /// Binds every `listen` address of `settings` and serves them; the
    /// first that cannot be bound fails it, naming the address.
    /// `tokens_file` holds the tokens (`mcpctl token`). With `activated`
    /// sockets (passed by the service manager) those are served instead
    /// of `listen`'s; `auth "none"` on one that is not loopback is refused.
    pub async fn start(
        shared: &Arc<Shared>,
        settings: HttpSettings,
        tokens_file: std::path::PathBuf,
        activated: Vec<std::net::TcpListener>,
    ) -> Result<Self, String> {
        if settings.auth == crate::unit::settings::Auth::None {
            for listener in &activated {
                let addr = listener.local_addr().map_err(|e| e.to_string())?;
                if !addr.ip().is_loopback() {
                    return Err(format!(
                        "auth \"none\" with the passed socket {addr}, which is not loopback: anyone who reaches it would use every server"
                    ));
                }
            }
        }
        let listen = settings.listen.clone();
        let inner = Arc::new(Inner {
            shared: Arc::downgrade(shared),
            settings: RwLock::new(Arc::new(settings)),
            sessions: Mutex::new(HashMap::new()),
            connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
            budget: Arc::new(tokio::sync::Semaphore::new(BUDGET)),
            usage: Arc::new(crate::tokens::Usage::open(&tokens_file)),
            tokens_file,
            tokens: RwLock::new(HashMap::new()),
            tokens_read: Mutex::new(None),
            tokens_check: tokio::sync::Mutex::new(()),
            tokens_looked: Mutex::new(None),
            tokens_reload: tokio::sync::Mutex::new(()),
            tokens_queued: std::sync::atomic::AtomicBool::new(false),
            addrs: RwLock::new(Vec::new()),
            epoch: tokio::sync::watch::Sender::new(0),
            stateless: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            stateless_of: Mutex::new(HashMap::new()),
            parked: Mutex::new(HashMap::new()),
            audit: Mutex::new(crate::supervisor::logs::Limiter::new(Some(
                crate::unit::RateLimit {
                    lines: AUDIT_LINES,
                    interval: AUDIT_WINDOW,
                },
            ))),
            idle: Arc::default(),
        });
        let mut endpoint = Endpoint {
            inner,
            listeners: Vec::new(),
            activated: !activated.is_empty(),
        };
        endpoint.inner.reload_tokens().await;
        tokio::spawn(expiry_sweep(
            Arc::downgrade(&endpoint.inner),
            endpoint.inner.epoch.subscribe(),
        ));
        let weak = Arc::downgrade(&endpoint.inner);
        tokio::spawn(session::idle_sweep(
            Arc::clone(&endpoint.inner.idle),
            move || {
                let inner = weak.upgrade()?;
                let sessions = inner.sessions.lock().ok()?;
                Some(sessions.values().map(|h| Arc::clone(&h.session)).collect())
            },
        ));
        if endpoint.activated {
            for listener in activated {
                let listener = TcpListener::from_std(listener).map_err(|e| e.to_string())?;
                let local = listener.local_addr().map_err(|e| e.to_string())?;
                let accept = tokio::spawn(accept_loop(listener, Arc::clone(&endpoint.inner)));
                endpoint.listeners.push((local, accept));
            }
            tracing::info!(target: "mcpd::http", "socket-activated: serving the sockets the service manager passed (`listen` is not used)");
        } else {
            endpoint.listeners = endpoint.bind(&listen).await?;
        }
        endpoint.log_start();
        Ok(endpoint)
    }

    /// Whether it serves the service manager's sockets.
    pub fn activated(&self) -> bool {
        self.activated
    }

    /// Stops listening (every address closed once this returns) and ends
    /// every session.
    pub async fn stop(mut self) {
        for (_, accept) in std::mem::take(&mut self.listeners) {
            accept.abort();
            let _ = accept.await;
        }
        if let Some(shared) = self.inner.shared.upgrade()
            && let Ok(mut http) = shared.http.lock()
        {
            *http = None;
        }
    }

    /// Reads the token file again (a file that does not read keeps the
    /// tokens read before, with a warning) and ends the sessions whose
    /// token is gone, expired or no longer reaches their path. The file
    /// is read and parsed on the blocking pool, never on the runtime's
    /// thread (a large or slow file delays no request: issue 49); one
    /// read at a time, and at most one more queued behind it (which reads
    /// the file as it is then, so every change is read).
    pub fn reload_tokens(&self) {
        let inner = Arc::clone(&self.inner);
        if inner
            .tokens_queued
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        tokio::spawn(async move {
            let _turn = inner.tokens_reload.lock().await;
            inner
                .tokens_queued
                .store(false, std::sync::atomic::Ordering::Release);
            inner.reload_tokens().await;
        });
    }

    /// The addresses it listens on, as bound (a port 0 resolved).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().map(|(a, _)| *a).collect()
    }

    /// How many sessions are open.
    pub fn sessions(&self) -> usize {
        self.inner.sessions.lock().map_or(0, |s| s.len())
    }

    fn log_start(&self) {
        if let Ok(mut addrs) = self.inner.addrs.write() {
            *addrs = self.local_addrs();
        }
        self.inner.publish();
        let addrs: Vec<String> = self.local_addrs().iter().map(ToString::to_string).collect();
        let auth = self.inner.settings.read().map(|s| s.auth).ok();
        tracing::info!(target: "mcpd::http", "HTTP endpoint listening on {}", addrs.join(" "));
        if auth == Some(crate::unit::settings::Auth::None) {
            tracing::warn!(target: "mcpd::http", "HTTP endpoint without authentication (auth \"none\"): any local user can use every server");
        }
    }

    async fn bind(
        &self,
        listen: &[SocketAddr],
    ) -> Result<Vec<(SocketAddr, JoinHandle<()>)>, String> {
        let mut bound = Vec::new();
        for addr in listen {
            let listener = TcpListener::bind(addr).await.map_err(|e| {
                format!(
                    "cannot listen on {addr}: {}",
                    crate::unit::diag::io_text(&e)
                )
            })?;
            let local = listener.local_addr().unwrap_or(*addr);
            let accept = tokio::spawn(accept_loop(listener, Arc::clone(&self.inner)));
            bound.push((local, accept));
        }
        Ok(bound)
    }

    /// Applies a reload's settings: a changed `listen` rebinds (the old
    /// addresses are kept when a new one cannot be bound), the rest
    /// applies to the next request.
    pub async fn apply(&mut self, settings: HttpSettings) {
        let old = self
            .inner
            .settings
            .read()
            .map(|s| s.listen.clone())
            .unwrap_or_default();
        if old != settings.listen && !self.activated {
            match self.bind(&settings.listen).await {
                Ok(bound) => {
                    for (_, accept) in std::mem::replace(&mut self.listeners, bound) {
                        accept.abort();
                        // Closed once this returns: its task is gone.
                        let _ = accept.await;
                    }
                }
                Err(why) => {
                    tracing::warn!(target: "mcpd::http", "keeping the last good settings: {why}");
                    return;
                }
            }
            if let Ok(mut mine) = self.inner.settings.write() {
                *mine = Arc::new(settings);
            }
            self.log_start();
            return;
        }
        if let Ok(mut mine) = self.inner.settings.write() {
            *mine = Arc::new(settings);
        }
    }
}

async fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff = Duration::from_millis(100);
                accepted
            }
            Err(e) => {
                tracing::warn!(target: "mcpd::http", "cannot accept a connection (retrying in {}): {e}", humantime::format_duration(backoff));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(6400));
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&inner.connections).try_acquire_owned() else {
            inner.audit(|| tracing::warn!(target: "mcpd::http", %peer, "more than {MAX_CONNECTIONS} connections: closed"));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let inner = Arc::clone(&inner);
        let inner_log = Arc::clone(&inner);
        tokio::spawn(async move {
            let _permit = permit;
            let seen = Arc::new(Seen::default());
            let service = hyper::service::service_fn(move |request| {
                let (inner, seen) = (Arc::clone(&inner), Arc::clone(&seen));
                // Boxed per request: hyper keeps room for the service's
                // future (`Box<Option<Future>>`) as long as the connection
                // lives, and this one is large; an idle keep-alive
                // connection then holds a pointer's room instead.
                Box::pin(
                    async move { Ok::<_, Infallible>(handle(&inner, peer, &seen, request).await) },
                )
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(read_timeout())
                .max_buf_size(64 << 10)
                .serve_connection(hyper_util::rt::TokioIo::new(Stalled::new(stream)), service)
                .await;
            if let Err(e) = served {
                if stalled(&e) {
                    inner_log.audit(|| tracing::info!(target: "mcpd::http", %peer, "closed a connection that read nothing of its answer for {}", humantime::format_duration(read_timeout())));
                } else {
                    tracing::debug!(target: "mcpd::http", %peer, "connection ended: {e}");
                }
            }
        });
    }
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed_unsync());
    *response.status_mut() = status;
    // Room for its content type and a session id: hyper keeps a
    // response's header map for the connection's next request, so an idle
    // keep-alive connection holds this one (a map's first insert makes
    // room for six, ~0.6 KiB).
    *response.headers_mut() = hyper::HeaderMap::with_capacity(2);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A refusal: plain text naming why.
fn refuse(status: StatusCode, why: &str) -> Response<Body> {
    full(status, "text/plain; charset=utf-8", format!("{why}\n"))
}

/// A JSON-RPC error (to no request id: `null`) as the body of a response
/// with HTTP status `status`.
fn rpc_error(status: StatusCode, code: ErrorCode, why: &str) -> Response<Body> {
    full(status, "application/json", code.error(why).line(None))
}

/// Whether `origin` (an `Origin` header) may call: loopback, or listed
/// in `allow-origin`. `Some(listed)`: allowed; `listed` says whether CORS
/// headers go with the answer.
fn origin_allowed(origin: &str, settings: &HttpSettings) -> Option<bool> {
    let normal = crate::unit::settings::origin(origin).ok()?;
    if settings.allow_origin.contains(&normal) {
        return Some(true);
    }
    let url = url::Url::parse(&normal).ok()?;
    let loopback = match url.host()? {
        url::Host::Domain(d) => d == "localhost" || d.ends_with(".localhost"),
        url::Host::Ipv4(ip) => ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
    };
    loopback.then_some(false)
}

async fn handle(
    inner: &Arc<Inner>,
    peer: SocketAddr,
    seen: &Seen,
    request: Request<Incoming>,
) -> Response<Body> {
    let settings = match inner.settings.read() {
        Ok(s) => Arc::clone(&s),
        Err(_) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, "settings poisoned"),
    };
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .map(|o| o.to_str().unwrap_or("").to_owned());
    let cors = match &origin {
        None => None,
        Some(o) => match origin_allowed(o, &settings) {
            Some(true) => Some(o.clone()),
            Some(false) => None,
            None => {
                inner.audit(|| tracing::warn!(target: "mcpd::http", %peer, "refused a request from origin {:?} (not loopback, not in allow-origin)", clip(o)));
                let mut response = refuse(StatusCode::FORBIDDEN, "origin not allowed");
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return response;
            }
        },
    };
    // A browser's preflight carries no token: answered once its origin
    // passed, before authorization.
    if *request.method() == Method::OPTIONS {
        let mut response = preflight(&request);
        if let Some(origin) = cors
            && let Ok(value) = HeaderValue::from_str(&origin)
        {
            let headers = response.headers_mut();
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
            headers.insert(header::VARY, HeaderValue::from_static("Origin"));
        }
        return response;
    }
    let token = match settings.auth {
        crate::unit::settings::Auth::None => None,
        crate::unit::settings::Auth::Token => match inner.authorize(&request, seen).await {
            Ok(entry) => Some(entry),
            Err(why) => {
                inner.audit(|| tracing::warn!(target: "mcpd::http", %peer, "refused a request to {}: {why}", clip(request.uri().path())));
                let mut response = refuse(StatusCode::UNAUTHORIZED, &why);
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"mcpd\""),
                );
                // A connection without a valid token holds no slot past
                // its refusal (issue 55, D1).
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return response;
            }
        },
    };
    let mut response = route(inner, &settings, peer, token.as_deref(), request).await;
    if let Some(origin) = cors
        && let Ok(value) = HeaderValue::from_str(&origin)
    {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("Mcp-Session-Id"),
        );
        headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

async fn route(
    inner: &Arc<Inner>,
    settings: &HttpSettings,
    peer: SocketAddr,
    token: Option<&crate::tokens::Entry>,
    request: Request<Incoming>,
) -> Response<Body> {
    let Some(name) = request.uri().path().strip_prefix("/mcp/") else {
        return refuse(
            StatusCode::NOT_FOUND,
            "not found: the endpoint is /mcp/NAME",
        );
    };
    let name = match percent_decode(name) {
        Some(n) if !n.is_empty() && !n.contains('/') => n,
        _ => {
            return refuse(
                StatusCode::NOT_FOUND,
                "not found: the endpoint is /mcp/NAME",
            );
        }
    };
    if let Some(entry) = token
        && *request.method() != Method::OPTIONS
        && !inner.reaches(entry, &name)
    {
        inner.audit(|| tracing::warn!(target: "mcpd::http", %peer, "refused token {} on /mcp/{}: outside its units ({})", entry.name, clip(&name), entry.scope.label()));
        return refuse(
            StatusCode::FORBIDDEN,
            &format!("token {} does not reach {name}", entry.name),
        );
    }
    // Accounted as its token's name and the client's address (DESIGN §15).
    let caller = Caller::http(token.map(|e| e.name.as_str()), peer);
    let token = token.map(|e| e.hash.as_str());
    let session = request
        .headers()
        .get(SESSION_HEADER)
        .map(|v| v.to_str().unwrap_or("").to_owned());
    match *request.method() {
        Method::POST => post(inner, settings, token, &caller, &name, session, request).await,
        Method::GET => {
            let Some(open) = inner.session(&name, session.as_deref(), token) else {
                return missing_session(session.as_deref());
            };
            if !accepts(&request, "text/event-stream") {
                return refuse(
                    StatusCode::NOT_ACCEPTABLE,
                    "GET needs Accept: text/event-stream",
                );
            }
            let resume = match request.headers().get("last-event-id") {
                None => None,
                Some(value) => match value.to_str().ok().and_then(session::parse_event_id) {
                    Some(resume) => Some(resume),
                    None => {
                        return refuse(
                            StatusCode::BAD_REQUEST,
                            "Last-Event-ID is not an event id of this endpoint (STREAM-SEQ)",
                        );
                    }
                },
            };
            // A resumed stream's queue holds what is replayed, and more.
            let (sink, rx) = session::stream();
            let Ok(from) = open.listen(sink, resume) else {
                return missing_session(session.as_deref());
            };
            sse(Some(from), None, rx)
        }
        Method::DELETE => {
            let Some(open) = inner.session(&name, session.as_deref(), token) else {
                return missing_session(session.as_deref());
            };
            open.end("ended by the client (DELETE)");
            full(StatusCode::OK, "text/plain", "")
        }
        _ => {
            let mut response = refuse(StatusCode::METHOD_NOT_ALLOWED, "use POST, GET or DELETE");
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
            response
        }
    }
}

/// The headers a browser may send: MCP's own (the 2026-07-28 routing
/// headers included), and any `Mcp-Param-*` it asks for.
const ALLOW_HEADERS: &str = "Authorization, Content-Type, Accept, Mcp-Session-Id, Mcp-Protocol-Version, Mcp-Method, Mcp-Name, Last-Event-ID";

/// The answer to a CORS preflight (`OPTIONS`): the methods, and the
/// headers of [`ALLOW_HEADERS`] with the `Mcp-Param-*` ones it asked for.
fn preflight(request: &Request<Incoming>) -> Response<Body> {
    let mut response = full(StatusCode::NO_CONTENT, "text/plain", "");
    let mut allowed = ALLOW_HEADERS.to_owned();
    for asked in request
        .headers()
        .get_all(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
    {
        let param = asked
            .get(..modern::PARAM_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(modern::PARAM_PREFIX));
        // Header names only (a token), within hyper's header limits.
        if param && hyper::header::HeaderName::from_bytes(asked.as_bytes()).is_ok() {
            allowed.push_str(", ");
            allowed.push_str(asked);
        }
    }
    let headers = response.headers_mut();
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE"),
    );
    if let Ok(value) = HeaderValue::from_str(&allowed) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, value);
    }
    response
}

/// What a peer sent, as a log line shows it: at most [`CLIP`] bytes,
/// with the size it had (a 60 KiB `Origin` is not logged whole).
fn clip(text: &str) -> std::borrow::Cow<'_, str> {
    crate::supervisor::logs::clip(text, CLIP)
}

/// The most of a peer's text a refusal line shows.
pub const CLIP: usize = 256;

fn missing_session(id: Option<&str>) -> Response<Body> {
    match id {
        None => rpc_error(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            "no Mcp-Session-Id: open a session with initialize",
        ),
        Some(_) => rpc_error(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidRequest,
            "no such session (it ended, or never was): initialize again",
        ),
    }
}

fn accepts(request: &Request<Incoming>, kind: &str) -> bool {
    request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|v| {
            v.split(|b| *b == b';')
                .next()
                .unwrap_or_default()
                .trim_ascii()
        })
        .any(|v| v == kind.as_bytes() || v == b"*/*")
}

/// `%XX` decoding of a path segment (`@` may come as `%40`).
fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// An SSE response of `first` and then the events `rx` brings; with
/// `prime`, a session's stream resumable from there, which starts with a
/// priming event ([`modern::priming`]: its id, empty data, `retry:`).
fn sse(
    prime: Option<session::Resume>,
    first: Option<Bytes>,
    mut rx: session::Stream,
) -> Response<Body> {
    // Each its own chunk, as every event.
    let mut prime = prime.map(|from| Bytes::from(modern::priming(from)));
    let mut first = first;
    let events = futures_util::stream::poll_fn(move |cx| {
        if let Some(event) = prime.take().or_else(|| first.take()) {
            return std::task::Poll::Ready(Some(Ok::<_, Infallible>(Frame::data(event))));
        }
        rx.poll_recv(cx)
            .map(|item| item.map(|item| Ok::<_, Infallible>(Frame::data(item.into_event()))))
    });
    let mut response = Response::new(StreamBody::new(events).boxed_unsync());
    // As `full`'s: its three headers and no more room kept.
    *response.headers_mut() = hyper::HeaderMap::with_capacity(3);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Ends a token's sessions the moment it expires (a request after it is
/// refused by `authorize`): sleeps until the earliest expiry to come,
/// again whenever the tokens change (`epoch`), then ends the sessions
/// whose token is no longer valid. One task for the endpoint, gone with
/// it (`epoch`'s sender is its).
async fn expiry_sweep(inner: std::sync::Weak<Inner>, mut epoch: tokio::sync::watch::Receiver<u64>) {
    loop {
        let next = match inner.upgrade() {
            Some(inner) => inner.next_expiry(now()),
            None => return,
        };
        let due = async {
            match next {
                Some(at) => {
                    let since = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    tokio::time::sleep(Duration::from_secs(at).saturating_sub(since)).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = due => match inner.upgrade() {
                Some(inner) => inner.end_sessions_without_a_valid_token("its token expired"),
                None => return,
            },
            changed = epoch.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Inner {
    /// Ends the sessions whose token is gone, expired or no longer
    /// reaches their path (saying `why`), and has stateless requests in
    /// flight check theirs again.
    fn end_sessions_without_a_valid_token(&self, why: &str) {
        self.epoch.send_modify(|n| *n += 1);
        let now = now();
        let ending: Vec<(String, Handle)> = match self.sessions.lock() {
            Ok(sessions) => sessions
                .iter()
                .filter(|(_, h)| match &h.token {
                    None => false,
                    Some(hash) => !self
                        .token(hash)
                        .is_some_and(|e| !e.expired(now) && self.reaches(&e, &h.target)),
                })
                .map(|(id, h)| (id.clone(), h.clone()))
                .collect(),
            Err(_) => Vec::new(),
        };
        for (id, handle) in ending {
            tracing::info!(target: "mcpd::http", "ending session {id} on {}: {why}", handle.target);
            handle.session.end(why);
        }
    }

    /// The earliest expiry of a token after `now` (seconds since the
    /// epoch).
    fn next_expiry(&self, now: u64) -> Option<u64> {
        let tokens = self.tokens.read().ok()?;
        tokens
            .values()
            .filter_map(|e| e.expires)
            .filter(|at| *at > now)
            .min()
    }
    /// Logs one refusal with `log`, within the audit's rate limit.
    fn audit(&self, log: impl FnOnce()) {
        let Ok(mut limiter) = self.audit.lock() else {
            return;
        };
        let admit = limiter.admit(std::time::Instant::now());
        drop(limiter);
        if let Some(n) = admit.suppressed {
            tracing::warn!(target: "mcpd::http", "{n} more refusals were not logged (at most {AUDIT_LINES} per {})", humantime::format_duration(AUDIT_WINDOW));
        }
        if admit.log {
            log();
        }
    }

    /// Counts a stateless request of token `hash` in (`true`) or out.
    fn note_stateless(&self, hash: Option<&str>, starts: bool) {
        let (Some(hash), Ok(mut of)) = (hash, self.stateless_of.lock()) else {
            return;
        };
        if starts {
            *of.entry(hash.to_owned()).or_default() += 1;
        } else if let Some(n) = of.get_mut(hash) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                of.remove(hash);
            }
        }
    }

    /// The sessions and stateless requests in flight of token `hash`.
    fn held_by(&self, hash: &str) -> usize {
        let sessions = self.sessions.lock().map_or(0, |s| {
            s.values()
                .filter(|h| h.token.as_deref() == Some(hash))
                .count()
        });
        sessions
            + self
                .stateless_of
                .lock()
                .map_or(0, |of| of.get(hash).copied().unwrap_or(0))
    }

    /// Sessions and stateless requests under way.
    fn count(&self) -> usize {
        self.sessions.lock().map_or(0, |s| s.len())
            + self.stateless.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tells the read model the addresses and the sessions now.
    fn publish(&self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let listen = self
            .addrs
            .read()
            .map(|a| a.iter().map(ToString::to_string).collect())
            .unwrap_or_default();
        let sessions = self.sessions.lock().map_or(0, |s| s.len());
        if let Ok(mut http) = shared.http.lock() {
            *http = Some(crate::model::HttpView { listen, sessions });
        }
    }

    /// Forgets session `id` (ended or ending).
    fn forget(&self, id: &str) {
        let removed = self
            .sessions
            .lock()
            .map(|mut s| s.remove(id).is_some())
            .unwrap_or(false);
        if removed {
            self.publish();
        }
    }

    /// Whether `entry` reaches every unit of path `name`.
    fn reaches(&self, entry: &crate::tokens::Entry, name: &str) -> bool {
        if entry.scope == crate::tokens::Scope::All {
            return true;
        }
        let (Some(shared), Ok(target)) = (self.shared.upgrade(), Target::parse(name)) else {
            return false;
        };
        let Ok(members) = shared.members(&target) else {
            return false;
        };
        !members.is_empty()
            && members.iter().all(|(unit, _, _)| {
                let groups = shared.unit(unit).map(|v| v.groups).unwrap_or_default();
                entry.scope.reaches(unit, &groups)
            })
    }

    /// The session `id` on the path's `name`, opened with `token`.
    fn session(&self, name: &str, id: Option<&str>, token: Option<&str>) -> Option<Arc<Session>> {
        let sessions = self.sessions.lock().ok()?;
        let handle = sessions.get(id?)?;
        (handle.target == name && handle.token.as_deref() == token)
            .then(|| Arc::clone(&handle.session))
    }

    /// Holds the token whose hash is `hash` to its share of the sessions
    /// (`max-sessions-per-token`): when it holds its share, or every
    /// session is taken, its own longest-idle session ends to make room;
    /// with none of its own idle it is refused (`503`). One token cannot
    /// take the sessions of every other.
    fn make_room(&self, hash: &str, settings: &HttpSettings) -> Result<(), Box<Response<Body>>> {
        let share = settings.per_token();
        let mine: Vec<Arc<Session>> = match self.sessions.lock() {
            Ok(sessions) => sessions
                .values()
                .filter(|h| h.token.as_deref() == Some(hash))
                .map(|h| Arc::clone(&h.session))
                .collect(),
            Err(_) => Vec::new(),
        };
        let stateless = self
            .stateless_of
            .lock()
            .map_or(0, |of| of.get(hash).copied().unwrap_or(0));
        let held = mine.len() + stateless >= share;
        if !held && self.count() < settings.max_sessions {
            return Ok(());
        }
        let oldest = mine
            .iter()
            .filter_map(|s| Some((s.idle_since()?, s)))
            .min_by_key(|(since, _)| *since);
        let name = self
            .token(hash)
            .map_or_else(|| "?".to_owned(), |e| e.name.clone());
        match oldest {
            Some((_, session)) => {
                session.end(&format!(
                    "token {name} opened another session past {} (its longest idle ends first)",
                    if held {
                        format!("its {share} (max-sessions-per-token)")
                    } else {
                        format!("{} (max-sessions)", settings.max_sessions)
                    }
                ));
                Ok(())
            }
            None if held => Err(Box::new(rpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ServerDown,
                &format!(
                    "token {name} holds {share} HTTP sessions, none idle (max-sessions-per-token)"
                ),
            ))),
            None => Ok(()),
        }
    }

    /// Opens a session on `name`: attaches a host session of the unit (or
    /// aggregate) and starts its task; its id, or the refusal.
    fn open(
        self: &Arc<Self>,
        name: &str,
        settings: &HttpSettings,
        token: Option<&str>,
        caller: &Caller,
    ) -> Result<(String, Arc<Session>), Box<Response<Body>>> {
        let shared = self
            .shared
            .upgrade()
            .ok_or_else(|| refuse(StatusCode::SERVICE_UNAVAILABLE, "the daemon is stopping"))?;
        let max = settings.max_sessions;
        if let Some(hash) = token {
            self.make_room(hash, settings)?;
        }
        if self.count() >= max {
            return Err(Box::new(rpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::ServerDown,
                &format!("more than {max} HTTP sessions (max-sessions)"),
            )));
        }
        let id = new_id();
        let inner = Arc::downgrade(self);
        let ended = id.clone();
        let label = name.to_owned();
        let (session, link) = Session::open(
            name,
            &id,
            &self.idle,
            Box::new(move |why| {
                if why.contains("(DELETE)") {
                    tracing::debug!(target: "mcpd::http", "session {ended} on {label} ended: {why}");
                } else {
                    tracing::info!(target: "mcpd::http", "session {ended} on {label} ended: {why}");
                }
                if let Some(inner) = inner.upgrade() {
                    inner.forget(&ended);
                }
            }),
        );
        attach(&shared, name, link, caller)?;
        let handle = Handle {
            target: name.to_owned(),
            session: Arc::clone(&session),
            token: token.map(str::to_owned),
        };
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.insert(id.clone(), handle);
        }
        self.publish();
        Ok((id, session))
    }
}

/// Attaches a host session of unit (or aggregate) `name` on `theirs`
/// (the unit's session is another task of this daemon, so no message
/// crosses a system call).
fn attach(
    shared: &Arc<Shared>,
    name: &str,
    theirs: HostLink,
    caller: &Caller,
) -> Result<(), Box<Response<Body>>> {
    let unknown = |e: &str| {
        Box::new(rpc_error(
            StatusCode::NOT_FOUND,
            ErrorCode::InvalidRequest,
            e,
        ))
    };
    let target = Target::parse(name).map_err(|e| unknown(&e))?;
    let caller = caller.clone();
    if target.is_aggregate() {
        crate::aggregate::attach(shared, target, theirs, caller).map_err(|e| unknown(&e))?;
    } else {
        shared
            .supervisor(name)
            .map_err(|e| unknown(&e.to_string()))?
            .attach(theirs, caller);
    }
    Ok(())
}

/// The version a request of MCP 2026-07-28 says it speaks
/// (`params._meta["io.modelcontextprotocol/protocolVersion"]`).
fn modern_version(message: &Message) -> Option<String> {
    let params = message.params()?;
    params
        .get("_meta")?
        .get("io.modelcontextprotocol/protocolVersion")?
        .as_str()
        .map(str::to_owned)
}

/// What a request without a session is checked by on the 2026-07-28
/// wire ([`modern`]): its routing headers and `Mcp-Param-*` headers, each
/// value as sent (a name sent twice: twice). Bounded by hyper's header
/// limits; values share the request's bytes.
fn modern_headers(headers: &hyper::HeaderMap) -> Vec<(hyper::header::HeaderName, HeaderValue)> {
    headers
        .iter()
        .filter(|(name, _)| {
            modern::ROUTING.contains(&name.as_str())
                || name.as_str().starts_with(modern::PARAM_PREFIX)
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

fn header_view(headers: &[(hyper::header::HeaderName, HeaderValue)]) -> Vec<(&str, &[u8])> {
    headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()))
        .collect()
}

/// A `tools/call`'s `Mcp-Param-*` headers against its arguments, by the
/// called tool's `inputSchema` as the unit last listed it (a member's, by
/// its prefix, on an aggregate's path); a tool not listed is not checked
/// ([`modern::param_mismatch`]).
fn param_mismatch(
    inner: &Inner,
    name: &str,
    message: &Message,
    headers: &modern::Headers<'_>,
) -> Option<String> {
    if message.method_kind() != Some(McpMethod::ToolsCall) {
        return None;
    }
    let params = message.params()?;
    let tool = params.get("name")?.as_str()?;
    let shared = inner.shared.upgrade()?;
    let target = Target::parse(name).ok()?;
    let (supervisor, tool) = if target.is_aggregate() {
        shared
            .members(&target)
            .ok()?
            .into_iter()
            .find_map(|(_, prefix, supervisor)| {
                let rest = tool
                    .strip_prefix(prefix.as_str())?
                    .strip_prefix(crate::mux::target::SEPARATOR)?;
                Some((supervisor, rest.to_owned()))
            })?
    } else {
        (shared.supervisor(name).ok()?, tool.to_owned())
    };
    let status = supervisor.status();
    // Most lists mirror nothing: not parsed for them.
    if !status.tools.json().contains(modern::X_MCP_HEADER) {
        return None;
    }
    let listed = status.tools.values();
    let schema = listed
        .iter()
        .find(|t| t["name"].as_str() == Some(tool.as_str()))?
        .get("inputSchema")?;
    modern::param_mismatch(schema, params.get("arguments"), headers)
}

/// A session id: 128 bits of the OS's randomness, hex.
fn new_id() -> String {
    let mut bytes = [0u8; 16];
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        // Never reused within a daemon even so: the counter differs.
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        bytes[..8].copy_from_slice(&n.to_le_bytes());
        bytes[8..].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(origins: &[&str]) -> HttpSettings {
        HttpSettings {
            listen: Vec::new(),
            auth: crate::unit::settings::Auth::Token,
            max_sessions: 1,
            max_sessions_per_token: None,
            allow_origin: origins.iter().map(|o| (*o).to_owned()).collect(),
        }
    }

    #[test]
    fn loopback_and_listed_origins_pass_others_do_not() {
        let s = settings(&["https://app.example"]);
        assert_eq!(origin_allowed("http://localhost:3000", &s), Some(false));
        assert_eq!(origin_allowed("http://127.0.0.1", &s), Some(false));
        assert_eq!(origin_allowed("http://[::1]:8080", &s), Some(false));
        assert_eq!(origin_allowed("https://APP.example", &s), Some(true));
        assert_eq!(origin_allowed("https://evil.example", &s), None);
        assert_eq!(origin_allowed("http://127.0.0.1.evil.example", &s), None);
        assert_eq!(origin_allowed("null", &s), None);
    }

    #[test]
    fn paths_are_percent_decoded() {
        assert_eq!(percent_decode("%40dev").as_deref(), Some("@dev"));
        assert_eq!(percent_decode("time").as_deref(), Some("time"));
        assert_eq!(percent_decode("%4"), None);
    }
}
