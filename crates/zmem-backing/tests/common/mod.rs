#![allow(dead_code)]
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Deterministic payload: `kind` 0 = random bytes (incompressible-looking),
/// 1 = a short repeating pattern, 2 = mostly zeros with a few bytes.
pub fn payload(len: usize, seed: u64, kind: u8) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    match kind % 3 {
        0 => (0..len).map(|_| rng.gen()).collect(),
        1 => {
            let pat: [u8; 7] = rng.gen();
            (0..len).map(|i| pat[i % 7]).collect()
        }
        _ => {
            let mut v = vec![0u8; len];
            for _ in 0..4 {
                let i = rng.gen_range(0..len);
                v[i] = rng.gen();
            }
            v
        }
    }
}

use zmem_backing::{BackingError, BackingStore, RecordId};

/// What the engine does with the records compaction copied
/// ([`BackingStore::take_moves`]): an id `kept` holds is replaced by its
/// copy's and the old record freed; the copy of a record no longer kept
/// is freed. Returns the moves taken.
pub fn take_moves<T>(s: &BackingStore, kept: &mut [T], id: impl Fn(&mut T) -> &mut RecordId) -> usize {
    let moves = s.take_moves();
    for m in &moves {
        let free = match kept.iter_mut().map(&id).find(|i| **i == m.from) {
            Some(i) => {
                *i = m.to;
                m.from
            }
            None => m.to,
        };
        s.free(free).expect("a copied record and its copy stay live until one is freed");
    }
    moves.len()
}

/// [`BackingStore::write_batch`] as the engine does it: a store full until
/// the moves of its compaction are taken is tried once more. (The moves
/// of a write that succeeds are the caller's to take once it keeps the
/// ids.)
pub fn write<T>(s: &BackingStore, batch: &[(u64, &[u8])], kept: &mut [T], id: impl Fn(&mut T) -> &mut RecordId) -> Result<Vec<RecordId>, BackingError> {
    match s.write_batch(batch) {
        Err(_) if take_moves(s, kept, id) > 0 => s.write_batch(batch),
        r => r,
    }
}

/// Compact until compaction copies nothing more, taking its moves.
pub fn compact_fully<T>(s: &BackingStore, kept: &mut [T], id: impl Fn(&mut T) -> &mut RecordId) -> u64 {
    let mut freed = 0;
    for _ in 0..32 {
        freed += s.compact().expect("compaction");
        if take_moves(s, kept, &id) == 0 {
            return freed;
        }
    }
    panic!("compaction kept copying: {:?}", s.stats());
}
