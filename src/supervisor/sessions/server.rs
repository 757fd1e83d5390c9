//! What the upstream sends the host sessions, beside what the router
//! routes: `list_changed` (re-syncs), `roots/list` from the unit's
//! `roots`, log messages to the journal within `log-rate-limit`, lines
//! that are not messages (counted and logged), and who had requests in
//! flight when the server failed.

use serde_json::{Value, json};

use crate::mux::lists::List;
use crate::mux::message::Message;
use crate::mux::route::Out;

use super::super::clock::now;
use super::super::logs;
use super::super::upstream::roots_result;
use super::{Task, Waiter};

impl Task {
    pub(super) fn on_server(&mut self, message: Message) {
        let name = message.method();
        let method = name.as_deref();
        let has_id = message.raw("id").is_some_and(|id| id != "null");
        if method.is_some() {
            self.heard.now();
        }
        match method {
            // mcpd's listen stream opened (a server of MCP 2026-07-28).
            Some("notifications/subscriptions/acknowledged") if !has_id => return,
            Some("notifications/tools/list_changed") if !has_id => {
                self.tools_changed();
                return;
            }
            Some(
                changed @ ("notifications/resources/list_changed"
                | "notifications/prompts/list_changed"),
            ) if !has_id => {
                // Read again first; hosts hear of it if the list differs.
                let kinds: Vec<List> = List::KEPT
                    .into_iter()
                    .filter(|k| k.changed() == changed)
                    .collect();
                for kind in kinds {
                    self.read_list(kind, true);
                }
                return;
            }
            Some("roots/list") if has_id && !self.roots.is_empty() => {
                let answer = json!({"jsonrpc": "2.0", "id": message.id(), "result": roots_result(&self.roots)});
                if let Some(up) = &self.upstream {
                    let _ = up.tx.send(answer.into());
                }
                return;
            }
            Some("notifications/message") => self.journal(&message),
            _ => {}
        }
        let answer = method.is_none();
        drop(name);
        let outs = self.router.from_server(message);
        if answer {
            // The server answered a host: a use (mcpd's own answers to
            // pings and settings are not).
            let used = outs.iter().any(|out| matches!(out, Out::Host(..)));
            // An answer to a request still waited for, other than a probe,
            // is a sign of life. An answer to a probe is judged by its
            // timeout alone, and an answer to nothing (a probe answered
            // after its timeout, cancelled since) is no sign either: a
            // late answer is still a miss.
            let alive = used
                || outs.iter().any(|out| match out {
                    Out::Answer(id, _) => !matches!(self.own.get(id), Some(Waiter::Probe(..))),
                    _ => false,
                });
            if alive {
                // One reading of the clock for both.
                let at = now();
                if used {
                    self.used = at;
                }
                self.heard.at(at);
            }
        }
        self.deliver(outs, None);
    }

    /// The server wrote `lines` lines that are not JSON-RPC messages (the
    /// last one not because of `why`): counted, and logged within the
    /// unit's `log-rate-limit` (its connection fails past `GARBAGE_RUN` in
    /// a row).
    pub(super) fn garbage(&mut self, lines: u64, why: &str) {
        self.counters.garbage(lines);
        let admit = self.log_limit.admit_n(lines, now());
        if let Some(until) = admit.reached {
            let line = logs::reached_line("its lines of garbage", until);
            tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{line}");
        }
        if let Some(n) = admit.suppressed {
            let line = logs::suppressed_line(n, self.log_limit.limit());
            tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{line}");
        }
        if admit.log {
            match lines {
                1 => {
                    tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "a line on the server's stdout is not a JSON-RPC message: {why}")
                }
                n => {
                    tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{n} lines on the server's stdout are not JSON-RPC messages (the last: {why})")
                }
            }
        }
    }

    /// A server's log message also goes to the journal.
    /// The unit's `log-rate-limit` applies, as to its stderr: past it,
    /// messages are counted and the count reported once the window ends.
    pub(super) fn journal(&mut self, message: &Message) {
        let admit = self.log_limit.admit(now());
        if let Some(until) = admit.reached {
            let line = logs::reached_line("its log messages", until);
            tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{line}");
        }
        if let Some(n) = admit.suppressed {
            let line = logs::suppressed_line(n, self.log_limit.limit());
            tracing::warn!(target: "mcpd::server", mcpd_server = %self.name, "{line}");
        }
        if !admit.log {
            return;
        }
        let params = message.params().unwrap_or(Value::Null);
        let level = params["level"].as_str().unwrap_or("info");
        let logger = params["logger"].as_str().unwrap_or_default();
        let data = match &params["data"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let name = &self.name;
        match level {
            "debug" => {
                tracing::debug!(target: "mcpd::server", mcpd_server = %name, mcpd_logger = logger, "{data}")
            }
            "info" | "notice" => {
                tracing::info!(target: "mcpd::server", mcpd_server = %name, mcpd_logger = logger, "{data}")
            }
            "warning" => {
                tracing::warn!(target: "mcpd::server", mcpd_server = %name, mcpd_logger = logger, "{data}")
            }
            _ => {
                tracing::error!(target: "mcpd::server", mcpd_server = %name, mcpd_logger = logger, "{level}: {data}")
            }
        }
    }

    /// The server failed (`why`) with host requests in flight: says whose,
    /// so that a host whose requests bring a shared server down can be
    /// found (a process and user id for each session).
    pub(super) fn blame(&self, why: &str) {
        let mut whose: Vec<String> = self
            .hosts
            .iter()
            .filter_map(|(host, h)| {
                let n = self.router.in_flight(*host);
                (n > 0).then(|| {
                    let mut who = format!("session {host}");
                    if h.caller.token.is_some() || h.caller.peer.is_some() {
                        who.push_str(&format!(" ({})", h.caller));
                    } else if let Some(pid) = h.caller.pid {
                        who.push_str(&format!(" (pid {pid}"));
                        if let Some(uid) = h.caller.uid {
                            who.push_str(&format!(", uid {uid}"));
                        }
                        who.push(')');
                    }
                    format!("{who}: {n}")
                })
            })
            .collect();
        if whose.is_empty() {
            return;
        }
        whose.sort();
        tracing::warn!(target: "mcpd::sessions", mcpd_server = %self.name, "the server failed ({why}) with requests in flight from {}", whose.join("; "));
    }
}
