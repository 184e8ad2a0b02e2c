//! The shared half of the pool crash harnesses (zmem-core's
//! `reopen_crash`, and zmem-backing's, which includes this file by its
//! path): the log a worker keeps of what finished and what was in flight,
//! the check of a pool opened again against it, and a worker's
//! operations. See `reopen_crash.rs` for how the rounds go.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rand::{Rng, SeedableRng};
use zmem_core::{DictConfig, DictSource, Pool, ZmemError};

/// Header: the worker's arena fd + 1, then the operation in flight: its
/// first key + 1, the seed of its page (NONE for a drop), its end key; then
/// whether the periodic work (`every_500`) is running, and how many
/// workers were killed while it was.
pub const HEADER: u64 = 64;
pub const NONE: u64 = u64::MAX;

pub struct Log(File);

impl Log {
    pub fn open(path: &Path) -> Log {
        Log(std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap())
    }
    pub fn word(&self, at: u64) -> u64 {
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, at).map_or(0, |_| u64::from_ne_bytes(b))
    }
    pub fn put(&self, at: u64, v: u64) {
        // One write of one word: a kill lands before or after it.
        self.0.write_all_at(&v.to_ne_bytes(), at).unwrap();
    }
    /// The seed of the page a finished store put under `key` (NONE: none).
    pub fn seed(&self, key: u64) -> u64 {
        self.word(HEADER + 8 * key).wrapping_sub(1)
    }
    pub fn set_seed(&self, key: u64, seed: u64) {
        self.put(HEADER + 8 * key, seed.wrapping_add(1));
    }
    /// Keys `first..end` are being given the page of `seed`.
    pub fn in_flight(&self) -> Option<(std::ops::Range<u64>, u64)> {
        let k = self.word(8);
        (k > 0).then(|| (k - 1..self.word(24), self.word(16)))
    }
    pub fn begin(&self, keys: std::ops::Range<u64>, seed: u64) {
        self.put(16, seed);
        self.put(24, keys.end);
        self.put(8, keys.start + 1);
    }
    pub fn end(&self) {
        self.put(8, 0);
    }
    /// Workers killed during the periodic work, so far.
    pub fn killed_in_periodic(&self) -> u64 {
        self.word(40)
    }
}

/// A harness's keys and pages.
pub struct Harness {
    pub keys: u64,
    /// The page a seed stands for.
    pub page: fn(u64) -> Vec<u8>,
}

impl Harness {
    /// Whether `key` holds the page of `seed` (NONE: nothing).
    fn holds(&self, pool: &Pool, key: u64, seed: u64, buf: &mut [u8]) -> bool {
        match pool.load(key, buf) {
            Ok(()) => seed != NONE && buf == (self.page)(seed),
            Err(ZmemError::NotFound { .. }) => seed == NONE,
            Err(e) => panic!("key {key}: {e}"),
        }
    }

    /// Every key of `pool` (opened on what the last worker left) holds
    /// what `log` says, or (a key of the operation in flight) what that
    /// operation was putting there; the operation is then settled as it
    /// landed.
    pub fn check(&self, pool: &Pool, log: &Log) {
        let flight = log.in_flight();
        if log.word(32) == 1 {
            log.put(40, log.word(40) + 1);
            log.put(32, 0);
        }
        let mut buf = vec![0u8; 4096];
        for key in 0..self.keys {
            let old = log.seed(key);
            let ok = match &flight {
                Some((keys, new)) if keys.contains(&key) => self.holds(pool, key, old, &mut buf) || self.holds(pool, key, *new, &mut buf),
                _ => self.holds(pool, key, old, &mut buf),
            };
            assert!(ok, "key {key} holds neither what the log says nor what was in flight ({flight:?})");
        }
        if let Some((keys, new)) = flight {
            for k in keys {
                if self.holds(pool, k, new, &mut buf) {
                    log.set_seed(k, new);
                }
            }
            log.end();
        }
        assert_eq!(pool.mem_charged(), pool.stats().mem_used_total);
    }

    /// A worker's operations on `pool` until it is killed: stores,
    /// overwrites, drops of single keys and of ranges at random, each
    /// logged; `every_500` after every 500.
    pub fn work(&self, pool: &Pool, log: &Log, round: u64, every_500: impl Fn(&Pool)) -> ! {
        let mut rng = rand::rngs::StdRng::seed_from_u64(round);
        for op in 0u64.. {
            let key = rng.gen_range(0..self.keys);
            match rng.gen_range(0..1000) {
                0..=849 => {
                    let seed = round << 32 | op;
                    log.begin(key..key + 1, seed);
                    pool.store(key, &(self.page)(seed)).unwrap();
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
                    let end = (key + 2048).min(self.keys);
                    log.begin(key..end, NONE);
                    pool.invalidate_range(key..end);
                    for k in key..end {
                        log.set_seed(k, NONE);
                    }
                    log.end();
                }
            }
            if op % 500 == 499 {
                log.put(32, 1);
                every_500(pool);
                log.put(32, 0);
            }
        }
        unreachable!("the worker runs until it is killed")
    }
}

/// Dictionaries for lz4 stores too, trained only when asked ([`train`],
/// in a worker's periodic work), on few samples: many installs and
/// retirements.
pub fn dict_config() -> DictConfig {
    DictConfig {
        source: DictSource::Auto,
        lz4: true,
        samples: 64,
        sample_every: 1,
        max_size: 8 << 10,
        drift_window: 256,
        background: false,
        ..DictConfig::default()
    }
}

/// A training round (a switch when the samples call for it), which may
/// find the five slots in use: a new dictionary then waits for an old one
/// to drain.
pub fn train(pool: &Pool) {
    match pool.train_dictionary() {
        Ok(_) => {}
        Err(ZmemError::Config(e)) if e.contains("slots") => {}
        Err(e) => panic!("training: {e}"),
    }
}
