//! JSON-RPC on the wire, as [`Message`]s: the framing of stdio
//! (newline-delimited messages) shared by the upstream pipes and the host
//! sessions' sockets, and [`Wire`], a connection to a server that carries
//! whatever JSON-RPC it says, unknown methods and fields included (over a
//! child's pipes, any byte stream, or channels fed by a transport that
//! runs its own task: the launcher's Streamable HTTP adapter,
//! `supervisor::http`).
//!
//! A reader holds no buffer while its peer is idle: it waits for the
//! descriptor to become readable before it takes one, and releases it once
//! every buffered line is handled (with one connection per server and one
//! per host session, 8 KiB kept per idle connection would dominate the
//! daemon's memory).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

use std::task::{Context, Poll};

use super::message::Message;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, Interest};
use tokio::sync::mpsc;
use tokio_util::bytes::BytesMut;

/// The most a single message (one line) may hold.
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// How much a read takes at once.
const CHUNK: usize = 8 * 1024;

/// How much the first read of a message takes: most messages are smaller,
/// and glibc's malloc sweeps its free lists for any request of 1 KiB or
/// more (a chunk reserved for every message did that every time).
const FIRST_READ: usize = 512;

/// Something lines are read from.
pub trait Source: Send + Unpin + 'static {
    /// Appends what can be read now to `buf`, or registers the task to be
    /// woken when something can; `Ok(0)` at end of file.
    fn poll_fill(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>>;

    /// [`Source::poll_fill`], waiting.
    fn fill(&mut self, buf: &mut BytesMut) -> impl Future<Output = io::Result<usize>> + Send
    where
        Self: Sized,
    {
        std::future::poll_fn(move |cx| self.poll_fill(cx, buf))
    }
}

/// Any source, as a server connection's (`Receiver`) reads them.
impl Source for Box<dyn Source> {
    fn poll_fill(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        (**self).poll_fill(cx, buf)
    }
}

macro_rules! readable_source {
    ($t:ty, $ready:expr) => {
        impl Source for $t {
            fn poll_fill(
                &mut self,
                cx: &mut Context<'_>,
                buf: &mut BytesMut,
            ) -> Poll<io::Result<usize>> {
                loop {
                    // The descriptor's one reader waker slot: no waiter
                    // list to join and leave.
                    std::task::ready!($ready(&*self, cx))?;
                    // Most messages are small: a first read takes little,
                    // and a partial line grows a chunk at a time.
                    buf.reserve(if buf.is_empty() { FIRST_READ } else { CHUNK });
                    match self.drain(buf) {
                        Ok(n) => return Poll::Ready(Ok(n)),
                        // Readiness was stale (and is now cleared).
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            if buf.is_empty() {
                                *buf = BytesMut::new();
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Poll::Ready(Err(e)),
                    }
                }
            }
        }
    };
}

/// A read that leaves no stale readiness behind.
pub trait Drain {
    /// Reads what is there into `buf`'s spare room. A read shorter than
    /// the room shows the descriptor drained, so its readiness is cleared
    /// then (as after EAGAIN), and a message costs one read, not a second
    /// that could only fail.
    fn drain(&self, buf: &mut BytesMut) -> io::Result<usize>;
}

/// [`Drain::drain`] through `try_io`, which clears readiness when its
/// closure says WouldBlock.
fn drain_with(
    buf: &mut BytesMut,
    read: impl Fn(&mut BytesMut) -> io::Result<usize>,
    try_io: impl FnOnce(&mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize>,
) -> io::Result<usize> {
    let room = buf.capacity() - buf.len();
    let mut got = None;
    let outcome = try_io(&mut || {
        let n = read(buf)?;
        got = Some(n);
        if n < room {
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    got.map_or(outcome, Ok)
}

impl Drain for tokio::net::unix::pipe::Receiver {
    fn drain(&self, buf: &mut BytesMut) -> io::Result<usize> {
        drain_with(buf, |b| self.try_read_buf(b), |f| self.try_io(f))
    }
}

impl Drain for tokio::net::UnixStream {
    fn drain(&self, buf: &mut BytesMut) -> io::Result<usize> {
        drain_with(
            buf,
            |b| self.try_read_buf(b),
            |f| self.try_io(Interest::READABLE, f),
        )
    }
}

impl Drain for tokio::net::unix::OwnedReadHalf {
    fn drain(&self, buf: &mut BytesMut) -> io::Result<usize> {
        let stream: &tokio::net::UnixStream = self.as_ref();
        stream.drain(buf)
    }
}

readable_source!(
    tokio::net::unix::pipe::Receiver,
    tokio::net::unix::pipe::Receiver::poll_read_ready
);
readable_source!(
    tokio::net::unix::OwnedReadHalf,
    |half: &tokio::net::unix::OwnedReadHalf, cx: &mut Context<'_>| {
        let stream: &tokio::net::UnixStream = half.as_ref();
        stream.poll_read_ready(cx)
    }
);
readable_source!(
    tokio::net::UnixStream,
    tokio::net::UnixStream::poll_read_ready
);

/// Any byte stream (in-memory pipes in tests): holds a buffer while waiting.
#[derive(Debug)]
pub struct Stream<R>(pub R);

impl<R: AsyncRead + Unpin + Send + 'static> Source for Stream<R> {
    fn poll_fill(&mut self, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
        buf.reserve(CHUNK);
        let n = std::task::ready!(tokio_util::io::poll_read_buf(
            std::pin::Pin::new(&mut self.0),
            cx,
            buf
        ))?;
        if buf.is_empty() {
            *buf = BytesMut::new();
        }
        Poll::Ready(Ok(n))
    }
}

/// One line read.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A JSON object: a message (whether it is a valid one is for the
    /// router to say).
    Message(Message),
    /// A line that is not a JSON object: why.
    Garbage(String),
    /// A line longer than [`MAX_LINE`] (dropped).
    TooLong,
}

/// Reads newline-delimited JSON messages from a [`Source`].
#[derive(Debug)]
pub struct Lines<S> {
    source: S,
    /// Bytes read and not yet handled; empty (unallocated) when idle.
    buf: BytesMut,
    /// How far `buf` is known to hold no newline.
    scanned: usize,
    /// Dropping the rest of an oversized line.
    discarding: bool,
}

impl<S: Source> Lines<S> {
    pub fn new(source: S) -> Self {
        Self::with_pending(source, Vec::new())
    }

    /// Lines of `pending` (bytes read from the same peer elsewhere) first,
    /// then of `source`.
    pub fn with_pending(source: S, pending: Vec<u8>) -> Self {
        Self {
            source,
            buf: BytesMut::from(&pending[..]),
            scanned: 0,
            discarding: false,
        }
    }

    /// The next whole line in `buf` (newline included), if there is one.
    fn take_line(&mut self) -> Option<BytesMut> {
        let newline = memchr::memchr(b'\n', &self.buf[self.scanned..])?;
        let line = self.buf.split_to(self.scanned + newline + 1);
        self.scanned = 0;
        if self.buf.is_empty() {
            // Release the allocation the line shared.
            self.buf = BytesMut::new();
        }
        Some(line)
    }

    /// The bytes allocated for reading (0 when idle).
    pub fn buffered(&self) -> usize {
        self.buf.capacity()
    }

    /// The next line; `None` at end of file or on a read error (any bytes
    /// left are an incomplete last message).
    pub async fn next(&mut self) -> Option<Frame> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// A line already read (no I/O), if a whole one is buffered.
    pub fn buffered_frame(&mut self) -> Option<Frame> {
        while !self.discarding {
            let line = self.take_line()?;
            if let Some(frame) = Self::frame(&line) {
                return Some(frame);
            }
        }
        None
    }

    /// [`Lines::next`], polled: cancelling it (not polling it again)
    /// loses nothing.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Frame>> {
        // A descriptor's readiness is not budgeted by tokio: a peer that
        // never stops sending would keep this task (and its worker) for
        // ever. A unit of budget per message makes it yield to the other
        // tasks now and then.
        let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
        loop {
            let Some(line) = self.take_line() else {
                self.scanned = self.buf.len();
                if self.discarding {
                    self.buf = BytesMut::new();
                    self.scanned = 0;
                } else if self.buf.len() > MAX_LINE {
                    self.discarding = true;
                    self.buf = BytesMut::new();
                    self.scanned = 0;
                    coop.made_progress();
                    return Poll::Ready(Some(Frame::TooLong));
                }
                match std::task::ready!(self.source.poll_fill(cx, &mut self.buf)) {
                    Ok(0) => return Poll::Ready(None),
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::debug!("read failed: {e}");
                        return Poll::Ready(None);
                    }
                }
            };
            if std::mem::take(&mut self.discarding) {
                continue;
            }
            if let Some(frame) = Self::frame(&line) {
                coop.made_progress();
                return Poll::Ready(Some(frame));
            }
        }
    }

    /// What a whole line (newline included) holds; `None` for a blank
    /// one.
    fn frame(line: &[u8]) -> Option<Frame> {
        if line.len() > MAX_LINE + 1 {
            return Some(Frame::TooLong);
        }
        let mut text: &[u8] = line;
        if let Some(rest) = text.strip_prefix("\u{feff}".as_bytes()) {
            text = rest;
        }
        if text.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        Some(match Message::parse(text) {
            Ok(message) => Frame::Message(message),
            Err(why) => Frame::Garbage(why.to_string()),
        })
    }
}

/// A message as one line, newline included.
pub fn line(message: &Value) -> Vec<u8> {
    // A `Value` always serializes.
    let mut bytes = serde_json::to_vec(message).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

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

/// A descriptor written to without waiting (pipes, sockets).
pub trait TryWrite: Send + Sync + 'static {
    fn try_write(&self, bytes: &[u8]) -> io::Result<usize>;
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
}

macro_rules! try_write_sink {
    ($t:ty) => {
        impl TryWrite for $t {
            fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
                <$t>::try_write(self, bytes)
            }
            async fn writable(&self) -> io::Result<()> {
                <$t>::writable(self).await
            }
        }
    };
}

try_write_sink!(tokio::net::unix::pipe::Sender);
try_write_sink!(tokio::net::unix::OwnedWriteHalf);
try_write_sink!(tokio::net::UnixStream);

/// Why a message could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// More than the limit is waiting: the reader is not reading.
    Full,
    /// The connection failed or was closed.
    Closed,
}

/// Writes lines to a descriptor from one task without waiting on it: what
/// the descriptor takes now is written at once (no task switch on the way
/// to the peer), the rest is queued for a writer task, and then everything
/// queues behind it, so order is kept. Dropping the outbox closes the
/// descriptor once the queue is written.
#[derive(Debug)]
pub struct Outbox<W> {
    sink: Arc<W>,
    /// Messages queued or being written by the writer task.
    queued: Arc<AtomicUsize>,
    queue: mpsc::UnboundedSender<Vec<u8>>,
    limit: usize,
    /// The writer task: it ends once the outbox is dropped and its queue
    /// written (or a write failed).
    writer: Option<tokio::task::JoinHandle<()>>,
}

impl<W: TryWrite> Outbox<W> {
    /// An outbox that refuses more than `limit` waiting messages;
    /// `failed` hears of a failed write (once).
    pub fn new(sink: W, limit: usize, failed: Option<mpsc::WeakUnboundedSender<Incoming>>) -> Self {
        let sink = Arc::new(sink);
        let queued = Arc::new(AtomicUsize::new(0));
        let (queue, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let (writer, count) = (Arc::clone(&sink), Arc::clone(&queued));
        let writer = tokio::spawn(async move {
            while let Some(bytes) = rx.recv().await {
                if let Err(e) = write_all(&*writer, &bytes).await {
                    // A closed pipe is the peer going away: its reader
                    // sees the end of file.
                    if e.kind() != io::ErrorKind::BrokenPipe
                        && let Some(incoming) = failed.as_ref().and_then(|f| f.upgrade())
                    {
                        let _ = incoming.send(Err(format!("cannot write to the server: {e}")));
                    }
                    // Further sends are refused as closed.
                    count.store(usize::MAX / 2, Ordering::Relaxed);
                    return;
                }
                count.fetch_sub(1, Ordering::Relaxed);
            }
        });
        Self {
            sink,
            queued,
            queue,
            limit,
            writer: Some(writer),
        }
    }

    /// The writer task, to wait for what is queued to be written after the
    /// outbox is dropped (or to abort it).
    pub fn take_writer(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        self.writer.take()
    }

    /// Writes `bytes` now if the descriptor takes them, else queues them.
    pub fn send(&self, mut bytes: Vec<u8>) -> Result<(), Refused> {
        let queued = self.queued.load(Ordering::Relaxed);
        if queued >= usize::MAX / 4 {
            return Err(Refused::Closed);
        }
        if queued == 0 {
            let mut written = 0;
            loop {
                match self.sink.try_write(&bytes[written..]) {
                    Ok(n) => {
                        written += n;
                        if written == bytes.len() {
                            return Ok(());
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // WouldBlock, or an error the writer task will meet
                    // and report.
                    Err(_) => break,
                }
            }
            bytes.drain(..written);
        } else if queued >= self.limit {
            return Err(Refused::Full);
        }
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.queue.send(bytes).map_err(|_| Refused::Closed)
    }
}

impl Outbox<tokio::net::unix::OwnedWriteHalf> {
    /// Shuts the socket down both ways now, whatever is still queued: the
    /// peer sees the end at once, and a writer task waiting for it to read
    /// fails and ends.
    pub fn shutdown(&self) {
        let stream: &tokio::net::UnixStream = (*self.sink).as_ref();
        shutdown(stream);
    }
}

impl Outbox<tokio::net::UnixStream> {
    /// As for a socket's half.
    pub fn shutdown(&self) {
        shutdown(&self.sink);
    }
}

fn shutdown(stream: &tokio::net::UnixStream) {
    use std::os::fd::AsFd;
    let _ = rustix::net::shutdown(stream.as_fd(), rustix::net::Shutdown::Both);
}

async fn write_all<W: TryWrite>(sink: &W, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        sink.writable().await?;
        match sink.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends messages to a server.
#[derive(Debug, Clone)]
pub struct Sender(SenderKind);

#[derive(Debug, Clone)]
enum SenderKind {
    /// To a task that serializes and writes them.
    Values(mpsc::UnboundedSender<Message>),
    /// Written at once where possible (the child's stdin).
    Pipe(Arc<Outbox<tokio::net::unix::pipe::Sender>>),
}

/// The connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl Sender {
    pub fn send(&self, message: Message) -> Result<(), Closed> {
        match &self.0 {
            SenderKind::Values(tx) => tx.send(message).map_err(|_| Closed),
            SenderKind::Pipe(outbox) => outbox.send(message.line()).map_err(|_| Closed),
        }
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
    /// Keeps the channel open for the writer's report while the pipe is
    /// read here.
    _open: Option<mpsc::UnboundedSender<Incoming>>,
    /// The end was seen.
    ended: bool,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("lines", &self.lines.is_some())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl Receiver {
    fn channel(channel: mpsc::UnboundedReceiver<Incoming>) -> Self {
        Self {
            lines: None,
            channel,
            _open: None,
            ended: false,
        }
    }

    /// Lines read from `source`; the sender of the channel, for a writer's
    /// report of a failed write.
    fn lines(source: impl Source) -> (Self, mpsc::UnboundedSender<Incoming>) {
        let (incoming, channel) = mpsc::unbounded_channel();
        let receiver = Self {
            lines: Some(Lines::new(Box::new(source))),
            channel,
            _open: Some(incoming.clone()),
            ended: false,
        };
        (receiver, incoming)
    }

    /// The next message, or why the connection failed; `None` once it
    /// ended. Cancelling it (not polling again) loses nothing.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Incoming>> {
        if self.ended {
            return Poll::Ready(None);
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
                Some(Frame::Message(message)) => return Poll::Ready(Some(Ok(message))),
                Some(Frame::Garbage(why)) => {
                    tracing::debug!("ignoring a line from the server: {why}");
                }
                Some(Frame::TooLong) => tracing::error!(
                    max_line_length = MAX_LINE,
                    "a message from the server exceeded the maximum line length; discarding it"
                ),
                None => {
                    self.ended = true;
                    self.lines = None;
                    return Poll::Ready(None);
                }
            }
        }
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
        let (tx, mut outgoing) = mpsc::unbounded_channel::<Message>();
        let (rx, incoming) = Receiver::lines(source);
        // The writer reports a failed write without keeping the channel
        // open once the receiver is gone.
        let reader_closed = incoming.downgrade();
        drop(incoming);
        tokio::spawn(async move {
            let mut sink = sink;
            while let Some(message) = outgoing.recv().await {
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
        Self {
            tx: Sender(SenderKind::Values(tx)),
            rx,
        }
    }

    /// Over a child's pipes: as [`Wire::lines`], but a message the pipe
    /// takes at once is written by the sender itself.
    pub fn pipes(
        source: tokio::net::unix::pipe::Receiver,
        sink: tokio::net::unix::pipe::Sender,
    ) -> Self {
        let (rx, incoming) = Receiver::lines(source);
        let outbox = Outbox::new(sink, usize::MAX / 8, Some(incoming.downgrade()));
        Self {
            tx: Sender(SenderKind::Pipe(Arc::new(outbox))),
            rx,
        }
    }

    /// Over channels, for a transport that runs its own task (the
    /// launcher's Streamable HTTP adapter): the messages sent on the wire
    /// come out of the receiver of `to_server`, and the transport sends
    /// what the server says, or why the connection failed, to the sender
    /// of `from_server`. The connection ends when that sender is dropped.
    pub fn channel(
        to_server: mpsc::UnboundedSender<Message>,
        from_server: mpsc::UnboundedReceiver<Incoming>,
    ) -> Self {
        Self {
            tx: Sender(SenderKind::Values(to_server)),
            rx: Receiver::channel(from_server),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use super::*;
    use tokio::net::unix::pipe;

    const PING: &str = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;

    fn rig() -> (Lines<pipe::Receiver>, pipe::Sender) {
        let (tx, rx) = pipe::pipe().expect("pipe");
        (Lines::new(rx), tx)
    }

    fn ping() -> Frame {
        Frame::Message(Message::parse(PING.as_bytes()).expect("JSON"))
    }

    #[tokio::test]
    async fn a_message_split_across_reads_and_messages_sharing_a_read() {
        let (mut lines, mut w) = rig();
        let (head, tail) = PING.split_at(10);
        w.write_all(head.as_bytes()).await.expect("write");
        let rest = format!("{tail}\n{PING}\r\n");
        let writer = tokio::spawn(async move {
            tokio::task::yield_now().await;
            w.write_all(rest.as_bytes()).await.expect("write");
            w
        });
        assert_eq!(lines.next().await, Some(ping()));
        assert_eq!(lines.next().await, Some(ping()));
        assert_eq!(lines.buffered(), 0, "idle: no buffer held");
        drop(writer.await.expect("writer"));
        assert_eq!(lines.next().await, None, "end of file ends the stream");
    }

    #[tokio::test]
    async fn a_short_read_clears_readiness_and_keeps_only_the_bytes_read() {
        let (mut w, mut rx) = pipe::pipe().expect("pipe");
        w.write_all(b"{\"jsonrpc\"").await.expect("write");
        let mut buf = BytesMut::new();
        assert_eq!(rx.fill(&mut buf).await.expect("read"), 10);
        assert!(
            buf.capacity() < 1024,
            "a chunk was kept: {}",
            buf.capacity()
        );
        // The read came back short: the pipe is drained, so waiting for it
        // to be readable waits (no second read that could only fail).
        {
            let mut readable = std::pin::pin!(rx.readable());
            let now = std::future::poll_fn(|cx| Poll::Ready(readable.as_mut().poll(cx))).await;
            assert!(
                now.is_pending(),
                "readiness was left set after a short read"
            );
        }
        w.write_all(b":\"2.0\"}\n").await.expect("write");
        assert_eq!(rx.fill(&mut buf).await.expect("read"), 8);
        assert_eq!(&buf[..], b"{\"jsonrpc\":\"2.0\"}\n");
    }

    /// A peer that always has more messages ready, as a pipe that is
    /// never drained is always readable.
    struct Endless;

    impl AsyncRead for Endless {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            const LINE: &[u8] = b"{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n";
            while buf.remaining() >= LINE.len() {
                buf.put_slice(LINE);
            }
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn a_reader_whose_peer_never_stops_sending_lets_other_tasks_run() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            rt.block_on(async {
                tokio::spawn(async {
                    let mut lines = Lines::new(Stream(Endless));
                    while lines.next().await.is_some() {}
                });
                // The reader runs now: this task resumes only once it
                // yields.
                tokio::task::yield_now().await;
                let _ = done.send(());
            });
        });
        assert!(
            finished
                .recv_timeout(std::time::Duration::from_secs(30))
                .is_ok(),
            "the reader never yielded to another task"
        );
    }

    #[tokio::test]
    async fn garbage_is_reported_blank_lines_skipped_and_a_bom_allowed() {
        let (mut lines, mut w) = rig();
        let input = format!("not json\n\n   \n[1]\n\"x\"\n\u{feff}{PING}\n");
        w.write_all(input.as_bytes()).await.expect("write");
        assert!(
            matches!(lines.next().await, Some(Frame::Garbage(why)) if why.starts_with("not JSON"))
        );
        assert!(matches!(lines.next().await, Some(Frame::Garbage(why)) if why.contains("batches")));
        assert!(matches!(lines.next().await, Some(Frame::Garbage(why)) if why.contains("object")));
        assert_eq!(lines.next().await, Some(ping()));
    }

    #[tokio::test]
    async fn an_oversized_line_is_reported_once_and_the_next_message_arrives() {
        let (mut lines, mut w) = rig();
        let writer = tokio::spawn(async move {
            let big = vec![b'x'; MAX_LINE + 10];
            w.write_all(&big).await.expect("write");
            w.write_all(format!("\n{PING}\n").as_bytes())
                .await
                .expect("write");
            w
        });
        assert_eq!(lines.next().await, Some(Frame::TooLong));
        assert_eq!(lines.next().await, Some(ping()));
        assert!(lines.buffered() < MAX_LINE, "the long line was not kept");
        drop(writer.await.expect("writer"));
    }

    #[tokio::test]
    async fn an_outbox_writes_at_once_queues_the_rest_in_order_and_refuses_past_its_limit() {
        let (tx, rx) = pipe::pipe().expect("pipe");
        let outbox = Outbox::new(tx, 3, None);
        // One message larger than the pipe holds: part now, part queued.
        let big = vec![b'a'; 256 * 1024];
        outbox.send(big.clone()).expect("first");
        outbox.send(b"b\n".to_vec()).expect("behind it");
        outbox.send(b"c\n".to_vec()).expect("behind it");
        assert_eq!(outbox.send(b"d\n".to_vec()), Err(Refused::Full));
        drop(outbox);
        let mut all = Vec::new();
        let mut rx = rx;
        tokio::io::AsyncReadExt::read_to_end(&mut rx, &mut all)
            .await
            .expect("read");
        let mut want = big;
        want.extend_from_slice(b"b\nc\n");
        assert_eq!(all.len(), want.len());
        assert!(all == want, "in order, nothing lost, closed once written");
    }

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
