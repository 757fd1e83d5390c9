//! `mcpctl`: argument parsing and dispatch only; the work is in `mcpd::ctl`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mcpd::unit::Style;

/// Control the mcpd service manager for MCP servers.
#[derive(Debug, Parser)]
#[command(name = "mcpctl", version, about)]
struct Cli {
    /// Never colour the output (also: NO_COLOR set in the environment).
    #[arg(long, global = true)]
    no_color: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check unit files (or directories of them) without a running daemon.
    ///
    /// Exit status is 0 when every unit is valid, 1 otherwise; diagnostics
    /// go to standard error.
    Verify {
        /// Unit files or unit directories.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stderr = std::io::stderr();
    let color = !cli.no_color
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        && stderr.is_terminal();
    let style = if color { Style::Color } else { Style::Plain };
    match cli.command {
        Command::Verify { paths } => {
            match mcpd::ctl::verify::run(&paths, style, &mut stderr.lock()) {
                Ok(summary) => ExitCode::from(summary.exit_code()),
                Err(e) => {
                    eprintln!("mcpctl: cannot write diagnostics: {e}");
                    ExitCode::from(mcpd::ctl::exit::FAILURE)
                }
            }
        }
    }
}
