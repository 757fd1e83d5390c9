//! The lists a unit's host sessions keep besides the tools (resources,
//! templates, prompts: `List::KEPT`): read page by page by the list
//! reader (`mux::lists`) after each handshake and on the server's
//! `list_changed` (told to hosts then, as the server told it), published
//! when they differ, answered to hosts from
//! here, kept through outages and after a failed read. A server of MCP
//! 2026-07-28 may say how long a list stays good (`ttlMs`): a host's
//! request for a list (the tools too) whose TTL passed has it read
//! again, at most once per TTL (`era::CacheHint`).

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::super::era::{CacheHint, Fresh};
use super::super::error::ErrorCode;
use super::super::lists::{List, ListError, ListRead, Next};
use super::super::message::{Message, RequestId};
use super::super::method::Method;
use super::super::route::HostId;
use super::classify;
use super::{Core, Level, Notice, Out, Publish, Waiter};

/// A kept list's reads.
#[derive(Debug, Default)]
pub(super) struct Cache {
    /// Being read now.
    reading: Option<ListRead>,
    /// The upstream id of the page asked for.
    asked: Option<u64>,
    /// Why the last read failed, once warned about (a read that fails
    /// the same way again is not warned about again).
    failed: Option<String>,
    /// The server said it changed while it was being read.
    dirty: bool,
    /// The read was asked for by the server's `list_changed`: hosts are
    /// told of the result even when there was no list before.
    notify: bool,
    /// The caching hints of the list kept, and when it was read (or
    /// last asked to be read again).
    hint: CacheHint,
    read_at: Option<Instant>,
}

impl Cache {
    /// When the read under way gives up, if one is.
    pub(super) fn deadline(&self) -> Option<std::time::Instant> {
        self.reading.as_ref().map(ListRead::deadline)
    }
}

impl Core {
    /// The page asked for will not be answered (the upstream ended): the
    /// list is read again on the next handshake.
    pub(super) fn page_unanswered(&mut self, kind: List) {
        let cache = &mut self.caches[kind.index()];
        cache.reading = None;
        cache.asked = None;
        self.arm();
        self.check_listed();
    }

    /// Publishes list `kind`; returns the one it replaces.
    pub(super) fn set_list(&mut self, kind: List, list: Option<Arc<str>>) -> Option<Arc<str>> {
        let old = std::mem::replace(&mut self.lists[kind.index()], list.clone());
        if old != list {
            self.out(Out::Publish(Publish::List(kind, list)));
        }
        old
    }

    pub(super) fn cached(&self, kind: List) -> Option<Arc<str>> {
        self.lists[kind.index()].clone()
    }

    /// Reads list `kind` from the server (again, once the read in flight
    /// is done, if one is), by the list reader: complete within the
    /// unit's `startup-timeout`, at most `MAX_PAGES` pages and
    /// `MAX_BYTES` bytes, never a cursor twice.
    pub(super) fn read_list(&mut self, kind: List, notify: bool) {
        let cache = &mut self.caches[kind.index()];
        cache.notify |= notify;
        if cache.reading.is_some() {
            cache.dirty = true;
            return;
        }
        let read = ListRead::new(kind, self.now, self.settings.list_timeout);
        let params = read.first();
        cache.reading = Some(read);
        self.request_page(kind, params);
        self.arm();
    }

    pub(super) fn request_page(&mut self, kind: List, params: Value) {
        let (id, outs) = self.router.request(kind.method(), params);
        self.own.insert(id, Waiter::Page(kind));
        self.caches[kind.index()].asked = Some(id);
        self.deliver(outs, None);
    }

    /// Says so once every list of the generation being read is read.
    pub(super) fn check_listed(&mut self) {
        if let Some(generation) = self.reading_for
            && self.caches.iter().all(|c| c.reading.is_none())
        {
            self.reading_for = None;
            self.out(Out::Publish(Publish::Listed(generation)));
        }
    }

    /// The timer of the list reads fired: those past their deadline fail
    /// (their page in flight is cancelled upstream).
    pub(super) fn lists_expired(&mut self) {
        let now = self.now;
        for kind in List::KEPT {
            let cache = &mut self.caches[kind.index()];
            let Some(error) = cache.reading.as_ref().and_then(|r| r.expired(now)) else {
                continue;
            };
            if let Some(id) = cache.asked.take() {
                self.own.remove(&id);
                let outs = self.router.cancel(id);
                self.deliver(outs, None);
            }
            self.list_failed(kind, error);
        }
        self.arm();
        self.check_listed();
    }

    /// A page of list `kind` arrived.
    pub(super) fn page(&mut self, kind: List, id: u64, answer: &Message) {
        if self.caches[kind.index()].asked != Some(id) {
            // The page of a read given up since (a stop, its deadline).
            return;
        }
        self.read_page(kind, answer);
        self.arm();
        self.check_listed();
    }

    pub(super) fn read_page(&mut self, kind: List, answer: &Message) {
        let cache = &mut self.caches[kind.index()];
        cache.asked = None;
        let Some(reading) = cache.reading.as_mut() else {
            return;
        };
        let items = match reading.answer(answer, answer.received(), self.now) {
            Next::Page(params) => {
                self.request_page(kind, params);
                return;
            }
            Next::Failed(error) => {
                self.list_failed(kind, error);
                return;
            }
            Next::Done(items) => {
                cache.hint = reading.hint();
                items
            }
        };
        cache.reading = None;
        cache.read_at = Some(self.now);
        cache.failed = None;
        let dirty = std::mem::take(&mut cache.dirty);
        let notify = std::mem::take(&mut cache.notify);
        let new: Arc<str> = Arc::from(Value::Array(items).to_string());
        let old = self.set_list(kind, Some(Arc::clone(&new)));
        // Hosts hear of it if the server said so (as they would from the
        // server directly, even of a list that came back the same), or if
        // it differs from what they have; hosts attached before the first
        // read had the server's own answers.
        let changed = notify || old.is_some_and(|old| old != new);
        if changed {
            self.broadcast(kind.notification());
        }
        if dirty {
            self.read_list(kind, true);
        }
    }

    /// A read of list `kind` failed: the server goes on serving its tools
    /// and hosts the last good list (or the server's own answers, if none
    /// was read); the operator is told once per distinct failure, in the
    /// log and in the unit's last error.
    pub(super) fn list_failed(&mut self, kind: List, error: ListError) {
        let cache = &mut self.caches[kind.index()];
        cache.reading = None;
        cache.asked = None;
        cache.notify = false;
        let error = error.to_string();
        let warn = cache.failed.as_deref() != Some(error.as_str());
        if warn {
            cache.failed = Some(error.clone());
        }
        let dirty = std::mem::take(&mut cache.dirty);
        if warn {
            self.log(
                Level::Warn,
                None,
                format!("{error}; keeping the list read before"),
            );
            if let Some(generation) = self.upstream {
                self.out(Out::Notice(Notice::ListFailed { generation, error }));
            }
        }
        if dirty {
            // The server said it changed since: one more try.
            self.read_list(kind, true);
        }
    }

    /// Answers a host's list request from the cache, if the list is kept
    /// (or, while an on-demand server does not run, with the error it
    /// would give if it does not offer the list: listing never starts it).
    pub(super) fn answer_list(&mut self, host: HostId, id: &RequestId, method: Method) -> bool {
        let Some(kind) = List::of(method).filter(|k| List::KEPT.contains(k)) else {
            return false;
        };
        let fresh = self.list_asked(kind);
        let Some(list) = self.cached(kind) else {
            let offered = self
                .init
                .as_ref()
                .is_some_and(|init| init["capabilities"].get(kind.capability()).is_some());
            if self.settings.on_demand && self.upstream.is_none() && !offered {
                let text = format!("server {} does not offer {}", self.name, kind.capability());
                self.send(
                    host,
                    ErrorCode::MethodNotFound.response(&id.to_value(), text),
                );
                return true;
            }
            return false;
        };
        let modern = self.hosts.get(&host).is_some_and(|h| h.modern.is_some());
        let bytes = if modern {
            if let Some(m) = self
                .hosts
                .get_mut(&host)
                .and_then(|h| h.modern.as_deref_mut())
            {
                m.close(id);
            }
            super::super::era::list_answer(id, kind.key(), &list, &self.server_info(), fresh)
        } else {
            classify::list_answer(id, kind.key(), &list)
        };
        self.answered(host, id);
        self.send_bytes(host, bytes);
        true
    }

    /// A host asks for list `kind` (kept here): read again first if its
    /// server (of MCP 2026-07-28, running) said how long it stays good
    /// and that passed; what the host is told of it.
    fn list_asked(&mut self, kind: List) -> Fresh {
        let now = self.now;
        let modern = self.modern_up && self.upstream.is_some();
        let cache = &mut self.caches[kind.index()];
        let Some(read) = cache.read_at else {
            return Fresh::default();
        };
        if modern
            && cache.reading.is_none()
            && cache.hint.stale_at(read).is_some_and(|at| now >= at)
        {
            // Once per TTL (at least `MIN_LIST_TTL`), whatever the read
            // does: hosts are answered from what is kept meanwhile, and
            // hear `list_changed` if the new list differs.
            cache.read_at = Some(now);
            self.read_list(kind, false);
            return Fresh::default();
        }
        cache.hint.fresh(read, now)
    }

    /// A host asks for the tools: read again (by the actor's re-sync, as
    /// after `list_changed`) if their server (of MCP 2026-07-28, running)
    /// said how long they stay good and that passed; what the host is
    /// told of them.
    pub(super) fn tools_asked(&mut self) -> Fresh {
        let now = self.now;
        let modern = self.modern_up && self.upstream.is_some();
        let Some((hint, read)) = self.tools_fresh else {
            return Fresh::default();
        };
        if modern && hint.stale_at(read).is_some_and(|at| now >= at) {
            // Once per TTL: the re-read sets the time again when done.
            self.tools_fresh = Some((hint, now));
            self.tools_changed();
            return Fresh::default();
        }
        hint.fresh(read, now)
    }

    /// The tools are to be read again (the server said `list_changed`, or
    /// their TTL passed): hosts hear of it once mcpd has re-synced
    /// (status_changed). The driver sends one notice at a time: a storm
    /// wakes the actor once per notice it takes, not once per
    /// notification.
    pub(super) fn tools_changed(&mut self) {
        if let Some(generation) = self.upstream {
            self.out(Out::Notice(Notice::ToolsChanged { generation }));
        }
    }
}
