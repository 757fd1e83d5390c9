//! The integration tests: one binary (ripgrep's layout), in two module
//! folders that say what a test needs:
//!
//! - `pure/`: no process, no daemon: table tests of the pure cores (the
//!   state machine, the router, the eras, the session core, the list
//!   reader, unit files) and the supervisor actor on a fake launcher.
//!   `cargo test --test tests pure::` is the fast suite.
//! - `daemon/`: real processes: the `mcpd` daemon and `mcpctl`, the
//!   fixture and reference servers, the SDK clients, D-Bus. A name in both
//!   folders is one subject, tested both ways (`pure::era` and
//!   `daemon::era`).
//! - `docs`: the documentation and the code's layering stay true, and
//!   this list stays complete (`autotests = false`: a file not listed
//!   here would never run).
//! - `helper`: what the tests share (binaries, snapshots, bounded waits).

mod helper;

mod docs;

mod pure {
    mod actor;
    mod era;
    mod fuzz;
    mod lanes;
    mod lists;
    mod machine;
    mod route;
    mod session;
    mod session_core;
    mod unit_files;
}

mod daemon {
    mod add;
    mod adopt;
    mod aggregate;
    mod bridge;
    mod conformance;
    mod connections;
    mod containment;
    mod credentials;
    mod ctl;
    mod dbus;
    mod edge;
    mod era;
    mod fidelity;
    mod fixture;
    mod flood;
    mod hostile;
    mod http;
    mod interop;
    mod lists;
    mod mcpd;
    mod modern;
    mod oauth;
    mod ondemand;
    mod packaging;
    mod perhost;
    mod reasons;
    mod reload;
    mod sandbox;
    mod search;
    mod session;
    mod supervisor;
    mod telemetry;
    mod tokens;
    mod verify;
}
