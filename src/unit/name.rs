//! Unit names: the file stem of a unit file, validated once.
//!
//! A `UnitName` always matches `[A-Za-z0-9][A-Za-z0-9_-]{0,63}` (DESIGN §1), so
//! it is safe to use in paths, D-Bus object paths (after escaping) and logs.

use std::fmt;

/// The longest a unit name may be.
pub const MAX_NAME_LEN: usize = 64;

/// A validated unit name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnitName(String);

/// Why a string is not a unit name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("unit name is empty")]
    Empty,
    #[error("unit name `{0}` is longer than {MAX_NAME_LEN} characters")]
    TooLong(String),
    #[error("unit name `{0}` must start with a letter or digit")]
    BadStart(String),
    #[error("unit name `{name}` contains {found:?}; only letters, digits, `_` and `-` are allowed")]
    BadChar { name: String, found: char },
}

impl UnitName {
    /// Validates `name` against `[A-Za-z0-9][A-Za-z0-9_-]{0,63}`.
    pub fn new(name: &str) -> Result<Self, NameError> {
        let mut chars = name.chars();
        let Some(first) = chars.next() else {
            return Err(NameError::Empty);
        };
        if let Some(found) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(NameError::BadChar {
                name: name.to_owned(),
                found,
            });
        }
        if !first.is_ascii_alphanumeric() {
            return Err(NameError::BadStart(name.to_owned()));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong(name.to_owned()));
        }
        Ok(Self(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for UnitName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_names() {
        for name in ["a", "github", "Git-Hub_2", "0day", &"x".repeat(64)] {
            assert_eq!(
                UnitName::new(name).map(|n| n.to_string()).as_deref(),
                Ok(name)
            );
        }
    }

    #[test]
    fn rejects_invalid_names() {
        assert_eq!(UnitName::new(""), Err(NameError::Empty));
        assert!(matches!(UnitName::new("-x"), Err(NameError::BadStart(_))));
        assert!(matches!(UnitName::new("_x"), Err(NameError::BadStart(_))));
        assert!(matches!(
            UnitName::new(&"x".repeat(65)),
            Err(NameError::TooLong(_))
        ));
        assert!(matches!(
            UnitName::new("a.b"),
            Err(NameError::BadChar { found: '.', .. })
        ));
        assert!(matches!(
            UnitName::new("grüße"),
            Err(NameError::BadChar { found: 'ü', .. })
        ));
    }
}
