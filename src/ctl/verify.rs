//! `mcpctl verify PATH…`: the daemon's loader, run offline.
//!
//! A file is loaded with the drop-ins beside it (`FILE.d/*.kdl`); a directory
//! is loaded as a unit directory, and its subdirectories (other than drop-in
//! directories) are verified too. With an instance in the [`Context`]
//! (`mcpctl --user verify`, `--system`), that instance's rules apply as
//! well, as the daemon applies them; without one, only what holds for both. Diagnostics go to the given writer (stderr
//! in the binary); the result is an exit code: 0 when every unit is valid.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::mux::aggregate::{Candidate, LONG_NAME, SEPARATOR, prefix_collisions, prefixed};
use crate::unit::{self, Context, Style, UnitFiles};

use super::exit;

/// A file of this name is the daemon's settings file (`mcpd.kdl`, DESIGN
/// §15, §18), not a unit.
pub const SETTINGS_FILE: &str = "mcpd.kdl";

/// What one `verify` run found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub valid: usize,
    pub invalid: usize,
    /// Paths that could not be verified at all (missing, unreadable).
    pub errors: usize,
}

impl Summary {
    pub fn exit_code(&self) -> u8 {
        if self.invalid == 0 && self.errors == 0 && self.valid > 0 {
            exit::OK
        } else {
            exit::FAILURE
        }
    }
}

/// Verifies `paths`, writing diagnostics to `err`.
pub fn run(
    paths: &[PathBuf],
    context: &Context,
    style: Style,
    err: &mut dyn Write,
) -> std::io::Result<Summary> {
    let checker = Checker {
        context,
        style,
        loaded: std::cell::RefCell::new(Vec::new()),
    };
    let mut summary = Summary::default();
    for path in paths {
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) => {
                writeln!(err, "mcpctl: {}: {e}", path.display())?;
                summary.errors += 1;
                continue;
            }
        };
        if meta.is_dir() {
            checker.dir(path, err, &mut summary)?;
        } else if path.file_name().is_some_and(|n| n == SETTINGS_FILE) {
            // The daemon's own settings, judged as the daemon reads them.
            match unit::settings::read(path, true) {
                Ok(_) => summary.valid += 1,
                Err(e) => {
                    summary.invalid += 1;
                    err.write_all(e.render(style).as_bytes())?;
                }
            }
        } else {
            checker.check(&UnitFiles::beside(path), err, &mut summary)?;
        }
    }
    // Units hosts may reach in one aggregate (`@all`, DESIGN §14) must
    // not share a prefix: both files are named.
    let loaded = checker.loaded.into_inner();
    let candidates: Vec<Candidate<'_>> = loaded
        .iter()
        .map(|(name, _, alias, groups, _)| Candidate {
            unit: name,
            alias: alias.as_deref(),
            groups,
        })
        .collect();
    for (prefix, a, b) in prefix_collisions(&candidates) {
        let file = |unit: &str| {
            loaded
                .iter()
                .find(|(name, ..)| name == unit)
                .map(|(_, path, ..)| path.display().to_string())
                .unwrap_or_default()
        };
        writeln!(
            err,
            "mcpctl: {} and {}: both units' tools and prompts would be named `{prefix}{SEPARATOR}…` in an aggregate (`alias` must differ from every other unit's name and alias)",
            file(&a),
            file(&b)
        )?;
        summary.invalid += 1;
        summary.valid = summary.valid.saturating_sub(1);
    }
    // Every unit may be in an aggregate (`@all`): names over LONG_NAME are
    // warned about (some hosts refuse them) and still valid.
    for (name, path, alias, _, cached) in &loaded {
        let prefix = alias.as_deref().unwrap_or(name);
        let room = LONG_NAME.saturating_sub(prefix.chars().count() + SEPARATOR.len());
        if room == 0 {
            writeln!(
                err,
                "mcpctl: warning: {}: in an aggregate every tool and prompt name of unit {name} is over {LONG_NAME} characters (`{prefix}{SEPARATOR}…`), more than some hosts take: give it a shorter `alias`",
                path.display()
            )?;
            continue;
        }
        let long: Vec<String> = cached
            .iter()
            .filter(|n| n.chars().count() > room)
            .map(|n| prefixed(prefix, n))
            .collect();
        if let Some(first) = long.first() {
            let more = match long.len() {
                1 => String::new(),
                n => format!(" and {} more", n - 1),
            };
            writeln!(
                err,
                "mcpctl: warning: {}: in an aggregate {first}{more} would be over {LONG_NAME} characters (as unit {name} last listed them), more than some hosts take: give it a shorter `alias`",
                path.display()
            )?;
        }
    }
    if summary.valid + summary.invalid + summary.errors == 0 {
        writeln!(err, "mcpctl: no unit files (*.kdl) found")?;
    } else if summary.invalid > 0 {
        let total = summary.valid + summary.invalid;
        writeln!(
            err,
            "mcpctl: {} of {} invalid",
            summary.invalid,
            crate::words::count(total as u64, "unit")
        )?;
    }
    Ok(summary)
}

struct Checker<'a> {
    context: &'a Context,
    style: Style,
    /// Each valid unit's name, main file, `alias`, groups and cached names.
    loaded: std::cell::RefCell<Vec<Loaded>>,
}

/// A valid unit's name, main file, `alias`, groups, and the tool and
/// prompt names its on-demand cache (DESIGN §9) holds in the instance's
/// state directory (none without an instance or a cache).
type Loaded = (String, PathBuf, Option<String>, Vec<String>, Vec<String>);

/// The tool and prompt names unit `name`'s cache records, when
/// `instance`'s state directory holds one for this transport; an
/// unreadable cache is not verify's business (the daemon warns of it).
fn cached_names(
    instance: Option<unit::Instance>,
    name: &str,
    spec: &unit::UnitSpec,
) -> Vec<String> {
    use crate::mux::lists::List;
    use crate::supervisor::cache::CacheFile;
    let Some(instance) = instance else {
        return Vec::new();
    };
    let file = CacheFile::new(&instance.state_dir().join("cache"), name, spec);
    let Ok(Some(restored)) = file.load() else {
        return Vec::new();
    };
    let mut names: Vec<String> = restored.cached.tools.names().map(str::to_owned).collect();
    let prompts = restored.lists[List::Prompts.index()]
        .as_deref()
        .and_then(|text| serde_json::from_str::<Vec<serde_json::Value>>(text).ok())
        .unwrap_or_default();
    names.extend(
        prompts
            .iter()
            .filter_map(|p| p["name"].as_str().map(str::to_owned)),
    );
    names
}

impl Checker<'_> {
    fn dir(&self, dir: &Path, err: &mut dyn Write, summary: &mut Summary) -> std::io::Result<()> {
        let (found, dir_errors) = unit::discover(&[dir.to_owned()]);
        for e in dir_errors {
            writeln!(err, "mcpctl: {e}")?;
            summary.errors += 1;
        }
        for unit in found.iter().filter(|u| !u.masked) {
            self.check(&unit.files, err, summary)?;
        }
        let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir() && !p.to_string_lossy().ends_with(".kdl.d"))
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        subdirs.sort();
        for sub in subdirs {
            self.dir(&sub, err, summary)?;
        }
        Ok(())
    }

    fn check(
        &self,
        files: &UnitFiles,
        err: &mut dyn Write,
        summary: &mut Summary,
    ) -> std::io::Result<()> {
        match unit::load_in(files, self.context) {
            Ok(spec) => {
                summary.valid += 1;
                let name = files
                    .main
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let cached = cached_names(self.context.instance, &name, &spec);
                self.loaded.borrow_mut().push((
                    name,
                    files.main.clone(),
                    spec.alias().map(str::to_owned),
                    spec.groups().to_vec(),
                    cached,
                ));
            }
            Err(e) => {
                summary.invalid += 1;
                err.write_all(e.render(self.style).as_bytes())?;
            }
        }
        Ok(())
    }
}
