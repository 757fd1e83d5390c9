//! How the daemon was asked to run ([`Config`]): read by the daemon's
//! `run` and by its registry alike, so a leaf of `daemon/`.

use std::path::PathBuf;

use crate::unit::{self, Instance};

/// How the daemon was asked to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub instance: Instance,
    /// The unit search path, highest priority first.
    pub unit_dirs: Vec<PathBuf>,
    /// Where the lock and the private D-Bus socket live.
    pub runtime_dir: PathBuf,
    /// Where on-demand units keep their caches (`cache/`).
    pub state_dir: PathBuf,
    /// Serve D-Bus only on the private socket, not on the bus.
    pub no_bus: bool,
    /// The settings file (`mcpd.kdl`, DESIGN §15): the instance's default
    /// path, or `--config`'s.
    pub settings: Option<PathBuf>,
    /// Whether the settings file was named (`--config`): then it must
    /// exist; the default path may be absent (no endpoint).
    pub settings_given: bool,
}

impl Config {
    /// `instance` if given, else system for root and user for everyone else;
    /// `units` (from `--units`) replaces the instance's search path.
    pub fn new(instance: Option<Instance>, units: Vec<PathBuf>) -> Self {
        let instance = instance.unwrap_or_else(Instance::by_default);
        let unit_dirs = if units.is_empty() {
            unit::search_path(instance, |var| std::env::var_os(var))
        } else {
            units
        };
        Self {
            instance,
            unit_dirs,
            runtime_dir: instance.runtime_dir(),
            state_dir: instance.state_dir(),
            no_bus: false,
            settings: unit::settings::default_path(instance, |var| std::env::var_os(var)),
            settings_given: false,
        }
    }
}
