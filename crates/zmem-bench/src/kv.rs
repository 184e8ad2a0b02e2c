//! The swap bench's second built-in workload: the heap of an in-memory
//! key-value store, read and updated at random by several clients.
//!
//! The default workload, a build, is many short processes that stream
//! through memory: most of what it swaps out is written once and read back
//! once, in address order, or never (a process exits). A long-lived heap is
//! the other kind a user swaps: a cache, a session store, a database's
//! buffer pool, a JVM's or a browser's heap. Its pages stay live for the
//! whole run, its accesses are random and skewed (a hot set takes most of
//! them, and it moves), a swapped-out page is read back many times and
//! written again, and neighbouring slots are rarely wanted together. It is
//! where swap read-ahead, slot reuse and the LRU matter most, and where a
//! compressed pool that wastes memory falls off a cliff.
//!
//! The heap is `bytes` of 1 KiB records (four to a page), split between
//! `threads` clients, each owning its share (no locks, so the run is the
//! same every time). A record holds its key, its version and a payload of
//! text-like words, a few of them common (field names, small numbers), and
//! in half of the records a zeroed tail (the unused capacity of a real
//! heap's buffers): LZO compresses its pages about 2.4 ×, as much as a
//! program's heap typically compresses in zram. After filling the heap in order, each client does
//! `passes` × its records of operations, a quarter of them updates: 60 %
//! go to a hot sixteenth of its records (scattered over the heap, as a
//! heap's hot objects are, so a quarter of its pages are hot), and the hot
//! set moves four times a run; the rest are uniform. Every read checks the
//! record's key, its version (kept per record in a second array) and its
//! payload's hash: a swap device that gives back a stale or a wrong page
//! ends the run with an error, never a wrong figure.

use std::time::{Duration, Instant};

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// Bytes of one record.
pub const RECORD: usize = 1024;
const HEADER: usize = 16;
/// Share of operations that go to the hot set, in percent.
const HOT_PERCENT: u64 = 60;
/// The hot set is one record in this many.
const HOT_ONE_IN: u64 = 16;
/// Times the hot set moves during the operations.
const EPOCHS: u64 = 4;
/// One operation in this many is an update.
const UPDATE_ONE_IN: u64 = 4;

/// What a run does.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub bytes: u64,
    pub threads: u32,
    /// Operations per record, over the run.
    pub passes: u32,
}

/// What a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    pub records: u64,
    pub reads: u64,
    pub updates: u64,
    /// Hash of every version at the end: the same for every run of one
    /// configuration.
    pub digest: u64,
    pub fill: Duration,
    pub ops: Duration,
    /// The longest a client went without finishing an operation (timed
    /// every [`PAUSE_SAMPLE`] operations): a swap-in's worst stall, and the
    /// operations around it.
    pub longest_pause: Duration,
}

/// Operations between two looks at the clock, for [`Outcome::longest_pause`]
/// (a look costs about what an operation does; a batch of them well under
/// a millisecond when nothing stalls).
pub const PAUSE_SAMPLE: u64 = 64;

/// How a run failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("the heap needs at least one 1 KiB record per client: give it at least {min} bytes")]
    TooSmall { min: u64 },
    #[error("the clients and the passes must be at least 1")]
    Zero,
    #[error("record {key} read back wrong ({what}): the memory under this process returned bytes it never wrote")]
    Corrupt { key: u64, what: &'static str },
}

/// splitmix64: the generator behind every choice and every payload.
fn mix(x: u64) -> u64 {
    crate::mix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15))
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

/// 256 words of 2 to 9 letters, the same every run.
fn vocabulary() -> Vec<Vec<u8>> {
    let mut r = Rng(0x5eed);
    (0..256).map(|_| (0..2 + r.below(8)).map(|_| b'a' + r.below(26) as u8).collect()).collect()
}

/// Write record `key` at `version` into `rec`.
fn write_record(rec: &mut [u8], key: u64, version: u32, words: &[Vec<u8>]) {
    let mut r = Rng(mix(key) ^ u64::from(version) << 40);
    let (head, payload) = rec.split_at_mut(HEADER);
    let zero_from = if r.below(2) == 0 { 64 + r.below((payload.len() - 64) as u64) as usize } else { payload.len() };
    let mut at = 0;
    while at < zero_from {
        // Skewed: a few words are common (field names, small numbers).
        let wider = r.below(words.len() as u64) + 1;
        let common = r.below(wider) + 1;
        let w = &words[r.below(common) as usize];
        let n = w.len().min(zero_from - at);
        payload[at..at + n].copy_from_slice(&w[..n]);
        at += n;
        if at < zero_from {
            payload[at] = b' ';
            at += 1;
        }
    }
    payload[zero_from..].fill(0);
    let check = xxh3_64(payload) as u32;
    head[..8].copy_from_slice(&key.to_le_bytes());
    head[8..12].copy_from_slice(&version.to_le_bytes());
    head[12..16].copy_from_slice(&check.to_le_bytes());
}

fn check_record(rec: &[u8], key: u64, version: u32) -> Result<(), KvError> {
    let word = |i: usize| u32::from_le_bytes(rec[i..i + 4].try_into().unwrap_or_default());
    if u64::from_le_bytes(rec[..8].try_into().unwrap_or_default()) != key {
        return Err(KvError::Corrupt { key, what: "another record's key" });
    }
    if word(8) != version {
        return Err(KvError::Corrupt { key, what: "an older or newer version" });
    }
    if word(12) != xxh3_64(&rec[HEADER..]) as u32 {
        return Err(KvError::Corrupt { key, what: "its payload does not match its hash" });
    }
    Ok(())
}

/// One client's share: its records, their versions, the first key.
struct Share<'a> {
    heap: &'a mut [u8],
    versions: &'a mut [u32],
    first: u64,
}

impl Share<'_> {
    fn records(&self) -> u64 {
        self.versions.len() as u64
    }
    fn rec(&mut self, i: u64) -> &mut [u8] {
        let at = i as usize * RECORD;
        &mut self.heap[at..at + RECORD]
    }
    fn fill(&mut self, words: &[Vec<u8>]) {
        for i in 0..self.records() {
            let key = self.first + i;
            write_record(self.rec(i), key, 0, words);
        }
    }
    /// `ops` operations; returns (reads, updates, the longest pause).
    fn work(&mut self, ops: u64, seed: u64, words: &[Vec<u8>]) -> Result<(u64, u64, Duration), KvError> {
        let n = self.records();
        let hot = (n / HOT_ONE_IN).max(1);
        let per_epoch = ops.div_ceil(EPOCHS).max(1);
        let mut r = Rng(mix(seed));
        let (mut reads, mut updates) = (0, 0);
        let (mut last, mut longest) = (Instant::now(), Duration::ZERO);
        for op in 0..ops {
            if op % PAUSE_SAMPLE == 0 {
                let now = Instant::now();
                longest = longest.max(now - last);
                last = now;
            }
            let i = if r.below(100) < HOT_PERCENT {
                // The j-th hot record of this epoch, hashed over the share.
                let epoch = op / per_epoch;
                mix(seed ^ epoch << 48 ^ r.below(hot)) % n
            } else {
                r.below(n)
            };
            let key = self.first + i;
            let version = self.versions[i as usize];
            check_record(self.rec(i), key, version)?;
            if r.below(UPDATE_ONE_IN) == 0 {
                let v = version.wrapping_add(1);
                write_record(self.rec(i), key, v, words);
                self.versions[i as usize] = v;
                updates += 1;
            } else {
                reads += 1;
            }
        }
        Ok((reads, updates, longest.max(last.elapsed())))
    }
}

/// Fill the heap, then run the operations; every read is checked.
pub fn run(cfg: Config) -> Result<Outcome, KvError> {
    if cfg.threads == 0 || cfg.passes == 0 {
        return Err(KvError::Zero);
    }
    let records = cfg.bytes / RECORD as u64;
    if records < u64::from(cfg.threads) {
        return Err(KvError::TooSmall { min: u64::from(cfg.threads) * RECORD as u64 });
    }
    let words = vocabulary();
    let mut heap = vec![0u8; records as usize * RECORD];
    let mut versions = vec![0u32; records as usize];
    let per = records.div_ceil(u64::from(cfg.threads));
    let mut shares: Vec<Share> = heap
        .chunks_mut(per as usize * RECORD)
        .zip(versions.chunks_mut(per as usize))
        .enumerate()
        .map(|(t, (heap, versions))| Share { heap, versions, first: t as u64 * per })
        .collect();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for sh in shares.iter_mut() {
            let words = &words;
            s.spawn(move || sh.fill(words));
        }
    });
    let fill = t0.elapsed();
    let t1 = Instant::now();
    let done: Vec<Result<(u64, u64, Duration), KvError>> = std::thread::scope(|s| {
        let hs: Vec<_> = shares
            .iter_mut()
            .map(|sh| {
                let words = &words;
                let ops = sh.records() * u64::from(cfg.passes);
                let seed = sh.first;
                s.spawn(move || sh.work(ops, seed, words))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let mut out = Outcome { records, fill, ops: t1.elapsed(), ..Outcome::default() };
    for d in done {
        let (r, u, pause) = d?;
        out.reads += r;
        out.updates += u;
        out.longest_pause = out.longest_pause.max(pause);
    }
    drop(shares);
    let mut h = Xxh3::new();
    versions.iter().for_each(|v| h.update(&v.to_le_bytes()));
    out.digest = h.digest();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_the_same_every_time_and_counts_its_operations() {
        let cfg = Config { bytes: 4 << 20, threads: 3, passes: 2 };
        let a = run(cfg).unwrap();
        assert_eq!(a.records, 4096);
        assert_eq!(a.reads + a.updates, 2 * 4096, "each client does passes × its records (shares of 1366, 1366 and 1364)");
        let share = a.updates as f64 / (a.reads + a.updates) as f64;
        assert!((0.2..0.3).contains(&share), "a quarter are updates: {share}");
        let b = run(cfg).unwrap();
        assert_eq!((a.reads, a.updates, a.digest), (b.reads, b.updates, b.digest));
        assert_ne!(run(Config { passes: 3, ..cfg }).unwrap().digest, a.digest, "the digest follows the versions");
    }

    #[test]
    fn records_compress_like_a_heap() {
        let words = vocabulary();
        let mut page = vec![0u8; 64 * RECORD];
        for (k, rec) in page.chunks_mut(RECORD).enumerate() {
            write_record(rec, k as u64, 7, &words);
        }
        // LZO: the bench's default compressor, as the kernel's.
        let lzo = zmem_compress::Compressor::new(zmem_compress::Algorithm::Lzo);
        let mut out = vec![0u8; zmem_compress::Algorithm::Lzo.compress_bound(4096)];
        let mut total = 0;
        for p in page.chunks(4096) {
            total += lzo.compress(p, &mut out).unwrap();
        }
        let ratio = page.len() as f64 / total as f64;
        assert!((2.0..3.0).contains(&ratio), "compressible as a heap is, not trivially: {ratio:.2}");
    }

    #[test]
    fn wrong_bytes_are_caught_never_counted() {
        let words = vocabulary();
        let mut rec = vec![0u8; RECORD];
        write_record(&mut rec, 42, 3, &words);
        assert_eq!(check_record(&rec, 42, 3), Ok(()));
        assert_eq!(check_record(&rec, 43, 3), Err(KvError::Corrupt { key: 43, what: "another record's key" }));
        assert_eq!(check_record(&rec, 42, 4), Err(KvError::Corrupt { key: 42, what: "an older or newer version" }));
        rec[500] ^= 1;
        assert_eq!(check_record(&rec, 42, 3), Err(KvError::Corrupt { key: 42, what: "its payload does not match its hash" }));
        // A whole page of zeros (what a device that lost a page returns).
        assert!(check_record(&[0u8; RECORD], 5, 0).is_err());
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert_eq!(run(Config { bytes: 1 << 20, threads: 0, passes: 1 }), Err(KvError::Zero));
        assert_eq!(run(Config { bytes: 1 << 20, threads: 1, passes: 0 }), Err(KvError::Zero));
        assert_eq!(run(Config { bytes: 2048, threads: 4, passes: 1 }), Err(KvError::TooSmall { min: 4096 }));
    }
}
