//! The I/O of host sessions (DESIGN §8): how a host reaches its unit's
//! session task ([`HostLink`]: a socket, or its own stdio handed over by
//! `mcpctl bridge`), how its messages are written ([`HostOut`], each an
//! [`Outbox`]: what the descriptor takes at once, the rest queued up to a
//! bound), and the readers the session task polls itself ([`Reader`]: a
//! host's lines, or the upstream's messages, each polled only once its
//! descriptor woke it, and stopped by dropping its [`StopReading`]).
//!
//! Nothing here decides anything about MCP: the session task
//! (`supervisor::sessions`) and its pure core ([`super::session`]) do.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::task::AtomicWaker;
use serde_json::Value;
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf, pipe};

use super::ledger::Ledger;
use super::outbox::TryWrite;
use super::route::HostId;
use super::wire::{Frame, Incoming, Lines, Outbox, Receiver, Refused, Source};

/// A generation of the unit's server, as the supervisor numbers them.
pub type Generation = u64;

/// How a host session reaches its host.
#[derive(Debug)]
pub enum HostLink {
    /// One stream socket both ways (D-Bus `Attach`, or the attach socket
    /// without descriptors). `pending`: bytes of the host's already read,
    /// which come first.
    Socket {
        stream: UnixStream,
        pending: Vec<u8>,
    },
    /// The host's own stdin and stdout, handed over by `mcpctl bridge`
    /// (`mux::attach`): nothing copies the session's bytes on the way.
    /// `control` is the bridge's socket: the host's `initialize` and the
    /// session's end are told on it, and its closing ends the session.
    /// `replay`: an `initialize` of an earlier session, handled first and
    /// not answered. `ledger`: where the host's requests in flight are
    /// recorded for the bridge (`mux::ledger`), when it could be made.
    Stdio {
        input: HostInput,
        output: HostOutput,
        control: UnixStream,
        replay: Option<Value>,
        pending: Vec<u8>,
        ledger: Option<Box<Ledger>>,
    },
    /// One end of an in-memory pair ([`super::memory`]): another task of
    /// the daemon is the host (an aggregate's member session).
    Memory(super::memory::End),
    /// A host in the daemon with no task of its own (an HTTP session,
    /// `endpoint::session`): its messages are read from `read` (one
    /// direction of [`super::memory`]), and what the session writes to
    /// it is handed to `deliver` by the writing task, as it is written.
    Direct {
        read: super::memory::Reader,
        deliver: Arc<dyn Deliver>,
    },
    /// A [`HostLink::Memory`] or [`HostLink::Direct`] whose first bytes
    /// were read ahead ([`HostLink::peek`]): they come first.
    Peeked(Box<HostLink>, Vec<u8>),
}

/// A host that takes what its session writes on the writing task itself
/// ([`HostLink::Direct`]): no buffer, reader or task wake-up between the
/// unit's session and it.
pub trait Deliver: Send + Sync + std::fmt::Debug + 'static {
    /// Whole lines the session writes to the host, in order. An error:
    /// the host is gone, as a closed socket's write fails.
    fn deliver(&self, lines: &[u8]) -> std::io::Result<()>;
    /// The session's writer was shut down or dropped: its session with
    /// the host is over. Called at least once; more calls do nothing.
    fn end(&self);
}

/// The writer of a [`Deliver`] host: takes everything at once.
#[derive(Debug)]
pub struct Direct(Arc<dyn Deliver>);

impl TryWrite for Direct {
    fn try_write(&self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.deliver(bytes).map(|()| bytes.len())
    }

    async fn writable(&self) -> std::io::Result<()> {
        Ok(())
    }

    fn shutdown(&self) {
        self.0.end();
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A host's link opened for its session: its reader (for the session
/// task's set of readers), what stops it, its writer, and what the
/// bridge handed over besides.
#[derive(Debug)]
pub struct Opened {
    pub reader: Reader,
    /// Dropped with the host: stops its reader.
    pub stop: StopReading,
    /// Holds its reader back, and lets it go ([`HoldReading::hold`]).
    pub hold: HoldReading,
    pub out: HostOut,
    /// The bridge's socket, for a host whose stdio was handed over: what
    /// the session tells the bridge (`Control` lines) is written here.
    pub control: Option<Outbox<OwnedWriteHalf>>,
    /// An `initialize` of an earlier session, to handle first, unanswered.
    pub replay: Option<Value>,
    pub ledger: Option<Box<Ledger>>,
}

impl HostLink {
    /// Whether the host can be made to wait by reading it no more: its
    /// link is a descriptor, whose writer then blocks (a socket, a
    /// bridge's stdio), or an in-memory pair, whose writer then queues
    /// (an aggregate's member session: the aggregate holds its own host
    /// back while that queue is long, `src/aggregate.rs`). An HTTP
    /// session ([`HostLink::Direct`]) is not held back: what it sends
    /// past its share is shed (`mux::session::toward`).
    pub fn pausable(&self) -> bool {
        match self {
            HostLink::Socket { .. } | HostLink::Stdio { .. } | HostLink::Memory(_) => true,
            HostLink::Direct { .. } => false,
            HostLink::Peeked(link, _) => link.pausable(),
        }
    }

    /// Opens the link for host session `host`: what is written to the
    /// host is queued up to `queue` messages and `bytes` bytes behind the
    /// one being written (to its bridge, up to `queue` messages).
    pub fn open(self, host: HostId, queue: usize, bytes: usize) -> Opened {
        self.open_after(host, queue, bytes, Vec::new())
    }

    /// [`open`](Self::open), the host's bytes `before` read ahead.
    fn open_after(self, host: HostId, queue: usize, bytes: usize, before: Vec<u8>) -> Opened {
        let (source, pending, watch, out, control, replay, ledger) = match self {
            HostLink::Peeked(link, pending) => return link.open_after(host, queue, bytes, pending),
            HostLink::Socket { stream, pending } => {
                let (read, write) = stream.into_split();
                (
                    HostSource::Half(read),
                    pending,
                    None,
                    HostOut::Half(Outbox::new(write, queue, None).bounded_in_bytes(bytes)),
                    None,
                    None,
                    None,
                )
            }
            HostLink::Memory(end) => (
                HostSource::Memory(end.read),
                before,
                None,
                HostOut::Memory(Outbox::new(end.write, queue, None).bounded_in_bytes(bytes)),
                None,
                None,
                None,
            ),
            HostLink::Direct { read, deliver } => (
                HostSource::Memory(read),
                before,
                None,
                HostOut::Direct(Outbox::new(Direct(deliver), queue, None)),
                None,
                None,
                None,
            ),
            HostLink::Stdio {
                input,
                output,
                control,
                replay,
                pending,
                ledger,
            } => {
                let (watch, control) = control.into_split();
                let source = match input {
                    HostInput::Pipe(p) => HostSource::Pipe(p),
                    HostInput::Socket(s) => HostSource::Socket(s),
                };
                let out = match output {
                    HostOutput::Pipe(p) => {
                        HostOut::Pipe(Outbox::new(p, queue, None).bounded_in_bytes(bytes))
                    }
                    HostOutput::Socket(s) => {
                        HostOut::Socket(Outbox::new(s, queue, None).bounded_in_bytes(bytes))
                    }
                };
                (
                    source,
                    pending,
                    Some(watch),
                    out,
                    Some(Outbox::new(control, queue, None)),
                    replay,
                    ledger,
                )
            }
        };
        let stop = Arc::new(Stop::default());
        let held = Arc::new(Stop::default());
        let reader = Reader::Host(HostReader {
            host,
            lines: Lines::with_pending(source, pending),
            control: watch.map(Watched::new),
            stop: Arc::clone(&stop),
            held: Arc::clone(&held),
            ended: false,
        });
        Opened {
            reader,
            stop: StopReading(stop),
            hold: HoldReading(held),
            out,
            control,
            replay,
            ledger,
        }
    }
}

impl HostLink {
    /// The host's first line (its newline included; at most
    /// [`MAX_LINE`](super::wire::MAX_LINE) bytes), read ahead within
    /// `within`, and the link that still yields it first: how a unit
    /// learns the era a host opens with before it picks the upstream that
    /// serves it (DESIGN §12, lanes). Empty: the host sent no whole line
    /// in time, or closed. A handed-over bridge's replayed `initialize`
    /// is its first line.
    pub async fn peek(self, within: std::time::Duration) -> (HostLink, Vec<u8>) {
        let deadline = tokio::time::Instant::now() + within;
        match self {
            HostLink::Socket {
                mut stream,
                pending,
            } => {
                let (line, pending) = read_line(&mut stream, pending, deadline).await;
                (HostLink::Socket { stream, pending }, line)
            }
            HostLink::Stdio {
                mut input,
                output,
                control,
                replay,
                pending,
                ledger,
            } => {
                let (line, pending) = match &replay {
                    Some(replay) => (super::lines::line(replay), pending),
                    None => match &mut input {
                        HostInput::Pipe(p) => read_line(p, pending, deadline).await,
                        HostInput::Socket(s) => read_line(s, pending, deadline).await,
                    },
                };
                let link = HostLink::Stdio {
                    input,
                    output,
                    control,
                    replay,
                    pending,
                    ledger,
                };
                (link, line)
            }
            HostLink::Memory(mut end) => {
                let (line, pending) = read_line(&mut end.read, Vec::new(), deadline).await;
                (
                    HostLink::Peeked(Box::new(HostLink::Memory(end)), pending),
                    line,
                )
            }
            HostLink::Direct { mut read, deliver } => {
                let (line, pending) = read_line(&mut read, Vec::new(), deadline).await;
                let link = HostLink::Direct { read, deliver };
                (HostLink::Peeked(Box::new(link), pending), line)
            }
            HostLink::Peeked(link, pending) => {
                let line = first_line(&pending).to_vec();
                (HostLink::Peeked(link, pending), line)
            }
        }
    }
}

/// The first whole line of `bytes` (empty: none).
fn first_line(bytes: &[u8]) -> &[u8] {
    memchr::memchr(b'\n', bytes).map_or(&[], |end| &bytes[..=end])
}

/// Reads `source` behind `pending` until a whole line is there, it holds
/// [`MAX_LINE`](super::wire::MAX_LINE) bytes, the source ends or fails, or
/// `deadline` passes: that first line (empty if none), and every byte read
/// (`pending` first), to be read again.
async fn read_line<S: Source>(
    source: &mut S,
    pending: Vec<u8>,
    deadline: tokio::time::Instant,
) -> (Vec<u8>, Vec<u8>) {
    let mut buf = tokio_util::bytes::BytesMut::from(&pending[..]);
    while memchr::memchr(b'\n', &buf).is_none() && buf.len() < super::wire::MAX_LINE {
        match tokio::time::timeout_at(deadline, source.fill(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => break,
        }
    }
    let line = first_line(&buf).to_vec();
    (line, buf.to_vec())
}

/// The host's stdin as handed over.
#[derive(Debug)]
pub enum HostInput {
    Pipe(pipe::Receiver),
    Socket(UnixStream),
}

/// The host's stdout as handed over.
#[derive(Debug)]
pub enum HostOutput {
    Pipe(pipe::Sender),
    Socket(UnixStream),
}

/// Where a host's messages are written.
#[derive(Debug)]
pub enum HostOut {
    Half(Outbox<OwnedWriteHalf>),
    Socket(Outbox<UnixStream>),
    Pipe(Outbox<pipe::Sender>),
    Memory(Outbox<super::memory::Writer>),
    Direct(Outbox<Direct>),
}

impl HostOut {
    pub fn send(&self, bytes: Vec<u8>) -> Result<(), Refused> {
        match self {
            HostOut::Half(out) => out.send(bytes),
            HostOut::Socket(out) => out.send(bytes),
            HostOut::Pipe(out) => out.send(bytes),
            HostOut::Memory(out) => out.send(bytes),
            HostOut::Direct(out) => out.send(bytes),
        }
    }

    /// [`HostOut::send`] of bytes the caller keeps (copied if they wait).
    pub fn send_slice(&self, bytes: &[u8]) -> Result<(), Refused> {
        match self {
            HostOut::Half(out) => out.send_slice(bytes),
            HostOut::Socket(out) => out.send_slice(bytes),
            HostOut::Pipe(out) => out.send_slice(bytes),
            HostOut::Memory(out) => out.send_slice(bytes),
            HostOut::Direct(out) => out.send_slice(bytes),
        }
    }

    /// Messages and bytes waiting to be written to the host.
    pub fn backlog(&self) -> (usize, usize) {
        match self {
            HostOut::Half(out) => out.backlog(),
            HostOut::Socket(out) => out.backlog(),
            HostOut::Pipe(out) => out.backlog(),
            HostOut::Memory(out) => out.backlog(),
            HostOut::Direct(out) => out.backlog(),
        }
    }

    /// Wakes `drained` each time a message that waited has been written
    /// to the host (whoever holds back what feeds it: an aggregate's
    /// host, while a member's session reads it no more).
    pub fn notify_drained(self, drained: Arc<tokio::sync::Notify>) -> Self {
        match self {
            HostOut::Half(out) => HostOut::Half(out.notify_drained(drained)),
            HostOut::Socket(out) => HostOut::Socket(out.notify_drained(drained)),
            HostOut::Pipe(out) => HostOut::Pipe(out.notify_drained(drained)),
            HostOut::Memory(out) => HostOut::Memory(out.notify_drained(drained)),
            HostOut::Direct(out) => HostOut::Direct(out.notify_drained(drained)),
        }
    }

    /// Its writer task, to wait for what is queued to be written.
    pub fn writer(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        match self {
            HostOut::Half(out) => out.take_writer(),
            HostOut::Socket(out) => out.take_writer(),
            HostOut::Pipe(out) => out.take_writer(),
            HostOut::Memory(out) => out.take_writer(),
            HostOut::Direct(out) => out.take_writer(),
        }
    }

    /// The host sees the session end now (a handed-over pipe ends once
    /// what was queued is written and the bridge exits).
    pub fn shutdown(&self) {
        match self {
            HostOut::Half(out) => out.shutdown(),
            HostOut::Socket(out) => out.shutdown(),
            HostOut::Memory(out) => out.shutdown(),
            HostOut::Direct(out) => out.shutdown(),
            HostOut::Pipe(_) => {}
        }
    }
}

/// Stops a host's reader when dropped (with its host): its descriptors
/// close once the session task next polls the readers (which this wakes).
#[derive(Debug)]
pub struct StopReading(Arc<Stop>);

impl Drop for StopReading {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::Release);
        self.0.waker.wake();
    }
}

/// Holds a host's reader back: while held, what the host sends is not
/// read (it waits in the descriptor, and then in the host's own writes),
/// though its end and its bridge's are still seen.
#[derive(Debug)]
pub struct HoldReading(Arc<Stop>);

impl HoldReading {
    /// Holds the reader back (`true`), or lets it go (and wakes it).
    pub fn hold(&self, on: bool) {
        self.0.stopped.store(on, Ordering::Release);
        if !on {
            self.0.waker.wake();
        }
    }
}

#[derive(Debug, Default)]
pub struct Stop {
    stopped: std::sync::atomic::AtomicBool,
    waker: AtomicWaker,
}

impl Stop {
    /// Whether its reader is stopped; if not, `cx` is woken when it is.
    fn stopped(&self, cx: &std::task::Context<'_>) -> bool {
        self.waker.register(cx.waker());
        self.stopped.load(Ordering::Acquire)
    }
}

/// What a host's stdin or socket is, to read it.
#[derive(Debug)]
pub enum HostSource {
    Pipe(pipe::Receiver),
    Socket(UnixStream),
    Half(OwnedReadHalf),
    Memory(super::memory::Reader),
}

impl Source for HostSource {
    fn poll_fill(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio_util::bytes::BytesMut,
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self {
            HostSource::Pipe(p) => p.poll_fill(cx, buf),
            HostSource::Socket(s) => s.poll_fill(cx, buf),
            HostSource::Half(h) => h.poll_fill(cx, buf),
            HostSource::Memory(m) => m.poll_fill(cx, buf),
        }
    }
}

/// One host's messages, read by the session task: `Some(frame)` for each
/// line, then `None` once (the host closed its end, or its bridge's
/// socket closed), and then nothing.
#[derive(Debug)]
pub struct HostReader {
    host: HostId,
    lines: Lines<HostSource>,
    /// The bridge's socket, for a host whose stdio was handed over: it
    /// only listens, so anything read on it (its end) ends the session.
    control: Option<Watched>,
    stop: Arc<Stop>,
    /// Held back while set ([`HoldReading`]).
    held: Arc<Stop>,
    ended: bool,
}

/// The bridge's socket, polled only once it woke the reader: with a
/// waker of its own, which says so (a poll of its readiness for every
/// message the host sent cost more than the message's routing).
#[derive(Debug)]
struct Watched {
    half: OwnedReadHalf,
    wake: Arc<WatchWake>,
    waker: std::task::Waker,
}

#[derive(Debug, Default)]
struct WatchWake {
    /// The socket woke it since it was last polled.
    woken: std::sync::atomic::AtomicBool,
    /// The task reading the host.
    task: AtomicWaker,
}

impl std::task::Wake for WatchWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Watched {
    fn new(half: OwnedReadHalf) -> Self {
        let wake = Arc::new(WatchWake::default());
        // Polled first to register its waker.
        wake.woken.store(true, Ordering::Release);
        let waker = std::task::Waker::from(Arc::clone(&wake));
        Self { half, wake, waker }
    }
}

impl HostReader {
    /// Its next line: `Event::Host(host, None)` at its end.
    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Event>> {
        use std::task::Poll;
        if self.ended || self.stop.stopped(cx) {
            return Poll::Ready(None);
        }
        if self.poll_bridge_gone(cx) {
            self.ended = true;
            return Poll::Ready(Some(Event::Host(self.host, None)));
        }
        if self.held.stopped(cx) {
            // Woken when let go.
            return Poll::Pending;
        }
        let frame = std::task::ready!(self.lines.poll_next(cx));
        self.ended = frame.is_none();
        Poll::Ready(Some(Event::Host(self.host, frame)))
    }

    /// Whether the bridge's socket closed (or sent what it must not).
    fn poll_bridge_gone(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let Some(watched) = &self.control else {
            return false;
        };
        watched.wake.task.register(cx.waker());
        if !watched.wake.woken.swap(false, Ordering::AcqRel) {
            // Its readiness is as it was when last polled: not ready.
            return false;
        }
        let control = &watched.half;
        let stream: &UnixStream = control.as_ref();
        let mut own = std::task::Context::from_waker(&watched.waker);
        let mut scratch = [0u8; 64];
        loop {
            match stream.poll_read_ready(&mut own) {
                std::task::Poll::Pending => return false,
                std::task::Poll::Ready(Err(_)) => return true,
                std::task::Poll::Ready(Ok(())) => {}
            }
            match control.try_read(&mut scratch) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                _ => return true,
            }
        }
    }
}

/// What a reader read.
#[derive(Debug)]
pub enum Event {
    /// A host's line, or its end (`None`).
    Host(HostId, Option<Frame>),
    /// What the upstream of generation `Generation` sent, or its end (`None`).
    /// With it, how many lines that were not messages it read before,
    /// and why the last was not.
    Server(Generation, Option<Incoming>, Option<(u64, String)>),
}

/// A reader polled by the session task.
#[derive(Debug)]
pub enum Reader {
    Host(HostReader),
    Server(ServerReader),
}

impl Reader {
    /// A reader of generation `generation`'s upstream messages, and what
    /// stops it.
    pub fn server(generation: Generation, rx: Receiver) -> (Self, StopReading) {
        let stop = Arc::new(Stop::default());
        let reader = Reader::Server(ServerReader {
            generation,
            rx,
            stop: Arc::clone(&stop),
            ended: false,
        });
        (reader, StopReading(stop))
    }

    /// The lines a host's reader has read (a read may bring several) and
    /// not yielded yet, into `into`; no I/O.
    pub fn buffered(&mut self, into: &mut Vec<(HostId, Frame)>) {
        if let Reader::Host(reader) = self {
            while let Some(frame) = reader.lines.buffered_frame() {
                into.push((reader.host, frame));
            }
        }
    }
}

impl futures_util::Stream for Reader {
    type Item = Event;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Event>> {
        match self.get_mut() {
            Reader::Host(host) => host.poll_next(cx),
            Reader::Server(server) => server.poll_next(cx),
        }
    }
}

/// The upstream's messages (`Wire::rx`), read by the session task until
/// its generation is let go.
#[derive(Debug)]
pub struct ServerReader {
    generation: Generation,
    rx: Receiver,
    stop: Arc<Stop>,
    ended: bool,
}

impl ServerReader {
    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Event>> {
        use std::task::Poll;
        if self.ended || self.stop.stopped(cx) {
            return Poll::Ready(None);
        }
        let incoming = std::task::ready!(self.rx.poll_recv(cx));
        self.ended = incoming.is_none();
        let garbage = self.rx.take_garbage();
        Poll::Ready(Some(Event::Server(self.generation, incoming, garbage)))
    }
}

/// The readers of one session task, polled as one stream: each only once
/// its descriptor (or its stop) woke it, as `futures_util`'s `SelectAll`
/// polls them, but with a waker made once per reader, where `SelectAll`
/// allocated a task (and a waker for the descriptor to clone) for every
/// message a reader yielded.
#[derive(Debug, Default)]
pub struct Readers {
    /// A reader's index is its waker's; a freed slot is used again.
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    ready: Arc<Ready>,
    len: usize,
    /// Of the first 64 slots, those woken and not yet polled, taken
    /// from `Ready::bits` at once.
    taken: u64,
}

#[derive(Debug)]
struct Slot {
    reader: Reader,
    wake: Arc<SlotWake>,
    waker: std::task::Waker,
}

/// The readers woken since they were last polled, and the task polling
/// them.
#[derive(Debug, Default)]
struct Ready {
    /// The first 64 slots (a session's upstream and its first hosts), a
    /// bit each: a wake is one atomic `or`.
    bits: std::sync::atomic::AtomicU64,
    /// The indices of the other slots, each once at most (a slot's
    /// `queued`): at most one per slot.
    queue: std::sync::Mutex<std::collections::VecDeque<usize>>,
    /// How many `queue` holds, read without its lock.
    queued: AtomicUsize,
    task: AtomicWaker,
}

/// One reader's waker.
#[derive(Debug)]
struct SlotWake {
    index: usize,
    /// In `queue` now (of a slot past the first 64).
    queued: std::sync::atomic::AtomicBool,
    ready: Arc<Ready>,
}

impl std::task::Wake for SlotWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.enqueue();
        self.ready.task.wake();
    }
}

impl SlotWake {
    fn enqueue(&self) {
        if self.index < 64 {
            self.ready.bits.fetch_or(1 << self.index, Ordering::AcqRel);
        } else if !self.queued.swap(true, Ordering::AcqRel)
            && let Ok(mut queue) = self.ready.queue.lock()
        {
            queue.push_back(self.index);
            self.ready.queued.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Readers polled in one call of [`Readers::poll_next`] before it yields
/// to the other tasks (a reader that is always ready, as `SelectAll`
/// bounds it).
const POLLS: usize = 32;

impl Readers {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Adds `reader`, to be polled at once.
    pub fn push(&mut self, reader: Reader) {
        let index = self.free.pop().unwrap_or(self.slots.len());
        let wake = Arc::new(SlotWake {
            index,
            queued: std::sync::atomic::AtomicBool::new(false),
            ready: Arc::clone(&self.ready),
        });
        let waker = std::task::Waker::from(Arc::clone(&wake));
        wake.enqueue();
        let slot = Some(Slot {
            reader,
            wake,
            waker,
        });
        if index == self.slots.len() {
            self.slots.push(slot);
        } else {
            self.slots[index] = slot;
        }
        self.len += 1;
        self.ready.task.wake();
    }

    /// Every reader.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Reader> {
        self.slots.iter_mut().flatten().map(|s| &mut s.reader)
    }

    /// The next event of a woken reader; `None` when there are no readers
    /// (a reader that ended is dropped).
    pub fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Event>> {
        use std::task::Poll;
        if self.len == 0 {
            return Poll::Ready(None);
        }
        self.ready.task.register(cx.waker());
        for _ in 0..POLLS {
            let Some(index) = self.next_woken() else {
                return Poll::Pending;
            };
            let Some(slot) = self.slots.get_mut(index).and_then(Option::as_mut) else {
                continue;
            };
            // Woken again while it is polled: polled again.
            slot.wake.queued.store(false, Ordering::Release);
            let mut own = std::task::Context::from_waker(&slot.waker);
            match futures_util::Stream::poll_next(std::pin::Pin::new(&mut slot.reader), &mut own) {
                Poll::Ready(Some(event)) => {
                    // It may have more read already.
                    slot.wake.enqueue();
                    return Poll::Ready(Some(event));
                }
                Poll::Ready(None) => {
                    self.slots[index] = None;
                    self.free.push(index);
                    self.len -= 1;
                    if self.len == 0 {
                        return Poll::Ready(None);
                    }
                }
                Poll::Pending => {}
            }
        }
        // Readers always ready: the other tasks run first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// A woken reader's index: of those taken of the first 64, the
    /// lowest; once they are all polled, one of the others, then the
    /// first 64's woken since (so that neither waits for the other).
    fn next_woken(&mut self) -> Option<usize> {
        loop {
            if self.taken != 0 {
                let index = self.taken.trailing_zeros() as usize;
                self.taken &= self.taken - 1;
                return Some(index);
            }
            if self.ready.queued.load(Ordering::Acquire) > 0
                && let Ok(mut queue) = self.ready.queue.lock()
                && let Some(index) = queue.pop_front()
            {
                self.ready.queued.fetch_sub(1, Ordering::AcqRel);
                return Some(index);
            }
            self.taken = self.ready.bits.swap(0, Ordering::AcqRel);
            if self.taken == 0 {
                return None;
            }
        }
    }

    /// [`Readers::poll_next`], waiting.
    pub fn next_event(&mut self) -> impl Future<Output = Option<Event>> + '_ {
        std::future::poll_fn(move |cx| self.poll_next(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mux::wire::{Stream, Wire};
    use tokio::io::AsyncWriteExt;

    /// A reader of the upstream of generation `generation`, and the
    /// server's end of its stdout.
    fn server(generation: Generation) -> (Reader, StopReading, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(4096);
        let wire = Wire::lines(Stream(ours), tokio::io::sink());
        let (reader, stop) = Reader::server(generation, wire.rx);
        (reader, stop, theirs)
    }

    fn generation_of(event: Option<Event>) -> (Generation, bool) {
        match event {
            Some(Event::Server(generation, incoming, _)) => (generation, incoming.is_some()),
            other => panic!("not a server's event: {other:?}"),
        }
    }

    /// Every line host session `link` yields once opened, until `n`.
    async fn lines_of(link: HostLink, n: usize) -> Vec<String> {
        let mut readers = Readers::new();
        let opened = link.open(7, 16, 1 << 20);
        readers.push(opened.reader);
        let mut lines = Vec::new();
        while lines.len() < n {
            match readers.next_event().await {
                Some(Event::Host(7, Some(Frame::Message(m)))) => {
                    lines.push(m.method().unwrap_or_default().into_owned());
                }
                other => panic!("not a host's line: {other:?}"),
            }
        }
        lines
    }

    const A: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"}\n";
    const B: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"b\"}\n";

    #[tokio::test]
    async fn peek_reads_the_first_line_ahead_and_the_session_still_reads_it_first() {
        let within = std::time::Duration::from_secs(30);
        // In memory: the first line, split over two writes, and one after.
        let (host, theirs) = crate::mux::memory::pair(1 << 16);
        host.write.try_write(&A[..10]).expect("write");
        let written = tokio::spawn(async move {
            tokio::task::yield_now().await;
            host.write.try_write(&A[10..]).expect("write");
            host.write.try_write(B).expect("write");
            host
        });
        let (link, line) = HostLink::Memory(theirs).peek(within).await;
        assert_eq!(line, A);
        let _host = written.await.expect("writer");
        assert_eq!(lines_of(link, 2).await, ["a", "b"]);
        // A socket whose pending bytes hold the first line already: read
        // from there, the rest after.
        let (ours, mut host) = UnixStream::pair().expect("pair");
        let mut pending = A.to_vec();
        pending.extend_from_slice(&B[..5]);
        host.write_all(&B[5..]).await.expect("write");
        let link = HostLink::Socket {
            stream: ours,
            pending,
        };
        let (link, line) = link.peek(within).await;
        assert_eq!(line, A);
        // Peeked twice: the same line.
        let (link, again) = match link {
            HostLink::Socket { stream, pending } => {
                HostLink::Socket { stream, pending }.peek(within).await
            }
            other => panic!("not a socket: {other:?}"),
        };
        assert_eq!(again, A);
        assert_eq!(lines_of(link, 2).await, ["a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn peek_gives_up_at_its_deadline_or_the_hosts_end_and_loses_nothing() {
        // Half a line, then nothing: no line within the bound.
        let (host, theirs) = crate::mux::memory::pair(1 << 16);
        host.write.try_write(&A[..10]).expect("write");
        let (link, line) = HostLink::Memory(theirs)
            .peek(std::time::Duration::from_secs(30))
            .await;
        assert!(line.is_empty());
        host.write.try_write(&A[10..]).expect("write");
        assert_eq!(lines_of(link, 1).await, ["a"]);
        // A host that closes at once.
        let (host, theirs) = crate::mux::memory::pair(1 << 16);
        drop(host);
        let (_link, line) = HostLink::Memory(theirs)
            .peek(std::time::Duration::from_secs(30))
            .await;
        assert!(line.is_empty());
    }

    #[tokio::test]
    async fn readers_yield_what_each_reads_in_order_and_drop_those_that_end() {
        let mut readers = Readers::new();
        let (one, _stop_one, mut out_one) = server(1);
        let (two, stop_two, mut out_two) = server(2);
        readers.push(one);
        readers.push(two);
        assert_eq!(readers.len(), 2);
        out_two
            .write_all(
                b"{\"jsonrpc\":\"2.0\",\"method\":\"a\"}\n{\"jsonrpc\":\"2.0\",\"method\":\"b\"}\n",
            )
            .await
            .expect("write");
        for method in ["a", "b"] {
            match readers.next_event().await {
                Some(Event::Server(2, Some(Ok(m)), None)) => {
                    assert_eq!(m.method().as_deref(), Some(method));
                }
                other => panic!("not {method}: {other:?}"),
            }
        }
        out_one
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"c\"}\n")
            .await
            .expect("write");
        assert_eq!(generation_of(readers.next_event().await), (1, true));
        // Its end, then it is dropped.
        drop(out_one);
        assert_eq!(generation_of(readers.next_event().await), (1, false));
        // A stopped reader ends without an event: the set is empty.
        drop(stop_two);
        assert_eq!(readers.next_event().await.map(|_| ()), None);
        assert!(readers.is_empty());
        // A slot is used again.
        let (three, _stop_three, mut out_three) = server(3);
        readers.push(three);
        out_three
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"d\"}\n")
            .await
            .expect("write");
        assert_eq!(generation_of(readers.next_event().await), (3, true));
        assert_eq!(readers.len(), 1);
    }

    #[tokio::test]
    async fn readers_past_the_first_64_are_polled_once_woken_too() {
        let mut readers = Readers::new();
        let mut outs = Vec::new();
        let mut stops = Vec::new();
        for generation in 0..70 {
            let (reader, stop, out) = server(generation);
            readers.push(reader);
            stops.push(stop);
            outs.push(out);
        }
        for n in [66, 2, 69] {
            outs[n]
                .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"a\"}\n")
                .await
                .expect("write");
        }
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(generation_of(readers.next_event().await).0);
        }
        seen.sort();
        assert_eq!(seen, [2, 66, 69]);
        // Their ends, whichever slot.
        drop(outs.remove(67));
        drop(outs.remove(1));
        let mut ended = Vec::new();
        for _ in 0..2 {
            ended.push(generation_of(readers.next_event().await));
        }
        ended.sort();
        assert_eq!(ended, [(1, false), (67, false)]);
    }

    /// A server that always has more messages ready.
    use crate::mux::lines::tests::{Endless, lets_others_run};

    #[test]
    fn readers_that_are_always_ready_let_other_tasks_run() {
        let readers = async {
            let mut readers = Readers::new();
            let mut stops = Vec::new();
            for generation in 0..3 {
                let wire = Wire::lines(Stream(Endless), tokio::io::sink());
                let (reader, stop) = Reader::server(generation, wire.rx);
                readers.push(reader);
                stops.push(stop);
            }
            while readers.next_event().await.is_some() {}
        };
        assert!(
            lets_others_run(readers),
            "the readers never yielded to another task"
        );
    }
}
