//! Child processes of stdio units: what to run, as whom, with what
//! environment; spawning it in its own process group; signalling the group.
//!
//! [`plan`] decides everything that can fail with a clear reason (program
//! not found, working directory missing, env-file missing or malformed,
//! unknown user) before anything is forked; [`spawn`] then only forks and
//! execs. The child gets a clean environment (DESIGN §2): PATH, HOME and
//! LANG from the daemon (HOME, USER, LOGNAME and SHELL of the target user
//! when `user` is set), then the env-files, `pass-env` and `env`.
//!
//! A child with a cgroup is forked straight into it by
//! `clone3(CLONE_INTO_CGROUP | CLONE_PIDFD)` (`clone3_into`, the one
//! hand-written fork: only system calls on what was made before it, then
//! `execve`; waited for on its pidfd), falling back to `std`'s fork with the
//! child writing its `cgroup.procs` before exec when the kernel refuses (said
//! once). A failing step in the child is named to the parent by one byte on
//! a pipe. Every server is forked on one of a few long-lived `mcpd-forker`
//! threads ([`spawn_on_forker`] says why neither the event loop nor the
//! blocking pool).

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::unit::{Instance, StdioSpec};

use super::cgroup::Placement;
use super::envfile;
use super::machine::Signal;
use super::sandbox::{Confinement, Failed};

/// PATH for children when the daemon has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the daemon knows about itself when it spawns.
#[derive(Debug, Clone)]
pub struct Host {
    pub instance: Instance,
    /// The daemon's effective uid.
    pub euid: u32,
    /// The `RLIMIT_NOFILE` children start with, when the daemon raised its
    /// own (`None`: they inherit the daemon's).
    pub child_nofile: Option<rustix::process::Rlimit>,
    /// Where servers' cgroups go; `None`: process groups only.
    pub cgroups: Option<super::cgroup::Cgroups>,
    /// What the kernel offers a `sandbox`.
    pub sandbox: super::sandbox::Offer,
    /// Where sandboxed servers' private temp directories are made (the
    /// daemon's runtime directory's `tmp`, emptied at start).
    pub scratch: PathBuf,
    /// Where credentials come from and go (DESIGN §16).
    pub credentials: super::credentials::Stores,
    /// Where logins are kept (DESIGN §17: `STATE/oauth`).
    pub logins: PathBuf,
    /// mcpd's Client ID Metadata Document (`mcpd.kdl` `oauth`).
    pub client_metadata_url: Option<String>,
}

impl Host {
    pub fn current(instance: Instance, child_nofile: Option<rustix::process::Rlimit>) -> Self {
        Self {
            instance,
            euid: rustix::process::geteuid().as_raw(),
            child_nofile,
            cgroups: None,
            sandbox: super::sandbox::Offer::probe(rustix::process::geteuid().as_raw()),
            scratch: std::env::temp_dir(),
            credentials: super::credentials::Stores::new(
                instance,
                rustix::process::geteuid().as_raw(),
                std::env::temp_dir(),
            ),
            logins: super::oauth::dir(&instance.state_dir()),
            client_metadata_url: None,
        }
    }
}

/// The user a child runs as, resolved before forking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Everything needed to exec a child; built by [`plan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Absolute path of the program.
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, OsString)>,
    pub cwd: PathBuf,
    /// Switch to this user (only when the daemon is root).
    pub credentials: Option<Credentials>,
    /// Set `RLIMIT_NOFILE` to this before exec ([`Host::child_nofile`]).
    pub nofile: Option<rustix::process::Rlimit>,
    /// Set `RLIMIT_CORE` to this before exec (`limits.core`).
    pub core: Option<rustix::process::Rlimit>,
}

/// Resolves a unit's stdio spec against the daemon's environment (`env`
/// looks up the daemon's variables). Reads env-files now: they are read at
/// every spawn, so edits apply on the next start. `private_tmp` is a
/// sandboxed generation's temp directory: its `TMPDIR` (unless the unit
/// sets one) and its working directory unless the unit names one.
pub fn plan(
    spec: &StdioSpec,
    host: &Host,
    env: &dyn Fn(&str) -> Option<OsString>,
    private_tmp: Option<&Path>,
) -> Result<Plan, String> {
    let mut target_home = None;
    let mut user_env = Vec::new();
    let mut credentials = None;
    if let Some(user) = spec.user() {
        let entry = lookup_user(user)?;
        if entry.uid.as_raw() != host.euid {
            if host.euid != 0 {
                return Err(format!(
                    "user {user}: the daemon runs as uid {}, and only root can run a server as another user",
                    host.euid
                ));
            }
            let name = std::ffi::CString::new(entry.name.clone())
                .map_err(|_| format!("user {user}: invalid name"))?;
            let groups = nix::unistd::getgrouplist(&name, entry.gid)
                .map_err(|e| format!("user {user}: cannot list its groups: {e}"))?;
            credentials = Some(Credentials {
                uid: entry.uid.as_raw(),
                gid: entry.gid.as_raw(),
                groups: groups.iter().map(|g| g.as_raw()).collect(),
            });
        }
        target_home = Some(entry.dir.clone());
        user_env.push(("USER".to_owned(), OsString::from(&entry.name)));
        user_env.push(("LOGNAME".to_owned(), OsString::from(&entry.name)));
        user_env.push(("SHELL".to_owned(), entry.shell.clone().into_os_string()));
    }

    let path = env("PATH")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.into());
    let home = target_home
        .map(PathBuf::into_os_string)
        .or_else(|| env("HOME"))
        .unwrap_or_else(|| "/".into());

    let cwd = match (spec.working_directory(), private_tmp) {
        (Some(dir), _) => dir.to_owned(),
        (None, Some(tmp)) => tmp.to_owned(),
        (None, None) => match host.instance {
            Instance::System => PathBuf::from("/"),
            Instance::User => PathBuf::from(&home),
        },
    };
    match std::fs::metadata(&cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(format!(
                "working directory {}: not a directory",
                cwd.display()
            ));
        }
        Err(e) => return Err(format!("working directory {}: {e}", cwd.display())),
    }

    let mut vars: Vec<(String, OsString)> =
        vec![("PATH".into(), path.clone()), ("HOME".into(), home)];
    if let Some(tmp) = private_tmp {
        vars.push(("TMPDIR".into(), tmp.as_os_str().to_owned()));
    }
    if let Some(lang) = env("LANG") {
        vars.push(("LANG".into(), lang));
    }
    vars.extend(user_env);
    for file in spec.env_files() {
        for (k, v) in envfile::read(file)? {
            set(&mut vars, k, v.into());
        }
    }
    for name in spec.pass_env() {
        // (UnitSpec rejects the service manager's variables.)
        if let Some(value) = env(name) {
            set(&mut vars, name.clone(), value);
        }
    }
    for (k, v) in spec.env() {
        set(&mut vars, k.clone(), v.into());
    }

    let program = resolve(spec.program(), &path)?;
    Ok(Plan {
        program,
        args: spec.args().to_vec(),
        env: vars,
        cwd,
        credentials,
        nofile: host.child_nofile,
        core: None,
    })
}

impl Plan {
    /// The value the child gets for `key`.
    pub fn var(&self, key: &str) -> Option<&OsString> {
        self.env.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Sets `key` for the child (credentials, DESIGN §16).
    pub fn set_var(&mut self, key: &str, value: OsString) {
        set(&mut self.env, key.to_owned(), value);
    }
}

fn set(vars: &mut Vec<(String, OsString)>, key: String, value: OsString) {
    match vars.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => vars.push((key, value)),
    }
}

/// A user by name or numeric uid.
fn lookup_user(user: &str) -> Result<nix::unistd::User, String> {
    let found = match user.parse::<u32>() {
        Ok(uid) => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)),
        Err(_) => nix::unistd::User::from_name(user),
    };
    match found {
        Ok(Some(entry)) => Ok(entry),
        Ok(None) => Err(format!("user {user}: no such user")),
        Err(e) => Err(format!("user {user}: cannot look it up: {e}")),
    }
}

/// An absolute program path, or a bare name found in `path`.
fn resolve(program: &str, path: &OsString) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.starts_with('/') {
        let p = PathBuf::from(program);
        return if executable(&p) {
            Ok(p)
        } else if p.exists() {
            Err(format!("command {program}: not an executable file"))
        } else {
            Err(format!("command {program}: no such file"))
        };
    }
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| {
            format!(
                "command {program}: not found in PATH ({})",
                path.to_string_lossy()
            )
        })
}

/// A step of the child's set-up before exec, named when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Session,
    Cgroup,
    DeathSignal,
    Nofile,
    Core,
    ParentGone,
    Credentials,
    /// A step of the sandbox's ([`Confinement`]).
    Sandbox(Failed),
}

impl Step {
    const ALL: [Step; 13] = [
        Step::Session,
        Step::Cgroup,
        Step::DeathSignal,
        Step::Nofile,
        Step::Core,
        Step::ParentGone,
        Step::Credentials,
        Step::Sandbox(Failed::Namespace),
        Step::Sandbox(Failed::IdMap),
        Step::Sandbox(Failed::Loopback),
        Step::Sandbox(Failed::NoNewPrivs),
        Step::Sandbox(Failed::Capabilities),
        Step::Sandbox(Failed::Landlock),
    ];

    /// The byte the child reports it by: its place in [`Step::ALL`], from 1.
    fn byte(self) -> u8 {
        Step::ALL
            .iter()
            .position(|s| *s == self)
            .map_or(0, |i| i as u8 + 1)
    }

    fn from_byte(byte: u8) -> Option<Step> {
        Step::ALL.get(usize::from(byte).checked_sub(1)?).copied()
    }

    fn what(self) -> &'static str {
        match self {
            Step::Session => "starting its own session",
            Step::Cgroup => "joining its cgroup",
            Step::DeathSignal => "setting its parent-death signal",
            Step::Nofile => "setting its file descriptor limit",
            Step::Core => "setting its core dump limit",
            Step::ParentGone => "checking that the daemon is still there",
            Step::Credentials => "switching to its user",
            Step::Sandbox(failed) => failed.what(),
        }
    }
}

/// A started child: its pid, the daemon's ends of its stdio pipes, and
/// its exit to wait for. Dropped before it is reaped, it is killed.
#[derive(Debug)]
pub struct Child {
    pub pid: u32,
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub exit: Exit,
}

/// A child's exit, to wait for ([`Exit::wait`]).
#[derive(Debug)]
pub struct Exit(Waiter);

#[derive(Debug)]
enum Waiter {
    /// Forked by `std` (killed on drop and reaped by tokio).
    Std(tokio::process::Child),
    /// Forked by [`clone3_into`]: its pidfd, until it is reaped.
    Pidfd(Option<OwnedFd>),
}

impl Exit {
    /// Waits for the child to exit and reaps it.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match &mut self.0 {
            Waiter::Std(child) => child.wait().await,
            Waiter::Pidfd(slot) => {
                let pidfd = slot
                    .as_ref()
                    .ok_or_else(|| std::io::Error::other("the child was already reaped"))?
                    .try_clone()?;
                let status = reap(pidfd).await?;
                *slot = None;
                Ok(status)
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // As tokio's `kill_on_drop`: a child nobody waits for any more is
        // killed, and reaped where a runtime is there to do it.
        if let Waiter::Pidfd(slot) = self
            && let Some(pidfd) = slot.take()
        {
            let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(reap(pidfd));
            }
        }
    }
}

/// Waits for the process of `pidfd` to exit and reaps it.
async fn reap(pidfd: OwnedFd) -> std::io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    #[allow(unsafe_code)]
    // SAFETY: the AsyncFd owns the pidfd, which stays open as long as it.
    let watched = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }?;
    loop {
        // A pidfd is readable once its process has exited.
        let mut ready = watched.readable().await?;
        let reaped = rustix::process::waitid(
            rustix::process::WaitId::PidFd(watched.get_ref().as_fd()),
            rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
        )?;
        let Some(status) = reaped else {
            ready.clear_ready();
            continue;
        };
        // As the kernel encodes it for wait(2).
        let raw = match (status.exit_status(), status.terminating_signal()) {
            (Some(code), _) => (code & 0xff) << 8,
            (None, Some(signal)) => signal | if status.dumped() { 0x80 } else { 0 },
            (None, None) => 0xff << 8,
        };
        return Ok(std::process::ExitStatus::from_raw(raw));
    }
}

/// How children get into their cgroups, decided at the first start of a
/// server with one and said once.
static INTO_CGROUP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// What the child does between fork and exec, besides its stdio: every
/// value made before the fork, so that it allocates nothing.
struct SetUp {
    session: bool,
    /// The cgroup's `cgroup.procs`, when the child must join it itself.
    procs: Option<OwnedFd>,
    parent: rustix::process::Pid,
    creds: Option<(
        rustix::process::Uid,
        rustix::process::Gid,
        Vec<rustix::process::Gid>,
    )>,
    nofile: Option<rustix::process::Rlimit>,
    core: Option<rustix::process::Rlimit>,
    confinement: Option<Confinement>,
}

impl SetUp {
    fn new(plan: &Plan, confinement: Option<Confinement>) -> Self {
        use rustix::process::{Gid, Uid};
        Self {
            // A sandboxed child leads a session of its own (setsid below,
            // which a process group leader may not call): no controlling
            // terminal to push input into. Either way it leads its own
            // process group.
            session: confinement.is_some(),
            procs: None,
            parent: rustix::process::getpid(),
            creds: plan.credentials.as_ref().map(|c| {
                (
                    Uid::from_raw(c.uid),
                    Gid::from_raw(c.gid),
                    c.groups.iter().map(|g| Gid::from_raw(*g)).collect(),
                )
            }),
            nofile: plan.nofile,
            core: plan.core,
            confinement,
        }
    }

    /// Runs in the child, after its stdio, working directory and process
    /// group are set: only system calls, no allocation.
    fn run(&mut self) -> Result<(), (Step, rustix::io::Errno)> {
        if self.session {
            rustix::process::setsid().map_err(|e| (Step::Session, e))?;
        }
        if let Some(procs) = &self.procs {
            // "0": the writing process, before it can fork anything.
            rustix::io::write(procs, b"0").map_err(|e| (Step::Cgroup, e))?;
        }
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(|e| (Step::DeathSignal, e))?;
        if let Some(limit) = self.nofile {
            rustix::process::setrlimit(rustix::process::Resource::Nofile, limit)
                .map_err(|e| (Step::Nofile, e))?;
        }
        if let Some(limit) = self.core {
            rustix::process::setrlimit(rustix::process::Resource::Core, limit)
                .map_err(|e| (Step::Core, e))?;
        }
        // The daemon may have died between fork and prctl.
        if rustix::process::getppid() != Some(self.parent) {
            return Err((Step::ParentGone, rustix::io::Errno::SRCH));
        }
        if let Some(c) = &self.confinement {
            c.enter_namespace()
                .map_err(|(f, e)| (Step::Sandbox(f), e))?;
        }
        if let Some((uid, gid, groups)) = &self.creds {
            let step = |e| (Step::Credentials, e);
            rustix::thread::set_thread_groups(groups).map_err(step)?;
            rustix::thread::set_thread_res_gid(*gid, *gid, *gid).map_err(step)?;
            rustix::thread::set_thread_res_uid(*uid, *uid, *uid).map_err(step)?;
            // A change of credentials clears the parent-death signal.
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(|e| (Step::DeathSignal, e))?;
            if rustix::process::getppid() != Some(self.parent) {
                return Err((Step::ParentGone, rustix::io::Errno::SRCH));
            }
        }
        if let Some(c) = &mut self.confinement {
            c.restrict().map_err(|(f, e)| (Step::Sandbox(f), e))?;
        }
        Ok(())
    }
}

/// Forks and execs `plan` in a new process group with piped stdio. The
/// child starts in the cgroup of `cgroup` (forked into it by `clone3`
/// where the kernel allows it, else joining it first thing), dies with
/// SIGKILL if the daemon's thread that spawned it goes away
/// (`PR_SET_PDEATHSIG`), gets `plan.nofile` as its `RLIMIT_NOFILE`,
/// enters the network namespace of `confinement`, runs as
/// `plan.credentials` when given, and enters its Landlock domain last. An
/// error names the step of that set-up that failed.
pub fn spawn(
    plan: &Plan,
    cgroup: Option<Placement>,
    confinement: Option<Confinement>,
) -> Result<Child, String> {
    let setup = SetUp::new(plan, confinement);
    let Some(placement) = cgroup else {
        return spawn_std(plan, setup);
    };
    if *INTO_CGROUP.get().unwrap_or(&true) {
        match spawn_into(plan, setup, &placement.dir) {
            Ok(child) => {
                INTO_CGROUP.get_or_init(|| {
                    tracing::info!(
                        "servers are forked straight into their cgroups (clone3 CLONE_INTO_CGROUP)"
                    );
                    true
                });
                return Ok(child);
            }
            Err(Refused::Not(errno, mut setup)) => {
                INTO_CGROUP.get_or_init(|| {
                    tracing::warn!(
                        "the kernel refuses to fork into a cgroup (clone3 CLONE_INTO_CGROUP: {}): servers join their cgroups after the fork, which costs milliseconds per start",
                        errno_text(&errno.into())
                    );
                    false
                });
                setup.procs = Some(placement.procs);
                return spawn_std(plan, *setup);
            }
            Err(Refused::Failed(why)) => return Err(why),
        }
    }
    let mut setup = setup;
    setup.procs = Some(placement.procs);
    spawn_std(plan, setup)
}

/// Why [`spawn_into`] did not start the child.
enum Refused {
    /// The kernel cannot fork into a cgroup (here): the set-up back.
    Not(rustix::io::Errno, Box<SetUp>),
    /// The start failed, saying why.
    Failed(String),
}

/// The daemon's ends of a child's stdio and the child's, kept at 3 and
/// above so that placing them on 0, 1 and 2 cannot overwrite one another.
struct Pipes {
    ours: [OwnedFd; 3],
    theirs: [OwnedFd; 3],
}

impl Pipes {
    fn new() -> rustix::io::Result<Self> {
        let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
        let high = |fd: OwnedFd| rustix::io::fcntl_dupfd_cloexec(&fd, 3);
        let (in_read, in_write) = pipe()?;
        let (out_read, out_write) = pipe()?;
        let (err_read, err_write) = pipe()?;
        Ok(Self {
            ours: [in_write, out_read, err_read],
            theirs: [high(in_read)?, high(out_write)?, high(err_write)?],
        })
    }
}

/// [`spawn`] by `clone3(CLONE_INTO_CGROUP)`: the child is in `cgroup`
/// from its first instruction, and no process ever moves (a move waits
/// for an RCU grace period: milliseconds).
fn spawn_into(plan: &Plan, mut setup: SetUp, cgroup: &OwnedFd) -> Result<Child, Refused> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let cannot =
        |why: String| Refused::Failed(format!("cannot start {}: {why}", plan.program.display()));
    let c = |bytes: &[u8]| {
        CString::new(bytes).map_err(|_| {
            cannot("a NUL byte in its command, environment or working directory".into())
        })
    };
    let program = c(plan.program.as_os_str().as_bytes())?;
    let cwd = c(plan.cwd.as_os_str().as_bytes())?;
    let mut args = vec![program.clone()];
    for arg in &plan.args {
        args.push(c(arg.as_bytes())?);
    }
    let mut env = Vec::with_capacity(plan.env.len());
    for (k, v) in &plan.env {
        let mut pair = k.as_bytes().to_vec();
        pair.push(b'=');
        pair.extend_from_slice(v.as_bytes());
        env.push(c(&pair)?);
    }
    let pipes = Pipes::new().map_err(|e| cannot(errno_text(&e.into())))?;
    // The child writes the step that failed and its errno here; the daemon
    // reads until the end: an exec closes it.
    let (reported, report) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| cannot(errno_text(&e.into())))?;
    let exec = Exec {
        program: &program,
        argv: args
            .iter()
            .map(|a| a.as_ptr())
            .chain([std::ptr::null()])
            .collect(),
        envp: env
            .iter()
            .map(|a| a.as_ptr())
            .chain([std::ptr::null()])
            .collect(),
        cwd: &cwd,
        stdio: &pipes.theirs,
        report: &report,
    };
    let (pid, pidfd) = match clone3_into(cgroup, &exec, &mut setup) {
        Ok(forked) => forked,
        Err(errno) if refusal(errno) => return Err(Refused::Not(errno, Box::new(setup))),
        Err(errno) => return Err(cannot(errno_text(&errno.into()))),
    };
    drop(exec);
    drop(report);
    let Pipes { ours, theirs } = pipes;
    drop(theirs);
    let mut message = [0u8; 5];
    let mut got = 0;
    while got < message.len() {
        match rustix::io::read(&reported, &mut message[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    let [stdin, stdout, stderr] = ours;
    let mut child = Child {
        pid: pid.as_raw_nonzero().get() as u32,
        stdin,
        stdout,
        stderr,
        exit: Exit(Waiter::Pidfd(Some(pidfd))),
    };
    if got == 0 {
        return Ok(child);
    }
    // The child failed before exec and exits: reap it here.
    if let Waiter::Pidfd(slot) = &mut child.exit.0
        && let Some(pidfd) = slot.take()
    {
        let _ = rustix::process::waitid(
            rustix::process::WaitId::PidFd(pidfd.as_fd()),
            rustix::process::WaitIdOptions::EXITED,
        );
    }
    let errno = i32::from_le_bytes([message[1], message[2], message[3], message[4]]);
    let e = std::io::Error::from_raw_os_error(errno);
    Err(Refused::Failed(failure(
        plan,
        Step::from_byte(message[0]),
        &e,
    )))
}

/// Errors by which the kernel says it cannot fork into a cgroup at all or
/// not into this one: too old (ENOSYS, E2BIG), not a cgroup v2 directory or
/// a threaded one (EINVAL, EOPNOTSUPP), not allowed (EPERM, EACCES), or one
/// that may not hold processes (EBUSY).
fn refusal(errno: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    [
        Errno::NOSYS,
        Errno::TOOBIG,
        Errno::INVAL,
        Errno::OPNOTSUPP,
        Errno::PERM,
        Errno::ACCESS,
        Errno::BUSY,
    ]
    .contains(&errno)
}

/// What the child of [`clone3_into`] needs to exec, made before the fork.
struct Exec<'a> {
    program: &'a std::ffi::CStr,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: &'a std::ffi::CStr,
    /// The child's stdin, stdout and stderr.
    stdio: &'a [OwnedFd; 3],
    /// Where the child writes the step that failed and the errno.
    report: &'a OwnedFd,
}

/// `clone3(CLONE_INTO_CGROUP | CLONE_PIDFD)`: forks a child into
/// `cgroup`, which sets up (stdio, working directory, process group,
/// signals, `setup`) and execs `exec`, or reports the step that failed on
/// `exec.report` and exits 127. Returns its pid and pidfd.
///
/// The one place the daemon forks by hand: `std` cannot fork into a
/// cgroup, and rustix does not offer clone3.
#[allow(unsafe_code)]
fn clone3_into(
    cgroup: &OwnedFd,
    exec: &Exec<'_>,
    setup: &mut SetUp,
) -> rustix::io::Result<(rustix::process::Pid, OwnedFd)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    /// `struct clone_args` of linux/sched.h (as of 5.7).
    #[repr(C)]
    struct CloneArgs {
        flags: u64,
        pidfd: u64,
        child_tid: u64,
        parent_tid: u64,
        exit_signal: u64,
        stack: u64,
        stack_size: u64,
        tls: u64,
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }
    const CLONE_PIDFD: u64 = 0x1000;
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        child_tid: 0,
        parent_tid: 0,
        exit_signal: libc::SIGCHLD as u64,
        stack: 0,
        stack_size: 0,
        tls: 0,
        set_tid: 0,
        set_tid_size: 0,
        cgroup: cgroup.as_raw_fd() as u64,
    };
    // SAFETY: without CLONE_VM, clone3 is fork: the child gets a copy of
    // the address space (its stack included, `stack` 0), so returning twice
    // is as sound as fork's. `args` and `pidfd` outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOSYS),
        ));
    }
    if ret > 0 {
        // SAFETY: the kernel made `pidfd` for us with CLONE_PIDFD.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let pid = rustix::process::Pid::from_raw(ret as i32).ok_or(rustix::io::Errno::SRCH)?;
        return Ok((pid, pidfd));
    }
    // The child. It is a copy of a multithreaded process with one thread:
    // a lock another thread held (the allocator's) stays held, so it only
    // makes system calls (async-signal-safe, as std's `pre_exec` rules
    // want) on what was made before the fork, and leaves by exec or
    // `_exit`, never by returning or unwinding.
    let fail = |step: u8, errno: libc::c_int| -> ! {
        let [a, b, c, d] = errno.to_le_bytes();
        // SAFETY: write and _exit are async-signal-safe; the buffer lives.
        unsafe {
            libc::write(
                exec.report.as_raw_fd(),
                [step, a, b, c, d].as_ptr().cast(),
                5,
            );
            libc::_exit(127)
        }
    };
    let last = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    for (fd, target) in exec.stdio.iter().zip(0..) {
        // SAFETY: dup2 on descriptors we own (all at 3 or above), which
        // clears close-on-exec on the copy.
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            fail(0, last());
        }
    }
    // SAFETY: `cwd` is a NUL-terminated string made before the fork.
    if unsafe { libc::chdir(exec.cwd.as_ptr()) } < 0 {
        fail(0, last());
    }
    // SAFETY: setpgid, signal and sigprocmask take no pointers but the
    // empty signal set on this stack. As std does: its own process group,
    // SIGPIPE back to the default the daemon ignores, no signal blocked.
    unsafe {
        if !setup.session && libc::setpgid(0, 0) < 0 {
            fail(0, last());
        }
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
    if let Err((step, errno)) = setup.run() {
        fail(step.byte(), errno.raw_os_error());
    }
    // SAFETY: program, argv and envp are NUL-terminated strings and
    // null-terminated arrays of them, made before the fork and alive.
    unsafe {
        libc::execve(
            exec.program.as_ptr(),
            exec.argv.as_ptr(),
            exec.envp.as_ptr(),
        );
    }
    fail(0, last())
}

/// [`spawn`] by `std`'s fork and exec: a child in a cgroup joins it
/// itself, first thing (`setup.procs`).
fn spawn_std(plan: &Plan, setup: SetUp) -> Result<Child, String> {
    let mut cmd = tokio::process::Command::new(&plan.program);
    cmd.args(&plan.args)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&plan.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if !setup.session {
        cmd.process_group(0);
    }
    // The child writes the step that failed here (one byte) before it
    // reports the error number the usual way.
    let (report, reported) = rustix::pipe::pipe_with(
        rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
    )
    .map_err(|e| format!("cannot start {}: {e}", plan.program.display()))?;
    let mut setup = setup;
    let pre_exec = move || -> std::io::Result<()> {
        setup.run().map_err(|(step, errno)| {
            let _ = rustix::io::write(&report, &[step.byte()]);
            errno.into()
        })
    };
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before exec. It only makes
    // raw system calls through rustix and libc (write, prctl, setrlimit,
    // getppid, unshare, open, ioctl, setgroups, setresgid, setresuid,
    // landlock_restrict_self), which are async-signal-safe, and allocates
    // nothing: the credentials, id maps and the Landlock ruleset were made
    // before the fork. Per-thread credential calls are correct here because
    // the child has exactly one thread.
    unsafe {
        cmd.pre_exec(pre_exec);
    }
    let mut child = cmd.spawn().map_err(|e| {
        let mut byte = [0u8];
        let step = match rustix::io::read(&reported, &mut byte) {
            Ok(1) => Step::from_byte(byte[0]),
            _ => None,
        };
        failure(plan, step, &e)
    })?;
    let pipes = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (Some(stdin), Some(stdout), Some(stderr)) = pipes else {
        return Err(format!(
            "cannot start {}: it has no stdio pipes",
            plan.program.display()
        ));
    };
    let owned =
        |e: std::io::Error| format!("cannot use the pipes of {}: {e}", plan.program.display());
    Ok(Child {
        pid: child.id().unwrap_or_default(),
        stdin: stdin.into_owned_fd().map_err(owned)?,
        stdout: stdout.into_owned_fd().map_err(owned)?,
        stderr: stderr.into_owned_fd().map_err(owned)?,
        exit: Exit(Waiter::Std(child)),
    })
}

/// "cannot start PROGRAM: STEP: ERROR".
fn failure(plan: &Plan, step: Option<Step>, e: &std::io::Error) -> String {
    match step {
        Some(step) => format!(
            "cannot start {}: {}: {}",
            plan.program.display(),
            step.what(),
            errno_text(e)
        ),
        None => format!("cannot start {}: {}", plan.program.display(), errno_text(e)),
    }
}

/// The most forker threads: one a CPU, up to this.
const FORKERS_MAX: usize = 4;

/// [`spawn`] on a forker: long-lived threads, started on first use, one a
/// CPU up to [`FORKERS_MAX`], that fork every server; a start-up of many
/// units forks on each at once. Two reasons they are not the event loop
/// nor the blocking pool. `spawn` waits for the child's set-up to reach
/// exec (and where the child must join its cgroup itself, that waits for
/// an RCU grace period when no other cgroup moved recently: some 20 ms):
/// the one event loop that carries every host session would stall that
/// long at each start. And `PR_SET_PDEATHSIG` fires when the *thread* that
/// forked the child ends, not the process: a pool thread retires after 10
/// s idle and would take its servers with it, while a forker lives as
/// long as the daemon.
pub async fn spawn_on_forker(
    plan: Plan,
    cgroup: Option<Placement>,
    confinement: Option<Confinement>,
) -> Result<Child, String> {
    type Job = Box<dyn FnOnce() + Send>;
    static FORKERS: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let forkers = FORKERS.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let n = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .clamp(1, FORKERS_MAX);
        let started = (0..n)
            .filter(|_| {
                let rx = std::sync::Arc::clone(&rx);
                std::thread::Builder::new()
                    .name("mcpd-forker".into())
                    .spawn(move || {
                        loop {
                            // One job at a time off the queue; the lock is
                            // let go before the job runs.
                            let job = match rx.lock() {
                                Ok(rx) => rx.recv(),
                                Err(_) => return,
                            };
                            match job {
                                Ok(job) => job(),
                                Err(_) => return,
                            }
                        }
                    })
                    .is_ok()
            })
            .count();
        (started > 0).then_some(tx)
    });
    let cannot = |why: &str| format!("cannot start {}: {why}", plan.program.display());
    let Some(forkers) = forkers else {
        return Err(cannot("the daemon cannot start its forker threads"));
    };
    let gone = cannot("the daemon's forker threads are gone");
    let runtime = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        // The child is the runtime's to wait for (its pidfd, or tokio's
        // reaper on the std path).
        let _entered = runtime.enter();
        let _ = tx.send(spawn(&plan, cgroup, confinement));
    });
    forkers.send(job).map_err(|_| gone.clone())?;
    rx.await.map_err(|_| gone)?
}

/// "Operation not permitted (EPERM)": what an errno means and its name, for
/// reasons an operator searches for.
fn errno_text(e: &std::io::Error) -> String {
    let text = crate::unit::diag::io_text(e);
    match e.raw_os_error().and_then(errno_name) {
        Some(name) => format!("{text} ({name})"),
        None => text,
    }
}

fn errno_name(n: i32) -> Option<&'static str> {
    Some(match n {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ENOMEM => "ENOMEM",
        libc::EAGAIN => "EAGAIN",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESRCH => "ESRCH",
        libc::EBADF => "EBADF",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        _ => return None,
    })
}

/// `limits.core` as the child's soft and hard `RLIMIT_CORE`, if the daemon
/// may grant it: above its own hard limit only as root.
pub fn core_limit(n: u64, euid: u32) -> Result<rustix::process::Rlimit, String> {
    let hard = rustix::process::getrlimit(rustix::process::Resource::Core).maximum;
    if euid != 0 && hard.is_some_and(|hard| n > hard) {
        return Err(format!(
            "`limits.core` {n} is above the daemon's hard limit of {} bytes, which only root may raise",
            hard.unwrap_or_default()
        ));
    }
    Ok(rustix::process::Rlimit {
        current: Some(n),
        maximum: Some(n),
    })
}

/// `limits.nofile` as the child's soft and hard `RLIMIT_NOFILE`, if the
/// daemon may grant it: above its own hard limit only as root, and never
/// above the kernel's `fs.nr_open`.
pub fn nofile_limit(n: u64, euid: u32) -> Result<rustix::process::Rlimit, String> {
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
    if euid != 0 && hard.is_some_and(|hard| n > hard) {
        return Err(format!(
            "`limits.nofile` {n} is above the daemon's hard limit of {} open files, which only root may raise",
            hard.unwrap_or_default()
        ));
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(max) = nr_open.filter(|max| n > *max) {
        return Err(format!(
            "`limits.nofile` {n} is above the kernel's fs.nr_open ({max})"
        ));
    }
    Ok(rustix::process::Rlimit {
        current: Some(n),
        maximum: Some(n),
    })
}

/// Sends `signal` to the process group led by `pid`. Errors (the group is
/// already gone) are ignored: the reaper reports what happened.
pub fn signal_group(pid: u32, signal: Signal) {
    let sig = match signal {
        Signal::Term => rustix::process::Signal::TERM,
        Signal::Kill => rustix::process::Signal::KILL,
    };
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, sig);
        if signal == Signal::Term {
            // A stopped process (SIGSTOP, a debugger) cannot act on SIGTERM
            // until it runs again; systemd sends SIGCONT after it too.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::CONT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit::{UnitDraft, UnitSpec, spec::StdioDraft};

    fn stdio(draft: StdioDraft) -> StdioSpec {
        let spec = UnitSpec::new(UnitDraft {
            stdio: Some(draft),
            ..UnitDraft::default()
        })
        .expect("valid");
        match spec.transport() {
            crate::unit::Transport::Stdio(s) => s.clone(),
            crate::unit::Transport::Http(_) => unreachable!(),
        }
    }

    fn host() -> Host {
        Host {
            instance: Instance::User,
            euid: rustix::process::geteuid().as_raw(),
            child_nofile: None,
            cgroups: None,
            sandbox: crate::supervisor::sandbox::Offer::probe(0),
            scratch: std::env::temp_dir(),
            credentials: crate::supervisor::credentials::Stores::new(
                Instance::User,
                0,
                std::env::temp_dir(),
            ),
            logins: std::env::temp_dir(),
            client_metadata_url: None,
        }
    }

    fn daemon_env(var: &str) -> Option<OsString> {
        match var {
            "PATH" => Some("/usr/bin:/bin".into()),
            "HOME" => Some("/tmp".into()),
            "LANG" => Some("C.UTF-8".into()),
            "SECRET_OF_DAEMON" => Some("leak".into()),
            "HTTPS_PROXY" => Some("http://proxy:3128".into()),
            "NOTIFY_SOCKET" => Some("/run/systemd/notify".into()),
            _ => None,
        }
    }

    #[test]
    fn environment_is_clean_and_layered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("a.env");
        std::fs::write(&file, "FROM_FILE=1\nOVERRIDDEN=file\n").expect("write");
        let spec = stdio(StdioDraft {
            command: vec!["sh".into(), "-c".into(), "true".into()],
            env: [("OVERRIDDEN".to_string(), "unit".to_string())].into(),
            env_files: vec![file],
            pass_env: vec!["HTTPS_PROXY".into(), "UNSET".into()],
            ..StdioDraft::default()
        });
        let plan = plan(&spec, &host(), &daemon_env, None).expect("plan");
        let env: Vec<(&str, &str)> = plan
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap_or_default()))
            .collect();
        assert_eq!(
            env,
            [
                ("PATH", "/usr/bin:/bin"),
                ("HOME", "/tmp"),
                ("LANG", "C.UTF-8"),
                ("FROM_FILE", "1"),
                ("OVERRIDDEN", "unit"),
                ("HTTPS_PROXY", "http://proxy:3128"),
            ]
        );
        assert!(plan.program.is_absolute(), "{:?}", plan.program);
        assert_eq!(plan.cwd, PathBuf::from("/tmp"));
    }

    /// A cgroup of its own for a test, under the test's own v2 cgroup
    /// (CI runs as root on a writable hierarchy); removed when dropped.
    struct TestCgroup(PathBuf);

    impl TestCgroup {
        fn new(tag: &str) -> Self {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
            let mount = crate::supervisor::cgroup::v2_mount(&mountinfo).expect("a v2 hierarchy");
            let own = std::fs::read_to_string("/proc/self/cgroup").expect("own cgroup");
            let own = crate::supervisor::cgroup::v2_path(&own).expect("a v2 path");
            let dir = mount
                .join(own.trim_start_matches('/'))
                .join(format!("mcpd-test-{tag}-{}", std::process::id()));
            std::fs::create_dir(&dir).expect("a test cgroup");
            Self(dir)
        }

        fn placement(&self) -> Placement {
            crate::supervisor::cgroup::Cgroups::at(self.0.clone())
                .server("u")
                .prepare()
                .expect("prepare")
        }

        /// The line of `/proc/PID/cgroup` of a process in it.
        fn line(&self) -> String {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
            let mount = crate::supervisor::cgroup::v2_mount(&mountinfo).expect("a v2 hierarchy");
            let path = self.0.join("u");
            let path = path.strip_prefix(&mount).expect("under the mount");
            format!("0::/{}", path.display())
        }
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(self.0.join("u"));
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    /// A plan running `script` with sh.
    fn sh(script: &str) -> Plan {
        let spec = stdio(StdioDraft {
            command: vec!["sh".into(), "-c".into(), script.into()],
            ..StdioDraft::default()
        });
        plan(&spec, &host(), &daemon_env, None).expect("plan")
    }

    /// Everything `child` writes to its stdout, and how it exits.
    async fn output(child: Child) -> (String, std::process::ExitStatus) {
        use tokio::io::AsyncReadExt;
        let Child {
            stdin,
            stdout,
            mut exit,
            ..
        } = child;
        drop(stdin);
        let mut stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout).expect("pipe");
        let mut text = String::new();
        stdout.read_to_string(&mut text).await.expect("read");
        (text, exit.wait().await.expect("wait"))
    }

    // The path taken when the kernel forks into a cgroup (all supported
    // kernels here): the child's first look at /proc finds it in its
    // cgroup, its stdio and exit status are its own, its set-up runs.
    #[tokio::test]
    async fn a_child_is_forked_straight_into_its_cgroup() {
        let cgroup = TestCgroup::new("clone3");
        let placement = cgroup.placement();
        let mut plan = sh(
            "grep ^0:: /proc/self/cgroup; ulimit -n; ps -o pgid= -p $$ | tr -d ' '; echo $$; exit 3",
        );
        plan.nofile = Some(rustix::process::Rlimit {
            current: Some(77),
            maximum: Some(77),
        });
        let setup = SetUp::new(&plan, None);
        let child = match spawn_into(&plan, setup, &placement.dir) {
            Ok(child) => child,
            Err(Refused::Not(errno, _)) => panic!("the kernel refused clone3: {errno}"),
            Err(Refused::Failed(why)) => panic!("{why}"),
        };
        let pid = child.pid;
        let (text, status) = output(child).await;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                cgroup.line().as_str(),
                "77",
                pid.to_string().as_str(),
                pid.to_string().as_str()
            ],
            "in its cgroup, its limit, its own process group"
        );
        assert_eq!(status.code(), Some(3));
        // A start that fails says which step and why, and leaves no child.
        let missing = Plan {
            cwd: PathBuf::from("/nonexistent-mcpd-dir"),
            ..sh("true")
        };
        match spawn_into(&missing, SetUp::new(&missing, None), &placement.dir) {
            Err(Refused::Failed(why)) => assert_eq!(
                why,
                "cannot start /usr/bin/sh: No such file or directory (ENOENT)"
            ),
            Err(Refused::Not(errno, _)) => panic!("refused: {errno}"),
            Ok(_) => panic!("started in a missing directory"),
        }
        let mut limited = sh("true");
        limited.nofile = Some(rustix::process::Rlimit {
            current: Some(u64::MAX - 1),
            maximum: Some(u64::MAX - 1),
        });
        match spawn_into(&limited, SetUp::new(&limited, None), &placement.dir) {
            Err(Refused::Failed(why)) => assert!(
                why.starts_with("cannot start /usr/bin/sh: setting its file descriptor limit: "),
                "{why}"
            ),
            Err(Refused::Not(errno, _)) => panic!("refused: {errno}"),
            Ok(_) => panic!("started beyond nr_open"),
        }
        assert!(
            std::fs::read_to_string(cgroup.0.join("u/cgroup.procs"))
                .expect("procs")
                .is_empty()
        );
    }

    // The path taken when the kernel refuses: the child joins its cgroup
    // itself before exec, so it too is in it when it first looks.
    #[tokio::test]
    async fn where_the_kernel_refuses_a_child_joins_its_cgroup_itself() {
        let cgroup = TestCgroup::new("fallback");
        let placement = cgroup.placement();
        let plan = sh("grep ^0:: /proc/self/cgroup; exit 4");
        let mut setup = SetUp::new(&plan, None);
        setup.procs = Some(placement.procs);
        let (text, status) = output(spawn_std(&plan, setup).expect("spawn")).await;
        assert_eq!(text.trim_end(), cgroup.line());
        assert_eq!(status.code(), Some(4));
        for errno in [
            rustix::io::Errno::NOSYS,
            rustix::io::Errno::INVAL,
            rustix::io::Errno::PERM,
            rustix::io::Errno::BUSY,
        ] {
            assert!(refusal(errno), "{errno}");
        }
        assert!(!refusal(rustix::io::Errno::AGAIN));
        assert!(!refusal(rustix::io::Errno::NOMEM));
    }

    // A child dropped before it is reaped is killed, as tokio's are.
    #[tokio::test]
    async fn a_child_nobody_waits_for_is_killed() {
        let cgroup = TestCgroup::new("dropped");
        let placement = cgroup.placement();
        let plan = sh("exec sleep 600");
        let child = spawn(&plan, Some(placement), None).expect("spawn");
        let pid = child.pid;
        drop(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(std::time::Instant::now() < deadline, "{pid} still there");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn every_step_of_the_childs_set_up_is_named_by_its_own_byte() {
        for step in Step::ALL {
            assert_ne!(step.byte(), 0);
            assert_eq!(Step::from_byte(step.byte()), Some(step));
        }
        assert_eq!(Step::from_byte(0), None);
        assert_eq!(Step::from_byte(200), None);
    }

    #[test]
    fn failures_name_what_is_missing() {
        let missing_cmd = stdio(StdioDraft {
            command: vec!["no-such-mcp-server".into()],
            ..StdioDraft::default()
        });
        let e = plan(&missing_cmd, &host(), &daemon_env, None).expect_err("missing");
        assert_eq!(
            e,
            "command no-such-mcp-server: not found in PATH (/usr/bin:/bin)"
        );

        let missing_dir = stdio(StdioDraft {
            command: vec!["/bin/sh".into()],
            working_directory: Some("/nonexistent/dir".into()),
            ..StdioDraft::default()
        });
        let e = plan(&missing_dir, &host(), &daemon_env, None).expect_err("missing");
        assert!(e.starts_with("working directory /nonexistent/dir: "), "{e}");

        let missing_file = stdio(StdioDraft {
            command: vec!["/bin/sh".into()],
            env_files: vec!["/nonexistent/x.env".into()],
            ..StdioDraft::default()
        });
        let e = plan(&missing_file, &host(), &daemon_env, None).expect_err("missing");
        assert!(e.starts_with("env-file /nonexistent/x.env: "), "{e}");

        let unknown_user = stdio(StdioDraft {
            command: vec!["/bin/sh".into()],
            user: Some("no-such-user-mcpd".into()),
            ..StdioDraft::default()
        });
        let e = plan(&unknown_user, &host(), &daemon_env, None).expect_err("unknown");
        assert_eq!(e, "user no-such-user-mcpd: no such user");
    }
}
