//! Tool-call accounting (DESIGN §8): every `tools/call` is counted per
//! server and logged at info with who made it, its outcome and duration,
//! never its arguments.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Who made a call, from the socket or bus credentials.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller {
    pub uid: Option<u32>,
    pub pid: Option<u32>,
}

/// The calls of one server since the daemon loaded it.
#[derive(Debug, Default)]
pub struct Counters {
    calls: AtomicU64,
    failed: AtomicU64,
}

impl Counters {
    /// Every call made.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Calls that produced no result or an `isError` result.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    pub(crate) fn record(&self, ok: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// The tool answered with `isError`.
    ErrorResult,
    /// No result: why.
    Failed(String),
    /// The caller went away before the answer (the call was cancelled).
    Abandoned,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Ok => f.write_str("ok"),
            Outcome::ErrorResult => f.write_str("error result"),
            Outcome::Failed(why) => write!(f, "failed: {why}"),
            Outcome::Abandoned => f.write_str("cancelled: the caller left"),
        }
    }
}

/// One call being made: counted and logged when finished, or when dropped
/// unfinished (abandoned).
#[derive(Debug)]
pub(crate) struct Record {
    server: Arc<str>,
    tool: String,
    counters: Arc<Counters>,
    /// Who called, once known.
    pub(crate) caller: Caller,
    started: Instant,
    done: bool,
}

impl Record {
    pub(crate) fn new(server: &Arc<str>, tool: &str, counters: &Arc<Counters>) -> Self {
        Self {
            server: Arc::clone(server),
            tool: tool.to_owned(),
            counters: Arc::clone(counters),
            caller: Caller::default(),
            started: Instant::now(),
            done: false,
        }
    }

    pub(crate) fn finish(&mut self, outcome: Outcome) {
        self.done = true;
        self.counters.record(outcome == Outcome::Ok);
        log_call(
            &self.server,
            &self.tool,
            self.caller,
            &outcome,
            self.started.elapsed(),
        );
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if !self.done {
            self.finish(Outcome::Abandoned);
        }
    }
}

/// Logs one finished call. The journal gets MCPD_SERVER, MCPD_TOOL,
/// MCPD_CALLER_UID, MCPD_CALLER_PID, MCPD_OUTCOME and MCPD_DURATION_USEC.
fn log_call(server: &str, tool: &str, caller: Caller, outcome: &Outcome, took: Duration) {
    let uid = caller.uid.map_or_else(|| "-".to_owned(), |u| u.to_string());
    let pid = caller.pid.map_or_else(|| "-".to_owned(), |p| p.to_string());
    tracing::info!(
        target: "mcpd::calls",
        mcpd_server = %server,
        mcpd_tool = %tool,
        mcpd_caller_uid = %uid,
        mcpd_caller_pid = %pid,
        mcpd_outcome = %outcome,
        mcpd_duration_usec = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        "tools/call {tool} by uid {uid} pid {pid}: {outcome} in {:.1} ms",
        took.as_secs_f64() * 1000.0
    );
}
