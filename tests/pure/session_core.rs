//! The host sessions' pure core (`mux::session::Core`), input by input:
//! every rule the daemon's tests reach through real processes, checked
//! here on the core alone, with the time and the unit's facts handed in.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use mcpd::mux::error::ErrorCode;
use mcpd::mux::message::Message;
use mcpd::mux::route::HostId;
use mcpd::mux::session::toward::{SERVER_QUEUE, SLOW};
use mcpd::mux::session::{
    Arrival, Core, Facts, Kind, Level, MAX_IN_FLIGHT, MAX_SESSIONS, Notice, Out, Outcome, Publish,
    Purpose, Settings, Tunables, UnitState,
};
use mcpd::mux::wire::Frame;
use mcpd::unit::ToolFilter;
use serde_json::{Value, json};

static T0: LazyLock<Instant> = LazyLock::new(Instant::now);

/// `s` seconds into the test.
fn at(s: u64) -> Instant {
    *T0 + Duration::from_secs(s)
}

fn settings() -> Settings {
    Settings {
        filter: ToolFilter::default(),
        roots: Vec::new(),
        on_demand: false,
        list_timeout: Duration::from_secs(30),
        max_request_size: 1 << 20,
        instance: false,
    }
}

fn facts(state: UnitState) -> Facts {
    Facts {
        state,
        tools_serial: 1,
        tools: Arc::from(r#"[{"name":"echo","inputSchema":{"type":"object"}}]"#),
        not_running: "server demo is failed".into(),
    }
}

/// The sessions of unit `demo`, the unit `state`.
fn core_with(settings: Settings, state: UnitState) -> Core {
    let mut n = 0u128;
    let nonces = Box::new(move || {
        n += 1;
        n
    });
    Core::new(
        "demo",
        settings,
        Tunables::default(),
        facts(state),
        nonces,
        at(0),
    )
}

/// A server's `initialize` result.
fn init() -> Arc<Value> {
    Arc::new(json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "fixture", "version": "1"},
    }))
}

/// Sessions of a running unit whose generation 1 is up.
fn running() -> Core {
    let mut core = core_with(settings(), UnitState::Running);
    core.up(1, init(), at(0));
    core.take();
    core
}

/// A host's line, as its reader parses it.
fn frame(value: Value) -> Frame {
    let line = serde_json::to_vec(&value).expect("json");
    Frame::Message(Message::parse(&line).expect("a message"))
}

fn request(id: Value, method: &str, params: Value) -> Frame {
    frame(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
}

fn initialize(id: Value) -> Frame {
    request(
        id,
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    )
}

/// Attaches a host and answers its `initialize`; its id.
fn initialized(core: &mut Core) -> HostId {
    let host = core.next_host();
    core.attach(host, Arrival::default(), at(0));
    core.host_frame(host, initialize(json!(0)), at(0));
    core.take();
    host
}

/// What went to `host`, as JSON.
fn to_host(outs: &[Out], to: HostId) -> Vec<Value> {
    outs.iter()
        .filter_map(|out| match out {
            Out::Host { host, message, .. } if *host == to => Some(message.to_value()),
            Out::Bytes(host, bytes) if *host == to => {
                Some(serde_json::from_slice(bytes).expect("a JSON line"))
            }
            _ => None,
        })
        .collect()
}

/// What went to the server, as JSON.
fn to_server(outs: &[Out]) -> Vec<Value> {
    outs.iter()
        .filter_map(|out| match out {
            Out::Server(message) => Some(message.to_value()),
            _ => None,
        })
        .collect()
}

/// The one error `host` got: its code and message.
fn error_of(outs: &[Out], host: HostId) -> (i64, String) {
    let sent = to_host(outs, host);
    assert_eq!(sent.len(), 1, "one message to host {host}: {sent:?}");
    let error = &sent[0]["error"];
    (
        error["code"].as_i64().expect("an error code"),
        error["message"].as_str().expect("a message").to_owned(),
    )
}

fn ended(outs: &[Out]) -> Vec<(HostId, Option<String>)> {
    outs.iter()
        .filter_map(|out| match out {
            Out::Ended { host, why, .. } => Some((*host, why.clone())),
            _ => None,
        })
        .collect()
}

fn calls(outs: &[Out]) -> Vec<(String, Outcome)> {
    outs.iter()
        .filter_map(|out| match out {
            Out::Call { call, outcome, .. } => Some((call.tool.clone(), outcome.clone())),
            _ => None,
        })
        .collect()
}

// --- attach ---------------------------------------------------------------

#[test]
fn attaching_publishes_presence_and_the_session_past_the_limit_is_refused() {
    let mut core = running();
    for n in 1..=MAX_SESSIONS as HostId {
        core.attach(n, Arrival::default(), at(0));
    }
    let outs = core.take();
    assert!(outs.iter().any(|o| matches!(
        o,
        Out::Publish(Publish::Presence { attached, arrived: true }) if *attached == MAX_SESSIONS
    )));
    assert!(ended(&outs).is_empty());

    let last = MAX_SESSIONS as HostId + 1;
    core.attach(last, Arrival::default(), at(0));
    let outs = core.take();
    let (code, message) = error_of(&outs, last);
    assert_eq!(code, ErrorCode::InvalidRequest.code());
    assert_eq!(
        message,
        format!("too many sessions on server demo (at most {MAX_SESSIONS})")
    );
    assert_eq!(ended(&outs), vec![(last, Some(message))]);
    assert_eq!(core.hosts(), MAX_SESSIONS);
}

#[test]
fn a_host_that_sends_no_initialize_in_time_is_detached() {
    let mut core = running();
    let host = core.next_host();
    core.attach(host, Arrival::default(), at(0));
    assert_eq!(core.deadline(), Some(at(30)));
    core.tick(at(29));
    assert!(ended(&core.take()).is_empty());
    core.tick(at(30));
    let outs = core.take();
    assert_eq!(
        ended(&outs),
        vec![(host, Some("it sent no initialize in time".into()))]
    );
    assert!(
        outs.iter()
            .any(|o| matches!(o, Out::Ended { counted: true, .. }))
    );
    assert_eq!(core.deadline(), None);
}

#[test]
fn a_host_over_max_instances_has_every_request_refused_naming_the_limit() {
    let mut core = running();
    let host = core.next_host();
    let arrival = Arrival {
        refused: Some(Arc::from("server demo has 2 instances (max-instances 2)")),
        ..Arrival::default()
    };
    core.attach(host, arrival, at(0));
    for (id, frame) in [
        (json!(1), initialize(json!(1))),
        (json!(2), request(json!(2), "tools/list", json!({}))),
    ] {
        core.host_frame(host, frame, at(0));
        let outs = core.take();
        let sent = to_host(&outs, host);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0]["id"], id);
        assert_eq!(sent[0]["error"]["code"], ErrorCode::InvalidRequest.code());
        assert_eq!(
            sent[0]["error"]["message"],
            "server demo has 2 instances (max-instances 2)"
        );
        assert!(to_server(&outs).is_empty());
    }
}

// --- opening ----------------------------------------------------------------

#[test]
fn initialize_is_answered_from_the_servers_result_with_the_negotiated_version() {
    let mut core = running();
    let host = core.next_host();
    core.attach(host, Arrival::default(), at(0));
    core.host_frame(
        host,
        request(
            json!(7),
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}}),
        ),
        at(1),
    );
    let outs = core.take();
    let sent = to_host(&outs, host);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["id"], 7);
    assert_eq!(sent[0]["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(sent[0]["result"]["serverInfo"]["name"], "fixture");
    assert!(
        outs.iter()
            .any(|o| matches!(o, Out::Publish(Publish::Version("2025-06-18", true))))
    );
    assert!(
        to_server(&outs).is_empty(),
        "mcpd answers initialize itself"
    );
    // Initialized: its deadline passes without it.
    core.tick(at(31));
    assert!(ended(&core.take()).is_empty());
    assert_eq!(core.deadline(), None);
}

#[test]
fn initialize_before_the_first_generation_waits_then_is_answered_with_what_was_held() {
    let mut core = core_with(settings(), UnitState::Starting);
    let host = core.next_host();
    core.attach(host, Arrival::default(), at(0));
    core.host_frame(host, initialize(json!(1)), at(0));
    core.host_frame(
        host,
        request(json!(2), "tools/call", json!({"name": "echo"})),
        at(0),
    );
    let outs = core.take();
    assert!(
        to_host(&outs, host).is_empty(),
        "nothing to answer from yet"
    );
    assert!(to_server(&outs).is_empty());

    core.up(1, init(), at(1));
    let outs = core.take();
    let sent = to_host(&outs, host);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["id"], 1);
    assert_eq!(sent[0]["result"]["serverInfo"]["name"], "fixture");
    // The call it sent meanwhile goes on, after the answer.
    let up = to_server(&outs);
    assert!(up.iter().any(|m| m["method"] == "tools/call"), "{up:?}");
}

#[test]
fn initialize_while_the_unit_failed_gets_the_outage_error() {
    let mut core = core_with(settings(), UnitState::Failed);
    let host = core.next_host();
    core.attach(host, Arrival::default(), at(0));
    core.host_frame(host, initialize(json!(1)), at(0));
    let (code, message) = error_of(&core.take(), host);
    assert_eq!(code, ErrorCode::ServerDown.code());
    assert_eq!(message, "server demo is failed");
}

/// A modern host's `_meta`.
fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}

/// The unit `state` whose generation 1 served and went down.
fn down_after_serving(state: UnitState) -> Core {
    let mut core = running();
    core.down(1, None, at(1));
    core.status(facts(state), at(1));
    core.take();
    core
}

#[test]
fn a_unit_that_gave_up_or_was_stopped_refuses_initialize_though_it_served_before() {
    for state in [UnitState::Failed, UnitState::Stopped] {
        let mut core = down_after_serving(state);
        let host = core.next_host();
        core.attach(host, Arrival::default(), at(2));
        core.host_frame(host, initialize(json!(1)), at(2));
        let (code, message) = error_of(&core.take(), host);
        assert_eq!(code, ErrorCode::ServerDown.code(), "{state:?}");
        assert_eq!(message, "server demo is failed", "{state:?}");
    }
}

#[test]
fn a_unit_retrying_after_it_served_answers_initialize_from_its_last_result() {
    for state in [UnitState::Retrying, UnitState::Reconnecting] {
        let mut core = down_after_serving(state);
        let host = core.next_host();
        core.attach(host, Arrival::default(), at(2));
        core.host_frame(host, initialize(json!(1)), at(2));
        let sent = to_host(&core.take(), host);
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0]["result"]["serverInfo"]["name"], "fixture");
    }
}

#[test]
fn a_unit_never_established_whose_start_failed_refuses_initialize_at_once() {
    // Attached while it starts: the initialize waits for the start.
    let mut core = core_with(settings(), UnitState::Starting);
    let early = core.next_host();
    core.attach(early, Arrival::default(), at(0));
    core.host_frame(early, initialize(json!(1)), at(0));
    assert!(to_host(&core.take(), early).is_empty(), "waits");
    // The start failed (its command is missing): it retries, and the
    // waiting host is told why now, not after every retry.
    core.status(facts(UnitState::Retrying), at(1));
    let (code, message) = error_of(&core.take(), early);
    assert_eq!(code, ErrorCode::ServerDown.code());
    assert_eq!(message, "server demo is failed");
    // A host attached while it retries is told at once.
    let late = core.next_host();
    core.attach(late, Arrival::default(), at(2));
    core.host_frame(late, initialize(json!(1)), at(2));
    let (_, message) = error_of(&core.take(), late);
    assert_eq!(message, "server demo is failed");
    // Neither is said to have sent no initialize.
    core.tick(at(60));
    assert!(ended(&core.take()).is_empty());
}

#[test]
fn a_modern_hosts_discover_or_first_request_on_a_unit_that_cannot_serve_gets_why() {
    let mut core = down_after_serving(UnitState::Failed);
    let discovering = core.next_host();
    core.attach(discovering, Arrival::default(), at(2));
    core.host_frame(
        discovering,
        request(json!(1), "server/discover", json!({"_meta": modern_meta()})),
        at(2),
    );
    let (code, message) = error_of(&core.take(), discovering);
    assert_eq!(code, ErrorCode::ServerDown.code());
    assert_eq!(message, "server demo is failed");

    // A host with no discovery: its first request, a list that would be
    // answered empty.
    let direct = core.next_host();
    core.attach(direct, Arrival::default(), at(2));
    core.host_frame(
        direct,
        request(json!(7), "tools/list", json!({"_meta": modern_meta()})),
        at(2),
    );
    let (code, message) = error_of(&core.take(), direct);
    assert_eq!(code, ErrorCode::ServerDown.code());
    assert_eq!(message, "server demo is failed");
    // They opened their sessions: neither is said to have sent nothing.
    core.tick(at(60));
    assert!(ended(&core.take()).is_empty());
}

#[test]
fn a_discover_waiting_for_the_first_start_is_no_session_that_says_nothing() {
    let mut core = core_with(settings(), UnitState::Starting);
    let host = core.next_host();
    core.attach(host, Arrival::default(), at(0));
    core.host_frame(
        host,
        request(json!(1), "server/discover", json!({"_meta": modern_meta()})),
        at(0),
    );
    assert!(to_host(&core.take(), host).is_empty(), "waits");
    core.tick(at(31));
    assert!(ended(&core.take()).is_empty());
    core.up(1, init(), at(32));
    let sent = to_host(&core.take(), host);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0]["result"].is_object(), "{sent:?}");
}

#[test]
fn a_replayed_initialize_is_answered_to_nobody_and_the_host_is_told_its_lists_may_have_changed() {
    let mut core = running();
    let host = core.next_host();
    let arrival = Arrival {
        replay: Some(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}}})),
        bridged: true,
        ..Arrival::default()
    };
    core.attach(host, arrival, at(0));
    let outs = core.take();
    let sent = to_host(&outs, host);
    assert!(
        sent.iter().all(|m| m.get("id").is_none()),
        "no answer: {sent:?}"
    );
    assert!(
        sent.iter()
            .any(|m| m["method"] == "notifications/tools/list_changed"),
        "{sent:?}"
    );
    // A replayed initialize is not handed to the bridge again.
    assert!(!outs.iter().any(|o| matches!(o, Out::Remember { .. })));
}

#[test]
fn a_bridged_hosts_initialize_is_remembered_by_its_bridge() {
    let mut core = running();
    let host = core.next_host();
    let arrival = Arrival {
        bridged: true,
        ..Arrival::default()
    };
    core.attach(host, arrival, at(0));
    core.host_frame(host, initialize(json!(1)), at(0));
    let outs = core.take();
    let remembered: Vec<&Value> = outs
        .iter()
        .filter_map(|o| match o {
            Out::Remember { initialize, .. } => Some(initialize),
            _ => None,
        })
        .collect();
    assert_eq!(remembered.len(), 1);
    assert_eq!(remembered[0]["method"], "initialize");
}

// --- requests ---------------------------------------------------------------

#[test]
fn tools_list_is_answered_from_the_published_tools() {
    let mut core = running();
    let host = initialized(&mut core);
    core.host_frame(host, request(json!(3), "tools/list", json!({})), at(1));
    let outs = core.take();
    let sent = to_host(&outs, host);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["result"]["tools"][0]["name"], "echo");
    assert!(to_server(&outs).is_empty());
}

#[test]
fn a_request_over_max_request_size_is_refused_a_notification_dropped_an_answer_replaced() {
    let mut s = settings();
    s.max_request_size = 256;
    let mut core = core_with(s, UnitState::Running);
    core.up(1, init(), at(0));
    core.take();
    let host = core.next_host();
    core.attach(host, Arrival::default(), at(0));
    core.host_frame(
        host,
        request(
            json!(0),
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {"roots": {}}}),
        ),
        at(0),
    );
    core.take();
    let big = "x".repeat(300);

    core.host_frame(
        host,
        request(json!(1), "tools/call", json!({"name": big})),
        at(1),
    );
    let outs = core.take();
    let (code, message) = error_of(&outs, host);
    assert_eq!(code, ErrorCode::InvalidRequest.code());
    assert!(
        message.ends_with("over the max-request-size of server demo (256 bytes)"),
        "{message}"
    );
    assert!(to_server(&outs).is_empty());

    core.host_frame(
        host,
        frame(json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"x": big}})),
        at(1),
    );
    let outs = core.take();
    assert!(to_server(&outs).is_empty() && to_host(&outs, host).is_empty());
    assert!(outs.iter().any(|o| matches!(o, Out::Log { .. })));

    // The server asks the host; the host's answer is too large.
    core.server_message(
        Message::from(json!({"jsonrpc": "2.0", "id": 9, "method": "roots/list"})),
        at(2),
    );
    let down = to_host(&core.take(), host);
    let down_id = down[0]["id"].clone();
    core.host_frame(
        host,
        frame(json!({"jsonrpc": "2.0", "id": down_id, "result": {"roots": [], "x": big}})),
        at(3),
    );
    let up = to_server(&core.take());
    assert_eq!(up.len(), 1);
    assert_eq!(up[0]["id"], 9);
    assert_eq!(up[0]["error"]["code"], ErrorCode::InternalError.code());
}

#[test]
fn a_request_id_in_use_is_refused_and_the_first_request_keeps_its_answer() {
    let mut core = running();
    let host = initialized(&mut core);
    core.host_frame(
        host,
        request(json!("a"), "tools/call", json!({"name": "echo"})),
        at(1),
    );
    let outs = core.take();
    let up = to_server(&outs);
    assert_eq!(up.len(), 1);
    core.host_frame(
        host,
        request(json!("a"), "tools/call", json!({"name": "echo"})),
        at(1),
    );
    let outs = core.take();
    let (code, message) = error_of(&outs, host);
    assert_eq!(code, ErrorCode::InvalidRequest.code());
    assert_eq!(message, "request id \"a\" is already in use");
    assert!(to_server(&outs).is_empty());
    // The first call's answer still ends its record as a success.
    core.server_message(
        Message::from(json!({"jsonrpc": "2.0", "id": up[0]["id"], "result": {"content": []}})),
        at(2),
    );
    let outs = core.take();
    assert_eq!(to_host(&outs, host)[0]["id"], "a");
    assert_eq!(calls(&outs), vec![("echo".into(), Outcome::Ok)]);
}

#[test]
fn a_host_past_max_in_flight_has_its_next_request_refused() {
    let mut core = running();
    let host = initialized(&mut core);
    for n in 0..MAX_IN_FLIGHT {
        core.host_frame(
            host,
            request(json!(n), "tools/call", json!({"name": "echo"})),
            at(1),
        );
    }
    assert_eq!(to_server(&core.take()).len(), MAX_IN_FLIGHT);
    core.host_frame(host, request(json!("one more"), "ping", json!({})), at(1));
    let (code, message) = error_of(&core.take(), host);
    assert_eq!(code, ErrorCode::InvalidRequest.code());
    assert_eq!(
        message,
        format!("too many requests in flight (at most {MAX_IN_FLIGHT} per session)")
    );
}

#[test]
fn a_filtered_tool_is_refused_and_never_sent() {
    let mut s = settings();
    s.filter = ToolFilter::new(Vec::new(), vec!["rm*".into()]);
    let mut core = core_with(s, UnitState::Running);
    core.up(1, init(), at(0));
    core.take();
    let host = initialized(&mut core);
    core.host_frame(
        host,
        request(json!(1), "tools/call", json!({"name": "rmrf"})),
        at(1),
    );
    let outs = core.take();
    let (code, message) = error_of(&outs, host);
    assert_eq!(code, ErrorCode::InvalidParams.code());
    assert_eq!(
        message,
        "tool rmrf of server demo is filtered out by its unit's `tools` block: it matches deny \"rm*\""
    );
    assert!(to_server(&outs).is_empty());
    assert!(calls(&outs).is_empty());
}

#[test]
fn a_call_cancelled_by_its_host_is_accounted_so_and_cancelled_upstream() {
    let mut core = running();
    let host = initialized(&mut core);
    core.host_frame(
        host,
        request(json!(1), "tools/call", json!({"name": "echo"})),
        at(1),
    );
    let up = to_server(&core.take());
    core.host_frame(
        host,
        frame(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})),
        at(2),
    );
    let outs = core.take();
    assert_eq!(
        calls(&outs),
        vec![(
            "echo".into(),
            Outcome::Failed("cancelled by the host".into())
        )]
    );
    let cancel = to_server(&outs);
    assert_eq!(cancel.len(), 1);
    assert_eq!(cancel[0]["method"], "notifications/cancelled");
    assert_eq!(cancel[0]["params"]["requestId"], up[0]["id"]);
}

#[test]
fn a_handed_over_hosts_requests_are_recorded_in_its_ledger_until_answered() {
    let mut core = running();
    let host = core.next_host();
    let arrival = Arrival {
        bridged: true,
        ledger: true,
        ..Arrival::default()
    };
    core.attach(host, arrival, at(0));
    core.host_frame(host, initialize(json!(0)), at(0));
    core.take();
    core.host_frame(
        host,
        request(json!(5), "tools/call", json!({"name": "echo"})),
        at(1),
    );
    let outs = core.take();
    let ledger: Vec<(&str, bool)> = outs
        .iter()
        .filter_map(|o| match o {
            Out::Ledger { id, record, .. } => Some((&**id, *record)),
            _ => None,
        })
        .collect();
    assert_eq!(ledger, vec![("5", true)]);
    let up = to_server(&outs);
    core.server_message(
        Message::from(json!({"jsonrpc": "2.0", "id": up[0]["id"], "result": {}})),
        at(2),
    );
    let outs = core.take();
    assert!(
        outs.iter()
            .any(|o| matches!(o, Out::Ledger { id, record: false, .. } if &**id == "5"))
    );
}

// --- outages and on-demand ------------------------------------------------

#[test]
fn a_request_while_the_server_is_down_gets_the_outage_error() {
    let mut core = running();
    let host = initialized(&mut core);
    core.down(1, None, at(1));
    let outs = core.take();
    assert!(outs.iter().any(|o| matches!(o, Out::Release)));
    core.status(facts(UnitState::Failed), at(1));
    core.take();
    core.host_frame(
        host,
        request(json!(1), "tools/call", json!({"name": "echo"})),
        at(2),
    );
    let (code, message) = error_of(&core.take(), host);
    assert_eq!(code, ErrorCode::ServerDown.code());
    assert_eq!(message, "server demo is failed");
}

#[test]
fn a_lost_connection_fails_requests_in_flight_tells_the_actor_and_names_whose_they_were() {
    let mut core = running();
    let host = initialized(&mut core);
    core.host_frame(
        host,
        request(json!(1), "tools/call", json!({"name": "echo"})),
        at(1),
    );
    core.take();
    core.lost(1, "the server closed the connection".into(), at(2));
    let outs = core.take();
    let (code, message) = error_of(&outs, host);
    assert_eq!(code, ErrorCode::ServerDown.code());
    assert_eq!(
        message,
        "server demo: connection lost: the server closed the connection"
    );
    assert!(
        outs.iter()
            .any(|o| matches!(o, Out::Notice(Notice::Closed { generation: 1, .. })))
    );
    assert!(outs.iter().any(|o| matches!(
        o,
        Out::Blame { whose, .. } if whose == &vec![(host, 1)]
    )));
    assert_eq!(core.upstream(), None);
}

#[test]
fn an_on_demand_units_requests_are_held_while_it_is_idle_and_start_it() {
    let mut s = settings();
    s.on_demand = true;
    let mut core = core_with(s, UnitState::Idle);
    core.restore(init(), [None, None, None]);
    core.status(facts(UnitState::Idle), at(0));
    core.take();
    let host = initialized(&mut core);
    core.host_frame(
        host,
        request(json!(1), "tools/call", json!({"name": "echo"})),
        at(1),
    );
    let outs = core.take();
    assert!(to_host(&outs, host).is_empty(), "held, not refused");
    assert!(
        outs.iter()
            .any(|o| matches!(o, Out::Notice(Notice::Demand)))
    );
    core.status(facts(UnitState::Starting), at(2));
    core.take();
    core.up(1, init(), at(3));
    let up = to_server(&core.take());
    assert!(up.iter().any(|m| m["method"] == "tools/call"), "{up:?}");
}

#[test]
fn settle_lets_an_idle_server_go_and_reports_the_last_use() {
    let mut core = running();
    let host = initialized(&mut core);
    core.host_frame(
        host,
        request(json!(1), "tools/call", json!({"name": "echo"})),
        at(5),
    );
    let up = to_server(&core.take());
    // Busy: a call is in flight.
    assert_eq!(core.settle(1, at(10), at(10)), (at(5), true));
    assert!(!core.take().iter().any(|o| matches!(o, Out::Release)));
    core.server_message(
        Message::from(json!({"jsonrpc": "2.0", "id": up[0]["id"], "result": {}})),
        at(6),
    );
    core.take();
    assert_eq!(
        core.settle(1, at(5), at(11)),
        (at(6), false),
        "used since the cutoff"
    );
    assert_eq!(core.settle(1, at(7), at(12)), (at(6), false));
    assert!(core.take().iter().any(|o| matches!(o, Out::Release)));
    assert_eq!(core.upstream(), None);
}

#[test]
fn a_failed_unit_withdraws_its_lists_and_tells_hosts_of_the_tools() {
    let mut core = running();
    core.adopt(init(), [Some(Arc::from(r#"[{"uri":"a"}]"#)), None, None]);
    let host = initialized(&mut core);
    let mut failed = facts(UnitState::Failed);
    failed.tools_serial = 2;
    failed.tools = Arc::from("[]");
    core.status(failed, at(1));
    let outs = core.take();
    let sent = to_host(&outs, host);
    let methods: Vec<&str> = sent.iter().filter_map(|m| m["method"].as_str()).collect();
    assert_eq!(
        methods,
        vec![
            "notifications/tools/list_changed",
            "notifications/resources/list_changed"
        ]
    );
    assert!(
        outs.iter()
            .any(|o| matches!(o, Out::Publish(Publish::List(_, None))))
    );
    assert!(outs.iter().all(|o| !matches!(
        o,
        Out::Host {
            kind: Kind::Kept,
            ..
        }
    )));
}

// --- mcpd's own requests --------------------------------------------------

#[test]
fn mcpds_own_request_is_answered_to_its_token_and_a_probes_answer_is_no_sign_of_life() {
    let mut core = running();
    core.request(7, "tools/list", json!({}), Purpose::Sync, at(1));
    let up = to_server(&core.take());
    core.server_message(
        Message::from(json!({"jsonrpc": "2.0", "id": up[0]["id"], "result": {"tools": []}})),
        at(2),
    );
    let outs = core.take();
    assert!(outs.iter().any(|o| matches!(
        o,
        Out::Reply {
            token: 7,
            answer: Ok(_)
        }
    )));
    assert!(outs.iter().any(|o| matches!(o, Out::Heard(_))));

    core.request(8, "ping", json!({}), Purpose::Probe, at(3));
    let up = to_server(&core.take());
    core.server_message(
        Message::from(json!({"jsonrpc": "2.0", "id": up[0]["id"], "result": {}})),
        at(4),
    );
    let outs = core.take();
    assert!(outs.iter().any(|o| matches!(
        o,
        Out::Reply {
            token: 8,
            answer: Ok(_)
        }
    )));
    assert!(!outs.iter().any(|o| matches!(o, Out::Heard(_))));
}

#[test]
fn bookkeeping_never_waits_for_a_server_that_is_not_up() {
    let mut core = core_with(settings(), UnitState::Failed);
    core.request(1, "tools/list", json!({}), Purpose::Sync, at(0));
    let outs = core.take();
    assert!(matches!(
        &outs[..],
        [Out::Reply { token: 1, answer: Err(why) }] if why == "server demo is failed"
    ));
}

#[test]
fn a_request_cancelled_by_its_caller_is_cancelled_upstream() {
    let mut core = running();
    core.request(
        3,
        "tools/call",
        json!({"name": "echo"}),
        Purpose::Use,
        at(1),
    );
    let up = to_server(&core.take());
    core.cancel(3, at(2));
    let cancel = to_server(&core.take());
    assert_eq!(cancel.len(), 1);
    assert_eq!(cancel[0]["method"], "notifications/cancelled");
    assert_eq!(cancel[0]["params"]["requestId"], up[0]["id"]);
}

// --- the end --------------------------------------------------------------

#[test]
fn ending_a_host_abandons_its_calls_and_closing_answers_what_was_waiting() {
    let mut core = running();
    let host = initialized(&mut core);
    core.host_frame(
        host,
        request(json!(1), "tools/call", json!({"name": "echo"})),
        at(1),
    );
    core.take();
    core.detached(host, None, at(2));
    let outs = core.take();
    assert_eq!(calls(&outs), vec![("echo".into(), Outcome::Abandoned)]);
    assert_eq!(ended(&outs), vec![(host, None)]);
    assert!(
        outs.iter()
            .any(|o| matches!(o, Out::Ended { counted: false, .. }))
    );

    let mut core = core_with(settings(), UnitState::Starting);
    let host = core.next_host();
    core.attach(host, Arrival::default(), at(0));
    core.host_frame(host, initialize(json!(1)), at(0));
    core.take();
    core.closing(vec![(host, request(json!(2), "tools/list", json!({})))]);
    let sent = to_host(&core.take(), host);
    let ids: Vec<&Value> = sent.iter().map(|m| &m["id"]).collect();
    assert_eq!(ids, vec![&json!(1), &json!(2)]);
    assert!(
        sent.iter()
            .all(|m| m["error"]["code"] == ErrorCode::ServerDown.code())
    );
}

// What waits toward the server (`mux::session::toward`), by host.

/// A notification from a host, as its reader parses it.
fn notification(n: usize) -> Frame {
    frame(
        json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed", "params": {"n": n}}),
    )
}

/// Attaches a host that can be held back (a socket, a bridge's stdio)
/// and answers its `initialize`; its id.
fn pausable(core: &mut Core) -> HostId {
    let host = core.next_host();
    let arrival = Arrival {
        pausable: true,
        ..Arrival::default()
    };
    core.attach(host, arrival, at(0));
    core.host_frame(host, initialize(json!(0)), at(0));
    core.take();
    host
}

/// Host `host`'s sheds among `outs`: (notifications, requests).
fn shed_of(outs: &[Out], to: HostId) -> (usize, usize) {
    let mut shed = (0, 0);
    for out in outs {
        if let Out::Shed { host, request } = out
            && *host == to
        {
            if *request {
                shed.1 += 1;
            } else {
                shed.0 += 1;
            }
        }
    }
    shed
}

#[test]
fn a_host_past_its_share_of_the_servers_queue_is_shed_and_told_then_let_through_once_it_drains() {
    let mut core = running();
    let host = initialized(&mut core);
    // The server reads nothing: everything sent waits.
    for n in 0..SERVER_QUEUE {
        core.host_frame(host, notification(n), at(1));
    }
    let outs = core.take();
    assert_eq!(
        to_server(&outs).len(),
        SERVER_QUEUE,
        "its share: the whole queue"
    );
    assert_eq!(shed_of(&outs, host), (0, 0));
    assert_eq!(core.toward_server().0, SERVER_QUEUE);
    // Past it: its notification dropped, its request refused, counted,
    // and the first of the run said in the journal.
    core.host_frame(host, notification(0), at(2));
    core.host_frame(
        host,
        request(json!(7), "tools/call", json!({"name": "echo"})),
        at(2),
    );
    core.host_frame(host, notification(1), at(2));
    let outs = core.take();
    assert!(to_server(&outs).is_empty(), "nothing more for the server");
    assert_eq!(shed_of(&outs, host), (2, 1));
    let (code, why) = error_of(&outs, host);
    assert_eq!(code, ErrorCode::ServerDown as i64);
    assert!(why.contains("not reading"), "{why}");
    let warnings = outs
        .iter()
        .filter(|o| {
            matches!(
                o,
                Out::Log {
                    level: Level::Warn,
                    ..
                }
            )
        })
        .count();
    assert_eq!(warnings, 1, "one line for the run, not one per message");
    assert!(
        !outs.iter().any(|o| matches!(o, Out::Call { .. })),
        "a refused call is no call"
    );
    // The server read it all: the host's next message goes, and the
    // journal says what the run cost.
    core.server_waiting(0);
    assert_eq!(core.toward_server(), (0, 0));
    core.host_frame(host, notification(2), at(3));
    let outs = core.take();
    assert_eq!(to_server(&outs).len(), 1);
    let said = outs.iter().find_map(|o| match o {
        Out::Log {
            level: Level::Info,
            text,
            ..
        } => Some(text.clone()),
        _ => None,
    });
    let said = said.expect("the run's cost said");
    assert!(
        said.contains("2 of its notifications were dropped and 1 of its requests refused"),
        "{said}"
    );
}

#[test]
fn one_hosts_flood_leaves_another_host_its_share_of_the_servers_queue() {
    let mut core = running();
    let flood = initialized(&mut core);
    let calm = initialized(&mut core);
    for n in 0..SERVER_QUEUE {
        core.host_frame(flood, notification(n), at(1));
    }
    let outs = core.take();
    assert_eq!(to_server(&outs).len(), SERVER_QUEUE / 2, "half each");
    assert_eq!(shed_of(&outs, flood), (SERVER_QUEUE / 2, 0));
    core.host_frame(
        calm,
        request(json!(1), "tools/call", json!({"name": "echo"})),
        at(2),
    );
    let outs = core.take();
    assert_eq!(to_server(&outs).len(), 1, "the calm host's request goes");
    assert_eq!(shed_of(&outs, calm), (0, 0));
    // The queue drains from the oldest: the flood's first messages are
    // written, and it may send as many again.
    core.server_waiting(1);
    core.host_frame(flood, notification(0), at(3));
    assert_eq!(to_server(&core.take()).len(), 1);
}

#[test]
fn a_host_that_can_wait_is_held_back_past_slow_and_let_go_once_half_is_written() {
    let mut core = running();
    let host = pausable(&mut core);
    let held = |outs: &[Out]| -> Vec<bool> {
        outs.iter()
            .filter_map(|o| match o {
                Out::Slow { host: h, slow } if *h == host => Some(*slow),
                _ => None,
            })
            .collect()
    };
    for n in 0..SLOW - 1 {
        core.host_frame(host, notification(n), at(1));
    }
    assert!(held(&core.take()).is_empty(), "below SLOW: read on");
    core.host_frame(host, notification(0), at(1));
    assert_eq!(held(&core.take()), [true], "at SLOW: held back");
    assert!(core.slowed());
    // Its reader may still yield a line it had read: taken, and not held
    // again.
    core.host_frame(host, notification(1), at(1));
    assert!(held(&core.take()).is_empty());
    core.server_waiting(SLOW / 2);
    assert!(held(&core.take()).is_empty(), "half of it still waits");
    core.server_waiting(SLOW / 2 - 1);
    assert_eq!(held(&core.take()), [false], "let go");
    assert!(!core.slowed());
    // Held again, and let go when the upstream goes (nothing waits for
    // the next one).
    for n in 0..SLOW {
        core.host_frame(host, notification(n), at(2));
    }
    assert_eq!(held(&core.take()), [true]);
    core.down(1, Some("gone".into()), at(3));
    let outs = core.take();
    assert_eq!(held(&outs), [false]);
    assert_eq!(core.toward_server(), (0, 0));
}

#[test]
fn a_host_that_cannot_wait_is_never_held_back_and_mcpds_own_messages_are_never_shed() {
    let mut core = running();
    let host = initialized(&mut core);
    for n in 0..SLOW * 2 {
        core.host_frame(host, notification(n), at(1));
    }
    let outs = core.take();
    assert!(!outs.iter().any(|o| matches!(o, Out::Slow { .. })));
    assert!(!core.slowed());
    for n in 0..SERVER_QUEUE {
        core.host_frame(host, notification(n), at(1));
    }
    core.take();
    // The queue is full; mcpd's own request still goes.
    core.request(1, "ping", json!({}), Purpose::Sync, at(2));
    assert_eq!(to_server(&core.take()).len(), 1);
}
