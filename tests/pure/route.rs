//! The pure routing core of host sessions (DESIGN §8), message by message.

use mcpd::mux::error::ErrorCode;
use mcpd::mux::message::Message;
use mcpd::mux::route::{Caps, HostId, Out, Router};
use serde_json::{Value, json};

const A: HostId = 1;
const B: HostId = 2;
const C: HostId = 3;

const ALL_CAPS: Caps = Caps {
    sampling: true,
    elicitation: true,
    roots: true,
};

/// A router with an established upstream and `hosts` attached.
fn router(hosts: &[(HostId, Caps)]) -> Router {
    let mut r = Router::new();
    assert!(r.upstream_ready().is_empty());
    for (id, caps) in hosts {
        r.attach(*id, *caps);
    }
    r
}

fn request(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

fn result(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// The one message sent upstream.
fn upstream(out: &[Out]) -> Value {
    match out {
        [Out::Server(msg)] => msg.to_value(),
        other => panic!("expected one message to the server, got {other:?}"),
    }
}

/// The one message sent to a host.
fn to_host(out: &[Out]) -> (HostId, Value) {
    match out {
        [Out::Host(host, msg)] => (*host, msg.to_value()),
        other => panic!("expected one message to a host, got {other:?}"),
    }
}

#[test]
fn ids_are_rewritten_per_host_and_answers_go_back() {
    let mut r = router(&[(A, Caps::default()), (B, Caps::default())]);
    // both hosts use id 1: upstream sees two distinct ids
    let a = upstream(&r.from_host(A, request(json!(1), "tools/call", json!({"name": "echo"}))));
    let b = upstream(&r.from_host(B, request(json!(1), "tools/call", json!({"name": "add"}))));
    assert_ne!(a["id"], b["id"]);
    assert_eq!(
        a["params"]["name"], "echo",
        "everything else passes unchanged"
    );
    // answers in the other order reach the right host with its own id
    let (host, msg) = to_host(&r.from_server(result(b["id"].clone(), json!({"b": true}))));
    assert_eq!(
        (host, &msg["id"], &msg["result"]),
        (B, &json!(1), &json!({"b": true}))
    );
    let (host, msg) = to_host(&r.from_server(result(a["id"].clone(), json!({"a": true}))));
    assert_eq!((host, &msg["id"]), (A, &json!(1)));
    // string ids and unknown methods and fields pass too
    let x = upstream(&r.from_host(
        A,
        json!({"jsonrpc": "2.0", "id": "x-7", "method": "x/future", "params": {"what": "t"}, "extra": 1}),
    ));
    assert_eq!(
        (x["method"].as_str(), x["extra"].as_i64()),
        (Some("x/future"), Some(1))
    );
    let (_, msg) = to_host(&r.from_server(result(x["id"].clone(), json!({}))));
    assert_eq!(msg["id"], "x-7");
    // an answer nobody waits for goes nowhere
    assert!(r.from_server(result(json!(999), json!({}))).is_empty());
}

#[test]
fn a_reused_id_in_flight_is_rejected() {
    let mut r = router(&[(A, Caps::default())]);
    upstream(&r.from_host(A, request(json!(5), "tools/call", json!({}))));
    let (host, msg) = to_host(&r.from_host(A, request(json!(5), "tools/call", json!({}))));
    assert_eq!(host, A);
    assert_eq!(msg["error"]["code"], -32600);
}

#[test]
fn progress_reaches_only_the_caller_with_its_own_token() {
    let mut r = router(&[(A, Caps::default()), (B, Caps::default())]);
    let a = upstream(&r.from_host(
        A,
        request(
            json!(1),
            "tools/call",
            json!({"name": "slow", "_meta": {"progressToken": "tok"}}),
        ),
    ));
    let b = upstream(&r.from_host(
        B,
        request(
            json!(1),
            "tools/call",
            json!({"name": "slow", "_meta": {"progressToken": "tok"}}),
        ),
    ));
    let (ta, tb) = (
        a["params"]["_meta"]["progressToken"].clone(),
        b["params"]["_meta"]["progressToken"].clone(),
    );
    assert_ne!(ta, tb, "the same host token becomes two upstream tokens");
    let (host, msg) = to_host(&r.from_server(notification(
        "notifications/progress",
        json!({"progressToken": tb, "progress": 1}),
    )));
    assert_eq!((host, &msg["params"]["progressToken"]), (B, &json!("tok")));
    // once answered, the token is gone
    to_host(&r.from_server(result(b["id"].clone(), json!({}))));
    assert!(
        r.from_server(notification(
            "notifications/progress",
            json!({"progressToken": tb, "progress": 2})
        ))
        .is_empty()
    );
}

#[test]
fn a_progress_token_is_set_in_the_text_or_through_a_parser() {
    let mut r = router(&[(A, Caps::default())]);
    // As SDKs write it: replaced in place, the rest of the params as the
    // host wrote them (order and spacing).
    let line = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow", "arguments":{"b":1,"a":2},"_meta":{"progressToken":"tok"}}}"#;
    let out = r.from_host(A, Message::parse(line).expect("a message"));
    let [Out::Server(up)] = &out[..] else {
        panic!("expected one message to the server, got {out:?}");
    };
    let ours = up.to_value()["params"]["_meta"]["progressToken"].clone();
    assert!(ours.is_u64(), "{ours}");
    assert_eq!(
        up.raw("params"),
        Some(format!(r#"{{"name":"slow", "arguments":{{"b":1,"a":2}},"_meta":{{"progressToken":{ours}}}}}"#).as_str())
    );
    // `_meta` twice: the last is the one a parser (and the server) reads,
    // and that is the one replaced.
    let line = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow","_meta":{"progressToken":"old"},"_meta":{"progressToken":"tok2"}}}"#;
    let up2 = upstream(&r.from_host(A, Message::parse(line).expect("a message")));
    let ours2 = up2["params"]["_meta"]["progressToken"].clone();
    assert!(ours2.is_u64() && ours2 != ours, "{ours2}");
    for (token, theirs) in [(ours, "tok"), (ours2, "tok2")] {
        let (host, msg) = to_host(&r.from_server(notification(
            "notifications/progress",
            json!({"progressToken": token, "progress": 1}),
        )));
        assert_eq!((host, &msg["params"]["progressToken"]), (A, &json!(theirs)));
    }
}

#[test]
fn a_cancellation_names_the_upstream_id_and_ends_the_request() {
    let mut r = router(&[(A, Caps::default())]);
    let call = upstream(&r.from_host(A, request(json!(9), "tools/call", json!({}))));
    let cancel = upstream(&r.from_host(
        A,
        notification(
            "notifications/cancelled",
            json!({"requestId": 9, "reason": "user"}),
        ),
    ));
    assert_eq!(cancel["params"]["requestId"], call["id"]);
    assert_eq!(cancel["params"]["reason"], "user");
    // a late answer is dropped, and the id may be used again
    assert!(
        r.from_server(result(call["id"].clone(), json!({})))
            .is_empty()
    );
    upstream(&r.from_host(A, request(json!(9), "tools/call", json!({}))));
    // cancelling what is not in flight sends nothing
    assert!(
        r.from_host(
            A,
            notification("notifications/cancelled", json!({"requestId": 77}))
        )
        .is_empty()
    );
}

#[test]
fn server_requests_go_to_the_host_that_caused_them() {
    // (hosts with a request in flight, capable hosts, who is asked)
    struct Case {
        busy: &'static [HostId],
        capable: &'static [HostId],
        asked: Result<HostId, &'static str>,
    }
    let cases = [
        // the most recent caller (C) is idle; the busy host B answers
        Case {
            busy: &[B],
            capable: &[B, C],
            asked: Ok(B),
        },
        // B's call caused it: B answers, though A is capable too
        Case {
            busy: &[B],
            capable: &[A, B],
            asked: Ok(B),
        },
        // the only busy host cannot answer: an error, not someone else
        Case {
            busy: &[B],
            capable: &[A],
            asked: Err("did not declare"),
        },
        // several busy: the most recent capable caller
        Case {
            busy: &[A, C, B],
            capable: &[A, C],
            asked: Ok(C),
        },
        // nobody busy: the most recent capable caller
        Case {
            busy: &[],
            capable: &[A, B],
            asked: Ok(B),
        },
        // nobody capable
        Case {
            busy: &[],
            capable: &[],
            asked: Err("no attached host declared"),
        },
        // several busy, none capable: an error, not the idle capable host
        Case {
            busy: &[A, B],
            capable: &[C],
            asked: Err("none of the hosts with a request in flight"),
        },
    ];
    for (n, case) in cases.iter().enumerate() {
        let caps = |h| {
            if case.capable.contains(&h) {
                ALL_CAPS
            } else {
                Caps::default()
            }
        };
        let mut r = router(&[(A, caps(A)), (B, caps(B)), (C, caps(C))]);
        // every host calls once (A, then B, then C), and those not busy get
        // their answer
        let mut ups = Vec::new();
        for h in [A, B, C] {
            ups.push(upstream(
                &r.from_host(h, request(json!(1), "tools/call", json!({}))),
            ));
        }
        for (h, up) in [A, B, C].into_iter().zip(&ups) {
            if !case.busy.contains(&h) {
                to_host(&r.from_server(result(up["id"].clone(), json!({}))));
            }
        }
        // the order of the busy list says who called last
        for h in case.busy {
            upstream(&r.from_host(*h, request(json!(2), "ping2", json!({}))));
        }
        let out = r.from_server(request(json!("s1"), "sampling/createMessage", json!({})));
        match case.asked {
            Ok(host) => {
                let (got, msg) = to_host(&out);
                assert_eq!(got, host, "case {n}");
                assert_eq!(msg["method"], "sampling/createMessage");
                // the host's answer goes back under the server's id
                let back =
                    upstream(&r.from_host(host, result(msg["id"].clone(), json!({"ok": 1}))));
                assert_eq!(
                    (back["id"].as_str(), &back["result"]),
                    (Some("s1"), &json!({"ok": 1}))
                );
            }
            Err(why) => {
                let msg = upstream(&out);
                assert_eq!(msg["id"], "s1", "case {n}");
                assert_eq!(
                    msg["error"]["code"],
                    ErrorCode::MethodNotFound.code(),
                    "case {n}"
                );
                let text = msg["error"]["message"].as_str().unwrap_or_default();
                assert!(text.contains(why), "case {n}: {text}");
            }
        }
    }
}

#[test]
fn an_answer_from_the_wrong_host_goes_nowhere() {
    let mut r = router(&[(A, ALL_CAPS), (B, ALL_CAPS)]);
    upstream(&r.from_host(A, request(json!(1), "tools/call", json!({}))));
    let (host, msg) = to_host(&r.from_server(request(json!(3), "roots/list", json!({}))));
    assert_eq!(host, A);
    assert!(
        r.from_host(B, result(msg["id"].clone(), json!({})))
            .is_empty()
    );
    assert!(r.from_host(A, result(json!(12345), json!({}))).is_empty());
    upstream(&r.from_host(A, result(msg["id"].clone(), json!({"roots": []}))));
}

#[test]
fn pings_are_answered_on_the_spot() {
    let mut r = router(&[(A, Caps::default())]);
    let (host, msg) = to_host(&r.from_host(A, request(json!(4), "ping", json!({}))));
    assert_eq!(
        (host, &msg["id"], &msg["result"]),
        (A, &json!(4), &json!({}))
    );
    let msg = upstream(&r.from_server(request(json!(8), "ping", json!({}))));
    assert_eq!((&msg["id"], &msg["result"]), (&json!(8), &json!({})));
}

#[test]
fn subscriptions_are_counted_and_updates_reach_subscribers_only() {
    let mut r = router(&[
        (A, Caps::default()),
        (B, Caps::default()),
        (C, Caps::default()),
    ]);
    let sub = |uri: &str| json!({"uri": uri});
    // the first subscriber's request goes upstream (and its answer back)
    let up = upstream(&r.from_host(
        A,
        request(json!(1), "resources/subscribe", sub("file:///x")),
    ));
    assert_eq!(up["method"], "resources/subscribe");
    to_host(&r.from_server(result(up["id"].clone(), json!({}))));
    // the second is answered by mcpd
    let (host, msg) = to_host(&r.from_host(
        B,
        request(json!(1), "resources/subscribe", sub("file:///x")),
    ));
    assert_eq!((host, &msg["result"]), (B, &json!({})));
    let updated = notification("notifications/resources/updated", sub("file:///x"));
    let out = r.from_server(updated.clone());
    let hosts: Vec<HostId> = out
        .iter()
        .map(|o| match o {
            Out::Host(h, _) => *h,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(hosts, [A, B], "C did not subscribe");
    // A leaves the URI: answered locally, B still subscribed
    to_host(&r.from_host(
        A,
        request(json!(2), "resources/unsubscribe", sub("file:///x")),
    ));
    assert_eq!(to_host(&r.from_server(updated.clone())).0, B);
    // the last one out unsubscribes upstream
    let up = upstream(&r.from_host(
        B,
        request(json!(2), "resources/unsubscribe", sub("file:///x")),
    ));
    assert_eq!(up["method"], "resources/unsubscribe");
    assert!(r.from_server(updated).is_empty());
}

#[test]
fn log_levels_are_per_host_and_the_upstream_gets_the_most_verbose() {
    let mut r = router(&[(A, Caps::default()), (C, Caps::default())]);
    let set = |level: &str| json!({"level": level});
    // C asks for errors only: the server is told error
    let out = r.from_host(C, request(json!(1), "logging/setLevel", set("error")));
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(matches!(&out[0], Out::Server(m) if m.to_value()["params"]["level"] == "error"));
    assert!(matches!(&out[1], Out::Host(C, m) if m.to_value()["result"] == json!({})));
    // A asks for debug: the server is told debug
    let out = r.from_host(A, request(json!(1), "logging/setLevel", set("debug")));
    assert!(matches!(&out[0], Out::Server(m) if m.to_value()["params"]["level"] == "debug"));
    // C asking again for error changes nothing upstream
    let out = r.from_host(C, request(json!(2), "logging/setLevel", set("error")));
    assert!(matches!(out.as_slice(), [Out::Host(C, _)]), "{out:?}");
    // a debug message reaches A only; an error message both
    let message = |level: &str| {
        notification(
            "notifications/message",
            json!({"level": level, "data": "x"}),
        )
    };
    assert_eq!(to_host(&r.from_server(message("debug"))).0, A);
    assert_eq!(r.from_server(message("error")).len(), 2);
    // A leaves: the server goes back to C's level
    let out = r.detach(A);
    assert!(
        matches!(out.as_slice(), [Out::Server(m)] if m.to_value()["params"]["level"] == "error"),
        "{out:?}"
    );
    // a bad level is the host's error, nothing upstream
    let (host, msg) = to_host(&r.from_host(C, request(json!(3), "logging/setLevel", set("loud"))));
    assert_eq!((host, &msg["error"]["code"]), (C, &json!(-32602)));
}

#[test]
fn a_host_without_a_level_sees_what_the_server_sends_until_someone_changes_it() {
    let mut r = router(&[(A, Caps::default()), (B, Caps::default())]);
    let message = |level: &str| notification("notifications/message", json!({"level": level}));
    assert_eq!(r.from_server(message("debug")).len(), 2);
    r.from_host(
        A,
        request(json!(1), "logging/setLevel", json!({"level": "debug"})),
    );
    // now B gets the default floor (info), A its own
    assert_eq!(to_host(&r.from_server(message("debug"))).0, A);
    assert_eq!(r.from_server(message("info")).len(), 2);
}

#[test]
fn detaching_cancels_upstream_and_releases_everything() {
    let mut r = router(&[(A, ALL_CAPS), (B, ALL_CAPS)]);
    let call = upstream(&r.from_host(
        A,
        request(
            json!(1),
            "tools/call",
            json!({"_meta": {"progressToken": 1}}),
        ),
    ));
    let sub = upstream(&r.from_host(
        A,
        request(json!(2), "resources/subscribe", json!({"uri": "u"})),
    ));
    to_host(&r.from_server(result(sub["id"].clone(), json!({}))));
    let (_, asked) = to_host(&r.from_server(request(json!("s"), "elicitation/create", json!({}))));
    let out = r.detach(A);
    let sent: Vec<Value> = out
        .iter()
        .map(|o| match o {
            Out::Server(m) => m.to_value(),
            other => panic!("only the server hears of it: {other:?}"),
        })
        .collect();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[0]["method"], "notifications/cancelled");
    assert_eq!(sent[0]["params"]["requestId"], call["id"]);
    assert_eq!(sent[1]["id"], "s", "the question it was asked fails");
    assert!(
        sent[1]["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("disconnected")
    );
    assert_eq!(sent[2]["method"], "resources/unsubscribe");
    // nothing of A is left: its late answers and progress go nowhere
    assert!(
        r.from_server(result(call["id"].clone(), json!({})))
            .is_empty()
    );
    assert!(
        r.from_server(notification(
            "notifications/progress",
            json!({"progressToken": call["params"]["_meta"]["progressToken"]})
        ))
        .is_empty()
    );
    assert!(
        r.from_host(A, result(asked["id"].clone(), json!({})))
            .is_empty()
    );
    assert_eq!(r.sessions(), 1);
}

#[test]
fn an_outage_fails_what_is_in_flight_and_replays_shared_state() {
    let mut r = router(&[(A, Caps::default()), (B, Caps::default())]);
    upstream(&r.from_host(A, request(json!(1), "tools/call", json!({}))));
    upstream(&r.from_host(B, request(json!("b"), "tools/call", json!({}))));
    let sub = upstream(&r.from_host(
        A,
        request(json!(2), "resources/subscribe", json!({"uri": "u"})),
    ));
    to_host(&r.from_server(result(sub["id"].clone(), json!({}))));
    r.from_host(
        B,
        request(json!(3), "logging/setLevel", json!({"level": "warning"})),
    );
    let down = r.upstream_lost();
    assert_eq!(
        down,
        [
            Out::Down {
                host: A,
                id: json!(1)
            },
            Out::Down {
                host: B,
                id: json!("b")
            }
        ]
    );
    // while down: requests are the outage's, shared state is recorded
    assert_eq!(
        r.from_host(A, request(json!(4), "tools/call", json!({}))),
        [Out::Down {
            host: A,
            id: json!(4)
        }]
    );
    let (host, _) = to_host(&r.from_host(
        B,
        request(json!(5), "resources/subscribe", json!({"uri": "v"})),
    ));
    assert_eq!(host, B);
    assert!(
        r.from_host(
            A,
            notification("notifications/roots/list_changed", json!({}))
        )
        .is_empty()
    );
    // back: subscriptions and the level are replayed, by mcpd, once each
    let replay = r.upstream_ready();
    let methods: Vec<(String, Value)> = replay
        .iter()
        .map(|o| match o {
            Out::Server(m) => (
                m.to_value()["method"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                m.to_value()["params"].clone(),
            ),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        methods,
        [
            ("resources/subscribe".to_owned(), json!({"uri": "u"})),
            ("resources/subscribe".to_owned(), json!({"uri": "v"})),
            ("logging/setLevel".to_owned(), json!({"level": "warning"})),
        ]
    );
    // their answers go to nobody
    for out in replay {
        if let Out::Server(m) = out {
            assert!(
                r.from_server(result(m.to_value()["id"].clone(), json!({})))
                    .is_empty()
            );
        }
    }
}

#[test]
fn list_changed_and_other_notifications_reach_every_host() {
    let mut r = router(&[(A, Caps::default()), (B, Caps::default())]);
    let out = r.from_server(notification("notifications/tools/list_changed", json!({})));
    assert_eq!(out.len(), 2);
    // a host's own notifications (and initialized) are handled apart
    assert!(
        r.from_host(A, notification("notifications/initialized", json!({})))
            .is_empty()
    );
    let fwd = upstream(&r.from_host(
        A,
        notification("notifications/roots/list_changed", json!({})),
    ));
    assert_eq!(fwd["method"], "notifications/roots/list_changed");
}

#[test]
fn garbage_from_a_host_gets_an_error_and_touches_nothing() {
    let mut r = router(&[(A, Caps::default())]);
    // What is not an object never reaches the router: the framing answers
    // it (as a parse error, tests/pure/fuzz.rs).
    for bad in [&b"[1, 2]"[..], b"\"text\"", b"{\"a\":"] {
        assert!(Message::parse(bad).is_err());
    }
    let (host, msg) = to_host(&r.from_host(A, json!({"jsonrpc": "2.0"})));
    assert_eq!((host, &msg["error"]["code"]), (A, &json!(-32600)));
    // an unknown host is ignored
    assert!(
        r.from_host(42, request(json!(1), "tools/call", json!({})))
            .is_empty()
    );
}

#[test]
fn null_ids_and_odd_params_are_refused_not_fatal() {
    let mut r = router(&[(A, ALL_CAPS)]);
    let (host, msg) = to_host(&r.from_host(
        A,
        json!({"jsonrpc": "2.0", "id": null, "method": "tools/call", "params": {}}),
    ));
    assert_eq!((host, &msg["error"]["code"]), (A, &json!(-32600)));
    // a cancellation whose params are not an object rewrites nothing
    assert!(
        r.from_host(
            A,
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 1})
        )
        .is_empty()
    );
    // the same from the server: a null id is no request to route
    let out = r.from_server(json!({"jsonrpc": "2.0", "id": null, "method": "roots/list"}));
    assert!(
        out.iter()
            .all(|o| !matches!(o, Out::Host(_, m) if m.to_value()["method"] == "roots/list")),
        "{out:?}"
    );
    let out = r
        .from_server(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": [1]}));
    assert!(out.is_empty(), "{out:?}");
    let out =
        r.from_server(json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": "x"}));
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn an_outage_withdraws_the_questions_hosts_were_asked() {
    let mut r = router(&[(A, ALL_CAPS)]);
    upstream(&r.from_host(A, request(json!(1), "tools/call", json!({}))));
    let (_, asked) = to_host(&r.from_server(request(json!("s"), "elicitation/create", json!({}))));
    let out = r.upstream_lost();
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(
        out[0],
        Out::Down {
            host: A,
            id: json!(1)
        }
    );
    match &out[1] {
        Out::Host(A, m) => {
            assert_eq!(m.to_value()["method"], "notifications/cancelled");
            assert_eq!(m.to_value()["params"]["requestId"], asked["id"]);
        }
        other => panic!("{other:?}"),
    }
    // and its late answer goes nowhere
    assert!(
        r.from_host(A, result(asked["id"].clone(), json!({})))
            .is_empty()
    );
}

#[test]
fn the_server_goes_back_to_the_default_level_when_the_last_host_with_a_level_leaves() {
    let mut r = router(&[(A, Caps::default()), (B, Caps::default())]);
    let out = r.from_host(
        A,
        request(json!(1), "logging/setLevel", json!({"level": "debug"})),
    );
    assert!(matches!(&out[0], Out::Server(m) if m.to_value()["params"]["level"] == "debug"));
    let out = r.detach(A);
    assert!(
        matches!(out.as_slice(), [Out::Server(m)] if m.to_value()["params"]["level"] == "info"),
        "{out:?}"
    );
    // B never set one: it sees info and up, as before A left
    let debug = notification(
        "notifications/message",
        json!({"level": "debug", "data": "x"}),
    );
    assert!(r.from_server(debug).is_empty());
    // nothing more to reset when B leaves too
    assert!(r.detach(B).is_empty());
}

#[test]
fn mcpds_own_requests_share_the_id_space_and_can_be_cancelled() {
    let mut r = router(&[(A, Caps::default())]);
    let host = upstream(&r.from_host(A, request(json!(1), "tools/call", json!({}))));
    let (id, out) = r.request("tools/list", json!({}));
    let [Out::Server(own)] = out.as_slice() else {
        panic!("{out:?}")
    };
    assert_eq!(own.to_value()["id"], json!(id));
    assert_ne!(
        own.to_value()["id"],
        host["id"],
        "never the id of a host's request"
    );
    // the answer comes back to mcpd, not to a host
    let out = r.from_server(result(json!(id), json!({"tools": []})));
    assert!(
        matches!(out.as_slice(), [Out::Answer(i, m)] if *i == id && m.to_value()["result"]["tools"] == json!([]))
    );
    // a cancelled one tells the server, and its late answer goes nowhere
    let (id, _) = r.request("tools/call", json!({"name": "slow"}));
    let out = upstream(&r.cancel(id));
    assert_eq!(out["method"], "notifications/cancelled");
    assert_eq!(out["params"]["requestId"], json!(id));
    assert!(r.from_server(result(json!(id), json!({}))).is_empty());
    // one in flight when the upstream ends is unanswered; none while down
    let (id, _) = r.request("tools/list", json!({}));
    let out = r.upstream_lost();
    assert!(out.contains(&Out::Unanswered(id)), "{out:?}");
    let (id, out) = r.request("tools/list", json!({}));
    assert_eq!(out, vec![Out::Unanswered(id)]);
}

// Held requests: an on-demand server starting for them (DESIGN §9).

/// A router whose upstream is down and held for, with `hosts` attached.
fn held_router(hosts: &[HostId]) -> Router {
    let mut r = Router::new();
    for host in hosts {
        r.attach(*host, Caps::default());
    }
    assert!(r.hold(true).is_empty());
    r
}

#[test]
fn requests_wait_while_the_upstream_is_held_for_and_go_in_order_once_ready() {
    let mut r = held_router(&[A, B]);
    assert!(!r.holding());
    let a = r.from_host(
        A,
        request(
            json!(1),
            "tools/call",
            json!({"name": "echo", "_meta": {"progressToken": "p"}}),
        ),
    );
    assert!(a.is_empty(), "held, not failed: {a:?}");
    // settings are the session's own, answered at once and replayed later
    let (_, sub) = to_host(&r.from_host(
        B,
        request(json!(7), "resources/subscribe", json!({"uri": "file:///x"})),
    ));
    assert_eq!(sub, result(json!(7), json!({})));
    assert!(
        r.from_host(
            B,
            request(json!(1), "resources/read", json!({"uri": "file:///x"}))
        )
        .is_empty()
    );
    let (own, out) = r.request("prompts/get", json!({"name": "p"}));
    assert!(out.is_empty());
    assert!(r.holding());
    assert!(r.hosts_busy(), "a held request is in flight");

    let out = r.upstream_ready();
    let sent: Vec<Value> = out
        .iter()
        .map(|o| match o {
            Out::Server(m) => m.to_value(),
            other => panic!("only messages to the server: {other:?}"),
        })
        .collect();
    let methods: Vec<&str> = sent
        .iter()
        .map(|m| m["method"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        methods,
        [
            "resources/subscribe",
            "tools/call",
            "resources/read",
            "prompts/get"
        ],
        "the subscription first, then what waited, in order"
    );
    assert!(!r.holding());
    assert_eq!(sent[3]["id"], json!(own));
    let (call_id, token) = (
        sent[1]["id"].clone(),
        sent[1]["params"]["_meta"]["progressToken"].clone(),
    );
    let read_id = sent[2]["id"].clone();
    assert_ne!(call_id, read_id);
    // progress and answers reach who asked
    let (host, progress) = to_host(&r.from_server(notification(
        "notifications/progress",
        json!({"progressToken": token, "progress": 1}),
    )));
    assert_eq!(
        (host, progress["params"]["progressToken"].clone()),
        (A, json!("p"))
    );
    assert_eq!(
        to_host(&r.from_server(result(read_id, json!({"contents": []})))),
        (B, result(json!(1), json!({"contents": []})))
    );
    assert_eq!(
        to_host(&r.from_server(result(call_id, json!({"content": []})))),
        (A, result(json!(1), json!({"content": []})))
    );
    assert!(matches!(
        r.from_server(result(json!(own), json!({}))).as_slice(),
        [Out::Answer(id, _)] if *id == own
    ));
    assert!(!r.hosts_busy());
}

#[test]
fn held_requests_fail_when_the_start_fails_and_later_ones_at_once() {
    let mut r = held_router(&[A]);
    assert!(
        r.from_host(A, request(json!(1), "tools/call", json!({})))
            .is_empty()
    );
    let (own, _) = r.request("resources/read", json!({}));
    let out = r.hold(false);
    assert_eq!(
        out,
        vec![
            Out::Down {
                host: A,
                id: json!(1)
            },
            Out::Unanswered(own)
        ]
    );
    assert!(!r.holding() && !r.hosts_busy());
    assert_eq!(
        r.from_host(A, request(json!(2), "tools/call", json!({}))),
        vec![Out::Down {
            host: A,
            id: json!(2)
        }]
    );
    // the id of a failed request is free again
    r.hold(true);
    assert!(
        r.from_host(A, request(json!(1), "tools/call", json!({})))
            .is_empty()
    );
    assert_eq!(upstream(&r.upstream_ready())["method"], "tools/call");
}

#[test]
fn a_held_request_cancelled_or_left_behind_is_never_sent() {
    let mut r = held_router(&[A, B]);
    assert!(
        r.from_host(A, request(json!(1), "tools/call", json!({"name": "x"})))
            .is_empty()
    );
    assert!(
        r.from_host(B, request(json!(1), "tools/call", json!({"name": "y"})))
            .is_empty()
    );
    assert!(
        r.from_host(B, request(json!(2), "tools/call", json!({"name": "z"})))
            .is_empty()
    );
    // A cancels its request; B leaves
    let out = r.from_host(
        A,
        notification("notifications/cancelled", json!({"requestId": 1})),
    );
    assert!(out.is_empty(), "it was never sent: {out:?}");
    assert!(
        r.detach(B).is_empty(),
        "nothing to cancel upstream: it never got them"
    );
    assert!(!r.holding());
    let out = r.upstream_ready();
    assert!(out.is_empty(), "{out:?}");
    // the upstream ending with requests held drops them with it
    let mut r = held_router(&[A]);
    assert!(
        r.from_host(A, request(json!(1), "tools/call", json!({})))
            .is_empty()
    );
    assert_eq!(
        r.upstream_lost(),
        vec![Out::Down {
            host: A,
            id: json!(1)
        }]
    );
    assert!(!r.holding());
}

#[test]
fn subscriptions_are_bounded_per_host_and_per_unit_and_freed_with_their_host() {
    use mcpd::mux::route::{MAX_SUBSCRIPTIONS, MAX_URIS};
    let hosts: Vec<(HostId, Caps)> = (1..=17).map(|h| (h, Caps::default())).collect();
    let mut r = router(&hosts);
    let subscribe = |r: &mut Router, host: HostId, n: usize, uri: &str| {
        r.from_host(
            host,
            request(json!(n), "resources/subscribe", json!({"uri": uri})),
        )
    };
    let refused = |out: &[Out]| match out {
        [Out::Host(_, msg)] => msg.to_value()["error"]["message"]
            .as_str()
            .map(str::to_owned),
        _ => None,
    };
    // one host: up to its bound, then refused; the same URI again is fine
    for n in 0..MAX_SUBSCRIPTIONS {
        let out = subscribe(&mut r, 1, n, &format!("file:///1/{n}"));
        assert_eq!(refused(&out), None, "subscription {n}");
    }
    let out = subscribe(&mut r, 1, 9999, "file:///1/more");
    assert_eq!(
        refused(&out).as_deref(),
        Some("too many subscriptions (at most 1024 per session)")
    );
    assert_eq!(refused(&subscribe(&mut r, 1, 10000, "file:///1/0")), None);
    // an unsubscribe makes room
    r.from_host(
        1,
        request(
            json!(10001),
            "resources/unsubscribe",
            json!({"uri": "file:///1/0"}),
        ),
    );
    assert_eq!(
        refused(&subscribe(&mut r, 1, 10002, "file:///1/more")),
        None
    );
    // the unit: every host to its bound fills it; a URI subscribed already
    // is no new one
    for host in 2..=(MAX_URIS / MAX_SUBSCRIPTIONS) as u64 {
        for n in 0..MAX_SUBSCRIPTIONS {
            let out = subscribe(&mut r, host, n, &format!("file:///{host}/{n}"));
            assert_eq!(refused(&out), None, "host {host}, subscription {n}");
        }
    }
    let out = subscribe(&mut r, 17, 1, "file:///17/new");
    assert_eq!(
        refused(&out).as_deref(),
        Some("too many subscriptions on this server (at most 16384 URIs for all its sessions)")
    );
    assert_eq!(refused(&subscribe(&mut r, 17, 2, "file:///2/5")), None);
    // a host that leaves frees its URIs
    r.detach(3);
    assert_eq!(refused(&subscribe(&mut r, 17, 3, "file:///17/new")), None);
    // and each URI is bounded in size
    let long = format!("file:///{}", "x".repeat(mcpd::mux::route::MAX_URI));
    assert_eq!(
        refused(&subscribe(&mut r, 17, 4, &long)).as_deref(),
        Some("a URI of 8200 bytes is too long to subscribe to (at most 8192)")
    );
}

#[test]
fn the_units_bound_counts_the_hosts_requests_and_not_mcpds_own() {
    let mut r = router(&[(1, Caps::default())]);
    let _ = r.request("resources/list", json!({}));
    let _ = r.request("ping", json!({}));
    assert_eq!(r.requests(), 0, "mcpd's own list read and probe");
    r.from_host(1, request(json!(1), "tools/call", json!({"name": "x"})));
    assert_eq!(r.requests(), 1);
}

/// The error answer's code and message.
fn refused(msg: &Value) -> (i64, String) {
    (
        msg["error"]["code"].as_i64().unwrap_or_default(),
        msg["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[test]
fn a_task_is_its_hosts_alone_under_an_id_of_mcpds() {
    let mut r = router(&[(A, ALL_CAPS), (B, ALL_CAPS)]);
    // A's call becomes a task on the server (MCP 2026-07-28, SEP-2663).
    let call = upstream(&r.from_host(A, request(json!(1), "tools/call", json!({"name": "slow"}))));
    let (host, created) = to_host(&r.from_server(result(
        call["id"].clone(),
        json!({"resultType": "task", "taskId": "srv-1", "status": "working"}),
    )));
    assert_eq!(host, A);
    let mine = created["result"]["taskId"]
        .as_str()
        .expect("task id")
        .to_owned();
    assert_ne!(mine, "srv-1", "the server's own id never reaches a host");
    assert_eq!(created["result"]["status"], "working");

    // B cannot reach it by A's id, nor by the server's.
    for id in [mine.as_str(), "srv-1"] {
        let (host, answer) =
            to_host(&r.from_host(B, request(json!(7), "tasks/get", json!({"taskId": id}))));
        let (code, why) = refused(&answer);
        assert_eq!((host, code), (B, -32602), "{answer}");
        assert!(
            why.contains(&format!("no task `{id}` of this session's")),
            "{why}"
        );
    }
    // A reaches it under its id; the server sees its own.
    let get = upstream(&r.from_host(A, request(json!(2), "tasks/get", json!({"taskId": mine}))));
    assert_eq!(get["params"]["taskId"], "srv-1");
    let (host, got) = to_host(&r.from_server(result(
        get["id"].clone(),
        json!({"resultType": "complete", "taskId": "srv-1", "status": "input_required"}),
    )));
    assert_eq!(
        (host, got["result"]["taskId"].as_str()),
        (A, Some(mine.as_str()))
    );

    // B calls last, yet the server's question about A's task goes to A.
    upstream(&r.from_host(B, request(json!(8), "tools/call", json!({"name": "echo"}))));
    let (host, asked) = to_host(&r.from_server(json!({
        "jsonrpc": "2.0", "id": 40, "method": "elicitation/create",
        "params": {"message": "?", "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "srv-1"}}}
    })));
    assert_eq!(host, A);
    assert_eq!(
        asked["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        json!(mine)
    );
    // Its status reaches A alone, under A's id; another's goes nowhere.
    let (host, status) = to_host(&r.from_server(notification(
        "notifications/tasks",
        json!({"taskId": "srv-1", "status": "completed"}),
    )));
    assert_eq!(
        (host, status["params"]["taskId"].as_str()),
        (A, Some(mine.as_str()))
    );
    assert!(
        r.from_server(notification(
            "notifications/tasks",
            json!({"taskId": "srv-9", "status": "working"})
        ))
        .is_empty()
    );

    // tasks/list (MCP 2025-11-25) lists a host its own tasks only.
    let list = upstream(&r.from_host(B, request(json!(9), "tasks/list", json!({}))));
    let (_, listed) = to_host(&r.from_server(result(
        list["id"].clone(),
        json!({"tasks": [{"taskId": "srv-1", "status": "completed"}]}),
    )));
    assert_eq!(listed["result"]["tasks"], json!([]), "{listed}");
    let list = upstream(&r.from_host(A, request(json!(3), "tasks/list", json!({}))));
    let (_, listed) = to_host(&r.from_server(result(
        list["id"].clone(),
        json!({"tasks": [{"taskId": "srv-1", "status": "completed"}, {"taskId": "srv-2", "status": "working"}]}),
    )));
    assert_eq!(
        listed["result"]["tasks"],
        json!([{"taskId": mine, "status": "completed"}])
    );

    // A leaves: nobody can read its task any more, so it is cancelled.
    let out = r.detach(A);
    let cancels: Vec<Value> = out
        .iter()
        .filter_map(|o| match o {
            Out::Server(m) => Some(m.to_value()),
            _ => None,
        })
        .filter(|m| m["method"] == "tasks/cancel")
        .collect();
    assert_eq!(cancels.len(), 1, "{out:?}");
    assert_eq!(cancels[0]["params"]["taskId"], "srv-1");
}

#[test]
fn a_new_generation_knows_none_of_the_last_ones_tasks() {
    let mut r = router(&[(A, ALL_CAPS)]);
    let call = upstream(&r.from_host(A, request(json!(1), "tools/call", json!({"name": "slow"}))));
    let (_, created) = to_host(&r.from_server(result(
        call["id"].clone(),
        json!({"task": {"taskId": "srv-1", "status": "working"}}),
    )));
    let mine = created["result"]["task"]["taskId"]
        .as_str()
        .expect("2025 shape")
        .to_owned();
    assert_ne!(mine, "srv-1");
    r.upstream_lost();
    r.upstream_ready();
    let (_, answer) = to_host(&r.from_host(
        A,
        request(json!(2), "tasks/result", json!({"taskId": mine})),
    ));
    assert_eq!(refused(&answer).0, -32602, "{answer}");
}
