//! Streamable HTTP sessions: rmcp's client transport, adapted to a
//! [`Wire`] that carries mcpd's own
//! [`Message`](crate::mux::message::Message)s. The only place that knows
//! rmcp's HTTP transport (the launcher's, see [`super::launch`]): `mux`
//! sees a channel-fed wire and nothing of rmcp.

use std::collections::HashMap;

use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::auth::AuthClient;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use tokio::sync::mpsc;

use crate::mux::error::ErrorCode;
use crate::mux::wire::{Wire, error_chain};

/// A session with the Streamable HTTP server at `url`, sending `headers`
/// with every request.
pub fn connect(url: &str, headers: HashMap<http::HeaderName, http::HeaderValue>) -> Wire {
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    let transport = StreamableHttpClientTransport::from_config(config);
    wire(transport, http_error_text)
}

/// A session with `url` as [`connect`], authorized by a login's client
/// (DESIGN §17): each request carries the unit's current token, and a
/// `401` is met with one refresh (rmcp's [`AuthClient`]).
pub fn connect_with(
    url: &str,
    headers: HashMap<http::HeaderName, http::HeaderValue>,
    client: AuthClient<reqwest::Client>,
) -> Wire {
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    let transport = StreamableHttpClientTransport::with_client(client, config);
    wire(transport, oauth_error_text)
}

/// [`http_error_text`], and a `401` that rmcp's one refresh did not mend
/// as [`TOKEN_REFUSED`](super::oauth::TOKEN_REFUSED): the unit needs a
/// login, not a retry.
fn oauth_error_text(error: &StreamableHttpError<reqwest::Error>) -> String {
    match error {
        StreamableHttpError::AuthRequired(_) => super::oauth::TOKEN_REFUSED.to_owned(),
        other => http_error_text(other),
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
/// knows of a message reaches the server. `describe` words a failed
/// send (which ends the connection).
pub fn wire<T>(transport: T, describe: fn(&T::Error) -> String) -> Wire
where
    T: rmcp::transport::Transport<rmcp::RoleClient> + Send + 'static,
{
    use rmcp::model::ClientJsonRpcMessage;
    let (incoming, rx) = mpsc::unbounded_channel();
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
                                let _ = incoming.send(Ok(refusal.into()));
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
                    let failed = incoming.clone();
                    let report = move |sent: Result<(), T::Error>| {
                        drop(written);
                        if let Err(e) = sent {
                            let _ = failed.send(Err(describe(&e)));
                        }
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
                            if incoming.send(Ok(value.into())).is_err() {
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

    // A multi-thread runtime runs the task spawned last first (its LIFO
    // slot): sends spawned unpolled reached the transport out of order,
    // `tools/list` before `notifications/initialized`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn messages_reach_an_rmcp_transport_in_the_order_sent() {
        let (recorder, mut seen) = mpsc::unbounded_channel();
        let wire = wire(Recording(recorder), |e| e.to_string());
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
