//! The endpoint's bearer tokens (DESIGN §15): looked up by their SHA-256
//! in memory, a connection's last header remembered ([`Seen`]); a token
//! minted since the file was read is looked for off the runtime's thread
//! (issue 49).

use super::*;

/// The token file is looked at for an unknown token at most this often
/// ([`Inner::minted_since`]): requests with made-up tokens cost no system
/// call each.
pub(super) const TOKENS_LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// The `Authorization` header a connection's last request bore and the
/// hash of its token: the requests of a keep-alive connection bear the
/// same one, which is then not hashed again (what is compared is what
/// the same connection sent before, so the comparison tells it nothing).
/// The token itself is looked up every time: a revoked one fails at once.
/// The header is kept as a copy: a `HeaderValue` hyper parsed shares the
/// connection's 8 KiB read buffer, which it would keep from being reused.
#[derive(Default)]
pub(super) struct Seen(Mutex<Option<(Box<[u8]>, String)>>);

impl Inner {
    /// The token the request bears, if it is one of the token file's and
    /// has not expired.
    pub(super) async fn authorize(
        self: &Arc<Self>,
        request: &Request<Incoming>,
        seen: &Seen,
    ) -> Result<Arc<crate::tokens::Entry>, String> {
        let Some(value) = request.headers().get(header::AUTHORIZATION) else {
            return Err("no token (Authorization: Bearer TOKEN)".into());
        };
        let hash = self.bearer_hash(value, seen)?;
        let entry = match self.token(&hash) {
            Some(entry) => entry,
            None => self.minted_since(hash).await.ok_or("not a valid token")?,
        };
        let now = now();
        if entry.expired(now) {
            return Err(format!("token {} has expired", entry.name));
        }
        if self.usage.note(&entry.hash, now) {
            let kept: std::collections::HashSet<String> = self
                .tokens
                .read()
                .map(|t| t.keys().cloned().collect())
                .unwrap_or_default();
            let usage = Arc::clone(&self.usage);
            tokio::task::spawn_blocking(move || {
                if let Err(why) = usage.write(&kept) {
                    tracing::warn!(target: "mcpd::http", "cannot record when tokens were used: {why}");
                }
            });
        }
        Ok(entry)
    }

    /// The hash of the bearer token `value` carries (the connection
    /// remembers the last one: a keep-alive client hashes once).
    pub(super) fn bearer_hash(&self, value: &HeaderValue, seen: &Seen) -> Result<String, String> {
        let mut seen = seen.0.lock().map_err(|_| "poisoned")?;
        if let Some((before, hash)) = &*seen
            && **before == *value.as_bytes()
        {
            return Ok(hash.clone());
        }
        let bearer = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or("not a bearer token")?;
        let hash = crate::tokens::hash(bearer);
        *seen = Some((value.as_bytes().into(), hash.clone()));
        Ok(hash)
    }

    pub(super) fn token(&self, hash: &str) -> Option<Arc<crate::tokens::Entry>> {
        self.tokens.read().ok()?.get(hash).cloned()
    }

    /// Records the token file's modification time as read now (blocking:
    /// a `stat`).
    pub(super) fn note_tokens_read(&self) {
        let modified = std::fs::metadata(&self.tokens_file)
            .and_then(|m| m.modified())
            .ok();
        if let Ok(mut read) = self.tokens_read.lock() {
            *read = modified;
        }
    }

    /// Reads the token file again on the blocking pool (its `stat`, read
    /// and parse: a 4 MiB file, or one that does not answer, delays no
    /// request), then takes its tokens and ends the sessions whose token
    /// went; a file that does not read keeps the tokens read before.
    pub(super) async fn reload_tokens(self: &Arc<Self>) {
        let inner = Arc::clone(self);
        let read = tokio::task::spawn_blocking(move || {
            inner.note_tokens_read();
            crate::tokens::load(&inner.tokens_file)
        })
        .await;
        let entries = match read {
            Ok(Ok(entries)) => entries,
            Ok(Err(why)) => {
                tracing::warn!(target: "mcpd::http", "keeping the tokens read before: {why}");
                return;
            }
            Err(why) => {
                tracing::warn!(target: "mcpd::http", "keeping the tokens read before: {why}");
                return;
            }
        };
        let by_hash: HashMap<String, Arc<crate::tokens::Entry>> = entries
            .into_iter()
            .map(|e| (e.hash.clone(), Arc::new(e)))
            .collect();
        let changed = self.tokens.read().map(|t| *t != by_hash).unwrap_or(true);
        if !changed {
            return;
        }
        tracing::info!(target: "mcpd::http", "{} HTTP tokens", by_hash.len());
        if let Ok(mut tokens) = self.tokens.write() {
            *tokens = by_hash;
        }
        self.end_sessions_without_a_valid_token("its token was revoked");
    }

    /// A token minted since the file was last read (`mcpctl token new`
    /// before the daemon's watch reloaded it): looked for in the file when
    /// it changed since, and the file's new tokens taken at once (the
    /// reload that follows ends what was revoked). Anyone who can connect
    /// reaches this with a token that is not one: the file's `stat` (and
    /// after a change its read) run on the blocking pool, one at a time
    /// (`tokens_check`), never on the runtime's thread; those waiting find
    /// what the one before them took.
    pub(super) async fn minted_since(
        self: &Arc<Self>,
        hash: String,
    ) -> Option<Arc<crate::tokens::Entry>> {
        let _turn = self.tokens_check.lock().await;
        if let Some(entry) = self.token(&hash) {
            return Some(entry);
        }
        let inner = Arc::clone(self);
        tokio::task::spawn_blocking(move || inner.minted_since_now(&hash))
            .await
            .ok()
            .flatten()
    }

    /// [`Inner::minted_since`]'s file work (blocking): at most one look
    /// at the file per [`TOKENS_LOOK_EVERY`], whatever the number of
    /// unknown tokens (a token minted since is seen within that, or by
    /// the watch's reload).
    pub(super) fn minted_since_now(&self, hash: &str) -> Option<Arc<crate::tokens::Entry>> {
        {
            let mut looked = self.tokens_looked.lock().ok()?;
            if looked.is_some_and(|at| at.elapsed() < TOKENS_LOOK_EVERY) {
                return None;
            }
            *looked = Some(std::time::Instant::now());
        }
        let modified = std::fs::metadata(&self.tokens_file)
            .and_then(|m| m.modified())
            .ok();
        {
            let read = self.tokens_read.lock().ok()?;
            if modified.is_none() || *read == modified {
                return None;
            }
        }
        self.note_tokens_read();
        let entries = crate::tokens::load(&self.tokens_file).ok()?;
        let mut tokens = self.tokens.write().ok()?;
        for entry in entries {
            tokens
                .entry(entry.hash.clone())
                .or_insert_with(|| Arc::new(entry));
        }
        tokens.get(hash).cloned()
    }
}
