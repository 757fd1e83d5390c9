//! `mcpctl import`, `connect` and `disconnect` (DESIGN §11): the file I/O
//! around [`crate::adopt`]. None needs a running daemon; a running one
//! picks imported units up by itself (it watches its unit directories).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::adopt::connect::{self, Record, Undo};
use crate::adopt::convert::Lookup;
use crate::adopt::hosts::{self, Dirs, Entry, Host};
use crate::adopt::import::{self, Row};
use crate::adopt::{pair, plan};
use crate::unit::Instance;

use super::client::CtlError;
use super::exit;

/// What `mcpctl import` was asked.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Host names or files; none: every host found.
    pub sources: Vec<String>,
    pub dry_run: bool,
    pub force: bool,
    /// Only these entries (by their name in the host, or their unit name).
    pub only: Vec<String>,
    /// Secrets to `UNIT.env` beside the unit (as before credentials)
    /// rather than into the instance's credstore.
    pub env_file: bool,
}

/// The user's directories, from `env`.
pub fn dirs(env: &dyn Fn(&str) -> Option<OsString>) -> Result<Dirs, CtlError> {
    let absolute = |var: &str| env(var).map(PathBuf::from).filter(|p| p.is_absolute());
    let home = absolute("HOME").ok_or_else(|| CtlError::failure("HOME is not set"))?;
    Ok(Dirs {
        config: absolute("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config")),
        codex: absolute("CODEX_HOME").unwrap_or_else(|| home.join(".codex")),
        project: std::env::current_dir().unwrap_or_else(|_| home.clone()),
        home,
    })
}

/// Where the instance's own units go: the first directory of its search
/// path (`~/.config/mcpd/units`, `/etc/mcpd/units`).
pub fn unit_dir(
    instance: Instance,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<PathBuf, CtlError> {
    crate::unit::search_path(instance, env)
        .into_iter()
        .next()
        .ok_or_else(|| CtlError::failure("no unit directory for this instance (is HOME set?)"))
}

/// A host file to read.
struct Source {
    host: Host,
    path: PathBuf,
}

fn sources(options: &ImportOptions, dirs: &Dirs, rows: &mut Vec<Row>) -> Vec<Source> {
    let mut out = Vec::new();
    let existing = |host: Host, projects: bool| -> Vec<Source> {
        let files = host.files(dirs);
        let take = if projects { files.len() } else { 1 };
        files
            .into_iter()
            .take(take)
            .filter(|p| p.is_file())
            .map(|path| Source { host, path })
            .collect()
    };
    if options.sources.is_empty() {
        // The user's own files only: a project's (`.mcp.json`, `.vscode/`
        // in the working directory) may come from a repository just
        // cloned, and its commands would run; those are read when the
        // host is named.
        for host in Host::ALL {
            out.extend(existing(host, false));
        }
        return dedup(out);
    }
    for source in &options.sources {
        if let Some(host) = Host::by_name(source) {
            let found = existing(host, true);
            if found.is_empty() {
                let looked: Vec<String> = host
                    .files(dirs)
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                rows.push(Row::failed_source(
                    host.name(),
                    format!("no config file (looked at {})", looked.join(", ")),
                ));
            }
            out.extend(found);
        } else if !Path::new(source).exists() {
            let known: Vec<&str> = Host::ALL.iter().map(|h| h.name()).collect();
            rows.push(Row::failed_source(
                "-",
                format!(
                    "\"{source}\" is neither a host ({}) nor a file",
                    known.join(", ")
                ),
            ));
        } else {
            let path = PathBuf::from(source);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            out.push(Source {
                host: Host::detect(&path, &text),
                path,
            });
        }
    }
    dedup(out)
}

/// Each file once: in the home directory, a host's project file is its
/// user file.
fn dedup(sources: Vec<Source>) -> Vec<Source> {
    let mut seen = std::collections::HashSet::new();
    sources
        .into_iter()
        .filter(|s| seen.insert(std::fs::canonicalize(&s.path).unwrap_or_else(|_| s.path.clone())))
        .collect()
}

/// `mcpctl import`: writes a unit (and an env-file for its secrets) for
/// each server the hosts have, prints what it did, exits 1 when anything
/// failed.
pub fn import(
    instance: Instance,
    options: &ImportOptions,
    env: &dyn Fn(&str) -> Option<OsString>,
    out: &mut dyn Write,
) -> Result<u8, CtlError> {
    let dirs = dirs(env)?;
    let units = unit_dir(instance, env)?;
    let store = crate::unit::instance::credstore(instance, env);
    let mut rows = Vec::new();
    let var = |name: &str| env(name).and_then(|v| v.into_string().ok());
    let file = |path: &Path| std::fs::read_to_string(path).ok();
    let lookup = Lookup {
        var: &var,
        file: &file,
        home: &dirs.home,
    };
    // Read before: the hosts' files, and what is there for a unit name.
    let named = sources(options, &dirs, &mut rows);
    // Hosts named: the other hosts' own files name units too, so that a
    // unit is named as importing every host names it, whatever the order.
    let context: Vec<Source> = if options.sources.is_empty() {
        Vec::new()
    } else {
        let all = sources(&ImportOptions::default(), &dirs, &mut Vec::new());
        let same = |a: &Path, b: &Path| {
            std::fs::canonicalize(a).unwrap_or_else(|_| a.to_owned())
                == std::fs::canonicalize(b).unwrap_or_else(|_| b.to_owned())
        };
        all.into_iter()
            .filter(|s| !named.iter().any(|n| same(&n.path, &s.path)))
            .collect()
    };
    let read: Vec<import::Source> = named
        .into_iter()
        .map(|s| (s, false))
        .chain(context.into_iter().map(|s| (s, true)))
        .map(|(source, context)| import::Source {
            base: hosts::base_of(source.host, &source.path, &dirs),
            text: std::fs::read_to_string(&source.path).map_err(|e| e.to_string()),
            host: source.host,
            path: source.path,
            context,
        })
        .collect();
    let existing = |name: &str| existing(&units, &store, name);
    let plan = import::import(import::ImportInput {
        sources: read,
        only: &options.only,
        dry_run: options.dry_run,
        force: options.force,
        env_file: options.env_file,
        units: &units,
        instance,
        lookup: &lookup,
        existing: &existing,
    });
    // Written after; a write that fails fails its row.
    let first = rows.len();
    rows.extend(plan.rows);
    for placement in plan.writes {
        if let Err(why) = write(&units, &store, &placement) {
            let row = &mut rows[first + placement.row];
            row.result = format!("{}failed: {why}", placement.prefix);
            row.failed = true;
        }
    }
    print_table(&rows, out).map_err(CtlError::output)?;
    if let Some(said) = import::summary(&rows, &units, instance, options.dry_run) {
        writeln!(out, "\n{said}").map_err(CtlError::output)?;
    }
    Ok(if rows.iter().any(|r| r.failed) {
        exit::FAILURE
    } else {
        exit::OK
    })
}

/// What unit `name` has now: its file, its env-file, its credentials.
fn existing(units: &Path, store: &Path, name: &str) -> import::Existing {
    let prefix = format!("{name}.");
    import::Existing {
        unit: std::fs::read_to_string(units.join(format!("{name}.kdl"))).ok(),
        env: std::fs::read_to_string(units.join(format!("{name}.env"))).ok(),
        credentials: std::fs::read_dir(store)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .map(|n| {
                let held = std::fs::read(store.join(&n)).unwrap_or_default();
                (n, held)
            })
            .collect(),
    }
}

/// Writes one imported unit's files as planned: its secrets first, the
/// unit last, so a running daemon never loads it before them.
fn write(units: &Path, store: &Path, placement: &import::Placement) -> Result<(), String> {
    std::fs::create_dir_all(units)
        .map_err(|e| format!("cannot create {}: {e}", units.display()))?;
    match &placement.env {
        (path, Some(text)) => write_atomically(path, text.as_bytes(), 0o600)?,
        (path, None) => {
            let _ = std::fs::remove_file(path);
        }
    }
    for (name, value) in &placement.credentials {
        super::credential::write(store, name, value)?;
    }
    for old in &placement.stale {
        let _ = std::fs::remove_file(store.join(old));
    }
    let (path, text) = &placement.unit;
    write_atomically(path, text.as_bytes(), 0o600)
}

pub use crate::files::write_atomically;

fn print_table(rows: &[Row], out: &mut dyn Write) -> std::io::Result<()> {
    if rows.is_empty() {
        return writeln!(out, "No MCP servers found in any host's configuration.");
    }
    let width = |f: fn(&Row) -> &str, title: &str| {
        rows.iter()
            .map(|r| f(r).chars().count())
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let (h, e, u) = (
        width(|r| &r.host, "HOST"),
        width(|r| &r.entry, "ENTRY"),
        width(|r| &r.unit, "UNIT"),
    );
    writeln!(out, "{:h$}  {:e$}  {:u$}  RESULT", "HOST", "ENTRY", "UNIT")?;
    for r in rows {
        writeln!(
            out,
            "{:h$}  {:e$}  {:u$}  {}",
            r.host, r.entry, r.unit, r.result
        )?;
    }
    Ok(())
}

/// The files `connect` keeps beside a host's file.
fn beside(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The command line a host runs for unit `unit`.
fn bridge_line(instance: Instance, unit: &str) -> Vec<String> {
    let mcpctl = std::env::current_exe()
        .ok()
        .and_then(|p| std::fs::canonicalize(p).ok())
        .map_or_else(|| "mcpctl".to_owned(), |p| p.display().to_string());
    vec![
        mcpctl,
        format!("--{}", instance.as_str()),
        "bridge".into(),
        unit.into(),
    ]
}

/// `http://ADDR` of the endpoint `instance`'s `mcpd.kdl` configures (its
/// first `listen`; an unspecified address as its loopback), and whether it
/// asks for tokens.
fn endpoint_base(
    instance: Instance,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<(String, bool), CtlError> {
    use crate::unit::settings;
    let path = settings::default_path(instance, env).ok_or_else(|| {
        CtlError::failure("--http: no settings file for this instance (is HOME set?)")
    })?;
    let http = settings::read(&path, false)
        .map_err(|e| CtlError::failure(format!("--http: {e}")))?
        .and_then(|s| s.http)
        .ok_or_else(|| {
            CtlError::failure(format!(
                "--http: mcpd's HTTP endpoint is not configured: {} has no `http {{ listen \"127.0.0.1:8737\"; }}` section (mcpd.kdl(5))",
                path.display()
            ))
        })?;
    let mut addr = *http.listen.first().ok_or_else(|| {
        CtlError::failure(format!(
            "--http: {} has no `listen` address",
            path.display()
        ))
    })?;
    if addr.port() == 0 {
        return Err(CtlError::failure(format!(
            "--http: {} listens on port 0 (any free port): a host needs a fixed port",
            path.display()
        )));
    }
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok((format!("http://{addr}"), http.auth == settings::Auth::Token))
}

/// Makes `planned`'s tokens in the instance's token file (one update,
/// under its lock; an earlier token of the same name replaced) and writes
/// each to its file (0600, in a 0700 directory).
fn mint(
    instance: Instance,
    env: &dyn Fn(&str) -> Option<OsString>,
    planned: &[plan::Token],
) -> Result<(), CtlError> {
    use std::os::unix::fs::DirBuilderExt;
    if planned.is_empty() {
        return Ok(());
    }
    let file = crate::tokens::path(&crate::unit::instance::state_dir(instance, env));
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let minted = crate::tokens::update(&file, |kept| {
        kept.retain(|t| !planned.iter().any(|p| p.name == t.name));
        if kept.len() + planned.len() > crate::tokens::MAX_TOKENS {
            return Err(format!(
                "{} tokens already: revoke some first",
                crate::tokens::MAX_TOKENS
            ));
        }
        let mut minted = Vec::new();
        for p in planned {
            let (token, hash) = crate::tokens::mint()?;
            kept.push(crate::tokens::Entry {
                name: p.name.clone(),
                hash,
                scope: p.scope.clone(),
                created,
                expires: None,
            });
            minted.push(token);
        }
        Ok(minted)
    })
    .map_err(|e| CtlError::failure(format!("--http: {e}")))?;
    for (p, token) in planned.iter().zip(minted) {
        if let Some(dir) = p.file.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| CtlError::failure(format!("cannot create {}: {e}", dir.display())))?;
        }
        write_atomically(&p.file, p.contents(&token).as_bytes(), 0o600)
            .map_err(CtlError::failure)?;
    }
    Ok(())
}

/// Revokes the tokens `connect --http` made and removes their files;
/// the names of those that were there.
fn revoke(
    instance: Instance,
    env: &dyn Fn(&str) -> Option<OsString>,
    made: &[(String, PathBuf)],
) -> Result<Vec<String>, CtlError> {
    if made.is_empty() {
        return Ok(Vec::new());
    }
    let file = crate::tokens::path(&crate::unit::instance::state_dir(instance, env));
    let revoked = crate::tokens::update(&file, |kept| {
        let revoked: Vec<String> = kept
            .iter()
            .filter(|t| made.iter().any(|(name, _)| *name == t.name))
            .map(|t| t.name.clone())
            .collect();
        kept.retain(|t| !revoked.contains(&t.name));
        Ok(revoked)
    })
    .map_err(CtlError::failure)?;
    for (_, path) in made {
        let _ = std::fs::remove_file(path);
    }
    Ok(revoked)
}

/// `mcpctl connect HOST [NAME…]`: points the host's user-level file at
/// `mcpctl bridge` for the named units (by default: every entry of that file
/// that is a unit of this instance), keeping a backup beside it. With
/// `group`: one entry of that name running `mcpctl bridge @GROUP`. With
/// `http`: the entries reach mcpd's HTTP endpoint by URL instead, each
/// with a token made for it.
#[allow(clippy::too_many_arguments)]
pub fn connect(
    instance: Instance,
    host: &str,
    names: &[String],
    group: Option<&str>,
    http: bool,
    force: bool,
    dry_run: bool,
    env: &dyn Fn(&str) -> Option<OsString>,
    out: &mut dyn Write,
) -> Result<u8, CtlError> {
    let host = Host::by_name(host).ok_or_else(|| unknown_host(host))?;
    let dirs = dirs(env)?;
    let endpoint = if http {
        Some(endpoint_base(instance, env)?)
    } else {
        None
    };
    let token_dir = dirs.config.join("mcpd/connect");
    let file = user_file(host, &dirs);
    // A host that has no servers yet may have no file: it is made (from
    // nothing), where the host's own directory is there.
    let (text, created) = match std::fs::read_to_string(&file) {
        Ok(text) => (text, false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = file.parent().unwrap_or(Path::new("/"));
            if !dir.is_dir() {
                return Err(CtlError::failure(format!(
                    "{}: no such file, nor its directory {}: is {} installed for this user?",
                    file.display(),
                    dir.display(),
                    host.name()
                )));
            }
            (String::new(), true)
        }
        Err(e) => return Err(CtlError::failure(format!("{}: {e}", file.display()))),
    };
    // Read as `import` read it, by the path the host's docs give (a unit's
    // origin names that path).
    let listed = host.files(&dirs).into_iter().next().expect("a user file");
    let base = hosts::base_of(host, &listed, &dirs);
    let entries = hosts::read(host, &listed, &text, &base).map_err(|e| {
        CtlError::failure(format!(
            "{}:{}:{}: {}",
            file.display(),
            e.line,
            e.column,
            e.message
        ))
    })?;
    let bridge = |unit: &str| bridge_line(instance, unit);
    let other = other_instance(instance);
    let other_bridge = |unit: &str| bridge_line(other, unit);
    let units = units_of(instance, env);
    let other_units = units_of(other, env);
    let var = |name: &str| env(name).and_then(|v| v.into_string().ok());
    let read = |path: &Path| std::fs::read_to_string(path).ok();
    let lookup = Lookup {
        var: &var,
        file: &read,
        home: &dirs.home,
    };
    // Only the user-level servers: `connect` edits that object alone.
    let entries: Vec<Entry> = entries.into_iter().filter(|e| e.base == base).collect();
    // A group's units, as the daemon loads them.
    let members: Vec<String> = match group {
        Some(group) => {
            let context = instance.load_context();
            units
                .iter()
                .filter(|u| {
                    crate::unit::load_in(&crate::unit::UnitFiles::beside(&u.path), &context)
                        .is_ok_and(|spec| spec.groups().iter().any(|g| g == group))
                })
                .map(|u| u.name.clone())
                .collect()
        }
        None => Vec::new(),
    };
    let record_path = beside(&file, ".mcpd-connect.json");
    let backup = beside(&file, ".mcpd-backup");
    let earlier: Option<Record> = std::fs::read_to_string(&record_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    // A host that starts the bridge with a minimal environment must still
    // find this daemon.
    let hidden = instance.runtime_dir_hidden_from_hosts();
    let vars: Vec<(String, String)> = hidden
        .iter()
        .map(|dir| ("MCPD_RUNTIME_DIR".to_owned(), dir.display().to_string()))
        .collect();
    let needing = if force {
        Vec::new()
    } else {
        needing_login(instance, env, &units)
    };
    let planned = plan::connect(plan::ConnectInput {
        host,
        file: &file,
        text: &text,
        entries: &entries,
        units: &units,
        instance: instance.as_str(),
        other_units: &other_units,
        other: other.as_str(),
        names,
        group: group.map(|g| (g, members.as_slice())),
        lookup: &lookup,
        bridge: &bridge,
        other_bridge: &other_bridge,
        vars: &vars,
        earlier,
        unit_dirs: &crate::unit::search_path(instance, env),
        created,
        http: endpoint.as_ref().map(|(base, tokens)| plan::Http {
            base,
            tokens: *tokens,
            dir: &token_dir,
        }),
        needs_login: &|unit: &str| needing.iter().any(|n| n == unit),
        force,
    })
    .map_err(CtlError::failure)?;
    let connected = planned.text.as_str();
    let w = CtlError::output;
    if dry_run {
        let diff = similar::TextDiff::from_lines(&text, connected);
        let shown = file.display().to_string();
        write!(out, "{}", diff.unified_diff().header(&shown, &shown)).map_err(w)?;
        return Ok(exit::OK);
    }
    mint(instance, env, &planned.tokens)?;
    // The original is the file before the first connect; a backup without
    // a record is left from a connect that did not finish.
    // Both are mcpd's private copies (the original may hold the secrets
    // `import` moved into the credstore): 0600 whatever the host file's
    // mode, and a looser one left by an earlier mcpd is tightened.
    if planned.backup {
        write_atomically(&backup, text.as_bytes(), PRIVATE).map_err(CtlError::failure)?;
    } else {
        keep_private(&backup)?;
    }
    let record_text = serde_json::to_string_pretty(&planned.record).expect("a record serializes");
    write_atomically(&record_path, record_text.as_bytes(), PRIVATE).map_err(CtlError::failure)?;
    write_atomically(&file, connected.as_bytes(), mode_of(&file)).map_err(CtlError::failure)?;
    for (entry, unit, why) in &planned.servers {
        match planned.urls.iter().find(|(e, _)| e == entry) {
            Some((_, url)) => writeln!(out, "{}: {entry} → {url} ({why})", host.name()),
            None => writeln!(
                out,
                "{}: {entry} → mcpctl bridge {unit} ({why})",
                host.name()
            ),
        }
        .map_err(w)?;
    }
    for token in &planned.tokens {
        writeln!(
            out,
            "{}: token {} made, kept in {} (0600)",
            host.name(),
            token.name,
            token.file.display()
        )
        .map_err(w)?;
    }
    let vars: Vec<&plan::Token> = planned.tokens.iter().filter(|t| t.var.is_some()).collect();
    if !vars.is_empty() {
        writeln!(
            out,
            "{} reads the token from its environment only: add to the environment it starts in (e.g. ~/.profile, then log in again):",
            host.name()
        )
        .map_err(w)?;
        for token in vars {
            writeln!(
                out,
                "  export {}=\"$(cat '{}')\"",
                token.var.as_deref().unwrap_or_default(),
                token.file.display().to_string().replace('\'', "'\\''")
            )
            .map_err(w)?;
        }
    }
    for line in &planned.left {
        writeln!(out, "{line}").map_err(w)?;
    }
    if let Some(dir) = &hidden {
        writeln!(
            out,
            "mcpd's runtime directory {} is not where a host's default environment finds it: each entry sets MCPD_RUNTIME_DIR.",
            dir.display()
        )
        .map_err(w)?;
    }
    writeln!(
        out,
        "Backup: {} (`mcpctl disconnect {}` restores it). Restart {} to use mcpd.",
        backup.display(),
        host.name(),
        host.name()
    )
    .map_err(w)?;
    Ok(exit::OK)
}

/// The instance that is not `instance`.
fn other_instance(instance: Instance) -> Instance {
    match instance {
        Instance::System => Instance::User,
        Instance::User => Instance::System,
    }
}

/// The units of `instance`, as its daemon would find them.
/// The units that need a login (DESIGN §17): those with `oauth` and a
/// person's grant that the daemon has no login for, by its `Auth`
/// property; a unit it has not loaded, or with no daemon reachable, by
/// the daemon's token file (`STATE/oauth/NAME.json`, written when a login
/// completes, removed on logout or `invalid_grant`).
fn needing_login(
    instance: Instance,
    env: &dyn Fn(&str) -> Option<OsString>,
    units: &[pair::Unit],
) -> Vec<String> {
    let context = instance.load_context();
    let oauth: Vec<&str> = units
        .iter()
        .filter(|u| {
            let Ok(spec) = crate::unit::load_in(&crate::unit::UnitFiles::beside(&u.path), &context)
            else {
                return false;
            };
            matches!(spec.transport(), crate::unit::Transport::Http(http)
                if http.oauth().is_some_and(|o| o.grant != crate::unit::Grant::ClientCredentials))
        })
        .map(|u| u.name.as_str())
        .collect();
    if oauth.is_empty() {
        return Vec::new();
    }
    // What the daemon says, when it is there (bounded: an unresponsive
    // daemon is the token file's case).
    let said: Vec<Option<String>> = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()
        .and_then(|runtime| {
            runtime.block_on(async {
                let ask = async {
                    let client = crate::dbus::Client::connect(instance).await.ok()?;
                    let mut said = Vec::new();
                    for name in &oauth {
                        let auth = match client.server(name).await {
                            Ok(server) => server.auth().await.ok(),
                            Err(_) => None,
                        };
                        said.push(auth);
                    }
                    Some(said)
                };
                tokio::time::timeout(std::time::Duration::from_secs(10), ask)
                    .await
                    .ok()
                    .flatten()
            })
        })
        .unwrap_or_else(|| vec![None; oauth.len()]);
    let logins = crate::supervisor::oauth::dir(&crate::unit::instance::state_dir(instance, env));
    oauth
        .iter()
        .zip(said)
        .filter(|(name, auth)| match auth {
            Some(auth) if !auth.is_empty() => auth.starts_with("needs login"),
            _ => !logins.join(format!("{name}.json")).is_file(),
        })
        .map(|(name, _)| (*name).to_owned())
        .collect()
}

fn units_of(instance: Instance, env: &dyn Fn(&str) -> Option<OsString>) -> Vec<pair::Unit> {
    let (found, _) = crate::unit::discover(&crate::unit::search_path(instance, env));
    found
        .into_iter()
        .filter(|f| !f.masked)
        .filter_map(|f| {
            let text = std::fs::read_to_string(&f.files.main).ok()?;
            let env = std::fs::read_to_string(f.files.main.with_extension("env")).ok();
            Some(pair::Unit {
                name: f.name,
                path: f.files.main,
                text,
                env,
            })
        })
        .collect()
}

/// `mcpctl disconnect HOST`: puts back what `connect` changed, leaving
/// the host's own changes since; `force`: the backup, whole.
pub fn disconnect(
    instance: Instance,
    host: &str,
    force: bool,
    env: &dyn Fn(&str) -> Option<OsString>,
    out: &mut dyn Write,
) -> Result<u8, CtlError> {
    let host = Host::by_name(host).ok_or_else(|| unknown_host(host))?;
    let dirs = dirs(env)?;
    let file = user_file(host, &dirs);
    let record_path = beside(&file, ".mcpd-connect.json");
    let backup = beside(&file, ".mcpd-backup");
    let (Ok(original), Ok(record)) = (
        std::fs::read_to_string(&backup),
        std::fs::read_to_string(&record_path),
    ) else {
        return Err(CtlError::failure(format!(
            "{} is not connected to mcpd: there is no {}",
            host.name(),
            backup.display()
        )));
    };
    let record: Record = serde_json::from_str(&record)
        .map_err(|e| CtlError::failure(format!("{}: {e}", record_path.display())))?;
    let current = std::fs::read_to_string(&file)
        .map_err(|e| CtlError::failure(format!("{}: {e}", file.display())))?;
    let bridge = |unit: &str| bridge_line(instance, unit);
    let w = CtlError::output;
    let (restored, undone) = if force {
        (original, Vec::new())
    } else {
        connect::disconnect(host, &current, &original, &record, &bridge).map_err(|c| {
            CtlError::failure(format!(
                "{}: {}; `mcpctl disconnect --force {}` puts back the original, {}, whole",
                file.display(),
                c.0,
                host.name(),
                backup.display()
            ))
        })?
    };
    let removed = record.created && restored.is_empty();
    if removed {
        // There was no file: there is none again.
        std::fs::remove_file(&file)
            .map_err(|e| CtlError::failure(format!("{}: {e}", file.display())))?;
    } else {
        write_atomically(&file, restored.as_bytes(), mode_of(&file)).map_err(CtlError::failure)?;
    }
    let revoked = revoke(instance, env, &record.tokens)?;
    let _ = std::fs::remove_file(&record_path);
    let _ = std::fs::remove_file(&backup);
    let how = if removed {
        "removed (mcpctl connect made it)"
    } else if force {
        "restored whole from the backup"
    } else if current == record.connected {
        "restored byte for byte"
    } else {
        "its entries put back; other changes kept"
    };
    writeln!(out, "{}: {} {how}.", host.name(), file.display()).map_err(w)?;
    for name in revoked {
        writeln!(out, "{}: token {name} revoked", host.name()).map_err(w)?;
    }
    for ((entry, unit), undo) in record.servers.iter().zip(&undone) {
        let what = match undo {
            Undo::Restored => continue,
            Undo::Removed => "removed since `mcpctl connect`: left removed",
            Undo::Changed => "changed since `mcpctl connect`: left as it is",
            Undo::Merged => {
                "edited since `mcpctl connect`: what it replaced is put back, the edits kept"
            }
        };
        writeln!(
            out,
            "{}: {entry} (mcpctl bridge {unit}) was {what}",
            host.name()
        )
        .map_err(w)?;
    }
    Ok(exit::OK)
}

/// The host's user-level file, through symlinks (a dotfile manager's link
/// stays a link: the file it points to is what is edited).
fn user_file(host: Host, dirs: &Dirs) -> PathBuf {
    let file = host.files(dirs).into_iter().next().expect("a user file");
    std::fs::canonicalize(&file).unwrap_or(file)
}

/// The mode of the files `connect` keeps for itself beside a host's file.
const PRIVATE: u32 = 0o600;

/// Makes `path`, if it exists and others may read it, readable by its
/// owner alone.
fn keep_private(path: &Path) -> Result<(), CtlError> {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    if meta.permissions().mode() & 0o077 == 0 {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(PRIVATE))
        .map_err(|e| CtlError::failure(format!("cannot make {} private: {e}", path.display())))
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).map_or(0o600, |m| m.permissions().mode() & 0o7777)
}

fn unknown_host(name: &str) -> CtlError {
    let known: Vec<&str> = Host::ALL.iter().map(|h| h.name()).collect();
    CtlError::failure(format!(
        "unknown host \"{name}\": expected one of {}",
        known.join(", ")
    ))
}
