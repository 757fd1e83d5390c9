//! Logins held by mcpd (DESIGN §17): one per HTTP unit with `oauth { }`,
//! for every host, kept in the state directory and never handed out.
//!
//! rmcp's `auth` does the protocol (RFC 9728 and RFC 8414 discovery, the
//! issuer checks, CIMD, pre-registered and dynamic clients, PKCE S256,
//! RFC 8707 `resource`, the code exchange, refresh with rotation, and the
//! refresh on a `401` of [`AuthClient`]); this module holds its state:
//!
//! - [`FileStore`]: the unit's tokens, one JSON file (0600) in
//!   `STATE/oauth/NAME.json`, written atomically, read within
//!   [`MAX_FILE`]; a refresh token the authorization server rejects
//!   (`invalid_grant`) drops the tokens, nothing else does.
//! - [`Login`]: the unit's [`AuthClient`] (one per unit, so one refresh at a
//!   time: rmcp's manager is behind one mutex), the login under way (its
//!   PKCE verifier and `state` stay here; `mcpctl auth login` gets only the
//!   URL and hands back the redirect), and a [`Summary`] published on a
//!   `watch` channel for status and D-Bus, which never holds a token.
//!
//! Every request to an authorization server is bounded
//! ([`REQUEST_TIMEOUT`]), so a hung one fails its own unit's login or
//! connect and nothing else.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rmcp::transport::auth::{
    AuthClient, AuthError, AuthorizationCallback, AuthorizationManager, AuthorizationRequest,
    AuthorizationSession, ClientCredentialsConfig, CredentialStore, OAuthClientConfig,
    StoredCredentials, WWWAuthenticateParams,
};
use tokio::sync::{Mutex, watch};

use crate::unit::{Grant, OAuthSpec};

/// The most a token file may hold.
pub const MAX_FILE: u64 = 1 << 20;
/// The bound on one discovery, registration or token request (and on a
/// login's start as a whole).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a login started by `mcpctl auth login` waits for its code.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(600);
/// The client name mcpd registers as.
pub const CLIENT_NAME: &str = "mcpd";

/// The directory of the token files in the daemon's state directory.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("oauth")
}

/// What status and D-Bus show of a login: never a token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// An access token is held.
    pub logged_in: bool,
    /// The authorization server that issued it.
    pub issuer: Option<String>,
    /// When the access token expires, if the server said.
    pub expires: Option<SystemTime>,
    pub scopes: Vec<String>,
    /// The last thing that went wrong with the login (a refused check, a
    /// failed exchange), until the next login.
    pub error: Option<String>,
}

impl Summary {
    /// The `Auth` property's text (the `Auth:` line without the expiry,
    /// which mcpctl counts down from `AuthExpiresUSec`).
    pub fn text(&self) -> String {
        if !self.logged_in {
            return match &self.error {
                Some(e) => format!("needs login ({e})"),
                None => "needs login".into(),
            };
        }
        let mut text = match &self.issuer {
            Some(issuer) => format!("OAuth ({issuer}), logged in"),
            None => "OAuth, logged in".into(),
        };
        if !self.scopes.is_empty() {
            text.push_str(", scopes ");
            text.push_str(&self.scopes.join(" "));
        }
        text
    }

    /// Read from a token file's contents (tokens skipped).
    fn of(stored: Option<&StoredCredentials>) -> Self {
        let Some(stored) = stored else {
            return Self::default();
        };
        let token = stored
            .token_response
            .as_ref()
            .and_then(|t| serde_json::to_value(t).ok());
        let Some(token) = token else {
            return Self {
                issuer: stored.issuer.clone(),
                ..Self::default()
            };
        };
        let expires = match (token["expires_in"].as_u64(), stored.token_received_at) {
            (Some(lifetime), Some(at)) => {
                Some(SystemTime::UNIX_EPOCH + Duration::from_secs(at.saturating_add(lifetime)))
            }
            _ => None,
        };
        let scopes = if stored.granted_scopes.is_empty() {
            token["scope"]
                .as_str()
                .map(|s| s.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default()
        } else {
            stored.granted_scopes.clone()
        };
        Self {
            logged_in: true,
            issuer: stored.issuer.clone(),
            expires,
            scopes,
            error: None,
        }
    }
}

/// A unit's tokens on disk: `STATE/oauth/NAME.json`, 0600.
#[derive(Clone)]
pub struct FileStore {
    path: PathBuf,
    summary: watch::Sender<Summary>,
    /// When the access token held was received and how long it lives (as
    /// the file says): what [`keep_fresh`] schedules by.
    lifetime: Arc<std::sync::Mutex<Option<(SystemTime, Duration)>>>,
    /// Held through a refresh (rmcp's refresh guard).
    refreshing: Arc<Mutex<()>>,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn store_error(e: impl std::fmt::Display) -> AuthError {
    AuthError::CredentialStoreError(e.to_string())
}

impl FileStore {
    /// Reads the file (blocking; small).
    fn read(path: &Path) -> Result<Option<StoredCredentials>, String> {
        use std::io::Read as _;
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let mut bytes = Vec::new();
        file.take(MAX_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(format!(
                "{} is larger than {MAX_FILE} bytes",
                path.display()
            ));
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{} is not a token file: {e}", path.display()))
    }

    fn write(path: &Path, stored: &StoredCredentials) -> Result<(), String> {
        if let Some(dir) = path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let bytes = serde_json::to_vec(stored).map_err(|e| e.to_string())?;
        crate::files::write_atomically(path, &bytes, 0o600)
    }

    fn publish(&self, stored: Option<&StoredCredentials>) {
        if let Ok(mut lifetime) = self.lifetime.lock() {
            *lifetime = lifetime_of(stored);
        }
        let mut summary = Summary::of(stored);
        // A failed login's error stays until a token is held again.
        if !summary.logged_in {
            summary.error = self.summary.borrow().error.clone();
        }
        self.summary.send_if_modified(|s| {
            let changed = *s != summary;
            *s = summary;
            changed
        });
    }
}

#[async_trait::async_trait]
impl CredentialStore for FileStore {
    /// The tokens as rmcp's manager sees them: without their expiry, so
    /// it never refreshes on its own 30 s before it (DESIGN §17: the
    /// unit's [`keep_fresh`] refreshes at ¾ of the lifetime; rmcp still
    /// refreshes on a `401`).
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let path = self.path.clone();
        let stored = tokio::task::spawn_blocking(move || Self::read(&path))
            .await
            .map_err(store_error)?
            .map_err(store_error)?;
        Ok(stored.map(|mut stored| {
            if let Some(token) = stored.token_response.as_mut() {
                token.set_expires_in(None);
            }
            stored
        }))
    }

    /// One refresh at a time per unit, whoever asks (the unit's
    /// [`keep_fresh`], a request's refresh on a `401`).
    async fn acquire_refresh_guard(
        &self,
    ) -> Result<Option<rmcp::transport::auth::CredentialRefreshGuard>, AuthError> {
        let guard = Arc::clone(&self.refreshing).lock_owned().await;
        Ok(Some(rmcp::transport::auth::CredentialRefreshGuard::new(
            guard,
        )))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        let path = self.path.clone();
        let kept = credentials.clone();
        tokio::task::spawn_blocking(move || Self::write(&path, &kept))
            .await
            .map_err(store_error)?
            .map_err(store_error)?;
        self.publish(Some(&credentials));
        Ok(())
    }

    async fn clear(&self) -> Result<(), AuthError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("cannot remove {}: {e}", path.display()))
            }
            _ => Ok(()),
        })
        .await
        .map_err(store_error)?
        .map_err(store_error)?;
        self.publish(None);
        Ok(())
    }

    /// `invalid_grant`: the refresh token is gone for good, and with it
    /// the login (the client id is kept for the next one).
    async fn on_refresh_token_rejected(
        &self,
        credentials: &StoredCredentials,
    ) -> Result<(), AuthError> {
        let kept = StoredCredentials::new(credentials.client_id.clone(), None, Vec::new(), None)
            .with_issuer(credentials.issuer.clone());
        self.save(kept).await
    }
}

/// Why a login (or the token a connect needs) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// No usable token: a person must log in.
    #[error("it needs a login")]
    Needed,
    /// A check of DESIGN §17 refused, or a request failed.
    #[error("{0}")]
    Failed(String),
    /// The login was begun by another caller.
    #[error("this login was begun by another user")]
    NotYours,
    /// No login is under way (none begun, or it timed out).
    #[error("no login is under way: run mcpctl auth login again")]
    NotBegun,
}

/// A login begun and not finished.
struct Pending {
    session: AuthorizationSession,
    /// Its `state` (the CSRF token), to compare with the redirect's.
    state: String,
    /// Who began it: only they may complete it.
    uid: u32,
    started: tokio::time::Instant,
    /// The scopes its authorization request asks for (its URL's `scope`).
    scopes: Vec<String>,
}

/// One unit's login.
pub struct Login {
    name: String,
    url: url::Url,
    spec: OAuthSpec,
    /// mcpd's Client ID Metadata Document (`mcpd.kdl`), if any.
    metadata_url: Option<String>,
    store: FileStore,
    /// The unit's client, once a connect built it: shared by its
    /// generations, so refreshes are one at a time.
    client: Mutex<Option<AuthClient<reqwest::Client>>>,
    /// The task that keeps that client's token fresh ([`keep_fresh`]).
    refresher: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    pending: Mutex<Option<Pending>>,
    /// What `403 insufficient_scope` answers asked for (DESIGN §17
    /// "Step-up"); a std mutex, never held across an await.
    step: std::sync::Mutex<StepUp>,
}

impl Drop for Login {
    fn drop(&mut self) {
        self.stop_refresher();
    }
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("summary", &*self.store.summary.borrow())
            .finish_non_exhaustive()
    }
}

/// What went wrong in rmcp's words, named by the check of DESIGN §17 it
/// is.
fn describe(e: &AuthError) -> String {
    match e {
        AuthError::AuthorizationServerMismatch {
            expected_issuer,
            received_issuer,
        } => format!(
            "issuer check failed: expected {expected_issuer}, the authorization server said {received_issuer}"
        ),
        AuthError::AuthorizationServerMissingIssuer { expected_issuer } => {
            format!("issuer check failed: no issuer in the answer, expected {expected_issuer}")
        }
        AuthError::PkceUnsupported => {
            "the authorization server does not offer PKCE S256 (code_challenge_methods_supported)"
                .into()
        }
        AuthError::ProtectedResourceMetadataInvalid { url, reason } => {
            format!("protected resource metadata at {url} is refused: {reason}")
        }
        other => crate::mux::wire::error_chain(other)
            .trim_end_matches([':', ' '])
            .to_owned(),
    }
}

impl Login {
    /// The login of unit `name` at `url`, its tokens in `dir`.
    pub fn new(
        name: &str,
        url: &url::Url,
        spec: &OAuthSpec,
        dir: &Path,
        metadata_url: Option<String>,
    ) -> Arc<Self> {
        let path = dir.join(format!("{name}.json"));
        // Small, and read once per unit and daemon start.
        let stored = FileStore::read(&path).ok().flatten();
        let (summary, _) = watch::channel(Summary::of(stored.as_ref()));
        let lifetime = Arc::new(std::sync::Mutex::new(lifetime_of(stored.as_ref())));
        Arc::new(Self {
            name: name.to_owned(),
            url: url.clone(),
            spec: spec.clone(),
            metadata_url,
            store: FileStore {
                path,
                summary,
                lifetime,
                refreshing: Arc::default(),
            },
            client: Mutex::new(None),
            refresher: std::sync::Mutex::new(None),
            pending: Mutex::new(None),
            step: std::sync::Mutex::new(StepUp::default()),
        })
    }

    /// Whether this login serves `url` and `spec` (else a new one is made).
    pub fn serves(&self, url: &url::Url, spec: &OAuthSpec, metadata_url: Option<&str>) -> bool {
        self.url == *url && self.spec == *spec && self.metadata_url.as_deref() == metadata_url
    }

    pub fn summary(&self) -> Summary {
        self.store.summary.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Summary> {
        self.store.summary.subscribe()
    }

    /// The port `mcpctl auth login` listens on (0: any).
    pub fn redirect_port(&self) -> u16 {
        self.spec.redirect_port.unwrap_or(0)
    }

    fn note(&self, error: Option<String>) {
        self.store.summary.send_if_modified(|s| {
            let changed = s.error != error;
            s.error = error;
            changed
        });
    }

    /// A manager for the unit's server with this store, its requests
    /// bounded.
    async fn manager(&self) -> Result<AuthorizationManager, LoginError> {
        let mut manager = tokio::time::timeout(
            REQUEST_TIMEOUT,
            AuthorizationManager::new(self.url.as_str()),
        )
        .await
        .map_err(|_| LoginError::Failed(format!("no answer within {REQUEST_TIMEOUT:?}")))?
        .map_err(|e| LoginError::Failed(describe(&e)))?;
        manager.set_credential_store(self.store.clone());
        Ok(manager)
    }

    /// The client a generation connects with: the unit's, holding a
    /// token. [`LoginError::Needed`] when there is none to be had without
    /// a person (no token, or the refresh token was refused); anything
    /// else is transient (the network, `temporarily_unavailable`) and
    /// retried with the unit's backoff.
    pub async fn client(
        &self,
        secret: Option<String>,
    ) -> Result<AuthClient<reqwest::Client>, LoginError> {
        if self.spec.grant == Grant::ClientCredentials {
            return self.client_credentials(secret).await;
        }
        if !self.store.summary.borrow().logged_in || self.login_needed().is_some() {
            return Err(LoginError::Needed);
        }
        let mut slot = self.client.lock().await;
        let client = match slot.as_ref() {
            Some(client) => client.clone(),
            None => {
                let mut manager = self.manager().await?;
                let found = tokio::time::timeout(REQUEST_TIMEOUT, manager.initialize_from_store())
                    .await
                    .map_err(|_| {
                        LoginError::Failed(format!(
                            "discovery: no answer within {REQUEST_TIMEOUT:?}"
                        ))
                    })?
                    .map_err(|e| LoginError::Failed(describe(&e)))?;
                if !found {
                    // Nothing stored, or another issuer's (DESIGN §17:
                    // never the old issuer's tokens).
                    return Err(LoginError::Needed);
                }
                if let (Some(id), Some(secret)) = (&self.spec.client_id, secret) {
                    manager
                        .configure_client(
                            OAuthClientConfig::new(id.clone(), self.url.as_str())
                                .with_client_secret(secret),
                        )
                        .map_err(|e| LoginError::Failed(describe(&e)))?;
                }
                let client = AuthClient::new(reqwest::Client::new(), manager);
                *slot = Some(client.clone());
                self.start_refresher(&client);
                client
            }
        };
        drop(slot);
        match tokio::time::timeout(REQUEST_TIMEOUT, client.get_access_token()).await {
            Err(_) => Err(LoginError::Failed(format!(
                "token refresh: no answer within {REQUEST_TIMEOUT:?}"
            ))),
            Ok(Ok(_)) => Ok(client),
            Ok(Err(AuthError::AuthorizationRequired)) => {
                *self.client.lock().await = None;
                self.stop_refresher();
                Err(LoginError::Needed)
            }
            Ok(Err(e)) => Err(LoginError::Failed(describe(&e))),
        }
    }

    /// Begins a login for caller `uid`, the redirect going to
    /// `redirect_uri` (mcpctl's loopback listener): discovery, the
    /// client's registration, and the authorization URL to open. A login
    /// begun earlier is forgotten.
    pub async fn begin(
        &self,
        redirect_uri: &str,
        uid: u32,
        secret: Option<String>,
    ) -> Result<String, LoginError> {
        if self.spec.grant == Grant::ClientCredentials {
            return Err(LoginError::Failed(
                "grant \"client-credentials\" needs no login".into(),
            ));
        }
        let begun = tokio::time::timeout(REQUEST_TIMEOUT, self.start(redirect_uri, secret)).await;
        let session = match begun {
            Err(_) => Err(LoginError::Failed(self.no_answer().await)),
            Ok(result) => result,
        };
        let session = match session {
            Ok(session) => session,
            Err(e) => {
                self.note(Some(e.to_string()));
                return Err(e);
            }
        };
        let url = session.get_authorization_url().to_owned();
        let query = |key: &str| {
            url::Url::parse(&url).ok().and_then(|u| {
                u.query_pairs()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.into_owned())
            })
        };
        let state = query("state").unwrap_or_default();
        let scopes = query("scope")
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        *self.pending.lock().await = Some(Pending {
            session,
            state,
            uid,
            started: tokio::time::Instant::now(),
            scopes,
        });
        Ok(url)
    }

    async fn start(
        &self,
        redirect_uri: &str,
        secret: Option<String>,
    ) -> Result<AuthorizationSession, LoginError> {
        let mut manager = self.manager().await?;
        // The spec's order: the 401's `resource_metadata` first (whose
        // `resource` must be this server: a mismatch is refused, not
        // passed by for the well-known URIs), then the well-known URIs.
        let challenge = self.challenge().await;
        let resolution = manager
            .resolve_metadata_from_challenge(challenge.as_deref())
            .await
            .map_err(|e| LoginError::Failed(describe(&e)))?;
        if !resolution.source.is_discovered() {
            return Err(LoginError::Failed(format!(
                "malformed or missing metadata: {} publishes no OAuth protected resource or authorization server metadata",
                self.url
            )));
        }
        check_endpoints(&resolution.metadata)?;
        manager.set_metadata(resolution.metadata);
        let mut request = AuthorizationRequest::new(redirect_uri)
            .with_client_name(CLIENT_NAME)
            .with_initial_scope_selection();
        if let Some(scope) = &self.spec.scope {
            request = request.with_scopes(scope.split_whitespace());
        }
        if let Some(wanted) = self.step_up_wanted() {
            // A step-up: the union of the scopes held and those a 403
            // asked for (SEP-2350), in place of the initial selection.
            request = request.with_scopes(wanted);
        }
        if let Some(id) = &self.spec.client_id {
            request = request.with_preregistered_client(id.clone());
            if let Some(secret) = secret {
                request = request.with_client_secret(secret);
            }
        } else if let Some(cimd) = &self.metadata_url {
            request = request.with_client_metadata_url(cimd.clone());
        }
        AuthorizationSession::new(manager, request)
            .await
            .map_err(|(_, e)| LoginError::Failed(describe(&e)))
    }

    /// The server's `WWW-Authenticate` challenge to a request without a
    /// token, if it answers 401 with one.
    async fn challenge(&self) -> Option<String> {
        let probe = reqwest::Client::new()
            .post(self.url.as_str())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(
                serde_json::json!({
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": crate::mux::method::Method::Ping.as_str(),
                })
                .to_string(),
            )
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .ok()?;
        if probe.status() != reqwest::StatusCode::UNAUTHORIZED {
            return None;
        }
        probe
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)?
            .to_str()
            .ok()
            .map(str::to_owned)
    }

    /// Completes the login begun by `uid` with the redirect mcpctl
    /// received (`redirect` is its whole URL): checks its `state` and
    /// `iss`, exchanges the code and keeps the tokens.
    pub async fn complete(&self, redirect: &str, uid: u32) -> Result<(), LoginError> {
        let mut slot = self.pending.lock().await;
        let Some(pending) = slot.as_ref() else {
            return Err(LoginError::NotBegun);
        };
        if pending.uid != uid {
            return Err(LoginError::NotYours);
        }
        if pending.started.elapsed() > LOGIN_TIMEOUT {
            *slot = None;
            return Err(LoginError::NotBegun);
        }
        let result = self.exchange(pending, redirect).await;
        if result.is_ok() {
            self.logged_in_with(pending.scopes.clone());
            *slot = None;
            // The next connect builds a client with the new tokens.
            *self.client.lock().await = None;
            self.stop_refresher();
        }
        self.note(result.as_ref().err().map(ToString::to_string));
        result
    }

    async fn exchange(&self, pending: &Pending, redirect: &str) -> Result<(), LoginError> {
        let url = url::Url::parse(redirect)
            .map_err(|e| LoginError::Failed(format!("the redirect is not a URL: {e}")))?;
        if let Some((_, error)) = url.query_pairs().find(|(k, _)| k == "error") {
            let detail = url
                .query_pairs()
                .find(|(k, _)| k == "error_description")
                .map(|(_, v)| format!(": {v}"))
                .unwrap_or_default();
            return Err(LoginError::Failed(format!(
                "the authorization server refused the login: {error}{detail}"
            )));
        }
        let callback = AuthorizationCallback::from_redirect_url(redirect)
            .map_err(|e| LoginError::Failed(describe(&e)))?;
        if callback.csrf_token != pending.state {
            return Err(LoginError::Failed(
                "state check failed: the redirect's state is not this login's".into(),
            ));
        }
        tokio::time::timeout(
            REQUEST_TIMEOUT,
            pending.session.handle_callback_with_issuer(
                &callback.code,
                &callback.csrf_token,
                callback.issuer.as_deref(),
            ),
        )
        .await
        .map_err(|_| {
            LoginError::Failed(format!(
                "the token endpoint did not answer within {REQUEST_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| LoginError::Failed(describe(&e)))?;
        Ok(())
    }

    /// Forgets the login: its tokens, its client, a login under way.
    /// [`Login::logout_revoking`] revokes them first.
    pub async fn logout(&self) -> Result<(), LoginError> {
        *self.pending.lock().await = None;
        *self.client.lock().await = None;
        if let Ok(mut step) = self.step.lock() {
            *step = StepUp::default();
        }
        self.stop_refresher();
        self.note(None);
        self.store
            .clear()
            .await
            .map_err(|e| LoginError::Failed(describe(&e)))
    }
}

/// The most scopes a step-up keeps: a server names them.
pub const MAX_SCOPES: usize = 64;
/// How many logins may ask for a scope the server goes on refusing before
/// it is not asked again (DESIGN §17: "a scope refused twice").
pub const SCOPE_TRIES: u32 = 2;

/// A unit's step-up (DESIGN §17; the MCP authorization spec's "Scope
/// challenge handling"): what the last login asked for, what a `403
/// insufficient_scope` asked for since, and how often each scope was
/// asked for and refused again.
#[derive(Debug, Default)]
struct StepUp {
    /// The scopes the last completed login asked for.
    asked: Vec<String>,
    /// Logins completed, so a refusal counts once per login however many
    /// calls meet it.
    logins: u64,
    /// Per scope: the logins that asked for it and were refused it still,
    /// and the last login counted.
    refused: HashMap<String, (u32, u64)>,
    /// The scopes a 403 named since the last login: the unit needs a login
    /// that asks for them (empty: it does not).
    needed: Vec<String>,
    /// The server answered `401` to the token and rmcp's refresh made no
    /// other (a revoked token, another authorization server since, SEP-2352):
    /// the unit needs a login.
    rejected: bool,
}

/// What a `403 insufficient_scope` means for the call that met it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepUpAnswer {
    /// A person must log in again with more scopes: the unit needs a
    /// login, and the call gets this reason.
    Login(String),
    /// The server goes on refusing a scope two logins asked for (or names
    /// none): the call gets this error, the unit runs on.
    Refused(String),
}

fn union(into: &mut Vec<String>, more: impl IntoIterator<Item = String>) {
    for scope in more {
        if into.len() < MAX_SCOPES && !into.contains(&scope) {
            into.push(scope);
        }
    }
}

impl Login {
    /// A request of the unit's met `403` with this `WWW-Authenticate`
    /// challenge (rmcp parses it). None when it is not
    /// `insufficient_scope`; else what the call is answered.
    pub fn insufficient_scope(&self, challenge: &str) -> Option<StepUpAnswer> {
        let params = WWWAuthenticateParams::parse(challenge, &self.url);
        if !params.is_insufficient_scope() {
            return None;
        }
        let name = &self.name;
        let required: Vec<String> = params
            .scope
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .take(MAX_SCOPES)
            .map(str::to_owned)
            .collect();
        if required.is_empty() {
            return Some(StepUpAnswer::Refused(format!(
                "server {name} refused the call (403 insufficient_scope) and named no scope to ask for"
            )));
        }
        let Ok(mut step) = self.step.lock() else {
            return Some(StepUpAnswer::Refused(format!(
                "server {name} refused the call (403 insufficient_scope)"
            )));
        };
        let login = step.logins;
        let mut exhausted = Vec::new();
        for scope in &required {
            if !step.asked.contains(scope) {
                continue;
            }
            if step.refused.len() >= MAX_SCOPES && !step.refused.contains_key(scope) {
                exhausted.push(scope.clone());
                continue;
            }
            let (count, counted) = step.refused.entry(scope.clone()).or_insert((0, u64::MAX));
            if *counted != login {
                *counted = login;
                *count += 1;
            }
            if *count >= SCOPE_TRIES {
                exhausted.push(scope.clone());
            }
        }
        if !exhausted.is_empty() {
            step.needed.clear();
            return Some(StepUpAnswer::Refused(format!(
                "server {name} refused the call: scope {} was refused {SCOPE_TRIES} times and is not asked again (403 insufficient_scope)",
                exhausted.join(" ")
            )));
        }
        let mut needed = std::mem::take(&mut step.needed);
        union(&mut needed, required);
        step.needed = needed;
        Some(StepUpAnswer::Login(super::machine::needs_login_with(
            name,
            &step.needed,
        )))
    }

    /// A request of the unit's met `401` that rmcp's refresh did not
    /// cure ([`AuthClient`] then hands the challenge on): the token is not
    /// accepted, and a person must log in (again). What the call gets.
    /// With `grant "client-credentials"` no person is needed: the client
    /// is dropped, and the next connect fetches a new token.
    pub fn rejected(&self) -> String {
        let name = &self.name;
        if self.spec.grant == Grant::ClientCredentials {
            if let Ok(mut slot) = self.client.try_lock() {
                *slot = None;
            }
            return format!("server {name} rejected mcpd's token: fetching a new one");
        }
        if let Ok(mut step) = self.step.lock() {
            step.rejected = true;
        }
        super::machine::needs_login(name)
    }

    /// Whether the unit needs a login since its last one: a `401` that a
    /// refresh did not cure, or a `403` asking for scopes (named here).
    pub fn login_needed(&self) -> Option<Vec<String>> {
        let step = self.step.lock().ok()?;
        (step.rejected || !step.needed.is_empty()).then(|| step.needed.clone())
    }

    /// The scopes a `403` asked for since the last login, when the unit
    /// needs a login for them.
    fn step_up_needed(&self) -> Option<Vec<String>> {
        let step = self.step.lock().ok()?;
        (!step.needed.is_empty()).then(|| step.needed.clone())
    }

    /// What the next login asks for in a step-up: the scopes held (those
    /// granted and those the last login asked for) and those asked for
    /// since.
    fn step_up_wanted(&self) -> Option<Vec<String>> {
        let needed = self.step_up_needed()?;
        let mut wanted = self
            .step
            .lock()
            .map(|s| s.asked.clone())
            .unwrap_or_default();
        union(&mut wanted, self.summary().scopes);
        union(&mut wanted, needed);
        Some(wanted)
    }

    /// A login that asked for `scopes` completed.
    fn logged_in_with(&self, scopes: Vec<String>) {
        if let Ok(mut step) = self.step.lock() {
            step.asked = scopes;
            step.logins += 1;
            step.needed.clear();
            step.rejected = false;
        }
    }
}

// ---- grant "client-credentials" (DESIGN §17, SEP-1046) ----

impl Login {
    /// The client of a machine-to-machine unit: its token fetched by the
    /// daemon with the client id and secret (rmcp's client credentials
    /// exchange: `client_secret_basic` when the AS offers only that, else
    /// `client_secret_post`), and fetched again when it expired or was
    /// rejected. Never [`LoginError::Needed`]: a failure is retried with
    /// the unit's backoff.
    async fn client_credentials(
        &self,
        secret: Option<String>,
    ) -> Result<AuthClient<reqwest::Client>, LoginError> {
        let (Some(client_id), Some(client_secret)) = (self.spec.client_id.clone(), secret) else {
            return Err(LoginError::Failed(
                "grant \"client-credentials\" needs client-id and client-secret".into(),
            ));
        };
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            let held = tokio::time::timeout(REQUEST_TIMEOUT, client.get_access_token()).await;
            if matches!(held, Ok(Ok(_))) {
                return Ok(client.clone());
            }
        }
        let fetched = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let mut manager = self.manager().await?;
            let resolution = manager
                .resolve_metadata()
                .await
                .map_err(|e| LoginError::Failed(describe(&e)))?;
            check_endpoints(&resolution.metadata)?;
            manager.set_metadata(resolution.metadata);
            let config = ClientCredentialsConfig::ClientSecret {
                client_id,
                client_secret,
                scopes: self
                    .spec
                    .scope
                    .as_deref()
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect(),
                resource: Some(self.url.to_string()),
            };
            let failed = |e: AuthError| LoginError::Failed(describe(&e));
            manager
                .validate_client_credentials_metadata(&config)
                .map_err(failed)?;
            manager
                .configure_client_credentials(&config)
                .map_err(failed)?;
            manager
                .exchange_client_credentials(&config)
                .await
                .map_err(failed)?;
            Ok::<_, LoginError>(AuthClient::new(reqwest::Client::new(), manager))
        })
        .await
        .map_err(|_| {
            LoginError::Failed(format!(
                "the authorization server did not answer within {REQUEST_TIMEOUT:?}"
            ))
        })?;
        let client = match fetched {
            Ok(client) => client,
            Err(e) => {
                self.note(Some(e.to_string()));
                return Err(e);
            }
        };
        self.note(None);
        *slot = Some(client.clone());
        Ok(client)
    }
}

/// Plain `http://` goes only to a loopback authorization server (DESIGN
/// §17): a code or a token must not cross a network in the clear.
fn check_endpoints(
    metadata: &rmcp::transport::auth::AuthorizationMetadata,
) -> Result<(), LoginError> {
    let endpoints = [
        Some(&metadata.authorization_endpoint),
        Some(&metadata.token_endpoint),
        metadata.registration_endpoint.as_ref(),
        metadata.issuer.as_ref(),
    ];
    for endpoint in endpoints.into_iter().flatten() {
        let url = url::Url::parse(endpoint).map_err(|e| {
            LoginError::Failed(format!("malformed metadata: {endpoint} is not a URL ({e})"))
        })?;
        match url.scheme() {
            "https" => {}
            "http" if crate::unit::spec::is_loopback_host(&url) => {}
            _ => {
                return Err(LoginError::Failed(format!(
                    "the authorization server's {endpoint} is not https:// (plain http:// only to a loopback address)"
                )));
            }
        }
    }
    Ok(())
}

// The token's lifetime (DESIGN §17): refreshed by the unit at ¾ of it,
// transient failures retried with a backoff of their own.

/// The bound on one refresh by [`keep_fresh`]: the unit's requests wait
/// for it no longer, and go on with the token they have (a quarter of its
/// lifetime is left).
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest wait between two attempts of a failing refresh.
pub const REFRESH_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// What a login shows when the server refused a token just refreshed.
pub const TOKEN_REFUSED: &str =
    "the server refused the token after a refresh (401 invalid_token): log in again";

/// When the stored access token was received and how long it lives.
fn lifetime_of(stored: Option<&StoredCredentials>) -> Option<(SystemTime, Duration)> {
    let stored = stored?;
    let token = serde_json::to_value(stored.token_response.as_ref()?).ok()?;
    let lifetime = Duration::from_secs(token["expires_in"].as_u64()?);
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(stored.token_received_at?);
    Some((at, lifetime))
}

/// When to refresh a token received `at` that lives `lifetime`: at ¾ of it.
pub fn refresh_due(at: SystemTime, lifetime: Duration) -> SystemTime {
    at + lifetime * 3 / 4
}

/// The wait after the `failures`th failed refresh in a row, `left` before
/// the token expires: doubling from 1 s up to [`REFRESH_BACKOFF_MAX`], and
/// while the token is still good at most half of what is left of it (so a
/// short outage is over before it expires).
pub fn refresh_backoff(failures: u32, left: Duration) -> Duration {
    let doubling = Duration::from_secs(1u64 << failures.saturating_sub(1).min(6));
    let wait = doubling.min(REFRESH_BACKOFF_MAX);
    if left.is_zero() {
        wait
    } else {
        wait.min((left / 2).max(Duration::from_secs(1)))
    }
}

impl Login {
    fn start_refresher(&self, client: &AuthClient<reqwest::Client>) {
        let task = tokio::spawn(keep_fresh(
            self.name.clone(),
            client.clone(),
            self.store.clone(),
        ));
        if let Ok(mut slot) = self.refresher.lock()
            && let Some(old) = slot.replace(task.abort_handle())
        {
            old.abort();
        }
    }

    fn stop_refresher(&self) {
        if let Ok(mut slot) = self.refresher.lock()
            && let Some(task) = slot.take()
        {
            task.abort();
        }
    }

    /// The server refused a token just refreshed: the unit needs a login
    /// (the tokens stay on disk: a refresh token is dropped only on
    /// `invalid_grant`).
    pub async fn refused(&self) {
        *self.client.lock().await = None;
        self.stop_refresher();
        self.store.summary.send_if_modified(|s| {
            let changed = s.logged_in || s.error.as_deref() != Some(TOKEN_REFUSED);
            s.logged_in = false;
            s.error = Some(TOKEN_REFUSED.into());
            changed
        });
    }
}

/// Keeps unit `name`'s token fresh: refreshes it at ¾ of its lifetime
/// through the unit's client (whose manager's lock makes requests wait
/// for the refresh, within [`REFRESH_TIMEOUT`]), retries a transient
/// failure with [`refresh_backoff`] (no restart budget spent, no login
/// asked for) and ends when the authorization server refuses the refresh
/// token (`invalid_grant`: the unit needs a login) or there is no expiry
/// to schedule by.
async fn keep_fresh(name: String, client: AuthClient<reqwest::Client>, store: FileStore) {
    let mut failures = 0u32;
    loop {
        let Some((at, lifetime)) = store.lifetime.lock().ok().and_then(|l| *l) else {
            return;
        };
        let left = (at + lifetime)
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        let wait = if failures == 0 {
            refresh_due(at, lifetime)
                .duration_since(SystemTime::now())
                .unwrap_or_default()
        } else {
            refresh_backoff(failures, left)
        };
        tokio::time::sleep(wait).await;
        let refreshed = tokio::time::timeout(REFRESH_TIMEOUT, async {
            let manager = client.auth_manager.lock().await;
            manager.refresh_token().await.map(drop)
        })
        .await;
        let error = match refreshed {
            Ok(Ok(())) => {
                tracing::debug!(target: "mcpd::supervisor", mcpd_server = %name, "refreshed its token");
                failures = 0;
                continue;
            }
            Ok(Err(
                e @ (AuthError::TokenRefreshRejected(_) | AuthError::AuthorizationRequired),
            )) => {
                let why = if matches!(e, AuthError::AuthorizationRequired) {
                    // No refresh token: the access token serves to its end.
                    tokio::time::sleep(left).await;
                    "the access token expired and the authorization server gave no refresh token"
                        .to_owned()
                } else {
                    format!(
                        "the authorization server refused the refresh token: {}",
                        describe(&e)
                    )
                };
                tracing::warn!(target: "mcpd::supervisor", mcpd_server = %name, "{why}");
                store.summary.send_if_modified(|s| {
                    s.logged_in = false;
                    s.error = Some(why);
                    true
                });
                return;
            }
            Ok(Err(e)) => describe(&e),
            Err(_) => format!("no answer within {REFRESH_TIMEOUT:?}"),
        };
        failures = failures.saturating_add(1);
        let left = (at + lifetime)
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tracing::warn!(
            target: "mcpd::supervisor", mcpd_server = %name,
            "token refresh failed ({error}); retry in {}",
            humantime::format_duration(refresh_backoff(failures, left))
        );
    }
}

/// How long [`Login::no_answer`] looks for the authorization server's name.
const NAMING_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of a metadata document read for that name.
const MAX_METADATA: usize = 64 << 10;

impl Login {
    /// Why a login's start timed out, naming the authorization server the
    /// server's protected resource metadata names (looked up again,
    /// briefly), else the server.
    async fn no_answer(&self) -> String {
        match tokio::time::timeout(NAMING_TIMEOUT, self.authorization_server()).await {
            Ok(Some(server)) => format!(
                "the authorization server {server} did not answer within {REQUEST_TIMEOUT:?}"
            ),
            _ => format!(
                "the authorization server of {} did not answer within {REQUEST_TIMEOUT:?}",
                self.url
            ),
        }
    }

    /// The first authorization server of the server's protected resource
    /// metadata (from its 401's `resource_metadata`, else the well-known
    /// URI).
    async fn authorization_server(&self) -> Option<String> {
        let http = reqwest::Client::builder()
            .timeout(NAMING_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .ok()?;
        let named = self.challenge().await.and_then(|h| {
            rmcp::transport::auth::WWWAuthenticateParams::parse(&h, &self.url).resource_metadata_url
        });
        let metadata = match named {
            Some(url) => url,
            None => {
                let mut url = self.url.clone();
                let path = url.path().trim_end_matches('/').to_owned();
                url.set_path(&format!("/.well-known/oauth-protected-resource{path}"));
                url.set_query(None);
                url
            }
        };
        let mut response = http.get(metadata).send().await.ok()?;
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.ok()? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_METADATA {
                return None;
            }
        }
        let document: serde_json::Value = serde_json::from_slice(&body).ok()?;
        document["authorization_servers"][0]
            .as_str()
            .map(str::to_owned)
    }
}

// Logout revokes (RFC 7009) where the authorization server offers it.

/// The bound on a logout's revocation as a whole (discovery and both
/// requests): past it the tokens are forgotten here all the same.
pub const REVOKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Login {
    /// Revokes the login's tokens where the authorization server
    /// advertises `revocation_endpoint` (the refresh token, then the
    /// access token; within [`REVOKE_TIMEOUT`]), then forgets them
    /// whatever came of it. Returns what became of the revocation, for the
    /// caller to say: `their tokens were revoked`, or why not.
    pub async fn logout_revoking(&self, secret: Option<String>) -> Result<String, LoginError> {
        let path = self.store.path.clone();
        let stored = tokio::task::spawn_blocking(move || FileStore::read(&path))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        let revoked = match stored {
            Some(stored) if stored.token_response.is_some() => Some(
                tokio::time::timeout(REVOKE_TIMEOUT, self.revoke(&stored, secret))
                    .await
                    .unwrap_or_else(|_| {
                        Err(format!(
                            "the authorization server did not answer within {REVOKE_TIMEOUT:?}"
                        ))
                    }),
            ),
            _ => None,
        };
        self.logout().await?;
        Ok(match revoked {
            None | Some(Ok(false)) => String::new(),
            Some(Ok(true)) => "its tokens were revoked".into(),
            Some(Err(e)) => {
                tracing::warn!(target: "mcpd::supervisor", mcpd_server = %self.name, "logout: the tokens were not revoked: {e}");
                format!("its tokens were forgotten here but not revoked: {e}")
            }
        })
    }

    /// Revokes `stored`'s refresh token, then its access token: whether
    /// the authorization server offers revocation.
    async fn revoke(
        &self,
        stored: &StoredCredentials,
        secret: Option<String>,
    ) -> Result<bool, String> {
        let manager = self.manager().await.map_err(|e| e.to_string())?;
        let metadata = manager.resolve_metadata().await.map_err(|e| describe(&e))?;
        let Some(endpoint) = metadata
            .metadata
            .additional_fields
            .get("revocation_endpoint")
            .and_then(|v| v.as_str())
        else {
            return Ok(false);
        };
        let url = url::Url::parse(endpoint)
            .map_err(|e| format!("revocation_endpoint {endpoint} is not a URL ({e})"))?;
        if !(url.scheme() == "https"
            || url.scheme() == "http" && crate::unit::spec::is_loopback_host(&url))
        {
            return Err(format!(
                "revocation_endpoint {endpoint} is not https:// (plain http:// only to a loopback address)"
            ));
        }
        let token =
            serde_json::to_value(stored.token_response.as_ref()).map_err(|e| e.to_string())?;
        let http = reqwest::Client::builder()
            .timeout(REVOKE_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        for hint in ["refresh_token", "access_token"] {
            let Some(value) = token[hint].as_str() else {
                continue;
            };
            let body = {
                let mut form = url::form_urlencoded::Serializer::new(String::new());
                form.append_pair("token", value)
                    .append_pair("token_type_hint", hint);
                if secret.is_none() {
                    form.append_pair("client_id", &stored.client_id);
                }
                form.finish()
            };
            let mut request = http
                .post(url.clone())
                .header("content-type", "application/x-www-form-urlencoded");
            if let Some(secret) = &secret {
                request = request.basic_auth(&stored.client_id, Some(secret));
            }
            let answer = request
                .body(body)
                .send()
                .await
                .map_err(|e| format!("{endpoint}: {}", crate::mux::wire::error_chain(&e)))?;
            if !answer.status().is_success() {
                return Err(format!(
                    "{endpoint} answered {} to the {}",
                    answer.status(),
                    hint.replace('_', " ")
                ));
            }
        }
        Ok(true)
    }
}
