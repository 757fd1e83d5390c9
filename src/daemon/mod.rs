//! The daemon: which units to run, one supervisor per valid unit, and a
//! clean shutdown.
//!
//! [`run`] loads every unit on the search path through the same loader as
//! `mcpctl verify`, starts a supervisor for each valid one, waits for the
//! shutdown future (the binary passes SIGINT/SIGTERM), then stops every
//! server in parallel, each within its own stop timeout.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;

use tokio::task::JoinHandle;

use crate::supervisor::process::Host;
use crate::supervisor::{LogRing, Supervisor, system_launcher};
use crate::unit::{self, Found, Instance, LoadError, UnitSpec};

/// How the daemon was asked to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub instance: Instance,
    /// The unit search path, highest priority first.
    pub unit_dirs: Vec<PathBuf>,
}

impl Config {
    /// `instance` if given, else system for root and user for everyone else;
    /// `units` (from `--units`) replaces the instance's search path.
    pub fn new(instance: Option<Instance>, units: Vec<PathBuf>) -> Self {
        let instance = instance.unwrap_or_else(default_instance);
        let unit_dirs = if units.is_empty() {
            unit::search_path(instance, |var| std::env::var_os(var))
        } else {
            units
        };
        Self {
            instance,
            unit_dirs,
        }
    }
}

/// System when running as root, else user (DESIGN §4).
pub fn default_instance() -> Instance {
    if rustix::process::geteuid().is_root() {
        Instance::System
    } else {
        Instance::User
    }
}

/// The rules of this daemon's instance for loading units.
pub fn load_context(instance: Instance) -> unit::Context {
    let uid = rustix::process::geteuid().as_raw();
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name);
    unit::Context {
        instance: Some(instance),
        own_user: Some((uid, name)),
    }
}

/// One unit found on the search path and what loading it gave.
#[derive(Debug)]
pub struct LoadedUnit {
    pub found: Found,
    pub spec: Result<UnitSpec, LoadError>,
}

/// Everything on the search path, loaded for `config`'s instance. Masked
/// units are left out.
pub fn load_units(config: &Config) -> (Vec<LoadedUnit>, Vec<unit::search::DirError>) {
    let context = load_context(config.instance);
    let (found, errors) = unit::discover(&config.unit_dirs);
    let loaded = found
        .into_iter()
        .filter(|f| !f.masked)
        .map(|found| {
            let spec = unit::load_in(&found.files, &context);
            LoadedUnit { found, spec }
        })
        .collect();
    (loaded, errors)
}

/// A running unit.
#[derive(Debug)]
struct Entry {
    supervisor: Supervisor,
    task: JoinHandle<()>,
}

/// Loads the units, supervises the valid ones until `shutdown` resolves,
/// then stops them all in parallel.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) {
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
    let (units, dir_errors) = load_units(&config);
    for e in &dir_errors {
        tracing::warn!(target: "mcpd::daemon", "{e}");
    }
    let host = Host::current(config.instance);
    let mut running: BTreeMap<String, Entry> = BTreeMap::new();
    let mut invalid = 0;
    for unit in units {
        let name = unit.found.name;
        match unit.spec {
            Ok(spec) => {
                let logs = LogRing::default();
                let launcher = system_launcher(&name, host.clone(), logs.clone());
                let (supervisor, task) = Supervisor::spawn(&name, spec, launcher, logs);
                supervisor.start();
                running.insert(name, Entry { supervisor, task });
            }
            Err(e) => {
                invalid += 1;
                tracing::error!(target: "mcpd::daemon", mcpd_server = %name, "unit {name} is invalid and was not started:\n{e}");
            }
        }
    }
    if running.is_empty() && invalid == 0 {
        tracing::warn!(target: "mcpd::daemon", "no units found in {}", dirs.join(":"));
    }
    tracing::info!(
        target: "mcpd::daemon",
        "started {} ({invalid} invalid)",
        count(running.len(), "unit")
    );

    shutdown.await;

    tracing::info!(target: "mcpd::daemon", "stopping {}", count(running.len(), "server"));
    let mut stopping = tokio::task::JoinSet::new();
    for (_, entry) in running {
        stopping.spawn(entry.supervisor.shutdown(entry.task));
    }
    while stopping.join_next().await.is_some() {}
    tracing::info!(target: "mcpd::daemon", "stopped");
}

/// "1 unit", "2 units".
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
