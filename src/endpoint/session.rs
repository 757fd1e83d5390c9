//! One HTTP session (MCP Streamable HTTP, 2025-11-25 sessions): the
//! state between the HTTP requests of one `Mcp-Session-Id` and a host
//! session of its unit (or aggregate), attached as every host's is
//! (`Supervisor::attach`, `aggregate::attach`), so the unit's routing,
//! bounds, eras and accounting are the bridge's. It has no task: the
//! request handlers write to the unit's session through one direction of
//! an in-memory pair (`mux::memory`), and the unit's session hands what
//! it writes back to the session on its own task
//! (`mux::host::HostLink::Direct`), which puts it on the stream it
//! concerns. Idle sessions end by one task of the endpoint's
//! ([`idle_sweep`]).
//!
//! Each POSTed request gets a stream (`Sink`): its answer ends it. An
//! answer that is the first thing its stream carries goes as a JSON line
//! ([`Item::Answer`]), which the HTTP side sends as one
//! `application/json` body (one write, no chunks; the spec lets a server
//! answer a request either way); anything before it makes the response an
//! SSE stream ([`Item::Event`]). What
//! the unit sends that is not an answer goes to the stream of the request
//! it concerns when the session can tell (a progress token), else to the
//! newest request's stream, else to the GET stream; with none open it is
//! dropped (the spec lets a server send only on open streams).
//!
//! Resumability (2025-11-25): every event of a session's SSE streams has
//! an id, `STREAM-SEQ` (the stream's number in the session, the event's
//! number in the session), and is kept in a bounded per-session buffer
//! ([`Replay`]: the newest [`REPLAY_EVENTS`] events within
//! [`REPLAY_BYTES`]). A stream queues what its client has not read yet
//! within [`STREAM_QUEUE`] messages and [`STREAM_BYTES`] (a burst of a
//! thousand progress notifications in one pipe read is queued whole; a
//! client that reads nothing loses its connection at the write
//! deadline). A stream whose client goes or is past those bounds is
//! detached, not ended: what it would carry is numbered and kept, and a
//! GET with `Last-Event-ID` replays that stream's events after the id and
//! then carries the stream on (the GET stream, or a request's stream
//! until its answer). A detached request's answer is kept apart from the
//! events, so no flood pushes it out ([`KEPT_ANSWERS`] within
//! [`KEPT_ANSWER_BYTES`] per session). What fell out of the buffer is
//! lost, and the log says so. Each SSE response starts with a
//! priming event (SEP-1699: the id to resume from, empty data, a `retry:`
//! field; `endpoint::modern::priming`), so a client can resume a stream
//! that broke before its first message.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::mux::error::ErrorCode;
use crate::mux::host::{Deliver, Event, HostLink, HostOut};
use crate::mux::lines::Frame;
use crate::mux::message::{Message, RequestId};
use crate::mux::method::Method;

/// What one HTTP response stream holds for a client that has not read it
/// yet: past [`STREAM_QUEUE`] messages or [`STREAM_BYTES`] (one message
/// larger than that goes alone) the stream is detached, its events kept
/// for a resume. A client that reads nothing for `read_timeout` loses
/// its connection (`endpoint::conn::Stalled`), which detaches it too: a
/// stream waits for a slow reader within bytes and time, and a burst the
/// unit delivers at once (one pipe read) is queued whole.
pub const STREAM_QUEUE: usize = 4096;
pub const STREAM_BYTES: usize = 4 << 20;
/// Requests of one session in flight at once (as a unit's host session).
pub const MAX_IN_FLIGHT: usize = 1024;
/// A session with no request in flight and no GET stream for this long
/// ends (a client that never sends DELETE does not hold a slot forever).
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// Events a session keeps for a client that reconnects with
/// `Last-Event-ID`, and the bytes they may take (an event larger than
/// that is sent but not kept).
pub const REPLAY_EVENTS: usize = 128;
pub const REPLAY_BYTES: usize = 512 << 10;
/// Answers a session keeps for streams whose client is away (apart from
/// the events: always kept for a resume, within these bounds).
pub const KEPT_ANSWERS: usize = MAX_IN_FLIGHT;
pub const KEPT_ANSWER_BYTES: usize = 32 << 20;
/// What the direction from an HTTP session to its unit's session holds
/// before its writer queues (as the aggregate's members).
pub const PAIR_BUFFER: usize = 256 << 10;
/// What is queued for the unit, as the aggregate queues for a member.
const QUEUE: usize = 4096;
const QUEUE_BYTES: usize = 32 << 20;

/// What goes to one response stream.
#[derive(Debug)]
pub enum Item {
    /// A request's answer that nothing came before on its stream: a JSON
    /// line, sent as one `application/json` body. Never kept for
    /// resuming: a client can resume only a stream it had an event of.
    Answer(Bytes),
    /// An SSE event ([`event`]): the response is (or goes on as) an SSE
    /// stream.
    Event(Bytes),
}

impl Item {
    /// The answer `line` of a request whose stream carried something
    /// before it (`sent`) as an event without an id, else as the answer.
    fn answer(sent: bool, line: Bytes) -> Self {
        if sent {
            Item::Event(event(None, &line))
        } else {
            Item::Answer(line)
        }
    }

    /// As an SSE stream carries it.
    pub fn into_event(self) -> Bytes {
        match self {
            Item::Answer(line) => event(None, &line),
            Item::Event(event) => event,
        }
    }
}

impl Item {
    fn len(&self) -> usize {
        match self {
            Item::Answer(b) | Item::Event(b) => b.len(),
        }
    }
}

/// Where one stream's messages go: queued for its response within
/// [`STREAM_QUEUE`] messages and [`STREAM_BYTES`].
#[derive(Debug, Clone)]
pub struct Sink {
    tx: mpsc::Sender<Item>,
    queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// What a stream's response reads: the other end of a [`Sink`].
#[derive(Debug)]
pub struct Stream {
    rx: mpsc::Receiver<Item>,
    queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A response stream: where its messages go, and where they are read.
pub fn stream() -> (Sink, Stream) {
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    let queued = std::sync::Arc::default();
    (
        Sink {
            tx,
            queued: std::sync::Arc::clone(&queued),
        },
        Stream { rx, queued },
    )
}

impl Sink {
    /// Queues `item` unless its client went or it would hold more than
    /// its bounds; `Err` gives it back.
    pub fn try_send(&self, item: Item) -> Result<(), Item> {
        use std::sync::atomic::Ordering;
        let len = item.len();
        let queued = self.queued.load(Ordering::Acquire);
        if queued > 0 && queued + len > STREAM_BYTES {
            return Err(item);
        }
        self.queued.fetch_add(len, Ordering::AcqRel);
        self.tx.try_send(item).map_err(|e| {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            e.into_inner()
        })
    }

    /// Queues `item` past [`STREAM_BYTES`] (a stream's answer, its last,
    /// or replayed events, bounded by the replay's own bounds) unless its
    /// client went or [`STREAM_QUEUE`] messages wait.
    pub fn send_last(&self, item: Item) -> Result<(), Item> {
        let len = item.len();
        self.queued
            .fetch_add(len, std::sync::atomic::Ordering::AcqRel);
        self.tx.try_send(item).map_err(|e| {
            self.queued
                .fetch_sub(len, std::sync::atomic::Ordering::AcqRel);
            e.into_inner()
        })
    }

    /// Whether its client went.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// When its client goes.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

impl Stream {
    pub async fn recv(&mut self) -> Option<Item> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    pub fn poll_recv(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Item>> {
        let polled = self.rx.poll_recv(cx);
        if let std::task::Poll::Ready(Some(item)) = &polled {
            self.queued
                .fetch_sub(item.len(), std::sync::atomic::Ordering::AcqRel);
        }
        polled
    }
}

/// A resumed stream's place: the stream's number and the last event the
/// client had (`Last-Event-ID: STREAM-SEQ`).
pub type Resume = (u64, u64);

/// Reads a `Last-Event-ID` this endpoint gave out (`STREAM-SEQ`).
pub fn parse_event_id(text: &str) -> Option<Resume> {
    let (stream, seq) = text.trim().split_once('-')?;
    Some((stream.parse().ok()?, seq.parse().ok()?))
}

/// One SSE event carrying `line` (a JSON-RPC message), with `id` if given.
pub fn event(id: Option<Resume>, line: &[u8]) -> Bytes {
    let json = line.strip_suffix(b"\n").unwrap_or(line);
    let mut out = Vec::with_capacity(json.len() + 48);
    if let Some((stream, seq)) = id {
        out.extend_from_slice(format!("id: {stream}-{seq}\n").as_bytes());
    }
    out.extend_from_slice(b"event: message\ndata: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// A session's requests in flight, as the unit's host sessions bound them.
struct Pending {
    id: RequestId,
    progress: Option<Value>,
    /// `None` while its client is away (a dropped SSE stream).
    sink: Option<Sink>,
    json: bool,
    /// Its stream's number (SSE).
    stream: u64,
    /// Whether its stream carried anything yet (then it is an SSE stream).
    sent: bool,
}

/// The GET stream: its number, and its client's sink while one listens.
struct Listen {
    stream: u64,
    sink: Option<Sink>,
}

/// The events of a session's SSE streams, newest last, for resuming: at
/// most [`REPLAY_EVENTS`] within [`REPLAY_BYTES`].
#[derive(Debug, Default)]
struct Replay {
    events: std::collections::VecDeque<(u64, u64, Bytes)>,
    bytes: usize,
    /// The last event number given out.
    seq: u64,
    /// The newest event number that fell out (or was never kept).
    lost: u64,
    /// The answers of requests whose stream had no client when they came,
    /// each the last event of its stream: kept apart from `events` (a
    /// flood on other streams does not push them out) until a resume
    /// takes them, at most [`KEPT_ANSWERS`] within [`KEPT_ANSWER_BYTES`].
    answers: std::collections::VecDeque<(u64, u64, Bytes)>,
    answer_bytes: usize,
}

impl Replay {
    /// Numbers `line` as the next event of `stream`, keeps it and returns
    /// it as an SSE event.
    fn push(&mut self, stream: u64, line: &[u8]) -> Bytes {
        self.seq += 1;
        let event = event(Some((stream, self.seq)), line);
        if event.len() > REPLAY_BYTES {
            self.lost = self.seq;
            return event;
        }
        self.bytes += event.len();
        self.events.push_back((stream, self.seq, event.clone()));
        while self.events.len() > REPLAY_EVENTS || self.bytes > REPLAY_BYTES {
            let Some((_, seq, old)) = self.events.pop_front() else {
                break;
            };
            self.bytes -= old.len();
            self.lost = seq;
        }
        event
    }

    /// Keeps `event` (numbered `seq`, of `stream`), the answer of a
    /// request whose stream has no client, for the resume that takes it.
    fn keep_answer(&mut self, stream: u64, seq: u64, event: Bytes) {
        if event.len() > KEPT_ANSWER_BYTES {
            self.lost = self.lost.max(seq);
            return;
        }
        // Not also among the events: the answer is its stream's last.
        if let Some(at) = self.events.iter().position(|(_, s, _)| *s == seq)
            && let Some((_, _, old)) = self.events.remove(at)
        {
            self.bytes -= old.len();
        }
        self.answer_bytes += event.len();
        self.answers.push_back((stream, seq, event));
        while self.answers.len() > KEPT_ANSWERS || self.answer_bytes > KEPT_ANSWER_BYTES {
            let Some((_, seq, old)) = self.answers.pop_front() else {
                break;
            };
            self.answer_bytes -= old.len();
            self.lost = self.lost.max(seq);
        }
    }

    /// The kept events of `stream` after event `after`, in order (its
    /// answer, kept apart, last).
    fn since(&self, stream: u64, after: u64) -> impl Iterator<Item = &Bytes> {
        self.events
            .iter()
            .chain(self.answers.iter())
            .filter(move |(s, seq, _)| *s == stream && *seq > after)
            .map(|(_, _, event)| event)
    }

    /// Lets go of `stream`'s kept answer (a resume took it).
    fn taken(&mut self, stream: u64) {
        if let Some(at) = self.answers.iter().position(|(s, _, _)| *s == stream)
            && let Some((_, _, old)) = self.answers.remove(at)
        {
            self.answer_bytes -= old.len();
        }
    }
}

/// The session has ended (or is ending): nothing more is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended;

/// Called once when a session ends, with why.
pub type OnEnd = Box<dyn FnOnce(&str) + Send>;

/// One HTTP session: no task of its own. The HTTP side's request
/// handlers call it ([`Session::request`], [`Session::listen`], …), which
/// write to the unit's session at once (a direction of an in-memory
/// pair, read by the unit's session task); what the unit's session
/// writes back is handed to it on that task, as it is written
/// ([`HostLink::Direct`]), and goes straight to the stream it concerns,
/// whose response the connection's task sends. A request crosses one
/// task wake-up on its way in (the unit's) and one on its way out (the
/// connection's), as a bridged host's does.
pub struct Session {
    /// `ID on UNIT`, for the log.
    name: String,
    /// The path's name (`NAME`, `@GROUP`), for the reasons it ends with.
    label: String,
    /// To the unit's session (queued and bounded past what the pair takes,
    /// as the aggregate's are).
    out: HostOut,
    state: std::sync::Mutex<State>,
    /// Told when it falls idle ([`idle_sweep`]).
    idle: std::sync::Arc<IdleWatch>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("name", &self.name).finish()
    }
}

struct State {
    pending: Vec<Pending>,
    listen: Option<Listen>,
    replay: Replay,
    /// Streams opened so far (each SSE stream's number).
    streams: u64,
    /// What the unit said when it refused the session (an error with no
    /// id), for the reason it ends with.
    refusal: Option<String>,
    /// Since when nothing is in flight and no GET stream has a client;
    /// `None` while busy.
    idle_since: Option<tokio::time::Instant>,
    /// Called when it ends; `None` once it has.
    on_end: Option<OnEnd>,
}

impl State {
    /// Notes whether it is idle now; true when it has just fallen idle.
    fn settle(&mut self) -> bool {
        let idle = self.pending.is_empty() && self.listen.as_ref().is_none_or(|l| l.sink.is_none());
        match (idle, self.idle_since) {
            (true, None) => {
                self.idle_since = Some(tokio::time::Instant::now());
                true
            }
            (false, Some(_)) => {
                self.idle_since = None;
                false
            }
            _ => false,
        }
    }
}

/// What the unit's session writes to an HTTP session, handed over on its
/// task ([`Deliver`]). Weak: the endpoint's table of sessions owns a
/// session; once it lets go, the unit's session reads the end of its
/// requests and lets go of this.
#[derive(Debug)]
struct Delivery(std::sync::Weak<Session>);

impl Deliver for Delivery {
    fn deliver(&self, lines: &[u8]) -> std::io::Result<()> {
        let Some(session) = self.0.upgrade() else {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        };
        for line in lines.split_inclusive(|b| *b == b'\n') {
            if line.trim_ascii().is_empty() {
                continue;
            }
            match Message::parse(line) {
                Ok(message) => session.on_unit(&message, line)?,
                Err(why) => {
                    tracing::debug!(target: "mcpd::http", "session {}: the unit wrote what is not a message: {why}", session.name);
                }
            }
        }
        Ok(())
    }

    fn end(&self) {
        if let Some(session) = self.0.upgrade() {
            let why = session.lock().refusal.take();
            let why = match why {
                Some(refusal) => format!("{} refused it: {refusal}", session.label),
                None => format!("{} ended the session", session.label),
            };
            session.end(&why);
        }
    }
}

impl Session {
    /// A session `id` on `label`, and the link its unit's (or
    /// aggregate's) host session is attached with. `on_end` is called
    /// once it ends, with why.
    pub fn open(
        label: &str,
        id: &str,
        idle: &std::sync::Arc<IdleWatch>,
        on_end: OnEnd,
    ) -> (std::sync::Arc<Session>, HostLink) {
        let (to_unit, unit_reads) = crate::mux::memory::channel(PAIR_BUFFER);
        let session = std::sync::Arc::new(Session {
            name: format!("{id} on {label}"),
            label: label.to_owned(),
            out: HostOut::Memory(
                crate::mux::outbox::Outbox::new(to_unit, QUEUE, None).bounded_in_bytes(QUEUE_BYTES),
            ),
            state: std::sync::Mutex::new(State {
                pending: Vec::new(),
                listen: None,
                replay: Replay::default(),
                streams: 0,
                refusal: None,
                idle_since: Some(tokio::time::Instant::now()),
                on_end: Some(on_end),
            }),
            idle: std::sync::Arc::clone(idle),
        });
        idle.fell_idle();
        let link = HostLink::Direct {
            read: unit_reads,
            deliver: std::sync::Arc::new(Delivery(std::sync::Arc::downgrade(&session))),
        };
        (session, link)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics under it; a poisoned lock's state is still whole.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request: written to the unit; its answer (and what concerns it)
    /// goes to `sink`, only its answer if `json`.
    pub fn request(
        &self,
        message: &Message,
        id: RequestId,
        sink: Sink,
        json: bool,
    ) -> Result<(), Ended> {
        let mut state = self.lock();
        if state.on_end.is_none() {
            return Err(Ended);
        }
        if state.pending.iter().any(|p| p.id == id) {
            let _ = sink.try_send(Item::Answer(
                ErrorCode::InvalidRequest
                    .error("a request with this id is already in flight")
                    .line(Some(id.as_json()))
                    .into(),
            ));
            return Ok(());
        }
        if state.pending.len() >= MAX_IN_FLIGHT {
            let _ = sink.try_send(Item::Answer(down(
                &id,
                &format!("more than {MAX_IN_FLIGHT} requests in flight in one session"),
            )));
            return Ok(());
        }
        // Its params parsed only when they may name one.
        let progress = message
            .may_hold("params", "progressToken")
            .then(|| message.params())
            .flatten()
            .and_then(|p| p.get("_meta")?.get("progressToken").cloned());
        state.streams += 1;
        let stream = state.streams;
        // In flight before the unit can answer it (its answer comes on
        // the unit's task, which waits for this lock).
        state.pending.push(Pending {
            id,
            progress,
            sink: Some(sink),
            json,
            stream,
            sent: false,
        });
        state.settle();
        if message.with_line(|line| self.out.send_slice(line)).is_err() {
            drop(state);
            self.end("the unit does not read what it is sent");
            return Err(Ended);
        }
        Ok(())
    }

    /// A notification, or an answer to the server's request.
    pub fn forward(&self, message: &Message) -> Result<(), Ended> {
        if self.lock().on_end.is_none() {
            return Err(Ended);
        }
        if message.with_line(|line| self.out.send_slice(line)).is_err() {
            self.end("the unit does not read what it is sent");
            return Err(Ended);
        }
        Ok(())
    }

    /// A GET stream: a new server→client stream (replacing an earlier
    /// one), or, with `resume`, the events a stream had after the
    /// client's last, and then that stream carried on (one of a request
    /// that is over ends there). The place the stream starts from, for
    /// its priming event: the new stream's number and 0, or `resume`.
    pub fn listen(&self, sink: Sink, resume: Option<Resume>) -> Result<Resume, Ended> {
        let mut state = self.lock();
        if state.on_end.is_none() {
            return Err(Ended);
        }
        let from = match resume {
            None => {
                state.streams += 1;
                state.listen = Some(Listen {
                    stream: state.streams,
                    sink: Some(sink),
                });
                (state.streams, 0)
            }
            Some(resume) => {
                self.resume(&mut state, sink, resume);
                resume
            }
        };
        state.settle();
        Ok(from)
    }

    fn resume(&self, state: &mut State, sink: Sink, (stream, after): Resume) {
        if state.replay.lost > after {
            tracing::info!(target: "mcpd::http", "session {}: resuming stream {stream} after event {after}: the events up to {} fell out of the replay buffer ({REPLAY_EVENTS} events, {} KiB) and are lost to it", self.name, state.replay.lost, REPLAY_BYTES >> 10);
        }
        let mut replayed = 0;
        for event in state.replay.since(stream, after) {
            // Its queue holds the whole buffer (bounded by its own bounds).
            if sink.send_last(Item::Event(event.clone())).is_err() {
                return;
            }
            replayed += 1;
        }
        state.replay.taken(stream);
        tracing::debug!(target: "mcpd::http", "session {}: resumed stream {stream} after event {after}, {replayed} events replayed", self.name);
        if let Some(listen) = state.listen.as_mut().filter(|l| l.stream == stream) {
            listen.sink = Some(sink);
        } else if let Some(pending) = state
            .pending
            .iter_mut()
            .find(|p| !p.json && p.stream == stream)
        {
            pending.sink = Some(sink);
        }
    }

    /// Ends the session (once): its requests in flight are answered with
    /// an error naming `why`, never left hanging; its streams end, the
    /// unit's session reads the end, and `on_end` is told.
    pub fn end(&self, why: &str) {
        let (pending, on_end) = {
            let mut state = self.lock();
            let Some(on_end) = state.on_end.take() else {
                return;
            };
            state.listen = None;
            state.idle_since = None;
            state.replay = Replay::default();
            (std::mem::take(&mut state.pending), on_end)
        };
        for pending in pending {
            let error = down(&pending.id, &format!("the session ended: {why}"));
            if let Some(sink) = pending.sink {
                let _ = sink.try_send(Item::answer(pending.sent, error));
            }
        }
        self.out.shutdown();
        on_end(why);
    }

    /// When it will have been idle for [`IDLE`], if it is idle.
    /// Since when it is idle (nothing in flight, no GET stream's client);
    /// `None` while busy.
    pub fn idle_since(&self) -> Option<tokio::time::Instant> {
        self.lock().idle_since
    }

    fn idle_deadline(&self) -> Option<tokio::time::Instant> {
        self.lock().idle_since.map(|at| at + IDLE)
    }

    /// A message of the unit's (`line` its text): an answer to the request
    /// it answers, anything else to the stream it concerns.
    fn on_unit(&self, message: &Message, line: &[u8]) -> std::io::Result<()> {
        let mut state = self.lock();
        if state.on_end.is_none() {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        let state = &mut *state;
        let answer = message.method().is_none();
        if answer {
            if let Some(id) = message.request_id()
                && let Some(at) = state.pending.iter().position(|p| p.id == id)
            {
                let pending = state.pending.remove(at);
                if state.pending.is_empty() {
                    // An idle session keeps no room for requests.
                    state.pending = Vec::new();
                }
                let out = if pending.sent {
                    Item::Event(state.replay.push(pending.stream, line))
                } else {
                    Item::Answer(Bytes::copy_from_slice(line))
                };
                let seq = state.replay.seq;
                let unsent = match pending.sink {
                    Some(sink) => sink.send_last(out).err(),
                    None => Some(out),
                };
                // An SSE stream's answer its client did not get is kept
                // for the resume that comes for it.
                if let (true, Some(Item::Event(event))) = (pending.sent, unsent) {
                    tracing::debug!(target: "mcpd::http", "session {}: the answer of stream {} is kept for a resume (its client is away or behind)", self.name, pending.stream);
                    state.replay.keep_answer(pending.stream, seq, event);
                }
                if state.settle() {
                    self.idle.fell_idle();
                }
            } else if message.raw("id") == Some("null") {
                // The unit refusing the session (too many on it): the
                // reason the session ends with.
                state.refusal = message.get::<serde_json::Value>("error").and_then(|e| {
                    e["message"]
                        .as_str()
                        .map(|m| m.chars().take(1024).collect())
                });
            }
            return Ok(());
        }
        let concerns = (message.method_kind() == Some(Method::Progress))
            .then(|| {
                message
                    .params()
                    .and_then(|p| p.get("progressToken").cloned())
            })
            .flatten();
        // The request it concerns, else the newest request's stream with
        // a client, else the GET stream's (kept for resuming while its
        // client is away), else the newest request's stream without one.
        let at = concerns
            .and_then(|token| {
                state
                    .pending
                    .iter()
                    .position(|p| !p.json && p.progress.as_ref() == Some(&token))
            })
            .or_else(|| {
                state
                    .pending
                    .iter()
                    .rposition(|p| !p.json && p.sink.is_some())
            });
        let at = match (at, &state.listen) {
            (Some(at), _) => Some(at),
            (None, Some(_)) => None,
            (None, None) => state.pending.iter().rposition(|p| !p.json),
        };
        let (stream, sink) = match at {
            Some(at) => {
                let pending = &mut state.pending[at];
                pending.sent = true;
                (pending.stream, &mut pending.sink)
            }
            None => match &mut state.listen {
                Some(listen) => (listen.stream, &mut listen.sink),
                None => return Ok(()),
            },
        };
        let event = state.replay.push(stream, line);
        if let Some(to) = sink
            && to.try_send(Item::Event(event)).is_err()
        {
            // Its client went, or is too far behind: the stream waits for
            // a GET that resumes it; the session stays.
            if !to.is_closed() {
                tracing::info!(target: "mcpd::http", "session {}: detached stream {stream}, whose client is {STREAM_QUEUE} messages or {} MiB behind: its events are kept for a resume", self.name, STREAM_BYTES >> 20);
            }
            *sink = None;
            if state.settle() {
                self.idle.fell_idle();
            }
        }
        Ok(())
    }
}

/// What the idle ends of an endpoint's sessions wait on: one task
/// ([`idle_sweep`]) sleeps until the first session's [`IDLE`] is over,
/// and only a session falling idle while the task has nothing to wait
/// for wakes it (a request answered does not).
#[derive(Debug, Default)]
pub struct IdleWatch {
    wake: tokio::sync::Notify,
    /// The sweep waits with no deadline.
    asleep: std::sync::atomic::AtomicBool,
}

impl IdleWatch {
    fn fell_idle(&self) {
        if self.asleep.swap(false, std::sync::atomic::Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// Wakes the sweep (its endpoint is gone: it ends).
    pub fn stop(&self) {
        self.wake.notify_one();
    }
}

/// Ends the sessions idle for [`IDLE`] (nothing in flight and no GET
/// stream), when they are: `sessions` gives the sessions now, `None` once
/// the endpoint is gone (then this ends).
pub async fn idle_sweep(
    watch: std::sync::Arc<IdleWatch>,
    sessions: impl Fn() -> Option<Vec<std::sync::Arc<Session>>>,
) {
    loop {
        // Set before looking: a session falling idle after it wakes it.
        watch
            .asleep
            .store(true, std::sync::atomic::Ordering::Release);
        let Some(sessions) = sessions() else {
            return;
        };
        let now = tokio::time::Instant::now();
        let mut next: Option<tokio::time::Instant> = None;
        for session in sessions {
            match session.idle_deadline() {
                Some(at) if at <= now => {
                    session.end(&format!("idle for {}", humantime::format_duration(IDLE)));
                }
                Some(at) => next = Some(next.map_or(at, |n| n.min(at))),
                None => {}
            }
        }
        if next.is_some() {
            watch
                .asleep
                .store(false, std::sync::atomic::Ordering::Release);
        }
        tokio::select! {
            () = sleep_until(next) => {}
            () = watch.wake.notified() => {}
        }
    }
}

/// [`ErrorCode::ServerDown`] to request `id`, as a line: the session or
/// the unit behind it cannot answer.
fn down(id: &RequestId, why: &str) -> Bytes {
    ErrorCode::ServerDown
        .error(why)
        .line(Some(id.as_json()))
        .into()
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A stateless request: the message, its id, where its answer goes and
/// whether as JSON.
#[derive(Debug)]
pub struct Once {
    pub message: Message,
    pub id: RequestId,
    pub sink: Sink,
    pub json: bool,
}

/// How long a call answered `input_required` waits for its retry here:
/// the unit's sessions' own bound, and a little more.
pub const PARKED: Duration = Duration::from_secs(crate::mux::era::INPUT_TIMEOUT.as_secs() + 5);

/// One request of a host without a session (MCP 2026-07-28, stateless):
/// a host session of its own on `link` for just this request, whose
/// answer ends it (what the unit sends before, progress and log messages,
/// goes to the sink too unless JSON); it also ends when the client goes
/// (the sink closed), when the unit's side closes, or when `epoch` moves
/// and `valid` says the request's token is no longer good. An answer that
/// is `input_required` keeps the session for the retry, which `park` is
/// given a sender for (by the answer's `requestState`), for [`PARKED`].
pub async fn once(
    link: HostLink,
    first: Once,
    mut epoch: tokio::sync::watch::Receiver<u64>,
    valid: impl Fn() -> bool,
    park: impl Fn(&str, mpsc::Sender<Once>),
    unpark: impl Fn(&str),
) {
    let opened = link.open(0, QUEUE, QUEUE_BYTES);
    let mut reader = opened.reader;
    let _stop = opened.stop;
    let (retry_tx, mut retries) = mpsc::channel::<Once>(1);
    let Once {
        message,
        mut id,
        sink,
        mut json,
    } = first;
    // The stream of the request being answered; none while parked.
    let mut sink = Some(sink);
    // Whether that stream carried anything yet.
    let mut sent = false;
    let mut unsent = Some(message);
    let mut parked: Option<(String, tokio::time::Instant)> = None;
    loop {
        if let Some(message) = unsent.take()
            && opened.out.send(message.line()).is_err()
        {
            if let Some(sink) = &sink {
                let _ = sink.try_send(Item::answer(
                    sent,
                    down(&id, "the unit does not read what it is sent"),
                ));
            }
            break;
        }
        let watch = sink.clone();
        let until = parked.as_ref().map(|(_, at)| *at);
        tokio::select! {
            event = reader.next() => match event {
                Some(Event::Host(_, Some(Frame::Message(message)))) => {
                    let Some(to) = &sink else { continue };
                    let line = Bytes::from(message.line());
                    if message.method().is_none() {
                        if message.request_id().as_ref() == Some(&id) {
                            let _ = to.send_last(Item::answer(sent, line));
                            let Some(state) = input_required(&message) else {
                                break;
                            };
                            park(&state, retry_tx.clone());
                            parked = Some((state, tokio::time::Instant::now() + PARKED));
                            sink = None;
                        }
                    } else if !json {
                        if to.try_send(Item::Event(self::event(None, &line))).is_err() {
                            break;
                        }
                        sent = true;
                    }
                }
                Some(Event::Host(_, Some(_)) | Event::Server(..)) => {}
                Some(Event::Host(_, None)) | None => {
                    if let Some(sink) = &sink {
                        let _ = sink.try_send(Item::answer(sent, down(&id, "the unit ended the session")));
                    }
                    break;
                }
            },
            () = closed(watch) => break,
            retry = retries.recv(), if parked.is_some() => {
                let Some(retry) = retry else { break };
                if let Some((state, _)) = parked.take() {
                    unpark(&state);
                }
                id = retry.id;
                json = retry.json;
                sink = Some(retry.sink);
                sent = false;
                unsent = Some(retry.message);
            }
            () = sleep_until(until) => break,
            changed = epoch.changed() => {
                if changed.is_err() || !valid() {
                    if let Some(sink) = &sink {
                        let _ = sink.try_send(Item::answer(sent, down(&id, "its token was revoked")));
                    }
                    break;
                }
            }
        }
    }
    if let Some((state, _)) = parked {
        unpark(&state);
    }
    opened.out.shutdown();
}

/// When the client of `sink` goes; never without one.
async fn closed(sink: Option<Sink>) {
    match sink {
        Some(sink) => sink.closed().await,
        None => std::future::pending().await,
    }
}

/// The `requestState` of an `input_required` answer.
fn input_required(answer: &Message) -> Option<String> {
    if !answer.may_hold("result", "input_required") {
        return None;
    }
    let result = answer.get::<Value>("result")?;
    (result.get("resultType")?.as_str()? == "input_required")
        .then(|| result.get("requestState")?.as_str().map(str::to_owned))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    type Opened = (
        std::sync::Arc<IdleWatch>,
        std::sync::Arc<Session>,
        crate::mux::memory::Reader,
        std::sync::Arc<dyn Deliver>,
        tokio::sync::oneshot::Receiver<String>,
    );

    /// A session "s" on unit "u": its idle watch, the session, the unit's
    /// side of its link, and where why it ended is told.
    fn opened() -> Opened {
        let watch = std::sync::Arc::new(IdleWatch::default());
        let (ended, why) = tokio::sync::oneshot::channel::<String>();
        let (session, link) = Session::open(
            "u",
            "s",
            &watch,
            Box::new(move |why| {
                let _ = ended.send(why.to_owned());
            }),
        );
        let HostLink::Direct { read, deliver } = link else {
            panic!("an HTTP session's link is direct");
        };
        (watch, session, read, deliver, why)
    }

    /// Nothing in flight and no GET stream for [`IDLE`]: the session ends
    /// (by the endpoint's one sweep); never while a request waits for its
    /// answer, however long. The request reaches the unit's side of the
    /// link, the answer handed over there reaches the request's stream,
    /// and the end reaches the unit as the end of what it reads.
    #[tokio::test(start_paused = true)]
    async fn a_session_ends_idle_for_its_bound_but_never_while_a_request_waits() {
        use crate::mux::lines::Source;
        let (watch, session, mut unit_reads, deliver, mut why) = opened();
        let all = vec![std::sync::Arc::clone(&session)];
        let sweep = tokio::spawn(idle_sweep(std::sync::Arc::clone(&watch), move || {
            Some(all.clone())
        }));
        let message =
            Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).expect("message");
        let id = message.request_id().expect("id");
        let (sink, mut answers) = stream();
        session
            .request(&message, id, sink, false)
            .expect("the session takes it");
        let mut read = tokio_util::bytes::BytesMut::new();
        unit_reads.fill(&mut read).await.expect("the unit reads");
        assert_eq!(
            &read[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n"
        );
        tokio::time::sleep(IDLE * 3).await;
        assert!(why.try_recv().is_err(), "a request waits: not idle");
        deliver
            .deliver(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
            .expect("the unit answers");
        let Some(Item::Answer(answer)) = answers.recv().await else {
            panic!("the answer, first on its stream");
        };
        assert_eq!(
            &answer[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n"
        );
        let idle_from = tokio::time::Instant::now();
        let why = why.await.expect("ended");
        assert_eq!(why, "idle for 30m");
        let took = idle_from.elapsed();
        assert!(
            took >= IDLE && took < IDLE + Duration::from_secs(1),
            "{took:?}"
        );
        assert_eq!(
            unit_reads.fill(&mut read).await.expect("the end"),
            0,
            "the unit reads the end"
        );
        assert!(
            deliver
                .deliver(b"{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n")
                .is_err(),
            "an ended session takes nothing more"
        );
        sweep.abort();
    }

    /// The unit's side ending the session answers what is in flight with
    /// the reason (the unit's refusal when it said one) and ends it; a
    /// progress notification goes to the stream of the request it names,
    /// which then becomes an SSE stream.
    #[tokio::test]
    async fn the_units_end_answers_what_is_in_flight_with_its_reason() {
        let (_watch, session, _unit_reads, deliver, why) = opened();
        let message = Message::parse(
            br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"_meta":{"progressToken":7}}}"#,
        )
        .expect("message");
        let (sink, mut stream) = stream();
        session
            .request(&message, message.request_id().expect("id"), sink, false)
            .expect("taken");
        deliver
            .deliver(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":7,\"progress\":1}}\n{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32000,\"message\":\"too many\"}}\n")
            .expect("delivered");
        let Some(Item::Event(progress)) = stream.recv().await else {
            panic!("the progress, as an event");
        };
        assert!(
            progress.starts_with(b"id: 1-1\nevent: message\ndata: {\"jsonrpc\""),
            "{progress:?}"
        );
        // As the unit's side does when it drops or shuts its writer.
        deliver.end();
        assert_eq!(why.await.expect("ended"), "u refused it: too many");
        let Some(Item::Event(error)) = stream.recv().await else {
            panic!("the error, as the stream's last event");
        };
        let text = String::from_utf8_lossy(&error);
        assert!(
            text.contains("the session ended: u refused it: too many"),
            "{text}"
        );
        let ping = Message::parse(br#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#).expect("ping");
        let (sink, _rx) = super::stream();
        assert_eq!(
            session.request(&ping, ping.request_id().expect("id"), sink, false),
            Err(Ended)
        );
    }

    #[test]
    fn the_replay_buffer_keeps_the_newest_events_within_its_bounds() {
        let mut replay = Replay::default();
        let first = replay.push(1, b"{\"a\":1}\n");
        assert_eq!(&first[..], b"id: 1-1\nevent: message\ndata: {\"a\":1}\n\n");
        replay.push(2, b"{}");
        replay.push(1, b"{}");
        let ids: Vec<&Bytes> = replay.since(1, 1).collect();
        assert_eq!(ids.len(), 1);
        assert!(ids[0].starts_with(b"id: 1-3\n"));
        assert_eq!(replay.lost, 0);
        for _ in 0..REPLAY_EVENTS {
            replay.push(1, b"{}");
        }
        assert_eq!(replay.events.len(), REPLAY_EVENTS);
        assert_eq!(replay.lost, 3);
        let big = vec![b'x'; REPLAY_BYTES / 3];
        for _ in 0..4 {
            replay.push(1, &big);
        }
        assert!(replay.bytes <= REPLAY_BYTES);
        assert_eq!(
            replay
                .events
                .iter()
                .filter(|e| e.2.len() > big.len())
                .count(),
            2
        );
        let huge = vec![b'x'; REPLAY_BYTES + 1];
        let seq = replay.seq;
        replay.push(1, &huge);
        assert_eq!(replay.lost, seq + 1, "too large to keep: lost");
        assert_eq!(parse_event_id("12-345"), Some((12, 345)));
        assert_eq!(parse_event_id("12"), None);
        assert_eq!(parse_event_id("a-1"), None);
    }
}
