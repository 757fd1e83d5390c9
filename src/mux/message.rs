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

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::method::Method;

/// A JSON-RPC message: a JSON object, its members as text (`{}` by
/// default).
#[derive(Clone)]
pub struct Message {
    /// The text the message was read from (empty for one made here):
    /// the buffer the line was read into, kept as it is (no copy).
    text: String,
    members: Vec<Member>,
    /// Where the members routing asks for are ([`KNOWN`]): their index
    /// in `members`, [`ABSENT`] if there is none.
    known: [u8; KNOWN.len()],
    /// A key came more than once in the text read (only its last value
    /// is kept): `mux::shape` refuses such a message from a host.
    repeated: bool,
}

/// The members looked up on every message, many times over.
/// (The members of a JSON-RPC 2.0 message, `jsonrpc` last: routing reads
/// the first five, a host session checks the version and that there is
/// nothing else.)
const KNOWN: [&str; 6] = ["id", "method", "params", "result", "error", "jsonrpc"];

const ABSENT: u8 = u8::MAX;

/// Spare room a message's text may keep of the buffer its line was read
/// into (a first read takes 512 bytes; a long line's buffer grew by
/// doubling).
const SLACK: usize = 4096;

/// The most a thread's buffer for writing lines keeps between them.
const SCRATCH: usize = 64 * 1024;

/// Where `key` is in [`KNOWN`]. Inlined, it folds to a constant for the
/// literal keys routing asks for (a search of `KNOWN` was a call for
/// every lookup, two dozen a bridged call).
/// (A match on the literal keys: their bytes are compared inline, where
/// a comparison with an entry of `KNOWN` is a call of `memcmp`.)
#[inline(always)]
fn known(key: &str) -> Option<usize> {
    match key {
        "id" => Some(0),
        "method" => Some(1),
        "params" => Some(2),
        "result" => Some(3),
        "error" => Some(4),
        "jsonrpc" => Some(5),
        _ => None,
    }
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
    /// A request id's text, shared with the map it was kept in.
    Shared(std::sync::Arc<str>),
    /// An unsigned integer's digits (the ids mcpd gives), kept inline:
    /// the last `.1` bytes of `.0`.
    Digits([u8; 20], u8),
}

impl Text {
    /// The text, of a message read from `text`. (Inlined, as it was
    /// before it had digits to read: every lookup of a member reads it.)
    #[inline(always)]
    fn get<'a>(&'a self, text: &'a str) -> &'a str {
        match self {
            Text::Span(start, end) => &text[*start as usize..*end as usize],
            Text::Own(own) => own,
            Text::Shared(shared) => shared,
            Text::Digits(digits, len) => digits_text(digits, *len),
        }
    }
}

/// The text of the last `len` bytes of `digits` (ASCII).
#[inline(never)]
fn digits_text(digits: &[u8; 20], len: u8) -> &str {
    std::str::from_utf8(&digits[digits.len() - usize::from(len)..]).unwrap_or("0")
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

impl Default for Message {
    fn default() -> Self {
        Self {
            text: String::new(),
            members: Vec::new(),
            known: [ABSENT; KNOWN.len()],
            repeated: false,
        }
    }
}

impl Message {
    fn new(text: String, (members, repeated): (Vec<Member>, bool)) -> Self {
        let mut message = Self {
            text,
            members,
            known: [ABSENT; KNOWN.len()],
            repeated,
        };
        message.index();
        message
    }

    /// Finds the known members anew (the members changed).
    fn index(&mut self) {
        self.known = [ABSENT; KNOWN.len()];
        for (i, m) in self.members.iter().enumerate() {
            if let Some(k) = known(m.key.get(&self.text))
                && let Ok(i) = u8::try_from(i)
                && i != ABSENT
            {
                self.known[k] = i;
            }
        }
    }

    /// Parses one line (a JSON object; whitespace around it is fine).
    pub fn parse(line: &[u8]) -> Result<Self, NotAMessage> {
        let message = std::str::from_utf8(line).ok().and_then(|text| {
            let members = members(text)?;
            Some(Self::new(text.into(), members))
        });
        message.ok_or_else(|| why_not(line))
    }

    /// [`Message::parse`] of a line read into `line`, which the message
    /// keeps as its text (no copy of it; a buffer much larger than its
    /// line is shrunk).
    pub fn parse_owned(line: Vec<u8>) -> Result<Self, NotAMessage> {
        let mut text = match String::from_utf8(line) {
            Ok(text) => text,
            Err(e) => return Err(why_not(e.as_bytes())),
        };
        let Some(members) = members(&text) else {
            return Err(why_not(text.as_bytes()));
        };
        if text.capacity() - text.len() > SLACK {
            text.shrink_to_fit();
        }
        Ok(Self::new(text, members))
    }

    #[inline(always)]
    fn text<'a>(&'a self, text: &'a Text) -> &'a str {
        text.get(&self.text)
    }

    /// [`Message::text`] as bytes (digits without a check of UTF-8).
    #[inline(always)]
    fn bytes<'a>(&'a self, text: &'a Text) -> &'a [u8] {
        match text {
            Text::Digits(digits, len) => &digits[digits.len() - usize::from(*len)..],
            other => other.get(&self.text).as_bytes(),
        }
    }

    /// Where member `key` is.
    #[inline(always)]
    fn position(&self, key: &str) -> Option<usize> {
        if let Some(k) = known(key) {
            let at = self.known[k];
            if at != ABSENT {
                return Some(usize::from(at));
            }
            // Only the first 255 members are indexed.
            if self.members.len() < usize::from(ABSENT) {
                return None;
            }
        }
        self.search(key)
    }

    /// Where member `key` is, found by comparing keys (one routing does
    /// not index, or past the indexed ones).
    #[inline(never)]
    fn search(&self, key: &str) -> Option<usize> {
        self.members.iter().position(|m| self.text(&m.key) == key)
    }

    #[inline(always)]
    fn member(&self, key: &str) -> Option<&Member> {
        self.members.get(self.position(key)?)
    }

    /// The length of the line it was read from, as received (0 for a
    /// message made here).
    pub fn received(&self) -> usize {
        self.text.len()
    }

    /// Whether a key came more than once in the text it was read from
    /// (only the last of its values is kept).
    pub fn repeated(&self) -> bool {
        self.repeated
    }

    /// The text it was read from (empty for one made here).
    pub fn source(&self) -> &str {
        &self.text
    }

    /// Its members' keys and JSON text, in order.
    pub fn members(&self) -> impl Iterator<Item = (&str, &str)> {
        self.members
            .iter()
            .map(|m| (self.text(&m.key), self.text(&m.value)))
    }

    /// Whether the message has a member `key`.
    #[inline(always)]
    pub fn has(&self, key: &str) -> bool {
        self.member(key).is_some()
    }

    /// The JSON text of member `key`.
    #[inline(always)]
    pub fn raw(&self, key: &str) -> Option<&str> {
        self.member(key).map(|m| self.text(&m.value))
    }

    /// Member `key` as a `T`; `None` if absent or not a `T`.
    pub fn get<'a, T: Deserialize<'a>>(&'a self, key: &str) -> Option<T> {
        serde_json::from_str(self.raw(key)?).ok()
    }

    /// The `id`, if there is one (`null` included).
    pub fn id(&self) -> Option<Value> {
        let raw = self.raw("id")?;
        // Integers and strings without escapes (every id mcpd makes, and
        // most hosts') are read without a parser.
        match plain_id(raw) {
            Some(Plain::Integer) => raw
                .parse::<i64>()
                .map(Value::from)
                .or_else(|_| raw.parse::<u64>().map(Value::from))
                .ok(),
            Some(Plain::String) => Some(Value::String(raw[1..raw.len() - 1].to_owned())),
            None => serde_json::from_str(raw).ok(),
        }
    }

    /// The `id` as serde_json writes it (`id().to_string()`), without
    /// parsing it when its text already is that (an integer, a string
    /// without escapes); `None` if it is absent or `null`.
    pub fn id_text(&self) -> Option<Cow<'_, str>> {
        let raw = self.raw("id")?;
        if plain_id(raw).is_some() {
            return Some(Cow::Borrowed(raw));
        }
        self.id()
            .filter(|id| !id.is_null())
            .map(|id| Cow::Owned(id.to_string()))
    }

    /// The request id, read once: `None` if it is absent or `null`.
    pub fn request_id(&self) -> Option<RequestId> {
        self.id_text().map(|text| RequestId(text.into()))
    }

    /// The `method`, if it is a string.
    pub fn method(&self) -> Option<Cow<'_, str>> {
        let raw = self.raw("method")?;
        match raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
            Some(plain) if !plain.contains('\\') => Some(Cow::Borrowed(plain)),
            _ => self.get::<String>("method").map(Cow::Owned),
        }
    }

    /// The `method`, if it is a string, as a [`Method`] ([`Method::Other`]
    /// for one mcpd does not treat specially): read once, then matched.
    pub fn method_kind(&self) -> Option<Method> {
        self.method().map(|name| Method::parse(&name))
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
            // Texts are short and the words rare: one search for a byte
            // of the name (its first capital, rarer in text than its
            // first letter) and for backslashes beats building a
            // substring searcher for each.
            let raw = raw.as_bytes();
            let name = name.as_bytes();
            let pivot = name.iter().position(u8::is_ascii_uppercase).unwrap_or(0);
            let Some(&byte) = name.get(pivot) else {
                return memchr::memmem::find(raw, b"\\u").is_some();
            };
            memchr::memchr2_iter(byte, b'\\', raw).any(|at| {
                if raw[at] == b'\\' {
                    raw.get(at + 1) == Some(&b'u')
                } else {
                    at >= pivot && raw[at - pivot..].starts_with(name)
                }
            })
        })
    }

    /// The JSON text of member `name` of the object member `key` holds
    /// (of a repeated name, the last), found by a scan: `Ok(None)` if
    /// `key` is absent or its object has no `name`; `Err` where only a
    /// parser can tell (not an object, or a key with escapes).
    pub fn inner(&self, key: &str, name: &str) -> Result<Option<&str>, Unsure> {
        let Some(raw) = self.raw(key) else {
            return Ok(None);
        };
        let [found] = inner_members(raw, [name])?;
        Ok(found)
    }

    /// [`Message::inner`] for each of `names` at once (one scan).
    pub fn inners<const N: usize>(
        &self,
        key: &str,
        names: [&str; N],
    ) -> Result<[Option<&str>; N], Unsure> {
        let Some(raw) = self.raw(key) else {
            return Ok([None; N]);
        };
        inner_members(raw, names)
    }

    /// Gives member `name` of the `_meta` object of `params` (a progress
    /// token) the unsigned integer `with` returns for the JSON text it
    /// holds, in the text: the rest of `params` stays as the host wrote
    /// it, where parsing `params` and writing it again cost some 5 µs a
    /// call. `Ok(false)` if there is no such member (`with` is not
    /// called) or `with` returns `None` (nothing is changed). `Err` where
    /// only a parser can tell which member a reader takes: a key with an
    /// escape, `_meta` or `name` given twice, or `params` or `_meta` not
    /// an object.
    pub fn set_meta_number(
        &mut self,
        name: &str,
        with: impl FnOnce(&str) -> Option<u64>,
    ) -> Result<bool, Unsure> {
        let Some(raw) = self.raw("params") else {
            return Ok(false);
        };
        let Some(meta) = only_member(raw, "_meta")? else {
            return Ok(false);
        };
        let Some(token) = only_member(&raw[meta.0..meta.1], name)? else {
            return Ok(false);
        };
        let (start, end) = (meta.0 + token.0, meta.0 + token.1);
        let Some(n) = with(&raw[start..end]) else {
            return Ok(false);
        };
        let mut buf = [0u8; 20];
        let digits = decimal(n, &mut buf);
        // The value's bounds are ASCII (a quote, a bracket, a digit...).
        let mut text = String::with_capacity(raw.len() - (end - start) + digits.len());
        text.push_str(&raw[..start]);
        text.push_str(digits);
        text.push_str(&raw[end..]);
        self.set_json("params", text);
        Ok(true)
    }

    /// Sets member `key` to `value`: in its place if it is there, else
    /// last.
    pub fn set(&mut self, key: &str, value: &impl Serialize) {
        // Ids, tokens and params serialize.
        let text = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
        self.set_json(key, text);
    }

    /// Sets member `key` to the JSON text `json` (the caller's word that
    /// it is JSON: an id's [`id_key`], a number).
    pub fn set_json(&mut self, key: &str, json: String) {
        self.set_text(key, Text::Own(json.into()));
    }

    fn set_text(&mut self, key: &str, text: Text) {
        match self.position(key) {
            Some(i) => self.members[i].value = text,
            None => {
                self.members.push(Member {
                    key: Text::Own(key.into()),
                    value: text,
                });
                self.index();
            }
        }
    }

    /// Sets member `key` to the unsigned integer `n` (no allocation).
    pub fn set_number(&mut self, key: &str, n: u64) {
        let mut digits = [0u8; 20];
        // At most 20 digits.
        let len = write_digits(n, &mut digits) as u8;
        self.set_text(key, Text::Digits(digits, len));
    }

    /// Sets the `id` to `id` (its text shared, not copied).
    pub fn set_id(&mut self, id: RequestId) {
        self.set_text("id", Text::Shared(id.0));
    }

    /// Whether every member is a JSON-RPC 2.0 one (`jsonrpc`, `id`,
    /// `method`, `params`, `result`, `error`): a look at the index, no
    /// key compared.
    pub fn only_json_rpc_members(&self) -> bool {
        let known = self.known.iter().filter(|at| **at != ABSENT).count();
        known == self.members.len()
    }

    /// Keeps only the members whose key `keep` accepts; returns the keys
    /// of those it dropped.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let text = &self.text;
        if self.members.iter().all(|m| keep(m.key.get(text))) {
            return Vec::new();
        }
        let mut dropped = Vec::new();
        self.members.retain(|m| {
            let key = m.key.get(text);
            keep(key) || {
                dropped.push(key.to_owned());
                false
            }
        });
        self.index();
        dropped
    }

    /// The message as one line, newline included.
    pub fn line(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_line(&mut out);
        out
    }

    /// Runs `f` with the message as one line, newline included, made in
    /// a buffer of the thread's that is kept for the next (no allocation
    /// per message written; one over [`SCRATCH`] is let go after).
    pub fn with_line<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        thread_local! {
            static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        LINE.with(|line| match line.try_borrow_mut() {
            Ok(mut buf) => {
                buf.clear();
                self.write_line(&mut buf);
                let r = f(&buf);
                if buf.capacity() > SCRATCH {
                    *buf = Vec::new();
                }
                r
            }
            // Written while another line is (never on the session path).
            Err(_) => f(&self.line()),
        })
    }

    /// Appends the message to `out` as one line, newline included.
    pub fn write_line(&self, out: &mut Vec<u8>) {
        let size: usize = self
            .members
            .iter()
            .map(|m| self.bytes(&m.key).len() + self.bytes(&m.value).len() + 4)
            .sum();
        out.reserve(size + 3);
        out.push(b'{');
        let text = self.text.as_bytes();
        // Members read one after another and written as they were read
        // (`"key":value`, a comma alone between them: how SDKs write) are
        // copied as one run of the text.
        let mut run: Option<(usize, usize)> = None;
        for (i, m) in self.members.iter().enumerate() {
            if let (Text::Span(ks, ke), Text::Span(vs, ve)) = (&m.key, &m.value)
                && *vs == *ke + 2
            {
                // From its key's opening quote to its value's end.
                let (start, end) = (*ks as usize - 1, *ve as usize);
                if let Some((_, run_end)) = &mut run
                    && start == *run_end + 1
                    && text[*run_end] == b','
                {
                    *run_end = end;
                    continue;
                }
                if let Some((s, e)) = run.take() {
                    out.extend_from_slice(&text[s..e]);
                }
                if i > 0 {
                    out.push(b',');
                }
                run = Some((start, end));
                continue;
            }
            if let Some((s, e)) = run.take() {
                out.extend_from_slice(&text[s..e]);
            }
            if i > 0 {
                out.push(b',');
            }
            match &m.key {
                // Read without escapes: written as it was.
                Text::Span(..) => {
                    out.push(b'"');
                    out.extend_from_slice(self.bytes(&m.key));
                    out.push(b'"');
                }
                // A string always serializes.
                Text::Own(key) => {
                    let _ = serde_json::to_writer(&mut *out, key);
                }
                // Keys are never shared, nor digits.
                Text::Shared(_) | Text::Digits(..) => {
                    let _ = serde_json::to_writer(&mut *out, self.text(&m.key));
                }
            }
            out.push(b':');
            out.extend_from_slice(self.bytes(&m.value));
        }
        if let Some((s, e)) = run {
            out.extend_from_slice(&text[s..e]);
        }
        out.extend_from_slice(b"}\n");
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

/// A request's id, read once ([`Message::request_id`], [`RequestId::of`]):
/// its JSON text as serde_json writes it (`7`, `"a"`). The key of every
/// map of requests in flight (the router's, a session's calls, a
/// bridge's ledger), and the text an answer carries back. Equal ids have
/// equal text: `1` and `"1"` are two ids.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(std::sync::Arc<str>);

impl RequestId {
    /// The id `id` (`None` for `null`, which is no id).
    pub fn of(id: &Value) -> Option<Self> {
        (!id.is_null()).then(|| Self(id_key(id).into()))
    }

    /// The integer id `n` (as mcpd numbers its own requests).
    pub fn number(n: u64) -> Self {
        Self(n.to_string().into())
    }

    /// Its JSON text.
    pub fn as_json(&self) -> &str {
        &self.0
    }

    /// It as a `Value` (for a message built as one).
    pub fn to_value(&self) -> Value {
        // Read from JSON, or written by serde_json.
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// It as an unsigned integer, if it is one (the ids mcpd gives).
    pub fn as_u64(&self) -> Option<u64> {
        self.0.parse().ok()
    }

    /// Its JSON text, owned.
    pub fn into_json(self) -> String {
        self.0.as_ref().to_owned()
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::borrow::Borrow<str> for RequestId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// The id of a message whose line was too long to be read (only its
/// first and last bytes were kept, `head` and `tail`): found at the top
/// level of the head (`{"jsonrpc":"2.0","id":7,"result":…`, as most
/// servers write it) or as the last member before the closing brace
/// (`{"result":…,"jsonrpc":"2.0","id":7}`, as the TypeScript SDK writes
/// it); `None` when neither says.
pub fn id_of_cut(head: &[u8], tail: &[u8]) -> Option<RequestId> {
    id_in_head(head).or_else(|| id_in_tail(tail))
}

fn id_of_raw(raw: &[u8]) -> Option<RequestId> {
    match serde_json::from_slice::<Value>(raw).ok()? {
        id @ (Value::String(_) | Value::Number(_)) => RequestId::of(&id),
        _ => None,
    }
}

fn skip_ws(text: &[u8], mut i: usize) -> usize {
    while text.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// Where the string starting at `text[i]` (its opening quote) ends: the
/// index after its closing quote.
fn string_end(text: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match text.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// Where the value starting at `text[i]` ends, if it ends within `text`.
fn value_end(text: &[u8], i: usize) -> Option<usize> {
    match text.get(i)? {
        b'"' => string_end(text, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match text.get(j)? {
                    b'"' => {
                        j = string_end(text, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let len = text[i..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace())?;
            Some(i + len)
        }
    }
}

fn id_in_head(head: &[u8]) -> Option<RequestId> {
    let mut i = skip_ws(head, 0);
    if head.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(head, i);
        if head.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(head, i)?;
        let key = &head[i + 1..key_end - 1];
        i = skip_ws(head, key_end);
        if head.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(head, i + 1);
        let end = value_end(head, i)?;
        if key == b"id" {
            return id_of_raw(&head[i..end]);
        }
        i = skip_ws(head, end);
        if head.get(i) != Some(&b',') {
            return None;
        }
        i += 1;
    }
}

fn id_in_tail(tail: &[u8]) -> Option<RequestId> {
    let trim = |t: &[u8]| -> usize {
        t.iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |p| p + 1)
    };
    let mut end = trim(tail);
    if end == 0 || tail[end - 1] != b'}' {
        return None;
    }
    end = trim(&tail[..end - 1]);
    let value_start = if end > 0 && tail[end - 1] == b'"' {
        // the opening quote: one not escaped by an odd run of backslashes
        let mut q = end - 1;
        loop {
            q = tail[..q].iter().rposition(|b| *b == b'"')?;
            let slashes = tail[..q].iter().rev().take_while(|b| **b == b'\\').count();
            if slashes % 2 == 0 {
                break q;
            }
        }
    } else {
        tail[..end]
            .iter()
            .rposition(|b| !(b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')))
            .map_or(0, |p| p + 1)
    };
    let raw = &tail[value_start..end];
    let before = &tail[..trim(&tail[..value_start])];
    let before = before.strip_suffix(b":")?;
    let before = &before[..trim(before)];
    let before = before.strip_suffix(b"\"id\"")?;
    let before = &before[..trim(before)];
    if !(before.ends_with(b",") || before.ends_with(b"{")) {
        return None;
    }
    id_of_raw(raw)
}

/// `n` in decimal, written at the end of `digits` (by hand: no
/// formatter, no allocation).
pub fn decimal(n: u64, digits: &mut [u8; 20]) -> &str {
    // Digits are ASCII.
    std::str::from_utf8(decimal_bytes(n, digits)).unwrap_or("0")
}

/// [`decimal`], as bytes (no check of UTF-8).
pub fn decimal_bytes(n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let at = digits.len() - write_digits(n, digits);
    &digits[at..]
}

/// Writes `n`'s digits at the end of `digits`; how many.
fn write_digits(n: u64, digits: &mut [u8; 20]) -> usize {
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    digits.len() - at
}

/// Whether `text` holds `word`: a short text searched for the byte of
/// `word` at `pivot` (one rare in JSON text: a capital), a long one by
/// `finder` (built once for `word`), whose time stays linear whatever
/// the text holds.
pub fn holds(text: &[u8], word: &[u8], pivot: usize, finder: &memchr::memmem::Finder<'_>) -> bool {
    if text.len() > 256 {
        return finder.find(text).is_some();
    }
    let Some(&byte) = word.get(pivot) else {
        return finder.find(text).is_some();
    };
    memchr::memchr_iter(byte, text).any(|at| at >= pivot && text[at - pivot..].starts_with(word))
}

/// [`Message::inner`] cannot tell without parsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsure;

/// What `id.to_string()` is (serde_json's text of it), without the
/// formatter for integers and plain strings: a key of ids in maps.
pub fn id_key(id: &Value) -> String {
    match id {
        Value::Number(n) if n.is_u64() => n.as_u64().unwrap_or_default().to_string(),
        Value::Number(n) if n.is_i64() => n.as_i64().unwrap_or_default().to_string(),
        Value::String(s) if !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) => {
            let mut key = String::with_capacity(s.len() + 2);
            key.push('"');
            key.push_str(s);
            key.push('"');
            key
        }
        other => other.to_string(),
    }
}

/// An id's text that is what serde_json writes for it.
enum Plain {
    /// Digits, perhaps after a minus.
    Integer,
    /// A string without escapes.
    String,
}

fn plain_id(raw: &str) -> Option<Plain> {
    // Not one serde_json reads as a float: beyond 64 bits, or `-0`.
    if raw != "-0" && (raw.parse::<i64>().is_ok() || raw.parse::<u64>().is_ok()) {
        return Some(Plain::Integer);
    }
    (raw.len() >= 2 && raw.starts_with('"') && raw.ends_with('"') && !raw.contains('\\'))
        .then_some(Plain::String)
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
        Self::new(String::new(), (members, false))
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

/// The members of the JSON object `text`, as spans of it; `None` if it
/// is not one (serde_json then says why). Of a repeated key only the last
/// value is kept.
/// The values of members `names` of `raw`, a member's value (checked
/// when its message was read, so not checked again): of a repeated name,
/// the last. `Err` if `raw` is not an object or a key holds an escape.
fn inner_members<'r, const N: usize>(
    raw: &'r str,
    names: [&str; N],
) -> Result<[Option<&'r str>; N], Unsure> {
    let mut found = [None; N];
    let mut escaped = false;
    super::scan::each_member(raw.as_bytes(), |s| {
        escaped |= s.escaped;
        let key = &raw[s.key.0..s.key.1];
        if let Some(i) = names.iter().position(|name| *name == key) {
            found[i] = Some(&raw[s.value.0..s.value.1]);
        }
    })
    .ok_or(Unsure)?;
    if escaped {
        return Err(Unsure);
    }
    Ok(found)
}

/// Where the value of member `name` of `raw` (an object's text, checked
/// when its message was read) is in `raw`: `Err` if `raw` is not an
/// object, a key holds an escape, or `name` is there twice.
fn only_member(raw: &str, name: &str) -> Result<Option<(usize, usize)>, Unsure> {
    let mut found = None;
    let (mut twice, mut escaped) = (false, false);
    super::scan::each_member(raw.as_bytes(), |s| {
        escaped |= s.escaped;
        if &raw[s.key.0..s.key.1] == name {
            twice |= found.is_some();
            found = Some(s.value);
        }
    })
    .ok_or(Unsure)?;
    if escaped || twice {
        return Err(Unsure);
    }
    Ok(found)
}

fn members(text: &str) -> Option<(Vec<Member>, bool)> {
    let mut members: Vec<Member> = Vec::with_capacity(5);
    let mut bad_key = false;
    super::scan::each_checked(text.as_bytes(), |span| {
        let key = if span.escaped {
            // Unescaped as serde_json does (a lone surrogate is an error).
            let quoted = &text[span.key.0 - 1..span.key.1 + 1];
            match serde_json::from_str::<String>(quoted) {
                Ok(key) => Text::Own(key.into()),
                Err(_) => {
                    bad_key = true;
                    return;
                }
            }
        } else {
            Text::Span(span.key.0 as u32, span.key.1 as u32)
        };
        // Lines are at most 16 MiB (wire::MAX_LINE).
        members.push(Member {
            key,
            value: Text::Span(span.value.0 as u32, span.value.1 as u32),
        });
    })?;
    if bad_key {
        return None;
    }
    let repeated = last_of_each(&mut members, text);
    Some((members, repeated))
}

/// Of a repeated key, keeps only the last member, where it is (the others
/// are dropped): what a `Value` reads, in the order of what is kept. In
/// time linear in the members, whatever a line holds (a 16 MiB line of
/// distinct keys is read on the session task). Whether a key was repeated.
fn last_of_each(members: &mut Vec<Member>, text: &str) -> bool {
    let n = members.len();
    // Members all JSON-RPC's, each once (as most messages are): none is
    // repeated, and no key is compared with another.
    let mut seen = 0u8;
    let distinct = members.iter().all(|m| {
        known(m.key.get(text)).is_some_and(|k| {
            let fresh = seen & (1 << k) == 0;
            seen |= 1 << k;
            fresh
        })
    });
    if distinct {
        return false;
    }
    // Messages have a handful of members: compared pairwise, no set.
    let repeated = if n <= 8 {
        (1..n).any(|i| (0..i).any(|j| members[j].key.get(text) == members[i].key.get(text)))
    } else {
        true
    };
    if !repeated {
        return false;
    }
    let mut seen = foldhash::HashSet::default();
    let mut keep = vec![false; n];
    for i in (0..n).rev() {
        keep[i] = seen.insert(members[i].key.get(text));
    }
    let mut keep = keep.into_iter();
    members.retain(|_| keep.next().unwrap_or(true));
    members.len() < n
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
            ("18446744073709551615", Some("18446744073709551615")),
            ("-0", Some("-0.0")),
            ("-9223372036854775809", Some("-9.223372036854776e+18")),
            (
                "123456789012345678901234567890",
                Some("1.2345678901234568e+29"),
            ),
            ("\"req-1\"", Some("\"req-1\"")),
            ("\"caf\u{e9}\"", Some("\"caf\u{e9}\"")),
            ("\"a\\u0041\"", Some("\"aA\"")),
            ("\"tab\\t\"", Some("\"tab\\t\"")),
            ("1.50", Some("1.5")),
            ("1e2", Some("100.0")),
            (
                "\"a\\u0001\\\\\\\"\u{7f}\"",
                Some("\"a\\u0001\\\\\\\"\u{7f}\""),
            ),
            ("null", None),
        ] {
            let m = parse(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}"
            ));
            assert_eq!(m.id_text().as_deref(), text, "{id}");
            assert_eq!(m.id(), serde_json::from_str(id).ok(), "{id}");
            let value = m.id().expect("id");
            assert_eq!(id_key(&value), value.to_string(), "{id}");
            if let Some(text) = text {
                assert_eq!(m.id().expect("id").to_string(), text, "{id}");
            }
        }
        assert_eq!(parse(r#"{"jsonrpc":"2.0","method":"x"}"#).id_text(), None);
    }

    #[test]
    fn may_hold_and_holds_find_what_a_substring_search_finds() {
        let finder = memchr::memmem::Finder::new("taskId");
        let long = format!("{{\"a\":\"{}\",\"taskId\":1}}", "I".repeat(300));
        let long_without = format!("{{\"a\":\"{}\"}}", "xI".repeat(300));
        for (text, word) in [
            (r#"{"taskId":"t1"}"#, "taskId"),
            (
                r#"{"content":[{"type":"text","text":"I am"}],"isError":false}"#,
                "taskId",
            ),
            (r#"{"Id":1,"tas":2}"#, "taskId"),
            (r#"{"a":"xtaskId"}"#, "taskId"),
            (r#"{"a":"Id"}"#, "taskId"),
            (long.as_str(), "taskId"),
            (long_without.as_str(), "taskId"),
            (r#"{"_meta":{"progressToken":1}}"#, "progressToken"),
            (r#"{"progress":1,"Token":2}"#, "progressToken"),
            (r#"{"isError":true}"#, "isError"),
            (r#"{"a":"\u0041"}"#, "isError"),
            (r#"{"a":"\\u"}"#, "isError"),
            (r#"{"a":"\\"}"#, "isError"),
            (r#"{"a":"\\"}"#, ""),
            (r#"{"a":"\u0041"}"#, ""),
        ] {
            let m = parse(&format!(r#"{{"params":{text}}}"#));
            let expected = (!word.is_empty() && text.contains(word)) || text.contains("\\u");
            assert_eq!(m.may_hold("params", word), expected, "{word} in {text}");
            if word == "taskId" {
                assert_eq!(
                    holds(text.as_bytes(), b"taskId", 4, &finder),
                    text.contains(word),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn ids_set_as_numbers_or_shared_are_written_as_json() {
        for n in [0, 7, 1234567890, u64::MAX] {
            let mut m = parse(r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#);
            m.set_number("id", n);
            assert_eq!(m.raw("id"), Some(n.to_string().as_str()));
            assert_eq!(m.id(), Some(json!(n)));
            assert_eq!(
                m.line(),
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{n},\"method\":\"ping\"}}\n").into_bytes()
            );
            m.set_id(RequestId::of(&json!("x\"y")).expect("an id"));
            assert_eq!(m.id(), Some(json!("x\"y")));
            assert_eq!(m.to_value()["id"], json!("x\"y"));
        }
    }

    #[test]
    fn a_line_read_into_its_own_buffer_is_the_message_parse_reads() {
        for text in [
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n",
            " {\"a\":[1,{\"b\":\"\\u00e9\"}]} \r\n",
        ] {
            let mut buffer = Vec::with_capacity(512);
            buffer.extend_from_slice(text.as_bytes());
            let owned = Message::parse_owned(buffer).expect("a message");
            assert_eq!(owned, parse(text));
            assert_eq!(owned.line(), parse(text).line());
            assert_eq!(owned.received(), text.len());
        }
        let mut big = Vec::with_capacity(1 << 20);
        big.extend_from_slice(b"{\"id\":2}\n");
        let owned = Message::parse_owned(big).expect("a message");
        assert!(
            owned.text.capacity() < 1 << 16,
            "a buffer much larger than its line was kept"
        );
        for not in ["[1]\n", "{\"a\":}\n"] {
            assert_eq!(
                Message::parse_owned(not.as_bytes().to_vec()).map(|m| m.line()),
                Message::parse(not.as_bytes()).map(|m| m.line())
            );
        }
        assert!(matches!(
            Message::parse_owned(b"{\"a\":\"\xff\"}".to_vec()),
            Err(NotAMessage::NotJson(_))
        ));
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
    fn a_progress_token_is_set_in_the_text_or_left_to_a_parser() {
        // Set in place, the rest of `params` as it was written.
        for (text, theirs, params) in [
            (
                r#"{"id":1,"params":{"_meta":{"progressToken":595},"arguments":{"message":"x"},"name":"echo"}}"#,
                "595",
                r#"{"_meta":{"progressToken":7},"arguments":{"message":"x"},"name":"echo"}"#,
            ),
            (
                r#"{"params": { "name" : "a", "_meta" : { "k":[1,{"progressToken":2}], "progressToken" : "tok\"en" } } }"#,
                r#""tok\"en""#,
                r#"{ "name" : "a", "_meta" : { "k":[1,{"progressToken":2}], "progressToken" : 7 } }"#,
            ),
        ] {
            let mut m = parse(text);
            let mut seen = None;
            let set = m.set_meta_number("progressToken", |t| {
                seen = Some(t.to_owned());
                Some(7)
            });
            assert_eq!((set, seen.as_deref()), (Ok(true), Some(theirs)), "{text}");
            assert_eq!(m.raw("params"), Some(params), "{text}");
            // What a parser reads: the token replaced, nothing else.
            let mut expected: Value = serde_json::from_str(text).expect("JSON");
            expected["params"]["_meta"]["progressToken"] = json!(7);
            assert_eq!(m.to_value(), expected, "{text}");
        }
        // `with` declines: unchanged.
        let text = r#"{"params":{"_meta":{"progressToken":1e400}}}"#;
        let mut m = parse(text);
        assert_eq!(m.set_meta_number("progressToken", |_| None), Ok(false));
        assert_eq!(
            m.raw("params"),
            Some(r#"{"_meta":{"progressToken":1e400}}"#)
        );
        // None there (`Ok(false)`), or where a reader's choice is not a
        // scan's to make (`Err`): nothing asked, nothing changed.
        for (text, set) in [
            (r#"{"id":1}"#, Ok(false)),
            (r#"{"params":{"name":"progressToken"}}"#, Ok(false)),
            (
                r#"{"params":{"arguments":{"_meta":{"progressToken":1}}}}"#,
                Ok(false),
            ),
            (r#"{"params":{"_meta":{"other":1}}}"#, Ok(false)),
            (
                r#"{"params":{"_meta":{"progressToken":1},"_meta":{"progressToken":2}}}"#,
                Err(Unsure),
            ),
            (
                r#"{"params":{"_meta":{"progressToken":1,"progressToken":2}}}"#,
                Err(Unsure),
            ),
            (
                r#"{"params":{"_m\u0065ta":{"progressToken":1}}}"#,
                Err(Unsure),
            ),
            (
                r#"{"params":{"_meta":{"progress\u0054oken":1}}}"#,
                Err(Unsure),
            ),
            (r#"{"params":{"_meta":[{"progressToken":1}]}}"#, Err(Unsure)),
            (r#"{"params":[{"_meta":{"progressToken":1}}]}"#, Err(Unsure)),
        ] {
            let mut m = parse(text);
            let got = m.set_meta_number("progressToken", |_| panic!("asked: {text}"));
            assert_eq!(got, set, "{text}");
            assert_eq!(
                m.to_value(),
                serde_json::from_str::<Value>(text).expect("JSON")
            );
        }
    }

    #[test]
    fn inner_members_are_found_by_a_scan_or_left_to_a_parser() {
        let m = parse(
            r#"{"params":{"name":"a","arguments":{"name":"x"},"name":"b"},"result":[1],"error":{"n\u0061me":1}}"#,
        );
        assert_eq!(m.inner("params", "name"), Ok(Some("\"b\"")), "the last");
        assert_eq!(m.inner("params", "nothing"), Ok(None));
        assert_eq!(m.inner("absent", "name"), Ok(None));
        assert_eq!(m.inner("result", "name"), Err(Unsure), "not an object");
        assert_eq!(m.inner("error", "name"), Err(Unsure), "an escaped key");
    }

    #[test]
    fn of_many_members_each_repeated_key_keeps_its_last_value_in_its_place() {
        let mut text = String::from("{");
        for c in 'a'..='z' {
            text.push_str(&format!("\"{c}\":\"{c}1\","));
        }
        text.push_str("\"c\":\"c2\",\"a\":\"a2\"}");
        let m = parse(&text);
        let keys: String = m.members.iter().map(|x| m.text(&x.key)).collect();
        assert_eq!(keys, "bdefghijklmnopqrstuvwxyzca");
        assert_eq!(m.raw("a"), Some("\"a2\""));
        assert_eq!(m.raw("c"), Some("\"c2\""));
        assert!(same_as_serde(&text));
        // A line of 200,000 keys, every one given twice: read, the last
        // of each kept (pairwise comparison took minutes here).
        let mut text = String::from("{");
        for round in 0..2 {
            for i in 0..100_000 {
                text.push_str(&format!("\"k{i}\":{round},"));
            }
        }
        text.push_str("\"id\":1}");
        let m = parse(&text);
        assert_eq!(m.members.len(), 100_001);
        assert_eq!(m.raw("k0"), Some("1"));
        assert_eq!(m.raw("k99999"), Some("1"));
        assert_eq!(m.id(), Some(json!(1)));
    }

    #[test]
    fn members_past_the_indexed_ones_are_found_and_set() {
        let mut text = String::from("{");
        for i in 0..300 {
            text.push_str(&format!("\"k{i}\":{i},"));
        }
        text.push_str("\"id\":7,\"method\":\"m\"}");
        let mut m = parse(&text);
        assert_eq!(m.id(), Some(json!(7)));
        assert_eq!(m.method().as_deref(), Some("m"));
        assert!(!m.has("params") && m.has("k299"));
        m.set("params", &json!({}));
        m.set("id", &8);
        m.set_json("result", "true".into());
        assert_eq!(m.raw("params"), Some("{}"));
        assert_eq!(m.id(), Some(json!(8)));
        assert_eq!(m.raw("result"), Some("true"));
        assert_eq!(m.to_value()["k299"], 299);
        assert_eq!(m.to_value().as_object().map(|o| o.len()), Some(304));
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
        // JSON-RPC's members alone, one twice: the last kept, in its place.
        let twice = parse(r#"{"jsonrpc":"2.0","id":1,"method":"a","id":2}"#);
        assert_eq!(twice.id(), Some(json!(2)));
        assert_eq!(
            twice.line(),
            b"{\"jsonrpc\":\"2.0\",\"method\":\"a\",\"id\":2}\n"
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

    /// What serde_json reads of `text` as an object of raw values: its
    /// members in order, keys unescaped (the reference the scan is held
    /// to).
    fn serde_members(text: &str) -> Option<Vec<(String, String)>> {
        use serde::Deserializer as _;
        use serde::de::{MapAccess, Visitor};
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<(String, String)>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value: &serde_json::value::RawValue = map.next_value()?;
                    out.push((key, value.get().to_owned()));
                }
                Ok(out)
            }
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let members = (&mut de).deserialize_map(V).ok()?;
        de.end().ok()?;
        Some(members)
    }

    /// Checks that `Message::parse` reads `text` as serde_json does.
    fn same_as_serde(text: &str) -> bool {
        let ours = Message::parse(text.as_bytes()).ok().map(|m| {
            m.members
                .iter()
                .map(|x| (m.text(&x.key).to_owned(), m.text(&x.value).to_owned()))
                .collect::<Vec<_>>()
        });
        let theirs = serde_members(text).map(|members| {
            // Of a repeated key the last value counts, and comes last.
            let mut kept: Vec<(String, String)> = Vec::new();
            for (key, value) in members {
                kept.retain(|(k, _)| *k != key);
                kept.push((key, value));
            }
            kept
        });
        assert_eq!(ours, theirs, "{text:?}");
        if let (Ok(m), Some(theirs)) = (Message::parse(text.as_bytes()), &theirs) {
            for key in KNOWN {
                let value = theirs
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.as_str());
                assert_eq!(m.raw(key), value, "{key} of {text:?}");
            }
        }
        ours.is_some()
    }

    #[test]
    fn a_line_is_a_message_exactly_when_serde_json_reads_an_object() {
        for text in [
            "{}",
            " {\"a\":1} \n",
            "{\"a\":-0.5e+10,\"b\":[true,false,null,{}],\"c\":\"\\u00e9\\n\"}",
            "{\"a\":01}",
            "{\"a\":1.}",
            "{\"a\":.5}",
            "{\"a\":-}",
            "{\"a\":1e}",
            "{\"a\":+1}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\\u12g4\"}",
            "{\"a\":\"\\ud800\"}",
            "{\"\\ud800\":1}",
            "{\"\\u0069d\":1,\"id\":2}",
            "{\"a\":\"tab\there\"}",
            "{\"a\":\"del\u{7f}\"}",
            "{\"a\":[1,]}",
            "{\"a\":1,}",
            "{,}",
            "{\"a\" 1}",
            "{\"a\":1}{}",
            "{\"a\":1} x",
            "\u{a0}{}",
            "{\"a\":tru}",
            "{\"a\":truex}",
            "[]",
            "",
        ] {
            same_as_serde(text);
        }
        // Any depth (serde_json sets no limit on a raw value's), past the
        // scan's first 128 levels, and as deep as a line may be.
        for depth in [1, 2, 127, 128, 129, 130, 300] {
            let text = format!("{{\"a\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
            same_as_serde(&text);
            let text = format!(
                "{{\"a\":{}1{}}}",
                "{\"b\":".repeat(depth),
                "}".repeat(depth)
            );
            same_as_serde(&text);
        }
        let deep = format!(
            "{{\"a\":{}1{}}}",
            "[{\"b\":".repeat(1000),
            "}]".repeat(1000)
        );
        assert!(same_as_serde(&deep));
        let line = format!("{{\"a\":{}}}", "[".repeat(crate::mux::wire::MAX_LINE - 7));
        assert!(
            Message::parse(line.as_bytes()).is_err(),
            "refused, and no stack overflow"
        );
    }

    /// Random objects, and random edits of them: held to serde_json.
    #[test]
    fn random_lines_read_as_serde_json_reads_them() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        const PIECES: &[&str] = &[
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            "\"",
            "\\",
            " ",
            "\n",
            "\t",
            "0",
            "1",
            "-",
            ".",
            "e",
            "E",
            "+",
            "true",
            "false",
            "null",
            "tru",
            "\\u00",
            "\\u0041",
            "\\ud83d\\ude00",
            "\\udc00",
            "x",
            "\u{e9}",
            "\u{1}",
            "\"id\"",
            "\"k\\\"q\"",
            "12.5e-3",
            "01",
            "-0",
        ];
        fn value(next: &mut impl FnMut(usize) -> usize, depth: usize, out: &mut String) {
            match next(if depth > 3 { 6 } else { 8 }) {
                0 => out.push_str(["true", "false", "null"][next(3)]),
                1 => out.push_str(["0", "-1", "12.5", "3e7", "-0.0E-2", "42"][next(6)]),
                2 | 3 => {
                    out.push('"');
                    for _ in 0..next(5) {
                        out.push_str(
                            ["a", "\\n", "\\\"", "\u{e9}", "\\u00e9", " ", "/", "\\/"][next(8)],
                        );
                    }
                    out.push('"');
                }
                4 | 5 => {
                    out.push('"');
                    out.push_str(["id", "method", "params", "x"][next(4)]);
                    out.push('"');
                }
                6 => {
                    out.push('[');
                    for i in 0..next(4) {
                        if i > 0 {
                            out.push(',');
                        }
                        value(next, depth + 1, out);
                    }
                    out.push(']');
                }
                _ => object(next, depth + 1, out),
            }
        }
        fn object(next: &mut impl FnMut(usize) -> usize, depth: usize, out: &mut String) {
            out.push('{');
            for i in 0..next(5) {
                if i > 0 {
                    out.push(',');
                }
                out.push_str([" ", "", "\n"][next(3)]);
                out.push_str(
                    ["\"id\"", "\"method\"", "\"a\\u0041\"", "\"params\"", "\"\""][next(5)],
                );
                out.push(':');
                value(next, depth, out);
            }
            out.push('}');
        }
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let mut text = String::new();
            object(&mut next, 0, &mut text);
            // Most lines are edited: a piece inserted, or a byte dropped.
            for _ in 0..next(3) {
                let at = next(text.len() + 1);
                if !text.is_char_boundary(at) {
                    continue;
                }
                if next(2) == 0 {
                    text.insert_str(at, PIECES[next(PIECES.len())]);
                } else if at < text.len() && text.is_char_boundary(at + 1) {
                    text.remove(at);
                }
            }
            if same_as_serde(&text) {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(
            accepted > 5_000 && refused > 5_000,
            "{accepted} read, {refused} refused"
        );
    }
}
