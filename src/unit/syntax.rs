//! The syntax layer: one parsed KDL file → a [`Layer`] of located values.
//!
//! This layer checks shape and types only (known keys, argument counts, value
//! types, duration syntax, duplicates within a file); bounds and cross-field
//! rules belong to [`UnitSpec::new`](super::spec::UnitSpec::new). Layers from a
//! unit file and its drop-ins are merged in order, then turned into a
//! [`UnitDraft`] plus a map from each [`Field`] to where it was written, so
//! spec errors can point back into the right file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use kdl::{KdlDocument, KdlEntry, KdlNode, KdlValue};
use miette::SourceSpan;

use super::spec::{Field, HttpDraft, ReconnectDraft, StdioDraft, UnitDraft};

/// Where something was written: file index (into the unit's file list) and span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub file: usize,
    pub span: SourceSpan,
}

/// A value and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At<T> {
    pub value: T,
    pub loc: Loc,
}

/// A syntax-level problem, located but not yet rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    pub loc: Loc,
    pub message: String,
    pub label: String,
    pub help: Option<String>,
    /// A second place in the same file, with its label.
    pub related: Option<(SourceSpan, String)>,
}

/// What one file says.
#[derive(Debug, Clone, Default)]
pub struct Layer {
    description: Option<At<String>>,
    stdio: Option<StdioLayer>,
    http: Option<HttpLayer>,
    reconnect: ReconnectLayer,
    startup_timeout: Option<At<Duration>>,
    stop_timeout: Option<At<Duration>>,
    /// Fields whose value was rejected here; spec errors about them would
    /// only repeat the problem (e.g. "needs a command" after a bad command).
    poisoned: HashSet<Field>,
}

#[derive(Debug, Clone)]
struct StdioLayer {
    loc: Loc,
    command: Option<At<Vec<String>>>,
    working_directory: Option<At<PathBuf>>,
    env: BTreeMap<String, At<String>>,
    env_files: Vec<At<PathBuf>>,
    pass_env: Vec<At<String>>,
    user: Option<At<String>>,
}

#[derive(Debug, Clone)]
struct HttpLayer {
    loc: Loc,
    url: Option<At<String>>,
    headers: Vec<At<(String, String)>>,
}

#[derive(Debug, Clone, Default)]
struct ReconnectLayer {
    enabled: Option<At<bool>>,
    initial_delay: Option<At<Duration>>,
    max_delay: Option<At<Duration>>,
    max_attempts: Option<At<i128>>,
}

pub const TOP_KEYS: &[&str] = &[
    "description",
    "stdio",
    "http",
    "reconnect",
    "startup-timeout",
    "stop-timeout",
];
pub const STDIO_KEYS: &[&str] = &[
    "command",
    "working-directory",
    "env",
    "env-file",
    "pass-env",
    "user",
];
pub const HTTP_KEYS: &[&str] = &["header"];
pub const RECONNECT_KEYS: &[&str] = &["enabled", "initial-delay", "max-delay", "max-attempts"];
const DURATION_HELP: &str = "write a duration such as \"500ms\", \"30s\" or \"1m30s\"";

/// The closest known key to `unknown`, if any is close enough to be a typo.
pub fn did_you_mean<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(unknown, k), *k))
        .filter(|(d, k)| *d <= (k.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// A value as the user wrote it, for "found …" messages.
fn describe(value: &KdlValue) -> String {
    match value {
        KdlValue::String(s) => format!("string \"{s}\""),
        KdlValue::Integer(i) => format!("integer {i}"),
        KdlValue::Float(f) => format!("number {f}"),
        KdlValue::Bool(b) => format!("#{b}"),
        KdlValue::Null => "#null".into(),
    }
}

/// Reads one file's document, collecting issues.
struct Reader<'a> {
    file: usize,
    issues: &'a mut Vec<Issue>,
    poisoned: HashSet<Field>,
}

impl Reader<'_> {
    fn loc(&self, span: SourceSpan) -> Loc {
        Loc {
            file: self.file,
            span,
        }
    }

    fn issue(&mut self, span: SourceSpan, message: String, label: &str, help: Option<String>) {
        self.issues.push(Issue {
            loc: self.loc(span),
            message,
            label: label.into(),
            help,
            related: None,
        });
    }

    /// Reports a bad value for `field` and remembers not to judge it again.
    fn bad(
        &mut self,
        field: Field,
        span: SourceSpan,
        message: String,
        label: &str,
        help: Option<String>,
    ) {
        self.poisoned.insert(field);
        self.issue(span, message, label, help);
    }

    /// Rejects type annotations, which no key uses.
    fn annotations(&mut self, node: &KdlNode, key: &str) {
        if let Some(ty) = node.ty() {
            self.issue(
                ty.span(),
                format!("`{key}`: type annotations are not used in unit files"),
                "remove this annotation",
                None,
            );
        }
        for entry in node.entries() {
            if let Some(ty) = entry.ty() {
                self.issue(
                    ty.span(),
                    format!("`{key}`: type annotations are not used in unit files"),
                    "remove this annotation",
                    None,
                );
            }
        }
    }

    /// Unknown key, with a suggestion from this block or a hint that the key
    /// belongs in another block.
    fn unknown(&mut self, node: &KdlNode, block: Option<&str>, known: &[&str]) {
        let name = node.name().value();
        let here = match block {
            Some(b) => format!("in `{b}`"),
            None => "at the top level".into(),
        };
        let help = if let Some(close) = did_you_mean(name, known) {
            if close == "command" {
                // "needs a command" would only repeat this typo.
                self.poisoned.insert(Field::Command);
            }
            Some(format!("did you mean `{close}`?"))
        } else if let Some((home, _)) = [
            ("stdio", STDIO_KEYS),
            ("http", HTTP_KEYS),
            ("reconnect", RECONNECT_KEYS),
            ("the top level", TOP_KEYS),
        ]
        .iter()
        .find(|(_, keys)| keys.contains(&name))
        {
            if matches!(*home, "stdio" | "http") {
                // "no transport" would only repeat this misplacement.
                self.poisoned.insert(Field::Unit);
            }
            Some(format!("`{name}` belongs in {}", home_block(home)))
        } else {
            Some(format!(
                "known keys {here}: {}",
                known
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        };
        self.issue(
            node.name().span(),
            format!("unknown key `{name}` {here}"),
            "unknown key",
            help,
        );
    }

    /// Reports a key given twice in one block of one file.
    fn duplicate(
        &mut self,
        seen: &mut HashMap<String, SourceSpan>,
        node: &KdlNode,
        key: &str,
    ) -> bool {
        let span = node.name().span();
        if let Some(first) = seen.get(node.name().value()) {
            self.issues.push(Issue {
                loc: self.loc(span),
                message: format!("duplicate key `{key}`"),
                label: "set again here".into(),
                help: Some("a key may be set once per file; drop-ins override it".into()),
                related: Some((*first, "first set here".into())),
            });
            return true;
        }
        seen.insert(node.name().value().to_owned(), span);
        false
    }

    fn no_children(&mut self, node: &KdlNode, key: &str) {
        if let Some(children) = node.children() {
            self.issue(
                children.span(),
                format!("`{key}` takes no block"),
                "unexpected block",
                None,
            );
        }
    }

    fn no_properties(&mut self, node: &KdlNode, key: &str) {
        for entry in node.entries().iter().filter(|e| e.name().is_some()) {
            let prop = entry.name().map(|n| n.value()).unwrap_or_default();
            self.issue(
                entry.span(),
                format!("`{key}` takes no property `{prop}`"),
                "unexpected property",
                None,
            );
        }
    }

    fn no_arguments(&mut self, node: &KdlNode, key: &str) {
        for entry in node.entries().iter().filter(|e| e.name().is_none()) {
            self.issue(
                entry.span(),
                format!(
                    "`{key}` takes no arguments, found {}",
                    describe(entry.value())
                ),
                "unexpected argument",
                Some(format!(
                    "write `{key} {{ … }}` with its settings inside the block"
                )),
            );
        }
    }

    /// Exactly one positional argument, no properties, no block.
    fn single<'n>(
        &mut self,
        node: &'n KdlNode,
        key: &str,
        field: &Field,
        example: &str,
    ) -> Option<&'n KdlEntry> {
        self.no_children(node, key);
        self.no_properties(node, key);
        let args: Vec<&KdlEntry> = node
            .entries()
            .iter()
            .filter(|e| e.name().is_none())
            .collect();
        match args.as_slice() {
            [one] => Some(*one),
            [] => {
                self.bad(
                    field.clone(),
                    node.name().span(),
                    format!("`{key}` needs a value"),
                    "no value",
                    Some(format!("write `{} {example}`", leaf(key))),
                );
                None
            }
            [_, extra @ ..] => {
                for e in extra {
                    self.bad(
                        field.clone(),
                        e.span(),
                        format!(
                            "`{key}` takes one value, found another: {}",
                            describe(e.value())
                        ),
                        "extra value",
                        None,
                    );
                }
                None
            }
        }
    }

    fn string(&mut self, entry: &KdlEntry, key: &str, field: &Field) -> Option<At<String>> {
        match entry.value() {
            KdlValue::String(s) => Some(At {
                value: s.clone(),
                loc: self.loc(entry.span()),
            }),
            other => {
                let help = match other {
                    KdlValue::Integer(i) => Some(format!("quote it: \"{i}\"")),
                    _ => None,
                };
                self.bad(
                    field.clone(),
                    entry.span(),
                    format!("`{key}`: expected a string, found {}", describe(other)),
                    "expected a string",
                    help,
                );
                None
            }
        }
    }

    fn single_string(
        &mut self,
        node: &KdlNode,
        key: &str,
        field: Field,
        example: &str,
    ) -> Option<At<String>> {
        let entry = self.single(node, key, &field, example)?;
        self.string(entry, key, &field)
    }

    fn duration(&mut self, node: &KdlNode, key: &str, field: Field) -> Option<At<Duration>> {
        let entry = self.single(node, key, &field, "\"30s\"")?;
        let text = match entry.value() {
            KdlValue::String(s) => s,
            other => {
                let help = match other {
                    KdlValue::Integer(i) => {
                        format!("durations need a unit: write \"{i}ms\" or \"{i}s\"")
                    }
                    _ => DURATION_HELP.into(),
                };
                self.bad(
                    field,
                    entry.span(),
                    format!(
                        "`{key}`: expected a duration string, found {}",
                        describe(other)
                    ),
                    "expected a duration",
                    Some(help),
                );
                return None;
            }
        };
        match humantime::parse_duration(text) {
            Ok(value) => Some(At {
                value,
                loc: self.loc(entry.span()),
            }),
            Err(e) => {
                self.bad(
                    field,
                    entry.span(),
                    format!("`{key}`: \"{text}\" is not a duration: {e}"),
                    "not a duration",
                    Some(DURATION_HELP.into()),
                );
                None
            }
        }
    }

    fn bool(&mut self, node: &KdlNode, key: &str, field: Field) -> Option<At<bool>> {
        let entry = self.single(node, key, &field, "#true")?;
        match entry.value() {
            KdlValue::Bool(b) => Some(At {
                value: *b,
                loc: self.loc(entry.span()),
            }),
            other => {
                let help = match other {
                    KdlValue::String(s)
                        if matches!(s.as_str(), "true" | "false" | "yes" | "no" | "on" | "off") =>
                    {
                        "KDL 2 booleans are `#true` and `#false`, without quotes"
                    }
                    _ => "write `#true` or `#false`",
                };
                self.bad(
                    field,
                    entry.span(),
                    format!(
                        "`{key}`: expected #true or #false, found {}",
                        describe(other)
                    ),
                    "expected a boolean",
                    Some(help.into()),
                );
                None
            }
        }
    }

    fn integer(&mut self, node: &KdlNode, key: &str, field: Field) -> Option<At<i128>> {
        let entry = self.single(node, key, &field, "10")?;
        match entry.value() {
            KdlValue::Integer(i) => Some(At {
                value: *i,
                loc: self.loc(entry.span()),
            }),
            other => {
                self.bad(
                    field,
                    entry.span(),
                    format!("`{key}`: expected an integer, found {}", describe(other)),
                    "expected an integer",
                    None,
                );
                None
            }
        }
    }

    /// One or more string arguments, no properties, no block.
    fn strings(
        &mut self,
        node: &KdlNode,
        key: &str,
        field: Field,
        example: &str,
    ) -> Option<Vec<At<String>>> {
        self.no_children(node, key);
        self.no_properties(node, key);
        let mut out = Vec::new();
        let mut ok = true;
        for entry in node.entries().iter().filter(|e| e.name().is_none()) {
            match self.string(entry, key, &field) {
                Some(s) => out.push(s),
                None => ok = false,
            }
        }
        if out.is_empty() && ok {
            self.bad(
                field,
                node.name().span(),
                format!("`{key}` needs at least one value"),
                "no value",
                Some(format!("write `{} {example}`", leaf(key))),
            );
            return None;
        }
        ok.then_some(out)
    }

    fn document(&mut self, doc: &KdlDocument) -> Layer {
        let mut layer = Layer::default();
        let mut seen = HashMap::new();
        for node in doc.nodes() {
            let key = node.name().value();
            if !TOP_KEYS.contains(&key) {
                self.unknown(node, None, TOP_KEYS);
                continue;
            }
            if self.duplicate(&mut seen, node, key) {
                continue;
            }
            self.annotations(node, key);
            match key {
                "description" => {
                    layer.description = self.single_string(
                        node,
                        key,
                        Field::Description,
                        "\"What this server does\"",
                    );
                }
                "stdio" => layer.stdio = Some(self.stdio(node)),
                "http" => layer.http = Some(self.http(node)),
                "reconnect" => layer.reconnect = self.reconnect(node),
                "startup-timeout" => {
                    layer.startup_timeout = self.duration(node, key, Field::StartupTimeout);
                }
                "stop-timeout" => layer.stop_timeout = self.duration(node, key, Field::StopTimeout),
                _ => {}
            }
        }
        layer.poisoned = std::mem::take(&mut self.poisoned);
        layer
    }

    /// The child nodes of a block, or an issue if it has none.
    fn block<'n>(&mut self, node: &'n KdlNode, key: &str, needs: bool) -> &'n [KdlNode] {
        match node.children() {
            Some(doc) => doc.nodes(),
            None => {
                // `reconnect #false` already got "takes no arguments".
                if needs && node.entries().is_empty() {
                    self.issue(
                        node.name().span(),
                        format!("`{key}` needs a block of settings"),
                        "no block",
                        Some(format!("write `{key} {{ … }}`")),
                    );
                }
                &[]
            }
        }
    }

    fn stdio(&mut self, node: &KdlNode) -> StdioLayer {
        self.no_arguments(node, "stdio");
        self.no_properties(node, "stdio");
        let mut out = StdioLayer {
            loc: self.loc(node.name().span()),
            command: None,
            working_directory: None,
            env: BTreeMap::new(),
            env_files: Vec::new(),
            pass_env: Vec::new(),
            user: None,
        };
        if node.children().is_none() {
            // "needs a command" from the spec says what is missing.
            return out;
        }
        let mut seen = HashMap::new();
        for child in self.block(node, "stdio", true) {
            let key = child.name().value();
            if !STDIO_KEYS.contains(&key) {
                self.unknown(child, Some("stdio"), STDIO_KEYS);
                continue;
            }
            let repeatable = matches!(key, "env" | "env-file" | "pass-env");
            if !repeatable && self.duplicate(&mut seen, child, key) {
                continue;
            }
            self.annotations(child, key);
            let full = format!("stdio.{key}");
            match key {
                "command" => {
                    out.command = self
                        .strings(
                            child,
                            &full,
                            Field::Command,
                            "\"/usr/bin/server\" \"--flag\"",
                        )
                        .and_then(|parts| {
                            let loc = parts.first()?.loc;
                            Some(At {
                                value: parts.into_iter().map(|p| p.value).collect(),
                                loc,
                            })
                        });
                }
                "working-directory" => {
                    out.working_directory = self
                        .single_string(child, &full, Field::WorkingDirectory, "\"/var/lib/server\"")
                        .map(|s| At {
                            value: PathBuf::from(s.value),
                            loc: s.loc,
                        });
                }
                "env" => self.env(child, &mut out.env),
                "env-file" => {
                    let field = Field::EnvFile(out.env_files.len());
                    if let Some(s) =
                        self.single_string(child, &full, field, "\"/etc/mcpd/server.env\"")
                    {
                        out.env_files.push(At {
                            value: PathBuf::from(s.value),
                            loc: s.loc,
                        });
                    }
                }
                "pass-env" => {
                    let field = Field::PassEnv(out.pass_env.len());
                    if let Some(names) = self.strings(child, &full, field, "\"HTTPS_PROXY\"") {
                        out.pass_env.extend(names);
                    }
                }
                "user" => {
                    out.user = self.single_string(child, &full, Field::User, "\"mcp-server\"")
                }
                _ => {}
            }
        }
        out
    }

    fn env(&mut self, node: &KdlNode, env: &mut BTreeMap<String, At<String>>) {
        self.no_children(node, "stdio.env");
        let mut any = false;
        for entry in node.entries() {
            let Some(name) = entry.name() else {
                self.issue(
                    entry.span(),
                    format!(
                        "`stdio.env` takes NAME=\"value\" properties, found {}",
                        describe(entry.value())
                    ),
                    "expected NAME=\"value\"",
                    Some("write `env GITHUB_HOST=\"github.com\"`".into()),
                );
                continue;
            };
            any = true;
            let name = name.value().to_owned();
            let field = Field::Env(name.clone());
            let Some(value) = self.string(entry, &format!("stdio.env {name}"), &field) else {
                continue;
            };
            if let Some(first) = env.get(&name)
                && first.loc.file == self.file
            {
                self.issues.push(Issue {
                    loc: value.loc,
                    message: format!("duplicate environment variable `{name}`"),
                    label: "set again here".into(),
                    help: None,
                    related: Some((first.loc.span, "first set here".into())),
                });
                continue;
            }
            env.insert(name, value);
        }
        if !any && node.entries().is_empty() {
            self.issue(
                node.name().span(),
                "`stdio.env` needs at least one NAME=\"value\"".into(),
                "no value",
                Some("write `env GITHUB_HOST=\"github.com\"`".into()),
            );
        }
    }

    fn http(&mut self, node: &KdlNode) -> HttpLayer {
        self.no_properties(node, "http");
        let args: Vec<&KdlEntry> = node
            .entries()
            .iter()
            .filter(|e| e.name().is_none())
            .collect();
        let url = match args.as_slice() {
            [] => None,
            [one, rest @ ..] => {
                for e in rest {
                    self.bad(
                        Field::Url,
                        e.span(),
                        format!(
                            "`http` takes one URL, found another: {}",
                            describe(e.value())
                        ),
                        "extra value",
                        None,
                    );
                }
                self.string(one, "http", &Field::Url)
            }
        };
        let mut out = HttpLayer {
            loc: self.loc(node.name().span()),
            url,
            headers: Vec::new(),
        };
        for child in self.block(node, "http", false) {
            let key = child.name().value();
            if !HTTP_KEYS.contains(&key) {
                self.unknown(child, Some("http"), HTTP_KEYS);
                continue;
            }
            self.annotations(child, key);
            let field = Field::Header(out.headers.len());
            self.no_children(child, "http.header");
            self.no_properties(child, "http.header");
            let args: Vec<&KdlEntry> = child
                .entries()
                .iter()
                .filter(|e| e.name().is_none())
                .collect();
            let [name, value] = args.as_slice() else {
                self.bad(
                    field,
                    child.name().span(),
                    format!(
                        "`http.header` takes a name and a value, found {} value(s)",
                        args.len()
                    ),
                    "expected NAME VALUE",
                    Some("write `header \"Authorization\" \"Bearer …\"`".into()),
                );
                continue;
            };
            let name = self.string(name, "http.header", &field);
            // Never echo a header value: it is usually a credential.
            let value = match value.value() {
                KdlValue::String(s) => Some(s.clone()),
                other => {
                    self.bad(
                        field,
                        value.span(),
                        format!(
                            "`http.header`: expected a string value, found a {}",
                            kind(other)
                        ),
                        "expected a string",
                        None,
                    );
                    None
                }
            };
            if let (Some(name), Some(value)) = (name, value) {
                out.headers.push(At {
                    value: (name.value, value),
                    loc: name.loc,
                });
            }
        }
        out
    }

    fn reconnect(&mut self, node: &KdlNode) -> ReconnectLayer {
        self.no_arguments(node, "reconnect");
        self.no_properties(node, "reconnect");
        let mut out = ReconnectLayer::default();
        let mut seen = HashMap::new();
        for child in self.block(node, "reconnect", true) {
            let key = child.name().value();
            if !RECONNECT_KEYS.contains(&key) {
                self.unknown(child, Some("reconnect"), RECONNECT_KEYS);
                continue;
            }
            if self.duplicate(&mut seen, child, key) {
                continue;
            }
            self.annotations(child, key);
            let full = format!("reconnect.{key}");
            match key {
                "enabled" => out.enabled = self.bool(child, &full, Field::ReconnectEnabled),
                "initial-delay" => {
                    out.initial_delay = self.duration(child, &full, Field::InitialDelay)
                }
                "max-delay" => out.max_delay = self.duration(child, &full, Field::MaxDelay),
                "max-attempts" => out.max_attempts = self.integer(child, &full, Field::MaxAttempts),
                _ => {}
            }
        }
        out
    }
}

/// `reconnect.max-attempts` → `max-attempts`, as written in the file.
fn leaf(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

fn home_block(home: &str) -> String {
    if home == "the top level" {
        home.into()
    } else {
        format!("the `{home}` block")
    }
}

fn kind(value: &KdlValue) -> &'static str {
    match value {
        KdlValue::String(_) => "string",
        KdlValue::Integer(_) => "integer",
        KdlValue::Float(_) => "number",
        KdlValue::Bool(_) => "boolean",
        KdlValue::Null => "#null",
    }
}

/// Reads the document of file number `file`, adding its problems to `issues`.
pub fn read(doc: &KdlDocument, file: usize, issues: &mut Vec<Issue>) -> Layer {
    Reader {
        file,
        issues,
        poisoned: HashSet::new(),
    }
    .document(doc)
}

impl Layer {
    /// Applies a later layer (a drop-in) on top of this one: scalars are
    /// replaced, `env` and `header` entries replaced by name, lists extended.
    pub fn merge(&mut self, later: Layer) {
        fn over<T>(slot: &mut Option<T>, later: Option<T>) {
            if later.is_some() {
                *slot = later;
            }
        }
        over(&mut self.description, later.description);
        over(&mut self.startup_timeout, later.startup_timeout);
        over(&mut self.stop_timeout, later.stop_timeout);
        over(&mut self.reconnect.enabled, later.reconnect.enabled);
        over(
            &mut self.reconnect.initial_delay,
            later.reconnect.initial_delay,
        );
        over(&mut self.reconnect.max_delay, later.reconnect.max_delay);
        over(
            &mut self.reconnect.max_attempts,
            later.reconnect.max_attempts,
        );
        match (&mut self.stdio, later.stdio) {
            (Some(mine), Some(theirs)) => {
                over(&mut mine.command, theirs.command);
                over(&mut mine.working_directory, theirs.working_directory);
                over(&mut mine.user, theirs.user);
                mine.env.extend(theirs.env);
                mine.env_files.extend(theirs.env_files);
                for name in theirs.pass_env {
                    if !mine.pass_env.iter().any(|n| n.value == name.value) {
                        mine.pass_env.push(name);
                    }
                }
            }
            (slot @ None, theirs) => *slot = theirs,
            (Some(_), None) => {}
        }
        match (&mut self.http, later.http) {
            (Some(mine), Some(theirs)) => {
                over(&mut mine.url, theirs.url);
                for header in theirs.headers {
                    mine.headers
                        .retain(|h| !h.value.0.eq_ignore_ascii_case(&header.value.0));
                    mine.headers.push(header);
                }
            }
            (slot @ None, theirs) => *slot = theirs,
            (Some(_), None) => {}
        }
        self.poisoned.extend(later.poisoned);
    }

    /// The draft for [`UnitSpec::new`](super::spec::UnitSpec::new), where each
    /// field was written, and the fields already reported as bad.
    pub fn into_draft(self, unit: Loc) -> (UnitDraft, HashMap<Field, Loc>, HashSet<Field>) {
        let mut locs = HashMap::new();
        locs.insert(Field::Unit, unit);
        fn take<T>(locs: &mut HashMap<Field, Loc>, field: Field, at: Option<At<T>>) -> Option<T> {
            at.map(|at| {
                locs.insert(field, at.loc);
                at.value
            })
        }
        let description = take(&mut locs, Field::Description, self.description);
        let stdio = self.stdio.map(|s| {
            locs.insert(Field::Stdio, s.loc);
            // A missing command is reported at the `stdio` node.
            locs.insert(Field::Command, s.loc);
            StdioDraft {
                command: take(&mut locs, Field::Command, s.command).unwrap_or_default(),
                working_directory: take(&mut locs, Field::WorkingDirectory, s.working_directory),
                env: s
                    .env
                    .into_iter()
                    .map(|(k, v)| {
                        locs.insert(Field::Env(k.clone()), v.loc);
                        (k, v.value)
                    })
                    .collect(),
                env_files: s
                    .env_files
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| {
                        locs.insert(Field::EnvFile(i), p.loc);
                        p.value
                    })
                    .collect(),
                pass_env: s
                    .pass_env
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| {
                        locs.insert(Field::PassEnv(i), p.loc);
                        p.value
                    })
                    .collect(),
                user: take(&mut locs, Field::User, s.user),
            }
        });
        let http = self.http.map(|h| {
            locs.insert(Field::Http, h.loc);
            // A missing URL is reported at the `http` node.
            locs.insert(Field::Url, h.loc);
            HttpDraft {
                url: take(&mut locs, Field::Url, h.url).unwrap_or_default(),
                headers: h
                    .headers
                    .into_iter()
                    .enumerate()
                    .map(|(i, h)| {
                        locs.insert(Field::Header(i), h.loc);
                        h.value
                    })
                    .collect(),
            }
        });
        let r = self.reconnect;
        let reconnect = ReconnectDraft {
            enabled: take(&mut locs, Field::ReconnectEnabled, r.enabled),
            initial_delay: take(&mut locs, Field::InitialDelay, r.initial_delay),
            max_delay: take(&mut locs, Field::MaxDelay, r.max_delay),
            max_attempts: take(&mut locs, Field::MaxAttempts, r.max_attempts),
        };
        let draft = UnitDraft {
            description,
            stdio,
            http,
            reconnect,
            startup_timeout: take(&mut locs, Field::StartupTimeout, self.startup_timeout),
            stop_timeout: take(&mut locs, Field::StopTimeout, self.stop_timeout),
        };
        (draft, locs, self.poisoned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_are_for_typos_only() {
        assert_eq!(did_you_mean("comand", STDIO_KEYS), Some("command"));
        assert_eq!(
            did_you_mean("max-attempt", RECONNECT_KEYS),
            Some("max-attempts")
        );
        assert_eq!(did_you_mean("descripton", TOP_KEYS), Some("description"));
        assert_eq!(did_you_mean("banana", TOP_KEYS), None);
    }
}
