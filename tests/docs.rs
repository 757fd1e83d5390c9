//! Documentation stays true: man pages lint clean and list every key, the
//! code keeps the layering ARCHITECTURE.md states and names JSON-RPC error
//! codes and MCP methods in one place each, and the tests are what
//! tests/tests.rs says (every file a module of the one binary; `pure/`
//! starts no process).

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
fn settings_man_page_documents_every_section_and_key() {
    let page = std::fs::read_to_string(root().join("man/mcpd.kdl.5")).expect("man/mcpd.kdl.5");
    let keys = mcpd::unit::settings::SECTIONS
        .iter()
        .chain(mcpd::unit::settings::HTTP_KEYS)
        .chain(mcpd::unit::settings::TELEMETRY_KEYS);
    for key in keys {
        let escaped = key.replace('-', "\\-");
        assert!(
            page.contains(&format!(".It Ic {escaped}")) || page.contains(&format!(".It Ic {key}")),
            "man/mcpd.kdl.5 does not document `{key}`"
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

/// One layering rule: the code under `under` (a directory or one file,
/// relative to the package root) names none of `forbidden`, except where a
/// row of `allowed` lets one file name one pattern. Patterns are matched
/// as text within a line of code and within every path a `use` names.
struct Layer {
    under: &'static str,
    forbidden: &'static [&'static str],
    /// `(file, pattern)`: a file under `under` that may name `pattern`.
    allowed: &'static [(&'static str, &'static str)],
    /// Why the rule holds, for the failure message.
    why: &'static str,
}

/// What a pure module may not name: tasks, files, sockets, processes and
/// clocks.
const NO_IO_NO_CLOCK: &[&str] = &[
    "tokio",
    "std::fs",
    "std::net",
    "std::process",
    "Instant::now",
    "SystemTime::now",
];

/// The layering of ARCHITECTURE.md's invariants, one row per rule. Adding a
/// pure module is adding a row.
const LAYERS: &[Layer] = &[
    Layer {
        under: "src/unit/",
        forbidden: NO_IO_NO_CLOCK,
        // The unit pipeline reads files and nothing else: `load.rs` reads a
        // unit's main file and drop-ins (and stamps them, and checks that
        // sandbox paths exist), `search.rs` lists the unit directories and
        // a file's drop-in directory and recognises masks, and
        // `instance.rs` asks whether `/run/user/UID` is a directory the
        // user owns (the one fact of the runtime directory's rule that is
        // on disk); `settings.rs` reads the daemon's `mcpd.kdl`.
        allowed: &[
            ("src/unit/load.rs", "std::fs"),
            ("src/unit/search.rs", "std::fs"),
            ("src/unit/instance.rs", "std::fs"),
            ("src/unit/settings.rs", "std::fs"),
        ],
        why: "src/unit/ is pure: it reads unit files, runs no task, process or \
              socket and reads no clock",
    },
    Layer {
        under: "src/supervisor/machine.rs",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "the machine is pure: no tasks, no I/O, no clock (it is handed `now`)",
    },
    Layer {
        under: "src/mux/route.rs",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "the router is pure: no tasks, no I/O, no clock",
    },
    Layer {
        under: "src/mux/method.rs",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "the table of MCP methods is pure: no tasks, no I/O, no clock",
    },
    Layer {
        under: "src/mux/session/",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "the host-session core is pure: no tasks, no I/O, no clock",
    },
    Layer {
        under: "src/mux/era.rs",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "the translation between eras is pure: no tasks, no I/O, no clock, \
              no randomness (instants and the nonce are handed in)",
    },
    Layer {
        under: "src/mux/aggregate.rs",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "the aggregate's routing is pure: no tasks, no I/O, no clock",
    },
    Layer {
        under: "src/aggregate.rs",
        forbidden: &["crate::daemon", "crate::dbus"],
        allowed: &[],
        why: "the aggregate's task is started by the attach socket and by D-Bus alike",
    },
    Layer {
        under: "src/endpoint/",
        forbidden: &["crate::daemon", "crate::dbus"],
        allowed: &[],
        why: "the HTTP endpoint attaches host sessions as the attach socket does; \
              the daemon starts it and hands it its settings",
    },
    Layer {
        under: "src/",
        forbidden: &["hyper::", "hyper_util::"],
        allowed: &[
            ("src/endpoint/mod.rs", "hyper::"),
            ("src/endpoint/mod.rs", "hyper_util::"),
            ("src/endpoint/conn.rs", "hyper::"),
        ],
        why: "the HTTP server is the endpoint's alone",
    },
    Layer {
        under: "src/mux/target.rs",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "what an aggregate is over is pure: no tasks, no I/O, no clock",
    },
    Layer {
        under: "src/mux/tasks.rs",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "whose task a task id is, is pure: no tasks, no I/O, no clock",
    },
    Layer {
        under: "src/mux/shape.rs",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "what a host's message must look like is pure: no tasks, no I/O, no clock",
    },
    Layer {
        under: "src/mux/lists.rs",
        forbidden: NO_IO_NO_CLOCK,
        allowed: &[],
        why: "the list reader is pure: no tasks, no I/O, no clock (it is handed `now`)",
    },
    Layer {
        under: "src/",
        forbidden: &["rmcp::"],
        // The Streamable HTTP client is rmcp's transport; Supervisor::call_tool
        // still returns rmcp's CallToolResult, which D-Bus `CallTool`
        // serializes as it always has, and ToolList hands D-Bus `Tools` as
        // rmcp's Tool.
        allowed: &[
            ("src/supervisor/http.rs", "rmcp::"),
            ("src/supervisor/oauth.rs", "rmcp::"),
            ("src/supervisor/actor.rs", "rmcp::"),
            ("src/supervisor/mod.rs", "rmcp::"),
            ("src/supervisor/tools.rs", "rmcp::"),
        ],
        why: "rmcp stays in the supervisor's launcher (its HTTP transport and OAuth) and the \
              types of the D-Bus CallTool and Tools answers: mcpd's own sessions speak \
              JSON-RPC as `Message`s",
    },
    Layer {
        under: "src/mux/",
        forbidden: &["crate::supervisor", "crate::daemon", "crate::dbus"],
        allowed: &[],
        why: "mux is below the supervisor, the daemon and D-Bus, which use it",
    },
];

/// Each code line of `text` before its `#[cfg(test)] mod tests` block, with
/// what it names: the line itself and, for a line that starts a `use`
/// declaration, every path of the whole declaration with its braces
/// expanded, so `use std::{\n fs,\n};` names `std::fs` at its first line.
fn named(text: &str) -> Vec<(usize, &str, String)> {
    let lines = before_tests(text);
    let lines = &lines[..];
    let mut out = Vec::new();
    for (i, &(n, line)) in lines.iter().enumerate() {
        let mut names = line.to_owned();
        let code = line.trim_start();
        // `pub use`, `pub(crate) use` and `use` alike.
        let code = match code.strip_prefix("pub") {
            Some(rest) => rest.split_once(' ').map_or(rest, |(_, r)| r),
            None => code,
        };
        if let Some(tree) = code.strip_prefix("use ") {
            let mut decl = tree.trim_end().to_owned();
            let mut next = lines[i + 1..].iter();
            while !decl.ends_with(';') {
                let Some((_, l)) = next.next() else { break };
                decl.push_str(l.trim());
            }
            let mut paths = Vec::new();
            use_paths("", decl.trim_end_matches(';'), &mut paths);
            names.push(' ');
            names.push_str(&paths.join(" "));
        }
        out.push((n, line, names));
    }
    out
}

/// The code lines of `text` before its `#[cfg(test)] mod tests` block
/// (`pub(crate) mod tests` too): tests at the end of a file may use what
/// the module may not (a temp directory, a clock, a method's name), so
/// the checks stop at their block.
fn before_tests(text: &str) -> Vec<(usize, &str)> {
    let mut lines: Vec<(usize, &str)> = code_lines(text).collect();
    let end = lines
        .windows(2)
        .position(|w| {
            w[0].1 == "#[cfg(test)]"
                && (w[1].1.starts_with("mod tests") || w[1].1.starts_with("pub(crate) mod tests"))
        })
        .unwrap_or(lines.len());
    lines.truncate(end);
    lines
}

/// Every path of a use tree, braces expanded: `std::{fs, net::TcpStream}`
/// gives `std::fs` and `std::net::TcpStream`.
fn use_paths(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        if !tree.is_empty() {
            out.push(format!("{prefix}{tree}"));
        }
        return;
    };
    let head = format!("{prefix}{}", &tree[..open]);
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                use_paths(&head, &inner[start..i], out);
                start = i + 1;
            }
            _ => {}
        }
    }
    use_paths(&head, &inner[start..], out);
}

#[test]
fn the_layering_check_sees_grouped_imports_and_skips_tests() {
    let text = "use std::{\n    fmt,\n    net::{self, TcpStream},\n};\n// tokio\n\
                fn f() {}\n#[cfg(test)]\nmod tests {\n    use tokio;\n}\n";
    let named = named(text);
    assert_eq!(named[0].0, 1);
    assert!(named[0].2.contains("std::net::self"), "{named:?}");
    assert!(named[0].2.contains("std::net::TcpStream"), "{named:?}");
    assert!(
        named.iter().all(|(_, _, names)| !names.contains("tokio")),
        "{named:?}"
    );
}

#[test]
fn pure_modules_and_mux_keep_their_layers() {
    let mut offenders = Vec::new();
    let mut used = std::collections::HashSet::new();
    for layer in LAYERS {
        for (path, text) in sources(layer.under) {
            let file = path
                .strip_prefix(root())
                .unwrap_or(&path)
                .display()
                .to_string();
            for (n, line, names) in named(&text) {
                for pattern in layer.forbidden {
                    if !names.contains(pattern) {
                        continue;
                    }
                    if layer.allowed.contains(&(file.as_str(), *pattern)) {
                        used.insert((file.clone(), *pattern));
                        continue;
                    }
                    offenders.push(format!(
                        "{file}:{n}: {} (names `{pattern}`; {})",
                        line.trim(),
                        layer.why
                    ));
                }
            }
        }
        // An exception no longer needed goes, so the list stays the truth.
        for &(file, pattern) in layer.allowed {
            if !used.contains(&(file.to_owned(), pattern)) {
                offenders.push(format!(
                    "{file}: allowed to name `{pattern}` but does not: drop the exception"
                ));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// Files under `src/` other than `src/mux/error.rs` that may still write a
/// JSON-RPC error code as a number in their code, each for a reason given
/// beside it. Empty: `ErrorCode` names every code (REVIEW §10.1). An entry
/// no longer needed fails the check, as `LAYERS`' exceptions do.
const CODES_ALLOWED: &[&str] = &[
    // None: a code is named in `mux::error::ErrorCode`, nowhere else.
];

/// Whether `line` holds a JSON-RPC error code as a number: `-32` and three
/// digits (`-32\d{3}`).
fn json_rpc_code(line: &str) -> bool {
    line.match_indices("-32").any(|(at, _)| {
        let digits = line.as_bytes().get(at + 3..at + 6).unwrap_or_default();
        digits.len() == 3 && digits.iter().all(u8::is_ascii_digit)
    })
}

#[test]
fn the_error_code_check_sees_codes_in_code_and_skips_comments_and_tests() {
    assert!(json_rpc_code("(-32600, why)"));
    assert!(json_rpc_code(r#""{\"code\":-32000}""#));
    assert!(!json_rpc_code("-32 and -3260 are not codes; -3"));
    let text = "// -32601 in prose\n/// `-32602` in docs\nlet c = -32603;\n\
                #[cfg(test)]\nmod tests {\n    const C: i64 = -32700;\n}\n";
    let found: Vec<usize> = named(text)
        .into_iter()
        .filter(|(_, line, _)| json_rpc_code(line))
        .map(|(n, _, _)| n)
        .collect();
    assert_eq!(found, [3]);
}

/// ARCHITECTURE.md: `mux::error::ErrorCode` is the only place a JSON-RPC
/// error code is written as a number; everything else names it.
#[test]
fn json_rpc_error_codes_are_named_only_in_mux_error() {
    let mut offenders = Vec::new();
    let mut used = std::collections::HashSet::new();
    for (path, text) in sources("src") {
        let file = path
            .strip_prefix(root())
            .unwrap_or(&path)
            .display()
            .to_string();
        if file == "src/mux/error.rs" {
            continue;
        }
        for (n, line, _) in named(&text) {
            if !json_rpc_code(line) {
                continue;
            }
            if CODES_ALLOWED.contains(&file.as_str()) {
                used.insert(file.clone());
                continue;
            }
            offenders.push(format!(
                "{file}:{n}: {} (a JSON-RPC error code as a number: name it, \
                 `mux::error::ErrorCode`)",
                line.trim()
            ));
        }
    }
    for &file in CODES_ALLOWED {
        if !used.contains(file) {
            offenders.push(format!(
                "{file}: allowed to write an error code as a number but does not: drop the \
                 exception"
            ));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

#[test]
fn mcp_method_names_are_written_in_the_method_table_only() {
    use mcpd::mux::method::Method;
    let quoted: Vec<String> = Method::ALL
        .iter()
        .map(|m| format!("\"{}\"", m.as_str()))
        .collect();
    let mut offenders = Vec::new();
    for (path, text) in sources("src") {
        let file = path
            .strip_prefix(root())
            .unwrap_or(&path)
            .display()
            .to_string();
        if file == "src/mux/method.rs" {
            continue;
        }
        for (n, line) in before_tests(&text) {
            let Some(name) = quoted.iter().find(|q| line.contains(q.as_str())) else {
                continue;
            };
            offenders.push(format!(
                "{file}:{n}: {} (spells {name}: use mcpd::mux::method::Method)",
                line.trim()
            ));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// The `.rs` files `file` declares as modules, resolved as rustc does
/// (no `#[path]`): `mod NAME;` at the top or inside inline `mod NAME { … }`
/// blocks (rustfmt's layout: a block ends at a `}` of its own indent).
/// `owns_dir`: `file` is a crate root or a `mod.rs`, whose children live
/// beside it rather than in a folder named after it.
fn declared_modules(file: &std::path::Path, owns_dir: bool) -> Vec<std::path::PathBuf> {
    let text = std::fs::read_to_string(file).expect("read");
    let base = if owns_dir {
        file.parent().expect("a parent").to_owned()
    } else {
        file.with_extension("")
    };
    let mut open: Vec<(usize, String)> = Vec::new();
    let mut out = Vec::new();
    for (_, line) in code_lines(&text) {
        let indent = line.len() - line.trim_start().len();
        let code = line.trim();
        if code == "}" {
            if open.last().is_some_and(|(at, _)| *at == indent) {
                open.pop();
            }
            continue;
        }
        let code = ["pub(crate) ", "pub(super) ", "pub "]
            .iter()
            .fold(code, |c, vis| c.strip_prefix(vis).unwrap_or(c));
        let Some(rest) = code.strip_prefix("mod ") else {
            continue;
        };
        if let Some(name) = rest.strip_suffix(';') {
            let dir = open.iter().fold(base.clone(), |d, (_, m)| d.join(m));
            let flat = dir.join(format!("{name}.rs"));
            out.push(if flat.exists() {
                flat
            } else {
                dir.join(name).join("mod.rs")
            });
        } else if let Some(name) = rest.strip_suffix(" {") {
            open.push((indent, name.to_owned()));
        }
    }
    out
}

/// Every `.rs` file of the test binary, from `tests/tests.rs` down.
fn test_modules() -> std::collections::BTreeSet<std::path::PathBuf> {
    let crate_root = root().join("tests/tests.rs");
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec![(crate_root, true)];
    while let Some((file, owns_dir)) = todo.pop() {
        if !seen.insert(file.clone()) {
            continue;
        }
        for child in declared_modules(&file, owns_dir) {
            let owns = child.file_name().is_some_and(|n| n == "mod.rs");
            todo.push((child, owns));
        }
    }
    seen
}

#[test]
fn every_test_file_is_a_module_of_the_test_binary() {
    // `autotests = false` (Cargo.toml): cargo builds tests/tests.rs alone,
    // so a file it does not reach is never compiled and never runs.
    let listed = test_modules();
    let mut files = Vec::new();
    let mut todo = vec![root().join("tests")];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            let top = dir == root().join("tests");
            if path.is_dir() {
                // data and npm packages, not test code
                if !(top && path.file_name().is_some_and(|n| n == "data" || n == "npm")) {
                    todo.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(
        files.len() > 30 && files.iter().all(|f| listed.contains(f)),
        "not modules of the test binary, so never run: {:?} (list each in tests/tests.rs)",
        files
            .iter()
            .filter(|f| !listed.contains(*f))
            .map(|f| f.strip_prefix(root()).unwrap_or(f))
            .collect::<Vec<_>>()
    );
    for file in &listed {
        assert!(file.is_file(), "{} is listed but missing", file.display());
    }
}

#[test]
fn the_pure_tests_start_no_process() {
    // `cargo test --test tests pure::` is the fast suite: no daemon, no
    // server, no command.
    let mut offenders = Vec::new();
    for (path, text) in sources("tests/pure") {
        for (n, line) in code_lines(&text) {
            // the code outside string literals (escaped quotes are rare
            // enough here not to matter)
            let code: String = line.split('"').step_by(2).collect();
            for word in [
                "Daemon",
                "Command",
                "fixture_path",
                "mcpctl",
                "tokio::process",
                "Bus::",
            ] {
                if code.contains(word) {
                    let file = path.strip_prefix(root()).unwrap_or(&path).display();
                    offenders.push(format!("{file}:{n}: {}", line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "a pure test starts a process (move it to tests/daemon/):\n{}",
        offenders.join("\n")
    );
}
