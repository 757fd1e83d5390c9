//! The unit search path and discovery of units and their drop-ins (a
//! unit's [`UnitFiles`]).
//!
//! Earlier directories win over later ones for a unit of the same name
//! (systemd order, DESIGN §2). Drop-ins `NAME.kdl.d/*.kdl` are collected from
//! every directory of the path: a drop-in file name in an earlier directory
//! hides the same name in a later one, and the survivors apply in lexical
//! order of their file names. A unit file or drop-in that is a symlink to
//! `/dev/null` is masked: it hides every lower-priority file of that name
//! and loads nothing.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::instance::Instance;

/// The unit directories of an instance, highest priority first. `env` looks
/// up environment variables (so tests need not change the process's own).
pub fn search_path(instance: Instance, env: impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    match instance {
        Instance::System => vec![
            PathBuf::from("/etc/mcpd/units"),
            PathBuf::from("/run/mcpd/units"),
            PathBuf::from("/usr/lib/mcpd/units"),
        ],
        Instance::User => {
            let absolute = |var: &str| env(var).map(PathBuf::from).filter(|p| p.is_absolute());
            let home = absolute("HOME");
            let config =
                absolute("XDG_CONFIG_HOME").or_else(|| home.as_ref().map(|h| h.join(".config")));
            let runtime = absolute("XDG_RUNTIME_DIR");
            let data =
                absolute("XDG_DATA_HOME").or_else(|| home.as_ref().map(|h| h.join(".local/share")));
            [config, runtime, data]
                .into_iter()
                .flatten()
                .map(|base| base.join("mcpd/units"))
                .collect()
        }
    }
}

/// The files that make up one unit: its main file, then drop-ins in the
/// order they apply.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnitFiles {
    pub main: PathBuf,
    pub dropins: Vec<PathBuf>,
}

impl UnitFiles {
    /// A unit file and the drop-ins found next to it in `FILE.d/*.kdl`.
    pub fn beside(main: &Path) -> Self {
        let mut dir = main.as_os_str().to_owned();
        dir.push(".d");
        let mut dropins: Vec<PathBuf> = std::fs::read_dir(PathBuf::from(dir))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| is_unit_file_name(p))
            .collect();
        dropins.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        Self {
            main: main.to_owned(),
            dropins,
        }
    }

    /// The unit name: the main file's stem.
    pub fn stem(&self) -> String {
        self.main
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// A unit found on the search path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The file stem; not yet validated (an invalid name is a load error).
    pub name: String,
    pub files: UnitFiles,
    /// The winning unit file is a symlink to `/dev/null`.
    pub masked: bool,
}

/// A directory of the search path that exists but cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read unit directory {}: {message}", path.display())]
pub struct DirError {
    pub path: PathBuf,
    pub message: String,
}

/// `*.kdl`, not hidden (editors' lock and backup files start with a dot).
pub fn is_unit_file_name(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    !name.starts_with('.') && name.len() > ".kdl".len() && name.ends_with(".kdl")
}

/// Whether `path` is masked: a symlink whose target is `/dev/null`.
pub fn is_masked(path: &Path) -> bool {
    path.symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
        && std::fs::canonicalize(path).is_ok_and(|t| t == Path::new("/dev/null"))
}

/// Lists a directory's entries, sorted by name; a missing directory is empty.
fn entries(dir: &Path, errors: &mut Vec<DirError>) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(read) => {
            let mut out: Vec<PathBuf> = read.flatten().map(|e| e.path()).collect();
            out.sort();
            out
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            errors.push(DirError {
                path: dir.to_owned(),
                message: "not a directory".into(),
            });
            Vec::new()
        }
        Err(e) => {
            errors.push(DirError {
                path: dir.to_owned(),
                message: e.to_string(),
            });
            Vec::new()
        }
    }
}

/// Every unit on the search path `dirs` (highest priority first), sorted by
/// name, with the drop-ins that apply to each.
pub fn discover(dirs: &[PathBuf]) -> (Vec<Found>, Vec<DirError>) {
    let mut errors = Vec::new();
    // name → winning main file
    let mut mains: BTreeMap<String, PathBuf> = BTreeMap::new();
    // name → drop-in file name → winning drop-in path
    let mut dropins: BTreeMap<String, BTreeMap<OsString, PathBuf>> = BTreeMap::new();
    for dir in dirs {
        for path in entries(dir, &mut errors) {
            let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if let Some(unit) = file_name.strip_suffix(".kdl.d") {
                if unit.starts_with('.') || !path.is_dir() {
                    continue;
                }
                let slot = dropins.entry(unit.to_owned()).or_default();
                for dropin in entries(&path, &mut errors) {
                    if is_unit_file_name(&dropin)
                        && let Some(n) = dropin.file_name()
                    {
                        slot.entry(n.to_owned()).or_insert(dropin);
                    }
                }
            } else if is_unit_file_name(&path) && !path.is_dir() || is_masked(&path) {
                let Some(stem) = file_name.strip_suffix(".kdl") else {
                    continue;
                };
                mains.entry(stem.to_owned()).or_insert(path);
            }
        }
    }
    let found = mains
        .into_iter()
        .map(|(name, main)| {
            let masked = is_masked(&main);
            let dropins = dropins
                .remove(&name)
                .unwrap_or_default()
                .into_values()
                .filter(|p| !is_masked(p))
                .collect();
            Found {
                name,
                files: UnitFiles { main, dropins },
                masked,
            }
        })
        .collect();
    (found, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_search_path_follows_xdg() {
        let env = |var: &str| match var {
            "HOME" => Some(OsString::from("/home/u")),
            "XDG_RUNTIME_DIR" => Some(OsString::from("/run/user/1000")),
            _ => None,
        };
        assert_eq!(
            search_path(Instance::User, env),
            [
                PathBuf::from("/home/u/.config/mcpd/units"),
                PathBuf::from("/run/user/1000/mcpd/units"),
                PathBuf::from("/home/u/.local/share/mcpd/units"),
            ]
        );
        let explicit = |var: &str| match var {
            "XDG_CONFIG_HOME" => Some(OsString::from("/c")),
            "XDG_DATA_HOME" => Some(OsString::from("/d")),
            // relative values are ignored, as the XDG spec says
            "HOME" => Some(OsString::from("relative")),
            _ => None,
        };
        assert_eq!(
            search_path(Instance::User, explicit),
            [
                PathBuf::from("/c/mcpd/units"),
                PathBuf::from("/d/mcpd/units")
            ]
        );
    }

    #[test]
    fn system_search_path_is_systemd_order() {
        assert_eq!(
            search_path(Instance::System, |_| None),
            [
                PathBuf::from("/etc/mcpd/units"),
                PathBuf::from("/run/mcpd/units"),
                PathBuf::from("/usr/lib/mcpd/units"),
            ]
        );
    }

    #[test]
    fn unit_file_names() {
        assert!(is_unit_file_name(Path::new("/x/github.kdl")));
        assert!(!is_unit_file_name(Path::new("/x/.#github.kdl")));
        assert!(!is_unit_file_name(Path::new("/x/github.kdl~")));
        assert!(!is_unit_file_name(Path::new("/x/github.kdl.swp")));
        assert!(!is_unit_file_name(Path::new("/x/.kdl")));
    }
}
