//! mcp-fixture: a small, misbehaving-on-demand MCP server over stdio.
//!
//! The tests of every stage and the demo unit run it. It is an example, not
//! a product binary: `cargo install` and the packages never ship it.
//!
//! Tools: `echo {text}`, `add {a, b}`, `crash {code}` (replies, then exits
//! with `code`), `hang` (never replies; logs `hang cancelled` when
//! the client cancels it), `fail {message}` (an `isError`
//! result), `log {text}` (a line on stderr), `set_tools {tools}` (replaces the
//! extra tools and sends `notifications/tools/list_changed`). Extra tools echo
//! their `text` argument; some names do more, for the host-session tests:
//! `roots` reports the client's roots, `progress {steps}` sends that many
//! progress notifications first, `sample {text}` asks the client for a
//! sampling and returns its answer, `levels` sends one log message at each
//! level, `shout {count, bytes}` that many info log messages of that size, `touch {uri}` sends `notifications/resources/updated`, `sleep {ms}`
//! answers after that long, saying nothing meanwhile; `task {text}`
//! (listed: the server offers the tasks extension, SEP-2663) makes the
//! call a task when the client declared tasks, completed with the echo
//! 100 ms later, for `tasks/get` and `tasks/cancel`; `read`, `write`
//! (a path), `connect` (an address), `listen` (its own 127.0.0.1) and `exec`
//! (a command line) report `ok` or the OS error, for the sandbox tests. `env` and
//! `whoami` report how the server was started.
//!
//! Behaviours at start are chosen by flags (see `--help`); every flag can also
//! be given as an environment variable `MCP_FIXTURE_<FLAG>` (e.g.
//! `MCP_FIXTURE_SLOW_START=2s`), so a test can change the behaviour of the
//! next respawn without touching the unit file.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content,
    Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "mcp-fixture",
    about = "A test MCP server with selectable misbehaviour"
)]
struct Args {
    /// Server name announced in `initialize`.
    #[arg(long, env = "MCP_FIXTURE_NAME", default_value = "mcp-fixture")]
    name: String,
    /// Append this process's PID to FILE at start (one line per spawn).
    #[arg(long, env = "MCP_FIXTURE_COUNT_FILE", value_name = "FILE")]
    count_file: Option<PathBuf>,
    /// Exit with CODE immediately at start, before speaking MCP.
    #[arg(long, env = "MCP_FIXTURE_DIE_ON_START", value_name = "CODE")]
    die_on_start: Option<i32>,
    /// Die on start (exit 3) while FILE (see --count-file) holds at most N spawns.
    #[arg(
        long,
        env = "MCP_FIXTURE_FAIL_FIRST",
        value_name = "N",
        requires = "count_file"
    )]
    fail_first: Option<usize>,
    /// Sleep this long (e.g. "2s") before serving.
    #[arg(long, env = "MCP_FIXTURE_SLOW_START", value_parser = humantime::parse_duration)]
    slow_start: Option<Duration>,
    /// Never answer anything, not even `initialize`.
    #[arg(long, env = "MCP_FIXTURE_HANG")]
    hang: bool,
    /// Exit with code 2 this long after start (e.g. "300ms").
    #[arg(long, env = "MCP_FIXTURE_EXIT_AFTER", value_parser = humantime::parse_duration)]
    exit_after: Option<Duration>,
    /// Append "start NS" (CLOCK_MONOTONIC nanoseconds) to FILE at start, and
    /// "exit NS" before an --exit-after exit (respawn benchmarks).
    #[arg(long, env = "MCP_FIXTURE_START_LOG", value_name = "FILE")]
    start_log: Option<PathBuf>,
    /// Keep running after stdin closes (instead of exiting 0).
    #[arg(long, env = "MCP_FIXTURE_LINGER")]
    linger: bool,
    /// Ignore SIGTERM (only SIGKILL stops it).
    #[arg(long, env = "MCP_FIXTURE_IGNORE_SIGTERM")]
    ignore_sigterm: bool,
    /// Start a `sleep` grandchild in the same process group; write its PID to FILE.
    #[arg(long, env = "MCP_FIXTURE_GRANDCHILD", value_name = "FILE")]
    grandchild: Option<PathBuf>,
    /// Start a `sleep` helper in a session of its own (`setsid`, as Node's
    /// `detached: true` does); write its PID to FILE.
    #[arg(long, env = "MCP_FIXTURE_DETACHED_HELPER", value_name = "FILE")]
    detached_helper: Option<PathBuf>,
    /// Start N `sleep` helpers that ignore SIGTERM, each in a session of
    /// its own (a process tree that only SIGKILL ends).
    #[arg(long, env = "MCP_FIXTURE_HELPERS", value_name = "N")]
    helpers: Option<usize>,
    /// Daemonize a `sleep` helper (double fork, own session), write its PID
    /// to FILE, and exit 0 at once.
    #[arg(long, env = "MCP_FIXTURE_DAEMONIZE", value_name = "FILE")]
    daemonize: Option<PathBuf>,
    /// Print a line that is not JSON-RPC on stdout before serving.
    #[arg(long, env = "MCP_FIXTURE_GARBAGE_STDOUT")]
    garbage_stdout: bool,
    /// Lines of chatter written to stderr at start.
    #[arg(
        long,
        env = "MCP_FIXTURE_CHATTER",
        default_value_t = 3,
        value_name = "N"
    )]
    chatter: usize,
    /// Extra tools present from the start (comma-separated names).
    #[arg(long, env = "MCP_FIXTURE_TOOLS", value_delimiter = ',')]
    tools: Vec<String>,
    /// Hold an exclusive lock on FILE while running; if another process
    /// holds it, write "overlap" to FILE.overlap and exit with code 99.
    #[arg(long, env = "MCP_FIXTURE_LOCK", value_name = "FILE")]
    lock: Option<PathBuf>,
    /// Serve Streamable HTTP on ADDR (e.g. 127.0.0.1:0) instead of stdio,
    /// at path /mcp; the bound port is written to --port-file.
    #[arg(long, env = "MCP_FIXTURE_HTTP", value_name = "ADDR")]
    http: Option<String>,
    /// With --http: write the bound port to FILE.
    #[arg(long, env = "MCP_FIXTURE_PORT_FILE", value_name = "FILE")]
    port_file: Option<PathBuf>,
    /// With --http: answer 401 unless the request has this Authorization header value.
    #[arg(long, env = "MCP_FIXTURE_REQUIRE_AUTH", value_name = "VALUE")]
    require_auth: Option<String>,
    /// With --http: append a line to FILE for every POST, its `Mcp-*`
    /// headers but the session's, sorted: `name: value; name: value`.
    #[arg(long, env = "MCP_FIXTURE_RECORD_HEADERS", value_name = "FILE")]
    record_headers: Option<PathBuf>,
    /// N more extra tools from the start, `tool-0` to `tool-<N-1>` (a
    /// catalog too large for a command line; page it with --page-size).
    #[arg(
        long,
        env = "MCP_FIXTURE_MANY_TOOLS",
        value_name = "N",
        default_value_t = 0
    )]
    many_tools: usize,
    /// Tools per `tools/list` page (0: all in one page).
    #[arg(long, env = "MCP_FIXTURE_PAGE_SIZE", default_value_t = 0)]
    page_size: usize,
    /// Write numbered lines to stderr as fast as it can, from the start.
    #[arg(long, env = "MCP_FIXTURE_STDERR_FLOOD")]
    stderr_flood: bool,
    /// Once serving, send `notifications/tools/list_changed` this many
    /// times a second, for ever; say "listed N" at each `tools/list`.
    #[arg(
        long,
        env = "MCP_FIXTURE_LIST_CHANGED_STORM",
        value_name = "PER_SECOND"
    )]
    list_changed_storm: Option<u32>,
}

#[derive(Clone)]
struct Fixture {
    name: String,
    extra: Arc<Mutex<Vec<String>>>,
    page_size: usize,
    /// With --list-changed-storm: `tools/list` calls so far, each said on
    /// stderr ("listed N").
    listed: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// The tasks the `task` tool made, by id (a test makes a few).
    tasks: Arc<Mutex<std::collections::HashMap<String, rmcp::model::DetailedTask>>>,
}

fn say(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "mcp-fixture[{}]: {line}", std::process::id());
}

fn schema(value: Value) -> Arc<rmcp::model::JsonObject> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(Default::default()),
    }
}

fn text_schema() -> Value {
    json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
}

impl Fixture {
    fn tools(&self) -> Vec<Tool> {
        let mut tools = vec![
            Tool::new("echo", "Return the given text", schema(text_schema())),
            Tool::new(
                "add",
                "Add two numbers",
                schema(
                    json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
                ),
            ),
            Tool::new(
                "crash",
                "Reply, then exit with the given code",
                schema(json!({"type": "object", "properties": {"code": {"type": "integer"}}})),
            ),
            Tool::new("hang", "Never reply", schema(json!({"type": "object"}))),
            Tool::new(
                "fail",
                "Return an isError result with the given message",
                schema(json!({"type": "object", "properties": {"message": {"type": "string"}}})),
            ),
            Tool::new(
                "log",
                "Write the given text to stderr",
                schema(text_schema()),
            ),
            Tool::new(
                "env",
                "Return the environment as a JSON object",
                schema(json!({"type": "object"})),
            ),
            Tool::new(
                "whoami",
                "Return uid, gid, groups and working directory",
                schema(json!({"type": "object"})),
            ),
            Tool::new(
                "set_tools",
                "Replace the extra tools and notify tools/list_changed",
                schema(
                    json!({"type": "object", "properties": {"tools": {"type": "array", "items": {"type": "string"}}}, "required": ["tools"]}),
                ),
            ),
        ];
        let extra = self.extra.lock().map(|e| e.clone()).unwrap_or_default();
        for name in extra {
            // An extra tool named `region` asks a 2026-07-28 client to
            // mirror its `region` argument in an `Mcp-Param-Region`
            // header (x-mcp-header, SEP-2243).
            let input = if name == "region" {
                json!({"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}, "text": {"type": "string"}}})
            } else {
                text_schema()
            };
            tools.push(Tool::new(
                name.clone(),
                format!("Extra tool {name}: echoes text"),
                schema(input),
            ));
        }
        tools
    }
}

impl Fixture {
    /// The `task` tool: a task (when the client declared tasks) that
    /// echoes `text` 100 ms later; else the echo at once.
    fn task(
        &self,
        text_arg: String,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        use rmcp::model::{CreateTaskResult, DetailedTask, Task, TaskPayload, TaskStatus};
        let declared = context
            .client_capabilities()
            .is_some_and(|caps| caps.supports_tasks());
        if !declared {
            return text(text_arg);
        }
        let now = "2026-12-05T00:00:00Z";
        let id = format!("fixture-task-{}", uuid_like());
        let task = Task::new(id.clone(), TaskStatus::Working, now, now);
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.insert(
                id.clone(),
                DetailedTask::new(task.clone(), TaskPayload::Working),
            );
        }
        say(&format!("task {id} created"));
        let tasks = self.tasks.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Ok(mut tasks) = tasks.lock()
                && let Some(t) = tasks.get_mut(&id)
                && !t.status().is_terminal()
            {
                let result =
                    json!({"content": [{"type": "text", "text": text_arg}], "isError": false});
                let result = match result {
                    Value::Object(map) => map,
                    _ => Default::default(),
                };
                *t = DetailedTask::new(t.task.clone(), TaskPayload::Completed { result });
            }
        });
        Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
    }
}

/// A task id no client could guess from another's.
fn uuid_like() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:016x}", h.finish())
}

fn arg<'a>(request: &'a CallToolRequestParams, key: &str) -> Option<&'a Value> {
    request.arguments.as_ref().and_then(|a| a.get(key))
}

fn text(s: impl Into<String>) -> Result<CallToolResponse, ErrorData> {
    Ok(CallToolResult::success(vec![Content::text(s)]).into())
}

// Logging and subscriptions are deprecated by SEP-2577, current in 2025-11-25.
#[allow(deprecated)]
impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_logging()
            .enable_resources()
            .enable_resources_subscribe();
        let tasks = self
            .extra
            .lock()
            .is_ok_and(|e| e.iter().any(|n| n == "task"));
        ServerConfig::new(if tasks {
            capabilities.enable_tasks().build()
        } else {
            capabilities.build()
        })
        .with_server_info(Implementation::new(
            self.name.clone(),
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions("A test fixture for mcpd. Try the echo tool.")
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        say(&format!("tasks/get {}", request.task_id));
        let task = self
            .tasks
            .lock()
            .ok()
            .and_then(|tasks| tasks.get(&request.task_id).cloned());
        match task {
            Some(task) => Ok(rmcp::model::GetTaskResult::new(task)),
            None => Err(ErrorData::invalid_params(
                format!("no task `{}`", request.task_id),
                None,
            )),
        }
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        use rmcp::model::{DetailedTask, TaskPayload};
        say(&format!("tasks/cancel {}", request.task_id));
        let mut tasks = self
            .tasks
            .lock()
            .map_err(|_| ErrorData::internal_error("poisoned", None))?;
        match tasks.get_mut(&request.task_id) {
            Some(t) if !t.status().is_terminal() => {
                *t = DetailedTask::new(t.task.clone(), TaskPayload::Cancelled);
                Ok(())
            }
            Some(_) => Err(ErrorData::invalid_params("the task is over", None)),
            None => Err(ErrorData::invalid_params(
                format!("no task `{}`", request.task_id),
                None,
            )),
        }
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        if let Some(listed) = &self.listed {
            let n = listed.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            say(&format!("listed {n}"));
        }
        let tools = self.tools();
        if self.page_size == 0 {
            return Ok(ListToolsResult::with_all_items(tools));
        }
        let start: usize = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(c) => c
                .parse()
                .map_err(|_| ErrorData::invalid_params("bad cursor", None))?,
        };
        let end = (start + self.page_size).min(tools.len());
        let mut page = ListToolsResult::with_all_items(tools[start.min(end)..end].to_vec());
        if end < tools.len() {
            page.next_cursor = Some(end.to_string());
        }
        Ok(page)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        let resource: rmcp::model::Resource = serde_json::from_value(json!({
            "uri": "fixture://a",
            "name": "a",
            "description": "The resource `touch` updates",
        }))
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(rmcp::model::ListResourcesResult::with_all_items(vec![
            resource,
        ]))
    }

    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        say(&format!("log level {:?}", request.level));
        Ok(())
    }

    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        say(&format!("subscribe {}", request.uri));
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        say(&format!("unsubscribe {}", request.uri));
        Ok(())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        say(&format!("call {}", request.name));
        // W3C trace context (SEP-414) as its client sent it: the tests
        // of mcpd's telemetry read it in the log.
        if let Some(parent) = context.meta.get("traceparent").and_then(Value::as_str) {
            say(&format!("traceparent {parent}"));
        }
        let get_text = || {
            arg(&request, "text")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| ErrorData::invalid_params("`text` (a string) is required", None))
        };
        match request.name.as_ref() {
            "echo" => text(get_text()?),
            "add" => {
                let num = |k| arg(&request, k).and_then(Value::as_f64);
                match (num("a"), num("b")) {
                    (Some(a), Some(b)) => text((a + b).to_string()),
                    _ => Err(ErrorData::invalid_params(
                        "`a` and `b` (numbers) are required",
                        None,
                    )),
                }
            }
            "crash" => {
                let code = arg(&request, "code").and_then(Value::as_i64).unwrap_or(1);
                let code = i32::try_from(code).unwrap_or(1);
                say(&format!("crashing with exit code {code}"));
                // Exit once the reply has had time to be written.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    std::process::exit(code);
                });
                text(format!("crashing with exit code {code}"))
            }
            "hang" => {
                // Never replies; says so on stderr when the client cancels.
                context.ct.cancelled().await;
                say("hang cancelled");
                Err(ErrorData::internal_error("cancelled", None))
            }
            "fail" => {
                let message = arg(&request, "message")
                    .and_then(Value::as_str)
                    .unwrap_or("failed on purpose");
                Ok(CallToolResult::error(vec![Content::text(message)]).into())
            }
            "log" => {
                let line = get_text()?;
                say(&line);
                text("logged")
            }
            "env" => {
                let env: serde_json::Map<String, Value> = std::env::vars()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                text(Value::Object(env).to_string())
            }
            "whoami" => {
                let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
                let field = |name: &str| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(name))
                        .map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
                        .unwrap_or_default()
                };
                let cwd = std::env::current_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default();
                text(
                    json!({"uid": field("Uid:"), "gid": field("Gid:"), "groups": field("Groups:"), "cwd": cwd, "pid": std::process::id()})
                        .to_string(),
                )
            }
            "set_tools" => {
                let names: Vec<String> = arg(&request, "tools")
                    .cloned()
                    .and_then(|v| serde_json::from_value(v).ok())
                    .ok_or_else(|| {
                        ErrorData::invalid_params("`tools` (strings) is required", None)
                    })?;
                if let Ok(mut extra) = self.extra.lock() {
                    *extra = names.clone();
                }
                if let Err(e) = context.peer.notify_tool_list_changed().await {
                    say(&format!("cannot notify list_changed: {e}"));
                }
                text(format!("tools set: {}", names.join(",")))
            }
            other => {
                let known = self
                    .extra
                    .lock()
                    .is_ok_and(|e| e.iter().any(|n| n == other));
                if known && other == "roots" {
                    // An extra tool named `roots` reports the client's roots.
                    text(roots_of(&context.peer).await)
                } else if known && other == "task" {
                    self.task(get_text()?, &context)
                } else if known && let Some(result) = special(other, &request, &context).await {
                    result
                } else if known {
                    text(get_text()?)
                } else {
                    Err(ErrorData::invalid_params(
                        format!("unknown tool `{other}`"),
                        None,
                    ))
                }
            }
        }
    }
}

/// The extra tools that do more than echo (see the module docs). Logging,
/// sampling and subscriptions are deprecated by SEP-2577 but current in
/// 2025-11-25, which is what hosts speak.
#[allow(deprecated)]
async fn special(
    name: &str,
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Option<Result<CallToolResponse, ErrorData>> {
    use rmcp::model::{
        CreateMessageRequestParams, LoggingLevel, LoggingMessageNotificationParam,
        ProgressNotificationParam, ResourceUpdatedNotificationParam, SamplingMessage,
    };
    let peer = &context.peer;
    Some(match name {
        "progress" => {
            let steps = arg(request, "steps").and_then(Value::as_u64).unwrap_or(3);
            if let Some(token) = context.meta.get_progress_token() {
                for step in 1..=steps {
                    let param = ProgressNotificationParam::new(token.clone(), step as f64)
                        .with_total(steps as f64);
                    if let Err(e) = peer.notify_progress(param).await {
                        say(&format!("cannot notify progress: {e}"));
                    }
                }
            }
            text(format!("{steps} steps"))
        }
        "sample" => {
            let prompt = arg(request, "text").and_then(Value::as_str).unwrap_or("hi");
            let params =
                CreateMessageRequestParams::new(vec![SamplingMessage::user_text(prompt)], 10);
            match peer.create_message(params).await {
                Ok(answer) => text(
                    serde_json::to_value(&answer.message.content)
                        .ok()
                        .and_then(|c| {
                            c.get("text")
                                .or_else(|| c.get(0).and_then(|c| c.get("text")))
                                .and_then(Value::as_str)
                                .map(str::to_owned)
                        })
                        .unwrap_or_default(),
                ),
                Err(e) => text(format!("sampling failed: {e}")),
            }
        }
        "shout" => {
            let count = arg(request, "count").and_then(Value::as_u64).unwrap_or(1);
            let bytes = arg(request, "bytes")
                .and_then(Value::as_u64)
                .unwrap_or(1024);
            let data = "x".repeat(usize::try_from(bytes).unwrap_or(1024));
            for _ in 0..count {
                let param = LoggingMessageNotificationParam::new(LoggingLevel::Info, json!(data));
                if let Err(e) = peer.notify_logging_message(param).await {
                    say(&format!("cannot log: {e}"));
                }
            }
            text(format!("{count} messages of {bytes} bytes"))
        }
        "levels" => {
            for level in [
                LoggingLevel::Debug,
                LoggingLevel::Info,
                LoggingLevel::Notice,
                LoggingLevel::Warning,
                LoggingLevel::Error,
                LoggingLevel::Critical,
                LoggingLevel::Alert,
                LoggingLevel::Emergency,
            ] {
                let param =
                    LoggingMessageNotificationParam::new(level, json!(format!("{level:?}")));
                if let Err(e) = peer.notify_logging_message(param).await {
                    say(&format!("cannot log: {e}"));
                }
            }
            text("8 levels")
        }
        // The sandbox probes: each reports `ok …` or the OS error.
        "read" => {
            let path = arg(request, "text").and_then(Value::as_str).unwrap_or("");
            text(match std::fs::read(path) {
                Ok(bytes) => format!("ok {} bytes", bytes.len()),
                Err(e) => format!("error: {e}"),
            })
        }
        "write" => {
            let path = arg(request, "text").and_then(Value::as_str).unwrap_or("");
            text(match std::fs::write(path, "written by mcp-fixture\n") {
                Ok(()) => "ok".to_owned(),
                Err(e) => format!("error: {e}"),
            })
        }
        "connect" => {
            let addr = arg(request, "text").and_then(Value::as_str).unwrap_or("");
            text(match std::net::TcpStream::connect(addr) {
                Ok(_) => "ok".to_owned(),
                Err(e) => format!("error: {e}"),
            })
        }
        "listen" => {
            // A listener on this process's own 127.0.0.1, and a connection to it.
            let result = std::net::TcpListener::bind("127.0.0.1:0").and_then(|listener| {
                let addr = listener.local_addr()?;
                std::net::TcpStream::connect(addr).map(|_| listener)
            });
            text(match result {
                Ok(_) => "ok".to_owned(),
                Err(e) => format!("error: {e}"),
            })
        }
        "exec" => {
            // `text` is a command line split on spaces; stdout and the status.
            let line = arg(request, "text").and_then(Value::as_str).unwrap_or("");
            let mut words = line.split_whitespace();
            let Some(program) = words.next() else {
                return Some(text("error: no command"));
            };
            text(
                match std::process::Command::new(program).args(words).output() {
                    Ok(out) => format!(
                        "{} {}{}",
                        out.status,
                        String::from_utf8_lossy(&out.stdout).trim(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                    Err(e) => format!("error: {e}"),
                },
            )
        }
        "sleep" => {
            let ms = arg(request, "ms").and_then(Value::as_u64).unwrap_or(1000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            text(format!("slept {ms} ms"))
        }
        "touch" => {
            let uri = arg(request, "uri")
                .and_then(Value::as_str)
                .unwrap_or("fixture://a");
            if let Err(e) = peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                .await
            {
                say(&format!("cannot notify: {e}"));
            }
            text(format!("touched {uri}"))
        }
        _ => return None,
    })
}

/// "no roots capability", or the client's roots/list answer as URIs.
#[allow(deprecated)] // roots are deprecated by SEP-2577, current in 2025-11-25
async fn roots_of(peer: &rmcp::Peer<RoleServer>) -> String {
    let declared = peer
        .peer_info()
        .is_some_and(|info| info.capabilities.roots.is_some());
    if !declared {
        return "no roots capability".into();
    }
    match peer.list_roots().await {
        Ok(list) => list
            .roots
            .iter()
            .map(|r| r.uri.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => format!("roots/list failed: {e}"),
    }
}

fn count_spawn(file: &PathBuf) -> std::io::Result<usize> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    writeln!(f, "{}", std::process::id())?;
    drop(f);
    Ok(std::fs::read_to_string(file)?.lines().count())
}

/// Serves the fixture over Streamable HTTP at `/mcp` until killed.
async fn serve_http(
    fixture: Fixture,
    addr: &str,
    port_file: Option<&PathBuf>,
    require_auth: Option<String>,
    record_headers: Option<PathBuf>,
) -> std::process::ExitCode {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            say(&format!("cannot bind {addr}: {e}"));
            return std::process::ExitCode::from(1);
        }
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    if let Some(file) = port_file {
        let _ = std::fs::write(file, format!("{port}\n"));
    }
    say(&format!("serving on http://127.0.0.1:{port}/mcp"));
    let service = StreamableHttpService::new(
        move || Ok(fixture.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let service = service.clone();
        let require_auth = require_auth.clone();
        let record_headers = record_headers.clone();
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let mut service = service.clone();
                    let require_auth = require_auth.clone();
                    if let Some(file) = &record_headers
                        && request.method() == hyper::Method::POST
                    {
                        record(file, request.headers());
                    }
                    async move {
                        use http_body_util::BodyExt;
                        let authorized = require_auth.as_deref().is_none_or(|want| {
                            request
                                .headers()
                                .get("authorization")
                                .and_then(|v| v.to_str().ok())
                                == Some(want)
                        });
                        if !authorized || request.uri().path() != "/mcp" {
                            let status = if authorized { 404 } else { 401 };
                            let empty = http_body_util::Full::new(bytes::Bytes::new())
                                .map_err(|e| match e {})
                                .boxed_unsync();
                            let mut response = hyper::Response::new(empty);
                            *response.status_mut() =
                                hyper::StatusCode::from_u16(status).unwrap_or_default();
                            return Ok::<_, std::convert::Infallible>(response);
                        }
                        let response = tower_service::Service::call(&mut service, request).await?;
                        Ok(response.map(|b| b.boxed_unsync()))
                    }
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), handler)
                .await;
        });
    }
}

/// Appends a request's `Mcp-*` headers (but `Mcp-Session-Id`) to `file`
/// as one line, sorted by name.
fn record(file: &PathBuf, headers: &hyper::HeaderMap) {
    let mut seen: Vec<String> = headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("mcp-") && name.as_str() != "mcp-session-id")
        .map(|(name, value)| format!("{name}: {}", String::from_utf8_lossy(value.as_bytes())))
        .collect();
    seen.sort();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
    {
        let _ = writeln!(f, "{}", seen.join("; "));
    }
}

/// Appends "WHAT NS" with the CLOCK_MONOTONIC time to `file`.
fn stamp(file: &PathBuf, what: &str) {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let ns = i128::from(now.tv_sec) * 1_000_000_000 + i128::from(now.tv_nsec);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
    {
        let _ = writeln!(f, "{what} {ns}");
    }
}

/// An exclusive, non-blocking `flock` on `file`, held until the process ends.
fn take_lock(file: &PathBuf) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(file)?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    Ok(f)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    say("starting");
    for i in 1..args.chatter {
        say(&format!("chatter line {i}"));
    }
    if args.stderr_flood {
        std::thread::spawn(|| {
            let mut err = std::io::stderr().lock();
            for n in 0u64.. {
                if writeln!(err, "flood line {n}").is_err() {
                    return;
                }
            }
        });
    }
    let mut spawns = 0;
    if let Some(file) = &args.count_file {
        match count_spawn(file) {
            Ok(n) => spawns = n,
            Err(e) => {
                say(&format!("cannot write count file {}: {e}", file.display()));
                return std::process::ExitCode::from(1);
            }
        }
    }
    let _lock = match &args.lock {
        Some(file) => match take_lock(file) {
            Ok(lock) => Some(lock),
            Err(e) => {
                say(&format!("lock {} is held: {e}", file.display()));
                let mut marker = file.as_os_str().to_owned();
                marker.push(".overlap");
                let _ = std::fs::write(PathBuf::from(marker), "overlap\n");
                std::process::exit(99);
            }
        },
        None => None,
    };
    if let Some(code) = args.die_on_start {
        say(&format!("dying on start with exit code {code}"));
        std::process::exit(code);
    }
    if args.fail_first.is_some_and(|n| spawns <= n) {
        say(&format!("failing spawn {spawns} on purpose"));
        std::process::exit(3);
    }
    let _term = if args.ignore_sigterm {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => Some(tokio::spawn(async move {
                while signal.recv().await.is_some() {
                    say("ignoring SIGTERM");
                }
            })),
            Err(e) => {
                say(&format!("cannot ignore SIGTERM: {e}"));
                return std::process::ExitCode::from(1);
            }
        }
    } else {
        None
    };
    let _grandchild = match &args.grandchild {
        Some(file) => match std::process::Command::new("sleep").arg("100000").spawn() {
            Ok(child) => {
                if let Err(e) = std::fs::write(file, format!("{}\n", child.id())) {
                    say(&format!("cannot write {}: {e}", file.display()));
                }
                Some(child)
            }
            Err(e) => {
                say(&format!("cannot start grandchild: {e}"));
                None
            }
        },
        None => None,
    };
    let _detached = match &args.detached_helper {
        Some(file) => match std::process::Command::new("setsid")
            .args(["sleep", "100000"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(child) => {
                if let Err(e) = std::fs::write(file, format!("{}\n", child.id())) {
                    say(&format!("cannot write {}: {e}", file.display()));
                }
                Some(child)
            }
            Err(e) => {
                say(&format!("cannot start a detached helper: {e}"));
                None
            }
        },
        None => None,
    };
    let _helpers: Vec<std::process::Child> = (0..args.helpers.unwrap_or(0))
        .filter_map(|_| {
            // SIG_IGN survives exec: the sleep ignores SIGTERM too.
            std::process::Command::new("setsid")
                .args(["sh", "-c", "trap '' TERM; exec sleep 100000"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| say(&format!("cannot start a helper: {e}")))
                .ok()
        })
        .collect();
    if let Some(file) = &args.daemonize {
        // The shell forks the helper into the background and exits: the
        // helper's parent is gone before this process is.
        let script = format!(
            "setsid sleep 100000 </dev/null >/dev/null 2>&1 & echo $! > '{}'",
            file.display()
        );
        let status = std::process::Command::new("sh")
            .args(["-c", &script])
            .status();
        say(&format!("daemonized a helper ({status:?}); exiting 0"));
        return std::process::ExitCode::SUCCESS;
    }
    if let Some(delay) = args.slow_start {
        say(&format!(
            "slow start: sleeping {}",
            humantime::format_duration(delay)
        ));
        tokio::time::sleep(delay).await;
    }
    if let Some(file) = &args.start_log {
        stamp(file, "start");
    }
    if let Some(after) = args.exit_after {
        let log = args.start_log.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            say("exiting on schedule with exit code 2");
            if let Some(file) = &log {
                stamp(file, "exit");
            }
            std::process::exit(2);
        });
    }
    if args.hang {
        say("hanging: never answering");
        std::future::pending::<()>().await;
    }
    if args.garbage_stdout {
        println!("this line is not JSON-RPC");
    }
    let linger = args.linger;
    let mut extra = args.tools;
    extra.extend((0..args.many_tools).map(|i| format!("tool-{i}")));
    let fixture = Fixture {
        name: args.name,
        extra: Arc::new(Mutex::new(extra)),
        page_size: args.page_size,
        listed: args.list_changed_storm.map(|_| Arc::default()),
        tasks: Arc::default(),
    };
    if let Some(addr) = args.http.clone() {
        return serve_http(
            fixture,
            &addr,
            args.port_file.as_ref(),
            args.require_auth.clone(),
            args.record_headers.clone(),
        )
        .await;
    }
    say("serving on stdio");
    let service = match fixture.serve(rmcp::transport::stdio()).await {
        Ok(service) => service,
        Err(e) => {
            say(&format!("initialize failed: {e}"));
            return std::process::ExitCode::from(1);
        }
    };
    if let Some(rate) = args.list_changed_storm.filter(|r| *r > 0) {
        let peer = service.peer().clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
            loop {
                tick.tick().await;
                if peer.notify_tool_list_changed().await.is_err() {
                    return;
                }
            }
        });
    }
    let reason = service.waiting().await;
    if linger {
        say(&format!("stdin closed ({reason:?}); lingering"));
        std::future::pending::<()>().await;
    }
    say(&format!("stdin closed ({reason:?}); exiting"));
    std::process::ExitCode::SUCCESS
}
