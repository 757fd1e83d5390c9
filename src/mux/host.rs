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
use std::sync::atomic::Ordering;

use futures_util::task::AtomicWaker;
use serde_json::Value;
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf, pipe};

use super::ledger::Ledger;
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
}

/// A host's link opened for its session: its reader (for the session
/// task's set of readers), what stops it, its writer, and what the
/// bridge handed over besides.
#[derive(Debug)]
pub struct Opened {
    pub reader: Reader,
    /// Dropped with the host: stops its reader.
    pub stop: StopReading,
    pub out: HostOut,
    /// The bridge's socket, for a host whose stdio was handed over: what
    /// the session tells the bridge (`Control` lines) is written here.
    pub control: Option<Outbox<OwnedWriteHalf>>,
    /// An `initialize` of an earlier session, to handle first, unanswered.
    pub replay: Option<Value>,
    pub ledger: Option<Box<Ledger>>,
}

impl HostLink {
    /// Opens the link for host session `host`: what is written to the
    /// host is queued up to `queue` messages and `bytes` bytes behind the
    /// one being written (to its bridge, up to `queue` messages).
    pub fn open(self, host: HostId, queue: usize, bytes: usize) -> Opened {
        let (source, pending, watch, out, control, replay, ledger) = match self {
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
                Vec::new(),
                None,
                HostOut::Memory(Outbox::new(end.write, queue, None).bounded_in_bytes(bytes)),
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
        let reader = Reader::Host(HostReader {
            host,
            lines: Lines::with_pending(source, pending),
            control: watch,
            stop: Arc::clone(&stop),
            ended: false,
        });
        Opened {
            reader,
            stop: StopReading(stop),
            out,
            control,
            replay,
            ledger,
        }
    }
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
}

impl HostOut {
    pub fn send(&self, bytes: Vec<u8>) -> Result<(), Refused> {
        match self {
            HostOut::Half(out) => out.send(bytes),
            HostOut::Socket(out) => out.send(bytes),
            HostOut::Pipe(out) => out.send(bytes),
            HostOut::Memory(out) => out.send(bytes),
        }
    }

    /// Messages and bytes waiting to be written to the host.
    pub fn backlog(&self) -> (usize, usize) {
        match self {
            HostOut::Half(out) => out.backlog(),
            HostOut::Socket(out) => out.backlog(),
            HostOut::Pipe(out) => out.backlog(),
            HostOut::Memory(out) => out.backlog(),
        }
    }

    /// Its writer task, to wait for what is queued to be written.
    pub fn writer(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        match self {
            HostOut::Half(out) => out.take_writer(),
            HostOut::Socket(out) => out.take_writer(),
            HostOut::Pipe(out) => out.take_writer(),
            HostOut::Memory(out) => out.take_writer(),
        }
    }

    /// The host sees the session end now (a handed-over pipe ends once
    /// what was queued is written and the bridge exits).
    pub fn shutdown(&self) {
        match self {
            HostOut::Half(out) => out.shutdown(),
            HostOut::Socket(out) => out.shutdown(),
            HostOut::Memory(out) => out.shutdown(),
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
    control: Option<OwnedReadHalf>,
    stop: Arc<Stop>,
    ended: bool,
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
        let frame = std::task::ready!(self.lines.poll_next(cx));
        self.ended = frame.is_none();
        Poll::Ready(Some(Event::Host(self.host, frame)))
    }

    /// Whether the bridge's socket closed (or sent what it must not).
    fn poll_bridge_gone(&mut self, cx: &mut std::task::Context<'_>) -> bool {
        let Some(control) = &self.control else {
            return false;
        };
        let stream: &UnixStream = control.as_ref();
        let mut scratch = [0u8; 64];
        loop {
            match stream.poll_read_ready(cx) {
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
