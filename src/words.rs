//! Numbers in words for what people read (status, logs, `mcpctl`): "1
//! tool", "2 tools", "0 processes". A leaf: it imports nothing of the
//! crate.

/// `n` and `noun`, plural unless `n` is 1: an `s`, or `es` after a
/// sibilant ("process", "match").
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {}", plural(noun))
    }
}

/// `noun`'s plural (regular nouns only).
pub fn plural(noun: &str) -> String {
    if ["s", "x", "z", "ch", "sh"]
        .iter()
        .any(|e| noun.ends_with(e))
    {
        format!("{noun}es")
    } else {
        format!("{noun}s")
    }
}

/// `noun` for `n`: "tool" for 1, else "tools".
pub fn noun(n: impl Into<u64>, noun: &str) -> String {
    if n.into() == 1 {
        noun.to_owned()
    } else {
        plural(noun)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_and_every_other_number_plural() {
        assert_eq!(count(1u32, "tool"), "1 tool");
        assert_eq!(count(0u32, "tool"), "0 tools");
        assert_eq!(count(2u64, "unit"), "2 units");
        assert_eq!(count(3u32, "process"), "3 processes");
        assert_eq!(noun(1u32, "file"), "file");
        assert_eq!(noun(7u32, "file"), "files");
    }
}
