//! `mcpctl token new|list|revoke` (DESIGN §15): the HTTP endpoint's
//! tokens, in the instance's state directory (`crate::tokens`). None needs
//! a running daemon: the daemon watches the file, so a new token works and
//! a revoked one stops working (its sessions end) as soon as it is
//! written.

use std::io::Write;
use std::path::Path;

use crate::tokens::{self, Entry, Scope};

use super::client::CtlError;
use super::exit;

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn load(file: &Path) -> Result<Vec<Entry>, CtlError> {
    tokens::load(file).map_err(CtlError::failure)
}

/// `mcpctl token new NAME [--units A,B | --group G] [--expires 30d]`:
/// prints the token, once, on `out`.
pub fn new(
    file: &Path,
    name: &str,
    units: &[String],
    group: Option<&str>,
    expires: Option<&str>,
    out: &mut dyn Write,
) -> Result<u8, CtlError> {
    if !tokens::is_name(name) {
        return Err(CtlError::failure(format!(
            "\"{}\" is not a token name (1 to 128 of A-Z a-z 0-9 _ . -, not starting with . or -)",
            name.escape_debug()
        )));
    }
    // `--units @GROUP` (DESIGN §15's spelling) is `--group GROUP`.
    let (units, group) = match (units, group) {
        ([one], None) if one.starts_with('@') => (&[][..], Some(one.as_str())),
        (units, _) if units.iter().any(|u| u.starts_with('@')) => {
            return Err(CtlError::failure(
                "--units @GROUP names a group alone: give it without units, or --group GROUP",
            ));
        }
        other => other,
    };
    for unit in units {
        crate::unit::UnitName::new(unit).map_err(|e| CtlError::failure(format!("--units: {e}")))?;
    }
    let scope = match (units.is_empty(), group) {
        (true, None) => Scope::All,
        (false, None) => Scope::Units(units.to_vec()),
        (true, Some(group)) => Scope::Group(group.trim_start_matches('@').to_owned()),
        (false, Some(_)) => {
            return Err(CtlError::failure("give --units or --group, not both"));
        }
    };
    let created = now();
    let expires = match expires {
        None => None,
        Some(text) => {
            let after = humantime::parse_duration(text)
                .map_err(|e| CtlError::failure(format!("--expires {text:?}: {e}")))?;
            Some(created.saturating_add(after.as_secs().max(1)))
        }
    };
    let token = tokens::update(file, |kept| {
        if kept.iter().any(|t| t.name == name) {
            return Err(format!(
                "a token named {name} exists: revoke it first (mcpctl token revoke {name})"
            ));
        }
        if kept.len() >= tokens::MAX_TOKENS {
            return Err(format!(
                "{} tokens already: revoke some first",
                tokens::MAX_TOKENS
            ));
        }
        let (token, hash) = tokens::mint()?;
        kept.push(Entry {
            name: name.to_owned(),
            hash,
            scope,
            created,
            expires,
        });
        Ok(token)
    })
    .map_err(CtlError::failure)?;
    writeln!(out, "{token}").map_err(CtlError::output)?;
    Ok(exit::OK)
}

fn when(seconds: u64) -> String {
    i64::try_from(seconds)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map_or_else(|| seconds.to_string(), |t| t.to_string())
}

/// `mcpctl token list`: name, scope, created, expires, last used (as the
/// daemon wrote it, to the minute; never a token).
pub fn list(file: &Path, json: bool, out: &mut dyn Write) -> Result<u8, CtlError> {
    let kept = load(file)?;
    let used = tokens::load_used(file);
    let last_used = |t: &Entry| used.get(&t.hash).copied();
    let now = now();
    if json {
        let rows: Vec<serde_json::Value> = kept
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name,
                    "scope": t.scope.label(),
                    "created": when(t.created),
                    "expires": t.expires.map(when),
                    "expired": t.expired(now),
                    "last_used": last_used(t).map(when),
                })
            })
            .collect();
        writeln!(out, "{}", serde_json::Value::Array(rows)).map_err(CtlError::output)?;
        return Ok(exit::OK);
    }
    if kept.is_empty() {
        writeln!(out, "No tokens in {}.", file.display()).map_err(CtlError::output)?;
        return Ok(exit::OK);
    }
    let width = kept.iter().map(|t| t.name.len()).max().unwrap_or(0).max(4);
    let scopes: Vec<String> = kept.iter().map(|t| t.scope.label()).collect();
    let swidth = scopes.iter().map(String::len).max().unwrap_or(0).max(5);
    writeln!(
        out,
        "{:width$}  {:swidth$}  {:20}  {:20}  EXPIRES",
        "NAME", "SCOPE", "CREATED", "LAST USED"
    )
    .map_err(CtlError::output)?;
    for (t, scope) in kept.iter().zip(&scopes) {
        let expires = match t.expires {
            None => "never".to_owned(),
            Some(at) if t.expired(now) => format!("{} (expired)", when(at)),
            Some(at) => when(at),
        };
        let used = last_used(t).map_or_else(|| "never".to_owned(), when);
        writeln!(
            out,
            "{:width$}  {scope:swidth$}  {:20}  {used:20}  {expires}",
            t.name,
            when(t.created)
        )
        .map_err(CtlError::output)?;
    }
    Ok(exit::OK)
}

/// `mcpctl token revoke NAME…`: exit 1 naming each that is not there.
pub fn revoke(file: &Path, names: &[String]) -> Result<u8, CtlError> {
    let missing = tokens::update(file, |kept| {
        let missing: Vec<String> = names
            .iter()
            .filter(|n| !kept.iter().any(|t| &t.name == *n))
            .cloned()
            .collect();
        kept.retain(|t| !names.contains(&t.name));
        Ok(missing)
    })
    .map_err(CtlError::failure)?;
    if missing.is_empty() {
        Ok(exit::OK)
    } else {
        Err(CtlError::failure(format!(
            "no token {} in {}",
            missing.join(", "),
            file.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_at_group_is_the_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = tokens::path(dir.path());
        let mut out = Vec::new();
        new(&file, "g", &["@dev".into()], None, None, &mut out).expect("new");
        assert_eq!(
            tokens::load(&file).expect("load")[0].scope,
            Scope::Group("dev".into())
        );
        let mixed = new(
            &file,
            "m",
            &["@dev".into(), "a".into()],
            None,
            None,
            &mut out,
        );
        assert!(mixed.is_err());
        assert_eq!(tokens::load(&file).expect("load").len(), 1);
    }
}
