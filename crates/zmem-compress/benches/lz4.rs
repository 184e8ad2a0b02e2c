//! lz4 decoders and encoders side by side, on the same pages, in one run:
//! which one zmem ships (issue 10, "lz4 at the kernel's speed").
//!
//! `cargo bench -p zmem-compress --bench lz4 [-- DIR [MIB]]`
//!
//! Pages: 4 KiB pages of the files under DIR (default
//! `/usr/lib/x86_64-linux-gnu`, the tree whose tar `zmem bench store`
//! uses), up to MIB MiB (default 128), same-filled pages left out (a pool
//! keeps those without compressing them). Each contender compresses every
//! page into its own buffers, then decompresses all of them into one page
//! buffer; the best of 5 passes is reported, as MB/s (10^6 bytes) of
//! original pages. Every decoder also decodes the other encoders' output,
//! and every page must come back byte for byte: the block format is one.
//!
//! Contenders:
//! - `lz4_flex 0.11 safe`: what zmem shipped before (`safe-encode`,
//!   `safe-decode`: no unsafe code).
//! - `lz4_flex 0.14 checked`: the crate's unsafe encoder and decoder, with
//!   `checked-decode` (bounds checks on untrusted input, the crate's
//!   recommendation for it).
//! - `liblz4 1.10 (C), shipped`: zmem-compress's lz4, which is
//!   `LZ4_compress_default` and `LZ4_decompress_safe` through `lz4-sys`
//!   (the kernel's lz4 is the same code).

use std::path::{Path, PathBuf};
use std::time::Instant;

use zmem_compress::{Algorithm, Compressor};

const PAGE: usize = 4096;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let dir = PathBuf::from(args.first().map(String::as_str).unwrap_or("/usr/lib/x86_64-linux-gnu"));
    let mib: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(128);
    let pages = load_pages(&dir, mib << 20);
    if pages.is_empty() {
        eprintln!("no pages under {}: give a directory with files in it", dir.display());
        std::process::exit(2);
    }
    println!("{} pages ({} MiB) from {}, same-filled pages left out", pages.len(), (pages.len() * PAGE) >> 20, dir.display());

    let codecs: [&dyn Codec; 3] = [&FlexSafe, &FlexChecked, &CLz4];
    let mut outputs = Vec::new();
    println!("{:<24} {:>12} {:>12} {:>14}", "codec", "compress MB/s", "decompress MB/s", "compressed / original");
    for c in codecs {
        let (comp, secs_c) = best_of(5, || compress_all(c, &pages));
        let total: usize = comp.iter().map(Vec::len).sum();
        let (_, secs_d) = best_of(5, || decompress_all(c, &comp, &pages));
        let mb = (pages.len() * PAGE) as f64 / 1e6;
        println!("{:<24} {:>12.0} {:>15.0} {:>14.3}", c.name(), mb / secs_c, mb / secs_d, total as f64 / (pages.len() * PAGE) as f64);
        outputs.push((c.name(), comp));
    }
    // One format: every decoder reads every encoder's output.
    for d in codecs {
        for (_, comp) in &outputs {
            decompress_all(d, comp, &pages);
        }
    }
    println!("cross-check: every decoder read every encoder's pages back byte for byte");
}

trait Codec {
    fn name(&self) -> &'static str;
    /// Compressed length, or None when the page does not fit in `dst`.
    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize>;
    /// Decompressed length, or None on a corrupt stream.
    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize>;
}

struct FlexSafe;
struct FlexChecked;
struct CLz4;

impl Codec for FlexSafe {
    fn name(&self) -> &'static str {
        "lz4_flex 0.11 safe"
    }
    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        lz4_flex_safe::block::compress_into(src, dst).ok()
    }
    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        lz4_flex_safe::block::decompress_into(src, dst).ok()
    }
}

impl Codec for FlexChecked {
    fn name(&self) -> &'static str {
        "lz4_flex 0.14 checked"
    }
    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        lz4_flex::block::compress_into(src, dst).ok()
    }
    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        lz4_flex::block::decompress_into(src, dst).ok()
    }
}

impl Codec for CLz4 {
    fn name(&self) -> &'static str {
        "liblz4 1.10 (C), shipped"
    }
    fn compress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        Compressor::new(Algorithm::Lz4).compress(src, dst).ok()
    }
    fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        zmem_compress::decompress(Algorithm::Lz4, src, dst).ok().map(|()| dst.len())
    }
}

fn compress_all(c: &dyn Codec, pages: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; PAGE * 2];
    pages
        .iter()
        .map(|p| {
            let n = c.compress(p, &mut buf).unwrap_or_else(|| panic!("{} could not compress a page into 8 KiB", c.name()));
            buf[..n].to_vec()
        })
        .collect()
}

fn decompress_all(c: &dyn Codec, comp: &[Vec<u8>], pages: &[Vec<u8>]) {
    let mut out = vec![0u8; PAGE];
    for (z, p) in comp.iter().zip(pages) {
        let n = c.decompress(z, &mut out);
        assert_eq!(n, Some(PAGE), "{} failed on a page", c.name());
        assert!(out == *p, "{} decoded a page wrong", c.name());
    }
}

fn best_of<T>(n: usize, mut f: impl FnMut() -> T) -> (T, f64) {
    let mut best = f64::MAX;
    let mut last = None;
    for _ in 0..n {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed().as_secs_f64());
        last = Some(r);
    }
    (last.expect("n > 0"), best)
}

/// Pages of the regular files under `dir` (sorted walk, symlinks not
/// followed), up to `limit` bytes, same-filled pages left out.
fn load_pages(dir: &Path, limit: usize) -> Vec<Vec<u8>> {
    let mut files = Vec::new();
    walk(dir, &mut files);
    files.sort();
    let mut pages = Vec::new();
    for f in files {
        let Ok(data) = std::fs::read(&f) else { continue };
        for chunk in data.chunks(PAGE) {
            if pages.len() * PAGE >= limit {
                return pages;
            }
            let mut page = chunk.to_vec();
            page.resize(PAGE, 0);
            if page.iter().all(|&b| b == page[0]) {
                continue;
            }
            pages.push(page);
        }
    }
    pages
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            walk(&e.path(), out);
        } else if t.is_file() {
            out.push(e.path());
        }
    }
}
