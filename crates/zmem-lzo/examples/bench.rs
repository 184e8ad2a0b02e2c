//! Quick, non-asserting throughput check on 4 KiB pages.
//! `cargo run --release -p zmem-lzo --example bench`

use std::time::{Duration, Instant};

use zmem_testkit::XorShift;

fn load(paths: &[&str], max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for p in paths {
        let Ok(rd) = std::fs::read_dir(p) else {
            continue;
        };
        let mut files: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect();
        files.sort();
        for f in files {
            if out.len() >= max {
                return out;
            }
            if let Ok(d) = std::fs::read(&f) {
                let take = d.len().min(max - out.len());
                out.extend_from_slice(&d[..take]);
            }
        }
    }
    out
}

fn text_fallback(len: usize) -> Vec<u8> {
    let words = ["the ", "memory ", "page ", "zram ", "kernel ", "and ", "of ", "int x = 0;\n"];
    let mut v = Vec::new();
    let mut r = XorShift::from_state(1);
    while v.len() < len {
        v.extend_from_slice(words[r.below(words.len() as u64) as usize].as_bytes());
    }
    v.truncate(len);
    v
}

fn time<F: FnMut()>(mut f: F) -> Duration {
    // best of 5 runs
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
    }
    best
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn bench(name: &str, data: &[u8]) {
    let pages: Vec<&[u8]> = data.chunks_exact(4096).collect();
    let total = pages.len() * 4096;
    if total == 0 {
        return;
    }
    let bound = zmem_lzo::compress_bound(4096);
    let mut comp: Vec<Vec<u8>> = Vec::with_capacity(pages.len());
    let mut buf = vec![0u8; bound];
    for p in &pages {
        let n = zmem_lzo::compress(p, &mut buf).unwrap();
        comp.push(buf[..n].to_vec());
    }
    let csize: usize = comp.iter().map(|c| c.len()).sum();

    let tc = time(|| {
        for p in &pages {
            std::hint::black_box(zmem_lzo::compress(p, &mut buf).unwrap());
        }
    });
    let mut out = vec![0u8; 4096];
    let td = time(|| {
        for c in &comp {
            std::hint::black_box(zmem_lzo::decompress(c, &mut out).unwrap());
        }
    });

    // Reference: rust-lzo (minilzo port).
    let mut ctx = rust_lzo::LZOContext::new();
    let mut rsize = 0;
    let mut rcomp = Vec::new();
    for p in &pages {
        let (r, _) = ctx.compress_to_slice(p, &mut buf);
        rsize += r.len();
        rcomp.push(r.to_vec());
    }
    let rtc = time(|| {
        for p in &pages {
            std::hint::black_box(ctx.compress_to_slice(p, &mut buf).0.len());
        }
    });
    let rtd = time(|| {
        for c in &rcomp {
            std::hint::black_box(rust_lzo::LZOContext::decompress_to_slice(c, &mut out).0.len());
        }
    });

    println!(
        "{name:>8}: {:>6} pages  ours: ratio {:.3} comp {:>7.0} MB/s decomp {:>7.0} MB/s | rust-lzo: ratio {:.3} comp {:>7.0} MB/s decomp {:>7.0} MB/s",
        pages.len(),
        csize as f64 / total as f64,
        mbps(total, tc),
        mbps(total, td),
        rsize as f64 / total as f64,
        mbps(total, rtc),
        mbps(total, rtd),
    );
}

fn main() {
    let bin = load(&["/usr/lib/x86_64-linux-gnu", "/usr/bin"], 16 << 20);
    let mut text = load(&["/usr/share/common-licenses", "/usr/include", "/usr/include/linux"], 8 << 20);
    if text.len() < (1 << 20) {
        text = text_fallback(8 << 20);
    }
    let zeros = vec![0u8; 4 << 20];
    let mut random = vec![0u8; 4 << 20];
    XorShift::from_state(7).fill(&mut random);
    bench("binary", &bin);
    bench("text", &text);
    bench("zeros", &zeros);
    bench("random", &random);
}
