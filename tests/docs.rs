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
