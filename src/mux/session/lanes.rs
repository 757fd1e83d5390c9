//! Lanes (DESIGN §12): which upstream serves a host, by the era it opens
//! with. A server that speaks both eras serves each host in that host's
//! era itself, one upstream connection (a *lane*) per era in use: the
//! unit's own generation speaks 2026-07-28 to it (`protocol "auto"` asks
//! `server/discover` first), and a host that opens with `initialize` gets
//! the unit's second lane, a process of the same spec pinned to the 2025
//! handshake. Translation (`super::modern`, `super::upstream`) serves a
//! host only where the server speaks one era or the unit pins one.
//!
//! - [`opening`]: the era a host's first line claims;
//! - [`Upstream::of`]: what the unit's own generation (or its cache) says
//!   the server speaks;
//! - [`lane`]: which lane serves a host of a shared unit;
//! - [`instance_protocol`]: the `protocol` of a per-host unit's instance
//!   (DESIGN §13), which is its host's era where the server speaks it;
//! - [`Agreement`]: when the lists two lanes read differ, and whether that
//!   difference was told already (once per change).
//!
//! Pure: the supervisor's handle asks, peeks at the host's first line and
//! attaches it where it is told.

use serde_json::Value;

use super::super::era::{self, Era};
use super::super::message::Message;
use super::super::method::Method;
use crate::unit::Protocol;

/// What the unit's own upstream is known to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// Nothing is known yet (no generation established, no cache).
    Unknown,
    /// The 2025 handshake only (it did not answer `server/discover`).
    Legacy,
    /// 2026-07-28 only: its 2025 lane could not be established.
    Modern,
    /// 2026-07-28, and presumably the handshake too.
    Both,
}

impl Upstream {
    /// What the server that answered with `init` (an `initialize` result,
    /// or a discovery kept as one: [`era::init_of_discover`]) speaks. A
    /// server of 2026-07-28 is taken to speak the 2025 handshake too:
    /// every SDK's does, and its discovery cannot say (its
    /// `supportedVersions` are those of the 2026 wire); where its lane
    /// cannot be established, the unit knows better ([`Upstream::Modern`]).
    pub fn of(init: Option<&Value>) -> Self {
        match init {
            None => Upstream::Unknown,
            Some(init) if era::is_modern(init) => Upstream::Both,
            Some(_) => Upstream::Legacy,
        }
    }
}

/// Which upstream serves a host of a shared unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The unit's own generation (in its era, translated if the host's
    /// differs).
    Own,
    /// The unit's 2025 lane: a second process pinned to the handshake.
    Legacy,
    /// Not known yet: ask again once the unit's own generation (or its
    /// cache) says what the server speaks, or, after `startup-timeout`,
    /// take [`Lane::Own`].
    Wait,
}

/// Which lane serves a host that opened in era `host` (None: its first
/// line claims neither, or it sent none) of a shared unit whose `protocol`
/// is `protocol`, over stdio or not (`stdio`), whose own upstream speaks
/// `upstream`.
///
/// Only a stdio server of `protocol "auto"` that speaks both eras has a
/// second lane: a pinned unit is one process and translation; an HTTP
/// server's upstream is one session (mcpd speaks it the handshake's era
/// unless the unit pins 2026-07-28). A modern host always takes the own
/// lane: with `auto`, a server of both eras is spoken 2026-07-28.
pub fn lane(protocol: Protocol, stdio: bool, upstream: Upstream, host: Option<Era>) -> Lane {
    if protocol != Protocol::Auto || !stdio || host != Some(Era::Legacy) {
        return Lane::Own;
    }
    match upstream {
        Upstream::Both => Lane::Legacy,
        Upstream::Unknown => Lane::Wait,
        Upstream::Legacy | Upstream::Modern => Lane::Own,
    }
}

/// The `protocol` an instance of a per-host unit (DESIGN §13) runs with,
/// for a host that opened in era `host`: a 2025 host's instance is pinned
/// to the handshake unless the server is known to speak 2026-07-28 only,
/// so each instance speaks its host's era; a modern host's, and a pinned
/// unit's, keep the unit's.
pub fn instance_protocol(protocol: Protocol, upstream: Upstream, host: Option<Era>) -> Protocol {
    match (protocol, host, upstream) {
        (Protocol::Auto, Some(Era::Legacy), Upstream::Modern) => Protocol::Auto,
        (Protocol::Auto, Some(Era::Legacy), _) => Protocol::Legacy,
        (protocol, _, _) => protocol,
    }
}

/// The era a host's first line claims: `initialize` is the 2025
/// handshake; `server/discover`, or a request whose `_meta` names a
/// protocol version, is 2026-07-28; anything else (a notification, a
/// `ping`, garbage) claims none.
pub fn opening(line: &[u8]) -> Option<Era> {
    let message = Message::parse(line.trim_ascii()).ok()?;
    message.request_id()?;
    let method = message.method()?;
    match Method::parse(&method) {
        Method::Initialize => Some(Era::Legacy),
        Method::ServerDiscover => Some(Era::Modern),
        _ if era::claims(&message) => Some(Era::Modern),
        _ => None,
    }
}

/// The lists two lanes of a unit read, compared: the unit's published
/// lists are its own lane's whatever the other lane reads, and a
/// difference (a server that lists differently by era, or whose lanes
/// drifted apart) is told to the operator once per change, not at every
/// re-read. Lists are indexed as [`Agreement::LISTS`].
#[derive(Debug, Default)]
pub struct Agreement {
    /// Per list: the pair of serials (own lane, other lane) whose
    /// difference was told last; None while they agree.
    told: [Option<(u64, u64)>; 4],
}

impl Agreement {
    /// The lists compared, as a warning names them: the tools, then the
    /// kept lists in the order of `List::KEPT`.
    pub const LISTS: [&'static str; 4] = ["tools", "resources", "resource templates", "prompts"];

    /// List `list` (an index into [`Agreement::LISTS`]) as the own lane
    /// and the other lane last read it (`serials`: each rises when its
    /// lane's list changes) is `same` or not: whether to tell of the
    /// difference now (it differs, and not as it was told before).
    pub fn differs(&mut self, list: usize, serials: (u64, u64), same: bool) -> bool {
        let Some(told) = self.told.get_mut(list) else {
            return false;
        };
        if same {
            *told = None;
            return false;
        }
        if *told == Some(serials) {
            return false;
        }
        *told = Some(serials);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_first_line_claims_its_era() {
        let cases: [(&str, Option<Era>); 7] = [
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#,
                Some(Era::Legacy),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":"server/discover"}"#,
                Some(Era::Modern),
            ),
            (
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
                Some(Era::Modern),
            ),
            (r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#, None),
            (r#"{"jsonrpc":"2.0","method":"initialize"}"#, None),
            (r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#, None),
            ("not json", None),
        ];
        for (line, era) in cases {
            assert_eq!(opening(line.as_bytes()), era, "{line}");
        }
        // With its newline, as it is read.
        let line = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n";
        assert_eq!(opening(line.as_bytes()), Some(Era::Legacy));
    }

    #[test]
    fn what_the_upstream_speaks() {
        let legacy = json!({"protocolVersion": "2025-11-25", "capabilities": {}});
        let modern = json!({"protocolVersion": "2026-07-28", "capabilities": {}});
        assert_eq!(Upstream::of(None), Upstream::Unknown);
        assert_eq!(Upstream::of(Some(&legacy)), Upstream::Legacy);
        assert_eq!(Upstream::of(Some(&modern)), Upstream::Both);
    }
}
