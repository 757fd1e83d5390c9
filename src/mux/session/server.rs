//! What the upstream sends the host sessions, beside what the router
//! routes: `list_changed` (re-syncs), `roots/list` from the unit's
//! `roots`, log messages (for the journal), signs of life, and who had
//! requests in flight when the server failed.

use std::time::Instant;

use serde_json::json;

use super::super::lists::List;
use super::super::message::Message;
use super::super::method::Method;
use super::super::route::{HostId, Out as RouteOut};
use super::upstream::roots_result;
use super::{Core, Out, Purpose, Waiter};

impl Core {
    /// The server of the current generation sent `message` (read at
    /// `now`).
    pub fn server_message(&mut self, message: Message, now: Instant) {
        self.now = now;
        self.on_server(message);
        self.settle_doomed();
    }

    fn on_server(&mut self, message: Message) {
        let method = message.method_kind();
        let has_id = message.raw("id").is_some_and(|id| id != "null");
        if method.is_some() {
            self.out(Out::Heard(self.now));
        }
        match method {
            // mcpd's listen stream opened (a server of MCP 2026-07-28).
            Some(Method::SubscriptionsAcknowledged) if !has_id => return,
            Some(Method::ToolsListChanged) if !has_id => {
                self.tools_owed = true;
                self.tools_changed();
                return;
            }
            Some(changed @ (Method::ResourcesListChanged | Method::PromptsListChanged))
                if !has_id =>
            {
                // Read again first; hosts hear of it if the list differs.
                let kinds: Vec<List> = List::KEPT
                    .into_iter()
                    .filter(|k| k.notification() == changed)
                    .collect();
                for kind in kinds {
                    self.read_list(kind, true);
                }
                return;
            }
            Some(Method::RootsList) if has_id && !self.settings.roots.is_empty() => {
                let answer = json!({"jsonrpc": "2.0", "id": message.id(), "result": roots_result(&self.settings.roots)});
                if self.upstream.is_some() {
                    self.out(Out::Server(answer.into()));
                }
                return;
            }
            Some(Method::LogMessage) => self.out(Out::ServerLog(message.clone())),
            _ => {}
        }
        let answer = method.is_none();
        let outs = self.router.from_server(message);
        if answer {
            // The server answered a host: a use (mcpd's own answers to
            // pings and settings are not).
            let used = outs.iter().any(|out| matches!(out, RouteOut::Host(..)));
            // An answer to a request still waited for, other than a probe,
            // is a sign of life. An answer to a probe is judged by its
            // timeout alone, and an answer to nothing (a probe answered
            // after its timeout, cancelled since) is no sign either: a
            // late answer is still a miss.
            let alive = used
                || outs.iter().any(|out| match out {
                    RouteOut::Answer(id, _) => {
                        !matches!(self.own.get(id), Some(Waiter::Own(Purpose::Probe, _)))
                    }
                    _ => false,
                });
            if alive {
                let at = self.now;
                if used {
                    self.used = at;
                }
                self.out(Out::Heard(at));
            }
        }
        self.deliver(outs, None);
    }

    /// The server failed (`why`) with host requests in flight: says whose,
    /// so that a host whose requests bring a shared server down can be
    /// found (a process and user id for each session).
    pub(super) fn blame(&mut self, why: &str) {
        let mut whose: Vec<(HostId, usize)> = self
            .hosts
            .keys()
            .map(|host| (*host, self.router.in_flight(*host)))
            .filter(|(_, n)| *n > 0)
            .collect();
        if whose.is_empty() {
            return;
        }
        whose.sort_unstable();
        self.out(Out::Blame {
            why: why.to_owned(),
            whose,
        });
    }
}
