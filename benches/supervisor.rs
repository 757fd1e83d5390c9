//! Supervisor benchmarks against the targets of the supervisor issue:
//!
//! 1. respawn latency: reap → respawn, minus the scheduled backoff delay
//!    (median over N crashes of the fixture server; target within 5 ms);
//! 2. re-established: respawn → initialize + tools/list done (target < 50 ms);
//! 3. heap per idle supervised server, counted by a global allocator, and
//!    RSS per server, with M servers (target < 64 KiB heap per server).
//!
//! Run through `bench/run` (builds the release fixture); prints a table.
//! `MCPD_BENCH_CRASHES` and `MCPD_BENCH_SERVERS` set N and M.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcpd::supervisor::launch::{BoxFuture, GenClient, Launched, Launcher};
use mcpd::supervisor::machine::{ExitStatus, Gen, Signal};
use mcpd::supervisor::process::Host;
use mcpd::supervisor::{LogRing, State, Supervisor, SystemLauncher};
use mcpd::unit::spec::{ReconnectDraft, StdioDraft};
use mcpd::unit::{Instance, UnitDraft, UnitSpec};

/// Counts live heap bytes.
struct Counting;

static HEAP: AtomicIsize = AtomicIsize::new(0);

// SAFETY: delegates to the system allocator and only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HEAP.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Records when generations are launched and reaped.
struct Timing {
    inner: SystemLauncher,
    launched: Arc<Mutex<Vec<(Gen, Instant)>>>,
    reaped: Arc<Mutex<Vec<(Gen, Instant)>>>,
}

impl Launcher for Timing {
    fn launch(
        &self,
        spec: &UnitSpec,
        generation: Gen,
        client: GenClient,
    ) -> Result<Launched, String> {
        self.launched
            .lock()
            .expect("lock")
            .push((generation, Instant::now()));
        let mut launched = self.inner.launch(spec, generation, client)?;
        if let Some(exit) = launched.exit.take() {
            let reaped = Arc::clone(&self.reaped);
            let wrapped: BoxFuture<ExitStatus> = Box::pin(async move {
                let status = exit.await;
                reaped
                    .lock()
                    .expect("lock")
                    .push((generation, Instant::now()));
                status
            });
            launched.exit = Some(wrapped);
        }
        Ok(launched)
    }

    fn signal(&self, pid: u32, signal: Signal) {
        self.inner.signal(pid, signal);
    }

    fn reaped(&self, pid: u32) {
        self.inner.reaped(pid);
    }
}

fn fixture() -> PathBuf {
    let path = std::env::var_os("MCPD_FIXTURE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/examples/mcp-fixture")
        });
    assert!(
        path.is_file(),
        "{} is missing: run bench/run, or cargo build --release --examples",
        path.display()
    );
    path
}

fn spec(delay_ms: u64, attempts: i128) -> UnitSpec {
    UnitSpec::new(UnitDraft {
        stdio: Some(StdioDraft {
            command: vec![
                fixture().display().to_string(),
                "--chatter".into(),
                "0".into(),
            ],
            ..StdioDraft::default()
        }),
        reconnect: ReconnectDraft {
            enabled: Some(true),
            initial_delay: Some(Duration::from_millis(delay_ms)),
            max_delay: Some(Duration::from_millis(delay_ms)),
            max_attempts: Some(attempts),
        },
        ..UnitDraft::default()
    })
    .expect("valid spec")
}

async fn wait_running(sup: &Supervisor, generation: Gen) -> Instant {
    let mut rx = sup.subscribe();
    let result = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            {
                let s = rx.borrow_and_update();
                if s.state == State::Running && s.generation >= generation {
                    return Instant::now();
                }
            }
            rx.changed().await.expect("supervisor alive");
        }
    })
    .await;
    result.unwrap_or_else(|_| panic!("generation {generation} never ran: {:#?}", sup.status()))
}

fn stats(mut xs: Vec<f64>) -> (f64, f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    let pick = |q: f64| xs[((xs.len() - 1) as f64 * q).round() as usize];
    (pick(0.5), pick(0.95), xs[0], xs[xs.len() - 1])
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Row {
    figure: String,
    target: String,
    median: String,
    spread: String,
    runs: usize,
}

async fn respawn(crashes: usize) -> Vec<Row> {
    const DELAY_MS: u64 = 100;
    let launched = Arc::new(Mutex::new(Vec::new()));
    let reaped = Arc::new(Mutex::new(Vec::new()));
    let logs = LogRing::default();
    let launcher = Arc::new(Timing {
        inner: SystemLauncher::new("bench", Host::current(Instance::User), logs.clone()),
        launched: Arc::clone(&launched),
        reaped: Arc::clone(&reaped),
    });
    let (sup, task) = Supervisor::spawn("bench", spec(DELAY_MS, 1_000_000), launcher, logs);
    sup.start();
    wait_running(&sup, 1).await;
    let mut late = Vec::new();
    let mut establish = Vec::new();
    for generation in 1..=crashes as u64 {
        let args = serde_json::json!({"code": 1});
        let _ = sup
            .call_tool("crash", args.as_object().cloned(), Duration::from_secs(10))
            .await;
        let up = wait_running(&sup, generation + 1).await;
        let reap = reaped
            .lock()
            .expect("lock")
            .iter()
            .find(|(g, _)| *g == generation)
            .map(|(_, t)| *t);
        let spawn = launched
            .lock()
            .expect("lock")
            .iter()
            .find(|(g, _)| *g == generation + 1)
            .map(|(_, t)| *t);
        let (Some(reap), Some(spawn)) = (reap, spawn) else {
            panic!("generation {generation}: no reap or respawn recorded");
        };
        late.push((spawn - reap).as_secs_f64() * 1000.0 - DELAY_MS as f64);
        establish.push((up - spawn).as_secs_f64() * 1000.0);
    }
    sup.shutdown(task).await;
    let (m1, p1, lo1, hi1) = stats(late);
    let (m2, p2, lo2, hi2) = stats(establish);
    vec![
        Row {
            figure: format!("respawn after reap minus backoff ({DELAY_MS} ms)"),
            target: "within 5 ms".into(),
            median: format!("{m1:.2} ms"),
            spread: format!("p95 {p1:.2}, {lo1:.2}..{hi1:.2} ms"),
            runs: crashes,
        },
        Row {
            figure: "respawn to re-established (initialize + tools/list)".into(),
            target: "< 50 ms".into(),
            median: format!("{m2:.2} ms"),
            spread: format!("p95 {p2:.2}, {lo2:.2}..{hi2:.2} ms"),
            runs: crashes,
        },
    ]
}

async fn memory(servers: usize) -> Vec<Row> {
    // Settle the runtime and allocator before the baseline.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let heap0 = HEAP.load(Ordering::SeqCst);
    let rss0 = rss_kib();
    let mut running = Vec::new();
    for i in 0..servers {
        let name = format!("idle{i}");
        let logs = LogRing::default();
        let launcher = Arc::new(SystemLauncher::new(
            &name,
            Host::current(Instance::User),
            logs.clone(),
        ));
        let (sup, task) = Supervisor::spawn(&name, spec(1000, 10), launcher, logs);
        sup.start();
        running.push((sup, task));
    }
    for (sup, _) in &running {
        wait_running(sup, 1).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let heap = HEAP.load(Ordering::SeqCst) - heap0;
    let rss = rss_kib().saturating_sub(rss0);
    let mut stopping = tokio::task::JoinSet::new();
    for (sup, task) in running {
        stopping.spawn(sup.shutdown(task));
    }
    while stopping.join_next().await.is_some() {}
    let per_heap = heap as f64 / servers as f64 / 1024.0;
    let per_rss = rss as f64 / servers as f64;
    vec![
        Row {
            figure: format!("daemon heap per idle running server ({servers} servers)"),
            target: "< 64 KiB".into(),
            median: format!("{per_heap:.1} KiB"),
            spread: format!("{:.1} MiB in all", heap as f64 / 1024.0 / 1024.0),
            runs: 1,
        },
        Row {
            figure: format!("daemon RSS per idle running server ({servers} servers)"),
            target: "-".into(),
            median: format!("{per_rss:.1} KiB"),
            spread: format!("{:.1} MiB in all", rss as f64 / 1024.0),
            runs: 1,
        },
    ]
}

fn main() {
    let crashes = env_usize("MCPD_BENCH_CRASHES", 50);
    let servers = env_usize("MCPD_BENCH_SERVERS", 200);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let mut rows = runtime.block_on(respawn(crashes));
    rows.extend(runtime.block_on(memory(servers)));
    let widths = [52, 12, 12, 32, 5];
    println!(
        "| {:<w0$} | {:<w1$} | {:<w2$} | {:<w3$} | {:>w4$} |",
        "figure",
        "target",
        "median",
        "p95, min..max",
        "runs",
        w0 = widths[0],
        w1 = widths[1],
        w2 = widths[2],
        w3 = widths[3],
        w4 = widths[4]
    );
    println!(
        "|{}|{}|{}|{}|{}|",
        "-".repeat(widths[0] + 2),
        "-".repeat(widths[1] + 2),
        "-".repeat(widths[2] + 2),
        "-".repeat(widths[3] + 2),
        "-".repeat(widths[4] + 1) + ":"
    );
    for r in rows {
        println!(
            "| {:<w0$} | {:<w1$} | {:<w2$} | {:<w3$} | {:>w4$} |",
            r.figure,
            r.target,
            r.median,
            r.spread,
            r.runs,
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
            w4 = widths[4]
        );
    }
}
