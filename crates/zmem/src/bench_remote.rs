//! `zmem bench remote`: arguments and printing; the driver is
//! `zmem_bench::remote` (see its doc for what is timed and how).

use std::path::PathBuf;

use anyhow::{bail, Context};
use zmem_bench::remote::{self, Config};

use crate::util::parse_size;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Files or directories to read (default /usr/lib/x86_64-linux-gnu).
    pub paths: Vec<PathBuf>,
    /// Read at most this much data.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub max_bytes: u64,
    /// Compressor: lz4, zstd[:LEVEL] or lzo.
    #[arg(long, default_value = "lz4")]
    pub compressor: String,
    /// The pool's cap as a share of the data set: 1/N.
    #[arg(long, default_value = "1/8")]
    pub max_pool: String,
    /// Single loads of written-back pages timed for p50 and p99.
    #[arg(long, default_value_t = 5000)]
    pub samples: usize,
    /// Where the throttled disk's image goes.
    #[arg(long, default_value = "/var/tmp")]
    pub scratch: PathBuf,
    /// Leave out the throttled disk (the cluster alone).
    #[arg(long)]
    pub no_disk: bool,
    /// Also time single reads while a master of the cluster is killed and
    /// its replica takes over.
    #[arg(long)]
    pub failover: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let den = match a.max_pool.split_once('/') {
        Some(("1", d)) => d.trim().parse::<u64>().with_context(|| format!("--max-pool {}: expected 1/N", a.max_pool))?,
        _ => bail!("--max-pool {}: expected a share of the data, 1/N (e.g. 1/8)", a.max_pool),
    };
    let cfg = Config {
        paths: a.paths.clone(),
        max_bytes: a.max_bytes,
        compressor: a.compressor.parse()?,
        pool_share_den: den,
        samples: a.samples,
        scratch: a.scratch.clone(),
        no_disk: a.no_disk,
        failover: a.failover,
    };
    let json = a.json;
    let report = remote::run(&cfg, |n| {
        if !json {
            eprintln!("zmem: {n}");
        }
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", remote::render(&report));
    }
    Ok(())
}
