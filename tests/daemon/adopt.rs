//! `mcpctl import`, `connect` and `disconnect` (DESIGN §11) against host
//! files written in each host's documented format (`tests/data/hosts/`),
//! in a temporary HOME, and end to end with the daemon.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use crate::helper::{
    Daemon, Snapshot, check_snapshot, fixture_path, mcpctl, mcpctl_user, root, snapshot_mode,
};

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            std::fs::create_dir_all(&target).expect("mkdir");
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// `mcpctl --user ARGS` as a user whose HOME is `home`, in `project`,
/// with only `vars` besides.
fn as_user(home: &Path, project: &Path, vars: &[(String, String)], args: &[&str]) -> Output {
    as_instance("--user", home, project, vars, args)
}

/// `mcpctl FLAG ARGS` (`--user`, `--system`), as [`as_user`].
fn as_instance(
    flag: &str,
    home: &Path,
    project: &Path,
    vars: &[(String, String)],
    args: &[&str],
) -> Output {
    let mut cmd = mcpctl();
    cmd.arg(flag)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .current_dir(project);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().expect("mcpctl")
}

/// Starts `host` (a bridge, as a host would), sends it `initialize` and
/// gives its first line, once it exited after its stdin closed.
fn initialize(mut host: Command) -> String {
    use std::io::{BufRead, Write};
    let mut host = host
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("bridge");
    let mut stdin = host.stdin.take().expect("stdin");
    writeln!(stdin, "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{{}},\"clientInfo\":{{\"name\":\"t\",\"version\":\"1\"}}}}}}").expect("write");
    let mut line = String::new();
    std::io::BufReader::new(host.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    drop(stdin);
    assert!(host.wait().expect("bridge").success(), "{line}");
    line
}

/// Everything in `dir`, file by file with its mode.
fn listing(dir: &Path) -> String {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    let mut out = String::new();
    for path in names {
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        let name = path.file_name().expect("name").to_string_lossy();
        out.push_str(&format!("--- {name} ({mode:o})\n"));
        out.push_str(&std::fs::read_to_string(&path).expect("read"));
    }
    out
}

#[test]
fn every_hosts_documented_format_imports_to_its_snapshot() {
    imports(snapshot_mode());
}

/// Each case of `tests/data/hosts/` imported, against its snapshot.
fn imports(mode: Snapshot) {
    let cases = root().join("tests/data/hosts");
    let mut failures = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&cases)
        .expect("cases")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.path())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 8, "a case per host and a malformed one");
    for case in dirs {
        let home = tempfile::tempdir().expect("home");
        let project = tempfile::tempdir().expect("project");
        copy_tree(&case.join("home"), home.path());
        if case.join("project").is_dir() {
            copy_tree(&case.join("project"), project.path());
        }
        let vars: Vec<(String, String)> = std::fs::read_to_string(case.join("env"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        // A project's files are read only when the host is named.
        let host = case
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let args: Vec<&str> = if case.join("project").is_dir() {
            vec!["import", "--env-file", &host]
        } else {
            vec!["import", "--env-file"]
        };
        let out = as_user(home.path(), project.path(), &vars, &args);
        let units = home.path().join(".config/mcpd/units");
        let mut actual = format!(
            "exit {}\n{}{}",
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        actual.push_str(&listing(&units));
        let actual = actual
            .replace(&home.path().display().to_string(), "$HOME")
            .replace(&project.path().display().to_string(), "$PROJECT");
        // Every unit written loads, and no secret of `env` is in one.
        for (_, value) in &vars {
            for kdl in std::fs::read_dir(&units).into_iter().flatten().flatten() {
                if kdl.path().extension().is_some_and(|e| e == "kdl") {
                    let text = std::fs::read_to_string(kdl.path()).expect("unit");
                    assert!(
                        !text.contains(value.as_str()),
                        "{}: a secret in {text}",
                        case.display()
                    );
                }
            }
        }
        if units.is_dir() {
            let verify = as_user(
                home.path(),
                project.path(),
                &vars,
                &["verify", &units.display().to_string()],
            );
            assert!(
                verify.status.success(),
                "{}: {}",
                case.display(),
                String::from_utf8_lossy(&verify.stderr)
            );
        }
        if let Some(why) = check_snapshot(mode, &case.join("expected"), &actual) {
            failures.push(why);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn imported_servers_run_and_hosts_connect_and_disconnect_byte_for_byte() {
    let home = tempfile::tempdir().expect("home");
    let runtime = tempfile::tempdir().expect("runtime");
    let h = home.path();
    std::fs::create_dir_all(h.join(".config/Claude")).expect("mkdir");
    std::fs::create_dir_all(h.join(".cursor")).expect("mkdir");
    let desktop = h.join(".config/Claude/claude_desktop_config.json");
    let original = format!(
        "{{\n  \"mcpServers\": {{\n    \"fixture\": {{\n      \"command\": \"{}\",\n      \"args\": [\"--chatter\", \"0\"],\n      \"env\": {{ \"FIXTURE_SECRET\": \"s3cr3t-value\" }}\n    }}\n  }},\n  \"globalShortcut\": \"Ctrl+Space\"\n}}\n",
        fixture_path().display()
    );
    std::fs::write(&desktop, &original).expect("desktop config");
    std::fs::write(
        h.join(".cursor/mcp.json"),
        "{\n  \"mcpServers\": {\n    \"remote\": {\n      \"url\": \"https://mcp.example.com/mcp\",\n      \"headers\": { \"Authorization\": \"Bearer tok-in-cursor\" }\n    }\n  }\n}\n",
    )
    .expect("cursor config");
    let user = |args: &[&str]| as_user(h, h, &[], args);
    let out = user(&["import", "--env-file", "claude-desktop", "cursor"]);
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{shown}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let units = h.join(".config/mcpd/units");
    for name in ["fixture", "remote"] {
        let unit = std::fs::read_to_string(units.join(format!("{name}.kdl"))).expect("unit");
        assert!(
            !unit.contains("s3cr3t-value") && !unit.contains("tok-in-cursor"),
            "{unit}"
        );
        let env = units.join(format!("{name}.env"));
        let mode = std::fs::metadata(&env)
            .expect("env-file")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{}", env.display());
    }
    assert!(
        std::fs::read_to_string(units.join("remote.env"))
            .expect("env")
            .contains("AUTHORIZATION=\"Bearer tok-in-cursor\"")
    );
    // A name that is no host and no file is refused, naming the hosts.
    let bad = user(&["import", "--env-file", "cursr"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stdout)
            .contains("\"cursr\" is neither a host (claude-desktop,"),
        "{}",
        String::from_utf8_lossy(&bad.stdout)
    );
    // A second import changes nothing and says so.
    let before = listing(&units);
    let again = user(&["import", "--env-file", "claude-desktop", "cursor"]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("unchanged"));
    assert_eq!(listing(&units), before);

    // The daemon runs the imported stdio unit, with its secret.
    let mut d = Daemon::user_no_bus(
        &units,
        &[
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            ("HOME", h.as_os_str()),
        ],
    );
    d.wait_until("fixture running", |d| d.latest_pid("fixture").is_some());
    let echo = mcpctl_user(
        runtime.path(),
        &["call", "fixture", "echo", "{\"text\":\"hi\"}"],
    );
    assert_eq!(String::from_utf8_lossy(&echo.stdout).trim(), "hi");
    let env = mcpctl_user(runtime.path(), &["call", "fixture", "env", "{}"]);
    let env: serde_json::Value = serde_json::from_slice(&env.stdout).expect("env");
    assert_eq!(env["FIXTURE_SECRET"], "s3cr3t-value");

    // connect: the entry runs `mcpctl bridge fixture`, every other key stays.
    let out = user(&["connect", "claude-desktop"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let connected = std::fs::read_to_string(&desktop).expect("config");
    let value: serde_json::Value = serde_json::from_str(&connected).expect("json");
    assert_eq!(value["globalShortcut"], "Ctrl+Space");
    assert_eq!(
        value["mcpServers"]["fixture"]["args"],
        serde_json::json!(["--user", "bridge", "fixture"])
    );
    let bridge = value["mcpServers"]["fixture"]["command"]
        .as_str()
        .expect("command");
    assert!(Path::new(bridge).is_absolute(), "{bridge}");
    // … and a host starting it that way reaches the managed server.
    let mut host = Command::new(bridge);
    host.args(["--user", "bridge", "fixture"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .env_remove("DBUS_SESSION_BUS_ADDRESS");
    let line = initialize(host);
    assert!(
        line.contains("\"id\":1") && line.contains("serverInfo"),
        "{line}"
    );
    // disconnect: the original, byte for byte.
    let out = user(&["disconnect", "claude-desktop"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&desktop).expect("config"), original);
    assert!(
        !h.join(".config/Claude/claude_desktop_config.json.mcpd-backup")
            .exists()
    );
    let again = user(&["disconnect", "claude-desktop"]);
    assert!(!again.status.success(), "not connected any more");
    drop(d);
}

#[test]
fn dry_run_writes_nothing_only_picks_entries_and_force_replaces() {
    let home = tempfile::tempdir().expect("home");
    let h = home.path();
    std::fs::create_dir_all(h.join(".cursor")).expect("mkdir");
    let config = h.join(".cursor/mcp.json");
    std::fs::write(
        &config,
        "{\n  // two servers\n  \"mcpServers\": {\n    \"one\": { \"command\": \"one-mcp\" },\n    \"two\": { \"command\": \"two-mcp\", \"args\": [\"--v1\"] }\n  }\n}\n",
    )
    .expect("config");
    let user = |args: &[&str]| as_user(h, h, &[], args);
    let stdout = |out: &Output| String::from_utf8_lossy(&out.stdout).into_owned();
    let units = h.join(".config/mcpd/units");

    let dry = user(&["import", "--env-file", "--dry-run", "cursor"]);
    assert!(dry.status.success());
    assert!(
        stdout(&dry)
            .lines()
            .any(|l| l.starts_with("cursor  one ") && l.ends_with("would import")),
        "{}",
        stdout(&dry)
    );
    assert!(!units.exists(), "a dry run writes nothing");

    let only = user(&["import", "--env-file", "cursor", "--only", "two"]);
    assert!(only.status.success(), "{}", stdout(&only));
    assert!(units.join("two.kdl").is_file());
    assert!(!units.join("one.kdl").exists(), "{}", stdout(&only));

    // The host's entry changed: kept without --force, replaced with it.
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .expect("read")
            .replace("--v1", "--v2"),
    )
    .expect("edit");
    let kept = user(&["import", "--env-file", "cursor", "--only", "two"]);
    assert!(kept.status.success());
    assert!(
        stdout(&kept).contains("exists (--force replaces it)"),
        "{}",
        stdout(&kept)
    );
    assert!(
        std::fs::read_to_string(units.join("two.kdl"))
            .expect("unit")
            .contains("--v1")
    );
    let forced = user(&["import", "--env-file", "cursor", "--only", "two", "--force"]);
    assert!(forced.status.success());
    assert!(
        std::fs::read_to_string(units.join("two.kdl"))
            .expect("unit")
            .contains("--v2")
    );

    // A project's servers (a repository just cloned) only when the host
    // is named.
    let project = tempfile::tempdir().expect("project");
    std::fs::create_dir_all(project.path().join(".vscode")).expect("mkdir");
    std::fs::write(
        project.path().join(".vscode/mcp.json"),
        "{ \"servers\": { \"repo-tool\": { \"type\": \"stdio\", \"command\": \"./run-me\" } } }",
    )
    .expect("project config");
    let all = as_user(
        h,
        project.path(),
        &[],
        &["import", "--env-file", "--dry-run"],
    );
    assert!(!stdout(&all).contains("repo-tool"), "{}", stdout(&all));
    let named = as_user(
        h,
        project.path(),
        &[],
        &["import", "--env-file", "--dry-run", "vscode"],
    );
    assert!(
        stdout(&named).contains("repo-tool.kdl"),
        "{}",
        stdout(&named)
    );

    // connect --dry-run prints the diff and changes nothing.
    let before = std::fs::read_to_string(&config).expect("read");
    let diff = user(&["connect", "--dry-run", "cursor"]);
    assert!(
        diff.status.success(),
        "{}",
        String::from_utf8_lossy(&diff.stderr)
    );
    let shown = stdout(&diff);
    assert!(
        shown.starts_with(&format!("--- {}", config.display())),
        "{shown}"
    );
    assert!(
        shown.contains("-    \"two\": { \"command\": \"two-mcp\", \"args\": [\"--v2\"] }"),
        "{shown}"
    );
    assert!(shown.contains("\"bridge\", \"two\""), "{shown}");
    assert!(
        !shown.contains("\"bridge\", \"one\""),
        "only units are connected: {shown}"
    );
    assert_eq!(std::fs::read_to_string(&config).expect("read"), before);
    assert!(!h.join(".cursor/mcp.json.mcpd-backup").exists());

    // Edits between two connects survive disconnect.
    assert!(user(&["connect", "cursor"]).status.success());
    let connected = std::fs::read_to_string(&config).expect("read");
    std::fs::write(
        &config,
        connected.replacen("{\n", "{\n  \"theme\": \"dark\",\n", 1),
    )
    .expect("edit");
    assert!(user(&["connect", "cursor", "two"]).status.success());
    let out = user(&["disconnect", "cursor"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = std::fs::read_to_string(&config).expect("read");
    assert!(
        after.contains("\"theme\": \"dark\""),
        "the edit is kept: {after}"
    );
    assert!(
        after.contains("two-mcp") && after.contains("--v2"),
        "{after}"
    );
    assert!(!after.contains("bridge"), "{after}");
}

/// A temporary HOME holding case `name`'s `home/` of `tests/data/hosts/`.
struct Case(tempfile::TempDir);

impl Case {
    fn new(name: &str) -> Self {
        let home = tempfile::tempdir().expect("home");
        copy_tree(
            &root().join("tests/data/hosts").join(name).join("home"),
            home.path(),
        );
        Case(home)
    }

    fn home(&self) -> &Path {
        self.0.path()
    }

    /// `mcpctl --user ARGS` as its user, in its home.
    fn run(&self, args: &[&str]) -> Output {
        as_user(self.home(), self.home(), &[], args)
    }
}

/// A host's JSON-with-comments file, as a value.
fn jsonc(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("host file");
    jsonc_parser::parse_to_serde_value(&text, &Default::default()).expect("jsonc")
}

fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// What a command that must succeed said.
fn succeeded(out: &Output) -> String {
    assert!(out.status.success(), "{}", said(out));
    said(out)
}

#[test]
fn connect_bridges_each_entry_to_the_unit_imported_from_it_never_by_name_alone() {
    // Claude Code's `time` runs Paris time, Gemini's Tokyo: two units.
    let case = Case::new("two-times");
    let h = case.home();
    let user = |args: &[&str]| case.run(args);
    let out = succeeded(&user(&["import", "--env-file"]));
    assert!(
        out.lines().any(|l| l.starts_with("gemini ")
            && l.contains(" time-gemini.kdl ")
            && l.contains("renamed: time is claude-code's")),
        "{out}"
    );
    let settings = h.join(".gemini/settings.json");
    let original = std::fs::read_to_string(&settings).expect("settings");

    let out = succeeded(&user(&["connect", "gemini"]));
    assert!(
        out.contains("gemini: time → mcpctl bridge time-gemini (imported from this entry)"),
        "{out}"
    );
    assert_eq!(
        jsonc(&settings)["mcpServers"]["time"]["args"],
        serde_json::json!(["--user", "bridge", "time-gemini"])
    );
    // Connecting again pairs them the same.
    let again = succeeded(&user(&["connect", "gemini"]));
    assert!(
        again.contains("gemini: time → mcpctl bridge time-gemini (imported from this entry)"),
        "{again}"
    );
    assert!(user(&["disconnect", "gemini"]).status.success());
    assert_eq!(
        std::fs::read_to_string(&settings).expect("settings"),
        original
    );

    // Unit `time` is Claude Code's: Gemini's `time` is not replaced by it.
    let named = user(&["connect", "gemini", "time"]);
    assert_eq!(named.status.code(), Some(1), "{}", said(&named));
    assert!(
        said(&named).contains(&format!(
            "entry time is not the server of unit time (imported from claude-code ({}/.claude.json, entry \"time\"))",
            h.display()
        )),
        "{}",
        said(&named)
    );
    assert_eq!(
        std::fs::read_to_string(&settings).expect("settings"),
        original
    );

    let out = succeeded(&user(&["connect", "claude-code"]));
    assert!(
        out.contains("claude-code: time → mcpctl bridge time (imported from this entry)"),
        "{out}"
    );
    let claude = jsonc(&h.join(".claude.json"));
    assert_eq!(
        claude["mcpServers"]["time"]["args"],
        serde_json::json!(["--user", "bridge", "time"])
    );
}

#[test]
fn connect_keeps_the_hosts_own_settings_and_import_its_tool_filter() {
    let case = Case::new("two-times");
    let h = case.home();
    assert!(case.run(&["import", "--env-file"]).status.success());
    // Gemini's excludeTools holds on every path: it is the unit's.
    let unit = std::fs::read_to_string(h.join(".config/mcpd/units/time-gemini.kdl")).expect("unit");
    assert!(
        unit.contains("tools {\n    deny \"convert_time\"\n}"),
        "{unit}"
    );
    succeeded(&case.run(&["connect", "gemini"]));
    let time = &jsonc(&h.join(".gemini/settings.json"))["mcpServers"]["time"];
    assert_eq!(time["timeout"], 30000, "{time}");
    assert_eq!(time["trust"], false, "{time}");
    assert_eq!(time["excludeTools"], serde_json::json!(["convert_time"]));
    assert_eq!(
        time["args"],
        serde_json::json!(["--user", "bridge", "time-gemini"])
    );
}

#[test]
fn connect_keeps_its_backup_and_record_private_whatever_the_hosts_file_mode() {
    let case = Case::new("two-times");
    let h = case.home();
    let settings = h.join(".gemini/settings.json");
    // Gemini writes its settings 0644; the original may hold secrets.
    std::fs::set_permissions(&settings, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert!(case.run(&["import", "--env-file"]).status.success());
    succeeded(&case.run(&["connect", "gemini"]));
    let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
    let backup = h.join(".gemini/settings.json.mcpd-backup");
    let record = h.join(".gemini/settings.json.mcpd-connect.json");
    assert_eq!(mode(&backup), 0o600);
    assert_eq!(mode(&record), 0o600);
    assert_eq!(mode(&settings), 0o644, "the host's own file keeps its mode");
    // A backup an earlier mcpd left readable is tightened by the next
    // connect.
    std::fs::set_permissions(&backup, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    succeeded(&case.run(&["connect", "gemini"]));
    assert_eq!(mode(&backup), 0o600);
    assert_eq!(mode(&record), 0o600);
}

#[test]
fn disconnect_after_the_host_removed_an_entry_puts_back_the_rest() {
    let case = Case::new("two-times");
    let h = case.home();
    let claude = h.join(".claude.json");
    let original = std::fs::read_to_string(&claude).expect("config");
    assert!(case.run(&["import", "--env-file"]).status.success());
    assert!(case.run(&["connect", "claude-code"]).status.success());
    // `claude mcp remove memory`: Claude Code writes its whole file again.
    let mut value = jsonc(&claude);
    value["mcpServers"]
        .as_object_mut()
        .expect("servers")
        .remove("memory");
    value["numStartups"] = 13.into();
    let removed = serde_json::to_string_pretty(&value).expect("json");
    std::fs::write(&claude, &removed).expect("write");

    let out = succeeded(&case.run(&["disconnect", "claude-code"]));
    assert!(
        out.contains(
            "claude-code: memory (mcpctl bridge memory) was removed since `mcpctl connect`: left removed"
        ),
        "{out}"
    );
    let after = jsonc(&claude);
    assert_eq!(after["numStartups"], 13);
    assert!(after["mcpServers"].get("memory").is_none(), "{after}");
    assert_eq!(
        after["mcpServers"]["time"],
        jsonc_parser::parse_to_serde_value::<serde_json::Value>(&original, &Default::default())
            .expect("original")["mcpServers"]["time"]
    );
    assert!(!h.join(".claude.json.mcpd-backup").exists());

    // --force puts back the backup whole, the host's changes too.
    let before = std::fs::read_to_string(&claude).expect("config");
    assert!(case.run(&["connect", "claude-code"]).status.success());
    let connected = std::fs::read_to_string(&claude).expect("config");
    std::fs::write(&claude, connected.replace("\"time\"", "\"clock\"")).expect("write");
    let out = succeeded(&case.run(&["disconnect", "--force", "claude-code"]));
    assert!(out.contains("restored whole from the backup"), "{out}");
    assert_eq!(std::fs::read_to_string(&claude).expect("config"), before);
}

#[test]
fn connect_tells_the_bridge_where_a_runtime_directory_hosts_cannot_find_is() {
    let home = tempfile::tempdir().expect("home");
    let runtime = tempfile::tempdir().expect("runtime");
    let h = home.path();
    std::fs::create_dir_all(h.join(".gemini")).expect("mkdir");
    let settings = h.join(".gemini/settings.json");
    std::fs::write(
        &settings,
        format!(
            "{{\n  \"mcpServers\": {{\n    \"fixture\": {{ \"command\": \"{}\", \"args\": [\"--chatter\", \"0\"], \"timeout\": 30000 }}\n  }}\n}}\n",
            fixture_path().display()
        ),
    )
    .expect("settings");
    // The user's shell and daemon share a runtime directory that a host's
    // default environment does not lead to.
    let xdg = [(
        "XDG_RUNTIME_DIR".to_owned(),
        runtime.path().display().to_string(),
    )];
    let user = |args: &[&str]| as_user(h, h, &xdg, args);
    succeeded(&user(&["import", "--env-file", "gemini"]));
    let mut d = Daemon::user_no_bus(
        &h.join(".config/mcpd/units"),
        &[
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            ("HOME", h.as_os_str()),
        ],
    );
    d.wait_until("fixture running", |d| d.latest_pid("fixture").is_some());
    let status = user(&["status"]);
    assert!(
        String::from_utf8_lossy(&status.stderr).contains(&format!(
            "warning: the runtime directory {}/mcpd is not where hosts",
            runtime.path().display()
        )),
        "{}",
        said(&status)
    );
    let out = succeeded(&user(&["connect", "gemini"]));
    assert!(out.contains("each entry sets MCPD_RUNTIME_DIR"), "{out}");
    let entry = jsonc(&settings)["mcpServers"]["fixture"].clone();
    assert_eq!(entry["timeout"], 30000, "{entry}");
    // A host starts it with the SDKs' default environment and the entry's.
    let mut host = Command::new(entry["command"].as_str().expect("command"));
    host.args(
        entry["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("arg")),
    )
    .env_clear()
    .env("HOME", h)
    .env("PATH", "/usr/bin:/bin");
    for (k, v) in entry["env"].as_object().expect("env") {
        host.env(k, v.as_str().expect("value"));
    }
    let line = initialize(host);
    assert!(line.contains("serverInfo"), "{line}");
    drop(d);
}

#[test]
fn import_says_where_units_go_and_connect_names_the_instance_that_has_them() {
    let case = Case::new("two-times");
    let h = case.home();
    // As root a plain import is the system instance's: the table says so,
    // a dry run too (which writes nothing, so it runs here).
    let system = |args: &[&str]| as_instance("--system", h, h, &[], args);
    let dry = succeeded(&system(&["import", "--env-file", "--dry-run"]));
    assert!(
        dry.ends_with("\nUnits would be written to /etc/mcpd/units (system instance).\n"),
        "{dry}"
    );
    let units = h.join(".config/mcpd/units");
    let dry = succeeded(&case.run(&["import", "--env-file", "--dry-run"]));
    assert!(
        dry.ends_with(&format!(
            "\nUnits would be written to {} (user instance).\n",
            units.display()
        )),
        "{dry}"
    );
    let done = succeeded(&case.run(&["import", "--env-file"]));
    assert!(
        done.contains(&format!(
            "\nUnits are in {} (user instance); a running mcpd",
            units.display()
        )),
        "{done}"
    );
    // connect without --user, for units only the user instance has.
    let settings = h.join(".gemini/settings.json");
    let refused = system(&["connect", "gemini"]);
    assert_eq!(refused.status.code(), Some(1), "{}", said(&refused));
    assert!(
        said(&refused).contains(&format!(
            "none of the servers in {} is a unit of the system instance: they are units of the user instance: use --user",
            settings.display()
        )),
        "{}",
        said(&refused)
    );
    let named = system(&["connect", "gemini", "time-gemini"]);
    assert!(
        said(&named).contains(
            "no unit time-gemini in the system instance's unit directories (/etc/mcpd/units, /run/mcpd/units, /usr/lib/mcpd/units); it is a unit of the user instance: use --user"
        ),
        "{}",
        said(&named)
    );
    assert!(!h.join(".gemini/settings.json.mcpd-backup").exists());
}

#[test]
fn output_whose_reader_went_away_ends_quietly() {
    let case = Case::new("two-times");
    succeeded(&case.run(&["import", "--env-file"]));
    // `mcpctl connect --dry-run gemini | head -0`: the reader is gone
    // before the first write.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = mcpctl()
        .args(["--user", "connect", "--dry-run", "gemini"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", case.home())
        .current_dir(case.home())
        .stdout(writer)
        .output()
        .expect("mcpctl");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert_eq!(out.status.code(), Some(141));
}

#[test]
fn connect_with_a_group_writes_one_entry_for_the_group_and_disconnect_takes_it_back() {
    let case = Case::new("two-times");
    let h = case.home();
    succeeded(&case.run(&["import"]));
    let unit = h.join(".config/mcpd/units/time-gemini.kdl");
    let text = std::fs::read_to_string(&unit).expect("unit");
    std::fs::write(&unit, format!("{text}group \"dev\"\n")).expect("write unit");
    let settings = h.join(".gemini/settings.json");
    let original = std::fs::read_to_string(&settings).expect("settings");

    let nobody = case.run(&["connect", "gemini", "--group", "nobody"]);
    assert_eq!(nobody.status.code(), Some(1), "{}", said(&nobody));
    assert!(said(&nobody).contains("no unit of the user instance is in group nobody"));

    let out = succeeded(&case.run(&["connect", "gemini", "--group", "dev"]));
    assert!(
        out.contains("gemini: dev → mcpctl bridge @dev (the group)"),
        "{out}"
    );
    // Gemini's own `time` is that unit: said, and left to the user.
    assert!(
        out.contains("gemini: time is also unit time-gemini of group dev"),
        "{out}"
    );
    let connected = jsonc(&settings);
    assert_eq!(
        connected["mcpServers"]["dev"]["args"],
        serde_json::json!(["--user", "bridge", "@dev"])
    );
    succeeded(&case.run(&["disconnect", "gemini"]));
    assert_eq!(
        std::fs::read_to_string(&settings).expect("settings"),
        original
    );
}

/// A host with no servers yet has no file: `connect` makes it, where the
/// host's directory is there (Cursor's `~/.cursor`; Claude Code's file
/// is in the home itself), and `disconnect` removes it again; with
/// neither file nor directory, `connect` says the host seems not to be
/// installed and writes nothing.
#[test]
fn connect_makes_a_hosts_missing_file_and_disconnect_removes_it() {
    let home = tempfile::tempdir().expect("home");
    let h = home.path();
    let units = h.join(".config/mcpd/units");
    std::fs::create_dir_all(&units).expect("units");
    std::fs::write(
        units.join("clock.kdl"),
        "stdio {\n    command \"mcp-fixture\"\n}\n",
    )
    .expect("unit");
    let run = |args: &[&str]| as_user(h, h, &[], args);

    let out = run(&["connect", "cursor", "clock"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        said(&out).contains(".cursor/mcp.json: no such file, nor its directory")
            && said(&out).contains("is cursor installed for this user?"),
        "{}",
        said(&out)
    );
    assert!(!h.join(".cursor").exists(), "nothing written");

    std::fs::create_dir(h.join(".cursor")).expect("cursor dir");
    let out = succeeded(&run(&["connect", "cursor", "clock"]));
    assert!(out.contains("cursor: clock → mcpctl bridge clock"), "{out}");
    let made = jsonc(&h.join(".cursor/mcp.json"));
    assert_eq!(
        made["mcpServers"]["clock"]["args"],
        serde_json::json!(["--user", "bridge", "clock"]),
        "{made}"
    );
    let out = succeeded(&run(&["disconnect", "cursor"]));
    assert!(out.contains("removed (mcpctl connect made it)"), "{out}");
    assert!(!h.join(".cursor/mcp.json").exists(), "gone again");
    assert_eq!(
        std::fs::read_dir(h.join(".cursor")).expect("dir").count(),
        0,
        "no backup or record left"
    );

    // A unit connect cannot see (a daemon of `--units DIR`): the
    // directories it looked in, and what to do instead.
    let out = run(&["connect", "cursor", "demo"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        said(&out).contains(&format!(
            "no unit demo in the user instance's unit directories ({}, ",
            units.display()
        )) && said(&out).contains("give the host `mcpctl bridge demo` by hand"),
        "{}",
        said(&out)
    );

    // Claude Code keeps its file in the home.
    succeeded(&run(&["connect", "claude-code", "clock"]));
    let made = jsonc(&h.join(".claude.json"));
    assert_eq!(
        made["mcpServers"]["clock"]["command"]
            .as_str()
            .map(|c| c.ends_with("mcpctl")),
        Some(true),
        "{made}"
    );
    succeeded(&run(&["disconnect", "claude-code"]));
    assert!(!h.join(".claude.json").exists());
}

#[test]
fn import_marks_a_hosts_oauth_entry_and_connect_leaves_it_to_the_host_until_a_login() {
    let home = tempfile::tempdir().expect("home");
    let h = home.path();
    let claude = h.join(".claude.json");
    std::fs::write(
        &claude,
        r#"{
  "mcpServers": {
    "time": { "type": "stdio", "command": "uvx", "args": ["mcp-server-time"] },
    "slack": {
      "type": "http",
      "url": "https://mcp.slack.com/mcp",
      "oauth": { "clientId": "1601185624273.8899143856786", "callbackPort": 3118 }
    }
  }
}
"#,
    )
    .expect("claude.json");
    let user = |args: &[&str]| as_user(h, h, &[], args);
    let out = succeeded(&user(&["import"]));
    assert!(
        out.lines().any(|l| l.contains(" slack.kdl ")
            && l.ends_with("imported; needs login: mcpctl auth login slack")),
        "{out}"
    );
    let unit = std::fs::read_to_string(h.join(".config/mcpd/units/slack.kdl")).expect("unit");
    assert!(
        unit.contains(r#"oauth { client-id "1601185624273.8899143856786"; redirect-port 3118; }"#),
        "{unit}"
    );
    let original = jsonc(&claude)["mcpServers"]["slack"].clone();

    // No login yet: the host keeps its own entry, and is told why.
    let out = succeeded(&user(&["connect", "claude-code"]));
    assert!(
        out.contains("claude-code: time → mcpctl bridge time"),
        "{out}"
    );
    assert!(
        out.contains("claude-code: skipped slack: needs a login: run mcpctl auth login slack, then connect again (--force connects it anyway)"),
        "{out}"
    );
    assert_eq!(jsonc(&claude)["mcpServers"]["slack"], original);
    // Named alone, there is nothing to connect.
    let named = user(&["connect", "claude-code", "slack"]);
    assert_eq!(named.status.code(), Some(1), "{}", said(&named));
    assert!(
        said(&named).contains("skipped slack: needs a login"),
        "{}",
        said(&named)
    );
    assert_eq!(jsonc(&claude)["mcpServers"]["slack"], original);

    // --force connects it anyway.
    let out = succeeded(&user(&["connect", "claude-code", "--force"]));
    assert!(
        out.contains("claude-code: slack → mcpctl bridge slack"),
        "{out}"
    );
    assert_eq!(
        jsonc(&claude)["mcpServers"]["slack"]["args"],
        serde_json::json!(["--user", "bridge", "slack"])
    );
    succeeded(&user(&["disconnect", "claude-code"]));
    assert_eq!(jsonc(&claude)["mcpServers"]["slack"], original);

    // Once the daemon holds a login (its token file), connect takes it.
    let logins = h.join(".local/state/mcpd/oauth");
    std::fs::create_dir_all(&logins).expect("state");
    std::fs::write(logins.join("slack.json"), "{}").expect("login");
    let out = succeeded(&user(&["connect", "claude-code"]));
    assert!(
        out.contains("claude-code: slack → mcpctl bridge slack"),
        "{out}"
    );
    assert!(!out.contains("skipped"), "{out}");
}

#[test]
fn connect_asks_a_running_daemon_whether_a_unit_needs_a_login() {
    let home = tempfile::tempdir().expect("home");
    let runtime = tempfile::tempdir().expect("runtime");
    let h = home.path();
    let claude = h.join(".claude.json");
    std::fs::write(
        &claude,
        r#"{ "mcpServers": { "slack": { "type": "http", "url": "http://127.0.0.1:9/mcp", "oauth": { "clientId": "c1" } } } }"#,
    )
    .expect("claude.json");
    let xdg = [(
        "XDG_RUNTIME_DIR".to_owned(),
        runtime.path().display().to_string(),
    )];
    let user = |args: &[&str]| as_user(h, h, &xdg, args);
    succeeded(&user(&["import"]));
    // A token file where mcpctl would look without a daemon; the daemon
    // (its own state directory) holds no login.
    let logins = h.join(".local/state/mcpd/oauth");
    std::fs::create_dir_all(&logins).expect("state");
    std::fs::write(logins.join("slack.json"), "{}").expect("file");
    let original = std::fs::read_to_string(&claude).expect("claude.json");
    let mut d = Daemon::user_no_bus(
        &h.join(".config/mcpd/units"),
        &[
            ("XDG_RUNTIME_DIR", runtime.path().as_os_str()),
            ("HOME", h.as_os_str()),
        ],
    );
    d.wait_until("slack needs a login", |_| {
        said(&user(&["status", "slack"])).contains("needs login")
    });
    let out = user(&["connect", "claude-code"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        said(&out)
            .contains("claude-code: skipped slack: needs a login: run mcpctl auth login slack"),
        "{}",
        said(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&claude).expect("claude.json"),
        original
    );
    drop(d);
    // Without the daemon, its token file is the judge.
    let out = succeeded(&user(&["connect", "claude-code"]));
    assert!(
        out.contains("claude-code: slack → mcpctl bridge slack"),
        "{out}"
    );
}
