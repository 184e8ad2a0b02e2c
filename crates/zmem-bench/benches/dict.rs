//! What trained dictionaries would buy zmem (issue 10, item 3), measured
//! before building them into the pool: on each data set, the bytes a pool
//! would hold for lz4, zstd:3 and zstd:9, each without and with a zstd
//! dictionary trained on a sample of the same pages.
//!
//! `cargo bench -p zmem-bench --bench dict [-- DICT_KIB [SAMPLE_EVERY [LEVEL]]]`
//! (LEVEL: the strong zstd level, default 9)
//!
//! Data sets (the three of the issue): the pages of
//! `/usr/lib/x86_64-linux-gnu` (128 MiB), the anonymous memory of a live
//! python3 process (`zmem bench store`'s default one, 64 MiB), and a cargo
//! build output (this repository's `target/release/deps`, 128 MiB).
//! Same-filled pages are left out (a pool keeps them for free).
//!
//! "Pool bytes" rounds each object up to the allocator's 16-byte size
//! classes (32 bytes at least) and stores raw at 4,032 bytes or more, as
//! `zmem-core` does; dictionary memory is added once. The dictionary is
//! trained on every SAMPLE_EVERY-th page (default 64) with zstd's trainer,
//! at DICT_KIB KiB (default 64); lz4 uses the same bytes as its
//! dictionary (a prefix the page's matches may point into).

use std::path::PathBuf;
use std::time::Instant;

use zmem_bench::pages::{self, PageSet};

const PAGE: usize = 4096;
const HUGE: usize = 4032;

fn pool_bytes(len: usize) -> u64 {
    if len >= HUGE {
        PAGE as u64
    } else {
        (len.max(32).div_ceil(16) * 16) as u64
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let dict_kib: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(64);
    let every: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let strong: i32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(9);
    let mut sets: Vec<(String, PageSet)> = Vec::new();
    sets.push(("/usr/lib tar".into(), pages::read_paths(&[PathBuf::from("/usr/lib/x86_64-linux-gnu")], Some(128 << 20))?));
    let mut child = pages::spawn_default_process(64 << 20)?;
    let anon = pages::read_process(child.id(), Some(64 << 20));
    let _ = child.kill();
    let _ = child.wait();
    sets.push(("python anon".into(), anon?));
    let deps = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/deps");
    if deps.is_dir() {
        sets.push(("cargo build output".into(), pages::read_paths(&[deps], Some(128 << 20))?));
    }
    println!("dictionary {dict_kib} KiB trained on every {every}th page; pool bytes in MB (10^6), ratio to lz4 alone");
    let (sl, sld) = (format!("zstd:{strong}"), format!("zstd:{strong}+dict"));
    println!("{:<20} {:>7} {:>9} {:>13} {:>9} {:>13} {:>9} {:>13} {:>8}", "data", "pages", "lz4", "lz4+dict", "zstd:3", "zstd:3+dict", sl, sld, "train s");
    for (name, set) in &sets {
        let pages: Vec<&[u8]> = set.iter().filter(|p| p.iter().any(|&b| b != p[0])).collect();
        let samples: Vec<&[u8]> = pages.iter().step_by(every.max(1)).copied().collect();
        let t = Instant::now();
        let dict = zstd::dict::from_samples(&samples, dict_kib << 10)?;
        let train = t.elapsed().as_secs_f64();
        let dict_bytes = dict.len() as u64;
        let mut out = vec![0u8; 4 * PAGE];
        let mut lz4 = (0u64, 0u64);
        let mut z = [(0u64, 0u64); 2];
        let (mut c3, mut c9) = (zstd::bulk::Compressor::new(3)?, zstd::bulk::Compressor::new(strong)?);
        let (mut d3, mut d9) = (zstd::bulk::Compressor::with_dictionary(3, &dict)?, zstd::bulk::Compressor::with_dictionary(strong, &dict)?);
        for p in &pages {
            let n = lz4_flex::block::compress_into(p, &mut out).map_err(|e| anyhow::anyhow!("lz4: {e}"))?;
            lz4.0 += pool_bytes(n);
            let n = lz4_flex::block::compress_into_with_dict(p, &mut out, &dict).map_err(|e| anyhow::anyhow!("lz4 with the dictionary: {e}"))?;
            lz4.1 += pool_bytes(n);
            z[0].0 += pool_bytes(c3.compress_to_buffer(p, &mut out[..])?);
            z[0].1 += pool_bytes(d3.compress_to_buffer(p, &mut out[..])?);
            z[1].0 += pool_bytes(c9.compress_to_buffer(p, &mut out[..])?);
            z[1].1 += pool_bytes(d9.compress_to_buffer(p, &mut out[..])?);
        }
        let base = lz4.0 as f64;
        let cell = |b: u64, with_dict: bool| {
            let b = b + if with_dict { dict_bytes } else { 0 };
            format!("{:.1} {:.3}", b as f64 / 1e6, b as f64 / base)
        };
        println!(
            "{:<20} {:>7} {:>9} {:>13} {:>9} {:>13} {:>9} {:>13} {:>8.2}",
            name,
            pages.len(),
            format!("{:.1}", base / 1e6),
            cell(lz4.1, true),
            cell(z[0].0, false),
            cell(z[0].1, true),
            cell(z[1].0, false),
            cell(z[1].1, true),
            train
        );
    }
    Ok(())
}
