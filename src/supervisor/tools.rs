//! A published tool list, kept compact.
//!
//! A daemon holds one list per server for the server's whole life, and a
//! parsed list is mostly JSON Schema trees: serde_json maps cost several
//! times their text (about 2 KiB per small tool, tens of KiB for a large
//! server). So the list is kept as its JSON text plus the tool names (for
//! the per-call "has no tool" check), and parsed only when a client asks
//! for the tools themselves.

use std::fmt;
use std::sync::Arc;

use rmcp::model::Tool;

/// The tools a generation published; cheap to clone, empty without an
/// allocation. Equal lists have equal JSON.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ToolList(Option<Arc<Compact>>);

#[derive(PartialEq, Eq)]
struct Compact {
    names: Box<[Box<str>]>,
    /// A JSON array of MCP `Tool` objects.
    json: Box<str>,
}

impl ToolList {
    /// Keeps `tools` as JSON; `tools` itself is dropped by the caller.
    pub fn new(tools: &[Tool]) -> Self {
        if tools.is_empty() {
            return Self(None);
        }
        // `Tool`s are JSON values with string keys: serializing cannot fail.
        let json = serde_json::to_string(tools).expect("tools serialize to JSON");
        let names = tools.iter().map(|t| Box::from(t.name.as_ref())).collect();
        Self(Some(Arc::new(Compact {
            names,
            json: json.into_boxed_str(),
        })))
    }

    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |c| c.names.len())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The tool names, in the server's order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .flat_map(|c| c.names.iter().map(AsRef::as_ref))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names().any(|n| n == name)
    }

    /// The list as a JSON array of MCP `Tool` objects (`[]` when empty).
    pub fn json(&self) -> &str {
        self.0.as_ref().map_or("[]", |c| &c.json)
    }

    /// The tools `keep` accepts by name; the same list (shared, not copied)
    /// when it accepts them all.
    pub fn filtered(&self, keep: impl Fn(&str) -> bool) -> ToolList {
        if self.names().all(&keep) {
            return self.clone();
        }
        let kept: Vec<Tool> = self.tools().into_iter().filter(|t| keep(&t.name)).collect();
        ToolList::new(&kept)
    }

    /// The tools, parsed again.
    pub fn tools(&self) -> Vec<Tool> {
        // The JSON was written from `Tool`s by `new`, so it reads back; a
        // D-Bus getter must not panic if rmcp ever disagrees with itself.
        serde_json::from_str(self.json()).unwrap_or_else(|e| {
            tracing::error!(target: "mcpd::supervisor", "a published tool list does not read back: {e}");
            Vec::new()
        })
    }
}

impl From<Vec<Tool>> for ToolList {
    fn from(tools: Vec<Tool>) -> Self {
        Self::new(&tools)
    }
}

impl fmt::Debug for ToolList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Tool {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"text": {"type": "string", "description": "what to say"}},
            "required": ["text"],
        });
        let serde_json::Value::Object(schema) = schema else {
            unreachable!()
        };
        Tool::new(name.to_owned(), format!("{name} tool"), Arc::new(schema))
    }

    #[test]
    fn keeps_names_order_and_reads_back() {
        let tools = vec![tool("b"), tool("a")];
        let list = ToolList::new(&tools);
        assert_eq!(list.len(), 2);
        assert_eq!(list.names().collect::<Vec<_>>(), ["b", "a"]);
        assert!(list.contains("a") && !list.contains("c"));
        assert_eq!(list.tools(), tools);
        assert_eq!(format!("{list:?}"), r#"["b", "a"]"#);
    }

    #[test]
    fn filtering_keeps_order_and_shares_an_unchanged_list() {
        let list = ToolList::new(&[tool("read_a"), tool("delete_b"), tool("read_c")]);
        let kept = list.filtered(|n| n.starts_with("read_"));
        assert_eq!(kept.names().collect::<Vec<_>>(), ["read_a", "read_c"]);
        assert_eq!(kept.tools()[1], tool("read_c"));
        let all = list.filtered(|_| true);
        assert_eq!(all, list);
        assert!(
            all.json().as_ptr() == list.json().as_ptr(),
            "shared, not copied"
        );
        assert!(list.filtered(|_| false).is_empty());
    }

    #[test]
    fn empty_lists_allocate_nothing_and_print_as_an_empty_array() {
        let list = ToolList::new(&[]);
        assert!(list.is_empty());
        assert_eq!(list, ToolList::default());
        assert_eq!(list.json(), "[]");
        assert!(list.tools().is_empty());
    }

    #[test]
    fn equal_tools_make_equal_lists() {
        assert_eq!(ToolList::new(&[tool("a")]), ToolList::new(&[tool("a")]));
        assert_ne!(ToolList::new(&[tool("a")]), ToolList::new(&[tool("b")]));
        let mut changed = tool("a");
        changed.description = Some("other".into());
        assert_ne!(ToolList::new(&[tool("a")]), ToolList::new(&[changed]));
    }
}
