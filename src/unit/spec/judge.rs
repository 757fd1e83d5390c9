//! The judge of a unit's draft: collects every problem of one
//! validation (a field, its message, a related place, help) while the
//! spec's parts are made from the draft (the parent module), so one pass
//! reports them all.

use super::*;

/// Collects the errors of one validation.
#[derive(Default)]
pub(super) struct Judge {
    pub(super) errors: Vec<SpecError>,
}

impl Judge {
    pub(super) fn fail(&mut self, field: Field, message: impl Into<String>) -> &mut SpecError {
        self.errors.push(SpecError {
            field,
            message: message.into(),
            related: None,
            help: None,
        });
        let last = self.errors.len() - 1;
        &mut self.errors[last]
    }

    pub(super) fn duration(
        &mut self,
        field: Field,
        value: Option<Duration>,
        default: Duration,
    ) -> Duration {
        let Some(d) = value else { return default };
        if d < MIN_DURATION {
            self.fail(
                field.clone(),
                format!("`{}` must be at least 1ms", field.key()),
            )
            .help = Some("write a positive duration such as \"500ms\" or \"1m30s\"".into());
        } else if d > MAX_DURATION {
            self.fail(
                field.clone(),
                format!("`{}` must be at most 24h", field.key()),
            );
        }
        d
    }

    pub(super) fn limits(&mut self, draft: LimitsDraft) -> Limits {
        let mut bounded = |field: Field, value: Option<i128>, min: u64, max: u64, unit: &str| {
            let n = value?;
            match u64::try_from(n) {
                Ok(n) if (min..=max).contains(&n) => Some(n),
                _ => {
                    let key = field.key();
                    self.fail(
                        field,
                        format!("`{key}` must be between {min} and {max}{unit}, got {n}"),
                    );
                    None
                }
            }
        };
        Limits {
            memory_max: bounded(
                Field::MemoryMax,
                draft.memory_max,
                1 << 20,
                u64::MAX >> 1,
                " bytes",
            ),
            tasks_max: bounded(Field::TasksMax, draft.tasks_max, 1, 4_194_304, ""),
            cpu_weight: bounded(Field::CpuWeight, draft.cpu_weight, 1, 10_000, ""),
            nofile: bounded(Field::Nofile, draft.nofile, 8, 1 << 30, ""),
            core: bounded(Field::Core, draft.core, 0, u64::MAX >> 1, " bytes"),
        }
    }

    pub(super) fn sandbox(&mut self, draft: SandboxDraft) -> Sandbox {
        let mut paths = |field: fn(usize) -> Field, list: Vec<String>| -> Vec<PathBuf> {
            let mut out: Vec<PathBuf> = Vec::new();
            for (i, path) in list.into_iter().enumerate() {
                let path = PathBuf::from(path);
                self.absolute_path(field(i), &path);
                if out.contains(&path) {
                    let key = field(i).key();
                    self.fail(
                        field(i),
                        format!("`{key}`: \"{}\" is given twice", path.display()),
                    );
                }
                out.push(path);
            }
            out
        };
        let read_only = paths(Field::ReadOnlyPaths, draft.read_only_paths);
        let read_write = paths(Field::ReadWritePaths, draft.read_write_paths);
        let network = match draft.network.as_deref() {
            None => Network::default(),
            Some(value) => match Network::ALL.into_iter().find(|n| n.as_str() == value) {
                Some(network) => network,
                None => {
                    self.fail(
                        Field::Network,
                        format!("`sandbox.network`: \"{value}\" is not a network mode"),
                    )
                    .help = Some("write \"none\", \"loopback\" or \"host\"".into());
                    Network::default()
                }
            },
        };
        Sandbox {
            read_only,
            read_write,
            network,
        }
    }

    /// `start` and `idle-stop`: an `idle-stop` only with `start
    /// "on-demand"`.
    pub(super) fn activation(
        &mut self,
        start: Option<&str>,
        idle_stop: Option<Duration>,
        per_host: bool,
    ) -> Activation {
        let on_demand = match start {
            // A per-host unit runs no instance without a host (DESIGN
            // §13): on demand unless it says `start "always"`.
            None if per_host => true,
            None | Some("always") => false,
            Some("on-demand") => true,
            Some(other) => {
                self.fail(
                    Field::Start,
                    format!("`start`: \"{other}\" is not a start mode"),
                )
                .help = Some("write \"always\" or \"on-demand\"".into());
                self.duration(Field::IdleStop, idle_stop, DEFAULT_IDLE_STOP);
                return Activation::Always;
            }
        };
        if !on_demand {
            if idle_stop.is_some() {
                let e = self.fail(
                    Field::IdleStop,
                    "`idle-stop` applies to an on-demand unit, but this one starts \"always\"",
                );
                e.related = start.is_some().then_some(Field::Start);
                e.help = Some("add `start \"on-demand\"`, or remove `idle-stop`".into());
            }
            return Activation::Always;
        }
        Activation::OnDemand {
            idle_stop: self.duration(Field::IdleStop, idle_stop, DEFAULT_IDLE_STOP),
        }
    }

    /// `sessions` and `max-instances`: a `max-instances` only with
    /// `sessions "per-host"`.
    pub(super) fn sessions(&mut self, word: Option<&str>, max: Option<i128>) -> Sessions {
        let per_host = match word {
            None | Some("shared") => false,
            Some("per-host") => true,
            Some(other) => {
                self.fail(
                    Field::Sessions,
                    format!("`sessions`: \"{other}\" is not a sessions mode"),
                )
                .help = Some("write \"shared\" or \"per-host\"".into());
                return Sessions::Shared;
            }
        };
        let max_instances = match max {
            None => DEFAULT_MAX_INSTANCES,
            Some(n) => match u32::try_from(n) {
                Ok(n) if (1..=MAX_INSTANCES).contains(&n) => n,
                _ => {
                    self.fail(
                        Field::MaxInstances,
                        format!("`max-instances` must be between 1 and {MAX_INSTANCES}, got {n}"),
                    );
                    DEFAULT_MAX_INSTANCES
                }
            },
        };
        if !per_host {
            if max.is_some() {
                let e = self.fail(
                    Field::MaxInstances,
                    "`max-instances` applies to a per-host unit, but this one's sessions are \"shared\"",
                );
                e.related = word.is_some().then_some(Field::Sessions);
                e.help = Some("add `sessions \"per-host\"`, or remove `max-instances`".into());
            }
            return Sessions::Shared;
        }
        Sessions::PerHost { max_instances }
    }

    pub(super) fn rate_limit(
        &mut self,
        value: Option<Option<(i128, Duration)>>,
    ) -> Option<RateLimit> {
        let (lines, interval) = match value {
            None => return Some(DEFAULT_LOG_RATE_LIMIT),
            Some(None) => return None,
            Some(Some(limit)) => limit,
        };
        let interval = self.duration(Field::LogRateLimit, Some(interval), interval);
        match u32::try_from(lines) {
            Ok(lines) if (1..=MAX_LOG_RATE_LINES).contains(&lines) => {
                Some(RateLimit { lines, interval })
            }
            _ => {
                self.fail(
                    Field::LogRateLimit,
                    format!(
                        "`log-rate-limit` must allow between 1 and {MAX_LOG_RATE_LINES} lines, got {lines}"
                    ),
                )
                .help = Some("to log every line, write `log-rate-limit #false`".into());
                Some(DEFAULT_LOG_RATE_LIMIT)
            }
        }
    }

    pub(super) fn no_nul(&mut self, field: Field, value: &str) {
        if value.contains('\0') {
            self.fail(
                field.clone(),
                format!("`{}` contains a NUL byte", field.key()),
            );
        }
    }

    pub(super) fn absolute_path(&mut self, field: Field, path: &Path) {
        let shown = path.display();
        if path.as_os_str().is_empty() {
            self.fail(field.clone(), format!("`{}` is empty", field.key()));
        } else if !path.is_absolute() {
            self.fail(
                field.clone(),
                format!(
                    "`{}` must be an absolute path, got \"{shown}\"",
                    field.key()
                ),
            );
        } else {
            self.no_nul(field, &path.to_string_lossy());
        }
    }

    pub(super) fn env_name(&mut self, field: Field, name: &str) {
        if SERVICE_MANAGER_ENV.contains(&name) {
            self.fail(
                field.clone(),
                format!(
                    "`{}`: {name} belongs to the daemon's service manager and is never given to a server",
                    field.key()
                ),
            );
        } else if !is_env_name(name) {
            self.fail(
                field.clone(),
                format!(
                    "`{}`: \"{name}\" is not a valid environment variable name",
                    field.key()
                ),
            )
            .help = Some("names are letters, digits and `_`, not starting with a digit".into());
        }
    }

    /// `roots`: absolute `file://` URIs (as MCP requires of roots), each
    /// once; returned normalized.
    pub(super) fn roots(&mut self, roots: Vec<String>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (i, root) in roots.into_iter().enumerate() {
            let field = Field::Roots(i);
            match url::Url::parse(&root) {
                Ok(url) if url.scheme() == "file" && url.host_str().is_none_or(str::is_empty) => {
                    let normal = url.to_string();
                    if out.contains(&normal) {
                        self.fail(field, format!("`roots`: \"{root}\" is given twice"));
                    } else {
                        out.push(normal);
                    }
                }
                Ok(url) if url.scheme() == "file" => {
                    self.fail(
                        field,
                        format!("`roots`: \"{root}\" names a host; roots are local paths"),
                    )
                    .help = Some("write \"file:///path/to/dir\"".into());
                }
                _ => {
                    self.fail(field, format!("`roots`: \"{root}\" is not a file:// URI"))
                        .help =
                        Some("MCP roots are file:// URIs: write \"file:///srv/repo\"".into());
                }
            }
        }
        out
    }

    /// `group`: names written as unit names are (DESIGN §14), each once;
    /// `all` is every unit already, so it names no group.
    pub(super) fn groups(&mut self, groups: Vec<String>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (i, group) in groups.into_iter().enumerate() {
            let field = Field::Group(i);
            if let Err(e) = crate::unit::name::UnitName::new(&group) {
                self.fail(field, format!("`group`: {e}")).help =
                    Some("a group is named as a unit is: letters, digits, `-` and `_`".into());
            } else if group == "all" {
                self.fail(
                    field,
                    "`group`: \"all\" is every unit (`@all`), not a group",
                )
                .help = Some("choose another name".into());
            } else if !out.contains(&group) {
                out.push(group);
            }
        }
        out
    }

    /// Tool-name globs (`*`, `?`): not empty, no whitespace or control
    /// characters.
    pub(super) fn globs(&mut self, field: fn(usize) -> Field, globs: Vec<String>) -> Vec<String> {
        for (i, glob) in globs.iter().enumerate() {
            if glob.is_empty() {
                self.fail(
                    field(i),
                    format!("`{}`: a pattern is empty", field(i).key()),
                )
                .help = Some("write a tool name or a glob such as \"read_*\"".into());
            } else if glob.chars().any(|c| c.is_whitespace() || c.is_control()) {
                self.fail(
                    field(i),
                    format!(
                        "`{}`: \"{}\" contains whitespace or a control character; tool names do not",
                        field(i).key(),
                        glob.escape_debug()
                    ),
                );
            }
        }
        globs
    }

    /// `credentials { … }`: names, absolute paths, globs, variables.
    pub(super) fn credentials(&mut self, draft: CredentialsDraft) -> CredentialsSpec {
        let mut sources: Vec<Credential> = Vec::new();
        let lines = draft
            .load
            .into_iter()
            .enumerate()
            .map(|(i, line)| (Field::CredentialLoad(i), line, false))
            .chain(
                draft
                    .load_encrypted
                    .into_iter()
                    .enumerate()
                    .map(|(i, line)| (Field::CredentialEncrypted(i), line, true)),
            );
        for (field, (name, path), encrypted) in lines {
            if !is_credential_name(&name) {
                self.fail(
                    field.clone(),
                    format!(
                        "`{}`: \"{}\" is not a credential name (a file name: no `/`, not `.` or `..`, at most 255 bytes)",
                        field.key(),
                        name.escape_debug()
                    ),
                );
            } else if sources.iter().any(|c| c.name == name) {
                self.fail(
                    field.clone(),
                    format!(
                        "`{}`: credential \"{name}\" is already loaded by another line",
                        field.key()
                    ),
                );
            }
            self.no_nul(field.clone(), &path);
            let path = PathBuf::from(path);
            self.absolute_path(field, &path);
            sources.push(Credential {
                name,
                path,
                encrypted,
            });
        }
        for (i, glob) in draft.import.iter().enumerate() {
            let field = Field::CredentialImport(i);
            if glob.is_empty() || glob.contains('/') || glob.chars().any(char::is_control) {
                self.fail(
                    field,
                    format!(
                        "`credentials.import`: \"{}\" is not a pattern of credential names",
                        glob.escape_debug()
                    ),
                )
                .help = Some("write a name or a glob such as \"github.*\"".into());
            }
        }
        let spec = CredentialsSpec {
            sources,
            import: draft.import,
            env: Vec::new(),
        };
        let mut env = Vec::with_capacity(draft.env.len());
        for (i, (var, name)) in draft.env.into_iter().enumerate() {
            let field = Field::CredentialEnv(i);
            self.env_name(field.clone(), &var);
            if var == CREDENTIALS_DIRECTORY {
                self.fail(
                    field.clone(),
                    format!("`credentials.env`: {CREDENTIALS_DIRECTORY} is set by mcpd itself"),
                );
            } else if env.iter().any(|(v, _): &(String, String)| *v == var) {
                self.fail(
                    field.clone(),
                    format!("`credentials.env`: {var} is given twice"),
                );
            }
            if !spec.names(&name) {
                self.fail(
                    field,
                    format!(
                        "`credentials.env`: {var} names credential \"{}\", which no `load`, `load-encrypted` or `import` line gives",
                        name.escape_debug()
                    ),
                );
            }
            env.push((var, name));
        }
        CredentialsSpec { env, ..spec }
    }

    /// Cross-field rules of credentials and the transport: `env` only for
    /// a process, not beside the same `stdio.env`; a header's credential
    /// is one the unit gives.
    pub(super) fn credential_uses(
        &mut self,
        credentials: &CredentialsSpec,
        transport: Option<&Transport>,
    ) {
        match transport {
            Some(Transport::Stdio(stdio)) => {
                for (i, (var, _)) in credentials.env.iter().enumerate() {
                    if stdio.env.contains_key(var) {
                        self.fail(
                            Field::CredentialEnv(i),
                            format!("`credentials.env`: {var} is also set by `stdio.env`"),
                        )
                        .related = Some(Field::Env(var.clone()));
                    }
                }
                if stdio.env.contains_key(CREDENTIALS_DIRECTORY) {
                    self.fail(
                        Field::Env(CREDENTIALS_DIRECTORY.into()),
                        format!("`stdio.env`: {CREDENTIALS_DIRECTORY} is set by mcpd itself"),
                    );
                }
            }
            Some(Transport::Http(http)) => {
                if !credentials.env.is_empty() {
                    self.fail(
                        Field::CredentialEnv(0),
                        "`credentials.env` sets a variable of a server's process; an `http` unit has none",
                    )
                    .help = Some("use `header \"NAME\" credential=\"…\"`".into());
                }
                for (i, (header, value)) in http.headers.iter().enumerate() {
                    if let HeaderValue::Credential { name, .. } = value
                        && !credentials.names(name)
                    {
                        self.fail(
                            Field::Header(i),
                            format!(
                                "`http.header`: \"{header}\" takes credential \"{}\", which no `credentials` line gives",
                                name.escape_debug()
                            ),
                        )
                        .help = Some(format!(
                            "add `credentials {{ load \"{}\" \"/path/to/file\" }}`",
                            name.escape_debug()
                        ));
                    }
                }
            }
            None => {}
        }
    }

    pub(super) fn finish<T>(self, value: T) -> Result<T, Vec<SpecError>> {
        if self.errors.is_empty() {
            Ok(value)
        } else {
            Err(self.errors)
        }
    }
}
