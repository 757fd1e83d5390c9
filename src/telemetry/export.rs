//! The exporting task: finished spans in batches, the metrics every
//! [`METRICS_EVERY`], as OTLP/HTTP protobuf through reqwest.
//!
//! Why not the OpenTelemetry SDK's `BatchSpanProcessor` and
//! `PeriodicReader` with `opentelemetry-otlp`: both run on threads of
//! their own and block on the export (the reader needs a blocking HTTP
//! client or a multi-threaded runtime), while the daemon's event loop is
//! one thread (ARCHITECTURE.md); and neither tells how many spans it
//! dropped, which `mcpctl status` shows. This task is one more task on
//! that thread, with one export at a time: while it waits for a slow
//! collector the queue fills and what does not fit is counted dropped.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{ResourceMetrics, ScopeMetrics};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1 as proto;
use prost::Message as _;
use tokio::sync::mpsc;

use super::{Pipeline, Span, SpanKind, Value};

/// The most spans in one export.
pub const BATCH: usize = 512;
/// How long a span waits for others before its batch goes.
pub const FLUSH_AFTER: Duration = Duration::from_secs(1);
/// How often the metrics go, when they changed.
pub const METRICS_EVERY: Duration = Duration::from_secs(5);
/// The longest an export may take: then what it carried is dropped.
pub const TIMEOUT: Duration = Duration::from_secs(5);

pub(super) async fn run(pipeline: Arc<Pipeline>, mut rx: mpsc::Receiver<Span>) {
    crate::supervisor::launch::install_crypto_provider();
    let client = match reqwest::Client::builder().timeout(TIMEOUT).build() {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(target: "mcpd::telemetry", "no telemetry: cannot make an HTTP client: {e}");
            return;
        }
    };
    let sender = Sender {
        client,
        pipeline: Arc::clone(&pipeline),
        failing: false,
    };
    let mut sender = sender;
    let mut batch: Vec<Span> = Vec::with_capacity(BATCH);
    let mut flush_at: Option<tokio::time::Instant> = None;
    let mut metrics = tokio::time::interval(METRICS_EVERY);
    metrics.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            span = rx.recv() => match span {
                Some(span) => {
                    batch.push(span);
                    flush_at.get_or_insert_with(|| tokio::time::Instant::now() + FLUSH_AFTER);
                    if batch.len() >= BATCH {
                        flush_at = None;
                        sender.spans(std::mem::take(&mut batch)).await;
                    }
                }
                None => break,
            },
            () = sleep_until(flush_at) => {
                flush_at = None;
                sender.spans(std::mem::take(&mut batch)).await;
            }
            _ = metrics.tick() => sender.metrics().await,
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

struct Sender {
    client: reqwest::Client,
    pipeline: Arc<Pipeline>,
    /// The last export failed (said once until one succeeds).
    failing: bool,
}

impl Sender {
    async fn spans(&mut self, batch: Vec<Span>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let request = ExportTraceServiceRequest {
            resource_spans: vec![proto::ResourceSpans {
                resource: Some(self.resource()),
                scope_spans: vec![proto::ScopeSpans {
                    scope: Some(scope()),
                    spans: batch.into_iter().map(span).collect(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        if self.post("v1/traces", request.encode_to_vec()).await {
            super::exported(n);
        } else {
            super::dropped(n);
        }
    }

    async fn metrics(&mut self) {
        let taken = match self.pipeline.metrics().lock() {
            Ok(mut m) => m.take(super::now_nanos()),
            Err(_) => None,
        };
        let Some(metrics) = taken else {
            return;
        };
        let request = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(scope()),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        if !self.post("v1/metrics", request.encode_to_vec()).await
            && let Ok(mut m) = self.pipeline.metrics().lock()
        {
            // Cumulative: the next export carries them again.
            m.again();
        }
    }

    fn resource(&self) -> Resource {
        Resource {
            attributes: vec![
                text(
                    "service.name",
                    self.pipeline.settings().service_name.clone(),
                ),
                text("service.version", env!("CARGO_PKG_VERSION").into()),
            ],
            ..Default::default()
        }
    }

    /// Sends one export: whether the collector took it.
    async fn post(&mut self, signal: &str, body: Vec<u8>) -> bool {
        let settings = self.pipeline.settings();
        let url = signal_url(&settings.otlp, signal);
        let mut request = self
            .client
            .post(url.as_str())
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body);
        for (name, value) in &settings.headers {
            request = request.header(name.clone(), value.clone());
        }
        let outcome = match request.send().await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => Err(format!("the collector answered {}", response.status())),
            Err(e) if e.is_timeout() => Err(format!(
                "the collector did not answer within {} s",
                TIMEOUT.as_secs()
            )),
            Err(e) => Err(format!("cannot reach the collector: {}", error_chain(&e))),
        };
        match outcome {
            Ok(()) => {
                if self.failing {
                    self.failing = false;
                    tracing::info!(target: "mcpd::telemetry", "telemetry exports to {} again", settings.otlp);
                }
                true
            }
            Err(why) => {
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(target: "mcpd::telemetry", "telemetry export to {url} failed, dropping what it carried: {why}");
                }
                false
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `base` with the signal's path appended (`/v1/traces`).
pub fn signal_url(base: &url::Url, signal: &str) -> url::Url {
    let mut url = base.clone();
    let path = format!("{}/{signal}", base.path().trim_end_matches('/'));
    url.set_path(&path);
    url
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "mcpd".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    }
}

pub(crate) fn text(key: &str, value: String) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value)),
        }),
        ..Default::default()
    }
}

fn span(s: Span) -> proto::Span {
    let attributes = s
        .attributes
        .into_iter()
        .map(|(k, v)| match v {
            Value::Text(t) => text(k, t),
            Value::Int(n) => KeyValue {
                key: k.into(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(n)),
                }),
                ..Default::default()
            },
        })
        .collect();
    let status = match s.error {
        Some(message) => proto::Status {
            message,
            code: proto::status::StatusCode::Error as i32,
        },
        None => proto::Status::default(),
    };
    proto::Span {
        trace_id: s.context.trace_id.to_vec(),
        span_id: s.context.span_id.to_vec(),
        trace_state: s.tracestate.unwrap_or_default(),
        parent_span_id: s.parent.map(|p| p.to_vec()).unwrap_or_default(),
        flags: u32::from(s.context.sampled),
        name: s.name,
        kind: match s.kind {
            SpanKind::Server => proto::span::SpanKind::Server,
            SpanKind::Client => proto::span::SpanKind::Client,
        } as i32,
        start_time_unix_nano: s.start,
        end_time_unix_nano: s.end,
        attributes,
        status: Some(status),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_paths_are_appended_to_the_base() {
        let url = |s: &str| url::Url::parse(s).expect("url");
        assert_eq!(
            signal_url(&url("http://127.0.0.1:4318"), "v1/traces").as_str(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            signal_url(&url("https://c.example/otlp/"), "v1/metrics").as_str(),
            "https://c.example/otlp/v1/metrics"
        );
    }
}
