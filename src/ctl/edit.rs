//! `mcpctl edit NAME`: a drop-in (`NAME.kdl.d/override.kdl` in the
//! instance's own unit directory) edited in `$EDITOR` as `systemctl edit`
//! edits one, or with `--full` the unit file itself (a copy in the unit
//! directory when the unit comes from a later directory of the search
//! path). The editor gets a scratch copy, the unit as it stands shown
//! below it as comments; what comes back is loaded with the unit's other
//! files by the daemon's own loader and kept only when the unit loads: an
//! edit that would break it is refused with the diagnostic (the file it
//! would be, its line and key) and nothing is changed, so the daemon goes
//! on running the unit it has. A kept edit is followed by a reload.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::unit::{self, Instance, Style, UnitFiles, UnitName};

use super::client::CtlError;
use super::exit;
use super::import::unit_dir;

/// The drop-in `mcpctl edit` writes (systemd's `override.conf`).
pub const OVERRIDE: &str = "override.kdl";

/// Where what the editor is given ends: the rest is the unit as it stands,
/// for reference, and is not kept.
pub const MARKER: &str = "// ### Everything below this line is discarded ###";

/// `mcpctl edit [--full] NAME`.
pub fn edit(
    instance: Instance,
    name: &str,
    full: bool,
    env: &dyn Fn(&str) -> Option<OsString>,
    out: &mut dyn Write,
) -> Result<u8, CtlError> {
    let name = UnitName::new(name).map_err(|e| CtlError::failure(format!("{name}: {e}")))?;
    let name = name.as_str();
    let search = unit::search_path(instance, env);
    let units = unit_dir(instance, env)?;
    let (found, _) = unit::discover(&search);
    let Some(found) = found.into_iter().find(|f| f.name == name) else {
        return Err(CtlError {
            message: format!(
                "no unit {name} in {} (mcpctl add {name} writes one)",
                paths(&search)
            ),
            code: exit::NO_SUCH_SERVER,
        });
    };
    if found.masked {
        return Err(CtlError::failure(format!(
            "unit {name} is masked ({} is a link to /dev/null)",
            found.files.main.display()
        )));
    }
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| CtlError::failure(format!("cannot read {}: {e}", p.display())))
    };
    // The file the edit becomes, what the editor starts from, and the
    // unit's files with that one in its place.
    let (target, before, files) = if full {
        let target = units.join(format!("{name}.kdl"));
        let before = read(&found.files.main)?;
        let files = UnitFiles {
            main: target.clone(),
            dropins: found.files.dropins.clone(),
        };
        (target, before, files)
    } else {
        let target = units.join(format!("{name}.kdl.d")).join(OVERRIDE);
        let before = if target.is_file() {
            read(&target)?
        } else {
            String::new()
        };
        let mut dropins: Vec<PathBuf> = found
            .files
            .dropins
            .iter()
            .filter(|p| p.file_name() != Some(OVERRIDE.as_ref()))
            .cloned()
            .chain([target.clone()])
            .collect();
        dropins.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        let files = UnitFiles {
            main: found.files.main.clone(),
            dropins,
        };
        (target, before, files)
    };
    let shown = reference(&files, &target);

    let scratch = scratch_dir()?;
    let file_name = target.file_name().unwrap_or(OVERRIDE.as_ref());
    let draft = scratch.join(file_name);
    let result = (|| {
        std::fs::write(&draft, format!("{before}{}", shown))
            .map_err(|e| CtlError::failure(format!("cannot write {}: {e}", draft.display())))?;
        run_editor(env, &draft)?;
        let edited = read(&draft)?;
        // Trailing blank lines are not an edit.
        let kept = kept_part(&edited).trim_end();
        Ok::<_, CtlError>(if kept.is_empty() {
            String::new()
        } else {
            format!("{kept}\n")
        })
    })();
    let edited = match result {
        Ok(edited) => edited,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&scratch);
            return Err(e);
        }
    };
    if edited.trim_end() == before.trim_end() {
        let _ = std::fs::remove_dir_all(&scratch);
        writeln!(out, "{}: nothing changed", target.display()).map_err(CtlError::output)?;
        return Ok(exit::OK);
    }
    if edited.trim().is_empty() {
        let _ = std::fs::remove_dir_all(&scratch);
        if full {
            return Err(CtlError::failure(format!(
                "{}: an empty unit file is not kept (mcpctl remove {name} removes the unit)",
                target.display()
            )));
        }
        // As systemctl edit: an emptied drop-in is removed.
        if target.is_file() {
            std::fs::remove_file(&target).map_err(|e| {
                CtlError::failure(format!("cannot remove {}: {e}", target.display()))
            })?;
            if let Some(dir) = target.parent() {
                let _ = std::fs::remove_dir(dir);
            }
            writeln!(out, "removed {}", target.display()).map_err(CtlError::output)?;
            return super::add::reload(instance, out);
        }
        writeln!(out, "{}: nothing changed", target.display()).map_err(CtlError::output)?;
        return Ok(exit::OK);
    }

    let loaded = unit::load::load_with(&files, &instance.load_context(), |p| {
        if p == target {
            Ok(edited.clone().into_bytes())
        } else {
            std::fs::read(p)
        }
    });
    if let Err(e) = loaded {
        // The draft is kept so the edit is not lost.
        let draft_text = std::fs::write(&draft, &edited);
        let kept = match draft_text {
            Ok(()) => format!("; the edit is kept in {}", draft.display()),
            Err(_) => String::new(),
        };
        return Err(CtlError::failure(format!(
            "{}: the edit does not load, nothing changed{kept}:\n{}",
            target.display(),
            e.render(Style::Plain).trim_end()
        )));
    }
    let _ = std::fs::remove_dir_all(&scratch);
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| CtlError::failure(format!("cannot create {}: {e}", dir.display())))?;
    }
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&target).map_or(0o600, |m| m.permissions().mode() & 0o7777)
    };
    crate::files::write_atomically(&target, edited.as_bytes(), mode).map_err(CtlError::failure)?;
    writeln!(out, "wrote {}", target.display()).map_err(CtlError::output)?;
    super::add::reload(instance, out)
}

/// What the editor keeps: everything above [`MARKER`].
pub fn kept_part(edited: &str) -> &str {
    let mut at = 0;
    for line in edited.split_inclusive('\n') {
        if line.trim_end() == MARKER {
            return &edited[..at];
        }
        at += line.len();
    }
    edited
}

/// The marker and, as comments, every file of the unit but `target`.
fn reference(files: &UnitFiles, target: &Path) -> String {
    let mut text = format!("\n{MARKER}\n");
    for path in std::iter::once(&files.main).chain(&files.dropins) {
        if path == target {
            text.push_str(&format!("//\n// {} (this file)\n", path.display()));
            continue;
        }
        let Ok(body) = std::fs::read_to_string(path) else {
            continue;
        };
        text.push_str(&format!("//\n// {}\n", path.display()));
        for line in body.lines() {
            text.push_str(&format!("// {line}\n").replace("// \n", "//\n"));
        }
    }
    text
}

fn paths(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn scratch_dir() -> Result<PathBuf, CtlError> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("mcpctl-edit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| CtlError::failure(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

/// The editor, as systemctl and git choose one: `$VISUAL`, `$EDITOR`
/// (through `sh`, so `code --wait` works), else the first of `editor`,
/// `nano`, `vim`, `vi` on `PATH`.
fn run_editor(env: &dyn Fn(&str) -> Option<OsString>, file: &Path) -> Result<(), CtlError> {
    let chosen = ["VISUAL", "EDITOR"]
        .into_iter()
        .find_map(|var| env(var).filter(|v| !v.is_empty()));
    let mut command = match chosen {
        Some(editor) => {
            let mut c = std::process::Command::new("/bin/sh");
            c.arg("-c")
                .arg(format!("{} \"$@\"", editor.to_string_lossy()))
                .arg("editor");
            c
        }
        None => {
            let path = env("PATH").unwrap_or_default();
            let found = ["editor", "nano", "vim", "vi"].into_iter().find_map(|e| {
                std::env::split_paths(&path)
                    .map(|d| d.join(e))
                    .find(|p| p.is_file())
            });
            let Some(found) = found else {
                return Err(CtlError::failure(
                    "no editor: set EDITOR (none of editor, nano, vim, vi is on PATH)",
                ));
            };
            std::process::Command::new(found)
        }
    };
    let status = command
        .arg(file)
        .status()
        .map_err(|e| CtlError::failure(format!("cannot run the editor: {e}")))?;
    if !status.success() {
        return Err(CtlError::failure(format!(
            "the editor exited with {status}: nothing changed"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_follows_the_marker_is_not_kept() {
        let text = format!("description \"x\"\n\n{MARKER}\n// description \"y\"\n");
        assert_eq!(kept_part(&text), "description \"x\"\n\n");
        assert_eq!(kept_part("a 1\n"), "a 1\n");
        assert_eq!(kept_part(&format!("{MARKER}\n// a\n")), "");
    }
}
