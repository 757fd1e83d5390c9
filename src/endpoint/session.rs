//! One HTTP session (MCP Streamable HTTP, 2025-11-25 sessions): the task
//! between the HTTP requests of one `Mcp-Session-Id` and a host session
//! of its unit (or aggregate), reached as every host reaches one: a
//! pair (in memory, `mux::memory`), one end attached through
//! `Supervisor::attach` (or `aggregate::attach`), so the unit's routing,
//! bounds, eras and accounting are the bridge's.
//!
//! Each POSTed request gets a stream (`Sink`): its answer ends it. An
//! answer that is the first thing its stream carries goes as a JSON line
//! ([`Item::Answer`]), which the HTTP side sends as one
//! `application/json` body (one write, no chunks; the spec lets a server
//! answer a request either way); anything before it makes the response an
//! SSE stream ([`Item::Event`]). What
//! the unit sends that is not an answer goes to the stream of the request
//! it concerns when the task can tell (a progress token), else to the
//! newest request's stream, else to the GET stream; with none open it is
//! dropped (the spec lets a server send only on open streams).
//!
//! Resumability (2025-11-25): every event of a session's SSE streams has
//! an id, `STREAM-SEQ` (the stream's number in the session, the event's
//! number in the session), and is kept in a bounded per-session buffer
//! ([`Replay`]: the newest [`REPLAY_EVENTS`] events within
//! [`REPLAY_BYTES`]). A stream whose client goes (or does not read,
//! [`STREAM_QUEUE`] messages behind) is detached, not ended: what it would
//! carry is numbered and kept, and a GET with `Last-Event-ID` replays that
//! stream's events after the id and then carries the stream on (the GET
//! stream, or a request's stream until its answer). What fell out of the
//! buffer is lost, and the log says so.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::mux::host::{Event, HostLink, HostOut};
use crate::mux::lines::Frame;
use crate::mux::message::{Message, RequestId};

/// Messages queued for one HTTP response stream before it is dropped.
pub const STREAM_QUEUE: usize = 64;
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

/// Where one stream's messages go.
pub type Sink = mpsc::Sender<Item>;

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

/// What the HTTP side asks of a session.
#[derive(Debug)]
pub enum Command {
    /// A request; its answer (and what concerns it) goes to `sink`.
    Request {
        message: Message,
        id: RequestId,
        sink: Sink,
        /// The client takes only JSON: only the answer goes to `sink`.
        json: bool,
    },
    /// A notification or an answer to the server's request.
    Forward(Message),
    /// A GET stream: a new server→client stream (replacing an earlier
    /// one), or, with `resume`, the events a stream had after the client's
    /// last, and then that stream carried on.
    Listen { sink: Sink, resume: Option<Resume> },
    /// The session ends (DELETE), for this reason.
    End(String),
}

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

    /// The kept events of `stream` after event `after`, in order.
    fn since(&self, stream: u64, after: u64) -> impl Iterator<Item = &Bytes> {
        self.events
            .iter()
            .filter(move |(s, seq, _)| *s == stream && *seq > after)
            .map(|(_, _, event)| event)
    }
}

/// Runs the session until DELETE, the unit's side ending, every handle
/// gone or [`IDLE`]; `end` is called with the reason once it is over.
pub async fn run(
    label: String,
    id: String,
    link: HostLink,
    mut commands: mpsc::Receiver<Box<Command>>,
    revoked: std::sync::Arc<tokio::sync::Notify>,
    end: impl FnOnce(&str),
) {
    // Taken apart at once: what a memory link does not have is not
    // kept for the session's life.
    let crate::mux::host::Opened {
        mut reader,
        stop: _stop,
        out,
        ..
    } = link.open(0, QUEUE, QUEUE_BYTES);
    let mut task = Task {
        out,
        pending: Vec::new(),
        listen: None,
        replay: Replay::default(),
        streams: 0,
        name: format!("{id} on {label}"),
        refusal: None,
    };
    drop(id);
    // One timer, set again when the session falls idle or its client
    // sends something while it is (not made anew for every message).
    let idle_timer = tokio::time::sleep(IDLE);
    tokio::pin!(idle_timer);
    let mut was_idle = true;
    let why: String = loop {
        let idle = task.pending.is_empty() && task.listen.as_ref().is_none_or(|l| l.sink.is_none());
        if idle && !was_idle {
            idle_timer
                .as_mut()
                .reset(tokio::time::Instant::now() + IDLE);
        }
        was_idle = idle;
        tokio::select! {
            command = commands.recv() => match command {
                None => break "the endpoint stopped".into(),
                Some(command) => {
                    if let Command::End(why) = *command {
                        break why;
                    }
                    // The client is there.
                    was_idle = false;
                    if let Err(why) = task.command(*command) {
                        break why;
                    }
                }
            },
            event = reader.next() => match event {
                Some(Event::Host(_, Some(Frame::Message(message)))) => task.on_unit(message),
                Some(Event::Host(_, Some(_))) => {}
                Some(Event::Host(_, None)) | None => break match task.refusal.take() {
                    Some(refusal) => format!("{label} refused it: {refusal}"),
                    None => format!("{label} ended the session"),
                },
                Some(Event::Server(..)) => {}
            },
            () = revoked.notified() => break "its token was revoked".into(),
            () = &mut idle_timer, if idle => break format!("idle for {}", humantime::format_duration(IDLE)),
        }
    };
    // Requests in flight are answered, never left hanging.
    for pending in task.pending.drain(..) {
        let error = error_line(
            Some(&pending.id),
            -32000,
            &format!("the session ended: {why}"),
        );
        if let Some(sink) = pending.sink {
            let _ = sink.try_send(Item::answer(pending.sent, error));
        }
    }
    task.out.shutdown();
    end(&why);
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

struct Task {
    out: HostOut,
    pending: Vec<Pending>,
    listen: Option<Listen>,
    replay: Replay,
    /// Streams opened so far (each SSE stream's number).
    streams: u64,
    /// `ID on UNIT`, for the log.
    name: String,
    /// What the unit said when it refused the session (an error with no
    /// id), for the error the session's requests end with.
    refusal: Option<String>,
}

impl Task {
    fn command(&mut self, command: Command) -> Result<(), String> {
        match command {
            Command::Request {
                message,
                id,
                sink,
                json,
            } => {
                if self.pending.iter().any(|p| p.id == id) {
                    let _ = sink.try_send(Item::Answer(error_line(
                        Some(&id),
                        -32600,
                        "a request with this id is already in flight",
                    )));
                    return Ok(());
                }
                if self.pending.len() >= MAX_IN_FLIGHT {
                    let _ = sink.try_send(Item::Answer(error_line(
                        Some(&id),
                        -32000,
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
                self.send(&message)?;
                self.streams += 1;
                self.pending.push(Pending {
                    id,
                    progress,
                    sink: Some(sink),
                    json,
                    stream: self.streams,
                    sent: false,
                });
            }
            Command::Forward(message) => self.send(&message)?,
            Command::Listen { sink, resume: None } => {
                self.streams += 1;
                self.listen = Some(Listen {
                    stream: self.streams,
                    sink: Some(sink),
                });
            }
            Command::Listen {
                sink,
                resume: Some(resume),
            } => self.resume(sink, resume),
            Command::End(_) => {}
        }
        Ok(())
    }

    /// A GET with `Last-Event-ID`: the events of that stream after it,
    /// then the stream goes on on `sink` (one of a request that is over
    /// ends there).
    fn resume(&mut self, sink: Sink, (stream, after): Resume) {
        if self.replay.lost > after {
            tracing::info!(target: "mcpd::http", "session {}: resuming stream {stream} after event {after}: the events up to {} fell out of the replay buffer ({REPLAY_EVENTS} events, {} KiB) and are lost to it", self.name, self.replay.lost, REPLAY_BYTES >> 10);
        }
        let mut replayed = 0;
        for event in self.replay.since(stream, after) {
            // Its queue holds the whole buffer.
            if sink.try_send(Item::Event(event.clone())).is_err() {
                return;
            }
            replayed += 1;
        }
        tracing::debug!(target: "mcpd::http", "session {}: resumed stream {stream} after event {after}, {replayed} events replayed", self.name);
        if let Some(listen) = self.listen.as_mut().filter(|l| l.stream == stream) {
            listen.sink = Some(sink);
        } else if let Some(pending) = self
            .pending
            .iter_mut()
            .find(|p| !p.json && p.stream == stream)
        {
            pending.sink = Some(sink);
        }
    }

    fn send(&self, message: &Message) -> Result<(), String> {
        self.out
            .send(message.line())
            .map_err(|_| "the unit does not read what it is sent".to_owned())
    }

    fn on_unit(&mut self, message: Message) {
        let answer = message.method().is_none();
        if answer {
            if let Some(id) = message.request_id()
                && let Some(at) = self.pending.iter().position(|p| p.id == id)
            {
                let pending = self.pending.remove(at);
                if self.pending.is_empty() {
                    // An idle session keeps no room for requests.
                    self.pending = Vec::new();
                }
                let line = Bytes::from(message.line());
                let out = if pending.sent {
                    Item::Event(self.replay.push(pending.stream, &line))
                } else {
                    Item::Answer(line)
                };
                if let Some(sink) = pending.sink {
                    let _ = sink.try_send(out);
                }
            } else if message.raw("id") == Some("null") {
                // The unit refusing the session (too many on it): the
                // reason the session ends with.
                self.refusal = message.get::<serde_json::Value>("error").and_then(|e| {
                    e["message"]
                        .as_str()
                        .map(|m| m.chars().take(1024).collect())
                });
            }
            return;
        }
        let concerns = (message.method().as_deref() == Some("notifications/progress"))
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
                self.pending
                    .iter()
                    .position(|p| !p.json && p.progress.as_ref() == Some(&token))
            })
            .or_else(|| {
                self.pending
                    .iter()
                    .rposition(|p| !p.json && p.sink.is_some())
            });
        let at = match (at, &self.listen) {
            (Some(at), _) => Some(at),
            (None, Some(_)) => None,
            (None, None) => self.pending.iter().rposition(|p| !p.json),
        };
        let line = message.line();
        let (stream, sink) = match at {
            Some(at) => {
                let pending = &mut self.pending[at];
                pending.sent = true;
                (pending.stream, &mut pending.sink)
            }
            None => match &mut self.listen {
                Some(listen) => (listen.stream, &mut listen.sink),
                None => return,
            },
        };
        let event = self.replay.push(stream, &line);
        if let Some(to) = sink
            && to.try_send(Item::Event(event)).is_err()
        {
            // Its client went, or does not read: the stream waits for a
            // GET that resumes it; the session stays.
            *sink = None;
        }
    }
}

/// A JSON-RPC error as one line.
pub fn error_line(id: Option<&RequestId>, code: i64, message: &str) -> Bytes {
    let id = id.map_or(Value::Null, RequestId::to_value);
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    });
    Bytes::from(crate::mux::lines::line(&error))
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
                    error_line(Some(&id), -32000, "the unit does not read what it is sent"),
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
                            let _ = to.try_send(Item::answer(sent, line));
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
                        let _ = sink.try_send(Item::answer(sent, error_line(Some(&id), -32000, "the unit ended the session")));
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
                        let _ = sink.try_send(Item::answer(sent, error_line(Some(&id), -32000, "its token was revoked")));
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

    /// Nothing in flight and no GET stream for [`IDLE`]: the session ends;
    /// never while a request waits for its answer, however long.
    #[tokio::test(start_paused = true)]
    async fn a_session_ends_idle_for_its_bound_but_never_while_a_request_waits() {
        use crate::mux::outbox::TryWrite;
        let (mine, theirs) = crate::mux::memory::pair(1 << 16);
        let (commands, rx) = mpsc::channel(4);
        let (ended, why) = tokio::sync::oneshot::channel::<String>();
        let session = tokio::spawn(run(
            "u".into(),
            "s".into(),
            HostLink::Memory(mine),
            rx,
            std::sync::Arc::new(tokio::sync::Notify::new()),
            move |why| {
                let _ = ended.send(why.to_owned());
            },
        ));
        let message =
            Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).expect("message");
        let id = message.request_id().expect("id");
        let (sink, mut answers) = mpsc::channel(4);
        commands
            .send(Box::new(Command::Request {
                message,
                id,
                sink,
                json: false,
            }))
            .await
            .expect("sent");
        tokio::time::sleep(IDLE * 3).await;
        assert!(!session.is_finished(), "a request waits: not idle");
        theirs
            .write
            .try_write(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
            .expect("the unit answers");
        let Some(Item::Answer(answer)) = answers.recv().await else {
            panic!("the answer, first on its stream");
        };
        assert!(answer.starts_with(b"{"), "{answer:?}");
        let idle_from = tokio::time::Instant::now();
        let why = why.await.expect("ended");
        assert_eq!(why, "idle for 30m");
        let took = idle_from.elapsed();
        assert!(
            took >= IDLE && took < IDLE + Duration::from_secs(1),
            "{took:?}"
        );
        drop(theirs);
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
