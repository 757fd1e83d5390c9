//! A validating scan of one JSON object's text: where each of its
//! top-level members' key and value are, and nothing else.
//!
//! [`Message::parse`](super::message::Message::parse) reads every line a
//! host or server sends with it. It accepts exactly the text serde_json
//! accepts as an object whose values are left as raw text (its grammar,
//! RFC 8259, nested to any depth), so a line is a message here
//! if and only if serde_json would read it as one; why a line is not one
//! is still told in serde_json's words (the rare path). It decodes
//! nothing: a key with escapes is only marked, for the caller to unescape.
//! A tenth of the instructions of serde_json's `RawValue` visitor on a
//! typical message (the daemon's hottest function after the kernel's).

/// Where one member is in the text: byte offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The key's text between its quotes.
    pub key: (usize, usize),
    /// The key holds an escape (its text is not the key itself).
    pub escaped: bool,
    /// The value's JSON text.
    pub value: (usize, usize),
}

/// The members of the JSON object `text` (JSON whitespace around it
/// allowed) in order, repeated keys included; `None` if `text` is not
/// exactly one JSON object. `text` is UTF-8 (the caller checked).
pub fn object(text: &[u8]) -> Option<Vec<Span>> {
    let mut members = Vec::with_capacity(4);
    each_checked(text, |span| members.push(span))?;
    Some(members)
}

/// [`object`], each member given to `each` as it is found (the caller's
/// own collection, no `Vec` of spans between); `None` if `text` is not
/// exactly one JSON object, with some members given already.
pub fn each_checked(text: &[u8], each: impl FnMut(Span)) -> Option<()> {
    walk(text, true, each)
}

/// The members of an object, given to `each`: its grammar checked
/// (`check`), or only skipped, for text that was checked before.
fn walk(text: &[u8], check: bool, mut each: impl FnMut(Span)) -> Option<()> {
    let mut s = Scanner { text, at: 0 };
    s.ws();
    s.eat(b'{')?;
    s.ws();
    if !s.eat_if(b'}') {
        loop {
            s.eat(b'"')?;
            let start = s.at;
            let escaped = if check { s.string()? } else { s.skip_string()? };
            let key = (start, s.at - 1);
            s.ws();
            s.eat(b':')?;
            s.ws();
            let start = s.at;
            if check {
                s.value()?;
            } else {
                s.skip_value()?;
            }
            each(Span {
                key,
                escaped,
                value: (start, s.at),
            });
            s.ws();
            match s.next()? {
                b',' => s.ws(),
                b'}' => break,
                _ => return None,
            }
        }
    }
    s.ws();
    (s.at == text.len()).then_some(())
}

/// The bytes a string's plain run stops at: its end, an escape, and
/// the control characters JSON forbids in it.
static STOP: [bool; 256] = {
    let mut stop = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        stop[b] = true;
        b += 1;
    }
    stop[b'"' as usize] = true;
    stop[b'\\' as usize] = true;
    stop
};

struct Scanner<'t> {
    text: &'t [u8],
    at: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn eat(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    fn eat_if(&mut self, want: u8) -> bool {
        let hit = self.peek() == Some(want);
        self.at += usize::from(hit);
        hit
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// A string's rest, after its opening quote: whether it held an
    /// escape.
    fn string(&mut self) -> Option<bool> {
        let mut escaped = false;
        loop {
            // Plain bytes first (most of a string), a byte at a time:
            // strings in messages are short, and most are ASCII.
            let rest = &self.text[self.at..];
            let plain = rest.iter().position(|&b| STOP[usize::from(b)])?;
            self.at += plain;
            match self.next()? {
                b'"' => return Some(escaped),
                b'\\' => {
                    escaped = true;
                    match self.next()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        b'u' => {
                            // Any four hex digits: serde_json checks
                            // surrogates only where it decodes (a key).
                            for _ in 0..4 {
                                if !self.next()?.is_ascii_hexdigit() {
                                    return None;
                                }
                            }
                        }
                        _ => return None,
                    }
                }
                // A control character.
                _ => return None,
            }
        }
    }

    /// One value, however deeply nested (without recursion: serde_json
    /// sets no limit on a raw value's depth, and a 16 MiB line of `[`
    /// must not overflow the stack).
    fn value(&mut self) -> Option<()> {
        let mut nest = Nest::default();
        loop {
            // A value starts here.
            match self.next()? {
                b'"' => {
                    self.string()?;
                }
                b'{' => {
                    self.ws();
                    if !self.eat_if(b'}') {
                        nest.push(true);
                        self.key()?;
                        continue;
                    }
                }
                b'[' => {
                    self.ws();
                    if !self.eat_if(b']') {
                        nest.push(false);
                        continue;
                    }
                }
                b't' => self.word(b"rue")?,
                b'f' => self.word(b"alse")?,
                b'n' => self.word(b"ull")?,
                b'-' => {
                    let first = self.next()?;
                    self.number(first)?;
                }
                first @ b'0'..=b'9' => self.number(first)?,
                _ => return None,
            }
            // A value ended: what follows it in its arrays and objects.
            loop {
                let Some(in_object) = nest.top() else {
                    return Some(());
                };
                self.ws();
                match (self.next()?, in_object) {
                    (b',', true) => {
                        self.ws();
                        self.key()?;
                        break;
                    }
                    (b',', false) => {
                        self.ws();
                        break;
                    }
                    (b'}', true) | (b']', false) => nest.pop(),
                    _ => return None,
                }
            }
        }
    }

    /// A member's key and colon, up to its value.
    fn key(&mut self) -> Option<()> {
        self.eat(b'"')?;
        self.string()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Some(())
    }

    fn word(&mut self, rest: &[u8]) -> Option<()> {
        let end = self.at + rest.len();
        (self.text.get(self.at..end)? == rest).then(|| self.at = end)
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        self.at - start
    }

    /// A number's rest after its first digit (`first`, after any sign).
    fn number(&mut self, first: u8) -> Option<()> {
        match first {
            // One leading zero, and nothing of the integer after it.
            b'0' => {
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return None;
                }
            }
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.eat_if(b'.') && self.digits() == 0 {
            return None;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        Some(())
    }
}

/// The arrays (`false`) and objects (`true`) a value is inside, innermost
/// last: the first 128 levels in bits, with no allocation.
#[derive(Default)]
struct Nest {
    bits: u128,
    depth: usize,
    deeper: Vec<bool>,
}

impl Nest {
    fn push(&mut self, object: bool) {
        if self.depth < 128 {
            self.bits = (self.bits & !(1 << self.depth)) | (u128::from(object) << self.depth);
        } else {
            self.deeper.push(object);
        }
        self.depth += 1;
    }

    fn top(&self) -> Option<bool> {
        let top = self.depth.checked_sub(1)?;
        Some(if top < 128 {
            self.bits >> top & 1 == 1
        } else {
            self.deeper[top - 128]
        })
    }

    fn pop(&mut self) {
        if self.depth > 128 {
            self.deeper.pop();
        }
        self.depth = self.depth.saturating_sub(1);
    }
}

/// Calls `each` with the members of `text`, a JSON object that [`object`]
/// accepted, whole or as a value inside one it accepted: the spans
/// [`object`] finds, in order, found without checking the grammar again
/// (a string is skipped to its closing quote, a nested value by counting
/// brackets outside strings), so a member read twice is validated once.
/// `None` if `text` is not an object (never a panic, whatever it is).
pub fn each_member(text: &[u8], each: impl FnMut(Span)) -> Option<()> {
    walk(text, false, each)
}

/// Bytes of a string skipped one at a time before a vectorized search.
const SHORT: usize = 16;

impl Scanner<'_> {
    /// A valid string's rest, after its opening quote: whether it held
    /// an escape.
    fn skip_string(&mut self) -> Option<bool> {
        let mut escaped = false;
        loop {
            let rest = self.text.get(self.at..)?;
            // Most strings of a message are short (keys, types, names):
            // their first bytes one at a time, which costs less than
            // setting up the vectorized search the rest gets.
            let head = rest.len().min(SHORT);
            self.at += match rest[..head].iter().position(|&b| b == b'"' || b == b'\\') {
                Some(at) => at,
                None => head + memchr::memchr2(b'"', b'\\', &rest[head..])?,
            };
            if self.next()? == b'"' {
                return Some(escaped);
            }
            // An escape: the byte after the backslash is never the end
            // (`\uXXXX`'s digits hold no quote or backslash).
            escaped = true;
            self.next()?;
        }
    }

    /// A valid value, however deeply nested.
    fn skip_value(&mut self) -> Option<()> {
        let mut depth = 0usize;
        loop {
            match self.next()? {
                b'"' => {
                    self.skip_string()?;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' => depth = depth.checked_sub(1)?,
                // A number, `true`, `false` or `null`: up to what ends it.
                _ if depth == 0 => {
                    while self.peek().is_some_and(|b| {
                        !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                    }) {
                        self.at += 1;
                    }
                }
                _ => {}
            }
            if depth == 0 {
                return Some(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_member_finds_what_the_validating_scan_finds() {
        let texts = [
            r#"{}"#,
            r#" { "a" : 1 , "b":[1,2,{"c":"]}"}], "d" : {"e":{"f":[[]]}} } "#,
            r#"{"s":"a \"quoted\" } and \\ backslash\\","n\u0061me":-1.5e+3,"t":true,"f":false,"z":null}"#,
            r#"{"deep":[[[[{"x":"[{"}]]]],"u":"\u005c\"","last":"é"}"#,
            r#"{"k":0,"k":{}}"#,
        ];
        for text in texts {
            let mut found = Vec::new();
            assert_eq!(
                each_member(text.as_bytes(), |s| found.push(s)),
                Some(()),
                "{text}"
            );
            assert_eq!(Some(found), object(text.as_bytes()), "{text}");
        }
        for not_an_object in ["[1]", "\"s\"", "1", "", "{\"a\":1", "{\"a\":]}"] {
            assert_eq!(
                each_member(not_an_object.as_bytes(), |_| ()),
                None,
                "{not_an_object}"
            );
        }
    }
}
