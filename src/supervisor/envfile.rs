//! `env-file` parsing: `KEY=VALUE` lines, read at every spawn.
//!
//! Blank lines and `#` comments are skipped, an `export ` prefix is allowed,
//! and a value wrapped in matching single or double quotes loses them (as in
//! systemd's `EnvironmentFile=`). Errors name the file and line but never a
//! value: env-files hold secrets.

use std::path::Path;

use crate::unit::spec::is_env_name;

/// Parses `text`, the content of `path`.
pub fn parse(path: &Path, text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let line = line.strip_prefix("export ").map_or(line, str::trim_start);
        let at = format!("{}:{}", path.display(), i + 1);
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("{at}: expected NAME=VALUE"));
        };
        let name = name.trim_end();
        if !is_env_name(name) {
            return Err(format!(
                "{at}: \"{name}\" is not a valid environment variable name"
            ));
        }
        let value = value.trim_start();
        let value = unquote(value)
            .ok_or_else(|| format!("{at}: unterminated quote in the value of {name}"))?;
        if value.contains('\0') {
            return Err(format!("{at}: the value of {name} contains a NUL byte"));
        }
        out.push((name.to_owned(), value));
    }
    Ok(out)
}

/// Reads and parses an env-file.
pub fn read(path: &Path) -> Result<Vec<(String, String)>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("env-file {}: {e}", path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("env-file {}: not valid UTF-8", path.display()))?;
    parse(path, &text).map_err(|e| format!("env-file {e}"))
}

fn unquote(value: &str) -> Option<String> {
    for quote in ['"', '\''] {
        if let Some(rest) = value.strip_prefix(quote) {
            return rest.strip_suffix(quote).map(str::to_owned);
        }
    }
    Some(value.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_systemd_style_files() {
        let text =
            "# comment\n\nA=1\nexport B = two words \nC=\"quoted = value\"\nD='single'\nE=\n";
        let vars = parse(Path::new("/e.env"), text).expect("valid");
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            vars,
            [
                ("A", "1"),
                ("B", "two words"),
                ("C", "quoted = value"),
                ("D", "single"),
                ("E", "")
            ]
        );
    }

    #[test]
    fn errors_name_file_and_line_but_not_values() {
        let e = parse(Path::new("/e.env"), "A=1\nthis is wrong\n").expect_err("invalid");
        assert_eq!(e, "/e.env:2: expected NAME=VALUE");
        let e = parse(Path::new("/e.env"), "1A=secret\n").expect_err("invalid");
        assert_eq!(
            e,
            "/e.env:1: \"1A\" is not a valid environment variable name"
        );
        let e = parse(Path::new("/e.env"), "TOKEN=\"secret\n").expect_err("invalid");
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn missing_file_names_it() {
        let e = read(Path::new("/nonexistent/mcpd.env")).expect_err("missing");
        assert!(e.starts_with("env-file /nonexistent/mcpd.env: "), "{e}");
    }
}
