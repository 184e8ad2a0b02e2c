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
