//! Prometheus metrics: what `zmem stat` shows, in the OpenMetrics text
//! format, served over HTTP (`--metrics ADDR`) or printed once
//! (`zmem stat --prometheus`).
//!
//! Every number of a [`StatsReply`] becomes one metric, with a `device`
//! label, named by Prometheus's conventions: `zmem_` and the field's name
//! (zram's and zswap's names where the kernel has them), base units in
//! the name (`_bytes`, `_seconds`, `_ratio`), `_total` on counters. Which
//! fields count up and which go up and down is the table [`COUNTERS`]; a
//! boolean is a gauge of 0 or 1. The text is written by `prometheus-client`
//! from a registry made for each scrape, of constant metrics read from one
//! `StatsReply`, so a scrape sees one consistent snapshot and the server
//! keeps no second set of counters.
//!
//! The HTTP side is `tiny_http` on a TCP address or a unix socket. It is
//! off unless asked for, and it binds exactly the address given (the
//! operator's choice; the docs suggest loopback or a socket).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;

use crate::protocol::StatsReply;

/// Where `--metrics` serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricsAddr {
    Tcp(SocketAddr),
    /// A unix socket (`unix:PATH`, or a path starting with `/`).
    Unix(PathBuf),
}

impl std::str::FromStr for MetricsAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(MetricsAddr::Unix(PathBuf::from(p)));
        }
        if s.starts_with('/') {
            return Ok(MetricsAddr::Unix(PathBuf::from(s)));
        }
        s.parse()
            .map(MetricsAddr::Tcp)
            .map_err(|_| format!("`{s}` is neither HOST:PORT (127.0.0.1:9940, [::1]:9940) nor a unix socket (unix:/run/zmem/metrics, or an absolute path)"))
    }
}

/// As `--metrics` takes it (so it parses back).
impl std::fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricsAddr::Tcp(a) => write!(f, "{a}"),
            MetricsAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// Fields (flattened, `section_field`) that only count up.
pub const COUNTERS: &[&str] = &[
    "pages_compacted",
    "huge_pages_since",
    "recompressed_pages",
    "recompress_saved_bytes",
    "dict_trainings",
    "dict_installs",
    "dict_retired",
    "pool_limit_hit",
    "reject_compress_poor",
    "reject_compress_fail",
    "reject_alloc_fail",
    "decompress_fail",
    "reject_reclaim_fail",
    "written_back_pages",
    "evicted_pages",
    "bd_reads",
    "bd_writes",
    "backing_bytes_written",
    "backing_bytes_read",
    "backing_compaction_bytes_read",
    "backing_record_bytes_read",
    "backing_read_ops",
    "backing_read_busy_ns",
    "backing_prefetch_ops",
    "backing_scattered_reads",
    "backing_readahead_bytes",
    "backing_readahead_used_bytes",
    "backing_readahead_hits_1k",
    "backing_readahead_hits_4k",
    "backing_readahead_hits_8k",
    "backing_readahead_hits_far",
    "backing_readahead_slot_hits_same",
    "backing_readahead_slot_hits_next",
    "backing_readahead_slot_hits_1k",
    "backing_readahead_slot_hits_far",
    "backing_failed_writes",
    "backing_failed_reads",
    "backing_missing_reads",
    "backing_replica_reads",
    "backing_frees_failed",
    "promoted_pages",
    "writeback_fail",
    "dedup_hits",
    "dedup_collisions",
    "dedup_switches",
    "stores",
    "loads",
    "failed_reads",
    "failed_writes",
    "invalid_io",
    "notify_free",
    "free_fail",
    "warnings_suppressed",
    "origin_cache_hits",
    "origin_cache_misses",
    "origin_cache_refused",
    "origin_cache_stale",
    "origin_cache_not_admitted",
    "origin_origin_reads",
    "origin_origin_read_bytes",
    "origin_origin_writes",
    "origin_origin_write_bytes",
    "origin_origin_flushes",
    "origin_origin_trims",
    "origin_origin_zeroes",
    "origin_origin_errors",
    "origin_evicted_pages",
    "nbd_connections_total",
    "nbd_connections_dropped",
    "nbd_panics",
    "nbd_timeouts",
    "nbd_warnings_suppressed",
    "nbd_requests",
    "nbd_request_errors",
    "fuse_reads",
    "fuse_writes",
    "fuse_bytes_read",
    "fuse_bytes_written",
    "fuse_discards",
    "fuse_errors",
    "fuse_reads_handed_off",
    "fuse_resent",
    "recovery_restarts",
    "shared_budget_updates",
    "shared_budget_refused",
    "shared_budget_floor_ticks",
];

/// Gauges in bytes whose names do not say so.
const BYTE_GAUGES: &[&str] = &[
    "disksize",
    "mem_limit",
    "mem_used_max",
    "shared_budget_budget",
    "shared_budget_limit",
    "shared_budget_pool",
    "shared_budget_pool_peak",
    "shared_budget_peak_total",
    "shared_budget_limit_min",
];

/// One metric: its name without prefix, unit and `_total`, its unit, and
/// whether it counts up.
#[derive(Debug, PartialEq)]
struct Shape {
    name: String,
    unit: Option<Unit>,
    counter: bool,
    /// What the field's value is multiplied by (ns to seconds, % to ratio).
    scale: f64,
}

fn shape(field: &str) -> Shape {
    let counter = COUNTERS.contains(&field);
    // `_total` is the counter suffix the encoder adds; a field's own
    // (mem_used_total, connections_total) goes.
    let field = field.strip_suffix("_total").unwrap_or(field);
    let strip = |s: &str, token: &str| -> Option<String> {
        let parts: Vec<&str> = s.split('_').collect();
        let i = parts.iter().rposition(|p| *p == token)?;
        let rest: Vec<&str> = parts.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, p)| *p).collect();
        Some(rest.join("_"))
    };
    if let Some(n) = field.strip_suffix("_ns") {
        return Shape { name: n.to_string(), unit: Some(Unit::Seconds), counter, scale: 1e-9 };
    }
    if let Some(n) = field.strip_suffix("_percent") {
        return Shape { name: n.to_string(), unit: Some(Unit::Other("ratio".into())), counter, scale: 0.01 };
    }
    if let Some(n) = strip(field, "bytes") {
        return Shape { name: n, unit: Some(Unit::Bytes), counter, scale: 1.0 };
    }
    if field.ends_with("_size") || field == "mem_used" || BYTE_GAUGES.iter().any(|g| g.strip_suffix("_total").unwrap_or(g) == field) {
        return Shape { name: field.to_string(), unit: Some(Unit::Bytes), counter, scale: 1.0 };
    }
    Shape { name: field.to_string(), unit: None, counter, scale: 1.0 }
}

/// The metric a `zmem stat --json` field becomes (`stores` →
/// `zmem_stores_total`), and what its value is multiplied by: how a
/// scraper finds a field (the tests check every one).
pub fn metric_name(field: &str) -> (String, f64) {
    let s = shape(field);
    let unit = s.unit.as_ref().map(|u| format!("_{}", u.as_str())).unwrap_or_default();
    (format!("zmem_{}{unit}{}", s.name, if s.counter { "_total" } else { "" }), s.scale)
}

/// `reply`'s numbers as `(flattened field, value)`: the pool's counters
/// by their own names, each other section's with its name before them
/// (`nbd_requests`, `fuse_reads`), in a stable order.
fn fields(reply: &StatsReply) -> Vec<(String, f64)> {
    let mut out = vec![("disksize".to_string(), reply.disksize as f64), ("dedup".to_string(), reply.dedup as u8 as f64)];
    let mut section = |prefix: &str, v: serde_json::Result<Value>| flatten(prefix, &v.unwrap_or(Value::Null), &mut out);
    section("", serde_json::to_value(&reply.stats));
    if let Some(o) = &reply.origin {
        section("origin", serde_json::to_value(o.counters));
        section("origin_evicted_pages", serde_json::to_value(o.evicted_pages));
    }
    if let Some(n) = &reply.nbd {
        section("nbd", serde_json::to_value(n));
    }
    if let Some(f) = &reply.fuse {
        section("fuse", serde_json::to_value(f));
    }
    if let Some(b) = &reply.shared_budget {
        section("shared_budget", serde_json::to_value(b));
    }
    if let Some(r) = &reply.reclaim_safety {
        section("reclaim", serde_json::to_value(r));
    }
    if let Some(m) = &reply.server_memory {
        section("server_memory", serde_json::to_value(m));
    }
    if let Some(r) = &reply.recovery {
        section("recovery", serde_json::to_value(r));
    }
    out
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, f64)>) {
    match v {
        Value::Object(m) => {
            // Histograms are rendered as histograms ([`histograms`]).
            for (k, v) in m.iter().filter(|(k, _)| *k != "latency") {
                let name = if prefix.is_empty() { k.clone() } else { format!("{prefix}_{k}") };
                flatten(&name, v, out);
            }
        }
        Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                out.push((prefix.to_string(), x));
            }
        }
        Value::Bool(b) => out.push((prefix.to_string(), if *b { 1.0 } else { 0.0 })),
        _ => {}
    }
}

/// A histogram as read from a snapshot (prometheus-client's own
/// `Histogram` can only be fed observations one by one).
#[derive(Debug)]
struct ConstHistogram {
    /// (upper bound in seconds, count in that bucket); the last bound is
    /// `f64::MAX`, which the encoder writes as `+Inf`.
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

impl prometheus_client::metrics::TypedMetric for ConstHistogram {
    const TYPE: prometheus_client::metrics::MetricType = prometheus_client::metrics::MetricType::Histogram;
}

impl prometheus_client::encoding::EncodeMetric for ConstHistogram {
    fn encode(&self, mut encoder: prometheus_client::encoding::MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Histogram
    }
}

impl ConstHistogram {
    fn of(l: &zmem_core::Latencies) -> Option<ConstHistogram> {
        if l.counts.len() != l.bounds_ns.len() + 1 {
            return None;
        }
        let bounds = l.bounds_ns.iter().map(|&b| b as f64 * 1e-9).chain(std::iter::once(f64::MAX));
        Some(ConstHistogram { buckets: bounds.zip(l.counts.iter().copied()).collect(), sum: l.sum_ns as f64 * 1e-9, count: l.count() })
    }
}

/// The request-duration histograms of `reply`'s frontends.
fn histograms(reply: &StatsReply) -> Vec<(&'static str, ConstHistogram)> {
    let mut out = Vec::new();
    if let Some(h) = reply.nbd.as_ref().and_then(|n| ConstHistogram::of(&n.latency)) {
        out.push(("nbd_request_duration", h));
    }
    if let Some(h) = reply.fuse.as_ref().and_then(|f| ConstHistogram::of(&f.latency)) {
        out.push(("fuse_request_duration", h));
    }
    out
}

/// The OpenMetrics text of `reply`, labelled `device="DEVICE"`.
pub fn render(reply: &StatsReply, device: &str) -> String {
    let mut root = Registry::with_prefix("zmem");
    let reg = root.sub_registry_with_label((Cow::Borrowed("device"), Cow::Owned(device.to_string())));
    for (field, value) in fields(reply) {
        let s = shape(&field);
        let help = format!("zmem stat's {field}");
        let x = value * s.scale;
        let integral = s.scale == 1.0 && value >= 0.0 && value.fract() == 0.0;
        match (s.counter, integral, s.unit) {
            (true, true, Some(u)) => reg.register_with_unit(s.name, help, u, ConstCounter::new(x as u64)),
            (true, true, None) => reg.register(s.name, help, ConstCounter::new(x as u64)),
            (true, false, Some(u)) => reg.register_with_unit(s.name, help, u, ConstCounter::new(x)),
            (true, false, None) => reg.register(s.name, help, ConstCounter::new(x)),
            (false, true, Some(u)) => reg.register_with_unit(s.name, help, u, ConstGauge::new(x as i64)),
            (false, true, None) => reg.register(s.name, help, ConstGauge::new(x as i64)),
            (false, false, Some(u)) => reg.register_with_unit(s.name, help, u, ConstGauge::new(x)),
            (false, false, None) => reg.register(s.name, help, ConstGauge::new(x)),
        }
    }
    for (name, h) in histograms(reply) {
        reg.register_with_unit(name, "how long requests took to run (the server's share)", Unit::Seconds, h);
    }
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &root).is_err() {
        text = "# EOF\n".into();
    }
    text
}

/// Why the metrics endpoint could not be served.
#[derive(Debug, thiserror::Error)]
#[error("serving metrics on {addr}: {why}")]
pub struct MetricsError {
    pub addr: String,
    pub why: String,
}

/// The endpoint, bound: `serve` answers it until `stop`.
pub struct MetricsServer {
    server: tiny_http::Server,
    addr: MetricsAddr,
}

impl MetricsServer {
    /// Bind `addr` (a unix socket is made mode 0600 through the process's
    /// umask, a stale one replaced).
    pub fn bind(addr: &MetricsAddr) -> Result<MetricsServer, MetricsError> {
        let err = |why: String| MetricsError { addr: addr.to_string(), why };
        let server = match addr {
            MetricsAddr::Tcp(a) => tiny_http::Server::http(a).map_err(|e| err(e.to_string()))?,
            MetricsAddr::Unix(p) => {
                if std::fs::symlink_metadata(p).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())) {
                    let _ = std::fs::remove_file(p);
                }
                tiny_http::Server::http_unix(p).map_err(|e| err(e.to_string()))?
            }
        };
        Ok(MetricsServer { server, addr: addr.clone() })
    }

    /// The TCP address it listens on (with the port the kernel chose for 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.server_addr().to_ip()
    }

    /// Answer `GET /metrics` with `text()` until `stop` is set; anything
    /// else gets 404 (405 for another method).
    pub fn serve(&self, text: impl Fn() -> String, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let req = match self.server.recv_timeout(Duration::from_millis(200)) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("zmem: metrics endpoint {}: {e}", self.addr);
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            let path = req.url().split('?').next().unwrap_or("");
            let resp = match (req.method(), path) {
                (tiny_http::Method::Get, "/metrics") => {
                    let ct = "application/openmetrics-text; version=1.0.0; charset=utf-8";
                    let mut r = tiny_http::Response::from_string(text());
                    if let Ok(h) = tiny_http::Header::from_bytes("Content-Type", ct) {
                        r.add_header(h);
                    }
                    r
                }
                (tiny_http::Method::Get, _) => tiny_http::Response::from_string("zmem serves /metrics\n").with_status_code(404),
                _ => tiny_http::Response::from_string("GET /metrics\n").with_status_code(405),
            };
            // A client that went away is its own problem.
            let _ = req.respond(resp);
        }
        if let MetricsAddr::Unix(p) = &self.addr {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        let s = |f: &str| metric_name(f).0;
        assert_eq!(s("orig_data_size"), "zmem_orig_data_size_bytes");
        assert_eq!(s("mem_used_total"), "zmem_mem_used_bytes");
        assert_eq!(s("stores"), "zmem_stores_total");
        assert_eq!(s("backing_bytes_read"), "zmem_backing_read_bytes_total");
        assert_eq!(s("backing_read_p99_ns"), "zmem_backing_read_p99_seconds");
        assert_eq!(s("accept_threshold_percent"), "zmem_accept_threshold_ratio");
        assert_eq!(s("fuse_bytes_written"), "zmem_fuse_written_bytes_total");
        assert_eq!(s("nbd_connections_active"), "zmem_nbd_connections_active");
        assert_eq!(s("disksize"), "zmem_disksize_bytes");
        assert_eq!(s("nbd_connections_total"), "zmem_nbd_connections_total");
        assert_eq!(s("shared_budget_peak_total"), "zmem_shared_budget_peak_bytes");
    }

    #[test]
    fn every_counter_is_a_field_of_some_reply() {
        let mut r = StatsReply {
            origin: Some(Default::default()),
            nbd: Some(Default::default()),
            fuse: Some(Default::default()),
            shared_budget: Some(Default::default()),
            server_memory: Some(Default::default()),
            recovery: Some(Default::default()),
            ..StatsReply::default()
        };
        r.reclaim_safety = Some(crate::reclaim::ReclaimSafety { mlockall: true, malloc_tuned: false, io_flusher: None, oom_score_adj: "-1000".into() });
        let names: Vec<String> = fields(&r).into_iter().map(|(n, _)| n).collect();
        for c in COUNTERS.iter().chain(BYTE_GAUGES) {
            assert!(names.iter().any(|n| n == c), "{c} names no field of StatsReply");
        }
        let text = render(&r, "zmem0");
        assert!(text.ends_with("# EOF\n"), "{text}");
        // One family per name: no field lands on another's name.
        let mut families: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
        let n = families.len();
        families.sort_unstable();
        families.dedup();
        assert_eq!(families.len(), n, "a metric name appears twice");
        assert!(text.contains("zmem_stores_total{device=\"zmem0\"} 0"), "{text}");
        assert!(text.contains("zmem_server_memory_rss_anon_bytes{device=\"zmem0\"} 0"), "{text}");
    }

    #[test]
    fn addresses() {
        assert_eq!("127.0.0.1:9940".parse::<MetricsAddr>().unwrap(), MetricsAddr::Tcp("127.0.0.1:9940".parse().unwrap()));
        assert_eq!("unix:/run/m.sock".parse::<MetricsAddr>().unwrap(), MetricsAddr::Unix("/run/m.sock".into()));
        assert_eq!("/run/m.sock".parse::<MetricsAddr>().unwrap(), MetricsAddr::Unix("/run/m.sock".into()));
        assert!("localhost".parse::<MetricsAddr>().unwrap_err().contains("neither"));
        for a in ["127.0.0.1:9940", "[::1]:9940", "unix:/run/m.sock"] {
            assert_eq!(a.parse::<MetricsAddr>().unwrap().to_string(), a, "round trip");
        }
    }
}
