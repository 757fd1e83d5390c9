//! How a host session opens (DESIGN §8, §12): its `initialize` answered
//! from the server's own result, its `server/discover` or `initialize`
//! held until the first generation when there is nothing to answer it
//! from yet and the server is starting, refused at once with the reason
//! when the unit cannot serve ([`Core::cannot_open`]), what it sent
//! meanwhile handled in order, the deadline for a session that never
//! opens, and the count of sessions per protocol version.

use serde_json::{Value, json};

use super::super::error::ErrorCode;
use super::super::message::{Message, RequestId};
use super::super::method::Method;
use super::super::route::{Caps, HostId};
use super::classify;
use super::{Core, Notice, Out, Publish, UnitState, upstream};

/// A host's `initialize` or `server/discover` waiting for the first
/// generation (nothing to answer it from yet).
pub(super) struct Waiting {
    pub(super) host: HostId,
    pub(super) id: Value,
    pub(super) params: Value,
    pub(super) discover: bool,
}

impl Waiting {
    pub(super) fn initialize(id: Value, params: Value) -> impl FnOnce(HostId) -> Self {
        move |host| Self {
            host,
            id,
            params,
            discover: false,
        }
    }

    pub(super) fn discover(id: Value) -> impl FnOnce(HostId) -> Self {
        move |host| Self {
            host,
            id,
            params: Value::Null,
            discover: true,
        }
    }
}

impl Core {
    /// Why a new host session cannot open now (the outage error's text),
    /// or `None` when it can: answered from the server's result, or
    /// waiting for a start under way. A unit that gave up (`failed`) or
    /// was stopped cannot, whatever it served before: a host answered from
    /// the last good result would show the server connected with tools it
    /// cannot call, or none, and no reason. Nor can a unit never
    /// established whose start failed (it retries: its first start's error
    /// is the reason, told now rather than after every retry) or that is
    /// stopping. A unit established before that is retrying is answered
    /// from its last good result, as its outage may pass.
    pub(super) fn cannot_open(&self) -> Option<String> {
        let cannot = match self.facts.state {
            UnitState::Failed | UnitState::Stopped => true,
            // A unit that needs a login serves what its cache holds (its
            // calls get the login error); without a cache, nothing.
            UnitState::Retrying
            | UnitState::Reconnecting
            | UnitState::Stopping
            | UnitState::NeedsLogin => self.init.is_none(),
            UnitState::Starting | UnitState::Running | UnitState::Idle => false,
        };
        cannot.then(|| self.down_text(None))
    }

    /// The unit cannot serve a new session ([`Core::cannot_open`]): a
    /// host's `initialize` gets the outage error. A replayed one (the host
    /// initialized with an earlier daemon) cannot be taken back: the
    /// session counts as initialized, so the host's requests get the
    /// outage error too, and work once the server is back.
    pub(super) fn refuse_initialize(&mut self, host: HostId, id: &Value, params: &Value) {
        let replaying = self.hosts.get(&host).is_some_and(|h| h.swallow.is_some());
        if replaying {
            if let Some(h) = self.hosts.get_mut(&host) {
                h.swallow = None;
                h.initialized = true;
                h.translated = Some(Box::new(upstream::Translated::of_initialize(params)));
            }
            self.router.attach(host, Caps::from_initialize(params));
        } else {
            let text = self.down_text(None);
            self.send(host, ErrorCode::ServerDown.response(id, text));
        }
        self.release_held(host);
    }

    /// A replayed `initialize` was answered: the host is told that every
    /// list it may hold could have changed while mcpd was away.
    pub(super) fn replayed(&mut self, host: HostId) {
        let Some(init) = self.init.clone() else {
            return;
        };
        for method in classify::replay_notices(&init) {
            self.send(host, json!({"jsonrpc": "2.0", "method": method}));
        }
    }

    /// Hosts that have not sent `initialize` within
    /// [`initialize_timeout`] of attaching are detached.
    pub(super) fn uninitialized_expired(&mut self) {
        let cutoff = self.now.checked_sub(self.tunables.initialize_timeout);
        let mut late: Vec<HostId> = self
            .hosts
            .iter()
            .filter(|(_, h)| h.uninitialized.is_some_and(|since| Some(since) <= cutoff))
            .map(|(host, _)| *host)
            .collect();
        late.sort_unstable();
        for host in late {
            self.detach(host, Some("it sent no initialize in time"));
        }
    }

    /// Answers host `host`'s `initialize` with the server's own result.
    pub(super) fn initialize(&mut self, host: HostId, id: &Value, params: &Value) {
        self.declare(params["capabilities"].clone());
        if self.cannot_open().is_some() {
            self.refuse_initialize(host, id, params);
            return;
        }
        let Some(init) = self.init.clone() else {
            self.open_later(host, Waiting::initialize(id.clone(), params.clone()));
            return;
        };
        let result = classify::initialize_result(&init, params);
        let held = match self.hosts.get_mut(&host) {
            Some(h) => {
                h.initialized = true;
                std::mem::take(&mut h.held)
            }
            None => Vec::new(),
        };
        self.router.attach(host, Caps::from_initialize(params));
        if let Some(h) = self.hosts.get_mut(&host) {
            h.translated = Some(Box::new(upstream::Translated::of_initialize(params)));
        }
        let version = classify::negotiate(params["protocolVersion"].as_str().unwrap_or_default());
        if let Some(h) = self.hosts.get_mut(&host)
            && h.version.is_none()
        {
            h.version = Some(version);
            self.out(Out::Publish(Publish::Version(version, true)));
        }
        if let Some(h) = self.hosts.get(&host)
            && h.bridged
            && h.swallow.is_none()
        {
            // The bridge keeps it, to replay if mcpd restarts.
            let initialize = json!({"jsonrpc": "2.0", "id": id, "method": Method::Initialize.as_str(), "params": params});
            self.out(Out::Remember { host, initialize });
        }
        self.send(host, json!({"jsonrpc": "2.0", "id": id, "result": result}));
        // What it sent meanwhile, in order.
        for frame in held {
            self.on_host(host, frame);
        }
    }

    /// Host `host`'s opening request (`waiting`, made for it) is answered
    /// once the first generation is established; an idle on-demand server
    /// is started for it (it has nothing to answer from yet).
    pub(super) fn open_later(&mut self, host: HostId, waiting: impl FnOnce(HostId) -> Waiting) {
        self.waiting.push(waiting(host));
        if self.facts.state == UnitState::Idle {
            self.out(Out::Notice(Notice::Demand));
        }
    }

    /// A waiting opening request, answered now that there is a result.
    pub(super) fn opened(&mut self, w: Waiting) {
        if w.discover {
            match RequestId::of(&w.id) {
                Some(id) => self.discover(w.host, &id, &Message::from(json!({}))),
                None => self.release_held(w.host),
            }
        } else {
            self.initialize(w.host, &w.id, &w.params);
        }
    }

    /// What host `host` sent while its opening request waited, handled
    /// in order.
    pub(super) fn release_held(&mut self, host: HostId) {
        let held = self
            .hosts
            .get_mut(&host)
            .map(|h| std::mem::take(&mut h.held))
            .unwrap_or_default();
        for frame in held {
            self.on_host(host, frame);
        }
    }
}
