//! Streamable HTTP sessions: rmcp's client transport, adapted to a
//! [`Wire`] that carries mcpd's own
//! [`Message`](crate::mux::message::Message)s. The only place that knows
//! rmcp's HTTP transport (the launcher's, see [`super::launch`]): `mux`
//! sees a channel-fed wire and nothing of rmcp.
//!
//! Every request goes through [`Traced`], which copies the W3C trace
//! context of its `params._meta` (DESIGN §18: mcpd's client span's when
//! telemetry is on, else the host's as it came) into the `traceparent`
//! and `tracestate` headers of its POST.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, GetMeta};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::auth::AuthClient;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use tokio::sync::mpsc;

use super::oauth::{Login, StepUpAnswer};
use crate::mux::error::ErrorCode;
use crate::mux::wire::{Wire, error_chain};

/// Messages from the server the session has not taken yet, past which
/// the transport reads no more (issue 49): a server that streams faster
/// than the daemon takes its messages waits in its own writes (rmcp's
/// channels behind this hold 16 messages each), it never grows the
/// daemon.
pub const FROM_SERVER: usize = 64;

/// What a failed send means for the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed {
    /// The session ends, for this reason.
    End(String),
    /// The request is answered with this error (a notification has no
    /// answer: the session ends); the session ends too when `end`.
    Answer { error: String, end: bool },
}

/// A session with the Streamable HTTP server at `url`, sending `headers`
/// with every request.
pub fn connect(url: &str, headers: HashMap<http::HeaderName, http::HeaderValue>) -> Wire {
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    let transport = StreamableHttpClientTransport::with_client(Traced(client()), config);
    wire(transport, |e| Failed::End(http_error_text(e)))
}

/// The most redirects followed for one request.
const MAX_REDIRECTS: usize = 10;

/// The HTTP client of a session without a login: rmcp's default one
/// (`StreamableHttpClientTransport::from_config`'s, which rmcp does not
/// export), made here to go inside [`Traced`]. No idle connections kept
/// (rmcp: a reused connection whose last body was not read stalls ~40 ms
/// on delayed ACKs); only same-origin 307 and 308 redirects followed
/// (they keep the method and body; another origin would be sent the
/// session id and the unit's headers), at most [`MAX_REDIRECTS`].
fn client() -> reqwest::Client {
    let redirects = reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .redirect(redirects)
        .build()
        .unwrap_or_default()
}

/// A session with `url` as [`connect`], authorized by a login's client
/// (DESIGN §17): each request carries the unit's current token, and a
/// `401` is met with one refresh (rmcp's [`AuthClient`]). A `403
/// insufficient_scope` answers its request with the login's step-up
/// ([`Login::insufficient_scope`]): the unit needs a login with the
/// scopes named (the session ends, and the actor finds the login needed),
/// or the scope was refused twice (the session goes on). A `401` the
/// refresh did not cure answers it with "needs a login" and ends the
/// session the same way.
pub fn connect_with(
    url: &str,
    headers: HashMap<http::HeaderName, http::HeaderValue>,
    client: AuthClient<reqwest::Client>,
    login: Arc<Login>,
) -> Wire {
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    let transport = StreamableHttpClientTransport::with_client(Traced(client), config);
    wire(transport, move |e| match e {
        StreamableHttpError::InsufficientScope(scope) => {
            match login.insufficient_scope(&scope.www_authenticate_header) {
                Some(StepUpAnswer::Login(error)) => Failed::Answer { error, end: true },
                Some(StepUpAnswer::Refused(error)) => Failed::Answer { error, end: false },
                None => Failed::End(http_error_text(e)),
            }
        }
        // rmcp's refresh did not cure a 401: the token is not accepted
        // (revoked, or another authorization server since: SEP-2352).
        StreamableHttpError::AuthRequired(_) => Failed::Answer {
            error: login.rejected(),
            end: true,
        },
        other => Failed::End(http_error_text(other)),
    })
}

/// An rmcp HTTP client that sends a request's trace context (its
/// `params._meta.traceparent` and `tracestate`) as the W3C headers too:
/// a server, or a proxy in front of it, that reads only the headers
/// joins the same trace. Everything else is `C`'s.
#[derive(Clone)]
struct Traced<C>(C);

impl<C> std::fmt::Debug for Traced<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Traced")
    }
}

/// `headers` with the W3C trace context of `message`, if it has one (a
/// `tracestate` only with a `traceparent`, as W3C says); a value that is
/// no header value is left out.
fn trace_headers(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return headers;
    };
    let meta = request.request.get_meta();
    let Some(parent) = meta
        .get_traceparent()
        .and_then(|v| HeaderValue::from_str(v).ok())
    else {
        return headers;
    };
    headers.insert(HeaderName::from_static("traceparent"), parent);
    if let Some(state) = meta
        .get_tracestate()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        headers.insert(HeaderName::from_static("tracestate"), state);
    }
    headers
}

impl<C: StreamableHttpClient + Sync> StreamableHttpClient for Traced<C> {
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = trace_headers(&message, custom_headers);
        self.0
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = trace_headers(&message, custom_headers);
        self.0
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = trace_headers(&message, custom_headers);
        self.0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<
        BoxStream<'static, Result<sse_stream::Sse, SseError>>,
        StreamableHttpError<Self::Error>,
    > {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// What went wrong in an HTTP request, without rmcp's wrapper type names.
pub fn http_error_text(error: &StreamableHttpError<reqwest::Error>) -> String {
    // rmcp wraps the HTTP client's error without exposing it as a source;
    // unwrap it to reach "connection refused" and the like.
    let text = match error {
        StreamableHttpError::Client(inner) => error_chain(inner),
        other => error_chain(other),
    };
    text.trim_end_matches([':', ' ']).to_owned()
}

/// Over an rmcp client transport (Streamable HTTP): messages are
/// converted to rmcp's types on the way, so only what rmcp's model
/// knows of a message reaches the server. `failed` says what a failed
/// send means: it ends the connection, or answers its request.
pub fn wire<T, F>(transport: T, failed: F) -> Wire
where
    T: rmcp::transport::Transport<rmcp::RoleClient> + Send + 'static,
    F: Fn(&T::Error) -> Failed + Send + Sync + 'static,
{
    let failed = Arc::new(failed);
    use rmcp::model::ClientJsonRpcMessage;
    let (incoming, rx) = mpsc::channel(FROM_SERVER);
    // Each message counts as waiting for the server (which the session
    // core bounds) until its HTTP request is over: a server that answers
    // slowly holds back the hosts that send it most.
    let (wire, mut outgoing) = Wire::channel(rx);
    tokio::spawn(async move {
        let mut transport = transport;
        loop {
            tokio::select! {
                message = outgoing.recv() => {
                    let Some((message, written)) = message else { break };
                    let message = message.to_value();
                    let typed = match serde_json::from_value::<ClientJsonRpcMessage>(message.clone()) {
                        Ok(typed) => typed,
                        Err(e) => {
                            // Answer a request rmcp cannot carry, so no
                            // caller waits for it.
                            if let (Some(id), Some(_)) = (message.get("id"), message.get("method")) {
                                let refusal = ErrorCode::InvalidParams.response(
                                    id,
                                    format!("mcpd cannot send this request over HTTP: {e}"),
                                );
                                let _ = incoming.send(Ok(refusal.into())).await;
                            }
                            continue;
                        }
                    };
                    // Poll the send once here, so it takes its place in
                    // the transport's queue in the order it was sent
                    // (`notifications/initialized` before the requests
                    // after it); its HTTP round trip goes on apart.
                    let mut send = Box::pin(transport.send(typed));
                    let first = std::future::poll_fn(|cx| {
                        std::task::Poll::Ready(send.as_mut().poll(cx))
                    })
                    .await;
                    let id = message.get("method").and(message.get("id")).cloned();
                    let back = incoming.clone();
                    let failed = Arc::clone(&failed);
                    let report = move |sent: Result<(), T::Error>| {
                        drop(written);
                        let Err(e) = sent else { return };
                        let outcome = (failed(&e), id);
                        // Told even while the channel is full.
                        tokio::spawn(async move {
                            match outcome {
                                (Failed::Answer { error, end }, Some(id)) => {
                                    let answer = ErrorCode::ServerDown.response(&id, error.clone());
                                    let _ = back.send(Ok(answer.into())).await;
                                    if end {
                                        let _ = back.send(Err(error)).await;
                                    }
                                }
                                (Failed::Answer { error, .. } | Failed::End(error), _) => {
                                    let _ = back.send(Err(error)).await;
                                }
                            }
                        });
                    };
                    match first {
                        std::task::Poll::Ready(sent) => report(sent),
                        std::task::Poll::Pending => {
                            tokio::spawn(async move { report(send.await) });
                        }
                    }
                }
                message = transport.receive() => match message {
                    Some(message) => match serde_json::to_value(&message) {
                        Ok(value) => {
                            // Waits for room: the server is read no more
                            // meanwhile.
                            if incoming.send(Ok(value.into())).await.is_err() {
                                break;
                            }
                        }
                        Err(e) => tracing::debug!("ignoring a message from the server: {e}"),
                    },
                    None => break,
                },
            }
        }
        let _ = transport.close().await;
    });
    wire
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transport that records each message when its send is first
    /// polled, as rmcp's worker transports queue it to their worker.
    struct Recording(mpsc::UnboundedSender<String>);

    impl rmcp::transport::Transport<rmcp::RoleClient> for Recording {
        type Error = std::io::Error;

        fn send(
            &mut self,
            item: rmcp::model::ClientJsonRpcMessage,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            let seen = self.0.clone();
            async move {
                let value = serde_json::to_value(&item).expect("serialize");
                let method = value["method"].as_str().unwrap_or("?").to_owned();
                let _ = seen.send(method);
                Ok(())
            }
        }

        async fn receive(&mut self) -> Option<rmcp::model::ServerJsonRpcMessage> {
            std::future::pending().await
        }

        async fn close(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    /// A transport whose server never stops sending: every `receive`
    /// is a notification at once, counted.
    struct Flooding(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl rmcp::transport::Transport<rmcp::RoleClient> for Flooding {
        type Error = std::io::Error;

        fn send(
            &mut self,
            _item: rmcp::model::ClientJsonRpcMessage,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            std::future::ready(Ok(()))
        }

        async fn receive(&mut self) -> Option<rmcp::model::ServerJsonRpcMessage> {
            // As rmcp's own channel does now and then: other tasks run.
            tokio::task::yield_now().await;
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let flood = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/message",
                "params": {"level": "info", "data": "x".repeat(1024)}});
            Some(serde_json::from_value(flood).expect("a notification"))
        }

        async fn close(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    /// A server that sends faster than the session takes its messages is
    /// read no more past [`FROM_SERVER`] of them (issue 49): before, the
    /// adapter's channel took everything, as fast as the server sent.
    #[tokio::test(flavor = "current_thread")]
    async fn a_server_sending_faster_than_the_session_reads_is_read_no_more() {
        let received = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut wire = wire(Flooding(std::sync::Arc::clone(&received)), |e| {
            Failed::End(e.to_string())
        });
        let read = || received.load(std::sync::atomic::Ordering::Relaxed);
        // The adapter's task runs as long as it can (it would never wait
        // with room for everything).
        for _ in 0..10_000 {
            tokio::task::yield_now().await;
        }
        assert!(read() <= FROM_SERVER + 1, "{} read", read());
        assert!(read() >= FROM_SERVER, "{} read", read());
        // Taking ten lets it read about ten more.
        for _ in 0..10 {
            assert!(wire.rx.recv().await.expect("open").is_ok());
        }
        for _ in 0..1_000 {
            tokio::task::yield_now().await;
        }
        assert!(read() <= FROM_SERVER + 11, "{} read", read());
    }

    // A multi-thread runtime runs the task spawned last first (its LIFO
    // slot): sends spawned unpolled reached the transport out of order,
    // `tools/list` before `notifications/initialized`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn messages_reach_an_rmcp_transport_in_the_order_sent() {
        let (recorder, mut seen) = mpsc::unbounded_channel();
        let wire = wire(Recording(recorder), |e| Failed::End(e.to_string()));
        let sent = [
            "notifications/initialized",
            "tools/list",
            "ping",
            "resources/list",
        ];
        for (id, method) in sent.iter().enumerate() {
            let message = if method.starts_with("notifications/") {
                serde_json::json!({"jsonrpc": "2.0", "method": method})
            } else {
                serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method})
            };
            wire.tx.send(message.into()).expect("the wire is open");
        }
        let mut order = Vec::new();
        while order.len() < sent.len() {
            let next = tokio::time::timeout(std::time::Duration::from_secs(10), seen.recv());
            order.push(next.await.expect("in time").expect("recorded"));
        }
        assert_eq!(order, sent);
    }
}
