//! File helpers shared by the daemon and `mcpctl`.

use std::io::Write;
use std::path::Path;

/// Writes `path` through a temporary file in its directory (created with
/// `mode`, so a secret is never readable by others), fsynced, renamed over
/// `path`, and the directory fsynced: a reader sees the old file or the
/// new one, never part of either, and a crash keeps one of them.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    // A crash mid-write (of a process with this pid, as PID 1 in a
    // container is at every start) may have left it.
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(fail)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // The rename is durable once the directory is.
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}
