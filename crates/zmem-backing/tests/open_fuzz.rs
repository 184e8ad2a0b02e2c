//! What an operator can hand `zmem serve --backing FILE`: 100,000 existing
//! files of 0 to 64 KiB, random and record-like, through the store's own
//! open. None may panic; each is taken (empty, or a zmem store's first
//! record) or refused with a message that names the file. The named
//! regression test for the short file that once panicked is in `open.rs`
//! (`short_files_that_look_like_a_header_are_refused`).

use zmem_backing::{BackingError, BackingStore, Existing};
use zmem_testkit::XorShift;

const MAGIC: u16 = 0x5a4d;

/// A record header and payload as the store writes them.
fn record(key: u64, payload: &[u8]) -> Vec<u8> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&key.to_le_bytes());
    h.update(payload);
    let mut r = Vec::with_capacity(16 + payload.len());
    r.extend_from_slice(&MAGIC.to_le_bytes());
    r.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    r.extend_from_slice(&key.to_le_bytes());
    r.extend_from_slice(&(h.digest() as u32).to_le_bytes());
    r.extend_from_slice(payload);
    r
}

/// One file's bytes: its length is spread over 0..=64 KiB (short ones
/// most, where the edges are), its content random, zeros, a whole record
/// then anything, a record cut short or with one byte changed, or a bare
/// header whose length field reads a page or less.
fn contents(rng: &mut XorShift) -> Vec<u8> {
    let len = match rng.below(10) {
        0..=3 => rng.below(64),
        4..=7 => rng.below(4200),
        _ => rng.below(64 * 1024 + 1),
    } as usize;
    let mut v = vec![0u8; len];
    match rng.below(6) {
        0 => rng.fill(&mut v),
        1 => {}
        kind => {
            let mut payload = vec![0u8; rng.below(4097) as usize];
            rng.fill(&mut payload);
            let mut r = record(rng.next_u64(), &payload);
            if kind == 3 && !r.is_empty() {
                let i = rng.below(r.len() as u64) as usize;
                r[i] ^= 1 + rng.below(255) as u8;
            }
            if kind == 4 {
                r.truncate(rng.below(r.len() as u64 + 1) as usize);
            }
            if kind == 5 {
                r.truncate(4);
                r[2..4].copy_from_slice(&(rng.below(4097) as u16).to_le_bytes());
            }
            rng.fill(&mut v);
            let n = r.len().min(v.len());
            v[..n].copy_from_slice(&r[..n]);
        }
    }
    v
}

#[test]
fn any_file_is_opened_or_refused_by_name_never_panicked_on() {
    // Four threads of 25,000 cases each, each its own directory and seed
    // (the cases are independent; one thread took 22 s here); a plain
    // `cargo test` runs the first 5,000 of each (scripts/test.sh and CI
    // run them all).
    let cases = if zmem_testkit::ci::thorough() { 25_000 } else { 5_000 };
    let runs: Vec<(u32, u32)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4u64).map(|t| s.spawn(move || run_cases(0x26 + t, cases))).collect();
        threads.into_iter().map(|h| h.join().expect("a fuzz thread panicked")).collect()
    });
    let (taken, refused) = runs.iter().fold((0, 0), |(a, b), &(t, r)| (a + t, b + r));
    eprintln!("{taken} files taken, {refused} refused");
    assert_eq!(taken + refused, 4 * cases);
    assert!(taken > 1000 && refused > 1000, "the cases exercise both ends: {taken} taken, {refused} refused");
}

/// `cases` files from `seed`, each opened as a backing store: returns how
/// many were taken and how many refused (anything else fails the test).
fn run_cases(seed: u64, cases: u32) -> (u32, u32) {
    let d = tempfile::tempdir().unwrap();
    let mut rng = XorShift::new(seed);
    let (mut taken, mut refused) = (0u32, 0u32);
    for case in 0..cases {
        let name = format!("backing-{}.img", case % 7);
        let p = d.path().join(&name);
        let bytes = contents(&mut rng);
        std::fs::write(&p, &bytes).unwrap();
        match BackingStore::open(&p, None, Existing::Refuse) {
            Ok(_) => taken += 1,
            Err(e @ BackingError::Refused { .. }) => {
                refused += 1;
                let msg = e.to_string();
                assert!(msg.contains(&name), "seed {seed:#x} case {case} ({} bytes): a refusal that does not name the file: {msg}", bytes.len());
                assert_eq!(std::fs::read(&p).unwrap(), bytes, "seed {seed:#x} case {case}: a refused file was changed");
            }
            Err(e) => panic!("seed {seed:#x} case {case} ({} bytes): neither taken nor refused: {e}", bytes.len()),
        }
    }
    (taken, refused)
}
