//! Shared test data generators.
#![allow(dead_code)]

use std::path::Path;

use zmem_testkit::XorShift;

/// The generator for `seed` (tests must not depend on a global RNG).
pub fn rng(seed: u64) -> XorShift {
    XorShift::from_state(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
}

pub fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng(seed).fill(&mut v);
    v
}

/// Text-like data: words from a small vocabulary.
pub fn text(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "the ",
        "memory ",
        "page ",
        "zram ",
        "compress ",
        "swap ",
        "kernel ",
        "of ",
        "a ",
        "and ",
        "LZO1X ",
        "fast ",
        "block\n",
        "(void *)",
        "return 0;\n",
        "\t",
        "0x7fff ",
    ];
    let mut r = rng(seed);
    let mut v = Vec::with_capacity(len + 16);
    while v.len() < len {
        v.extend_from_slice(WORDS[r.below(WORDS.len() as u64) as usize].as_bytes());
    }
    v.truncate(len);
    v
}

/// Repetitive data: short random patterns repeated, with occasional noise,
/// and long-distance repeats (exercises M2, M3 and M4 and long lengths).
pub fn repetitive(len: usize, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let mut v: Vec<u8> = Vec::with_capacity(len + 512);
    while v.len() < len {
        match r.below(5) {
            0 => {
                let pl = 1 + r.below(12) as usize;
                let pat: Vec<u8> = (0..pl).map(|_| r.next_u64() as u8).collect();
                let reps = 1 + r.below(64) as usize;
                for _ in 0..reps {
                    v.extend_from_slice(&pat);
                }
            }
            1 if !v.is_empty() => {
                // copy from far back
                let dist = 1 + r.below(v.len().min(60_000) as u64) as usize;
                let l = 3 + r.below(300) as usize;
                let start = v.len() - dist;
                for k in 0..l {
                    let b = v[start + k];
                    v.push(b);
                }
            }
            2 => {
                let l = r.below(40) as usize;
                for _ in 0..l {
                    v.push(r.next_u64() as u8);
                }
            }
            3 => {
                let l = r.below(1000) as usize;
                let b = r.next_u64() as u8;
                v.resize(v.len() + l, b);
            }
            _ => v.extend_from_slice(b"struct page *page = alloc_page(GFP_KERNEL);\n"),
        }
    }
    v.truncate(len);
    v
}

/// Up to `max_bytes` of real binary data from system libraries (may be empty).
pub fn real_data(max_bytes: usize) -> Vec<u8> {
    let dir = Path::new("/usr/lib/x86_64-linux-gnu");
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    let mut files: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    for f in files {
        if out.len() >= max_bytes {
            break;
        }
        if let Ok(data) = std::fs::read(&f) {
            let take = data.len().min(256 * 1024).min(max_bytes - out.len());
            out.extend_from_slice(&data[..take]);
        }
    }
    out
}

/// Sizes that hit the encoder's edge cases.
pub const SIZES: &[usize] = &[
    0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 14, 15, 16, 17, 18, 19, 20, 31, 33, 100, 237, 238, 239, 240, 255, 256, 257, 300, 1000, 1023, 4095, 4096, 4097, 16384,
    16385, 49151, 49152, 49153, 65535, 65536, 65537, 100_003, 200_000,
];

pub fn all_kinds(len: usize, seed: u64) -> Vec<(&'static str, Vec<u8>)> {
    vec![("zeros", vec![0u8; len]), ("random", random(len, seed)), ("text", text(len, seed)), ("repetitive", repetitive(len, seed))]
}

pub fn our_compress(src: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; zmem_lzo::compress_bound(src.len())];
    let n = zmem_lzo::compress(src, &mut out).expect("compress with bound-sized dst");
    out.truncate(n);
    out
}

pub fn our_decompress(src: &[u8], len: usize) -> Result<Vec<u8>, zmem_lzo::LzoError> {
    let mut out = vec![0u8; len];
    let n = zmem_lzo::decompress(src, &mut out)?;
    out.truncate(n);
    Ok(out)
}
