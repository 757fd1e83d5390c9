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
    let checker = Checker { context, style };
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
            Ok(_) => summary.valid += 1,
            Err(e) => {
                summary.invalid += 1;
                err.write_all(e.render(self.style).as_bytes())?;
            }
        }
        Ok(())
    }
}
