//! `zmem bench reopen`: what a pool that outlives its process costs, and
//! how long opening it again takes.
//!
//! A swap device survives its server only if its pool does: the objects
//! live in the allocator's arena, and a pool of a device keeps every key's
//! entry in its ledger (`PoolConfig::ledger_keys`), so a new process can
//! open it (`Pool::open`). Here the same pages (files' pages, repeated to
//! `size`) go into a plain pool and a pool with a ledger, one after the
//! other, `repeat` times each; reported are the store throughput of each
//! (best run), the memory each holds at the end (`mem_used_total`, and of
//! it the ledger's pages), and then, for the pool with a ledger, the time
//! `Pool::open` takes to rebuild it from its arena once its pool is
//! dropped: the stall a server's restart adds to the requests waiting for
//! it. Every page is read back and compared after the opening. Numbers
//! only: nothing here passes or fails on speed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use zmem_core::{Compressor, Pool, PoolConfig};

use crate::pages::{read_paths, PAGE_SIZE};

pub struct Config {
    pub paths: Vec<PathBuf>,
    /// Bytes of pages read from `paths` (repeated to `size`).
    pub data_bytes: u64,
    /// Bytes stored: the device's size.
    pub size: u64,
    pub compressor: Compressor,
    pub repeat: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub pages: u64,
    pub sources: usize,
    pub store_mb_s_plain: f64,
    pub store_mb_s_ledger: f64,
    pub mem_used_total_plain: u64,
    pub mem_used_total_ledger: u64,
    pub ledger_bytes: u64,
    pub open_ms: f64,
    pub opened_pages: u64,
    pub strays_freed: u64,
    pub lost: u64,
    pub verify_ms: f64,
}

/// Store every page; the best of `repeat` runs' time and the last pool.
fn fill(cfg: &PoolConfig, data: &[u8], keys: u64, repeat: usize) -> anyhow::Result<(Duration, Pool)> {
    let n = (data.len() / PAGE_SIZE) as u64;
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..repeat.max(1) {
        drop(last.take());
        let pool = Pool::new(cfg.clone())?;
        let t = Instant::now();
        for k in 0..keys {
            let i = (k % n) as usize;
            pool.store(k, &data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])?;
        }
        best = best.min(t.elapsed());
        last = Some(pool);
    }
    Ok((best, last.expect("at least one run")))
}

pub fn run(cfg: &Config) -> anyhow::Result<Report> {
    let set = read_paths(&cfg.paths, Some(cfg.data_bytes))?;
    if set.is_empty() {
        bail!("no pages in {:?}", cfg.paths);
    }
    let keys = (cfg.size / PAGE_SIZE as u64).next_multiple_of(256).max(256);
    let mb = (keys * PAGE_SIZE as u64) as f64 / 1e6;
    let plain = PoolConfig { compressor: cfg.compressor, ..PoolConfig::default() };
    let ledger = PoolConfig { ledger_keys: Some(keys), ..plain.clone() };
    let (t_plain, pool) = fill(&plain, &set.data, keys, cfg.repeat)?;
    let mem_plain = pool.stats().mem_used_total;
    drop(pool);
    let (t_ledger, pool) = fill(&ledger, &set.data, keys, cfg.repeat)?;
    let st = pool.stats();
    let fd = pool.arena().context("the pool has no arena")?.try_clone_to_owned()?;
    drop(pool);
    let t = Instant::now();
    let (pool, opened) = Pool::open(fd, ledger)?;
    let open = t.elapsed();
    let t = Instant::now();
    let n = set.pages() as u64;
    let mut buf = vec![0u8; PAGE_SIZE];
    for k in 0..keys {
        pool.load(k, &mut buf).with_context(|| format!("key {k} after the opening"))?;
        if buf != set.page((k % n) as usize) {
            bail!("key {k} read back wrong after the opening");
        }
    }
    Ok(Report {
        pages: keys,
        sources: set.sources.len(),
        store_mb_s_plain: mb / t_plain.as_secs_f64(),
        store_mb_s_ledger: mb / t_ledger.as_secs_f64(),
        mem_used_total_plain: mem_plain,
        mem_used_total_ledger: st.mem_used_total,
        ledger_bytes: st.ledger_bytes,
        open_ms: open.as_secs_f64() * 1e3,
        opened_pages: opened.pages,
        strays_freed: opened.strays_freed,
        lost: opened.lost,
        verify_ms: t.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_opens_every_page_and_counts_the_ledger() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..4 {
            let text: String = (0..20_000).map(|j| format!("line {j} of file {i}\n")).collect();
            std::fs::write(d.path().join(format!("f{i}")), text).unwrap();
        }
        let cfg = Config { paths: vec![d.path().to_path_buf()], data_bytes: 1 << 20, size: 4 << 20, compressor: Compressor::default(), repeat: 1 };
        let r = run(&cfg).unwrap();
        assert_eq!((r.pages, r.opened_pages, r.strays_freed, r.lost), (1024, 1024, 0, 0), "{r:?}");
        // 16 bytes a key, in whole pages of 256 keys.
        assert_eq!(r.ledger_bytes, 1024 * 16);
        assert!(r.mem_used_total_ledger > r.mem_used_total_plain, "{r:?}");
    }
}
