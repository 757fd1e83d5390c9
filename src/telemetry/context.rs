//! W3C trace context (`traceparent`, `tracestate`) and the sampling rule:
//! pure, table-tested in place.

/// A span's identity in its trace, as `traceparent` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The sampled flag (`01`).
    pub sampled: bool,
}

/// The longest `tracestate` carried on (W3C: 32 members of at most 256
/// bytes, 512 bytes propagated at least): a longer one is dropped.
pub const MAX_TRACESTATE: usize = 512;

impl SpanContext {
    /// Reads a `traceparent` header value (version `00`, or a later one
    /// read as `00` as the W3C spec says); `None` for a malformed one or
    /// all-zero ids.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let mut parts = text.split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        if version.len() != 2 || version == "ff" || !is_lower_hex(version) {
            return None;
        }
        // Version 00 has exactly four fields; a later one may have more.
        if version == "00" && parts.next().is_some() {
            return None;
        }
        if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?;
        let span_id: [u8; 8] = hex(span)?;
        let [flags]: [u8; 1] = hex(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` value of this span.
    pub fn traceparent(&self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &self.span_id);
        s.push_str(if self.sampled { "-01" } else { "-00" });
        s
    }
}

/// Whether a trace mcpd starts (no parent) with `trace_id` is recorded at
/// `ratio`: the W3C/OpenTelemetry rule of the trace id's last 8 bytes
/// against the ratio, so every process that samples a trace by the same
/// ratio agrees.
pub fn sampled(ratio: f64, trace_id: &[u8; 16]) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let bound = (ratio * (1u64 << 63) as f64) as u64;
    (u64::from_be_bytes(low) >> 1) < bound
}

/// Whether a new span with this parent is recorded: a parent's sampled
/// flag decides; without one, the ratio.
pub fn decide(parent: Option<&SpanContext>, ratio: f64, trace_id: &[u8; 16]) -> bool {
    match parent {
        Some(p) => p.sampled,
        None => sampled(ratio, trace_id),
    }
}

/// A `tracestate` carried on as it came, if it is one (printable ASCII,
/// within [`MAX_TRACESTATE`]).
pub fn tracestate(text: &str) -> Option<&str> {
    (text.len() <= MAX_TRACESTATE && text.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .then_some(text)
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !is_lower_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// `bytes` as lowercase hex.
pub fn push_hex(s: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_read_and_written_as_w3c_says() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let ctx = SpanContext::parse(text).expect("valid");
        assert!(ctx.sampled);
        assert_eq!(
            ctx.span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(ctx.traceparent(), text);
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!SpanContext::parse(unsampled).expect("valid").sampled);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(SpanContext::parse(bad), None, "{bad}");
        }
        // A later version with more fields is read as 00.
        assert!(
            SpanContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_some()
        );
    }

    #[test]
    fn a_parent_decides_and_the_ratio_decides_for_roots() {
        let low = [0u8; 16];
        let high = [0xff; 16];
        assert!(sampled(1.0, &high));
        assert!(!sampled(0.0, &low));
        assert!(sampled(0.5, &low));
        assert!(!sampled(0.5, &high));
        let parent = SpanContext {
            trace_id: high,
            span_id: [1; 8],
            sampled: true,
        };
        assert!(decide(Some(&parent), 0.0, &high));
        let parent = SpanContext {
            sampled: false,
            ..parent
        };
        assert!(!decide(Some(&parent), 1.0, &high));
        assert_eq!(tracestate("a=1,b=2"), Some("a=1,b=2"));
        assert_eq!(tracestate("a=\n"), None);
        assert_eq!(tracestate(&"a".repeat(600)), None);
    }
}
