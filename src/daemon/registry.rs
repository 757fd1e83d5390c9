//! The registry: every known unit (name → supervisor, last good spec, unit
//! files, load error) and reload by rescanning and diffing.
//!
//! A reload never trusts file events: it rescans the search path, loads
//! every unit and compares specs. New valid units start; removed units stop
//! and vanish; a changed transport (command, environment, user, URL, …)
//! restarts the unit as a new generation (so do changed roots, limits,
//! sandbox and credentials); other changes (description,
//! reconnect policy, timeouts) apply in place (`max-instances` too, for
//! the hosts that attach next), a unit switched between shared and
//! per-host sessions is stopped and started anew; unchanged units are not
//! touched. An invalid file never half-applies: a running unit keeps its
//! last good spec and shows the load error; a new invalid unit is listed
//! and never started.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::model::{Change, Diff, UnitView};
use crate::supervisor::process::Host;
use crate::supervisor::{LogRing, State, Supervisor, system_launcher};
use crate::unit::{self, LoadError, UnitFiles, UnitSpec};

use super::config::Config;

/// One unit the daemon knows.
#[derive(Debug)]
pub struct Entry {
    pub files: UnitFiles,
    /// The spec the supervisor runs (the last valid one).
    pub spec: Option<UnitSpec>,
    /// Why the unit's current files do not load.
    pub load_error: Option<LoadError>,
    running: Option<(Supervisor, JoinHandle<()>)>,
}

impl Entry {
    pub fn supervisor(&self) -> Option<&Supervisor> {
        self.running.as_ref().map(|(s, _)| s)
    }
}

/// Every unit of the daemon.
#[derive(Debug)]
pub struct Registry {
    config: Config,
    /// Parses the unit files, remembering what stands unchanged.
    loader: unit::Loader,
    host: Host,
    entries: BTreeMap<String, Entry>,
    /// Units being stopped after removal, by name: a unit re-added under
    /// the same name waits for its predecessor (one process at a time).
    retiring: HashMap<String, JoinHandle<()>>,
    /// Woken whenever any server's status changes.
    changed: Arc<Notify>,
}

impl Registry {
    /// A registry of `config`'s units whose children are spawned on `host`.
    pub fn new(config: Config, host: Host) -> Self {
        Self {
            loader: unit::Loader::new(config.instance.load_context()),
            config,
            host,
            entries: BTreeMap::new(),
            retiring: HashMap::new(),
            changed: Arc::new(Notify::new()),
        }
    }

    pub fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }

    /// The read model of every unit, for D-Bus.
    pub fn snapshot(&self) -> BTreeMap<String, UnitView> {
        self.entries
            .iter()
            .map(|(name, e)| {
                let view = UnitView {
                    supervisor: e.supervisor().cloned(),
                    path: e.files.main.clone(),
                    description: e
                        .spec
                        .as_ref()
                        .and_then(|s| s.description().map(str::to_owned)),
                    load_error: e.load_error.as_ref().map(ToString::to_string),
                    groups: e
                        .spec
                        .as_ref()
                        .map(|s| s.groups().to_vec())
                        .unwrap_or_default(),
                    alias: e.spec.as_ref().and_then(|s| s.alias().map(str::to_owned)),
                };
                (name.clone(), view)
            })
            .collect()
    }

    /// Notified on every status change of any server.
    pub fn changed(&self) -> Arc<Notify> {
        Arc::clone(&self.changed)
    }

    /// The directories to watch: every existing unit directory and every
    /// drop-in directory in them.
    pub fn watch_paths(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for dir in &self.config.unit_dirs {
            if !dir.is_dir() {
                continue;
            }
            out.push(dir.clone());
            if let Ok(read) = std::fs::read_dir(dir) {
                let mut dropins: Vec<PathBuf> = read
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir() && p.to_string_lossy().ends_with(".kdl.d"))
                    .collect();
                dropins.sort();
                out.extend(dropins);
            }
        }
        out
    }

    /// Rescans the search path and applies the differences.
    pub async fn reload(&mut self) -> Diff {
        // Reading and parsing every file is blocking work (a large search
        // path takes a while): not on the thread that carries the hosts'
        // sessions.
        // Files that stand as they were are not parsed again (see
        // `unit::Loader`): one changed among 500 costs one parse.
        let dirs = self.config.unit_dirs.clone();
        // A scan that fails (panics) leaves a loader that remembers nothing.
        let fresh = self.loader.fresh();
        let mut loader = std::mem::replace(&mut self.loader, fresh);
        let scan = move || {
            let now = std::time::SystemTime::now();
            let (found, dir_errors) = unit::discover(&dirs);
            let seen: BTreeMap<_, _> = found
                .into_iter()
                .filter(|f| !f.masked)
                .map(|f| {
                    let loaded = loader.load(&f.files, now);
                    (f.name, (f.files, loaded))
                })
                .collect();
            loader.retain(&seen.values().map(|(files, _)| files).collect());
            (seen, dir_errors, loader)
        };
        let (seen, dir_errors) = match tokio::task::spawn_blocking(scan).await {
            Ok((seen, dir_errors, loader)) => {
                self.loader = loader;
                (seen, dir_errors)
            }
            Err(e) => {
                // Nothing read: nothing changes.
                tracing::error!(target: "mcpd::daemon", "reading the units failed: {e}");
                return Diff(Vec::new());
            }
        };
        for e in &dir_errors {
            tracing::warn!(target: "mcpd::daemon", "{e}");
        }
        let mut diff = Vec::new();

        let removed: Vec<String> = self
            .entries
            .keys()
            .filter(|n| !seen.contains_key(*n))
            .cloned()
            .collect();
        for name in removed {
            if let Some(entry) = self.entries.remove(&name) {
                if let Some((supervisor, task)) = entry.running {
                    let handle = tokio::spawn(supervisor.shutdown(task));
                    self.retiring.insert(name.clone(), handle);
                }
                tracing::info!(target: "mcpd::daemon", mcpd_server = %name, "unit {name} removed");
                diff.push((name, Change::Removed));
            }
        }

        for (name, (files, loaded)) in seen {
            let change = self.apply(&name, files, loaded).await;
            diff.push((name, change));
        }
        diff.sort_by(|a, b| a.0.cmp(&b.0));
        self.retiring.retain(|_, h| !h.is_finished());
        Diff(diff)
    }

    async fn apply(
        &mut self,
        name: &str,
        files: UnitFiles,
        loaded: Result<UnitSpec, LoadError>,
    ) -> Change {
        match (self.entries.get_mut(name), loaded) {
            (Some(entry), Err(e)) => {
                let message = e.to_string();
                if entry.load_error.as_ref().map(ToString::to_string) != Some(message.clone()) {
                    let keeps = if entry.running.is_some() {
                        " (keeps running its last valid configuration)"
                    } else {
                        ""
                    };
                    tracing::error!(target: "mcpd::daemon", mcpd_server = %name, "unit {name} is invalid{keeps}:\n{message}");
                }
                entry.files = files;
                entry.load_error = Some(e);
                Change::Invalid(message)
            }
            (None, Err(e)) => {
                let message = e.to_string();
                tracing::error!(target: "mcpd::daemon", mcpd_server = %name, "unit {name} is invalid and was not started:\n{message}");
                self.entries.insert(
                    name.to_owned(),
                    Entry {
                        files,
                        spec: None,
                        load_error: Some(e),
                        running: None,
                    },
                );
                Change::Invalid(message)
            }
            (Some(entry), Ok(spec)) => {
                entry.files = files;
                entry.load_error = None;
                match (&entry.spec, &entry.running) {
                    (Some(old), Some(_)) if *old == spec => Change::Unchanged,
                    (Some(old), Some(_)) if old.sessions().as_str() != spec.sessions().as_str() => {
                        // Shared ↔ per-host (DESIGN §13): where the unit's
                        // server runs (its cgroup beside its instances'
                        // or above them) changes, and so does who its
                        // hosts are. A new supervisor after the old one is
                        // gone; its hosts' bridges attach again.
                        if let Some((supervisor, task)) = entry.running.take() {
                            let handle = tokio::spawn(supervisor.shutdown(task));
                            self.retiring.insert(name.to_owned(), handle);
                        }
                        let running = self.start(name, spec.clone()).await;
                        if let Some(entry) = self.entries.get_mut(name) {
                            entry.spec = Some(spec);
                            entry.running = Some(running);
                        }
                        tracing::info!(target: "mcpd::daemon", mcpd_server = %name, "unit {name} changed its sessions, restarting it");
                        Change::Changed { restarted: true }
                    }
                    (Some(old), Some((supervisor, _))) => {
                        // Roots are declared in `initialize`: a new list
                        // needs a new session; limits are set on a new
                        // process, and so is a sandbox; credentials are
                        // delivered at a start.
                        let restarted = old.transport() != spec.transport()
                            || old.roots() != spec.roots()
                            || old.limits() != spec.limits()
                            || old.sandbox() != spec.sandbox()
                            || old.credentials() != spec.credentials();
                        supervisor.apply(spec.clone(), restarted);
                        entry.spec = Some(spec);
                        let how = if restarted {
                            "restarting it"
                        } else {
                            "applied in place"
                        };
                        tracing::info!(target: "mcpd::daemon", mcpd_server = %name, "unit {name} changed, {how}");
                        Change::Changed { restarted }
                    }
                    _ => {
                        // Known only as invalid until now: start it.
                        let running = self.start(name, spec.clone()).await;
                        if let Some(entry) = self.entries.get_mut(name) {
                            entry.spec = Some(spec);
                            entry.running = Some(running);
                        }
                        Change::Added
                    }
                }
            }
            (None, Ok(spec)) => {
                let running = self.start(name, spec.clone()).await;
                self.entries.insert(
                    name.to_owned(),
                    Entry {
                        files,
                        spec: Some(spec),
                        load_error: None,
                        running: Some(running),
                    },
                );
                Change::Added
            }
        }
    }

    /// Starts a supervisor for `name`, after any predecessor of the same
    /// name has fully stopped.
    async fn start(&mut self, name: &str, spec: UnitSpec) -> (Supervisor, JoinHandle<()>) {
        if let Some(previous) = self.retiring.remove(name) {
            let _ = previous.await;
        }
        let logs = LogRing::default();
        let launcher = system_launcher(name, self.host.clone(), logs.clone());
        let cache = Some(self.config.state_dir.join("cache"));
        let (supervisor, task) = Supervisor::spawn(name, spec, launcher, logs, cache);
        let mut rx = supervisor.subscribe();
        let changed = Arc::clone(&self.changed);
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                changed.notify_one();
            }
        });
        supervisor.arm();
        (supervisor, task)
    }

    /// "3 servers: 2 running, 1 retrying" (and invalid units).
    pub fn summary(&self) -> String {
        // Only the states: this runs at every change of any server (500
        // at a start-up), and a whole status holds the tool list.
        let states: Vec<State> = self
            .entries
            .values()
            .filter_map(|e| e.supervisor().map(Supervisor::state))
            .collect();
        let invalid_only = self
            .entries
            .values()
            .filter(|e| e.running.is_none())
            .count();
        let invalid_running = self
            .entries
            .values()
            .filter(|e| e.running.is_some() && e.load_error.is_some())
            .count();
        let mut parts: Vec<String> = State::ALL
            .iter()
            .filter_map(|state| {
                let n = states.iter().filter(|s| *s == state).count();
                (n > 0).then(|| format!("{n} {state}"))
            })
            .collect();
        if invalid_only + invalid_running > 0 {
            parts.push(format!("{} invalid", invalid_only + invalid_running));
        }
        let total = states.len() + invalid_only;
        let noun = if total == 1 { "server" } else { "servers" };
        if parts.is_empty() {
            format!("{total} {noun}")
        } else {
            format!("{total} {noun}: {}", parts.join(", "))
        }
    }

    /// Stops every server in parallel, each within its stop timeout, and
    /// waits for units still retiring.
    pub async fn shutdown(mut self) {
        let mut stopping = tokio::task::JoinSet::new();
        for (_, entry) in std::mem::take(&mut self.entries) {
            if let Some((supervisor, task)) = entry.running {
                stopping.spawn(supervisor.shutdown(task));
            }
        }
        for (_, handle) in self.retiring.drain() {
            stopping.spawn(async move {
                let _ = handle.await;
            });
        }
        while stopping.join_next().await.is_some() {}
    }
}
