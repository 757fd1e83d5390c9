//! OpenTelemetry (DESIGN §18): spans and metrics after the OpenTelemetry
//! MCP semantic conventions, exported as OTLP over HTTP/protobuf.
//!
//! Off unless `mcpd.kdl` has a `telemetry { }` section ([`apply`], at
//! start and at every reload): then [`on`] is one relaxed load of an
//! atomic, and nothing else of this module runs. On, the unit's host
//! sessions record through a [`Tracer`] (`trace.rs`), which the driver
//! (`supervisor::sessions`) feeds what it reads and writes; finished spans
//! go to a bounded queue ([`QUEUE`]) and durations into histograms, and
//! one task ([`export`]) sends them in batches. A span that does not fit
//! the queue, and every span and metric point of an export that fails or
//! takes longer than [`export::TIMEOUT`], is dropped and counted
//! ([`stats`], shown by `mcpctl status`): nothing a collector does can
//! delay a call.
//!
//! The pipeline is a process global, as the journal is: every unit's
//! sessions record into the one the settings name, and a reload swaps it.

pub mod context;
pub mod export;
pub mod metrics;
mod trace;

pub use trace::{Tracer, Transport};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::mpsc;

use crate::unit::settings::TelemetrySettings;
use context::SpanContext;

/// Finished spans waiting for an export.
pub const QUEUE: usize = 2048;

/// The kind of a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A host's request, as mcpd serves it.
    Server,
    /// mcpd's request to a server.
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Text(String),
    Int(i64),
}

/// A finished span.
#[derive(Debug, Clone)]
pub struct Span {
    pub context: SpanContext,
    pub parent: Option<[u8; 8]>,
    pub tracestate: Option<String>,
    pub name: String,
    pub kind: SpanKind,
    /// Unix time, nanoseconds.
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<(&'static str, Value)>,
    /// The span failed: its `error.type` is among the attributes, and
    /// this is its status message.
    pub error: Option<String>,
}

/// What the exporter did since the daemon started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub on: bool,
    pub exported: u64,
    pub dropped: u64,
}

static ON: AtomicBool = AtomicBool::new(false);
static EXPORTED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static PIPELINE: Mutex<Option<Arc<Pipeline>>> = Mutex::new(None);

/// One configuration's queue, histograms and exporting task.
#[derive(Debug)]
pub(crate) struct Pipeline {
    settings: TelemetrySettings,
    spans: mpsc::Sender<Span>,
    metrics: Mutex<metrics::Metrics>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Whether telemetry is on: the one check on every path when it is off.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// What has been exported and dropped.
pub fn stats() -> Stats {
    Stats {
        on: on(),
        exported: EXPORTED.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
    }
}

pub(crate) fn exported(n: u64) {
    EXPORTED.fetch_add(n, Ordering::Relaxed);
}

pub(crate) fn dropped(n: u64) {
    DROPPED.fetch_add(n, Ordering::Relaxed);
}

fn current() -> Option<Arc<Pipeline>> {
    PIPELINE.lock().ok().and_then(|p| p.clone())
}

/// The settings' telemetry now (`None`: off). Called in the runtime: the
/// exporting task is spawned on it. The same settings again change
/// nothing; other settings end the old pipeline (what it held is
/// dropped and counted) and start a new one.
pub fn apply(settings: Option<TelemetrySettings>) {
    let Ok(mut slot) = PIPELINE.lock() else {
        return;
    };
    if slot.as_ref().map(|p| &p.settings) == settings.as_ref() {
        return;
    }
    if let Some(old) = slot.take() {
        ON.store(false, Ordering::Relaxed);
        old.close();
    }
    let Some(settings) = settings else {
        tracing::info!(target: "mcpd::telemetry", "telemetry off");
        return;
    };
    let (tx, rx) = mpsc::channel(QUEUE);
    let pipeline = Arc::new(Pipeline {
        metrics: Mutex::new(metrics::Metrics::new(now_nanos())),
        settings,
        spans: tx,
        task: Mutex::new(None),
    });
    let task = tokio::spawn(export::run(Arc::clone(&pipeline), rx));
    if let Ok(mut slot) = pipeline.task.lock() {
        *slot = Some(task);
    }
    tracing::info!(
        target: "mcpd::telemetry",
        "telemetry to {} (OTLP/HTTP), service {}, sample ratio {}",
        pipeline.settings.otlp,
        pipeline.settings.service_name,
        pipeline.settings.sample_ratio
    );
    *slot = Some(pipeline);
    ON.store(true, Ordering::Relaxed);
}

impl Pipeline {
    /// Ends the exporting task: what it held is dropped (and counted).
    fn close(&self) {
        if let Ok(mut task) = self.task.lock()
            && let Some(task) = task.take()
        {
            task.abort();
        }
        dropped((QUEUE - self.spans.capacity()) as u64);
    }

    pub(crate) fn settings(&self) -> &TelemetrySettings {
        &self.settings
    }

    pub(crate) fn metrics(&self) -> &Mutex<metrics::Metrics> {
        &self.metrics
    }
}

/// Hands a finished span to the exporter, or counts it dropped.
pub fn finish(span: Span) {
    let Some(pipeline) = current() else {
        return;
    };
    if pipeline.spans.try_send(span).is_err() {
        dropped(1);
    }
}

/// The sample ratio of the pipeline on, if one is.
pub fn sample_ratio() -> Option<f64> {
    current().map(|p| p.settings.sample_ratio)
}

/// Records a duration in one of the conventions' histograms.
pub fn record(metric: metrics::Histogram, seconds: f64, attributes: Vec<(&'static str, String)>) {
    if let Some(pipeline) = current()
        && let Ok(mut m) = pipeline.metrics.lock()
    {
        m.record(metric, seconds, attributes);
    }
}

/// Adds one to an `mcpd.` counter.
pub fn count(counter: metrics::Counter, attributes: Vec<(&'static str, String)>) {
    if !on() {
        return;
    }
    if let Some(pipeline) = current()
        && let Ok(mut m) = pipeline.metrics.lock()
    {
        m.add(counter, attributes);
    }
}

/// Unix time now, nanoseconds.
pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A fresh id of `N` bytes, never all zero: a counter mixed by SplitMix64
/// from a seed the kernel gave once.
pub fn fresh_id<const N: usize>() -> [u8; N] {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        let mut bytes = [0u8; 8];
        if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
            return now_nanos() ^ u64::from(std::process::id()) << 32;
        }
        u64::from_le_bytes(bytes)
    });
    let mut out = [0u8; N];
    for chunk in out.chunks_mut(8) {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut z = seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let bytes = z.to_be_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    if out.iter().all(|b| *b == 0) {
        out[N - 1] = 1;
    }
    out
}
