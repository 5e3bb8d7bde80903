//! `--http`'s /metrics: the run's events counted in a Prometheus registry, every series
//! labelled with the lock, so that the runs of one fleet (each its own target) sum by lock.
//!
//! Every label value a family can take is created at zero up front: a counter that is only
//! ever absent or positive makes `rate()` miss its first increase, and a dashboard would not
//! know which results exist.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::{Event, Observer};

/// The two expositions: OpenMetrics (what prometheus-client writes, and what Prometheus asks
/// for in its Accept header) and Prometheus' older text format (for anything else: curl,
/// `promtool check metrics`, which reads only that one and takes an OpenMetrics counter's
/// HELP, which names the family without `_total`, for a missing one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Text,
}

impl Format {
    /// The format a scraper asks for in its Accept header.
    pub fn accepted(accept: Option<&str>) -> Self {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The store requests `TimedStore` times (the `operation` label).
pub const OPERATIONS: [&str; 7] = ["acquire", "renew", "release", "status", "list", "revoke", "abandon"];
const ATTEMPTS: [&str; 3] = ["won", "held", "failed"];
const RENEWALS: [&str; 5] = ["renewed", "too_late", "lost", "failed", "timed_out"];
const CHILD_ENDS: [&str; 5] = ["exited", "interrupted", "lease_lost", "lease_expired", "max_runtime"];

/// From a fast local store (SQLite, ~1 ms) to a request the elector gives up on (seconds).
const BUCKETS: [f64; 13] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

type Label = [(&'static str, &'static str); 1];

fn request_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

pub struct Metrics {
    registry: Registry,
    leader: Gauge,
    fencing_token: Gauge,
    transitions: Counter,
    attempts: Family<Label, Counter>,
    renewals: Family<Label, Counter>,
    requests: Family<Label, Histogram, fn() -> Histogram>,
    stop_signal_in: Gauge<f64, AtomicU64>,
    child_starts: Counter,
    child_ends: Family<Label, Counter>,
    /// Whether this run leads, so that an end of leadership reported twice (stepping down,
    /// then the release) counts once.
    leading: AtomicBool,
    /// When the child gets its stop signal unless a renewal moves it (CLOCK_BOOTTIME), while
    /// leading.
    stop_at: Mutex<Option<Duration>>,
}

impl Metrics {
    pub fn new(lock: &str) -> Self {
        let labels = [("lock".into(), lock.to_string().into())];
        let mut registry = Registry::with_prefix_and_labels("leaderrun", labels.into_iter());
        let metrics = Self {
            registry: Registry::default(),
            leader: Gauge::default(),
            fencing_token: Gauge::default(),
            transitions: Counter::default(),
            attempts: Family::default(),
            renewals: Family::default(),
            requests: Family::new_with_constructor(request_histogram),
            stop_signal_in: Gauge::default(),
            child_starts: Counter::default(),
            child_ends: Family::default(),
            leading: AtomicBool::new(false),
            stop_at: Mutex::new(None),
        };
        registry.register("leader", "1 while this run holds the lease, else 0", metrics.leader.clone());
        registry.register(
            "fencing_token",
            "The fencing token of the lease this run holds (0 while it does not lead)",
            metrics.fencing_token.clone(),
        );
        registry.register(
            "leadership_transitions",
            "Times this run was elected or stopped leading",
            metrics.transitions.clone(),
        );
        registry.register(
            "acquire_attempts",
            "Acquire requests by result: won, held (by another) or failed (no answer, or an error)",
            metrics.attempts.clone(),
        );
        registry.register("renewals", "Renewal requests by result", metrics.renewals.clone());
        registry.register_with_unit(
            "store_request_duration",
            "How long store requests took, answered or not, by operation",
            Unit::Seconds,
            metrics.requests.clone(),
        );
        registry.register_with_unit(
            "stop_signal_in",
            "Time left before the child gets its stop signal unless a renewal moves it (0 while not leading)",
            Unit::Seconds,
            metrics.stop_signal_in.clone(),
        );
        registry.register("child_starts", "Times the child was started", metrics.child_starts.clone());
        registry.register("child_ends", "Times the child ended, by reason", metrics.child_ends.clone());
        for result in ATTEMPTS {
            drop(metrics.attempts.get_or_create(&[("result", result)]));
        }
        for result in RENEWALS {
            drop(metrics.renewals.get_or_create(&[("result", result)]));
        }
        for reason in CHILD_ENDS {
            drop(metrics.child_ends.get_or_create(&[("reason", reason)]));
        }
        for operation in OPERATIONS {
            drop(metrics.requests.get_or_create(&[("operation", operation)]));
        }
        Self { registry, ..metrics }
    }

    /// The exposition, with the stop signal's countdown as of `now` (CLOCK_BOOTTIME).
    pub fn encode(&self, now: Duration, format: Format) -> String {
        let left = self.stop_at().map_or(0.0, |at| at.saturating_sub(now).as_secs_f64());
        self.stop_signal_in.set(left);
        let mut out = String::new();
        // Writing to a String cannot fail, nor can the registry's own encoders.
        let _ = text::encode(&mut out, &self.registry);
        match format {
            Format::OpenMetrics => out,
            Format::Text => to_text_format(&out),
        }
    }

    fn stop_at(&self) -> Option<Duration> {
        *self.stop_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_stop_at(&self, at: Option<Duration>) {
        *self.stop_at.lock().unwrap_or_else(|p| p.into_inner()) = at;
    }

    fn leadership_ends(&self) {
        self.set_stop_at(None);
        if self.leading.swap(false, Ordering::Relaxed) {
            self.transitions.inc();
            self.leader.set(0);
            self.fencing_token.set(0);
        }
    }
}

/// OpenMetrics as prometheus-client writes it, in Prometheus' text format 0.0.4: a counter's
/// HELP and TYPE name its `_total` series, and there is no UNIT or EOF line. Samples, label
/// escaping and histograms are the same in both for the families here.
fn to_text_format(open_metrics: &str) -> String {
    let mut out = String::with_capacity(open_metrics.len());
    let mut help: Option<&str> = None;
    for line in open_metrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let name = if kind == "counter" { format!("{name}_total") } else { name.to_string() };
            if let Some(text) = help.take() {
                let text = text.split_once(' ').map_or("", |(_, text)| text);
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

impl Observer for Metrics {
    fn event(&self, event: &Event<'_>) {
        match *event {
            Event::Attempted(attempt) => {
                self.attempts.get_or_create(&[("result", attempt.label())]).inc();
            }
            Event::Elected { lease, stop_at, .. } => {
                if !self.leading.swap(true, Ordering::Relaxed) {
                    self.transitions.inc();
                }
                self.leader.set(1);
                self.fencing_token.set(i64::try_from(lease.token).unwrap_or(i64::MAX));
                self.set_stop_at(Some(stop_at));
            }
            Event::ChildStarted => {
                self.child_starts.inc();
            }
            Event::Renewal(renewal) => {
                self.renewals.get_or_create(&[("result", renewal.label())]).inc();
                if let super::Renewal::Renewed { stop_at } = renewal {
                    if self.leading.load(Ordering::Relaxed) {
                        self.set_stop_at(Some(stop_at));
                    }
                }
            }
            Event::SteppingDown | Event::Released => self.leadership_ends(),
            Event::ChildEnded { why, .. } => {
                self.child_ends.get_or_create(&[("reason", why.label())]).inc();
            }
            Event::StoreCall { operation, took, .. } => {
                self.requests.get_or_create(&[("operation", operation)]).observe(took.as_secs_f64());
            }
            Event::Campaigning { .. } | Event::Stopping => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{Attempt, ChildEnd, Renewal};
    use crate::payload::ChildExit;
    use crate::store::Lease;

    fn line<'a>(text: &'a str, series: &str) -> &'a str {
        text.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    }

    #[test]
    fn a_term_of_leadership_moves_the_gauges_and_counts_two_transitions() {
        let metrics = Metrics::new("nightly");
        let lease = Lease { lock: "nightly".into(), identity: "me".into(), token: 42 };
        metrics.event(&Event::Attempted(Attempt::Won));
        metrics.event(&Event::Elected { lease: &lease, slot: 0, stop_at: Duration::from_secs(100) });
        metrics.event(&Event::ChildStarted);
        metrics.event(&Event::StoreCall { operation: "renew", took: Duration::from_millis(3), ok: true });
        metrics.event(&Event::Renewal(Renewal::Renewed { stop_at: Duration::from_secs(110) }));

        let text = metrics.encode(Duration::from_secs(102), Format::OpenMetrics);
        assert_eq!(line(&text, "leaderrun_leader{"), r#"leaderrun_leader{lock="nightly"} 1"#);
        assert_eq!(line(&text, "leaderrun_fencing_token{"), r#"leaderrun_fencing_token{lock="nightly"} 42"#);
        assert_eq!(
            line(&text, "leaderrun_stop_signal_in_seconds{"),
            r#"leaderrun_stop_signal_in_seconds{lock="nightly"} 8.0"#
        );
        assert!(text.contains(r#"leaderrun_acquire_attempts_total{lock="nightly",result="won"} 1"#), "{text}");
        assert!(text.contains(r#"leaderrun_acquire_attempts_total{lock="nightly",result="failed"} 0"#), "{text}");
        assert!(text.contains(r#"leaderrun_renewals_total{lock="nightly",result="renewed"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"leaderrun_store_request_duration_seconds_bucket{lock="nightly",le="0.005",operation="renew"} 1"#
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));

        metrics.event(&Event::SteppingDown);
        metrics.event(&Event::ChildEnded { exit: ChildExit::Code(143), why: ChildEnd::LeaseLost });
        metrics.event(&Event::Released);
        let text = metrics.encode(Duration::from_secs(103), Format::OpenMetrics);
        assert_eq!(line(&text, "leaderrun_leader{"), r#"leaderrun_leader{lock="nightly"} 0"#);
        assert_eq!(line(&text, "leaderrun_fencing_token{"), r#"leaderrun_fencing_token{lock="nightly"} 0"#);
        assert_eq!(
            line(&text, "leaderrun_stop_signal_in_seconds{"),
            r#"leaderrun_stop_signal_in_seconds{lock="nightly"} 0.0"#
        );
        assert_eq!(
            line(&text, "leaderrun_leadership_transitions_total{"),
            r#"leaderrun_leadership_transitions_total{lock="nightly"} 2"#
        );
        assert!(text.contains(r#"leaderrun_child_ends_total{lock="nightly",reason="lease_lost"} 1"#), "{text}");
        assert!(text.contains(r#"leaderrun_child_starts_total{lock="nightly"} 1"#), "{text}");

        let text = metrics.encode(Duration::from_secs(103), Format::Text);
        assert!(text.contains("# HELP leaderrun_child_starts_total Times the child was started.\n"), "{text}");
        assert!(text.contains("# TYPE leaderrun_child_starts_total counter\n"), "{text}");
        assert!(text.contains("# TYPE leaderrun_leader gauge\nleaderrun_leader{"), "{text}");
        assert!(!text.contains("# UNIT") && !text.contains("# EOF"), "{text}");
        assert!(text.contains(r#"leaderrun_child_starts_total{lock="nightly"} 1"#), "{text}");
    }
}
