//! [`Wire`], a connection to a server that carries whatever JSON-RPC it
//! says as [`Message`]s, unknown methods and fields included: a
//! [`Sender`] and a [`Receiver`], over a child's pipes, any byte stream,
//! or channels fed by a transport that runs its own task (the launcher's
//! Streamable HTTP adapter, `supervisor::http`).
//!
//! The framing these connections share with the host sessions is in
//! [`super::lines`], the writer of a descriptor in [`super::outbox`]; their
//! names are re-exported here, where the session layer has always taken
//! them from.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc};

use super::error::ErrorCode;
pub use super::lines::{Drain, Frame, Lines, MAX_LINE, Source, Stream, line};
use super::message::{Message, RequestId};
pub use super::outbox::{Outbox, Refused, TryWrite};

/// An error and its sources, as one line.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}

/// Sends messages to a server.
#[derive(Debug, Clone)]
pub struct Sender(SenderKind);

#[derive(Debug, Clone)]
enum SenderKind {
    /// To a task that serializes and writes them.
    Values(mpsc::UnboundedSender<Message>, Arc<Queued>),
    /// Written at once where possible (the child's stdin).
    Pipe(Arc<Outbox<tokio::net::unix::pipe::Sender>>, Arc<Notify>),
}

/// The connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl Sender {
    pub fn send(&self, message: Message) -> Result<(), Closed> {
        match &self.0 {
            SenderKind::Values(tx, queued) => {
                queued.messages.fetch_add(1, Ordering::Relaxed);
                tx.send(message).map_err(|_| {
                    queued.messages.fetch_sub(1, Ordering::Relaxed);
                    Closed
                })
            }
            SenderKind::Pipe(outbox, _) => message
                .with_line(|line| outbox.send_slice(line))
                .map_err(|_| Closed),
        }
    }

    /// Messages sent and not written yet (the one being written
    /// included), in the order sent: what a server that reads slowly has
    /// not taken. The session core bounds it (`mux::session::toward`).
    pub fn waiting(&self) -> usize {
        match &self.0 {
            SenderKind::Values(_, queued) => queued.messages.load(Ordering::Relaxed),
            SenderKind::Pipe(outbox, _) => outbox.backlog().0,
        }
    }

    /// Woken each time a message that waited has been written.
    pub fn drained(&self) -> Arc<Notify> {
        match &self.0 {
            SenderKind::Values(_, queued) => Arc::clone(&queued.drained),
            SenderKind::Pipe(_, drained) => Arc::clone(drained),
        }
    }
}

/// The count of a channel-fed connection's messages not written yet,
/// shared by its [`Sender`]s and its [`Outgoing`].
#[derive(Debug, Default)]
struct Queued {
    messages: AtomicUsize,
    drained: Arc<Notify>,
}

/// The transport's end of a channel-fed connection ([`Wire::channel`]):
/// the messages sent on the wire, each with the [`Written`] that says,
/// when dropped, that it has left the daemon.
#[derive(Debug)]
pub struct Outgoing {
    rx: mpsc::UnboundedReceiver<Message>,
    queued: Arc<Queued>,
}

impl Outgoing {
    /// The next message sent on the wire; `None` once every sender is
    /// gone.
    pub async fn recv(&mut self) -> Option<(Message, Written)> {
        let message = self.rx.recv().await?;
        Some((message, Written(Arc::clone(&self.queued))))
    }
}

/// A message taken off a channel-fed connection: counted as waiting
/// ([`Sender::waiting`]) until this is dropped (once it was written, or
/// its send failed).
#[derive(Debug)]
pub struct Written(Arc<Queued>);

impl Drop for Written {
    fn drop(&mut self) {
        self.0.messages.fetch_sub(1, Ordering::Relaxed);
        self.0.drained.notify_one();
    }
}

/// What a server connection reports.
pub type Incoming = Result<Message, String>;

/// A connection to a server carrying raw JSON-RPC: messages to the server
/// on `tx` (dropping every sender closes the connection), messages from it
/// on `rx`. The connection is gone when `rx` ends, or at an `Err`: a
/// request that could not be sent, and why.
#[derive(Debug)]
pub struct Wire {
    pub tx: Sender,
    pub rx: Receiver,
}

/// Messages from a server. Lines (a child's stdout) are read by whoever
/// awaits them (no task between the pipe and the session task: a message
/// costs no task switch and no channel); messages of other connections,
/// and a failed write, arrive on a channel.
pub struct Receiver {
    lines: Option<Lines<Box<dyn Source>>>,
    channel: mpsc::UnboundedReceiver<Incoming>,
    /// A channel-fed connection's messages ([`Wire::channel`]): bounded,
    /// so a server that sends faster than the session takes is read no
    /// more by its transport until there is room.
    from: Option<mpsc::Receiver<Incoming>>,
    /// Keeps the channel open for the writer's report while the pipe is
    /// read here.
    _open: Option<mpsc::UnboundedSender<Incoming>>,
    /// The end was seen.
    ended: bool,
    /// Lines that were not messages.
    garbage: Garbage,
}

/// Lines from a server that were not JSON-RPC messages.
#[derive(Debug, Default)]
struct Garbage {
    /// Since the last message: past [`GARBAGE_RUN`], the connection fails.
    run: u64,
    /// Since the last [`Receiver::take_garbage`].
    unreported: u64,
    /// Why the last one was not a message.
    last: String,
}

/// Lines in a row from a server that are not JSON-RPC messages past which
/// its connection is taken for broken (a server writing binary to its
/// stdout), and fails.
pub const GARBAGE_RUN: u64 = 10_000;

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("lines", &self.lines.is_some())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Receiver {
    fn channel(from: mpsc::Receiver<Incoming>) -> Self {
        Self {
            lines: None,
            channel: mpsc::unbounded_channel().1,
            from: Some(from),
            _open: None,
            ended: false,
            garbage: Garbage::default(),
        }
    }

    /// Lines read from `source`; the sender of the channel, for a writer's
    /// report of a failed write.
    fn lines(source: impl Source) -> (Self, mpsc::UnboundedSender<Incoming>) {
        let (incoming, channel) = mpsc::unbounded_channel();
        let receiver = Self {
            lines: Some(Lines::new(Box::new(source))),
            channel,
            from: None,
            _open: Some(incoming.clone()),
            ended: false,
            garbage: Garbage::default(),
        };
        (receiver, incoming)
    }

    /// The next message, or why the connection failed; `None` once it
    /// ended. Cancelling it (not polling again) loses nothing.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Incoming>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(from) = &mut self.from {
            let next = std::task::ready!(from.poll_recv(cx));
            self.ended = next.is_none();
            return Poll::Ready(next);
        }
        match self.channel.poll_recv(cx) {
            Poll::Ready(Some(incoming)) => return Poll::Ready(Some(incoming)),
            Poll::Ready(None) if self.lines.is_none() => {
                self.ended = true;
                return Poll::Ready(None);
            }
            _ => {}
        }
        let Some(lines) = &mut self.lines else {
            return Poll::Pending;
        };
        loop {
            match std::task::ready!(lines.poll_next(cx)) {
                Some(Frame::Message(message)) => {
                    self.garbage.run = 0;
                    return Poll::Ready(Some(Ok(message)));
                }
                Some(Frame::Garbage(why)) => {
                    let garbage = &mut self.garbage;
                    garbage.run += 1;
                    garbage.unreported += 1;
                    garbage.last = why;
                    if garbage.run >= GARBAGE_RUN {
                        garbage.run = 0;
                        let why = format!(
                            "the server wrote {GARBAGE_RUN} lines in a row that are not JSON-RPC messages (the last: {})",
                            garbage.last
                        );
                        return Poll::Ready(Some(Err(why)));
                    }
                }
                Some(Frame::TooLong(id)) => {
                    tracing::error!(
                        max_line_length = MAX_LINE,
                        "a message from the server exceeded the maximum line length; discarding it"
                    );
                    // An answer whose id is known is answered, in its
                    // place, with an error: nobody waits for it for ever.
                    if let Some(id) = id {
                        return Poll::Ready(Some(Ok(oversized(&id))));
                    }
                }
                None => {
                    self.ended = true;
                    self.lines = None;
                    return Poll::Ready(None);
                }
            }
        }
    }

    /// How many lines that were not messages were read since the last
    /// call, and why the last was not, if there were any.
    pub fn take_garbage(&mut self) -> Option<(u64, String)> {
        let garbage = &mut self.garbage;
        (garbage.unreported > 0).then(|| {
            (
                std::mem::take(&mut garbage.unreported),
                garbage.last.clone(),
            )
        })
    }

    /// [`Receiver::poll_recv`], waiting.
    pub async fn recv(&mut self) -> Option<Incoming> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl Wire {
    /// Newline-delimited messages: read from `source`, written to `sink`.
    /// Lines that are not messages are logged and dropped.
    pub fn lines<S, W>(source: S, sink: W) -> Self
    where
        S: Source,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, mut outgoing) = Self::outgoing();
        let (rx, incoming) = Receiver::lines(source);
        // The writer reports a failed write without keeping the channel
        // open once the receiver is gone.
        let reader_closed = incoming.downgrade();
        drop(incoming);
        tokio::spawn(async move {
            let mut sink = sink;
            while let Some((message, _written)) = outgoing.recv().await {
                let bytes = message.line();
                let written = async {
                    sink.write_all(&bytes).await?;
                    sink.flush().await
                };
                if let Err(e) = written.await {
                    // A closed pipe is the server going away: its reader
                    // sees the end of file.
                    if e.kind() != io::ErrorKind::BrokenPipe
                        && let Some(incoming) = reader_closed.upgrade()
                    {
                        let _ = incoming.send(Err(format!("cannot write to the server: {e}")));
                    }
                    break;
                }
            }
            // Closing the sink (the child's stdin) tells the server to go.
            let _ = sink.shutdown().await;
        });
        Self { tx, rx }
    }

    /// A channel-fed connection's sender and the transport's end.
    fn outgoing() -> (Sender, Outgoing) {
        let (tx, rx) = mpsc::unbounded_channel::<Message>();
        let queued = Arc::new(Queued::default());
        let sender = Sender(SenderKind::Values(tx, Arc::clone(&queued)));
        (sender, Outgoing { rx, queued })
    }

    /// Over a child's pipes: as [`Wire::lines`], but a message the pipe
    /// takes at once is written by the sender itself.
    pub fn pipes(
        source: tokio::net::unix::pipe::Receiver,
        sink: tokio::net::unix::pipe::Sender,
    ) -> Self {
        let (rx, incoming) = Receiver::lines(source);
        let drained = Arc::new(Notify::new());
        // Unbounded here: what may wait for the server is bounded by the
        // session core, by host (`mux::session::toward`).
        let outbox = Outbox::new(sink, usize::MAX / 8, Some(incoming.downgrade()))
            .notify_drained(Arc::clone(&drained));
        Self {
            tx: Sender(SenderKind::Pipe(Arc::new(outbox), drained)),
            rx,
        }
    }

    /// Over channels, for a transport that runs its own task (the
    /// launcher's Streamable HTTP adapter): the messages sent on the wire
    /// come out of the [`Outgoing`] returned (each counted as waiting
    /// until its [`Written`] is dropped), and the transport sends what the
    /// server says, or why the connection failed, to the sender of
    /// `from_server` (bounded: the transport waits for room). The
    /// connection ends when that sender is dropped.
    pub fn channel(from_server: mpsc::Receiver<Incoming>) -> (Self, Outgoing) {
        let (tx, outgoing) = Self::outgoing();
        let wire = Self {
            tx,
            rx: Receiver::channel(from_server),
        };
        (wire, outgoing)
    }
}

/// What stands for the server's answer to request `id` that exceeded the
/// line limit and was dropped.
fn oversized(id: &RequestId) -> Message {
    ErrorCode::InternalError
        .response(
            &id.to_value(),
            format!(
                "the server's answer exceeded mcpd's limit of {} MiB per message and was dropped",
                MAX_LINE >> 20
            ),
        )
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::unix::pipe;

    const PING: &str = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;

    #[tokio::test]
    async fn a_wire_writes_one_line_per_message_and_closes_its_sink() {
        let (server_out, client_in) = pipe::pipe().expect("pipe");
        let (client_out, server_in) = pipe::pipe().expect("pipe");
        let mut wire = Wire::pipes(client_in, client_out);
        let mut from_client = Lines::new(server_in);
        wire.tx
            .send(serde_json::json!({"jsonrpc": "2.0", "method": "x"}).into())
            .expect("send");
        assert!(
            matches!(from_client.next().await, Some(Frame::Message(m)) if m.method().as_deref() == Some("x"))
        );
        let mut server_out = server_out;
        server_out
            .write_all(format!("{PING}\n").as_bytes())
            .await
            .expect("write");
        assert_eq!(
            wire.rx.recv().await,
            Some(Ok(Message::parse(PING.as_bytes()).expect("JSON")))
        );
        drop(wire.tx);
        assert_eq!(
            from_client.next().await,
            None,
            "closed once every sender is gone"
        );
        drop(server_out);
        assert_eq!(
            wire.rx.recv().await,
            None,
            "the server's end of file ends it"
        );
    }
}
