//! The list reader (`mux::lists`), answer by answer: the pure paging
//! machine every path that reads a server's lists uses.

use std::time::{Duration, Instant};

use mcpd::mux::lists::{List, ListRead, MAX_BYTES, MAX_PAGES, Next, Why};
use mcpd::mux::message::Message;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(30);

/// An answer whose result is `result`, as a line received.
fn answer(result: Value) -> Message {
    let line = json!({"jsonrpc": "2.0", "id": 1, "result": result}).to_string();
    Message::parse(line.as_bytes()).expect("a message")
}

/// A page of `list` with `items` and `next` as its cursor.
fn page(list: List, items: &[&str], next: Option<Value>) -> Message {
    let items: Vec<Value> = items.iter().map(|n| json!({"name": n, "uri": n})).collect();
    let mut result = json!({ list.key(): items });
    if let Some(next) = next {
        result["nextCursor"] = next;
    }
    answer(result)
}

/// Feeds `pages` in order; returns what the reader asked for after each.
fn feed(list: List, pages: &[Message]) -> Vec<Next> {
    let t0 = Instant::now();
    let mut read = ListRead::new(list, t0, TIMEOUT);
    assert_eq!(read.first(), json!({}));
    pages
        .iter()
        .map(|m| read.answer(m, m.received(), t0))
        .collect()
}

fn names(next: &Next) -> Vec<String> {
    match next {
        Next::Done(items) => items
            .iter()
            .map(|i| i["name"].as_str().expect("name").to_owned())
            .collect(),
        other => panic!("not done: {other:?}"),
    }
}

fn failed(next: &Next) -> String {
    match next {
        Next::Failed(error) => error.to_string(),
        other => panic!("not failed: {other:?}"),
    }
}

#[test]
fn a_list_of_one_page_is_done_at_once() {
    for list in [List::Tools, List::Resources, List::Templates, List::Prompts] {
        let out = feed(list, &[page(list, &["a", "b"], None)]);
        assert_eq!(names(&out[0]), ["a", "b"], "{list}");
    }
    // a null cursor ends the list as an absent one does
    let out = feed(List::Tools, &[page(List::Tools, &["a"], Some(Value::Null))]);
    assert_eq!(names(&out[0]), ["a"]);
}

#[test]
fn pages_are_asked_for_by_cursor_and_joined_in_order() {
    let list = List::Prompts;
    let out = feed(
        list,
        &[
            page(list, &["a"], Some(json!("p2"))),
            page(list, &["b", "c"], Some(json!({"opaque": [1, 2]}))),
            page(list, &[], Some(json!(3))),
            page(list, &["d"], None),
        ],
    );
    assert_eq!(out[0], Next::Page(json!({"cursor": "p2"})));
    // a cursor is opaque: whatever JSON the server gave goes back as it was
    assert_eq!(out[1], Next::Page(json!({"cursor": {"opaque": [1, 2]}})));
    assert_eq!(out[2], Next::Page(json!({"cursor": 3})));
    assert_eq!(names(&out[3]), ["a", "b", "c", "d"]);
}

#[test]
fn a_cursor_given_twice_ends_the_read_whether_it_repeats_at_once_or_cycles() {
    let list = List::Tools;
    // A, then A again
    let out = feed(
        list,
        &[
            page(list, &["a"], Some(json!("A"))),
            page(list, &["a"], Some(json!("A"))),
        ],
    );
    assert_eq!(
        failed(&out[1]),
        r#"tools/list: cursor "A" repeated after 2 pages"#
    );
    // A → B → A: the cycle that grew the daemon by 2 GB in 20 s
    let list = List::Resources;
    let out = feed(
        list,
        &[
            page(list, &["x"], Some(json!("A"))),
            page(list, &["y"], Some(json!("B"))),
            page(list, &["x"], Some(json!("A"))),
        ],
    );
    assert_eq!(out[1], Next::Page(json!({"cursor": "B"})));
    assert_eq!(
        failed(&out[2]),
        r#"resources/list: cursor "A" repeated after 3 pages"#
    );
    // equal as JSON text: 1 and "1" are different cursors
    let out = feed(
        list,
        &[
            page(list, &[], Some(json!(1))),
            page(list, &[], Some(json!("1"))),
            page(list, &[], None),
        ],
    );
    assert!(matches!(out[1], Next::Page(_)));
    assert!(matches!(out[2], Next::Done(_)));
}

#[test]
fn a_list_of_more_pages_than_the_bound_is_refused_at_the_bound() {
    let list = List::Templates;
    let t0 = Instant::now();
    let mut read = ListRead::new(list, t0, TIMEOUT);
    for n in 1..=MAX_PAGES {
        let m = page(list, &["t"], Some(json!(format!("c{n}"))));
        match read.answer(&m, m.received(), t0) {
            Next::Page(_) if n < MAX_PAGES => {}
            Next::Failed(error) if n == MAX_PAGES => {
                assert_eq!(error.why, Why::TooManyPages);
                assert_eq!(
                    error.to_string(),
                    "resources/templates/list: more than 1000 pages"
                );
                return;
            }
            other => panic!("page {n}: {other:?}"),
        }
    }
    panic!("never refused");
}

#[test]
fn a_list_of_more_bytes_than_the_bound_is_refused_counting_what_was_received() {
    let list = List::Resources;
    let t0 = Instant::now();
    let mut read = ListRead::new(list, t0, TIMEOUT);
    let m = page(list, &["r"], Some(json!("next")));
    // sizes as received (a line may carry whitespace the parse dropped)
    assert!(matches!(read.answer(&m, MAX_BYTES - 10, t0), Next::Page(_)));
    let m = page(list, &["r"], None);
    assert_eq!(
        failed(&read.answer(&m, 11, t0)),
        "resources/list: more than 64 MiB of answers after 2 pages"
    );
    // at the bound exactly, it is read
    let mut read = ListRead::new(list, t0, TIMEOUT);
    let m = page(list, &["r"], None);
    assert!(matches!(read.answer(&m, MAX_BYTES, t0), Next::Done(_)));
}

#[test]
fn a_list_of_more_items_than_the_bound_is_refused() {
    use mcpd::mux::lists::MAX_ITEMS;
    let list = List::Tools;
    let t0 = Instant::now();
    let mut read = ListRead::new(list, t0, TIMEOUT);
    // tiny items parse into many times their bytes: counted, not weighed
    let zeros = |n: usize| answer(json!({"tools": vec![0; n], "nextCursor": format!("c{n}")}));
    let m = zeros(MAX_ITEMS - 1);
    assert!(matches!(read.answer(&m, m.received(), t0), Next::Page(_)));
    let m = zeros(2);
    assert_eq!(
        failed(&read.answer(&m, m.received(), t0)),
        "tools/list: more than 200000 items"
    );
}

#[test]
fn a_read_not_complete_by_its_deadline_has_expired() {
    let list = List::Tools;
    let t0 = Instant::now();
    let mut read = ListRead::new(list, t0, Duration::from_secs(2));
    assert_eq!(read.deadline(), t0 + Duration::from_secs(2));
    assert!(read.expired(t0 + Duration::from_millis(1999)).is_none());
    let m = page(list, &["a"], Some(json!("A")));
    assert!(matches!(
        read.answer(&m, m.received(), t0 + Duration::from_secs(1)),
        Next::Page(_)
    ));
    let error = read
        .expired(t0 + Duration::from_secs(2))
        .expect("expired at its deadline");
    assert_eq!(
        error.to_string(),
        "tools/list: not complete within 2s (1 page read)"
    );
    // an answer arriving after the deadline does not revive it
    let m = page(list, &["b"], None);
    assert_eq!(
        failed(&read.answer(&m, m.received(), t0 + Duration::from_secs(3))),
        "tools/list: not complete within 2s (1 page read)"
    );
}

#[test]
fn an_error_or_a_page_without_the_list_ends_the_read_saying_why() {
    let list = List::Tools;
    let refusal = Message::parse(
        br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}"#,
    )
    .expect("message");
    assert_eq!(
        failed(&feed(list, &[refusal])[0]),
        "tools/list: Method not found (-32601)"
    );
    assert_eq!(
        failed(&feed(list, &[answer(json!({"items": []}))])[0]),
        "tools/list: the answer has no tools array"
    );
    assert_eq!(
        failed(&feed(List::Prompts, &[answer(json!({"prompts": {}}))])[0]),
        "prompts/list: the answer has no prompts array"
    );
    let t0 = Instant::now();
    let read = ListRead::new(List::Resources, t0, TIMEOUT);
    assert_eq!(
        read.lost("the server closed the connection").to_string(),
        "resources/list: the server closed the connection"
    );
}
