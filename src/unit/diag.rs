//! Load errors: every problem of a unit file, each pointing at its origin.
//!
//! A [`Problem`] is a miette diagnostic carrying the file's text, so it renders
//! as `path:line:col`, the source line and a caret. [`LoadError`] holds all
//! problems of one unit (its file and drop-ins) and renders them two ways:
//! [`LoadError::render`] (the full report, for `mcpctl verify`) and `Display`
//! (one `path:line:col: message` line each, for status output and D-Bus).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use miette::{GraphicalReportHandler, GraphicalTheme, NamedSource, SourceSpan};

/// One thing wrong with a unit.
#[derive(Debug, Clone, thiserror::Error, miette::Diagnostic)]
#[error("{message}")]
pub struct Problem {
    message: String,
    #[source_code]
    code: Option<NamedSource<Arc<str>>>,
    /// The primary label: the report's `path:line:col` header points here,
    /// even when a related label comes earlier in the file.
    #[label(primary, "{label}")]
    span: Option<SourceSpan>,
    label: String,
    #[label("{related_label}")]
    related_span: Option<SourceSpan>,
    related_label: String,
    #[help]
    help: Option<String>,
    path: PathBuf,
    position: Option<(usize, usize)>,
}

impl Problem {
    /// A problem with the file as a whole, with no position in it.
    pub fn file(path: &Path, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: None,
            span: None,
            label: String::new(),
            related_span: None,
            related_label: String::new(),
            help: None,
            path: path.to_owned(),
            position: None,
        }
    }

    /// A problem at `span` (byte offsets) of `text`, the content of `path`.
    pub fn at(
        path: &Path,
        text: &Arc<str>,
        span: SourceSpan,
        message: impl Into<String>,
        label: impl Into<String>,
    ) -> Self {
        let start = span.offset().min(text.len());
        Self {
            message: message.into(),
            code: Some(NamedSource::new(
                path.display().to_string(),
                Arc::clone(text),
            )),
            span: Some(span),
            label: label.into(),
            related_span: None,
            related_label: String::new(),
            help: None,
            path: path.to_owned(),
            position: Some(line_col(text, start)),
        }
    }

    /// Adds a fix-it hint.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds a hint only when there is one.
    pub fn with_help_opt(mut self, help: Option<String>) -> Self {
        if help.is_some() {
            self.help = help;
        }
        self
    }

    /// Marks a second place in the same file (e.g. "first set here").
    pub fn with_related(mut self, span: SourceSpan, label: impl Into<String>) -> Self {
        self.related_span = Some(span);
        self.related_label = label.into();
        self
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The file the problem is in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// 1-based line and column (in characters), when the problem has a position.
    pub fn position(&self) -> Option<(usize, usize)> {
        self.position
    }
}

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.0;
        match p.position {
            Some((line, col)) => write!(f, "{}:{line}:{col}: {}", p.path.display(), p.message),
            None => write!(f, "{}: {}", p.path.display(), p.message),
        }
    }
}

/// `path:line:col: message`, the compact form of a [`Problem`].
#[derive(Debug)]
pub struct Located<'a>(pub &'a Problem);

/// 1-based line and character column of byte `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// Every problem of one unit (its file and drop-ins), in file order.
#[derive(Debug, Clone)]
pub struct LoadError {
    path: PathBuf,
    problems: Vec<Problem>,
}

/// How to render a [`LoadError`] report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Unicode frames, no colour: stable, for files and snapshots.
    Plain,
    /// Unicode frames with ANSI colour, for terminals.
    Color,
}

impl LoadError {
    /// `problems` must not be empty.
    pub fn new(path: PathBuf, problems: Vec<Problem>) -> Self {
        debug_assert!(!problems.is_empty());
        Self { path, problems }
    }

    /// The unit's main file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }

    /// The full report: each problem with its source line and caret.
    pub fn render(&self, style: Style) -> String {
        let theme = match style {
            Style::Plain => GraphicalTheme::unicode_nocolor(),
            Style::Color => GraphicalTheme::unicode(),
        };
        let handler = GraphicalReportHandler::new_themed(theme)
            .with_links(false)
            .with_width(100);
        let mut out = String::new();
        for problem in &self.problems {
            if problem.code.is_none() {
                // No snippet to show: name the file in the headline itself.
                out.push_str(&format!("  × {}\n", Located(problem)));
                if let Some(help) = &problem.help {
                    out.push_str(&format!("  help: {help}\n"));
                }
                out.push('\n');
                continue;
            }
            if handler.render_report(&mut out, problem).is_err() {
                out.push_str(&format!("  × {}\n", Located(problem)));
            }
            out.push('\n');
        }
        out
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}", Located(problem))?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

/// What an I/O error says, without Rust's " (os error N)".
pub fn io_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters() {
        let text = "a\nbü c\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 2), (2, 1));
        // 'c' is after the two-byte 'ü'
        assert_eq!(line_col(text, 6), (2, 4));
        assert_eq!(line_col(text, 999), (3, 1));
        // inside a multi-byte character: clamps to its start
        assert_eq!(line_col(text, 4), (2, 2));
    }

    #[test]
    fn display_is_one_located_line_per_problem() {
        let text: Arc<str> = Arc::from("description 5\n");
        let err = LoadError::new(
            "u.kdl".into(),
            vec![
                Problem::at(Path::new("u.kdl"), &text, (12, 1).into(), "bad", "here"),
                Problem::file(Path::new("u.kdl"), "worse"),
            ],
        );
        assert_eq!(err.to_string(), "u.kdl:1:13: bad\nu.kdl: worse");
    }
}
