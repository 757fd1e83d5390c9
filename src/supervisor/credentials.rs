//! Credentials (DESIGN §16): what a unit's `credentials` block names, read
//! at each start and delivered as systemd delivers them.
//!
//! [`read`] takes each credential from where the unit says (a file, each
//! file of a directory, the credstores, `systemd-creds decrypt`) within
//! the size limits, and fails closed with a reason naming the credential
//! and the path. [`deliver`] writes them into a fresh per-generation
//! directory under the daemon's runtime directory (0500, files 0400, owned
//! by the server's user); the [`Delivered`] it returns removes the
//! directory when dropped, which is when the generation ends. [`prepare`]
//! removes what an earlier daemon left there. Values never leave this
//! module except into the files, the `env` variables and HTTP headers;
//! what is shown is the [`Listing`]: names and sizes.

use std::ffi::OsString;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::unit::{CredentialsSpec, Instance};

/// The most one credential (one file) may hold: 1 MiB.
pub const MAX_CREDENTIAL: u64 = 1 << 20;
/// The most all credentials of one unit may hold together: 16 MiB.
pub const MAX_UNIT: u64 = 16 << 20;
/// The most files one unit's credentials may have.
pub const MAX_FILES: usize = 1024;

/// `f_type` of a tmpfs and of a ramfs (`statfs(2)`).
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Where a daemon's credentials come from and go.
#[derive(Debug, Clone)]
pub struct Stores {
    /// The directory generations' credential directories are made in
    /// (`RUNTIME/credentials`).
    pub root: PathBuf,
    /// The credstores `import` looks in, first match wins.
    pub credstores: Vec<PathBuf>,
    /// `systemd-creds --user`: an unprivileged user instance decrypts with
    /// the user's key, as systemd's per-user services do.
    pub user_scope: bool,
    /// Whether `root` is on a tmpfs (credentials never reach a disk).
    pub tmpfs: bool,
}

impl Stores {
    /// The credstores of `instance` (DESIGN §16): `/etc/mcpd/credstore`
    /// for the system instance, `$XDG_CONFIG_HOME/mcpd/credstore` for a
    /// user instance, then the daemon's own `$CREDENTIALS_DIRECTORY` when
    /// systemd started it with credentials.
    pub fn new(instance: Instance, euid: u32, root: PathBuf) -> Self {
        let mut credstores = vec![instance.credstore()];
        if let Some(own) =
            std::env::var_os(crate::unit::spec::CREDENTIALS_DIRECTORY).filter(|d| !d.is_empty())
        {
            credstores.push(PathBuf::from(own));
        }
        let tmpfs = root
            .parent()
            .and_then(|p| rustix::fs::statfs(p).ok())
            .is_some_and(|s| {
                // (`f_type`'s width differs between architectures.)
                #[allow(clippy::useless_conversion)]
                let kind = i64::from(s.f_type);
                kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
            });
        Self {
            root,
            credstores,
            user_scope: instance == Instance::User && euid != 0,
            tmpfs,
        }
    }
}

/// One credential as read: a file, or a directory of files.
#[derive(Debug)]
pub struct Item {
    pub name: String,
    pub files: Contents,
}

/// What one credential holds. `Debug` shows sizes, never values.
pub enum Contents {
    File(Vec<u8>),
    /// The files of a directory, by file name.
    Directory(Vec<(String, Vec<u8>)>),
}

impl std::fmt::Debug for Contents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Contents::File(bytes) => write!(f, "File(<{} bytes>)", bytes.len()),
            Contents::Directory(files) => write!(f, "Directory(<{} files>)", files.len()),
        }
    }
}

/// What a unit was given, as shown: `gh (40 B), db (1 file)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing(pub Vec<(String, Shown)>);

/// How one credential is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    Bytes(u64),
    Files(usize),
}

impl std::fmt::Display for Listing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, shown)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match shown {
                Shown::Bytes(n) => write!(f, "{name} ({n} B)")?,
                Shown::Files(1) => write!(f, "{name} (1 file)")?,
                Shown::Files(n) => write!(f, "{name} ({n} files)")?,
            }
        }
        Ok(())
    }
}

impl Listing {
    pub fn of(items: &[Item]) -> Self {
        Self(
            items
                .iter()
                .map(|item| {
                    let shown = match &item.files {
                        Contents::File(bytes) => Shown::Bytes(bytes.len() as u64),
                        Contents::Directory(files) => Shown::Files(files.len()),
                    };
                    (item.name.clone(), shown)
                })
                .collect(),
        )
    }
}

/// Counts what is read against the unit's limits.
#[derive(Default)]
struct Budget {
    bytes: u64,
    files: usize,
}

impl Budget {
    fn take(&mut self, name: &str, bytes: u64) -> Result<(), String> {
        self.bytes += bytes;
        self.files += 1;
        if self.bytes > MAX_UNIT {
            return Err(format!(
                "credential {name}: the unit's credentials pass 16 MiB together"
            ));
        }
        if self.files > MAX_FILES {
            return Err(format!(
                "credential {name}: the unit's credentials pass {MAX_FILES} files"
            ));
        }
        Ok(())
    }
}

/// Reads every credential of `spec` (the `load` and `load-encrypted`
/// lines in order, then what `import` finds), failing closed: the reason
/// names the credential and the path.
pub fn read(
    spec: &CredentialsSpec,
    stores: &Stores,
    within: Duration,
) -> Result<Vec<Item>, String> {
    let mut budget = Budget::default();
    let mut items = Vec::new();
    for source in spec.sources() {
        let name = &source.name;
        let files = if source.encrypted {
            let bytes = decrypt(name, &source.path, stores.user_scope, within)?;
            budget.take(name, bytes.len() as u64)?;
            Contents::File(bytes)
        } else {
            let meta = std::fs::metadata(&source.path)
                .map_err(|e| cannot(name, "read", &source.path, &e))?;
            if meta.is_dir() {
                Contents::Directory(directory(name, &source.path, &mut budget)?)
            } else {
                let bytes = file(name, &source.path)?;
                budget.take(name, bytes.len() as u64)?;
                Contents::File(bytes)
            }
        };
        items.push(Item {
            name: name.clone(),
            files,
        });
    }
    for glob in spec.import() {
        let pattern = wildmatch::WildMatch::new(glob);
        for store in &stores.credstores {
            let Ok(entries) = std::fs::read_dir(store) else {
                // A credstore that does not exist holds nothing.
                continue;
            };
            let mut found: Vec<(String, PathBuf)> = entries
                .flatten()
                .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
                .filter(|(n, p)| !n.starts_with('.') && pattern.matches(n) && p.is_file())
                .collect();
            found.sort();
            for (name, path) in found {
                if items.iter().any(|i| i.name == name) {
                    continue;
                }
                let bytes = file(&name, &path)?;
                budget.take(&name, bytes.len() as u64)?;
                items.push(Item {
                    name,
                    files: Contents::File(bytes),
                });
            }
        }
    }
    Ok(items)
}

/// The value of credential `name` for an HTTP header or a variable: a
/// file, not a directory; `stores` for the reason when `import` found
/// none.
pub fn value<'a>(items: &'a [Item], name: &str, stores: &Stores) -> Result<&'a [u8], String> {
    match items.iter().find(|i| i.name == name).map(|i| &i.files) {
        Some(Contents::File(bytes)) => Ok(bytes),
        Some(Contents::Directory(_)) => Err(format!(
            "credential {name} is a directory; a header or a variable takes a file"
        )),
        None => Err(format!(
            "credential {name}: no `import` found it in {}",
            stores
                .credstores
                .iter()
                .map(|s| s.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn cannot(name: &str, what: &str, path: &Path, e: &std::io::Error) -> String {
    format!(
        "credential {name}: cannot {what} {}: {}",
        path.display(),
        crate::unit::diag::io_text(e)
    )
}

/// One file, at most [`MAX_CREDENTIAL`] bytes.
fn file(name: &str, path: &Path) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(path).map_err(|e| cannot(name, "read", path, &e))?;
    let mut bytes = Vec::new();
    f.take(MAX_CREDENTIAL + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| cannot(name, "read", path, &e))?;
    if bytes.len() as u64 > MAX_CREDENTIAL {
        return Err(format!(
            "credential {name}: {} is larger than 1 MiB",
            path.display()
        ));
    }
    Ok(bytes)
}

/// Each regular file of a directory (not below it), by file name.
fn directory(
    name: &str,
    dir: &Path,
    budget: &mut Budget,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut entries = std::fs::read_dir(dir)
        .and_then(|entries| entries.collect::<Result<Vec<_>, _>>())
        .map_err(|e| cannot(name, "list", dir, &e))?;
    // In name order, so a limit always stops at the same file.
    entries.sort_by_key(std::fs::DirEntry::file_name);
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.path();
        let Ok(file_name) = entry.file_name().into_string() else {
            return Err(format!(
                "credential {name}: {} is not a UTF-8 name",
                path.display()
            ));
        };
        if !path.is_file() {
            continue;
        }
        let shown = format!("{name}/{file_name}");
        let bytes = file(&shown, &path)?;
        budget.take(&shown, bytes.len() as u64)?;
        files.push((file_name, bytes));
    }
    Ok(files)
}

/// How much of `systemd-creds`' stderr is kept for the reason.
const STDERR_KEPT: u64 = 64 * 1024;

/// `systemd-creds decrypt --name=NAME PATH -` (with `--user` in user
/// scope): the plaintext, or why not. It gets `within` (the unit's
/// `startup-timeout`: decrypting is part of the start) and is killed
/// past it; of its output no more than a credential's limit is read.
fn decrypt(name: &str, path: &Path, user_scope: bool, within: Duration) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path).map_err(|e| cannot(name, "read", path, &e))?;
    // An encrypted credential is larger than its plaintext.
    if meta.len() > 2 * MAX_CREDENTIAL {
        return Err(format!(
            "credential {name}: {} is larger than 1 MiB",
            path.display()
        ));
    }
    let mut command = std::process::Command::new("systemd-creds");
    if user_scope {
        command.arg("--user");
    }
    let out = bounded_output(
        command
            .arg("decrypt")
            .arg(format!("--name={name}"))
            .arg(path)
            .arg("-"),
        within,
        MAX_CREDENTIAL + 1,
    )
    .map_err(|e| {
        let why = match e {
            Bounded::Run(e) => format!(
                "cannot run systemd-creds: {}",
                crate::unit::diag::io_text(&e)
            ),
            Bounded::Late => format!(
                "systemd-creds{} decrypt did not finish within {} (startup-timeout); killed",
                if user_scope { " --user" } else { "" },
                humantime::format_duration(within)
            ),
        };
        format!(
            "credential {name}: cannot decrypt {}: {why}",
            path.display()
        )
    })?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        let why = why.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
        let status = out
            .status
            .code()
            .map_or_else(|| "killed".into(), |c| format!("exit {c}"));
        return Err(format!(
            "credential {name}: cannot decrypt {}: systemd-creds{} decrypt failed ({status}): {why}",
            path.display(),
            if user_scope { " --user" } else { "" },
        ));
    }
    if out.stdout.len() as u64 > MAX_CREDENTIAL {
        return Err(format!(
            "credential {name}: {} decrypts to more than 1 MiB",
            path.display()
        ));
    }
    Ok(out.stdout)
}

/// Why [`bounded_output`] has no output.
enum Bounded {
    /// The command could not be run (or waited for).
    Run(std::io::Error),
    /// It did not exit in time, and was killed.
    Late,
}

/// `command`'s output as [`std::process::Command::output`] gives it, but
/// with at most `limit` bytes of its stdout (and [`STDERR_KEPT`] of its
/// stderr) read, and the command killed if it has not exited `within`.
/// Blocking: for a thread that may block (the launcher's preparing
/// thread).
fn bounded_output(
    command: &mut std::process::Command,
    within: Duration,
    limit: u64,
) -> Result<std::process::Output, Bounded> {
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(Bounded::Run)?;
    // Signalled through its pidfd: never another process that took its
    // pid after it was reaped.
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_child(&child),
        rustix::process::PidfdFlags::empty(),
    )
    .ok();
    let stdout = read_at_most(child.stdout.take(), limit);
    let stderr = read_at_most(child.stderr.take(), STDERR_KEPT);
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(within) {
        Ok(status) => status.map_err(Bounded::Run)?,
        Err(_) => {
            match &pidfd {
                Some(pidfd) => {
                    let _ =
                        rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
                }
                None => {
                    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                }
            }
            // Reaped by its waiter; its readers end with its pipes.
            let _ = rx.recv();
            return Err(Bounded::Late);
        }
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// A thread reading at most `limit` bytes of `pipe`; past the limit the
/// pipe is closed (its writer gets EPIPE).
fn read_at_most(
    pipe: Option<impl std::io::Read + Send + 'static>,
    limit: u64,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(pipe) = pipe {
            let _ = pipe.take(limit).read_to_end(&mut bytes);
        }
        bytes
    })
}

/// A generation's credentials directory, removed with its files when
/// dropped (the generation's end).
#[derive(Debug)]
pub struct Delivered {
    pub dir: PathBuf,
    pub listing: Listing,
    /// `CREDENTIALS_DIRECTORY` and the `env` lines' variables.
    pub env: Vec<(String, OsString)>,
}

impl Drop for Delivered {
    fn drop(&mut self) {
        remove(&self.dir);
    }
}

/// Reads `spec`'s credentials and writes them into a fresh directory for
/// generation `generation` of unit `unit`, handed to `owner` (uid, gid)
/// when the server runs as another user. None when the unit has none.
pub fn deliver(
    spec: &CredentialsSpec,
    stores: &Stores,
    unit: &str,
    generation: u64,
    owner: Option<(u32, u32)>,
    within: Duration,
) -> Result<Option<Delivered>, String> {
    use std::os::unix::ffi::OsStringExt;
    if spec.is_empty() {
        return Ok(None);
    }
    let items = read(spec, stores, within)?;
    let mut env = Vec::with_capacity(spec.env().len() + 1);
    for (var, name) in spec.env() {
        let bytes = value(&items, name, stores).map_err(|e| format!("{var}: {e}"))?;
        if bytes.contains(&0) {
            return Err(format!(
                "{var}: credential {name} holds a NUL byte, which no variable can"
            ));
        }
        env.push((var.clone(), OsString::from_vec(bytes.to_vec())));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = stores.root.join(format!("{unit}.{generation}.{nanos:08x}"));
    let made = std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| {
            format!(
                "cannot create the credentials directory {}: {}",
                dir.display(),
                crate::unit::diag::io_text(&e)
            )
        });
    made?;
    env.insert(
        0,
        (
            crate::unit::spec::CREDENTIALS_DIRECTORY.to_owned(),
            dir.clone().into_os_string(),
        ),
    );
    let delivered = Delivered {
        dir,
        listing: Listing::of(&items),
        env,
    };
    write(&delivered.dir, &items, owner)?;
    if !stores.tmpfs {
        warn_not_tmpfs(&stores.root);
    }
    Ok(Some(delivered))
}

use std::os::unix::fs::DirBuilderExt as _;

/// Writes the files (0400) and subdirectories (0500) into `dir`, hands
/// them to `owner`, then closes `dir` (0500).
fn write(dir: &Path, items: &[Item], owner: Option<(u32, u32)>) -> Result<(), String> {
    let failed = |path: &Path, e: std::io::Error| {
        format!(
            "cannot write the credentials directory {}: {}",
            path.display(),
            crate::unit::diag::io_text(&e)
        )
    };
    let mut closed = Vec::new();
    for item in items {
        match &item.files {
            Contents::File(bytes) => {
                let path = dir.join(&item.name);
                put(&path, bytes, owner).map_err(|e| failed(&path, e))?;
            }
            Contents::Directory(files) => {
                let sub = dir.join(&item.name);
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&sub)
                    .map_err(|e| failed(&sub, e))?;
                for (file_name, bytes) in files {
                    let path = sub.join(file_name);
                    put(&path, bytes, owner).map_err(|e| failed(&path, e))?;
                }
                closed.push(sub);
            }
        }
    }
    closed.push(dir.to_owned());
    for d in closed {
        give(&d, owner).map_err(|e| failed(&d, e))?;
        set_mode(&d, 0o500).map_err(|e| failed(&d, e))?;
    }
    Ok(())
}

/// One file, created 0400 and written through the descriptor that made it.
fn put(path: &Path, bytes: &[u8], owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(path)?;
    f.write_all(bytes)?;
    give(path, owner)
}

fn give(path: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    match owner {
        Some((uid, gid)) => rustix::fs::chown(
            path,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(std::io::Error::from),
        None => Ok(()),
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Removes a credentials directory (0500: made ours to empty first).
fn remove(dir: &Path) {
    if std::fs::remove_dir_all(dir).is_err() {
        unlock(dir);
        if let Err(e) = std::fs::remove_dir_all(dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(target: "mcpd::daemon", "cannot remove the credentials directory {}: {e}", dir.display());
        }
    }
}

/// Makes `dir` and every directory below it (symlinks not followed)
/// ours to list and empty.
fn unlock(dir: &Path) {
    let _ = set_mode(dir, 0o700);
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            unlock(&entry.path());
        }
    }
}

/// Says once per daemon that credentials are written to a disk.
fn warn_not_tmpfs(root: &Path) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(target: "mcpd::daemon", "credentials are written to {}, which is not on a tmpfs: they may reach the disk", root.display());
    });
}

/// The directory generations' credentials go in (`RUNTIME/credentials`),
/// emptied of what an earlier daemon left there (after a SIGKILL). Mode
/// 0711: a server running as another user reaches its own directory and
/// cannot list the others.
pub fn prepare(runtime_dir: &Path) -> PathBuf {
    let dir = runtime_dir.join("credentials");
    if dir.exists() {
        unlock(&dir);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(target: "mcpd::daemon", "removed the servers' credentials an earlier daemon left in {}", dir.display())
            }
            Err(e) => tracing::warn!(target: "mcpd::daemon", "cannot empty {}: {e}", dir.display()),
        }
    }
    let made = std::fs::DirBuilder::new().mode(0o711).create(&dir);
    if let Err(e) = made.and_then(|()| set_mode(&dir, 0o711)) {
        tracing::warn!(target: "mcpd::daemon", "cannot create {}: {e}; servers with credentials cannot start", dir.display());
    }
    dir
}

/// Removes the (empty) directory at daemon stop.
pub fn close(root: &Path) {
    let _ = std::fs::remove_dir(root);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_names_and_sizes_never_values() {
        let listing = Listing::of(&[
            Item {
                name: "gh".into(),
                files: Contents::File(vec![b'x'; 40]),
            },
            Item {
                name: "db".into(),
                files: Contents::Directory(vec![("pw".into(), b"secret".to_vec())]),
            },
            Item {
                name: "tls".into(),
                files: Contents::Directory(vec![
                    ("a".into(), Vec::new()),
                    ("b".into(), Vec::new()),
                ]),
            },
        ]);
        assert_eq!(listing.to_string(), "gh (40 B), db (1 file), tls (2 files)");
    }

    #[test]
    fn the_unit_budget_names_the_credential_that_passes_it() {
        let mut budget = Budget::default();
        for i in 0..16 {
            budget
                .take(&format!("c{i}"), MAX_CREDENTIAL)
                .expect("within");
        }
        let err = budget.take("last", 1).expect_err("over");
        assert!(err.contains("credential last"), "{err}");
    }
}
