//! `mcpctl credential set|list|remove` (DESIGN §16): the instance's
//! credstore, the directory `credentials { import … }` reads first. A
//! value comes from standard input, never from the command line (which
//! any user sees in `ps`); `list` shows names and sizes, never a value.
//! None needs a running daemon: the next start of a unit reads the store.

use std::io::{Read, Write};
use std::path::Path;

use crate::supervisor::credentials::MAX_CREDENTIAL;
use crate::unit::spec::is_credential_name;

use super::client::CtlError;
use super::exit;

fn checked(name: &str) -> Result<(), CtlError> {
    if is_credential_name(name) {
        Ok(())
    } else {
        Err(CtlError::failure(format!(
            "\"{}\" is not a credential name (a file name: no `/`, not `.` or `..`, at most 255 bytes)",
            name.escape_debug()
        )))
    }
}

/// `mcpctl credential set NAME`: the value read from `input` (to its end)
/// into `STORE/NAME`, mode 0600, in a 0700 store.
pub fn set(store: &Path, name: &str, input: &mut dyn Read) -> Result<u8, CtlError> {
    checked(name)?;
    let mut value = Vec::new();
    input
        .take(MAX_CREDENTIAL + 1)
        .read_to_end(&mut value)
        .map_err(|e| {
            CtlError::failure(format!("cannot read the value from standard input: {e}"))
        })?;
    if value.len() as u64 > MAX_CREDENTIAL {
        return Err(CtlError::failure(format!(
            "credential {name}: the value is larger than 1 MiB"
        )));
    }
    write(store, name, &value).map_err(CtlError::failure)?;
    Ok(exit::OK)
}

/// Writes credential `name` into `store` (made 0700 when missing), 0600.
pub fn write(store: &Path, name: &str, value: &[u8]) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    if !store.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(store)
            .map_err(|e| format!("cannot create {}: {e}", store.display()))?;
    }
    crate::files::write_atomically(&store.join(name), value, 0o600)
}

/// `mcpctl credential list`: each credential's name and size.
pub fn list(store: &Path, json: bool, out: &mut dyn Write) -> Result<u8, CtlError> {
    let mut rows: Vec<(String, u64)> = match std::fs::read_dir(store) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let meta = e.metadata().ok()?;
                (meta.is_file() && !name.starts_with('.')).then_some((name, meta.len()))
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            return Err(CtlError::failure(format!(
                "cannot list {}: {e}",
                store.display()
            )));
        }
    };
    rows.sort();
    if json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, size)| serde_json::json!({ "name": name, "size": size }))
            .collect();
        writeln!(out, "{}", serde_json::Value::Array(rows)).map_err(CtlError::output)?;
        return Ok(exit::OK);
    }
    if rows.is_empty() {
        writeln!(out, "No credentials in {}.", store.display()).map_err(CtlError::output)?;
        return Ok(exit::OK);
    }
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0).max(4);
    writeln!(out, "{:width$}  SIZE", "NAME").map_err(CtlError::output)?;
    for (name, size) in rows {
        writeln!(out, "{name:width$}  {size} B").map_err(CtlError::output)?;
    }
    Ok(exit::OK)
}

/// `mcpctl credential remove NAME…`: exit 1 naming each that is not there.
pub fn remove(store: &Path, names: &[String]) -> Result<u8, CtlError> {
    let mut missing = Vec::new();
    for name in names {
        checked(name)?;
        match std::fs::remove_file(store.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(name.as_str()),
            Err(e) => {
                return Err(CtlError::failure(format!(
                    "cannot remove {}: {e}",
                    store.join(name).display()
                )));
            }
        }
    }
    if missing.is_empty() {
        Ok(exit::OK)
    } else {
        Err(CtlError::failure(format!(
            "no credential {} in {}",
            missing.join(", "),
            store.display()
        )))
    }
}
