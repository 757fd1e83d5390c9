//! One host session over several units (DESIGN §14): the task that runs
//! an aggregate ([`crate::mux::aggregate`] decides everything) between the
//! host and one host session of each member unit.
//!
//! Each member is reached as any host reaches a unit: a stream pair (in
//! memory, [`crate::mux::memory`]: the member's session is another task of
//! this daemon), one end attached to the unit's sessions
//! (`Supervisor::attach`), so outages,
//! on-demand starts, both protocol eras, bounds and accounting stay the
//! unit's own. The task follows the read model: a reload that adds a unit
//! to the group, removes one, or changes its alias, joins or leaves it
//! while the host stays attached.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::SelectAll;

use crate::model::Shared;
use crate::mux::aggregate::{Aggregate, MemberId, Out, Target};
use crate::mux::attach::Control;
use crate::mux::error::ErrorCode;
use crate::mux::host::{Event, HostOut, Opened, Reader, StopReading};
use crate::mux::lines::Frame;
use crate::mux::lists::List;
use crate::mux::message::Message;
use crate::mux::method::Method;
use crate::supervisor::{Caller, HostLink};

/// Messages and bytes queued for the host, or for a member, behind the
/// one being written (as a unit's sessions queue for a host).
const QUEUE: usize = 4096;
const QUEUE_BYTES: usize = 32 << 20;
/// What each direction between the aggregate and a member holds before
/// its writer queues (a socket's buffer, as the socket pair it replaced).
const MEMBER_BUFFER: usize = 256 << 10;

/// The host's reader among the task's readers; members are `1 + id`.
const HOST: u64 = 0;

/// Messages waiting toward one member (behind what its session took)
/// past which the host is read no more, and the bytes: a member whose
/// session holds it back (its server reads slowly) holds back the host,
/// as a unit's own host would be, instead of the aggregate reading the
/// host as fast as it writes (issue 49). It is read again once every
/// member's queue is under half of both.
const HOLD: usize = 64;
const HOLD_BYTES: usize = 256 << 10;

struct Linked {
    unit: String,
    prefix: String,
    out: HostOut,
    _stop: StopReading,
    supervisor: crate::supervisor::Supervisor,
    /// While its session refuses the host's `initialize`: the unit's
    /// state, to ask again when it changes.
    waiting: Option<tokio::sync::watch::Receiver<crate::supervisor::Status>>,
}

/// Starts the aggregate session of `target` for the host on `link`;
/// refused (naming why) when `target` names a unit that is not there or a
/// group with no unit.
pub fn attach(
    shared: &Arc<Shared>,
    target: Target,
    link: HostLink,
    caller: Caller,
) -> Result<(), String> {
    let members = shared.members(&target)?;
    if members.is_empty() {
        return Err(format!("{}: no unit to serve", target.label()));
    }
    let shared = Arc::clone(shared);
    tokio::spawn(run(shared, target, link, caller));
    Ok(())
}

async fn run(shared: Arc<Shared>, target: Target, link: HostLink, caller: Caller) {
    let label = target.label();
    let Opened {
        reader,
        stop: _host_stop,
        hold,
        out: host_out,
        control,
        replay,
        ledger,
    } = link.open(HOST, QUEUE, QUEUE_BYTES);
    let mut readers: SelectAll<Reader> = SelectAll::new();
    readers.push(reader);
    let mut task = Task {
        aggregate: Aggregate::new(label.clone()),
        members: HashMap::new(),
        host_out,
        control,
        caller,
        label,
        swallow: None,
        ended: None,
        ledger,
        hold,
        held: false,
        drained: Arc::new(tokio::sync::Notify::new()),
    };
    let drained = Arc::clone(&task.drained);
    let mut published = shared.published.subscribe();
    task.follow(&shared, &target, &mut readers);
    if let Some(replay) = replay {
        // An `initialize` of the host's earlier session (mcpd restarted):
        // handled first, its answer to nobody, and the host told the lists
        // may have changed.
        let message = Message::from(replay);
        task.swallow = message.request_id();
        let outs = task.aggregate.on_host(message);
        task.deliver(outs);
    }
    while task.ended.is_none() {
        tokio::select! {
            event = readers.next() => match event {
                Some(Event::Host(HOST, frame)) => task.host_frame(frame),
                Some(Event::Host(n, frame)) => task.member_frame((n - 1) as MemberId, frame),
                Some(Event::Server(..)) => {}
                None => break,
            },
            () = drained.notified(), if task.held => {}
            id = task.next_state_change(), if task.waits() => task.state_changed(id),
            changed = published.changed() => {
                if changed.is_err() {
                    break;
                }
                tracing::debug!(target: "mcpd::sessions", mcpd_aggregate = %task.label, "units published");
                task.follow(&shared, &target, &mut readers);
            }
        }
        task.hold_back();
    }
    if let Some(why) = task.ended.take().flatten() {
        tracing::warn!(target: "mcpd::sessions", mcpd_aggregate = %task.label, pid = ?task.caller.pid, "detaching aggregate session: {why}");
        task.host_out.shutdown();
        if let Some(control) = &task.control {
            let _ = control.send(crate::mux::attach::line(&Control::End(Some(why))));
        }
    }
}

struct Task {
    aggregate: Aggregate,
    members: HashMap<MemberId, Linked>,
    host_out: HostOut,
    control: Option<crate::mux::outbox::Outbox<tokio::net::unix::OwnedWriteHalf>>,
    caller: Caller,
    label: String,
    /// The id of a replayed `initialize`, whose answer nobody waits for.
    swallow: Option<crate::mux::message::RequestId>,
    /// Set when the session is over: `Some(why)` when mcpd ends it.
    ended: Option<Option<String>>,
    /// A handed-over session's ledger (`mux::ledger`): the host's
    /// requests read and not yet answered, for its bridge to fail if the
    /// daemon is killed, as a unit's own session keeps one.
    ledger: Option<Box<crate::mux::ledger::Ledger>>,
    /// Holds the host's reader back while a member's queue is long
    /// ([`HOLD`]); `held` while it does.
    hold: crate::mux::host::HoldReading,
    held: bool,
    /// Woken as a member's queue is written.
    drained: Arc<tokio::sync::Notify>,
}

impl Task {
    /// Joins the units the target is over now and lets go of those it is
    /// not (or whose prefix changed).
    fn follow(&mut self, shared: &Shared, target: &Target, readers: &mut SelectAll<Reader>) {
        let wanted = shared.members(target).unwrap_or_default();
        let gone: Vec<MemberId> = self
            .members
            .iter()
            .filter(|(_, l)| {
                !wanted
                    .iter()
                    .any(|(unit, prefix, _)| *unit == l.unit && *prefix == l.prefix)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.leave(id, "left the group");
        }
        for (unit, prefix, supervisor) in wanted {
            if self.members.values().any(|l| l.unit == unit) {
                continue;
            }
            // In memory: the member's session is another task of this
            // daemon, so its messages cross no system call.
            let (mine, theirs) = crate::mux::memory::pair(MEMBER_BUFFER);
            supervisor
                .clone()
                .attach(HostLink::Memory(theirs), self.caller.clone());
            let (id, outs) = self.aggregate.join(&unit, &prefix);
            tracing::debug!(target: "mcpd::sessions", mcpd_aggregate = %self.label, "{unit} joins as {prefix}");
            let opened = HostLink::Memory(mine).open(id as u64 + 1, QUEUE, QUEUE_BYTES);
            readers.push(opened.reader);
            self.members.insert(
                id,
                Linked {
                    unit,
                    prefix,
                    out: opened.out.notify_drained(Arc::clone(&self.drained)),
                    _stop: opened.stop,
                    supervisor,
                    waiting: None,
                },
            );
            self.deliver(outs);
        }
    }

    /// Holds the host back while a member's queue is past [`HOLD`] (its
    /// session reads it no more: its server is slow), and lets it go
    /// once every member's is under half.
    fn hold_back(&mut self) {
        let backlogs = self.members.values().map(|l| l.out.backlog());
        let held = if self.held {
            !backlogs
                .into_iter()
                .all(|(n, bytes)| n < HOLD / 2 && bytes < HOLD_BYTES / 2)
        } else {
            backlogs
                .into_iter()
                .any(|(n, bytes)| n >= HOLD || bytes >= HOLD_BYTES)
        };
        if held != self.held {
            self.held = held;
            self.hold.hold(held);
            tracing::debug!(target: "mcpd::sessions", mcpd_aggregate = %self.label, "host {}", if held { "held back: a member reads slowly" } else { "read again" });
        }
    }

    /// Whether a member waits for its unit to run.
    fn waits(&self) -> bool {
        self.members.values().any(|l| l.waiting.is_some())
    }

    /// The next member whose unit's state changed while it waited.
    async fn next_state_change(&mut self) -> MemberId {
        let waits = self.members.iter_mut().filter_map(|(id, l)| {
            let rx = l.waiting.as_mut()?;
            let id = *id;
            Some(Box::pin(async move {
                // A unit whose supervisor went is left by the next reload.
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                id
            }))
        });
        futures_util::future::select_all(waits).await.0
    }

    /// Member `id`'s unit changed state: once it may serve, its session
    /// is asked again.
    fn state_changed(&mut self, id: MemberId) {
        let Some(linked) = self.members.get_mut(&id) else {
            return;
        };
        let state = linked.supervisor.status().state;
        if matches!(
            state,
            crate::supervisor::State::Stopped | crate::supervisor::State::Failed
        ) {
            return;
        }
        linked.waiting = None;
        let outs = self.aggregate.rejoin(id);
        self.deliver(outs);
    }

    /// Members whose session refused the host's `initialize` wait for
    /// their unit's state to change.
    fn watch_refused(&mut self) {
        for id in self.aggregate.refused() {
            if let Some(linked) = self.members.get_mut(&id)
                && linked.waiting.is_none()
            {
                let mut rx = linked.supervisor.subscribe();
                rx.mark_unchanged();
                let state = rx.borrow().state;
                linked.waiting = Some(rx);
                if matches!(
                    state,
                    crate::supervisor::State::Running | crate::supervisor::State::Idle
                ) {
                    // It serves already: ask at once.
                    self.state_changed(id);
                }
            }
        }
    }

    fn leave(&mut self, id: MemberId, why: &str) {
        if let Some(linked) = self.members.remove(&id) {
            linked.out.shutdown();
        }
        let outs = self.aggregate.leave(id, why);
        self.deliver(outs);
    }

    fn host_frame(&mut self, frame: Option<Frame>) {
        let outs = match frame {
            None => {
                self.ended = Some(None);
                return;
            }
            Some(Frame::Message(message)) => {
                let method = message.method_kind();
                if let Some(ledger) = &mut self.ledger {
                    if message.has("method")
                        && let Some(id) = message.id_text()
                    {
                        ledger.record(&id);
                    } else if method == Some(Method::Cancelled)
                        && let Some(params) = message.params()
                        && let Some(id) = params.get("requestId").filter(|id| !id.is_null())
                    {
                        // A request the host cancelled is answered by no one.
                        ledger.clear(&crate::mux::message::id_key(id));
                    }
                }
                if method == Some(Method::Initialize)
                    && let Some(control) = &self.control
                {
                    let _ = control.send(crate::mux::attach::line(&Control::Initialize(
                        message.to_value(),
                    )));
                }
                self.aggregate.on_host(message)
            }
            Some(Frame::Garbage(why)) => vec![Out::Host(
                ErrorCode::ParseError
                    .error(format!("parse error: {why}"))
                    .to_message(None),
            )],
            Some(Frame::TooLong(id)) => vec![Out::Host(
                ErrorCode::InvalidRequest
                    .error("message too long")
                    .to_message(id.as_ref()),
            )],
        };
        self.deliver(outs);
    }

    fn member_frame(&mut self, id: MemberId, frame: Option<Frame>) {
        match frame {
            None => {
                let unit = self.members.get(&id).map(|l| l.unit.clone());
                if let Some(unit) = unit {
                    tracing::info!(target: "mcpd::sessions", mcpd_aggregate = %self.label, "{unit} ended its session");
                }
                self.leave(id, "its session ended");
            }
            Some(Frame::Message(message)) => {
                let outs = self.aggregate.on_member(id, message);
                self.deliver(outs);
                self.watch_refused();
                for (uri, units) in self.aggregate.collisions() {
                    tracing::warn!(target: "mcpd::sessions", mcpd_aggregate = %self.label, "resource {uri} is listed by {}: {} serves it", units.join(" and "), units[0]);
                }
            }
            Some(_) => {}
        }
    }

    fn deliver(&mut self, outs: Vec<Out>) {
        for out in outs {
            match out {
                Out::Host(message) => {
                    if let Some(ledger) = &mut self.ledger
                        && !message.has("method")
                        && let Some(id) = message.id_text()
                    {
                        ledger.clear(&id);
                    }
                    if self.swallow.is_some() && message.request_id() == self.swallow {
                        self.swallow = None;
                        for list in [List::Tools, List::Prompts, List::Resources] {
                            let notice = Message::from(serde_json::json!(
                                {"jsonrpc": "2.0", "method": list.changed()}
                            ));
                            let _ = self.host_out.send(notice.line());
                        }
                        continue;
                    }
                    if self.host_out.send(message.line()).is_err() && self.ended.is_none() {
                        self.ended = Some(Some("the host does not read what it is sent".into()));
                    }
                }
                Out::Member(id, message) => {
                    let refused = match self.members.get(&id) {
                        Some(linked) => linked.out.send(message.line()).is_err(),
                        None => false,
                    };
                    if refused {
                        self.leave(id, "its session does not read what it is sent");
                    }
                }
            }
        }
    }
}
