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
        (Protocol::Auto, true, Upstream::Both, Some(L), Legacy),
        (Protocol::Auto, true, Upstream::Both, Some(M), Own),
        (Protocol::Auto, true, Upstream::Both, None, Own),
        // Not known yet: a 2025 host waits for it; a modern one need not.
        (Protocol::Auto, true, Upstream::Unknown, Some(L), Wait),
        (Protocol::Auto, true, Upstream::Unknown, Some(M), Own),
        // One era only: translation on the unit's own.
        (Protocol::Auto, true, Upstream::Legacy, Some(L), Own),
        (Protocol::Auto, true, Upstream::Legacy, Some(M), Own),
        (Protocol::Auto, true, Upstream::Modern, Some(L), Own),
        // A pinned unit: one process, translation.
        (Protocol::Legacy, true, Upstream::Legacy, Some(M), Own),
        (Protocol::Modern, true, Upstream::Both, Some(L), Own),
        (Protocol::Modern, true, Upstream::Unknown, Some(L), Own),
        (Protocol::Legacy, true, Upstream::Both, Some(L), Own),
        // An HTTP server: one session.
        (Protocol::Auto, false, Upstream::Both, Some(L), Own),
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

#[test]
fn lanes_is_another_word_for_auto() {
    // The opt-in's word before lanes were `auto`'s: a unit that wrote it
    // keeps its meaning.
    for word in ["auto", "lanes"] {
        let text = format!("stdio {{\n    command \"/bin/true\"\n}}\nprotocol \"{word}\"\n");
        let files = mcpd::unit::UnitFiles::beside(std::path::Path::new("/units/demo.kdl"));
        let spec = mcpd::unit::load_with(&files, &Default::default(), |_| {
            Ok(text.clone().into_bytes())
        })
        .expect(word);
        assert_eq!(spec.protocol(), Protocol::Auto, "{word}");
    }
}

#[test]
fn a_difference_between_two_lanes_lists_is_told_once_per_change() {
    use mcpd::mux::session::lanes::Agreement;
    let mut a = Agreement::default();
    // (list, serials of the own lane and the other, same) → tell
    let steps: &[(usize, (u64, u64), bool, bool)] = &[
        // They agree: nothing to tell.
        (0, (1, 1), true, false),
        // The other lane's tools change: told once...
        (0, (1, 2), false, true),
        // ...not again at a re-read that changed nothing...
        (0, (1, 2), false, false),
        // ...nor of another list (told on its own).
        (3, (4, 7), false, true),
        (3, (4, 7), false, false),
        // A change of either lane while they still differ: told again.
        (0, (2, 2), false, true),
        (0, (2, 3), false, true),
        // They agree again, then differ as before: told again.
        (0, (2, 4), true, false),
        (0, (2, 3), false, true),
        // Not a list: nothing.
        (4, (1, 2), false, false),
    ];
    for (i, &(list, serials, same, tell)) in steps.iter().enumerate() {
        assert_eq!(
            a.differs(list, serials, same),
            tell,
            "step {i}: list {list} {serials:?} same {same}"
        );
    }
    assert_eq!(Agreement::LISTS[0], "tools");
}
