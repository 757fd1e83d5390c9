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
use serde_json::Value;

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
        // `Tool`s are JSON values with string keys: serializing cannot fail.
        Self::from_values(
            tools
                .iter()
                .map(|t| serde_json::to_value(t).expect("tools serialize to JSON"))
                .collect(),
        )
    }

    /// The tools as the server sent them (every field kept, known to mcpd
    /// or not); entries without a string `name` are not tools and are
    /// dropped.
    pub fn from_values(mut tools: Vec<Value>) -> Self {
        tools.retain(|t| t.get("name").is_some_and(Value::is_string));
        if tools.is_empty() {
            return Self(None);
        }
        let names = tools
            .iter()
            .map(|t| Box::from(t["name"].as_str().unwrap_or_default()))
            .collect();
        let json = Value::Array(tools).to_string();
        Self(Some(Arc::new(Compact {
            names,
            json: json.into_boxed_str(),
        })))
    }

    /// A list from its JSON text as [`json`](Self::json) wrote it (an
    /// on-demand unit's cache), keeping the text itself: only the names
    /// are read, no schema tree is built. None when the text is not an
    /// array of tools each with a string `name`.
    pub fn from_json(text: &str) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct Named<'a> {
            #[serde(borrow)]
            name: std::borrow::Cow<'a, str>,
        }
        let named: Vec<Named<'_>> = serde_json::from_str(text).ok()?;
        if named.is_empty() {
            return Some(Self(None));
        }
        let names = named
            .into_iter()
            .map(|n| Box::from(n.name.as_ref()))
            .collect();
        Some(Self(Some(Arc::new(Compact {
            names,
            json: Box::from(text),
        }))))
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
        let mut kept = self.values();
        kept.retain(|t| keep(t["name"].as_str().unwrap_or_default()));
        ToolList::from_values(kept)
    }

    /// The tools as JSON values, parsed again.
    pub fn values(&self) -> Vec<Value> {
        // Written by `from_values` from an array: it reads back.
        serde_json::from_str(self.json()).unwrap_or_default()
    }

    /// The tools in rmcp's model (for D-Bus); a tool rmcp cannot read is
    /// left out, and logged.
    pub fn tools(&self) -> Vec<Tool> {
        self.values()
            .into_iter()
            .filter_map(|t| match serde_json::from_value::<Tool>(t) {
                Ok(tool) => Some(tool),
                Err(e) => {
                    tracing::warn!(target: "mcpd::supervisor", "a tool the server listed does not fit the MCP schema: {e}");
                    None
                }
            })
            .collect()
    }
}

impl From<Vec<Value>> for ToolList {
    fn from(tools: Vec<Value>) -> Self {
        Self::from_values(tools)
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
    fn fields_mcpd_does_not_know_are_kept_and_nameless_entries_dropped() {
        let list = ToolList::from_values(vec![
            serde_json::json!({"name": "a", "inputSchema": {"type": "object"}, "x-future": [1, 2]}),
            serde_json::json!({"description": "no name"}),
        ]);
        assert_eq!(list.len(), 1);
        assert_eq!(list.values()[0]["x-future"], serde_json::json!([1, 2]));
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
