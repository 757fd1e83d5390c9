//! `mcpd`: argument parsing, logging setup and signals; the work is in
//! `mcpd::daemon`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mcpd::daemon::{self, Config};
use mcpd::unit::Instance;
use tokio::signal::unix::{SignalKind, signal};

/// Keep MCP servers running, as declared by unit files.
#[derive(Debug, Parser)]
#[command(name = "mcpd", version, about)]
struct Cli {
    /// Run the per-machine instance (default when run as root).
    #[arg(long, conflicts_with = "user")]
    system: bool,
    /// Run the per-user instance (default when not root).
    #[arg(long)]
    user: bool,
    /// Load units from DIR instead of the instance's search path (repeatable;
    /// earlier directories win).
    #[arg(long = "units", value_name = "DIR")]
    units: Vec<PathBuf>,
    /// Log filter: a level (error, warn, info, debug, trace) or tracing
    /// directives such as "info,mcpd::supervisor=debug". Overrides MCPD_LOG.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = cli
        .log_level
        .or_else(|| std::env::var("MCPD_LOG").ok())
        .unwrap_or_else(|| "info".into());
    // rmcp narrates every session at info; its warnings and errors still count.
    let filter = if filter.contains("rmcp") {
        filter
    } else {
        format!("{filter},rmcp=warn")
    };
    let filter = match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(filter) => filter,
        Err(e) => {
            eprintln!("mcpd: invalid --log-level {filter:?}: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let instance = match (cli.system, cli.user) {
        (true, _) => Some(Instance::System),
        (_, true) => Some(Instance::User),
        _ => None,
    };
    let config = Config::new(instance, cli.units);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("mcpd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let (mut term, mut int) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => (term, int),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("mcpd: cannot handle signals: {e}");
                return ExitCode::FAILURE;
            }
        };
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => tracing::info!(target: "mcpd::daemon", "SIGTERM received"),
                _ = int.recv() => tracing::info!(target: "mcpd::daemon", "SIGINT received"),
            }
        };
        daemon::run(config, shutdown).await;
        ExitCode::SUCCESS
    })
}
