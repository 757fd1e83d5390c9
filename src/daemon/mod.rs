//! The daemon: one supervisor per valid unit, hot reload, systemd
//! integration, clean shutdown.
//!
//! [`run`] takes the instance lock, loads every unit through the same
//! loader as `mcpctl verify` (see [`registry`]), tells systemd it is ready,
//! then waits on its control channel (reload, shutdown: the binary maps
//! SIGHUP, SIGTERM and SIGINT onto it), the unit directories' watcher
//! (debounced), status changes (for `STATUS=`) and the watchdog timer.
//!
//! Reading order: [`registry`] (units and reload by diff), [`attach`] (the
//! attach socket for host sessions), [`watch`],
//! [`sdnotify`], [`lock`], [`fdlimit`], [`logging`].
//!
//! The settings file (`mcpd.kdl`) is read at start (one that does not load
//! stops the start) and at every reload (a broken one keeps the last good
//! settings, with a warning naming each problem); its directory is watched
//! beside the unit directories. Directory events are debounced: the reload
//! comes `DEBOUNCE` after the last event, at most `MAX_DEBOUNCE` after the
//! first.

pub mod activation;
pub mod attach;
mod config;
pub mod fdlimit;
pub mod lock;
pub mod logging;
mod memory;
pub mod registry;
pub mod sdnotify;
pub mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::unit;

pub use config::Config;
pub use registry::Registry;

use crate::model::{Change, Control};

/// How long a burst of file events is collected before one reload.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// A continuous stream of events still reloads this often.
pub const MAX_DEBOUNCE: Duration = Duration::from_secs(1);

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error("cannot watch the unit directories: {0}")]
    Watch(#[from] notify::Error),
    #[error(transparent)]
    Dbus(#[from] crate::dbus::StartError),
    #[error("{0}")]
    Settings(crate::unit::LoadError),
    #[error("HTTP endpoint: {0}")]
    Http(String),
    #[error("cannot create the attach socket {}: {source}", path.display())]
    Attach {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A task that ends when this is dropped.
struct Aborts(tokio::task::JoinHandle<()>);

impl Drop for Aborts {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the daemon until [`Control::Shutdown`] (or the channel closes).
/// `controller` is a sender of the same channel, given to D-Bus for
/// `Reload`.
pub async fn run(
    config: Config,
    controller: mpsc::UnboundedSender<Control>,
    mut control: mpsc::UnboundedReceiver<Control>,
) -> Result<(), RunError> {
    let lock = lock::InstanceLock::acquire(config.instance, &config.runtime_dir)?;
    let settings_file = (config.settings.clone(), config.settings_given);
    let tokens_file = crate::tokens::path(&config.state_dir);
    let state_dir = config.state_dir.clone();
    let mut settings = read_settings(&settings_file).map_err(RunError::Settings)?;
    log_settings(&settings_file, &settings);
    crate::telemetry::apply(settings.telemetry.clone());
    memory::give_large_buffers_back();
    let hand_back = tokio::spawn(memory::hand_back());
    // Ends with `run`, whichever way it returns.
    let _hand_back = Aborts(hand_back);
    let dirs: Vec<String> = config
        .unit_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    tracing::info!(
        target: "mcpd::daemon",
        "mcpd {} starting: {} instance, units from {}",
        env!("CARGO_PKG_VERSION"),
        config.instance.as_str(),
        dirs.join(":")
    );
    tracing::debug!(target: "mcpd::daemon", "holding {}", lock.path().display());
    let child_nofile = match fdlimit::raise() {
        Ok(Some(raised)) => {
            tracing::debug!(
                target: "mcpd::daemon",
                "file descriptor limit raised from {} to {}; servers start with {}",
                fdlimit::show(raised.inherited.current),
                fdlimit::show(raised.now.current),
                fdlimit::show(raised.inherited.current),
            );
            Some(raised.inherited)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(target: "mcpd::daemon", "cannot raise the file descriptor limit: {e}");
            None
        }
    };

    let (events_tx, mut events) = mpsc::unbounded_channel();
    let mut watcher = watch::DirWatcher::new(events_tx)?;
    let runtime_dir = config.runtime_dir.clone();
    let no_bus = config.no_bus;
    let shared = Arc::new(crate::model::Shared::new(
        config.instance,
        config.unit_dirs.clone(),
        controller,
    ));
    let mut host = crate::supervisor::process::Host::current(config.instance, child_nofile);
    host.cgroups = contain(config.instance, &runtime_dir).await;
    host.scratch = scratch(&runtime_dir);
    let scratch_dir = host.scratch.clone();
    host.credentials = crate::supervisor::credentials::Stores::new(
        config.instance,
        host.euid,
        crate::supervisor::credentials::prepare(&runtime_dir),
    );
    let credentials_dir = host.credentials.root.clone();
    host.logins = crate::supervisor::oauth::dir(&config.state_dir);
    host.client_metadata_url = settings
        .oauth
        .as_ref()
        .map(|o| o.client_metadata_url.clone());
    let cgroups = host.cgroups.clone();
    let mut registry = Registry::new(config, host);
    let diff = registry.reload().await;
    publish(&shared, &registry);
    let bus = crate::dbus::Service::start(Arc::clone(&shared), &runtime_dir, no_bus).await?;
    let attach = attach::start(&shared, &runtime_dir).map_err(|source| RunError::Attach {
        path: crate::mux::attach::socket(&runtime_dir),
        source,
    })?;
    // Where this daemon's sockets are, for a bridge that looked elsewhere
    // (a host entry without MCPD_RUNTIME_DIR) to name.
    let breadcrumb = runtime_breadcrumb(&state_dir, &runtime_dir);
    // Sockets of `mcpd-http.socket` serve the endpoint even without an
    // `http` section (with its defaults).
    let activated = activation::http_listeners();
    let http = settings
        .http
        .clone()
        .or_else(|| (!activated.is_empty()).then(Default::default));
    let mut endpoint = match http {
        Some(http) => Some(
            crate::endpoint::Endpoint::start(&shared, http, tokens_file.clone(), activated)
                .await
                .map_err(RunError::Http)?,
        ),
        None => None,
    };
    watcher.set(&watch_paths(&registry, &settings_file, &tokens_file));
    if registry.entries().is_empty() {
        tracing::warn!(target: "mcpd::daemon", "no units found in {}", dirs.join(":"));
    }
    let invalid = diff
        .0
        .iter()
        .filter(|(_, c)| matches!(c, Change::Invalid(_)))
        .count();
    tracing::info!(
        target: "mcpd::daemon",
        "started {} ({invalid} invalid)",
        count(registry.entries().len() - invalid, "unit")
    );
    let mut status = registry.summary();
    sdnotify::ready(&status);

    let changed = registry.changed();
    let watchdog = sdnotify::watchdog_interval();
    let mut watchdog_at = watchdog.map(|every| tokio::time::Instant::now() + every);
    // First and latest event of a burst not yet reloaded.
    let mut burst: Option<(tokio::time::Instant, tokio::time::Instant)> = None;

    loop {
        let reload_at = burst.map(|(first, last)| (last + DEBOUNCE).min(first + MAX_DEBOUNCE));
        let mut reply = None;
        let reload = tokio::select! {
            command = control.recv() => match command {
                Some(Control::Reload { reply: r }) => {
                    reply = r;
                    true
                }
                Some(Control::Shutdown) | None => break,
            },
            Some(()) = events.recv() => {
                let now = tokio::time::Instant::now();
                burst = Some(burst.map_or((now, now), |(first, _)| (first, now)));
                false
            }
            () = sleep_until(reload_at) => true,
            () = changed.notified() => {
                let now = registry.summary();
                if now != status {
                    status = now;
                    sdnotify::status(&status);
                }
                false
            }
            () = sleep_until(watchdog_at) => {
                sdnotify::watchdog();
                watchdog_at = watchdog.map(|every| tokio::time::Instant::now() + every);
                false
            }
        };
        if reload {
            burst = None;
            sdnotify::reloading();
            let diff = registry.reload().await;
            publish(&shared, &registry);
            bus.hub.apply(&diff).await;
            let file = settings_file.clone();
            match tokio::task::spawn_blocking(move || read_settings(&file)).await {
                Ok(Ok(new)) => {
                    if new != settings {
                        settings = new;
                        log_settings(&settings_file, &settings);
                        apply_http(&shared, &mut endpoint, settings.http.clone(), &tokens_file)
                            .await;
                        crate::telemetry::apply(settings.telemetry.clone());
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(target: "mcpd::daemon", "keeping the last good settings: {}", e.to_string().replace('\n', "; "));
                }
                Err(e) => {
                    tracing::warn!(target: "mcpd::daemon", "cannot read the settings file: {e}")
                }
            }
            if let Some(serving) = &endpoint {
                serving.reload_tokens();
            }
            watcher.set(&watch_paths(&registry, &settings_file, &tokens_file));
            status = registry.summary();
            sdnotify::ready(&status);
            tracing::info!(target: "mcpd::daemon", "reloaded: {diff}");
            if let Some(reply) = reply {
                let _ = reply.send(diff);
            }
        }
    }

    sdnotify::stopping();
    tracing::info!(target: "mcpd::daemon", "stopping {}", count(registry.entries().len(), "unit"));
    // No new host sessions on a daemon that is stopping.
    drop(attach);
    if let Some(serving) = endpoint {
        serving.stop().await;
    }
    registry.shutdown().await;
    drop(bus);
    if let Some(cgroups) = cgroups {
        // Every server's cgroup went with its last process.
        cgroups.remove();
    }
    // Emptied by the servers' ends, as their cgroups.
    let _ = std::fs::remove_dir(&scratch_dir);
    crate::supervisor::credentials::close(&credentials_dir);
    crate::supervisor::accounting::flush_log();
    crate::telemetry::apply(None);
    if let Some(path) = breadcrumb
        && std::fs::read(&path).is_ok_and(|b| b == runtime_dir.as_os_str().as_encoded_bytes())
    {
        let _ = std::fs::remove_file(&path);
    }
    tracing::info!(target: "mcpd::daemon", "stopped");
    drop(lock);
    Ok(())
}

/// Starts, changes or stops the HTTP endpoint for a reload's settings.
async fn apply_http(
    shared: &Arc<crate::model::Shared>,
    endpoint: &mut Option<crate::endpoint::Endpoint>,
    http: Option<unit::settings::HttpSettings>,
    tokens_file: &std::path::Path,
) {
    match (endpoint.as_mut(), http) {
        (Some(serving), Some(http)) => serving.apply(http).await,
        // The service manager's sockets stay served, with the defaults.
        (Some(serving), None) if serving.activated() => serving.apply(Default::default()).await,
        (None, Some(http)) => {
            match crate::endpoint::Endpoint::start(shared, http, tokens_file.to_owned(), Vec::new())
                .await
            {
                Ok(started) => *endpoint = Some(started),
                Err(why) => tracing::warn!(target: "mcpd::daemon", "no HTTP endpoint: {why}"),
            }
        }
        (Some(_), None) => {
            if let Some(serving) = endpoint.take() {
                serving.stop().await;
            }
            tracing::info!(target: "mcpd::daemon", "HTTP endpoint stopped: the settings have no `http` section");
        }
        (None, None) => {}
    }
}

/// The settings file (`mcpd.kdl`): the path, and whether it must exist.
type SettingsFile = (Option<PathBuf>, bool);

/// What the settings file says now: no file at the default path is the
/// defaults (no HTTP endpoint).
fn read_settings(
    (path, required): &SettingsFile,
) -> Result<unit::settings::Settings, crate::unit::LoadError> {
    match path {
        None => Ok(unit::settings::Settings::default()),
        Some(path) => Ok(unit::settings::read(path, *required)?.unwrap_or_default()),
    }
}

fn log_settings((path, _): &SettingsFile, settings: &unit::settings::Settings) {
    let from = path.as_ref().map_or_else(
        || "no settings file".to_owned(),
        |p| p.display().to_string(),
    );
    match &settings.http {
        None => tracing::info!(target: "mcpd::daemon", "settings from {from}: no HTTP endpoint"),
        Some(http) => {
            let listen: Vec<String> = http.listen.iter().map(ToString::to_string).collect();
            tracing::info!(
                target: "mcpd::daemon",
                "settings from {from}: HTTP endpoint on {}, auth {}, at most {} sessions",
                listen.join(" "),
                http.auth.as_str(),
                http.max_sessions
            );
        }
    }
}

/// The unit directories, and the directories of the settings file and
/// the HTTP tokens when they exist (their events reload as a unit file's
/// do).
fn watch_paths(
    registry: &Registry,
    (path, _): &SettingsFile,
    tokens: &std::path::Path,
) -> Vec<PathBuf> {
    let mut paths = registry.watch_paths();
    for file in [path.as_deref(), Some(tokens)].into_iter().flatten() {
        if let Some(dir) = file.parent()
            && dir.is_dir()
        {
            paths.push(dir.to_owned());
        }
    }
    paths
}

/// Hands the registry's read model to D-Bus.
fn publish(shared: &crate::model::Shared, registry: &Registry) {
    let units = registry.snapshot();
    let candidates: Vec<_> = units
        .iter()
        .map(|(name, v)| crate::mux::aggregate::Candidate {
            unit: name,
            alias: v.alias.as_deref(),
            groups: &v.groups,
        })
        .collect();
    for (prefix, a, b) in crate::mux::aggregate::prefix_collisions(&candidates) {
        tracing::warn!(target: "mcpd::daemon", "units {a} and {b} share the prefix {prefix} in aggregates: {a} is served, {b} is left out of them");
    }
    drop(candidates);
    shared.publish(units);
}

/// The file in the state directory that names the runtime directory of
/// the running daemon ([`crate::unit::instance::RUNTIME_BREADCRUMB`]),
/// written once its sockets are bound; none if it cannot be written.
fn runtime_breadcrumb(
    state_dir: &std::path::Path,
    runtime_dir: &std::path::Path,
) -> Option<std::path::PathBuf> {
    let path = state_dir.join(crate::unit::instance::RUNTIME_BREADCRUMB);
    let written = std::fs::create_dir_all(state_dir)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            crate::files::write_atomically(&path, runtime_dir.as_os_str().as_encoded_bytes(), 0o600)
        });
    match written {
        Ok(()) => Some(path),
        Err(e) => {
            tracing::debug!(target: "mcpd::daemon", "cannot note the runtime directory: {e}");
            None
        }
    }
}

/// "1 unit", "2 units".
fn count(n: usize, noun: &str) -> String {
    crate::words::count(n as u64, noun)
}

/// The directory sandboxed servers' private temp directories go in
/// (`RUNTIME/tmp`), emptied of what an earlier daemon left there. Mode 0711:
/// a server running as another user reaches its own directory (0700) and
/// cannot list the others.
fn scratch(runtime_dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let dir = runtime_dir.join("tmp");
    if dir.exists() {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(target: "mcpd::daemon", "removed the servers' temp directories an earlier daemon left in {}", dir.display())
            }
            Err(e) => tracing::warn!(target: "mcpd::daemon", "cannot empty {}: {e}", dir.display()),
        }
    }
    let made = std::fs::DirBuilder::new().mode(0o711).create(&dir);
    if let Err(e) = made.and_then(|()| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
    }) {
        tracing::warn!(target: "mcpd::daemon", "cannot create {}: {e}; sandboxed servers cannot start", dir.display());
    }
    dir
}

/// Sets up the servers' cgroups (DESIGN §10) and kills what an earlier
/// daemon of this instance and runtime directory left in them; without a
/// usable cgroup v2 hierarchy, says once that servers are contained by
/// process groups only.
async fn contain(
    instance: crate::unit::Instance,
    runtime_dir: &std::path::Path,
) -> Option<crate::supervisor::cgroup::Cgroups> {
    match crate::supervisor::cgroup::Cgroups::setup(instance, runtime_dir) {
        Ok(cgroups) => {
            for (server, n) in cgroups.recover().await {
                let processes = if n == 1 { "process" } else { "processes" };
                tracing::warn!(target: "mcpd::daemon", mcpd_server = %server, "killed {n} leftover {processes} of server {server}");
            }
            tracing::info!(target: "mcpd::daemon", "servers run in cgroups under {}", cgroups.dir().display());
            Some(cgroups)
        }
        Err(why) => {
            tracing::warn!(target: "mcpd::daemon", "servers are contained by process groups only, not cgroups: {why}");
            None
        }
    }
}
