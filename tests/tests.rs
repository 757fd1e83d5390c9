//! The integration tests: one binary, a module per area (ripgrep's layout).

mod helper;

mod actor;
mod adopt;
mod aggregate;
mod bridge;
mod connections;
mod containment;
mod credentials;
mod ctl;
mod daemon;
mod dbus;
mod era;

mod docs;
mod eras;
mod fidelity;
mod fixture;
mod fuzz;
mod hostile;
mod http;
mod interop;
mod lists;
mod machine;
mod modern;
mod ondemand;
mod packaging;
mod perhost;
mod reload;
mod route;
mod sandbox;
mod search;
mod session;
mod session_core;
mod sessions;
mod supervisor;
mod tokens;
mod unit_files;
mod verify;
