//! `zmem bench store --dict`: the same pages in every encoding a pool
//! offers, with and without a dictionary it trained itself.
//!
//! For each data set (the `/usr/lib/x86_64-linux-gnu` files, the anonymous
//! memory of a live python process, a cargo build output directory; or
//! the paths and process given), one fresh pool per encoding:
//! * **lz4, zstd:1, zstd:3, zstd:9**: every page stored once;
//! * **lz4+dict, zstd:3+dict, zstd:STRONG+dict**: a pool with `--dict
//!   auto` stores every page (sampling them), then runs a training round
//!   (`Pool::train_dictionary`, what the `zmem-dict` thread does once its
//!   sample ring is full); a fresh pool given that dictionary then stores
//!   every page once, so that every row is one store pass into a fresh
//!   pool (a pool that rewrote its pages would also show the allocator's
//!   fragmentation). A dictionary that does not pay for itself is not
//!   installed, and the row then shows the pool without one;
//! * **lz4, then idle pages recompressed with zstd:STRONG+dict**: stored
//!   with lz4 into a pool holding the zstd:STRONG dictionary, then the
//!   recompression pass of `zmem bench store --recompress` (half the pages
//!   stay lz4 because they are read while the rest is recompressed; then
//!   the rest is rewritten too).
//!
//! Reported per encoding: compressed bytes and `mem_used_total` after
//! compaction (dictionaries, their prepared forms and the sample ring are
//! part of it), both as a ratio to lz4 alone, and the single-thread load
//! speed (best of `repeat` passes). Every page is read back and compared.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use zmem_compress::Compressor;
use zmem_core::{DictConfig, DictSource, Pool, PoolConfig};

use crate::pages::{self, PageSet, PAGE_SIZE};
use crate::store::{mbps, recompress_pass, verify, RecompressReport};

/// What to run on.
#[derive(Debug, Clone)]
pub struct Config {
    /// Pages of these paths and this process make one data set; with
    /// neither, the three default sets.
    pub paths: Vec<PathBuf>,
    pub pid: Option<u32>,
    /// Cap per data set (default 128 MiB).
    pub max_bytes: Option<u64>,
    /// The strong zstd for the dictionary and recompression rows (zstd:9).
    pub strong: Compressor,
    /// Load passes; the best of each is reported.
    pub repeat: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub encoding: String,
    pub compr_bytes: u64,
    pub mem_used_bytes: u64,
    pub compr_vs_lz4: f64,
    pub mem_vs_lz4: f64,
    /// Bytes the dictionaries hold (in mem_used_bytes), and the pages written with one.
    pub dict_bytes: u64,
    pub dict_pages: u64,
    /// Seconds the training round took (dictionary rows).
    pub train_secs: f64,
    /// The first store pass (fresh pool), MB/s.
    pub store_mbps: f64,
    pub load_mbps: f64,
    /// Where mem_used_bytes goes: allocator pages, allocator tables, index.
    pub pool_pages: u64,
    pub alloc_metadata_bytes: u64,
    pub index_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SetReport {
    pub data: String,
    pub pages: u64,
    pub rows: Vec<Row>,
    /// The "lz4, then idle recompression" row's details.
    pub recompress: RecompressReport,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub sets: Vec<SetReport>,
    pub notes: Vec<String>,
}

/// The data sets `cfg` names.
fn data_sets(cfg: &Config, notes: &mut Vec<String>) -> anyhow::Result<Vec<(String, PageSet)>> {
    let cap_bytes = cfg.max_bytes.unwrap_or(128 << 20);
    let cap = Some(cap_bytes);
    if !cfg.paths.is_empty() || cfg.pid.is_some() {
        let mut set = if cfg.paths.is_empty() { PageSet::default() } else { pages::read_paths(&cfg.paths, cap)? };
        if let Some(pid) = cfg.pid {
            set.data.extend_from_slice(&pages::read_process(pid, cap)?.data);
        }
        let name = cfg.paths.iter().map(|p| p.display().to_string()).chain(cfg.pid.map(|p| format!("pid {p}"))).collect::<Vec<_>>().join(" + ");
        return Ok(vec![(name, set)]);
    }
    let mut sets = vec![("/usr/lib/x86_64-linux-gnu".to_string(), pages::read_paths(&[PathBuf::from("/usr/lib/x86_64-linux-gnu")], cap)?)];
    match pages::spawn_default_process(64 << 20) {
        Ok(mut child) => {
            let r = pages::read_process(child.id(), Some(cap_bytes.min(256 << 20)));
            let _ = child.kill();
            let _ = child.wait();
            sets.push(("python3 process (anonymous memory)".into(), r?));
        }
        Err(e) => notes.push(format!("no live-process data: {e:#}")),
    }
    let deps = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/deps");
    match deps.canonicalize() {
        Ok(d) if d.is_dir() => sets.push((format!("cargo build output ({})", d.display()), pages::read_paths(&[d], cap)?)),
        _ => notes.push(format!("no cargo build output at {}: build zmem with --release first", deps.display())),
    }
    Ok(sets)
}

/// Store every page of `set` under its index; the seconds it took.
fn store_all(pool: &Pool, set: &PageSet) -> anyhow::Result<f64> {
    let t = Instant::now();
    for (k, p) in set.iter().enumerate() {
        pool.store(k as u64, p).with_context(|| format!("storing page {k}"))?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Best of `repeat` load passes over every page, in MB/s; then every page
/// is compared with what was stored.
fn load_all(pool: &Pool, set: &PageSet, repeat: usize) -> anyhow::Result<f64> {
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut best = f64::MAX;
    for _ in 0..repeat.max(1) {
        let t = Instant::now();
        for k in 0..set.pages() {
            pool.load(k as u64, &mut buf).with_context(|| format!("loading page {k}"))?;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    verify(pool, &set.data, "")?;
    Ok(mbps(set.len_bytes() as u64, best))
}

fn pool_cfg(c: Compressor, source: DictSource, lz4_dict: bool, recomp: Vec<Compressor>) -> PoolConfig {
    PoolConfig {
        compressor: c,
        recomp_algorithms: recomp,
        dict: DictConfig { source, lz4: lz4_dict, background: false, ..DictConfig::default() },
        ..PoolConfig::default()
    }
}

/// The dictionary a `--dict auto` pool with compressor `c` trains on
/// `set` (None if it did not pay for itself), and the training's seconds.
fn trained(set: &PageSet, c: Compressor, lz4_dict: bool, what: &str) -> anyhow::Result<(DictSource, f64)> {
    let pool = Pool::new(pool_cfg(c, DictSource::Auto, lz4_dict, vec![]))?;
    store_all(&pool, set)?;
    let t = Instant::now();
    let rep = pool.train_dictionary()?;
    let secs = t.elapsed().as_secs_f64();
    match pool.dictionary() {
        Some(d) => Ok((DictSource::Bytes(d), secs)),
        None => {
            eprintln!("zmem: {what}: the trained dictionary did not pay for itself and was not installed ({rep:?})");
            Ok((DictSource::Off, secs))
        }
    }
}

/// Every row for one data set.
fn run_set(name: &str, set: &PageSet, cfg: &Config) -> anyhow::Result<SetReport> {
    let mut rows: Vec<Row> = Vec::new();
    let lz4 = Compressor::default();
    let z = |l: i32| Compressor::zstd(l);
    let strong = cfg.strong;
    for c in [lz4, z(1)?, z(3)?, z(9)?] {
        let pool = Pool::new(pool_cfg(c, DictSource::Off, false, vec![]))?;
        let secs = store_all(&pool, set)?;
        rows.push(row(c.to_string(), &pool, set, secs, 0.0, cfg.repeat)?);
    }
    let mut strong_dict = (DictSource::Off, 0.0);
    for (c, lz4_dict) in [(lz4, true), (z(3)?, false), (strong, false)] {
        let (dict, train_secs) = trained(set, c, lz4_dict, &format!("{name}, {c}+dict"))?;
        let pool = Pool::new(pool_cfg(c, dict.clone(), lz4_dict, vec![]))?;
        let secs = store_all(&pool, set)?;
        rows.push(row(format!("{c}+dict"), &pool, set, secs, train_secs, cfg.repeat)?);
        strong_dict = (dict, train_secs);
    }
    let pool = Pool::new(pool_cfg(lz4, strong_dict.0, false, vec![strong]))?;
    let secs = store_all(&pool, set)?;
    let rc = recompress_pass(&pool, set.pages(), cfg.repeat, &[strong])?;
    rows.push(row(format!("lz4, idle -> {strong}+dict"), &pool, set, secs, strong_dict.1, cfg.repeat)?);
    let (base_c, base_m) = (rows[0].compr_bytes.max(1) as f64, rows[0].mem_used_bytes.max(1) as f64);
    for r in &mut rows {
        r.compr_vs_lz4 = r.compr_bytes as f64 / base_c;
        r.mem_vs_lz4 = r.mem_used_bytes as f64 / base_m;
    }
    Ok(SetReport { data: name.to_string(), pages: set.pages() as u64, rows, recompress: rc })
}

fn row(encoding: String, pool: &Pool, set: &PageSet, store_secs: f64, train_secs: f64, repeat: usize) -> anyhow::Result<Row> {
    pool.compact();
    let st = pool.stats();
    let load_mbps = load_all(pool, set, repeat)?;
    Ok(Row {
        encoding,
        compr_bytes: st.compr_data_size,
        mem_used_bytes: st.mem_used_total,
        compr_vs_lz4: 0.0,
        mem_vs_lz4: 0.0,
        dict_bytes: st.dict_bytes,
        dict_pages: st.dict_pages,
        train_secs,
        store_mbps: mbps(set.len_bytes() as u64, store_secs),
        load_mbps,
        pool_pages: st.pool_pages,
        alloc_metadata_bytes: st.alloc_metadata_bytes,
        index_bytes: st.index_bytes,
    })
}

/// Run every data set.
pub fn run(cfg: &Config) -> anyhow::Result<Report> {
    let mut notes = Vec::new();
    let sets = data_sets(cfg, &mut notes)?;
    let mut out = Vec::new();
    for (name, set) in &sets {
        if set.is_empty() {
            notes.push(format!("{name}: no pages"));
            continue;
        }
        out.push(run_set(name, set, cfg).with_context(|| name.clone())?);
    }
    Ok(Report { sets: out, notes })
}

/// The tables, one per data set.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    for set in &r.sets {
        s += &format!("{} ({} pages, {:.1} MB)\n", set.data, set.pages, (set.pages * PAGE_SIZE as u64) as f64 / 1e6);
        s += &format!(
            "  {:<26} {:>9} {:>7} {:>9} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8}\n",
            "encoding", "compr MB", "x lz4", "mem MB", "x lz4", "dict KB", "dict pg", "train s", "store", "load MB/s"
        );
        for row in &set.rows {
            s += &format!(
                "  {:<26} {:>9.1} {:>7.3} {:>9.1} {:>7.3} {:>8.0} {:>8} {:>7.2} {:>8.0} {:>8.0}\n",
                row.encoding,
                row.compr_bytes as f64 / 1e6,
                row.compr_vs_lz4,
                row.mem_used_bytes as f64 / 1e6,
                row.mem_vs_lz4,
                row.dict_bytes as f64 / 1e3,
                row.dict_pages,
                row.train_secs,
                row.store_mbps,
                row.load_mbps
            );
        }
        let c = &set.recompress;
        s += &format!(
            "  idle recompression: {} pages rewritten, {} marked; pages left lz4 load at {:.3} x their speed before ({:.0} -> {:.0} MB/s); rewritten pages load at {:.0} MB/s\n\n",
            c.recompressed_pages,
            c.marked_pages,
            c.untouched_after_vs_before,
            c.untouched_load_mbps_before,
            c.untouched_load_mbps_after,
            c.recompressed_load_mbps_after
        );
    }
    for n in &r.notes {
        s += &format!("note: {n}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use zmem_testkit::XorShift;

    /// Pages of words from one vocabulary: a dictionary pays on them.
    fn words(n: usize) -> PageSet {
        let word = |i: u64| {
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (0..11).map(|b| b'a' + ((h >> (b * 5)) % 26) as u8).collect::<Vec<u8>>()
        };
        let mut data = Vec::with_capacity(n * PAGE_SIZE);
        let mut r = XorShift::from_state(0x2545_F491_4F6C_DD1D);
        while data.len() < n * PAGE_SIZE {
            data.extend_from_slice(&word(r.below(600)));
            data.push(b' ');
        }
        data.truncate(n * PAGE_SIZE);
        PageSet { data, sources: vec!["words".into()] }
    }

    #[test]
    fn every_encoding_is_reported_and_dictionaries_pay() {
        let cfg = Config { paths: vec![], pid: None, max_bytes: None, strong: Compressor::zstd(9).unwrap(), repeat: 1 };
        let r = run_set("words", &words(3000), &cfg).unwrap();
        let names: Vec<&str> = r.rows.iter().map(|r| r.encoding.as_str()).collect();
        assert_eq!(names, ["lz4", "zstd:1", "zstd:3", "zstd:9", "lz4+dict", "zstd:3+dict", "zstd:9+dict", "lz4, idle -> zstd:9+dict"]);
        let by = |n: &str| r.rows.iter().find(|r| r.encoding == n).unwrap();
        assert_eq!(by("lz4").mem_vs_lz4, 1.0);
        for (plain, dict) in [("lz4", "lz4+dict"), ("zstd:3", "zstd:3+dict"), ("zstd:9", "zstd:9+dict")] {
            assert!(by(dict).compr_bytes < by(plain).compr_bytes, "{dict}: {:?} vs {:?}", by(dict), by(plain));
            assert_eq!(by(dict).dict_pages, 3000, "{dict}");
            assert!(by(dict).dict_bytes > 0 && by(plain).dict_bytes == 0);
        }
        let last = by("lz4, idle -> zstd:9+dict");
        assert!(last.mem_vs_lz4 < by("zstd:9").mem_vs_lz4, "{last:?}");
        assert_eq!(r.recompress.recompressed_pages, 3000);
        assert!(r.rows.iter().all(|r| r.load_mbps > 0.0 && r.store_mbps > 0.0));
        assert!(render(&Report { sets: vec![r], notes: vec![] }).contains("lz4+dict"));
    }
}
