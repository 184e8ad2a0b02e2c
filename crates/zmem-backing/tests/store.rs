//! Churn, fault injection, real files, concurrency and a measurement.
mod common;

use std::collections::HashMap;
use std::sync::Arc;

use rand::{rngs::StdRng, Rng, SeedableRng};
use zmem_backing::{
    BackingError, BackingStore, BlockFile, Existing, FaultyFile, MemFile, OsFile, RecordId, MAX_PAYLOAD, RECORD_ALIGN, RECORD_HEADER_SIZE, SEGMENT_SIZE,
};

const SEG: u64 = SEGMENT_SIZE as u64;

fn faulty(direct: bool) -> (BackingStore, Arc<FaultyFile<MemFile>>) {
    let f = Arc::new(FaultyFile::new(MemFile::new(direct)));
    (BackingStore::new(Box::new(f.clone()), None), f)
}

fn write_one(s: &BackingStore, key: u64, p: &[u8]) -> RecordId {
    s.write_batch(&[(key, p)]).unwrap()[0]
}

fn read(s: &BackingStore, id: RecordId, key: u64) -> Result<Vec<u8>, BackingError> {
    let mut out = Vec::new();
    s.read(id, key, &mut out).map(|_| out)
}

#[test]
fn store_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<BackingStore>();
    check::<FaultyFile<MemFile>>();
}

#[test]
fn batch_is_one_write_and_packed() {
    for direct in [false, true] {
        let (s, f) = faulty(direct);
        let pages: Vec<Vec<u8>> = (0..64).map(|i| common::payload(1000 + i * 7, i as u64, 0)).collect();
        let batch: Vec<(u64, &[u8])> = pages.iter().enumerate().map(|(i, p)| (i as u64, p.as_slice())).collect();
        let ids = s.write_batch(&batch).unwrap();
        assert_eq!(f.writes(), 1, "a batch must be one write");
        let data: u64 = pages.iter().map(|p| (p.len() + RECORD_HEADER_SIZE) as u64).sum();
        let st = s.stats();
        assert_eq!(st.bytes_written, data.div_ceil(4096) * 4096, "records packed, padded once");
        assert_eq!(st.records, 64);
        assert_eq!(st.records_written, 64);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(read(&s, *id, i as u64).unwrap(), pages[i]);
        }
        assert_eq!(s.stats().records_read, 64);
        // A batch of 64 incompressible pages fits a segment in one write.
        let full: Vec<Vec<u8>> = (0..64).map(|i| common::payload(4096, 100 + i, 0)).collect();
        let batch: Vec<(u64, &[u8])> = full.iter().map(|p| (7, p.as_slice())).collect();
        let before = f.writes();
        s.write_batch(&batch).unwrap();
        assert!(f.writes() - before <= 2);
    }
}

#[test]
fn too_large_and_empty_batches() {
    let (s, f) = faulty(false);
    let big = vec![1u8; MAX_PAYLOAD + 1];
    let ok = vec![1u8; 10];
    let r = s.write_batch(&[(1, &ok), (2, &big)]);
    assert!(matches!(r, Err(BackingError::TooLarge { len }) if len == MAX_PAYLOAD + 1), "{r:?}");
    assert_eq!(s.write_batch(&[]).unwrap(), vec![]);
    assert_eq!(f.writes(), 0);
    assert_eq!(s.stats().records, 0);
}

#[test]
fn churn_keeps_file_bounded() {
    for direct in [false, true] {
        let s = BackingStore::new(Box::new(MemFile::new(direct)), None);
        let mut rng = StdRng::seed_from_u64(42 + direct as u64);
        let mut live: Vec<(RecordId, u64, u64, usize)> = Vec::new(); // id, key, seed, len
        let max_live = 1500;
        let mut peak_file = 0;
        for cycle in 0..20_000u64 {
            // Write a small batch, then free random records beyond the bound.
            let n = rng.gen_range(1..=8);
            let recs: Vec<(u64, u64, usize)> = (0..n).map(|i| (cycle * 16 + i, rng.gen(), rng.gen_range(1..=4096))).collect();
            let data: Vec<Vec<u8>> = recs.iter().map(|&(_, seed, len)| common::payload(len, seed, 0)).collect();
            let batch: Vec<(u64, &[u8])> = recs.iter().zip(&data).map(|(r, d)| (r.0, d.as_slice())).collect();
            let ids = common::write(&s, &batch, &mut live, |r| &mut r.0).unwrap();
            for (id, r) in ids.into_iter().zip(recs) {
                live.push((id, r.0, r.1, r.2));
            }
            common::take_moves(&s, &mut live, |r| &mut r.0);
            while live.len() > max_live || (rng.gen_bool(0.3) && !live.is_empty()) {
                let i = rng.gen_range(0..live.len());
                s.free(live.swap_remove(i).0).unwrap();
            }
            peak_file = peak_file.max(s.stats().file_bytes);
        }
        let st = s.stats();
        println!("churn (direct={direct}): {st:?}, peak file {peak_file}");
        assert_eq!(st.records, live.len() as u64);
        assert!(st.file_bytes <= 2 * st.live_bytes + 4 * SEG, "file too long: {st:?}");
        assert!(st.segments_compacted > 0);
        let mut out = Vec::new();
        for &(id, key, seed, len) in &live {
            s.read(id, key, &mut out).unwrap();
            assert_eq!(out, common::payload(len, seed, 0));
        }
    }
}

#[test]
fn failed_write_records_nothing() {
    for direct in [false, true] {
        let (s, f) = faulty(direct);
        let a = common::payload(3000, 1, 0);
        let ida = write_one(&s, 1, &a);
        let before = s.stats();
        f.fail_nth_write(1);
        let b = common::payload(2000, 2, 0);
        let r = s.write_batch(&[(2, &b), (3, &b)]);
        match &r {
            Err(e @ BackingError::Io { op: "write", .. }) => println!("write error reads: {e}"),
            other => panic!("expected Io write error, got {other:?}"),
        }
        let after = s.stats();
        assert_eq!(f.inner().len(), after.file_bytes, "file cut back to its committed end");
        assert_eq!(after.records, before.records);
        assert_eq!(after.live_bytes, before.live_bytes);
        assert_eq!(after.records_written, before.records_written);
        // Later writes work, earlier records are intact.
        let idb = write_one(&s, 2, &b);
        assert_eq!(read(&s, ida, 1).unwrap(), a);
        assert_eq!(read(&s, idb, 2).unwrap(), b);
        assert_eq!(s.stats().records, 2);
    }
}

#[test]
fn failure_in_second_segment_of_a_split_batch_records_nothing() {
    let (s, f) = faulty(false);
    // Fill most of the first segment.
    let filler: Vec<Vec<u8>> = (0..240).map(|i| common::payload(4096, i, 0)).collect();
    let batch: Vec<(u64, &[u8])> = filler.iter().map(|p| (9, p.as_slice())).collect();
    let ids = s.write_batch(&batch).unwrap();
    let before = s.stats();
    // This batch spills into a new segment: two writes; fail the second.
    let more: Vec<Vec<u8>> = (0..40).map(|i| common::payload(4096, 1000 + i, 0)).collect();
    let batch: Vec<(u64, &[u8])> = more.iter().map(|p| (10, p.as_slice())).collect();
    f.fail_nth_write(2);
    assert!(s.write_batch(&batch).is_err());
    let after = s.stats();
    assert_eq!((after.records, after.live_bytes), (before.records, before.live_bytes));
    assert_eq!(f.inner().len(), after.file_bytes, "partial segment cut off");
    let ids2 = s.write_batch(&batch).unwrap();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(read(&s, *id, 9).unwrap(), filler[i]);
    }
    for (i, id) in ids2.iter().enumerate() {
        assert_eq!(read(&s, *id, 10).unwrap(), more[i]);
    }
}

#[test]
fn short_write_is_reported() {
    let (s, f) = faulty(false);
    let a = common::payload(100, 1, 0);
    let ida = write_one(&s, 1, &a);
    // The disk is "full" 100 bytes into the next batch's block.
    f.set_space_limit(Some(4096 + 100));
    let b = common::payload(3000, 2, 0);
    let r = s.write_batch(&[(2, &b)]);
    match r {
        Err(e @ BackingError::ShortWrite { expected: 4096, written: 100 }) => println!("{e}"),
        other => panic!("expected ShortWrite, got {other:?}"),
    }
    assert_eq!(s.stats().records, 1);
    assert_eq!(f.inner().len(), s.stats().file_bytes);
    f.set_space_limit(None);
    let idb = write_one(&s, 2, &b);
    assert_eq!(read(&s, ida, 1).unwrap(), a);
    assert_eq!(read(&s, idb, 2).unwrap(), b);
}

#[test]
fn read_error_is_io() {
    let (s, f) = faulty(true);
    let a = common::payload(500, 1, 1);
    let id = write_one(&s, 1, &a);
    f.fail_reads(true);
    let mut out = vec![1, 2, 3];
    let r = s.read(id, 1, &mut out);
    assert!(matches!(r, Err(BackingError::Io { op: "read", .. })), "{r:?}");
    assert!(out.is_empty());
    f.fail_reads(false);
    assert_eq!(read(&s, id, 1).unwrap(), a);
}

#[test]
fn every_bit_flip_is_a_checksum_error() {
    for direct in [false, true] {
        let (s, f) = faulty(direct);
        let a = common::payload(200, 1, 0);
        let id = write_one(&s, 77, &a);
        // A fresh store puts the first record at file offset 0.
        for byte in 0..(RECORD_HEADER_SIZE + a.len()) as u64 {
            for bit in 0..8 {
                f.flip_bit(Some((byte, bit)));
                let mut out = Vec::new();
                let r = s.read(id, 77, &mut out);
                assert!(matches!(r, Err(BackingError::Checksum { .. })), "byte {byte} bit {bit}: {r:?}");
                assert!(out.is_empty(), "corrupt bytes returned");
            }
        }
        // Bits outside the record do not matter.
        f.flip_bit(Some(((RECORD_HEADER_SIZE + a.len()) as u64, 0)));
        assert_eq!(read(&s, id, 77).unwrap(), a);
        f.flip_bit(None);
        assert!(matches!(read(&s, id, 78), Err(BackingError::Checksum { .. })), "wrong key");
    }
}

#[test]
fn stale_and_bogus_ids_are_invalid() {
    let (s, _f) = faulty(false);
    let a = common::payload(100, 1, 0);
    let id = write_one(&s, 1, &a);
    s.free(id).unwrap();
    assert!(matches!(read(&s, id, 1), Err(BackingError::InvalidRecord { .. })));
    assert!(matches!(s.free(id), Err(BackingError::InvalidRecord { .. })));
    // The next record has a place of its own; the old id stays dead.
    let id2 = write_one(&s, 2, &a);
    assert_ne!(id, id2);
    assert!(matches!(read(&s, id, 1), Err(BackingError::InvalidRecord { .. })));
    assert_eq!(read(&s, id2, 2).unwrap(), a);
    // Bogus ids: no record there, another generation, a length past the
    // segment's end.
    for raw in [0, 12345, u64::MAX, id2.to_raw() + (1 << 16), id2.to_raw() ^ 1 << 56, id2.to_raw() | 0xffff] {
        let r = read(&s, RecordId::from_raw(raw), 2);
        assert!(matches!(r, Err(BackingError::InvalidRecord { .. })), "{raw:#x}: {r:?}");
        assert!(matches!(s.free(RecordId::from_raw(raw)), Err(BackingError::InvalidRecord { .. })), "{raw:#x}");
    }
    // A length that fits but is not the record's fails its check, never data.
    let r = read(&s, RecordId::from_raw(id2.to_raw() + 1), 2);
    assert!(matches!(r, Err(BackingError::Checksum { .. })), "{r:?}");
    assert_eq!(RecordId::from_raw(id2.to_raw()), id2);
}

/// Compaction copies the live records of sparse segments: each copy is a
/// move for the owner to take, after which the old ids are dead, the
/// copies read the same, and the file is short.
#[test]
fn compaction_moves_records_and_the_file_shrinks() {
    let (s, _f) = faulty(true);
    let mut recs = Vec::new();
    for i in 0..2000u64 {
        let p = common::payload(1500 + (i as usize % 700), i, (i % 3) as u8);
        recs.push((write_one(&s, i, &p), i, p));
        // (Records written one a batch take a block each: the writes
        // compact too.)
        common::take_moves(&s, &mut recs, |r| &mut r.0);
    }
    let grown = s.stats().file_bytes;
    // Free 3 in 4: every segment becomes sparse.
    let mut kept = Vec::new();
    for (n, r) in recs.into_iter().enumerate() {
        if n % 4 == 0 {
            kept.push(r);
        } else {
            s.free(r.0).unwrap();
        }
    }
    let old: Vec<RecordId> = kept.iter().map(|r| r.0).collect();
    // Copied, not yet taken: both the old ids and the copies read.
    assert!(s.compact().unwrap() > 0);
    let moves = s.take_moves();
    assert!(!moves.is_empty() && moves.len() <= kept.len());
    for m in &moves {
        let (_, key, p) = kept.iter().find(|r| r.0 == m.from).expect("a move names a kept record");
        assert_eq!(m.key, *key);
        assert_eq!(&read(&s, m.from, *key).unwrap(), p);
        assert_eq!(&read(&s, m.to, *key).unwrap(), p);
    }
    for m in &moves {
        kept.iter_mut().find(|r| r.0 == m.from).unwrap().0 = m.to;
        s.free(m.from).unwrap();
    }
    let freed = common::compact_fully(&s, &mut kept, |r| &mut r.0);
    let st = s.stats();
    println!("compacted {freed} more segments: {grown} -> {st:?}");
    assert!(st.file_bytes < grown);
    assert!(st.file_bytes <= 2 * st.live_bytes + 2 * SEG, "{st:?}");
    assert_eq!(st.records, kept.len() as u64);
    for (id, key, p) in &kept {
        assert_eq!(&read(&s, *id, *key).unwrap(), p);
    }
    let moved: Vec<&RecordId> = old.iter().filter(|id| !kept.iter().any(|r| r.0 == **id)).collect();
    assert!(!moved.is_empty());
    for id in moved {
        assert!(matches!(read(&s, *id, 0), Err(BackingError::InvalidRecord { .. })), "an old id is dead once its move is taken");
    }
}

#[test]
fn limit_is_enforced_after_compaction() {
    let s = BackingStore::new(Box::new(MemFile::new(false)), Some(4 * SEG));
    let p = common::payload(4000, 1, 0);
    let mut ids = Vec::new();
    let err = loop {
        match s.write_batch(&[(1, &p), (1, &p), (1, &p), (1, &p)]) {
            Ok(v) => ids.extend(v),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, BackingError::Full { limit_bytes } if limit_bytes == 4 * SEG), "{err:?}");
    println!("{err}");
    assert!(s.stats().file_bytes <= 4 * SEG);
    // Freeing space makes writes succeed again (compaction reclaims it,
    // once its moves are taken).
    let mut kept = Vec::new();
    for (i, id) in ids.drain(..).enumerate() {
        if i % 2 == 0 {
            s.free(id).unwrap();
        } else {
            kept.push(id);
        }
    }
    for _ in 0..50 {
        let v = common::write(&s, &[(1, &p)], &mut kept, |r| r).unwrap();
        kept.extend(v);
        common::take_moves(&s, &mut kept, |r| r);
    }
    for id in kept {
        assert_eq!(read(&s, id, 1).unwrap(), p);
    }
    assert!(s.stats().file_bytes <= 4 * SEG);
}

/// Readers race appends, frees, compaction and the moves it makes, as the
/// engine's loads do: a reader looks its record's id up under a lock (the
/// index's), reads with no lock, and looks again if the id is no longer
/// live (the record was copied and the old one freed meanwhile); a read
/// that succeeds always has the right bytes.
#[test]
fn concurrent_reads_during_writes_frees_and_compaction() {
    type Stable = Vec<(RecordId, u64, Vec<u8>)>;
    let s = Arc::new(BackingStore::new(Box::new(MemFile::new(true)), None));
    let stable: Stable = (0..300u64)
        .map(|i| {
            let p = common::payload(1 + (i as usize * 37) % 4096, i, 0);
            (write_one(&s, i, &p), i, p)
        })
        .collect();
    let stable = Arc::new(std::sync::Mutex::new(stable));
    let writer = {
        let (s, stable) = (s.clone(), stable.clone());
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(5);
            let mut mine: Vec<RecordId> = Vec::new();
            let take = |mine: &mut Vec<RecordId>| {
                let moves = s.take_moves();
                for m in &moves {
                    // The owner of the old id names the copy, then frees the old one.
                    let named = {
                        let mut st = stable.lock().unwrap();
                        match st.iter_mut().map(|r| &mut r.0).chain(mine.iter_mut()).find(|i| **i == m.from) {
                            Some(i) => {
                                *i = m.to;
                                true
                            }
                            None => false,
                        }
                    };
                    s.free(if named { m.from } else { m.to }).unwrap();
                }
            };
            for round in 0..3000u64 {
                let p = common::payload(rng.gen_range(1..4096), round, 0);
                mine.extend(s.write_batch(&[(round, &p), (round, &p)]).unwrap());
                while mine.len() > 200 {
                    let i = rng.gen_range(0..mine.len());
                    s.free(mine.swap_remove(i)).unwrap();
                }
                if round % 500 == 0 {
                    s.compact().unwrap();
                }
                take(&mut mine);
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|t| {
            let (s, stable) = (s.clone(), stable.clone());
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let mut looked_again = 0;
                for n in 0..20_000usize {
                    let i = (n * 7 + t) % 300;
                    loop {
                        let (id, key, p) = stable.lock().unwrap()[i].clone();
                        match s.read(id, key, &mut out) {
                            Ok(()) => {
                                assert_eq!(out, p);
                                break;
                            }
                            Err(BackingError::InvalidRecord { .. }) => looked_again += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                looked_again
            })
        })
        .collect();
    writer.join().unwrap();
    let looked_again: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    let st = s.stats();
    println!("{looked_again} reads looked their id up again; {st:?}");
    assert!(st.segments_compacted > 0, "{st:?}");
    assert_eq!(st.records, 300 + 200, "every copy taken, every old record freed: {st:?}");
    for (id, key, p) in stable.lock().unwrap().iter() {
        assert_eq!(&read(&s, *id, *key).unwrap(), p);
    }
}

#[test]
fn real_file_in_tmp() {
    let mut model = HashMap::new();
    for dir in ["/var/tmp", "/tmp"] {
        let Ok(td) = tempfile::tempdir_in(dir) else {
            continue;
        };
        let path = td.path().join("backing");
        let (s, why) = BackingStore::open(&path, None, Existing::Refuse).unwrap();
        match &why {
            None => println!("{dir}: O_DIRECT in use"),
            Some(w) => println!("{dir}: buffered I/O: {w}"),
        }
        assert_eq!(s.direct(), why.is_none());
        model.clear();
        for i in 0..500u64 {
            let p = common::payload(1 + (i as usize * 131) % 4096, i, (i % 3) as u8);
            model.insert(write_one(&s, i, &p), (i, p));
        }
        for (id, (key, p)) in &model {
            assert_eq!(&read(&s, *id, *key).unwrap(), p);
        }
        let st = s.stats();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), st.file_bytes);
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
        // Reopening our own store (a restart) is allowed, and truncates.
        drop(s);
        let (f, _) = OsFile::open(&path, Existing::Refuse).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert!(f.sync().is_ok());
    }
}

/// Reads of a real file (`O_DIRECT` where its filesystem takes it, on
/// 512-byte sectors on ext4) at every read-ahead floor, through scattered
/// reads that shrink the read-ahead from its 64 KiB start by quarters and
/// runs that grow it: every bound of every read is one the file takes (a
/// read-ahead quartered to 1 KiB or 256 bytes made an `O_DIRECT` read of
/// a length that is no multiple of a sector: EINVAL, a page lost), and
/// every record reads back as written.
#[test]
fn real_file_reads_at_every_read_ahead() {
    for dir in ["/var/tmp", "/tmp"] {
        let Ok(td) = tempfile::tempdir_in(dir) else {
            continue;
        };
        for floor in [0usize, 1000, 8 << 10] {
            let path = td.path().join(format!("backing-{floor}"));
            let (s, _) = BackingStore::open(&path, None, Existing::Refuse).unwrap();
            s.set_min_read_ahead(floor).unwrap();
            let mut model = Vec::new();
            for b in 0..40u64 {
                let pages: Vec<(u64, Vec<u8>)> = (0..64).map(|i| b * 64 + i).map(|k| (k, common::payload(300 + (k as usize * 37) % 3000, k, 0))).collect();
                let batch: Vec<(u64, &[u8])> = pages.iter().map(|(k, p)| (*k, p.as_slice())).collect();
                let ids = s.write_batch(&batch).unwrap();
                model.extend(ids.into_iter().zip(pages));
            }
            let n = model.len();
            let scattered = (0..n).map(|j| (j * 997) % n);
            for i in scattered.chain(0..n) {
                let (id, (key, p)) = &model[i];
                let got = read(&s, *id, *key).unwrap_or_else(|e| panic!("{dir}, floor {floor}: record {i}: {e}"));
                assert_eq!(&got, p, "{dir}, floor {floor}: record {i}");
            }
        }
    }
}

#[test]
fn io_errors_name_the_file() {
    let r = BackingStore::open(std::path::Path::new("/nonexistent-zmem-dir/backing"), None, Existing::Refuse);
    let e = r.unwrap_err();
    let msg = e.to_string();
    println!("{msg}");
    assert!(msg.contains("/nonexistent-zmem-dir/backing"), "{msg}");
}

/// What goes to disk for 4 KiB pages that compressed to about 2 KiB: each
/// record's payload and 16-byte header, plus at most one 4 KiB pad per
/// batch, against zram/zswap's 4096 bytes per page; and the table costs
/// about 2 bytes of RAM per record.
#[test]
fn bytes_written_per_record_are_payload_header_and_one_pad_per_batch() {
    let s = BackingStore::new(Box::new(MemFile::new(true)), None);
    let mut rng = StdRng::seed_from_u64(9);
    let (n_batches, per_batch) = (500u64, 32u64);
    let mut live = 0u64;
    for b in 0..n_batches {
        let data: Vec<Vec<u8>> = (0..per_batch).map(|i| common::payload(rng.gen_range(1800..=2300), b * 64 + i, 0)).collect();
        live += data.iter().map(|p| (RECORD_HEADER_SIZE + p.len()).next_multiple_of(RECORD_ALIGN) as u64).sum::<u64>();
        let batch: Vec<(u64, &[u8])> = data.iter().map(|p| (b, p.as_slice())).collect();
        s.write_batch(&batch).unwrap();
    }
    let st = s.stats();
    let records = n_batches * per_batch;
    println!(
        "{} B written per record ({:.1}% of a 4096-byte page), {:.1} B of table per record",
        st.bytes_written / records,
        100.0 * st.bytes_written as f64 / (records as f64 * 4096.0),
        (st.metadata_bytes - zmem_backing::BUFFER_BYTES) as f64 / records as f64,
    );
    assert_eq!((st.records_written, st.records, st.live_bytes), (records, records, live));
    // Batches crossing a segment end are split in two writes: two pads.
    assert!(st.bytes_written >= live && st.bytes_written <= live + 2 * n_batches * 4096, "{st:?}");
    assert!(st.bytes_written < records * 4096 * 6 / 10, "compressed writeback: {st:?}");
    // metadata_bytes also holds the two 1 MiB append buffers and the read
    // windows'.
    // A record costs its 2-byte offset in its segment's live list and its
    // share of the segment's entry (the table grows by an eighth).
    let table = st.metadata_bytes - zmem_backing::BUFFER_BYTES;
    assert!(table <= records * 3, "{:.1} B of table per record", table as f64 / records as f64);
}

/// Records read back in the order they were written cost one file read per
/// 64 KiB window, not one per record.
#[test]
fn sequential_reads_are_served_by_readahead() {
    for direct in [false, true] {
        let (s, f) = faulty(direct);
        let payloads: Vec<Vec<u8>> = (0..64).map(|i| common::payload(2000, i, 0)).collect();
        let recs: Vec<(u64, &[u8])> = payloads.iter().enumerate().map(|(i, p)| (i as u64, &p[..])).collect();
        let ids = s.write_batch(&recs).unwrap();
        let before = f.reads();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(read(&s, *id, i as u64).unwrap(), payloads[i]);
        }
        let reads = f.reads() - before;
        assert!(reads <= 4, "{reads} file reads for 64 records of ~2 KiB (direct {direct})");
        assert_eq!(s.stats().records_read, 64);
    }
}

/// Reads interleaved with appends, frees and compaction read back right
/// (windows are bounded by the file's end and dropped on any write; the
/// epoch rule itself is unit-tested in store.rs).
#[test]
fn readahead_window_is_not_trusted_after_a_write() {
    for direct in [false, true] {
        let (s, _f) = faulty(direct);
        let a = common::payload(1000, 1, 0);
        let id_a = write_one(&s, 1, &a);
        // Fills a window that covers the (still empty) space after `a`.
        assert_eq!(read(&s, id_a, 1).unwrap(), a);
        let b = common::payload(1000, 2, 0);
        let id_b = write_one(&s, 2, &b);
        assert_eq!(read(&s, id_b, 2).unwrap(), b);
        // And after the file shrinks and regrows through compaction.
        s.free(id_a).unwrap();
        s.compact().unwrap();
        let c = common::payload(3000, 3, 0);
        let id_c = write_one(&s, 3, &c);
        assert_eq!(read(&s, id_b, 2).unwrap(), b);
        assert_eq!(read(&s, id_c, 3).unwrap(), c);
    }
}

/// Start reading `id` on another thread, and return once that read is
/// held at the disk (reads stay held until `hold_reads(false)`).
fn read_stuck(s: &Arc<BackingStore>, f: &FaultyFile<MemFile>, id: RecordId, key: u64) -> std::thread::JoinHandle<Result<Vec<u8>, BackingError>> {
    f.hold_reads(true);
    let s = Arc::clone(s);
    let reader = std::thread::spawn(move || read(&s, id, key));
    assert!(f.wait_held(1, std::time::Duration::from_secs(10)), "the read reached the disk");
    reader
}

/// A read waiting on the disk holds no lock: appends, frees and stats go
/// on meanwhile. Before, the table's read lock was held across `pread`, so
/// the append below waited for the stuck read.
#[test]
fn a_stuck_read_blocks_no_one() {
    let (s, f) = faulty(false);
    let s = Arc::new(s);
    let p = common::payload(3000, 1, 0);
    let id = write_one(&s, 1, &p);
    let reader = read_stuck(&s, &f, id, 1);
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = {
        let s = Arc::clone(&s);
        std::thread::spawn(move || {
            let q = common::payload(2000, 2, 1);
            let id2 = write_one(&s, 2, &q);
            s.free(id2).unwrap();
            let _ = s.stats();
            tx.send(()).unwrap();
        })
    };
    let done = rx.recv_timeout(std::time::Duration::from_secs(10));
    f.hold_reads(false);
    writer.join().unwrap();
    assert!(done.is_ok(), "an append and a free waited for a stuck read");
    assert_eq!(reader.join().unwrap().unwrap(), p);
}

/// A segment freed while a lock-free read is on the disk makes the read
/// start again (its bytes might have been reused), and it still returns
/// the right payload.
#[test]
fn a_read_racing_a_freed_segment_is_retried() {
    let (s, f) = faulty(false);
    let s = Arc::new(s);
    // Fill segment 0 with records that will be freed, then one in segment 1.
    let filler = common::payload(4000, 3, 0);
    let mut doomed = Vec::new();
    while s.stats().file_bytes < SEG {
        doomed.push(write_one(&s, 9, &filler));
    }
    let p = common::payload(1500, 4, 2);
    let id = write_one(&s, 7, &p);
    let reader = read_stuck(&s, &f, id, 7);
    for d in doomed {
        s.free(d).unwrap();
    }
    f.hold_reads(false);
    assert_eq!(reader.join().unwrap().unwrap(), p);
    assert!(s.stats().read_retries >= 1, "{:?}", s.stats());
}

/// A backing file on a full filesystem: once most records are freed,
/// appends find room again at once. Every segment the file grows by comes
/// with a spare reserved on the filesystem (`fallocate`), and when the
/// filesystem refuses to reserve more, compaction moves the live records of
/// sparse segments into the spare and appends reuse what it frees. Before,
/// appends kept failing with a short write until something else compacted.
#[test]
fn a_full_disk_is_usable_again_once_records_are_freed() {
    let (s, f) = faulty(true);
    f.set_space_limit(Some(4 * SEG));
    let page = common::payload(3000, 1, 0);
    let mut ids = Vec::new();
    let err = loop {
        match s.write_batch(&[(1, &page[..]); 8]) {
            Ok(v) => ids.extend(v),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, BackingError::NoSpace { .. }), "{err}");
    assert!(err.to_string().contains("filesystem is full"), "{err}");
    assert!(ids.len() > 900, "{}", ids.len());
    let mut kept: Vec<(RecordId, u64)> = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        if i % 10 != 0 {
            s.free(*id).unwrap();
        } else {
            kept.push((*id, 1));
        }
    }
    for _ in 0..100 {
        let v = common::write(&s, &[(2, &page[..]); 8], &mut kept, |r| &mut r.0).unwrap_or_else(|e| panic!("after freeing 90%: {e} {:?}", s.stats()));
        kept.extend(v.into_iter().map(|id| (id, 2)));
        common::take_moves(&s, &mut kept, |r| &mut r.0);
    }
    for &(id, key) in &kept {
        assert_eq!(read(&s, id, key).unwrap(), page);
    }
    assert!(s.stats().file_bytes <= 4 * SEG, "{:?}", s.stats());
}

/// Compaction after a write moves only what it must: with twenty segments
/// each 40 % live, it frees segments until those in use are back under
/// twice the live bytes, not all twenty (each record moved is read and
/// written again, and under a swap storm most records die by themselves
/// soon). An explicit compact() still compacts everything sparse.
#[test]
fn compaction_after_a_write_moves_only_what_it_must() {
    let (s, _f) = faulty(true);
    let len = 2000;
    let per_seg = SEGMENT_SIZE / (RECORD_HEADER_SIZE + len);
    let mut recs = Vec::new();
    let mut key = 0u64;
    while s.stats().file_bytes < 20 * SEG {
        let data: Vec<Vec<u8>> = (0..16).map(|i| common::payload(len, key + i, 0)).collect();
        let batch: Vec<(u64, &[u8])> = data.iter().enumerate().map(|(i, d)| (key + i as u64, d.as_slice())).collect();
        for (id, (k, _)) in s.write_batch(&batch).unwrap().into_iter().zip(&batch) {
            recs.push((id, *k));
        }
        key += 16;
    }
    // Keep 2 of every 5 records: every segment 40 % live.
    let mut kept = Vec::new();
    for (n, r) in recs.into_iter().enumerate() {
        if n % 5 < 2 {
            kept.push(r);
        } else {
            s.free(r.0).unwrap();
        }
    }
    let before = s.stats();
    let p = common::payload(len, 1 << 40, 0);
    kept.push((write_one(&s, 1 << 40, &p), 1 << 40));
    common::take_moves(&s, &mut kept, |r| &mut r.0);
    let after = s.stats();
    let moved = after.segments_compacted - before.segments_compacted;
    println!("{per_seg} records per segment; before {before:?}; after {after:?}; {moved} segments compacted");
    assert!(moved > 0, "the file was over its target: {after:?}");
    assert!(moved <= 10, "compacted {moved} of ~20 sparse segments: {after:?}");
    assert!(after.file_bytes <= 4 * after.live_bytes + 4 * SEG, "{after:?}");
    common::compact_fully(&s, &mut kept, |r| &mut r.0);
    let done = s.stats();
    assert!(done.file_bytes <= 2 * done.live_bytes + 2 * SEG, "{done:?}");
    for (id, k) in kept {
        let want = if k == 1 << 40 { p.clone() } else { common::payload(len, k, 0) };
        assert_eq!(read(&s, id, k).unwrap(), want);
    }
}
