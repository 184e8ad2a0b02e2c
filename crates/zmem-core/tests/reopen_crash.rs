//! A pool's process killed at any instant: the next one opens the pool
//! (`Pool::open`) and every page reads back as the last acknowledged store
//! left it, byte for byte.
//!
//! This binary is its own child (`harness = false` in Cargo.toml). The
//! parent runs rounds: each starts the binary again as a worker, which
//! opens the pool the last worker left (through `/proc/PARENT/fd`), checks
//! every key against a log, and then stores, overwrites, drops (single
//! keys and ranges), recompresses and compacts at random until the parent
//! SIGKILLs it at a random instant. The log says, per key, which page a
//! finished store put there (or none), and which operation was in flight:
//! that key may hold its old page or its new one, every other key exactly
//! what the log says. A worker that finds anything else panics, and the
//! parent fails on any end that is not its own SIGKILL.

mod common;

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use zmem_core::{Compressor, Pool, PoolConfig, ZmemError};

const ROUNDS: u64 = 10;
const KEYS: u64 = 4096;
/// Header: the worker's arena fd + 1, then the operation in flight: its
/// first key + 1, the seed of its page (NONE for a drop), its end key.
const HEADER: u64 = 64;
const NONE: u64 = u64::MAX;

fn cfg() -> PoolConfig {
    PoolConfig { ledger_keys: Some(KEYS), recomp_algorithms: vec![Compressor::zstd(3).unwrap()], ..PoolConfig::default() }
}

fn page(seed: u64) -> Vec<u8> {
    match seed % 4 {
        0 => common::compressible(seed),
        1 => common::incompressible(seed),
        2 => common::same_filled(seed % 3),
        _ => common::half(seed),
    }
}

fn main() {
    match std::env::var(zmem_testkit::crash::WORKER_ENV) {
        Ok(round) => worker(round.parse().unwrap()),
        Err(_) => parent(),
    }
}

struct Log(File);

impl Log {
    fn open(path: &Path) -> Log {
        Log(std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap())
    }
    fn word(&self, at: u64) -> u64 {
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, at).map_or(0, |_| u64::from_ne_bytes(b))
    }
    fn put(&self, at: u64, v: u64) {
        // One write of one word: a kill lands before or after it.
        self.0.write_all_at(&v.to_ne_bytes(), at).unwrap();
    }
    /// The seed of the page a finished store put under `key` (NONE: none).
    fn seed(&self, key: u64) -> u64 {
        self.word(HEADER + 8 * key).wrapping_sub(1)
    }
    fn set_seed(&self, key: u64, seed: u64) {
        self.put(HEADER + 8 * key, seed.wrapping_add(1));
    }
    /// Keys `first..end` are being given the page of `seed`.
    fn in_flight(&self) -> Option<(std::ops::Range<u64>, u64)> {
        let k = self.word(8);
        (k > 0).then(|| (k - 1..self.word(24), self.word(16)))
    }
    fn begin(&self, keys: std::ops::Range<u64>, seed: u64) {
        self.put(16, seed);
        self.put(24, keys.end);
        self.put(8, keys.start + 1);
    }
    fn end(&self) {
        self.put(8, 0);
    }
}

/// Whether `key` holds the page of `seed` (NONE: nothing).
fn holds(pool: &Pool, key: u64, seed: u64, buf: &mut [u8]) -> bool {
    match pool.load(key, buf) {
        Ok(()) => seed != NONE && buf == page(seed),
        Err(ZmemError::NotFound { .. }) => seed == NONE,
        Err(e) => panic!("key {key}: {e}"),
    }
}

fn take_over(log: &Log, arena: Option<String>) -> Pool {
    let Some(path) = arena else { return Pool::new(cfg()).unwrap() };
    let fd: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap().into();
    let (pool, report) = Pool::open(fd, cfg()).unwrap();
    let flight = log.in_flight();
    // Objects no key names: those of the operation in flight (a range's
    // objects are freed after their entries are gone), and one a
    // recompression had made or was replacing.
    let bound = flight.as_ref().map_or(0, |(keys, _)| keys.end - keys.start) + 2;
    assert!(report.strays_freed <= bound, "{report:?}, at most {bound} expected");
    let mut buf = vec![0u8; 4096];
    for key in 0..KEYS {
        let old = log.seed(key);
        let ok = match &flight {
            Some((keys, new)) if keys.contains(&key) => holds(&pool, key, old, &mut buf) || holds(&pool, key, *new, &mut buf),
            _ => holds(&pool, key, old, &mut buf),
        };
        assert!(ok, "key {key} holds neither what the log says nor what was in flight ({flight:?})");
    }
    // Settle the one in flight as it landed.
    if let Some((keys, new)) = flight {
        for k in keys {
            if holds(&pool, k, new, &mut buf) {
                log.set_seed(k, new);
            }
        }
        log.end();
    }
    assert_eq!(pool.mem_charged(), pool.stats().mem_used_total);
    pool
}

fn worker(round: u64) {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).unwrap();
    let log = Log::open(Path::new(&std::env::var(zmem_testkit::crash::LOG_ENV).unwrap()));
    let pool = take_over(&log, std::env::var(zmem_testkit::crash::ARENA_ENV).ok());
    log.put(0, pool.arena().unwrap().as_raw_fd() as u64 + 1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(round);
    for op in 0u64.. {
        let key = rng.gen_range(0..KEYS);
        match rng.gen_range(0..1000) {
            0..=849 => {
                let seed = round << 32 | op;
                log.begin(key..key + 1, seed);
                pool.store(key, &page(seed)).unwrap();
                log.set_seed(key, seed);
                log.end();
            }
            850..=997 => {
                log.begin(key..key + 1, NONE);
                pool.invalidate(key);
                log.set_seed(key, NONE);
                log.end();
            }
            _ => {
                // A range (dropped shard by shard when wider than the
                // pool holds, as it mostly is).
                let end = (key + 2048).min(KEYS);
                log.begin(key..end, NONE);
                pool.invalidate_range(key..end);
                for k in key..end {
                    log.set_seed(k, NONE);
                }
                log.end();
            }
        }
        if op % 500 == 499 {
            pool.recompress(&zmem_core::Recompress::default()).unwrap();
            pool.compact();
        }
    }
}

fn parent() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("log");
    File::create(&log_path).unwrap().set_len(HEADER + 8 * KEYS).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xc0ffee);
    let (_arena, path) = zmem_testkit::crash::kill_rounds(&log_path, ROUNDS, || Duration::from_millis(rng.gen_range(30..300)), |_| {});
    let pool = take_over(&Log::open(&log_path), Some(path));
    eprintln!("reopen_crash: {ROUNDS} workers killed; {} pages at the end", pool.len());
}
