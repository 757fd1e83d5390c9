//! What waits toward the server, and whose it is: the bounds of what the
//! host sessions of a unit may queue for a server that reads slowly or
//! not at all (issue 49).
//!
//! Every message the core sends the server is written down here, oldest
//! first, with the host it came from (mcpd's own messages: host
//! [`MCPD`]); the driver tells the core how many of them still wait in
//! the upstream's queue ([`super::Core::server_waiting`]), and the oldest
//! are forgotten as they are written (the queue is first in, first out).
//! From that the core decides, for each host:
//!
//! - **slow** ([`Toward::slow`]): a host that can be made to wait (a
//!   socket or a bridge's pipe: its own writes then block) is read no more
//!   once [`SLOW`] of its messages or [`SLOW_BYTES`] wait, until half of
//!   that is written: back-pressure, with no byte held for it;
//! - **shed** ([`Toward::admit`]): past its share of the unit's queue
//!   ([`SERVER_QUEUE`] messages and [`SERVER_QUEUE_BYTES`], divided among
//!   the attached hosts, at least [`MIN_SHARE`] and [`MIN_SHARE_BYTES`]),
//!   or the unit's queue full, a host's notifications are dropped and its
//!   requests refused (counted, and said in the journal). A host that
//!   cannot be made to wait (an HTTP session) is bounded so; an
//!   aggregate's member session can (its in-memory pair fills, and the
//!   aggregate then reads its own host no more).
//!
//! A host's flood thus never holds more than its share of the queue, and
//! another host's request waits behind at most the shares of those
//! before it.

use std::collections::VecDeque;

use foldhash::HashMap;

use super::super::route::HostId;

/// The sender of mcpd's own messages (tool syncs, probes, replays,
/// cancellations of a detached host's requests): never slowed or shed.
pub const MCPD: HostId = 0;

/// Messages of one host waiting toward the server past which it is read
/// no more (when it can be made to wait).
pub const SLOW: usize = 256;

/// Bytes of one host waiting toward the server past which it is read no
/// more (when it can be made to wait).
pub const SLOW_BYTES: usize = 256 << 10;

/// Messages that may wait toward a unit's server, all hosts together.
pub const SERVER_QUEUE: usize = 8192;

/// Bytes that may wait toward a unit's server, all hosts together.
pub const SERVER_QUEUE_BYTES: usize = 16 << 20;

/// The least share of [`SERVER_QUEUE`] a host has, however many are
/// attached.
pub const MIN_SHARE: usize = 64;

/// The least share of [`SERVER_QUEUE_BYTES`] a host has, however many are
/// attached.
pub const MIN_SHARE_BYTES: usize = 256 << 10;

/// The bytes a message mcpd made is counted for (its length is not
/// known before it is written).
const MADE: usize = 64;

/// Whether a host's message may go to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Sent.
    Pass,
    /// Past its share, or the unit's queue full: a notification dropped,
    /// a request refused.
    Shed,
}

/// A host's messages and bytes waiting toward the server.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Waiting {
    messages: usize,
    bytes: usize,
}

/// What waits toward the server, by host.
#[derive(Debug, Default)]
pub struct Toward {
    /// Every message sent and not known to be written, oldest first: its
    /// host and its bytes.
    queue: VecDeque<(HostId, usize)>,
    bytes: usize,
    by_host: HashMap<HostId, Waiting>,
    /// Hosts read no more until their messages are written.
    slowed: Vec<HostId>,
}

impl Toward {
    /// `host` sent the server a message of `bytes` (0: one mcpd made).
    pub fn sent(&mut self, host: HostId, bytes: usize) {
        let bytes = if bytes == 0 { MADE } else { bytes };
        self.queue.push_back((host, bytes));
        self.bytes += bytes;
        let w = self.by_host.entry(host).or_default();
        w.messages += 1;
        w.bytes += bytes;
    }

    /// The upstream's queue holds `messages` (the one being written
    /// included): those sent before them have been written. `true` if
    /// that let a slowed host go.
    pub fn waiting(&mut self, messages: usize) -> bool {
        if self.queue.len() <= messages {
            return false;
        }
        while self.queue.len() > messages {
            let Some((host, bytes)) = self.queue.pop_front() else {
                break;
            };
            self.bytes -= bytes;
            if let Some(w) = self.by_host.get_mut(&host) {
                w.messages -= 1;
                w.bytes -= bytes;
                if w.messages == 0 {
                    self.by_host.remove(&host);
                }
            }
        }
        !self.slowed.is_empty()
    }

    /// The upstream is gone (or new): nothing waits.
    pub fn clear(&mut self) {
        self.queue.clear();
        self.bytes = 0;
        self.by_host.clear();
    }

    fn of(&self, host: HostId) -> Waiting {
        self.by_host.get(&host).copied().unwrap_or_default()
    }

    /// Whether `host`'s message of `bytes` may go to the server, `hosts`
    /// being attached. A host's first waiting message always may, unless
    /// the unit's queue is full.
    pub fn admit(&self, host: HostId, bytes: usize, hosts: usize) -> Admit {
        if host == MCPD {
            return Admit::Pass;
        }
        let hosts = hosts.max(1);
        let share = (SERVER_QUEUE / hosts).max(MIN_SHARE);
        let share_bytes = (SERVER_QUEUE_BYTES / hosts).max(MIN_SHARE_BYTES);
        let mine = self.of(host);
        let full = self.queue.len() >= SERVER_QUEUE
            || (self.bytes > 0 && self.bytes.saturating_add(bytes) > SERVER_QUEUE_BYTES);
        let over = mine.messages >= share
            || (mine.bytes > 0 && mine.bytes.saturating_add(bytes) > share_bytes);
        if full || over {
            Admit::Shed
        } else {
            Admit::Pass
        }
    }

    /// Whether `host` is to be read no more for now: enough of its
    /// messages wait ([`SLOW`], [`SLOW_BYTES`]); marked slowed if so.
    pub fn slow(&mut self, host: HostId) -> bool {
        if host == MCPD || self.slowed.contains(&host) {
            return false;
        }
        let mine = self.of(host);
        let slow = mine.messages >= SLOW || mine.bytes >= SLOW_BYTES;
        if slow {
            self.slowed.push(host);
        }
        slow
    }

    /// The slowed hosts to read again: less than half of [`SLOW`] and of
    /// [`SLOW_BYTES`] of theirs waits (or they left).
    pub fn resume(&mut self, into: &mut Vec<HostId>) {
        let by_host = &self.by_host;
        self.slowed.retain(|host| {
            let mine = by_host.get(host).copied().unwrap_or_default();
            let go = mine.messages < SLOW / 2 && mine.bytes < SLOW_BYTES / 2;
            if go {
                into.push(*host);
            }
            !go
        });
    }

    /// Whether any host is slowed (the driver then waits for the
    /// upstream's queue to drain).
    pub fn any_slowed(&self) -> bool {
        !self.slowed.is_empty()
    }

    /// `host` left: it is no longer slowed (what it sent still waits, and
    /// is counted until written).
    pub fn left(&mut self, host: HostId) {
        self.slowed.retain(|h| *h != host);
    }

    /// Messages and bytes waiting, all hosts together.
    pub fn total(&self) -> (usize, usize) {
        (self.queue.len(), self.bytes)
    }
}
