//! What a server writes to stderr: the last lines, kept in memory for
//! `status`, and the rate limit of what reaches the log (DESIGN §3,
//! invariant 10: journald's defaults, 10,000 lines per 30 s).
//!
//! `pump`, the stderr reader, makes a small first read (most wake-ups bring
//! one line), then reads larger chunks split with memchr, and holds no
//! buffer while the server is quiet. Over the limit it reads at intervals
//! from a pipe shrunk to a page, so a flood of small writes costs a few
//! reads and wake-ups, not one per line. `Limiter` is pure: a window opened
//! by its first line, its first N lines logged, the rest counted and
//! reported once.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio_util::bytes::BytesMut;

use crate::mux::wire::Drain;
use crate::unit::RateLimit;

/// Lines kept per server.
pub const CAPACITY: usize = 200;
/// Longer lines are cut to this many bytes (a server's log message to
/// the journal too, with its size shown: [`clip`]).
pub const MAX_LINE: usize = 4096;
/// A rate-limit window logs at most its `lines` times this many bytes as
/// well (10,000 lines: 5 MiB per window), so large lines reach the limit
/// sooner than small ones.
pub const BYTES_PER_LINE: u64 = 512;

/// `text` as a log line shows it: at most `max` bytes (cut at a
/// character), then `… [N bytes]` with the size it had.
pub fn clip(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} bytes]", &text[..end], text.len()).into()
}

/// A bounded ring of log lines, shared by the stderr reader (writer) and
/// status queries (readers), and the unit's log rate limit, which spans
/// its generations (a crash loop does not reset it).
#[derive(Debug, Clone, Default)]
pub struct LogRing {
    lines: Arc<Mutex<VecDeque<String>>>,
    limiter: Arc<Mutex<Limiter>>,
}

/// The rate limit's state: a window of `interval` opened by its first
/// line, the first `lines` of it logged, the rest counted.
#[derive(Debug, Clone, Default)]
pub struct Limiter {
    limit: Option<RateLimit>,
    window: Option<Instant>,
    logged: u32,
    /// The bytes the window logged.
    bytes: u64,
    suppressed: u64,
    /// The window dropped a line already (said once per window).
    reached: bool,
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admit {
    /// Log this line.
    pub log: bool,
    /// First say that this many lines of the window before were dropped.
    pub suppressed: Option<u64>,
    /// The first line this window drops: lines are dropped until then.
    pub reached: Option<Instant>,
}

impl Limiter {
    /// A limiter applying `limit` (None: log everything).
    pub fn new(limit: Option<RateLimit>) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    /// A changed `log-rate-limit`, applied from the next line on.
    pub fn set(&mut self, limit: Option<RateLimit>) {
        if self.limit != limit {
            self.limit = limit;
            self.window = None;
            self.logged = 0;
            self.bytes = 0;
        }
    }

    /// One line, written at `now`.
    pub fn admit(&mut self, now: Instant) -> Admit {
        self.admit_sized(0, now)
    }

    /// One line of `len` bytes, written at `now`: logged while the window
    /// has lines left and `lines` × [`BYTES_PER_LINE`] bytes.
    pub fn admit_sized(&mut self, len: usize, now: Instant) -> Admit {
        let Some(limit) = self.limit else {
            return Admit {
                log: true,
                suppressed: self.take_suppressed(),
                reached: None,
            };
        };
        let mut suppressed = None;
        if self
            .window
            .is_none_or(|start| now.saturating_duration_since(start) >= limit.interval)
        {
            suppressed = self.take_suppressed();
            self.window = Some(now);
            self.logged = 0;
            self.bytes = 0;
            self.reached = false;
        }
        // Every line costs a byte at least (a window spent in bytes logs
        // no empty line either).
        let len = u64::try_from(len.max(1)).unwrap_or(u64::MAX);
        let room = u64::from(limit.lines).saturating_mul(BYTES_PER_LINE);
        if self.logged < limit.lines && self.bytes.saturating_add(len) <= room {
            self.logged += 1;
            self.bytes = self.bytes.saturating_add(len);
            Admit {
                log: true,
                suppressed,
                reached: None,
            }
        } else {
            self.suppressed += 1;
            Admit {
                log: false,
                suppressed,
                reached: self.reach(limit),
            }
        }
    }

    /// The end of the window, the first time it drops a line.
    fn reach(&mut self, limit: RateLimit) -> Option<Instant> {
        if std::mem::replace(&mut self.reached, true) {
            return None;
        }
        self.window.map(|start| start + limit.interval)
    }

    /// `n` lines, written at `now`, at the cost of one: whether any of them
    /// is logged (the caller logs one line for them all), and the report
    /// of a window before that dropped lines.
    pub fn admit_n(&mut self, n: u64, now: Instant) -> Admit {
        if n == 0 {
            return Admit {
                log: false,
                suppressed: None,
                reached: None,
            };
        }
        let mut first = self.admit(now);
        let Some(limit) = self.limit else {
            return first;
        };
        // The rest of the `n` in the same window.
        let room = u64::from(limit.lines.saturating_sub(self.logged));
        let rest = n - 1;
        let logged = rest.min(room);
        self.logged += u32::try_from(logged).unwrap_or(u32::MAX);
        self.suppressed += rest - logged;
        if rest > logged {
            first.reached = first.reached.or_else(|| self.reach(limit));
        }
        first
    }

    /// Whether lines written at `now` are dropped: the window's lines are
    /// used up.
    pub fn over(&self, now: Instant) -> bool {
        match (self.limit, self.window) {
            (Some(limit), Some(start)) => {
                (self.logged >= limit.lines
                    || self.bytes >= u64::from(limit.lines).saturating_mul(BYTES_PER_LINE))
                    && now.saturating_duration_since(start) < limit.interval
            }
            _ => false,
        }
    }

    /// Lines dropped and not yet reported (at the end of the stream).
    pub fn take_suppressed(&mut self) -> Option<u64> {
        (self.suppressed > 0).then(|| std::mem::take(&mut self.suppressed))
    }

    /// The limit, for the report line.
    pub fn limit(&self) -> Option<RateLimit> {
        self.limit
    }
}

/// "log-rate-limit reached: dropping stderr until 14:03:27" (local time),
/// for a window that ends at `until`; `what` names what is dropped
/// (stderr, the server's log messages, its garbage lines).
pub fn reached_line(what: &str, until: Instant) -> String {
    let at = std::time::SystemTime::now() + until.saturating_duration_since(Instant::now());
    let at = jiff::Timestamp::try_from(at).map_or_else(
        |_| "the window ends".to_owned(),
        |t| {
            t.to_zoned_datetime(jiff::tz::TimeZone::system())
                .strftime("%H:%M:%S")
                .to_string()
        },
    );
    format!("log-rate-limit reached: dropping {what} until {at}")
}

/// "suppressed 12 lines (log-rate-limit 10000 per 30s)".
pub fn suppressed_line(n: u64, limit: Option<RateLimit>) -> String {
    let lines = if n == 1 { "line" } else { "lines" };
    match limit {
        Some(l) => format!(
            "suppressed {n} {lines} (log-rate-limit {} per {})",
            l.lines,
            humantime::format_duration(l.interval)
        ),
        None => format!("suppressed {n} {lines}"),
    }
}

/// While a server is over its log rate limit, its stderr is read at most
/// this often, and its pipe holds only [`FLOOD_PIPE`] bytes: the server's
/// writes wait for the reader, as for any reader that is behind, so a
/// flood of small writes costs the daemon a few reads (and a few wake-ups:
/// every write to a pipe wakes its poller) instead of one per line, and
/// what is read is still the newest.
pub const FLOOD_PACE: std::time::Duration = std::time::Duration::from_millis(25);

/// The pipe size while flooding (a page); the usual is restored after.
pub const FLOOD_PIPE: usize = 4096;

/// The usual pipe size on Linux.
const PIPE: usize = 64 * 1024;

/// The longest line read from stderr; a longer one is cut into pieces.
pub const MAX_READ_LINE: usize = 64 * 1024;

/// Reads a server's stderr until it closes: every line into `ring`, and
/// as many as the rate limit admits into the log: `log(line, false)`, and
/// `log(report, true)` for the `suppressed N lines` reports. Reads in
/// large chunks while the server writes, holding no buffer while it is
/// quiet; over the limit, at most every [`FLOOD_PACE`], so a flood costs
/// the daemon a read per 64 KiB and a scan, not a log record (or a
/// wake-up) per line.
pub async fn pump(
    stderr: tokio::net::unix::pipe::Receiver,
    ring: LogRing,
    log: impl Fn(&str, bool),
) {
    const CHUNK: usize = 64 * 1024;
    // Most wake-ups bring a line or two. Not zeroed: a zeroed 64 KiB
    // buffer for every line a server writes cost the daemon more than the
    // session path of a call; and small, as glibc sweeps its free lists
    // for a request of 1 KiB or more.
    const FIRST_READ: usize = 512;
    let mut partial: Vec<u8> = Vec::new();
    let mut ends: Vec<usize> = Vec::new();
    let mut flooding = false;
    // Kept between reads while small (a line a call costs no allocation);
    // what a burst grew is let go when it ends.
    let mut buf = BytesMut::with_capacity(FIRST_READ);
    'read: loop {
        if stderr.readable().await.is_err() {
            break;
        }
        if buf.capacity() != FIRST_READ {
            buf = BytesMut::with_capacity(FIRST_READ);
        }
        loop {
            buf.clear();
            let room = buf.capacity();
            // A read shorter than its room drained the pipe, and cleared
            // its readiness: no second read to learn that.
            let n = match stderr.drain(&mut buf) {
                Ok(0) => break 'read,
                Ok(n) => n,
                // Readiness was stale (and is now cleared).
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break 'read,
            };
            // One reading of the clock for the chunk's lines and the check.
            let now = Instant::now();
            if !lines(&buf[..n], &mut partial, &mut ends, &ring, &log, now) {
                break 'read;
            }
            if n < room {
                let over = ring.over(now);
                if over != flooding {
                    flooding = over;
                    let size = if over { FLOOD_PIPE } else { PIPE };
                    let _ = rustix::pipe::fcntl_setpipe_size(&stderr, size);
                }
                if over {
                    buf = BytesMut::new();
                    tokio::time::sleep(FLOOD_PACE).await;
                }
                break;
            }
            buf.clear();
            buf.reserve(CHUNK);
        }
    }
    if !partial.is_empty()
        && let Ok(mut limiter) = ring.limiter.lock()
    {
        ring.line(&mut limiter, &partial, Instant::now(), true, &log);
    }
    let (suppressed, limit) = match ring.limiter.lock() {
        Ok(mut l) => (l.take_suppressed(), l.limit()),
        Err(_) => (None, None),
    };
    if let Some(n) = suppressed {
        log(&suppressed_line(n, limit), true);
    }
}

/// The lines of one chunk read (and of the `partial` line before it) into
/// the ring and the log; `false` once the ring is unusable (poisoned).
fn lines(
    chunk: &[u8],
    partial: &mut Vec<u8>,
    ends: &mut Vec<usize>,
    ring: &LogRing,
    log: &impl Fn(&str, bool),
    now: Instant,
) -> bool {
    if chunk.is_empty() {
        return true;
    }
    ends.clear();
    ends.extend(memchr::memchr_iter(b'\n', chunk));
    // Only the newest lines of a chunk can stay in the ring.
    let keep_from = ends.len().saturating_sub(CAPACITY);
    // One lock for the chunk, not one per line.
    let Ok(mut limiter) = ring.limiter.lock() else {
        return false;
    };
    let mut start = 0;
    for (i, &end) in ends.iter().enumerate() {
        let piece = &chunk[start..end];
        start = end + 1;
        let line: &[u8] = if partial.is_empty() {
            piece
        } else {
            partial.extend_from_slice(piece);
            partial
        };
        ring.line(&mut limiter, line, now, i >= keep_from, log);
        partial.clear();
    }
    partial.extend_from_slice(&chunk[start..]);
    if partial.len() >= MAX_READ_LINE {
        ring.line(&mut limiter, partial, now, true, log);
        partial.clear();
    }
    true
}

impl LogRing {
    /// Whether lines written now are dropped.
    fn over(&self, now: Instant) -> bool {
        self.limiter.lock().is_ok_and(|l| l.over(now))
    }

    /// Applies a unit's `log-rate-limit`.
    pub fn set_limit(&self, limit: Option<RateLimit>) {
        if let Ok(mut l) = self.limiter.lock() {
            l.set(limit);
        }
    }

    /// One line of stderr (without its newline), at `now`: logged if the
    /// limit admits it (after the report of a window that dropped lines),
    /// kept in the ring if `keep`.
    fn line(
        &self,
        limiter: &mut Limiter,
        raw: &[u8],
        now: Instant,
        keep: bool,
        log: &impl Fn(&str, bool),
    ) {
        let admit = limiter.admit_sized(raw.len().min(MAX_LINE), now);
        if let Some(n) = admit.suppressed {
            log(&suppressed_line(n, limiter.limit()), true);
        }
        if let Some(until) = admit.reached {
            log(&reached_line("stderr", until), true);
        }
        if !admit.log && !keep {
            return;
        }
        // Most lines are UTF-8: checked at once, not char by char.
        let text = match std::str::from_utf8(raw) {
            Ok(text) => std::borrow::Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(raw),
        };
        let text = text.trim_end_matches('\r');
        if admit.log {
            log(text, false);
        }
        if keep {
            self.push(text);
        }
    }

    /// Appends a line, dropping the oldest beyond [`CAPACITY`].
    pub fn push(&self, line: &str) {
        let line = line.trim_end_matches(['\n', '\r']);
        let mut cut = line.len().min(MAX_LINE);
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        if let Ok(mut lines) = self.lines.lock() {
            // A full ring's oldest line is written over (no allocation
            // when it was as long).
            let mut kept = if lines.len() == CAPACITY {
                lines.pop_front().unwrap_or_default()
            } else {
                String::new()
            };
            if kept.capacity() > 2 * cut.max(64) {
                // Not a long line's room for a short one.
                kept = String::new();
            }
            kept.clear();
            kept.push_str(&line[..cut]);
            if cut < line.len() {
                kept.push('…');
            }
            lines.push_back(kept);
        }
    }

    /// The last `n` lines, oldest first.
    pub fn tail(&self, n: usize) -> Vec<String> {
        match self.lines.lock() {
            Ok(lines) => lines
                .iter()
                .skip(lines.len().saturating_sub(n))
                .cloned()
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const LIMIT: RateLimit = RateLimit {
        lines: 3,
        interval: Duration::from_secs(30),
    };

    #[test]
    fn the_first_line_a_window_drops_says_until_when() {
        let t0 = Instant::now();
        let mut l = Limiter::new(Some(LIMIT));
        for _ in 0..3 {
            assert_eq!(l.admit(t0).reached, None);
        }
        let end = t0 + LIMIT.interval;
        assert_eq!(l.admit(t0 + Duration::from_secs(1)).reached, Some(end));
        assert_eq!(l.admit(t0 + Duration::from_secs(2)).reached, None);
        // A new window: said again when it drops, and at once for a batch.
        let t1 = t0 + Duration::from_secs(30);
        assert_eq!(l.admit_n(10, t1).reached, Some(t1 + LIMIT.interval));
        assert_eq!(l.admit_n(10, t1).reached, None);
        let line = reached_line("stderr", Instant::now() + Duration::from_secs(5));
        let at = line
            .strip_prefix("log-rate-limit reached: dropping stderr until ")
            .expect(&line);
        assert!(
            at.len() == 8 && at.chars().filter(|c| *c == ':').count() == 2,
            "{line}"
        );
    }

    #[test]
    fn the_limit_logs_a_burst_then_counts_and_reports_once_per_window() {
        let t0 = Instant::now();
        let mut l = Limiter::new(Some(LIMIT));
        let logged = |a: Admit| (a.log, a.suppressed);
        for _ in 0..3 {
            assert_eq!(logged(l.admit(t0)), (true, None));
        }
        for i in 0..5 {
            assert_eq!(logged(l.admit(t0 + Duration::from_secs(i))), (false, None));
        }
        // the window opened by the first line ends 30 s later: the next
        // line reports what was dropped, and is logged
        assert_eq!(
            logged(l.admit(t0 + Duration::from_secs(30))),
            (true, Some(5))
        );
        assert_eq!(l.take_suppressed(), None);
        assert_eq!(
            suppressed_line(5, Some(LIMIT)),
            "suppressed 5 lines (log-rate-limit 3 per 30s)"
        );
    }

    #[test]
    fn no_limit_logs_everything_and_a_changed_limit_starts_a_new_window() {
        let t0 = Instant::now();
        // many at once cost one call, and count as many
        let mut l = Limiter::new(Some(LIMIT));
        assert!(l.admit_n(1_000_000, t0).log);
        assert!(!l.admit_n(3, t0 + Duration::from_secs(1)).log);
        let later = l.admit(t0 + Duration::from_secs(30));
        assert_eq!(later.suppressed, Some(1_000_003 - u64::from(LIMIT.lines)));
        let mut l = Limiter::new(None);
        for _ in 0..100_000 {
            assert!(l.admit(t0).log);
        }
        l.set(Some(LIMIT));
        for _ in 0..3 {
            assert!(l.admit(t0).log);
        }
        assert!(!l.admit(t0).log);
        l.set(None);
        assert_eq!(
            (l.admit(t0).log, l.admit(t0).suppressed),
            (true, None),
            "the dropped line was reported with the first line after"
        );
    }

    #[tokio::test]
    async fn a_flood_is_read_in_chunks_logged_up_to_the_limit_and_kept_newest_first() {
        let (mut tx, rx) = tokio::net::unix::pipe::pipe().expect("pipe");
        let ring = LogRing::default();
        ring.set_limit(Some(RateLimit {
            lines: 10,
            interval: Duration::from_secs(3600),
        }));
        let logged = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logged);
        let pump = tokio::spawn(pump(rx, ring.clone(), move |line, report| {
            sink.lock().expect("lock").push((line.to_owned(), report));
        }));
        use tokio::io::AsyncWriteExt;
        let mut text = String::new();
        for i in 0..10_000 {
            text.push_str(&format!("line {i}\n"));
        }
        // a last line without its newline, split across writes
        text.push_str("the e");
        tx.write_all(text.as_bytes()).await.expect("write");
        tx.write_all(b"nd").await.expect("write");
        drop(tx);
        pump.await.expect("pump");
        let logged = logged.lock().expect("lock").clone();
        assert_eq!(logged.len(), 12, "{logged:?}");
        assert_eq!(logged[0], ("line 0".to_owned(), false));
        assert_eq!(logged[9], ("line 9".to_owned(), false));
        assert!(
            logged[10].1
                && logged[10]
                    .0
                    .starts_with("log-rate-limit reached: dropping stderr until "),
            "said when it began to drop: {logged:?}"
        );
        assert_eq!(
            logged[11],
            (
                "suppressed 9991 lines (log-rate-limit 10 per 1h)".to_owned(),
                true
            ),
            "reported when the stream ends"
        );
        let tail = ring.tail(3);
        assert_eq!(tail, ["line 9998", "line 9999", "the end"]);
        assert_eq!(ring.tail(usize::MAX).len(), CAPACITY);
    }

    /// A window logs its lines × [`BYTES_PER_LINE`] bytes at most: long
    /// lines reach the limit sooner, and are clipped with their size.
    #[test]
    fn the_limit_counts_bytes_as_well_as_lines() {
        let limit = RateLimit {
            lines: 100,
            interval: Duration::from_secs(30),
        };
        let mut l = Limiter::new(Some(limit));
        let t0 = Instant::now();
        let logged = (0..100).filter(|_| l.admit_sized(MAX_LINE, t0).log).count();
        assert_eq!(logged, 12, "12 lines of 4 KiB within 100 × 512 bytes");
        assert!(!l.over(t0), "2 KiB left");
        assert!(l.admit_sized(2048, t0).log);
        assert!(l.over(t0));
        assert!(!l.admit_sized(0, t0).log, "the window is spent");
        assert!(
            l.admit_sized(MAX_LINE, t0 + limit.interval).log,
            "a new window"
        );
        let text = "é".repeat(3000);
        let clipped = clip(&text, 4095);
        assert!(clipped.ends_with("… [6000 bytes]"), "{clipped}");
        assert_eq!(clipped.len(), 4094 + "… [6000 bytes]".len());
        assert_eq!(clip("short", 4096), "short");
    }

    #[test]
    fn keeps_the_newest_lines() {
        let ring = LogRing::default();
        for i in 0..(CAPACITY + 5) {
            ring.push(&format!("line {i}\n"));
        }
        let all = ring.tail(usize::MAX);
        assert_eq!(all.len(), CAPACITY);
        assert_eq!(all[0], "line 5");
        assert_eq!(
            ring.tail(2),
            [
                format!("line {}", CAPACITY + 3),
                format!("line {}", CAPACITY + 4)
            ]
        );
    }

    #[test]
    fn cuts_long_lines_on_a_char_boundary() {
        let ring = LogRing::default();
        ring.push(&"é".repeat(MAX_LINE));
        let line = &ring.tail(1)[0];
        assert!(line.len() <= MAX_LINE + '…'.len_utf8());
        assert!(line.ends_with('…'));
    }
}
