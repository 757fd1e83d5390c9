//! The supervisor actor end to end with fake processes on paused time:
//! real rmcp sessions over in-memory pipes, virtual clocks, exact timings.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mcpd::supervisor::machine::{ExitStatus, Signal};
use mcpd::supervisor::{CallError, LogRing, State, Status, Supervisor};
use mcpd::unit::spec::{ReconnectDraft, StdioDraft};
use mcpd::unit::{UnitDraft, UnitSpec};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::helper::fake::{Fake, Plan};
use crate::helper::{ms, timed_out, within};

/// Virtual time: generous, costs nothing.
const BOUND: Duration = Duration::from_secs(3600);

fn spec(reconnect: ReconnectDraft) -> UnitSpec {
    UnitSpec::new(UnitDraft {
        stdio: Some(StdioDraft {
            command: vec!["/fake/server".into()],
            ..StdioDraft::default()
        }),
        reconnect,
        startup_timeout: Some(ms(2000)),
        stop_timeout: Some(ms(1000)),
        // The fake speaks both eras; these tests count its pings.
        protocol: Some("legacy".into()),
        ..UnitDraft::default()
    })
    .expect("valid")
}

fn policy(initial: u64, max: u64, attempts: i128) -> ReconnectDraft {
    crate::helper::policy(initial, max, attempts, true)
}

struct Rig {
    sup: Supervisor,
    task: JoinHandle<()>,
    rx: watch::Receiver<Status>,
}

fn rig(fake: &Fake, spec: UnitSpec) -> Rig {
    let (sup, task) = Supervisor::spawn(
        "fake",
        spec,
        Arc::new(fake.clone()),
        LogRing::default(),
        None,
    );
    let rx = sup.subscribe();
    sup.start();
    Rig { sup, task, rx }
}

impl Rig {
    /// Waits (bounded, woken by each change of the status) until the
    /// status satisfies `pred`.
    async fn until(&mut self, what: &str, pred: impl Fn(&Status) -> bool) -> Status {
        let rx = &mut self.rx;
        let result = within(BOUND, async {
            loop {
                {
                    let s = rx.borrow_and_update();
                    if pred(&s) {
                        return s.clone();
                    }
                }
                rx.changed().await.expect("actor alive");
            }
        })
        .await;
        result.unwrap_or_else(|| {
            panic!(
                "{}; last status: {:#?}",
                timed_out(what, BOUND),
                self.sup.status()
            )
        })
    }

    async fn running(&mut self, generation: u64) -> Status {
        self.until("running", |s| {
            s.state == State::Running && s.generation == generation
        })
        .await
    }

    async fn shutdown(self) {
        within(BOUND, self.sup.shutdown(self.task))
            .await
            .unwrap_or_else(|| panic!("{}", timed_out("shutdown", BOUND)));
    }
}

#[tokio::test(start_paused = true)]
async fn crash_recovers_after_exactly_the_initial_delay() {
    let fake = Fake::new(&["a", "b"]);
    let mut r = rig(&fake, spec(policy(100, 1000, 3)));
    let first = r.running(1).await;
    let pid = first.main_pid.expect("pid");
    let crashed = Instant::now();
    fake.exit(pid, ExitStatus::Code(1));
    r.until("reconnecting", |s| {
        s.state == State::Reconnecting && s.next_retry.is_some()
    })
    .await;
    let second = r.running(2).await;
    assert_eq!(
        crashed.elapsed(),
        ms(100),
        "respawned exactly after initial-delay"
    );
    assert_eq!(second.tools_serial, 1);
    assert_eq!(fake.launches(), 2);
    // the stability window ends the outage after max-delay
    r.until("stable", |s| s.attempt == 0).await;
    assert_eq!(crashed.elapsed(), ms(1100));
    r.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn default_policy_gives_up_after_151_5_seconds_and_11_spawns() {
    let fake = Fake::new(&["a"]);
    fake.plan(std::iter::repeat_n(Plan::DieAtOnce(1), 20));
    let default = UnitSpec::new(UnitDraft {
        stdio: Some(StdioDraft {
            command: vec!["/fake/server".into()],
            ..StdioDraft::default()
        }),
        ..UnitDraft::default()
    })
    .expect("valid");
    let started = Instant::now();
    let mut r = rig(&fake, default);
    let failed = r.until("failed", |s| s.state == State::Failed).await;
    assert_eq!(started.elapsed(), Duration::from_millis(151_500));
    assert_eq!(fake.launches(), 11);
    assert_eq!(failed.attempt, 10);
    assert!(
        failed.reason.contains("gave up after 10 retries"),
        "{}",
        failed.reason
    );
    r.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_list_changed_storm_is_serialized_and_ends_on_the_newest_list() {
    let fake = Fake::new(&["v0"]);
    let mut r = rig(&fake, spec(policy(100, 1000, 3)));
    let running = r.running(1).await;
    let pid = running.main_pid.expect("pid");
    *fake.server.list_delay.lock().expect("lock") = ms(10);
    let before = fake.server.probe.lists.load(Ordering::SeqCst);
    for i in 1..=50 {
        fake.set_tools(&[&format!("v{i}")]);
        fake.notify_list_changed(pid).await;
    }
    let last = r
        .until("newest list", |s| s.tools.names().next() == Some("v50"))
        .await;
    // Wait until the actor has nothing left to do: no tools/list in flight
    // and its health probe reaching the server. It probes only after
    // `health.interval` of silence, so any coalesced sync still queued (due
    // at most the sync spacing after the previous one began) has run by then.
    let probe = &fake.server.probe;
    let pings = probe.pings.load(Ordering::SeqCst);
    within(
        BOUND,
        probe.until(|p| {
            p.pings.load(Ordering::SeqCst) > pings && p.in_flight.load(Ordering::SeqCst) == 0
        }),
    )
    .await
    .unwrap_or_else(|| panic!("{}", timed_out("the actor to settle and probe", BOUND)));
    assert_eq!(
        probe.max_in_flight.load(Ordering::SeqCst),
        1,
        "syncs never interleave"
    );
    let syncs = probe.lists.load(Ordering::SeqCst) - before;
    assert!(
        (1..=3).contains(&syncs),
        "50 notifications coalesced into {syncs} syncs"
    );
    let now = r.sup.status();
    assert_eq!(
        now.tools_serial, last.tools_serial,
        "nothing after the newest list"
    );
    assert_eq!(now.tools.names().next(), Some("v50"));
    r.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_early_list_changed_is_synced_after_establishment() {
    let fake = Fake::new(&["old"]);
    // the initial tools/list is held until released
    let gate = Arc::new(Notify::new());
    *fake.server.gate.lock().expect("lock") = Some(Arc::clone(&gate));
    let mut r = rig(&fake, spec(policy(100, 1000, 3)));
    within(
        BOUND,
        fake.server
            .probe
            .until(|p| p.in_flight.load(Ordering::SeqCst) > 0),
    )
    .await
    .unwrap_or_else(|| panic!("{}", timed_out("initial list to start", BOUND)));
    let pid = fake.live()[0];
    fake.set_tools(&["new"]);
    fake.notify_list_changed(pid).await;
    *fake.server.gate.lock().expect("lock") = None;
    gate.notify_one();
    let s = r
        .until("new list", |s| s.tools.names().next() == Some("new"))
        .await;
    assert_eq!(s.state, State::Running);
    r.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn dispose_does_not_wait_on_a_hung_sync_and_nothing_follows_it() {
    let fake = Fake::new(&["a"]);
    let mut r = rig(&fake, spec(policy(100, 1000, 3)));
    let running = r.running(1).await;
    let pid = running.main_pid.expect("pid");
    // the next tools/list answers only when released
    let gate = Arc::new(Notify::new());
    *fake.server.gate.lock().expect("lock") = Some(Arc::clone(&gate));
    fake.set_tools(&["b"]);
    fake.notify_list_changed(pid).await;
    within(
        BOUND,
        fake.server
            .probe
            .until(|p| p.in_flight.load(Ordering::SeqCst) > 0),
    )
    .await
    .unwrap_or_else(|| panic!("{}", timed_out("a sync in flight", BOUND)));
    let mut rx = r.sup.subscribe();
    within(BOUND, r.sup.shutdown(r.task))
        .await
        .unwrap_or_else(|| {
            panic!(
                "{}",
                timed_out("shutdown to complete with the sync cancelled", BOUND)
            )
        });
    let last = rx.borrow_and_update().clone();
    assert_eq!(last.state, State::Stopped);
    assert!(last.tools.is_empty(), "withdrawn");
    assert!(fake.live().is_empty());
    // the late answer changes nothing, and nothing restarts: the actor is
    // gone, so its status channel is closed with `last` its final value
    // (`changed` fails only when no value came after the one seen, and no
    // sender is left), and no second process was launched
    gate.notify_waiters();
    // (scenario: a minute of virtual time for anything that would follow)
    tokio::time::sleep(Duration::from_secs(60)).await;
    match within(BOUND, rx.changed()).await {
        Some(Err(_closed)) => {}
        Some(Ok(())) => panic!("a status followed the shutdown: {:#?}", *rx.borrow()),
        None => panic!("the actor outlived its shutdown: its status channel is still open"),
    }
    assert_eq!(rx.borrow().state, State::Stopped);
    assert_eq!(fake.launches(), 1);
}

#[tokio::test(start_paused = true)]
async fn stop_during_backoff_cancels_the_pending_retry() {
    let fake = Fake::new(&["a"]);
    let mut r = rig(&fake, spec(policy(500, 1000, 3)));
    let pid = r.running(1).await.main_pid.expect("pid");
    fake.exit(pid, ExitStatus::Code(1));
    r.until("backoff", |s| s.next_retry.is_some()).await;
    r.sup.stop();
    let stopped = r.until("stopped", |s| s.state == State::Stopped).await;
    assert!(stopped.tools.is_empty());
    // (scenario: the retry's time passes, virtual, and it must not come)
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(fake.launches(), 1, "the retry never happened");
    r.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn double_failure_signals_schedule_one_retry() {
    let fake = Fake::new(&["a"]);
    // dies before answering: the connect error and the exit both arrive
    fake.plan([Plan::DieAtOnce(2)]);
    let mut r = rig(&fake, spec(policy(100, 1000, 3)));
    let s = r.running(2).await;
    assert_eq!(fake.launches(), 2);
    assert_eq!(s.attempt, 1);
    assert_eq!(s.last_exit, Some(ExitStatus::Code(2)));
    r.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_spawn_failure_is_retried_without_a_process() {
    let fake = Fake::new(&["a"]);
    fake.plan([Plan::FailSpawn("command /fake/server: no such file".into())]);
    let mut r = rig(&fake, spec(policy(100, 1000, 3)));
    let retrying = r.until("retrying", |s| s.state == State::Retrying).await;
    assert_eq!(
        retrying.reason,
        "connection failed: command /fake/server: no such file"
    );
    assert_eq!(retrying.main_pid, None);
    r.running(2).await;
    r.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn sigterm_ignored_means_sigkill_after_stop_timeout_and_no_overlap() {
    let fake = Fake::new(&["a"]);
    fake.ignore_term(true);
    let mut r = rig(&fake, spec(policy(100, 1000, 3)));
    let pid = r.running(1).await.main_pid.expect("pid");
    let asked = Instant::now();
    r.sup.restart();
    r.until("stopping", |s| s.state == State::Stopping).await;
    let second = r.running(2).await;
    assert_eq!(asked.elapsed(), ms(1000), "SIGKILL exactly at stop-timeout");
    assert_eq!(fake.signals(), [(pid, Signal::Term), (pid, Signal::Kill)]);
    assert_eq!(
        fake.live(),
        [second.main_pid.expect("pid")],
        "one process at a time"
    );
    r.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn calls_go_to_the_current_generation_or_fail_at_once() {
    let fake = Fake::new(&["a"]);
    let mut r = rig(&fake, spec(policy(5000, 10_000, 3)));
    let pid = r.running(1).await.main_pid.expect("pid");
    let result = r
        .sup
        .call_tool("a", None, ms(1000), std::future::ready(Default::default()))
        .await
        .expect("call");
    assert_eq!(
        serde_json::to_value(&result.content).expect("json")[0]["text"],
        "called a"
    );
    fake.exit(pid, ExitStatus::Code(1));
    r.until("backoff", |s| s.next_retry.is_some()).await;
    let asked = Instant::now();
    let err = r
        .sup
        .call_tool("a", None, ms(1000), std::future::ready(Default::default()))
        .await
        .expect_err("not running");
    assert_eq!(asked.elapsed(), Duration::ZERO, "immediate");
    match err {
        CallError::NotRunning {
            state,
            attempt,
            max_attempts,
            next_retry,
            ..
        } => {
            assert_eq!((state, attempt, max_attempts), (State::Reconnecting, 1, 3));
            assert!(next_retry.is_some());
        }
        other => panic!("{other:?}"),
    }
    r.shutdown().await;
}
