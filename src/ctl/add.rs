//! `mcpctl add` and `mcpctl remove`: a unit written (or removed) from a
//! command line as the hosts' own `mcp add` take one (`claude mcp add NAME
//! -- CMD ARGS…`, `--transport http NAME URL`, `--env K=V`, `--header`).
//! The unit is made as `mcpctl import` makes one from a host's entry
//! ([`crate::adopt::convert`]: secrets to the credstore, referenced by the
//! unit), verified with the daemon's own loader before anything is
//! written, and the daemon is told to reload; without a daemon it is used
//! when one starts.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::adopt::convert::{self, Keep, Lookup};
use crate::adopt::hosts::{Entry, HeaderValue, Host, Server, Tools};
use crate::dbus::Client;
use crate::unit::{Instance, Style, UnitName};

use super::client::CtlError;
use super::commands::Output;
use super::exit;
use super::import::{dirs, unit_dir, write_atomically};

/// What `mcpctl add` was asked.
#[derive(Debug, Clone, Default)]
pub struct AddOptions {
    pub name: String,
    /// `COMMAND ARG…`, or one URL.
    pub target: Vec<String>,
    /// `stdio` or `http`; none: `http` for a lone `http(s)://` URL.
    pub transport: Option<String>,
    /// `KEY=VALUE` each.
    pub env: Vec<String>,
    /// `Name: value` (or `Name=value`) each.
    pub headers: Vec<String>,
    pub description: Option<String>,
    /// Replace a unit of that name.
    pub force: bool,
    /// The server needs a login (DESIGN §17): the unit gets `oauth { }`
    /// with these keys, and `mcpctl auth login NAME` is the next step.
    pub oauth: Option<crate::adopt::hosts::HostOAuth>,
}

/// `mcpctl add`: writes unit NAME, then tells the daemon to reload.
pub fn add(
    instance: Instance,
    options: &AddOptions,
    env: &dyn Fn(&str) -> Option<OsString>,
    out: &mut dyn Write,
) -> Result<u8, CtlError> {
    let name = UnitName::new(&options.name)
        .map_err(|e| CtlError::failure(format!("{}: {e}", options.name)))?;
    let name = name.as_str().to_owned();
    let dirs = dirs(env)?;
    let units = unit_dir(instance, env)?;
    let store = crate::unit::instance::credstore(instance, env);
    let path = units.join(format!("{name}.kdl"));
    if path.exists() && !options.force {
        return Err(CtlError::failure(format!(
            "{} exists (--force replaces it)",
            path.display()
        )));
    }
    let entry = Entry {
        name: name.clone(),
        // Its syntax: `${VAR}` is the variable of this environment.
        host: Host::ClaudeCode,
        file: PathBuf::from("mcpctl add"),
        base: std::env::current_dir().unwrap_or_else(|_| dirs.home.clone()),
        server: server(options)?,
        disabled: false,
        tools: Tools::default(),
    };
    let var = |v: &str| env(v).and_then(|v| v.into_string().ok());
    let file = |p: &Path| std::fs::read_to_string(p).ok();
    let lookup = Lookup {
        var: &var,
        file: &file,
        home: &dirs.home,
    };
    let description = options
        .description
        .clone()
        .unwrap_or_else(|| format!("{name}, added by mcpctl add"));
    let head = vec![format!("description {}", convert::kdl(&description))];
    let made = convert::convert_as(&entry, Keep::Credstore { unit: &name }, &lookup, head)
        .map_err(|why| CtlError::failure(format!("{name}: {why}")))?;
    verify(instance, &name, &made.unit)?;
    // The secrets first, the unit last: a daemon that sees it has them.
    for (var, value) in &made.secrets {
        super::credential::write(&store, &format!("{name}.{var}"), value.as_bytes())
            .map_err(CtlError::failure)?;
    }
    std::fs::create_dir_all(&units)
        .map_err(|e| CtlError::failure(format!("cannot create {}: {e}", units.display())))?;
    write_atomically(&path, made.unit.as_bytes(), 0o600).map_err(CtlError::failure)?;
    writeln!(out, "wrote {}", path.display()).map_err(CtlError::output)?;
    for (var, _) in &made.secrets {
        writeln!(
            out,
            "kept {var} as credential {name}.{var} in {}",
            store.display()
        )
        .map_err(CtlError::output)?;
    }
    let code = reload(instance, out)?;
    if made.login {
        writeln!(out, "then: mcpctl auth login {name}").map_err(CtlError::output)?;
    }
    Ok(code)
}

/// What the entry runs or reaches, from the options.
fn server(options: &AddOptions) -> Result<Server, CtlError> {
    let bad = |why: String| CtlError::failure(format!("{}: {why}", options.name));
    let env: Vec<(String, String)> = options
        .env
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| bad(format!("--env {pair}: expected KEY=VALUE")))
        })
        .collect::<Result<_, _>>()?;
    let lone_url = matches!(options.target.as_slice(), [one] if one.starts_with("http://") || one.starts_with("https://"));
    let transport = match options.transport.as_deref() {
        Some(t) => t,
        None if lone_url => "http",
        None => "stdio",
    };
    match transport {
        "stdio" => {
            if !options.headers.is_empty() {
                return Err(bad("--header is for an HTTP server".into()));
            }
            if options.oauth.is_some() {
                return Err(bad("--oauth is for an HTTP server".into()));
            }
            let Some((command, args)) = options.target.split_first() else {
                return Err(bad("name the command to run: -- COMMAND ARG…".into()));
            };
            Ok(Server::Stdio {
                command: command.clone(),
                args: args.to_vec(),
                env,
                cwd: None,
                env_file: None,
                pass: Vec::new(),
            })
        }
        "http" | "streamable-http" => {
            let [url] = options.target.as_slice() else {
                return Err(bad("an HTTP server is one URL".into()));
            };
            if !env.is_empty() {
                return Err(bad("--env is for a stdio server".into()));
            }
            let headers = options
                .headers
                .iter()
                .map(|h| {
                    let (k, v) = h
                        .split_once(':')
                        .or_else(|| h.split_once('='))
                        .ok_or_else(|| bad(format!("--header {h}: expected \"Name: value\"")))?;
                    Ok((k.trim().to_owned(), HeaderValue::Text(v.trim().to_owned())))
                })
                .collect::<Result<_, CtlError>>()?;
            Ok(Server::Remote {
                url: url.clone(),
                sse: false,
                headers,
                oauth: options.oauth.clone(),
            })
        }
        "sse" => Err(bad(
            "the SSE transport is not spoken by mcpd (Streamable HTTP only: --transport http)"
                .into(),
        )),
        other => Err(bad(format!("--transport {other}: expected stdio or http"))),
    }
}

/// The unit's text judged by the daemon's loader, in a scratch directory:
/// a unit that would not load is not written.
fn verify(instance: Instance, name: &str, text: &str) -> Result<(), CtlError> {
    use std::os::unix::fs::DirBuilderExt;
    let scratch = std::env::temp_dir().join(format!("mcpctl-add-{}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&scratch)
        .map_err(|e| CtlError::failure(format!("cannot create {}: {e}", scratch.display())))?;
    let path = scratch.join(format!("{name}.kdl"));
    let judged = std::fs::write(&path, text)
        .map_err(|e| CtlError::failure(format!("cannot write {}: {e}", path.display())))
        .and_then(|()| {
            let mut said = Vec::new();
            let summary =
                super::verify::run(&[path], &instance.load_context(), Style::Plain, &mut said)
                    .map_err(|e| CtlError::failure(e.to_string()))?;
            if summary.exit_code() == exit::OK {
                return Ok(());
            }
            Err(CtlError::failure(format!(
                "the unit it would write does not load:\n{}",
                String::from_utf8_lossy(&said).trim_end()
            )))
        });
    let _ = std::fs::remove_dir_all(&scratch);
    judged
}

/// `mcpctl remove NAME`: removes unit NAME's file (and its drop-ins and
/// env-file), with `purge` its credentials and on-demand cache too, then
/// tells the daemon to reload, which stops it.
pub fn remove(
    instance: Instance,
    name: &str,
    purge: bool,
    env: &dyn Fn(&str) -> Option<OsString>,
    out: &mut dyn Write,
) -> Result<u8, CtlError> {
    let units = unit_dir(instance, env)?;
    let path = units.join(format!("{name}.kdl"));
    if !path.is_file() {
        return Err(CtlError {
            message: format!("no unit {name} in {}", units.display()),
            code: exit::NO_SUCH_SERVER,
        });
    }
    let mut gone = vec![path];
    gone.push(units.join(format!("{name}.env")));
    if purge {
        let store = crate::unit::instance::credstore(instance, env);
        let prefix = format!("{name}.");
        gone.extend(
            std::fs::read_dir(&store)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path()),
        );
        let state = crate::unit::instance::state_dir(instance, env);
        gone.push(state.join("cache").join(format!("{name}.json")));
    }
    for file in gone.iter().filter(|f| f.exists()) {
        std::fs::remove_file(file)
            .map_err(|e| CtlError::failure(format!("cannot remove {}: {e}", file.display())))?;
        writeln!(out, "removed {}", file.display()).map_err(CtlError::output)?;
    }
    let dropins = units.join(format!("{name}.kdl.d"));
    if dropins.is_dir() {
        std::fs::remove_dir_all(&dropins)
            .map_err(|e| CtlError::failure(format!("cannot remove {}: {e}", dropins.display())))?;
        writeln!(out, "removed {}", dropins.display()).map_err(CtlError::output)?;
    }
    reload(instance, out)
}

const PLAIN: Output = Output {
    color: false,
    json: false,
};

/// Tells the daemon to reload and prints what changed; without a daemon,
/// says the change applies when one starts.
pub(super) fn reload(instance: Instance, out: &mut dyn Write) -> Result<u8, CtlError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CtlError::failure(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        match Client::connect(instance).await {
            Ok(client) => super::commands::reload(&client, PLAIN, out).await,
            Err(e) => {
                writeln!(
                    out,
                    "mcpd ({} instance) is not running ({e}): it loads the change when it starts",
                    instance.as_str()
                )
                .map_err(CtlError::output)?;
                Ok(exit::OK)
            }
        }
    })
}
