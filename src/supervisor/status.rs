//! What a supervisor publishes and answers, shared by its handle
//! (`mod.rs`), its actor and its host sessions: the [`Status`] read model
//! and the [`CallError`] of a tool call. A leaf: it imports only the
//! machine's types.

use std::fmt;
use std::time::{Duration, SystemTime};

use super::machine::{self, State};

/// The read model of one server (DESIGN §3 "every state exposes"): the
/// machine's [`View`](machine::View) with wall-clock times.
pub type Status = machine::View<SystemTime>;

/// Why a tool call did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The server has no established generation.
    NotRunning {
        server: String,
        state: State,
        reason: String,
        attempt: u32,
        max_attempts: u32,
        next_retry: Option<SystemTime>,
    },
    /// No answer within the call's timeout.
    Timeout(Duration),
    /// The server answered with a JSON-RPC error (unknown tool, bad arguments).
    Rejected { code: i32, message: String },
    /// The connection failed during the call.
    Failed(String),
    /// The server lists no such tool.
    NoSuchTool { server: String, tool: String },
    /// The unit's `tools` block filters the tool out.
    Filtered {
        server: String,
        tool: String,
        why: String,
    },
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::NotRunning {
                server,
                state,
                reason,
                attempt,
                max_attempts,
                next_retry,
            } => {
                if *state == State::NeedsLogin {
                    // The reason says it all: "server NAME needs a login: …".
                    return f.write_str(reason);
                }
                write!(f, "server {server} is {state}")?;
                if *attempt > 0 {
                    write!(f, " (retry {attempt}/{max_attempts}")?;
                    if let Some(at) = next_retry {
                        let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
                        let wait = Duration::from_secs(wait.as_secs())
                            + Duration::from_millis(u64::from(wait.subsec_millis()));
                        write!(f, ", next in {}", humantime::format_duration(wait))?;
                    }
                    write!(f, ")")?;
                }
                if !reason.is_empty() {
                    write!(f, ": {reason}")?;
                }
                Ok(())
            }
            CallError::Timeout(t) => {
                write!(f, "no answer within {}", humantime::format_duration(*t))
            }
            CallError::Rejected { code, message } => {
                write!(f, "the server rejected the call ({code}): {message}")
            }
            CallError::Failed(e) => write!(f, "the call failed: {e}"),
            CallError::NoSuchTool { server, tool } => {
                write!(f, "server {server} has no tool {tool}")
            }
            CallError::Filtered { server, tool, why } => {
                f.write_str(&crate::mux::session::filtered(server, tool, why))
            }
        }
    }
}

impl std::error::Error for CallError {}

impl CallError {
    /// The `result` of a server's answer, or the error it answered with.
    pub(crate) fn result_of(mut answer: serde_json::Value) -> Result<serde_json::Value, Self> {
        if let Some(result) = answer.get_mut("result") {
            return Ok(result.take());
        }
        let error = &answer["error"];
        Err(CallError::Rejected {
            code: error["code"]
                .as_i64()
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(0),
            message: error["message"]
                .as_str()
                .unwrap_or("an error without a message")
                .to_owned(),
        })
    }

    /// Why server `server` cannot answer now: its state and next retry.
    pub fn not_running(server: &str, status: &Status) -> Self {
        CallError::NotRunning {
            server: server.to_owned(),
            state: status.state,
            reason: status.reason.clone(),
            attempt: status.attempt,
            max_attempts: status.max_attempts,
            next_retry: status.next_retry,
        }
    }
}
