//! Which upstream serves a host (DESIGN §12, lanes), as a table:
//! `mux::session::lanes`.

use mcpd::mux::era::Era;
use mcpd::mux::session::lanes::{Lane, Upstream, instance_protocol, lane};
use mcpd::unit::Protocol;

#[test]
fn a_shared_units_host_gets_the_lane_of_its_era() {
    use Era::{Legacy as L, Modern as M};
    use Lane::{Legacy, Own, Wait};
    // (protocol, stdio, upstream, host) → lane
    let cases: &[(Protocol, bool, Upstream, Option<Era>, Lane)] = &[
        // A server of both eras, auto, over stdio: a 2025 host gets the
        // second process; a modern host and one that claimed no era the
        // unit's own.
        (Protocol::Lanes, true, Upstream::Both, Some(L), Legacy),
        (Protocol::Lanes, true, Upstream::Both, Some(M), Own),
        (Protocol::Lanes, true, Upstream::Both, None, Own),
        // Not known yet: a 2025 host waits for it; a modern one need not.
        (Protocol::Lanes, true, Upstream::Unknown, Some(L), Wait),
        (Protocol::Lanes, true, Upstream::Unknown, Some(M), Own),
        // One era only: translation on the unit's own.
        (Protocol::Lanes, true, Upstream::Legacy, Some(L), Own),
        (Protocol::Lanes, true, Upstream::Legacy, Some(M), Own),
        (Protocol::Lanes, true, Upstream::Modern, Some(L), Own),
        // A pinned unit: one process, translation.
        (Protocol::Legacy, true, Upstream::Legacy, Some(M), Own),
        (Protocol::Modern, true, Upstream::Both, Some(L), Own),
        (Protocol::Modern, true, Upstream::Unknown, Some(L), Own),
        // `auto`: one process, translation (lanes are asked for).
        (Protocol::Auto, true, Upstream::Both, Some(L), Own),
        // An HTTP server: one session.
        (Protocol::Lanes, false, Upstream::Both, Some(L), Own),
    ];
    for &(protocol, stdio, upstream, host, expected) in cases {
        assert_eq!(
            lane(protocol, stdio, upstream, host),
            expected,
            "{protocol:?} stdio {stdio} {upstream:?} host {host:?}"
        );
    }
}

#[test]
fn a_per_host_instance_speaks_its_hosts_era() {
    use Era::{Legacy as L, Modern as M};
    let cases: &[(Protocol, Upstream, Option<Era>, Protocol)] = &[
        // A 2025 host's instance is pinned to the handshake, unless the
        // server is known to speak 2026-07-28 only.
        (Protocol::Auto, Upstream::Both, Some(L), Protocol::Legacy),
        (Protocol::Auto, Upstream::Unknown, Some(L), Protocol::Legacy),
        (Protocol::Auto, Upstream::Legacy, Some(L), Protocol::Legacy),
        (Protocol::Auto, Upstream::Modern, Some(L), Protocol::Auto),
        // A modern host's asks server/discover first, as the unit does.
        (Protocol::Auto, Upstream::Both, Some(M), Protocol::Auto),
        (Protocol::Auto, Upstream::Both, None, Protocol::Auto),
        // A pinned unit's instances keep its pin.
        (Protocol::Modern, Upstream::Both, Some(L), Protocol::Modern),
        (Protocol::Legacy, Upstream::Both, Some(M), Protocol::Legacy),
    ];
    for &(protocol, upstream, host, expected) in cases {
        assert_eq!(
            instance_protocol(protocol, upstream, host),
            expected,
            "{protocol:?} {upstream:?} host {host:?}"
        );
    }
}
