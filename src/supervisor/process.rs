//! Child processes of stdio units: what to run, as whom, with what
//! environment; spawning it in its own process group; signalling the group.
//!
//! [`plan`] decides everything that can fail with a clear reason (program
//! not found, working directory missing, env-file missing or malformed,
//! unknown user) before anything is forked; [`spawn`] then only forks and
//! execs. The child gets a clean environment (DESIGN §2): PATH, HOME and
//! LANG from the daemon (HOME, USER, LOGNAME and SHELL of the target user
//! when `user` is set), then the env-files, `pass-env` and `env`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::unit::{Instance, StdioSpec};

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

/// Forks and execs `plan` in a new process group with piped stdio. The
/// child joins the cgroup whose `cgroup.procs` is `cgroup` first, dies
/// with SIGKILL if the daemon's thread that spawned it goes away
/// (`PR_SET_PDEATHSIG`), gets `plan.nofile` as its `RLIMIT_NOFILE`, enters
/// the network namespace of `confinement`, runs as `plan.credentials` when
/// given, and enters its Landlock domain last. An error names the step of
/// that set-up that failed.
pub fn spawn(
    plan: &Plan,
    cgroup: Option<std::os::fd::OwnedFd>,
    confinement: Option<Confinement>,
) -> Result<tokio::process::Child, String> {
    use rustix::process::{Gid, Uid};
    let mut cmd = tokio::process::Command::new(&plan.program);
    cmd.args(&plan.args)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&plan.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // A sandboxed child leads a session of its own (setsid below, which a
    // process group leader may not call): no controlling terminal to push
    // input into. Either way it leads its own process group.
    let session = confinement.is_some();
    if !session {
        cmd.process_group(0);
    }
    let parent = rustix::process::getpid();
    // Everything the child needs is computed here, before the fork: the
    // closure below must not allocate.
    let creds = plan.credentials.as_ref().map(|c| {
        (
            Uid::from_raw(c.uid),
            Gid::from_raw(c.gid),
            c.groups
                .iter()
                .map(|g| Gid::from_raw(*g))
                .collect::<Vec<Gid>>(),
        )
    });
    let nofile = plan.nofile;
    let core = plan.core;
    // The child writes the step that failed here (one byte) before it
    // reports the error number the usual way.
    let (report, reported) = rustix::pipe::pipe_with(
        rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
    )
    .map_err(|e| format!("cannot start {}: {e}", plan.program.display()))?;
    let mut confinement = confinement;
    let mut in_child = move || -> Result<(), (Step, rustix::io::Errno)> {
        if session {
            rustix::process::setsid().map_err(|e| (Step::Session, e))?;
        }
        if let Some(procs) = &cgroup {
            // "0": the writing process, before it can fork anything.
            rustix::io::write(procs, b"0").map_err(|e| (Step::Cgroup, e))?;
        }
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(|e| (Step::DeathSignal, e))?;
        if let Some(limit) = nofile {
            rustix::process::setrlimit(rustix::process::Resource::Nofile, limit)
                .map_err(|e| (Step::Nofile, e))?;
        }
        if let Some(limit) = core {
            rustix::process::setrlimit(rustix::process::Resource::Core, limit)
                .map_err(|e| (Step::Core, e))?;
        }
        // The daemon may have died between fork and prctl.
        if rustix::process::getppid() != Some(parent) {
            return Err((Step::ParentGone, rustix::io::Errno::SRCH));
        }
        if let Some(c) = &confinement {
            c.enter_namespace()
                .map_err(|(f, e)| (Step::Sandbox(f), e))?;
        }
        if let Some((uid, gid, groups)) = &creds {
            let step = |e| (Step::Credentials, e);
            rustix::thread::set_thread_groups(groups).map_err(step)?;
            rustix::thread::set_thread_res_gid(*gid, *gid, *gid).map_err(step)?;
            rustix::thread::set_thread_res_uid(*uid, *uid, *uid).map_err(step)?;
            // A change of credentials clears the parent-death signal.
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(|e| (Step::DeathSignal, e))?;
            if rustix::process::getppid() != Some(parent) {
                return Err((Step::ParentGone, rustix::io::Errno::SRCH));
            }
        }
        if let Some(c) = &mut confinement {
            c.restrict().map_err(|(f, e)| (Step::Sandbox(f), e))?;
        }
        Ok(())
    };
    let pre_exec = move || -> std::io::Result<()> {
        in_child().map_err(|(step, errno)| {
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
    cmd.spawn().map_err(|e| {
        let mut byte = [0u8];
        let step = match rustix::io::read(&reported, &mut byte) {
            Ok(1) => Step::from_byte(byte[0]),
            _ => None,
        };
        match step {
            Some(step) => format!(
                "cannot start {}: {}: {}",
                plan.program.display(),
                step.what(),
                errno_text(&e)
            ),
            None => format!(
                "cannot start {}: {}",
                plan.program.display(),
                errno_text(&e)
            ),
        }
    })
}

/// [`spawn`] on the forker: one thread, started on first use, that forks
/// every server. Two reasons it is not the event loop nor the blocking
/// pool. `spawn` waits for the child's set-up to reach exec, and joining
/// a cgroup there waits for an RCU grace period when no other cgroup
/// moved recently (some 20 ms, measured on a reload): the one event loop
/// that carries every host session would stall that long at each start.
/// And `PR_SET_PDEATHSIG` fires when the *thread* that forked the child
/// ends, not the process: a pool thread retires after 10 s idle and would
/// take its servers with it, while the forker lives as long as the daemon.
pub async fn spawn_on_forker(
    plan: Plan,
    cgroup: Option<std::os::fd::OwnedFd>,
    confinement: Option<Confinement>,
) -> Result<tokio::process::Child, String> {
    type Job = Box<dyn FnOnce() + Send>;
    static FORKER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let forker = FORKER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("mcpd-forker".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .ok()
            .map(|_| tx)
    });
    let cannot = |why: &str| format!("cannot start {}: {why}", plan.program.display());
    let Some(forker) = forker else {
        return Err(cannot("the daemon cannot start its forker thread"));
    };
    let gone = cannot("the daemon's forker thread is gone");
    let runtime = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        // The child is tokio's to reap, on the daemon's runtime.
        let _entered = runtime.enter();
        let _ = tx.send(spawn(&plan, cgroup, confinement));
    });
    forker.send(job).map_err(|_| gone.clone())?;
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
