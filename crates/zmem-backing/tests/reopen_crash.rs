//! A pool with a backing file, its process killed at any instant (in a
//! store, a writeback batch, a compaction of the file and the moves it
//! leaves, a recompression, a dictionary's training and switch, with
//! objects of old dictionaries written back): the next one opens the pool
//! on the same file (`Pool::open_with_cold_store`) and every page reads
//! back as the last acknowledged store left it, byte for byte, none lost. zmem-core's
//! `reopen_crash` harness (its log and operations are included from there),
//! with a pool whose cap keeps its shrinker writing back all the time.

#[path = "../../zmem-core/tests/common/crash_log.rs"]
#[allow(dead_code)]
mod crash_log;

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crash_log::{Harness, Log, HEADER};
use rand::{Rng, SeedableRng};
use zmem_backing::{BackingStore, Existing, OsFile};
use zmem_core::{Compressor, Pool, PoolConfig};

const ROUNDS: u64 = 12;
const KEYS: u64 = 4096;
const H: Harness = Harness { keys: KEYS, page };

fn cfg() -> PoolConfig {
    // A cap of a fraction of what the keys hold: most pages are written
    // back, and stay there when read (every opening reads every key).
    PoolConfig {
        ledger_keys: Some(KEYS),
        max_pool: Some(KEYS * 4096 / 32),
        promote_loads: false,
        recomp_algorithms: vec![Compressor::zstd(3).unwrap()],
        dict: crash_log::dict_config(),
        ..PoolConfig::default()
    }
}

/// Text of words from a vocabulary of the seed's round (its high half):
/// what a dictionary learns, drifting from round to round.
fn text(seed: u64) -> Vec<u8> {
    let vocab = (seed >> 32) % 3;
    let mut r = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    let mut p = Vec::with_capacity(4200);
    while p.len() < 4096 {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        let h = (r % 500 + vocab * 1_000_003).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        p.extend((0..9).map(|b| b'a' + ((h >> (b * 5)) % 26) as u8));
        p.push(b' ');
    }
    p.truncate(4096);
    p
}

fn page(seed: u64) -> Vec<u8> {
    let mut p = format!("page {seed:016x} ").repeat(200).into_bytes();
    p.truncate(4096);
    // (About 2:1 for most: a byte in eight is noise.)
    p.iter_mut().enumerate().step_by(8).for_each(|(i, b)| *b = (seed.wrapping_add(i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as u8);
    match seed % 5 {
        0 => p,
        4 => text(seed),
        1 => (0..4096u64).map(|i| (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(i * 0x2545_f491) >> 29) as u8).collect(),
        2 => vec![(seed % 3) as u8; 4096],
        _ => {
            p[2048..].iter_mut().enumerate().for_each(|(i, b)| *b = (seed.wrapping_add(i as u64).wrapping_mul(0x9e37_79b9) >> 13) as u8);
            p
        }
    }
}

/// The backing file, beside the log.
fn backing_path(log: &Path) -> PathBuf {
    log.with_file_name("backing")
}

fn main() {
    match std::env::var(zmem_testkit::crash::WORKER_ENV) {
        Ok(round) => worker(round.parse().unwrap()),
        Err(_) => parent(),
    }
}

fn take_over(log: &Log, log_path: &Path, arena: Option<String>) -> Pool {
    let path = backing_path(log_path);
    let Some(arena) = arena else {
        let (store, _) = BackingStore::open(&path, None, Existing::Overwrite).unwrap();
        return Pool::with_cold_store(cfg(), Box::new(store)).unwrap();
    };
    let fd: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).open(&arena).unwrap().into();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let store = BackingStore::on_file(OsFile::kept(file, &path).unwrap(), None).unwrap();
    let (pool, report) = Pool::open_with_cold_store(fd, cfg(), Box::new(store)).unwrap();
    assert_eq!(report.lost, 0, "{report:?}");
    // (Objects no key names are freed: besides the operation in flight's,
    // a writeback batch's whose entries already named their records.)
    H.check(&pool, log);
    pool
}

fn worker(round: u64) {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL)).unwrap();
    let log_path = std::env::var(zmem_testkit::crash::LOG_ENV).unwrap();
    let log = Log::open(Path::new(&log_path));
    let pool = take_over(&log, Path::new(&log_path), std::env::var(zmem_testkit::crash::ARENA_ENV).ok());
    log.put(0, pool.arena().unwrap().as_raw_fd() as u64 + 1);
    H.work(&pool, &log, round, |pool| {
        pool.recompress(&zmem_core::Recompress::default()).unwrap();
        pool.compact();
        pool.writeback(zmem_core::WritebackMode::Idle(0), Some(300)).unwrap();
        crash_log::train(pool);
    });
}

fn parent() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("log");
    File::create(&log_path).unwrap().set_len(HEADER + 8 * KEYS).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xbac4);
    let (_arena, path) = zmem_testkit::crash::kill_rounds(&log_path, ROUNDS, || Duration::from_millis(rng.gen_range(30..300)), |_| {});
    let pool = take_over(&Log::open(&log_path), &log_path, Some(path));
    let st = pool.stats();
    assert!(st.bd_count > 0, "nothing was written back: {} pages, {} written back", pool.len(), st.bd_count);
    eprintln!(
        "reopen_crash (backing file): {ROUNDS} workers killed ({} in a recompression, compaction, writeback or training); {} pages at the end, {} of them written back, {} with a dictionary",
        Log::open(&log_path).killed_in_periodic(),
        pool.len(),
        st.bd_count,
        st.dict_pages
    );
    assert!(st.dict_pages > 0, "no page was written with a dictionary: the rounds did not exercise them");
}
