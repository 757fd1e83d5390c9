//! Logging: to the journal when stderr is the journal (`JOURNAL_STREAM`
//! names stderr's device and inode), else human-readable to stderr. Fields
//! keep their names: a child's lines carry `mcpd_server`, which the journal
//! stores as `MCPD_SERVER` (`journalctl MCPD_SERVER=github`).

use std::fmt::{self, Write as _};
use std::io::IsTerminal;
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Whether `journal_stream` ("DEV:INO", from `JOURNAL_STREAM`) is stderr.
pub fn stderr_is_journal(journal_stream: Option<&str>) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match rustix::fs::fstat(std::io::stderr()) {
        Ok(stat) => stat.st_dev == dev && stat.st_ino == ino,
        Err(_) => false,
    }
}

/// Installs the global subscriber with `filter` (a level or directives).
/// Returns where logs go, for the first log line.
pub fn init(filter: &str) -> Result<&'static str, String> {
    // rmcp narrates every session at info; its warnings and errors still count.
    let filter = if filter.contains("rmcp") {
        filter.to_owned()
    } else {
        format!("{filter},rmcp=warn")
    };
    let filter =
        EnvFilter::try_new(&filter).map_err(|e| format!("invalid log filter {filter:?}: {e}"))?;
    let journal = std::env::var("JOURNAL_STREAM").ok();
    if stderr_is_journal(journal.as_deref())
        && let Ok(layer) = tracing_journald::layer()
    {
        tracing_subscriber::registry()
            .with(filter)
            .with(
                layer
                    .with_field_prefix(None)
                    .with_syslog_identifier("mcpd".into()),
            )
            .init();
        return Ok("journal");
    }
    let ansi = std::io::stderr().is_terminal();
    crate::logbatch::set_text(ansi);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| crate::logbatch::Stderr)
        .with_ansi(ansi)
        // A write that fails (whoever read stderr went away) is dropped:
        // reporting it would print to the same stderr, which panics the
        // task that logged, be it a server's actor or the signal handler.
        .log_internal_errors(false)
        .event_format(Text)
        .init();
    Ok("stderr")
}

/// The text log line: what tracing-subscriber's default format writes
/// for an event outside spans (mcpd opens none), `TIME LEVEL target:
/// message field=value…`, in the same colours on a terminal, at a fraction
/// of its cost (every tool call and every line a server writes is one:
/// the default format spent some 14,000 instructions a line, mostly
/// painting with styles even when colours are off and escaping through
/// `fmt::Formatter` a character at a time).
///
/// As there, control characters a terminal would obey (ESC, BEL, BS, FF,
/// DEL, C1) are shown escaped; here in field values too, not only in the
/// message, since a server's words reach both.
#[derive(Debug, Clone, Copy)]
struct Text;

impl<S, N> FormatEvent<S, N> for Text
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let ansi = writer.has_ansi_escapes();
        let meta = event.metadata();
        let (colour, name) = match *meta.level() {
            Level::TRACE => ("\x1b[35m", "TRACE"),
            Level::DEBUG => ("\x1b[34m", "DEBUG"),
            Level::INFO => ("\x1b[32m", " INFO"),
            Level::WARN => ("\x1b[33m", " WARN"),
            Level::ERROR => ("\x1b[31m", "ERROR"),
        };
        crate::logbatch::prefix(
            &mut writer,
            ansi,
            SystemTime::now(),
            (colour, name),
            meta.target(),
        )?;
        let sanitize = writer.sanitizes_ansi_escapes();
        let mut fields = Fields {
            out: Sanitized {
                out: writer.by_ref(),
                on: sanitize,
            },
            ansi,
            message: true,
            first: true,
            result: Ok(()),
        };
        // The message first, then the fields in their order.
        event.record(&mut fields);
        fields.message = false;
        event.record(&mut fields);
        fields.result?;
        writer.write_char('\n')
    }
}

/// Writes an event's message (`message`) or its other fields.
struct Fields<'a> {
    out: Sanitized<'a>,
    ansi: bool,
    message: bool,
    /// Nothing written yet (no separating space).
    first: bool,
    result: fmt::Result,
}

impl Fields<'_> {
    fn field(&mut self, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
        let is_message = field.name() == "message";
        if is_message != self.message {
            return Ok(());
        }
        if !std::mem::take(&mut self.first) {
            self.out.out.write_char(' ')?;
        }
        if is_message {
            return write!(self.out, "{value:?}");
        }
        let name = field.name().strip_prefix("r#").unwrap_or(field.name());
        crate::logbatch::field_name(&mut self.out.out, self.ansi, name)?;
        write!(self.out, "{value:?}")
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_ok() {
            self.result = self.field(field, value);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let chain = crate::mux::wire::error_chain(value);
        self.record_debug(field, &format_args!("{chain}"));
    }
}

/// Passes text through, control characters a terminal would obey shown
/// escaped (as tracing-subscriber's own sanitizing does).
struct Sanitized<'a> {
    out: Writer<'a>,
    on: bool,
}

impl fmt::Write for Sanitized<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if !self.on {
            return self.out.write_str(s);
        }
        crate::logbatch::escape(&mut self.out, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(!stderr_is_journal(None));
        assert!(!stderr_is_journal(Some("garbage")));
        assert!(!stderr_is_journal(Some("1:2")));
        let stat = rustix::fs::fstat(std::io::stderr()).expect("fstat stderr");
        let own = format!("{}:{}", stat.st_dev, stat.st_ino);
        assert!(stderr_is_journal(Some(&own)));
    }

    /// What `log` writes through a subscriber formatting with `text`
    /// (mcpd's [`Text`], else tracing-subscriber's default), timestamps
    /// cut off.
    fn logged(text: bool, ansi: bool, log: impl Fn()) -> Vec<String> {
        use std::sync::{Arc, Mutex};
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&out);
        let writer = move || crate::logbatch::Sink(Arc::clone(&sink));
        let builder = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_writer(writer)
            .with_ansi(ansi);
        if text {
            tracing::subscriber::with_default(builder.event_format(Text).finish(), log);
        } else {
            tracing::subscriber::with_default(builder.finish(), log);
        }
        let text = String::from_utf8(out.lock().expect("sink").clone()).expect("UTF-8");
        text.lines()
            .map(|line| {
                let (time, rest) = line.split_once(' ').expect("a timestamp");
                let time = strip_ansi(time);
                assert!(
                    humantime::parse_rfc3339(&time).is_ok() && time.len() == 27,
                    "{time:?} is an RFC 3339 time to the microsecond"
                );
                rest.to_owned()
            })
            .collect()
    }

    #[test]
    fn call_lines_made_for_the_batch_are_the_text_logs_own() {
        use crate::supervisor::accounting::Outcome;
        for ansi in [false, true] {
            let tools = [
                ("echo", Outcome::Ok),
                ("evil\x1b[2J\u{9b}tool", Outcome::Abandoned),
                ("echo", Outcome::Failed("bad\x07\x1b[31m".into())),
            ];
            for (tool, outcome) in tools {
                let (line, log) = crate::supervisor::accounting::sample(tool, outcome, ansi);
                let (time, made) = line.split_once(' ').expect("a timestamp");
                assert!(
                    humantime::parse_rfc3339(&strip_ansi(time)).is_ok(),
                    "{line:?}"
                );
                assert_eq!(vec![made.trim_end().to_owned()], logged(true, ansi, log));
            }
        }
    }

    fn strip_ansi(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("\x1b[") {
            out.push_str(&rest[..start]);
            let end = rest[start..].find('m').expect("an SGR sequence ends in m");
            rest = &rest[start + end + 1..];
        }
        out.push_str(rest);
        out
    }

    fn events() {
        let (server, uid, logger) = ("demo", 1000_u32, "fs");
        tracing::info!(
            target: "mcpd::calls",
            mcpd_server = %server,
            mcpd_caller_uid = uid,
            mcpd_duration_usec = 42_u64,
            "tools/call echo by uid {uid}: ok in {:.1} ms",
            0.25
        );
        tracing::warn!(target: "mcpd::server", mcpd_server = %server, mcpd_logger = logger, "a line");
        tracing::error!(ok = true, delta = -3_i64, "failed: {}", "why");
        tracing::debug!("plain");
        tracing::trace!(r#type = "x", only = 1_u8);
    }

    #[test]
    fn text_lines_read_as_tracing_subscribers_default_format() {
        let ours = logged(true, false, events);
        assert_eq!(ours, logged(false, false, events));
        assert_eq!(
            ours,
            [
                " INFO mcpd::calls: tools/call echo by uid 1000: ok in 0.2 ms mcpd_server=demo \
                 mcpd_caller_uid=1000 mcpd_duration_usec=42",
                " WARN mcpd::server: a line mcpd_server=demo mcpd_logger=\"fs\"",
                "ERROR mcpd::daemon::logging::tests: failed: why ok=true delta=-3",
                "DEBUG mcpd::daemon::logging::tests: plain",
                "TRACE mcpd::daemon::logging::tests: type=\"x\" only=1",
            ]
        );
        // On a terminal: the same text, in colour.
        let coloured = logged(true, true, events);
        assert!(coloured[0].starts_with("\x1b[32m INFO\x1b[0m \x1b[2mmcpd::calls:\x1b[0m "));
        assert_eq!(
            coloured.iter().map(|l| strip_ansi(l)).collect::<Vec<_>>(),
            ours
        );
    }

    #[test]
    fn control_characters_from_servers_are_shown_escaped() {
        let log = || {
            tracing::info!(
                target: "mcpd::server",
                mcpd_server = %"evil\x1b]0;title\x07",
                "{}",
                "red \x1b[31mtext\x1b[0m bell \x07 \u{9b}2J del \x7f bs \x08 ff \x0c é"
            );
        };
        assert_eq!(
            logged(true, false, log),
            [
                " INFO mcpd::server: red \\x1b[31mtext\\x1b[0m bell \\x07 \\u{9b}2J del \\x7f \
              bs \\x08 ff \\x0c é mcpd_server=evil\\x1b]0;title\\x07"
            ]
        );
        // The default format escapes the message alike.
        let theirs = logged(false, false, log);
        assert!(
            theirs[0]
                .starts_with(" INFO mcpd::server: red \\x1b[31mtext\\x1b[0m bell \\x07 \\u{9b}2J")
        );
    }
}
