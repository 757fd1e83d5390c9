//! The types the daemon and its adapters (D-Bus, the attach socket)
//! share: what a reload did ([`Diff`], [`Change`]), what a unit looks like
//! from outside ([`UnitView`]), what the daemon can be asked to do
//! ([`Control`]) and the read model the daemon publishes after every
//! reload ([`Shared`]), which the adapters read.
//!
//! Architecture Invariant: it imports neither `crate::daemon` nor
//! `crate::dbus` (it does import `supervisor`, `mux` and `unit`), so the
//! daemon can wire the D-Bus adapter in while the adapter knows nothing of
//! the daemon's internals (`tests/docs.rs` checks).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::RwLock;

use tokio::sync::{mpsc, oneshot, watch};

use crate::mux::aggregate::{Candidate, Target, members_of};
use crate::supervisor::Supervisor;
use crate::unit::Instance;

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
    /// Its `group`s and `alias` (DESIGN §14), as last loaded.
    pub groups: Vec<String>,
    pub alias: Option<String>,
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

/// What the daemon's adapters read and act through: the units as the
/// daemon last loaded them, published after every reload, and the
/// daemon's control channel.
#[derive(Debug)]
pub struct Shared {
    pub instance: Instance,
    pub unit_dirs: Vec<PathBuf>,
    /// The units as the daemon last loaded them.
    pub units: RwLock<BTreeMap<String, UnitView>>,
    /// Reloads go to the daemon's loop.
    pub control: mpsc::UnboundedSender<Control>,
    /// Counts the read model's publications: aggregates follow their
    /// groups by it.
    pub published: watch::Sender<u64>,
    /// The HTTP endpoint (DESIGN §15) while it serves: kept up to date by
    /// the endpoint, shown by `mcpctl status`.
    pub http: std::sync::Mutex<Option<HttpView>>,
}

/// The HTTP endpoint as the outside sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpView {
    /// The addresses it listens on.
    pub listen: Vec<String>,
    /// Its open sessions.
    pub sessions: usize,
}

/// How many names [`Shared::choices`] lists.
pub const NAMES_LISTED: usize = 20;

/// Why the read model has no unit, or no supervisor, by a name. The
/// messages are the ones the adapters pass on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// No unit of that name is known.
    #[error("no server named {0}")]
    NoSuchServer(String),
    /// The unit has never loaded, so nothing runs it.
    #[error("unit {name} is invalid and cannot run: {reason}")]
    Invalid { name: String, reason: String },
}

impl Shared {
    /// The read model of a daemon with no units yet.
    pub fn new(
        instance: Instance,
        unit_dirs: Vec<PathBuf>,
        control: mpsc::UnboundedSender<Control>,
    ) -> Self {
        Self {
            instance,
            unit_dirs,
            units: RwLock::new(BTreeMap::new()),
            control,
            published: watch::Sender::new(0),
            http: std::sync::Mutex::new(None),
        }
    }

    /// Replaces the units with `units` and tells who follows them.
    pub fn publish(&self, units: BTreeMap<String, UnitView>) {
        if let Ok(mut mine) = self.units.write() {
            *mine = units;
        }
        self.published.send_modify(|n| *n += 1);
    }

    /// The units of `target` that run, each with its prefix and
    /// supervisor (DESIGN §14).
    pub fn members(&self, target: &Target) -> Result<Vec<(String, String, Supervisor)>, String> {
        let units = self
            .units
            .read()
            .map_err(|_| "the read model is poisoned".to_owned())?;
        let candidates: Vec<Candidate<'_>> = units
            .iter()
            .filter(|(_, v)| v.supervisor.is_some())
            .map(|(name, v)| Candidate {
                unit: name,
                alias: v.alias.as_deref(),
                groups: &v.groups,
            })
            .collect();
        let members = members_of(target, &candidates)?;
        Ok(members
            .into_iter()
            .filter_map(|(unit, prefix)| {
                let supervisor = units.get(&unit)?.supervisor.clone()?;
                Some((unit, prefix, supervisor))
            })
            .collect())
    }

    /// The names of every known unit.
    pub fn names(&self) -> Vec<String> {
        self.units
            .read()
            .map(|u| u.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// What there is to choose from, for a refusal of a name that is not
    /// there: the units' names (`units: a, b`), or with `groups` the
    /// groups'; at most [`NAMES_LISTED`], then how many more.
    pub fn choices(&self, groups: bool) -> String {
        let Ok(units) = self.units.read() else {
            return "the read model is poisoned".into();
        };
        let names: Vec<&str> = if groups {
            let set: std::collections::BTreeSet<&str> = units
                .values()
                .flat_map(|v| v.groups.iter().map(String::as_str))
                .collect();
            set.into_iter().collect()
        } else {
            units.keys().map(String::as_str).collect()
        };
        let (what, none) = if groups {
            ("groups", "no unit has a group")
        } else {
            ("units", "no unit is loaded")
        };
        if names.is_empty() {
            return none.into();
        }
        let mut text = format!(
            "{what}: {}",
            names[..names.len().min(NAMES_LISTED)].join(", ")
        );
        if names.len() > NAMES_LISTED {
            text.push_str(&format!(" and {} more", names.len() - NAMES_LISTED));
        }
        text
    }

    /// The unit `name` as the daemon last loaded it.
    pub fn unit(&self, name: &str) -> Result<UnitView, UnitError> {
        self.units
            .read()
            .ok()
            .and_then(|u| u.get(name).cloned())
            .ok_or_else(|| UnitError::NoSuchServer(name.to_owned()))
    }

    /// The supervisor of `name`; a unit that never loaded has none.
    pub fn supervisor(&self, name: &str) -> Result<Supervisor, UnitError> {
        let unit = self.unit(name)?;
        unit.supervisor.ok_or_else(|| UnitError::Invalid {
            name: name.to_owned(),
            reason: unit.load_error.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_invalid_unit_is_named_in_the_adapters_words() {
        let (control, _) = mpsc::unbounded_channel();
        let shared = Shared::new(Instance::User, Vec::new(), control);
        let invalid = UnitView {
            supervisor: None,
            path: PathBuf::from("/units/bad.kdl"),
            description: None,
            load_error: Some("/units/bad.kdl:1:1: oops".into()),
            groups: Vec::new(),
            alias: None,
        };
        if let Ok(mut units) = shared.units.write() {
            units.insert("bad".into(), invalid);
        }
        assert_eq!(shared.names(), ["bad"]);
        let missing = shared
            .supervisor("nope")
            .map(|_| ())
            .expect_err("no such unit");
        assert_eq!(missing.to_string(), "no server named nope");
        let bad = shared
            .supervisor("bad")
            .map(|_| ())
            .expect_err("never loaded");
        assert_eq!(
            bad.to_string(),
            "unit bad is invalid and cannot run: /units/bad.kdl:1:1: oops"
        );
        assert!(shared.unit("bad").is_ok());
        assert_eq!(shared.choices(false), "units: bad");
        assert_eq!(shared.choices(true), "no unit has a group");
        if let Ok(mut units) = shared.units.write() {
            for n in 0..25 {
                let mut view = units["bad"].clone();
                view.groups = vec![format!("g{}", n % 2)];
                units.insert(format!("u{n:02}"), view);
            }
        }
        assert_eq!(shared.choices(true), "groups: g0, g1");
        let listed = shared.choices(false);
        assert!(
            listed.starts_with("units: bad, u00, u01,") && listed.ends_with("u18 and 6 more"),
            "{listed}"
        );
    }
}
