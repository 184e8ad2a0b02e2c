//! A pool's arena outlives the pool: opened again, it holds every object
//! the pool held, and the allocator goes on from there. An arena that is
//! not a pool's, of another version, damaged, or still held is refused
//! with its reason, and nothing is read or changed.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use zmem_alloc::{AllocConfig, ArenaError, Budget, Handle, ZsPool};

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn arena_of(pool: &ZsPool) -> OwnedFd {
    pool.arena_fd().expect("an arena").try_clone_to_owned().unwrap()
}

/// A file of the arena, written at `at` (as a damaged or foreign arena).
fn poke(fd: &OwnedFd, at: u64, bytes: &[u8]) {
    let f = std::fs::File::from(fd.try_clone().unwrap());
    f.write_all_at(bytes, at).unwrap();
}

fn peek(fd: &OwnedFd, at: u64) -> u64 {
    let f = std::fs::File::from(fd.try_clone().unwrap());
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, at).unwrap();
    u64::from_ne_bytes(b)
}

/// A pool of objects of every class, some freed, compacted.
fn filled(seed: u64) -> (ZsPool, HashMap<Handle, (u64, usize)>) {
    let pool = ZsPool::new(AllocConfig { max_span_pages: 8, limit_bytes: None });
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut live = HashMap::new();
    for i in 0..6000u64 {
        let len = if i % 7 == 0 { 4096 } else { rng.gen_range(1..=4096) };
        let h = pool.alloc_write(&content(i, len)).unwrap();
        live.insert(h, (i, len));
        if rng.gen_bool(0.4) {
            let k = *live.keys().next().unwrap();
            live.remove(&k);
            pool.free(k).unwrap();
        }
    }
    pool.compact();
    (pool, live)
}

fn check(pool: &ZsPool, live: &HashMap<Handle, (u64, usize)>) {
    for (&h, &(seed, len)) in live {
        let got = pool.read(h, |b| b[..len].to_vec()).unwrap();
        assert!(got == content(seed, len), "object {h:?} read back wrong");
    }
    let st = pool.stats();
    assert_eq!(st.objs_used, live.len() as u64);
    assert_eq!(pool.budget().used(), st.pages_used * 4096 + st.metadata_bytes, "{st:?}");
}

#[test]
fn an_arena_opened_again_holds_every_object_and_the_pool_goes_on() {
    let (pool, mut live) = filled(1);
    check(&pool, &live);
    let before = pool.stats();
    let freed = *live.keys().next().unwrap();
    let (_, freed_len) = live.remove(&freed).unwrap();
    pool.free(freed).unwrap();
    let fd = arena_of(&pool);
    drop(pool);

    let (pool, found) = ZsPool::open(fd, Arc::new(Budget::new(None))).unwrap();
    let found: std::collections::HashSet<Handle> = found.into_iter().collect();
    assert_eq!(found, live.keys().copied().collect(), "the live handles are exactly the pool's");
    check(&pool, &live);
    let after = pool.stats();
    let freed_bytes = ZsPool::class_size(freed_len).unwrap() as u64;
    assert_eq!((after.objs_used, after.obj_bytes_used), (before.objs_used - 1, before.obj_bytes_used - freed_bytes));
    assert!(after.pages_used <= before.pages_used, "{after:?} against {before:?}");
    assert!(matches!(pool.read(freed, |_| ()), Err(zmem_alloc::AllocError::InvalidHandle { .. })), "a freed handle stays stale");

    // It goes on: new objects, frees, a compaction, and open once more.
    for i in 0..2000u64 {
        let len = 1 + (i as usize * 37) % 4096;
        live.insert(pool.alloc_write(&content(100_000 + i, len)).unwrap(), (100_000 + i, len));
    }
    let gone: Vec<Handle> = live.keys().copied().step_by(3).collect();
    for h in gone {
        live.remove(&h);
        pool.free(h).unwrap();
    }
    pool.compact();
    check(&pool, &live);
    let fd = arena_of(&pool);
    drop(pool);
    let (pool, found) = ZsPool::open(fd, Arc::new(Budget::new(None))).unwrap();
    assert_eq!(found.len(), live.len());
    check(&pool, &live);
    assert_eq!(pool.resident_pages_of_released_spans(), 0, "released spans hold no pages after opening");
}

#[test]
fn an_arena_in_use_is_refused() {
    let (pool, _) = filled(2);
    let fd = arena_of(&pool);
    assert!(matches!(ZsPool::open(fd, Arc::new(Budget::new(None))), Err(ArenaError::Busy)));
    // The refusal changed nothing.
    pool.alloc_write(&[7u8; 300]).unwrap();
}

#[test]
fn a_foreign_short_or_damaged_arena_is_refused_and_left_as_it_was() {
    // Not an arena at all.
    let f = tempfile::tempfile().unwrap();
    f.set_len(1 << 20).unwrap();
    f.write_all_at(b"hello, this is not an arena", 0).unwrap();
    assert!(matches!(ZsPool::open(f.into(), Arc::new(Budget::new(None))), Err(ArenaError::Foreign)));
    let short = tempfile::tempfile().unwrap();
    short.set_len(4096).unwrap();
    assert!(matches!(ZsPool::open(short.into(), Arc::new(Budget::new(None))), Err(ArenaError::Foreign)));

    let open = |fd: &OwnedFd| ZsPool::open(fd.try_clone().unwrap(), Arc::new(Budget::new(None)));
    let (pool, live) = filled(3);
    let fd = arena_of(&pool);
    drop(pool);
    // Another version.
    let version = peek(&fd, 8);
    poke(&fd, 8, &(version + 1).to_ne_bytes());
    match open(&fd) {
        Err(e @ ArenaError::Version { found, expected }) => {
            assert_eq!((found, expected), (version + 1, version));
            assert!(e.to_string().contains("version"), "{e}");
        }
        other => panic!("expected a version refusal, got {:?}", other.map(|_| ())),
    }
    poke(&fd, 8, &version.to_ne_bytes());
    // A header field changed under its checksum.
    let pages = peek(&fd, 24);
    poke(&fd, 24, &(pages ^ 1).to_ne_bytes());
    assert!(matches!(open(&fd), Err(ArenaError::Checksum)));
    poke(&fd, 24, &pages.to_ne_bytes());
    // A directory entry changed under its check.
    let entry = peek(&fd, 512 + 8);
    poke(&fd, 512 + 8, &(entry + 1).to_ne_bytes());
    assert!(matches!(open(&fd), Err(ArenaError::Corrupt(m)) if m.contains("entry 0")));
    poke(&fd, 512 + 8, &entry.to_ne_bytes());
    // Two handles naming one slot: in a handle segment, copy a live entry
    // over its neighbour.
    let dir_len = peek(&fd, 48) as usize;
    let seg = (0..dir_len)
        .map(|i| (peek(&fd, 512 + 16 * i as u64), peek(&fd, 512 + 16 * i as u64 + 8)))
        .find(|(w0, _)| w0 >> 56 == 2)
        .map(|(_, w1)| (w1 >> 32) * 4096)
        .unwrap();
    let j = (0..511u64).find(|j| peek(&fd, seg + 8 * j) & (1 << 39) != 0).expect("a live entry");
    let (a, b) = (peek(&fd, seg + 8 * j), peek(&fd, seg + 8 * j + 8));
    poke(&fd, seg + 8 * j + 8, &a.to_ne_bytes());
    assert!(matches!(open(&fd), Err(ArenaError::Corrupt(m)) if m.contains("taken")), "a slot named twice");
    poke(&fd, seg + 8 * j + 8, &b.to_ne_bytes());
    // Every refusal left it whole.
    let (pool, found) = open(&fd).unwrap();
    assert_eq!(found.len(), live.len());
    check(&pool, &live);
}

#[test]
fn the_table_outlives_the_pool_whole_and_is_handed_out_once() {
    let pool = ZsPool::default();
    assert!(matches!(pool.shared_table(100), Err(zmem_alloc::AllocError::InvalidSize { .. })), "whole pages of entries only");
    let t = pool.shared_table(4 * zmem_alloc::TABLE_PAGE_ENTRIES).unwrap();
    assert!(pool.shared_table(4 * zmem_alloc::TABLE_PAGE_ENTRIES).is_err(), "one table a pool");
    assert!(t.written().is_empty(), "a new table holds nothing");
    t.set(3, u128::MAX - 1);
    t.set(600, 7);
    assert_eq!(t.written(), vec![0..256, 512..768]);
    t.clear(512..768);
    // (Asked first: reading a hole through the mapping fills it.)
    assert_eq!(t.written(), vec![0..256], "a cleared page is given back");
    assert_eq!(t.get(600), 0);
    let fd = arena_of(&pool);
    drop((t, pool));
    let (pool, _) = ZsPool::open(fd, Arc::new(Budget::new(None))).unwrap();
    assert!(pool.shared_table(8 * zmem_alloc::TABLE_PAGE_ENTRIES).is_err(), "found with another size");
    let t = pool.shared_table(4 * zmem_alloc::TABLE_PAGE_ENTRIES).unwrap();
    assert_eq!((t.get(3), t.get(600), t.len()), (u128::MAX - 1, 0, 1024));
}
