//! The pure core of a host session (`mux::session`), case by case: what
//! mcpd decides about a host's lines itself.

use mcpd::mux::era::Era;
use mcpd::mux::message::{Message, RequestId};
use mcpd::mux::session::{
    self, BACKLOG, HOST_VERSIONS, HostState, Outcome, PROTOCOL_VERSION, Step, classify,
};
use mcpd::mux::wire::Frame;
use serde_json::{Value, json};

/// The request id `id`.
fn rid(id: Value) -> RequestId {
    RequestId::of(&id).expect("not null")
}

fn frame(value: Value) -> Frame {
    Frame::Message(value.into())
}

fn request(id: Value, method: &str) -> Frame {
    frame(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {}}))
}

const READY: HostState = HostState {
    era: Some(Era::Legacy),
    initialized: true,
    waiting: false,
    held: 0,
};

const NEW: HostState = HostState {
    era: None,
    initialized: false,
    waiting: false,
    held: 0,
};

/// The code and message of a refusal.
fn refusal(step: &Step) -> (i64, Value, String) {
    match step {
        Step::Refuse(error) => (
            error["error"]["code"].as_i64().expect("code"),
            error["id"].clone(),
            error["error"]["message"]
                .as_str()
                .expect("message")
                .to_owned(),
        ),
        other => panic!("not a refusal: {other:?}"),
    }
}

#[test]
fn a_new_session_answers_initialize_and_ping_and_refuses_the_rest() {
    let cases: [(Frame, Step); 5] = [
        (
            request(json!(1), "initialize"),
            Step::Initialize(rid(json!(1))),
        ),
        (request(json!("p"), "ping"), Step::Pong(rid(json!("p")))),
        (
            frame(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
            Step::Ignore,
        ),
        (
            frame(
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
            ),
            Step::Ignore,
        ),
        // an answer to nothing, before initialize: routed (the router drops it)
        (
            frame(json!({"jsonrpc": "2.0", "id": 1, "result": {}})),
            Step::Route,
        ),
    ];
    for (n, (line, want)) in cases.into_iter().enumerate() {
        assert_eq!(classify(&line, NEW), want, "case {n}");
    }
    for method in ["tools/list", "tools/call", "resources/read"] {
        let step = classify(&request(json!(7), method), NEW);
        assert_eq!(
            refusal(&step),
            (
                -32600,
                json!(7),
                "send initialize first (MCP 2025), or server/discover or requests with _meta io.modelcontextprotocol/protocolVersion (MCP 2026-07-28)".into()
            ),
            "{method}"
        );
    }
}

#[test]
fn an_initialized_session_routes_requests_and_refuses_a_second_initialize() {
    assert_eq!(
        refusal(&classify(&request(json!(2), "initialize"), READY)),
        (
            -32600,
            json!(2),
            "the session is already initialized".into()
        )
    );
    assert_eq!(
        classify(&request(json!(3), "tools/list"), READY),
        Step::ToolsList(rid(json!(3)))
    );
    for method in ["ping", "resources/list", "tools/call", "x/unknown"] {
        assert_eq!(
            classify(&request(json!(4), method), READY),
            Step::Request {
                id: rid(json!(4)),
                method: method.into()
            }
        );
    }
    // a null id is no id: a notification-shaped request is routed
    assert_eq!(
        classify(&request(Value::Null, "tools/call"), READY),
        Step::Route
    );
    assert_eq!(
        classify(
            &frame(
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "a"}})
            ),
            READY
        ),
        Step::Cancelled {
            request: Some(rid(json!("a")))
        }
    );
    assert_eq!(
        classify(
            &frame(json!({"jsonrpc": "2.0", "method": "notifications/cancelled"})),
            READY
        ),
        Step::Cancelled { request: None }
    );
    assert_eq!(
        classify(
            &frame(json!({"jsonrpc": "2.0", "method": "notifications/progress"})),
            READY
        ),
        Step::Route
    );
}

#[test]
fn lines_that_are_not_messages_are_refused_with_a_null_id() {
    for state in [NEW, READY] {
        let (code, id, why) = refusal(&classify(&Frame::Garbage("not JSON".into()), state));
        assert_eq!((code, id, why.as_str()), (-32700, Value::Null, "not JSON"));
        let (code, id, why) = refusal(&classify(&Frame::TooLong(None), state));
        assert_eq!((code, id), (-32600, Value::Null));
        assert_eq!(why, "a message longer than 16777216 bytes was dropped");
        // with the id its ends told
        let (code, id, _) = refusal(&classify(&Frame::TooLong(Some(rid(json!(9)))), state));
        assert_eq!((code, id), (-32600, json!(9)));
    }
}

#[test]
fn behind_a_waiting_initialize_lines_are_held_up_to_the_backlog() {
    let waiting = |held| HostState {
        era: None,
        initialized: false,
        waiting: true,
        held,
    };
    for line in [
        request(json!(1), "tools/call"),
        Frame::Garbage("x".into()),
        Frame::TooLong(None),
    ] {
        assert_eq!(classify(&line, waiting(0)), Step::Hold);
        assert_eq!(classify(&line, waiting(BACKLOG - 1)), Step::Hold);
        assert_eq!(
            classify(&line, waiting(BACKLOG)),
            Step::Overflow("it sent too much before its initialize was answered")
        );
    }
}

#[test]
fn initialize_is_answered_with_the_servers_result_and_the_hosts_version() {
    let init = json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {"tools": {}, "resources": {"listChanged": true}},
        "serverInfo": {"name": "s", "version": "1"},
        "instructions": "be nice",
    });
    for asked in HOST_VERSIONS {
        let result = session::initialize_result(&init, &json!({"protocolVersion": asked}));
        assert_eq!(result["protocolVersion"], asked);
    }
    for asked in [json!("1999-01-01"), json!(5), Value::Null] {
        let result = session::initialize_result(&init, &json!({"protocolVersion": asked}));
        assert_eq!(result["protocolVersion"], PROTOCOL_VERSION, "{asked}");
    }
    let result = session::initialize_result(&init, &json!({}));
    // mcpd tells hosts when the published tools change
    assert_eq!(result["capabilities"]["tools"]["listChanged"], true);
    assert_eq!(
        result["capabilities"]["resources"],
        init["capabilities"]["resources"]
    );
    assert_eq!(result["instructions"], "be nice");
    assert_eq!(result["serverInfo"], init["serverInfo"]);
    // a server without tools is not given them
    let bare = json!({"protocolVersion": "2025-11-25", "capabilities": {}});
    let result = session::initialize_result(&bare, &json!({}));
    assert_eq!(result["capabilities"], json!({}));
}

#[test]
fn a_replayed_initialize_is_told_every_list_that_may_have_changed() {
    let notices = |caps: Value| session::replay_notices(&json!({"capabilities": caps}));
    assert_eq!(notices(json!({})), ["notifications/tools/list_changed"]);
    assert_eq!(
        notices(json!({"resources": {"listChanged": true}, "prompts": {"listChanged": true}})),
        [
            "notifications/tools/list_changed",
            "notifications/resources/list_changed",
            "notifications/prompts/list_changed"
        ]
    );
    assert_eq!(
        notices(json!({"resources": {"subscribe": true}, "prompts": {"listChanged": false}})),
        ["notifications/tools/list_changed"]
    );
}

#[test]
fn a_kept_list_is_answered_as_its_text() {
    let bytes = session::list_answer(&rid(json!("a\"b")), "prompts", r#"[{"name":"p"}]"#);
    let answer: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(
        answer,
        json!({"jsonrpc": "2.0", "id": "a\"b", "result": {"prompts": [{"name": "p"}]}})
    );
    assert_eq!(bytes.last(), Some(&b'\n'));
}

#[test]
fn pings_and_session_settings_are_no_use_of_the_server() {
    for method in [
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
    ] {
        assert!(!session::counts_as_use(method), "{method}");
    }
    for method in [
        "tools/call",
        "resources/read",
        "prompts/get",
        "completion/complete",
    ] {
        assert!(session::counts_as_use(method), "{method}");
    }
}

#[test]
fn a_tool_call_is_accounted_by_its_answer_and_named_by_its_params() {
    let answer = |v: Value| Message::from(v);
    let cases = [
        (json!({"id": 1, "result": {"content": []}}), Outcome::Ok),
        (
            json!({"id": 1, "result": {"content": [], "isError": true}}),
            Outcome::ErrorResult,
        ),
        (
            json!({"id": 1, "result": {"content": [{"text": "isError"}], "isError": false}}),
            Outcome::Ok,
        ),
        (
            json!({"id": 1, "error": {"code": -32000, "message": "down"}}),
            Outcome::Failed("down".into()),
        ),
        (
            json!({"id": 1, "error": {"code": -32000}}),
            Outcome::Failed("an error without a message".into()),
        ),
    ];
    for (n, (value, want)) in cases.into_iter().enumerate() {
        assert_eq!(session::outcome_of(&answer(value)), want, "case {n}");
    }
    // a key spelt with an escape is read as a parser reads it
    let escaped = Message::parse(br#"{"id":1,"result":{"\u0069sError":true}}"#).expect("message");
    assert_eq!(session::outcome_of(&escaped), Outcome::ErrorResult);
    // as read from a line: the member of the result itself, spaced or
    // not, and not one deeper or a string that looks like it
    for (line, want) in [
        (r#"{"result":{"isError" :	true}}"#, Outcome::ErrorResult),
        (
            r#"{"result":{"content":[],"isError":true}}"#,
            Outcome::ErrorResult,
        ),
        (
            r#"{"result":{"isError":false,"isError":true}}"#,
            Outcome::ErrorResult,
        ),
        (
            r#"{"result":{"isError":true,"isError":false}}"#,
            Outcome::Ok,
        ),
        (
            r#"{"result":{"structuredContent":{"isError":true},"isError":false}}"#,
            Outcome::Ok,
        ),
        (
            r#"{"result":{"content":[{"text":"\"isError\":true"}]}}"#,
            Outcome::Ok,
        ),
        (
            r#"{"result":{"content":[{"text":"isError: true"}]}}"#,
            Outcome::Ok,
        ),
        (r#"{"result":{"isError":"true"}}"#, Outcome::Ok),
        (r#"{"result":{"isErrors":true}}"#, Outcome::Ok),
        (
            r#"{"result":{"content":[{"text":"\u00e9"}],"isError":true}}"#,
            Outcome::ErrorResult,
        ),
        (
            r#"{"result":{"content":[{"text":"\u00e9"}],"isError":false}}"#,
            Outcome::Ok,
        ),
    ] {
        let answer = Message::parse(line.as_bytes()).expect("message");
        assert_eq!(session::outcome_of(&answer), want, "{line}");
    }

    let call = |params: &str| {
        Message::parse(format!(r#"{{"id":1,"method":"tools/call","params":{params}}}"#).as_bytes())
            .expect("message")
    };
    assert_eq!(session::tool_name(&call(r#"{"name":"echo"}"#)), "echo");
    // the name first, as SDKs write it, and whatever may follow it
    for (params, name) in [
        (r#"{ "name" : "echo", "arguments": {"text": "x"}}"#, "echo"),
        (r#"{"name":"echo","arguments":{"name":"inner"}}"#, "echo"),
        (r#"{"name":"echo","arguments":{"text":"\"name\""}}"#, "echo"),
        (r#"{"name":"echo","name":"last"}"#, "last"),
        (r#"{"name":"echo","n\u0061me":"escaped"}"#, "escaped"),
        (r#"{"name":"echo","arguments":{"t":"\u00e9"}}"#, "echo"),
        (r#"{"name":"ec\u0068o"}"#, "echo"),
        (r#"{"name":"a\"b"}"#, "a\"b"),
        (r#"{"name":7}"#, ""),
        (r#"{"arguments":{"name":"inner"},"name":"echo"}"#, "echo"),
    ] {
        assert_eq!(session::tool_name(&call(params)), name, "{params}");
    }
    // of a repeated name, the last, as the server will read it
    assert_eq!(
        session::tool_name(&call(r#"{"name":"safe","name":"rm"}"#)),
        "rm"
    );
    assert_eq!(session::tool_name(&call(r#"{"name":"a\u0062"}"#)), "ab");
    assert_eq!(session::tool_name(&call(r#"{"\u006eame":"n"}"#)), "n");
    assert_eq!(session::tool_name(&call(r#"{"arguments":{}}"#)), "");
}

#[test]
fn a_request_id_is_its_json_text_read_once() {
    let read = |line: &str| {
        Message::parse(line.as_bytes())
            .expect("message")
            .request_id()
    };
    let cases = [
        (r#"{"id":7}"#, Some("7")),
        (r#"{"id":-3}"#, Some("-3")),
        (r#"{"id":"a"}"#, Some(r#""a""#)),
        // as serde_json writes it: escapes normalised
        (r#"{"id":"\u0061"}"#, Some(r#""a""#)),
        (r#"{"id":"a\"b"}"#, Some(r#""a\"b""#)),
        (r#"{"id":1e2}"#, Some("100.0")),
        (r#"{"id":null}"#, None),
        (r#"{"method":"x"}"#, None),
    ];
    for (line, want) in cases {
        assert_eq!(read(line).as_ref().map(RequestId::as_json), want, "{line}");
    }
    // the same id from a Value and from a line
    for id in [json!(7), json!("a"), json!("a\"b"), json!(u64::MAX)] {
        let line = json!({"id": id}).to_string();
        assert_eq!(read(&line), RequestId::of(&id), "{id}");
        assert_eq!(rid(id.clone()).to_value(), id);
    }
    assert_eq!(RequestId::of(&Value::Null), None);
    // 1 and "1" are two ids
    assert_ne!(rid(json!(1)), rid(json!("1")));
    assert_eq!(rid(json!(42)).as_u64(), Some(42));
    assert_eq!(rid(json!("42")).as_u64(), None);
    assert_eq!(rid(json!("a")).to_string(), r#""a""#);
}

#[test]
fn what_is_not_json_rpc_2_0_is_an_invalid_request_and_unknown_members_go() {
    let line = |text: &str| Frame::Message(Message::parse(text.as_bytes()).expect("message"));
    let cases = [
        (
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            json!(1),
            "jsonrpc must be \"2.0\"",
        ),
        (
            r#"{"id":"a","method":"tools/list"}"#,
            json!("a"),
            "jsonrpc must be \"2.0\"",
        ),
        (
            r#"{"jsonrpc":2.0,"id":1,"method":"ping"}"#,
            json!(1),
            "jsonrpc must be \"2.0\"",
        ),
        (
            r#"{"jsonrpc":"1.0","method":"notifications/initialized"}"#,
            Value::Null,
            "jsonrpc must be \"2.0\"",
        ),
        (
            r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#,
            Value::Null,
            "a request id must be a string or an integer (64 bits)",
        ),
        (
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
            Value::Null,
            "a request id must be a string or an integer (64 bits)",
        ),
        (
            r#"{"jsonrpc":"2.0","id":[1],"result":{}}"#,
            Value::Null,
            "a request id must be a string or an integer (64 bits)",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            Value::Null,
            "a request id must be a string or an integer (64 bits)",
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
            Value::Null,
            "a JSON-RPC member (id, method, params, …) is given twice",
        ),
    ];
    for state in [NEW, READY] {
        for (text, id, why) in &cases {
            let (code, got, message) = refusal(&classify(&line(text), state));
            assert_eq!((code, &got, message.as_str()), (-32600, id, *why), "{text}");
        }
    }
    // valid ids of every kind pass
    for text in [
        r#"{"jsonrpc":"2.0","id":-1,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":"x","method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"m"}}"#,
    ] {
        assert!(
            !matches!(classify(&line(text), READY), Step::Refuse(_)),
            "{text}"
        );
    }
    // members JSON-RPC does not have are dropped, the rest kept in order
    let mut message = Message::parse(
        br#"{"jsonrpc":"2.0","extra":1,"id":5,"method":"tools/call","params":{"x":1},"trace":"t"}"#,
    )
    .expect("message");
    assert_eq!(session::strip(&mut message), ["extra", "trace"]);
    assert_eq!(
        message.to_value(),
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"x": 1}})
    );
    assert_eq!(
        String::from_utf8(message.line()).expect("utf-8"),
        "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"x\":1}}\n"
    );
    assert!(session::strip(&mut message).is_empty());
}
