//! One HTTP session (MCP Streamable HTTP, 2025-11-25 sessions): the task
//! between the HTTP requests of one `Mcp-Session-Id` and a host session
//! of its unit (or aggregate), reached as every host reaches one: a
//! pair (in memory, `mux::memory`), one end attached through
//! `Supervisor::attach` (or `aggregate::attach`), so the unit's routing,
//! bounds, eras and accounting are the bridge's.
//!
//! Each POSTed request gets a stream (`Sink`): its answer ends it. What
//! the unit sends that is not an answer goes to the stream of the request
//! it concerns when the task can tell (a progress token), else to the
//! newest request's stream, else to the GET stream; with none open it is
//! dropped (the spec lets a server send only on open streams). A stream
//! whose client does not read ([`STREAM_QUEUE`] messages behind) is
//! dropped; the session goes on.

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
/// What is queued for the unit, as the aggregate queues for a member.
const QUEUE: usize = 4096;
const QUEUE_BYTES: usize = 32 << 20;

/// Where one stream's messages go: SSE `data:` payloads (or, for a JSON
/// response, the one answer).
pub type Sink = mpsc::Sender<Bytes>;

/// What the HTTP side asks of a session.
#[derive(Debug)]
pub enum Command {
    /// A request; its answer (and what concerns it) goes to `sink`.
    Request {
        message: Message,
        id: RequestId,
        sink: Sink,
        /// A JSON response: only the answer goes to `sink`.
        json: bool,
    },
    /// A notification or an answer to the server's request.
    Forward(Message),
    /// The GET stream (replacing an earlier one).
    Listen(Sink),
    /// The session ends (DELETE), for this reason.
    End(String),
}

struct Pending {
    id: RequestId,
    progress: Option<Value>,
    sink: Sink,
    json: bool,
}

/// Runs the session until DELETE, the unit's side ending, every handle
/// gone or [`IDLE`]; `end` is called with the reason once it is over.
pub async fn run(
    label: String,
    link: HostLink,
    mut commands: mpsc::Receiver<Command>,
    revoked: std::sync::Arc<tokio::sync::Notify>,
    end: impl FnOnce(&str),
) {
    let opened = link.open(0, QUEUE, QUEUE_BYTES);
    let mut reader = opened.reader;
    let _stop = opened.stop;
    let mut task = Task {
        out: opened.out,
        pending: Vec::new(),
        listen: None,
    };
    let why: String = loop {
        let idle = task.pending.is_empty() && task.listen.is_none();
        let idle_at = idle.then(|| tokio::time::Instant::now() + IDLE);
        tokio::select! {
            command = commands.recv() => match command {
                None => break "the endpoint stopped".into(),
                Some(Command::End(why)) => break why,
                Some(command) => {
                    if let Err(why) = task.command(command) {
                        break why;
                    }
                }
            },
            event = reader.next() => match event {
                Some(Event::Host(_, Some(Frame::Message(message)))) => task.on_unit(message),
                Some(Event::Host(_, Some(_))) => {}
                Some(Event::Host(_, None)) | None => break format!("{label} ended the session"),
                Some(Event::Server(..)) => {}
            },
            () = revoked.notified() => break "its token was revoked".into(),
            () = sleep_until(idle_at) => break format!("idle for {}", humantime::format_duration(IDLE)),
        }
    };
    // Requests in flight are answered, never left hanging.
    for pending in task.pending.drain(..) {
        let error = error_line(
            Some(&pending.id),
            -32000,
            &format!("the session ended: {why}"),
        );
        let _ = pending.sink.try_send(error);
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
    listen: Option<Sink>,
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
                    let _ = sink.try_send(error_line(
                        Some(&id),
                        -32600,
                        "a request with this id is already in flight",
                    ));
                    return Ok(());
                }
                if self.pending.len() >= MAX_IN_FLIGHT {
                    let _ = sink.try_send(error_line(
                        Some(&id),
                        -32000,
                        &format!("more than {MAX_IN_FLIGHT} requests in flight in one session"),
                    ));
                    return Ok(());
                }
                let progress = message
                    .params()
                    .and_then(|p| p.get("_meta")?.get("progressToken").cloned());
                self.send(&message)?;
                self.pending.push(Pending {
                    id,
                    progress,
                    sink,
                    json,
                });
            }
            Command::Forward(message) => self.send(&message)?,
            Command::Listen(sink) => self.listen = Some(sink),
            Command::End(_) => {}
        }
        Ok(())
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
                let _ = pending.sink.try_send(Bytes::from(message.line()));
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
        let at = concerns
            .and_then(|token| {
                self.pending
                    .iter()
                    .position(|p| !p.json && p.progress.as_ref() == Some(&token))
            })
            .or_else(|| self.pending.iter().rposition(|p| !p.json));
        let line = Bytes::from(message.line());
        match at {
            Some(at) => {
                if self.pending[at].sink.try_send(line).is_err() {
                    // Its client does not read: that stream goes (its
                    // answer too); the session stays.
                    self.pending.remove(at);
                }
            }
            None => {
                if let Some(listen) = &self.listen
                    && listen.try_send(line).is_err()
                {
                    self.listen = None;
                }
            }
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
    let mut unsent = Some(message);
    let mut parked: Option<(String, tokio::time::Instant)> = None;
    loop {
        if let Some(message) = unsent.take()
            && opened.out.send(message.line()).is_err()
        {
            if let Some(sink) = &sink {
                let _ = sink.try_send(error_line(
                    Some(&id),
                    -32000,
                    "the unit does not read what it is sent",
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
                            let _ = to.try_send(line);
                            let Some(state) = input_required(&message) else {
                                break;
                            };
                            park(&state, retry_tx.clone());
                            parked = Some((state, tokio::time::Instant::now() + PARKED));
                            sink = None;
                        }
                    } else if !json && to.try_send(line).is_err() {
                        break;
                    }
                }
                Some(Event::Host(_, Some(_)) | Event::Server(..)) => {}
                Some(Event::Host(_, None)) | None => {
                    if let Some(sink) = &sink {
                        let _ = sink.try_send(error_line(Some(&id), -32000, "the unit ended the session"));
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
                unsent = Some(retry.message);
            }
            () = sleep_until(until) => break,
            changed = epoch.changed() => {
                if changed.is_err() || !valid() {
                    if let Some(sink) = &sink {
                        let _ = sink.try_send(error_line(Some(&id), -32000, "its token was revoked"));
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
