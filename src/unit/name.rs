//! Unit names: the file stem of a unit file, validated once; and the one
//! grammar of the names of a per-host unit's instances (DESIGN §13), as
//! systemd's `unit-name.h` is for `foo@bar.service`.
//!
//! A `UnitName` always matches `[A-Za-z0-9][A-Za-z0-9_-]{0,63}` (DESIGN §1), so
//! it is safe to use in paths, D-Bus object paths (after escaping) and logs.
//! An [`InstanceName`] is `NAME@N` (a host's instance) or `NAME@uid-UID` (the
//! instance of one user's D-Bus calls); every place that builds or reads
//! one goes through [`InstanceName`] or [`InstanceOf`].

use std::fmt;
use std::str::FromStr;

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

/// Which instance of a per-host unit (DESIGN §13): the part of its name
/// after `@`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InstanceOf {
    /// `N`: the instance of host session number `N`.
    Host(u32),
    /// `uid-UID`: the instance of user `UID`'s D-Bus calls.
    Caller(u32),
}

/// The prefix of a D-Bus caller's instance label.
const CALLER_PREFIX: &str = "uid-";

impl InstanceOf {
    /// The name of this instance of the unit named `unit` (a unit that
    /// runs, so named validly): `unit@N` or `unit@uid-UID`, as
    /// [`InstanceName`] displays it.
    pub fn name_in(self, unit: &str) -> String {
        format!("{unit}@{self}")
    }
}

/// `N` or `uid-UID`: also the label of the instance's launcher and cgroup.
impl fmt::Display for InstanceOf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstanceOf::Host(n) => write!(f, "{n}"),
            InstanceOf::Caller(uid) => write!(f, "{CALLER_PREFIX}{uid}"),
        }
    }
}

/// Why a string is not an instance name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceNameError {
    #[error("`{0}` is not NAME@N or NAME@uid-UID")]
    NotAnInstance(String),
    #[error(transparent)]
    Unit(#[from] NameError),
}

impl FromStr for InstanceOf {
    type Err = InstanceNameError;

    /// `N` or `uid-UID`, each number a `u32` as [`u32::from_str`] reads it.
    fn from_str(label: &str) -> Result<Self, Self::Err> {
        let not = || InstanceNameError::NotAnInstance(label.to_owned());
        match label.strip_prefix(CALLER_PREFIX) {
            Some(uid) => uid.parse().map(InstanceOf::Caller).map_err(|_| not()),
            None => label.parse().map(InstanceOf::Host).map_err(|_| not()),
        }
    }
}

/// The name of an instance of a per-host unit: `NAME@N` or `NAME@uid-UID`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceName {
    pub unit: UnitName,
    pub of: InstanceOf,
}

impl fmt::Display for InstanceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.of.name_in(self.unit.as_str()))
    }
}

impl FromStr for InstanceName {
    type Err = InstanceNameError;

    /// `NAME@N` or `NAME@uid-UID`, split at the last `@` (a unit name has
    /// none), the unit's part a valid [`UnitName`].
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let (unit, of) = name
            .rsplit_once('@')
            .ok_or_else(|| InstanceNameError::NotAnInstance(name.to_owned()))?;
        let of = of
            .parse()
            .map_err(|_| InstanceNameError::NotAnInstance(name.to_owned()))?;
        Ok(InstanceName {
            unit: UnitName::new(unit)?,
            of,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names() {
        use InstanceOf::{Caller, Host};
        let name = |unit: &str, of| InstanceName {
            unit: UnitName::new(unit).expect("a unit name"),
            of,
        };
        // (text, what it parses to, what that displays as)
        let table: &[(&str, Option<InstanceName>, &str)] = &[
            ("web@3", Some(name("web", Host(3))), "web@3"),
            ("web@0", Some(name("web", Host(0))), "web@0"),
            (
                "web@uid-1000",
                Some(name("web", Caller(1000))),
                "web@uid-1000",
            ),
            ("web@uid-0", Some(name("web", Caller(0))), "web@uid-0"),
            (
                "web@uid-4294967295",
                Some(name("web", Caller(u32::MAX))),
                "web@uid-4294967295",
            ),
            (
                "Git-Hub_2@12",
                Some(name("Git-Hub_2", Host(12))),
                "Git-Hub_2@12",
            ),
            // Numbers as `u32::from_str` reads them.
            ("web@+3", Some(name("web", Host(3))), "web@3"),
            ("web@007", Some(name("web", Host(7))), "web@7"),
            ("web", None, ""),
            ("web@", None, ""),
            ("web@x", None, ""),
            ("web@-1", None, ""),
            ("web@4294967296", None, ""),
            ("web@uid-", None, ""),
            ("web@uid-x", None, ""),
            ("web@uid--1", None, ""),
            ("web@UID-3", None, ""),
            ("@3", None, ""),
            ("a.b@3", None, ""),
            ("a@b@3", None, ""),
            ("-x@3", None, ""),
        ];
        for (text, parsed, shown) in table {
            let got = text.parse::<InstanceName>().ok();
            assert_eq!(&got, parsed, "{text}");
            if let Some(got) = got {
                assert_eq!(got.to_string(), *shown, "{text}");
                assert_eq!(got.of.name_in(got.unit.as_str()), *shown, "{text}");
                assert_eq!(shown.parse::<InstanceName>().ok(), Some(got), "{text}");
            }
        }
    }

    #[test]
    fn instance_labels() {
        assert_eq!(InstanceOf::Host(3).to_string(), "3");
        assert_eq!(InstanceOf::Caller(1000).to_string(), "uid-1000");
        assert_eq!("3".parse(), Ok(InstanceOf::Host(3)));
        assert_eq!("uid-1000".parse(), Ok(InstanceOf::Caller(1000)));
        assert!("uid".parse::<InstanceOf>().is_err());
        assert!(matches!(
            "a.b@3".parse::<InstanceName>(),
            Err(InstanceNameError::Unit(NameError::BadChar {
                found: '.',
                ..
            }))
        ));
    }

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
