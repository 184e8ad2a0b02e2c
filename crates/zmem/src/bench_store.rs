//! `zmem bench store`: arguments and printing; the driver is
//! `zmem_bench::store` (see its doc for what is timed and how).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use zmem_bench::store::{self, Config, MaxPool, Progress};
use zmem_bench::store_dict;
use zmem_compress::Compressor;

use crate::util::{parse_on_off, parse_pool_limit, parse_size};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Files or directories to read (each file cut into 4 KiB pages, tail
    /// zero-padded). With neither paths nor --pid: /usr/lib/x86_64-linux-gnu
    /// plus the anonymous memory of a freshly started python3 process.
    pub paths: Vec<PathBuf>,
    /// Also read the anonymous memory of this live process.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Compressor: lz4, zstd[:LEVEL] or lzo.
    #[arg(long, default_value = "lz4")]
    pub compressor: String,
    /// Deduplicate identical pages: on or off.
    #[arg(long, default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub dedup: bool,
    /// Threads for the store, load and raw passes.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Timed passes; the best of each is reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Stop reading input after this much data (e.g. 512M).
    #[arg(long, value_parser = parse_size)]
    pub max_bytes: Option<u64>,
    /// Objects compressed to this many bytes or more are stored raw.
    #[arg(long, default_value_t = zmem_core::DEFAULT_HUGE_THRESHOLD)]
    pub huge_threshold: usize,
    /// zswap's max_pool: a size (64M), a share of RAM (20%), or a share of
    /// the data set (1/8). Past it, the coldest pages are written back,
    /// compressed, to --backing.
    #[arg(long)]
    pub max_pool: Option<String>,
    /// Backing file for writeback (default with --max-pool: a temporary
    /// file in $TMPDIR, removed afterwards).
    #[arg(long)]
    pub backing: Option<PathBuf>,
    /// Skip the kernel zram comparison.
    #[arg(long)]
    pub no_kernel: bool,
    /// After the timed passes, recompress every page with these algorithms
    /// (comma-separated, by priority, e.g. zstd:9) and report the memory
    /// saved and the load speed of untouched and rewritten pages.
    #[arg(long, value_name = "ALGO[,ALGO...]", value_delimiter = ',')]
    pub recompress: Vec<String>,
    /// Instead of the timed passes: the same pages in every encoding
    /// (lz4, zstd:1/3/9, lz4/zstd with a dictionary the pool trains, lz4
    /// then idle recompression with zstd and the dictionary), one table per
    /// data set: with no paths or --pid, the /usr/lib files, a live python
    /// process and this tree's cargo build output (128 MiB each by default).
    /// The strong zstd is the first --recompress algorithm (zstd:9).
    #[arg(long)]
    pub dict: bool,
    /// Print one JSON object instead of a table (no progress bar).
    #[arg(long)]
    pub json: bool,
}

/// Parse --max-pool: a share of the data set (`1/8`), else a pool limit
/// (a size, or a share of RAM).
fn parse_max_pool(arg: &str) -> anyhow::Result<MaxPool> {
    if let Some((n, d)) = arg.split_once('/') {
        let (num, den): (u64, u64) = (
            n.trim().parse().with_context(|| format!("bad fraction `{arg}`: expected e.g. 1/8"))?,
            d.trim().parse().with_context(|| format!("bad fraction `{arg}`: expected e.g. 1/8"))?,
        );
        if num == 0 || den == 0 || num > den {
            bail!("bad fraction `{arg}`: expected a share of the data between 0 and 1, e.g. 1/8");
        }
        return Ok(MaxPool::ShareOfData { num, den });
    }
    Ok(MaxPool::Bytes(parse_pool_limit(arg)?))
}

fn config(a: &Args) -> anyhow::Result<Config> {
    Ok(Config {
        paths: a.paths.clone(),
        pid: a.pid,
        compressor: a.compressor.parse()?,
        dedup: a.dedup,
        threads: a.threads,
        repeat: a.repeat,
        max_bytes: a.max_bytes,
        huge_threshold: a.huge_threshold,
        max_pool: a.max_pool.as_deref().map(parse_max_pool).transpose()?,
        backing: a.backing.clone(),
        kernel: !a.no_kernel,
        recompress: a.recompress.iter().map(|c| c.parse()).collect::<Result<_, _>>().context("--recompress")?,
    })
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = config(&a)?;
    if a.dict {
        let strong = cfg.recompress.first().copied().unwrap_or(Compressor::zstd(9)?);
        if strong.algorithm != zmem_compress::Algorithm::Zstd {
            bail!("--dict: the strong algorithm (--recompress) must be zstd:LEVEL, not {strong}");
        }
        let dcfg = store_dict::Config { paths: a.paths.clone(), pid: a.pid, max_bytes: a.max_bytes, strong, repeat: a.repeat };
        let report = store_dict::run(&dcfg)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", store_dict::render(&report));
        }
        return Ok(());
    }
    let show = !a.json && std::io::stderr().is_terminal();
    let mut bar = ProgressBar::hidden();
    let report = store::run(&cfg, |p| match p {
        Progress::Passes { steps } if show => {
            bar = ProgressBar::new(steps);
            bar.set_style(ProgressStyle::with_template("{msg:>12} [{bar:40}] {percent:>3}% {elapsed}").unwrap_or_else(|_| ProgressStyle::default_bar()));
        }
        Progress::Pass(what) => bar.set_message(what),
        Progress::Advance(steps) => bar.inc(steps),
        Progress::PassesDone => bar.finish_and_clear(),
        Progress::KernelZram if show => eprintln!("writing the same pages to kernel zram..."),
        Progress::Note(note) if !a.json => eprintln!("zmem: {note}"),
        _ => {}
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", store::render(&report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_pool_forms() {
        assert_eq!(parse_max_pool("1/8").unwrap(), MaxPool::ShareOfData { num: 1, den: 8 });
        assert_eq!(parse_max_pool("64M").unwrap(), MaxPool::Bytes(64 << 20));
        for bad in ["0/8", "9/8", "1/0", "x/8", "0"] {
            assert!(parse_max_pool(bad).is_err(), "{bad}");
        }
    }
}
