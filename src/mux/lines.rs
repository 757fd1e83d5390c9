//! Newline-delimited framing, shared by the upstream pipes and the host
//! sessions' sockets: [`Lines`] reads [`Frame`]s (a message, a line that
//! is not one, or a line over [`MAX_LINE`]) from a [`Source`], and
//! [`line`] writes a message as one.
//!
//! A reader holds no buffer while its peer is idle: it waits for the
//! descriptor to become readable before it takes one, and releases it once
//! every buffered line is handled (with one connection per server and one
//! per host session, 8 KiB kept per idle connection would dominate the
//! daemon's memory).
//!
//! A line over `MAX_LINE` is dropped and reported once it ends
//! (`Frame::TooLong`), with the id `message::id_of_cut` reads from its
//! first or last 4 KiB: a host's request is refused with its id, and the
//! server side (`wire::Receiver`) replaces a too-long answer with an error to
//! the request it answered, so nobody waits for it. A short read clears the
//! descriptor's readiness, so a message costs one read; each message takes a
//! unit of tokio's coop budget, so a peer that never stops sending cannot
//! keep the thread.

use std::io;
use std::task::{Context, Poll};

use serde_json::Value;
use tokio::io::{AsyncRead, Interest};
use tokio_util::bytes::BytesMut;

use super::message::{Message, RequestId, id_of_cut};

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
    /// A line longer than [`MAX_LINE`] (dropped), reported once it ended,
    /// with the id of the message it held when its first or last bytes
    /// tell it ([`id_of_cut`]).
    TooLong(Option<RequestId>),
}

/// What is kept of a line too long to read: its first and its last
/// [`KEPT`] bytes, to find its id.
#[derive(Debug, Default)]
struct Cut {
    head: Vec<u8>,
    tail: Vec<u8>,
}

/// Bytes kept of each end of a line too long to read.
const KEPT: usize = 4096;

impl Cut {
    fn starting(bytes: &[u8]) -> Self {
        let mut cut = Self {
            head: bytes[..bytes.len().min(KEPT)].to_vec(),
            tail: Vec::new(),
        };
        cut.then(bytes);
        cut
    }

    /// More of the line.
    fn then(&mut self, bytes: &[u8]) {
        if bytes.len() >= KEPT {
            self.tail.clear();
            self.tail.extend_from_slice(&bytes[bytes.len() - KEPT..]);
        } else {
            let keep = (KEPT - bytes.len()).min(self.tail.len());
            self.tail.drain(..self.tail.len() - keep);
            self.tail.extend_from_slice(bytes);
        }
    }

    fn frame(self) -> Frame {
        Frame::TooLong(id_of_cut(&self.head, &self.tail))
    }
}

/// Reads newline-delimited JSON messages from a [`Source`].
#[derive(Debug)]
pub struct Lines<S> {
    source: S,
    /// Bytes read and not yet handled; empty (unallocated) when idle.
    buf: BytesMut,
    /// How far `buf` is known to hold no newline.
    scanned: usize,
    /// Dropping the rest of an oversized line: what is kept of it.
    discarding: Option<Cut>,
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
            discarding: None,
        }
    }

    /// The next whole line in `buf` (newline included), if there is one.
    fn take_line(&mut self) -> Option<BytesMut> {
        let newline = memchr::memchr(b'\n', &self.buf[self.scanned..])?;
        let end = self.scanned + newline + 1;
        self.scanned = 0;
        if end == self.buf.len() {
            // The line is all there is (a read of one message, the most
            // usual): it takes the buffer, which stays its own (a split
            // would share it, and allocate to count its owners).
            return Some(std::mem::take(&mut self.buf));
        }
        Some(self.buf.split_to(end))
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
        while self.discarding.is_none() {
            let line = self.take_line()?;
            if let Some(frame) = Self::frame(line) {
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
                if let Some(cut) = &mut self.discarding {
                    cut.then(&self.buf);
                    self.buf = BytesMut::new();
                    self.scanned = 0;
                } else if self.buf.len() > MAX_LINE {
                    self.discarding = Some(Cut::starting(&self.buf));
                    self.buf = BytesMut::new();
                    self.scanned = 0;
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
            if let Some(mut cut) = self.discarding.take() {
                // The end of the line too long: reported now, with the id
                // its ends tell.
                cut.then(&line[..line.len() - 1]);
                coop.made_progress();
                return Poll::Ready(Some(cut.frame()));
            }
            if let Some(frame) = Self::frame(line) {
                coop.made_progress();
                return Poll::Ready(Some(frame));
            }
        }
    }

    /// What a whole line (newline included) holds; `None` for a blank
    /// one.
    fn frame(line: BytesMut) -> Option<Frame> {
        if line.len() > MAX_LINE + 1 {
            return Some(Cut::starting(&line[..line.len() - 1]).frame());
        }
        let bom = line.starts_with("\u{feff}".as_bytes());
        let text = if bom { &line[3..] } else { &line[..] };
        if text.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        // The message keeps the buffer it was read into as its text
        // (after a byte order mark, a copy).
        let parsed = if bom {
            Message::parse(text)
        } else {
            Message::parse_owned(Vec::from(line))
        };
        Some(match parsed {
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
#[cfg(test)]
pub(crate) mod tests {
    use std::task::Poll;

    use super::*;
    use tokio::io::AsyncWriteExt;
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
    pub(crate) struct Endless;

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

    /// Whether `reader`, spawned on a runtime of one thread, lets another
    /// task of it run (within 30 s).
    pub(crate) fn lets_others_run(reader: impl Future<Output = ()> + Send + 'static) -> bool {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            rt.block_on(async {
                tokio::spawn(reader);
                // The reader runs now: this task resumes only once it
                // yields.
                tokio::task::yield_now().await;
                let _ = done.send(());
            });
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(30))
            .is_ok()
    }

    #[test]
    fn a_reader_whose_peer_never_stops_sending_lets_other_tasks_run() {
        let reader = async {
            let mut lines = Lines::new(Stream(Endless));
            while lines.next().await.is_some() {}
        };
        assert!(
            lets_others_run(reader),
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
        assert_eq!(lines.next().await, Some(Frame::TooLong(None)));
        assert_eq!(lines.next().await, Some(ping()));
        assert!(lines.buffered() < MAX_LINE, "the long line was not kept");
        drop(writer.await.expect("writer"));
    }

    #[tokio::test]
    async fn an_oversized_message_is_reported_with_the_id_its_first_or_last_bytes_tell() {
        let filler = "y".repeat(MAX_LINE + 10);
        for (line, id) in [
            // as most servers write an answer
            (
                format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"text":"{filler}"}}}}"#),
                Some("7"),
            ),
            // as the TypeScript SDK does: the id last
            (
                format!(r#"{{"result":{{"text":"{filler}"}},"jsonrpc":"2.0","id":"a\"b"}}"#),
                Some(r#""a\"b""#),
            ),
            (
                format!(r#"{{ "result" : "{filler}" , "id" : -3 }}"#),
                Some("-3"),
            ),
            // an id nested deeper is not the message's
            (
                format!(r#"{{"result":{{"id":5,"text":"{filler}"}}}}"#),
                None,
            ),
            (
                format!(r#"{{"result":{{"text":"{filler}","id":5}}}}"#),
                None,
            ),
            (format!(r#"{{"id":true,"result":"{filler}"}}"#), None),
        ] {
            let (mut lines, mut w) = rig();
            let writer = tokio::spawn(async move {
                w.write_all(format!("{line}\n{PING}\n").as_bytes())
                    .await
                    .expect("write");
                w
            });
            let Some(Frame::TooLong(got)) = lines.next().await else {
                panic!("not too long");
            };
            assert_eq!(got.as_ref().map(RequestId::as_json), id);
            assert_eq!(lines.next().await, Some(ping()));
            drop(writer.await.expect("writer"));
        }
    }
}
