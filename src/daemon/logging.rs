//! Logging: to the journal when stderr is the journal (`JOURNAL_STREAM`
//! names stderr's device and inode), else human-readable to stderr. Fields
//! keep their names: a child's lines carry `mcpd_server`, which the journal
//! stores as `MCPD_SERVER` (`journalctl MCPD_SERVER=github`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
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
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // A write that fails (whoever read stderr went away) is dropped:
        // reporting it would print to the same stderr, which panics the
        // task that logged, be it a server's actor or the signal handler.
        .log_internal_errors(false)
        .init();
    Ok("stderr")
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
}
