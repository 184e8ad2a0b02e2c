//! Dictionaries the pool trains from its own pages (`PoolConfig::dict`):
//! new objects shrink and read back byte for byte, in RAM and from the
//! backing file; a dictionary lives while an object uses it and is freed
//! after; its memory is counted; a bad dictionary file is refused.

mod common;

use std::sync::Arc;

use common::*;
use zmem_backing::{BackingStore, FaultyFile, MemFile};
use zmem_core::{Compressor, DictConfig, DictSource, Pool, PoolConfig, Recompress, WritebackMode, ZmemError};

/// Pages of words from a vocabulary of 600 (one per `family`) that pages
/// share but rarely repeat within one: what a dictionary holds and a page
/// alone does not.
fn record_page(family: u64, seed: u64) -> Vec<u8> {
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
