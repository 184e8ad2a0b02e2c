//! Per-operation cost of the allocator (prints numbers, asserts nothing):
//! `cargo run --release -p zmem-alloc --example microbench`

use zmem_alloc::{Handle, ZsPool};

fn main() {
    use std::hint::black_box;
    use std::time::Instant;
    let n = 100_000;
    let per = |d: std::time::Duration, n: usize| d.as_nanos() as f64 / n as f64;
    for &len in &[100usize, 1500, 4096] {
        let pool = ZsPool::default();
        let data = vec![0x5Au8; len];
        // Cold: every span is new or was released (page faults included).
        let t = Instant::now();
        let mut hs: Vec<Handle> = (0..n).map(|_| pool.alloc_write(&data).unwrap()).collect();
        let cold_alloc = per(t.elapsed(), n);
        let t = Instant::now();
        let mut sum = 0u64;
        for h in &hs {
            sum += pool.read(*h, |b| b[len - 1] as u64).unwrap();
        }
        let read = per(t.elapsed(), n);
        hs.clear();
        drop(pool);
        // Warm, cache-resident steady state: a 2000-object population where
        // every round frees every other object (spans stay live) and refills.
        let pool = ZsPool::default();
        let mut hs: Vec<Handle> = (0..2000).map(|_| pool.alloc_write(&data).unwrap()).collect();
        let (mut tf, mut ta, rounds) = (std::time::Duration::ZERO, std::time::Duration::ZERO, 200);
        for _ in 0..rounds {
            let t = Instant::now();
            for h in hs.iter().skip(1).step_by(2) {
                pool.free(*h).unwrap();
            }
            tf += t.elapsed();
            let t = Instant::now();
            for i in (1..hs.len()).step_by(2) {
                hs[i] = pool.alloc_write(&data).unwrap();
            }
            ta += t.elapsed();
        }
        let warm_free = per(tf, rounds * 1000);
        let warm_alloc = per(ta, rounds * 1000);
        hs.clear();
        let mut buf = vec![0u8; 4096];
        let t = Instant::now();
        for _ in 0..n {
            buf[..len].copy_from_slice(black_box(&data));
            black_box(&mut buf);
        }
        let memcpy = per(t.elapsed(), n);
        println!(
            "len {len:4}: alloc_write cold {cold_alloc:7.1} ns, warm {warm_alloc:6.1} ns | read {read:5.1} ns | \
             free (span stays live) {warm_free:6.1} ns | memcpy {memcpy:5.1} ns (sum {sum})"
        );
    }
    // Huge class: every free releases its 1-page span (a hole punched), every alloc refaults it.
    let pool = ZsPool::default();
    let page = vec![1u8; 4096];
    let hs: Vec<Handle> = (0..n).map(|_| pool.alloc_write(&page).unwrap()).collect();
    let t = Instant::now();
    for h in hs {
        pool.free(h).unwrap();
    }
    let free = per(t.elapsed(), n);
    let t = Instant::now();
    for _ in 0..n {
        black_box(pool.alloc_write(&page).unwrap());
    }
    println!("len 4096 churn: free (hole punched) {free:.1} ns, alloc into released span {:.1} ns", per(t.elapsed(), n));
}
