//! What an aggregate (DESIGN §14) is over and how its names are made:
//! [`Target`] (`NAME`, `A+B`, `@GROUP`, `@all`, as `mcpctl bridge` writes
//! it and the attach socket carries it), the units a target takes
//! ([`members_of`], one per prefix) and the prefixes two units would
//! share ([`prefix_collisions`], which `mcpctl verify` refuses), and a
//! tool's or prompt's name under its unit's prefix ([`prefixed`]). The
//! routing of an aggregate's messages is [`super::aggregate`]. Pure: no
//! tasks, no I/O, no clock.

use std::collections::HashSet;

/// Between a unit's prefix and a tool's or prompt's name: allowed by
/// every host's name rules (`^[a-zA-Z0-9_-]{1,128}$` at the strictest),
/// unlike `.` or `:`.
pub const SEPARATOR: &str = "__";

/// Names longer than this are cut or refused by some hosts (VS Code,
/// OpenAI and Claude allow 64 characters, Cursor 60): reported, still
/// served.
pub const LONG_NAME: usize = 64;

/// What one host session is over: one unit (no aggregate), a list of
/// units, a group, or every unit. Written as `mcpctl bridge` takes it and
/// as the attach socket carries it: `NAME`, `A+B`, `@GROUP`, `@all`
/// (`+` and `@` are in no unit name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Unit(String),
    Units(Vec<String>),
    Group(String),
    All,
}

impl Target {
    /// The target of `mcpctl bridge`'s arguments: one name, several, or
    /// one `@GROUP`/`@all`.
    pub fn of_args(args: &[String]) -> Result<Self, String> {
        match args {
            [] => Err("name a server, several, or @GROUP".into()),
            [one] => Self::parse(one),
            many => {
                if let Some(group) = many.iter().find(|a| a.starts_with('@')) {
                    return Err(format!("{group}: a group is bridged alone"));
                }
                let mut names: Vec<String> = Vec::new();
                for name in many {
                    if !names.contains(name) {
                        names.push(name.clone());
                    }
                }
                Ok(Target::Units(names))
            }
        }
    }

    /// Its written form read back.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(group) = text.strip_prefix('@') {
            return match group {
                "" => Err("`@` needs a group name (or @all)".into()),
                "all" => Ok(Target::All),
                group => Ok(Target::Group(group.to_owned())),
            };
        }
        if text.contains('+') {
            return Ok(Target::Units(text.split('+').map(str::to_owned).collect()));
        }
        Ok(Target::Unit(text.to_owned()))
    }

    /// Its written form.
    pub fn label(&self) -> String {
        match self {
            Target::Unit(name) => name.clone(),
            Target::Units(names) => names.join("+"),
            Target::Group(group) => format!("@{group}"),
            Target::All => "@all".into(),
        }
    }

    /// Whether it is more than one unit's session.
    pub fn is_aggregate(&self) -> bool {
        !matches!(self, Target::Unit(_))
    }
}

/// A unit as an aggregate sees it: its name, its `alias`, its groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate<'a> {
    pub unit: &'a str,
    pub alias: Option<&'a str>,
    pub groups: &'a [String],
}

/// The units `target` is over, with their prefixes, in unit-name order;
/// an error names a unit that is not there or a group with no unit.
pub fn members_of(
    target: &Target,
    units: &[Candidate<'_>],
) -> Result<Vec<(String, String)>, String> {
    let pick = |c: &Candidate<'_>| (c.unit.to_owned(), c.alias.unwrap_or(c.unit).to_owned());
    let mut out: Vec<(String, String)> = match target {
        Target::Unit(name) => vec![
            units
                .iter()
                .find(|c| c.unit == name)
                .map(pick)
                .ok_or_else(|| format!("no server named {name}"))?,
        ],
        Target::Units(names) => names
            .iter()
            .map(|n| {
                units
                    .iter()
                    .find(|c| c.unit == n)
                    .map(pick)
                    .ok_or_else(|| format!("no server named {n}"))
            })
            .collect::<Result<_, _>>()?,
        Target::Group(group) => {
            let found: Vec<_> = units
                .iter()
                .filter(|c| c.groups.iter().any(|g| g == group))
                .map(pick)
                .collect();
            if found.is_empty() {
                return Err(format!("no unit is in group {group}"));
            }
            found
        }
        Target::All => units.iter().map(pick).collect(),
    };
    out.sort();
    // Of two units with one prefix (which `mcpctl verify` refuses), the
    // first by name is served.
    let mut prefixes = HashSet::new();
    out.retain(|(_, prefix)| prefixes.insert(prefix.clone()));
    Ok(out)
}

/// Prefixes two units of `units` would share (an alias equal to another
/// unit's name or alias): each with the two units.
pub fn prefix_collisions(units: &[Candidate<'_>]) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for (i, a) in units.iter().enumerate() {
        for b in &units[i + 1..] {
            let pa = a.alias.unwrap_or(a.unit);
            let pb = b.alias.unwrap_or(b.unit);
            if pa == pb {
                found.push((pa.to_owned(), a.unit.to_owned(), b.unit.to_owned()));
            }
        }
    }
    found
}

/// The name a host sees for tool or prompt `name` of a unit with prefix
/// `prefix`.
pub fn prefixed(prefix: &str, name: &str) -> String {
    format!("{prefix}{SEPARATOR}{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_read_from_the_bridge_arguments_and_resolved_against_the_units() {
        let args =
            |a: &[&str]| Target::of_args(&a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(args(&["one"]), Ok(Target::Unit("one".into())));
        assert_eq!(args(&["@dev"]), Ok(Target::Group("dev".into())));
        assert_eq!(args(&["@all"]), Ok(Target::All));
        assert_eq!(
            args(&["a", "b", "a"]),
            Ok(Target::Units(vec!["a".into(), "b".into()]))
        );
        assert!(args(&["a", "@dev"]).is_err());
        assert!(args(&["@"]).is_err());
        assert!(args(&[]).is_err());
        for target in [
            Target::Unit("x".into()),
            Target::Units(vec!["a".into(), "b".into()]),
            Target::Group("g".into()),
            Target::All,
        ] {
            assert_eq!(Target::parse(&target.label()), Ok(target));
        }
        let dev = vec!["dev".to_owned()];
        let none: Vec<String> = Vec::new();
        let units = [
            Candidate {
                unit: "gh",
                alias: None,
                groups: &dev,
            },
            Candidate {
                unit: "github",
                alias: Some("gh"),
                groups: &dev,
            },
            Candidate {
                unit: "time",
                alias: None,
                groups: &none,
            },
        ];
        assert_eq!(
            members_of(&Target::Group("dev".into()), &units),
            Ok(vec![("gh".into(), "gh".into())]),
            "of two units with one prefix, the first by name"
        );
        assert_eq!(members_of(&Target::All, &units).map(|m| m.len()), Ok(2));
        assert!(members_of(&Target::Group("none".into()), &units).is_err());
        assert!(members_of(&Target::Units(vec!["time".into(), "nope".into()]), &units).is_err());
        assert_eq!(
            prefix_collisions(&units),
            [("gh".to_owned(), "gh".to_owned(), "github".to_owned())]
        );
    }
}
