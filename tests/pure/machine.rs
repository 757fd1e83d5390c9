//! The pure supervisor state machine, transition by transition (DESIGN §3).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::helper::{ms, policy};
use mcpd::supervisor::machine::{
    Cached, Effect, Event, ExitStatus, Machine, Signal, State, Timer, ToolList,
};
use mcpd::unit::spec::{HealthDraft, HttpDraft, ReconnectDraft, StdioDraft};
use mcpd::unit::{UnitDraft, UnitSpec};
use rmcp::model::Tool;

const PID: u32 = 4242;

fn stdio_spec(reconnect: ReconnectDraft) -> UnitSpec {
    UnitSpec::new(UnitDraft {
        stdio: Some(StdioDraft {
            command: vec!["/bin/true".into()],
            ..StdioDraft::default()
        }),
        reconnect,
        startup_timeout: Some(ms(3000)),
        stop_timeout: Some(ms(1000)),
        ..UnitDraft::default()
    })
    .expect("valid spec")
}

fn tools(names: &[&str]) -> ToolList {
    names
        .iter()
        .map(|n| Tool::new(n.to_string(), "d", Arc::new(serde_json::Map::new())))
        .collect::<Vec<_>>()
        .into()
}

/// A machine with its own clock.
struct Rig {
    m: Machine,
    now: Instant,
    spawns: u32,
    waits: Vec<Duration>,
}

impl Rig {
    fn new(spec: &UnitSpec) -> Self {
        let now = Instant::now();
        Self {
            m: Machine::new("srv", spec, now),
            now,
            spawns: 0,
            waits: Vec::new(),
        }
    }

    fn step(&mut self, event: Event) -> Vec<Effect> {
        let fx = self.m.step(event, self.now);
        self.spawns += fx
            .iter()
            .filter(|e| matches!(e, Effect::Spawn { .. }))
            .count() as u32;
        fx
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Jumps to the machine's deadline and fires it.
    fn fire(&mut self) -> Vec<Effect> {
        let (timer, at) = self.m.deadline().expect("a deadline is set");
        if self.m.view().next_retry.is_some() {
            assert_eq!(timer, Timer::Retry);
            self.waits.push(at - self.now);
        }
        self.now = at;
        self.step(Event::Deadline(timer))
    }

    /// Fires the `idle-stop` deadline, which asks for the last use
    /// (`Effect::Settle`), and answers that nothing used the server since
    /// the cutoff: what the idle stop does.
    fn idle_stop(&mut self) -> Vec<Effect> {
        let (timer, _) = self.m.deadline().expect("a deadline is set");
        assert_eq!(timer, Timer::IdleStop);
        let fx = self.fire();
        let [Effect::Settle { generation, cutoff }] = fx[..] else {
            panic!("the idle-stop deadline settles first: {fx:?}");
        };
        self.step(Event::Used {
            generation,
            at: cutoff,
            busy: false,
        })
    }

    fn generation(&self) -> u64 {
        self.m.view().generation
    }

    /// Starts the newest generation's process.
    fn spawned(&mut self) {
        let generation = self.generation();
        assert!(
            self.step(Event::Spawned {
                generation,
                pid: Some(PID)
            })
            .is_empty()
        );
    }

    fn established(&mut self, list: &ToolList) -> Vec<Effect> {
        let generation = self.generation();
        self.step(Event::Established {
            generation,
            tools: list.clone(),
            instructions: None,
            probe: "ping",
        })
    }

    fn exited(&mut self, code: i32) -> Vec<Effect> {
        let generation = self.generation();
        self.step(Event::Exited {
            generation,
            status: ExitStatus::Code(code),
        })
    }

    fn state(&self) -> State {
        self.m.view().state
    }

    fn reason(&self) -> String {
        self.m.view().reason
    }
}

fn spawn(generation: u64) -> Vec<Effect> {
    vec![Effect::Spawn { generation }]
}

#[test]
fn first_start_establishes_and_publishes_tools() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    assert_eq!(r.state(), State::Stopped);
    assert_eq!(r.step(Event::Start), spawn(1));
    assert_eq!(r.state(), State::Starting);
    r.spawned();
    assert_eq!(r.m.view().main_pid, Some(PID));
    assert!(r.established(&tools(&["a", "b"])).is_empty());
    let v = r.m.view();
    assert_eq!(
        (v.state, v.reason.as_str(), v.attempt),
        (State::Running, "", 0)
    );
    assert_eq!(
        (v.tools.len(), v.tools_serial, v.tools_generation),
        (2, 1, 1)
    );
    // no outage: no stability window to wait for, only the first probe
    assert_eq!(
        r.m.deadline(),
        Some((Timer::Probe, r.now + Duration::from_secs(30)))
    );
    // a second start is a no-op
    assert!(r.step(Event::Start).is_empty());
}

#[test]
fn initial_failure_says_connection_failed_and_retries() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    assert_eq!(
        r.exited(1),
        vec![Effect::Disconnect {
            generation: 1,
            lost: Some("process exited with status 1".into())
        }]
    );
    let v = r.m.view();
    assert_eq!(v.state, State::Retrying);
    assert_eq!(v.reason, "connection failed: process exited with status 1");
    assert_eq!((v.attempt, v.max_attempts), (1, 3));
    assert_eq!(v.next_retry, Some(r.now + ms(100)));
    assert_eq!(v.last_exit, Some(ExitStatus::Code(1)));
    assert_eq!(r.fire(), spawn(2));
    // a retry in flight stays in its outage state
    assert_eq!(r.state(), State::Retrying);
}

#[test]
fn an_oom_kill_says_so_in_the_reason() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    let generation = r.generation();
    r.step(Event::Exited {
        generation,
        status: ExitStatus::OutOfMemory,
    });
    let v = r.m.view();
    assert_eq!(
        v.reason,
        "connection lost: process killed by the OOM killer"
    );
    assert_eq!(v.last_exit, Some(ExitStatus::OutOfMemory));
}

#[test]
fn established_loss_says_connection_lost_and_keeps_tools() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    let list = tools(&["a"]);
    r.step(Event::Start);
    r.spawned();
    r.established(&list);
    r.exited(7);
    let v = r.m.view();
    assert_eq!(v.state, State::Reconnecting);
    assert_eq!(v.reason, "connection lost: process exited with status 7");
    assert_eq!(
        (v.tools.len(), v.tools_serial),
        (1, 1),
        "tools stay published during the outage"
    );
    // the retry fails without establishing: now it is a connection failure
    assert_eq!(r.fire(), spawn(2));
    r.spawned();
    r.exited(1);
    let v = r.m.view();
    assert_eq!(v.state, State::Retrying);
    assert_eq!(v.reason, "connection failed: process exited with status 1");
    assert_eq!(v.attempt, 2);
    assert_eq!(v.next_retry, Some(r.now + ms(200)));
}

#[test]
fn reconnect_disabled_fails_at_once_with_manual_recovery_hint() {
    let spec = stdio_spec(policy(100, 800, 3, false));
    let mut r = Rig::new(&spec);
    r.step(Event::Start);
    r.spawned();
    r.exited(1);
    assert_eq!(r.state(), State::Failed);
    assert_eq!(
        r.reason(),
        "connection failed: process exited with status 1; reconnect is disabled, run `mcpctl restart srv` to start it again"
    );
    assert_eq!(r.m.deadline(), None);

    let mut r = Rig::new(&spec);
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    r.exited(9);
    let v = r.m.view();
    assert_eq!(v.state, State::Failed);
    assert_eq!(
        v.reason,
        "connection lost: process exited with status 9; reconnect is disabled, run `mcpctl restart srv` to start it again"
    );
    assert!(v.tools.is_empty(), "tools withdrawn on final failure");
    assert_eq!(v.tools_serial, 2);
    assert_eq!(r.m.deadline(), None);
    assert_eq!(r.spawns, 1);
}

#[test]
fn budget_is_exhausted_after_exactly_max_attempts() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    r.exited(1); // outage begins
    for _ in 0..3 {
        assert!(matches!(r.state(), State::Retrying | State::Reconnecting));
        r.fire();
        r.spawned();
        r.exited(1);
    }
    let v = r.m.view();
    assert_eq!(r.spawns, 4, "1 start + 3 retries");
    assert_eq!(v.state, State::Failed);
    assert_eq!(
        v.reason,
        "connection failed: process exited with status 1; gave up after 3 retries, run `mcpctl restart srv` to try again"
    );
    assert!(v.tools.is_empty());
    assert_eq!(r.m.deadline(), None);
    assert_eq!(r.waits, [ms(100), ms(200), ms(400)]);
}

#[test]
fn stability_window_ends_the_outage_and_resets_the_budget() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 2, true)));
    r.step(Event::Start);
    r.spawned();
    r.exited(1); // retry 1 scheduled
    r.fire();
    r.spawned();
    r.established(&tools(&["a"]));
    assert_eq!(r.state(), State::Running);
    assert_eq!(
        r.m.deadline(),
        Some((Timer::Stable, r.now + ms(800))),
        "stability window = max-delay"
    );
    let stable = r.now;
    assert!(r.fire().is_empty());
    assert_eq!(
        r.m.deadline(),
        Some((Timer::Probe, stable + Duration::from_secs(30))),
        "only the probe timer is left"
    );
    // a later loss is a new outage: retry 1 again, initial delay again
    r.exited(1);
    let v = r.m.view();
    assert_eq!((v.state, v.attempt), (State::Reconnecting, 1));
    assert_eq!(v.next_retry, Some(r.now + ms(100)));
}

#[test]
fn brief_successes_do_not_launder_the_budget() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    r.exited(1);
    for k in 1..=3 {
        r.fire();
        r.spawned();
        r.established(&tools(&["a"]));
        assert_eq!(r.m.view().attempt, k);
        r.advance(ms(799)); // drops just inside the stability window
        r.exited(1);
    }
    assert_eq!(r.state(), State::Failed);
    assert!(
        r.reason()
            .starts_with("connection lost: process exited with status 1; gave up after 3 retries")
    );
    assert_eq!(r.spawns, 4);
}

#[test]
fn double_failure_signals_schedule_exactly_one_retry() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    // connect error first, the process still alive: SIGTERM it, wait for the reap
    let fx = r.step(Event::ConnectFailed {
        generation: 1,
        error: "initialize failed: boom".into(),
    });
    assert_eq!(
        fx,
        vec![
            Effect::Disconnect {
                generation: 1,
                lost: Some("initialize failed: boom".into())
            },
            Effect::Signal {
                generation: 1,
                signal: Signal::Term
            }
        ]
    );
    assert_eq!(r.m.view().attempt, 1);
    // the second signal of the same generation only completes the cleanup
    assert!(
        r.step(Event::Closed {
            generation: 1,
            error: "closed".into()
        })
        .is_empty()
    );
    assert!(r.exited(1).is_empty());
    assert_eq!(r.m.view().attempt, 1);
    assert_eq!(
        r.m.view().reason,
        "connection failed: initialize failed: boom"
    );
    assert_eq!(r.fire(), spawn(2));
    assert_eq!(r.spawns, 2);

    // reversed order: the exit first, then the connect error
    r.spawned();
    r.exited(1);
    assert!(
        r.step(Event::ConnectFailed {
            generation: 2,
            error: "late".into()
        })
        .is_empty()
    );
    assert_eq!(r.m.view().attempt, 2);
    assert_eq!(r.fire(), spawn(3));
}

#[test]
fn events_of_stale_generations_are_inert() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    let list = tools(&["a"]);
    r.step(Event::Start);
    r.spawned();
    r.exited(1);
    r.fire();
    r.spawned();
    r.established(&list);
    let before = r.m.view();
    for event in [
        Event::Established {
            generation: 1,
            tools: tools(&["x"]),
            instructions: Some("stale".into()),
            probe: "ping",
        },
        Event::ConnectFailed {
            generation: 1,
            error: "x".into(),
        },
        Event::Closed {
            generation: 1,
            error: "x".into(),
        },
        Event::Exited {
            generation: 1,
            status: ExitStatus::Code(1),
        },
        Event::ToolsSynced {
            generation: 1,
            tools: tools(&["x"]),
        },
        Event::Spawned {
            generation: 1,
            pid: Some(1),
        },
        Event::SpawnFailed {
            generation: 1,
            error: "x".into(),
        },
        Event::Exited {
            generation: 99,
            status: ExitStatus::Code(1),
        },
    ] {
        assert!(r.step(event).is_empty());
    }
    assert_eq!(r.m.view(), before);
}

#[test]
fn stop_during_backoff_cancels_the_retry() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    r.exited(1);
    let (timer, retry_at) = r.m.deadline().expect("retry armed");
    assert_eq!(timer, Timer::Retry);
    assert!(r.step(Event::Stop).is_empty());
    let v = r.m.view();
    assert_eq!(v.state, State::Stopped);
    assert!(v.tools.is_empty());
    assert_eq!(r.m.deadline(), None);
    r.now = retry_at;
    assert!(
        r.step(Event::Deadline(Timer::Retry)).is_empty(),
        "the cancelled retry never fires"
    );
    assert_eq!(r.spawns, 1);
}

#[test]
fn stop_quiesces_and_a_close_after_it_schedules_nothing() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    assert_eq!(
        r.step(Event::Stop),
        vec![
            Effect::Disconnect {
                generation: 1,
                lost: None
            },
            Effect::Signal {
                generation: 1,
                signal: Signal::Term
            }
        ]
    );
    assert_eq!(r.state(), State::Stopping);
    assert_eq!(
        r.m.view().tools.len(),
        1,
        "tools withdrawn only once the process is gone"
    );
    assert!(
        r.step(Event::Closed {
            generation: 1,
            error: "closed".into()
        })
        .is_empty()
    );
    assert!(r.exited(0).is_empty());
    let v = r.m.view();
    assert_eq!(v.state, State::Stopped);
    assert!(v.tools.is_empty());
    assert_eq!(r.m.deadline(), None);
    assert!(r.m.is_settled());
    assert_eq!(r.spawns, 1);
}

#[test]
fn a_new_generation_waits_for_the_old_process_to_be_reaped() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    // the session closes but the process lingers, ignoring SIGTERM
    let fx = r.step(Event::Closed {
        generation: 1,
        error: "the server closed the connection".into(),
    });
    assert_eq!(
        fx,
        vec![Effect::Disconnect {
            generation: 1,
            lost: Some("the server closed the connection".into())
        }],
        "a hang-up gets time to exit on its own"
    );
    assert_eq!(r.m.deadline(), Some((Timer::KillGrace, r.now + ms(1000))));
    assert_eq!(
        r.fire(),
        vec![Effect::Signal {
            generation: 1,
            signal: Signal::Term
        }]
    );
    assert_eq!(
        r.m.deadline(),
        Some((Timer::KillGrace, r.now + ms(1000))),
        "stop-timeout before SIGKILL"
    );
    assert_eq!(
        r.fire(),
        vec![Effect::Signal {
            generation: 1,
            signal: Signal::Kill
        }]
    );
    assert_eq!(r.spawns, 1, "no retry while the process lives");
    // reaped after SIGKILL: the backoff starts; our own SIGKILL explains nothing
    r.step(Event::Exited {
        generation: 1,
        status: ExitStatus::Signal(9),
    });
    assert_eq!(
        r.reason(),
        "connection lost: the server closed the connection"
    );
    assert_eq!(r.m.view().next_retry, Some(r.now + ms(100)));
    assert_eq!(r.fire(), spawn(2));
}

#[test]
fn a_hang_up_followed_by_an_exit_reports_the_exit_status() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.step(Event::Closed {
        generation: 1,
        error: "the server closed the connection during initialize".into(),
    });
    assert_eq!(
        r.reason(),
        "connection failed: the server closed the connection during initialize"
    );
    assert!(r.exited(3).is_empty());
    assert_eq!(
        r.reason(),
        "connection failed: process exited with status 3"
    );
    assert_eq!(
        r.m.view().last_error.as_deref(),
        Some("process exited with status 3")
    );
    // an answer that was wrong is not re-explained by the exit it caused
    assert_eq!(r.fire(), spawn(2));
    r.spawned();
    r.step(Event::ConnectFailed {
        generation: 2,
        error: "initialize failed: bad version".into(),
    });
    r.step(Event::Exited {
        generation: 2,
        status: ExitStatus::Signal(15),
    });
    assert_eq!(
        r.reason(),
        "connection failed: initialize failed: bad version"
    );
}

#[test]
fn a_process_that_survives_sigkill_fails_closed() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    r.step(Event::Stop);
    assert_eq!(
        r.fire(),
        vec![Effect::Signal {
            generation: 1,
            signal: Signal::Kill
        }]
    );
    assert!(r.fire().is_empty());
    let v = r.m.view();
    assert_eq!(v.state, State::Failed);
    assert_eq!(
        v.reason,
        format!(
            "stop failed: process {PID} did not exit after SIGKILL; not starting another until it does"
        )
    );
    assert!(v.tools.is_empty());
    assert_eq!(r.m.deadline(), None);
    // start insists with SIGKILL but never starts a second process meanwhile
    assert_eq!(
        r.step(Event::Start),
        vec![Effect::Signal {
            generation: 1,
            signal: Signal::Kill
        }]
    );
    assert_eq!(r.spawns, 1);
    // once reaped, the start goes ahead with a fresh generation
    assert_eq!(
        r.step(Event::Exited {
            generation: 1,
            status: ExitStatus::Signal(9)
        }),
        spawn(2)
    );
}

#[test]
fn startup_timeout_fails_the_attempt() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    assert_eq!(r.m.deadline(), Some((Timer::Startup, r.now + ms(3000))));
    let fx = r.fire();
    assert_eq!(
        fx,
        vec![
            Effect::Disconnect {
                generation: 1,
                lost: Some(
                    "startup-timeout (3s) expired before initialize and tools/list completed"
                        .into()
                )
            },
            Effect::Signal {
                generation: 1,
                signal: Signal::Term
            }
        ]
    );
    assert_eq!(
        r.reason(),
        "connection failed: startup-timeout (3s) expired before initialize and tools/list completed"
    );
    assert_eq!(r.state(), State::Retrying);
}

#[test]
fn tool_list_changes_are_published_once_and_only_when_different() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a", "b"]));
    assert_eq!(r.m.view().tools_serial, 1);
    r.exited(1);
    r.fire();
    r.spawned();
    // recovered with an equal (not identical) list: nothing changes
    r.established(&tools(&["a", "b"]));
    let v = r.m.view();
    assert_eq!((v.tools_serial, v.tools_generation), (1, 2));
    r.step(Event::ToolsSynced {
        generation: 2,
        tools: tools(&["a", "b"]),
    });
    assert_eq!(r.m.view().tools_serial, 1);
    r.step(Event::ToolsSynced {
        generation: 2,
        tools: tools(&["a", "b", "c"]),
    });
    let v = r.m.view();
    assert_eq!((v.tools.len(), v.tools_serial), (3, 2));
}

#[test]
fn a_list_that_failed_is_the_last_error_of_the_established_generation_only() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    let why = r#"resources/list: cursor "A" repeated after 3 pages"#;
    // a stale generation's failure is inert
    r.step(Event::ListFailed {
        generation: 7,
        error: why.into(),
    });
    assert_eq!(r.m.view().last_error, None);
    r.step(Event::ListFailed {
        generation: 1,
        error: why.into(),
    });
    let v = r.m.view();
    assert_eq!(v.last_error.as_deref(), Some(why));
    // the server goes on serving: nothing else changes
    assert_eq!(
        (v.state, v.generation, v.tools.len()),
        (State::Running, 1, 1)
    );
    assert!(v.reason.is_empty(), "{}", v.reason);
}

#[test]
fn restart_and_start_begin_with_a_fresh_budget() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 2, true)));
    r.step(Event::Start);
    r.spawned();
    r.exited(1);
    r.fire();
    r.spawned();
    r.exited(1);
    assert_eq!(r.m.view().attempt, 2);
    // restart during backoff: at once, a first start again
    assert_eq!(r.step(Event::Restart), spawn(3));
    assert_eq!((r.state(), r.m.view().attempt), (State::Starting, 0));
    r.spawned();
    r.exited(1);
    r.fire();
    r.spawned();
    r.exited(1);
    r.fire();
    r.spawned();
    r.exited(1);
    assert_eq!(r.state(), State::Failed);
    // start from failed: fresh budget again
    assert_eq!(r.step(Event::Start), spawn(6));
    r.spawned();
    r.exited(1);
    assert_eq!((r.state(), r.m.view().attempt), (State::Retrying, 1));
}

#[test]
fn restart_of_a_running_server_waits_for_the_old_process() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 2, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    let fx = r.step(Event::Restart);
    assert!(!fx.iter().any(|e| matches!(e, Effect::Spawn { .. })));
    assert_eq!(r.state(), State::Stopping);
    assert_eq!(r.exited(0), spawn(2));
    assert_eq!(r.state(), State::Starting);
    assert_eq!(
        r.m.view().tools.len(),
        1,
        "tools survive a restart until the new list arrives"
    );
}

#[test]
fn default_policy_waits_add_up_to_151_5_seconds() {
    let spec = UnitSpec::new(UnitDraft {
        stdio: Some(StdioDraft {
            command: vec!["/bin/true".into()],
            ..StdioDraft::default()
        }),
        ..UnitDraft::default()
    })
    .expect("valid");
    let mut r = Rig::new(&spec);
    r.step(Event::Start);
    while r.state() != State::Failed {
        r.spawned();
        r.exited(1);
        if r.state() != State::Failed {
            r.fire();
        }
    }
    assert_eq!(r.spawns, 11, "1 + max-attempts spawns");
    let total: Duration = r.waits.iter().sum();
    assert_eq!(total, Duration::from_millis(151_500));
}

#[test]
fn apply_restarts_only_when_asked_and_never_a_stopped_unit() {
    let spec = stdio_spec(policy(100, 800, 2, true));
    let mut r = Rig::new(&spec);
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    assert!(
        r.step(Event::Apply {
            spec: Box::new(spec.clone()),
            restart: false
        })
        .is_empty()
    );
    assert_eq!(r.state(), State::Running);
    let fx = r.step(Event::Apply {
        spec: Box::new(spec.clone()),
        restart: true,
    });
    assert!(fx.contains(&Effect::Signal {
        generation: 1,
        signal: Signal::Term
    }));
    assert_eq!(r.exited(0), spawn(2));

    let mut stopped = Rig::new(&spec);
    assert!(
        stopped
            .step(Event::Apply {
                spec: Box::new(spec),
                restart: true
            })
            .is_empty()
    );
    assert_eq!(stopped.state(), State::Stopped);
}

#[test]
fn spawn_failure_needs_no_reap_and_an_http_failure_neither() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 2, true)));
    r.step(Event::Start);
    let fx = r.step(Event::SpawnFailed {
        generation: 1,
        error: "command x: not found in PATH (/bin)".into(),
    });
    assert_eq!(
        fx,
        vec![Effect::Disconnect {
            generation: 1,
            lost: Some("command x: not found in PATH (/bin)".into())
        }]
    );
    assert_eq!(
        r.reason(),
        "connection failed: command x: not found in PATH (/bin)"
    );
    assert_eq!(r.m.view().next_retry, Some(r.now + ms(100)));

    let http = UnitSpec::new(UnitDraft {
        http: Some(HttpDraft {
            url: "http://127.0.0.1:9/mcp".into(),
            headers: vec![],
            ..Default::default()
        }),
        reconnect: policy(100, 800, 2, true),
        ..UnitDraft::default()
    })
    .expect("valid");
    let mut r = Rig::new(&http);
    r.step(Event::Start);
    assert!(
        r.step(Event::Spawned {
            generation: 1,
            pid: None
        })
        .is_empty()
    );
    r.established(&tools(&["a"]));
    let fx = r.step(Event::Closed {
        generation: 1,
        error: "session closed".into(),
    });
    assert_eq!(
        fx,
        vec![Effect::Disconnect {
            generation: 1,
            lost: Some("session closed".into())
        }],
        "no process to signal"
    );
    assert_eq!(r.reason(), "connection lost: session closed");
    assert_eq!(r.fire(), spawn(2));
}

#[test]
fn a_deadline_fires_only_for_the_timer_that_is_armed() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    let (timer, at) = r.m.deadline().expect("startup armed");
    assert_eq!(timer, Timer::Startup);
    r.now = at;
    let before = r.m.view();
    for other in [Timer::Stable, Timer::KillGrace, Timer::Retry] {
        assert!(r.step(Event::Deadline(other)).is_empty(), "{other:?}");
        assert_eq!(
            r.m.view(),
            before,
            "{other:?} is not armed: nothing changes"
        );
    }
    // not yet due: nothing either
    r.now = at - ms(1);
    assert!(r.step(Event::Deadline(Timer::Startup)).is_empty());
    assert_eq!(r.m.view(), before);
    r.now = at;
    assert_eq!(
        r.step(Event::Deadline(Timer::Startup)),
        vec![
            Effect::Disconnect {
                generation: 1,
                lost: Some(
                    "startup-timeout (3s) expired before initialize and tools/list completed"
                        .into()
                )
            },
            Effect::Signal {
                generation: 1,
                signal: Signal::Term
            }
        ]
    );
    assert_eq!(r.state(), State::Retrying);
}

#[test]
fn the_tool_filter_shapes_the_published_list_and_applies_in_place() {
    let with = |allow: &[&str], deny: &[&str]| {
        UnitSpec::new(UnitDraft {
            stdio: Some(StdioDraft {
                command: vec!["/bin/true".into()],
                ..StdioDraft::default()
            }),
            tools_allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            tools_deny: deny.iter().map(|s| (*s).to_owned()).collect(),
            ..UnitDraft::default()
        })
        .expect("valid")
    };
    let names = |r: &Rig| {
        r.m.view()
            .tools
            .names()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let mut r = Rig::new(&with(&[], &["b*"]));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a", "b1", "c"]));
    assert_eq!(names(&r), ["a", "c"], "deny b*");
    assert_eq!(r.m.view().tools_serial, 1);
    /// allow, deny, published, whether the serial moves
    type Case = (
        &'static [&'static str],
        &'static [&'static str],
        &'static [&'static str],
        bool,
    );
    let cases: [Case; 5] = [
        (&[], &["c"], &["a", "b1"], true),
        (&[], &["c"], &["a", "b1"], false),
        (&["a", "c"], &["c"], &["a"], true),
        (&["?1"], &[], &["b1"], true),
        (&[], &[], &["a", "b1", "c"], true),
    ];
    for (allow, deny, want, moves) in cases {
        let before = r.m.view().tools_serial;
        let fx = r.step(Event::Apply {
            spec: Box::new(with(allow, deny)),
            restart: false,
        });
        assert!(fx.is_empty(), "applied in place: {fx:?}");
        assert_eq!(names(&r), want, "allow {allow:?} deny {deny:?}");
        assert_eq!(
            r.m.view().tools_serial != before,
            moves,
            "allow {allow:?} deny {deny:?}"
        );
        assert_eq!(r.state(), State::Running);
    }
    // a re-sync from the server goes through the filter too
    r.step(Event::Apply {
        spec: Box::new(with(&[], &["c"])),
        restart: false,
    });
    r.step(Event::ToolsSynced {
        generation: 1,
        tools: tools(&["c", "d"]),
    });
    assert_eq!(names(&r), ["d"]);
    // a filter that hides every tool still knows which ones exist
    r.step(Event::Apply {
        spec: Box::new(with(&["x*"], &[])),
        restart: false,
    });
    assert!(names(&r).is_empty());
    assert_eq!(r.m.server_lists("d"), Some(true));
    assert_eq!(r.m.server_lists("zz"), Some(false));
}

#[test]
fn restarts_count_automatic_retries_only() {
    let mut r = Rig::new(&stdio_spec(policy(100, 800, 3, true)));
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    assert_eq!(r.m.view().restarts, 0, "the first start is not a restart");
    r.exited(1);
    r.fire();
    assert_eq!(r.m.view().restarts, 1, "a retry is");
    r.spawned();
    r.established(&tools(&["a"]));
    // an operator restart is not counted
    r.step(Event::Restart);
    r.exited(0);
    assert_eq!(r.m.view().restarts, 1);
    r.spawned();
    r.exited(1);
    r.fire();
    assert_eq!(r.m.view().restarts, 2);
}

/// A stdio unit probed after `interval` ms of silence, each probe waiting
/// `timeout` ms, `failures` misses ending the generation.
fn probed(interval: u64, timeout: u64, failures: i128) -> UnitSpec {
    UnitSpec::new(UnitDraft {
        stdio: Some(StdioDraft {
            command: vec!["/bin/true".into()],
            ..StdioDraft::default()
        }),
        reconnect: policy(100, 800, 3, true),
        health: HealthDraft {
            interval: Some(ms(interval)),
            timeout: Some(ms(timeout)),
            failures: Some(failures),
            ..HealthDraft::default()
        },
        ..UnitDraft::default()
    })
    .expect("valid spec")
}

/// A rig with generation 1 established at its `now`.
fn running(spec: &UnitSpec) -> Rig {
    let mut r = Rig::new(spec);
    r.step(Event::Start);
    r.spawned();
    r.established(&tools(&["a"]));
    assert_eq!(r.state(), State::Running);
    r
}

fn probe(generation: u64, probe: u64) -> Vec<Effect> {
    vec![Effect::Probe { generation, probe }]
}

#[test]
fn a_probe_goes_only_after_interval_of_silence_and_any_message_defers_it() {
    let mut r = running(&probed(1000, 200, 3));
    let up = r.now;
    assert_eq!(r.m.deadline(), Some((Timer::Probe, up + ms(1000))));
    // the server spoke 600 ms in: silence starts again
    r.advance(ms(700));
    assert!(
        r.step(Event::Heard {
            generation: 1,
            at: up + ms(600)
        })
        .is_empty()
    );
    assert_eq!(r.m.deadline(), Some((Timer::Probe, up + ms(1600))));
    // a deadline that is no longer due changes nothing
    r.now = up + ms(1000);
    assert!(r.step(Event::Deadline(Timer::Probe)).is_empty());
    // an older sign of life changes nothing either
    r.step(Event::Heard {
        generation: 1,
        at: up + ms(100),
    });
    assert_eq!(r.m.deadline(), Some((Timer::Probe, up + ms(1600))));
    assert_eq!(r.fire(), probe(1, 1));
    assert_eq!(r.m.deadline(), Some((Timer::ProbeTimeout, up + ms(1800))));
    // answered in time: its round trip is published, silence starts again
    r.advance(ms(3));
    assert!(
        r.step(Event::ProbeAnswered {
            generation: 1,
            probe: 1,
            rtt: ms(3)
        })
        .is_empty()
    );
    let health = r.m.view().health;
    assert_eq!(
        (health.enabled, health.missed, health.last_ping),
        (true, 0, Some((ms(3), r.now)))
    );
    assert_eq!(r.m.deadline(), Some((Timer::Probe, r.now + ms(1000))));
    assert_eq!(r.state(), State::Running);
}

#[test]
fn consecutive_misses_end_the_generation_after_interval_plus_failures_times_timeout() {
    let mut r = running(&probed(1000, 200, 3));
    let up = r.now;
    assert_eq!(r.fire(), probe(1, 1));
    // a miss sends the next probe at once
    assert_eq!(r.fire(), probe(1, 2));
    assert_eq!(r.m.view().health.missed, 1);
    assert_eq!(r.state(), State::Running);
    assert_eq!(r.fire(), probe(1, 3));
    assert_eq!(r.m.view().health.missed, 2);
    assert_eq!(
        r.fire(),
        vec![
            Effect::Disconnect {
                generation: 1,
                lost: Some("no answer to ping (3 probes, 200ms each)".into())
            },
            Effect::Signal {
                generation: 1,
                signal: Signal::Term
            }
        ],
        "the third miss ends it like a failed connection: SIGTERM at once"
    );
    assert_eq!(r.now - up, ms(1000 + 3 * 200));
    assert_eq!(r.state(), State::Reconnecting);
    assert_eq!(
        r.reason(),
        "connection lost: no answer to ping (3 probes, 200ms each)"
    );
    // then the usual path: reaped, backoff, retry
    r.exited(143);
    assert_eq!(r.m.view().attempt, 1);
    assert_eq!(r.fire(), spawn(2));
}

#[test]
fn one_allowed_failure_is_named_in_the_singular() {
    let mut r = running(&probed(500, 100, 1));
    assert_eq!(r.fire(), probe(1, 1));
    r.fire();
    assert_eq!(
        r.reason(),
        "connection lost: no answer to ping (1 probe, 100ms each)"
    );
}

#[test]
fn a_2026_07_28_server_is_probed_with_discover_on_the_same_rules() {
    // Established as a server of 2026-07-28 (no ping): the same timers,
    // and the reason names the request its probes send.
    let mut r = Rig::new(&probed(1000, 200, 2));
    r.step(Event::Start);
    r.spawned();
    let up = r.now;
    r.step(Event::Established {
        generation: 1,
        tools: tools(&["a"]),
        instructions: None,
        probe: "server/discover",
    });
    assert_eq!(r.state(), State::Running);
    assert_eq!(r.fire(), probe(1, 1));
    assert_eq!(r.fire(), probe(1, 2));
    r.fire();
    assert_eq!(r.now - up, ms(1000 + 2 * 200));
    assert_eq!(r.state(), State::Reconnecting);
    assert_eq!(
        r.reason(),
        "connection lost: no answer to server/discover (2 probes, 200ms each)"
    );
}

#[test]
fn a_probe_answered_after_its_timeout_is_still_a_miss() {
    let mut r = running(&probed(1000, 200, 3));
    assert_eq!(r.fire(), probe(1, 1));
    assert_eq!(r.fire(), probe(1, 2));
    r.advance(ms(50));
    // probe 1's answer, too late
    assert!(
        r.step(Event::ProbeAnswered {
            generation: 1,
            probe: 1,
            rtt: ms(250)
        })
        .is_empty()
    );
    let health = r.m.view().health;
    assert_eq!((health.missed, health.last_ping), (1, None));
    assert_eq!(
        r.m.deadline().map(|(t, _)| t),
        Some(Timer::ProbeTimeout),
        "probe 2 still waits"
    );
    // probe 2 answered in time: the count starts over
    r.step(Event::ProbeAnswered {
        generation: 1,
        probe: 2,
        rtt: ms(50),
    });
    assert_eq!(r.m.view().health.missed, 0);
    assert_eq!(r.m.deadline(), Some((Timer::Probe, r.now + ms(1000))));
}

#[test]
fn a_server_that_talks_while_probed_is_alive() {
    // e.g. progress of a long call: the ping itself may wait behind it
    let mut r = running(&probed(1000, 200, 2));
    assert_eq!(r.fire(), probe(1, 1));
    assert_eq!(r.fire(), probe(1, 2));
    r.advance(ms(100));
    r.step(Event::Heard {
        generation: 1,
        at: r.now,
    });
    assert_eq!(r.m.view().health.missed, 0);
    assert_eq!(r.m.deadline(), Some((Timer::Probe, r.now + ms(1000))));
    assert_eq!(r.state(), State::Running);
}

#[test]
fn no_probe_while_no_generation_is_established() {
    let mut r = Rig::new(&probed(500, 200, 3));
    r.step(Event::Start);
    r.spawned();
    // connecting: only the startup timeout
    assert_eq!(r.m.deadline().map(|(t, _)| t), Some(Timer::Startup));
    r.established(&tools(&["a"]));
    assert_eq!(r.fire(), probe(1, 1));
    r.exited(1);
    // backoff, then connecting again: no probe timer, and generation 1's
    // events are inert
    assert_eq!(r.m.deadline().map(|(t, _)| t), Some(Timer::Retry));
    assert!(
        r.step(Event::ProbeAnswered {
            generation: 1,
            probe: 1,
            rtt: ms(1)
        })
        .is_empty()
    );
    assert_eq!(r.fire(), spawn(2));
    r.spawned();
    r.step(Event::Heard {
        generation: 1,
        at: r.now,
    });
    assert_eq!(r.m.deadline().map(|(t, _)| t), Some(Timer::Startup));
    // the new generation starts with a clean slate
    r.established(&tools(&["a"]));
    let health = r.m.view().health;
    assert_eq!((health.missed, health.last_ping), (0, None));
    assert_eq!(r.m.deadline(), Some((Timer::Probe, r.now + ms(500))));
}

#[test]
fn disabled_health_sends_nothing() {
    let spec = UnitSpec::new(UnitDraft {
        stdio: Some(StdioDraft {
            command: vec!["/bin/true".into()],
            ..StdioDraft::default()
        }),
        health: HealthDraft {
            enabled: Some(false),
            ..HealthDraft::default()
        },
        ..UnitDraft::default()
    })
    .expect("valid spec");
    let mut r = running(&spec);
    assert_eq!(r.m.deadline(), None);
    assert!(!r.m.view().health.enabled);
    r.advance(Duration::from_secs(3600));
    assert!(r.step(Event::Deadline(Timer::Probe)).is_empty());
    assert!(r.step(Event::Deadline(Timer::ProbeTimeout)).is_empty());
    assert_eq!(r.state(), State::Running);
}

// On-demand units (DESIGN §9).

/// An on-demand stdio unit idling `idle_ms` after its last use (no
/// probes, so the only timers are the ones under test).
fn on_demand(idle_ms: u64, start: &str) -> UnitSpec {
    UnitSpec::new(UnitDraft {
        stdio: Some(StdioDraft {
            command: vec!["/bin/true".into()],
            ..StdioDraft::default()
        }),
        reconnect: policy(100, 400, 2, true),
        health: HealthDraft {
            enabled: Some(false),
            ..HealthDraft::default()
        },
        startup_timeout: Some(ms(3000)),
        stop_timeout: Some(ms(1000)),
        start: Some(start.into()),
        idle_stop: (start == "on-demand").then(|| ms(idle_ms)),
        ..UnitDraft::default()
    })
    .expect("valid spec")
}

/// An on-demand unit armed with cached `names`: idle.
fn idle(idle_ms: u64, names: &[&str]) -> Rig {
    let mut r = Rig::new(&on_demand(idle_ms, "on-demand"));
    r.step(Event::Arm {
        cached: cached(names),
    });
    r
}

fn cached(names: &[&str]) -> Option<Cached> {
    Some(Cached {
        tools: tools(names),
        instructions: Some("from the cache".into()),
    })
}

#[test]
fn an_on_demand_unit_with_a_cache_idles_with_its_lists_and_one_first_use_starts_it() {
    let mut r = Rig::new(&on_demand(1000, "on-demand"));
    assert!(
        r.step(Event::Arm {
            cached: cached(&["a", "b"])
        })
        .is_empty(),
        "no process"
    );
    let v = r.m.view();
    assert_eq!(v.state, State::Idle);
    assert_eq!(v.reason, "waiting for first use");
    assert_eq!(v.tools, tools(&["a", "b"]), "the cached list is published");
    assert_eq!(v.instructions.as_deref(), Some("from the cache"));
    assert_eq!(v.main_pid, None);
    assert_eq!(r.m.deadline(), None, "an idle unit has no timer");
    assert!(r.m.will_serve(), "a request may wait for it");
    let serial = v.tools_serial;

    assert_eq!(r.step(Event::Demand), vec![Effect::Spawn { generation: 1 }]);
    assert_eq!(r.state(), State::Starting);
    // Concurrent first uses: one process.
    assert!(r.step(Event::Demand).is_empty());
    assert!(r.step(Event::Arm { cached: None }).is_empty(), "armed once");
    r.spawned();
    r.established(&tools(&["a", "b"]));
    assert_eq!(r.state(), State::Running);
    assert_eq!(
        r.m.view().tools_serial,
        serial,
        "an unchanged list is not news"
    );
    assert_eq!(r.spawns, 1);
}

#[test]
fn a_start_whose_lists_differ_from_the_cache_publishes_them() {
    let mut r = idle(1000, &["a"]);
    let serial = r.m.view().tools_serial;
    r.step(Event::Demand);
    r.spawned();
    r.established(&tools(&["a", "c"]));
    assert_eq!(r.m.view().tools, tools(&["a", "c"]));
    assert_eq!(r.m.view().tools_serial, serial + 1);
}

#[test]
fn lists_learnt_by_an_instance_are_published_as_the_units_but_not_by_a_stopped_one() {
    let mut r = idle(1000, &["a"]);
    let serial = r.m.view().tools_serial;
    let learned = |names: &[&str]| Event::Learned {
        cached: Cached {
            tools: tools(names),
            instructions: Some("from an instance".into()),
        },
    };
    assert!(r.step(learned(&["a", "b"])).is_empty(), "nothing starts");
    let v = r.m.view();
    assert_eq!(v.state, State::Idle);
    assert_eq!(v.tools, tools(&["a", "b"]));
    assert_eq!(v.tools_serial, serial + 1);
    assert_eq!(v.instructions.as_deref(), Some("from an instance"));
    assert_eq!(r.m.server_tools(), &tools(&["a", "b"]));
    // The same list again is not news.
    r.step(learned(&["a", "b"]));
    assert_eq!(r.m.view().tools_serial, serial + 1);
    // Stopped, its lists are withdrawn and stay so.
    r.step(Event::Stop);
    assert_eq!(r.state(), State::Stopped);
    assert!(r.m.view().tools.is_empty());
    assert!(r.step(learned(&["c"])).is_empty());
    assert!(r.m.view().tools.is_empty());
}

#[test]
fn without_a_cache_an_on_demand_unit_starts_to_learn_its_lists_then_idles() {
    let mut r = Rig::new(&on_demand(1000, "on-demand"));
    assert_eq!(
        r.step(Event::Arm { cached: None }),
        vec![Effect::Spawn { generation: 1 }]
    );
    r.spawned();
    r.advance(ms(20));
    r.established(&tools(&["a"]));
    let established = r.now;
    assert_eq!(
        r.m.deadline(),
        Some((Timer::IdleStop, established + ms(1000))),
        "idle-stop counts from the handshake"
    );
    // At the deadline the actor reports a use since: not idle yet.
    r.now = established + ms(1000);
    r.step(Event::Used {
        generation: 1,
        at: established + ms(600),
        busy: false,
    });
    assert_eq!(
        r.m.deadline(),
        Some((Timer::IdleStop, established + ms(1600)))
    );
    assert!(
        r.step(Event::Deadline(Timer::IdleStop)).is_empty(),
        "not due any more"
    );
    // A request in flight is use until answered.
    r.now = established + ms(1600);
    r.step(Event::Used {
        generation: 1,
        at: established + ms(600),
        busy: true,
    });
    assert_eq!(
        r.m.deadline(),
        Some((Timer::IdleStop, established + ms(2600)))
    );
    // Nothing since: stopped the usual way (SIGTERM, then wait).
    r.now = established + ms(2600);
    r.step(Event::Used {
        generation: 1,
        at: established + ms(1700),
        busy: false,
    });
    let fx = r.idle_stop();
    assert_eq!(
        fx,
        vec![
            Effect::Disconnect {
                generation: 1,
                lost: None
            },
            Effect::Signal {
                generation: 1,
                signal: Signal::Term
            }
        ]
    );
    assert_eq!(r.state(), State::Stopping);
    r.exited(0);
    let v = r.m.view();
    assert_eq!(v.state, State::Idle);
    assert_eq!(v.reason, "stopped after 1s idle");
    assert_eq!(v.tools, tools(&["a"]), "kept while idle");
    assert_eq!(v.main_pid, None);
    assert_eq!(v.attempt, 0);
    assert_eq!(r.m.deadline(), None);
    // The next use starts a new generation.
    assert_eq!(r.step(Event::Demand), vec![Effect::Spawn { generation: 2 }]);
}

#[test]
fn the_idle_stop_deadline_asks_for_the_last_use_once_and_the_answer_decides() {
    let mut r = Rig::new(&on_demand(1000, "on-demand"));
    r.step(Event::Arm { cached: None });
    r.spawned();
    r.established(&tools(&["a"]));
    let established = r.now;
    let deadline = established + ms(1000);
    assert_eq!(r.m.deadline(), Some((Timer::IdleStop, deadline)));
    // the deadline asks; it does not stop the server by itself
    let fx = r.fire();
    assert_eq!(
        fx,
        vec![Effect::Settle {
            generation: 1,
            cutoff: established
        }]
    );
    assert_eq!(r.state(), State::Running);
    assert_eq!(r.m.deadline(), None, "asked once, until answered");
    // a request in flight: not idle; idle-stop counts from now
    r.step(Event::Used {
        generation: 1,
        at: established,
        busy: true,
    });
    assert_eq!(r.state(), State::Running);
    assert_eq!(r.m.deadline(), Some((Timer::IdleStop, deadline + ms(1000))));
    // a use after the cutoff: not idle; idle-stop counts from that use
    let fx = r.fire();
    let [Effect::Settle { cutoff, .. }] = fx[..] else {
        panic!("{fx:?}");
    };
    assert_eq!(cutoff, deadline);
    r.step(Event::Used {
        generation: 1,
        at: cutoff + ms(1),
        busy: false,
    });
    assert_eq!(r.state(), State::Running);
    assert_eq!(r.m.deadline(), Some((Timer::IdleStop, deadline + ms(1001))));
    // a use reported outside a settle only moves the deadline
    r.step(Event::Used {
        generation: 1,
        at: deadline + ms(500),
        busy: false,
    });
    assert_eq!(r.m.deadline(), Some((Timer::IdleStop, deadline + ms(1500))));
    // unused since the cutoff (a use at the cutoff itself included): idle
    let fx = r.fire();
    let [Effect::Settle { cutoff, .. }] = fx[..] else {
        panic!("{fx:?}");
    };
    let fx = r.step(Event::Used {
        generation: 1,
        at: cutoff,
        busy: false,
    });
    assert_eq!(
        fx,
        vec![
            Effect::Disconnect {
                generation: 1,
                lost: None
            },
            Effect::Signal {
                generation: 1,
                signal: Signal::Term
            }
        ]
    );
    assert_eq!(r.state(), State::Stopping);
    // the rule itself
    let t = r.now;
    assert!(mcpd::supervisor::machine::idle(t, false, t));
    assert!(!mcpd::supervisor::machine::idle(t, true, t));
    assert!(!mcpd::supervisor::machine::idle(t + ms(1), false, t));
}

#[test]
fn a_use_during_the_idle_stop_starts_it_again_once_the_old_process_is_gone() {
    let mut r = Rig::new(&on_demand(500, "on-demand"));
    r.step(Event::Arm { cached: None });
    r.spawned();
    r.established(&tools(&["a"]));
    r.idle_stop();
    assert_eq!(r.state(), State::Stopping);
    assert!(!r.m.will_serve(), "stopping for good, until a use");
    assert!(r.step(Event::Demand).is_empty(), "one process at a time");
    assert!(r.m.will_serve());
    assert_eq!(r.exited(0), vec![Effect::Spawn { generation: 2 }]);
    assert_eq!(r.state(), State::Starting);
}

#[test]
fn stop_of_an_on_demand_unit_is_final_until_start() {
    let mut r = idle(500, &["a"]);
    assert!(r.step(Event::Stop).is_empty());
    let v = r.m.view();
    assert_eq!(v.state, State::Stopped);
    assert!(v.tools.is_empty(), "withdrawn by stop");
    assert!(!r.m.will_serve());
    assert!(
        r.step(Event::Demand).is_empty(),
        "no activation while stopped"
    );
    // Start runs it now; it idles later.
    assert_eq!(r.step(Event::Start), vec![Effect::Spawn { generation: 1 }]);
    r.spawned();
    r.established(&tools(&["a"]));
    assert!(matches!(r.m.deadline(), Some((Timer::IdleStop, _))));
    // Stopped while its idle stop is under way: stopped, not idle.
    r.fire();
    r.step(Event::Stop);
    r.exited(0);
    assert_eq!(r.state(), State::Stopped);
    // Started on an idle unit: now.
    let mut r = idle(500, &["a"]);
    assert_eq!(r.step(Event::Start), vec![Effect::Spawn { generation: 1 }]);
}

#[test]
fn a_failed_on_demand_start_follows_the_usual_backoff_and_budget() {
    let mut r = idle(500, &["a"]);
    r.step(Event::Demand);
    r.spawned();
    r.exited(1);
    let v = r.m.view();
    assert_eq!(v.state, State::Retrying);
    assert!(
        v.reason
            .starts_with("connection failed: process exited with status 1"),
        "{}",
        v.reason
    );
    assert!(!r.m.will_serve(), "waiting requests fail now");
    assert!(
        r.step(Event::Demand).is_empty(),
        "a use does not skip the backoff"
    );
    for _ in 0..2 {
        r.fire();
        r.spawned();
        r.exited(1);
    }
    let v = r.m.view();
    assert_eq!(v.state, State::Failed);
    assert!(v.tools.is_empty(), "withdrawn on final failure");
    assert!(r.step(Event::Demand).is_empty());
    assert_eq!(r.spawns, 3, "1 + max-attempts");
    assert_eq!(r.waits, vec![ms(100), ms(200)]);
}

#[test]
fn a_crash_of_a_running_on_demand_server_reconnects_as_any_other() {
    let mut r = Rig::new(&on_demand(500, "on-demand"));
    r.step(Event::Arm { cached: None });
    r.spawned();
    r.established(&tools(&["a"]));
    r.exited(139);
    assert_eq!(r.state(), State::Reconnecting);
    assert_eq!(r.m.view().tools, tools(&["a"]), "kept through the outage");
    r.fire();
    assert_eq!(r.state(), State::Reconnecting);
    r.spawned();
    r.established(&tools(&["a"]));
    assert_eq!(r.state(), State::Running);
}

#[test]
fn an_always_unit_arms_by_starting_and_never_idles() {
    let mut r = Rig::new(&on_demand(500, "always"));
    assert_eq!(
        r.step(Event::Arm {
            cached: cached(&["a"])
        }),
        vec![Effect::Spawn { generation: 1 }],
        "a cache means nothing to an always unit"
    );
    r.spawned();
    r.established(&tools(&["a"]));
    assert_eq!(r.m.deadline(), None, "no idle-stop");
    assert!(!r.m.will_serve(), "requests of an always unit never wait");
    assert!(r.step(Event::Demand).is_empty());
}

#[test]
fn a_reload_switching_activation_applies_in_place() {
    // Always → on demand, while running: it idles later.
    let mut r = Rig::new(&on_demand(500, "always"));
    r.step(Event::Arm { cached: None });
    r.spawned();
    r.established(&tools(&["a"]));
    let fx = r.step(Event::Apply {
        spec: Box::new(on_demand(500, "on-demand")),
        restart: false,
    });
    assert!(fx.is_empty(), "same process");
    assert!(matches!(r.m.deadline(), Some((Timer::IdleStop, _))));
    r.idle_stop();
    r.exited(0);
    assert_eq!(r.state(), State::Idle);
    // On demand → always, while idle: it starts.
    let fx = r.step(Event::Apply {
        spec: Box::new(on_demand(500, "always")),
        restart: false,
    });
    assert_eq!(fx, vec![Effect::Spawn { generation: 2 }]);
    r.spawned();
    r.established(&tools(&["a"]));
    assert_eq!(r.m.deadline(), None);
}

#[test]
fn switched_to_always_while_stopping_for_idleness_it_starts_once_stopped() {
    let mut r = Rig::new(&on_demand(500, "on-demand"));
    r.step(Event::Arm { cached: None });
    r.spawned();
    r.established(&tools(&["a"]));
    r.idle_stop();
    assert_eq!(r.state(), State::Stopping);
    assert!(
        r.step(Event::Apply {
            spec: Box::new(on_demand(500, "always")),
            restart: false,
        })
        .is_empty(),
        "one process at a time"
    );
    assert_eq!(r.exited(0), vec![Effect::Spawn { generation: 2 }]);
    assert_eq!(r.state(), State::Starting);
}

#[test]
fn requests_wait_only_for_a_start_on_demand_not_for_a_retry() {
    let mut r = idle(500, &["a"]);
    r.step(Event::Demand);
    assert!(r.m.will_serve(), "starting: a request waits");
    r.spawned();
    r.exited(1);
    r.fire();
    assert_eq!(r.state(), State::Retrying);
    assert!(r.m.current().is_some(), "the retry is under way");
    assert!(!r.m.will_serve(), "during an outage requests fail at once");
}

#[test]
fn a_per_host_instance_begins_idle_and_its_hosts_first_use_starts_it() {
    let unit = UnitSpec::new(UnitDraft {
        stdio: Some(StdioDraft {
            command: vec!["/bin/true".into()],
            ..StdioDraft::default()
        }),
        sessions: Some("per-host".into()),
        ..UnitDraft::default()
    })
    .expect("valid spec");
    let mut r = Rig::new(&unit.for_instance());
    let v = r.m.view();
    assert_eq!(v.state, State::Idle);
    assert_eq!(v.reason, "waiting for its host");
    assert_eq!(r.m.deadline(), None, "no timer, no process");
    assert_eq!(r.step(Event::Demand), vec![Effect::Spawn { generation: 1 }]);
    assert!(r.step(Event::Demand).is_empty(), "one process");
    r.spawned();
    r.established(&tools(&["a"]));
    assert_eq!(r.state(), State::Running);
    // An instance is never stopped for idleness: no idle-stop timer.
    assert!(
        !matches!(r.m.deadline(), Some((Timer::IdleStop, _))),
        "{:?}",
        r.m.deadline()
    );
    // A crash restarts it under its own budget, as any unit.
    r.exited(1);
    assert_eq!(r.state(), State::Reconnecting);

    // The unit itself is on demand (implied by per-host).
    let mut u = Rig::new(&unit);
    assert_eq!(u.state(), State::Stopped);
    assert_eq!(
        u.step(Event::Arm { cached: None }),
        vec![Effect::Spawn { generation: 1 }],
        "it starts once to learn its lists"
    );
    assert!(unit.activation().idle_stop().is_some());
}

#[test]
fn needs_login_spends_no_retry_keeps_the_tools_and_a_login_starts_it() {
    let http = UnitSpec::new(UnitDraft {
        http: Some(HttpDraft {
            url: "http://localhost:9/mcp".into(),
            oauth: Some(Default::default()),
            ..Default::default()
        }),
        reconnect: policy(100, 800, 2, true),
        ..UnitDraft::default()
    })
    .expect("valid");
    let mut r = Rig::new(&http);
    r.step(Event::Start);
    r.step(Event::Spawned {
        generation: 1,
        pid: None,
    });
    r.established(&tools(&["a"]));
    r.step(Event::Closed {
        generation: 1,
        error: "session closed".into(),
    });
    r.advance(ms(100));
    assert_eq!(r.fire(), spawn(2));
    r.step(Event::Spawned {
        generation: 2,
        pid: None,
    });
    // The login is gone (a refresh token refused): no retry, no flapping.
    let fx = r.step(Event::NeedsLogin {
        generation: 2,
        scopes: Vec::new(),
    });
    assert_eq!(
        fx,
        vec![Effect::Disconnect {
            generation: 2,
            lost: None
        }]
    );
    assert_eq!(r.state(), State::NeedsLogin);
    assert_eq!(
        r.reason(),
        "server srv needs a login: run mcpctl auth login srv"
    );
    let view = r.m.view();
    assert_eq!((view.attempt, view.next_retry), (0, None));
    assert_eq!(view.tools.len(), 1, "the tools are kept");
    assert_eq!(r.m.deadline(), None, "nothing is armed: no retry");
    // Stale events and deadlines change nothing.
    assert!(
        r.step(Event::NeedsLogin {
            generation: 1,
            scopes: Vec::new()
        })
        .is_empty()
    );
    assert_eq!(r.state(), State::NeedsLogin);
    // A completed login starts it with a fresh budget.
    assert_eq!(r.step(Event::LoggedIn), spawn(3));
    assert_eq!(r.state(), State::Starting);
    assert!(r.m.view().last_error.is_none());
    // A login while running changes nothing.
    r.step(Event::Spawned {
        generation: 3,
        pid: None,
    });
    r.established(&tools(&["a"]));
    assert!(r.step(Event::LoggedIn).is_empty());
    assert_eq!(r.state(), State::Running);
    // A 403 insufficient_scope (a step-up, DESIGN §17): the reason names
    // the scopes the server asked for, and a login starts it again.
    r.step(Event::NeedsLogin {
        generation: 3,
        scopes: vec!["mcp:write".into(), "files:read".into()],
    });
    assert_eq!(r.state(), State::NeedsLogin);
    assert_eq!(
        r.reason(),
        "server srv needs a login with scope mcp:write files:read: run mcpctl auth login srv"
    );
    assert_eq!(r.m.view().tools.len(), 1, "the tools are kept");
    assert_eq!(r.step(Event::LoggedIn), spawn(4));
}
