//! The caching export (`Export::with_origin`) against an in-memory origin
//! that can fail: it must read what the origin holds, write through before
//! it answers, and never serve a copy older than the origin's, even while
//! its pool drops pages and writes race with read misses.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;
use proptest::prelude::*;
use zmem_core::{DropCold, Pool, PoolConfig};
use zmem_export::{Export, Origin, EIO};

const PAGE: usize = 4096;

/// How the next write fails.
const WRITE_OK: u8 = 0;
const WRITE_FAILS: u8 = 1;
/// Half the bytes reach the device, then the write fails.
const WRITE_TORN: u8 = 2;

#[derive(Default)]
struct MemOrigin {
    data: Mutex<Vec<u8>>,
    fail_reads: AtomicBool,
    fail_writes: AtomicU8,
    /// Requests not aligned as the trait promises.
    misaligned: AtomicU64,
    reads: AtomicU64,
    flushes: AtomicU64,
    /// The next read, once it has the bytes, says so on the first channel
    /// and waits for the second before it returns.
    gate: Mutex<Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>>,
    /// Yield in the middle of reads and sleep before returning, to widen
    /// race windows.
    slow: bool,
}

impl MemOrigin {
    fn new(size: usize, slow: bool) -> MemOrigin {
        let data = (0..size).map(|i| (i / PAGE) as u8 ^ (i % 251) as u8).collect();
        MemOrigin { data: Mutex::new(data), slow, ..Default::default() }
    }
    fn check(&self, ptr: *const u8, off: u64, len: u64) {
        if !(ptr as usize).is_multiple_of(PAGE) || !off.is_multiple_of(PAGE as u64) || !len.is_multiple_of(PAGE as u64) {
            self.misaligned.fetch_add(1, Relaxed);
        }
    }
    fn snapshot(&self) -> Vec<u8> {
        self.data.lock().clone()
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected {what} failure"))
}

/// The origin the export owns; the test keeps another handle.
struct Shared(Arc<MemOrigin>);

impl std::ops::Deref for Shared {
    type Target = MemOrigin;
    fn deref(&self) -> &MemOrigin {
        &self.0
    }
}

impl Origin for Shared {
    fn size(&self) -> u64 {
        self.data.lock().len() as u64
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(buf.as_ptr(), offset, buf.len() as u64);
        self.reads.fetch_add(1, Relaxed);
        if self.fail_reads.load(Relaxed) {
            return Err(eio("read"));
        }
        let o = offset as usize;
        if self.slow {
            // Half now, half after a pause: a torn read if a write lands between.
            let half = buf.len() / 2;
            buf[..half].copy_from_slice(&self.data.lock()[o..o + half]);
            std::thread::yield_now();
            let n = buf.len();
            buf[half..].copy_from_slice(&self.data.lock()[o + half..o + n]);
            // A disk's latency: writes land while this read is on its way back.
            std::thread::sleep(std::time::Duration::from_micros(100));
        } else {
            buf.copy_from_slice(&self.data.lock()[o..o + buf.len()]);
        }
        if let Some((entered, go)) = self.gate.lock().take() {
            entered.send(()).unwrap();
            go.recv().unwrap();
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> io::Result<()> {
        self.check(buf.as_ptr(), offset, buf.len() as u64);
        let o = offset as usize;
        match self.fail_writes.load(Relaxed) {
            WRITE_FAILS => Err(eio("write")),
            WRITE_TORN => {
                let half = buf.len() / 2;
                self.data.lock()[o..o + half].copy_from_slice(&buf[..half]);
                Err(eio("write"))
            }
            _ => {
                self.data.lock()[o..o + buf.len()].copy_from_slice(buf);
                Ok(())
            }
        }
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Relaxed);
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(PAGE as *const u8, offset, len);
        // Trimmed blocks read back as something else (here: 0xEE).
        self.data.lock()[offset as usize..(offset + len) as usize].fill(0xEE);
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(PAGE as *const u8, offset, len);
        self.data.lock()[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

/// A clean-cache pool as `zmem serve --origin` builds it, capped at `cap`.
fn cache(origin: &Arc<MemOrigin>, cap: u64) -> Export {
    let cfg = PoolConfig { max_pool: Some(cap), huge_threshold: 2048, store_incompressible: false, ..Default::default() };
    let pool = Pool::with_cold_store(cfg, Box::new(DropCold)).unwrap();
    Export::with_origin(Arc::new(pool), Box::new(Shared(Arc::clone(origin))))
}

/// Compressible bytes that differ by seed and position.
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n).map(|i| ((i / 64) as u64 ^ seed.wrapping_mul(0x9E37)) as u8).collect()
}

#[derive(Debug, Clone)]
enum Op {
    Read(u64, u64),
    Write(u64, u64, u64),
    Trim(u64, u64),
    Zero(u64, u64),
    Flush,
}

fn op(size: u64) -> impl Strategy<Value = Op> {
    let range = (0..size).prop_flat_map(move |off| (Just(off), 1..=(size - off).min(40_000)));
    prop_oneof![
        4 => range.clone().prop_map(|(o, l)| Op::Read(o, l)),
        4 => (range.clone(), any::<u64>()).prop_map(|((o, l), s)| Op::Write(o, l, s)),
        1 => range.clone().prop_map(|(o, l)| Op::Trim(o, l)),
        1 => range.prop_map(|(o, l)| Op::Zero(o, l)),
        1 => Just(Op::Flush),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Against a model of the device: every read returns what the origin
    /// holds, every write is in the origin when it returns, and the origin
    /// sees only aligned requests, while a 96 KiB pool drops pages.
    #[test]
    fn reads_see_the_origin_and_writes_reach_it(ops in proptest::collection::vec(op(48 * PAGE as u64), 1..60)) {
        let size = 48 * PAGE;
        let origin = Arc::new(MemOrigin::new(size, false));
        let e = cache(&origin, 96 << 10);
        prop_assert_eq!(e.size(), size as u64);
        for op in ops {
            match op {
                Op::Read(o, l) => {
                    let mut b = vec![0x55u8; l as usize];
                    e.read(o, &mut b).unwrap();
                    let want = origin.snapshot();
                    prop_assert!(b == want[o as usize..(o + l) as usize], "read {}+{}", o, l);
                }
                Op::Write(o, l, s) => {
                    let d = pattern(l as usize, s);
                    e.write(o, &d).unwrap();
                    prop_assert!(origin.snapshot()[o as usize..(o + l) as usize] == d[..], "written through");
                }
                Op::Trim(o, l) => { e.trim(o, l).unwrap(); }
                Op::Zero(o, l) => {
                    e.write_zeroes(o, l, false).unwrap();
                    prop_assert!(origin.snapshot()[o as usize..(o + l) as usize].iter().all(|&v| v == 0));
                }
                Op::Flush => e.flush().unwrap(),
            }
        }
        let mut all = vec![0u8; size];
        e.read(0, &mut all).unwrap();
        prop_assert!(all == origin.snapshot());
        prop_assert_eq!(origin.misaligned.load(Relaxed), 0);
    }
}

#[test]
fn hits_come_from_the_pool_and_drops_are_misses() {
    let size = 256 * PAGE;
    let origin = Arc::new(MemOrigin::new(size, false));
    let e = cache(&origin, 4 << 20);
    let mut b = vec![0u8; size];
    e.read(0, &mut b).unwrap();
    let st = e.origin_stats().unwrap();
    assert_eq!((st.cache_misses, st.cache_hits), (256, 0));
    assert_eq!(st.origin_reads, 2, "1 MiB is read in two halves, each one run and one origin read");
    e.read(0, &mut b).unwrap();
    let st = e.origin_stats().unwrap();
    assert_eq!((st.cache_hits, st.origin_reads), (256, 2), "all hits, no origin read");
    assert_eq!(b, origin.snapshot());
    // Misses with a few hits between them: one origin read for them all.
    for p in (0..32u64).step_by(2) {
        e.trim(p * PAGE as u64, PAGE as u64).unwrap();
    }
    let mut part = vec![0u8; 32 * PAGE];
    e.read(0, &mut part).unwrap();
    let st2 = e.origin_stats().unwrap();
    assert_eq!((st2.cache_misses - st.cache_misses, st2.origin_reads - st.origin_reads), (16, 1), "16 misses, one read");
    assert_eq!(part, &origin.snapshot()[..32 * PAGE]);
    // A small pool drops pages and misses them again, reading the origin.
    let small = cache(&origin, 32 << 10);
    for _ in 0..3 {
        small.read(0, &mut b).unwrap();
        assert_eq!(b, origin.snapshot());
    }
    let ps = small.pool().stats();
    assert!(ps.evicted_pages > 0, "the pool dropped pages: {ps:?} {:?}", small.origin_stats());
    assert!(small.origin_stats().unwrap().origin_reads > 1);
    // Incompressible pages are not kept.
    let noise: Vec<u8> = (0..PAGE as u64).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).collect();
    e.write(0, &noise).unwrap();
    assert!(e.origin_stats().unwrap().cache_refused >= 1);
    let mut p = vec![0u8; PAGE];
    e.read(0, &mut p).unwrap();
    assert_eq!(p, noise);
    e.flush().unwrap();
    assert_eq!(origin.flushes.load(Relaxed), 1, "FLUSH reaches the origin");
}

#[test]
fn a_failed_origin_read_fails_its_request_and_caches_nothing() {
    let size = 64 * PAGE;
    let origin = Arc::new(MemOrigin::new(size, false));
    let e = cache(&origin, 4 << 20);
    origin.fail_reads.store(true, Relaxed);
    let mut b = vec![0u8; 8 * PAGE];
    let err = e.read(0, &mut b).unwrap_err();
    assert_eq!(err.errno(), EIO);
    assert!(err.to_string().contains("origin failed a read"), "{err}");
    assert_eq!(e.pool().stats().orig_data_size, 0, "nothing cached");
    // A partial write needs the page's bytes: it fails too, and writes nothing.
    let before = origin.snapshot();
    assert_eq!(e.write(100, &[1u8; 10]).unwrap_err().errno(), EIO);
    assert_eq!(origin.snapshot(), before);
    origin.fail_reads.store(false, Relaxed);
    e.read(0, &mut b).unwrap();
    assert_eq!(b, &before[..8 * PAGE]);
    assert_eq!(e.origin_stats().unwrap().origin_errors, 2);
}

#[test]
fn a_failed_origin_write_fails_its_request_and_leaves_no_stale_copy() {
    let size = 64 * PAGE;
    for mode in [WRITE_FAILS, WRITE_TORN] {
        let origin = Arc::new(MemOrigin::new(size, false));
        let e = cache(&origin, 4 << 20);
        // Cache the old pages, then fail a write over them.
        let old = pattern(8 * PAGE, 1);
        e.write(0, &old).unwrap();
        let mut b = vec![0u8; 8 * PAGE];
        e.read(0, &mut b).unwrap();
        assert_eq!(e.origin_stats().unwrap().cache_hits, 8);
        origin.fail_writes.store(mode, Relaxed);
        let err = e.write(PAGE as u64 / 2, &pattern(6 * PAGE, 2)).unwrap_err();
        assert_eq!(err.errno(), EIO);
        assert!(err.to_string().contains("origin failed a write"), "{err}");
        origin.fail_writes.store(WRITE_OK, Relaxed);
        // What is read is what the origin holds, torn or not.
        e.read(0, &mut b).unwrap();
        assert_eq!(b, &origin.snapshot()[..8 * PAGE], "mode {mode}");
        if mode == WRITE_TORN {
            assert_ne!(b, old, "the torn write changed the origin");
        }
    }
}

/// A read miss has the page's old bytes from the origin; a write of the
/// page completes; then the read finishes. The old bytes must not be cached.
#[test]
fn a_fetch_overtaken_by_a_write_is_not_cached() {
    let origin = Arc::new(MemOrigin::new(16 * PAGE, false));
    let e = cache(&origin, 4 << 20);
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    *origin.gate.lock() = Some((entered_tx, go_rx));
    let old = origin.snapshot()[3 * PAGE..4 * PAGE].to_vec();
    let new = pattern(PAGE, 9);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut b = vec![0u8; PAGE];
            e.read(3 * PAGE as u64, &mut b).unwrap();
            b
        });
        entered.recv().unwrap();
        e.write(3 * PAGE as u64, &new).unwrap();
        go.send(()).unwrap();
        assert_eq!(reader.join().unwrap(), old, "the read began before the write");
    });
    let mut b = vec![0u8; PAGE];
    e.read(3 * PAGE as u64, &mut b).unwrap();
    assert_eq!(b, new, "the cache kept the overtaken fetch");
    assert_eq!(e.origin_stats().unwrap().cache_stale, 1);
}

/// Writers and readers over the same pages with a pool that keeps dropping
/// them and an origin that tears reads: afterwards every page read through
/// the cache is the origin's, so no fetch raced a write into the pool.
#[test]
fn read_misses_racing_writes_never_cache_old_data() {
    let pages = 32;
    let origin = Arc::new(MemOrigin::new(pages * PAGE, true));
    // Smaller than the pages: it keeps dropping them, and reads keep missing.
    let e = cache(&origin, 8 << 10);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (e, stop) = (&e, &stop);
            s.spawn(move || {
                let mut x = t + 1;
                let mut b = vec![0u8; 3 * PAGE];
                while !stop.load(Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let p = (x >> 33) % (pages as u64 - 3);
                    e.read(p * PAGE as u64, &mut b).unwrap();
                }
            });
        }
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let e = &e;
                s.spawn(move || {
                    let mut x = t + 7;
                    for i in 0..3000u64 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let p = (x >> 33) % pages as u64;
                        let off = p * PAGE as u64 + if i % 3 == 0 { 512 } else { 0 };
                        e.write(off, &pattern(PAGE + 1024, x)[..if i % 3 == 0 { 2048 } else { PAGE }]).unwrap();
                    }
                })
            })
            .collect();
        let joined: Vec<_> = writers.into_iter().map(|h| h.join()).collect();
        stop.store(true, Relaxed);
        for j in joined {
            if let Err(p) = j {
                std::panic::resume_unwind(p);
            }
        }
    });
    let want = origin.snapshot();
    for p in 0..pages {
        let mut b = vec![0u8; PAGE];
        e.read((p * PAGE) as u64, &mut b).unwrap();
        assert!(b == want[p * PAGE..(p + 1) * PAGE], "page {p} is stale in the cache");
    }
    let st = e.origin_stats().unwrap();
    eprintln!("{st:?}");
    assert!(st.cache_hits > 0 && st.cache_misses > 100, "{st:?}");
}

/// A scan of more pages than the pool holds, repeated: LRU would drop
/// each page just before it is read again (no hits at all); admission
/// once full keeps a stable share of them.
#[test]
fn a_repeated_scan_larger_than_the_pool_still_hits() {
    let pages = 4096;
    let origin = Arc::new(MemOrigin::new(pages * PAGE, false));
    let e = cache(&origin, 512 << 10);
    let mut b = vec![0u8; 32 * PAGE];
    let mut last = Default::default();
    for pass in 0..4 {
        let before = e.origin_stats().unwrap();
        for c in 0..pages / 32 {
            e.read((c * 32 * PAGE) as u64, &mut b).unwrap();
        }
        last = e.origin_stats().unwrap();
        eprintln!("pass {pass}: {} hits, {} not admitted", last.cache_hits - before.cache_hits, last.cache_not_admitted - before.cache_not_admitted);
        if pass == 3 {
            let hits = last.cache_hits - before.cache_hits;
            let held = e.pool().stats().orig_data_size / PAGE as u64;
            assert!(hits * 10 >= held * 6, "the last pass hit {hits} pages of the {held} the pool holds");
        }
    }
    assert!(last.cache_not_admitted > 0);
}
