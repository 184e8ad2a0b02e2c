use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use zmem_alloc::*;

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn read_exact(pool: &ZsPool, h: Handle, len: usize) -> Result<Vec<u8>, AllocError> {
    pool.read(h, |b| {
        assert_eq!(Some(b.len()), ZsPool::class_size(len), "read slice must be the class size");
        b[..len].to_vec()
    })
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { len: usize, seed: u64 },
    Free(usize),
    Read(usize),
    ReadStale(usize),
    Compact,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let len = prop_oneof![1usize..=64, 1usize..=4096, 4000usize..=4096, Just(4096usize)];
    prop_oneof![
        6 => (len, any::<u64>()).prop_map(|(len, seed)| Op::Alloc { len, seed }),
        4 => any::<usize>().prop_map(Op::Free),
        3 => any::<usize>().prop_map(Op::Read),
        1 => any::<usize>().prop_map(Op::ReadStale),
        1 => Just(Op::Compact),
    ]
}

fn check_stats(pool: &ZsPool, model: &HashMap<Handle, Vec<u8>>) {
    let st = pool.stats();
    assert_eq!(st.objs_used, model.len() as u64);
    let bytes: u64 = model.values().map(|v| ZsPool::class_size(v.len()).unwrap() as u64).sum();
    assert_eq!(st.obj_bytes_used, bytes);
    assert!(st.objs_allocated >= st.objs_used);
    assert_eq!(st.pages_used, pool.pages_used());
    assert!(st.pages_used <= st.pages_used_max);
    // Everything held is charged, and nothing more.
    assert_eq!(pool.budget().used(), st.pages_used * 4096 + st.metadata_bytes, "{st:?}");
    if model.is_empty() {
        assert_eq!(st.pages_used, 0);
        assert_eq!(st.objs_allocated, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn model_based(ops in prop::collection::vec(op_strategy(), 1..400), small_spans in any::<bool>()) {
        let cfg = AllocConfig { max_span_pages: if small_spans { 2 } else { 16 }, limit_bytes: None };
        let pool = ZsPool::new(cfg);
        let mut model: HashMap<Handle, Vec<u8>> = HashMap::new();
        let mut order: Vec<Handle> = Vec::new();
        let mut freed: Vec<Handle> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { len, seed } => {
                    let data = content(seed, len);
                    let h = pool.alloc_write(&data).unwrap();
                    prop_assert!(h.to_raw() != 0);
                    prop_assert!(model.insert(h, data).is_none(), "handle reused while live");
                    order.push(h);
                }
                Op::Free(i) if !order.is_empty() => {
                    let h = order.swap_remove(i % order.len());
                    model.remove(&h);
                    pool.free(h).unwrap();
                    freed.push(h);
                }
                Op::Read(i) if !order.is_empty() => {
                    let h = order[i % order.len()];
                    let want = &model[&h];
                    prop_assert_eq!(&read_exact(&pool, h, want.len()).unwrap(), want);
                }
                Op::ReadStale(i) if !freed.is_empty() => {
                    let h = freed[i % freed.len()];
                    let stale_read = matches!(pool.read(h, |_| ()), Err(AllocError::InvalidHandle { .. }));
                    let stale_free = matches!(pool.free(h), Err(AllocError::InvalidHandle { .. }));
                    prop_assert!(stale_read, "stale read accepted");
                    prop_assert!(stale_free, "double free accepted");
                }
                Op::Compact => {
                    pool.compact();
                }
                _ => {}
            }
            check_stats(&pool, &model);
        }
        pool.compact();
        for (h, want) in &model {
            prop_assert_eq!(&read_exact(&pool, *h, want.len()).unwrap(), want);
        }
        for h in order {
            pool.free(h).unwrap();
        }
        model.clear();
        check_stats(&pool, &model);
        prop_assert_eq!(pool.resident_pages_of_released_spans(), 0);
    }
}

#[test]
fn compaction_moves_objects_and_frees_spans() {
    let pool = ZsPool::default();
    let len = 100; // class 112
    let mut objs = Vec::new();
    for i in 0..5000u64 {
        let data = content(i, len);
        objs.push((pool.alloc_write(&data).unwrap(), data));
    }
    let full_pages = pool.pages_used();
    // Free 90%, scattered: keep every 10th object.
    let mut kept = Vec::new();
    for (i, (h, data)) in objs.into_iter().enumerate() {
        if i % 10 == 3 {
            kept.push((h, data));
        } else {
            pool.free(h).unwrap();
        }
    }
    let before = pool.stats();
    assert_eq!(before.pages_used, full_pages, "scattered frees should not empty spans");
    assert_eq!(before.pages_compacted, 0);
    let freed = pool.compact();
    let after = pool.stats();
    assert!(freed > 0);
    assert_eq!(after.pages_compacted, freed);
    assert_eq!(after.pages_used, before.pages_used - freed);
    assert!(after.pages_used * 4 < before.pages_used, "{after:?} vs {before:?}");
    // Nothing left to compact: fewer than one span's worth of holes.
    let span_objs = pool.span_pages_of_class(112).unwrap() as u64 * 4096 / 112;
    assert!(after.objs_allocated - after.objs_used < span_objs);
    assert_eq!(pool.compact(), 0);
    for (h, data) in &kept {
        assert_eq!(&read_exact(&pool, *h, len).unwrap(), data);
    }
    assert_eq!(pool.resident_pages_of_released_spans(), 0);
    for (h, _) in kept {
        pool.free(h).unwrap();
    }
    assert_eq!(pool.pages_used(), 0);
}

#[test]
fn compaction_across_all_classes() {
    let pool = ZsPool::new(AllocConfig { max_span_pages: 4, limit_bytes: None });
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut live = Vec::new();
    for i in 0..30_000u64 {
        let len = rng.gen_range(1..=4096);
        live.push((pool.alloc_write(&content(i, len)).unwrap(), i, len));
    }
    let mut kept = Vec::new();
    for obj in live {
        if rng.gen_bool(0.25) {
            kept.push(obj);
        } else {
            pool.free(obj.0).unwrap();
        }
    }
    let before = pool.stats();
    let freed = pool.compact();
    let after = pool.stats();
    assert!(freed > 0 && after.pages_used == before.pages_used - freed);
    assert!(after.objs_allocated < before.objs_allocated);
    assert_eq!(after.objs_used, kept.len() as u64);
    assert_eq!(pool.compact(), 0, "compaction must reach a fixed point");
    for (h, seed, len) in kept {
        assert_eq!(read_exact(&pool, h, len).unwrap(), content(seed, len));
    }
    assert_eq!(pool.resident_pages_of_released_spans(), 0);
}

#[test]
fn released_spans_leave_ram() {
    let pool = ZsPool::default();
    let mut hs = Vec::new();
    for i in 0..300u64 {
        hs.push(pool.alloc_write(&vec![0xA5; 4096]).unwrap());
        hs.push(pool.alloc_write(&content(i, 700)).unwrap());
        hs.push(pool.alloc_write(&content(i, 33)).unwrap());
    }
    let used = pool.pages_used() as usize;
    // Every live span has been written to, so mincore must see it resident
    // (except untouched tail pages of each class's last, partly filled span).
    let slack = pool.span_pages_of_class(704).unwrap() + pool.span_pages_of_class(48).unwrap();
    let live = pool.resident_pages_of_live_spans();
    assert!(live <= used && live + slack >= used, "{live} resident of {used}");
    assert_eq!(pool.resident_pages_of_released_spans(), 0);
    // Free the huge objects: each releases its own span.
    for h in hs.iter().step_by(3) {
        pool.free(*h).unwrap();
    }
    assert_eq!(pool.stats().spans_released, 300);
    assert_eq!(pool.pages_used() as usize, used - 300);
    assert_eq!(pool.resident_pages_of_released_spans(), 0);
    for (i, h) in hs.iter().enumerate() {
        if i % 3 != 0 {
            pool.free(*h).unwrap();
        }
    }
    assert_eq!(pool.pages_used(), 0);
    assert_eq!(pool.resident_pages_of_live_spans(), 0);
    assert_eq!(pool.resident_pages_of_released_spans(), 0);
    // Released spans are reused, and come back zeroed + resident.
    let h = pool.alloc_write(&[7; 4096]).unwrap();
    assert_eq!(pool.resident_pages_of_live_spans(), 1);
    assert_eq!(read_exact(&pool, h, 4096).unwrap(), vec![7; 4096]);
}

#[test]
fn errors() {
    let pool = ZsPool::default();
    assert!(matches!(pool.alloc_write(&[]), Err(AllocError::InvalidSize { len: 0 })));
    assert!(matches!(pool.alloc_write(&[0; 4097]), Err(AllocError::InvalidSize { len: 4097 })));
    assert_eq!(ZsPool::class_size(0), None);
    assert_eq!(ZsPool::class_size(4097), None);
    assert_eq!(ZsPool::class_size(1), Some(32));
    assert_eq!(ZsPool::class_size(33), Some(48));
    assert_eq!(ZsPool::class_size(48), Some(48));
    assert_eq!(ZsPool::class_size(4081), Some(4096));

    let h = pool.alloc_write(b"hello").unwrap();
    let keep = pool.alloc_write(b"world").unwrap();
    assert_eq!(pool.read(h, |b| b[..5].to_vec()).unwrap(), b"hello");
    pool.free(h).unwrap();
    assert!(matches!(pool.read(h, |_| ()), Err(AllocError::InvalidHandle { .. })));
    assert!(matches!(pool.free(h), Err(AllocError::InvalidHandle { .. })));
    // Slot and handle index reused: the old handle must still be rejected.
    let h2 = pool.alloc_write(b"again").unwrap();
    assert_ne!(h, h2);
    assert!(matches!(pool.read(h, |_| ()), Err(AllocError::InvalidHandle { .. })));
    assert!(matches!(pool.free(h), Err(AllocError::InvalidHandle { .. })));
    assert_eq!(pool.read(h2, |b| b[..5].to_vec()).unwrap(), b"again");

    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for raw in [0, u64::MAX, 1, 0xFF << 32, h2.to_raw() + 1, h2.to_raw() ^ (1 << 40)].into_iter().chain((0..10_000).map(|_| rng.gen::<u64>())) {
        if raw == h2.to_raw() || raw == keep.to_raw() {
            continue;
        }
        let g = Handle::from_raw(raw);
        assert!(matches!(pool.read(g, |_| ()), Err(AllocError::InvalidHandle { raw: r }) if r == raw));
        assert!(matches!(pool.free(g), Err(AllocError::InvalidHandle { .. })));
    }
    assert_eq!(pool.read(keep, |b| b[..5].to_vec()).unwrap(), b"world");
    assert_eq!(pool.stats().objs_used, 2);
}

#[test]
fn limit_reached_changes_nothing() {
    // Room for ten huge objects and the metadata they need, no more.
    let probe = ZsPool::default();
    for i in 0..10u8 {
        probe.alloc_write(&[i; 4096]).unwrap();
    }
    let limit = probe.budget().used();
    let pool = ZsPool::new(AllocConfig { max_span_pages: 16, limit_bytes: Some(limit) });
    let mut hs = Vec::new();
    for i in 0..10u8 {
        hs.push(pool.alloc_write(&[i; 4096]).unwrap());
    }
    let small = pool.alloc_write(&[9; 40]); // needs a new span (48 class, 3 pages)
    assert!(matches!(small, Err(AllocError::LimitReached { limit_bytes }) if limit_bytes == limit));
    let before = pool.stats();
    assert!(matches!(
        pool.alloc_write(&[1; 4096]),
        Err(AllocError::LimitReached { limit_bytes }) if limit_bytes == limit
    ));
    assert_eq!(pool.stats(), before);
    assert_eq!(before.pages_used, 10);
    for (i, h) in hs.iter().enumerate() {
        assert_eq!(read_exact(&pool, *h, 4096).unwrap(), vec![i as u8; 4096]);
    }
    pool.free(hs.pop().unwrap()).unwrap();
    hs.push(pool.alloc_write(&[42; 4096]).unwrap());
    pool.set_limit(None);
    let extra = pool.alloc_write(&[5; 100]).unwrap();
    assert_eq!(pool.read(extra, |b| b[..100].to_vec()).unwrap(), vec![5; 100]);
    assert!(pool.pages_used() > 10);
    // Objects that fit an existing span's touched pages succeed even at the limit.
    pool.set_limit(Some(pool.budget().used()));
    let more = pool.alloc_write(&[6; 100]).unwrap();
    assert_eq!(pool.read(more, |b| b[0]).unwrap(), 6);
    assert_eq!(pool.stats().pages_used_max, pool.pages_used());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Under a limit, whatever the mix of allocations, frees and
    /// compactions: the charged total never passes the limit, a refused
    /// allocation is `LimitReached` and changes nothing, and the books
    /// match what is held after every step.
    #[test]
    fn a_limit_covers_pages_and_metadata(
        ops in prop::collection::vec(op_strategy(), 1..600),
        limit_pages in 12u64..64,
        small_spans in any::<bool>(),
    ) {
        let limit = ZsPool::fixed_bytes() + limit_pages * 4096;
        let pool = ZsPool::new(AllocConfig { max_span_pages: if small_spans { 2 } else { 16 }, limit_bytes: Some(limit) });
        let mut model: HashMap<Handle, Vec<u8>> = HashMap::new();
        let mut order: Vec<Handle> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { len, seed } => {
                    let data = content(seed, len);
                    let before = pool.stats();
                    match pool.alloc_write(&data) {
                        Ok(h) => {
                            model.insert(h, data);
                            order.push(h);
                        }
                        Err(AllocError::LimitReached { limit_bytes }) => {
                            prop_assert_eq!(limit_bytes, limit);
                            prop_assert_eq!(pool.stats().objs_used, before.objs_used);
                            prop_assert_eq!(pool.stats().pages_used, before.pages_used);
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                Op::Free(i) if !order.is_empty() => {
                    let h = order.swap_remove(i % order.len());
                    model.remove(&h);
                    pool.free(h).unwrap();
                }
                Op::Compact => {
                    pool.compact();
                }
                _ => {}
            }
            check_stats(&pool, &model);
            prop_assert!(pool.budget().max_used() <= limit, "{} > {limit}", pool.budget().max_used());
        }
        for (h, want) in &model {
            prop_assert_eq!(&read_exact(&pool, *h, want.len()).unwrap(), want);
        }
    }
}

#[test]
fn metadata_grows_with_objects() {
    let pool = ZsPool::default();
    let m0 = pool.stats().metadata_bytes;
    assert!(m0 > 0);
    let hs: Vec<_> = (0..20_000u64).map(|i| pool.alloc_write(&content(i, 1 + (i as usize * 37) % 2000)).unwrap()).collect();
    let st = pool.stats();
    assert!(st.metadata_bytes > m0 + 20_000 * 8, "{st:?}");
    assert!(st.obj_bytes_used <= st.pages_used * 4096);
    for h in hs {
        pool.free(h).unwrap();
    }
    // Tables are kept for reuse, so metadata does not shrink below the peak.
    assert!(pool.stats().metadata_bytes >= st.metadata_bytes);
}

#[test]
fn concurrent_stress_with_compaction() {
    let pool = Arc::new(ZsPool::new(AllocConfig { max_span_pages: 8, limit_bytes: None }));
    let stop = Arc::new(AtomicBool::new(false));
    let compactor = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut freed = 0;
            while !stop.load(Ordering::Relaxed) {
                freed += pool.compact();
                std::thread::yield_now();
            }
            freed
        })
    };
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut live: Vec<(Handle, u64, usize)> = Vec::new();
                for step in 0..40_000u64 {
                    let r = rng.gen_range(0..10);
                    if r < 4 || live.is_empty() {
                        // Each thread favours a few classes shared with others.
                        let len = if rng.gen_bool(0.1) { 4096 } else { rng.gen_range(1..=600) };
                        let seed = (t << 32) | step;
                        let h = pool.alloc_write(&content(seed, len)).unwrap();
                        live.push((h, seed, len));
                    } else if r < 7 {
                        let i = rng.gen_range(0..live.len());
                        let (h, seed, len) = live.swap_remove(i);
                        assert_eq!(read_exact(&pool, h, len).unwrap(), content(seed, len));
                        pool.free(h).unwrap();
                    } else {
                        let (h, seed, len) = live[rng.gen_range(0..live.len())];
                        let ok = pool.read(h, |b| b[..len] == content(seed, len)[..]).unwrap();
                        assert!(ok);
                    }
                }
                live
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.join().unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let _ = compactor.join().unwrap();
    pool.compact();
    assert_eq!(pool.stats().objs_used, all.len() as u64);
    for (h, seed, len) in all {
        assert_eq!(read_exact(&pool, h, len).unwrap(), content(seed, len));
        pool.free(h).unwrap();
    }
    let st = pool.stats();
    assert_eq!((st.pages_used, st.objs_used, st.objs_allocated), (0, 0, 0));
    assert_eq!(pool.resident_pages_of_released_spans(), 0);
}

/// Only pages that objects were written into are charged, and exactly those
/// are resident: a class's last, partly filled span costs what it holds.
#[test]
fn charged_pages_are_the_resident_pages() {
    let pool = ZsPool::new(AllocConfig::default());
    let size = 3008; // a class whose span is many pages long
    let span_pages = pool.span_pages_of_class(size).unwrap();
    assert!(span_pages > 4, "class {size} uses {span_pages}-page spans");
    let a = pool.alloc_write(&vec![1u8; size]).unwrap();
    assert_eq!(pool.pages_used(), 1, "one object in a fresh span touches one page");
    assert_eq!(pool.resident_pages_of_live_spans(), 1);
    let mut hs = vec![a];
    for i in 0..5u8 {
        hs.push(pool.alloc_write(&vec![i; size]).unwrap());
        assert_eq!(pool.resident_pages_of_live_spans() as u64, pool.pages_used());
    }
    // six 3008-byte objects reach into ceil(6*3008/4096) = 5 pages
    assert_eq!(pool.pages_used(), 5);
    for h in hs {
        pool.free(h).unwrap();
    }
    assert_eq!(pool.pages_used(), 0);
    assert_eq!(pool.resident_pages_of_live_spans(), 0);
    assert_eq!(pool.resident_pages_of_released_spans(), 0);
}

/// Holes that add up to less than a span, scattered over every span of a
/// class (what recompression or a wave of rewrites leaves), pinned their
/// pages: compaction now packs the class as a fresh pool would hold the
/// same objects, releases the pages past them, and charges them again when
/// new objects reach into them.
#[test]
fn scattered_holes_are_packed_as_a_fresh_pool_holds_them() {
    let pool = ZsPool::new(AllocConfig::default());
    let len = 1500;
    let span_objs = pool.span_pages_of_class(1504).unwrap() * 4096 / 1504;
    let n = 6 * span_objs;
    let mut kept = Vec::new();
    for i in 0..n as u64 {
        let data = content(i, len);
        let h = pool.alloc_write(&data).unwrap();
        kept.push((h, data));
    }
    // Free one object in 8, everywhere: fewer holes than a span holds.
    let all = std::mem::take(&mut kept);
    let mut freed = 0;
    for (i, (h, data)) in all.into_iter().enumerate() {
        if i % 8 == 5 {
            pool.free(h).unwrap();
            freed += 1;
        } else {
            kept.push((h, data));
        }
    }
    assert!(freed > 0 && freed < span_objs, "{freed} holes, {span_objs} a span");
    let before = pool.pages_used();
    pool.compact();
    let fresh = ZsPool::new(AllocConfig::default());
    for (_, data) in &kept {
        fresh.alloc_write(data).unwrap();
    }
    assert_eq!(pool.pages_used(), fresh.pages_used(), "compacted {} pages (from {before}), fresh {}", pool.pages_used(), fresh.pages_used());
    assert!(pool.pages_used() < before);
    assert_eq!(pool.resident_pages_of_live_spans() as u64, pool.pages_used(), "trimmed pages left RAM");
    for (h, data) in &kept {
        assert_eq!(&read_exact(&pool, *h, len).unwrap(), data);
    }
    assert_eq!(pool.compact(), 0, "a fixed point");
    // New objects fill the packed span from its head, charging its pages again.
    for i in 0..freed as u64 {
        let data = content(1_000_000 + i, len);
        kept.push((pool.alloc_write(&data).unwrap(), data));
        assert_eq!(pool.resident_pages_of_live_spans() as u64, pool.pages_used());
    }
    for (h, data) in &kept {
        assert_eq!(&read_exact(&pool, *h, len).unwrap(), data);
    }
    for (h, _) in kept {
        pool.free(h).unwrap();
    }
    assert_eq!(pool.pages_used(), 0);
}
