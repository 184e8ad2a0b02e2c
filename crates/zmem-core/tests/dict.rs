//! Dictionaries the pool trains from its own pages (`PoolConfig::dict`):
//! new objects shrink and read back byte for byte, in RAM and from the
//! backing file; a dictionary lives while an object uses it and is freed
//! after; its memory is counted; a bad dictionary file is refused.

mod common;

use std::sync::Arc;

use common::*;
use zmem_backing::{BackingStore, FaultyFile, MemFile};
use zmem_core::{Compressor, DictConfig, DictSource, Pool, PoolConfig, Recompress, WritebackMode, ZmemError};

fn cfg(source: DictSource) -> PoolConfig {
    PoolConfig {
        shards: 8,
        compressor: Compressor::zstd(3).unwrap(),
        dict: DictConfig { source, samples: 128, sample_every: 1, max_size: 16 << 10, drift_window: 256, background: false, ..DictConfig::default() },
        ..PoolConfig::default()
    }
}

fn pool(source: DictSource, tiered: bool) -> Pool {
    let c = cfg(source);
    if tiered {
        let store = BackingStore::new(Box::new(Arc::new(FaultyFile::new(MemFile::new(true)))), None);
        Pool::with_cold_store(PoolConfig { max_pool: Some(256 << 20), ..c }, Box::new(store)).unwrap()
    } else {
        Pool::new(c).unwrap()
    }
}

fn check(p: &Pool, keys: impl Iterator<Item = (u64, Vec<u8>)>) {
    let mut buf = vec![0u8; PAGE];
    for (k, want) in keys {
        p.load(k, &mut buf).unwrap_or_else(|e| panic!("key {k}: {e}"));
        assert!(buf == want, "key {k} read back wrong");
    }
}

fn family(f: u64, keys: std::ops::Range<u64>) -> impl Iterator<Item = (u64, Vec<u8>)> {
    keys.map(move |k| (k, record_page(f, k)))
}

#[test]
fn a_trained_dictionary_shrinks_new_objects_which_read_back() {
    for tiered in [false, true] {
        let p = pool(DictSource::Auto, tiered);
        for (k, page) in family(0, 0..500) {
            p.store(k, &page).unwrap();
        }
        let before = p.stats();
        assert_eq!((before.dict_id, before.dict_pages), (0, 0), "no dictionary before training");
        let rep = p.train_dictionary().unwrap();
        let id = rep.installed.unwrap_or_else(|| panic!("not installed: {rep:?}"));
        assert!(rep.trained_bytes.unwrap() < rep.plain_bytes, "{rep:?}");
        // The same pages again, under new keys: now with the dictionary.
        for (k, page) in family(0, 0..500) {
            p.store(k + 10_000, &page).unwrap();
        }
        let st = p.stats();
        assert_eq!((st.dict_id, st.dict_count, st.dict_pages), (id, 1, 500), "tiered {tiered}");
        let with = st.compr_data_size - before.compr_data_size;
        assert!(with * 100 < before.compr_data_size * 90, "with the dictionary {with} bytes, without {}", before.compr_data_size);
        assert!(st.dict_bytes > 16 << 10, "the dictionary and its prepared forms are counted: {}", st.dict_bytes);
        assert_eq!(p.mem_charged(), st.mem_used_total, "the budget holds exactly what the stats count");
        check(&p, family(0, 0..500));
        check(&p, family(0, 0..500).map(|(k, v)| (k + 10_000, v)));
        assert!(p.dictionary().is_some_and(|d| d.len() <= 16 << 10));
        if tiered {
            assert!(p.writeback(WritebackMode::All, None).unwrap() >= 1000);
            assert_eq!(p.stats().dict_pages, 500, "written back, still counted");
            check(&p, family(0, 0..500).map(|(k, v)| (k + 10_000, v)));
        }
    }
}

#[test]
fn an_old_dictionary_lives_while_used_and_is_freed_after() {
    for tiered in [false, true] {
        let p = pool(DictSource::Auto, tiered);
        for (k, page) in family(0, 0..600) {
            p.store(k, &page).unwrap();
        }
        let first = p.train_dictionary().unwrap().installed.expect("first dictionary");
        assert!(!p.stats().dict_collecting, "no samples kept after a round");
        for (k, page) in family(0, 600..2300) {
            p.store(k, &page).unwrap();
        }
        p.train_dictionary().unwrap();
        assert!(!p.stats().dict_collecting, "the same data: no drift");
        // The data drifts: stores of the other family come out larger...
        for (k, page) in family(1, 100_000..102_000) {
            p.store(k, &page).unwrap();
        }
        let rep = p.train_dictionary().unwrap();
        assert_eq!(rep.installed, None);
        assert!(p.stats().dict_collecting, "drift seen: collecting");
        // ... so the pool samples them and trains on them.
        for (k, page) in family(1, 100_000..102_000) {
            p.store(k, &page).unwrap();
        }
        let rep = p.train_dictionary().unwrap();
        let second = rep.installed.unwrap_or_else(|| panic!("drift not followed: {rep:?}"));
        assert!(second > first);
        let st = p.stats();
        assert_eq!((st.dict_id, st.dict_count), (second, 2), "tiered {tiered}");
        if tiered {
            p.writeback(WritebackMode::All, None).unwrap();
        }
        check(&p, family(0, 295..2300));
        check(&p, family(1, 100_000..102_000));
        // Two rounds: a dictionary is freed the second time it is found unused.
        p.train_dictionary().unwrap();
        p.train_dictionary().unwrap();
        assert_eq!(p.stats().dict_count, 2, "the first dictionary still has objects");
        // The other family was stored with the first dictionary too:
        // rewritten, it moves to the second.
        for (k, page) in family(1, 100_000..102_000) {
            p.store(k, &page).unwrap();
        }
        p.train_dictionary().unwrap();
        p.train_dictionary().unwrap();
        assert_eq!(p.stats().dict_count, 2, "the first dictionary's own pages are still there");
        assert_eq!(p.invalidate_range(0..2300), 2300);
        p.train_dictionary().unwrap();
        p.train_dictionary().unwrap();
        let after = p.stats();
        assert_eq!((after.dict_count, after.dict_retired, after.dict_id), (1, 1, second), "tiered {tiered}");
        assert!(after.dict_bytes < st.dict_bytes, "{} -> {}", st.dict_bytes, after.dict_bytes);
        assert_eq!(p.mem_charged(), after.mem_used_total);
        check(&p, family(1, 100_000..102_000));
    }
}

#[test]
fn recompression_writes_with_the_dictionary() {
    let c = PoolConfig { compressor: Compressor::default(), recomp_algorithms: vec![Compressor::zstd(9).unwrap()], ..cfg(DictSource::Auto) };
    let p = Pool::new(c).unwrap();
    for (k, page) in family(0, 0..600) {
        p.store(k, &page).unwrap();
    }
    assert!(p.train_dictionary().unwrap().installed.is_some(), "trained for zstd:9, the recompression algorithm");
    assert_eq!(p.stats().dict_pages, 0, "lz4 stores do not use it unless asked");
    let before = p.stats().compr_data_size;
    let rep = p.recompress(&Recompress::default()).unwrap();
    assert_eq!(rep.recompressed, 600);
    let st = p.stats();
    assert_eq!(st.dict_pages, 600);
    assert!(st.compr_data_size * 2 < before, "{before} -> {}", st.compr_data_size);
    check(&p, family(0, 0..600));
}

#[test]
fn lz4_uses_the_dictionary_when_asked() {
    let mut c = cfg(DictSource::Auto);
    c.compressor = Compressor::default();
    c.dict.lz4 = true;
    let p = Pool::new(c).unwrap();
    for (k, page) in family(1, 0..400) {
        p.store(k, &page).unwrap();
    }
    let plain = p.stats().compr_data_size;
    assert!(p.train_dictionary().unwrap().installed.is_some());
    for (k, page) in family(1, 0..400) {
        p.store(k, &page).unwrap();
    }
    let st = p.stats();
    assert_eq!(st.dict_pages, 400);
    assert!(st.compr_data_size < plain, "{plain} -> {}", st.compr_data_size);
    check(&p, family(1, 0..400));
}

#[test]
fn a_given_dictionary_is_used_and_a_bad_one_refused() {
    let trainer = pool(DictSource::Auto, false);
    for (k, page) in family(0, 0..600) {
        trainer.store(k, &page).unwrap();
    }
    trainer.train_dictionary().unwrap().installed.unwrap();
    let bytes = trainer.dictionary().unwrap();
    let p = pool(DictSource::Bytes(bytes.clone()), false);
    assert_eq!(p.stats().dict_id, 1);
    for (k, page) in family(0, 0..100) {
        p.store(k, &page).unwrap();
    }
    assert_eq!(p.stats().dict_pages, 100);
    check(&p, family(0, 0..100));
    let e = p.train_dictionary().unwrap();
    assert_eq!(e.installed, None, "a given dictionary is not replaced");

    for (what, bad) in [("text", b"not a dictionary at all".to_vec()), ("cut", bytes[..24].to_vec()), ("empty", Vec::new())] {
        match Pool::new(cfg(DictSource::Bytes(bad))) {
            Err(ZmemError::Config(msg)) => assert!(msg.contains("dictionary"), "{what}: {msg}"),
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: a bad dictionary was accepted"),
        }
    }
    assert!(matches!(Pool::new(cfg(DictSource::Off)).unwrap().train_dictionary(), Err(ZmemError::Config(_))));
}

#[test]
fn the_trainer_thread_trains_by_itself() {
    let mut c = cfg(DictSource::Auto);
    c.dict.background = true;
    let p = Pool::new(c).unwrap();
    for (k, page) in family(0, 0..400) {
        p.store(k, &page).unwrap();
    }
    let t = std::time::Instant::now();
    while p.stats().dict_id == 0 {
        assert!(t.elapsed().as_secs() < 30, "no dictionary after 30 s");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(p.stats().dict_trainings, 1);
}

/// A pool that keeps a ledger keeps its dictionaries there: opened again,
/// every page reads back, each dictionary is in its slot (the newest
/// current, new ids after it), and retiring one clears it from the ledger.
#[test]
fn dictionaries_are_kept_with_a_pool_opened_again() {
    const KEYS: u64 = 4096;
    let c = || PoolConfig { ledger_keys: Some(KEYS), ..cfg(DictSource::Auto) };
    let reopen = |p: Pool| {
        let fd = p.arena().unwrap().try_clone_to_owned().unwrap();
        drop(p);
        Pool::open(fd, c()).unwrap()
    };
    let p = Pool::new(c()).unwrap();
    for (k, page) in family(0, 0..600) {
        p.store(k, &page).unwrap();
    }
    let first = p.train_dictionary().unwrap().installed.expect("first dictionary");
    for (k, page) in family(0, 600..2300) {
        p.store(k, &page).unwrap();
    }
    p.train_dictionary().unwrap();
    // Drift to the other family, then a second dictionary for it.
    for _ in 0..2 {
        for (k, page) in family(1, 2300..4000) {
            p.store(k, &page).unwrap();
        }
        p.train_dictionary().unwrap();
    }
    // (Rewritten, the other family moves to the second.)
    for (k, page) in family(1, 2300..4000) {
        p.store(k, &page).unwrap();
    }
    let before = p.stats();
    let second = before.dict_id;
    assert!(second > first && before.dict_count == 2, "{before:?}");
    let every = || family(0, 0..2300).chain(family(1, 2300..4000));

    let (p, report) = reopen(p);
    assert_eq!((report.pages, report.lost), (4000, 0), "{report:?}");
    check(&p, every());
    let st = p.stats();
    assert_eq!((st.dict_id, st.dict_count, st.dict_pages, st.dict_bytes), (second, 2, before.dict_pages, before.dict_bytes));
    assert_eq!(p.mem_charged(), st.mem_used_total);
    // New stores use the current one; the next trained is numbered after.
    for (k, page) in family(1, 4000..4096) {
        p.store(k, &page).unwrap();
    }
    assert_eq!(p.stats().dict_pages, before.dict_pages + 96);
    // The first dictionary's pages go: it is retired, and gone from the ledger.
    assert_eq!(p.invalidate_range(600..2300), 1700);
    p.train_dictionary().unwrap();
    p.train_dictionary().unwrap();
    assert_eq!(p.stats().dict_count, 1);
    let (p, report) = reopen(p);
    assert_eq!((report.pages, report.lost), (2396, 0));
    let st = p.stats();
    assert_eq!((st.dict_id, st.dict_count), (second, 1));
    assert_eq!(p.mem_charged(), st.mem_used_total);
    check(&p, family(0, 0..600).chain(family(1, 2300..4096)));
    for (k, page) in family(2, 0..600) {
        p.store(k, &page).unwrap();
    }
    for (k, page) in family(2, 0..600) {
        p.store(k, &page).unwrap();
    }
    if let Some(id) = p.train_dictionary().unwrap().installed {
        assert!(id > second, "a new dictionary's id {id} repeats one in use");
    }
}

/// A dictionary whose bytes changed in the arena is not used: the pages
/// written with it are lost (reads fail, never other bytes), the others
/// are served; a given dictionary (`DictSource::Bytes`) is found again,
/// not installed twice.
#[test]
fn a_damaged_kept_dictionary_loses_its_pages_and_no_others() {
    use std::os::unix::fs::FileExt;
    const KEYS: u64 = 1024;
    let trainer = pool(DictSource::Auto, false);
    for (k, page) in family(0, 0..600) {
        trainer.store(k, &page).unwrap();
    }
    trainer.train_dictionary().unwrap().installed.unwrap();
    let given = DictSource::Bytes(trainer.dictionary().unwrap());
    let c = || PoolConfig { ledger_keys: Some(KEYS), ..cfg(given.clone()) };
    let p = Pool::new(c()).unwrap();
    // Pages 0..200 with the dictionary; 200..300 same-filled, without.
    for (k, page) in family(0, 0..200) {
        p.store(k, &page).unwrap();
    }
    for k in 200..300u64 {
        p.store(k, &same_filled(k)).unwrap();
    }
    let fd = p.arena().unwrap().try_clone_to_owned().unwrap();
    drop(p);
    let (p, report) = Pool::open(fd.try_clone().unwrap(), c()).unwrap();
    assert_eq!((report.pages, report.lost), (300, 0));
    let st = p.stats();
    assert_eq!((st.dict_id, st.dict_count, st.dict_pages), (1, 1, 200), "the given dictionary found again, not installed twice");
    check(&p, family(0, 0..200));
    drop(p);
    // A byte of the dictionary (slot 0, the entry after its header) changed.
    let at = ledger_entry_at(&fd, KEYS + 1) + 5;
    let f = file_of(&fd);
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x20], at).unwrap();
    let (p, report) = Pool::open(fd, c()).unwrap();
    assert_eq!((report.pages, report.lost), (100, 200), "{report:?}");
    let mut buf = vec![0u8; PAGE];
    for k in 0..200 {
        assert!(matches!(p.load(k, &mut buf), Err(ZmemError::Lost { .. })), "key {k} must not read as anything");
    }
    for k in 200..300u64 {
        p.load(k, &mut buf).unwrap();
        assert_eq!(buf, same_filled(k));
    }
    // The given dictionary is installed again, fresh, for new pages.
    let st = p.stats();
    assert_eq!((st.dict_count, st.lost_pages), (1, 200));
    assert!(st.dict_id > 1, "ids are not reused: {}", st.dict_id);
    p.store(0, &record_page(0, 0)).unwrap();
    check(&p, family(0, 0..1));
    assert_eq!(p.mem_charged(), p.stats().mem_used_total);
}
