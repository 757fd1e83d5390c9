//! The on-demand cache (DESIGN §9): what an on-demand unit's last
//! established generation said — its `initialize` result, its tools (before
//! the unit's filter), resources, resource templates and prompts — so that
//! while no process runs, and after a daemon restart, hosts and D-Bus are
//! answered without starting it.
//!
//! One file per unit, `STATE/cache/NAME.json` (mode 0600, in a 0700
//! directory), written atomically. It is valid only for the transport it
//! was made with (the key is a hash of the transport and the roots, which
//! are part of `initialize`): a changed command finds no cache and learns
//! the lists again. A file that cannot be read or parsed is an error for
//! the caller to warn about, never a crash.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use serde_json::value::RawValue;

use crate::unit::UnitSpec;

use super::machine::{Cached, ToolList};
use crate::mux::lists::List as Kind;

/// The format's version: a file of another version is not read.
const VERSION: u64 = 1;

/// The cache file of one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheFile {
    path: PathBuf,
    key: String,
}

/// What a valid cache file holds.
#[derive(Debug, Clone)]
pub struct Restored {
    pub init: Arc<Value>,
    /// The tools and instructions, for the machine.
    pub cached: Cached,
    /// The resource, template and prompt lists (as [`Kind::KEPT`]), as
    /// JSON arrays; None where the server offered none.
    pub lists: [Option<Arc<str>>; 3],
    /// [`digest`] of the file: what [`CacheFile::render`] gives for the
    /// same state, so an unchanged state is not written again.
    pub digest: u64,
}

/// A digest of a cache file's text (FNV-1a), to tell whether a state was
/// written already without keeping its text.
pub fn digest(text: &str) -> u64 {
    fnv(text.as_bytes())
}

/// FNV-1a, 64 bits: stable across builds and machines.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl CacheFile {
    /// Unit `name`'s cache in `dir` (`STATE/cache`), for `spec`'s transport.
    pub fn new(dir: &Path, name: &str, spec: &UnitSpec) -> Self {
        // Debug of the transport names every setting that decides which
        // server runs (command, arguments, environment, files, user, URL;
        // header values redacted), and the roots are declared to it.
        let what = format!("{:?}\n{:?}", spec.transport(), spec.roots());
        Self {
            path: dir.join(format!("{name}.json")),
            key: format!("{:016x}", fnv(what.as_bytes())),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text for this state: `init` (the server's `initialize`
    /// result), its `tools` and the three lists.
    pub fn render(&self, init: &Value, tools: &ToolList, lists: &[Option<Arc<str>>; 3]) -> String {
        let list = |l: &Option<Arc<str>>| l.as_deref().unwrap_or("null").to_owned();
        format!(
            "{{\"version\":{VERSION},\"key\":\"{}\",\"initialize\":{init},\"tools\":{},\"{}\":{},\"{}\":{},\"{}\":{}}}\n",
            self.key,
            tools.json(),
            Kind::Resources.key(),
            list(&lists[0]),
            Kind::Templates.key(),
            list(&lists[1]),
            Kind::Prompts.key(),
            list(&lists[2]),
        )
    }

    /// Writes `text` (from [`render`](Self::render)); makes the directory
    /// (0700) if needed.
    pub fn store(&self, text: &str) -> Result<(), String> {
        if let Some(dir) = self.path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        crate::files::write_atomically(&self.path, text.as_bytes(), 0o600)
    }

    /// The cached state, if the file exists and is for this transport;
    /// an error names the file and what is wrong with it.
    pub fn load(&self) -> Result<Option<Restored>, String> {
        let text = match std::fs::read(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", self.path.display())),
        };
        let bad = |why: &str| format!("{} is not a valid cache: {why}", self.path.display());
        // Borrowed raw pieces: the lists are kept as the text they are,
        // never built into a tree only to be printed again.
        #[derive(serde::Deserialize)]
        struct File<'a> {
            version: u64,
            #[serde(borrow)]
            key: &'a str,
            #[serde(borrow)]
            initialize: &'a RawValue,
            #[serde(borrow)]
            tools: &'a RawValue,
            #[serde(borrow, default)]
            resources: Option<&'a RawValue>,
            #[serde(borrow, default, rename = "resourceTemplates")]
            templates: Option<&'a RawValue>,
            #[serde(borrow, default)]
            prompts: Option<&'a RawValue>,
        }
        let text = std::str::from_utf8(&text).map_err(|e| bad(&e.to_string()))?;
        let file: File<'_> = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
        if file.version != VERSION {
            return Err(bad("it is of another version"));
        }
        if file.key != self.key {
            // Written for another command: not this server's lists.
            return Ok(None);
        }
        let init: Value = match serde_json::from_str(file.initialize.get()) {
            Ok(init @ Value::Object(_)) => init,
            _ => return Err(bad("no initialize result")),
        };
        let tools = ToolList::from_json(file.tools.get()).ok_or_else(|| bad("no tools array"))?;
        let mut lists: [Option<Arc<str>>; 3] = Default::default();
        let raw = [file.resources, file.templates, file.prompts];
        for ((slot, kind), raw) in lists.iter_mut().zip(Kind::KEPT).zip(raw) {
            *slot = match raw.map(RawValue::get) {
                None | Some("null") => None,
                Some(list) if list.starts_with('[') => Some(Arc::from(list)),
                Some(_) => return Err(bad(&format!("{} is not an array", kind.key()))),
            };
        }
        let instructions = init["instructions"].as_str().map(str::to_owned);
        Ok(Some(Restored {
            init: Arc::new(init),
            cached: Cached {
                tools,
                instructions,
            },
            lists,
            digest: digest(text),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(command: &str) -> UnitSpec {
        UnitSpec::new(crate::unit::UnitDraft {
            stdio: Some(crate::unit::spec::StdioDraft {
                command: vec![command.to_owned()],
                ..Default::default()
            }),
            start: Some("on-demand".into()),
            ..Default::default()
        })
        .expect("ok")
    }

    #[test]
    fn a_stored_cache_loads_back_only_for_the_same_transport() {
        let dir = tempfile::tempdir().expect("ok");
        let file = CacheFile::new(dir.path(), "x", &spec("/bin/a"));
        assert!(file.load().expect("ok").is_none(), "no file yet");
        let init = json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": {"name": "a", "version": "1"}, "instructions": "be nice"});
        let tools = ToolList::from_values(vec![
            json!({"name": "echo", "inputSchema": {"type": "object"}}),
        ]);
        let lists = [
            Some(Arc::from("[{\"name\":\"a\",\"uri\":\"file:///a\"}]")),
            None,
            Some(Arc::from("[]")),
        ];
        file.store(&file.render(&init, &tools, &lists)).expect("ok");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file.path())
            .expect("ok")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let back = file.load().expect("ok").expect("cached");
        assert_eq!(*back.init, init);
        assert_eq!(back.cached.tools, tools);
        assert_eq!(back.cached.instructions.as_deref(), Some("be nice"));
        assert_eq!(back.lists, lists);
        assert_eq!(
            back.digest,
            digest(&file.render(&init, &tools, &lists)),
            "rendering what was read gives the file back"
        );
        // Another command: the same name finds nothing.
        let other = CacheFile::new(dir.path(), "x", &spec("/bin/b"));
        assert_eq!(other.path(), file.path());
        assert!(other.load().expect("ok").is_none());
    }

    #[test]
    fn a_corrupt_cache_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("ok");
        let file = CacheFile::new(dir.path(), "x", &spec("/bin/a"));
        for text in [
            "{\"version\":1,\"key\":",
            "[]",
            "{\"version\":9}",
            "\u{0}\u{1}",
        ] {
            std::fs::write(file.path(), text).expect("ok");
            let e = file.load().expect_err("an error");
            assert!(e.contains(&file.path().display().to_string()), "{e}");
        }
        let key = &file.key;
        std::fs::write(
            file.path(),
            format!("{{\"version\":1,\"key\":\"{key}\",\"initialize\":{{}},\"tools\":{{}}}}"),
        )
        .expect("ok");
        assert!(
            file.load()
                .expect_err("an error")
                .contains("no tools array")
        );
    }
}
