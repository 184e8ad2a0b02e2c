//! `zmem stat`: what a running `zmem serve` holds, like `zramctl`.
//!
//! Asks the server's control socket for `stats` (one JSON line) and prints
//! a table: export, algorithm, disk size, data (uncompressed), compressed,
//! total memory used, ratio (data / total), same-filled, deduplicated and
//! huge pages, connections; then zram's `mm_stat` and `io_stat` lines.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The server's control socket [default: as `zmem serve`].
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Ask the control socket at `path` for its stats.
pub fn query(path: &std::path::Path) -> anyhow::Result<Value> {
    request(path, "stats")
}

/// Send one command line to the control socket at `path`; return its JSON reply.
pub fn request(path: &std::path::Path, cmd: &str) -> anyhow::Result<Value> {
    let mut s = UnixStream::connect(path).with_context(|| format!("connecting to {} (is `zmem serve` running?)", path.display()))?;
    // Writeback of a large pool can take a while.
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("{cmd}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    let v: Value = serde_json::from_str(line.trim()).context("parsing the server's reply")?;
    if let Some(e) = v.get("error") {
        bail!("server: {e}");
    }
    Ok(v)
}

/// Sizes as zramctl prints them: 0B, 512B, 4K, 1.5M, 2G.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || (v - v.round()).abs() < 0.05 {
        format!("{}{}", v.round() as u64, UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// The table (header, row) and the mm_stat line for a stats reply.
pub fn render(v: &Value) -> String {
    let st = &v["stats"];
    let g = |k: &str| st[k].as_u64().unwrap_or(0);
    let name = v["export"].as_str().unwrap_or("");
    let name = if name.is_empty() { "\"\"".to_string() } else { name.to_string() };
    let ratio = if g("mem_used_total") == 0 { "-".to_string() } else { format!("{:.2}", g("orig_data_size") as f64 / g("mem_used_total") as f64) };
    let cols = [
        ("EXPORT", name),
        ("ALGORITHM", v["algorithm"].as_str().unwrap_or("?").to_string()),
        ("DISKSIZE", human(v["disksize"].as_u64().unwrap_or(0))),
        ("DATA", human(g("orig_data_size"))),
        ("COMPR", human(g("compr_data_size"))),
        ("TOTAL", human(g("mem_used_total"))),
        ("RATIO", ratio),
        ("SAME", g("same_pages").to_string()),
        ("DUP", g("dup_pages").to_string()),
        ("HUGE", g("huge_pages").to_string()),
        ("CONNS", v["connections"]["active"].as_u64().unwrap_or(0).to_string()),
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
    let mut out = format!("{head}\n{row}\nmm_stat: {}\n", v["mm_stat"].as_str().unwrap_or(""));
    if let Some(io) = v["io_stat"].as_str() {
        out += &format!("io_stat: {io}\n");
    }
    if let Some(o) = v.get("origin").filter(|o| o.is_object()) {
        let n = |k: &str| o[k].as_u64().unwrap_or(0);
        let looked = n("cache_hits") + n("cache_misses");
        out += &format!(
            "cache: {} hits, {} misses ({}), {} not kept (compress too poorly), {} not admitted (pool full), {} stale fetches dropped, {} pages dropped for room
origin: {}: {} reads ({}), {} writes ({}), {} flushes, {} trims, {} zeroings, {} errors
",
            n("cache_hits"),
            n("cache_misses"),
            if looked == 0 { "no reads yet".to_string() } else { format!("hit rate {:.1}%", 100.0 * n("cache_hits") as f64 / looked as f64) },
            n("cache_refused"),
            n("cache_not_admitted"),
            n("cache_stale"),
            n("evicted_pages"),
            o["origin"].as_str().unwrap_or("?"),
            n("origin_reads"),
            human(n("origin_read_bytes")),
            n("origin_writes"),
            human(n("origin_write_bytes")),
            n("origin_flushes"),
            n("origin_trims"),
            n("origin_zeroes"),
            n("origin_errors"),
        );
    }
    if let Some(f) = v.get("fuse").filter(|f| f.is_object()) {
        let n = |k: &str| f[k].as_u64().unwrap_or(0);
        out += &format!(
            "fuse: {} reads ({}), {} writes ({}), {} discards, {} errors{}\n",
            n("reads"),
            human(n("bytes_read")),
            n("writes"),
            human(n("bytes_written")),
            n("discards"),
            n("errors"),
            if n("uring_requests") > 0 { format!("; {} requests over io_uring", n("uring_requests")) } else { String::new() }
        );
    }
    if g("recompressed_pages") + g("recompress_marked") > 0 {
        out += &format!(
            "recompress: {} pages rewritten smaller, {} saved, {} beyond it (marked)\n",
            g("recompressed_pages"),
            human(g("recompress_saved_bytes")),
            g("recompress_marked")
        );
    }
    if v["dedup"].as_bool() == Some(true) {
        out += &format!(
            "dedup: {} ({} switches), dup_data_size {}, meta_data_size {}\n",
            if st["dedup_full"].as_bool() == Some(true) { "full" } else { "sampling 1/32 (twins did not pay for records)" },
            g("dedup_switches"),
            human(g("dup_data_size")),
            human(g("meta_data_size"))
        );
    }
    if g("dict_installs") + g("dict_count") > 0 {
        out += &format!(
            "dict: id {} on {} pages, {} dictionaries alive holding {} (with the sample ring), {} trained, {} installed, {} freed\n",
            g("dict_id"),
            g("dict_pages"),
            g("dict_count"),
            human(g("dict_bytes")),
            g("dict_trainings"),
            g("dict_installs"),
            g("dict_retired")
        );
    }
    if g("free_fail") > 0 {
        out += &format!("free_fail: {} (frees that failed: a bug, see the server's log)\n", g("free_fail"));
    }
    if g("max_pool_bytes") > 0 {
        out += &format!(
            "max_pool: {} used of {} (pages and tables; accept below {}%), pool_limit_hit {}, reject_reclaim_fail {}\n",
            human(g("max_pool_used_bytes")),
            human(g("max_pool_bytes")),
            g("accept_threshold_percent"),
            g("pool_limit_hit"),
            g("reject_reclaim_fail")
        );
    }
    if st.get("backing_file_bytes").is_some() && (g("bd_writes") > 0 || v["backing"].is_string()) {
        out += &format!(
            "bd_stat: {} {} {}\nwriteback: {} pages written back, {} written, {} read in {} reads, file {} ({} live), {} pages brought back\nexclusive loads: {} now, {} loaded pages queued at the cold end\n",
            g("bd_count"),
            g("bd_reads"),
            g("bd_writes"),
            g("written_back_pages"),
            human(g("backing_bytes_written")),
            human(g("backing_bytes_read")),
            g("backing_read_ops"),
            human(g("backing_file_bytes")),
            human(g("backing_live_bytes")),
            g("promoted_pages"),
            if st.get("exclusive_loads").and_then(serde_json::Value::as_bool) == Some(true) { "on" } else { "off" },
            g("cold_queued_pages")
        );
    }
    out
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let path = a.control.unwrap_or_else(crate::serve::default_control_path);
    let v = query(&path)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(&v));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(512), "512B");
        assert_eq!(human(4096), "4K");
        assert_eq!(human(1536 << 10), "1.5M");
        assert_eq!(human(1 << 30), "1G");
    }

    #[test]
    fn renders_a_row() {
        let v = serde_json::json!({
            "export": "", "algorithm": "lz4", "disksize": 1u64 << 30,
            "connections": {"active": 2},
            "mm_stat": "1 2 3",
            "io_stat": "0 1 2 3",
            "stats": {"orig_data_size": 8192, "compr_data_size": 100, "mem_used_total": 4096,
                      "same_pages": 1, "dup_pages": 0, "huge_pages": 0}
        });
        let out = render(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("EXPORT"));
        assert!(lines[1].contains("1G") && lines[1].contains("2.00") && lines[1].contains("lz4"));
        assert_eq!(lines[2], "mm_stat: 1 2 3");
        assert_eq!(lines[3], "io_stat: 0 1 2 3");
    }
}
