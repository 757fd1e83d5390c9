//! `mcpctl`: the command-line client. Each subcommand lives in its own module
//! and returns an exit code; `src/bin/mcpctl.rs` only dispatches.

pub mod add;
pub mod auth;
pub mod bridge;
pub mod client;
pub mod commands;
pub mod credential;
pub mod edit;
pub mod import;
pub mod token;
pub mod verify;

/// Exit codes shared by every subcommand (systemctl's convention).
pub mod exit {
    /// Success; for `status`, every named server is running.
    pub const OK: u8 = 0;
    /// Any failure not covered below (invalid units, bad arguments, I/O).
    pub const FAILURE: u8 = 1;
    /// A named server is not running.
    pub const NOT_RUNNING: u8 = 3;
    /// A named server does not exist.
    pub const NO_SUCH_SERVER: u8 = 4;
    /// Standard output was closed by its reader (`mcpctl … | head`): the
    /// status a shell shows for a program SIGPIPE ended, with no message.
    pub const BROKEN_PIPE: u8 = 128 + 13;
}
