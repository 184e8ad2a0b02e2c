//! `zmem bench cache`: arguments and printing; the driver is
//! `zmem_bench::cache` (see its doc for the set-up and what is measured).

use std::path::PathBuf;

use anyhow::Context;
use zmem_bench::cache::{self, Config, Frontend};
use zmem_host::Throttle;

use crate::util::parse_size;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The reader's memory: its page cache, and with zmem, zmem's memory too.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub budget: u64,
    /// Where the data set's files come from (a fixed sample of its regular files).
    #[arg(long, default_value = "/usr/lib")]
    pub data_dir: PathBuf,
    /// Bytes of files in the data set [default: 2 × --budget].
    #[arg(long, value_parser = parse_size)]
    pub data_bytes: Option<u64>,
    /// zmem's --max-pool, in percent of the budget.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub pool_percent: u32,
    /// zmem's compressor.
    #[arg(long, default_value = "zstd:3")]
    pub compressor: String,
    /// zmem's --dedup: on or off.
    #[arg(long, default_value = "on", value_parser = crate::util::parse_on_off, action = clap::ArgAction::Set)]
    pub dedup: bool,
    /// zmem's --cache-max-compressed: pages compressing to more are not kept.
    #[arg(long, default_value_t = 4095, value_parser = clap::value_parser!(u16).range(64..=4096))]
    pub cache_max_compressed: u16,
    /// One more argument for `zmem serve --origin` (repeat for more, e.g.
    /// `--zmem-arg=--dict --zmem-arg=auto`).
    #[arg(long = "zmem-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub zmem_args: Vec<String>,
    /// The origin disk's IOPS, each way.
    #[arg(long, default_value_t = 3000)]
    pub iops: u64,
    /// The origin disk's MB/s (10^6 bytes), each way.
    #[arg(long, default_value_t = 125)]
    pub mbps: u64,
    /// Sequential passes after the cold one.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub warm_passes: u32,
    /// Seconds of random 4 KiB reads.
    #[arg(long, default_value_t = 30)]
    pub random_secs: u64,
    /// fio jobs reading at random at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub random_jobs: u32,
    /// How the kernel reaches zmem's device: `fuse`, zmem serve's own FUSE
    /// file (--fuse), or `nbd`, nbdfuse over its NBD socket (this kernel
    /// has no nbd driver; nbdfuse adds a process and a socket to the path).
    #[arg(long, default_value = "fuse", value_parser = ["fuse", "nbd"])]
    pub frontend: String,
    /// Scratch directory on a real disk (removed after the run).
    #[arg(long, default_value = "/var/tmp/zmem-bench-cache")]
    pub workdir: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = Config {
        zmem: std::env::current_exe().context("cannot find the zmem binary")?,
        workdir: a.workdir,
        data_dir: a.data_dir,
        budget: a.budget,
        data_bytes: a.data_bytes,
        pool_percent: a.pool_percent,
        compressor: a.compressor,
        dedup: a.dedup,
        max_compressed: a.cache_max_compressed,
        zmem_args: a.zmem_args,
        throttle: Throttle { iops: a.iops, bps: a.mbps * 1_000_000 },
        warm_passes: a.warm_passes,
        random_secs: a.random_secs,
        random_jobs: a.random_jobs,
        frontend: if a.frontend == "nbd" { Frontend::Nbd } else { Frontend::Fuse },
    };
    let report = cache::run(&cfg, |msg| eprintln!("zmem: {msg}"))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", cache::render(&report));
    }
    Ok(())
}
