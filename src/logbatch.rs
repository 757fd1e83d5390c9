//! Log lines written together: inside [`together`], what the text log
//! (`daemon::logging`, stderr) is given on this thread is collected and
//! written in one `write` at the end, so that a batch of lines wakes
//! whoever reads stderr once, not once a line. The tool-call log
//! (`supervisor::accounting`) writes its batches this way, formatting
//! its lines itself when the text log takes them ([`text`], [`prefix`],
//! [`escape`]: the text log's own format, shared). A leaf: it imports
//! nothing of the crate.

use std::cell::RefCell;
use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};

thread_local! {
    static BATCH: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Runs `f`, then writes to stderr in one go what the text log was given
/// meanwhile (nothing when logs go to the journal). A failed write is
/// dropped, as the text log drops its own. Nested, the outer batch writes
/// it; if `f` panics, what it logged is written as the stack unwinds.
pub fn together(f: impl FnOnce()) {
    let outer = BATCH
        .try_with(|b| b.borrow_mut().replace(Vec::new()))
        .ok()
        .flatten();
    let _batch = Batch { outer };
    f();
}

/// An open batch: closing it (dropped) puts back the outer one and
/// writes what it collected.
struct Batch {
    outer: Option<Vec<u8>>,
}

impl Drop for Batch {
    fn drop(&mut self) {
        let outer = self.outer.take();
        let bytes = BATCH
            .try_with(|b| {
                b.try_borrow_mut()
                    .map(|mut b| std::mem::replace(&mut *b, outer))
            })
            .ok()
            .and_then(Result::ok)
            .flatten();
        if let Some(bytes) = bytes.filter(|b| !b.is_empty())
            && !collect(&bytes)
        {
            let _ = std::io::stderr().lock().write_all(&bytes);
        }
    }
}

/// Writes `bytes` to the batch open on this thread, else to stderr in
/// one `write` (a failed write is dropped, as the text log drops its own).
pub fn write(bytes: &[u8]) {
    if !bytes.is_empty() && !collect(bytes) {
        let _ = std::io::stderr().lock().write_all(bytes);
    }
}

/// Keeps `bytes` for the batch open on this thread, if any.
pub fn collect(bytes: &[u8]) -> bool {
    BATCH
        .try_with(|b| match b.try_borrow_mut() {
            Ok(mut batch) => match batch.as_mut() {
                Some(batch) => {
                    batch.extend_from_slice(bytes);
                    true
                }
                None => false,
            },
            Err(_) => false,
        })
        .unwrap_or(false)
}

/// Where the log goes: 0 not to the text log (the journal, or not set
/// up), 1 the text log, 2 the text log with colours.
static TEXT: AtomicU8 = AtomicU8::new(0);

/// Says that the log is the text log, on stderr ([`Stderr`]), with
/// colours when `ansi`.
pub fn set_text(ansi: bool) {
    TEXT.store(if ansi { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether the log is the text log (`Some`), and with colours.
pub fn text() -> Option<bool> {
    match TEXT.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n == 2),
    }
}

/// The start of a text log line: `TIME LEVEL target: `, the level one of
/// "TRACE", "DEBUG", " INFO", " WARN", "ERROR" (its colour first when
/// `ansi`).
pub fn prefix(
    out: &mut impl fmt::Write,
    ansi: bool,
    now: std::time::SystemTime,
    level: (&str, &str),
    target: &str,
) -> fmt::Result {
    const DIM: &str = "\x1b[2m";
    const RESET: &str = "\x1b[0m";
    let now = humantime::format_rfc3339_micros(now);
    let (colour, name) = level;
    if ansi {
        write!(
            out,
            "{DIM}{now}{RESET} {colour}{name}{RESET} {DIM}{target}:{RESET} "
        )
    } else {
        write!(out, "{now} {name} {target}: ")
    }
}

/// The name of a field and its `=` in a text log line (after a space),
/// in italics when `ansi`.
pub fn field_name(out: &mut impl fmt::Write, ansi: bool, name: &str) -> fmt::Result {
    if ansi {
        out.write_str("\x1b[3m")?;
        out.write_str(name)?;
        out.write_str("\x1b[0m\x1b[2m=\x1b[0m")
    } else {
        out.write_str(name)?;
        out.write_char('=')
    }
}

/// Writes `s` with the control characters a terminal would obey (ESC,
/// BEL, BS, FF, DEL, C1) shown escaped, as tracing-subscriber's own
/// sanitizing does.
pub fn escape(out: &mut impl fmt::Write, s: &str) -> fmt::Result {
    // C1 controls (U+0080..U+009F) are 0xC2 0x80..0x9F in UTF-8.
    let risky = |b: &u8| matches!(b, 0x07 | 0x08 | 0x0c | 0x1b | 0x7f | 0xc2);
    if !s.as_bytes().iter().any(risky) {
        return out.write_str(s);
    }
    for ch in s.chars() {
        match ch {
            '\x07' | '\x08' | '\x0c' | '\x1b' | '\x7f' => {
                write!(out, "\\x{:02x}", ch as u32)?;
            }
            '\u{80}'..='\u{9f}' => write!(out, "\\u{{{:x}}}", ch as u32)?,
            _ => out.write_char(ch)?,
        }
    }
    Ok(())
}

/// The text log's writer: stderr, or the batch open on this thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if collect(bytes) {
            return Ok(bytes.len());
        }
        std::io::stderr().write(bytes)
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if collect(bytes) {
            return Ok(());
        }
        std::io::stderr().write_all(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A test's log writer: what it is given, kept in memory.
#[cfg(test)]
#[derive(Debug, Clone, Default)]
pub(crate) struct Sink(pub(crate) std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl Write for Sink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("sink").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_collects_what_is_written_on_its_thread_and_nests() {
        assert!(!collect(b"no batch"));
        let mut seen = Vec::new();
        together(|| {
            assert!(collect(b"one "));
            together(|| assert!(collect(b"two ")));
            BATCH.with(|b| seen = b.borrow().clone().expect("open"));
            // Another thread has no batch open.
            std::thread::spawn(|| assert!(!collect(b"elsewhere")))
                .join()
                .expect("thread");
        });
        assert_eq!(seen, b"one two ");
        assert!(!collect(b"closed again"));
        // A panic inside closes the batch all the same.
        let panicked = std::panic::catch_unwind(|| {
            together(|| {
                assert!(collect(b""));
                panic!("in a batch");
            })
        });
        assert!(panicked.is_err());
        assert!(!collect(b"no batch left open"));
    }
}
