//! A store made on the file a dead process's store left takes over the
//! records its engine still names (`BackingStore::adopt`): each reads back
//! as written, what no one names is free space again, ids that cannot be
//! live records are refused, and new writes never land on a record taken.

use std::collections::HashMap;
use std::sync::Arc;

use zmem_backing::{BackingError, BackingStore, MemFile, RecordId, SEGMENT_SIZE};

fn payload(key: u64) -> Vec<u8> {
    let len = 200 + (key as usize * 7919) % 12_000;
    (0..len).map(|i| (key as usize * 31 + i / 3) as u8).collect()
}

fn write(s: &BackingStore, keys: std::ops::Range<u64>) -> Vec<(u64, RecordId)> {
    let pages: Vec<(u64, Vec<u8>)> = keys.map(|k| (k, payload(k))).collect();
    let batch: Vec<(u64, &[u8])> = pages.iter().map(|(k, p)| (*k, &p[..])).collect();
    pages.iter().map(|p| p.0).zip(s.write_batch(&batch).unwrap()).collect()
}

fn read(s: &BackingStore, id: RecordId, key: u64) -> Result<Vec<u8>, BackingError> {
    let mut out = Vec::new();
    s.read(id, key, &mut out).map(|_| out)
}

#[test]
fn a_new_store_takes_over_the_records_still_named() {
    for direct in [false, true] {
        let file = Arc::new(MemFile::new(direct));
        let old = BackingStore::new(Box::new(file.clone()), None);
        // What the engine names: every record written, less those freed.
        let mut named: HashMap<u64, RecordId> = HashMap::new();
        for b in 0..6u64 {
            named.extend(write(&old, b * 100..b * 100 + 90));
        }
        for k in (0..600u64).filter(|k| k % 5 == 0) {
            if let Some(id) = named.remove(&k) {
                old.free(id).unwrap();
            }
        }
        // A compaction's copies: half taken (the engine names the copy and
        // frees the old record), half not (the old one is still named and
        // the copy is garbage to the next store).
        old.compact().unwrap();
        for (i, m) in old.take_moves().into_iter().enumerate() {
            if i % 2 == 0 && named.get(&m.key) == Some(&m.from) {
                named.insert(m.key, m.to);
                old.free(m.from).unwrap();
            }
        }
        // A batch written and never named: the process died before it
        // published the entries.
        let unnamed = write(&old, 1000..1040);
        let file_before = file.len();
        assert!(file_before > 2 * SEGMENT_SIZE as u64, "the test spans segments: {file_before}");
        drop(old);

        let new = BackingStore::new(Box::new(file.clone()), None);
        let mut ids: Vec<(u64, RecordId)> = named.iter().map(|(&k, &id)| (k, id)).collect();
        ids.sort_unstable_by_key(|p| p.0);
        let (k0, id0) = ids[0];
        // Ids that cannot be live records: overlapping a named one, of
        // another generation than the rest of their segment, past the
        // file's end, with bits no id has.
        let bogus = [
            RecordId::from_raw(id0.to_raw() + (1 << 12)),
            RecordId::from_raw(id0.to_raw() ^ (0x40 << 56)),
            RecordId::from_raw(id0.to_raw() + (1 << 40)),
            RecordId::from_raw(id0.to_raw() | 1 << 30),
            RecordId::from_raw(0),
        ];
        let mut asked: Vec<RecordId> = ids.iter().map(|p| p.1).collect();
        asked.extend(bogus);
        // The same record named twice (as two keys of one extent would) is one record.
        asked.push(id0);
        let taken = new.adopt(&asked).unwrap();
        assert!(taken[..ids.len()].iter().all(|&t| t), "a named record was not taken");
        assert_eq!(&taken[ids.len()..ids.len() + bogus.len()], &[false; 5], "a bogus id was taken");
        assert!(taken[ids.len() + bogus.len()], "a record named twice");
        assert_eq!(new.stats().records, ids.len() as u64);
        assert!(file.len() <= file_before, "the file grew");
        for &(k, id) in &ids {
            assert_eq!(read(&new, id, k).unwrap(), payload(k), "key {k}");
        }
        for (k, id) in unnamed {
            assert!(matches!(read(&new, id, k), Err(BackingError::InvalidRecord { .. })), "an unnamed record is live");
        }
        assert!(matches!(new.adopt(&[id0]), Err(BackingError::Adopt { .. })), "a store that holds records takes no more");

        // New writes land in free space only; then everything can go.
        let more = write(&new, 2000..2300);
        for &(k, id) in ids.iter().chain(&more) {
            assert_eq!(read(&new, id, k).unwrap(), payload(k), "key {k} after new writes");
        }
        assert_eq!(read(&new, id0, k0).unwrap(), payload(k0));
        for &(_, id) in ids.iter().chain(&more) {
            new.free(id).unwrap();
        }
        new.compact().unwrap();
        assert_eq!(new.stats().records, 0);
        assert!(file.len() <= 2 * SEGMENT_SIZE as u64, "the emptied file keeps {} bytes", file.len());
    }
}

#[test]
fn nothing_named_leaves_an_empty_store() {
    let file = Arc::new(MemFile::new(false));
    let old = BackingStore::new(Box::new(file.clone()), None);
    write(&old, 0..50);
    drop(old);
    let new = BackingStore::new(Box::new(file.clone()), None);
    assert_eq!(new.adopt(&[]).unwrap(), Vec::<bool>::new());
    assert_eq!((new.stats().records, file.len()), (0, 0));
    let ids = write(&new, 0..10);
    assert_eq!(read(&new, ids[3].1, 3).unwrap(), payload(3));
}
