#![allow(dead_code)]
//! Page generators shared by the integration tests.

use zmem_testkit::XorShift;

pub mod crash_log;

pub const PAGE: usize = 4096;

/// Every seed gives its own stream ([`XorShift::new`] mixes it first).
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut r = XorShift::new(seed);
    move || r.next_u64()
}

/// Text-like page: compresses well but not to nothing.
pub fn compressible(seed: u64) -> Vec<u8> {
    let mut r = xorshift(seed);
    let words = [&b"alpha "[..], b"beta ", b"gamma ", b"delta ", b"0x1f ", b"\n", b"zmem ", b"page "];
    let mut p = Vec::with_capacity(PAGE);
    while p.len() < PAGE {
        let w = words[(r() % words.len() as u64) as usize];
        p.extend_from_slice(w);
        if r().is_multiple_of(5) {
            p.push((r() % 256) as u8);
        }
    }
    p.truncate(PAGE);
    p
}

pub fn incompressible(seed: u64) -> Vec<u8> {
    let mut r = xorshift(seed ^ 0xdead_beef);
    (0..PAGE / 8).flat_map(|_| r().to_le_bytes()).collect()
}

pub fn same_filled(pattern: u64) -> Vec<u8> {
    (0..PAGE / 8).flat_map(|_| pattern.to_ne_bytes()).collect()
}

/// Half compressible, half random: lands in a large size class.
pub fn half(seed: u64) -> Vec<u8> {
    let mut p = compressible(seed);
    p[..PAGE / 2].copy_from_slice(&incompressible(seed)[..PAGE / 2]);
    p
}

/// Pages of words from a vocabulary of 600 (one per `family`) that pages
/// share but rarely repeat within one: what a dictionary holds and a page
/// alone does not.
pub fn record_page(family: u64, seed: u64) -> Vec<u8> {
    let word = |i: u64| {
        let h = (i + family * 1_000_003).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (0..11).map(|b| b'a' + ((h >> (b * 5)) % 26) as u8).collect::<Vec<u8>>()
    };
    let mut r = xorshift(seed ^ (family << 40));
    let mut p = Vec::with_capacity(PAGE);
    while p.len() < PAGE {
        p.extend_from_slice(&word(r() % 600));
        p.push(b' ');
    }
    p.truncate(PAGE);
    p
}

/// The arena file, read or written at `at`.
pub fn file_of(fd: &std::os::fd::OwnedFd) -> std::fs::File {
    std::fs::File::from(fd.try_clone().unwrap())
}

/// Where the ledger's entry of `key` is in the arena file (its directory:
/// 16-byte entries from byte 512, their count at byte 48; the table is the
/// region of kind 3). Past the keys (`ledger_keys`) are the dictionaries'
/// areas: 65,536 entries each, the first a header.
pub fn ledger_entry_at(fd: &std::os::fd::OwnedFd, key: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = file_of(fd);
    let word = |at: u64| {
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, at).unwrap();
        u64::from_ne_bytes(b)
    };
    let table = (0..word(48)).map(|i| (word(512 + 16 * i), word(520 + 16 * i))).find(|(w0, _)| w0 >> 56 == 3).expect("the ledger's table").1;
    (table >> 32) * 4096 + 16 * key
}
