//! `zmem bench store`: the engine measured against its own ceiling and the kernel.
//!
//! One run, same pages, side by side:
//! * **raw**: the compressor alone, page by page into a scratch buffer, then
//!   decompression of those outputs — the ceiling no store can beat;
//! * **store/load**: the same pages through a [`Pool`] (same-filled check,
//!   dedup, compression, allocation, index), loaded back into a separate
//!   buffer and verified byte for byte after the timed pass;
//! * **kernel_zram**: as root, the same pages written to and read from
//!   `/dev/zramN` with the same algorithm (see `zmem_bench::kernel_zram`).
//!
//! Every timed pass runs `--repeat` times, interleaved (raw, store, load,
//! raw, ...), and the best time of each is reported: this 2-core machine is
//! noisy, and ratios of bests within one run are what we compare.
//! MB/s is 10^6 bytes of uncompressed data per second.

use std::io::IsTerminal;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use zmem_bench::pages::{self, PageSet, PAGE_SIZE};
use zmem_compress::Compressor;
use zmem_core::{Pool, PoolConfig, Stats};

use crate::util::{mbps, parse_on_off, parse_size};

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
    /// Print one JSON object instead of a table (no progress bar).
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    pages: u64,
    orig_bytes: u64,
    compr_bytes: u64,
    mem_used_bytes: u64,
    same_pages: u64,
    dup_pages: u64,
    dup_data_size: u64,
    meta_data_size: u64,
    huge_pages: u64,
    /// Best warm pass (pool already holds the data; keys overwritten).
    store_mbps: f64,
    /// First pass, into a fresh pool: includes the kernel's page faults.
    store_cold_mbps: f64,
    /// mem_used_total after the warm passes overwrote every key (no compaction).
    mem_used_bytes_after_overwrites: u64,
    load_mbps: f64,
    raw_compress_mbps: f64,
    raw_decompress_mbps: f64,
    raw_compr_bytes: u64,
    store_vs_raw_compress: f64,
    load_vs_raw_decompress: f64,
    compressor: String,
    dedup: bool,
    threads: usize,
    repeat: usize,
    verified_pages: u64,
    mm_stat: String,
    sources: usize,
    stats: Stats,
    kernel_zram: Option<zmem_bench::kernel_zram::ZramResult>,
    kernel_zram_skipped: Option<String>,
    mem_used_vs_kernel_zram: Option<f64>,
    writeback: Option<WritebackReport>,
}

/// The writeback tier's figures, over the whole run.
#[derive(Serialize)]
struct WritebackReport {
    backing_file: String,
    /// Why O_DIRECT is not used, if it is not.
    buffered_io: Option<String>,
    max_pool_bytes: u64,
    written_back_pages: u64,
    /// Bytes really written to the backing file.
    backing_bytes_written: u64,
    /// What writing those pages back uncompressed would have cost (pages × 4096).
    uncompressed_baseline_bytes: u64,
    written_vs_baseline: f64,
    bd_stat: String,
    bd_count: u64,
    bd_reads: u64,
    bd_writes: u64,
    backing_bytes_read: u64,
    backing_file_bytes: u64,
    backing_live_bytes: u64,
    promoted_pages: u64,
    pool_limit_hit: u64,
}

/// Resolve --max-pool against the data set size.
fn resolve_max_pool(arg: &str, data_bytes: u64) -> anyhow::Result<u64> {
    if let Some((n, d)) = arg.split_once('/') {
        let (n, d): (u64, u64) = (
            n.trim().parse().with_context(|| format!("bad fraction `{arg}`: expected e.g. 1/8"))?,
            d.trim().parse().with_context(|| format!("bad fraction `{arg}`: expected e.g. 1/8"))?,
        );
        if n == 0 || d == 0 || n > d {
            bail!("bad fraction `{arg}`: expected a share of the data between 0 and 1, e.g. 1/8");
        }
        return Ok((data_bytes * n / d).max(PAGE_SIZE as u64));
    }
    crate::util::parse_pool_limit(arg)
}

fn load_pages(a: &Args, quiet: bool) -> anyhow::Result<PageSet> {
    let mut set = PageSet::default();
    let default = a.paths.is_empty() && a.pid.is_none();
    let paths = if default {
        vec![PathBuf::from("/usr/lib/x86_64-linux-gnu")]
    } else {
        a.paths.clone()
    };
    if !paths.is_empty() {
        set = pages::read_paths(&paths, a.max_bytes)
            .with_context(|| format!("reading {}", paths[0].display()))?;
    }
    let mut extra = |p: PageSet| {
        set.data.extend_from_slice(&p.data);
        set.sources.extend(p.sources);
    };
    if let Some(pid) = a.pid {
        extra(pages::read_process(pid, a.max_bytes)?);
    } else if default {
        // The built-in live process: a python3 heap of dicts, strings, numbers.
        match pages::spawn_default_process(64 << 20) {
            Ok(mut child) => {
                let r = pages::read_process(child.id(), Some(256 << 20));
                let _ = child.kill();
                let _ = child.wait();
                extra(r?);
            }
            Err(e) if !quiet => eprintln!("zmem: no live-process data: {e:#}"),
            Err(_) => {}
        }
    }
    if set.is_empty() {
        bail!("no pages to benchmark: the inputs were empty");
    }
    Ok(set)
}

/// Run `f` on every part at once, one thread each; the first error wins.
fn par<T: Send>(parts: Vec<T>, f: impl Fn(T) -> anyhow::Result<()> + Sync) -> anyhow::Result<()> {
    std::thread::scope(|s| {
        let hs: Vec<_> = parts.into_iter().map(|p| s.spawn(|| f(p))).collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| anyhow::anyhow!("benchmark thread panicked"))?)
            .collect::<anyhow::Result<Vec<()>>>()
    })?;
    Ok(())
}

/// Split the pages of `r` into `threads` runs: (first page, that run's
/// share of `out`, which holds `unit` elements per page).
fn split<'a, T>(r: &Range<usize>, threads: usize, out: &'a mut [T], unit: usize) -> Vec<(usize, &'a mut [T])> {
    let per = r.len().div_ceil(threads).max(1);
    out.chunks_mut(per * unit).enumerate().map(|(t, o)| (r.start + t * per, o)).collect()
}

fn timed(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.threads == 0 || a.threads > 256 {
        bail!("--threads must be between 1 and 256");
    }
    if a.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let comp: Compressor = a.compressor.parse()?;
    let show = !a.json && std::io::stderr().is_terminal();
    let set = load_pages(&a, a.json)?;
    let n = set.pages();
    let orig = (n * PAGE_SIZE) as u64;
    let data = &set.data;

    let bar = if show {
        let b = ProgressBar::new((a.repeat * 4 * n) as u64);
        b.set_style(
            ProgressStyle::with_template("{msg:>12} [{bar:40}] {percent:>3}% {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    } else {
        ProgressBar::hidden()
    };

    // Raw compressor outputs, one slot per page, sized for the worst case.
    let bound = comp.algorithm.compress_bound(PAGE_SIZE);
    let mut raw_out = vec![0u8; n * bound];
    let mut raw_len = vec![0u32; n];
    let mut out = vec![0u8; data.len()];
    // Touch the output buffers now, so no timed pass pays their page faults.
    raw_out.fill(1);
    out.fill(1);
    let max_pool = a.max_pool.as_deref().map(|m| resolve_max_pool(m, orig)).transpose()?;
    let cfg = PoolConfig {
        compressor: comp,
        dedup: a.dedup,
        huge_threshold: a.huge_threshold,
        max_pool,
        ..PoolConfig::default()
    };
    // The backing file, when the run has a writeback tier.
    let mut _tmp_backing = None;
    let backing_path = match (&a.backing, max_pool) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(_)) => {
            let f = tempfile::Builder::new().prefix("zmem-backing-").tempfile()?;
            let p = f.path().to_path_buf();
            _tmp_backing = Some(f);
            Some(p)
        }
        (None, None) => None,
    };
    let mut buffered_io = None;
    let mut new_pool = || -> anyhow::Result<Pool> {
        Ok(match &backing_path {
            Some(p) => {
                let (store, why) = zmem_core::BackingStore::open(p, None, zmem_core::Existing::Refuse)
                    .with_context(|| format!("opening backing file {}", p.display()))?;
                if let Some(why) = why {
                    if !a.json {
                        eprintln!("zmem: {why}");
                    }
                    buffered_io = Some(why);
                }
                Pool::with_backing(cfg.clone(), store)?
            }
            None => Pool::new(cfg.clone())?,
        })
    };
    // The timed passes are interleaved chunk by chunk: for each chunk of
    // pages, the raw compressor then the store; then, for each chunk, the
    // load then the raw decompressor. A chunk's time is its best over the
    // repeats and a pass's time is the sum of its chunks' bests, so a burst
    // of noise on this shared machine spoils one chunk of one pass, not a
    // whole comparison. The first repeat stores into a fresh pool, paying the
    // kernel's page faults (fault + zeroing of every new page: the price of
    // fresh anonymous memory, which in-kernel zram does not pay); it is
    // reported as `store_cold_mbps`. Later repeats overwrite the same keys in
    // the warm pool, as a long-running zram or zswap pool does; with dedup
    // on, each chunk is dropped first so they measure new pages, not
    // duplicate hits.
    const CHUNK: usize = 4096; // pages: 16 MiB
    let nchunks = n.div_ceil(CHUNK);
    let chunk = |c: usize| c * CHUNK..((c + 1) * CHUNK).min(n);
    let threads = a.threads;
    let mut rc_t = vec![f64::MAX; nchunks];
    let mut st_t = vec![f64::MAX; nchunks];
    let mut ld_t = vec![f64::MAX; nchunks];
    let mut rd_t = vec![f64::MAX; nchunks];
    let mut cold_st = 0.0;
    let pool = new_pool()?;
    let mut cold_stats: Option<Stats> = None;
    for rep in 0..a.repeat {
        let cold = rep == 0;
        bar.set_message(if cold { "store, cold" } else { "store" });
        for c in 0..nchunks {
            let r = chunk(c);
            let secs = timed(|| {
                let outs = split(&r, threads, &mut raw_out[r.start * bound..r.end * bound], bound);
                let lens = split(&r, threads, &mut raw_len[r.clone()], 1);
                par(outs.into_iter().zip(lens).collect(), |((first, o), (_, l))| {
                    for (i, len) in l.iter_mut().enumerate() {
                        let p = &data[(first + i) * PAGE_SIZE..][..PAGE_SIZE];
                        *len = comp.compress(p, &mut o[i * bound..][..bound]).unwrap_or(0) as u32;
                    }
                    Ok(())
                })
            })?;
            rc_t[c] = rc_t[c].min(secs);
            if a.dedup && !cold {
                pool.invalidate_range(r.start as u64..r.end as u64);
            }
            let secs = timed(|| {
                let per = r.len().div_ceil(threads).max(1);
                let runs = r.clone().step_by(per).map(|f| f..(f + per).min(r.end)).collect();
                par(runs, |run: Range<usize>| {
                    for i in run {
                        pool.store(i as u64, &data[i * PAGE_SIZE..][..PAGE_SIZE])
                            .with_context(|| format!("storing page {i}"))?;
                    }
                    Ok(())
                })
            })?;
            if cold {
                cold_st += secs;
            }
            // The headline store figure is the best warm pass (the cold one
            // when it is the only one).
            if !cold || a.repeat == 1 {
                st_t[c] = st_t[c].min(secs);
            }
            bar.inc(2 * r.len() as u64);
        }
        if cold {
            cold_stats = Some(pool.stats());
        }
        bar.set_message("load");
        for c in 0..nchunks {
            let r = chunk(c);
            let secs = timed(|| {
                let dst = &mut out[r.start * PAGE_SIZE..r.end * PAGE_SIZE];
                par(split(&r, threads, dst, PAGE_SIZE), |(first, d)| {
                    for (j, page) in d.chunks_exact_mut(PAGE_SIZE).enumerate() {
                        let i = first + j;
                        pool.load(i as u64, page).with_context(|| format!("loading page {i}"))?;
                    }
                    Ok(())
                })
            })?;
            ld_t[c] = ld_t[c].min(secs);
            let secs = timed(|| {
                let dst = &mut out[r.start * PAGE_SIZE..r.end * PAGE_SIZE];
                par(split(&r, threads, dst, PAGE_SIZE), |(first, d)| {
                    for (j, page) in d.chunks_exact_mut(PAGE_SIZE).enumerate() {
                        let i = first + j;
                        let src = &raw_out[i * bound..][..raw_len[i] as usize];
                        let _ = zmem_compress::decompress(comp.algorithm, src, page);
                    }
                    Ok(())
                })
            })?;
            rd_t[c] = rd_t[c].min(secs);
            bar.inc(2 * r.len() as u64);
        }
    }
    bar.finish_and_clear();
    let (best_rc, best_st, best_ld, best_rd): (f64, f64, f64, f64) =
        (rc_t.iter().sum(), st_t.iter().sum(), ld_t.iter().sum(), rd_t.iter().sum());

    // Verify every byte, outside the timed passes: load again into `out`.
    let mut bad = 0u64;
    let mut buf = vec![0u8; PAGE_SIZE];
    for (i, want) in data.chunks_exact(PAGE_SIZE).enumerate() {
        pool.load(i as u64, &mut buf)?;
        if buf != want {
            bad += 1;
        }
    }
    if bad > 0 {
        bail!("{bad} of {n} pages read back wrong: this is a bug, please report it");
    }
    let raw_compr: u64 = raw_len.iter().map(|&l| l as u64).sum();
    let st = pool.stats();
    drop(pool);

    let (kernel_zram, kernel_zram_skipped) = if a.no_kernel {
        (None, Some("skipped: --no-kernel".to_string()))
    } else {
        if show {
            eprintln!("writing the same pages to kernel zram...");
        }
        match zmem_bench::kernel_zram::run(data, comp.algorithm.name()) {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e.reason)),
        }
    };
    let store_mbps = mbps(orig, best_st);
    let store_cold_mbps = mbps(orig, cold_st);
    // Memory is reported for the data stored once into a fresh pool — the
    // same operation kernel zram is measured on — and, separately, after
    // the warm overwrite passes (before any compaction).
    let after_overwrites = st.mem_used_total;
    let writeback = backing_path.as_ref().map(|p| WritebackReport {
        backing_file: p.display().to_string(),
        buffered_io: buffered_io.clone(),
        max_pool_bytes: st.max_pool_bytes,
        written_back_pages: st.written_back_pages,
        backing_bytes_written: st.backing_bytes_written,
        uncompressed_baseline_bytes: st.written_back_pages * PAGE_SIZE as u64,
        written_vs_baseline: st.backing_bytes_written as f64 / (st.written_back_pages * PAGE_SIZE as u64).max(1) as f64,
        bd_stat: st.bd_stat(),
        bd_count: st.bd_count,
        bd_reads: st.bd_reads,
        bd_writes: st.bd_writes,
        backing_bytes_read: st.backing_bytes_read,
        backing_file_bytes: st.backing_file_bytes,
        backing_live_bytes: st.backing_live_bytes,
        promoted_pages: st.promoted_pages,
        pool_limit_hit: st.pool_limit_hit,
    });
    let st = cold_stats.unwrap_or(st);
    let load_mbps = mbps(orig, best_ld);
    let raw_compress_mbps = mbps(orig, best_rc);
    let raw_decompress_mbps = mbps(orig, best_rd);
    let report = Report {
        pages: n as u64,
        orig_bytes: orig,
        compr_bytes: st.compr_data_size,
        mem_used_bytes: st.mem_used_total,
        same_pages: st.same_pages,
        dup_pages: st.dup_pages,
        dup_data_size: st.dup_data_size,
        meta_data_size: st.meta_data_size,
        huge_pages: st.huge_pages,
        store_mbps,
        store_cold_mbps,
        mem_used_bytes_after_overwrites: after_overwrites,
        load_mbps,
        raw_compress_mbps,
        raw_decompress_mbps,
        raw_compr_bytes: raw_compr,
        store_vs_raw_compress: store_mbps / raw_compress_mbps,
        load_vs_raw_decompress: load_mbps / raw_decompress_mbps,
        compressor: comp.to_string(),
        dedup: a.dedup,
        threads: a.threads,
        repeat: a.repeat,
        verified_pages: n as u64,
        mm_stat: st.mm_stat(),
        sources: set.sources.len(),
        // With a writeback tier most pages are on the file: RAM use is
        // bounded by max_pool, and a ratio against zram would mislead.
        mem_used_vs_kernel_zram: kernel_zram
            .as_ref()
            .filter(|_| backing_path.is_none())
            .map(|k| st.mem_used_total as f64 / k.mem_used_bytes.max(1) as f64),
        stats: st,
        writeback,
        kernel_zram,
        kernel_zram_skipped,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &Report) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "zmem bench store: {} pages ({:.1} MiB) from {} sources, {}, dedup {}, {} thread(s), best of {}",
        r.pages,
        mib(r.orig_bytes),
        r.sources,
        r.compressor,
        if r.dedup { "on" } else { "off" },
        r.threads,
        r.repeat
    );
    println!("  all {} pages verified byte for byte", r.verified_pages);
    println!();
    println!("  {:<22} {:>14} {:>14}", "", "zmem", "kernel zram");
    let kz = r.kernel_zram.as_ref();
    let col = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!(
        "  {:<22} {:>14.1} {:>14}",
        "compressed MiB",
        mib(r.compr_bytes),
        col(kz.map(|k| format!("{:.1}", mib(k.compr_bytes))))
    );
    println!(
        "  {:<22} {:>14.1} {:>14}",
        "memory used MiB",
        mib(r.mem_used_bytes),
        col(kz.map(|k| format!("{:.1}", mib(k.mem_used_bytes))))
    );
    println!(
        "  {:<22} {:>14} {:>14}",
        "same / huge pages",
        format!("{} / {}", r.same_pages, r.huge_pages),
        col(kz.map(|k| format!("{} / {}", k.same_pages, k.huge_pages)))
    );
    println!(
        "  {:<22} {:>14.0} {:>14}",
        "store / write MB/s",
        r.store_mbps,
        col(kz.map(|k| format!("{:.0}", k.write_mbps)))
    );
    println!(
        "  {:<22} {:>14.0} {:>14}",
        "load / read MB/s",
        r.load_mbps,
        col(kz.map(|k| format!("{:.0}", k.read_mbps)))
    );
    println!();
    println!(
        "  first store into a fresh pool (page faults included): {:.0} MB/s",
        r.store_cold_mbps
    );
    println!(
        "  raw {}: compress {:.0} MB/s, decompress {:.0} MB/s; store at {:.2}x, load at {:.2}x of raw",
        r.compressor, r.raw_compress_mbps, r.raw_decompress_mbps, r.store_vs_raw_compress, r.load_vs_raw_decompress
    );
    if r.dedup {
        println!(
            "  dedup: {} pages shared, {:.1} MiB saved, {:.1} MiB metadata",
            r.dup_pages,
            mib(r.dup_data_size),
            mib(r.meta_data_size)
        );
    }
    if let Some(w) = &r.writeback {
        println!(
            "  writeback: max_pool {:.1} MiB, {} pages written back, {:.1} MiB written to {} ({:.3}x of {:.1} MiB uncompressed)",
            mib(w.max_pool_bytes),
            w.written_back_pages,
            mib(w.backing_bytes_written),
            w.backing_file,
            w.written_vs_baseline,
            mib(w.uncompressed_baseline_bytes)
        );
        println!("  bd_stat: {}  (file {:.1} MiB, live {:.1} MiB)", w.bd_stat, mib(w.backing_file_bytes), mib(w.backing_live_bytes));
    }
    if let Some(x) = r.mem_used_vs_kernel_zram {
        println!("  memory used vs kernel zram: {x:.3}x");
    }
    if let Some(why) = &r.kernel_zram_skipped {
        println!("  kernel zram: not compared ({why})");
    }
    println!("  mm_stat: {}", r.mm_stat);
}
