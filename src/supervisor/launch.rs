//! Starting a generation: a child process (stdio) or a session (HTTP,
//! through rmcp's transport in [`super::http`]), as a raw [`Wire`].
//!
//! The actor only sees the [`Launcher`] trait, so its tests can launch
//! in-process fakes; [`SystemLauncher`] is the real one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::unix::pipe;

use crate::mux::wire::Wire;
use crate::unit::{HeaderValue, HttpSpec, InstanceOf, Sandbox, StdioSpec, Transport, UnitSpec};

use super::cgroup::{Cgroup, Usage};
use super::credentials;
use super::logs::{self, LogRing};
use super::machine::{ExitStatus, Gen, Signal};
use super::oauth::{Login, LoginError};
use super::process::{self, Host};
use super::sandbox::{self, Confinement};

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// A started generation.
pub struct Launched {
    /// The process (group leader) of a stdio generation.
    pub pid: Option<u32>,
    /// Resolves to the connection to the server (the handshake is the
    /// supervisor's).
    pub connect: BoxFuture<Result<Wire, ConnectError>>,
    /// Resolves once the process is reaped; None when there is no process.
    pub exit: Option<BoxFuture<ExitStatus>>,
}

impl std::fmt::Debug for Launched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launched")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// Why connecting to a generation failed; the machine treats the two kinds
/// differently (a hang-up gives the process time to exit on its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectError {
    /// The server hung up (EOF, a closed pipe, a closed session).
    Closed(String),
    /// The server answered wrongly, or the request failed.
    Failed(String),
    /// The unit has `oauth` and no usable login (DESIGN §17).
    NeedsLogin,
}

impl ConnectError {
    /// What went wrong, for the reason text.
    pub fn message(&self) -> &str {
        match self {
            ConnectError::Closed(m) | ConnectError::Failed(m) => m,
            ConnectError::NeedsLogin => "it needs a login",
        }
    }
}

/// Starts generations and signals their processes.
pub trait Launcher: Send + Sync + 'static {
    /// Starts generation `generation` of `spec`. An error means nothing
    /// was started. What can be decided at once is (a plan, its cgroup);
    /// the future resolves once the process exists (forked and exec'd).
    fn launch(&self, spec: &UnitSpec, generation: Gen) -> BoxFuture<Result<Launched, String>>;
    /// Signals the process group led by `pid`.
    fn signal(&self, pid: u32, signal: Signal);
    /// The process `pid` was reaped: clean up what is left of its group.
    fn reaped(&self, pid: u32);
    /// The unit changed in place: apply what the launcher keeps of it.
    fn configure(&self, _spec: &UnitSpec) {}
    /// How its processes are contained: "cgroup DIR", "process group";
    /// empty when it runs none (HTTP).
    fn containment(&self) -> String {
        "process group".into()
    }
    /// What the running generation's processes use, where known.
    fn usage(&self) -> Option<Usage> {
        None
    }
    /// How the last generation was sandboxed ("landlock v7, network
    /// none"); empty when it was not.
    fn sandbox(&self) -> String {
        String::new()
    }

    /// What the last generation was given, as names and sizes ("gh (40
    /// B), db (1 file)"); never a value. Empty when nothing.
    fn credentials(&self) -> String {
        String::new()
    }

    /// The launcher of instance `of` of this per-host unit (DESIGN §13),
    /// whose processes are contained apart from the unit's and the other
    /// instances'; None when this launcher cannot make one (the tests'
    /// in-process servers): its hosts share the unit's server.
    fn instance(&self, _of: InstanceOf) -> Option<SharedLauncher> {
        None
    }

    /// The unit's login (DESIGN §17), when it is an HTTP unit with
    /// `oauth`.
    fn login(&self) -> Option<Arc<Login>> {
        None
    }

    /// The client secret `oauth.client-secret` names, read now.
    fn oauth_secret(&self, _spec: &UnitSpec) -> Result<Option<String>, String> {
        Ok(None)
    }

    /// The launcher of the unit's lane named `name` (`NAME@VERSION`, a
    /// second process of a dual-era server, DESIGN §12), contained beside
    /// the unit's own (cgroup v2 keeps processes in leaves); None when
    /// this launcher cannot make one: its hosts are translated instead.
    fn lane(&self, _name: &str) -> Option<SharedLauncher> {
        None
    }
}

/// Removes a generation's (empty) cgroup; `nested`: an instance's, whose
/// unit's cgroup goes with its last instance (DESIGN §13).
fn remove(cgroup: &Cgroup, nested: bool) {
    cgroup.remove();
    if nested && let Some(unit) = cgroup.dir().parent() {
        // Fails while another instance (or the unit's own) is there.
        let _ = std::fs::remove_dir(unit);
    }
}

/// A stdio generation ready to fork.
struct Prepared {
    plan: process::Plan,
    /// Its cgroup, opened for the child.
    procs: Option<super::cgroup::Placement>,
    confinement: Option<Confinement>,
    cgroup: Option<Cgroup>,
    /// The cgroup's OOM kills before this generation.
    oom_kills: u64,
    tmp: Option<PrivateTmp>,
    /// Its credentials directory, removed when the generation ends.
    credentials: Option<credentials::Delivered>,
}

/// Launches real children and HTTP sessions.
#[derive(Debug, Clone)]
pub struct SystemLauncher {
    name: String,
    host: Host,
    logs: LogRing,
    /// The unit is an HTTP one (as last configured): no processes.
    http: Arc<std::sync::atomic::AtomicBool>,
    /// How the last generation was sandboxed, for status.
    enforced: Arc<std::sync::Mutex<String>>,
    /// What the last generation was given, for status (names and sizes).
    delivered: Arc<std::sync::Mutex<String>>,
    /// The last [`Launcher::usage`] reading and when it was taken.
    usage: Arc<std::sync::Mutex<Option<(std::time::Instant, Usage)>>>,
    /// Its cgroup, below the servers' (DESIGN §13): the unit's name for a
    /// shared unit, `NAME/unit` for a per-host unit's own server (its
    /// instances are beside it), `NAME/N` for instance N (`NAME/uid-UID`
    /// for a D-Bus caller's). Chosen at each
    /// launch, so that the signals of a generation reach its own cgroup.
    place: Arc<std::sync::Mutex<String>>,
    /// An instance's launcher: its place never changes.
    instance: bool,
    /// The unit's login, for an HTTP unit with `oauth` (as last
    /// configured).
    login: Arc<std::sync::Mutex<Option<Arc<Login>>>>,
}

/// How long a usage reading serves: one D-Bus `GetAll` (or
/// `GetManagedObjects`, a `GetAll` of every server) reads the three usage
/// properties back to back, and each reading opens several files per
/// process.
const USAGE_FRESH: std::time::Duration = std::time::Duration::from_millis(100);

impl SystemLauncher {
    /// A launcher for unit `name`; child stderr lines go to `logs` and the log.
    pub fn new(name: &str, host: Host, logs: LogRing) -> Self {
        Self {
            name: name.to_owned(),
            host,
            logs,
            http: Arc::default(),
            enforced: Arc::default(),
            delivered: Arc::default(),
            usage: Arc::default(),
            place: Arc::new(std::sync::Mutex::new(name.to_owned())),
            instance: false,
            login: Arc::default(),
        }
    }

    /// Plans and prepares a stdio generation here; forks it on the
    /// forker ([`process::spawn_on_forker`]) in the future it returns.
    fn stdio(
        &self,
        unit: &UnitSpec,
        spec: &StdioSpec,
        generation: Gen,
    ) -> BoxFuture<Result<Launched, String>> {
        if encrypted(unit) {
            // `systemd-creds decrypt` may take its time (a TPM): not on
            // the daemon's one runtime thread.
            let (this, unit, spec) = (self.clone(), unit.clone(), spec.clone());
            return Box::pin(async move {
                let prepare = this.clone();
                let prepared =
                    tokio::task::spawn_blocking(move || prepare.prepare(&unit, &spec, generation))
                        .await
                        .map_err(|e| format!("cannot prepare the start: {e}"))??;
                this.fork(prepared, generation).await
            });
        }
        match self.prepare(unit, spec, generation) {
            Ok(prepared) => Box::pin(self.clone().fork(prepared, generation)),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    /// Everything before the fork: what can fail with a reason does.
    fn prepare(
        &self,
        unit: &UnitSpec,
        spec: &StdioSpec,
        generation: Gen,
    ) -> Result<Prepared, String> {
        let (limits, sandboxed) = (unit.limits(), unit.sandbox());
        if let Ok(mut enforced) = self.enforced.lock() {
            enforced.clear();
        }
        let tmp = match sandboxed {
            Some(_) => Some(
                PrivateTmp::create(&self.host.scratch, &self.name, generation)
                    .map_err(|why| format!("cannot sandbox the server: {why}"))?,
            ),
            None => None,
        };
        let mut plan = process::plan(
            spec,
            &self.host,
            &|var| std::env::var_os(var),
            tmp.as_ref().map(|t| t.path.as_path()),
        )?;
        if let Some(n) = limits.nofile {
            plan.nofile = Some(process::nofile_limit(n, self.host.euid)?);
        }
        if let Some(n) = limits.core {
            plan.core = Some(process::core_limit(n, self.host.euid)?);
        }
        let credentials = self.deliver(unit, &mut plan, generation)?;
        let confinement = match (sandboxed, &tmp) {
            (Some(sandboxed), Some(tmp)) => Some(self.confine(
                sandboxed,
                spec,
                &plan,
                tmp,
                credentials.as_ref().map(|c| c.dir.as_path()),
            )?),
            _ => None,
        };
        let cgroup = self.cgroup();
        let mut oom_kills = 0;
        if limits.needs_cgroup() && cgroup.is_none() {
            return Err(
                "`limits` needs cgroups, but servers are contained by process groups only (see the daemon's warning at start)".into(),
            );
        }
        let procs = match &cgroup {
            Some(cgroup) => {
                let procs = cgroup.prepare()?;
                oom_kills = cgroup.oom_kills();
                if let Err(e) = cgroup.limit(&limits) {
                    remove(cgroup, self.nested());
                    return Err(e);
                }
                Some(procs)
            }
            None => None,
        };
        // Shown once the start is prepared: a start that failed gave none.
        if let (Some(d), Ok(mut shown)) = (&credentials, self.delivered.lock()) {
            *shown = d.listing.to_string();
        }
        Ok(Prepared {
            plan,
            procs,
            confinement,
            cgroup,
            oom_kills,
            tmp,
            credentials,
        })
    }

    /// Delivers the unit's credentials for this generation (DESIGN §16)
    /// and puts `CREDENTIALS_DIRECTORY` and the `env` lines into the plan;
    /// fails closed.
    fn deliver(
        &self,
        unit: &UnitSpec,
        plan: &mut process::Plan,
        generation: Gen,
    ) -> Result<Option<credentials::Delivered>, String> {
        if let Ok(mut delivered) = self.delivered.lock() {
            delivered.clear();
        }
        let owner = plan.credentials.as_ref().map(|c| (c.uid, c.gid));
        let delivered = credentials::deliver(
            unit.credentials(),
            &self.host.credentials,
            &self.name,
            generation,
            owner,
            unit.startup_timeout(),
        )?;
        if let Some(d) = &delivered {
            for (var, value) in &d.env {
                plan.set_var(var, value.clone());
            }
        }
        Ok(delivered)
    }

    /// Forks a prepared generation and wires it up.
    async fn fork(self, prepared: Prepared, generation: Gen) -> Result<Launched, String> {
        let (cgroup, oom_kills, tmp) = (prepared.cgroup, prepared.oom_kills, prepared.tmp);
        let credentials = prepared.credentials;
        let child = process::spawn_on_forker(prepared.plan, prepared.procs, prepared.confinement)
            .await
            .inspect_err(|_| {
                if let Some(cgroup) = &cgroup {
                    remove(cgroup, self.nested());
                }
            })?;
        let pid = Some(child.pid);
        let (stdin, stdout, stderr) = (child.stdin, child.stdout, child.stderr);
        let mut exit = child.exit;
        let pipes = pipe::Receiver::from_owned_fd(stdout).and_then(|read| {
            let write = pipe::Sender::from_owned_fd(stdin)?;
            Ok((read, write))
        });
        let (read, write) = pipes.map_err(|e| format!("cannot use the server's pipes: {e}"))?;
        let stderr = pipe::Receiver::from_owned_fd(stderr)
            .map_err(|e| format!("cannot use the server's stderr: {e}"))?;
        let wire = Wire::pipes(read, write);
        let name = self.name.clone();
        let nested = self.nested();
        tokio::spawn(logs::pump(
            stderr,
            self.logs.clone(),
            move |line, report| {
                if report {
                    tracing::warn!(target: "mcpd::server", mcpd_server = %name, generation = generation, "{line}");
                } else {
                    tracing::info!(target: "mcpd::server", mcpd_server = %name, generation = generation, "{line}");
                }
            },
        ));
        let connect: BoxFuture<Result<Wire, ConnectError>> = Box::pin(async move { Ok(wire) });
        let exit: BoxFuture<ExitStatus> = Box::pin(async move {
            use std::os::unix::process::ExitStatusExt;
            let mut status = match exit.wait().await {
                Ok(status) => match (status.code(), status.signal()) {
                    (Some(code), _) => ExitStatus::Code(code),
                    (None, Some(sig)) => ExitStatus::Signal(sig),
                    (None, None) => ExitStatus::Code(-1),
                },
                // Cannot wait: treat as gone rather than blocking forever.
                Err(_) => ExitStatus::Code(-1),
            };
            if let Some(cgroup) = cgroup {
                // The generation is over when all of it is gone: helpers
                // the main process left behind die first (invariant 11).
                if cgroup.populated() {
                    cgroup.kill();
                }
                cgroup.emptied().await;
                if cgroup.oom_kills() > oom_kills {
                    // As systemd's `oom-kill` result: any of its processes.
                    status = ExitStatus::OutOfMemory;
                }
                remove(&cgroup, nested);
            }
            if let Some(tmp) = tmp {
                // What the server left there may be large: not on the
                // actor's thread.
                let _ = tokio::task::spawn_blocking(move || drop(tmp)).await;
            }
            // The generation is over: its credentials go with it.
            drop(credentials);
            status
        });
        Ok(Launched {
            pid,
            connect,
            exit: Some(exit),
        })
    }

    /// Decides and prepares a generation's sandbox: its Landlock ruleset,
    /// its namespaces, its private temp directory handed to its user.
    /// Fails closed.
    fn confine(
        &self,
        sandboxed: &Sandbox,
        spec: &StdioSpec,
        plan: &process::Plan,
        tmp: &PrivateTmp,
        credentials: Option<&std::path::Path>,
    ) -> Result<Confinement, String> {
        let cannot = |why: String| format!("cannot sandbox the server: {why}");
        let enforcement = sandbox::decide(sandboxed.network, &self.host.sandbox).map_err(cannot)?;
        if let Some(c) = &plan.credentials {
            tmp.give(c.uid, c.gid).map_err(cannot)?;
        }
        let home = plan.var("HOME").cloned().unwrap_or_default();
        let path = plan.var("PATH").cloned().unwrap_or_default();
        let grants = sandbox::grants(
            sandboxed,
            sandbox::Site {
                program: &plan.program,
                working_directory: spec.working_directory(),
                tmpdir: &tmp.path,
                credentials,
                path: &path,
                home: std::path::Path::new(&home),
            },
        );
        let ids = (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        let as_root = match &plan.credentials {
            Some(c) => c.uid == 0,
            None => ids.0 == 0,
        };
        let confinement =
            Confinement::prepare(enforcement, &grants, ids, as_root).map_err(cannot)?;
        if let Ok(mut enforced) = self.enforced.lock() {
            *enforced = enforcement.to_string();
        }
        Ok(confinement)
    }

    /// Whether its cgroup is below its unit's (an instance's, DESIGN §13).
    fn nested(&self) -> bool {
        self.place.lock().is_ok_and(|p| p.contains('/'))
    }

    /// This unit's cgroup, when the daemon contains its servers in cgroups.
    fn cgroup(&self) -> Option<Cgroup> {
        let place = self.place.lock().map(|p| p.clone()).unwrap_or_default();
        self.host.cgroups.as_ref().map(|c| c.server(&place))
    }

    fn http(&self, unit: &UnitSpec, spec: &HttpSpec) -> Result<Launched, String> {
        install_crypto_provider();
        let mut headers = std::collections::HashMap::new();
        // Read at every connect, as a stdio server's are at every spawn.
        let mut vars = Vec::new();
        for file in spec.env_files() {
            vars.extend(super::envfile::read(file)?);
        }
        let items = self.http_credentials(unit)?;
        for (name, value) in spec.headers() {
            let text = match value {
                HeaderValue::Literal(secret) => std::borrow::Cow::Borrowed(secret.expose()),
                HeaderValue::Credential {
                    name: credential,
                    format,
                } => {
                    let bytes = credentials::value(&items, credential, &self.host.credentials)
                        .map_err(|e| format!("header {name}: {e}"))?;
                    let value = std::str::from_utf8(bytes).map_err(|_| {
                        format!("header {name}: credential {credential} is not UTF-8 text")
                    })?;
                    // A file's last newline is not part of a header.
                    let value = value.strip_suffix('\n').unwrap_or(value);
                    std::borrow::Cow::Owned(format.replacen(
                        crate::unit::spec::CREDENTIAL_PLACEHOLDER,
                        value,
                        1,
                    ))
                }
                HeaderValue::Env(var) => vars
                    .iter()
                    .rev()
                    .find(|(k, _)| k == var)
                    .map(|(_, v)| std::borrow::Cow::Borrowed(v.as_str()))
                    .ok_or_else(|| {
                        let files: Vec<String> = spec
                            .env_files()
                            .iter()
                            .map(|f| f.display().to_string())
                            .collect();
                        format!("header {name}: {var} is not set in {}", files.join(", "))
                    })?,
            };
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("header {name}: invalid name"))?;
            let mut value = http::HeaderValue::from_str(&text)
                .map_err(|_| format!("header {name}: invalid value"))?;

            value.set_sensitive(true);
            headers.insert(name, value);
        }
        if let Ok(mut shown) = self.delivered.lock() {
            *shown = credentials::Listing::of(&items).to_string();
        }
        let connect: BoxFuture<Result<Wire, ConnectError>> = match (spec.oauth(), self.login()) {
            (Some(oauth), Some(login)) => {
                let secret = self.client_secret(&items, oauth)?;
                let url = spec.url().as_str().to_owned();
                Box::pin(async move {
                    match login.client(secret).await {
                        Ok(client) => Ok(super::http::connect_with(&url, headers, client, login)),
                        Err(LoginError::Needed) => Err(ConnectError::NeedsLogin),
                        Err(e) => Err(ConnectError::Failed(format!("login: {e}"))),
                    }
                })
            }
            _ => {
                let wire = super::http::connect(spec.url().as_str(), headers);
                Box::pin(async move { Ok(wire) })
            }
        };
        Ok(Launched {
            pid: None,
            connect,
            exit: None,
        })
    }
}

impl SystemLauncher {
    /// The client secret `oauth.client-secret` names, from the unit's
    /// credentials (DESIGN §16).
    fn client_secret(
        &self,
        items: &[credentials::Item],
        oauth: &crate::unit::OAuthSpec,
    ) -> Result<Option<String>, String> {
        let Some(name) = &oauth.client_secret else {
            return Ok(None);
        };
        let bytes = credentials::value(items, name, &self.host.credentials)
            .map_err(|e| format!("oauth.client-secret: {e}"))?;
        let text = std::str::from_utf8(bytes)
            .map_err(|_| format!("oauth.client-secret: credential {name} is not UTF-8 text"))?;
        Ok(Some(text.strip_suffix('\n').unwrap_or(text).to_owned()))
    }

    /// An HTTP unit's credentials, read at each connect (no directory:
    /// they go into headers only).
    fn http_credentials(&self, unit: &UnitSpec) -> Result<Vec<credentials::Item>, String> {
        if let Ok(mut delivered) = self.delivered.lock() {
            delivered.clear();
        }
        credentials::read(
            unit.credentials(),
            &self.host.credentials,
            unit.startup_timeout(),
        )
    }
}

/// A sandboxed generation's private temp directory (mode 0700, owned by
/// the server's user), removed with everything in it when dropped.
#[derive(Debug)]
struct PrivateTmp {
    path: std::path::PathBuf,
}

impl PrivateTmp {
    fn create(scratch: &std::path::Path, name: &str, generation: Gen) -> Result<Self, String> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = scratch.join(format!("{name}.{generation}.{nanos:08x}"));
        let failed = |path: &std::path::Path, e: std::io::Error| {
            format!(
                "cannot create its temp directory {}: {}",
                path.display(),
                crate::unit::diag::io_text(&e)
            )
        };
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| failed(&path, e))?;
        Ok(Self { path })
    }

    /// Hands the directory to the server's user.
    fn give(&self, uid: u32, gid: u32) -> Result<(), String> {
        rustix::fs::chown(
            &self.path,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(|e| {
            format!(
                "cannot give its temp directory {} to uid {uid}: {e}",
                self.path.display()
            )
        })
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        if std::fs::remove_dir_all(&self.path).is_err() {
            // The server may have left directories nobody may list (mode
            // 000), which only root removes as they are. Its processes are
            // gone by now: nothing races the walk.
            unlock(&self.path);
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Makes `dir` and every directory below it (symlinks not followed) ours
/// to list and empty.
fn unlock(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            unlock(&entry.path());
        }
    }
}

/// Whether a start of `unit` runs `systemd-creds decrypt`.
fn encrypted(unit: &UnitSpec) -> bool {
    unit.credentials().sources().iter().any(|c| c.encrypted)
}

/// rustls needs a process-wide crypto provider; we build with ring only
/// (telemetry's exporter installs it too).
pub(crate) fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

impl Launcher for SystemLauncher {
    fn launch(&self, spec: &UnitSpec, generation: Gen) -> BoxFuture<Result<Launched, String>> {
        self.configure(spec);
        if !self.instance
            && let Ok(mut place) = self.place.lock()
        {
            // The previous generation is gone (one process at a time):
            // nothing of it is signalled in the old place.
            *place = if spec.sessions().is_per_host() {
                format!("{}/unit", self.name)
            } else {
                self.name.clone()
            };
        }
        match spec.transport() {
            Transport::Stdio(stdio) => self.stdio(spec, stdio, generation),
            Transport::Http(http) if encrypted(spec) => {
                // As for a stdio unit: `systemd-creds` off the runtime thread.
                let (this, spec, http) = (self.clone(), spec.clone(), http.clone());
                Box::pin(async move {
                    tokio::task::spawn_blocking(move || this.http(&spec, &http))
                        .await
                        .map_err(|e| format!("cannot prepare the connect: {e}"))?
                })
            }
            Transport::Http(http) => Box::pin(std::future::ready(self.http(spec, http))),
        }
    }

    fn signal(&self, pid: u32, signal: Signal) {
        match (self.cgroup(), signal) {
            (Some(cgroup), Signal::Term) => cgroup.terminate(),
            (Some(cgroup), Signal::Kill) => cgroup.kill(),
            (None, signal) => process::signal_group(pid, signal),
        }
    }

    fn reaped(&self, pid: u32) {
        // Grandchildren left in the group would outlive their server (a
        // cgroup's are killed before the exit is reported).
        if self.cgroup().is_none() {
            process::signal_group(pid, Signal::Kill);
        }
    }

    fn containment(&self) -> String {
        if self.http.load(std::sync::atomic::Ordering::Relaxed) {
            return String::new();
        }
        match self.cgroup() {
            Some(cgroup) => format!("cgroup {}", cgroup.dir().display()),
            None => "process group".into(),
        }
    }

    fn usage(&self) -> Option<Usage> {
        let now = std::time::Instant::now();
        if let Ok(cached) = self.usage.lock()
            && let Some((at, usage)) = *cached
            && now.duration_since(at) < USAGE_FRESH
        {
            return Some(usage);
        }
        let usage = self.cgroup().filter(|c| c.populated()).map(|c| c.usage())?;
        if let Ok(mut cached) = self.usage.lock() {
            *cached = Some((now, usage));
        }
        Some(usage)
    }

    fn sandbox(&self) -> String {
        self.enforced.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn credentials(&self) -> String {
        self.delivered.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn instance(&self, of: InstanceOf) -> Option<SharedLauncher> {
        Some(Arc::new(Self {
            name: of.name_in(&self.name),
            host: self.host.clone(),
            logs: self.logs.clone(),
            http: Arc::default(),
            enforced: Arc::default(),
            delivered: Arc::default(),
            usage: Arc::default(),
            place: Arc::new(std::sync::Mutex::new(format!("{}/{of}", self.name))),
            instance: true,
            // An instance logs in as its unit does.
            login: Arc::clone(&self.login),
        }))
    }

    fn login(&self) -> Option<Arc<Login>> {
        self.login.lock().ok().and_then(|l| l.clone())
    }

    fn oauth_secret(&self, spec: &UnitSpec) -> Result<Option<String>, String> {
        let Transport::Http(http) = spec.transport() else {
            return Ok(None);
        };
        match http.oauth() {
            Some(oauth) if oauth.client_secret.is_some() => {
                let items = self.http_credentials(spec)?;
                self.client_secret(&items, oauth)
            }
            _ => Ok(None),
        }
    }

    fn lane(&self, name: &str) -> Option<SharedLauncher> {
        Some(Arc::new(Self {
            name: name.to_owned(),
            host: self.host.clone(),
            logs: self.logs.clone(),
            http: Arc::default(),
            enforced: Arc::default(),
            delivered: Arc::default(),
            usage: Arc::default(),
            place: Arc::new(std::sync::Mutex::new(name.to_owned())),
            instance: true,
            // A lane is a second process of a stdio unit: no login.
            login: Arc::default(),
        }))
    }

    fn configure(&self, spec: &UnitSpec) {
        if !self.instance
            && let Ok(mut login) = self.login.lock()
        {
            let wanted = match spec.transport() {
                Transport::Http(http) => http.oauth().map(|o| (http.url(), o)),
                Transport::Stdio(_) => None,
            };
            let metadata_url = self.host.client_metadata_url.as_deref();
            *login = match (wanted, login.take()) {
                (Some((url, oauth)), Some(kept)) if kept.serves(url, oauth, metadata_url) => {
                    Some(kept)
                }
                (Some((url, oauth)), _) => Some(Login::new(
                    &self.name,
                    url,
                    oauth,
                    &self.host.logins,
                    self.host.client_metadata_url.clone(),
                )),
                (None, _) => None,
            };
        }
        self.logs.set_limit(spec.log_rate_limit());
        self.http.store(
            matches!(spec.transport(), Transport::Http(_)),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// A launcher shared between supervisors.
pub type SharedLauncher = Arc<dyn Launcher>;
