//! `zmem bench swap`: arguments and printing; the driver is
//! `zmem_bench::swap` (see its doc for what runs and how memory is made
//! equal between the systems).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use zmem_bench::swap::{self, Amount, Config, DiskKind, Progress, System};

use crate::util::parse_size;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Parallel jobs of the workload, one set of runs each (-j sweep):
    /// `4` or `4,8,16`. Replaces `{jobs}` in a custom command.
    #[arg(long, short = 'j', default_value = "4", value_delimiter = ',')]
    pub jobs: Vec<u32>,
    /// Memory budgets for workload plus pool, one set of runs each: sizes
    /// (400M) or shares of the peak of its anonymous memory without a
    /// limit (50%).
    #[arg(long, default_value = "50%,35%", value_delimiter = ',', value_parser = parse_amount)]
    pub budget: Vec<Amount>,
    /// The compressed pool's cap: a size or a share of the budget (zswap's
    /// default max_pool_percent is 20).
    #[arg(long, default_value = "20%", value_parser = parse_amount)]
    pub pool_cap: Amount,
    /// Systems to compare, in this order.
    #[arg(long, default_value = "disk,zswap,zram,zmem", value_delimiter = ',')]
    pub systems: Vec<System>,
    /// Disks: real (as it is), throttled (3,000 IOPS, 125 MB/s), hdd (150
    /// IOPS, 58 MB/s).
    #[arg(long, default_value = "real,throttled", value_delimiter = ',')]
    pub disks: Vec<DiskKind>,
    /// Compressor for every system, by the kernel's name (zmem uses its own
    /// LZO for lzo and lzo-rle).
    #[arg(long, default_value = "lzo")]
    pub compressor: String,
    /// Size of the swap file and of zmem's swap device.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    pub swap_size: u64,
    /// Scratch directory: the disk image, logs, the build's target dir.
    #[arg(long, default_value = "/var/tmp/zmem-bench-swap")]
    pub scratch: PathBuf,
    /// memory.swappiness of the workload's cgroup.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=200))]
    pub swappiness: u32,
    /// zswap's shrinker (writeback of cold entries under memcg pressure).
    #[arg(long, default_value = "on", value_parser = crate::util::parse_on_off, action = clap::ArgAction::Set)]
    pub zswap_shrinker: bool,
    /// The zmem binary whose swap server (and `kv` workload) is measured,
    /// to compare another build with this one in the same set [default:
    /// this binary]
    #[arg(long, value_name = "PATH")]
    pub zmem_bin: Option<std::path::PathBuf>,
    /// The zmem binary of the `zmem-b` runs alone (two builds in one set:
    /// `--systems zmem,zmem-b --zmem-b-bin NEW`) [default: --zmem-bin's]
    #[arg(long, value_name = "PATH")]
    pub zmem_b_bin: Option<std::path::PathBuf>,
    /// zram's disksize as a multiple of the pool cap.
    #[arg(long, default_value_t = 3.0)]
    pub zram_ratio: f64,
    /// An extra argument for `zmem swap on`, repeated for each (e.g.
    /// `--zmem-arg=--exclusive-loads --zmem-arg=off`). A `--compressor`
    /// here replaces --compressor for zmem alone (`--zmem-arg=--compressor
    /// --zmem-arg=zstd --zmem-arg=--dict --zmem-arg=auto`).
    #[arg(long = "zmem-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub zmem_args: Vec<String>,
    /// An extra argument for the `zmem-b` runs alone, after the --zmem-arg
    /// ones (a second setting in the same set: `--systems
    /// disk,zmem,zmem-b --zmem-b-arg=--read-ahead --zmem-b-arg=0`).
    #[arg(long = "zmem-b-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub zmem_b_args: Vec<String>,
    /// Replace the `zmem-b` runs' server every this many seconds while
    /// the workload runs (`zmem swap restart`): what planned restarts cost,
    /// against `zmem` in the same set (`--systems zmem,zmem-b`).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub zmem_b_restart_every: Option<u64>,
    /// Kill a run that takes longer than this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// Sets of runs for each budget, the systems in the reverse order in
    /// every second set. A workload near its memory cliff (the build)
    /// varies set to set: each set's ratios are its own, and the table
    /// ends with their median and range.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub sets: u32,
    /// The built-in workload: `build` (a clean `cargo build --release` of
    /// a source tree: many short processes streaming through memory) or
    /// `kv` (a key-value store's heap, read and updated at random by
    /// `-j` clients: one long-lived, randomly accessed working set; see
    /// `zmem bench kv`).
    #[arg(long, value_enum, default_value_t = Workload::Build)]
    pub workload: Workload,
    /// `--workload kv`: the heap's size.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub kv_size: u64,
    /// `--workload kv`: operations per record over the run.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub kv_passes: u32,
    /// Source tree for the build workload (a cargo workspace).
    #[arg(long)]
    pub source: Option<PathBuf>,
    /// Write the plot here (PNG); default SCRATCH/swap.png.
    #[arg(long)]
    pub png: Option<PathBuf>,
    /// JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The workload, instead of a built-in one: any command, e.g. `--
    /// make -j{jobs}`.
    #[arg(last = true)]
    pub cmd: Vec<String>,
}

/// The built-in workloads of `zmem bench swap`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Build,
    Kv,
}

#[derive(clap::Args, Debug)]
pub struct KvArgs {
    /// The heap's size (1 KiB records).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Clients, each with its own share of the records.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// Operations per record over the run.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub passes: u32,
}

/// `zmem bench kv`: the swap bench's second workload on its own.
pub fn run_kv(a: KvArgs) -> anyhow::Result<()> {
    let o = zmem_bench::kv::run(zmem_bench::kv::Config { bytes: a.size, threads: a.threads, passes: a.passes })?;
    println!(
        "kv: {} records of {} B, {} reads and {} updates, all checked; fill {:.2} s, operations {:.2} s; digest {:016x}; longest pause {:.3} s",
        o.records,
        zmem_bench::kv::RECORD,
        o.reads,
        o.updates,
        o.fill.as_secs_f64(),
        o.ops.as_secs_f64(),
        o.digest,
        o.longest_pause.as_secs_f64()
    );
    Ok(())
}

fn parse_amount(s: &str) -> anyhow::Result<Amount> {
    if let Some(p) = s.strip_suffix('%') {
        let p: u32 = p.trim().parse().with_context(|| format!("bad share `{s}`"))?;
        if !(1..=100).contains(&p) {
            bail!("a share must be 1% to 100%, got `{s}`");
        }
        Ok(Amount::Percent(p))
    } else {
        let b = parse_size(s)?;
        if b < 16 << 20 {
            bail!("`{s}` is too small: at least 16M");
        }
        Ok(Amount::Bytes(b))
    }
}

fn config(a: &Args) -> anyhow::Result<Config> {
    let bin = |flag: &str, p: &std::path::Path| -> anyhow::Result<std::path::PathBuf> {
        if !p.is_file() {
            bail!("{flag} {}: no such file", p.display());
        }
        std::fs::canonicalize(p).with_context(|| format!("{flag} {}", p.display()))
    };
    let zmem = match &a.zmem_bin {
        Some(p) => bin("--zmem-bin", p)?,
        None => std::env::current_exe().context("cannot find the zmem binary")?,
    };
    let zmem_b = a.zmem_b_bin.as_deref().map(|p| bin("--zmem-b-bin", p)).transpose()?;
    if a.zram_ratio < 1.0 || !a.zram_ratio.is_finite() {
        bail!("--zram-ratio must be at least 1");
    }
    if !a.cmd.is_empty() && a.workload != Workload::Build {
        bail!("give either --workload or a command after --, not both");
    }
    if a.workload == Workload::Kv && a.source.is_some() {
        bail!("--source is the build workload's; --workload kv needs none");
    }
    let (workload, workload_dir, workload_env, prepare) = if a.workload == Workload::Kv {
        let argv = vec![
            zmem.display().to_string(),
            "bench".into(),
            "kv".into(),
            "--size".into(),
            a.kv_size.to_string(),
            "--threads".into(),
            "{jobs}".into(),
            "--passes".into(),
            a.kv_passes.to_string(),
        ];
        (argv, std::env::current_dir()?, vec![], None)
    } else if a.cmd.is_empty() {
        let src = match &a.source {
            Some(s) => s.clone(),
            None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")),
        };
        let src = src.canonicalize().with_context(|| format!("the source tree {} does not exist (give --source)", src.display()))?;
        if !src.join("Cargo.toml").is_file() {
            bail!("{} has no Cargo.toml (give --source, or a command after --)", src.display());
        }
        let target = a.scratch.join("target");
        let argv = ["cargo", "build", "--release", "--offline", "-q", "-j{jobs}"].map(String::from).to_vec();
        let env = vec![("CARGO_TARGET_DIR".to_string(), target.display().to_string())];
        let prepare = vec!["rm".to_string(), "-rf".to_string(), target.display().to_string()];
        (argv, src, env, Some(prepare))
    } else {
        (a.cmd.clone(), std::env::current_dir()?, vec![], None)
    };
    Ok(Config {
        workload,
        workload_dir,
        workload_env,
        prepare,
        jobs: a.jobs.clone(),
        budgets: a.budget.clone(),
        pool_cap: a.pool_cap,
        systems: a.systems.clone(),
        disks: a.disks.clone(),
        zmem,
        zmem_b,
        compressor: a.compressor.clone(),
        swap_size: a.swap_size / 4096 * 4096,
        scratch: a.scratch.clone(),
        swappiness: a.swappiness,
        zswap_shrinker: a.zswap_shrinker,
        zram_ratio: a.zram_ratio,
        zmem_args: a.zmem_args.clone(),
        zmem_b_args: a.zmem_b_args.clone(),
        timeout: Duration::from_secs(a.timeout),
        sets: a.sets,
        zmem_b_restart_every: a.zmem_b_restart_every.map(Duration::from_secs),
    })
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let cfg = config(&a)?;
    let stop = crate::sys::stop_on_signals().context("cannot handle signals")?;
    let report = swap::run(&cfg, stop, |p| match p {
        Progress::Start { index, total, what } => eprintln!("[{index}/{total}] {what}"),
        Progress::Done { result: r, .. } => eprintln!(
            "        {} {:.1} s wall, {:.1} s CPU, pswpout {}, disk {:.0} MB read {:.0} MB written{}",
            if r.exit_ok { "done:" } else { "FAILED:" },
            r.wall_secs,
            r.cpu_secs,
            r.pswpout,
            r.disk_io.read_bytes as f64 / 1e6,
            r.disk_io.write_bytes as f64 / 1e6,
            r.error.as_ref().map_or(String::new(), |e| format!(" ({e})"))
        ),
    })?;
    let png = a.png.clone().unwrap_or_else(|| a.scratch.join("swap.png"));
    let plotted = zmem_bench::plot::swap_png(&report, &png);
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        let ratios: Vec<_> = report.runs.iter().map(|r| swap::ratios(&report, r)).collect();
        v["ratios"] = serde_json::to_value(ratios)?;
        v["spreads"] = serde_json::to_value(swap::spreads(&report))?;
        v["png"] = plotted.as_ref().ok().map(|_| png.display().to_string()).into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", swap::render(&report));
    }
    match plotted {
        Ok(()) => eprintln!("plot: {}", png.display()),
        Err(e) => eprintln!("zmem: no plot: {e:#}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<Args, clap::Error> {
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            a: Args,
        }
        <T as clap::Parser>::try_parse_from(std::iter::once("swap").chain(v.iter().copied())).map(|t| t.a)
    }

    #[test]
    fn the_kv_workload_is_this_binary_with_one_client_per_job() {
        let c = config(&args(&["--workload", "kv", "--kv-size", "64M", "--kv-passes", "2", "-j", "2,4"]).unwrap()).unwrap();
        assert_eq!(c.workload[1..], ["bench", "kv", "--size", "67108864", "--threads", "{jobs}", "--passes", "2"]);
        assert_eq!(c.workload[0], std::env::current_exe().unwrap().display().to_string());
        assert!(c.prepare.is_none() && c.jobs == [2, 4]);
        let e = config(&args(&["--workload", "kv", "--", "make"]).unwrap()).unwrap_err().to_string();
        assert!(e.contains("not both"), "{e}");
        let e = config(&args(&["--workload", "kv", "--source", "/tmp"]).unwrap()).unwrap_err().to_string();
        assert!(e.contains("--source"), "{e}");
        assert!(args(&["--workload", "heap"]).is_err());
        assert!(args(&["--kv-passes", "0"]).is_err());
        assert_eq!(config(&args(&["--sets", "3"]).unwrap()).unwrap().sets, 3);
        assert_eq!(config(&args(&[]).unwrap()).unwrap().sets, 1);
        assert!(args(&["--sets", "0"]).is_err());
    }

    #[test]
    fn amounts() {
        assert_eq!(parse_amount("50%").unwrap(), Amount::Percent(50));
        assert_eq!(parse_amount("400M").unwrap(), Amount::Bytes(400 << 20));
        assert!(parse_amount("0%").is_err());
        assert!(parse_amount("101%").is_err());
        assert!(parse_amount("1M").is_err());
        assert!(parse_amount("x").is_err());
    }
}
