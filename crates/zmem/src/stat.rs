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
    #[arg(long, conflicts_with = "watch")]
    pub prometheus: bool,
    /// Redraw the table every SECS seconds (default 1) with rates per
    /// second, until interrupted; one line per interval when the output is
    /// not a terminal.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1", value_parser = parse_interval, conflicts_with = "json")]
    pub watch: Option<std::time::Duration>,
}

/// `--watch`'s interval: 0.1 to 3600 seconds.
fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number of seconds (1, 0.5)"))?;
    if !(0.1..=3600.0).contains(&secs) {
        return Err(format!("the interval must be between 0.1 and 3600 seconds, got {s}"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Rates between two replies `secs` apart: what `--watch` adds to the
/// table (stores, loads, pages written back and read back, cache hits
/// and misses, per second).
fn rates(prev: &StatsReply, now: &StatsReply, secs: f64) -> Vec<(&'static str, f64)> {
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs.max(1e-9);
    let (p, n) = (&prev.stats, &now.stats);
    let hits = |r: &StatsReply| r.origin.as_ref().map_or((0, 0), |o| (o.counters.cache_hits, o.counters.cache_misses));
    let (ph, pm) = hits(prev);
    let (nh, nm) = hits(now);
    vec![
        ("stores/s", per(p.stores, n.stores)),
        ("loads/s", per(p.loads, n.loads)),
        ("writeback/s", per(p.written_back_pages, n.written_back_pages)),
        ("readback/s", per(p.bd_reads, n.bd_reads)),
        ("hits/s", per(ph, nh)),
        ("misses/s", per(pm, nm)),
    ]
}

/// `--watch`: the table redrawn in place on a terminal, else one line
/// per interval (time, the rates, data and memory used).
fn watch(path: &std::path::Path, every: std::time::Duration) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stdout().is_terminal();
    let mut prev = protocol::stats(path)?;
    let mut at = std::time::Instant::now();
    let mut out = std::io::stdout().lock();
    if !tty {
        writeln!(
            out,
            "{:>8} {:>10} {:>10} {:>12} {:>11} {:>9} {:>10} {:>10} {:>10}",
            "TIME", "stores/s", "loads/s", "writeback/s", "readback/s", "hits/s", "misses/s", "DATA", "TOTAL"
        )?;
    }
    loop {
        std::thread::sleep(every);
        let now = protocol::stats(path)?;
        let secs = at.elapsed().as_secs_f64();
        at = std::time::Instant::now();
        let r = rates(&prev, &now, secs);
        let line = r.iter().map(|(k, v)| format!("{k} {v:.0}")).collect::<Vec<_>>().join("  ");
        let written = if tty {
            // Home, clear, redraw.
            write!(out, "\x1b[H\x1b[2J{}\n{line}\n", render(&now))
        } else {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() % 86400);
            let v: Vec<String> = r.iter().map(|(_, v)| format!("{v:.0}")).collect();
            writeln!(
                out,
                "{:02}:{:02}:{:02} {:>10} {:>10} {:>12} {:>11} {:>9} {:>10} {:>10} {:>10}",
                t / 3600,
                t / 60 % 60,
                t % 60,
                v[0],
                v[1],
                v[2],
                v[3],
                v[4],
                v[5],
                human(now.stats.orig_data_size),
                human(now.stats.mem_used_total)
            )
        };
        // A reader that went away (`| head`) ends the watch, not in error.
        if written.and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
        prev = now;
    }
}

use zmem_host::human_size as human;

/// The table (header, row) and the mm_stat line for a stats reply, then
/// one line for each part the server has.
pub fn render(v: &StatsReply) -> String {
    let mut out = table(v);
    out += &format!("mm_stat: {}\nio_stat: {}\n", v.mm_stat, v.io_stat);
    for line in [origin_lines(v), fuse_line(v), recovery_line(v), pool_lines(v), memory_line(v), writeback_lines(v)].into_iter().flatten() {
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

/// A swap server's `recovery:` line, once it is not the keeper's first.
fn recovery_line(v: &StatsReply) -> Option<String> {
    let r = v.recovery.as_ref().filter(|r| r.restarts > 0)?;
    Some(format!(
        "recovery: {} servers before this one; it took over in {:.0} ms: {} pages whole, {} unpublished objects freed, {} pages lost\n",
        r.restarts,
        r.took_ns as f64 / 1e6,
        r.pages,
        r.strays_freed,
        r.lost_pages
    ))
}

/// The FUSE file's `fuse:` line.
fn fuse_line(v: &StatsReply) -> Option<String> {
    let f = v.fuse.as_ref()?;
    Some(format!(
        "fuse: {} reads ({}), {} writes ({}), {} discards, {} errors{}{}\n",
        f.reads,
        human(f.bytes_read),
        f.writes,
        human(f.bytes_written),
        f.discards,
        f.errors,
        if f.reads_handed_off > 0 { format!("; {} reads on the read threads", f.reads_handed_off) } else { String::new() },
        if f.resent > 0 { format!("; {} requests sent again after a restart", f.resent) } else { String::new() }
    ))
}

/// The server process's `server:` line: its resident memory, and how
/// much of it is not the pool's (`mem_used_total`).
fn memory_line(v: &StatsReply) -> Option<String> {
    let m = v.server_memory.as_ref()?;
    Some(format!(
        "server: {} resident ({} anonymous, {} shared (the pool's arena), {} code and files; at most {}), {} of it beside the pool's {}; malloc holds {} free\n",
        human(m.rss()),
        human(m.rss_anon_bytes),
        human(m.rss_shmem_bytes),
        human(m.rss_file_bytes),
        human(m.rss_max_bytes),
        human(m.rss().saturating_sub(v.stats.mem_used_total)),
        human(v.stats.mem_used_total),
        human(m.malloc_free_bytes)
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
    if let (Some(share), true) = (st.pool_data_share(), st.max_pool_bytes > 0) {
        out += &format!("pool holds: {:.0}% compressed data, the rest allocator slack and tables\n", share * 100.0);
    }
    if st.first_out_of > 0 {
        out += &format!(
            "unmapped: {} of the {} pages in RAM at the last scan were in no page table; {} written back first\n",
            st.first_out_named, st.first_out_of, st.first_out_taken
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
            "bd_stat: {} {} {}\nwriteback: {} pages written back, {} written, {} read in {} reads ({} the records' bytes; {} a read), file {} ({} live), {} pages brought back\nread-ahead: {} read past the pages wanted, {} of it used ({}), floor {}; hits by slots past the pages read: {} in their block of 16, {} the next, {} within 1024, {} beyond\nexclusive loads: {} now, {} loaded pages queued at the cold end\ntables: {} of RAM for the written-back pages ({} a page)\n",
            st.bd_count,
            st.bd_reads,
            st.bd_writes,
            st.written_back_pages,
            human(st.backing_bytes_written),
            human(st.backing_bytes_read),
            st.backing_read_ops,
            st.backing_read_amplification().map_or("-".into(), |a| format!("{a:.2} x")),
            st.backing_read_cost_ns().map_or("-".into(), |ns| format!("{:.2} ms", ns as f64 / 1e6)),
            human(st.backing_file_bytes),
            human(st.backing_live_bytes),
            st.promoted_pages,
            human(st.backing_readahead_bytes),
            human(st.backing_readahead_used_bytes),
            st.readahead_used_share().map_or("-".into(), |u| format!("{:.0} %", u * 100.0)),
            human(st.backing_readahead_floor_bytes),
            st.backing_readahead_slot_hits_same,
            st.backing_readahead_slot_hits_next,
            st.backing_readahead_slot_hits_1k,
            st.backing_readahead_slot_hits_far,
            if st.exclusive_loads { "on" } else { "off" },
            st.cold_queued_pages,
            human(st.backed_table_bytes),
            st.table_bytes_per_backed_page().map_or("-".into(), |b| format!("{b:.1} B"))
        ) + &remote_lines(v)
    })
}

/// The remote tier's line: where, read latency, queue depth, failures.
fn remote_lines(v: &StatsReply) -> String {
    let st = &v.stats;
    let Some(to) = v.backing.as_deref().filter(|b| b.starts_with("redis://")) else { return String::new() };
    let us = |ns: u64| format!("{:.0} µs", ns as f64 / 1000.0);
    let waits = match st.backing_masters_short {
        0 => String::new(),
        n => format!("remote writeback waits: {n} master(s) have fewer replicas than --remote-replicas asks to acknowledge a batch\n"),
    };
    format!(
        "{waits}remote: {to}: {} pages there; read p50 {} p99 {}; {} batches in flight, {} frees pending; {} reads answered by a replica\nremote failures: {} batches kept in RAM, {} reads failed, {} found no record, {} frees given up\n",
        st.bd_count,
        us(st.backing_read_p50_ns),
        us(st.backing_read_p99_ns),
        st.backing_in_flight,
        st.backing_frees_pending,
        st.backing_replica_reads,
        st.backing_failed_writes,
        st.backing_failed_reads,
        st.backing_missing_reads,
        st.backing_frees_failed
    )
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let path = a.control.unwrap_or_else(crate::serve::default_control_path);
    if let Some(every) = a.watch {
        return watch(&path, every);
    }
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
    fn watch_rates_and_intervals() {
        let mut a = StatsReply::default();
        a.stats.stores = 100;
        a.stats.loads = 50;
        let mut b = a.clone();
        b.stats.stores = 300;
        b.stats.written_back_pages = 10;
        let r = rates(&a, &b, 2.0);
        assert_eq!(r[0], ("stores/s", 100.0));
        assert_eq!(r[1], ("loads/s", 0.0));
        assert_eq!(r[2], ("writeback/s", 5.0));
        // A counter that went back (a restarted server) is no negative rate.
        assert_eq!(rates(&b, &a, 1.0)[0].1, 0.0);
        assert_eq!(parse_interval("0.5").unwrap(), std::time::Duration::from_millis(500));
        for bad in ["0", "-1", "x", "3601", "NaN"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }

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
        assert!(!out.contains("server:"), "no server line without a report");
        v.server_memory = Some(zmem_server::memory::ServerMemory {
            rss_anon_bytes: 2 << 20,
            rss_file_bytes: 6 << 20,
            rss_shmem_bytes: 8 << 20,
            rss_max_bytes: 20 << 20,
            malloc_free_bytes: 1 << 20,
            ..Default::default()
        });
        v.stats.mem_used_total = 8 << 20;
        let out = render(&v);
        let line = out.lines().find(|l| l.starts_with("server:")).unwrap();
        assert_eq!(line, "server: 16M resident (2M anonymous, 8M shared (the pool's arena), 6M code and files; at most 20M), 8M of it beside the pool's 8M; malloc holds 1M free");
    }
}
