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

use crate::mux::aggregate::{Candidate, SEPARATOR, prefix_collisions};
use crate::unit::{self, Context, Style, UnitFiles};

use super::exit;

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
        } else {
            checker.check(&UnitFiles::beside(path), err, &mut summary)?;
        }
    }
    // Units hosts may reach in one aggregate (`@all`, DESIGN §14) must
    // not share a prefix: both files are named.
    let loaded = checker.loaded.into_inner();
    let candidates: Vec<Candidate<'_>> = loaded
        .iter()
        .map(|(name, _, alias, groups)| Candidate {
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
    if summary.valid + summary.invalid + summary.errors == 0 {
        writeln!(err, "mcpctl: no unit files (*.kdl) found")?;
    } else if summary.invalid > 0 {
        let total = summary.valid + summary.invalid;
        writeln!(err, "mcpctl: {} of {total} units invalid", summary.invalid)?;
    }
    Ok(summary)
}

struct Checker<'a> {
    context: &'a Context,
    style: Style,
    /// Each valid unit's name, main file, `alias` and groups.
    loaded: std::cell::RefCell<Vec<Loaded>>,
}

/// A valid unit's name, main file, `alias` and groups.
type Loaded = (String, PathBuf, Option<String>, Vec<String>);

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
                self.loaded.borrow_mut().push((
                    name,
                    files.main.clone(),
                    spec.alias().map(str::to_owned),
                    spec.groups().to_vec(),
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
