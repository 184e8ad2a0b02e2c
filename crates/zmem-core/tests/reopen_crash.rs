//! A pool's process killed at any instant: the next one opens the pool
//! (`Pool::open`) and every page reads back as the last acknowledged store
//! left it, byte for byte.
//!
//! This binary is its own child (`harness = false` in Cargo.toml). The
//! parent runs rounds: each starts the binary again as a worker, which
//! opens the pool the last worker left (through `/proc/PARENT/fd`), checks
//! every key against a log, and then stores, overwrites, drops (single
//! keys and ranges), recompresses, compacts and trains dictionaries (each
//! round's text pages are of another vocabulary, so new dictionaries are
//! installed and old ones retired) at random until the parent SIGKILLs it
//! at a random instant. The log says, per key, which page a
//! finished store put there (or none), and which operation was in flight:
//! that key may hold its old page or its new one, every other key exactly
//! what the log says. A worker that finds anything else panics, and the
//! parent fails on any end that is not its own SIGKILL. (The log and the
//! operations are `common/crash_log.rs`, which zmem-backing's harness of a
//! pool with a backing file shares.)

mod common;

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use common::crash_log::{self, Harness, Log, HEADER};
use rand::{Rng, SeedableRng};
use zmem_core::{Compressor, Pool, PoolConfig};

const ROUNDS: u64 = 10;
const KEYS: u64 = 4096;
const H: Harness = Harness { keys: KEYS, page };

fn cfg() -> PoolConfig {
    let dict = crash_log::dict_config();
    PoolConfig { ledger_keys: Some(KEYS), recomp_algorithms: vec![Compressor::zstd(3).unwrap()], dict, ..PoolConfig::default() }
}

/// A seed is its round (high half) and its operation.
fn page(seed: u64) -> Vec<u8> {
    match seed % 5 {
        0 => common::compressible(seed),
        1 => common::incompressible(seed),
        2 => common::same_filled(seed % 3),
        3 => common::half(seed),
        // Text of the round's vocabulary: the data drifts from round to round.
        _ => common::record_page((seed >> 32) % 3, seed),
    }
}

fn main() {
    match std::env::var(zmem_testkit::crash::WORKER_ENV) {
        Ok(round) => worker(round.parse().unwrap()),
        Err(_) => parent(),
    }
}

fn take_over(log: &Log, arena: Option<String>) -> Pool {
    let Some(path) = arena else { return Pool::new(cfg()).unwrap() };
    let fd: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap().into();
    let (pool, report) = Pool::open(fd, cfg()).unwrap();
    // Objects no key names: those of the operation in flight (a range's
    // objects are freed after their entries are gone), and one a
    // recompression had made or was replacing.
    let bound = log.in_flight().as_ref().map_or(0, |(keys, _)| keys.end - keys.start) + 2;
    assert!(report.strays_freed <= bound, "{report:?}, at most {bound} expected");
    H.check(&pool, log);
    pool
}

fn worker(round: u64) {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).unwrap();
    let log = Log::open(Path::new(&std::env::var(zmem_testkit::crash::LOG_ENV).unwrap()));
    let pool = take_over(&log, std::env::var(zmem_testkit::crash::ARENA_ENV).ok());
    log.put(0, pool.arena().unwrap().as_raw_fd() as u64 + 1);
    H.work(&pool, &log, round, |pool| {
        pool.recompress(&zmem_core::Recompress::default()).unwrap();
        pool.compact();
        crash_log::train(pool);
    });
}

fn parent() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("log");
    File::create(&log_path).unwrap().set_len(HEADER + 8 * KEYS).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xc0ffee);
    let (_arena, path) = zmem_testkit::crash::kill_rounds(&log_path, ROUNDS, || Duration::from_millis(rng.gen_range(30..300)), |_| {});
    let pool = take_over(&Log::open(&log_path), Some(path));
    let st = pool.stats();
    eprintln!(
        "reopen_crash: {ROUNDS} workers killed ({} in a recompression, compaction or training); {} pages at the end, {} with a dictionary ({} dictionaries)",
        Log::open(&log_path).killed_in_periodic(),
        pool.len(),
        st.dict_pages,
        st.dict_count,
    );
    assert!(st.dict_pages > 0, "no page was written with a dictionary: the rounds did not exercise them");
}
