//! `zmem bench store`: the engine measured against its own ceiling and the kernel.
//!
//! One run, same pages, side by side:
//! * **raw**: the compressor alone, page by page into a scratch buffer, then
//!   decompression of those outputs — the ceiling no store can beat;
//! * **store/load**: the same pages through a [`Pool`] (same-filled check,
//!   dedup, compression, allocation, index), loaded back into a separate
//!   buffer and verified byte for byte after the timed pass;
//! * **kernel_zram**: as root, the same pages written to and read from
//!   `/dev/zramN` with the same algorithm (see [`crate::kernel_zram`]).
//!
//! Every timed pass runs `repeat` times, interleaved (raw, store, load,
//! raw, ...), and the best time of each is reported: this 2-core machine is
//! noisy, and ratios of bests within one run are what we compare.
//! MB/s is 10^6 bytes of uncompressed data per second.
//!
//! [`run`] does the work and reports through a progress callback; the
//! `zmem` binary turns [`Progress`] into a progress bar and prints
//! [`render`]'s table or the [`Report`] as JSON.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;
use zmem_compress::Compressor;
use zmem_core::{Pool, PoolConfig, Stats};

use crate::pages::{self, PageSet, PAGE_SIZE};

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Files or directories to read, each file cut into 4 KiB pages (tail
    /// zero-padded). With neither paths nor `pid`:
    /// /usr/lib/x86_64-linux-gnu plus the anonymous memory of a freshly
    /// started python3 process.
    pub paths: Vec<PathBuf>,
    /// Also read the anonymous memory of this live process.
    pub pid: Option<u32>,
    pub compressor: Compressor,
    /// Deduplicate identical pages.
    pub dedup: bool,
    /// Threads for the store, load and raw passes (1 to 256).
    pub threads: usize,
    /// Timed passes (at least 1); the best of each is reported.
    pub repeat: usize,
    /// Stop reading input after this much data.
    pub max_bytes: Option<u64>,
    /// Objects compressed to this many bytes or more are stored raw.
    pub huge_threshold: usize,
    /// zswap's max_pool; past it the coldest pages are written back,
    /// compressed, to `backing`.
    pub max_pool: Option<MaxPool>,
    /// Backing file for writeback (default with `max_pool`: a temporary
    /// file in $TMPDIR, removed afterwards).
    pub backing: Option<PathBuf>,
    /// Write the same pages to kernel zram too.
    pub kernel: bool,
    /// Recompression algorithms by priority (empty: none): after the timed
    /// passes, every page is recompressed and loads are timed again.
    pub recompress: Vec<Compressor>,
}

/// The pool's cap, as given: a size, or a share of the data set (known
/// only once the pages are read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxPool {
    Bytes(u64),
    /// `num / den` of the data set (0 < num <= den), at least one page.
    ShareOfData {
        num: u64,
        den: u64,
    },
}

impl MaxPool {
    /// The cap in bytes for a data set of `data_bytes`.
    pub fn of(self, data_bytes: u64) -> u64 {
        match self {
            MaxPool::Bytes(b) => b,
            MaxPool::ShareOfData { num, den } => (data_bytes * num / den).max(PAGE_SIZE as u64),
        }
    }
}

/// How far a run is, for the caller to show.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// The pages are read; the timed passes take this many steps in all.
    Passes { steps: u64 },
    /// A timed pass begins: `store, cold`, `store` or `load`.
    Pass(&'static str),
    /// This many more steps are done.
    Advance(u64),
    /// The timed passes are over.
    PassesDone,
    /// The same pages are being written to kernel zram.
    KernelZram,
    /// Worth telling, not worth stopping for (no live-process data,
    /// buffered I/O on the backing file).
    Note(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub pages: u64,
    pub orig_bytes: u64,
    pub compr_bytes: u64,
    pub mem_used_bytes: u64,
    pub same_pages: u64,
    pub dup_pages: u64,
    pub dup_data_size: u64,
    pub meta_data_size: u64,
    pub huge_pages: u64,
    /// Best warm pass (pool already holds the data; keys overwritten).
    pub store_mbps: f64,
    /// First pass, into a fresh pool: includes the kernel's page faults.
    pub store_cold_mbps: f64,
    /// mem_used_total after the warm passes overwrote every key (no compaction).
    pub mem_used_bytes_after_overwrites: u64,
    pub load_mbps: f64,
    pub raw_compress_mbps: f64,
    pub raw_decompress_mbps: f64,
    pub raw_compr_bytes: u64,
    pub store_vs_raw_compress: f64,
    pub load_vs_raw_decompress: f64,
    pub compressor: String,
    pub dedup: bool,
    pub threads: usize,
    pub repeat: usize,
    pub verified_pages: u64,
    pub mm_stat: String,
    pub sources: usize,
    pub stats: Stats,
    pub kernel_zram: Option<crate::kernel_zram::ZramResult>,
    pub kernel_zram_skipped: Option<String>,
    pub mem_used_vs_kernel_zram: Option<f64>,
    pub writeback: Option<WritebackReport>,
    pub recompress: Option<RecompressReport>,
}

/// "Store with the fast compressor, then recompress": what it saves, what
/// it costs, and what loads cost afterwards. Memory is compared compacted
/// on both sides; load speeds are the best of `repeat` per page, summed
/// over the pages in each group, before and after, in one run.
#[derive(Debug, Clone, Serialize)]
pub struct RecompressReport {
    pub algorithms: Vec<String>,
    pub recompress_secs: f64,
    /// MB/s of original data passed through recompression.
    pub recompress_mbps: f64,
    pub recompressed_pages: u64,
    pub saved_bytes: u64,
    pub marked_pages: u64,
    pub compr_bytes_before: u64,
    pub compr_bytes_after: u64,
    pub mem_used_bytes_before: u64,
    pub mem_used_bytes_after: u64,
    pub mem_used_after_vs_before: f64,
    /// Objects the first compressor wrote that idle recompression left
    /// alone (they were read meanwhile): their load speed, loaded alone,
    /// before it and after it, and the ratio (loads of pages never
    /// recompressed must not slow).
    pub untouched_pages: u64,
    pub untouched_load_mbps_before: f64,
    pub untouched_load_mbps_after: f64,
    pub untouched_after_vs_before: f64,
    /// Pages rewritten: load speed before (first compressor) and after.
    pub recompressed_load_mbps_before: f64,
    pub recompressed_load_mbps_after: f64,
}

/// The best time of `repeat` loads of each page of `keys`, page by page
/// (single thread; the timer's own cost is the same before and after).
fn load_times(pool: &Pool, keys: &[u64], repeat: usize) -> anyhow::Result<Vec<f64>> {
    let mut best = vec![f64::MAX; keys.len()];
    let mut buf = vec![0u8; PAGE_SIZE];
    for _ in 0..repeat {
        for (&k, b) in keys.iter().zip(best.iter_mut()) {
            let t = Instant::now();
            pool.load(k, &mut buf).with_context(|| format!("loading page {k}"))?;
            *b = b.min(t.elapsed().as_secs_f64());
        }
    }
    Ok(best)
}

/// How long pages must sit unread to count as idle in the recompression pass.
const IDLE_SECS: u32 = 2;

/// zram's "store with lz4, recompress idle pages": every page of `pool`
/// (holding `n`) is left idle, then half of them (every other block of 16
/// keys, loaded meanwhile, so not idle) are kept as they are while
/// `Recompress { idle }` rewrites the rest. The kept half is loaded alone
/// before and after, so its speed is compared with nothing else in the
/// caches; then the rest is recompressed too, for the memory figure.
pub(crate) fn recompress_pass(pool: &Pool, n: usize, repeat: usize, algos: &[Compressor]) -> anyhow::Result<RecompressReport> {
    pool.compact();
    let before = pool.stats();
    let all: Vec<u64> = (0..n as u64).collect();
    let t_before = load_times(pool, &all, 1)?;
    std::thread::sleep(std::time::Duration::from_secs(u64::from(IDLE_SECS) + 1));
    let kept: Vec<u64> = all.iter().copied().filter(|k| (k >> 4) % 2 == 0).collect();
    let kept_before = load_times(pool, &kept, repeat)?;
    let t = Instant::now();
    let idle = pool.recompress(&zmem_core::Recompress { idle_secs: Some(IDLE_SECS), ..Default::default() })?;
    let mut recompress_secs = t.elapsed().as_secs_f64();
    let kept_after = load_times(pool, &kept, repeat)?;
    let untouched: Vec<bool> = kept.iter().map(|&k| pool.recomp_priority(k) == Some(0)).collect();
    let t = Instant::now();
    let rest = pool.recompress(&zmem_core::Recompress::default())?;
    recompress_secs += t.elapsed().as_secs_f64();
    let after = pool.stats();
    let t_after = load_times(pool, &all, 1)?;
    let rewritten: Vec<bool> = all.iter().map(|&k| pool.recomp_priority(k).is_some_and(|p| p > 0)).collect();
    let group = |times: &[f64], members: &[bool]| -> (u64, f64) {
        let (count, secs) = times.iter().zip(members).filter(|(_, &m)| m).fold((0u64, 0.0), |(c, s), (t, _)| (c + 1, s + t));
        (count, if count == 0 { 0.0 } else { mbps(count * PAGE_SIZE as u64, secs) })
    };
    let (untouched_pages, ub) = group(&kept_before, &untouched);
    let (_, ua) = group(&kept_after, &untouched);
    let (_, rb) = group(&t_before, &rewritten);
    let (_, ra) = group(&t_after, &rewritten);
    let mut r = idle;
    r += rest;
    Ok(RecompressReport {
        algorithms: algos.iter().map(|c| c.to_string()).collect(),
        recompress_secs,
        recompress_mbps: mbps((n * PAGE_SIZE) as u64, recompress_secs),
        recompressed_pages: r.recompressed,
        saved_bytes: r.saved_bytes,
        marked_pages: r.marked,
        compr_bytes_before: before.compr_data_size,
        compr_bytes_after: after.compr_data_size,
        mem_used_bytes_before: before.mem_used_total,
        mem_used_bytes_after: after.mem_used_total,
        mem_used_after_vs_before: after.mem_used_total as f64 / before.mem_used_total.max(1) as f64,
        untouched_pages,
        untouched_load_mbps_before: ub,
        untouched_load_mbps_after: ua,
        untouched_after_vs_before: if ub > 0.0 { ua / ub } else { 0.0 },
        recompressed_load_mbps_before: rb,
        recompressed_load_mbps_after: ra,
    })
}

/// The writeback tier's figures, over the whole run.
#[derive(Debug, Clone, Serialize)]
pub struct WritebackReport {
    pub backing_file: String,
    /// Why O_DIRECT is not used, if it is not.
    pub buffered_io: Option<String>,
    pub max_pool_bytes: u64,
    pub written_back_pages: u64,
    /// Bytes really written to the backing file.
    pub backing_bytes_written: u64,
    /// What writing those pages back uncompressed would have cost (pages × 4096).
    pub uncompressed_baseline_bytes: u64,
    pub written_vs_baseline: f64,
    pub bd_stat: String,
    pub bd_count: u64,
    pub bd_reads: u64,
    pub bd_writes: u64,
    pub backing_bytes_read: u64,
    pub backing_file_bytes: u64,
    pub backing_live_bytes: u64,
    pub promoted_pages: u64,
    pub pool_limit_hit: u64,
}

/// Megabytes (10^6 bytes) per second; 0 for no time at all.
/// Load every page of `data` (page `i` under key `i`) and compare it;
/// `when` ends the error ("after recompression").
pub(crate) fn verify(pool: &Pool, data: &[u8], when: &str) -> anyhow::Result<()> {
    let mut buf = vec![0u8; PAGE_SIZE];
    for (i, want) in data.chunks_exact(PAGE_SIZE).enumerate() {
        pool.load(i as u64, &mut buf).with_context(|| format!("loading page {i}"))?;
        if buf != want {
            bail!("page {i} read back wrong{when}: this is a bug, please report it");
        }
    }
    Ok(())
}

pub(crate) fn mbps(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        0.0
    } else {
        bytes as f64 / 1e6 / secs
    }
}

fn load_pages(cfg: &Config, progress: &mut impl FnMut(Progress)) -> anyhow::Result<PageSet> {
    let mut set = PageSet::default();
    let default = cfg.paths.is_empty() && cfg.pid.is_none();
    let paths = if default { vec![PathBuf::from("/usr/lib/x86_64-linux-gnu")] } else { cfg.paths.clone() };
    if !paths.is_empty() {
        set = pages::read_paths(&paths, cfg.max_bytes).with_context(|| format!("reading {}", paths[0].display()))?;
    }
    let mut extra = |p: PageSet| {
        set.data.extend_from_slice(&p.data);
        set.sources.extend(p.sources);
    };
    if let Some(pid) = cfg.pid {
        extra(pages::read_process(pid, cfg.max_bytes)?);
    } else if default {
        // The built-in live process: a python3 heap of dicts, strings, numbers.
        match pages::spawn_default_process(64 << 20) {
            Ok(mut child) => {
                let r = pages::read_process(child.id(), Some(256 << 20));
                let _ = child.kill();
                let _ = child.wait();
                extra(r?);
            }
            Err(e) => progress(Progress::Note(format!("no live-process data: {e:#}"))),
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
        hs.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("benchmark thread panicked"))?).collect::<anyhow::Result<Vec<()>>>()
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

/// Run the bench: read the pages, time the passes, verify every page, and
/// (if `cfg.kernel`) compare with kernel zram.
pub fn run(cfg: &Config, mut progress: impl FnMut(Progress)) -> anyhow::Result<Report> {
    check_config(cfg)?;
    let set = load_pages(cfg, &mut progress)?;
    let n = set.pages();
    let data = &set.data;
    progress(Progress::Passes { steps: (cfg.repeat * 4 * n) as u64 });
    let mut bufs = Buffers::touched(cfg.compressor, n, data.len());
    let max_pool = cfg.max_pool.map(|m| m.of((n * PAGE_SIZE) as u64));
    let backing = backing_file(cfg, max_pool)?;
    let (pool, buffered_io) = new_pool(cfg, max_pool, backing.path.as_deref(), &mut progress)?;
    let passes = timed_passes(cfg, data, &pool, &mut bufs, &mut progress)?;
    verify_every_page(&pool, data, n)?;
    let st = pool.stats();
    let recompress = recompress_if_asked(cfg, &pool, data, n, &mut progress)?;
    drop(pool);
    let kernel = kernel_zram_pass(cfg, data, &mut progress);
    let writeback = backing.path.as_deref().map(|p| writeback_report(p, buffered_io, &st));
    Ok(assemble_report(cfg, &set, passes, st, kernel, writeback, recompress))
}

/// Refuse a thread count or a repeat count out of range.
fn check_config(cfg: &Config) -> anyhow::Result<()> {
    if cfg.threads == 0 || cfg.threads > 256 {
        bail!("--threads must be between 1 and 256");
    }
    if cfg.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    Ok(())
}

/// The raw compressor's outputs and the load buffer of the timed passes.
struct Buffers {
    /// The compressor's worst case for a page: the size of a slot of `raw_out`.
    bound: usize,
    /// Raw compressor outputs, one slot per page, sized for the worst case.
    raw_out: Vec<u8>,
    raw_len: Vec<u32>,
    /// Where loads and raw decompression write the pages.
    out: Vec<u8>,
}

impl Buffers {
    /// The buffers for `n` pages (`data_len` bytes), touched now, so no timed pass pays their page faults.
    fn touched(comp: Compressor, n: usize, data_len: usize) -> Buffers {
        let bound = comp.algorithm.compress_bound(PAGE_SIZE);
        let mut raw_out = vec![0u8; n * bound];
        let raw_len = vec![0u32; n];
        let mut out = vec![0u8; data_len];
        raw_out.fill(1);
        out.fill(1);
        Buffers { bound, raw_out, raw_len, out }
    }
}

/// The backing file, when the run has a writeback tier; a temporary one is removed when this drops.
struct Backing {
    path: Option<PathBuf>,
    _tmp: Option<tempfile::NamedTempFile>,
}

/// The run's backing file: `cfg.backing`, or with a pool cap and no file given, a temporary file.
fn backing_file(cfg: &Config, max_pool: Option<u64>) -> anyhow::Result<Backing> {
    Ok(match (&cfg.backing, max_pool) {
        (Some(p), _) => Backing { path: Some(p.clone()), _tmp: None },
        (None, Some(_)) => {
            let f = tempfile::Builder::new().prefix("zmem-backing-").tempfile()?;
            Backing { path: Some(f.path().to_path_buf()), _tmp: Some(f) }
        }
        (None, None) => Backing { path: None, _tmp: None },
    })
}

/// A fresh pool with the backing file as its cold store, if any; and why that file does buffered I/O, if it does.
fn new_pool(cfg: &Config, max_pool: Option<u64>, backing: Option<&Path>, progress: &mut impl FnMut(Progress)) -> anyhow::Result<(Pool, Option<String>)> {
    let pool_cfg = PoolConfig {
        compressor: cfg.compressor,
        dedup: cfg.dedup,
        huge_threshold: cfg.huge_threshold,
        max_pool,
        recomp_algorithms: cfg.recompress.clone(),
        ..PoolConfig::default()
    };
    let mut buffered_io = None;
    let pool = match backing {
        Some(p) => {
            let (store, why) =
                zmem_backing::BackingStore::open(p, None, zmem_backing::Existing::Refuse).with_context(|| format!("opening backing file {}", p.display()))?;
            if let Some(why) = why {
                progress(Progress::Note(why.clone()));
                buffered_io = Some(why);
            }
            Pool::with_cold_store(pool_cfg, Box::new(store))?
        }
        None => Pool::new(pool_cfg)?,
    };
    Ok((pool, buffered_io))
}

/// What the timed passes measured: each pass's time (the sum of its
/// chunks' bests), the first store's, and what the raw compressor wrote.
struct Passes {
    raw_compress: f64,
    store: f64,
    load: f64,
    raw_decompress: f64,
    /// The first store, into the fresh pool.
    cold_store: f64,
    /// The pool's stats after that first store.
    cold_stats: Option<Stats>,
    raw_compr_bytes: u64,
}

/// The timed passes, `cfg.repeat` times over: per chunk the raw compressor then the store, then per chunk the load then the raw decompressor.
fn timed_passes(cfg: &Config, data: &[u8], pool: &Pool, b: &mut Buffers, progress: &mut impl FnMut(Progress)) -> anyhow::Result<Passes> {
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
    let n = data.len() / PAGE_SIZE;
    let nchunks = n.div_ceil(CHUNK);
    let chunk = |c: usize| c * CHUNK..((c + 1) * CHUNK).min(n);
    let (comp, threads) = (cfg.compressor, cfg.threads);
    let mut rc_t = vec![f64::MAX; nchunks];
    let mut st_t = vec![f64::MAX; nchunks];
    let mut ld_t = vec![f64::MAX; nchunks];
    let mut rd_t = vec![f64::MAX; nchunks];
    let mut cold_st = 0.0;
    let mut cold_stats: Option<Stats> = None;
    for rep in 0..cfg.repeat {
        let cold = rep == 0;
        progress(Progress::Pass(if cold { "store, cold" } else { "store" }));
        for c in 0..nchunks {
            let r = chunk(c);
            let secs = raw_compress_chunk(comp, data, &r, threads, b)?;
            rc_t[c] = rc_t[c].min(secs);
            if cfg.dedup && !cold {
                pool.invalidate_range(r.start as u64..r.end as u64);
            }
            let secs = store_chunk(pool, data, &r, threads)?;
            if cold {
                cold_st += secs;
            }
            // The headline store figure is the best warm pass (the cold one
            // when it is the only one).
            if !cold || cfg.repeat == 1 {
                st_t[c] = st_t[c].min(secs);
            }
            progress(Progress::Advance(2 * r.len() as u64));
        }
        if cold {
            cold_stats = Some(pool.stats());
        }
        progress(Progress::Pass("load"));
        for c in 0..nchunks {
            let r = chunk(c);
            let secs = load_chunk(pool, &r, threads, &mut b.out)?;
            ld_t[c] = ld_t[c].min(secs);
            let secs = raw_decompress_chunk(comp, &r, threads, b)?;
            rd_t[c] = rd_t[c].min(secs);
            progress(Progress::Advance(2 * r.len() as u64));
        }
    }
    progress(Progress::PassesDone);
    let sum = |t: &[f64]| -> f64 { t.iter().sum() };
    let raw_compr_bytes = b.raw_len.iter().map(|&l| l as u64).sum();
    Ok(Passes { raw_compress: sum(&rc_t), store: sum(&st_t), load: sum(&ld_t), raw_decompress: sum(&rd_t), cold_store: cold_st, cold_stats, raw_compr_bytes })
}

/// The raw compressor over the pages of `r`, each into its slot of `b.raw_out`: the time it took.
fn raw_compress_chunk(comp: Compressor, data: &[u8], r: &Range<usize>, threads: usize, b: &mut Buffers) -> anyhow::Result<f64> {
    let bound = b.bound;
    timed(|| {
        let outs = split(r, threads, &mut b.raw_out[r.start * bound..r.end * bound], bound);
        let lens = split(r, threads, &mut b.raw_len[r.clone()], 1);
        par(outs.into_iter().zip(lens).collect(), |((first, o), (_, l))| {
            for (i, len) in l.iter_mut().enumerate() {
                let p = &data[(first + i) * PAGE_SIZE..][..PAGE_SIZE];
                *len = comp.compress(p, &mut o[i * bound..][..bound]).unwrap_or(0) as u32;
            }
            Ok(())
        })
    })
}

/// The pages of `r` stored into `pool`, page `i` under key `i`: the time it took.
fn store_chunk(pool: &Pool, data: &[u8], r: &Range<usize>, threads: usize) -> anyhow::Result<f64> {
    timed(|| {
        let per = r.len().div_ceil(threads).max(1);
        let runs = r.clone().step_by(per).map(|f| f..(f + per).min(r.end)).collect();
        par(runs, |run: Range<usize>| {
            for i in run {
                pool.store(i as u64, &data[i * PAGE_SIZE..][..PAGE_SIZE]).with_context(|| format!("storing page {i}"))?;
            }
            Ok(())
        })
    })
}

/// The pages of `r` loaded from `pool` into `out`: the time it took.
fn load_chunk(pool: &Pool, r: &Range<usize>, threads: usize, out: &mut [u8]) -> anyhow::Result<f64> {
    timed(|| {
        let dst = &mut out[r.start * PAGE_SIZE..r.end * PAGE_SIZE];
        par(split(r, threads, dst, PAGE_SIZE), |(first, d)| {
            for (j, page) in d.chunks_exact_mut(PAGE_SIZE).enumerate() {
                let i = first + j;
                pool.load(i as u64, page).with_context(|| format!("loading page {i}"))?;
            }
            Ok(())
        })
    })
}

/// The raw compressor's outputs for the pages of `r` decompressed into `b.out`: the time it took.
fn raw_decompress_chunk(comp: Compressor, r: &Range<usize>, threads: usize, b: &mut Buffers) -> anyhow::Result<f64> {
    let Buffers { bound, raw_out, raw_len, out } = b;
    let bound = *bound;
    timed(|| {
        let dst = &mut out[r.start * PAGE_SIZE..r.end * PAGE_SIZE];
        par(split(r, threads, dst, PAGE_SIZE), |(first, d)| {
            for (j, page) in d.chunks_exact_mut(PAGE_SIZE).enumerate() {
                let i = first + j;
                let src = &raw_out[i * bound..][..raw_len[i] as usize];
                let _ = zmem_compress::decompress(comp.algorithm, src, page);
            }
            Ok(())
        })
    })
}

/// Every page loaded again and compared, outside the timed passes; any page read back wrong fails the run.
fn verify_every_page(pool: &Pool, data: &[u8], n: usize) -> anyhow::Result<()> {
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
    Ok(())
}

/// With `cfg.recompress`, the recompression pass, then every page verified again.
fn recompress_if_asked(cfg: &Config, pool: &Pool, data: &[u8], n: usize, progress: &mut impl FnMut(Progress)) -> anyhow::Result<Option<RecompressReport>> {
    if cfg.recompress.is_empty() {
        return Ok(None);
    }
    progress(Progress::Pass("recompress"));
    let r = recompress_pass(pool, n, cfg.repeat, &cfg.recompress)?;
    verify(pool, data, " after recompression")?;
    Ok(Some(r))
}

/// With `cfg.kernel`, the same pages through kernel zram with the same algorithm; otherwise, or when it cannot run, why not.
fn kernel_zram_pass(cfg: &Config, data: &[u8], progress: &mut impl FnMut(Progress)) -> (Option<crate::kernel_zram::ZramResult>, Option<String>) {
    if !cfg.kernel {
        (None, Some("skipped: --no-kernel".to_string()))
    } else {
        progress(Progress::KernelZram);
        match crate::kernel_zram::run(data, cfg.compressor.algorithm.name()) {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(e.reason)),
        }
    }
}

/// The writeback tier's figures from the pool's stats after the timed passes.
fn writeback_report(backing_file: &Path, buffered_io: Option<String>, st: &Stats) -> WritebackReport {
    WritebackReport {
        backing_file: backing_file.display().to_string(),
        buffered_io,
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
    }
}

/// The Report: speeds from the passes, memory from the first store (`st` is the pool's stats after the timed passes).
fn assemble_report(
    cfg: &Config,
    set: &PageSet,
    passes: Passes,
    st: Stats,
    (kernel_zram, kernel_zram_skipped): (Option<crate::kernel_zram::ZramResult>, Option<String>),
    writeback: Option<WritebackReport>,
    recompress: Option<RecompressReport>,
) -> Report {
    let n = set.pages();
    let orig = (n * PAGE_SIZE) as u64;
    let store_mbps = mbps(orig, passes.store);
    let store_cold_mbps = mbps(orig, passes.cold_store);
    // Memory is reported for the data stored once into a fresh pool — the
    // same operation kernel zram is measured on — and, separately, after
    // the warm overwrite passes (before any compaction).
    let after_overwrites = st.mem_used_total;
    let st = passes.cold_stats.unwrap_or(st);
    let load_mbps = mbps(orig, passes.load);
    let raw_compress_mbps = mbps(orig, passes.raw_compress);
    let raw_decompress_mbps = mbps(orig, passes.raw_decompress);
    Report {
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
        raw_compr_bytes: passes.raw_compr_bytes,
        store_vs_raw_compress: store_mbps / raw_compress_mbps,
        load_vs_raw_decompress: load_mbps / raw_decompress_mbps,
        compressor: cfg.compressor.to_string(),
        dedup: cfg.dedup,
        threads: cfg.threads,
        repeat: cfg.repeat,
        verified_pages: n as u64,
        mm_stat: st.mm_stat(),
        sources: set.sources.len(),
        // With a writeback tier most pages are on the file: RAM use is
        // bounded by max_pool, and a ratio against zram would mislead.
        mem_used_vs_kernel_zram: kernel_zram.as_ref().filter(|_| writeback.is_none()).map(|k| st.mem_used_total as f64 / k.mem_used_bytes.max(1) as f64),
        stats: st,
        writeback,
        recompress,
        kernel_zram,
        kernel_zram_skipped,
    }
}

/// The report as a table: zmem and kernel zram side by side, then the raw
/// compressor, dedup, writeback and zram's `mm_stat` line.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    out += &format!(
        "zmem bench store: {} pages ({:.1} MiB) from {} sources, {}, dedup {}, {} thread(s), best of {}\n",
        r.pages,
        mib(r.orig_bytes),
        r.sources,
        r.compressor,
        if r.dedup { "on" } else { "off" },
        r.threads,
        r.repeat
    );
    out += &format!("  all {} pages verified byte for byte\n", r.verified_pages);
    out.push('\n');
    out += &format!("  {:<22} {:>14} {:>14}\n", "", "zmem", "kernel zram");
    let kz = r.kernel_zram.as_ref();
    let col = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    out += &format!("  {:<22} {:>14.1} {:>14}\n", "compressed MiB", mib(r.compr_bytes), col(kz.map(|k| format!("{:.1}", mib(k.compr_bytes)))));
    out += &format!("  {:<22} {:>14.1} {:>14}\n", "memory used MiB", mib(r.mem_used_bytes), col(kz.map(|k| format!("{:.1}", mib(k.mem_used_bytes)))));
    out += &format!(
        "  {:<22} {:>14} {:>14}\n",
        "same / huge pages",
        format!("{} / {}", r.same_pages, r.huge_pages),
        col(kz.map(|k| format!("{} / {}", k.same_pages, k.huge_pages)))
    );
    out += &format!("  {:<22} {:>14.0} {:>14}\n", "store / write MB/s", r.store_mbps, col(kz.map(|k| format!("{:.0}", k.write_mbps))));
    out += &format!("  {:<22} {:>14.0} {:>14}\n", "load / read MB/s", r.load_mbps, col(kz.map(|k| format!("{:.0}", k.read_mbps))));
    out.push('\n');
    out += &format!("  first store into a fresh pool (page faults included): {:.0} MB/s\n", r.store_cold_mbps);
    out += &format!(
        "  raw {}: compress {:.0} MB/s, decompress {:.0} MB/s; store at {:.2}x, load at {:.2}x of raw\n",
        r.compressor, r.raw_compress_mbps, r.raw_decompress_mbps, r.store_vs_raw_compress, r.load_vs_raw_decompress
    );
    if r.dedup {
        out += &format!("  dedup: {} pages shared, {:.1} MiB saved, {:.1} MiB metadata\n", r.dup_pages, mib(r.dup_data_size), mib(r.meta_data_size));
    }
    if let Some(c) = &r.recompress {
        out += &format!(
            "  recompress with {}: {} pages rewritten in {:.1} s ({:.0} MB/s), {} marked; compressed {:.1} -> {:.1} MiB, memory {:.1} -> {:.1} MiB ({:.3}x)\n",
            c.algorithms.join(", "),
            c.recompressed_pages,
            c.recompress_secs,
            c.recompress_mbps,
            c.marked_pages,
            mib(c.compr_bytes_before),
            mib(c.compr_bytes_after),
            mib(c.mem_used_bytes_before),
            mib(c.mem_used_bytes_after),
            c.mem_used_after_vs_before
        );
        out += &format!(
            "  loads after recompression: {} untouched pages {:.0} -> {:.0} MB/s ({:.3}x); rewritten pages {:.0} -> {:.0} MB/s\n",
            c.untouched_pages,
            c.untouched_load_mbps_before,
            c.untouched_load_mbps_after,
            c.untouched_after_vs_before,
            c.recompressed_load_mbps_before,
            c.recompressed_load_mbps_after
        );
    }
    if let Some(w) = &r.writeback {
        out += &format!(
            "  writeback: max_pool {:.1} MiB, {} pages written back, {:.1} MiB written to {} ({:.3}x of {:.1} MiB uncompressed)\n",
            mib(w.max_pool_bytes),
            w.written_back_pages,
            mib(w.backing_bytes_written),
            w.backing_file,
            w.written_vs_baseline,
            mib(w.uncompressed_baseline_bytes)
        );
        out += &format!("  bd_stat: {}  (file {:.1} MiB, live {:.1} MiB)\n", w.bd_stat, mib(w.backing_file_bytes), mib(w.backing_live_bytes));
    }
    if let Some(x) = r.mem_used_vs_kernel_zram {
        out += &format!("  memory used vs kernel zram: {x:.3}x\n");
    }
    if let Some(why) = &r.kernel_zram_skipped {
        out += &format!("  kernel zram: not compared ({why})\n");
    }
    out += &format!("  mm_stat: {}\n", r.mm_stat);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use zmem_testkit::XorShift;

    #[test]
    fn max_pool_shares_of_the_data() {
        assert_eq!(MaxPool::Bytes(64 << 20).of(1 << 30), 64 << 20);
        assert_eq!(MaxPool::ShareOfData { num: 1, den: 8 }.of(1 << 30), 128 << 20);
        // Never below one page.
        assert_eq!(MaxPool::ShareOfData { num: 1, den: 8 }.of(8192), PAGE_SIZE as u64);
    }

    fn config(path: PathBuf) -> Config {
        Config {
            paths: vec![path],
            pid: None,
            compressor: "lz4".parse().unwrap(),
            dedup: false,
            threads: 2,
            repeat: 2,
            max_bytes: None,
            huge_threshold: zmem_core::DEFAULT_HUGE_THRESHOLD,
            max_pool: None,
            backing: None,
            kernel: false,
            recompress: vec![],
        }
    }

    #[test]
    fn runs_reports_and_renders() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("data");
        let mut data = vec![0u8; 8 * PAGE_SIZE];
        data.extend((0..8 * PAGE_SIZE).map(|i| (i % 251) as u8));
        std::fs::write(&f, &data).unwrap();
        let mut seen = Vec::new();
        let r = run(&config(f), |p| seen.push(p)).unwrap();
        assert_eq!((r.pages, r.verified_pages, r.same_pages), (16, 16, 8));
        assert_eq!(r.kernel_zram_skipped.as_deref(), Some("skipped: --no-kernel"));
        assert_eq!(seen.first(), Some(&Progress::Passes { steps: 2 * 4 * 16 }));
        let steps: u64 = seen.iter().map(|p| if let Progress::Advance(n) = p { *n } else { 0 }).sum();
        assert_eq!(steps, 2 * 4 * 16, "{seen:?}");
        assert_eq!(seen.last(), Some(&Progress::PassesDone));
        let table = render(&r);
        assert!(table.starts_with("zmem bench store: 16 pages (0.1 MiB) from 1 sources, lz4, dedup off, 2 thread(s), best of 2\n"), "{table}");
        assert!(table.contains("kernel zram: not compared (skipped: --no-kernel)"), "{table}");
        assert!(table.ends_with(&format!("  mm_stat: {}\n", r.mm_stat)), "{table}");
    }

    /// --recompress: pages lz4 leaves raw are rewritten with zstd, memory
    /// drops, loads of both groups are timed, and every page reads back.
    #[test]
    fn recompress_reports_savings_and_load_speeds() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("data");
        let mut r = XorShift::from_state(7);
        let mut data: Vec<u8> = (0..32 * PAGE_SIZE).map(|_| b'0' + r.below(64) as u8).collect();
        // Random pages: raw under both, marked, left untouched.
        let mut random = vec![0u8; 32 * PAGE_SIZE];
        r.fill(&mut random);
        data.extend_from_slice(&random);
        std::fs::write(&f, &data).unwrap();
        let mut c = config(f);
        c.recompress = vec!["zstd:3".parse().unwrap()];
        let r = run(&c, |_| {}).unwrap();
        let rc = r.recompress.as_ref().expect("a recompression report");
        assert_eq!((rc.recompressed_pages, rc.marked_pages), (32, 32), "{rc:?}");
        assert!(rc.mem_used_bytes_after < rc.mem_used_bytes_before, "{rc:?}");
        assert_eq!(rc.compr_bytes_before - rc.compr_bytes_after, rc.saved_bytes);
        assert!(rc.untouched_load_mbps_after > 0.0 && rc.recompressed_load_mbps_after > 0.0, "{rc:?}");
        assert!(rc.untouched_pages > 0 && rc.untouched_pages < 64, "{rc:?}");
        assert!(render(&r).contains("recompress with zstd:3"), "{}", render(&r));
    }

    #[test]
    fn bad_threads_and_repeat_are_refused() {
        let mut c = config(PathBuf::from("/nonexistent"));
        c.threads = 0;
        assert!(run(&c, |_| {}).unwrap_err().to_string().contains("--threads"));
        c.threads = 1;
        c.repeat = 0;
        assert!(run(&c, |_| {}).unwrap_err().to_string().contains("--repeat"));
    }
}
