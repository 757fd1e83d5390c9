//! What `mcpctl import` will do, decided in one place (DESIGN §11): the
//! hosts' files as read and what the unit directory and the credstore
//! hold now in, an [`ImportPlan`] out (the table's rows, each entry's unit
//! and why: imported, merged with another host's same server, renamed
//! beside a different one, unchanged, skipped, failed; and the files to
//! write and remove). Nothing here writes or prints: `ctl::import` reads
//! before, and writes the plan's files and prints its table after (a
//! write that fails turns its row into a failure there).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::convert::{self, Imported, Lookup};
use super::hosts::{self, Entry, Host};
use crate::unit::Instance;

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub host: String,
    pub entry: String,
    pub unit: String,
    pub result: String,
    pub failed: bool,
}

impl Row {
    /// A source that could not be read at all.
    pub fn failed_source(host: &str, why: String) -> Self {
        Row {
            host: host.into(),
            entry: "-".into(),
            unit: "-".into(),
            result: format!("failed: {why}"),
            failed: true,
        }
    }
}

/// A host's file, as read (or why it could not be).
#[derive(Debug)]
pub struct Source {
    pub host: Host,
    pub path: PathBuf,
    pub text: Result<String, String>,
    /// Where its relative paths are relative to ([`hosts::base_of`]).
    pub base: PathBuf,
    /// Read only to name units as importing every host would: another
    /// host's file, whose entries take their names (the host first in
    /// [`Host::ALL`] keeps a name two servers want) but are neither
    /// written nor shown. Importing one host at a time then pairs entries
    /// by server, whatever the order.
    pub context: bool,
}

/// What is there now for a unit name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Existing {
    /// `NAME.kdl`'s text.
    pub unit: Option<String>,
    /// `NAME.env`'s text.
    pub env: Option<String>,
    /// The credstore's `NAME.*` files and what they hold.
    pub credentials: Vec<(String, Vec<u8>)>,
}

impl Existing {
    /// Whether the credstore holds exactly `secrets` for unit `name`.
    fn holds(&self, name: &str, secrets: &[(String, String)]) -> bool {
        self.credentials.len() == secrets.len()
            && secrets.iter().all(|(var, value)| {
                self.credentials.iter().any(|(file, held)| {
                    *file == format!("{name}.{var}") && held == value.as_bytes()
                })
            })
    }
}

/// What `import` is given.
pub struct ImportInput<'a> {
    pub sources: Vec<Source>,
    /// Only these entries (by their name in the host, or their unit name).
    pub only: &'a [String],
    pub dry_run: bool,
    pub force: bool,
    /// Secrets to `UNIT.env` rather than the credstore.
    pub env_file: bool,
    /// The unit directory the units go to, and the instance's.
    pub units: &'a Path,
    pub instance: Instance,
    pub lookup: &'a Lookup<'a>,
    /// What is there now for a unit name.
    pub existing: &'a dyn Fn(&str) -> Existing,
}

impl std::fmt::Debug for ImportInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportInput")
            .field("sources", &self.sources)
            .field("units", &self.units)
            .field("only", &self.only)
            .finish_non_exhaustive()
    }
}

/// The files one imported unit is written as, in this order: the unit
/// last, so a running daemon never loads it before its secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Its row in the table, and what that row said before (a failed
    /// write is said after it).
    pub row: usize,
    pub prefix: String,
    /// The env-file to write (`--env-file` and secrets), or to remove (a
    /// replaced unit's secrets must not outlive it).
    pub env: (PathBuf, Option<String>),
    /// Credstore files (`NAME.VAR`) to write, and to remove (those the
    /// unit no longer has, or all of them with `--env-file`).
    pub credentials: Vec<(String, Vec<u8>)>,
    pub stale: Vec<String>,
    /// The unit file and its text (written 0600: an argument may hold
    /// what the host kept in the clear).
    pub unit: (PathBuf, String),
    /// The row's result once written.
    pub done: String,
}

/// What `import` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportPlan {
    pub rows: Vec<Row>,
    /// Nothing with `--dry-run`.
    pub writes: Vec<Placement>,
}

/// What `import` will do with `input`.
pub fn import(input: ImportInput<'_>) -> ImportPlan {
    let mut rows = Vec::new();
    let mut writes = Vec::new();
    // Unit name → (entry, imported) of what is imported in this run.
    // (and whether it is only read for naming: a context source's).
    let mut planned: BTreeMap<String, (Entry, Imported, bool)> = BTreeMap::new();
    let mut sources: Vec<&Source> = input.sources.iter().collect();
    if sources.iter().any(|s| s.context) {
        // Every host's entries named in one order, whichever is imported.
        sources.sort_by_key(|s| Host::ALL.iter().position(|h| *h == s.host));
    }
    // What a context source's entries would show, never shown.
    let mut unseen = Vec::new();
    for source in sources {
        let rows = if source.context {
            unseen.clear();
            &mut unseen
        } else {
            &mut rows
        };
        let host = source.host;
        let text = match &source.text {
            Ok(text) => text,
            Err(e) => {
                rows.push(Row::failed_source(
                    host.name(),
                    format!("{}: {e}", source.path.display()),
                ));
                continue;
            }
        };
        let entries = match hosts::read(host, &source.path, text, &source.base) {
            Ok(entries) => entries,
            Err(e) => {
                rows.push(Row::failed_source(
                    host.name(),
                    format!(
                        "{}:{}:{}: {}; nothing imported from it",
                        source.path.display(),
                        e.line,
                        e.column,
                        e.message
                    ),
                ));
                continue;
            }
        };
        for entry in entries {
            let mut row = Row {
                host: host.name().into(),
                entry: entry.name.clone(),
                unit: "-".into(),
                result: String::new(),
                failed: false,
            };
            let Some(mut name) = convert::unit_name(&entry.name) else {
                row.result = "failed: no unit name can be made of this name".into();
                row.failed = true;
                rows.push(row);
                continue;
            };
            if !input.only.is_empty() && !input.only.iter().any(|o| *o == entry.name || *o == name)
            {
                continue;
            }
            if entry.disabled {
                row.result = format!("skipped: disabled in {}", host.name());
                rows.push(row);
                continue;
            }
            // What mcpd cannot run is skipped, not failed.
            let skip = match &entry.server {
                hosts::Server::Unusable(why) => Some(why.clone()),
                hosts::Server::Remote { sse: true, .. } => Some(
                    "it uses the SSE transport, which mcpd does not speak (Streamable HTTP only)"
                        .into(),
                ),
                _ => None,
            };
            if let Some(why) = skip {
                row.result = format!("skipped: {why}");
                rows.push(row);
                continue;
            }
            let imported = |name: &str| {
                let env_file = input.units.join(format!("{name}.env"));
                let keep = if input.env_file {
                    convert::Keep::EnvFile(&env_file)
                } else {
                    convert::Keep::Credstore { unit: name }
                };
                convert::convert(&entry, keep, input.lookup)
            };
            let mut converted = match imported(&name) {
                Ok(c) => c,
                Err(why) => {
                    row.result = format!("failed: {why}");
                    row.failed = true;
                    rows.push(row);
                    continue;
                }
            };
            if let Some((other, before, only_named)) = planned.get(&name) {
                let same_server = same(before, &converted);
                if same_server && *only_named && !source.context {
                    // The same server as another host's, not imported
                    // now: this host's unit, of the name they share.
                    row.result = format!("the same server as {}'s; ", other.host.name());
                } else if same_server {
                    row.unit = format!("{name}.kdl");
                    row.result = format!("merged: the same server as {}'s", other.host.name());
                    rows.push(row);
                    continue;
                } else {
                    let base = convert::unit_name(&format!("{name}-{}", host.name()))
                        .unwrap_or_else(|| name.clone());
                    let mut renamed = base.clone();
                    let mut n = 2;
                    while planned.contains_key(&renamed) {
                        renamed = format!("{base}-{n}");
                        n += 1;
                    }
                    row.result = format!(
                        "renamed: {name} is {}'s, a different server; ",
                        other.host.name()
                    );
                    name = renamed;
                    converted = match imported(&name) {
                        Ok(c) => c,
                        Err(why) => {
                            row.result = format!("failed: {why}");
                            row.failed = true;
                            rows.push(row);
                            continue;
                        }
                    };
                }
            }
            row.unit = format!("{name}.kdl");
            if source.context {
                planned.insert(name, (entry, converted, true));
                continue;
            }
            match place(&input, &name, host, &converted) {
                Ok(Placed::Said(said)) => row.result += &said,
                Ok(Placed::Write(mut placement)) => {
                    placement.row = rows.len();
                    placement.prefix = row.result.clone();
                    row.result += &placement.done;
                    writes.push(placement);
                }
                Err(why) => {
                    row.failed = true;
                    row.result += &format!("failed: {why}");
                }
            }
            if converted.login && !row.failed {
                row.result += &format!("; needs login: mcpctl auth login {name}");
            }
            rows.push(row);
            planned.insert(name, (entry, converted, false));
        }
    }
    ImportPlan { rows, writes }
}

/// The sentence under the table: where the units went (or would go).
pub fn summary(rows: &[Row], units: &Path, instance: Instance, dry_run: bool) -> Option<String> {
    let place = format!("{} ({} instance)", units.display(), instance.as_str());
    if dry_run && rows.iter().any(|r| r.result.contains("would import")) {
        Some(format!("Units would be written to {place}."))
    } else if rows
        .iter()
        .any(|r| r.result.starts_with("imported") || r.result.contains("; imported"))
    {
        Some(format!(
            "Units are in {place}; a running mcpd starts them by itself."
        ))
    } else {
        None
    }
}

/// Whether two conversions are the same server (their origin comments aside).
fn same(a: &Imported, b: &Imported) -> bool {
    let env = (!b.secrets.is_empty()).then(|| b.env_file("", Host::Codex));
    convert::same_server(a, &b.unit, env.as_deref())
}

/// What becomes of one converted unit.
enum Placed {
    /// Nothing to write: the row's result.
    Said(String),
    Write(Placement),
}

/// Verifies one unit and decides what is written for it, or why not.
fn place(
    input: &ImportInput<'_>,
    name: &str,
    host: Host,
    converted: &Imported,
) -> Result<Placed, String> {
    let unit_path = input.units.join(format!("{name}.kdl"));
    let env_path = input.units.join(format!("{name}.env"));
    let env_text =
        (input.env_file && !converted.secrets.is_empty()).then(|| converted.env_file(name, host));
    let existing = (input.existing)(name);
    // Verified with the daemon's own loader before anything is written.
    let files = crate::unit::UnitFiles {
        main: unit_path.clone(),
        dropins: Vec::new(),
    };
    let bytes = converted.unit.clone().into_bytes();
    if let Err(e) =
        crate::unit::load_with(
            &files,
            &input.instance.load_context(),
            |_| Ok(bytes.clone()),
        )
    {
        let text = e.render(crate::unit::Style::Plain);
        let first = text
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        return Err(format!("the unit would not load: {first}"));
    }
    if existing.unit.as_deref() == Some(converted.unit.as_str())
        && existing.env == env_text
        && (input.env_file || existing.holds(name, &converted.secrets))
    {
        return Ok(Placed::Said("unchanged".into()));
    }
    if let Some(unit) = &existing.unit {
        let same_server = if input.env_file {
            convert::same_server(converted, unit, existing.env.as_deref())
        } else {
            let without = Imported {
                secrets: Vec::new(),
                ..converted.clone()
            };
            convert::same_server(&without, unit, None) && existing.holds(name, &converted.secrets)
        };
        if same_server {
            // Another host's entry of the same server was imported.
            return Ok(Placed::Said(
                "merged: the same server as the unit there".into(),
            ));
        }
    }
    if existing.unit.is_some() && !input.force {
        return Ok(Placed::Said(format!(
            "skipped: {} exists (--force replaces it)",
            unit_path.display()
        )));
    }
    // Each secret with the rule that moved it.
    let why: Vec<String> = converted
        .secrets
        .iter()
        .zip(&converted.because)
        .map(|((k, _), why)| format!("{k}: {why}"))
        .collect();
    let kept = if input.env_file {
        format!("{name}.env")
    } else {
        format!("the credstore as {name}.*")
    };
    let secrets = match converted.secrets.len() {
        0 => String::new(),
        1 => format!(", 1 secret in {kept} ({})", why.join("; ")),
        n => format!(", {n} secrets in {kept} ({})", why.join("; ")),
    };
    if input.dry_run {
        return Ok(Placed::Said(format!("would import{secrets}")));
    }
    let credentials = if input.env_file {
        Vec::new()
    } else {
        converted
            .secrets
            .iter()
            .map(|(var, value)| (format!("{name}.{var}"), value.as_bytes().to_vec()))
            .collect()
    };
    let stale = existing
        .credentials
        .iter()
        .map(|(file, _)| file.clone())
        .filter(|file| {
            let var = file.strip_prefix(&format!("{name}.")).unwrap_or_default();
            input.env_file || !converted.secrets.iter().any(|(k, _)| k == var)
        })
        .collect();
    Ok(Placed::Write(Placement {
        row: 0,
        prefix: String::new(),
        env: (env_path, env_text),
        credentials,
        stale,
        unit: (unit_path, converted.unit.clone()),
        done: format!("imported{secrets}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup_none() -> (
        impl Fn(&str) -> Option<String>,
        impl Fn(&Path) -> Option<String>,
    ) {
        (|_: &str| None, |_: &Path| None)
    }

    fn source(host: Host, text: &str) -> Source {
        Source {
            host,
            path: PathBuf::from(format!("/home/u/{}.json", host.name())),
            text: Ok(text.to_owned()),
            base: PathBuf::from("/home/u"),
            context: false,
        }
    }

    fn run(sources: Vec<Source>, existing: &dyn Fn(&str) -> Existing, force: bool) -> ImportPlan {
        let (var, file) = lookup_none();
        let home = PathBuf::from("/home/u");
        let lookup = Lookup {
            var: &var,
            file: &file,
            home: &home,
        };
        import(ImportInput {
            sources,
            only: &[],
            dry_run: false,
            force,
            env_file: false,
            units: Path::new("/home/u/.config/mcpd/units"),
            instance: Instance::User,
            lookup: &lookup,
            existing,
        })
    }

    const PARIS: &str = r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Europe/Paris"]}}}"#;
    const TOKYO: &str = r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Asia/Tokyo"]}}}"#;

    #[test]
    fn one_host_at_a_time_names_units_as_every_host_at_once_whatever_the_order() {
        let claude = r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Europe/Paris"]}, "both": {"command": "both-server"}}}"#;
        let gemini = r#"{"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone", "Asia/Tokyo"]}, "both": {"command": "both-server"}}}"#;
        // One host imported, the other read for naming, with what earlier
        // runs wrote on disk: its rows and what it wrote.
        let one = |host: Host,
                   text: &str,
                   other: Host,
                   other_text: &str,
                   disk: &BTreeMap<String, String>| {
            let mut context = source(other, other_text);
            context.context = true;
            let existing = |name: &str| Existing {
                unit: disk.get(name).cloned(),
                ..Existing::default()
            };
            let plan = run(vec![source(host, text), context], &existing, false);
            let rows: Vec<(String, String, String)> = plan
                .rows
                .iter()
                .map(|r| (r.host.clone(), r.entry.clone(), r.unit.clone()))
                .collect();
            let written: Vec<(String, String)> = plan
                .writes
                .iter()
                .map(|w| {
                    (
                        w.unit
                            .0
                            .file_stem()
                            .expect("a name")
                            .to_string_lossy()
                            .into_owned(),
                        w.unit.1.clone(),
                    )
                })
                .collect();
            (rows, written)
        };
        let all = run(
            vec![
                source(Host::ClaudeCode, claude),
                source(Host::Gemini, gemini),
            ],
            &|_| Existing::default(),
            false,
        );
        let mut expected: Vec<(String, String, String)> = all
            .rows
            .iter()
            .map(|r| (r.host.clone(), r.entry.clone(), r.unit.clone()))
            .collect();
        expected.sort();
        let units: Vec<&str> = expected.iter().map(|r| r.2.as_str()).collect();
        assert_eq!(
            units,
            ["both.kdl", "time.kdl", "both.kdl", "time-gemini.kdl"],
            "{expected:?}"
        );
        // Claude Code then Gemini, and Gemini then Claude Code: the same
        // units, each entry paired with the same one.
        let hosts = [(Host::ClaudeCode, claude), (Host::Gemini, gemini)];
        for order in [[0, 1], [1, 0]] {
            let mut disk = BTreeMap::new();
            let mut rows = Vec::new();
            for i in order {
                let ((host, text), (other, other_text)) = (hosts[i], hosts[1 - i]);
                let (said, written) = one(host, text, other, other_text, &disk);
                rows.extend(said);
                disk.extend(written);
            }
            rows.sort();
            assert_eq!(rows, expected, "order {order:?}");
            let names: Vec<&str> = disk.keys().map(String::as_str).collect();
            assert_eq!(names, ["both", "time", "time-gemini"], "order {order:?}");
        }
        // Only the host imported is written (its share of a server both
        // have too).
        let mut context = source(Host::ClaudeCode, claude);
        context.context = true;
        let plan = run(
            vec![source(Host::Gemini, gemini), context],
            &|_| Existing::default(),
            false,
        );
        let written: Vec<String> = plan
            .writes
            .iter()
            .map(|w| w.unit.0.display().to_string())
            .collect();
        assert_eq!(
            written,
            [
                "/home/u/.config/mcpd/units/both.kdl",
                "/home/u/.config/mcpd/units/time-gemini.kdl"
            ],
            "{:?}",
            plan.rows
        );
    }

    #[test]
    fn the_same_server_twice_is_merged_and_a_different_one_renamed() {
        let plan = run(
            vec![
                source(Host::ClaudeDesktop, PARIS),
                source(Host::Cursor, PARIS),
                source(Host::Gemini, TOKYO),
            ],
            &|_| Existing::default(),
            false,
        );
        let results: Vec<(&str, &str, &str)> = plan
            .rows
            .iter()
            .map(|r| (r.host.as_str(), r.unit.as_str(), r.result.as_str()))
            .collect();
        assert_eq!(
            results,
            [
                ("claude-desktop", "time.kdl", "imported"),
                (
                    "cursor",
                    "time.kdl",
                    "merged: the same server as claude-desktop's"
                ),
                (
                    "gemini",
                    "time-gemini.kdl",
                    "renamed: time is claude-desktop's, a different server; imported"
                ),
            ]
        );
        let written: Vec<&Path> = plan.writes.iter().map(|w| w.unit.0.as_path()).collect();
        assert_eq!(
            written,
            [
                Path::new("/home/u/.config/mcpd/units/time.kdl"),
                Path::new("/home/u/.config/mcpd/units/time-gemini.kdl")
            ]
        );
        assert!(plan.writes[1].unit.1.contains("Asia/Tokyo"));
        assert_eq!(plan.writes[1].row, 2);
        assert_eq!(
            plan.writes[1].prefix,
            "renamed: time is claude-desktop's, a different server; "
        );
    }

    #[test]
    fn an_existing_unit_is_unchanged_skipped_or_replaced_with_force() {
        let first = run(
            vec![source(Host::ClaudeDesktop, PARIS)],
            &|_| Existing::default(),
            false,
        );
        let text = first.writes[0].unit.1.clone();
        let same = Existing {
            unit: Some(text),
            ..Existing::default()
        };
        let plan = run(
            vec![source(Host::ClaudeDesktop, PARIS)],
            &|_| same.clone(),
            false,
        );
        assert_eq!(plan.rows[0].result, "unchanged");
        assert!(plan.writes.is_empty());
        let other = Existing {
            unit: Some("stdio { command \"other\"; }\n".into()),
            env: None,
            credentials: vec![("time.OLD".into(), b"x".to_vec())],
        };
        let plan = run(
            vec![source(Host::ClaudeDesktop, PARIS)],
            &|_| other.clone(),
            false,
        );
        assert!(
            plan.rows[0].result.starts_with("skipped: ") && plan.rows[0].result.contains("--force"),
            "{:?}",
            plan.rows
        );
        assert!(plan.writes.is_empty());
        let plan = run(
            vec![source(Host::ClaudeDesktop, PARIS)],
            &|_| other.clone(),
            true,
        );
        assert_eq!(plan.rows[0].result, "imported");
        // The credential the replaced unit had goes with it.
        assert_eq!(plan.writes[0].stale, ["time.OLD"]);
    }

    #[test]
    fn an_unreadable_or_broken_file_is_one_failed_row_naming_it() {
        let mut unreadable = source(Host::Cursor, "");
        unreadable.text = Err("permission denied".into());
        let plan = run(
            vec![unreadable, source(Host::ClaudeDesktop, "{ not json")],
            &|_| Existing::default(),
            false,
        );
        assert_eq!(plan.rows.len(), 2);
        assert!(plan.rows.iter().all(|r| r.failed));
        assert_eq!(
            plan.rows[0].result,
            "failed: /home/u/cursor.json: permission denied"
        );
        assert!(
            plan.rows[1]
                .result
                .starts_with("failed: /home/u/claude-desktop.json:1:"),
            "{:?}",
            plan.rows[1]
        );
        assert!(plan.writes.is_empty());
    }
}
