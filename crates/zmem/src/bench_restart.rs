//! `zmem bench restart`: arguments and printing; the driver is
//! `zmem_bench::restart` (see its doc for what is measured and how).

use std::path::PathBuf;

use anyhow::Context;
use zmem_bench::restart::{self, Cold, Config};

use crate::util::parse_size;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The workload's heap (most of it goes to the device).
    #[arg(long, default_value = "1536M", value_parser = parse_size)]
    pub heap: u64,
    /// The workload's memory cgroup limit.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub resident: u64,
    /// Server replacements per phase (one phase of crashes, one of restarts).
    #[arg(long, default_value_t = 20)]
    pub events: u32,
    /// The replacements start once the device holds this much.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub min_swapped: u64,
    /// The workload's length: operations per record.
    #[arg(long, default_value_t = 4)]
    pub passes: u32,
    /// Where the device lives while the bench runs.
    #[arg(long, default_value = "/var/tmp/zmem-bench-restart")]
    pub scratch: PathBuf,
    /// Give the device this pool cap and a backing file (in --scratch)
    /// for the rest: the written-back pages are handed over too
    /// [default: every page in RAM, no backing file]
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub backed_pool: Option<u64>,
    /// Give the device this pool cap and a Redis cluster for the rest (3
    /// masters and 3 replicas on loopback, started by the bench): the
    /// records on the cluster are taken over too
    #[arg(long, value_parser = parse_size, value_name = "SIZE", conflicts_with = "backed_pool")]
    pub remote_pool: Option<u64>,
    /// More options for the device's `zmem swap on`, in one string
    /// (e.g. "--compressor zstd:3 --dict auto")
    #[arg(long, value_name = "OPTIONS", allow_hyphen_values = true)]
    pub swap_on: Option<String>,
    /// Print one JSON array (a phase each) instead of lines.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let zmem = std::env::current_exe().context("finding the zmem binary")?;
    let cfg = Config {
        zmem,
        heap: a.heap,
        resident: a.resident,
        events: a.events,
        min_swapped: a.min_swapped,
        passes: a.passes,
        scratch: a.scratch,
        cold: match (a.backed_pool, a.remote_pool) {
            (Some(cap), _) => Cold::Backing(cap),
            (None, Some(cap)) => Cold::Remote(cap),
            (None, None) => Cold::Ram,
        },
        extra: a.swap_on.as_deref().unwrap_or_default().split_whitespace().map(String::from).collect(),
    };
    let phases = restart::run(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&phases)?);
        return Ok(());
    }
    let pool = match cfg.cold {
        Cold::Ram => "every page in RAM".to_string(),
        Cold::Backing(c) => format!("a pool of {} MiB and a backing file", c >> 20),
        Cold::Remote(c) => format!("a pool of {} MiB and a Redis cluster", c >> 20),
    };
    let pool = if cfg.extra.is_empty() { pool } else { format!("{pool}; {}", cfg.extra.join(" ")) };
    println!("zmem bench restart: a {} MiB heap in {} MiB ({pool}), its server replaced {} times a phase", a.heap >> 20, a.resident >> 20, a.events);
    println!("{:<9} {:>6} {:>10} {:>12} {:>11} {:>13}  workload", "phase", "events", "swapped", "takeover p50", "takeover max", "longest pause");
    for p in &phases {
        let mut t = p.takeover_ms.clone();
        t.sort_by(f64::total_cmp);
        // (No replacement, no takeover: `--events 0` measures the pauses
        // the workload has without them.)
        let ms = |x: Option<&f64>| x.map_or("-".to_string(), |v| format!("{v:.0}"));
        let (p50, max) = (ms(t.get(t.len() / 2)), ms(t.last()));
        let verdict = if p.workload_ok { "every read right".to_string() } else { format!("FAILED ({}): {}", p.workload, p.kv) };
        println!("{:<9} {:>6} {:>6} MiB {:>9} ms {:>8} ms {:>11.3} s  {verdict}", p.kind, p.events, p.swapped_bytes >> 20, p50, max, p.longest_pause_s);
    }
    for p in &phases {
        println!("  {}: {}; recovery {}; requests sent again {}", p.kind, p.kv, p.recovery, p.fuse["resent"]);
    }
    if phases.iter().any(|p| !p.workload_ok) {
        anyhow::bail!("the workload failed under restarts");
    }
    Ok(())
}
