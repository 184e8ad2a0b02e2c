//! `zmem stat`: what a running `zmem serve` holds, like `zramctl`.
//!
//! Asks the server's control socket for `stats` (one JSON line) and prints
//! a table: export, algorithm, disk size, data (uncompressed), compressed,
//! total memory used, ratio (data / total), same-filled, deduplicated and
//! huge pages, connections; then zram's `mm_stat` and `io_stat` lines.

use std::path::PathBuf;

use zmem_server::protocol::{self, StatsReply};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The server's control socket [default: as `zmem serve`].
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Print the server's JSON instead of a table.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print the counters once as Prometheus metrics (what --metrics
    /// serves) instead of a table.
    #[arg(long)]
    pub prometheus: bool,
}

use zmem_host::human_size as human;

/// The table (header, row) and the mm_stat line for a stats reply, then
/// one line for each part the server has.
pub fn render(v: &StatsReply) -> String {
    let mut out = table(v);
    out += &format!("mm_stat: {}\nio_stat: {}\n", v.mm_stat, v.io_stat);
    for line in [origin_lines(v), fuse_line(v), pool_lines(v), writeback_lines(v)].into_iter().flatten() {
        out += &line;
    }
    out
}

/// The zramctl-like header and row.
fn table(v: &StatsReply) -> String {
    let st = &v.stats;
    let name = v.nbd.as_ref().map_or("", |n| n.export.as_str());
    let name = if name.is_empty() { "\"\"".to_string() } else { name.to_string() };
    let ratio = if st.mem_used_total == 0 { "-".to_string() } else { format!("{:.2}", st.orig_data_size as f64 / st.mem_used_total as f64) };
    let cols = [
        ("EXPORT", name),
        ("ALGORITHM", v.algorithm.clone()),
        ("DISKSIZE", human(v.disksize)),
        ("DATA", human(st.orig_data_size)),
        ("COMPR", human(st.compr_data_size)),
        ("TOTAL", human(st.mem_used_total)),
        ("RATIO", ratio),
        ("SAME", st.same_pages.to_string()),
        ("DUP", st.dup_pages.to_string()),
        ("HUGE", st.huge_pages.to_string()),
        ("CONNS", v.nbd.as_ref().map_or(0, |n| n.connections.active).to_string()),
    ];
    let mut head = String::new();
    let mut row = String::new();
    for (i, (h, val)) in cols.iter().enumerate() {
        let w = h.len().max(val.len());
        let sep = if i + 1 == cols.len() { "" } else { " " };
        if i == 0 {
            head += &format!("{h:<w$}{sep}");
            row += &format!("{val:<w$}{sep}");
        } else {
            head += &format!("{h:>w$}{sep}");
            row += &format!("{val:>w$}{sep}");
        }
    }
    format!("{head}\n{row}\n")
}

/// A caching device's `cache:` and `origin:` lines.
fn origin_lines(v: &StatsReply) -> Option<String> {
    let o = v.origin.as_ref()?;
    let c = &o.counters;
    let looked = c.cache_hits + c.cache_misses;
    Some(format!(
        "cache: {} hits, {} misses ({}), {} not kept (compress too poorly), {} not admitted (pool full), {} stale fetches dropped, {} pages dropped for room
origin: {}: {} reads ({}), {} writes ({}), {} flushes, {} trims, {} zeroings, {} errors
",
        c.cache_hits,
        c.cache_misses,
        if looked == 0 { "no reads yet".to_string() } else { format!("hit rate {:.1}%", 100.0 * c.cache_hits as f64 / looked as f64) },
        c.cache_refused,
        c.cache_not_admitted,
        c.cache_stale,
        o.evicted_pages,
        o.origin,
        c.origin_reads,
        human(c.origin_read_bytes),
        c.origin_writes,
        human(c.origin_write_bytes),
        c.origin_flushes,
        c.origin_trims,
        c.origin_zeroes,
        c.origin_errors,
    ))
}

/// The FUSE file's `fuse:` line.
fn fuse_line(v: &StatsReply) -> Option<String> {
    let f = v.fuse.as_ref()?;
    Some(format!(
        "fuse: {} reads ({}), {} writes ({}), {} discards, {} errors{}\n",
        f.reads,
        human(f.bytes_read),
        f.writes,
        human(f.bytes_written),
        f.discards,
        f.errors,
        if f.uring_requests > 0 { format!("; {} requests over io_uring", f.uring_requests) } else { String::new() }
    ))
}

/// The pool's optional parts: recompression, dedup, dictionaries, failed
/// frees, max_pool.
fn pool_lines(v: &StatsReply) -> Option<String> {
    let st = &v.stats;
    let mut out = String::new();
    if st.recompressed_pages + st.recompress_marked > 0 {
        out += &format!(
            "recompress: {} pages rewritten smaller, {} saved, {} beyond it (marked)\n",
            st.recompressed_pages,
            human(st.recompress_saved_bytes),
            st.recompress_marked
        );
    }
    if v.dedup {
        out += &format!(
            "dedup: {} ({} switches), dup_data_size {}, meta_data_size {}\n",
            if st.dedup_full { "full" } else { "sampling 1/32 (twins did not pay for records)" },
            st.dedup_switches,
            human(st.dup_data_size),
            human(st.meta_data_size)
        );
    }
    if st.dict_installs + st.dict_count > 0 {
        out += &format!(
            "dict: id {} on {} pages, {} dictionaries alive holding {} (with the sample ring), {} trained, {} installed, {} freed\n",
            st.dict_id,
            st.dict_pages,
            st.dict_count,
            human(st.dict_bytes),
            st.dict_trainings,
            st.dict_installs,
            st.dict_retired
        );
    }
    if st.free_fail > 0 {
        out += &format!("free_fail: {} (frees that failed: a bug, see the server's log)\n", st.free_fail);
    }
    if st.max_pool_bytes > 0 {
        out += &format!(
            "max_pool: {} used of {} (pages and tables; accept below {}%), pool_limit_hit {}, reject_reclaim_fail {}\n",
            human(st.max_pool_used_bytes),
            human(st.max_pool_bytes),
            st.accept_threshold_percent,
            st.pool_limit_hit,
            st.reject_reclaim_fail
        );
    }
    (!out.is_empty()).then_some(out)
}

/// zram's `bd_stat` and the writeback tier's lines, for a server with a
/// backing file (or one that has written back).
fn writeback_lines(v: &StatsReply) -> Option<String> {
    let st = &v.stats;
    (st.bd_writes > 0 || v.backing.is_some()).then(|| {
        format!(
            "bd_stat: {} {} {}\nwriteback: {} pages written back, {} written, {} read in {} reads, file {} ({} live), {} pages brought back\nexclusive loads: {} now, {} loaded pages queued at the cold end\n",
            st.bd_count,
            st.bd_reads,
            st.bd_writes,
            st.written_back_pages,
            human(st.backing_bytes_written),
            human(st.backing_bytes_read),
            st.backing_read_ops,
            human(st.backing_file_bytes),
            human(st.backing_live_bytes),
            st.promoted_pages,
            if st.exclusive_loads { "on" } else { "off" },
            st.cold_queued_pages
        ) + &remote_lines(v)
    })
}

/// The remote tier's line: where, read latency, queue depth, failures.
fn remote_lines(v: &StatsReply) -> String {
    let st = &v.stats;
    let Some(to) = v.backing.as_deref().filter(|b| b.starts_with("redis://")) else { return String::new() };
    let us = |ns: u64| format!("{:.0} µs", ns as f64 / 1000.0);
    format!(
        "remote: {to}: {} pages there; read p50 {} p99 {}; {} batches in flight, {} frees pending\nremote failures: {} batches kept in RAM, {} reads failed, {} found no record, {} frees given up\n",
        st.bd_count,
        us(st.backing_read_p50_ns),
        us(st.backing_read_p99_ns),
        st.backing_in_flight,
        st.backing_frees_pending,
        st.backing_failed_writes,
        st.backing_failed_reads,
        st.backing_missing_reads,
        st.backing_frees_failed
    )
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let path = a.control.unwrap_or_else(crate::serve::default_control_path);
    let v = protocol::stats(&path)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if a.prometheus {
        print!("{}", zmem_server::metrics::render(&v, &v.device));
    } else {
        print!("{}", render(&v));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_row() {
        let mut v = StatsReply { algorithm: "lz4".into(), disksize: 1 << 30, mm_stat: "1 2 3".into(), io_stat: "0 1 2 3".into(), ..Default::default() };
        v.nbd =
            Some(zmem_server::protocol::NbdReply { connections: zmem_server::protocol::Connections { active: 2, ..Default::default() }, ..Default::default() });
        (v.stats.orig_data_size, v.stats.compr_data_size, v.stats.mem_used_total, v.stats.same_pages) = (8192, 100, 4096, 1);
        let out = render(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("EXPORT"));
        assert!(lines[1].contains("1G") && lines[1].contains("2.00") && lines[1].contains("lz4"));
        assert_eq!(lines[2], "mm_stat: 1 2 3");
        assert_eq!(lines[3], "io_stat: 0 1 2 3");
    }
}
