//! mcpd: a systemd-style service manager for MCP servers.
//!
//! The library holds everything; the binaries `mcpd` and `mcpctl` only parse
//! arguments and call into it. See `ARCHITECTURE.md` for the code map.

pub mod adopt;
pub mod aggregate;
pub mod ctl;
pub mod daemon;
pub mod dbus;
pub mod endpoint;
pub mod files;
pub mod logbatch;
pub mod model;
pub mod mux;
pub mod sockets;
pub mod supervisor;
pub mod telemetry;
pub mod tokens;
pub mod unit;
pub mod words;
