//! The histograms of the MCP semantic conventions and mcpd's own
//! counters, aggregated in place (cumulative) until an export reads them.
//! Bounded: [`MAX_SERIES`] attribute sets in all; a point of a set beyond
//! is counted dropped.

use foldhash::HashMap;

use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1 as proto;

/// Attribute sets kept across every metric.
pub const MAX_SERIES: usize = 4096;

/// The bucket bounds (seconds) the conventions give
/// `mcp.*.operation.duration`.
pub const BOUNDS: [f64; 14] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// A histogram of the conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Histogram {
    /// A host's request as mcpd served it.
    Server,
    /// mcpd's request to a server.
    Client,
}

impl Histogram {
    pub fn name(self) -> &'static str {
        match self {
            Histogram::Server => "mcp.server.operation.duration",
            Histogram::Client => "mcp.client.operation.duration",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Histogram::Server => {
                "The duration of the MCP request or notification as observed on the receiver from the time it was received until the result or ack is sent."
            }
            Histogram::Client => {
                "The duration of the MCP request or notification as observed on the sender from the time it was sent until the response or ack is received."
            }
        }
    }
}

/// mcpd's own counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Counter {
    /// A server running again after it failed (its unit was retrying or
    /// reconnecting).
    Restarts,
    /// A unit changed state.
    StateChanges,
    /// Notifications not sent to a host that was behind.
    DroppedNotifications,
}

impl Counter {
    pub fn name(self) -> &'static str {
        match self {
            Counter::Restarts => "mcpd.server.restarts",
            Counter::StateChanges => "mcpd.server.state_changes",
            Counter::DroppedNotifications => "mcpd.notifications.dropped",
        }
    }
}

type Attributes = Vec<(&'static str, String)>;

#[derive(Debug, Default, Clone)]
struct Buckets {
    counts: [u64; BOUNDS.len() + 1],
    sum: f64,
    count: u64,
    min: f64,
    max: f64,
}

/// The aggregation.
#[derive(Debug)]
pub struct Metrics {
    start: u64,
    histograms: HashMap<(Histogram, Attributes), Buckets>,
    counters: HashMap<(Counter, Attributes), u64>,
    /// Something changed since the last export.
    dirty: bool,
}

impl Metrics {
    pub fn new(start: u64) -> Self {
        Self {
            start,
            histograms: HashMap::default(),
            counters: HashMap::default(),
            dirty: false,
        }
    }

    fn full(&self) -> bool {
        self.histograms.len() + self.counters.len() >= MAX_SERIES
    }

    pub fn record(&mut self, metric: Histogram, seconds: f64, mut attributes: Attributes) {
        attributes.sort_unstable();
        let key = (metric, attributes);
        if !self.histograms.contains_key(&key) && self.full() {
            super::dropped(1);
            return;
        }
        let b = self.histograms.entry(key).or_default();
        let i = BOUNDS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(BOUNDS.len());
        b.counts[i] += 1;
        if b.count == 0 || seconds < b.min {
            b.min = seconds;
        }
        if b.count == 0 || seconds > b.max {
            b.max = seconds;
        }
        b.sum += seconds;
        b.count += 1;
        self.dirty = true;
    }

    pub fn add(&mut self, counter: Counter, mut attributes: Attributes) {
        attributes.sort_unstable();
        let key = (counter, attributes);
        if !self.counters.contains_key(&key) && self.full() {
            super::dropped(1);
            return;
        }
        *self.counters.entry(key).or_default() += 1;
        self.dirty = true;
    }

    /// Every series, cumulative since the pipeline started, if anything
    /// changed since the last time (then marked seen).
    pub fn take(&mut self, now: u64) -> Option<Vec<proto::Metric>> {
        if !self.dirty {
            return None;
        }
        self.dirty = false;
        let mut by_histogram: Vec<(Histogram, Vec<proto::HistogramDataPoint>)> = Vec::new();
        for ((metric, attributes), b) in &self.histograms {
            let point = proto::HistogramDataPoint {
                attributes: key_values(attributes),
                start_time_unix_nano: self.start,
                time_unix_nano: now,
                count: b.count,
                sum: Some(b.sum),
                bucket_counts: b.counts.to_vec(),
                explicit_bounds: BOUNDS.to_vec(),
                min: Some(b.min),
                max: Some(b.max),
                ..Default::default()
            };
            match by_histogram.iter_mut().find(|(m, _)| m == metric) {
                Some((_, points)) => points.push(point),
                None => by_histogram.push((*metric, vec![point])),
            }
        }
        let mut by_counter: Vec<(Counter, Vec<proto::NumberDataPoint>)> = Vec::new();
        for ((counter, attributes), n) in &self.counters {
            let point = proto::NumberDataPoint {
                attributes: key_values(attributes),
                start_time_unix_nano: self.start,
                time_unix_nano: now,
                value: Some(proto::number_data_point::Value::AsInt(
                    i64::try_from(*n).unwrap_or(i64::MAX),
                )),
                ..Default::default()
            };
            match by_counter.iter_mut().find(|(c, _)| c == counter) {
                Some((_, points)) => points.push(point),
                None => by_counter.push((*counter, vec![point])),
            }
        }
        let cumulative = proto::AggregationTemporality::Cumulative as i32;
        let mut out: Vec<proto::Metric> = by_histogram
            .into_iter()
            .map(|(metric, points)| proto::Metric {
                name: metric.name().into(),
                description: metric.description().into(),
                unit: "s".into(),
                data: Some(proto::metric::Data::Histogram(proto::Histogram {
                    data_points: points,
                    aggregation_temporality: cumulative,
                })),
                ..Default::default()
            })
            .collect();
        out.extend(
            by_counter
                .into_iter()
                .map(|(counter, points)| proto::Metric {
                    name: counter.name().into(),
                    unit: "{event}".into(),
                    data: Some(proto::metric::Data::Sum(proto::Sum {
                        data_points: points,
                        aggregation_temporality: cumulative,
                        is_monotonic: true,
                    })),
                    ..Default::default()
                }),
        );
        Some(out)
    }

    /// Points of the last export are to be sent again (it failed).
    pub fn again(&mut self) {
        self.dirty = true;
    }
}

pub(crate) fn key_values(attributes: &[(&'static str, String)]) -> Vec<KeyValue> {
    attributes
        .iter()
        .map(|(k, v)| super::export::text(k, v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fall_in_the_conventions_buckets_and_series_are_bounded() {
        let mut m = Metrics::new(1);
        m.record(
            Histogram::Server,
            0.004,
            vec![("mcp.method.name", "tools/call".into())],
        );
        m.record(
            Histogram::Server,
            0.5,
            vec![("mcp.method.name", "tools/call".into())],
        );
        m.record(
            Histogram::Server,
            999.0,
            vec![("mcp.method.name", "tools/call".into())],
        );
        let metrics = m.take(2).expect("changed");
        assert!(m.take(3).is_none(), "nothing new");
        assert_eq!(metrics.len(), 1);
        let Some(proto::metric::Data::Histogram(h)) = &metrics[0].data else {
            panic!("a histogram");
        };
        let p = &h.data_points[0];
        assert_eq!(p.count, 3);
        assert_eq!(p.bucket_counts[0], 1);
        assert_eq!(p.bucket_counts[5], 1, "0.5 s is in the bucket up to 0.5");
        assert_eq!(p.bucket_counts[BOUNDS.len()], 1);
        assert_eq!((p.min, p.max), (Some(0.004), Some(999.0)));
        for i in 0..MAX_SERIES + 10 {
            m.add(Counter::Restarts, vec![("mcpd.unit", i.to_string())]);
        }
        assert_eq!(m.counters.len() + m.histograms.len(), MAX_SERIES);
    }
}
