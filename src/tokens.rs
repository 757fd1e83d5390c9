//! The HTTP endpoint's tokens (DESIGN §15): `STATE/tokens.json`, mode
//! 0600 in a 0700 directory, written by `mcpctl token` and read by the
//! daemon (which watches it: a change applies at once, a revoked token's
//! sessions end). Only a token's SHA-256 is kept; the token itself is
//! printed once, when it is made.
//!
//! A token is `mcpd_` and 64 hex digits: 256 bits of the OS's randomness.
//!
//! Every write goes through `update` (load, change, store under an
//! exclusive `flock` of `tokens.json.lock` beside it), so writers at once
//! lose nothing; the file is bounded (`MAX_FILE`, `MAX_TOKENS`). `Usage` is
//! the daemon's record of when each token was last used, written to
//! `tokens-used.json` at most once per `USED_EVERY` per token; `mcpctl token
//! list` reads it, the daemon does not watch it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Every token begins so (recognisable in a leaked file or log).
pub const PREFIX: &str = "mcpd_";
/// The most tokens a file may hold, and its largest size.
pub const MAX_TOKENS: usize = 4096;
pub const MAX_FILE: u64 = 4 << 20;

/// One token as it is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    /// SHA-256 of the token, hex.
    pub hash: String,
    pub scope: Scope,
    /// Seconds since the epoch.
    pub created: u64,
    pub expires: Option<u64>,
}

/// What a token reaches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every unit.
    All,
    /// These units.
    Units(Vec<String>),
    /// The units of this group (as they are when the request comes).
    Group(String),
}

impl Scope {
    /// How `mcpctl token list` writes it.
    pub fn label(&self) -> String {
        match self {
            Scope::All => "all".into(),
            Scope::Units(units) => units.join(","),
            Scope::Group(group) => format!("@{group}"),
        }
    }

    /// Whether unit `unit`, of groups `groups`, is within it.
    pub fn reaches(&self, unit: &str, groups: &[String]) -> bool {
        match self {
            Scope::All => true,
            Scope::Units(units) => units.iter().any(|u| u == unit),
            Scope::Group(group) => groups.iter().any(|g| g == group),
        }
    }
}

impl Entry {
    /// Whether it has expired at `now` (seconds since the epoch).
    pub fn expired(&self, now: u64) -> bool {
        self.expires.is_some_and(|at| now >= at)
    }
}

/// The token file of a state directory.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("tokens.json")
}

/// SHA-256 of `token`, hex.
pub fn hash(token: &str) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    // Every HTTP request hashes its token: two table lookups a byte, not
    // a `format!` (a third of a request's instructions before).
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// A new token (printed once) and its hash (kept).
pub fn mint() -> Result<(String, String), String> {
    let mut bytes = [0u8; 32];
    let mut filled = 0;
    while filled < bytes.len() {
        filled +=
            rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())
                .map_err(|e| format!("no randomness from the OS: {e}"))?;
    }
    let token = format!("{PREFIX}{}", hex(&bytes));
    let hash = hash(&token);
    Ok((token, hash))
}

/// Whether `name` may name a token: 1 to 128 of `[A-Za-z0-9_.-]`, not
/// starting with `.` or `-` (128: `connect-HOST-UNIT.group` of
/// `mcpctl connect --http` fits with a unit name of 64).
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The tokens of `file`; none when it does not exist.
pub fn load(file: &Path) -> Result<Vec<Entry>, String> {
    use std::io::Read;
    let mut text = Vec::new();
    match std::fs::File::open(file) {
        Ok(f) => {
            f.take(MAX_FILE + 1)
                .read_to_end(&mut text)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
    }
    if text.len() as u64 > MAX_FILE {
        return Err(format!(
            "{} is larger than {} MiB",
            file.display(),
            MAX_FILE >> 20
        ));
    }
    let tokens: Vec<Entry> = serde_json::from_slice(&text)
        .map_err(|e| format!("{} is not a token file: {e}", file.display()))?;
    if tokens.len() > MAX_TOKENS {
        return Err(format!(
            "{} holds more than {MAX_TOKENS} tokens",
            file.display()
        ));
    }
    Ok(tokens)
}

/// `file`'s directory, made 0700 when missing.
fn make_dir(file: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(dir) = file.parent()
        && !dir.is_dir()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// The lock file beside `file` that writers hold (`tokens.json.lock`).
pub fn lock_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Reads `file`, lets `change` edit its tokens and writes them back, all
/// under an exclusive `flock` of [`lock_path`]: two writers at once (two
/// `mcpctl token new`, a `connect --http` beside them) each see the
/// other's tokens, none is lost. Nothing is written when `change` fails.
/// The lock is released when its descriptor closes, also when the process
/// dies.
pub fn update<T>(
    file: &Path,
    change: impl FnOnce(&mut Vec<Entry>) -> Result<T, String>,
) -> Result<T, String> {
    use std::os::unix::fs::OpenOptionsExt;
    make_dir(file)?;
    let lock = lock_path(file);
    let held = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock)
        .map_err(|e| format!("cannot open {}: {e}", lock.display()))?;
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("cannot lock {}: {e}", lock.display()))?;
    let mut tokens = load(file)?;
    let out = change(&mut tokens)?;
    store(file, &tokens)?;
    drop(held);
    Ok(out)
}

/// Writes `tokens` to `file` (0600; its directory made 0700 when missing).
/// Writers go through [`update`], which holds the lock.
pub fn store(file: &Path, tokens: &[Entry]) -> Result<(), String> {
    make_dir(file)?;
    let mut text = serde_json::to_vec_pretty(tokens).map_err(|e| e.to_string())?;
    text.push(b'\n');
    crate::files::write_atomically(file, &text, 0o600)
}

/// How often, at most, a token's use is written down: `token list`'s
/// "last used" is to the minute.
pub const USED_EVERY: u64 = 60;

/// The file beside `file` where the daemon writes when each token was
/// last used (`tokens-used.json`: hash → seconds since the epoch). The
/// daemon's alone: `mcpctl token` only reads it, so it needs no lock.
pub fn used_path(file: &Path) -> PathBuf {
    file.with_file_name("tokens-used.json")
}

/// When each token of `file` was last used, by hash; none when it was
/// never written (or does not read: it is only informative).
pub fn load_used(file: &Path) -> std::collections::HashMap<String, u64> {
    use std::io::Read;
    let mut text = Vec::new();
    let read = std::fs::File::open(used_path(file))
        .and_then(|f| f.take(MAX_FILE + 1).read_to_end(&mut text));
    match read {
        Ok(n) if n as u64 <= MAX_FILE => serde_json::from_slice(&text).unwrap_or_default(),
        _ => std::collections::HashMap::new(),
    }
}

/// The daemon's record of uses: noted on every authorized request, kept
/// in memory, written to [`used_path`] the first time in [`USED_EVERY`]
/// seconds that a token is used.
#[derive(Debug)]
pub struct Usage {
    file: PathBuf,
    seen: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Held while writing: one write at a time.
    writing: std::sync::Mutex<()>,
}

impl Usage {
    /// The uses recorded for the tokens of `file` so far.
    pub fn open(file: &Path) -> Self {
        Self {
            file: file.to_owned(),
            seen: std::sync::Mutex::new(load_used(file)),
            writing: std::sync::Mutex::new(()),
        }
    }

    /// Notes a use of the token `hash` at `now`; whether to write (its
    /// last use written is [`USED_EVERY`] or more before).
    pub fn note(&self, hash: &str, now: u64) -> bool {
        let Ok(mut seen) = self.seen.lock() else {
            return false;
        };
        match seen.get_mut(hash) {
            Some(at) if now < at.saturating_add(USED_EVERY) => false,
            Some(at) => {
                *at = now;
                true
            }
            None => {
                seen.insert(hash.to_owned(), now);
                true
            }
        }
    }

    /// Writes the uses of the tokens `kept` (hashes; the others are
    /// forgotten). Blocking.
    pub fn write(&self, kept: &std::collections::HashSet<String>) -> Result<(), String> {
        let _one = self.writing.lock().map_err(|e| e.to_string())?;
        let snapshot: std::collections::BTreeMap<String, u64> = {
            let mut seen = self.seen.lock().map_err(|e| e.to_string())?;
            seen.retain(|hash, _| kept.contains(hash));
            seen.iter().map(|(h, at)| (h.clone(), *at)).collect()
        };
        let mut text = serde_json::to_vec(&snapshot).map_err(|e| e.to_string())?;
        text.push(b'\n');
        make_dir(&self.file)?;
        crate::files::write_atomically(&used_path(&self.file), &text, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_is_sha256_in_lowercase_hex() {
        assert_eq!(
            super::hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_token_is_prefixed_high_entropy_and_kept_only_as_its_hash() {
        let (token, hash) = mint().expect("mint");
        assert!(token.starts_with(PREFIX));
        assert_eq!(token.len(), PREFIX.len() + 64);
        assert_eq!(hash.len(), 64);
        assert_eq!(super::hash(&token), hash);
        assert!(!hash.contains(&token[PREFIX.len()..]));
        let (other, _) = mint().expect("mint");
        assert_ne!(token, other);
    }

    #[test]
    fn scopes_reach_their_units() {
        let groups = ["dev".to_owned()];
        assert!(Scope::All.reaches("a", &[]));
        assert!(Scope::Units(vec!["a".into()]).reaches("a", &[]));
        assert!(!Scope::Units(vec!["a".into()]).reaches("b", &[]));
        assert!(Scope::Group("dev".into()).reaches("b", &groups));
        assert!(!Scope::Group("ops".into()).reaches("b", &groups));
    }

    #[test]
    fn the_file_round_trips_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = path(&dir.path().join("state"));
        assert_eq!(load(&file), Ok(Vec::new()));
        let entry = Entry {
            name: "laptop".into(),
            hash: hash("mcpd_x"),
            scope: Scope::Units(vec!["a".into(), "b".into()]),
            created: 1,
            expires: Some(2),
        };
        store(&file, std::slice::from_ref(&entry)).expect("store");
        assert_eq!(load(&file), Ok(vec![entry.clone()]));
        let mode = std::fs::metadata(&file).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(entry.expired(2) && !entry.expired(1));
        assert!(is_name("laptop-1.home") && !is_name("-x") && !is_name("a/b") && !is_name(""));
    }

    #[test]
    fn uses_are_written_once_a_minute_and_only_of_kept_tokens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = path(dir.path());
        let usage = Usage::open(&file);
        assert!(usage.note("h1", 1000));
        assert!(!usage.note("h1", 1000 + USED_EVERY - 1));
        assert!(usage.note("h1", 1000 + USED_EVERY));
        assert!(usage.note("h2", 1000));
        let kept = ["h1".to_owned()].into_iter().collect();
        usage.write(&kept).expect("write");
        let used = load_used(&file);
        assert_eq!(used.get("h1"), Some(&(1000 + USED_EVERY)));
        assert!(!used.contains_key("h2"));
        // A restarted daemon goes on from what was written.
        assert!(!Usage::open(&file).note("h1", 1000 + USED_EVERY + 1));
    }
}
