//! Tool-call accounting (DESIGN §8): every `tools/call` is counted per
//! server and logged at info with who made it, its outcome and duration,
//! never its arguments.
//!
//! The count is at once; the log line is written in a batch, the way
//! web servers write access logs (nginx's `access_log … flush=`, Envoy's
//! access-log flush interval): a finished call waits at most
//! [`FLUSH_AFTER`] (or until [`FLUSH_AT`] wait) and the batch is written
//! together. Writing each line as its call ended put its formatting, a
//! `write` and the wake-up of the log's reader (journald) between a
//! host's answer and the next message the daemon forwards. Nothing waits
//! past the runtime: the timer task flushes when dropped, and the daemon
//! flushes before its last line ([`flush_log`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::mux::message::decimal_bytes;

/// Who made a call: from the socket or bus credentials, or for an HTTP
/// session (DESIGN §15) the name of its token and the remote address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    pub uid: Option<u32>,
    pub pid: Option<u32>,
    /// The token an HTTP session was opened with (none: `auth "none"`,
    /// or not over HTTP).
    pub token: Option<Arc<str>>,
    /// The HTTP client's address.
    pub peer: Option<std::net::SocketAddr>,
}

impl Caller {
    /// An HTTP session's caller.
    pub fn http(token: Option<&str>, peer: std::net::SocketAddr) -> Self {
        Self {
            token: token.map(Arc::from),
            peer: Some(peer),
            ..Self::default()
        }
    }
}

impl std::fmt::Display for Caller {
    /// `uid U pid P` (`-` for what is not known); an HTTP session's
    /// `token NAME from ADDR` (`http from ADDR` without a token).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = |id: Option<u32>| id.map_or_else(|| "-".to_owned(), |n| n.to_string());
        match (&self.token, self.peer) {
            (Some(token), Some(peer)) => write!(f, "token {token} from {peer}"),
            (Some(token), None) => write!(f, "token {token}"),
            (None, Some(peer)) => write!(f, "http from {peer}"),
            (None, None) => write!(f, "uid {} pid {}", id(self.uid), id(self.pid)),
        }
    }
}

/// The calls of one server since the daemon loaded it, and what its host
/// sessions lost to peers that misbehaved.
#[derive(Debug, Default)]
pub struct Counters {
    calls: AtomicU64,
    failed: AtomicU64,
    detached: AtomicU64,
    dropped: AtomicU64,
    garbage: AtomicU64,
    slowed: AtomicU64,
    shed: AtomicU64,
    refused: AtomicU64,
}

impl Counters {
    /// Adds `other`'s counts to these (a per-host unit keeps its gone
    /// instances' counts, and sums its live ones', DESIGN §13).
    pub fn add(&self, other: &Counters) {
        for (mine, theirs) in [
            (&self.calls, &other.calls),
            (&self.failed, &other.failed),
            (&self.detached, &other.detached),
            (&self.dropped, &other.dropped),
            (&self.garbage, &other.garbage),
            (&self.slowed, &other.slowed),
            (&self.shed, &other.shed),
            (&self.refused, &other.refused),
        ] {
            mine.fetch_add(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Host sessions detached for misbehaving (not reading, sending too
    /// much before `initialize`, a failed connection).
    pub fn detached(&self) -> u64 {
        self.detached.load(Ordering::Relaxed)
    }

    /// Notifications not sent to host sessions that were behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Lines the server wrote to its stdout that were not JSON-RPC
    /// messages.
    pub fn garbage_lines(&self) -> u64 {
        self.garbage.load(Ordering::Relaxed)
    }

    pub(crate) fn garbage(&self, lines: u64) {
        self.garbage.fetch_add(lines, Ordering::Relaxed);
    }

    pub(crate) fn host_detached(&self) {
        self.detached.fetch_add(1, Ordering::Relaxed);
    }

    /// Times a host session was read no more for a while, because the
    /// server had not read enough of what it sent (back-pressure).
    pub fn slowed(&self) -> u64 {
        self.slowed.load(Ordering::Relaxed)
    }

    /// Notifications of host sessions dropped, not sent to a server that
    /// was not reading (past the session's share of its queue).
    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }

    /// Requests of host sessions refused, for the same reason.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn host_slowed(&self) {
        self.slowed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn host_shed(&self, request: bool) {
        let counter = if request { &self.refused } else { &self.shed };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn notification_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

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
pub use crate::mux::session::Outcome;

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
    pub(crate) fn new(
        server: &Arc<str>,
        tool: impl Into<String>,
        counters: &Arc<Counters>,
    ) -> Self {
        Self {
            server: Arc::clone(server),
            tool: tool.into(),
            counters: Arc::clone(counters),
            caller: Caller::default(),
            started: Instant::now(),
            done: false,
        }
    }

    /// A call of `caller`'s that started at `started` (the host sessions'
    /// core keeps its calls without their accounting).
    pub(crate) fn started(
        server: &Arc<str>,
        tool: String,
        counters: &Arc<Counters>,
        caller: Caller,
        started: Instant,
    ) -> Self {
        Self {
            server: Arc::clone(server),
            tool,
            counters: Arc::clone(counters),
            caller,
            started,
            done: false,
        }
    }

    pub(crate) fn finish(&mut self, outcome: Outcome) {
        self.done = true;
        self.counters.record(outcome == Outcome::Ok);
        log_later(Finished {
            server: Arc::clone(&self.server),
            tool: std::mem::take(&mut self.tool),
            caller: self.caller.clone(),
            outcome,
            took: self.started.elapsed(),
        });
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if !self.done {
            self.finish(Outcome::Abandoned);
        }
    }
}

/// How long a finished call's line may wait to be written, unless
/// [`set_flush_after`] said otherwise.
pub const FLUSH_AFTER: Duration = Duration::from_millis(50);
/// The longest [`set_flush_after`] takes.
pub const FLUSH_AFTER_MAX: Duration = Duration::from_secs(60);
/// How many lines may wait: the one that makes this many writes them all.
pub const FLUSH_AT: usize = 64;

/// A finished call, to be logged.
#[derive(Debug)]
struct Finished {
    server: Arc<str>,
    tool: String,
    caller: Caller,
    outcome: Outcome,
    took: Duration,
}

/// The lines waiting, and whether a flush is on its way.
struct Waiting {
    calls: Vec<Finished>,
    scheduled: bool,
}

static WAITING: Mutex<Waiting> = Mutex::new(Waiting {
    calls: Vec::new(),
    scheduled: false,
});

/// The wait, in microseconds (`FLUSH_AFTER` until set).
static FLUSH_AFTER_USEC: AtomicU64 = AtomicU64::new(FLUSH_AFTER.as_micros() as u64);

/// Sets how long a call's line may wait (`MCPD_CALL_LOG_DELAY`, read by
/// the daemon's binary): zero writes each line as its call ends. At most
/// [`FLUSH_AFTER_MAX`].
pub fn set_flush_after(wait: Duration) -> Result<(), String> {
    if wait > FLUSH_AFTER_MAX {
        return Err(format!("at most {}s", FLUSH_AFTER_MAX.as_secs()));
    }
    let usec = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
    FLUSH_AFTER_USEC.store(usec, Ordering::Relaxed);
    Ok(())
}

fn waiting() -> MutexGuard<'static, Waiting> {
    // A panic while logging leaves the lines as good as they were.
    WAITING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Queues a finished call's line: written at once when it makes
/// [`FLUSH_AT`], when the wait is zero, or when no runtime is there to
/// time the flush; else within the wait ([`FLUSH_AFTER`]).
fn log_later(call: Finished) {
    let wait = Duration::from_micros(FLUSH_AFTER_USEC.load(Ordering::Relaxed));
    let mut w = waiting();
    w.calls.push(call);
    if w.calls.len() < FLUSH_AT && !wait.is_zero() {
        if w.scheduled {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            w.scheduled = true;
            drop(w);
            // Dropped unpolled (the runtime stopping) or after the wait,
            // it writes what waits.
            let flush = Scheduled;
            runtime.spawn(async move {
                let _flush = flush;
                tokio::time::sleep(wait).await;
            });
            return;
        }
    }
    drop(w);
    flush_log();
}

/// The flush on its way: writes what waits when dropped.
struct Scheduled;

impl Drop for Scheduled {
    fn drop(&mut self) {
        waiting().scheduled = false;
        flush_log();
    }
}

/// Writes the lines of every finished call now (the daemon, before its
/// last line).
pub fn flush_log() {
    let calls = std::mem::take(&mut waiting().calls);
    if calls.is_empty() {
        return;
    }
    if let Some(ansi) = crate::logbatch::text() {
        // The text log: the lines are made here, in its format, with one
        // timestamp, and written in one go (DESIGN §8: no per-call trip
        // through tracing's field machinery).
        if tracing::enabled!(target: "mcpd::calls", tracing::Level::INFO) {
            // One time for the batch: every line starts the same.
            let mut start = String::with_capacity(64);
            let now = std::time::SystemTime::now();
            let _ = crate::logbatch::prefix(&mut start, ansi, now, INFO, "mcpd::calls");
            let lines = text_lines(&calls, &start, ansi);
            crate::logbatch::write(&lines);
        }
        return;
    }
    crate::logbatch::together(|| {
        for call in &calls {
            log_call(call);
        }
    });
}

/// The text log lines of `calls`, each after `start`. A run of calls of
/// one tool by one caller with one outcome (the most usual batch) has
/// its lines' [`Pieces`] made once.
fn text_lines(calls: &[Finished], start: &str, ansi: bool) -> Vec<u8> {
    let mut lines = Vec::with_capacity(calls.len() * 200);
    let mut made: Option<(&Finished, Pieces)> = None;
    for call in calls {
        if !made.as_ref().is_some_and(|(m, _)| Pieces::fit(m, call)) {
            match Pieces::of(call, ansi) {
                Ok(pieces) => made = Some((call, pieces)),
                Err(_) => continue,
            }
        }
        if let Some((_, pieces)) = &made {
            pieces.line(&mut lines, start, call);
        }
    }
    lines
}

/// The text log's level of a call's line, with its colour.
const INFO: (&str, &str) = ("\x1b[32m", " INFO");

/// One finished call's text log line, as [`log_call`] writes it through
/// the text log, after `start` (the batch's [`crate::logbatch::prefix`],
/// made once); with `push_str` and digits made by hand, not `fmt`
/// (whose machinery was half of a line's cost). Its text but the two
/// durations is the same for every call of one tool by one caller with
/// one outcome: [`Pieces`], which a batch makes once for a run of them.
#[cfg(test)]
fn text_line(out: &mut String, start: &str, ansi: bool, call: &Finished) -> std::fmt::Result {
    let pieces = Pieces::of(call, ansi)?;
    let mut line = Vec::new();
    pieces.line(&mut line, start, call);
    out.push_str(&String::from_utf8(line).map_err(|_| std::fmt::Error)?);
    Ok(())
}

/// A call's text log line but its start and its two durations.
struct Pieces {
    /// `tools/call TOOL by CALLER: OUTCOME in `.
    head: String,
    /// ` ms mcpd_server=… mcpd_duration_usec=`.
    tail: String,
}

impl Pieces {
    fn of(call: &Finished, ansi: bool) -> Result<Self, std::fmt::Error> {
        use crate::logbatch::{escape, field_name};
        let id = |out: &mut String, id: Option<u32>| match id {
            Some(id) => push_number(out, u64::from(id)),
            None => out.push('-'),
        };
        let outcome = |out: &mut String| {
            if call.outcome == Outcome::Ok {
                out.push_str("ok");
                Ok(())
            } else {
                escape(out, &call.outcome.to_string())
            }
        };
        let mut out = String::with_capacity(64);
        out.push_str("tools/call ");
        escape(&mut out, &call.tool)?;
        out.push_str(" by ");
        if call.caller.token.is_none() && call.caller.peer.is_none() {
            // A bridge's or the bus's (the most calls): as `Display` says
            // it, without `fmt`.
            out.push_str("uid ");
            id(&mut out, call.caller.uid);
            out.push_str(" pid ");
            id(&mut out, call.caller.pid);
        } else {
            // An HTTP session's, as `Display` says it, the address without
            // `fmt` (an HTTP call's line has it twice).
            let mut caller = String::with_capacity(64);
            match &call.caller.token {
                Some(token) => {
                    caller.push_str("token ");
                    caller.push_str(token);
                    if call.caller.peer.is_some() {
                        caller.push_str(" from ");
                    }
                }
                None => caller.push_str("http from "),
            }
            if let Some(peer) = call.caller.peer {
                push_address(&mut caller, peer);
            }
            escape(&mut out, &caller)?;
        }
        out.push_str(": ");
        outcome(&mut out)?;
        out.push_str(" in ");
        let head = std::mem::replace(&mut out, String::with_capacity(192));
        out.push_str(" ms ");
        field_name(&mut out, ansi, "mcpd_server")?;
        escape(&mut out, &call.server)?;
        out.push(' ');
        field_name(&mut out, ansi, "mcpd_tool")?;
        escape(&mut out, &call.tool)?;
        out.push(' ');
        field_name(&mut out, ansi, "mcpd_caller_uid")?;
        id(&mut out, call.caller.uid);
        out.push(' ');
        field_name(&mut out, ansi, "mcpd_caller_pid")?;
        id(&mut out, call.caller.pid);
        out.push(' ');
        if let Some(token) = &call.caller.token {
            field_name(&mut out, ansi, "mcpd_caller_token")?;
            escape(&mut out, token)?;
            out.push(' ');
        }
        if let Some(peer) = call.caller.peer {
            field_name(&mut out, ansi, "mcpd_caller_address")?;
            let mut address = String::with_capacity(48);
            push_address(&mut address, peer);
            escape(&mut out, &address)?;
            out.push(' ');
        }
        field_name(&mut out, ansi, "mcpd_outcome")?;
        outcome(&mut out)?;
        out.push(' ');
        field_name(&mut out, ansi, "mcpd_duration_usec")?;
        Ok(Self { head, tail: out })
    }

    /// Whether `call`'s line has the pieces of `made`'s.
    fn fit(made: &Finished, call: &Finished) -> bool {
        made.tool == call.tool
            && made.outcome == call.outcome
            && made.caller == call.caller
            && made.server == call.server
    }

    /// `call`'s whole line, after `start`.
    fn line(&self, out: &mut Vec<u8>, start: &str, call: &Finished) {
        out.extend_from_slice(start.as_bytes());
        out.extend_from_slice(self.head.as_bytes());
        push_millis(out, call.took);
        out.extend_from_slice(self.tail.as_bytes());
        let mut digits = [0u8; 20];
        out.extend_from_slice(decimal_bytes(micros(call.took), &mut digits));
        out.push(b'\n');
    }
}

fn micros(took: Duration) -> u64 {
    u64::try_from(took.as_micros()).unwrap_or(u64::MAX)
}

/// `peer` as `Display` writes it; an IPv4 one without `fmt`.
fn push_address(out: &mut String, peer: std::net::SocketAddr) {
    match peer {
        std::net::SocketAddr::V4(v4) => {
            for (i, octet) in v4.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push_number(out, u64::from(octet));
            }
            out.push(':');
            push_number(out, u64::from(v4.port()));
        }
        std::net::SocketAddr::V6(_) => {
            use std::fmt::Write;
            let _ = write!(out, "{peer}");
        }
    }
}

/// `n` in decimal.
fn push_number(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    // Digits are ASCII: one copy, not a push a digit.
    out.push_str(crate::mux::message::decimal(n, &mut digits));
}

/// `took` in milliseconds to a tenth, rounded half up ("1.3").
fn push_millis(out: &mut Vec<u8>, took: Duration) {
    let tenths = micros(took).saturating_add(50) / 100;
    let mut digits = [0u8; 20];
    out.extend_from_slice(decimal_bytes(tenths / 10, &mut digits));
    out.push(b'.');
    out.push(b'0' + (tenths % 10) as u8);
}

/// Logs one finished call. The journal gets MCPD_SERVER, MCPD_TOOL,
/// MCPD_CALLER_UID, MCPD_CALLER_PID, MCPD_OUTCOME and MCPD_DURATION_USEC,
/// and for an HTTP session MCPD_CALLER_TOKEN and MCPD_CALLER_ADDRESS.
fn log_call(call: &Finished) {
    let Finished {
        server,
        tool,
        caller,
        outcome,
        took,
    } = call;
    let uid = caller.uid.map_or_else(|| "-".to_owned(), |u| u.to_string());
    let pid = caller.pid.map_or_else(|| "-".to_owned(), |p| p.to_string());
    let mut millis = Vec::new();
    push_millis(&mut millis, *took);
    let millis = String::from_utf8_lossy(&millis);
    let token = caller.token.as_deref().map(tracing::field::display);
    let address = caller.peer.map(tracing::field::display);
    tracing::info!(
        target: "mcpd::calls",
        mcpd_server = %server,
        mcpd_tool = %tool,
        mcpd_caller_uid = %uid,
        mcpd_caller_pid = %pid,
        mcpd_caller_token = token,
        mcpd_caller_address = address,
        mcpd_outcome = %outcome,
        mcpd_duration_usec = micros(*took),
        "tools/call {tool} by {caller}: {outcome} in {millis} ms"
    );
}

/// A call to `tool` by uid 1000 (pid unknown) that took 1.25 ms and
/// ended with `outcome`: its
/// line as [`flush_log`] makes it for the text log, and [`log_call`]
/// logging it (for the text log's tests: the two lines must not differ).
#[cfg(test)]
pub(crate) fn sample(tool: &str, outcome: Outcome, ansi: bool) -> (String, impl Fn()) {
    let call = Finished {
        server: Arc::from("srv"),
        tool: tool.to_owned(),
        caller: Caller {
            uid: Some(1000),
            ..Caller::default()
        },
        outcome,
        took: Duration::from_micros(1250),
    };
    let mut start = String::new();
    let now = std::time::SystemTime::now();
    crate::logbatch::prefix(&mut start, ansi, now, INFO, "mcpd::calls").expect("formats");
    let mut line = String::new();
    text_line(&mut line, &start, ansi, &call).expect("formats");
    (line, move || log_call(&call))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::logbatch::Sink;

    /// The lines `sink` was given for calls of `server`.
    fn lines(sink: &Sink, server: &str) -> usize {
        let text = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("utf-8");
        text.lines()
            .filter(|l| l.contains(&format!("mcpd_server={server} ")))
            .count()
    }

    fn call(server: &Arc<str>, counters: &Arc<Counters>) {
        Record::new(server, "echo", counters).finish(Outcome::Ok);
    }

    fn paused() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime")
    }

    #[test]
    fn a_batch_makes_each_line_as_a_line_alone_would_be() {
        let finished = |server: &str, tool: &str, uid, outcome: Outcome, micros| Finished {
            server: Arc::from(server),
            tool: tool.to_owned(),
            caller: Caller {
                uid,
                pid: Some(7),
                ..Caller::default()
            },
            outcome,
            took: Duration::from_micros(micros),
        };
        let calls = [
            finished("a", "echo", Some(1), Outcome::Ok, 1250),
            finished("a", "echo", Some(1), Outcome::Ok, 99),
            finished("a", "echo", Some(2), Outcome::Ok, 1_000_049),
            finished("a", "add", Some(2), Outcome::Ok, 0),
            finished("a", "add", Some(2), Outcome::ErrorResult, 3),
            finished("b", "add", Some(2), Outcome::ErrorResult, 3),
            finished("b", "add", None, Outcome::Failed("x\x1b".into()), 3),
            finished("b", "add", None, Outcome::Failed("y".into()), 3),
            finished("b", "add", None, Outcome::Failed("y".into()), 12),
        ];
        for ansi in [false, true] {
            let mut alone = String::new();
            for call in &calls {
                text_line(&mut alone, "START ", ansi, call).expect("formats");
            }
            assert_eq!(text_lines(&calls, "START ", ansi), alone.into_bytes());
        }
        let mut one = String::new();
        text_line(&mut one, "", false, &calls[2]).expect("formats");
        assert_eq!(
            one,
            "tools/call echo by uid 2 pid 7: ok in 1000.0 ms mcpd_server=a mcpd_tool=echo \
             mcpd_caller_uid=2 mcpd_caller_pid=7 mcpd_outcome=ok mcpd_duration_usec=1000049\n"
        );
    }

    #[test]
    fn an_http_callers_line_says_it_as_display_does() {
        for (token, peer) in [
            (Some("laptop"), "127.0.0.1:4321"),
            (None, "10.255.0.9:80"),
            (Some("a b"), "[::1]:8737"),
        ] {
            let peer: std::net::SocketAddr = peer.parse().expect("address");
            let mut address = String::new();
            push_address(&mut address, peer);
            assert_eq!(address, peer.to_string());
            let caller = Caller::http(token, peer);
            let call = Finished {
                server: Arc::from("u"),
                tool: "echo".into(),
                caller: caller.clone(),
                outcome: Outcome::Ok,
                took: Duration::from_micros(1500),
            };
            let mut line = String::new();
            text_line(&mut line, "", false, &call).expect("line");
            let mut said = String::new();
            crate::logbatch::escape(&mut said, &caller.to_string()).expect("escape");
            assert!(
                line.starts_with(&format!("tools/call echo by {said}: ok in ")),
                "{line}"
            );
            assert!(
                line.contains(&format!("mcpd_caller_address={peer} ")),
                "{line}"
            );
        }
    }

    // One test: the queue is the process's, and tests run in parallel.
    #[test]
    fn calls_are_counted_at_once_and_logged_in_batches_that_are_never_lost() {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let counters = Arc::new(Counters::default());
            // With no runtime to time a flush: at once.
            let alone: Arc<str> = Arc::from("alone");
            call(&alone, &counters);
            assert_eq!((counters.calls(), lines(&sink, "alone")), (1, 1));

            // In a runtime: counted at once, written FLUSH_AFTER later.
            let timed: Arc<str> = Arc::from("timed");
            paused().block_on(async {
                call(&timed, &counters);
                call(&timed, &counters);
                assert_eq!((counters.calls(), lines(&sink, "timed")), (3, 0));
                tokio::time::sleep(FLUSH_AFTER - Duration::from_millis(1)).await;
                assert_eq!(lines(&sink, "timed"), 0, "written before its time");
                tokio::time::sleep(Duration::from_millis(2)).await;
                tokio::task::yield_now().await;
                assert_eq!(lines(&sink, "timed"), 2, "both, in one batch");
            });

            // The call that makes FLUSH_AT writes them all, without waiting.
            let full: Arc<str> = Arc::from("full");
            paused().block_on(async {
                for n in 1..FLUSH_AT {
                    call(&full, &counters);
                    assert_eq!(lines(&sink, "full"), 0, "after {n}");
                }
                call(&full, &counters);
                assert_eq!(lines(&sink, "full"), FLUSH_AT);
            });

            // A runtime that ends first writes what waits as it goes, and
            // the daemon's flush writes what waits at once.
            let ended: Arc<str> = Arc::from("ended");
            paused().block_on(async { call(&ended, &counters) });
            assert_eq!(lines(&sink, "ended"), 1);
            let flushed: Arc<str> = Arc::from("flushed");
            paused().block_on(async {
                call(&flushed, &counters);
                flush_log();
                assert_eq!(lines(&sink, "flushed"), 1);
            });
            assert_eq!(lines(&sink, "flushed"), 1, "written once");

            // A wait of zero: each line as its call ends.
            assert!(set_flush_after(FLUSH_AFTER_MAX + Duration::from_secs(1)).is_err());
            set_flush_after(Duration::ZERO).expect("zero");
            let now: Arc<str> = Arc::from("now");
            paused().block_on(async {
                call(&now, &counters);
                assert_eq!(lines(&sink, "now"), 1);
            });
            set_flush_after(FLUSH_AFTER).expect("default");
        });
    }
}
