//! The pure translation between eras (`mux::era`) and what the router
//! does for it, case by case: each message of a modern host (2026-07-28)
//! as a 2025 server must see it, each answer as the host must see it,
//! the input-required round trip and its state, listen streams.

use std::time::{Duration, Instant};

use mcpd::mux::era::{
    self, Era, Filter, Inputs, Listens, Parked, RequestMeta, STALE, Settled, answers, check,
};
use mcpd::mux::message::{Message, RequestId};
use mcpd::mux::route::{Caps, Level, Out, Router};
use mcpd::mux::session::{HostState, Step, classify};
use mcpd::mux::wire::Frame;
use serde_json::{Value, json};

fn rid(id: Value) -> RequestId {
    RequestId::of(&id).expect("not null")
}

fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    })
}

fn message(value: Value) -> Message {
    Message::from(value)
}

fn state(era: Option<Era>) -> HostState {
    HostState {
        era,
        initialized: era.is_some(),
        waiting: false,
        held: 0,
    }
}

#[test]
fn the_first_request_fixes_the_era_and_a_session_never_mixes_them() {
    let modern_call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "_meta": modern_meta()}});
    let discover = json!({"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {}});
    let plain_call =
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo"}});
    let initialize = json!({"jsonrpc": "2.0", "id": 4, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}}});
    let ping = json!({"jsonrpc": "2.0", "id": 5, "method": "ping"});
    let frame = |v: &Value| Frame::Message(v.clone().into());
    // A new session: either era may open it.
    assert_eq!(
        classify(&frame(&modern_call), state(None)),
        Step::Modern {
            id: rid(json!(1)),
            method: "tools/call".into()
        }
    );
    assert_eq!(
        classify(&frame(&discover), state(None)),
        Step::Discover(rid(json!(2)))
    );
    assert_eq!(
        classify(&frame(&initialize), state(None)),
        Step::Initialize(rid(json!(4)))
    );
    assert_eq!(
        classify(&frame(&ping), state(None)),
        Step::Pong(rid(json!(5)))
    );
    // A modern session: every request is judged as modern (one without the
    // _meta is refused there); initialize gets -32022 naming the modern
    // versions, which a dual-era client takes as its cue.
    assert_eq!(
        classify(&frame(&plain_call), state(Some(Era::Modern))),
        Step::Modern {
            id: rid(json!(3)),
            method: "tools/call".into()
        }
    );
    let Step::Refuse(refusal) = classify(&frame(&initialize), state(Some(Era::Modern))) else {
        panic!("initialize on a modern session");
    };
    assert_eq!(refusal["error"]["code"], -32022);
    assert_eq!(refusal["error"]["data"]["supported"], json!(["2026-07-28"]));
    assert_eq!(refusal["error"]["data"]["requested"], "2025-11-25");
    assert_eq!(
        classify(&frame(&ping), state(Some(Era::Modern))),
        Step::Pong(rid(json!(5)))
    );
    // A legacy session: a modern request or discovery is refused.
    for line in [&modern_call, &discover] {
        let Step::Refuse(refusal) = classify(&frame(line), state(Some(Era::Legacy))) else {
            panic!("a modern request on a legacy session: {line}");
        };
        assert_eq!(refusal["error"]["code"], -32600);
        assert!(
            refusal["error"]["message"]
                .as_str()
                .expect("message")
                .contains("began with initialize")
        );
    }
}

#[test]
fn a_modern_request_is_checked_for_version_capabilities_and_level() {
    let id = rid(json!(7));
    let meta = |v: Value| v.as_object().cloned();
    let ok = check(&id, meta(modern_meta()).as_ref()).expect("valid");
    assert_eq!(
        ok,
        RequestMeta {
            caps: Caps {
                sampling: false,
                elicitation: true,
                roots: false
            },
            level: None
        }
    );
    let mut leveled = modern_meta();
    leveled["io.modelcontextprotocol/logLevel"] = json!("notice");
    assert_eq!(
        check(&id, meta(leveled).as_ref()).expect("valid").level,
        Some(Level::Notice)
    );
    let cases: [(Value, i64, &str); 5] = [
        (
            json!({"io.modelcontextprotocol/protocolVersion": "2025-11-25",
                   "io.modelcontextprotocol/clientCapabilities": {}}),
            -32022,
            "unsupported protocol version",
        ),
        (
            json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"}),
            -32602,
            "clientCapabilities",
        ),
        (
            json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                   "io.modelcontextprotocol/clientCapabilities": []}),
            -32602,
            "must be an object",
        ),
        (
            json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                   "io.modelcontextprotocol/clientCapabilities": {},
                   "io.modelcontextprotocol/logLevel": "loud"}),
            -32602,
            "unknown log level",
        ),
        (
            json!({"io.modelcontextprotocol/clientCapabilities": {}}),
            -32602,
            "protocolVersion",
        ),
    ];
    for (meta_value, code, words) in cases {
        let refusal = check(&id, meta(meta_value.clone()).as_ref()).expect_err("refused");
        assert_eq!(refusal["id"], 7);
        assert_eq!(refusal["error"]["code"], code, "{meta_value}");
        let text = refusal["error"]["message"].as_str().expect("message");
        assert!(text.contains(words), "{text}");
    }
    let refusal = check(&id, None).expect_err("no _meta");
    assert_eq!(refusal["error"]["code"], -32602);
    // -32022 says what mcpd serves: the modern version, and the handshake's.
    let refusal = check(
        &id,
        meta(
            json!({"io.modelcontextprotocol/protocolVersion": "2099-01-01",
                    "io.modelcontextprotocol/clientCapabilities": {}}),
        )
        .as_ref(),
    )
    .expect_err("refused");
    assert_eq!(refusal["error"]["data"]["requested"], "2099-01-01");
    let supported = refusal["error"]["data"]["supported"]
        .as_array()
        .expect("list");
    assert_eq!(supported[0], "2026-07-28");
    assert!(supported.contains(&json!("2025-11-25")));
}

#[test]
fn a_2025_server_sees_the_request_without_the_reserved_meta() {
    let mut request = message(
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "echo",
            "arguments": {"text": "x"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/logLevel": "info",
                "progressToken": 5,
                "com.example/trace": "t",
            },
        }}),
    );
    assert!(era::claims(&request));
    era::strip_reserved(&mut request);
    assert!(!era::claims(&request));
    assert_eq!(
        request.params().expect("params"),
        json!({"name": "echo", "arguments": {"text": "x"},
               "_meta": {"progressToken": 5, "com.example/trace": "t"}})
    );
    // Nothing else left: no _meta at all.
    let mut bare = message(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list",
        "params": {"_meta": modern_meta()}}));
    era::strip_reserved(&mut bare);
    assert_eq!(bare.params().expect("params"), json!({}));
    // Keys only a parser can read: the same outcome.
    let mut escaped = Message::parse(
        br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"n\u0061me":"echo","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":1}}}"#,
    )
    .expect("parse");
    era::strip_reserved(&mut escaped);
    assert_eq!(
        escaped.params().expect("params"),
        json!({"name": "echo", "_meta": {"progressToken": 1}})
    );
    // Nothing reserved: untouched, byte for byte.
    let line = br#"{"jsonrpc":"2.0","id":5,"method":"x","params":{"a" : 1,"_meta":{"k":2}}}"#;
    let mut plain = Message::parse(line).expect("parse");
    era::strip_reserved(&mut plain);
    assert_eq!(plain.line(), [&line[..], b"\n"].concat());
    // A 2025 request never claims the era.
    let legacy = message(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list",
        "params": {"_meta": {"progressToken": 1}}}));
    assert!(!era::claims(&legacy));
}

#[test]
fn a_modern_host_gets_answers_that_say_what_they_are_and_who_made_them() {
    let info = r#"{"name":"srv","version":"1"}"#;
    let cases: [(Value, bool, Value); 5] = [
        (
            json!({"content": []}),
            false,
            json!({"content": [], "resultType": "complete",
                   "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "srv", "version": "1"}}}),
        ),
        (
            json!({}),
            false,
            json!({"resultType": "complete",
                   "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "srv", "version": "1"}}}),
        ),
        // The server's own _meta keeps its keys.
        (
            json!({"content": [], "_meta": {"com.example/x": 1}}),
            false,
            json!({"content": [], "resultType": "complete",
                   "_meta": {"com.example/x": 1, "io.modelcontextprotocol/serverInfo": {"name": "srv", "version": "1"}}}),
        ),
        // A list carries caching hints.
        (
            json!({"tools": []}),
            true,
            json!({"tools": [], "resultType": "complete", "ttlMs": 0, "cacheScope": "private",
                   "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "srv", "version": "1"}}}),
        ),
        // Only a parser can read this one (an escaped key).
        (
            json!({"cont\u{65}nt": [], "resultType": "complete"}),
            false,
            json!({"content": [], "resultType": "complete",
                   "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "srv", "version": "1"}}}),
        ),
    ];
    for (result, list, want) in cases {
        let mut answer = message(json!({"jsonrpc": "2.0", "id": 1, "result": result}));
        era::complete(&mut answer, info, list);
        let got: Value = serde_json::from_slice(&answer.line()).expect("json");
        assert_eq!(got["result"], want, "{result}");
    }
    let escaped =
        Message::parse(br#"{"jsonrpc":"2.0","id":1,"result":{"cont\u0065nt":[]}}"#).expect("parse");
    let mut escaped = escaped;
    era::complete(&mut escaped, info, false);
    let got: Value = serde_json::from_slice(&escaped.line()).expect("json");
    assert_eq!(got["result"]["resultType"], "complete");
    assert_eq!(got["result"]["content"], json!([]));
    // Errors pass as they are.
    let error = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "no"}});
    let mut answer = message(error.clone());
    era::complete(&mut answer, info, false);
    assert_eq!(
        serde_json::from_slice::<Value>(&answer.line()).expect("json"),
        error
    );
}

#[test]
fn discovery_tells_the_servers_own_identity_and_what_mcpd_serves() {
    let init = json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {"tools": {}, "resources": {"subscribe": true}, "tasks": {"list": {}}},
        "serverInfo": {"name": "srv", "version": "2"},
        "instructions": "use it well",
    });
    let result = era::discover_result(&init);
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["supportedVersions"][0], "2026-07-28");
    assert!(
        result["supportedVersions"]
            .as_array()
            .expect("list")
            .contains(&json!("2025-06-18"))
    );
    assert_eq!(result["capabilities"]["tools"]["listChanged"], true);
    assert_eq!(result["capabilities"]["resources"]["subscribe"], true);
    assert!(result["capabilities"].get("tasks").is_none());
    assert_eq!(
        result["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"],
        json!({"list": {}})
    );
    assert_eq!(result["instructions"], "use it well");
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "srv"
    );
    assert_eq!(
        (result["ttlMs"].clone(), result["cacheScope"].clone()),
        (json!(0), json!("private"))
    );
}

fn parked(up: u64, method: &str, deadline: Instant, asks: Vec<era::Ask>) -> Parked<()> {
    Parked {
        up,
        method: method.into(),
        asks,
        settled: None,
        call: (),
        deadline,
        meta: RequestMeta {
            caps: Caps::ALL,
            level: None,
        },
    }
}

fn asked(down: u64, method: &str) -> era::Ask {
    era::ask(
        down,
        &message(
            json!({"jsonrpc": "2.0", "id": down, "method": method, "params": {"message": "?"}}),
        ),
    )
}

#[test]
fn a_request_state_is_the_sessions_own_used_once_and_expires() {
    let t0 = Instant::now();
    let mut inputs: Inputs<()> = Inputs::new(0xfeed);
    let mut other: Inputs<()> = Inputs::new(0xbeef);
    let state = inputs.park(parked(1, "tools/call", t0 + Duration::from_secs(5), vec![]));
    let theirs = other.park(parked(1, "tools/call", t0 + Duration::from_secs(5), vec![]));
    assert_ne!(state, theirs);
    // Another session's state, a tampered one, the wrong method.
    assert_eq!(
        inputs.take(&theirs, "tools/call", t0).err().as_deref(),
        Some(STALE)
    );
    let tampered = format!("{state}0");
    assert_eq!(
        inputs.take(&tampered, "tools/call", t0).err().as_deref(),
        Some(STALE)
    );
    let wrong = inputs
        .take(&state, "prompts/get", t0)
        .expect_err("wrong method");
    assert!(wrong.contains("tools/call"), "{wrong}");
    // Once.
    assert_eq!(inputs.take(&state, "tools/call", t0).expect("valid").up, 1);
    assert_eq!(
        inputs.take(&state, "tools/call", t0).err().as_deref(),
        Some(STALE)
    );
    // Expiry: taken by `expired`, refused after.
    let late = inputs.park(parked(2, "tools/call", t0 + Duration::from_secs(1), vec![]));
    assert_eq!(inputs.deadline(), Some(t0 + Duration::from_secs(1)));
    assert!(inputs.expired(t0).is_empty());
    let gone = inputs.expired(t0 + Duration::from_secs(1));
    assert_eq!(gone.iter().map(|p| p.up).collect::<Vec<_>>(), [2]);
    assert_eq!(
        inputs
            .take(&late, "tools/call", t0 + Duration::from_secs(2))
            .err()
            .as_deref(),
        Some(STALE)
    );
    assert!(inputs.is_empty());
}

#[test]
fn the_input_required_round_trip_answers_what_was_shown_and_asks_again_for_the_rest() {
    let t0 = Instant::now();
    let mut inputs: Inputs<()> = Inputs::new(1);
    let state = inputs.park(parked(
        9,
        "tools/call",
        t0 + Duration::from_secs(5),
        vec![asked(41, "elicitation/create")],
    ));
    let shown = inputs.by_up(9).expect("parked");
    let result = era::input_required(&mut shown.asks, &state, r#"{"name":"srv","version":"1"}"#);
    assert_eq!(result["resultType"], "input_required");
    assert_eq!(result["requestState"], state.as_str());
    assert_eq!(
        result["inputRequests"]["41"],
        json!({"method": "elicitation/create", "params": {"message": "?"}})
    );
    // A second question arrives before the retry: kept, not shown yet.
    inputs
        .with_ask(41)
        .expect("the call that waits for 41")
        .asks
        .push(asked(42, "sampling/createMessage"));
    let call = inputs.take(&state, "tools/call", t0).expect("retry");
    let responses = json!({"41": {"action": "accept", "content": {}}, "42": {"role": "assistant"}});
    let (answered, missing) = answers(call.asks, responses.as_object().expect("map"));
    // 42 was never shown: its "answer" is not taken; it is asked again.
    assert_eq!(
        answered,
        vec![(41, json!({"action": "accept", "content": {}}))]
    );
    assert_eq!(missing.iter().map(|a| a.down).collect::<Vec<_>>(), [42]);
    // An ended call keeps how it ended for the retry.
    let mut ended = parked(10, "prompts/get", t0 + Duration::from_secs(5), vec![]);
    ended.settled = Some(Settled::Lost);
    let state = inputs.park(ended);
    assert_eq!(
        inputs
            .take(&state, "prompts/get", t0)
            .expect("retry")
            .settled,
        Some(Settled::Lost)
    );
}

#[test]
fn a_listen_stream_gets_what_it_opted_in_to_tagged_with_its_id() {
    let init = json!({"capabilities": {"tools": {}, "resources": {"subscribe": true, "listChanged": true}}});
    let filter = Filter::honoured(
        &json!({"toolsListChanged": true, "promptsListChanged": true,
                "resourceSubscriptions": ["a://1", "a://2"]}),
        &init,
    )
    .expect("valid");
    // No prompts offered: not honoured, and not acknowledged.
    assert_eq!(
        filter.to_value(),
        json!({"toolsListChanged": true, "resourceSubscriptions": ["a://1", "a://2"]})
    );
    let ack = era::acknowledged(&rid(json!("L")), &filter);
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "L"
    );
    let mut listens = Listens::default();
    listens.open(rid(json!("L")), filter);
    listens.open(
        rid(json!(2)),
        Filter::honoured(&json!({"resourceSubscriptions": ["a://2"]}), &init).expect("valid"),
    );
    let updated = |uri: &str| {
        message(
            json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": uri}}),
        )
    };
    let tags = |copies: Vec<Message>| -> Vec<Value> {
        copies
            .iter()
            .map(|m| {
                m.params().expect("params")["_meta"]["io.modelcontextprotocol/subscriptionId"]
                    .clone()
            })
            .collect()
    };
    assert_eq!(tags(listens.fan_out(&updated("a://1"))), [json!("L")]);
    assert_eq!(
        tags(listens.fan_out(&updated("a://2"))),
        [json!("L"), json!(2)]
    );
    assert!(listens.fan_out(&updated("a://3")).is_empty());
    let tools = message(json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}));
    assert_eq!(tags(listens.fan_out(&tools)), [json!("L")]);
    let prompts =
        message(json!({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed"}));
    assert!(listens.fan_out(&prompts).is_empty());
    // Closing one releases what no other stream listens to.
    assert_eq!(
        listens.close(&rid(json!("L"))),
        Some(vec!["a://1".to_owned()])
    );
    assert_eq!(listens.close(&rid(json!("L"))), None);
    assert_eq!(listens.close_all(), ["a://2"]);
    // Bad filters.
    assert!(Filter::honoured(&json!(null), &init).is_err());
    assert!(Filter::honoured(&json!({"resourceSubscriptions": [1]}), &init).is_err());
}

#[test]
fn uri_templates_match_their_uris() {
    for (template, uri, matches) in [
        ("file:///{path}", "file:///etc/hosts", true),
        ("file:///{path}", "http://x", false),
        (
            "test://static/resource/{id}",
            "test://static/resource/7",
            true,
        ),
        ("db://{table}/rows/{id}", "db://users/rows/3", true),
        ("db://{table}/rows/{id}", "db://users/cols/3", false),
        ("plain://x", "plain://x", true),
        ("plain://x", "plain://y", false),
    ] {
        assert_eq!(
            era::template_matches(template, uri),
            matches,
            "{template} {uri}"
        );
    }
}

fn server(out: &[Out]) -> Vec<Value> {
    out.iter()
        .filter_map(|o| match o {
            Out::Server(m) => Some(serde_json::from_slice(&m.line()).expect("json")),
            _ => None,
        })
        .collect()
}

#[test]
fn the_router_parks_a_call_for_its_hosts_input_and_gives_the_answer_to_the_retry() {
    let mut router = Router::new();
    router.attach_by_request(1);
    router.upstream_ready();
    let out = router.request_logged(
        1,
        (rid(json!("c1")), "tools/call", None),
        message(json!({"jsonrpc": "2.0", "id": "c1", "method": "tools/call", "params": {"name": "ask"}})),
    );
    let up = server(&out)[0]["id"].as_u64().expect("upstream id");
    // The server asks; a host that judges capabilities per request gets it.
    let out = router.from_server(message(
        json!({"jsonrpc": "2.0", "id": "s1", "method": "elicitation/create", "params": {}}),
    ));
    assert!(matches!(&out[..], [Out::Host(1, _)]), "{out:?}");
    // Parked: the host's id is free again, the call still open upstream.
    assert_eq!(router.park(1, &rid(json!("c1"))), Some(up));
    assert!(!router.in_use(1, &rid(json!("c1"))));
    assert_eq!(router.in_flight(1), 1);
    assert!(router.resume(1, up, rid(json!("c2"))));
    let out = router.from_server(message(
        json!({"jsonrpc": "2.0", "id": up, "result": {"ok": true}}),
    ));
    let [Out::Host(1, answer)] = &out[..] else {
        panic!("{out:?}");
    };
    assert_eq!(answer.id(), Some(json!("c2")));
    // Answered while parked: kept for the retry.
    router.request_logged(
        1,
        (rid(json!("c3")), "tools/call", None),
        message(json!({"jsonrpc": "2.0", "id": "c3", "method": "tools/call", "params": {}})),
    );
    let up = router.park(1, &rid(json!("c3"))).expect("parked");
    let out = router.from_server(message(json!({"jsonrpc": "2.0", "id": up, "result": {}})));
    assert!(
        matches!(&out[..], [Out::Parked { host: 1, up: u, answer: Some(_) }] if *u == up),
        "{out:?}"
    );
    // Lost with the upstream.
    router.request_logged(
        1,
        (rid(json!("c4")), "tools/call", None),
        message(json!({"jsonrpc": "2.0", "id": "c4", "method": "tools/call", "params": {}})),
    );
    let up = router.park(1, &rid(json!("c4"))).expect("parked");
    let out = router.upstream_lost();
    assert!(
        out.iter()
            .any(|o| matches!(o, Out::Parked { host: 1, up: u, answer: None } if *u == up)),
        "{out:?}"
    );
    // Abandoned: cancelled upstream.
    router.upstream_ready();
    router.request_logged(
        1,
        (rid(json!("c5")), "tools/call", None),
        message(json!({"jsonrpc": "2.0", "id": "c5", "method": "tools/call", "params": {}})),
    );
    let up = router.park(1, &rid(json!("c5"))).expect("parked");
    let out = server(&router.abandon(up, "too late"));
    assert_eq!(out[0]["method"], "notifications/cancelled");
    assert_eq!(out[0]["params"]["requestId"], up);
    assert_eq!(router.in_flight(1), 0);
}

#[test]
fn a_per_request_level_sets_the_upstream_while_it_is_in_flight_and_only_its_host_hears() {
    let mut router = Router::new();
    router.attach(1, Caps::default());
    router.attach_by_request(2);
    router.upstream_ready();
    let out = router.request_logged(
        2,
        (rid(json!(1)), "tools/call", Some(Level::Warning)),
        message(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}})),
    );
    let sent = server(&out);
    assert_eq!(
        sent[0]["method"], "logging/setLevel",
        "told first: {sent:?}"
    );
    assert_eq!(sent[0]["params"]["level"], "warning");
    assert_eq!(sent[1]["method"], "tools/call");
    let up = sent[1]["id"].as_u64().expect("id");
    let log = |level: &str| {
        message(
            json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": level, "data": "x"}}),
        )
    };
    let hosts = |out: Vec<Out>| -> Vec<u64> {
        out.iter()
            .filter_map(|o| match o {
                Out::Host(h, _) => Some(*h),
                _ => None,
            })
            .collect()
    };
    // The legacy host set no level: it sees what the server sends from the
    // default level up; the modern one from its request's.
    assert_eq!(hosts(router.from_server(log("info"))), [1]);
    assert_eq!(hosts(router.from_server(log("error"))), [1, 2]);
    // Its request answered: no more messages for it, and the upstream goes
    // back to the default.
    let out = router.from_server(message(json!({"jsonrpc": "2.0", "id": up, "result": {}})));
    let sent = server(&out);
    assert_eq!(sent[0]["method"], "logging/setLevel");
    assert_eq!(sent[0]["params"]["level"], "info");
    assert_eq!(hosts(router.from_server(log("error"))), [1]);
    // A request without a level gets no messages at all.
    router.request_logged(
        2,
        (rid(json!(2)), "tools/call", None),
        message(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {}})),
    );
    assert_eq!(hosts(router.from_server(log("emergency"))), [1]);
}

#[test]
fn listening_counts_with_the_hosts_subscriptions() {
    let mut router = Router::new();
    router.attach(1, Caps::default());
    router.attach_by_request(2);
    router.upstream_ready();
    let out = server(&router.subscribe(2, "a://1").expect("subscribed"));
    assert_eq!(out[0]["method"], "resources/subscribe");
    // A legacy host's subscription to the same URI shares it.
    let shared = router.from_host(
        1,
        message(json!({"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": "a://1"}})),
    );
    assert!(server(&shared).is_empty(), "{shared:?}");
    assert!(server(&router.unsubscribe(2, "a://1")).is_empty());
    let last = router.from_host(
        1,
        message(json!({"jsonrpc": "2.0", "id": 2, "method": "resources/unsubscribe", "params": {"uri": "a://1"}})),
    );
    assert_eq!(server(&last)[0]["params"]["uri"], "a://1");
    // Bounded like subscriptions.
    let long = format!("a://{}", "x".repeat(9000));
    assert!(router.subscribe(2, &long).is_err());
}

#[test]
fn a_2025_hosts_request_gets_its_meta_for_a_2026_07_28_server() {
    let members = r#""io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}"#;
    let want_meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let cases: [(&[u8], Value); 4] = [
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, json!({"_meta": want_meta})),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e"}}"#,
            json!({"_meta": want_meta, "name": "e"}),
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e","_meta":{"progressToken":3}}}"#,
            json!({"name": "e", "_meta": {"progressToken": 3,
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}}}),
        ),
        // Only a parser can read it.
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n\u0061me":"e"}}"#,
            json!({"_meta": want_meta, "name": "e"}),
        ),
    ];
    for (line, want) in cases {
        let mut message = Message::parse(line).expect("parse");
        era::add_meta(&mut message, members);
        let got: Value = serde_json::from_slice(&message.line()).expect("json");
        assert_eq!(got["params"], want, "{}", String::from_utf8_lossy(line));
        assert!(era::claims(&message));
    }
}

#[test]
fn a_lists_ttl_says_when_it_is_read_again_never_sooner_than_min_list_ttl() {
    use era::{CacheHint, Fresh, MIN_LIST_TTL};
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    // What a page says.
    for (result, ttl, public) in [
        (
            json!({"ttlMs": 1500, "cacheScope": "public"}),
            Some(ms(1500)),
            true,
        ),
        (
            json!({"ttlMs": 0, "cacheScope": "private"}),
            Some(ms(0)),
            false,
        ),
        (json!({"ttlMs": -1, "cacheScope": "shared"}), None, false),
        (json!({"ttlMs": "5"}), None, false),
        (json!({}), None, false),
    ] {
        assert_eq!(
            CacheHint::of(&result),
            CacheHint { ttl, public },
            "{result}"
        );
    }
    // Pages: the shortest TTL, public only if all are.
    let public = |ttl| CacheHint {
        ttl: Some(ms(ttl)),
        public: true,
    };
    let private = CacheHint {
        ttl: Some(ms(200)),
        public: false,
    };
    assert_eq!(public(500).and(public(300)), public(300));
    assert_eq!(
        public(100).and(private),
        CacheHint {
            ttl: Some(ms(100)),
            public: false
        }
    );
    assert_eq!(
        CacheHint::default().and(public(40)),
        CacheHint {
            ttl: Some(ms(40)),
            public: false
        }
    );
    // When it is read again: its TTL after the read, at least
    // MIN_LIST_TTL (ttlMs 0 is no storm); never without a TTL.
    assert_eq!(public(1500).stale_at(t0), Some(t0 + ms(1500)));
    assert_eq!(public(0).stale_at(t0), Some(t0 + MIN_LIST_TTL));
    assert_eq!(MIN_LIST_TTL, ms(100));
    assert_eq!(CacheHint::default().stale_at(t0), None);
    let forever = CacheHint {
        ttl: Some(Duration::MAX),
        public: false,
    };
    assert_eq!(forever.stale_at(t0), None);
    // What a host is told: the TTL left, and the scope.
    assert_eq!(
        public(1500).fresh(t0, t0 + ms(1000)),
        Fresh {
            ttl_ms: 500,
            public: true
        }
    );
    assert_eq!(public(1500).fresh(t0, t0 + ms(2000)).ttl_ms, 0);
    assert_eq!(private.fresh(t0, t0).scope(), "private");
    assert_eq!(CacheHint::default().fresh(t0, t0), Fresh::default());
    // ... in the answer from a kept list.
    let answer = era::list_answer(
        &rid(json!(7)),
        "tools",
        "[]",
        "{}",
        public(1500).fresh(t0, t0 + ms(1000)),
    );
    let answer: Value = serde_json::from_slice(&answer).expect("JSON");
    assert_eq!(
        (
            answer["result"]["ttlMs"].clone(),
            answer["result"]["cacheScope"].clone()
        ),
        (json!(500), json!("public"))
    );
}

#[test]
fn a_task_is_its_hosts_alone_by_an_id_of_mcpds() {
    use mcpd::mux::tasks::{MAX_TASKS, RELATED_TASK_KEY, Tasks, rename_tasks};
    let mut tasks: Tasks<u32> = Tasks::default();
    // Host 1's call created the server's task "s-1": host 1 knows it by
    // mcpd's id, the same each time the server names it to host 1.
    let a = tasks.created(1, "s-1");
    assert_ne!(a, "s-1");
    assert_eq!(tasks.created(1, "s-1"), a);
    let b = tasks.created(2, "s-2");
    assert_ne!(a, b);
    assert_eq!(tasks.to_server(1, &a), Some("s-1"));
    assert_eq!(tasks.to_host("s-1"), Some((1, a.as_str())));
    // Another host's id, or the server's own, names nothing for a host.
    assert_eq!(tasks.to_server(2, &a), None);
    assert_eq!(tasks.to_server(1, "s-1"), None);
    assert_eq!(tasks.to_server(1, &b), None);

    // Each place a message names a task, renamed; untouched elsewhere.
    let cases = [
        (
            json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"taskId": a}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"taskId": "s-1"}}),
        ),
        (
            json!({"jsonrpc": "2.0", "id": 4, "result": {"task": {"taskId": a, "status": "working"}}}),
            json!({"jsonrpc": "2.0", "id": 4, "result": {"task": {"taskId": "s-1", "status": "working"}}}),
        ),
        (
            json!({"jsonrpc": "2.0", "id": 5, "result": {"taskId": a, "status": "completed",
                   "_meta": {RELATED_TASK_KEY: {"taskId": a}}}}),
            json!({"jsonrpc": "2.0", "id": 5, "result": {"taskId": "s-1", "status": "completed",
                   "_meta": {RELATED_TASK_KEY: {"taskId": "s-1"}}}}),
        ),
        (
            json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                   "params": {"taskId": a, "status": "failed", "statusMessage": "taskId"}}),
            json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
                   "params": {"taskId": "s-1", "status": "failed", "statusMessage": "taskId"}}),
        ),
        (
            json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                   "params": {"name": "taskId", "arguments": {"taskId": "x"}}}),
            json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                   "params": {"name": "taskId", "arguments": {"taskId": "x"}}}),
        ),
    ];
    for (host_side, server_side) in cases {
        // Upstream: host 1's ids become the server's.
        let mut up = host_side.clone();
        assert!(rename_tasks(&mut up, |id| tasks
            .to_server(1, id)
            .map(str::to_owned)));
        assert_eq!(up, server_side);
        // Back: the server's become host 1's.
        let mut down = server_side.clone();
        assert!(rename_tasks(&mut down, |id| tasks
            .to_host(id)
            .filter(|(h, _)| *h == 1)
            .map(|(_, d)| d.to_owned())));
        assert_eq!(down, host_side);
    }
    // Host 2 asking about host 1's task: refused, the message unchanged.
    let mut asked =
        json!({"jsonrpc": "2.0", "id": 7, "method": "tasks/cancel", "params": {"taskId": a}});
    let before = asked.clone();
    assert!(!rename_tasks(&mut asked, |id| tasks
        .to_server(2, id)
        .map(str::to_owned)));
    assert_eq!(asked, before);

    // A host that leaves takes its tasks with it (the server's ids, to
    // cancel them).
    assert_eq!(tasks.detach(1), ["s-1"]);
    assert_eq!(tasks.to_server(1, &a), None);
    assert_eq!(tasks.len(), 1);
    // Bounded: past MAX_TASKS the oldest is forgotten.
    for i in 0..MAX_TASKS {
        tasks.created(3, &format!("n-{i}"));
    }
    assert_eq!(tasks.len(), MAX_TASKS);
    assert_eq!(tasks.to_host("s-2"), None, "the oldest went first");
    assert!(tasks.to_host(&format!("n-{}", MAX_TASKS - 1)).is_some());
}
