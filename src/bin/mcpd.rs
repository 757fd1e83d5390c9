//! `mcpd`: argument parsing only; the work is in `mcpd::daemon`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mcpd::daemon::{self, Config};
use mcpd::unit::{Instance, Transport};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let instance = match (cli.system, cli.user) {
        (true, _) => Some(Instance::System),
        (_, true) => Some(Instance::User),
        _ => None,
    };
    let config = Config::new(instance, cli.units);
    let dirs: Vec<String> = config
        .unit_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    eprintln!(
        "mcpd: {} instance, unit path: {}",
        config.instance.as_str(),
        dirs.join(":")
    );
    let (units, dir_errors) = daemon::load_units(&config);
    for e in &dir_errors {
        eprintln!("mcpd: {e}");
    }
    let mut invalid = 0;
    for unit in &units {
        match &unit.spec {
            Ok(spec) => {
                let what = match spec.transport() {
                    Transport::Stdio(s) => format!("stdio {} {}", s.program(), s.args().join(" ")),
                    Transport::Http(h) => format!("http {}", h.url()),
                };
                let r = spec.reconnect();
                println!(
                    "{}: {} ({what}; reconnect {}, {} attempts, {}..{})",
                    unit.found.name,
                    spec.description().unwrap_or("-"),
                    if r.enabled() { "on" } else { "off" },
                    r.max_attempts(),
                    humantime::format_duration(r.initial_delay()),
                    humantime::format_duration(r.max_delay()),
                );
            }
            Err(e) => {
                invalid += 1;
                println!("{}: invalid\n{e}", unit.found.name);
            }
        }
    }
    eprintln!("mcpd: {} units loaded, {invalid} invalid", units.len());
    if invalid > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
