//! A pool's owner killed at any instant: the next process opens the arena
//! and finds every object its predecessor had handed out, byte for byte.
//!
//! This binary is its own child. The parent runs rounds: each starts the
//! binary again as a worker, which opens the arena the last worker left
//! (through `/proc/PARENT/fd`), checks and tidies it, and then allocates,
//! frees, reads and compacts at random, as fast as it can, until the
//! parent SIGKILLs it at a random instant. The worker keeps a log in a
//! file, as a pool's index would: a record is written once `alloc_write`
//! has returned, and marked freed before `free` is called. So after a
//! kill, every record marked live must read back right, and the arena may
//! hold at most two live objects the log does not name (one allocated and
//! not yet logged, one logged freed and not yet freed), which the next
//! worker frees. A worker that finds anything else panics, and the parent
//! fails on any exit that is not its own SIGKILL.
//!
//! (No libtest harness: `harness = false` in Cargo.toml.)

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use zmem_alloc::{AllocConfig, Budget, Handle, ZsPool};

const ROUNDS: u64 = 12;
const HEADER: u64 = 64;
const RECORD: u64 = 32;
const LIVE: u64 = 1;
const FREED: u64 = 2;

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn main() {
    match std::env::var(zmem_testkit::crash::WORKER_ENV) {
        Ok(round) => worker(round.parse().unwrap()),
        Err(_) => parent(),
    }
}

/// The log: records in the order made, `(state, handle, seed, len)`.
struct Log {
    file: File,
    records: Vec<[u64; 4]>,
}

impl Log {
    fn read(path: &Path) -> Log {
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
        let mut records = Vec::new();
        let mut buf = [0u8; RECORD as usize];
        while file.read_exact_at(&mut buf, HEADER + RECORD * records.len() as u64).is_ok() {
            let r: [u64; 4] = std::array::from_fn(|i| u64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap()));
            if r[0] == 0 {
                break;
            }
            records.push(r);
        }
        Log { file, records }
    }

    fn write(&mut self, i: usize, r: [u64; 4]) {
        let mut buf = [0u8; RECORD as usize];
        for (k, w) in r.iter().enumerate() {
            buf[k * 8..k * 8 + 8].copy_from_slice(&w.to_ne_bytes());
        }
        // One write of one record: a kill lands before or after it.
        self.file.write_all_at(&buf, HEADER + RECORD * i as u64).unwrap();
        if i == self.records.len() {
            self.records.push(r);
        } else {
            self.records[i] = r;
        }
    }

    fn live(&self) -> HashMap<Handle, (usize, u64, usize)> {
        self.records.iter().enumerate().filter(|(_, r)| r[0] == LIVE).map(|(i, r)| (Handle::from_raw(r[1]), (i, r[2], r[3] as usize))).collect()
    }
}

/// Open what the last worker left (or start a pool), make it agree with
/// the log, and check every object the log names.
fn take_over(log: &Log, arena: Option<String>) -> ZsPool {
    let Some(path) = arena else {
        return ZsPool::new(AllocConfig { max_span_pages: 8, limit_bytes: None });
    };
    let fd: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap().into();
    let (pool, found) = ZsPool::open(fd, Arc::new(Budget::new(None))).unwrap();
    let live = log.live();
    let strays: Vec<Handle> = found.iter().copied().filter(|h| !live.contains_key(h)).collect();
    assert!(strays.len() <= 2, "{} live objects the log does not name", strays.len());
    for h in strays {
        pool.free(h).unwrap();
    }
    for (&h, &(i, seed, len)) in &live {
        let ok = pool.read(h, |b| b[..len] == content(seed, len)[..]).unwrap_or_else(|e| panic!("record {i}: {e}"));
        assert!(ok, "record {i} ({h:?}) read back wrong");
    }
    assert_eq!(pool.stats().objs_used, live.len() as u64);
    pool
}

fn worker(round: u64) {
    // A worker never outlives its parent (a parent that failed).
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).unwrap();
    let log_path = std::env::var(zmem_testkit::crash::LOG_ENV).unwrap();
    let mut log = Log::read(Path::new(&log_path));
    let pool = take_over(&log, std::env::var(zmem_testkit::crash::ARENA_ENV).ok());
    // Tell the parent where the arena is, then work until killed.
    let fd = pool.arena_fd().unwrap().as_raw_fd();
    log.file.write_all_at(&(fd as u64 + 1).to_ne_bytes(), 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(round);
    let mut live: Vec<usize> = log.live().values().map(|v| v.0).collect();
    for op in 0u64.. {
        let n = log.records.len();
        if live.len() < 3000 && rng.gen_bool(0.55) {
            let len = if rng.gen_bool(0.1) { 4096 } else { rng.gen_range(1..=4096) };
            let seed = round << 40 | op;
            let h = pool.alloc_write(&content(seed, len)).unwrap();
            log.write(n, [LIVE, h.to_raw(), seed, len as u64]);
            live.push(n);
        } else if !live.is_empty() {
            let i = live.swap_remove(rng.gen_range(0..live.len()));
            let mut r = log.records[i];
            r[0] = FREED;
            log.write(i, r);
            pool.free(Handle::from_raw(r[1])).unwrap();
        }
        if op % 97 == 0 {
            pool.compact();
        }
    }
}

fn parent() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    File::create(&log).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut records = 0;
    let (_arena, path) = zmem_testkit::crash::kill_rounds(
        &log,
        ROUNDS,
        || Duration::from_millis(rng.gen_range(20..250)),
        |round| {
            let now = Log::read(&log).records.len();
            assert!(now > records, "round {round}: the worker logged nothing");
            records = now;
        },
    );
    // The parent takes over last, with the same checks.
    let pool = take_over(&Log::read(&log), Some(path));
    eprintln!("crash: {ROUNDS} workers killed, {records} objects logged, {} live at the end", pool.stats().objs_used);
}
