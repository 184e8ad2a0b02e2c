//! `zmem bench blockdev`: arguments and printing; the driver is
//! `zmem_bench::blockdev` (see its doc for the targets, the jobs and the
//! data they are filled with).

use std::path::PathBuf;

use anyhow::Context;
use zmem_bench::blockdev::{self, Config};

use crate::util::{parse_on_off, parse_size};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Device size for every target.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub size: u64,
    /// zmem's compressor (zram uses the same if the kernel has it).
    #[arg(long, default_value = "lz4")]
    pub compressor: String,
    /// zmem dedup: on or off.
    #[arg(long, default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub dedup: bool,
    /// Seconds for each time-based random job.
    #[arg(long, default_value_t = 5)]
    pub runtime: u64,
    /// fio iodepth for the random jobs.
    #[arg(long, default_value_t = 16)]
    pub iodepth: u32,
    /// fio buffer_compress_percentage for randwrite data [default: the
    /// fill data's compressibility, measured by zmem's pool].
    #[arg(long)]
    pub compress_percentage: Option<u32>,
    /// Fill source: the devices are filled with this file's first --size
    /// bytes [default: bench-data/usrlib.tar, a tar of
    /// /usr/lib/x86_64-linux-gnu, created if missing].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Skip nbdkit.
    #[arg(long)]
    pub no_nbdkit: bool,
    /// Skip kernel zram.
    #[arg(long)]
    pub no_zram: bool,
    /// Skip the FUSE file + loop device target (`zmem swap`'s device).
    #[arg(long)]
    pub no_fuse: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = Config {
        zmem: std::env::current_exe().context("cannot find the zmem binary")?,
        size: a.size,
        compressor: a.compressor.clone(),
        dedup: a.dedup,
        runtime: a.runtime,
        iodepth: a.iodepth,
        compress_percentage: a.compress_percentage,
        data: a.data.clone(),
        nbdkit: !a.no_nbdkit,
        zram: !a.no_zram,
        fuse: !a.no_fuse,
    };
    let report = blockdev::run(&cfg, |msg| eprintln!("zmem: {msg}"))?;
    if a.json {
        // Through a Value, whose objects order their keys by name: the JSON
        // this command has always printed.
        println!("{}", serde_json::to_string_pretty(&serde_json::to_value(&report)?)?);
    } else {
        print!("{}", blockdev::render(&report));
    }
    Ok(())
}
