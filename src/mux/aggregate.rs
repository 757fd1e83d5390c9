//! One host session over several units (DESIGN §14), the pure core: what
//! each message of the host or of a unit's session becomes, and where it
//! goes. No tasks, no I/O, no clock.
//!
//! The aggregate is a layer over the per-unit host sessions (§8): it is
//! one host of each member unit's session, which keeps doing everything it
//! does for a host (outages, on-demand starts, eras, accounting, bounds).
//! Here:
//!
//! - tools and prompts are named `PREFIX__NAME` ([`SEPARATOR`]; the prefix
//!   is the unit's name or its `alias`), calls and `prompts/get` are routed
//!   by the longest prefix that matches and the unit gets its own name back;
//! - resources keep their URIs: a read, a subscription and a completion go
//!   to the unit that listed the URI (the first by unit name when two list
//!   it, [`Aggregate::collisions`]), or whose template matches it;
//! - `initialize`, `server/discover`, the four lists and `logging/setLevel`
//!   go to every member and their answers are merged into one: the
//!   capabilities are the union, `serverInfo` names mcpd and the group,
//!   `instructions` are each unit's under its name;
//! - every request to a unit gets an id of the aggregate's (so a host's
//!   cancellation finds it), and every request of a unit to the host one
//!   too (so the host's answer finds its unit); `subscriptions/listen`
//!   streams are split per unit and their notifications tagged back.
//!
//! Everything kept is bounded: requests in flight ([`MAX_IN_FLIGHT`]),
//! requests of units to the host ([`MAX_ASKED`]), listen streams
//! ([`era::MAX_LISTENS`]), pages followed per list ([`MAX_PAGES`]), and,
//! as the unit's own reader (`mux::lists`), no cursor followed twice and
//! at most `lists::MAX_BYTES` of one member's pages.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde_json::{Map, Value, json};

use super::era;
use super::error::ErrorCode;
use super::lists::List;
use super::message::{Message, RequestId};
use super::method::Method;
use super::session;
pub use super::target::{
    Candidate, LONG_NAME, SEPARATOR, Target, members_of, prefix_collisions, prefixed,
};

/// Requests of the host in flight in the aggregate's units at once (and
/// the aggregate's own reads): one host session's bound, as a unit's
/// sessions bound each host.
pub const MAX_IN_FLIGHT: usize = 1024;

/// Requests of the units waiting for the host's answer at once.
pub const MAX_ASKED: usize = 1024;

/// Pages of one unit's list followed for one merged answer.
pub const MAX_PAGES: usize = 1000;

/// A member's index in the aggregate, never reused.
pub type MemberId = usize;

/// Where a message goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    Host(Message),
    Member(MemberId, Message),
}

/// What a merged request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fan {
    Initialize,
    Discover,
    List(List),
    SetLevel,
}

impl Fan {
    /// The request each member gets.
    fn method(self) -> Method {
        match self {
            Fan::Initialize => Method::Initialize,
            Fan::Discover => Method::ServerDiscover,
            Fan::List(list) => list.request(),
            Fan::SetLevel => Method::LoggingSetLevel,
        }
    }
}

/// Whether the items of a merged list are named with the unit's prefix
/// (tools and prompts; resources keep their URIs).
fn named_by_prefix(list: List) -> bool {
    matches!(list, List::Tools | List::Prompts)
}

/// A unit of the aggregate.
#[derive(Debug, Clone)]
struct Member {
    unit: String,
    prefix: String,
    /// Its `initialize` (or discovery) result, once answered.
    init: Option<Value>,
    /// The URIs and templates of its resources, as last listed.
    uris: HashSet<String>,
    templates: Vec<String>,
    /// Its session refused the host's `initialize` (the unit was stopped,
    /// or not started yet): [`Aggregate::rejoin`] asks again.
    refused: bool,
}

/// A request sent to a member, by the aggregate's id.
#[derive(Debug, Clone)]
enum Pending {
    /// The host's, answered with the host's id.
    Forward { host: RequestId },
    /// A part of merge `merge`, for list page `page`.
    Part { merge: u64, page: usize },
    /// The aggregate's own `initialize` of a unit that joined later.
    Join,
    /// The aggregate's own read of a unit's resources or templates (to
    /// route reads by URI), page `page`.
    Learn { list: List, page: usize },
    /// A part of the host's listen stream `host`.
    Listen { host: RequestId },
}

#[derive(Debug)]
struct Merge {
    host: RequestId,
    fan: Fan,
    /// Members whose part has not come yet.
    waiting: BTreeSet<MemberId>,
    parts: Vec<(MemberId, Result<Value, Value>)>,
    /// A list's paging per member: the cursors it gave, and the bytes of
    /// its pages (the unit reader's bounds, `mux::lists`).
    paging: HashMap<MemberId, (HashSet<String>, usize)>,
}

#[derive(Debug)]
struct Listen {
    filter: era::Filter,
    /// The aggregate's id of each member's part, and whether it was
    /// acknowledged.
    parts: Vec<(MemberId, RequestId, bool)>,
    /// What the members acknowledged (merged into one acknowledgement).
    honoured: era::Filter,
    acknowledged: bool,
}

/// The aggregate's state: its members, and what is in flight.
#[derive(Debug)]
pub struct Aggregate {
    /// How the host asked for it (`@dev`, `@all`, `a+b`), for `serverInfo`.
    label: String,
    members: Vec<(MemberId, Member)>,
    next_member: MemberId,
    next_id: u64,
    pending: HashMap<RequestId, (MemberId, Pending)>,
    /// The host's requests forwarded: the member and the aggregate's id.
    by_host: HashMap<RequestId, (MemberId, RequestId)>,
    merges: HashMap<u64, Merge>,
    /// The aggregate's own reads of a member's resources or templates:
    /// the cursors each gave and the bytes of its pages, as a merge's.
    learning: HashMap<(MemberId, List), (HashSet<String>, usize)>,
    next_merge: u64,
    /// Requests of members to the host: the member and its own id.
    asked: HashMap<RequestId, (MemberId, Value)>,
    /// The host's `initialize` params (a 2025 host), for units that join.
    host_init: Option<Value>,
    /// The `_meta` of the host's last request (a 2026-07-28 host), for
    /// the aggregate's own requests on its behalf.
    host_meta: Option<Value>,
    listens: HashMap<RequestId, Listen>,
    /// URIs two members list, each reported once.
    reported: HashSet<String>,
}

fn answer(id: &RequestId, result: Value) -> Message {
    let mut m = Message::from(json!({"jsonrpc": "2.0", "result": result}));
    m.set_json("id", id.as_json().to_owned());
    m
}

fn request(id: &RequestId, method: Method, params: Option<Value>) -> Message {
    let mut m = Message::from(json!({"jsonrpc": "2.0", "method": method.as_str()}));
    m.set_json("id", id.as_json().to_owned());
    if let Some(params) = params {
        m.set("params", &params);
    }
    m
}

fn notification(method: Method) -> Message {
    Message::from(json!({"jsonrpc": "2.0", "method": method.as_str()}))
}

/// `a` with everything of `b` it lacks: objects merged key by key, `true`
/// winning over anything else (the capabilities' union).
fn union(a: &mut Value, b: &Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(mine) => union(mine, v),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (a, Value::Bool(true)) => *a = Value::Bool(true),
        _ => {}
    }
}

impl Aggregate {
    /// An aggregate with no members yet; `label` names it in `serverInfo`.
    pub fn new(label: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            members: Vec::new(),
            next_member: 0,
            next_id: 0,
            pending: HashMap::new(),
            by_host: HashMap::new(),
            merges: HashMap::new(),
            learning: HashMap::new(),
            next_merge: 0,
            asked: HashMap::new(),
            host_init: None,
            host_meta: None,
            listens: HashMap::new(),
            reported: HashSet::new(),
        }
    }

    /// The members' units, in the order their answers are merged.
    pub fn units(&self) -> Vec<&str> {
        self.members.iter().map(|(_, m)| m.unit.as_str()).collect()
    }

    /// The member running `unit`.
    pub fn member(&self, unit: &str) -> Option<MemberId> {
        self.members
            .iter()
            .find(|(_, m)| m.unit == unit)
            .map(|(id, _)| *id)
    }

    fn get(&self, id: MemberId) -> Option<&Member> {
        self.members.iter().find(|(m, _)| *m == id).map(|(_, m)| m)
    }

    fn get_mut(&mut self, id: MemberId) -> Option<&mut Member> {
        self.members
            .iter_mut()
            .find(|(m, _)| *m == id)
            .map(|(_, m)| m)
    }

    fn fresh(&mut self) -> RequestId {
        self.next_id += 1;
        RequestId::number(self.next_id)
    }

    /// Whether the host spoke first (an `initialize` or a modern request):
    /// a unit joining now is brought up to date.
    fn host_known(&self) -> bool {
        self.host_init.is_some() || self.host_meta.is_some()
    }

    /// Adds unit `unit` with prefix `prefix` (kept in unit-name order).
    /// A unit joining a session under way is initialized as the host was,
    /// its resources learned, and the host told the lists changed.
    pub fn join(&mut self, unit: &str, prefix: &str) -> (MemberId, Vec<Out>) {
        let id = self.next_member;
        self.next_member += 1;
        let member = Member {
            unit: unit.to_owned(),
            prefix: prefix.to_owned(),
            init: None,
            uris: HashSet::new(),
            templates: Vec::new(),
            refused: false,
        };
        let at = self
            .members
            .iter()
            .position(|(_, m)| m.unit.as_str() > unit)
            .unwrap_or(self.members.len());
        self.members.insert(at, (id, member));
        let mut out = Vec::new();
        if self.host_init.is_some() {
            out.extend(self.rejoin(id));
        } else if self.host_meta.is_some() {
            out.extend(self.learn(id, List::Resources, None, 0));
            out.extend(self.learn(id, List::Templates, None, 0));
            out.extend(self.changed_lists());
        }
        (id, out)
    }

    /// Members whose session refused the host's `initialize`, to ask
    /// again once their unit runs.
    pub fn refused(&self) -> Vec<MemberId> {
        self.members
            .iter()
            .filter(|(_, m)| m.refused)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Member `id` initialized as the host was (a 2025 host's session).
    pub fn rejoin(&mut self, id: MemberId) -> Vec<Out> {
        let Some(params) = self.host_init.clone() else {
            return Vec::new();
        };
        if let Some(member) = self.get_mut(id) {
            member.refused = false;
        }
        let rid = self.fresh();
        self.pending.insert(rid.clone(), (id, Pending::Join));
        vec![Out::Member(
            id,
            request(&rid, Method::Initialize, Some(params)),
        )]
    }

    /// Removes member `id` (its session ended, or a reload took it out
    /// of the group): the host's requests it had get an error naming the
    /// unit, merges stop waiting for it, and the host is told the lists
    /// changed.
    pub fn leave(&mut self, id: MemberId, why: &str) -> Vec<Out> {
        let Some(at) = self.members.iter().position(|(m, _)| *m == id) else {
            return Vec::new();
        };
        let (_, member) = self.members.remove(at);
        self.learning.retain(|(m, _), _| *m != id);
        let mut out = Vec::new();
        let gone: Vec<RequestId> = self
            .pending
            .iter()
            .filter(|(_, (m, _))| *m == id)
            .map(|(rid, _)| rid.clone())
            .collect();
        for rid in gone {
            if let Some((_, pending)) = self.pending.remove(&rid) {
                match pending {
                    Pending::Forward { host } => {
                        self.by_host.remove(&host);
                        out.push(Out::Host(
                            ErrorCode::InternalError
                                .error(format!("server {}: {why}", member.unit))
                                .to_message(Some(&host)),
                        ));
                    }
                    Pending::Part { merge, .. } => {
                        out.extend(self.part(merge, id, Err(Value::Null)));
                    }
                    Pending::Join | Pending::Learn { .. } | Pending::Listen { .. } => {}
                }
            }
        }
        self.asked.retain(|_, (m, _)| *m != id);
        for listen in self.listens.values_mut() {
            listen.parts.retain(|(m, _, _)| *m != id);
        }
        if self.host_known() {
            out.extend(self.changed_lists());
        }
        out
    }

    /// What tells the host that every list may have changed: the three
    /// notifications to a 2025 host; to a 2026-07-28 host, through each
    /// listen stream that opted in.
    fn changed_lists(&self) -> Vec<Out> {
        let mut out = Vec::new();
        for list in [List::Tools, List::Prompts, List::Resources] {
            out.extend(self.tell(notification(list.notification())));
        }
        out
    }

    /// A notification of the aggregate's own to the host: as it is to a
    /// 2025 host, through the listen streams that want it to a modern one.
    fn tell(&self, message: Message) -> Vec<Out> {
        if self.host_meta.is_none() {
            return vec![Out::Host(message)];
        }
        let method = message.method_kind().unwrap_or(Method::Other);
        self.listens
            .iter()
            .filter(|(_, l)| l.filter.wants(method, None))
            .map(|(id, _)| Out::Host(era::tagged(&message, id)))
            .collect()
    }

    /// The member whose prefix starts `name` (the longest that does), and
    /// the name the unit knows.
    pub fn route_name<'a>(&self, name: &'a str) -> Option<(MemberId, &'a str)> {
        self.members
            .iter()
            .filter_map(|(id, m)| {
                name.strip_prefix(m.prefix.as_str())
                    .and_then(|rest| rest.strip_prefix(SEPARATOR))
                    .filter(|inner| !inner.is_empty())
                    .map(|inner| (m.prefix.len(), *id, inner))
            })
            .max_by_key(|(len, ..)| *len)
            .map(|(_, id, inner)| (id, inner))
    }

    /// The member that serves `uri`: the first (by unit name) that listed
    /// it, else the first whose template matches it, else the only member
    /// that offers resources.
    pub fn route_uri(&self, uri: &str) -> Option<MemberId> {
        let listed = self.members.iter().find(|(_, m)| m.uris.contains(uri));
        let templated = || {
            self.members
                .iter()
                .find(|(_, m)| m.templates.iter().any(|t| era::template_matches(t, uri)))
        };
        let only = || {
            let mut offering = self.members.iter().filter(|(_, m)| {
                m.init
                    .as_ref()
                    .is_some_and(|i| i["capabilities"].get("resources").is_some())
            });
            match (offering.next(), offering.next()) {
                (Some(one), None) => Some(one),
                _ => None,
            }
        };
        listed.or_else(templated).or_else(only).map(|(id, _)| *id)
    }

    /// URIs listed by more than one member that were not reported yet,
    /// each with the units that list it (the first serves it).
    pub fn collisions(&mut self) -> Vec<(String, Vec<String>)> {
        let mut seen: HashMap<&str, Vec<&str>> = HashMap::new();
        for (_, m) in &self.members {
            for uri in &m.uris {
                seen.entry(uri.as_str()).or_default().push(m.unit.as_str());
            }
        }
        let mut found: Vec<(String, Vec<String>)> = seen
            .into_iter()
            .filter(|(uri, units)| units.len() > 1 && !self.reported.contains(*uri))
            .map(|(uri, units)| {
                (
                    uri.to_owned(),
                    units.into_iter().map(str::to_owned).collect(),
                )
            })
            .collect();
        found.sort();
        for (uri, _) in &found {
            self.reported.insert(uri.clone());
        }
        found
    }

    /// What the host's message `message` becomes.
    pub fn on_host(&mut self, message: Message) -> Vec<Out> {
        let method = message.method().map(|m| m.into_owned());
        let id = message.request_id();
        match (method, id) {
            (Some(name), Some(id)) => self.host_request((&name, Method::parse(&name)), id, message),
            (Some(name), None) => self.host_notification(Method::parse(&name), &message),
            (None, Some(id)) => self.host_answer(&id, message),
            (None, None) => Vec::new(),
        }
    }

    fn host_request(
        &mut self,
        (name, method): (&str, Method),
        id: RequestId,
        message: Message,
    ) -> Vec<Out> {
        if self.pending.len() >= MAX_IN_FLIGHT {
            return vec![Out::Host(
                ErrorCode::InternalError
                    .error(format!(
                        "{}: {MAX_IN_FLIGHT} requests are in flight already",
                        self.label
                    ))
                    .to_message(Some(&id)),
            )];
        }
        if self.by_host.contains_key(&id) || self.listens.contains_key(&id) {
            return vec![Out::Host(
                ErrorCode::InvalidRequest
                    .error("a request with this id is in flight already")
                    .to_message(Some(&id)),
            )];
        }
        let params = message.params();
        if let Some(meta) = params.as_ref().and_then(|p| p.get("_meta"))
            && era::claims(&message)
        {
            self.host_meta = Some(meta.clone());
        }
        match method {
            Method::Initialize => {
                let params = params.unwrap_or_else(|| json!({}));
                self.host_init = Some(params.clone());
                self.fan(id, Fan::Initialize, Some(params))
            }
            Method::ServerDiscover => self.fan(id, Fan::Discover, params),
            Method::LoggingSetLevel => self.fan(id, Fan::SetLevel, params),
            Method::Ping => vec![Out::Host(answer(&id, json!({})))],
            Method::SubscriptionsListen => self.listen(id, params),
            _ => {
                if let Some(list) = List::of(method) {
                    let mut params = params;
                    if let Some(Value::Object(p)) = &mut params {
                        p.remove("cursor");
                    }
                    return self.fan(id, Fan::List(list), params);
                }
                self.route((name, method), id, message, params)
            }
        }
    }

    /// A request for one member: by name, by URI, by reference.
    fn route(
        &mut self,
        (name, method): (&str, Method),
        id: RequestId,
        mut message: Message,
        params: Option<Value>,
    ) -> Vec<Out> {
        let mut params = params.unwrap_or_else(|| json!({}));
        let target = match method {
            Method::ToolsCall | Method::PromptsGet => {
                let what = if method == Method::ToolsCall {
                    "tool"
                } else {
                    "prompt"
                };
                let name = params["name"].as_str().unwrap_or_default().to_owned();
                match self.route_name(&name) {
                    Some((member, inner)) => {
                        params["name"] = json!(inner);
                        Ok(member)
                    }
                    None => Err((
                        ErrorCode::InvalidParams,
                        format!("{}: no {what} named {name:?}", self.label),
                    )),
                }
            }
            Method::ResourcesRead | Method::ResourcesSubscribe | Method::ResourcesUnsubscribe => {
                let uri = params["uri"].as_str().unwrap_or_default().to_owned();
                self.route_uri(&uri).ok_or((
                    ErrorCode::ResourceNotFound,
                    format!("{}: no resource {uri:?}", self.label),
                ))
            }
            Method::CompletionComplete => {
                let reference = &params["ref"];
                match reference["type"].as_str() {
                    Some("ref/prompt") => {
                        let name = reference["name"].as_str().unwrap_or_default().to_owned();
                        match self.route_name(&name) {
                            Some((member, inner)) => {
                                params["ref"]["name"] = json!(inner);
                                Ok(member)
                            }
                            None => Err((
                                ErrorCode::InvalidParams,
                                format!("{}: no prompt named {name:?}", self.label),
                            )),
                        }
                    }
                    _ => {
                        let uri = reference["uri"].as_str().unwrap_or_default().to_owned();
                        self.route_uri(&uri).ok_or((
                            ErrorCode::InvalidParams,
                            format!("{}: no resource {uri:?}", self.label),
                        ))
                    }
                }
            }
            _ => Err((
                ErrorCode::MethodNotFound,
                format!("{}: method {name:?} is not served here", self.label),
            )),
        };
        match target {
            Ok(member) => {
                let rid = self.fresh();
                message.set("params", &params);
                message.set_json("id", rid.as_json().to_owned());
                self.by_host.insert(id.clone(), (member, rid.clone()));
                self.pending
                    .insert(rid, (member, Pending::Forward { host: id }));
                vec![Out::Member(member, message)]
            }
            Err((code, text)) => vec![Out::Host(code.error(text).to_message(Some(&id)))],
        }
    }

    /// Request `method` to every member, merged into one answer to `id`.
    fn fan(&mut self, id: RequestId, fan: Fan, params: Option<Value>) -> Vec<Out> {
        self.next_merge += 1;
        let merge = self.next_merge;
        let mut out = Vec::new();
        let members: Vec<MemberId> = self.members.iter().map(|(m, _)| *m).collect();
        for member in &members {
            let rid = self.fresh();
            self.pending
                .insert(rid.clone(), (*member, Pending::Part { merge, page: 0 }));
            out.push(Out::Member(
                *member,
                request(&rid, fan.method(), params.clone()),
            ));
        }
        self.merges.insert(
            merge,
            Merge {
                host: id,
                fan,
                waiting: members.into_iter().collect(),
                parts: Vec::new(),
                paging: HashMap::new(),
            },
        );
        out.extend(self.finish(merge));
        out
    }

    /// A member's part of merge `merge` came (`Err(Value::Null)`: it
    /// left).
    fn part(&mut self, merge: u64, member: MemberId, result: Result<Value, Value>) -> Vec<Out> {
        let Some(m) = self.merges.get_mut(&merge) else {
            return Vec::new();
        };
        m.waiting.remove(&member);
        m.parts.push((member, result));
        self.finish(merge)
    }

    /// Member `member` gave `cursor` after page `page` (of `bytes`) of
    /// merge `merge`'s list: why it is read no further, past the unit
    /// reader's bounds (a cursor given before, more than `MAX_BYTES`).
    fn paged(
        &mut self,
        merge: u64,
        member: MemberId,
        cursor: &Value,
        bytes: usize,
        page: usize,
    ) -> Option<crate::mux::lists::Why> {
        use crate::mux::lists::{MAX_BYTES, Why};
        let m = self.merges.get_mut(&merge)?;
        let (cursors, total) = m.paging.entry(member).or_default();
        *total = total.saturating_add(bytes);
        let pages = u32::try_from(page + 1).unwrap_or(u32::MAX);
        let text = cursor.to_string();
        if cursors.contains(&text) {
            return Some(Why::Repeated {
                cursor: text,
                pages,
            });
        }
        if *total > MAX_BYTES {
            return Some(Why::TooLarge { pages });
        }
        cursors.insert(text);
        None
    }

    /// The unit member `member` is, for messages.
    fn unit_of(&self, member: MemberId) -> String {
        self.get(member)
            .map_or_else(|| format!("member {member}"), |m| m.unit.clone())
    }

    /// Merge `merge`'s answer, once no part is missing.
    fn finish(&mut self, merge: u64) -> Vec<Out> {
        if self
            .merges
            .get(&merge)
            .is_none_or(|m| !m.waiting.is_empty())
        {
            return Vec::new();
        }
        let Some(m) = self.merges.remove(&merge) else {
            return Vec::new();
        };
        // Parts in the members' order, whatever order they came in.
        let mut parts = m.parts;
        let order = |id: &MemberId| self.members.iter().position(|(m, _)| m == id);
        parts.sort_by_key(|(id, _)| order(id));
        let mut out = Vec::new();
        let result = match m.fan {
            Fan::Initialize | Fan::Discover => {
                for (id, part) in &parts {
                    if let Some(member) = self.get_mut(*id) {
                        match part {
                            Ok(init) => member.init = Some(init.clone()),
                            Err(_) => member.refused = m.fan == Fan::Initialize,
                        }
                    }
                }
                let result = self.merged_init(&parts, m.fan);
                if m.fan == Fan::Initialize {
                    for (id, part) in &parts {
                        if part.is_ok() {
                            out.push(Out::Member(*id, notification(Method::Initialized)));
                        }
                    }
                }
                let ids: Vec<MemberId> = parts
                    .iter()
                    .filter(|(_, p)| p.is_ok())
                    .map(|(id, _)| *id)
                    .collect();
                out.push(Out::Host(answer(&m.host, result)));
                for id in ids {
                    out.extend(self.learn(id, List::Resources, None, 0));
                    out.extend(self.learn(id, List::Templates, None, 0));
                }
                return out;
            }
            Fan::SetLevel => json!({}),
            Fan::List(list) => self.merged_list(list, &parts),
        };
        out.push(Out::Host(answer(&m.host, result)));
        out
    }

    /// The host's `initialize` answer (or discovery), from the members'.
    fn merged_init(&self, parts: &[(MemberId, Result<Value, Value>)], fan: Fan) -> Value {
        let ok: Vec<(&Member, &Value)> = parts
            .iter()
            .filter_map(|(id, p)| Some((self.get(*id)?, p.as_ref().ok()?)))
            .collect();
        let mut capabilities = json!({});
        let mut instructions = Vec::new();
        for (member, init) in &ok {
            union(&mut capabilities, &init["capabilities"]);
            if let Some(text) = init["instructions"].as_str() {
                instructions.push(format!("## {}\n\n{text}", member.unit));
            }
        }
        // Tasks are answered by `taskId`, which an aggregate does not
        // route: its hosts call tools as plain requests.
        if let Value::Object(c) = &mut capabilities {
            c.remove("tasks");
        }
        // Membership changes by reload: the host is told of it.
        capabilities["tools"]["listChanged"] = json!(true);
        for key in ["prompts", "resources"] {
            if capabilities.get(key).is_some() {
                capabilities[key]["listChanged"] = json!(true);
            }
        }
        let mut result = match ok.first() {
            Some((_, first)) => (*first).clone(),
            None => json!({}),
        };
        result["capabilities"] = capabilities;
        result["serverInfo"] = self.identity();
        self.restamp(&mut result);
        match instructions.is_empty() {
            true => {
                if let Value::Object(r) = &mut result {
                    r.remove("instructions");
                }
            }
            false => result["instructions"] = json!(instructions.join("\n\n")),
        }
        match fan {
            Fan::Initialize => {
                if result.get("protocolVersion").is_none() {
                    let asked = self
                        .host_init
                        .as_ref()
                        .and_then(|p| p["protocolVersion"].as_str())
                        .unwrap_or_default();
                    result["protocolVersion"] = json!(session::negotiate(asked));
                }
            }
            _ => {
                // The versions every member serves (mcpd serves 2026-07-28
                // over any member).
                let mut versions: Option<Vec<Value>> = None;
                for (_, init) in &ok {
                    let theirs = init["supportedVersions"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    versions = Some(match versions {
                        None => theirs,
                        Some(v) => v.into_iter().filter(|x| theirs.contains(x)).collect(),
                    });
                }
                result["supportedVersions"] =
                    json!(versions.unwrap_or_else(|| vec![json!(era::MODERN)]));
            }
        }
        result
    }

    /// Who answers a host of the aggregate: mcpd, and the target.
    fn identity(&self) -> Value {
        json!({
            "name": "mcpd",
            "title": format!("mcpd {}", self.label),
            "version": env!("CARGO_PKG_VERSION"),
        })
    }

    /// A 2026-07-28 result names its server in `_meta`: the aggregate,
    /// not the unit that made it.
    fn restamp(&self, result: &mut Value) {
        if let Some(meta) = result.get_mut("_meta").and_then(Value::as_object_mut)
            && meta.contains_key(era::SERVER_INFO_KEY)
        {
            meta.insert(era::SERVER_INFO_KEY.into(), self.identity());
        }
    }

    /// One list from the members' pages: names prefixed, the URIs of
    /// resources learned.
    fn merged_list(&mut self, list: List, parts: &[(MemberId, Result<Value, Value>)]) -> Value {
        let mut items = Vec::new();
        let mut first: Option<Map<String, Value>> = None;
        for (id, part) in parts {
            let (Ok(page), Some(member)) = (part, self.get(*id)) else {
                continue;
            };
            let prefix = member.prefix.clone();
            if first.is_none()
                && let Value::Object(page) = page
            {
                first = Some(page.clone());
            }
            let got = page[list.key()].as_array().cloned().unwrap_or_default();
            for mut item in got {
                if named_by_prefix(list)
                    && let Some(name) = item["name"].as_str()
                {
                    item["name"] = json!(prefixed(&prefix, name));
                }
                items.push(item);
            }
            self.learned(*id, list, page, true);
        }
        let mut result = first.unwrap_or_default();
        result.remove("nextCursor");
        result.insert(list.key().into(), Value::Array(items));
        let mut result = Value::Object(result);
        self.restamp(&mut result);
        result
    }

    /// What member `id` listed of its resources or templates (`fresh`: a
    /// first page, replacing what was known).
    fn learned(&mut self, id: MemberId, list: List, page: &Value, fresh: bool) {
        let Some(member) = self.get_mut(id) else {
            return;
        };
        let items = page[list.key()].as_array();
        match list {
            List::Resources => {
                if fresh {
                    member.uris.clear();
                }
                for item in items.into_iter().flatten() {
                    if let Some(uri) = item["uri"].as_str() {
                        member.uris.insert(uri.to_owned());
                    }
                }
            }
            List::Templates => {
                if fresh {
                    member.templates.clear();
                }
                for item in items.into_iter().flatten() {
                    if let Some(t) = item["uriTemplate"].as_str() {
                        member.templates.push(t.to_owned());
                    }
                }
            }
            List::Tools | List::Prompts => {}
        }
    }

    /// The aggregate's own read of member `id`'s resources or templates
    /// (from `cursor`), when the member offers resources.
    fn learn(&mut self, id: MemberId, list: List, cursor: Option<Value>, page: usize) -> Vec<Out> {
        let offers = self
            .get(id)
            .and_then(|m| m.init.as_ref())
            .is_some_and(|i| i["capabilities"].get("resources").is_some());
        if !offers && self.host_meta.is_none() || page >= MAX_PAGES {
            return Vec::new();
        }
        let mut params = json!({});
        if let Some(cursor) = cursor {
            params["cursor"] = cursor;
        }
        if let Some(meta) = &self.host_meta {
            params["_meta"] = meta.clone();
        }
        let rid = self.fresh();
        self.pending
            .insert(rid.clone(), (id, Pending::Learn { list, page }));
        vec![Out::Member(id, request(&rid, list.request(), Some(params)))]
    }

    fn host_notification(&mut self, method: Method, message: &Message) -> Vec<Out> {
        match method {
            // Each member had its own, after its `initialize` answer.
            Method::Initialized => Vec::new(),
            Method::Cancelled => {
                let Some(id) = message
                    .params()
                    .and_then(|p| RequestId::of(&p["requestId"]))
                else {
                    return Vec::new();
                };
                if let Some(listen) = self.listens.remove(&id) {
                    return listen
                        .parts
                        .into_iter()
                        .map(|(member, rid, _)| {
                            self.pending.remove(&rid);
                            Out::Member(member, cancelled(&rid))
                        })
                        .collect();
                }
                match self.by_host.get(&id) {
                    Some((member, rid)) => vec![Out::Member(*member, cancelled(rid))],
                    None => Vec::new(),
                }
            }
            // Everything else (roots changed, progress) is every member's.
            _ => self
                .members
                .iter()
                .map(|(id, _)| Out::Member(*id, message.clone()))
                .collect(),
        }
    }

    /// The host's answer to a member's request.
    fn host_answer(&mut self, id: &RequestId, mut message: Message) -> Vec<Out> {
        match self.asked.remove(id) {
            Some((member, theirs)) => {
                message.set("id", &theirs);
                vec![Out::Member(member, message)]
            }
            None => Vec::new(),
        }
    }

    /// A `subscriptions/listen` of a 2026-07-28 host: one stream per
    /// member, with the URIs that member serves.
    fn listen(&mut self, id: RequestId, params: Option<Value>) -> Vec<Out> {
        if self.listens.len() >= era::MAX_LISTENS {
            return vec![Out::Host(
                ErrorCode::InvalidParams
                    .error(format!(
                        "at most {} listen streams per session",
                        era::MAX_LISTENS
                    ))
                    .to_message(Some(&id)),
            )];
        }
        let params = params.unwrap_or_else(|| json!({}));
        let requested = &params["notifications"];
        let uris: Vec<String> = requested["resourceSubscriptions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|u| u.as_str().map(str::to_owned))
            .collect();
        let filter = era::Filter {
            tools: requested["toolsListChanged"] == json!(true),
            resources: requested["resourcesListChanged"] == json!(true),
            prompts: requested["promptsListChanged"] == json!(true),
            uris: uris.iter().cloned().collect(),
        };
        let members: Vec<MemberId> = self.members.iter().map(|(m, _)| *m).collect();
        let mut out = Vec::new();
        let mut parts = Vec::new();
        for member in members {
            let mine: Vec<&String> = uris
                .iter()
                .filter(|u| self.route_uri(u) == Some(member))
                .collect();
            let mut theirs = params.clone();
            theirs["notifications"]["resourceSubscriptions"] = json!(mine);
            let rid = self.fresh();
            self.pending
                .insert(rid.clone(), (member, Pending::Listen { host: id.clone() }));
            parts.push((member, rid.clone(), false));
            out.push(Out::Member(
                member,
                request(&rid, Method::SubscriptionsListen, Some(theirs)),
            ));
        }
        let done = parts.is_empty();
        self.listens.insert(
            id.clone(),
            Listen {
                filter,
                parts,
                honoured: era::Filter::default(),
                acknowledged: false,
            },
        );
        if done {
            out.extend(self.acknowledge(&id));
        }
        out
    }

    /// The host's acknowledgement of listen stream `id`, once every
    /// member acknowledged its part: the union of what they honour (list
    /// changes of the aggregate's own always).
    fn acknowledge(&mut self, id: &RequestId) -> Vec<Out> {
        let Some(listen) = self.listens.get_mut(id) else {
            return Vec::new();
        };
        if listen.acknowledged || listen.parts.iter().any(|(_, _, acked)| !acked) {
            return Vec::new();
        }
        listen.acknowledged = true;
        let mut honoured = listen.honoured.clone();
        honoured.tools |= listen.filter.tools;
        honoured.prompts |= listen.filter.prompts;
        honoured.resources |= listen.filter.resources;
        listen.filter = honoured.clone();
        vec![Out::Host(Message::from(era::acknowledged(id, &honoured)))]
    }

    /// What member `id`'s message `message` becomes.
    pub fn on_member(&mut self, id: MemberId, message: Message) -> Vec<Out> {
        let method = message.method().map(|m| m.into_owned());
        let rid = message.request_id();
        match (method, rid) {
            (None, Some(rid)) => self.member_answer(id, &rid, message),
            (Some(method), Some(rid)) => {
                if self.asked.len() >= MAX_ASKED {
                    return vec![Out::Member(
                        id,
                        ErrorCode::InternalError
                            .error("too many requests wait for the host")
                            .to_message(Some(&rid)),
                    )];
                }
                let Some(theirs) = message.id() else {
                    return Vec::new();
                };
                let _ = method;
                let mine = self.fresh();
                self.asked.insert(mine.clone(), (id, theirs));
                let mut message = message;
                message.set_json("id", mine.as_json().to_owned());
                vec![Out::Host(message)]
            }
            (Some(method), None) => self.member_notification(id, Method::parse(&method), message),
            (None, None) => Vec::new(),
        }
    }

    fn member_answer(&mut self, id: MemberId, rid: &RequestId, mut message: Message) -> Vec<Out> {
        let Some((member, pending)) = self.pending.remove(rid) else {
            return Vec::new();
        };
        if member != id {
            // Not this member's to answer: keep it for its own.
            self.pending.insert(rid.clone(), (member, pending));
            return Vec::new();
        }
        let result = match message.get::<Value>("result") {
            Some(r) => Ok(r),
            None => Err(message.get::<Value>("error").unwrap_or(Value::Null)),
        };
        match pending {
            Pending::Forward { host } => {
                self.by_host.remove(&host);
                message.set_json("id", host.as_json().to_owned());
                if self.host_meta.is_some()
                    && message.may_hold("result", era::SERVER_INFO_KEY)
                    && let Some(mut result) = message.get::<Value>("result")
                {
                    self.restamp(&mut result);
                    message.set("result", &result);
                }
                vec![Out::Host(message)]
            }
            Pending::Part { merge, page } => {
                let Some(fan) = self.merges.get(&merge).map(|m| m.fan) else {
                    return Vec::new();
                };
                if let (Fan::List(list), Ok(result)) = (fan, &result)
                    && let Some(cursor) = result.get("nextCursor").filter(|c| !c.is_null())
                    && page + 1 < MAX_PAGES
                {
                    if let Some(why) = self.paged(merge, id, cursor, message.received(), page) {
                        // Within the bounds of the unit's own reader: a
                        // member that cycles its cursors or pages without
                        // end is left out of the answer, and says why.
                        let error = crate::mux::lists::ListError { list, why };
                        let error = ErrorCode::InternalError
                            .error(format!("{}: {error}", self.unit_of(id)))
                            .to_value(&Value::Null);
                        if let Some(m) = self.merges.get_mut(&merge) {
                            m.parts.retain(|(member, _)| *member != id);
                        }
                        return self.part(merge, id, Err(error["error"].clone()));
                    }
                    // Keep this page and ask for the next; the merge waits.
                    let mut params = json!({"cursor": cursor});
                    if let Some(meta) = &self.host_meta {
                        params["_meta"] = meta.clone();
                    }
                    let next = self.fresh();
                    self.pending.insert(
                        next.clone(),
                        (
                            id,
                            Pending::Part {
                                merge,
                                page: page + 1,
                            },
                        ),
                    );
                    if let Some(m) = self.merges.get_mut(&merge) {
                        m.parts.push((id, Ok(result.clone())));
                    }
                    return vec![Out::Member(
                        id,
                        request(&next, list.request(), Some(params)),
                    )];
                }
                self.part(merge, id, result)
            }
            Pending::Join => {
                let Ok(init) = result else {
                    if let Some(member) = self.get_mut(id) {
                        member.refused = true;
                    }
                    return Vec::new();
                };
                if let Some(member) = self.get_mut(id) {
                    member.init = Some(init);
                }
                let mut out = vec![Out::Member(id, notification(Method::Initialized))];
                out.extend(self.learn(id, List::Resources, None, 0));
                out.extend(self.learn(id, List::Templates, None, 0));
                out.extend(self.changed_lists());
                out
            }
            Pending::Learn { list, page } => {
                let Ok(result) = result else {
                    return Vec::new();
                };
                self.learned(id, list, &result, page == 0);
                if page == 0 {
                    self.learning.remove(&(id, list));
                }
                let Some(cursor) = result.get("nextCursor").filter(|c| !c.is_null()) else {
                    self.learning.remove(&(id, list));
                    return Vec::new();
                };
                let (cursors, total) = self.learning.entry((id, list)).or_default();
                *total = total.saturating_add(message.received());
                // The unit reader's bounds: a cursor given before, or more
                // than `MAX_BYTES`, ends the read with what it learnt.
                if !cursors.insert(cursor.to_string()) || *total > crate::mux::lists::MAX_BYTES {
                    self.learning.remove(&(id, list));
                    return Vec::new();
                }
                self.learn(id, list, Some(cursor.clone()), page + 1)
            }
            Pending::Listen { host } => {
                // A listen stream ends with its answer: the host's ends
                // with its last part.
                let Some(listen) = self.listens.get_mut(&host) else {
                    return Vec::new();
                };
                listen.parts.retain(|(_, r, _)| r != rid);
                if listen.parts.is_empty() {
                    self.listens.remove(&host);
                    message.set_json("id", host.as_json().to_owned());
                    return vec![Out::Host(message)];
                }
                self.acknowledge(&host)
            }
        }
    }

    fn member_notification(
        &mut self,
        id: MemberId,
        method: Method,
        mut message: Message,
    ) -> Vec<Out> {
        // A listen stream's notification names the member's part: the
        // host's stream instead.
        let tag = message
            .params()
            .and_then(|p| RequestId::of(&p["_meta"][era::SUBSCRIPTION_ID_KEY]));
        if let Some(tag) = tag {
            let Some((_, Pending::Listen { host })) = self.pending.get(&tag).cloned() else {
                return Vec::new();
            };
            if method == Method::SubscriptionsAcknowledged {
                if let Some(listen) = self.listens.get_mut(&host) {
                    let honoured = message
                        .params()
                        .and_then(|p| era::Filter::honoured(&p["notifications"], &json!({})).ok());
                    let asked = &message.params().unwrap_or_default()["notifications"];
                    listen.honoured.tools |= asked["toolsListChanged"] == json!(true);
                    listen.honoured.prompts |= asked["promptsListChanged"] == json!(true);
                    listen.honoured.resources |= asked["resourcesListChanged"] == json!(true);
                    if let Some(h) = honoured {
                        listen.honoured.uris.extend(h.uris);
                    }
                    for part in &mut listen.parts {
                        if part.1 == tag {
                            part.2 = true;
                        }
                    }
                }
                return self.acknowledge(&host);
            }
            if method == Method::ResourcesListChanged {
                let mut out = self.learn(id, List::Resources, None, 0);
                out.extend(self.learn(id, List::Templates, None, 0));
                out.push(Out::Host(era::tagged(&message, &host)));
                return out;
            }
            return vec![Out::Host(era::tagged(&message, &host))];
        }
        match method {
            Method::ResourcesListChanged => {
                let mut out = self.learn(id, List::Resources, None, 0);
                out.extend(self.learn(id, List::Templates, None, 0));
                out.push(Out::Host(message));
                out
            }
            Method::Cancelled => {
                // The member gave up a request of its own to the host.
                let theirs = message.params().map(|p| p["requestId"].clone());
                let mine = self
                    .asked
                    .iter()
                    .find(|(_, (m, t))| *m == id && Some(t) == theirs.as_ref())
                    .map(|(mine, _)| mine.clone());
                match mine {
                    Some(mine) => {
                        self.asked.remove(&mine);
                        let mut params = message.params().unwrap_or_default();
                        params["requestId"] = mine.to_value();
                        message.set("params", &params);
                        vec![Out::Host(message)]
                    }
                    None => Vec::new(),
                }
            }
            _ => vec![Out::Host(message)],
        }
    }

    /// How many requests are in flight (for tests and bounds).
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

fn cancelled(id: &RequestId) -> Message {
    Message::from(json!({
        "jsonrpc": "2.0",
        "method": Method::Cancelled.as_str(),
        "params": {"requestId": id.to_value()},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(value: Value) -> Message {
        Message::from(value)
    }

    fn to_member(outs: &[Out]) -> Vec<(MemberId, Value)> {
        outs.iter()
            .filter_map(|o| match o {
                Out::Member(m, msg) => Some((*m, msg.to_value())),
                Out::Host(_) => None,
            })
            .collect()
    }

    fn to_host(outs: &[Out]) -> Vec<Value> {
        outs.iter()
            .filter_map(|o| match o {
                Out::Host(msg) => Some(msg.to_value()),
                Out::Member(..) => None,
            })
            .collect()
    }

    fn init_result(name: &str, caps: Value) -> Value {
        json!({"protocolVersion": "2025-11-25", "capabilities": caps,
               "serverInfo": {"name": name, "version": "1"}, "instructions": format!("I am {name}")})
    }

    /// An aggregate of `a` (alias `x`) and `b`, the host initialized.
    fn initialized() -> (Aggregate, MemberId, MemberId) {
        let mut agg = Aggregate::new("@dev");
        let (b, _) = agg.join("b", "b");
        let (a, _) = agg.join("a", "x");
        let outs = agg.on_host(msg(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "h", "version": "1"}}})));
        let sent = to_member(&outs);
        assert_eq!(sent.len(), 2);
        let mut host = Vec::new();
        for (member, request) in sent {
            let caps = if member == a {
                json!({"tools": {}, "resources": {"subscribe": true}})
            } else {
                json!({"tools": {"listChanged": true}, "prompts": {}})
            };
            let name = if member == a { "a" } else { "b" };
            let outs = agg.on_member(
                member,
                msg(json!({"jsonrpc": "2.0", "id": request["id"], "result": init_result(name, caps)})),
            );
            host.extend(to_host(&outs));
        }
        assert_eq!(host.len(), 1, "{host:?}");
        let result = &host[0]["result"];
        assert_eq!(host[0]["id"], 1);
        assert_eq!(result["serverInfo"]["name"], "mcpd");
        assert_eq!(result["serverInfo"]["title"], "mcpd @dev");
        assert_eq!(result["capabilities"]["tools"]["listChanged"], true);
        assert_eq!(result["capabilities"]["resources"]["subscribe"], true);
        assert!(result["capabilities"]["prompts"].is_object());
        // Each unit's instructions under its name, in unit-name order.
        assert_eq!(result["instructions"], "## a\n\nI am a\n\n## b\n\nI am b");
        (agg, a, b)
    }

    #[test]
    fn initialize_goes_to_every_unit_and_their_answers_become_one() {
        initialized();
    }

    #[test]
    fn lists_are_merged_with_prefixes_and_calls_routed_by_the_longest_prefix() {
        let (mut agg, a, b) = initialized();
        let outs = agg.on_host(msg(
            json!({"jsonrpc": "2.0", "id": "t", "method": "tools/list"}),
        ));
        let sent = to_member(&outs);
        assert_eq!(sent.len(), 2);
        let mut host = Vec::new();
        for (member, request) in sent {
            let tools = if member == a {
                json!([{"name": "echo"}])
            } else {
                json!([{"name": "echo"}, {"name": "add"}])
            };
            host.extend(to_host(&agg.on_member(
                member,
                msg(json!({"jsonrpc": "2.0", "id": request["id"], "result": {"tools": tools}})),
            )));
        }
        assert_eq!(host.len(), 1);
        assert_eq!(host[0]["id"], "t");
        let names: Vec<&str> = host[0]["result"]["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(names, ["x__echo", "b__echo", "b__add"]);

        // A call goes to its unit with the unit's own name, under an id of
        // the aggregate's; the answer comes back under the host's.
        let learning = agg.in_flight();
        let outs = agg.on_host(msg(
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "x__echo", "arguments": {"text": "hi"}}}),
        ));
        let sent = to_member(&outs);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, a);
        assert_eq!(sent[0].1["params"]["name"], "echo");
        assert_eq!(sent[0].1["params"]["arguments"]["text"], "hi");
        let outs = agg.on_member(
            a,
            msg(json!({"jsonrpc": "2.0", "id": sent[0].1["id"], "result": {"content": []}})),
        );
        assert_eq!(
            to_host(&outs),
            [json!({"jsonrpc": "2.0", "result": {"content": []}, "id": 7})]
        );
        assert_eq!(agg.in_flight(), learning);

        // A prefix that is a prefix of another: the longest wins.
        let (long, _) = agg.join("b-x", "b__x");
        assert_eq!(agg.route_name("b__x__echo"), Some((long, "echo")));
        assert_eq!(agg.route_name("b__echo"), Some((b, "echo")));
        assert_eq!(agg.route_name("nobody__echo"), None);
        assert_eq!(agg.route_name("b__"), None);
        let outs = agg.on_host(msg(
            json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
            "params": {"name": "zz__echo"}}),
        ));
        let refused = to_host(&outs);
        assert_eq!(refused[0]["error"]["code"], ErrorCode::InvalidParams.code());
    }

    #[test]
    fn a_member_that_cycles_its_cursors_is_read_no_further_than_the_units_reader_reads() {
        let (mut agg, a, b) = initialized();
        let outs = agg.on_host(msg(
            json!({"jsonrpc": "2.0", "id": "t", "method": "tools/list"}),
        ));
        let mut asked_a = 0;
        let mut host = Vec::new();
        let mut queue = to_member(&outs);
        // a answers A, B, A, B, …; b answers one page.
        while let Some((member, request)) = queue.pop() {
            let result = if member == a {
                asked_a += 1;
                assert!(asked_a <= 3, "a was asked past its repeated cursor");
                let next = if asked_a % 2 == 1 { "A" } else { "B" };
                json!({"tools": [{"name": format!("t{asked_a}")}], "nextCursor": next})
            } else {
                assert_eq!(member, b);
                json!({"tools": [{"name": "add"}]})
            };
            let outs = agg.on_member(
                member,
                msg(json!({"jsonrpc": "2.0", "id": request["id"], "result": result})),
            );
            queue.extend(to_member(&outs));
            host.extend(to_host(&outs));
        }
        assert_eq!(asked_a, 3, "the third page repeats the first cursor");
        assert_eq!(host.len(), 1, "{host:?}");
        let names: Vec<&str> = host[0]["result"]["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(names, ["b__add"], "a's pages are left out, b's kept");
    }

    #[test]
    fn a_unit_that_joins_later_is_initialized_as_the_host_was_and_the_host_told() {
        let (mut agg, _, _) = initialized();
        let (c, outs) = agg.join("c", "c");
        let sent = to_member(&outs);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].1["method"], "initialize");
        assert_eq!(sent[0].1["params"]["clientInfo"]["name"], "h");
        let outs = agg.on_member(
            c,
            msg(json!({"jsonrpc": "2.0", "id": sent[0].1["id"], "result": init_result("c", json!({"tools": {}}))})),
        );
        let told: Vec<Value> = to_host(&outs)
            .into_iter()
            .map(|m| m["method"].clone())
            .collect();
        assert!(
            told.contains(&json!("notifications/tools/list_changed")),
            "{told:?}"
        );
        assert!(
            to_member(&outs)
                .iter()
                .any(|(m, v)| *m == c && v["method"] == "notifications/initialized")
        );
        // And one that leaves fails what it had in flight, naming it.
        let learning = agg.in_flight();
        let outs = agg.on_host(msg(
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "c__slow"}}),
        ));
        assert_eq!(to_member(&outs).len(), 1);
        let outs = agg.leave(c, "left the group");
        let host = to_host(&outs);
        assert_eq!(host[0]["id"], 9);
        assert_eq!(host[0]["error"]["message"], "server c: left the group");
        assert!(
            host.iter()
                .any(|m| m["method"] == "notifications/tools/list_changed")
        );
        assert_eq!(agg.in_flight(), learning);
    }

    #[test]
    fn requests_of_units_to_the_host_get_ids_of_the_aggregate_and_their_answers_go_back() {
        let (mut agg, a, b) = initialized();
        let ask = |id: Value| {
            msg(
                json!({"jsonrpc": "2.0", "id": id, "method": "sampling/createMessage", "params": {}}),
            )
        };
        let from_a = to_host(&agg.on_member(a, ask(json!(1))));
        let from_b = to_host(&agg.on_member(b, ask(json!(1))));
        assert_ne!(from_a[0]["id"], from_b[0]["id"], "one id each for the host");
        let back = agg.on_host(msg(
            json!({"jsonrpc": "2.0", "id": from_b[0]["id"], "result": {"x": 1}}),
        ));
        assert_eq!(
            to_member(&back),
            [(b, json!({"jsonrpc": "2.0", "id": 1, "result": {"x": 1}}))]
        );
        // An answer to nothing asked goes nowhere.
        assert!(
            agg.on_host(msg(json!({"jsonrpc": "2.0", "id": 999, "result": {}})))
                .is_empty()
        );
    }

    #[test]
    fn reads_go_to_the_unit_that_listed_the_uri_and_collisions_are_reported_once() {
        let (mut agg, a, b) = initialized();
        // The aggregate learned nothing yet: only `a` offers resources.
        assert_eq!(agg.route_uri("file:///x"), Some(a));
        let page = json!({"resources": [{"uri": "mem://1"}, {"uri": "mem://both"}]});
        agg.learned(a, List::Resources, &page, true);
        agg.learned(
            b,
            List::Resources,
            &json!({"resources": [{"uri": "mem://both"}, {"uri": "mem://2"}]}),
            true,
        );
        agg.learned(
            b,
            List::Templates,
            &json!({"resourceTemplates": [{"uriTemplate": "db://{table}"}]}),
            true,
        );
        assert_eq!(agg.route_uri("mem://1"), Some(a));
        assert_eq!(agg.route_uri("mem://2"), Some(b));
        assert_eq!(
            agg.route_uri("mem://both"),
            Some(a),
            "the first by unit name"
        );
        assert_eq!(agg.route_uri("db://users"), Some(b), "by template");
        assert_eq!(
            agg.collisions(),
            [(
                "mem://both".to_owned(),
                vec!["a".to_owned(), "b".to_owned()]
            )]
        );
        assert!(agg.collisions().is_empty(), "reported once");
    }
}
