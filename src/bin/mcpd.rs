//! `mcpd`: argument parsing, logging setup and signals; the work is in
//! `mcpd::daemon`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mcpd::daemon::{self, Config};
use mcpd::model::Control;
use mcpd::unit::Instance;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

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
    /// Serve D-Bus only on the private socket in the runtime directory,
    /// not on the system or session bus.
    #[arg(long)]
    no_bus: bool,
    /// Read the daemon's settings (mcpd.kdl(5)) from PATH instead of
    /// /etc/mcpd/mcpd.kdl (system) or $XDG_CONFIG_HOME/mcpd/mcpd.kdl (user);
    /// it must exist.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Log filter: a level (error, warn, info, debug, trace) or tracing
    /// directives such as "info,mcpd::supervisor=debug". Overrides MCPD_LOG.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
}

fn main() -> ExitCode {
    // Before any descriptor is opened: the service manager's sockets.
    let passed = daemon::activation::take();
    let cli = Cli::parse();
    let filter = cli
        .log_level
        .or_else(|| std::env::var("MCPD_LOG").ok())
        .unwrap_or_else(|| "info".into());
    if let Err(e) = daemon::logging::init(&filter) {
        eprintln!("mcpd: {e}");
        return ExitCode::from(2);
    }
    for line in passed {
        tracing::warn!(target: "mcpd::daemon", "{line}");
    }
    // Tunables for the tests and the benchmarks, checked at start.
    type Set = fn(std::time::Duration) -> Result<(), String>;
    let knobs: [(&str, Set); 3] = [
        ("MCPD_HTTP_READ_TIMEOUT", mcpd::endpoint::set_read_timeout),
        (
            "MCPD_CALL_LOG_DELAY",
            mcpd::supervisor::accounting::set_flush_after,
        ),
        (
            "MCPD_INITIALIZE_TIMEOUT",
            mcpd::supervisor::set_initialize_timeout,
        ),
    ];
    for (name, set) in knobs {
        if let Ok(value) = std::env::var(name) {
            let set = humantime::parse_duration(value.trim())
                .map_err(|e| e.to_string())
                .and_then(set);
            if let Err(e) = set {
                eprintln!("mcpd: invalid {name} {value:?}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let instance = match (cli.system, cli.user) {
        (true, _) => Some(Instance::System),
        (_, true) => Some(Instance::User),
        _ => None,
    };
    let mut config = Config::new(instance, cli.units);
    config.no_bus = cli.no_bus;
    if let Some(path) = cli.config {
        // Absolute, so its directory can be watched.
        config.settings = Some(std::path::absolute(&path).unwrap_or(path));
        config.settings_given = true;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("mcpd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let signals = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        );
        let (mut term, mut int, mut hup) = match signals {
            (Ok(term), Ok(int), Ok(hup)) => (term, int, hup),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                eprintln!("mcpd: cannot handle signals: {e}");
                return ExitCode::FAILURE;
            }
        };
        let (control, rx) = mpsc::unbounded_channel();
        let controller = control.clone();
        tokio::spawn(async move {
            loop {
                let command = tokio::select! {
                    _ = term.recv() => {
                        tracing::info!(target: "mcpd::daemon", "SIGTERM received");
                        Control::Shutdown
                    }
                    _ = int.recv() => {
                        tracing::info!(target: "mcpd::daemon", "SIGINT received");
                        Control::Shutdown
                    }
                    _ = hup.recv() => {
                        tracing::info!(target: "mcpd::daemon", "SIGHUP received: reloading");
                        Control::Reload { reply: None }
                    }
                };
                if control.send(command).is_err() {
                    break;
                }
            }
        });
        match daemon::run(config, controller, rx).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mcpd: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
