//! Log lines written together: inside [`together`], what the text log
//! (`daemon::logging`, stderr) is given on this thread is collected and
//! written in one `write` at the end, so that a batch of lines wakes
//! whoever reads stderr once, not once a line. The tool-call log
//! (`supervisor::accounting`) writes its batches this way. A leaf: it
//! imports nothing of the crate.

use std::cell::RefCell;
use std::io::Write;

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
