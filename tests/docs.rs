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
