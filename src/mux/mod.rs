//! Host sessions (DESIGN §8): every host that attaches to a unit gets its
//! own MCP session with mcpd, multiplexed onto the one upstream session of
//! the unit's current generation.
//!
//! Reading order: the three pure parts first — [`route`], the routing core
//! (ids and progress tokens, who answers a server→client request,
//! subscriptions, log levels, detach and outage cleanup), table-tested
//! like the supervisor's machine; [`session`], the core of a unit's host
//! sessions, which takes every decision about its hosts and its upstream
//! (`initialize` and its version, refusals and bounds, answers from kept
//! lists, accounting, eras) as outputs for its driver; [`method`], the MCP methods mcpd treats
//! specially, one documented row each; [`era`], what a host speaking MCP
//! 2026-07-28 gets over a 2025 server (discovery, per-request `_meta`,
//! `input_required`, listen streams); [`tasks`], whose task a task id is
//! (each host knows its own by ids of mcpd's); [`lists`], the list reader (paging
//! bounded in cursors, pages, bytes and time). Then [`message`], a
//! message kept as its members' JSON text (found by `scan`, a validating
//! scan of an object's top level); [`error`], every JSON-RPC error code
//! named and the one builder of error responses; [`lines`], the framing, [`outbox`], a descriptor's writer
//! ([`memory`]: an in-memory stream pair for two tasks of the daemon), and
//! [`wire`], a connection to a server; [`host`], a host's link, writer
//! and readers; [`attach`], the attach socket's protocol, and [`ledger`],
//! the requests in flight of a handed-over session, for its bridge.
//!
//! Three places drive these parts: `supervisor::sessions`, the task of a
//! unit's host sessions, which feeds its [`session`] core (and the router
//! within it) and carries out what it returns; `crate::aggregate`, the
//! task of an aggregate, which runs [`aggregate`]; and
//! `endpoint::session`, an HTTP session's requests and streams, which
//! reaches its unit's sessions as a host through [`memory`] and [`host`].

pub mod aggregate;
pub mod attach;
pub mod era;
pub mod error;
pub mod host;
pub mod ledger;
pub mod lines;
pub mod lists;
pub mod memory;
pub mod message;
pub mod method;
pub mod outbox;
pub mod route;
mod scan;
pub mod session;
pub mod shape;
pub mod target;
pub mod tasks;
pub mod wire;
