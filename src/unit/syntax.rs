//! The syntax layer: one parsed KDL file → a [`Layer`] of located values.
//!
//! This layer checks shape and types only (known keys, argument counts, value
//! types, duration syntax, duplicates within a file); bounds and cross-field
//! rules belong to [`UnitSpec::new`](super::spec::UnitSpec::new). What each
//! key is comes from the vocabulary table ([`super::keys`]): the reader
//! dispatches on it and layers merge by it. Layers from a unit file and its
//! drop-ins are merged in order, then turned into a [`UnitDraft`] plus a map
//! from each [`Field`] to where it was written, so spec errors can point back
//! into the right file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use kdl::{KdlDocument, KdlEntry, KdlNode, KdlValue};
use miette::SourceSpan;

use super::keys::{self, Block, Key, Kind, Merge};
use super::spec::{
    CredentialsDraft, Field, HeaderDraft, HealthDraft, HttpDraft, LimitsDraft, OAuthDraft,
    ReconnectDraft, SandboxDraft, StdioDraft, UnitDraft,
};

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

/// A value of a single-valued key, as its [`Kind`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    String(String),
    Path(PathBuf),
    Strings(Vec<String>),
    Duration(Duration),
    Bool(bool),
    Integer(i128),
    /// `log-rate-limit`: None for `#false`.
    RateLimit(Option<(i128, Duration)>),
    /// Bytes (not yet bounded).
    Size(i128),
}

/// What one file says, by key ([`keys::KEYS`]).
#[derive(Debug, Clone, Default)]
pub struct Layer {
    /// Keys merged with [`Merge::Replace`], by path.
    values: BTreeMap<String, At<Value>>,
    /// Keys merged with [`Merge::Append`] / [`Merge::AppendUnique`], by path.
    lists: BTreeMap<String, Vec<At<String>>>,
    /// `stdio.env`, by variable name.
    env: BTreeMap<String, At<String>>,
    /// `http.header`: name and value.
    headers: Vec<At<(String, HeaderDraft)>>,
    /// Keys of [`Kind::Pair`] (`credentials.load`, …), by path: a name and
    /// its value, replaced by name.
    pairs: BTreeMap<String, Vec<At<(String, String)>>>,
    /// The blocks this file opens (`stdio`, `http`, …), where first opened.
    blocks: BTreeMap<Block, Loc>,
    /// Fields whose value was rejected here; spec errors about them would
    /// only repeat the problem (e.g. "needs a command" after a bad command).
    poisoned: HashSet<Field>,
}

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
    fn unknown(&mut self, node: &KdlNode, block: Block) {
        let name = node.name().value();
        let here = block.here();
        let known = keys::names(block);
        let help = if let Some(close) = did_you_mean(name, &known) {
            if close == "command" {
                // "needs a command" would only repeat this typo.
                self.poisoned.insert(Field::Command);
            }
            Some(format!("did you mean `{close}`?"))
        } else if let Some(home) = [
            Block::Stdio,
            Block::Http,
            Block::Reconnect,
            Block::Sandbox,
            Block::Tools,
            Block::Credentials,
            Block::OAuth,
            Block::Top,
        ]
        .into_iter()
        .find(|b| keys::lookup(*b, name).is_some())
        {
            if matches!(home, Block::Stdio | Block::Http) {
                // "no transport" would only repeat this misplacement.
                self.poisoned.insert(Field::Unit);
            }
            Some(format!("`{name}` belongs in {}", home.home()))
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
        let args = arguments(node);
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

    /// A size: `1048576`, or `"512M"` (K, M, G, T: powers of 1024).
    fn size(&mut self, node: &KdlNode, key: &str, field: Field) -> Option<At<i128>> {
        let entry = self.single(node, key, &field, "\"512M\"")?;
        let loc = self.loc(entry.span());
        let parsed = match entry.value() {
            KdlValue::Integer(n) => Ok(*n),
            KdlValue::String(text) => {
                parse_size(text).ok_or_else(|| format!("\"{text}\" is not a size"))
            }
            other => Err(format!("expected a size, found {}", describe(other))),
        };
        match parsed {
            Ok(value) => Some(At { value, loc }),
            Err(e) => {
                self.bad(
                    field,
                    entry.span(),
                    format!("`{key}`: {e}"),
                    "not a size",
                    Some(
                        "write bytes, or a number with K, M, G or T (powers of 1024): \"512M\""
                            .into(),
                    ),
                );
                None
            }
        }
    }

    /// `KEY 10000 "30s"` or `KEY #false`.
    fn rate_limit(
        &mut self,
        node: &KdlNode,
        key: &str,
        field: Field,
    ) -> Option<At<Option<(i128, Duration)>>> {
        self.no_children(node, key);
        self.no_properties(node, key);
        let args = arguments(node);
        let help = format!("write `{key} 10000 \"30s\"` (lines per interval) or `{key} #false`");
        let loc = self.loc(node.name().span());
        match args.as_slice() {
            [one] if matches!(one.value(), KdlValue::Bool(false)) => {
                return Some(At { value: None, loc });
            }
            [lines, interval] => {
                if let (KdlValue::Integer(n), KdlValue::String(text)) =
                    (lines.value(), interval.value())
                {
                    return match humantime::parse_duration(text) {
                        Ok(d) => Some(At {
                            value: Some((*n, d)),
                            loc,
                        }),
                        Err(e) => {
                            self.bad(
                                field,
                                interval.span(),
                                format!("`{key}`: \"{text}\" is not a duration: {e}"),
                                "not a duration",
                                Some(DURATION_HELP.into()),
                            );
                            None
                        }
                    };
                }
            }
            _ => {}
        }
        let found = match args.as_slice() {
            [] => "nothing".to_owned(),
            args => args
                .iter()
                .map(|a| describe(a.value()))
                .collect::<Vec<_>>()
                .join(" and "),
        };
        self.bad(
            field,
            args.first().map_or(node.name().span(), |a| a.span()),
            format!("`{key}` takes a line count and a duration, or #false; found {found}"),
            "expected lines and a duration",
            Some(help),
        );
        None
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
        self.settings(doc.nodes(), Block::Top, &mut layer);
        layer.poisoned = std::mem::take(&mut self.poisoned);
        layer
    }

    /// Reads the settings of `block`: each node a key of the table.
    fn settings(&mut self, nodes: &[KdlNode], block: Block, layer: &mut Layer) {
        let mut seen = HashMap::new();
        for node in nodes {
            let name = node.name().value();
            let Some(key) = keys::lookup(block, name) else {
                self.unknown(node, block);
                continue;
            };
            if !key.repeatable() && self.duplicate(&mut seen, node, name) {
                continue;
            }
            self.annotations(node, name);
            self.key(key, node, layer);
        }
    }

    /// Reads one node of `key`, as its [`Kind`] says, into `layer`.
    fn key(&mut self, key: &'static Key, node: &KdlNode, layer: &mut Layer) {
        let path = key.path();
        let field = key.field.clone().unwrap_or(Field::Unit);
        let at = |value: Option<At<String>>, wrap: fn(String) -> Value| {
            value.map(|s| At {
                value: wrap(s.value),
                loc: s.loc,
            })
        };
        let value = match key.kind {
            Kind::Block { inner, required } => {
                self.no_arguments(node, &path);
                self.no_properties(node, &path);
                layer
                    .blocks
                    .entry(inner)
                    .or_insert(self.loc(node.name().span()));
                if node.children().is_none() && !required {
                    // The spec says what is missing ("needs a command").
                    return;
                }
                let children = self.block(node, &path, required);
                self.settings(children, inner, layer);
                return;
            }
            Kind::Endpoint { inner } => {
                self.endpoint(key, node, layer);
                let children = self.block(node, &path, false);
                self.settings(children, inner, layer);
                return;
            }
            Kind::Env => return self.env(node, &mut layer.env),
            Kind::Pair => {
                let pairs = layer.pairs.entry(path.clone()).or_default();
                let field = indexed(&field, pairs.len());
                return self.pair(node, &path, field, key.example, pairs);
            }
            Kind::Header => return self.header(node, &mut layer.headers),
            Kind::CredentialRef => at(self.credential_ref(node, &path, field), Value::String),
            Kind::String => at(
                self.single_string(node, &path, field, key.example),
                Value::String,
            ),
            Kind::Path if key.merge == Merge::Replace => {
                at(self.single_string(node, &path, field, key.example), |s| {
                    Value::Path(PathBuf::from(s))
                })
            }
            Kind::Path => {
                let list = layer.lists.entry(path.clone()).or_default();
                let field = indexed(&field, list.len());
                if let Some(s) = self.single_string(node, &path, field, key.example) {
                    list.push(s);
                }
                return;
            }
            Kind::Strings if key.merge == Merge::Replace => self
                .strings(node, &path, field, key.example)
                .and_then(|parts| {
                    let loc = parts.first()?.loc;
                    Some(At {
                        value: Value::Strings(parts.into_iter().map(|p| p.value).collect()),
                        loc,
                    })
                }),
            Kind::Strings => {
                let list = layer.lists.entry(path.clone()).or_default();
                let field = indexed(&field, list.len());
                if let Some(values) = self.strings(node, &path, field, key.example) {
                    list.extend(values);
                }
                return;
            }
            Kind::Duration => self.duration(node, &path, field).map(|d| At {
                value: Value::Duration(d.value),
                loc: d.loc,
            }),
            Kind::Bool => self.bool(node, &path, field).map(|b| At {
                value: Value::Bool(b.value),
                loc: b.loc,
            }),
            Kind::Integer => self.integer(node, &path, field).map(|i| At {
                value: Value::Integer(i.value),
                loc: i.loc,
            }),
            Kind::Size => self.size(node, &path, field).map(|r| At {
                value: Value::Size(r.value),
                loc: r.loc,
            }),
            Kind::RateLimit => self.rate_limit(node, &path, field).map(|r| At {
                value: Value::RateLimit(r.value),
                loc: r.loc,
            }),
        };
        if let Some(value) = value {
            layer.values.insert(path, value);
        }
    }

    /// The child nodes of `key { … }`, or an issue if it has none and
    /// `needs` one.
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

    /// `load "NAME" "PATH"`: two strings; a name given twice in one file is
    /// reported at the second.
    fn pair(
        &mut self,
        node: &KdlNode,
        key: &str,
        field: Field,
        example: &str,
        pairs: &mut Vec<At<(String, String)>>,
    ) {
        self.no_children(node, key);
        self.no_properties(node, key);
        let args = arguments(node);
        let [name, value] = args.as_slice() else {
            self.bad(
                field,
                node.name().span(),
                format!("`{key}` takes two values, found {}", args.len()),
                "expected two strings",
                Some(format!("write `{} {example}`", leaf(key))),
            );
            return;
        };
        let (Some(name), Some(value)) = (
            self.string(name, key, &field),
            self.string(value, key, &field),
        ) else {
            return;
        };
        if let Some(first) = pairs
            .iter()
            .find(|p| p.value.0 == name.value && p.loc.file == self.file)
        {
            self.issues.push(Issue {
                loc: name.loc,
                message: format!("`{key}`: \"{}\" is given twice", name.value),
                label: "given again here".into(),
                help: None,
                related: Some((first.loc.span, "first given here".into())),
            });
            return;
        }
        pairs.push(At {
            value: (name.value, value.value),
            loc: name.loc,
        });
    }

    /// `client-secret credential="NAME"`: one `credential` property.
    fn credential_ref(&mut self, node: &KdlNode, key: &str, field: Field) -> Option<At<String>> {
        self.no_children(node, key);
        let help = Some(format!("write `{} credential=\"NAME\"`", leaf(key)));
        match node.entries() {
            [one] if one.name().is_some_and(|n| n.value() == "credential") => {
                self.string(one, key, &field)
            }
            [] => {
                self.bad(
                    field,
                    node.name().span(),
                    format!("`{key}` needs `credential=\"NAME\"`"),
                    "no credential",
                    help,
                );
                None
            }
            [one, ..] => {
                let found = match one.name() {
                    Some(name) => format!("property `{}`", name.value()),
                    None => describe(one.value()),
                };
                self.bad(
                    field,
                    one.span(),
                    format!(
                        "`{key}` takes only `credential=\"NAME\"` (a secret is never written in a unit), found {found}"
                    ),
                    "expected credential=\"NAME\"",
                    help,
                );
                None
            }
        }
    }

    /// `http "URL"`: the block itself and its one URL argument.
    fn endpoint(&mut self, key: &Key, node: &KdlNode, layer: &mut Layer) {
        let path = key.path();
        self.no_properties(node, &path);
        layer
            .blocks
            .entry(Block::Http)
            .or_insert(self.loc(node.name().span()));
        let args = arguments(node);
        let url = match args.as_slice() {
            [] => None,
            [one, rest @ ..] => {
                for e in rest {
                    self.bad(
                        Field::Url,
                        e.span(),
                        format!(
                            "`{path}` takes one URL, found another: {}",
                            describe(e.value())
                        ),
                        "extra value",
                        None,
                    );
                }
                self.string(one, &path, &Field::Url)
            }
        };
        if let Some(url) = url {
            layer.values.insert(
                URL.to_owned(),
                At {
                    value: Value::String(url.value),
                    loc: url.loc,
                },
            );
        }
    }

    /// `header "Name" "value"`.
    fn header(&mut self, node: &KdlNode, headers: &mut Vec<At<(String, HeaderDraft)>>) {
        let field = Field::Header(headers.len());
        self.no_children(node, "http.header");
        let props: Vec<&kdl::KdlEntry> = node
            .entries()
            .iter()
            .filter(|e| e.name().is_some())
            .collect();
        let args = arguments(node);
        // `header "Authorization" credential="gh" format="Bearer {}"`.
        if let [name] = args.as_slice()
            && props
                .iter()
                .any(|p| p.name().is_some_and(|n| n.value() == "credential"))
        {
            let name = self.string(name, "http.header", &field);
            let mut credential = None;
            let mut format = None;
            for prop in &props {
                let key = prop.name().map_or("", |n| n.value());
                let slot = match key {
                    "credential" => &mut credential,
                    "format" => &mut format,
                    other => {
                        self.bad(
                            field.clone(),
                            prop.span(),
                            format!("`http.header`: unknown property `{other}`"),
                            "unknown property",
                            Some("write `header \"Authorization\" credential=\"gh\" format=\"Bearer {}\"`".into()),
                        );
                        continue;
                    }
                };
                match prop.value() {
                    KdlValue::String(s) => *slot = Some(s.clone()),
                    other => self.bad(
                        field.clone(),
                        prop.span(),
                        format!(
                            "`http.header`: `{key}` takes a string, found a {}",
                            kind(other)
                        ),
                        "expected a string",
                        None,
                    ),
                }
            }
            if let (Some(name), Some(credential)) = (name, credential) {
                headers.push(At {
                    value: (name.value, HeaderDraft::Credential { credential, format }),
                    loc: name.loc,
                });
            }
            return;
        }
        // `header "Authorization" env="API_TOKEN"`: the value from an env-file.
        if let ([name], [prop]) = (args.as_slice(), props.as_slice())
            && prop.name().is_some_and(|n| n.value() == "env")
        {
            let name = self.string(name, "http.header", &field);
            let var = match prop.value() {
                KdlValue::String(s) => Some(s.clone()),
                other => {
                    self.bad(
                        field,
                        prop.span(),
                        format!(
                            "`http.header`: `env` names a variable, found a {}",
                            kind(other)
                        ),
                        "expected a string",
                        None,
                    );
                    None
                }
            };
            if let (Some(name), Some(var)) = (name, var) {
                headers.push(At {
                    value: (name.value, HeaderDraft::Env(var)),
                    loc: name.loc,
                });
            }
            return;
        }
        self.no_properties(node, "http.header");
        let [name, value] = args.as_slice() else {
            self.bad(
                field,
                node.name().span(),
                format!(
                    "`http.header` takes a name and a value, found {} value(s)",
                    args.len()
                ),
                "expected NAME VALUE or NAME env=\"VAR\"",
                Some("write `header \"Authorization\" \"Bearer …\"`, or `header \"Authorization\" env=\"API_TOKEN\"` with the value in an `env-file`".into()),
            );
            return;
        };
        let name = self.string(name, "http.header", &field);
        // Never echo a header value: it is usually a credential.
        let value = match value.value() {
            KdlValue::String(s) => Some(HeaderDraft::Value(s.clone())),
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
            headers.push(At {
                value: (name.value, value),
                loc: name.loc,
            });
        }
    }
}

/// Where the `http` node's URL argument is kept in [`Layer::values`].
const URL: &str = "http";

/// `field` for the value at `index` of a repeatable key.
fn indexed(field: &Field, index: usize) -> Field {
    match field {
        Field::EnvFile(_) => Field::EnvFile(index),
        Field::HttpEnvFile(_) => Field::HttpEnvFile(index),
        Field::PassEnv(_) => Field::PassEnv(index),
        Field::Header(_) => Field::Header(index),
        Field::Roots(_) => Field::Roots(index),
        Field::Group(_) => Field::Group(index),
        Field::ToolsAllow(_) => Field::ToolsAllow(index),
        Field::ToolsDeny(_) => Field::ToolsDeny(index),
        Field::ReadOnlyPaths(_) => Field::ReadOnlyPaths(index),
        Field::ReadWritePaths(_) => Field::ReadWritePaths(index),
        Field::CredentialLoad(_) => Field::CredentialLoad(index),
        Field::CredentialImport(_) => Field::CredentialImport(index),
        Field::CredentialEncrypted(_) => Field::CredentialEncrypted(index),
        Field::CredentialEnv(_) => Field::CredentialEnv(index),
        other => other.clone(),
    }
}

/// "512M" → 536870912; K, M, G, T are powers of 1024, a bare number is bytes.
fn parse_size(text: &str) -> Option<i128> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last()? {
        (i, 'K' | 'k') => (&text[..i], 10),
        (i, 'M' | 'm') => (&text[..i], 20),
        (i, 'G' | 'g') => (&text[..i], 30),
        (i, 'T' | 't') => (&text[..i], 40),
        _ => (text, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<i128>().ok()?.checked_mul(1 << shift)
}

/// A node's positional arguments (its entries without a name).
fn arguments(node: &KdlNode) -> Vec<&KdlEntry> {
    node.entries()
        .iter()
        .filter(|e| e.name().is_none())
        .collect()
}

/// `reconnect.max-attempts` → `max-attempts`, as written in the file.
fn leaf(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
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
    /// Applies a later layer (a drop-in) on top of this one, key by key as
    /// the table says: single values are replaced, lists extended (without
    /// repeats where the key says so), `env` and `header` entries replaced
    /// by name.
    pub fn merge(&mut self, later: Layer) {
        self.values.extend(later.values);
        for (path, values) in later.lists {
            let unique = keys::by_path(&path).is_some_and(|k| k.merge == Merge::AppendUnique);
            let mine = self.lists.entry(path).or_default();
            for value in values {
                if !(unique && mine.iter().any(|v| v.value == value.value)) {
                    mine.push(value);
                }
            }
        }
        self.env.extend(later.env);
        for (path, pairs) in later.pairs {
            let mine = self.pairs.entry(path).or_default();
            for pair in pairs {
                mine.retain(|p| p.value.0 != pair.value.0);
                mine.push(pair);
            }
        }
        for header in later.headers {
            self.headers
                .retain(|h| !h.value.0.eq_ignore_ascii_case(&header.value.0));
            self.headers.push(header);
        }
        for (block, loc) in later.blocks {
            self.blocks.entry(block).or_insert(loc);
        }
        self.poisoned.extend(later.poisoned);
    }

    /// The draft for [`UnitSpec::new`](super::spec::UnitSpec::new), where each
    /// field was written, and the fields already reported as bad.
    pub fn into_draft(mut self, unit: Loc) -> (UnitDraft, HashMap<Field, Loc>, HashSet<Field>) {
        let mut d = Drafting {
            locs: HashMap::from([(Field::Unit, unit)]),
        };
        let description = d.string(&mut self, "description");
        let stdio = self.blocks.get(&Block::Stdio).copied().map(|loc| {
            d.locs.insert(Field::Stdio, loc);
            // A missing command is reported at the `stdio` node.
            d.locs.insert(Field::Command, loc);
            StdioDraft {
                command: d.strings(&mut self, "stdio.command").unwrap_or_default(),
                working_directory: d.path(&mut self, "stdio.working-directory"),
                env: std::mem::take(&mut self.env)
                    .into_iter()
                    .map(|(k, v)| {
                        d.locs.insert(Field::Env(k.clone()), v.loc);
                        (k, v.value)
                    })
                    .collect(),
                env_files: d
                    .list(&mut self, "stdio.env-file")
                    .into_iter()
                    .map(PathBuf::from)
                    .collect(),
                pass_env: d.list(&mut self, "stdio.pass-env"),
                user: d.string(&mut self, "stdio.user"),
            }
        });
        let http = self.blocks.get(&Block::Http).copied().map(|loc| {
            d.locs.insert(Field::Http, loc);
            // A missing URL is reported at the `http` node.
            d.locs.insert(Field::Url, loc);
            HttpDraft {
                url: d.string(&mut self, URL).unwrap_or_default(),
                env_files: d
                    .list(&mut self, "http.env-file")
                    .into_iter()
                    .map(PathBuf::from)
                    .collect(),
                headers: std::mem::take(&mut self.headers)
                    .into_iter()
                    .enumerate()
                    .map(|(i, h)| {
                        d.locs.insert(Field::Header(i), h.loc);
                        h.value
                    })
                    .collect(),
                oauth: self.blocks.get(&Block::OAuth).copied().map(|loc| {
                    d.locs.insert(Field::OAuth, loc);
                    OAuthDraft {
                        client_id: d.string(&mut self, "oauth.client-id"),
                        client_secret: d.string(&mut self, "oauth.client-secret"),
                        scope: d.string(&mut self, "oauth.scope"),
                        redirect_port: d.integer(&mut self, "oauth.redirect-port"),
                        grant: d.string(&mut self, "oauth.grant"),
                    }
                }),
            }
        });
        let reconnect = ReconnectDraft {
            enabled: d.bool(&mut self, "reconnect.enabled"),
            initial_delay: d.duration(&mut self, "reconnect.initial-delay"),
            max_delay: d.duration(&mut self, "reconnect.max-delay"),
            max_attempts: d.integer(&mut self, "reconnect.max-attempts"),
        };
        let health = HealthDraft {
            enabled: d.bool(&mut self, "health.enabled"),
            interval: d.duration(&mut self, "health.interval"),
            timeout: d.duration(&mut self, "health.timeout"),
            failures: d.integer(&mut self, "health.failures"),
        };
        let limits = LimitsDraft {
            memory_max: match d.take(&mut self, "limits.memory-max") {
                Some(Value::Size(n)) => Some(n),
                _ => None,
            },
            tasks_max: d.integer(&mut self, "limits.tasks-max"),
            cpu_weight: d.integer(&mut self, "limits.cpu-weight"),
            nofile: d.integer(&mut self, "limits.nofile"),
            core: match d.take(&mut self, "limits.core") {
                Some(Value::Size(n)) => Some(n),
                _ => None,
            },
        };
        let sandbox = self.blocks.get(&Block::Sandbox).copied().map(|loc| {
            d.locs.insert(Field::Sandbox, loc);
            SandboxDraft {
                read_only_paths: d.list(&mut self, "sandbox.read-only-paths"),
                read_write_paths: d.list(&mut self, "sandbox.read-write-paths"),
                network: d.string(&mut self, "sandbox.network"),
            }
        });
        let credentials = self.blocks.get(&Block::Credentials).copied().map(|loc| {
            d.locs.insert(Field::Credentials, loc);
            CredentialsDraft {
                load: d.pairs(&mut self, "credentials.load", Field::CredentialLoad),
                import: d.list(&mut self, "credentials.import"),
                load_encrypted: d.pairs(
                    &mut self,
                    "credentials.load-encrypted",
                    Field::CredentialEncrypted,
                ),
                env: d.pairs(&mut self, "credentials.env", Field::CredentialEnv),
            }
        });
        let log_rate_limit = match d.take(&mut self, "log-rate-limit") {
            Some(Value::RateLimit(limit)) => Some(limit),
            _ => None,
        };
        let draft = UnitDraft {
            description,
            stdio,
            http,
            reconnect,
            health,
            limits,
            sandbox,
            credentials,
            log_rate_limit,
            startup_timeout: d.duration(&mut self, "startup-timeout"),
            stop_timeout: d.duration(&mut self, "stop-timeout"),
            max_request_size: match d.take(&mut self, "max-request-size") {
                Some(Value::Size(n)) => Some(n),
                _ => None,
            },
            protocol: d.string(&mut self, "protocol"),
            start: d.string(&mut self, "start"),
            idle_stop: d.duration(&mut self, "idle-stop"),
            sessions: d.string(&mut self, "sessions"),
            max_instances: d.integer(&mut self, "max-instances"),
            roots: d.list(&mut self, "roots"),
            groups: d.list(&mut self, "group"),
            alias: d.string(&mut self, "alias"),
            tools_allow: d.list(&mut self, "tools.allow"),
            tools_deny: d.list(&mut self, "tools.deny"),
        };
        (draft, d.locs, self.poisoned)
    }
}

/// Takes values out of a merged layer by key path, recording where each
/// was written under the key's field.
struct Drafting {
    locs: HashMap<Field, Loc>,
}

impl Drafting {
    fn take(&mut self, layer: &mut Layer, path: &str) -> Option<Value> {
        let at = layer.values.remove(path)?;
        let field = if path == URL {
            Field::Url
        } else {
            keys::by_path(path)?.field.clone()?
        };
        self.locs.insert(field, at.loc);
        Some(at.value)
    }

    fn string(&mut self, layer: &mut Layer, path: &str) -> Option<String> {
        match self.take(layer, path)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    fn path(&mut self, layer: &mut Layer, path: &str) -> Option<PathBuf> {
        match self.take(layer, path)? {
            Value::Path(p) => Some(p),
            _ => None,
        }
    }

    fn strings(&mut self, layer: &mut Layer, path: &str) -> Option<Vec<String>> {
        match self.take(layer, path)? {
            Value::Strings(v) => Some(v),
            _ => None,
        }
    }

    fn duration(&mut self, layer: &mut Layer, path: &str) -> Option<Duration> {
        match self.take(layer, path)? {
            Value::Duration(d) => Some(d),
            _ => None,
        }
    }

    fn bool(&mut self, layer: &mut Layer, path: &str) -> Option<bool> {
        match self.take(layer, path)? {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    fn integer(&mut self, layer: &mut Layer, path: &str) -> Option<i128> {
        match self.take(layer, path)? {
            Value::Integer(i) => Some(i),
            _ => None,
        }
    }

    /// A repeatable key's values in order, each recorded at its index.
    fn list(&mut self, layer: &mut Layer, path: &str) -> Vec<String> {
        let Some(field) = keys::by_path(path).and_then(|k| k.field.clone()) else {
            return Vec::new();
        };
        layer
            .lists
            .remove(path)
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                self.locs.insert(indexed(&field, i), v.loc);
                v.value
            })
            .collect()
    }

    /// A [`Kind::Pair`] key's pairs in order, each recorded at its index.
    fn pairs(
        &mut self,
        layer: &mut Layer,
        path: &str,
        field: fn(usize) -> Field,
    ) -> Vec<(String, String)> {
        layer
            .pairs
            .remove(path)
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                self.locs.insert(field(i), p.loc);
                p.value
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions_are_for_typos_only() {
        let names = keys::names;
        assert_eq!(
            did_you_mean("comand", &names(Block::Stdio)),
            Some("command")
        );
        assert_eq!(
            did_you_mean("max-attempt", &names(Block::Reconnect)),
            Some("max-attempts")
        );
        assert_eq!(
            did_you_mean("descripton", &names(Block::Top)),
            Some("description")
        );
        assert_eq!(did_you_mean("banana", &names(Block::Top)), None);
    }
}
