//! The lock that keeps one daemon per instance, in its runtime directory
//! ([`Instance::runtime_dir`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::unit::Instance;

/// Why the daemon cannot take its instance's lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another mcpd is already running the {instance} instance: {} is locked{}", path.display(), holder.map(|p| format!(" by pid {p}")).unwrap_or_default())]
    Held {
        instance: &'static str,
        path: PathBuf,
        holder: Option<u32>,
    },
    #[error("cannot create runtime directory {}: {source}", path.display())]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open lock file {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The held lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct InstanceLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl InstanceLock {
    /// Creates `dir` (mode 0700 for a user instance) and locks `dir/mcpd.lock`.
    pub fn acquire(instance: Instance, dir: &Path) -> Result<Self, LockError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let mode = match instance {
            Instance::System => 0o755,
            Instance::User => 0o700,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir)
            .map_err(|source| LockError::Dir {
                path: dir.to_owned(),
                source,
            })?;
        if instance == Instance::User {
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
        let path = dir.join("mcpd.lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|source| LockError::Open {
                path: path.clone(),
                source,
            })?;
        if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            let holder = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            return Err(LockError::Held {
                instance: instance.as_str(),
                path,
                holder,
            });
        }
        let _ = file.set_len(0);
        let _ = writeln!(file, "{}", std::process::id());
        Ok(Self { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
