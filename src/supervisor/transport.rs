//! The stdio transport to a child server: newline-delimited JSON-RPC, as
//! in rmcp's `AsyncRwTransport`, but holding no buffer while the server is
//! idle.
//!
//! rmcp's transport keeps an 8 KiB read buffer, an 8 KiB write buffer and
//! its largest line for the life of the connection; with one connection per
//! server that was a quarter of the daemon's memory per idle server. Here a
//! read waits for the pipe to become readable before it takes a buffer, the
//! buffer is released once every buffered line is handled, and each message
//! is written from its own serialization. Messages are parsed by rmcp's
//! `JsonRpcMessageCodec`, so what is accepted, ignored (non-MCP
//! notifications) or rejected is exactly rmcp's; unparsable lines are
//! dropped and well-formed non-messages answered with Invalid Request, as
//! rmcp's own transport does.

use std::io;
use std::sync::Arc;

use rmcp::RoleClient;
use rmcp::model::ErrorData;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::{JsonRpcMessageCodec, JsonRpcMessageCodecError};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::Mutex;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::Decoder;

/// The most a single incoming line may hold (rmcp's default, and its
/// streamable HTTP client's largest event).
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// How much a read takes at once.
const CHUNK: usize = 8 * 1024;

/// A client's transport over a child's stdout (messages in) and stdin
/// (messages out).
#[derive(Debug)]
pub struct StdioTransport {
    read: pipe::Receiver,
    /// Bytes read and not yet handled; empty (unallocated) when idle.
    buf: BytesMut,
    /// How far `buf` is known to hold no newline.
    scanned: usize,
    /// Dropping the rest of an oversized line.
    discarding: bool,
    codec: JsonRpcMessageCodec<RxJsonRpcMessage<RoleClient>>,
    write: Arc<Mutex<Option<pipe::Sender>>>,
}

impl StdioTransport {
    pub fn new(stdout: ChildStdout, stdin: ChildStdin) -> io::Result<Self> {
        Ok(Self::from_pipes(
            pipe::Receiver::from_owned_fd(stdout.into_owned_fd()?)?,
            pipe::Sender::from_owned_fd(stdin.into_owned_fd()?)?,
        ))
    }

    /// Over any pair of pipes: messages in on `read`, out on `write`.
    pub fn from_pipes(read: pipe::Receiver, write: pipe::Sender) -> Self {
        Self {
            read,
            buf: BytesMut::new(),
            scanned: 0,
            discarding: false,
            codec: JsonRpcMessageCodec::default(),
            write: Arc::new(Mutex::new(Some(write))),
        }
    }

    /// The next whole line in `buf` (newline included), if there is one.
    fn take_line(&mut self) -> Option<BytesMut> {
        let newline = self.buf[self.scanned..].iter().position(|b| *b == b'\n')?;
        let line = self.buf.split_to(self.scanned + newline + 1);
        self.scanned = 0;
        if self.buf.is_empty() {
            // Release the allocation the line shared.
            self.buf = BytesMut::new();
        }
        Some(line)
    }

    /// Reads more into `buf`; `false` at end of file or on an error.
    /// Cancel-safe: nothing is read unless the read completes.
    async fn fill(&mut self) -> bool {
        loop {
            if let Err(e) = self.read.readable().await {
                tracing::debug!("cannot wait for the server's stdout: {e}");
                return false;
            }
            self.buf.reserve(CHUNK);
            match self.read.try_read_buf(&mut self.buf) {
                Ok(0) => return false,
                Ok(_) => return true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.buf.is_empty() {
                        self.buf = BytesMut::new();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!("reading the server's stdout: {e}");
                    return false;
                }
            }
        }
    }

    /// Answers a well-formed message of the wrong shape, as rmcp does.
    fn reject(&self) {
        let response = TxJsonRpcMessage::<RoleClient>::error(
            ErrorData::invalid_request("Invalid request", None),
            None,
        );
        let write = Arc::clone(&self.write);
        // Its own task: a `receive` cancelled by the service loop must not
        // leave half a message on the pipe.
        tokio::spawn(async move {
            let _ = write_message(&write, &response).await;
        });
    }
}

fn log_oversized() {
    tracing::error!(
        max_line_length = MAX_LINE,
        "a message from the server exceeded the maximum line length; discarding it"
    );
}

async fn write_message(
    write: &Mutex<Option<pipe::Sender>>,
    item: &TxJsonRpcMessage<RoleClient>,
) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(item)?;
    bytes.push(b'\n');
    let mut guard = write.lock().await;
    let stdin = guard
        .as_mut()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "Transport is closed"))?;
    stdin.write_all(&bytes).await?;
    stdin.flush().await
}

impl Transport<RoleClient> for StdioTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = Arc::clone(&self.write);
        async move { write_message(&write, &item).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let Some(mut line) = self.take_line() else {
                self.scanned = self.buf.len();
                if self.discarding {
                    self.buf = BytesMut::new();
                    self.scanned = 0;
                } else if self.buf.len() > MAX_LINE {
                    log_oversized();
                    self.discarding = true;
                    self.buf = BytesMut::new();
                    self.scanned = 0;
                }
                if !self.fill().await {
                    // Any bytes left are an incomplete last message.
                    return None;
                }
                continue;
            };
            if std::mem::take(&mut self.discarding) {
                continue;
            }
            if line.len() > MAX_LINE + 1 {
                log_oversized();
                continue;
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match self.codec.decode(&mut line) {
                Ok(Some(message)) => return Some(message),
                // A notification outside MCP, ignored for compatibility.
                Ok(None) => {}
                Err(JsonRpcMessageCodecError::Serde(e)) => match e.classify() {
                    serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                        tracing::debug!("ignoring an unparsable line from the server: {e}");
                    }
                    serde_json::error::Category::Data | serde_json::error::Category::Io => {
                        tracing::debug!("protocol error from the server: {e}");
                        self.reject();
                    }
                },
                Err(e) => {
                    tracing::debug!("reading the server's stdout: {e}");
                    return None;
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        drop(self.write.lock().await.take());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    const PING: &str = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
    const CHANGED: &str = r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#;

    /// A transport, the server's end of its input, and the server's view of
    /// what the transport writes.
    fn rig() -> (StdioTransport, pipe::Sender, BufReader<pipe::Receiver>) {
        let (server_out, client_in) = pipe::pipe().expect("pipe");
        let (client_out, server_in) = pipe::pipe().expect("pipe");
        (
            StdioTransport::from_pipes(client_in, client_out),
            server_out,
            BufReader::new(server_in),
        )
    }

    fn is_ping(m: &ServerJsonRpcMessage) -> bool {
        matches!(m, ServerJsonRpcMessage::Request(r) if r.id == rmcp::model::NumberOrString::Number(7))
    }

    fn is_changed(m: &ServerJsonRpcMessage) -> bool {
        matches!(m, ServerJsonRpcMessage::Notification(_))
    }

    #[tokio::test]
    async fn a_message_split_across_reads_and_messages_sharing_a_read() {
        let (mut t, mut server, _) = rig();
        let (head, tail) = PING.split_at(10);
        server.write_all(head.as_bytes()).await.expect("write");
        assert!(t.fill().await);
        assert!(t.take_line().is_none(), "half a line is not a message");
        let rest = format!("{tail}\n{CHANGED}\r\n");
        server.write_all(rest.as_bytes()).await.expect("write");
        assert!(is_ping(&t.receive().await.expect("ping")));
        assert!(is_changed(&t.receive().await.expect("notification")));
        // idle: every buffered line handled, no buffer held
        assert_eq!(t.buf.capacity(), 0);
        drop(server);
        assert!(t.receive().await.is_none(), "end of file ends the stream");
    }

    #[tokio::test]
    async fn garbage_and_blank_lines_are_skipped_and_a_bom_is_allowed() {
        let (mut t, mut server, _) = rig();
        let input = format!("not json\n\n   \n{{\"jsonrpc\":\n\u{feff}{PING}\n");
        server.write_all(input.as_bytes()).await.expect("write");
        assert!(is_ping(&t.receive().await.expect("ping after the garbage")));
    }

    #[tokio::test]
    async fn well_formed_json_that_is_no_message_is_answered_with_invalid_request() {
        let (mut t, mut server, mut replies) = rig();
        let input = format!("{{\"foo\":1}}\n{PING}\n");
        server.write_all(input.as_bytes()).await.expect("write");
        assert!(is_ping(&t.receive().await.expect("ping")));
        let mut line = String::new();
        replies.read_line(&mut line).await.expect("reply");
        let reply: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(reply["error"]["code"], -32600, "{line}");
    }

    #[tokio::test]
    async fn an_oversized_line_is_dropped_and_the_next_message_arrives() {
        let (mut t, mut server, _) = rig();
        let writer = tokio::spawn(async move {
            let big = vec![b'x'; MAX_LINE + 10];
            server.write_all(&big).await.expect("write");
            server
                .write_all(format!("\n{PING}\n").as_bytes())
                .await
                .expect("write");
            server
        });
        assert!(is_ping(
            &t.receive().await.expect("ping after the long line")
        ));
        assert!(t.buf.capacity() < MAX_LINE, "the long line was not kept");
        drop(writer.await.expect("writer"));
    }

    #[tokio::test]
    async fn sends_one_line_per_message_until_closed() {
        let (mut t, _server, mut written) = rig();
        let message = ClientJsonRpcMessage::notification(
            rmcp::model::ClientNotification::InitializedNotification(Default::default()),
        );
        t.send(message.clone()).await.expect("send");
        t.send(message).await.expect("send");
        for _ in 0..2 {
            let mut line = String::new();
            written.read_line(&mut line).await.expect("line");
            let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
            assert_eq!(v["method"], "notifications/initialized");
        }
        t.close().await.expect("close");
        let mut rest = String::new();
        assert_eq!(
            written.read_line(&mut rest).await.expect("eof"),
            0,
            "closed"
        );
        let closed = ClientJsonRpcMessage::notification(
            rmcp::model::ClientNotification::InitializedNotification(Default::default()),
        );
        assert_eq!(
            t.send(closed).await.expect_err("closed").kind(),
            io::ErrorKind::NotConnected
        );
    }
}
