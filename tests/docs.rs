//! Documentation stays true: man pages lint clean and list every key.

use crate::helper::{root, run};

#[test]
fn man_pages_are_mandoc_lint_clean() {
    let pages: Vec<_> = std::fs::read_dir(root().join("man"))
        .expect("man/")
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(!pages.is_empty());
    for page in pages {
        let out = run(std::process::Command::new("mandoc")
            .args(["-T", "lint", "-W", "warning"])
            .arg(&page));
        let report = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && report.trim().is_empty(),
            "{}:\n{report}",
            page.display()
        );
    }
}

#[test]
fn unit_man_page_documents_every_key() {
    let page = std::fs::read_to_string(root().join("man/mcpd.unit.5")).expect("man/mcpd.unit.5");
    for key in mcpd::unit::vocabulary() {
        let leaf = key.rsplit('.').next().unwrap_or(&key);
        // keys appear as .It Ic KEY (roff escapes '-' as '\-')
        let escaped = leaf.replace('-', "\\-");
        assert!(
            page.contains(&format!(".It Ic {escaped}")) || page.contains(&format!(".It Ic {leaf}")),
            "man/mcpd.unit.5 does not document `{key}`"
        );
    }
}

#[test]
fn mcpctl_man_page_documents_every_subcommand() {
    let page = std::fs::read_to_string(root().join("man/mcpctl.1")).expect("man/mcpctl.1");
    let help = run(crate::helper::mcpctl().arg("--help"));
    let help = String::from_utf8_lossy(&help.stdout);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 12, "{commands:?}");
    for command in commands {
        assert!(
            page.contains(&format!(".It Cm {command}")),
            "mcpctl {command} is not in man/mcpctl.1"
        );
    }
}

#[test]
fn completions_are_generated_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = run(crate::helper::mcpctl().args(["completions", shell]));
        assert!(out.status.success());
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("restart") && script.contains("verify"),
            "{shell}: {script}"
        );
    }
}

/// Every `.rs` file under `dir` (relative to the package root), with its text.
fn sources(dir: &str) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut todo = vec![root().join(dir)];
    while let Some(path) = todo.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read_dir") {
                todo.push(entry.expect("entry").path());
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read");
            out.push((path, text));
        }
    }
    assert!(!out.is_empty(), "no sources under {dir}");
    out
}

/// Lines of `text` that are code, not comments.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
}

#[test]
fn the_dbus_adapter_does_not_reach_into_the_daemon() {
    // ARCHITECTURE.md: the daemon wires D-Bus in; D-Bus and the daemon share
    // only the leaf `src/model.rs`, which imports neither.
    let mut offenders = Vec::new();
    for (path, text) in sources("src/dbus") {
        for (n, line) in code_lines(&text) {
            if line.contains("crate::daemon") {
                offenders.push(format!("{}:{n}: {}", path.display(), line.trim()));
            }
        }
    }
    let model = std::fs::read_to_string(root().join("src/model.rs")).expect("src/model.rs");
    for (n, line) in code_lines(&model) {
        if line.contains("crate::daemon") || line.contains("crate::dbus") {
            offenders.push(format!("src/model.rs:{n}: {}", line.trim()));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

#[test]
fn only_src_dbus_knows_zbus() {
    let mut offenders = Vec::new();
    for (path, text) in sources("src") {
        if path.starts_with(root().join("src/dbus")) {
            continue;
        }
        for (n, line) in code_lines(&text) {
            if line.contains("zbus::") || line.contains("use zbus") {
                offenders.push(format!("{}:{n}: {}", path.display(), line.trim()));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}
