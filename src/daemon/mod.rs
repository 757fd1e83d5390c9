//! The daemon: which units to run, and (in later stages) running them.
//!
//! So far the daemon resolves its instance and unit search path and loads
//! every unit through the same loader as `mcpctl verify`; supervision is
//! built on top of [`load_units`].

use std::path::PathBuf;

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

/// One unit found on the search path and what loading it gave.
#[derive(Debug)]
pub struct LoadedUnit {
    pub found: Found,
    pub spec: Result<UnitSpec, LoadError>,
}

/// Everything on the search path, loaded. Masked units are left out.
pub fn load_units(config: &Config) -> (Vec<LoadedUnit>, Vec<unit::search::DirError>) {
    let (found, errors) = unit::discover(&config.unit_dirs);
    let loaded = found
        .into_iter()
        .filter(|f| !f.masked)
        .map(|found| {
            let spec = unit::load(&found.files);
            LoadedUnit { found, spec }
        })
        .collect();
    (loaded, errors)
}
