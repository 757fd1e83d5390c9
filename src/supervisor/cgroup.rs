//! Containment (DESIGN §10, invariant 11): every stdio server runs in a
//! cgroup v2 of its own, so every process it starts, even one that
//! `setsid`s or double-forks away from its process group, belongs to it
//! and dies with it.
//!
//! The daemon finds the v2 hierarchy in `/proc/self/mountinfo` (at
//! `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid systems) and
//! its own place in it in `/proc/self/cgroup`. A daemon alone in its
//! cgroup (a systemd service with `Delegate=yes`) moves itself into the
//! leaf `daemon` and puts servers in `servers/NAME` beside it, as the
//! no-internal-process rule wants; any other (started from a shell, or one
//! of several daemons in one cgroup) makes a subtree named after its
//! instance and runtime directory, `mcpd-user-<hash>/NAME`, so no daemon
//! ever touches another's servers. Without a writable v2 hierarchy the
//! daemon falls back to process groups and says so once.
//!
//! A child is in its cgroup before it execs: forked into it by `clone3`
//! (the cgroup is opened before the fork), or, where the kernel refuses
//! that, joining it first thing (its `cgroup.procs`, opened before the
//! fork, is written in the child). A generation is
//! over when its cgroup is empty (`cgroup.events` says `populated 0`,
//! watched with inotify, no polling); helpers left behind by a main
//! process that exited are killed first (`cgroup.kill`).
//!
//! A per-host unit's cgroup holds no process of its own: below it, its
//! instances are `N`, a D-Bus caller's `uid-UID`, and its own server
//! (learning its lists, serving D-Bus) `unit`, since
//! cgroup v2 wants processes in leaves only and `cgroup.kill` and
//! `populated` take a whole subtree. A `limits` block it cannot enforce (no
//! controller delegated, no cgroups at all, a `nofile` above what the
//! daemon may grant) fails the start.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::unit::{Instance, Limits};

/// The mount point of the cgroup v2 hierarchy in a `/proc/self/mountinfo`.
pub fn v2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "36 25 0:30 / /sys/fs/cgroup rw,… shared:9 - cgroup2 cgroup2 rw,…"
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(unescape(mount)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The process's cgroup v2 path ("/", "/system.slice/mcpd.service") in a
/// `/proc/self/cgroup`.
pub fn v2_path(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end_matches(" (deleted)").to_owned())
}

/// The subtree of a daemon that shares its cgroup: one per instance and
/// runtime directory (FNV-1a of the path: stable across builds, so a new
/// daemon finds what an older one left).
pub fn subtree_name(instance: Instance, runtime_dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let hash = runtime_dir
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    let instance = match instance {
        Instance::System => "system",
        Instance::User => "user",
    };
    format!("mcpd-{instance}-{hash:016x}")
}

/// Where a daemon keeps its servers' cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    /// The directory holding one cgroup per server.
    servers: PathBuf,
}

impl Cgroups {
    /// Finds the hierarchy and prepares the daemon's place in it: moves
    /// the daemon into `daemon` when its cgroup is its own, or makes its
    /// subtree. An error says what is missing.
    pub fn setup(instance: Instance, runtime_dir: &Path) -> Result<Self, String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let mount = v2_mount(&mountinfo).ok_or("no cgroup v2 hierarchy is mounted")?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .as_deref()
            .and_then(v2_path)
            .ok_or("/proc/self/cgroup names no cgroup v2 path")?;
        let own = mount.join(own.trim_start_matches('/'));
        let servers = if alone_in(&own) {
            let leaf = own.join("daemon");
            mkdir(&leaf)?;
            std::fs::write(leaf.join("cgroup.procs"), "0")
                .map_err(|e| format!("cannot move the daemon into {}: {e}", leaf.display()))?;
            own.join("servers")
        } else {
            own.join(subtree_name(instance, runtime_dir))
        };
        mkdir(&servers)?;
        // A probe: a cgroup the daemon can create is one it can use.
        let probe = servers.join(".probe");
        mkdir(&probe)?;
        let _ = std::fs::remove_dir(&probe);
        Ok(Self { servers })
    }

    /// The cgroups for the servers of this daemon, in `dir` (tests).
    pub fn at(dir: PathBuf) -> Self {
        Self { servers: dir }
    }

    pub fn dir(&self) -> &Path {
        &self.servers
    }

    /// Server `name`'s cgroup.
    pub fn server(&self, name: &str) -> Cgroup {
        Cgroup {
            dir: self.servers.join(name),
        }
    }

    /// Removes the (empty) directory of the servers' cgroups, and the
    /// subtree or leaf it is in when the daemon made them.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.servers);
    }

    /// Kills what an earlier daemon of this instance and runtime directory
    /// left running: (server, processes killed) for each that had any.
    pub async fn recover(&self) -> Vec<(String, usize)> {
        let mut killed = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.servers) else {
            return killed;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let cgroup = Cgroup { dir: entry.path() };
            // A per-host unit's instances are cgroups below it (DESIGN
            // §13): `cgroup.kill` and `populated` take the whole subtree.
            let below = cgroup.below();
            let n = cgroup.pids().len() + below.iter().map(|c| c.pids().len()).sum::<usize>();
            if n > 0 {
                cgroup.kill();
                let _ = tokio::time::timeout(Duration::from_secs(5), cgroup.emptied()).await;
                killed.push((name, n));
            }
            for c in below {
                c.remove();
            }
            cgroup.remove();
        }
        killed
    }
}

/// Whether `dir`'s only process is this one, with no cgroups below but
/// the daemon's own.
fn alone_in(dir: &Path) -> bool {
    let me = std::process::id().to_string();
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    let mut pids = procs.lines();
    // The root cgroup is never the daemon's own, whoever else is in it.
    dir.parent()
        .is_some_and(|p| p.join("cgroup.procs").exists())
        && pids.next() == Some(me.as_str())
        && pids.next().is_none()
}

fn mkdir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot create cgroup {}: {e}", dir.display())),
    }
}

/// What a server's processes use, as `mcpctl status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Threads (`cgroup.threads`), as systemd's `Tasks`.
    pub tasks: u64,
    /// Bytes resident, summed over its processes.
    pub memory: u64,
    /// CPU time since the cgroup was made (`cpu.stat` `usage_usec`).
    pub cpu: Option<Duration>,
}

/// A server's cgroup opened for its next child ([`Cgroup::prepare`]).
#[derive(Debug)]
pub struct Placement {
    /// The cgroup's directory, for `clone3(CLONE_INTO_CGROUP)`.
    pub dir: OwnedFd,
    /// Its `cgroup.procs`, for a child forked elsewhere to join.
    pub procs: OwnedFd,
}

/// One server's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the cgroup and opens it and its `cgroup.procs`, for the child
    /// to be forked into or to join before exec. A cgroup with processes
    /// in it is not reused: they are killed and this start fails (the
    /// previous generation ended only once its cgroup was empty, so they
    /// are nobody's).
    pub fn prepare(&self) -> Result<Placement, String> {
        // An instance's cgroup is below its unit's (DESIGN §13), which
        // the last instance's end removes: made again if that came
        // between the two.
        for last in [false, true] {
            if let Some(parent) = self.dir.parent() {
                mkdir(parent)?;
            }
            match mkdir(&self.dir) {
                Err(_) if !last && self.dir.parent().is_some_and(|p| !p.exists()) => {}
                made => {
                    made?;
                    break;
                }
            }
        }
        let left = self.pids().len();
        if left > 0 {
            self.kill();
            return Err(format!(
                "cgroup {} still had {}; killed them, not starting beside them",
                self.dir.display(),
                crate::words::count(left as u64, "process")
            ));
        }
        let dir = rustix::fs::open(
            &self.dir,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("cannot open {}: {e}", self.dir.display()))?;
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))
            .map(OwnedFd::from)
            .map_err(|e| format!("cannot open {}/cgroup.procs: {e}", self.dir.display()))?;
        Ok(Placement { dir, procs })
    }

    /// Sets `limits`' cgroup controls (`memory.max`, `pids.max`,
    /// `cpu.weight`), enabling each controller for the servers' cgroups;
    /// an error names what cannot be enforced (the start fails: a limit
    /// is never dropped).
    pub fn limit(&self, limits: &Limits) -> Result<(), String> {
        let controls = [
            ("memory", "memory.max", "memory-max", limits.memory_max),
            ("pids", "pids.max", "tasks-max", limits.tasks_max),
            ("cpu", "cpu.weight", "cpu-weight", limits.cpu_weight),
        ];
        let parent = self.dir.parent().unwrap_or(&self.dir);
        for (controller, file, key, value) in controls {
            let Some(value) = value else { continue };
            let mut available =
                std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
            if !available.split_whitespace().any(|c| c == controller)
                && let Some(grand) = parent.parent()
            {
                // An instance's unit (DESIGN §13) is given the controller
                // by the servers' cgroup, where the daemon may enable it.
                let _ = std::fs::write(
                    grand.join("cgroup.subtree_control"),
                    format!("+{controller}"),
                );
                available =
                    std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
            }
            if !available.split_whitespace().any(|c| c == controller) {
                let have = if available.trim().is_empty() {
                    "none".to_owned()
                } else {
                    available.trim().to_owned()
                };
                return Err(format!(
                    "`limits.{key}` needs the cgroup {controller} controller, which is not delegated to {} (available: {have})",
                    parent.display()
                ));
            }
            std::fs::write(
                parent.join("cgroup.subtree_control"),
                format!("+{controller}"),
            )
            .map_err(|e| {
                format!(
                    "`limits.{key}`: cannot enable the {controller} controller in {}: {e}",
                    parent.display()
                )
            })?;
            std::fs::write(self.dir.join(file), value.to_string()).map_err(|e| {
                format!(
                    "`limits.{key}`: cannot write {}/{file}: {e}",
                    self.dir.display()
                )
            })?;
        }
        Ok(())
    }

    /// The processes in it.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Threads in it (systemd's `Tasks`).
    pub fn tasks(&self) -> usize {
        std::fs::read_to_string(self.dir.join("cgroup.threads"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    /// CPU time used by everything that ran in it, from `cpu.stat`.
    pub fn cpu(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse().ok())
            .map(Duration::from_micros)
    }

    /// What it uses now. Memory is the sum of its processes' resident
    /// sets (the memory controller may not be delegated; where it is, this
    /// is still what `ps` would add up).
    pub fn usage(&self) -> Usage {
        let memory = self
            .pids()
            .into_iter()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
            .filter_map(|status| {
                let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
                kib.trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
            .sum();
        Usage {
            tasks: self.tasks() as u64,
            memory,
            cpu: self.cpu(),
        }
    }

    /// How many processes the OOM killer killed in it (`memory.events`;
    /// 0 without the memory controller).
    pub fn oom_kills(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.events"))
            .map(|events| oom_kill_count(&events))
            .unwrap_or(0)
    }

    /// Whether any process is in it (`cgroup.events`).
    pub fn populated(&self) -> bool {
        std::fs::read_to_string(self.dir.join("cgroup.events"))
            .map(|e| e.lines().any(|l| l == "populated 1"))
            .unwrap_or(false)
    }

    /// SIGTERM (then SIGCONT, so stopped ones can act on it) to every
    /// process in it.
    pub fn terminate(&self) {
        self.each(rustix::process::Signal::TERM);
        self.each(rustix::process::Signal::CONT);
    }

    /// SIGKILL to every process in it, at once (`cgroup.kill`; before
    /// Linux 5.14, to each process it lists, repeated by the callers that
    /// wait for it to empty).
    pub fn kill(&self) {
        if std::fs::write(self.dir.join("cgroup.kill"), "1").is_err() {
            self.each(rustix::process::Signal::KILL);
        }
    }

    fn each(&self, signal: rustix::process::Signal) {
        for pid in self.pids() {
            if let Some(pid) = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, signal);
            }
        }
    }

    /// Waits until it is empty: woken by inotify on `cgroup.events`.
    pub async fn emptied(&self) {
        // Mostly it is already (a server's last process was its main
        // one): no watch to set up and tear down.
        if !self.populated() {
            return;
        }
        let events = self.dir.join("cgroup.events");
        let watch = Watch::new(&events);
        while self.populated() {
            match &watch {
                Some(watch) => watch.changed().await,
                // No inotify: the fallback is a slow re-read.
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        if let Some(watch) = watch {
            watch.close();
        }
    }

    /// Removes it (it must be empty).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }

    /// The cgroups directly below it (a per-host unit's instances).
    pub fn below(&self) -> Vec<Cgroup> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| Cgroup { dir: e.path() })
            .collect()
    }
}

/// An inotify watch on one file's modifications.
struct Watch {
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
}

impl Watch {
    fn new(file: &Path) -> Option<Self> {
        use rustix::fs::inotify;
        let fd =
            inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK).ok()?;
        inotify::add_watch(&fd, file, inotify::WatchFlags::MODIFY).ok()?;
        // `new` is deprecated for types whose fd may change or close under
        // it; an `OwnedFd` owns its fd until dropped, which is exactly what
        // `register` asks of its caller.
        #[allow(deprecated)]
        let fd = tokio::io::unix::AsyncFd::new(fd).ok()?;
        Some(Self { fd })
    }

    /// Closes it on the blocking pool: closing an inotify instance waits
    /// for an SRCU grace period (some 10 ms, measured), which would stall
    /// the event loop and every session on it.
    fn close(self) {
        let fd = self.fd.into_inner();
        drop(tokio::task::spawn_blocking(move || drop(fd)));
    }

    /// Waits for the next modification (or spuriously: callers re-check).
    async fn changed(&self) {
        if let Ok(mut ready) = self.fd.readable().await {
            let mut buf = [0u8; 1024];
            loop {
                match rustix::io::read(self.fd.get_ref().as_fd(), &mut buf) {
                    Ok(n) if n > 0 => continue,
                    _ => break,
                }
            }
            ready.clear_ready();
        }
    }
}

/// The `oom_kill` count of a `memory.events` file.
fn oom_kill_count(events: &str) -> u64 {
    events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kills_are_read_from_memory_events() {
        let events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(events), 1);
        assert_eq!(oom_kill_count("low 0\noom 0\n"), 0);
        assert_eq!(oom_kill_count(""), 0);
    }

    #[test]
    fn finds_the_v2_mount_on_unified_and_hybrid_systems() {
        let unified =
            "24 1 0:22 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(v2_mount(unified), Some(PathBuf::from("/sys/fs/cgroup")));
        let hybrid = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                      32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            v2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let legacy = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n";
        assert_eq!(v2_mount(legacy), None);
        let escaped = "41 31 0:38 / /mnt/cg\\040v2 rw - cgroup2 cgroup2 rw\n";
        assert_eq!(v2_mount(escaped), Some(PathBuf::from("/mnt/cg v2")));
    }

    #[test]
    fn reads_the_v2_path_of_a_process() {
        let hybrid = "9:name=systemd:/\n4:memory:/x\n0::/system.slice/mcpd.service\n";
        assert_eq!(
            v2_path(hybrid).as_deref(),
            Some("/system.slice/mcpd.service")
        );
        assert_eq!(v2_path("0::/\n").as_deref(), Some("/"));
        assert_eq!(v2_path("4:memory:/x\n"), None);
    }

    #[test]
    fn subtrees_differ_by_instance_and_runtime_directory() {
        let a = subtree_name(Instance::User, Path::new("/tmp/a/mcpd"));
        let b = subtree_name(Instance::User, Path::new("/tmp/b/mcpd"));
        let c = subtree_name(Instance::System, Path::new("/tmp/a/mcpd"));
        assert!(a.starts_with("mcpd-user-") && c.starts_with("mcpd-system-"));
        assert_ne!(a, b);
        assert_eq!(a, subtree_name(Instance::User, Path::new("/tmp/a/mcpd")));
    }
}
