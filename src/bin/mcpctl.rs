//! `mcpctl`: argument parsing and dispatch only; the work is in `mcpd::ctl`.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mcpd::ctl::client::CtlError;
use mcpd::ctl::commands::{self, Output, Verb};
use mcpd::ctl::exit;
use mcpd::dbus::Client;
use mcpd::unit::{Instance, Style};

/// Control the mcpd service manager for MCP servers.
#[derive(Debug, Parser)]
#[command(
    name = "mcpctl",
    version,
    about = "Control mcpd, the service manager for MCP servers"
)]
struct Cli {
    /// Talk to the system instance (default when run as root).
    #[arg(long, global = true, conflicts_with = "user")]
    system: bool,
    /// Talk to your user instance (default when not root).
    #[arg(long, global = true)]
    user: bool,
    /// Print JSON instead of text (read commands).
    #[arg(long, global = true)]
    json: bool,
    /// Never colour the output (also: NO_COLOR set in the environment).
    #[arg(long, global = true)]
    no_color: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show servers: one line each, or in detail for the names given.
    ///
    /// Exit status: 0 when every named server is running, 3 when one is
    /// not, 4 when a name is unknown.
    Status { names: Vec<String> },
    /// List servers in a table.
    List,
    /// Start servers (with a fresh retry budget).
    Start {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Stop servers.
    Stop {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Restart servers (with a fresh retry budget).
    Restart {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Rescan the unit files now and print what changed; exit 1 if a unit
    /// is invalid.
    Reload,
    /// List a server's tools.
    Tools { name: String },
    /// List a server's resources (or, with --templates, its resource
    /// templates): URI and description.
    Resources {
        name: String,
        #[arg(long)]
        templates: bool,
    },
    /// List a server's prompts: name and description.
    Prompts { name: String },
    /// Call a tool; ARGUMENTS is a JSON object, or - to read it from stdin.
    /// Exit 1 when the tool reports an error.
    Call {
        name: String,
        tool: String,
        arguments: Option<String>,
    },
    /// Show the last lines a server wrote to stderr.
    Logs {
        name: String,
        /// How many lines.
        #[arg(short = 'n', long, default_value_t = 50)]
        lines: u32,
    },
    /// Show a server's unit file and drop-ins (header values redacted).
    Cat { name: String },
    /// Serve a managed server to an MCP host on stdin/stdout: use
    /// `mcpctl bridge NAME` as the server command in the host's config.
    /// Several names, `@GROUP` or `@all` serve those units as one server,
    /// their tools and prompts named UNIT__NAME.
    Bridge {
        #[arg(required = true, value_name = "NAME|@GROUP")]
        names: Vec<String>,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Check unit files (or directories of them), or the daemon's
    /// settings file (a file named mcpd.kdl), without a running daemon.
    ///
    /// Exit status is 0 when every unit is valid, 1 otherwise; diagnostics
    /// go to standard error.
    Verify {
        /// Unit files or unit directories.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Write unit NAME for a server, as a host's `mcp add` takes one:
    /// `mcpctl add NAME -- COMMAND ARG...` (stdio) or `mcpctl add
    /// --transport http NAME URL`; verify it and tell the daemon to reload.
    ///
    /// Secret values (of --env and --header: tokens, keys, passwords) go to
    /// the instance's credstore as NAME.VAR (mode 0600), referenced by the
    /// unit, as `import` keeps them. A server that needs a login gets
    /// --oauth (then `mcpctl auth login NAME`). Exit status 1 when the
    /// unit would not load or exists (without --force).
    Add {
        name: String,
        /// The command and its arguments (after `--`, so that theirs are not
        /// read as mcpctl's options), or the server's URL.
        #[arg(required = true, value_name = "COMMAND|URL")]
        target: Vec<String>,
        /// stdio or http (default: http for a lone http(s):// URL).
        #[arg(long, short = 't')]
        transport: Option<String>,
        /// An environment variable of the server (stdio), KEY=VALUE.
        #[arg(long, short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// A header of the server's requests (http), "Name: value".
        #[arg(long = "header", short = 'H', value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// The unit's description.
        #[arg(long)]
        description: Option<String>,
        /// Replace unit NAME if it exists.
        #[arg(long)]
        force: bool,
        /// The server needs a login (OAuth 2.1): the unit gets an `oauth`
        /// block; log in with `mcpctl auth login NAME`.
        #[arg(long)]
        oauth: bool,
        /// The scopes to ask for (space-separated; default: the server's).
        #[arg(long, requires = "oauth")]
        scope: Option<String>,
        /// A client id registered with the authorization server (default:
        /// registered by mcpd).
        #[arg(long, requires = "oauth", value_name = "ID")]
        client_id: Option<String>,
        /// The fixed loopback port of the redirect that client id was
        /// registered with (default: any free port).
        #[arg(long, requires = "oauth", value_name = "PORT")]
        redirect_port: Option<u16>,
    },
    /// Edit unit NAME in $EDITOR as `systemctl edit` does: a drop-in
    /// (NAME.kdl.d/override.kdl in the instance's unit directory), or with
    /// --full the unit file itself; kept only when the unit still loads,
    /// then the daemon is told to reload.
    ///
    /// The editor gets a copy, the unit's files shown below it as comments
    /// (not kept). An edit that does not load is refused with the
    /// diagnostic and changes nothing (exit status 1); an emptied drop-in
    /// is removed. Exit status 4 when there is no such unit.
    Edit {
        name: String,
        /// Edit the unit file itself (a copy in the instance's unit
        /// directory when it comes from a later directory of the path).
        #[arg(long)]
        full: bool,
    },
    /// Remove unit NAME (and its drop-ins and env-file) and tell the daemon
    /// to reload, which stops it; with --purge its credentials and its
    /// on-demand cache too. Exit status 4 when there is no such unit file.
    Remove {
        name: String,
        /// Also remove its credentials (NAME.*) and cache.
        #[arg(long)]
        purge: bool,
    },
    /// Turn the MCP servers configured in hosts into units: HOST is one of
    /// claude-desktop, claude-code, cursor, vscode, windsurf, gemini, codex
    /// (none: every host found), or a host's config FILE.
    ///
    /// Secrets (env and header values) go to the instance's credstore,
    /// one file NAME.VAR (mode 0600) each, which the unit's `credentials`
    /// block references (--env-file: to NAME.env beside the unit). Exit
    /// status 1 when anything failed.
    Import {
        #[arg(value_name = "HOST|FILE")]
        sources: Vec<String>,
        /// Show what would be written; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Replace units that exist.
        #[arg(long)]
        force: bool,
        /// Only these entries (host name or unit name).
        #[arg(long, value_name = "NAME", num_args = 1..)]
        only: Vec<String>,
        /// Keep secrets in NAME.env beside the unit (0600), referenced by
        /// `env-file`, instead of in the credstore.
        #[arg(long)]
        env_file: bool,
    },
    /// Point HOST's config at `mcpctl bridge` for the named units (default:
    /// every entry that is a unit), keeping a backup beside it.
    Connect {
        host: String,
        names: Vec<String>,
        /// One entry, named GROUP, running `mcpctl bridge @GROUP`: every
        /// unit of the group as one server.
        #[arg(long, conflicts_with = "names")]
        group: Option<String>,
        /// Point the entries at mcpd's HTTP endpoint (mcpd.kdl(5)) by URL,
        /// each with a token made for it, instead of the bridge.
        #[arg(long)]
        http: bool,
        /// Connect units that need a login too (by default their entries
        /// are left to the host, which is logged in).
        #[arg(long)]
        force: bool,
        /// Print the change as a diff; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Undo `mcpctl connect HOST`.
    Disconnect {
        host: String,
        /// Put back the backup whole, undoing the host's changes since too.
        #[arg(long)]
        force: bool,
    },
    /// Log in to servers that need it (units with `oauth`): the daemon
    /// holds the login for every host.
    Auth {
        #[command(subcommand)]
        action: AuthAction,
    },
    /// Manage the HTTP endpoint's tokens (mcpd.kdl(5)): kept as hashes in
    /// the instance's state directory; the daemon applies a change at once.
    Token {
        #[command(subcommand)]
        action: TokenAction,
    },
    /// Manage the instance's credstore, which units' `credentials { import
    /// … }` read (values never on the command line, never shown).
    Credential {
        #[command(subcommand)]
        action: CredentialAction,
    },
}

#[derive(Debug, Subcommand)]
enum AuthAction {
    /// Log in to server NAME: open the printed URL; mcpctl waits for the
    /// redirect on 127.0.0.1 and the daemon keeps the tokens.
    Login {
        name: String,
        /// Print the URL only (no browser is opened).
        #[arg(long)]
        no_browser: bool,
    },
    /// Forget server NAME's login (it then needs a login again).
    Logout { name: String },
    /// The login of each unit with `oauth` (or of NAME…).
    Status { names: Vec<String> },
}

#[derive(Debug, Subcommand)]
enum TokenAction {
    /// Make token NAME and print it (once: only its hash is kept).
    New {
        name: String,
        /// Only these units (comma-separated), or `@GROUP`: as --group.
        #[arg(long, value_delimiter = ',', conflicts_with = "group")]
        units: Vec<String>,
        /// Only the units of this group.
        #[arg(long)]
        group: Option<String>,
        /// Expire after this long (30d, 12h).
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
    },
    /// List the tokens: name, scope, created, last used, expires.
    List,
    /// Revoke tokens: their open HTTP sessions end.
    Revoke {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum CredentialAction {
    /// Store the value read from standard input as credential NAME (0600).
    Set { name: String },
    /// List the stored credentials' names and sizes.
    List,
    /// Remove stored credentials.
    Remove {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// `mcpctl [--user|--system] bridge NAME…` (the flags before or after),
/// as hosts start it: the instance and what to serve, written as the
/// attach socket takes it (`NAME`, `A+B`, `@GROUP`). Anything else, help
/// and mistakes included, is for clap.
fn bridge_argv(args: impl Iterator<Item = std::ffi::OsString>) -> Option<(Instance, String)> {
    let (mut system, mut user, mut verb, mut names) = (false, false, false, Vec::new());
    for arg in args {
        match arg.to_str()? {
            "--system" => system = true,
            "--user" => user = true,
            "bridge" if !verb => verb = true,
            n if verb && !n.starts_with('-') && !n.contains('+') => names.push(n.to_owned()),
            _ => return None,
        }
    }
    let name = mcpd::mux::aggregate::Target::of_args(&names)
        .ok()
        .map(|t| t.label());
    let instance = match (system, user) {
        (true, true) => return None,
        (true, false) => Instance::System,
        (false, true) => Instance::User,
        (false, false) => Instance::by_default(),
    };
    Some((instance, name?))
}

fn bridge(instance: Instance, name: &str) -> ExitCode {
    match mcpd::ctl::bridge::run(instance, name) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // The host may have closed our stderr: the exit code still counts.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "mcpctl: {e}");
            ExitCode::from(e.code)
        }
    }
}

/// The exit of a failed command, its reason on stderr (none when standard
/// output's reader went away).
fn fail(e: &CtlError) -> ExitCode {
    if !e.message.is_empty() {
        eprintln!("mcpctl: {e}");
    }
    ExitCode::from(e.code)
}

fn main() -> ExitCode {
    // Hosts start a bridge for every session: it skips building the whole
    // command line grammar (its start-up time and memory count).
    if let Some((instance, name)) = bridge_argv(std::env::args_os().skip(1)) {
        return bridge(instance, &name);
    }
    let cli = Cli::parse();
    let no_color = cli.no_color || std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    if let Command::Completions { shell } = cli.command {
        use clap::CommandFactory;
        clap_complete::generate(shell, &mut Cli::command(), "mcpctl", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    if let Command::Verify { paths } = &cli.command {
        let stderr = std::io::stderr();
        let style = if !no_color && stderr.is_terminal() {
            Style::Color
        } else {
            Style::Plain
        };
        // An instance's own rules only when one is named, as the daemon
        // of that instance would apply them.
        let context = match (cli.system, cli.user) {
            (true, _) => Instance::System.load_context(),
            (_, true) => Instance::User.load_context(),
            _ => mcpd::unit::Context::default(),
        };
        return match mcpd::ctl::verify::run(paths, &context, style, &mut stderr.lock()) {
            Ok(summary) => {
                let code = summary.exit_code();
                if code == exit::OK {
                    // As systemd-analyze prints its findings.
                    let units = if summary.valid == 1 { "unit" } else { "units" };
                    if let Err(e) =
                        writeln!(std::io::stdout(), "{} {units}, no problems", summary.valid)
                    {
                        return fail(&CtlError::output(e));
                    }
                }
                ExitCode::from(code)
            }
            Err(e) => {
                eprintln!("mcpctl: cannot write diagnostics: {e}");
                ExitCode::from(exit::FAILURE)
            }
        };
    }
    let instance = match (cli.system, cli.user) {
        (true, _) => Instance::System,
        (_, true) => Instance::User,
        _ => Instance::by_default(),
    };
    if let Command::Bridge { names } = &cli.command {
        return match mcpd::mux::aggregate::Target::of_args(names) {
            Ok(target) => bridge(instance, &target.label()),
            Err(e) => fail(&CtlError::failure(e)),
        };
    }
    let env = |var: &str| std::env::var_os(var);
    let offline = match &cli.command {
        Command::Import {
            sources,
            dry_run,
            force,
            only,
            env_file,
        } => {
            let options = mcpd::ctl::import::ImportOptions {
                sources: sources.clone(),
                dry_run: *dry_run,
                force: *force,
                only: only.clone(),
                env_file: *env_file,
            };
            Some(mcpd::ctl::import::import(
                instance,
                &options,
                &env,
                &mut std::io::stdout().lock(),
            ))
        }
        Command::Connect {
            host,
            names,
            group,
            http,
            force,
            dry_run,
        } => Some(mcpd::ctl::import::connect(
            instance,
            host,
            names,
            group.as_deref(),
            *http,
            *force,
            *dry_run,
            &env,
            &mut std::io::stdout().lock(),
        )),
        Command::Disconnect { host, force } => Some(mcpd::ctl::import::disconnect(
            instance,
            host,
            *force,
            &env,
            &mut std::io::stdout().lock(),
        )),
        Command::Token { action } => {
            use mcpd::ctl::token;
            let file = mcpd::tokens::path(&instance.state_dir());
            Some(match action {
                TokenAction::New {
                    name,
                    units,
                    group,
                    expires,
                } => token::new(
                    &file,
                    name,
                    units,
                    group.as_deref(),
                    expires.as_deref(),
                    &mut std::io::stdout().lock(),
                ),
                TokenAction::List => token::list(&file, cli.json, &mut std::io::stdout().lock()),
                TokenAction::Revoke { names } => token::revoke(&file, names),
            })
        }
        Command::Add {
            name,
            target,
            transport,
            env: vars,
            headers,
            description,
            force,
            oauth,
            scope,
            client_id,
            redirect_port,
        } => {
            let oauth = oauth.then(|| mcpd::adopt::hosts::HostOAuth {
                client_id: client_id.clone(),
                redirect_port: *redirect_port,
                scope: scope.clone(),
            });
            let options = mcpd::ctl::add::AddOptions {
                name: name.clone(),
                target: target.clone(),
                transport: transport.clone(),
                env: vars.clone(),
                headers: headers.clone(),
                description: description.clone(),
                force: *force,
                oauth,
            };
            Some(mcpd::ctl::add::add(
                instance,
                &options,
                &env,
                &mut std::io::stdout().lock(),
            ))
        }
        Command::Edit { name, full } => Some(mcpd::ctl::edit::edit(
            instance,
            name,
            *full,
            &env,
            &mut std::io::stdout().lock(),
        )),
        Command::Remove { name, purge } => Some(mcpd::ctl::add::remove(
            instance,
            name,
            *purge,
            &env,
            &mut std::io::stdout().lock(),
        )),
        Command::Credential { action } => {
            use mcpd::ctl::credential;
            let store = instance.credstore();
            Some(match action {
                CredentialAction::Set { name } => {
                    credential::set(&store, name, &mut std::io::stdin().lock())
                }
                CredentialAction::List => {
                    credential::list(&store, cli.json, &mut std::io::stdout().lock())
                }
                CredentialAction::Remove { names } => credential::remove(&store, names),
            })
        }
        _ => None,
    };
    if let Some(result) = offline {
        return match result {
            Ok(code) => ExitCode::from(code),
            Err(e) => fail(&e),
        };
    }
    let output = Output {
        color: !no_color && std::io::stdout().is_terminal(),
        json: cli.json,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("mcpctl: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILURE);
        }
    };
    let result: Result<u8, CtlError> = runtime.block_on(async {
        let client = Client::connect(instance).await?;
        let mut out = std::io::stdout().lock();
        match cli.command {
            Command::Status { names } => {
                // The overview, for a person.
                if let Some(dir) = instance.runtime_dir_hidden_from_hosts()
                    && !output.json
                    && names.is_empty()
                {
                    eprintln!(
                        "mcpctl: warning: the runtime directory {} is not where hosts started with a default environment (HOME LOGNAME PATH SHELL TERM USER) look; `mcpctl connect` writes MCPD_RUNTIME_DIR into the entries it rewrites",
                        dir.display()
                    );
                }
                commands::status(&client, &names, output, &mut out).await
            }
            Command::List => commands::list(&client, output, &mut out).await,
            Command::Start { names } => commands::control(&client, Verb::Start, &names).await,
            Command::Stop { names } => commands::control(&client, Verb::Stop, &names).await,
            Command::Restart { names } => commands::control(&client, Verb::Restart, &names).await,
            Command::Reload => commands::reload(&client, output, &mut out).await,
            Command::Auth { action } => match action {
                AuthAction::Login { name, no_browser } => {
                    mcpd::ctl::auth::login(&client, &name, no_browser, &mut out).await
                }
                AuthAction::Logout { name } => mcpd::ctl::auth::logout(&client, &name, &mut out).await,
                AuthAction::Status { names } => mcpd::ctl::auth::status(&client, &names, &mut out).await,
            },
            Command::Tools { name } => commands::tools(&client, &name, output, &mut out).await,
            Command::Resources { name, templates } => {
                let listing = if templates {
                    commands::Listing::Templates
                } else {
                    commands::Listing::Resources
                };
                commands::items(&client, &name, listing, output, &mut out).await
            }
            Command::Prompts { name } => {
                commands::items(&client, &name, commands::Listing::Prompts, output, &mut out).await
            }
            Command::Call {
                name,
                tool,
                arguments,
            } => {
                let arguments = match arguments.as_deref() {
                    Some("-") => {
                        let mut text = String::new();
                        std::io::stdin().read_to_string(&mut text).map_err(|e| {
                            CtlError::failure(format!("cannot read arguments from stdin: {e}"))
                        })?;
                        text
                    }
                    Some(json) => json.to_owned(),
                    None => String::new(),
                };
                commands::call(&client, &name, &tool, &arguments, output, &mut out).await
            }
            Command::Logs { name, lines } => {
                commands::logs(&client, &name, lines, output, &mut out).await
            }
            Command::Cat { name } => commands::cat(&client, &name, output, &mut out).await,
            Command::Bridge { .. }
            | Command::Verify { .. }
            | Command::Completions { .. }
            | Command::Import { .. }
            | Command::Add { .. }
            | Command::Edit { .. }
            | Command::Remove { .. }
            | Command::Connect { .. }
            | Command::Disconnect { .. }
            | Command::Token { .. }
            | Command::Credential { .. } => Ok(exit::OK),
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Option<(Instance, String)> {
        bridge_argv(args.iter().map(std::ffi::OsString::from))
    }

    #[test]
    fn a_bridge_command_line_is_read_without_clap_and_anything_else_is_left_to_it() {
        assert_eq!(
            argv(&["--user", "bridge", "demo"]),
            Some((Instance::User, "demo".into()))
        );
        assert_eq!(
            argv(&["bridge", "demo", "--system"]),
            Some((Instance::System, "demo".into()))
        );
        assert_eq!(
            argv(&["bridge", "demo"]).map(|(i, _)| i),
            Some(Instance::by_default())
        );
        for other in [
            &["bridge"][..],
            &["bridge", "a", "@dev"],
            &["bridge", "a+b"],
            &["--user", "--system", "bridge", "demo"],
            &["bridge", "--help"],
            &["status", "demo"],
            &["--json", "bridge", "demo"],
            &["demo", "bridge"],
        ] {
            assert_eq!(argv(other), None, "{other:?}");
        }
        // The name is the bridge's argument even when it reads like a verb.
        assert_eq!(
            argv(&["bridge", "bridge"]),
            Some((Instance::by_default(), "bridge".into()))
        );
    }
}
