//! The sandbox of a stdio server (DESIGN §10): Landlock confines the
//! filesystem, a network namespace the network, and `no_new_privs` is always
//! set.
//!
//! Three steps, each where it belongs:
//! - [`decide`] (pure, table-tested) sets what the unit asks against what
//!   the kernel offers ([`Offer`], read once at daemon start) and fails
//!   closed: a sandbox the kernel cannot give is an error naming what is
//!   missing, never a weaker sandbox.
//! - [`grants`] and [`Confinement::prepare`] run in the daemon before the
//!   fork: they work out the paths a generation may reach (its program's
//!   prefix, its interpreter's, …), open them and build the Landlock ruleset.
//! - [`Confinement::enter_namespace`] and [`Confinement::restrict`] run in
//!   the forked child before exec and only make system calls. Landlock
//!   domains and namespaces are inherited by every process the server
//!   starts and cannot be left, so the server cannot undo either.
//!
//! Why these mechanisms: Landlock and user namespaces need no privilege
//! (a user instance confines its servers as well as the system one), are
//! stacked by the kernel rather than emulated (no ptrace or seccomp
//! supervisor in the path of every system call), and cost a few system
//! calls per start. Landlock names what may be reached, not what is hidden,
//! which is the shape of the unit's `sandbox` block.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope,
};

use crate::unit::{Network, Sandbox};

/// The oldest Landlock ABI mcpd confines with: v3 (Linux 6.2) is the first
/// that controls truncation; under older ones a server could still
/// truncate any file its user may write.
pub const MIN_LANDLOCK_ABI: i32 = 3;

/// System directories every sandboxed server may read and execute from,
/// where they exist. `/proc` and `/sys` are read by ordinary runtimes
/// (Node reads its cgroup's memory limit, Python `/proc/self`); writing to
/// them, as to everything not granted, is refused.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/opt", "/proc", "/sys",
];

/// Devices every sandboxed server may read and write.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// What the kernel offers a sandbox, read once when the daemon starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The Landlock ABI version, or why there is none.
    pub landlock: Result<i32, String>,
    /// The daemon is root: it creates network namespaces itself.
    pub root: bool,
    /// An unprivileged process may create a user namespace (to own its
    /// network namespace), or why it may not.
    pub userns: Result<(), String>,
}

impl Offer {
    /// Reads this kernel's offer.
    pub fn probe(euid: u32) -> Self {
        Self {
            landlock: landlock_abi(),
            root: euid == 0,
            userns: userns_allowed(),
        }
    }
}

/// How a generation is confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enforcement {
    /// The Landlock ABI the ruleset is built for (all its rights handled).
    pub landlock: i32,
    pub network: Network,
    pub namespace: Namespace,
}

/// The namespaces a sandboxed child enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    /// None: `network "host"`.
    None,
    /// A network namespace (the daemon is root).
    Net,
    /// A user namespace mapping only the server's own uid and gid, owning a
    /// network namespace (an unprivileged daemon).
    UserNet,
}

impl std::fmt::Display for Enforcement {
    /// `landlock v7, network none`, as `mcpctl status` shows it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "landlock v{}, network {}",
            self.landlock,
            self.network.as_str()
        )
    }
}

/// What of `network` (and the filesystem confinement every sandbox has)
/// this kernel can enforce; an error names what is missing.
pub fn decide(network: Network, offer: &Offer) -> Result<Enforcement, String> {
    let landlock = match &offer.landlock {
        Ok(abi) if *abi >= MIN_LANDLOCK_ABI => *abi,
        Ok(abi) => {
            return Err(format!(
                "the kernel's Landlock is ABI v{abi}, and the sandbox needs v{MIN_LANDLOCK_ABI} (Linux 6.2) to control truncation"
            ));
        }
        Err(why) => return Err(format!("the sandbox needs Landlock: {why}")),
    };
    let namespace = match network {
        Network::Host => Namespace::None,
        _ if offer.root => Namespace::Net,
        _ => match &offer.userns {
            Ok(()) => Namespace::UserNet,
            Err(why) => {
                return Err(format!(
                    "`network \"{}\"` needs a network namespace, which an unprivileged daemon creates inside a user namespace: {why}",
                    network.as_str()
                ));
            }
        },
    };
    Ok(Enforcement {
        landlock,
        network,
        namespace,
    })
}

/// The Landlock ABI version of the running kernel.
fn landlock_abi() -> Result<i32, String> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    #[allow(unsafe_code)]
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) reads nothing and
    // returns the ABI version or -1; it creates no file descriptor.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if abi > 0 {
        return Ok(i32::try_from(abi).unwrap_or(i32::MAX));
    }
    let error = std::io::Error::last_os_error();
    Err(match error.raw_os_error() {
        Some(libc::ENOSYS) => "the kernel is built without Landlock (CONFIG_SECURITY_LANDLOCK)".into(),
        Some(libc::EOPNOTSUPP) => {
            "Landlock is built in but not enabled at boot (add `landlock` to the kernel's `lsm=` list)".into()
        }
        _ => format!("cannot query Landlock: {error}"),
    })
}

/// Whether this kernel lets an unprivileged process create a user
/// namespace, from the sysctls that forbid it.
fn userns_allowed() -> Result<(), String> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    if read("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Err("user namespaces are disabled (user.max_user_namespaces = 0)".into());
    }
    if read("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Err(
            "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)"
                .into(),
        );
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        return Err("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1)".into());
    }
    Ok(())
}

/// What a generation may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Readable and executable (directories: everything beneath).
    pub read: Vec<PathBuf>,
    /// Readable, writable and executable.
    pub write: Vec<PathBuf>,
    /// Device files, readable and writable.
    pub devices: Vec<PathBuf>,
    /// Defaults that may be missing on this system (`/lib32`, `/dev/tty`
    /// without a terminal): skipped if they are. Paths the unit names must
    /// exist.
    pub optional: Vec<PathBuf>,
}

/// Where a generation runs, for [`grants`].
#[derive(Debug, Clone, Copy)]
pub struct Site<'a> {
    /// The program as the plan resolved it (absolute).
    pub program: &'a Path,
    /// The working directory when the unit sets one.
    pub working_directory: Option<&'a Path>,
    /// The private temp directory (`TMPDIR`).
    pub tmpdir: &'a Path,
    /// The generation's credentials directory, readable (DESIGN §16).
    pub credentials: Option<&'a Path>,
    /// The child's PATH, to find a `#!/usr/bin/env NAME` interpreter.
    pub path: &'a OsStr,
    /// The child's HOME: a prefix is never the whole home directory.
    pub home: &'a Path,
}

/// The paths a sandboxed generation may reach (DESIGN §10): system
/// directories, the installation prefix of its program and of the
/// interpreters its `#!` lines name (as named and as resolved through
/// symlinks), its working directory, the private temp directory, the
/// target of `/etc/resolv.conf` and what the unit grants.
pub fn grants(sandbox: &Sandbox, site: Site<'_>) -> Grants {
    let mut g = Grants::default();
    for dir in SYSTEM_DIRS {
        g.read.push(PathBuf::from(dir));
        g.optional.push(PathBuf::from(dir));
    }
    for program in programs(site.program, site.path) {
        // Without a prefix, the program file alone.
        g.read.push(prefix(&program, site.home).unwrap_or(program));
    }
    // On systemd systems this is a symlink into /run.
    if let Ok(resolv) = std::fs::canonicalize("/etc/resolv.conf") {
        g.read.push(resolv);
    }
    g.read.extend(site.working_directory.map(Path::to_owned));
    g.read.extend(site.credentials.map(Path::to_owned));
    g.read.extend(sandbox.read_only.iter().cloned());
    g.write.push(site.tmpdir.to_owned());
    g.write.extend(sandbox.read_write.iter().cloned());
    for device in DEVICES {
        g.devices.push(PathBuf::from(device));
        g.optional.push(PathBuf::from(device));
    }
    dedup(&mut g.read);
    g
}

fn dedup(paths: &mut Vec<PathBuf>) {
    let mut seen = std::collections::HashSet::new();
    paths.retain(|p| seen.insert(p.clone()));
}

/// The program, then each interpreter its `#!` line names (following a
/// chain of scripts a few deep), each as named and as resolved.
fn programs(program: &Path, path: &OsStr) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut next = Some(program.to_owned());
    for _ in 0..4 {
        let Some(named) = next.take() else { break };
        let resolved = std::fs::canonicalize(&named).unwrap_or_else(|_| named.clone());
        out.push(named);
        out.push(resolved.clone());
        next = first_line(&resolved)
            .and_then(|line| interpreter(&line))
            .and_then(|interp| match interp {
                Interpreter::Path(p) => Some(p),
                Interpreter::Search(name) => std::env::split_paths(path)
                    .map(|dir| dir.join(&name))
                    .find(|p| p.is_file()),
            });
    }
    out
}

/// The first line of a file, if it starts with `#!`.
fn first_line(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let head = &head[..n];
    if !head.starts_with(b"#!") {
        return None;
    }
    let end = memchr::memchr(b'\n', head).unwrap_or(head.len());
    String::from_utf8(head[..end].to_vec()).ok()
}

/// The interpreter a `#!` line names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Interpreter {
    Path(PathBuf),
    /// `#!/usr/bin/env NAME`: NAME looked up in PATH.
    Search(String),
}

fn interpreter(line: &str) -> Option<Interpreter> {
    let mut words = line.strip_prefix("#!")?.split_whitespace();
    let program = words.next()?;
    if Path::new(program).file_name() == Some(OsStr::new("env")) {
        // `env -S node --flag`, `env node`: the first word that is not an
        // option of env's.
        let name = words.find(|w| !w.starts_with('-'))?;
        return Some(if name.contains('/') {
            Interpreter::Path(PathBuf::from(name))
        } else {
            Interpreter::Search(name.to_owned())
        });
    }
    program
        .starts_with('/')
        .then(|| Interpreter::Path(PathBuf::from(program)))
}

/// Directories far wider than any installation: a prefix is never one.
const BROAD: &[&str] = &[
    "/",
    "/tmp",
    "/var",
    "/var/tmp",
    "/var/lib",
    "/var/cache",
    "/var/log",
    "/dev/shm",
    "/run",
    "/srv",
    "/mnt",
    "/media",
    "/home",
    "/root",
];

/// The installation prefix of `program`: the parent of the directory that
/// holds it (`/opt/venv/bin/tool` → `/opt/venv`), so its libraries and
/// data are readable. Never `/`, a shared directory such as `/tmp` or
/// `/var/lib`, anyone's home directory or a directory directly in the
/// user's home (`~/.local` and `~/.cargo` hold keyrings and credentials):
/// then only the program's own directory, or (when that is one of them) no
/// prefix at all.
fn prefix(program: &Path, home: &Path) -> Option<PathBuf> {
    let home = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_owned());
    let broad = |p: &Path| {
        p.as_os_str().is_empty()
            || p == home
            || p.parent() == Some(home.as_path())
            || p.parent() == Some(Path::new("/home"))
            || BROAD.iter().any(|b| p == Path::new(b))
    };
    let dir = program.parent()?;
    if broad(dir) {
        return None;
    }
    match dir.parent() {
        Some(parent) if !broad(parent) => Some(parent.to_owned()),
        _ => Some(dir.to_owned()),
    }
}

/// The parts of a sandbox applied in the child, prepared before the fork so
/// that the child only makes system calls.
#[derive(Debug)]
pub struct Confinement {
    /// The Landlock ruleset; taken by [`Confinement::restrict`].
    ruleset: Option<OwnedFd>,
    namespace: Namespace,
    loopback: bool,
    /// `/proc/self/uid_map` and `gid_map` lines for [`Namespace::UserNet`].
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// The server runs as root: it gives up every capability, so that
    /// uid 0 is only an owner of files (no module loading, no BPF, no
    /// reboot, no raw devices), and cannot get them back by exec.
    drop_capabilities: bool,
}

/// What failed in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    Namespace,
    IdMap,
    Loopback,
    NoNewPrivs,
    Capabilities,
    Landlock,
}

impl Failed {
    pub fn what(self) -> &'static str {
        match self {
            Failed::Namespace => "creating its network namespace",
            Failed::IdMap => "mapping its uid and gid into its user namespace",
            Failed::Loopback => "bringing up its private loopback",
            Failed::NoNewPrivs => "setting no_new_privs",
            Failed::Capabilities => "dropping its capabilities",
            Failed::Landlock => "entering its Landlock domain",
        }
    }
}

impl Confinement {
    /// Opens every granted path and builds the ruleset. `ids` are the
    /// daemon's own uid and gid (mapped into a user namespace); `as_root`:
    /// the server will run as uid 0.
    pub fn prepare(
        enforcement: Enforcement,
        grants: &Grants,
        ids: (u32, u32),
        as_root: bool,
    ) -> Result<Self, String> {
        let abi = ABI::from(enforcement.landlock);
        let text = |e: landlock::RulesetError| format!("cannot build the Landlock ruleset: {e}");
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))
            .map_err(text)?;
        let scopes = Scope::from_all(abi);
        if !scopes.is_empty() {
            // Abstract unix sockets and signals outside the sandbox (v6).
            ruleset = ruleset.scope(scopes).map_err(text)?;
        }
        let mut created = ruleset.create().map_err(text)?;
        let read = AccessFs::from_read(abi);
        let all = AccessFs::from_all(abi);
        let device = AccessFs::from_file(abi) & !AccessFs::Execute;
        let groups: [(&[PathBuf], BitFlags<AccessFs>, &str); 3] = [
            (&grants.read, read, "read"),
            (&grants.write, all, "read-write"),
            (&grants.devices, device, "device"),
        ];
        for (paths, access, kind) in groups {
            for path in paths {
                let fd = match PathFd::new(path) {
                    Ok(fd) => fd,
                    Err(_) if grants.optional.contains(path) => continue,
                    Err(landlock::PathFdError::OpenCall { source, .. }) => {
                        return Err(format!("sandbox {kind} path {}: {source}", path.display()));
                    }
                    Err(e) => return Err(format!("sandbox {kind} path {}: {e}", path.display())),
                };
                let access = if path.is_dir() {
                    access
                } else {
                    access & AccessFs::from_file(abi)
                };
                created = created
                    .add_rule(PathBeneath::new(fd, access))
                    .map_err(|e| format!("sandbox {kind} path {}: {e}", path.display()))?;
            }
        }
        let ruleset: Option<OwnedFd> = created.into();
        let ruleset = ruleset.ok_or("cannot build the Landlock ruleset: the kernel gave none")?;
        Ok(Self {
            ruleset: Some(ruleset),
            namespace: enforcement.namespace,
            loopback: enforcement.network == Network::Loopback,
            uid_map: format!("{0} {0} 1\n", ids.0).into_bytes(),
            gid_map: format!("{0} {0} 1\n", ids.1).into_bytes(),
            drop_capabilities: as_root,
        })
    }

    /// In the child, while it still has the daemon's privileges: the
    /// network namespace (inside a user namespace for an unprivileged
    /// daemon) and its loopback.
    pub fn enter_namespace(&self) -> Result<(), (Failed, rustix::io::Errno)> {
        use rustix::thread::UnshareFlags;
        let flags = match self.namespace {
            Namespace::None => return Ok(()),
            Namespace::Net => UnshareFlags::NEWNET,
            Namespace::UserNet => UnshareFlags::NEWUSER | UnshareFlags::NEWNET,
        };
        #[allow(unsafe_code)]
        // SAFETY: the child has one thread and shares nothing that
        // unsharing a user or network namespace could invalidate.
        unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(|e| (Failed::Namespace, e))?;
        if self.namespace == Namespace::UserNet {
            let write = |path: &std::ffi::CStr, line: &[u8]| -> rustix::io::Result<()> {
                let fd = rustix::fs::open(
                    path,
                    rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?;
                rustix::io::write(&fd, line).map(|_| ())
            };
            let map = |e| (Failed::IdMap, e);
            // An unprivileged process maps its own ids only, and its gid
            // only once it gives up setgroups(2).
            write(c"/proc/self/setgroups", b"deny").map_err(map)?;
            write(c"/proc/self/uid_map", &self.uid_map).map_err(map)?;
            write(c"/proc/self/gid_map", &self.gid_map).map_err(map)?;
        }
        if self.loopback {
            loopback_up().map_err(|e| (Failed::Loopback, e))?;
        }
        Ok(())
    }

    /// In the child, last before exec: `no_new_privs` (a setuid program
    /// gains nothing) and the Landlock domain.
    pub fn restrict(&mut self) -> Result<(), (Failed, rustix::io::Errno)> {
        rustix::thread::set_no_new_privs(true).map_err(|e| (Failed::NoNewPrivs, e))?;
        if self.drop_capabilities {
            drop_capabilities().map_err(|e| (Failed::Capabilities, e))?;
        }
        let Some(ruleset) = self.ruleset.take() else {
            return Err((Failed::Landlock, rustix::io::Errno::BADF));
        };
        #[allow(unsafe_code)]
        // SAFETY: landlock_restrict_self(fd, 0) takes a ruleset file
        // descriptor we own and no pointers.
        let done = unsafe {
            libc::syscall(
                libc::SYS_landlock_restrict_self,
                ruleset.as_raw_fd(),
                0 as libc::c_uint,
            )
        };
        if done != 0 {
            return Err((
                Failed::Landlock,
                rustix::io::Errno::from_raw_os_error(errno()),
            ));
        }
        Ok(())
    }
}

/// Empties the bounding set (so exec as root grants nothing), then the
/// thread's own sets.
fn drop_capabilities() -> rustix::io::Result<()> {
    for cap in 0..64 {
        #[allow(unsafe_code)]
        // SAFETY: prctl(PR_CAPBSET_DROP, cap) takes two integers.
        let done = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        // EINVAL: past the kernel's last capability.
        if done != 0 && errno() != libc::EINVAL {
            return Err(rustix::io::Errno::from_raw_os_error(errno()));
        }
    }
    rustix::thread::clear_ambient_capability_set()?;
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: rustix::thread::CapabilitySet::empty(),
            permitted: rustix::thread::CapabilitySet::empty(),
            inheritable: rustix::thread::CapabilitySet::empty(),
        },
    )
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EPERM)
}

/// `ip link set lo up` in the current network namespace.
fn loopback_up() -> rustix::io::Result<()> {
    use rustix::net::{AddressFamily, SocketType};
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    let socket = rustix::net::socket(AddressFamily::INET, SocketType::DGRAM, None)?;
    let mut name = [0u8; 16];
    name[..2].copy_from_slice(b"lo");
    let mut req = IfReq {
        name,
        flags: 0,
        _pad: [0; 22],
    };
    #[allow(unsafe_code)]
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write a `struct ifreq`,
    // which `IfReq` lays out (name, then the flags in the union, padded to
    // its 40 bytes).
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(rustix::io::Errno::from_raw_os_error(errno()));
        }
        req.flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(rustix::io::Errno::from_raw_os_error(errno()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(landlock: Result<i32, &str>, root: bool, userns: Result<(), &str>) -> Offer {
        Offer {
            landlock: landlock.map_err(str::to_owned),
            root,
            userns: userns.map_err(str::to_owned),
        }
    }

    #[test]
    fn the_kernel_gives_what_the_unit_asks_or_the_start_fails_saying_what_is_missing() {
        use Namespace as Ns;
        use Network::{Host, Loopback, None as Off};
        let no_userns = Err("unprivileged user namespaces are disabled");
        type Want = Result<(i32, Namespace), &'static str>;
        let table: &[(Network, Offer, Want)] = &[
            // Everything there.
            (Off, offer(Ok(7), false, Ok(())), Ok((7, Ns::UserNet))),
            (Loopback, offer(Ok(7), false, Ok(())), Ok((7, Ns::UserNet))),
            (Host, offer(Ok(7), false, Ok(())), Ok((7, Ns::None))),
            // Root needs no user namespace.
            (Off, offer(Ok(6), true, no_userns), Ok((6, Ns::Net))),
            (Loopback, offer(Ok(3), true, no_userns), Ok((3, Ns::Net))),
            // No user namespaces: only the host's network.
            (Host, offer(Ok(7), false, no_userns), Ok((7, Ns::None))),
            (
                Off,
                offer(Ok(7), false, no_userns),
                Err("needs a network namespace"),
            ),
            (
                Loopback,
                offer(Ok(7), false, no_userns),
                Err("user namespaces are disabled"),
            ),
            // Landlock missing or too old: never unconfined.
            (
                Host,
                offer(Err("not enabled at boot"), true, Ok(())),
                Err("not enabled at boot"),
            ),
            (Host, offer(Ok(2), true, Ok(())), Err("ABI v2")),
            (Off, offer(Ok(1), false, Ok(())), Err("needs v3")),
        ];
        for (network, offer, want) in table {
            let got = decide(*network, offer);
            match (want, &got) {
                (Ok((abi, ns)), Ok(e)) => {
                    assert_eq!((e.landlock, e.namespace, e.network), (*abi, *ns, *network));
                }
                (Err(part), Err(why)) => assert!(why.contains(part), "{why} lacks {part:?}"),
                _ => panic!("{network:?} with {offer:?}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_level_reads_as_status_shows_it() {
        let e = decide(Network::None, &offer(Ok(7), false, Ok(()))).expect("ok");
        assert_eq!(e.to_string(), "landlock v7, network none");
    }

    #[test]
    fn interpreters_are_read_off_the_first_line() {
        let p = |s: &str| Some(Interpreter::Path(PathBuf::from(s)));
        let search = |s: &str| Some(Interpreter::Search(s.to_owned()));
        let table = [
            ("#!/usr/bin/python3", p("/usr/bin/python3")),
            ("#! /opt/venv/bin/python -E", p("/opt/venv/bin/python")),
            ("#!/usr/bin/env node", search("node")),
            ("#!/usr/bin/env -S node --no-warnings", search("node")),
            ("#!/bin/env /opt/node/bin/node", p("/opt/node/bin/node")),
            ("#!relative", None),
            ("#!", None),
            ("#!/usr/bin/env", None),
        ];
        for (line, want) in table {
            assert_eq!(interpreter(line), want, "{line}");
        }
    }

    #[test]
    fn a_prefix_is_the_installation_never_the_root_or_home() {
        let home = Path::new("/home/u");
        let table = [
            ("/opt/venv/bin/tool", Some("/opt/venv")),
            (
                "/home/u/.pyenv/versions/3.11/bin/python3.11",
                Some("/home/u/.pyenv/versions/3.11"),
            ),
            ("/usr/bin/node", Some("/usr")),
            // Parent would be / or the home directory: the program's own.
            ("/bin/sh", Some("/bin")),
            ("/home/u/bin/tool", None),
            ("/tmp/build/server", Some("/tmp/build")),
            // Never a directory directly in home, nor anyone's home.
            ("/home/u/.local/bin/uvx", Some("/home/u/.local/bin")),
            ("/home/u/.cargo/bin/tool", Some("/home/u/.cargo/bin")),
            (
                "/home/u/.nvm/versions/node/v20/bin/node",
                Some("/home/u/.nvm/versions/node/v20"),
            ),
            ("/var/lib/tool/server", Some("/var/lib/tool")),
            // Directly in / or home: nothing beyond the program itself.
            ("/tool", None),
            ("/home/u/tool", None),
            ("/tmp/server", None),
            ("/home/other/server", None),
        ];
        for (program, want) in table {
            assert_eq!(
                prefix(Path::new(program), home),
                want.map(PathBuf::from),
                "{program}"
            );
        }
    }

    #[test]
    fn a_script_grants_its_interpreter_as_named_and_as_resolved() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("versions/3.11/bin");
        let venv = dir.path().join("venv/bin");
        std::fs::create_dir_all(&real).expect("mkdir");
        std::fs::create_dir_all(&venv).expect("mkdir");
        std::fs::write(real.join("python3.11"), "\x7fELF").expect("write");
        std::os::unix::fs::symlink(real.join("python3.11"), venv.join("python")).expect("ln");
        let script = venv.join("tool");
        std::fs::write(
            &script,
            format!("#!{}\nimport x\n", venv.join("python").display()),
        )
        .expect("write");
        let found = programs(&script, OsStr::new("/usr/bin"));
        assert!(found.contains(&venv.join("python")), "{found:?}");
        assert!(found.contains(&real.join("python3.11")), "{found:?}");
        let g = grants(
            &Sandbox::default(),
            Site {
                program: &script,
                working_directory: None,
                tmpdir: Path::new("/run/x/tmp"),
                credentials: None,
                path: OsStr::new("/usr/bin"),
                home: Path::new("/nonexistent"),
            },
        );
        assert!(g.read.contains(&dir.path().join("venv")), "{:?}", g.read);
        assert!(
            g.read.contains(&dir.path().join("versions/3.11")),
            "{:?}",
            g.read
        );
        assert_eq!(g.write, vec![PathBuf::from("/run/x/tmp")]);
    }
}
