//! The loader: a unit's files on disk → a [`UnitSpec`] or every problem.
//!
//! Reads the main file and its drop-ins, rejects what is not UTF-8 or not
//! KDL 2 (recognising KDL 1), reads each document into a layer, merges the
//! layers in order and lets [`UnitSpec::new`] judge the result. Never panics,
//! whatever the bytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kdl::KdlDocument;

use super::diag::{LoadError, Problem};
use super::instance::Instance;
use super::name::UnitName;
use super::spec::{Field, SpecError, UnitSpec};
use super::syntax::{self, Issue, Layer, Loc};

// Defined beside what they belong to (an instance's rules, the files
// discovery finds) and named here too, where the loader takes them, so
// `unit::load::Context` and `unit::load::UnitFiles` keep working.
pub use super::instance::Context;
pub use super::search::UnitFiles;

/// A file's path and text, for rendering problems.
struct Source {
    path: PathBuf,
    text: Arc<str>,
}

/// Loads and validates a unit. All problems of all its files come back at once.
pub fn load(files: &UnitFiles) -> Result<UnitSpec, LoadError> {
    load_with(files, &Context::default(), |path| std::fs::read(path))
}

/// [`load`] for an instance (see [`Context`]).
pub fn load_in(files: &UnitFiles, context: &Context) -> Result<UnitSpec, LoadError> {
    load_with(files, context, |path| std::fs::read(path))
}

/// How long a file must have been left alone before a [`Loader`] trusts
/// its stamp: an edit within the filesystem's timestamp granularity of the
/// moment the file was read could otherwise leave the stamp as it was.
pub const SETTLED: std::time::Duration = std::time::Duration::from_secs(2);

/// [`load_in`] that remembers what it loaded: a unit whose files all stand
/// as they did (device, inode, size, mtime, ctime) is not read and parsed
/// again. It remembers only what depends on the files alone: valid units
/// whose files had [`SETTLED`] when they were read, and whose sandbox
/// names no paths (their existence is checked at load); errors and the
/// rest are loaded afresh every time.
#[derive(Debug, Default)]
pub struct Loader {
    context: Context,
    known: HashMap<UnitFiles, (Vec<Stamp>, UnitSpec)>,
    /// How many units were read and parsed (not remembered).
    pub parsed: usize,
}

/// What identifies a file's content without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Whether the file's last change is [`SETTLED`] before `now`.
    fn settled(&self, now: std::time::SystemTime) -> bool {
        let (Ok(secs), Ok(nanos)) = (u64::try_from(self.ctime.0), u32::try_from(self.ctime.1))
        else {
            return false;
        };
        let changed = std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
        changed + SETTLED <= now
    }
}

impl Loader {
    pub fn new(context: Context) -> Self {
        Self {
            context,
            ..Self::default()
        }
    }

    /// A loader for the same instance that remembers nothing yet.
    pub fn fresh(&self) -> Self {
        Self::new(self.context.clone())
    }

    /// Loads `files` (see [`load_in`]); `now` is the time of the scan.
    pub fn load(
        &mut self,
        files: &UnitFiles,
        now: std::time::SystemTime,
    ) -> Result<UnitSpec, LoadError> {
        // Stamped before reading: a change after the stamp makes the next
        // stamp differ.
        let stamps: Option<Vec<Stamp>> = std::iter::once(&files.main)
            .chain(&files.dropins)
            .map(|p| Stamp::of(p))
            .collect();
        if let (Some(stamps), Some((known, spec))) = (&stamps, self.known.get(files))
            && stamps == known
        {
            return Ok(spec.clone());
        }
        self.known.remove(files);
        self.parsed += 1;
        let loaded = load_in(files, &self.context);
        if let (Some(stamps), Ok(spec)) = (stamps, &loaded)
            && stamps.iter().all(|s| s.settled(now))
            && spec
                .sandbox()
                .is_none_or(|s| s.read_only.is_empty() && s.read_write.is_empty())
        {
            self.known.insert(files.clone(), (stamps, spec.clone()));
        }
        loaded
    }

    /// Forgets every unit but those in `kept` (the last scan's).
    pub fn retain(&mut self, kept: &std::collections::HashSet<&UnitFiles>) {
        self.known.retain(|files, _| kept.contains(files));
    }
}

/// [`load_in`] with the file reads supplied by `read` (tests feed bytes from memory).
pub fn load_with(
    files: &UnitFiles,
    context: &Context,
    read: impl Fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<UnitSpec, LoadError> {
    let mut problems = Vec::new();
    if let Err(e) = UnitName::new(&files.stem()) {
        problems.push(
            Problem::file(&files.main, format!("invalid unit name: {e}"))
                .with_help("unit names match [A-Za-z0-9][A-Za-z0-9_-]{0,63}; rename the file"),
        );
    }

    let mut sources = Vec::new();
    let mut layers = Vec::new();
    let mut issues = Vec::new();
    let mut readable = true;
    let all = std::iter::once(&files.main).chain(&files.dropins);
    for (index, path) in all.enumerate() {
        let is_main = index == 0;
        match read_document(path, read(path), is_main) {
            Ok((text, doc)) => {
                layers.push(syntax::read(&doc, index, &mut issues));
                sources.push(Source {
                    path: path.clone(),
                    text,
                });
            }
            Err(problem) => {
                problems.push(*problem);
                readable = false;
                // Keep file indices aligned with `sources`.
                sources.push(Source {
                    path: path.clone(),
                    text: Arc::from(""),
                });
                layers.push(Layer::default());
            }
        }
    }

    let mut located: Vec<(Loc, Problem)> = issues
        .into_iter()
        .map(|issue| (issue.loc, problem_from_issue(&sources, issue)))
        .collect();

    if readable {
        let mut layers = layers.into_iter();
        let mut merged = layers.next().unwrap_or_default();
        for later in layers {
            merged.merge(later);
        }
        let unit_loc = Loc {
            file: 0,
            span: (0, 0).into(),
        };
        let (draft, locs, poisoned) = merged.into_draft(unit_loc);
        if let Some(e) = context_error(&draft, context) {
            located.push(spec_problem(&sources, &locs, e));
        }
        for e in missing_paths(&draft) {
            located.push(spec_problem(&sources, &locs, e));
        }
        match UnitSpec::new(draft) {
            Ok(spec) if problems.is_empty() && located.is_empty() => return Ok(spec),
            Ok(_) => {}
            Err(errors) => {
                for e in errors {
                    if poisoned.contains(&e.field) {
                        continue;
                    }
                    located.push(spec_problem(&sources, &locs, e));
                }
            }
        }
    }

    located.sort_by_key(|(loc, _)| (loc.file, loc.span.offset()));
    problems.extend(located.into_iter().map(|(_, p)| p));
    Err(LoadError::new(files.main.clone(), problems))
}

/// Rules of the instance: a user instance runs every server as its own user.
fn context_error(draft: &super::spec::UnitDraft, context: &Context) -> Option<SpecError> {
    let user = draft.stdio.as_ref()?.user.as_deref()?;
    if context.instance != Some(Instance::User) {
        return None;
    }
    let (uid, name) = context.own_user.as_ref()?;
    if user == uid.to_string() || name.as_deref() == Some(user) {
        return None;
    }
    let own = name.clone().unwrap_or_else(|| format!("uid {uid}"));
    Some(SpecError {
        field: Field::User,
        message: format!(
            "`stdio.user`: a user instance runs every server as its own user ({own}), not \"{user}\""
        ),
        related: None,
        help: Some("remove `user`, or install the unit for the system instance".into()),
    })
}

/// The paths a `sandbox` grants must exist when the unit loads: a typo
/// would otherwise only show as a server that cannot reach its files.
fn missing_paths(draft: &super::spec::UnitDraft) -> Vec<SpecError> {
    let Some(sandbox) = &draft.sandbox else {
        return Vec::new();
    };
    type Indexed = fn(usize) -> Field;
    let lists: [(Indexed, &Vec<String>); 2] = [
        (Field::ReadOnlyPaths, &sandbox.read_only_paths),
        (Field::ReadWritePaths, &sandbox.read_write_paths),
    ];
    let mut errors = Vec::new();
    for (field, paths) in lists {
        for (i, path) in paths.iter().enumerate() {
            if !path.starts_with('/') || path.contains('\0') {
                continue; // the spec says what is wrong with it
            }
            if let Err(e) = std::fs::metadata(path) {
                errors.push(SpecError {
                    field: field(i),
                    message: format!(
                        "`{}`: {path}: {}",
                        field(i).key(),
                        lowercase_first(&super::diag::io_text(&e))
                    ),
                    related: None,
                    help: Some("create it first, or remove it from the sandbox".into()),
                });
            }
        }
    }
    errors
}

/// Reads a file as a KDL 2 document, or says precisely why it is not one.
fn read_document(
    path: &Path,
    bytes: std::io::Result<Vec<u8>>,
    is_main: bool,
) -> Result<(Arc<str>, KdlDocument), Box<Problem>> {
    let bytes =
        bytes.map_err(|e| Box::new(Problem::file(path, format!("cannot read unit file: {e}"))))?;
    let text: Arc<str> = match String::from_utf8(bytes) {
        Ok(text) => Arc::from(text),
        Err(e) => {
            let offset = e.utf8_error().valid_up_to();
            let lossy: Arc<str> = Arc::from(String::from_utf8_lossy(e.as_bytes()).into_owned());
            return Err(Box::new(
                Problem::at(
                    path,
                    &lossy,
                    (offset, 1).into(),
                    "unit file is not valid UTF-8",
                    "invalid byte",
                )
                .with_help("unit files are UTF-8 text; re-save the file as UTF-8"),
            ));
        }
    };
    let doc = match KdlDocument::parse_v2(&text) {
        Ok(doc) => doc,
        Err(v2) => return Err(Box::new(kdl_problem(path, &text, &v2))),
    };
    if is_main && doc.nodes().is_empty() {
        return Err(Box::new(
            Problem::file(
                path,
                "unit file is empty: expected a `stdio` or an `http` node",
            )
            .with_help("a minimal unit is `stdio { command \"/path/to/server\" }`"),
        ));
    }
    Ok((text, doc))
}

/// The first KDL syntax error, or a KDL 1 hint when the text parses as KDL 1.
pub(super) fn kdl_problem(path: &Path, text: &Arc<str>, err: &kdl::KdlError) -> Problem {
    let first = err.diagnostics.first();
    let span = first.map_or((0, 0).into(), |d| clamp(text, d.span));
    if looks_like_kdl1(text, span) {
        return Problem::at(
            path,
            text,
            span,
            "this file looks like KDL 1, but unit files are KDL 2",
            "KDL 1 syntax",
        )
        .with_help(
            "in KDL 2, booleans are #true/#false, null is #null and raw strings are #\"…\"#",
        );
    }
    let message = first
        .and_then(|d| d.message.clone())
        .unwrap_or_else(|| "invalid KDL".into());
    Problem::at(
        path,
        text,
        span,
        format!("invalid KDL: {}", lowercase_first(&message)),
        first
            .and_then(|d| d.label.clone())
            .unwrap_or_else(|| "here".into()),
    )
    .with_help_opt(first.and_then(|d| d.help.clone()))
}

/// Whether a KDL 2 syntax error at `span` is KDL 1 syntax: a bare `true`,
/// `false` or `null`, an `r"…"` raw string, or a `/- kdl-version 1` marker.
fn looks_like_kdl1(text: &str, span: miette::SourceSpan) -> bool {
    let first_line = text.lines().next().unwrap_or_default();
    if first_line.contains("kdl-version 1") {
        return true;
    }
    let at = &text[span.offset()..];
    let token: String = at
        .chars()
        .take_while(|c| !c.is_whitespace() && !matches!(c, ';' | '}' | '{'))
        .collect();
    matches!(token.as_str(), "true" | "false" | "null")
        || token.starts_with("r\"")
        || token.starts_with("r#")
}

/// Keeps a span inside the text and on character boundaries.
fn clamp(text: &str, span: miette::SourceSpan) -> miette::SourceSpan {
    let mut start = span.offset().min(text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + span.len()).min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    (start, end - start).into()
}

fn lowercase_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn problem_from_issue(sources: &[Source], issue: Issue) -> Problem {
    let source = &sources[issue.loc.file];
    let mut problem = Problem::at(
        &source.path,
        &source.text,
        clamp(&source.text, issue.loc.span),
        issue.message,
        issue.label,
    )
    .with_help_opt(issue.help);
    if let Some((span, label)) = issue.related {
        problem = problem.with_related(clamp(&source.text, span), label);
    }
    problem
}

fn spec_problem(sources: &[Source], locs: &HashMap<Field, Loc>, e: SpecError) -> (Loc, Problem) {
    let related = e.related.as_ref().and_then(|f| locs.get(f).copied());
    let loc = locs
        .get(&e.field)
        .copied()
        .or(related)
        .or_else(|| locs.get(&Field::Unit).copied())
        .unwrap_or(Loc {
            file: 0,
            span: (0, 0).into(),
        });
    let source = &sources[loc.file];
    let label = if e.field == Field::Unit {
        "in this unit".to_owned()
    } else {
        "here".to_owned()
    };
    let mut problem = Problem::at(
        &source.path,
        &source.text,
        clamp(&source.text, loc.span),
        e.message,
        label,
    )
    .with_help_opt(e.help);
    if let (Some(rel), Some(field)) = (related, &e.related)
        && rel != loc
    {
        let rel_source = &sources[rel.file];
        if rel.file == loc.file {
            problem = problem.with_related(
                clamp(&rel_source.text, rel.span),
                format!("`{}` set here", field.key()),
            );
        }
    }
    (loc, problem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn unit(dir: &Path, name: &str, body: &str) -> UnitFiles {
        let main = dir.join(format!("{name}.kdl"));
        std::fs::write(&main, body).expect("write");
        UnitFiles::beside(&main)
    }

    const FIXTURE: &str = "stdio {\n    command \"/bin/true\"\n}\n";

    #[test]
    fn a_settled_unchanged_unit_is_not_parsed_again_and_any_change_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = unit(dir.path(), "a", FIXTURE);
        let mut loader = Loader::default();
        let later = SystemTime::now() + SETTLED + Duration::from_secs(1);
        let first = loader.load(&files, later).expect("valid");
        assert_eq!(loader.load(&files, later).expect("valid"), first);
        assert_eq!(loader.parsed, 1, "the second load is remembered");
        // The same size, a new content: only the ctime says so, once the
        // filesystem's clock has ticked past the first write's.
        let stamp = Stamp::of(&files.main).expect("stamp");
        for _ in 0..400 {
            std::fs::write(&files.main, FIXTURE.replace("true", "echo")).expect("write");
            if Stamp::of(&files.main).expect("stamp").ctime != stamp.ctime {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_ne!(Stamp::of(&files.main).expect("stamp").ctime, stamp.ctime);
        let changed = loader.load(&files, later + SETTLED).expect("valid");
        assert_ne!(changed, first);
        assert_eq!(loader.parsed, 2);
        // A drop-in makes other files: parsed.
        std::fs::create_dir(dir.path().join("a.kdl.d")).expect("mkdir");
        std::fs::write(dir.path().join("a.kdl.d/10-x.kdl"), "stop-timeout \"3s\"\n")
            .expect("write");
        let files = UnitFiles::beside(&files.main);
        loader.load(&files, later + SETTLED).expect("valid");
        assert_eq!(loader.parsed, 3);
        // Forgotten once it is not in a scan.
        loader.retain(&std::collections::HashSet::new());
        loader.load(&files, later + SETTLED).expect("valid");
        assert_eq!(loader.parsed, 4);
    }

    #[test]
    fn fresh_files_errors_and_sandbox_paths_are_parsed_every_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut loader = Loader::default();
        let now = SystemTime::now();
        // Just written: its stamp may not show an edit in the same tick.
        let fresh = unit(dir.path(), "fresh", FIXTURE);
        loader.load(&fresh, now).expect("valid");
        loader.load(&fresh, now).expect("valid");
        assert_eq!(loader.parsed, 2);
        let later = now + SETTLED + Duration::from_secs(1);
        let broken = unit(dir.path(), "broken", "stdio {\n");
        assert!(loader.load(&broken, later).is_err());
        assert!(loader.load(&broken, later).is_err());
        assert_eq!(loader.parsed, 4);
        let data = dir.path().join("data");
        let sandboxed = unit(
            dir.path(),
            "sandboxed",
            &format!(
                "{FIXTURE}sandbox {{\n    read-only-paths \"{}\"\n}}\n",
                data.display()
            ),
        );
        assert!(
            loader.load(&sandboxed, later).is_err(),
            "the path is missing"
        );
        std::fs::create_dir(&data).expect("mkdir");
        loader.load(&sandboxed, later).expect("valid now");
        std::fs::remove_dir(&data).expect("rmdir");
        assert!(loader.load(&sandboxed, later).is_err(), "missing again");
        assert_eq!(loader.parsed, 7);
    }
}
