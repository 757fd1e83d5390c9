//! One JSON-RPC message as the wire carries it: its text, and where each
//! of its members is in that text.
//!
//! A host session or an upstream passes most messages on with no more
//! than a new `id`, so a message is not parsed into a `serde_json::Value`
//! tree: its top-level members stay JSON text (validated as the line is
//! read), what routing looks at (`id`, `method`, sometimes `params`) is
//! parsed when asked for, and a member set anew replaces just its text.
//! Writing a message out copies the members' text. Building, dropping and
//! writing `Value` trees was a third of the daemon's instructions per
//! bridged `tools/call`; with `Message` the total fell from 63,700 to
//! 55,000 (`bench/instructions.py`), and a large result costs one
//! validating scan and a copy.
//!
//! Members keep their order, unknown ones included; of a key that
//! appears twice only the last value is kept (as in a `Value`), so mcpd
//! and the server it writes to read the same message.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer as _, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON-RPC message: a JSON object, its members as text (`{}` by
/// default).
#[derive(Clone, Default)]
pub struct Message {
    /// The text the message was read from (empty for one made here).
    text: Box<str>,
    members: Vec<Member>,
}

#[derive(Clone)]
struct Member {
    /// The key, unescaped: a span of `text` (between its quotes) when it
    /// held no escapes, else its own.
    key: Text,
    /// The value's JSON text.
    value: Text,
}

#[derive(Clone)]
enum Text {
    Span(u32, u32),
    Own(Box<str>),
}

impl Text {
    /// The text, of a message read from `text`.
    fn get<'a>(&'a self, text: &'a str) -> &'a str {
        match self {
            Text::Span(start, end) => &text[*start as usize..*end as usize],
            Text::Own(own) => own,
        }
    }
}

/// Why a line is not a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAMessage {
    /// A JSON array.
    Batch,
    /// JSON, but not an object.
    NotAnObject,
    /// Not JSON: serde_json's words.
    NotJson(String),
}

impl fmt::Display for NotAMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotAMessage::Batch => {
                f.write_str("JSON-RPC batches are not part of MCP (since 2025-06-18)")
            }
            NotAMessage::NotAnObject => f.write_str("expected a JSON-RPC message object"),
            NotAMessage::NotJson(why) => write!(f, "not JSON: {why}"),
        }
    }
}

impl Message {
    /// Parses one line (a JSON object; whitespace around it is fine).
    pub fn parse(line: &[u8]) -> Result<Self, NotAMessage> {
        let members = std::str::from_utf8(line)
            .ok()
            .filter(|text| text.trim_start().starts_with('{'))
            .and_then(|text| {
                let text: Box<str> = text.into();
                let members = members(&text).ok()?;
                Some(Self { text, members })
            });
        members.ok_or_else(|| why_not(line))
    }

    fn text<'a>(&'a self, text: &'a Text) -> &'a str {
        text.get(&self.text)
    }

    fn member(&self, key: &str) -> Option<&Member> {
        self.members.iter().find(|m| self.text(&m.key) == key)
    }

    /// Whether the message has a member `key`.
    pub fn has(&self, key: &str) -> bool {
        self.member(key).is_some()
    }

    /// The JSON text of member `key`.
    pub fn raw(&self, key: &str) -> Option<&str> {
        self.member(key).map(|m| self.text(&m.value))
    }

    /// Member `key` as a `T`; `None` if absent or not a `T`.
    pub fn get<'a, T: Deserialize<'a>>(&'a self, key: &str) -> Option<T> {
        serde_json::from_str(self.raw(key)?).ok()
    }

    /// The `id`, if there is one (`null` included).
    pub fn id(&self) -> Option<Value> {
        self.get("id")
    }

    /// The `id` as serde_json writes it (`id().to_string()`), without
    /// parsing it when its text already is that (an integer, a string
    /// without escapes); `None` if it is absent or `null`.
    pub fn id_text(&self) -> Option<Cow<'_, str>> {
        let raw = self.raw("id")?;
        let plain_integer = {
            let digits = raw.strip_prefix('-').unwrap_or(raw);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        };
        let plain_string =
            raw.len() >= 2 && raw.starts_with('"') && raw.ends_with('"') && !raw.contains('\\');
        if plain_integer || plain_string {
            return Some(Cow::Borrowed(raw));
        }
        self.id()
            .filter(|id| !id.is_null())
            .map(|id| Cow::Owned(id.to_string()))
    }

    /// The `method`, if it is a string.
    pub fn method(&self) -> Option<Cow<'_, str>> {
        let raw = self.raw("method")?;
        match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
            Some(plain) if !plain.contains('\\') => Some(Cow::Borrowed(plain)),
            _ => self.get::<String>("method").map(Cow::Owned),
        }
    }

    /// The `params`, parsed.
    pub fn params(&self) -> Option<Value> {
        self.get("params")
    }

    /// Whether member `key` may hold a member named `name` at any depth:
    /// a quick test before parsing it. Its text holds the name, or a
    /// `\u` escape that could spell it (only such an escape can spell a
    /// letter).
    pub fn may_hold(&self, key: &str, name: &str) -> bool {
        self.raw(key).is_some_and(|raw| {
            let find = |word: &str| memchr::memmem::find(raw.as_bytes(), word.as_bytes());
            find(name).is_some() || find("\\u").is_some()
        })
    }

    /// Sets member `key` to `value`: in its place if it is there, else
    /// last.
    pub fn set(&mut self, key: &str, value: &impl Serialize) {
        // Ids, tokens and params serialize.
        let text: Box<str> = serde_json::to_string(value)
            .unwrap_or_else(|_| "null".into())
            .into();
        let at = self.members.iter().position(|m| self.text(&m.key) == key);
        match at {
            Some(i) => self.members[i].value = Text::Own(text),
            None => self.members.push(Member {
                key: Text::Own(key.into()),
                value: Text::Own(text),
            }),
        }
    }

    /// The message as one line, newline included.
    pub fn line(&self) -> Vec<u8> {
        let size: usize = self
            .members
            .iter()
            .map(|m| self.text(&m.key).len() + self.text(&m.value).len() + 4)
            .sum();
        let mut out = Vec::with_capacity(size + 3);
        out.push(b'{');
        for (i, m) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match &m.key {
                // Read without escapes: written as it was.
                Text::Span(..) => {
                    out.push(b'"');
                    out.extend_from_slice(self.text(&m.key).as_bytes());
                    out.push(b'"');
                }
                // A string always serializes.
                Text::Own(key) => {
                    let _ = serde_json::to_writer(&mut out, key);
                }
            }
            out.push(b':');
            out.extend_from_slice(self.text(&m.value).as_bytes());
        }
        out.extend_from_slice(b"}\n");
        out
    }

    /// The message as a `Value` (for what needs all of it).
    pub fn to_value(&self) -> Value {
        let mut map = serde_json::Map::new();
        for m in &self.members {
            // Every member's text was read as JSON, or serialized.
            let value = serde_json::from_str(self.text(&m.value)).unwrap_or(Value::Null);
            map.insert(self.text(&m.key).to_owned(), value);
        }
        Value::Object(map)
    }
}

/// A `Value` object as a message (anything else: an empty one; mcpd
/// makes only objects).
impl From<Value> for Message {
    fn from(value: Value) -> Self {
        debug_assert!(value.is_object(), "a message is an object: {value}");
        let members = match value {
            Value::Object(map) => map
                .into_iter()
                .map(|(key, value)| Member {
                    key: Text::Own(key.into()),
                    value: Text::Own(value.to_string().into()),
                })
                .collect(),
            _ => Vec::new(),
        };
        Self {
            text: Box::default(),
            members,
        }
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.to_value() == other.to_value()
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = self.line();
        f.write_str(String::from_utf8_lossy(&line[..line.len() - 1]).as_ref())
    }
}

/// Why `line` is not a message, in serde_json's words where it is not
/// JSON (the slow path: lines that are not messages are rare).
fn why_not(line: &[u8]) -> NotAMessage {
    match serde_json::from_slice::<Value>(line) {
        Ok(Value::Array(_)) => NotAMessage::Batch,
        Ok(_) => NotAMessage::NotAnObject,
        Err(e) => NotAMessage::NotJson(e.to_string()),
    }
}

/// The members of the JSON object `text`, as spans of it.
fn members(text: &str) -> Result<Vec<Member>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let members = (&mut de).deserialize_map(Members { text })?;
    de.end()?;
    Ok(members)
}

struct Members<'t> {
    text: &'t str,
}

impl Members<'_> {
    /// Where `part` (borrowed from the text) is in it.
    fn span(&self, part: &str) -> Text {
        let start = part.as_ptr() as usize - self.text.as_ptr() as usize;
        // Lines are at most 16 MiB (wire::MAX_LINE).
        Text::Span(start as u32, (start + part.len()) as u32)
    }
}

impl<'de> Visitor<'de> for Members<'de> {
    type Value = Vec<Member>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC message object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::with_capacity(4);
        while let Some(key) = map.next_key_seed(Key)? {
            let value: &'de RawValue = map.next_value()?;
            // A repeated key: the last value counts (and is kept alone).
            let text = self.text;
            members.retain(|m: &Member| m.key.get(text) != key);
            let key = match key {
                Cow::Borrowed(key) => self.span(key),
                Cow::Owned(key) => Text::Own(key.into()),
            };
            members.push(Member {
                key,
                value: self.span(value.get()),
            });
        }
        Ok(members)
    }
}

/// A key, borrowed from the text when it holds no escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(key))
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(key.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(text: &str) -> Message {
        Message::parse(text.as_bytes()).expect("a message")
    }

    #[test]
    fn id_text_is_what_serde_json_writes_for_the_id() {
        for (id, text) in [
            ("7", Some("7")),
            ("-12", Some("-12")),
            ("\"req-1\"", Some("\"req-1\"")),
            ("\"caf\u{e9}\"", Some("\"caf\u{e9}\"")),
            ("\"a\\u0041\"", Some("\"aA\"")),
            ("\"tab\\t\"", Some("\"tab\\t\"")),
            ("1.50", Some("1.5")),
            ("1e2", Some("100.0")),
            ("null", None),
        ] {
            let m = parse(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}"
            ));
            assert_eq!(m.id_text().as_deref(), text, "{id}");
            if let Some(text) = text {
                assert_eq!(m.id().expect("id").to_string(), text, "{id}");
            }
        }
        assert_eq!(parse(r#"{"jsonrpc":"2.0","method":"x"}"#).id_text(), None);
    }

    #[test]
    fn members_are_read_as_text_and_parsed_when_asked() {
        let m = parse(
            r#" {"jsonrpc":"2.0", "id": 7 ,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a\"b"}},"x-extra":[1, 2]}
"#,
        );
        assert_eq!(m.id(), Some(json!(7)));
        assert_eq!(m.method().as_deref(), Some("tools/call"));
        assert!(matches!(m.method(), Some(Cow::Borrowed(_))));
        assert_eq!(m.raw("x-extra"), Some("[1, 2]"));
        assert_eq!(m.params().expect("params")["arguments"]["text"], "a\"b");
        assert!(m.may_hold("params", "arguments") && !m.may_hold("params", "progressToken"));
        assert!(
            parse(r#"{"params":{"progress\u0054oken":1}}"#).may_hold("params", "progressToken")
        );
        assert!(m.has("jsonrpc") && !m.has("result"));
        // Written out member by member, as read.
        assert_eq!(
            m.line(),
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"a\\\"b\"}},\"x-extra\":[1, 2]}\n"
        );
        assert_eq!(
            m.to_value(),
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"text": "a\"b"}}, "x-extra": [1, 2]})
        );
    }

    #[test]
    fn a_member_set_replaces_its_text_in_place_or_comes_last() {
        let mut m = parse(r#"{"jsonrpc":"2.0","id":"x-1","result":{"ok":true}}"#);
        m.set("id", &42);
        assert_eq!(
            m.line(),
            b"{\"jsonrpc\":\"2.0\",\"id\":42,\"result\":{\"ok\":true}}\n"
        );
        m.set("params", &json!({"a": "é\u{1b}"}));
        assert_eq!(
            m.to_value(),
            json!({"jsonrpc": "2.0", "id": 42, "result": {"ok": true}, "params": {"a": "é\u{1b}"}})
        );
        assert_eq!(m, Message::from(m.to_value()));
    }

    #[test]
    fn escaped_keys_and_methods_and_repeated_keys_read_as_a_value_reads_them() {
        let mut m = parse(r#"{"\u0069d":1,"method":"a\/b","id":2,"k\"q":0,"method":"c"}"#);
        assert_eq!(m.id(), Some(json!(2)), "the last occurrence counts");
        assert_eq!(m.method().as_deref(), Some("c"));
        assert_eq!(m.to_value(), json!({"id": 2, "method": "c", "k\"q": 0}));
        assert_eq!(
            m.line(),
            b"{\"id\":2,\"k\\\"q\":0,\"method\":\"c\"}\n",
            "written once, as the last"
        );
        m.set("id", &3);
        assert_eq!(m.to_value(), json!({"id": 3, "method": "c", "k\"q": 0}));
        assert_eq!(
            parse(r#"{"method":"a\/b"}"#).method().as_deref(),
            Some("a/b")
        );
        let line = m.line();
        assert_eq!(
            serde_json::from_slice::<Value>(&line).expect("JSON"),
            json!({"id": 3, "method": "c", "k\"q": 0}),
            "{}",
            String::from_utf8_lossy(&line)
        );
        assert_eq!(parse(r#"{"id":null}"#).id(), Some(Value::Null));
        assert_eq!(parse(r#"{"method":5}"#).method(), None);
    }

    #[test]
    fn lines_that_are_not_messages_say_why() {
        let why = |text: &[u8]| Message::parse(text).expect_err("not a message");
        assert_eq!(why(b"[1]"), NotAMessage::Batch);
        assert_eq!(why(b"\"x\""), NotAMessage::NotAnObject);
        assert_eq!(why(b"  42 "), NotAMessage::NotAnObject);
        for bad in [
            &b"{"[..],
            b"{\"a\":}",
            b"{\"a\":1}x",
            b"{\"a\":\"\xff\"}",
            b"{\"a\":\"\\q\"}",
            b"{\"a\":[1,}",
            b"not json",
        ] {
            let NotAMessage::NotJson(text) = why(bad) else {
                panic!("{bad:?} is not JSON");
            };
            assert!(text.contains("line 1"), "{text}");
        }
    }
}
