//! Host sessions (DESIGN §8): every host that attaches to a unit gets its
//! own MCP session with mcpd, multiplexed onto the one upstream session of
//! the unit's current generation.
//!
//! Reading order: [`route`], the pure routing core (ids and progress
//! tokens, who answers a server→client request, subscriptions, log levels,
//! detach and outage cleanup), table-tested like the supervisor's machine;
//! [`message`], a message kept as its members' JSON text (found by
//! `scan`, a validating scan of an object's top level); [`lines`], the
//! framing, [`outbox`], a descriptor's writer, and [`wire`], a connection
//! to a server; [`attach`], the attach socket's protocol, and [`ledger`], the
//! requests in flight of a handed-over session, for its bridge. The
//! session layer that runs the router (`initialize`, the cached lists
//! through outages) is `supervisor::sessions`.

pub mod attach;
pub mod ledger;
pub mod lines;
pub mod message;
pub mod outbox;
pub mod route;
mod scan;
pub mod wire;
