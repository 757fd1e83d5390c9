//! Host sessions (DESIGN §8): every host that attaches to a unit gets its
//! own MCP session with mcpd, multiplexed onto the one upstream session of
//! the unit's current generation.
//!
//! Reading order: the three pure parts first — [`route`], the routing core
//! (ids and progress tokens, who answers a server→client request,
//! subscriptions, log levels, detach and outage cleanup), table-tested
//! like the supervisor's machine; [`session`], what mcpd decides about a
//! host's lines itself (`initialize` and its version, refusals, answers
//! from kept lists, accounting); [`method`], the MCP methods mcpd treats
//! specially, one documented row each; [`era`], what a host speaking MCP
//! 2026-07-28 gets over a 2025 server (discovery, per-request `_meta`,
//! `input_required`, listen streams); [`tasks`], whose task a task id is
//! (each host knows its own by ids of mcpd's); [`lists`], the list reader (paging
//! bounded in cursors, pages, bytes and time). Then [`message`], a
//! message kept as its members' JSON text (found by `scan`, a validating
//! scan of an object's top level); [`error`], the JSON-RPC errors mcpd
//! writes; [`lines`], the framing, [`outbox`], a descriptor's writer
//! ([`memory`]: an in-memory stream pair for two tasks of the daemon), and
//! [`wire`], a connection to a server; [`host`], a host's link, writer
//! and readers; [`attach`], the attach socket's protocol, and [`ledger`],
//! the requests in flight of a handed-over session, for its bridge. The
//! task that runs them for a unit (its state, its timers, the actor's
//! requests) is `supervisor::sessions`.

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
pub mod target;
pub mod tasks;
pub mod wire;
