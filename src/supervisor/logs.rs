//! The last lines a server wrote to stderr, kept in memory for `status`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Lines kept per server.
pub const CAPACITY: usize = 200;
/// Longer lines are cut to this many bytes.
pub const MAX_LINE: usize = 4096;

/// A bounded ring of log lines, shared by the stderr reader (writer) and
/// status queries (readers).
#[derive(Debug, Clone, Default)]
pub struct LogRing {
    lines: Arc<Mutex<VecDeque<String>>>,
}

impl LogRing {
    /// Appends a line, dropping the oldest beyond [`CAPACITY`].
    pub fn push(&self, line: &str) {
        let mut line = line.trim_end_matches(['\n', '\r']).to_owned();
        if line.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        if let Ok(mut lines) = self.lines.lock() {
            if lines.len() == CAPACITY {
                lines.pop_front();
            }
            lines.push_back(line);
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
