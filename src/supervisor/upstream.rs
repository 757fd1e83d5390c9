//! mcpd's own MCP client on a generation's [`Wire`]: the handshake that
//! establishes a generation (`initialize`, `notifications/initialized`, the
//! complete tool list, read by the list reader `mux::lists`), before the
//! wire is handed to the host sessions.
//!
//! The upstream client declares `sampling`, `elicitation` and `roots`, so a
//! server lists the tools that need them; hosts answer those requests
//! through their sessions (DESIGN §8).
//!
//! With the unit's `protocol` other than `legacy` (stdio servers only),
//! `server/discover` is asked first (within half of
//! `startup-timeout`; any other answer, or none, means `initialize`): a
//! server that offers 2026-07-28 gets no `initialize`, and its discovery is
//! kept as an `initialize` result would be (`era::init_of_discover`), which
//! is how the host sessions and the cache know the era.
//! A tool list whose answers pass `LARGE` is judged and made into the
//! published `ToolList` on a blocking thread: the daemon's event loop is
//! one thread, and a list of megabytes parsed on it would hold every other
//! unit's hosts.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::clock::now;
use super::launch::ConnectError;
use super::tools::ToolList;
use crate::mux::era;
use crate::mux::error::ErrorCode;
use crate::mux::lists::{List, ListError, ListRead, Next};
use crate::mux::message::Message;
use crate::mux::method::Method;
use crate::mux::session::PROTOCOL_VERSION;
pub use crate::mux::session::upstream::{
    client_capabilities, mcpd_meta, roots_result, with_mcpd_meta,
};
use crate::mux::wire::Wire;
use crate::unit::Protocol;

/// A generation that completed its handshake.
#[derive(Debug)]
pub struct Handshake {
    pub wire: Wire,
    /// The server's `initialize` result, as it sent it.
    pub init: Arc<Value>,
    /// Every tool, from every page of `tools/list`.
    pub tools: ToolList,
    /// A `list_changed` arrived during the handshake.
    pub dirty: bool,
    /// The tools' caching hints (a server of MCP 2026-07-28).
    pub tools_hint: era::CacheHint,
}

struct Client<'a> {
    wire: &'a mut Wire,
    roots: &'a [String],
    next: u64,
    dirty: bool,
    /// The server speaks MCP 2026-07-28: every request carries mcpd's
    /// `_meta`.
    modern: bool,
    /// The caching hints of the last list read.
    hint: era::CacheHint,
}

impl Client<'_> {
    /// Sends request `method` and waits for its result, answering what
    /// the server asks meanwhile. `what` names the step for errors.
    async fn request(
        &mut self,
        method: &str,
        params: Value,
        what: &str,
    ) -> Result<Value, ConnectError> {
        let message = self.answer(method, params, what).await?;
        // The handshake's few messages, parsed whole.
        let message = message.to_value();
        if let Some(result) = message.get("result") {
            return Ok(result.clone());
        }
        let error = &message["error"];
        let text = error["message"]
            .as_str()
            .unwrap_or("no result and no error");
        Err(ConnectError::Failed(match error["code"].as_i64() {
            Some(code) => format!("{what} failed: {text} ({code})"),
            None => format!("{what} failed: {text}"),
        }))
    }

    /// Sends request `method` and waits for its answer (a result or an
    /// error), answering what the server asks meanwhile.
    async fn answer(
        &mut self,
        method: &str,
        params: Value,
        what: &str,
    ) -> Result<Message, ConnectError> {
        self.next += 1;
        let id = self.next;
        let params = if self.modern {
            with_mcpd_meta(params)
        } else {
            params
        };
        let closed =
            || ConnectError::Closed(format!("the server closed the connection during {what}"));
        self.wire
            .tx
            .send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).into())
            .map_err(|_| closed())?;
        loop {
            let message = match self.wire.rx.recv().await {
                None => return Err(closed()),
                Some(Err(why)) => {
                    return Err(ConnectError::Failed(format!("{what} failed: {why}")));
                }
                Some(Ok(message)) => message,
            };
            let asked = message.method();
            match (asked.as_deref(), message.id()) {
                (None, Some(answer)) if answer.as_u64() == Some(id) => {
                    drop(asked);
                    return Ok(message);
                }
                (Some(asked), Some(their_id)) => {
                    let reply = match Method::parse(asked) {
                        Method::Ping => json!({"jsonrpc": "2.0", "id": their_id, "result": {}}),
                        Method::RootsList => {
                            json!({"jsonrpc": "2.0", "id": their_id, "result": roots_result(self.roots)})
                        }
                        _ => ErrorCode::MethodNotFound.response(
                            &their_id,
                            format!("mcpd cannot answer {asked} before the server is initialized"),
                        ),
                    };
                    let _ = self.wire.tx.send(reply.into());
                }
                (Some(asked), None) if Method::parse(asked) == Method::ToolsListChanged => {
                    self.dirty = true;
                }
                // Answers to nothing, log messages, progress: nobody waits.
                _ => {}
            }
        }
    }

    /// Every page of `list`: complete within `timeout`, or an error
    /// naming the list and the bound.
    async fn list(&mut self, list: List, timeout: Duration) -> Result<ToolList, ConnectError> {
        let (mut pages, mut params) = Pages::new(list, timeout);
        loop {
            let answer = self.answer(list.method(), params, list.method());
            match pages.next(answer).await {
                Paged::Ask(next) => params = next,
                Paged::Done(items) => {
                    self.hint = pages.hint();
                    return Ok(items);
                }
                Paged::Asking(e) => return Err(e),
                Paged::Failed(e) => return Err(ConnectError::Failed(e.to_string())),
            }
        }
    }
}

/// Bytes of a tool list's answers past which reading and publishing it
/// is done on a blocking thread: the daemon's runtime has one thread, and
/// a list of megabytes parsed there would hold every other unit's hosts
/// (DESIGN §3: a bad server never disturbs the daemon).
pub const LARGE: usize = 1 << 20;

/// What a page judged makes.
enum Judged {
    Page(Value),
    Done(ToolList),
    Failed(ListError),
}

/// Judges `message` (`size` bytes) with `read`; the complete list made a
/// `ToolList`.
fn judge(read: &mut ListRead, message: &Message, size: usize, at: std::time::Instant) -> Judged {
    match read.answer(message, size, at) {
        Next::Page(next) => Judged::Page(next),
        Next::Done(items) => Judged::Done(ToolList::from_values(items)),
        Next::Failed(error) => Judged::Failed(error),
    }
}

/// A list read page by page by a task of its own (the handshake, the
/// tools' re-sync) with the list reader (`mux::lists`): each answer
/// waited for until the read's deadline, and judged.
pub(crate) struct Pages {
    /// None only while a page is judged on a blocking thread.
    read: Option<ListRead>,
    deadline: tokio::time::Instant,
    /// Bytes of the answers so far.
    bytes: usize,
}

/// What to do after a page.
pub(crate) enum Paged<E> {
    /// Ask for the next page with these params.
    Ask(Value),
    /// The whole list, as the tools published.
    Done(ToolList),
    /// The request for a page failed.
    Asking(E),
    /// The list reader gave up.
    Failed(ListError),
}

impl Pages {
    /// A read of `list` within `timeout`, and the first page's params.
    pub(crate) fn new(list: List, timeout: Duration) -> (Self, Value) {
        let read = ListRead::new(list, now(), timeout);
        let first = read.first();
        let deadline = tokio::time::Instant::from_std(read.deadline());
        let pages = Self {
            read: Some(read),
            deadline,
            bytes: 0,
        };
        (pages, first)
    }

    /// The caching hints of the pages read (a server of 2026-07-28).
    pub(crate) fn hint(&self) -> crate::mux::era::CacheHint {
        self.read.as_ref().map(ListRead::hint).unwrap_or_default()
    }

    /// Waits for `answer`, the page asked for, until the deadline.
    pub(crate) async fn next<E>(
        &mut self,
        answer: impl Future<Output = Result<Message, E>>,
    ) -> Paged<E> {
        let message = match tokio::time::timeout_at(self.deadline, answer).await {
            Ok(Ok(message)) => message,
            Ok(Err(e)) => return Paged::Asking(e),
            Err(_) => {
                let Some(read) = &self.read else {
                    return Paged::Failed(ListError {
                        list: List::Tools,
                        why: crate::mux::lists::Why::Lost("the read timed out".into()),
                    });
                };
                return Paged::Failed(
                    read.expired(now())
                        .unwrap_or_else(|| read.lost("the read timed out")),
                );
            }
        };
        let Some(mut read) = self.read.take() else {
            return Paged::Failed(ListError {
                list: List::Tools,
                why: crate::mux::lists::Why::Lost("the read was lost".into()),
            });
        };
        let size = message.received();
        self.bytes += size;
        let at = now();
        let judged = if self.bytes >= LARGE {
            let work = tokio::task::spawn_blocking(move || {
                let judged = judge(&mut read, &message, size, at);
                (read, judged)
            });
            match work.await {
                Ok((read, judged)) => {
                    self.read = Some(read);
                    judged
                }
                Err(_) => Judged::Failed(ListError {
                    list: List::Tools,
                    why: crate::mux::lists::Why::Lost("reading the list failed".into()),
                }),
            }
        } else {
            let judged = judge(&mut read, &message, size, at);
            self.read = Some(read);
            judged
        };
        match judged {
            Judged::Page(next) => Paged::Ask(next),
            Judged::Done(tools) => Paged::Done(tools),
            Judged::Failed(error) => Paged::Failed(error),
        }
    }
}

/// What the probe found: the server's discovery result when it speaks MCP
/// 2026-07-28, else why it is taken for a server of the handshake.
async fn probe(client: &mut Client<'_>, bound: Duration) -> Result<Value, String> {
    let discover = Method::ServerDiscover.as_str();
    let answer = client.answer(discover, json!({"_meta": mcpd_meta()}), discover);
    let message = match tokio::time::timeout(bound, answer).await {
        Err(_) => return Err(format!("no answer to server/discover within {bound:?}")),
        Ok(Err(ConnectError::Closed(why))) => return Err(why),
        Ok(Err(ConnectError::Failed(why))) => return Err(why),
        Ok(Err(e @ ConnectError::NeedsLogin)) => return Err(e.message().to_owned()),
        Ok(Ok(message)) => message.to_value(),
    };
    if let Some(error) = message.get("error") {
        return Err(format!(
            "server/discover failed: {} ({})",
            error["message"].as_str().unwrap_or("no message"),
            error["code"]
        ));
    }
    let result = &message["result"];
    let modern = result["supportedVersions"]
        .as_array()
        .is_some_and(|versions| versions.iter().any(|v| v == era::MODERN));
    if !modern || !result["capabilities"].is_object() {
        return Err(format!(
            "server/discover did not offer {} (supportedVersions {})",
            era::MODERN,
            result["supportedVersions"]
        ));
    }
    Ok(result.clone())
}

/// Runs the handshake on `wire`; the tool list must be complete within
/// `list_timeout` of its first request. With `protocol` other than
/// legacy, `server/discover` is asked first (within half of
/// `list_timeout`, the unit's `startup-timeout`: a server still loading
/// under load is waited for, not taken for one of the handshake; one that
/// ignores the request costs this once per start): a server that answers it as a server of MCP
/// 2026-07-28 is spoken to in that era, any other answer (or none) means
/// `initialize` (unless the unit pins 2026-07-28: then the start fails).
/// `capabilities` are what the client declares in `initialize` (an
/// instance's host's, DESIGN §13); none: mcpd's own
/// ([`client_capabilities`]).
pub async fn handshake(
    mut wire: Wire,
    roots: &[String],
    list_timeout: Duration,
    (protocol, name): (Protocol, &str),
    capabilities: Option<Value>,
) -> Result<Handshake, ConnectError> {
    let mut client = Client {
        wire: &mut wire,
        roots,
        next: 0,
        dirty: false,
        modern: false,
        hint: era::CacheHint::default(),
    };
    if protocol != Protocol::Legacy {
        // Half the start's time: initialize must fit after it.
        match probe(&mut client, list_timeout / 2).await {
            Ok(discovered) => {
                // No initialize: its identity, capabilities and
                // instructions kept as an initialize result holds them.
                client.modern = true;
                let init = era::init_of_discover(&discovered);
                let tools = if init["capabilities"].get("tools").is_some() {
                    client.list(List::Tools, list_timeout).await?
                } else {
                    ToolList::default()
                };
                let (dirty, tools_hint) = (client.dirty, client.hint);
                return Ok(Handshake {
                    wire,
                    init: Arc::new(init),
                    tools,
                    dirty,
                    tools_hint,
                });
            }
            Err(why) if protocol == Protocol::Modern => {
                return Err(ConnectError::Failed(format!(
                    "the unit pins protocol {} and the server does not speak it: {why}",
                    era::MODERN
                )));
            }
            Err(why) => {
                tracing::info!(target: "mcpd::supervisor", mcpd_server = %name, "speaking MCP {PROTOCOL_VERSION}: {why}");
            }
        }
    }
    let init = client
        .request(
            Method::Initialize.as_str(),
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": capabilities.unwrap_or_else(client_capabilities),
                "clientInfo": {"name": "mcpd", "version": env!("CARGO_PKG_VERSION")},
            }),
            Method::Initialize.as_str(),
        )
        .await?;
    if !init.is_object() || !init["protocolVersion"].is_string() {
        return Err(ConnectError::Failed(
            "initialize failed: the answer has no protocolVersion".into(),
        ));
    }
    client
        .wire
        .tx
        .send(json!({"jsonrpc": "2.0", "method": Method::Initialized.as_str()}).into())
        .map_err(|_| {
            ConnectError::Closed("the server closed the connection during initialize".into())
        })?;
    let tools = if init["capabilities"].get("tools").is_some() {
        client.list(List::Tools, list_timeout).await?
    } else {
        ToolList::default()
    };
    let dirty = client.dirty;
    Ok(Handshake {
        wire,
        init: Arc::new(init),
        tools,
        dirty,
        tools_hint: era::CacheHint::default(),
    })
}
