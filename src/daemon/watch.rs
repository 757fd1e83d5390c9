//! Watching the unit directories (inotify through `notify`). Events only
//! say "something may have changed"; the registry rescans and diffs, so
//! editor rename-saves, `cp`, `mv` and bursts all converge.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use notify::{RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

/// Watches a set of directories, non-recursively.
pub struct DirWatcher {
    watcher: notify::RecommendedWatcher,
    watched: BTreeSet<PathBuf>,
}

impl std::fmt::Debug for DirWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatcher")
            .field("watched", &self.watched)
            .finish()
    }
}

/// Whether an event about `path` can concern a unit: a unit file, a
/// drop-in, a drop-in directory, or a watched directory itself; or the
/// settings file (`*.kdl`) or the HTTP tokens (`tokens.json`).
fn relevant(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let parent = path
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    name.ends_with(".kdl")
        || name.ends_with(".kdl.d")
        || parent.ends_with(".kdl.d")
        || name == "tokens.json"
}

impl DirWatcher {
    /// A watcher that sends `()` on `tx` for every relevant change.
    pub fn new(tx: mpsc::UnboundedSender<()>) -> notify::Result<Self> {
        let watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
                Ok(event) => {
                    // Reading the files (as every rescan does) is no change.
                    let change = !matches!(event.kind, notify::EventKind::Access(_));
                    if change && (event.paths.is_empty() || event.paths.iter().any(|p| relevant(p)))
                    {
                        let _ = tx.send(());
                    }
                }
                // Lost events (queue overflow): a rescan finds the truth.
                Err(_) => {
                    let _ = tx.send(());
                }
            })?;
        Ok(Self {
            watcher,
            watched: BTreeSet::new(),
        })
    }

    /// Watches exactly `paths` from now on.
    pub fn set(&mut self, paths: &[PathBuf]) {
        let wanted: BTreeSet<PathBuf> = paths.iter().cloned().collect();
        for gone in self
            .watched
            .difference(&wanted)
            .cloned()
            .collect::<Vec<_>>()
        {
            let _ = self.watcher.unwatch(&gone);
            self.watched.remove(&gone);
        }
        for new in wanted
            .difference(&self.watched)
            .cloned()
            .collect::<Vec<_>>()
        {
            match self.watcher.watch(&new, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(new);
                }
                Err(e) => {
                    tracing::warn!(target: "mcpd::daemon", "cannot watch {}: {e}", new.display())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unit_paths_are_relevant() {
        assert!(relevant(Path::new("/u/a.kdl")));
        assert!(relevant(Path::new("/u/a.kdl.d")));
        assert!(relevant(Path::new("/u/a.kdl.d/10-x.kdl")));
        assert!(relevant(Path::new("/u/a.kdl.d/.10-x.kdl.swp")));
        assert!(!relevant(Path::new("/u/.a.kdl.swp")));
        assert!(!relevant(Path::new("/u/4913")));
        assert!(relevant(Path::new("/var/lib/mcpd/tokens.json")));
        assert!(!relevant(Path::new("/var/lib/mcpd/.tokens.json.tmp-7")));
    }
}
