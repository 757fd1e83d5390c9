//! The types the daemon and its adapters (D-Bus) share: what a reload
//! did ([`Diff`], [`Change`]), what a unit looks like from outside
//! ([`UnitView`]) and what the daemon can be asked to do ([`Control`]).
//!
//! Architecture Invariant: a leaf. It imports neither `crate::daemon` nor
//! `crate::dbus`, so the daemon can wire the D-Bus adapter in while the
//! adapter knows nothing of the daemon's internals (`tests/docs.rs` checks).

use std::fmt;
use std::path::PathBuf;

use tokio::sync::oneshot;

use crate::supervisor::Supervisor;

/// What a reload did to one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Added,
    /// A new spec: `restarted` when it changed how the server runs.
    Changed {
        restarted: bool,
    },
    Removed,
    Unchanged,
    /// The unit's files do not load; a running unit keeps its last good spec.
    Invalid(String),
}

impl Change {
    /// The word `mcpctl reload` and the D-Bus `Reload` method use.
    pub fn word(&self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Changed { .. } => "changed",
            Change::Removed => "removed",
            Change::Unchanged => "unchanged",
            Change::Invalid(_) => "invalid",
        }
    }
}

/// A reload's outcome, unit by unit, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff(pub Vec<(String, Change)>);

impl Diff {
    /// How many units changed in a way `matches` accepts.
    fn count(&self, matches: impl Fn(&Change) -> bool) -> usize {
        self.0.iter().filter(|(_, c)| matches(c)).count()
    }
}

impl fmt::Display for Diff {
    /// "2 added, 1 changed, 0 removed, 5 unchanged, 1 invalid"
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} added, {} changed, {} removed, {} unchanged, {} invalid",
            self.count(|c| matches!(c, Change::Added)),
            self.count(|c| matches!(c, Change::Changed { .. })),
            self.count(|c| matches!(c, Change::Removed)),
            self.count(|c| matches!(c, Change::Unchanged)),
            self.count(|c| matches!(c, Change::Invalid(_)))
        )
    }
}

/// What the outside (D-Bus) sees of a unit: cheap to clone.
#[derive(Debug, Clone)]
pub struct UnitView {
    /// None for a unit that has never loaded.
    pub supervisor: Option<Supervisor>,
    /// The unit's main file.
    pub path: PathBuf,
    pub description: Option<String>,
    /// The current load error, one `file:line:col: message` line each.
    pub load_error: Option<String>,
}

/// What the daemon can be asked to do.
#[derive(Debug)]
pub enum Control {
    /// Rescan the units now; the diff goes to `reply` when given.
    Reload {
        reply: Option<oneshot::Sender<Diff>>,
    },
    /// Stop every server and return.
    Shutdown,
}
