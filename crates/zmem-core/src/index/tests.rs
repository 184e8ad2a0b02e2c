//! The tests of `index.rs` (and of `index/cold.rs` through it).

use super::*;

#[test]
fn insert_get_remove_and_free_blocks() {
    {
        let b = Budget::new(None);
        let mut ix = BlockIndex::new();
        assert_eq!(ix.insert(5, Entry::same(1), &b).unwrap(), None);
        assert_eq!(ix.insert(5, Entry::same(2), &b).unwrap(), Some(Entry::same(1)));
        assert_eq!(ix.insert(u64::MAX, Entry::same(3), &b).unwrap(), None);
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.get(5), Some(Entry::same(2)));
        assert_eq!(ix.get(6), None);
        // Two blocks of one key: room for one key each, not sixteen.
        assert_eq!(ix.block_bytes, 2 * kept_bytes(1));
        assert!(ix.heap_bytes() < 2 * kept_bytes(BLOCK), "{}", ix.heap_bytes());
        assert_eq!(b.used(), ix.heap_bytes());
        ix.touch(5, 77);
        assert_eq!(ix.ac_time(5), 77);
        assert_eq!(ix.ac_time(6), 0);
        assert_eq!(ix.iter().map(|(k, _, ac)| (k, ac)).collect::<Vec<_>>().len(), 2);
        assert_eq!(ix.remove(5, &b), Some(Entry::same(2)));
        assert_eq!(ix.remove(5, &b), None);
        assert_eq!(ix.blocks.len(), 1, "the emptied block is freed");
        assert_eq!(b.used(), ix.heap_bytes());
        let mut out = Vec::new();
        for k in 0..100 {
            ix.insert(k, Entry::same(k), &b).unwrap();
        }
        ix.remove_range(&(10..90), &mut out, &b);
        assert_eq!(out.len(), 80);
        assert_eq!(ix.len(), 21);
        assert!(ix.contains(9) && !ix.contains(10) && !ix.contains(89) && ix.contains(90));
        assert_eq!(b.used(), ix.heap_bytes());
        ix.remove_range(&(0..u64::MAX), &mut out, &b);
        assert!(ix.contains(u64::MAX));
        assert_eq!(ix.len(), 1);
        assert_eq!(b.used(), ix.heap_bytes());
    }
}

fn backed(rec: u64) -> Entry {
    Entry::backed(rec, ObjInfo::raw())
}

/// A block whose pages name one record (and zero pages) is kept cold in
/// 16 bytes, reads back the same, comes back to a block when a key is
/// stored, and hands every key out as it was, however it leaves (removed,
/// replaced, in a range), in either form.
#[test]
fn cold_blocks_keep_what_their_keys_name() {
    let b = Budget::new(None);
    let mut ix = BlockIndex::new();
    for k in 16..32 {
        ix.insert(k, if k % 4 == 0 { Entry::same(0) } else { backed(7) }, &b).unwrap();
    }
    let hot = ix.heap_bytes();
    assert!(ix.make_cold(20, &b), "one extent and zero pages");
    assert!(ix.heap_bytes() < hot && ix.block_bytes == 0, "{} of {hot}", ix.heap_bytes());
    assert_eq!(std::mem::size_of::<(u64, ColdBlock)>(), 24, "a cold block's slot in its map");
    assert_eq!(b.used(), ix.heap_bytes());
    assert_eq!((ix.len(), ix.blocks.len(), ix.cold.len()), (16, 0, 1));
    assert_eq!(ix.get(16), Some(Entry::same(0)));
    assert_eq!(ix.get(17).and_then(Entry::record), Some(7));
    assert_eq!(ix.access(17, 5, |_| panic!("no flags on a cold key")).and_then(Entry::record), Some(7));
    assert_eq!(ix.iter().count(), 16);
    let mut ext = Vec::new();
    ix.extents(&mut ext);
    assert_eq!(ext, vec![(7, 16, 0b1110_1110_1110_1110)]);
    // Removed one by one, each as it was.
    for k in 16..32 {
        assert_eq!(ix.remove(k, &b).map(view), Some(if k % 4 == 0 { (0, 0) } else { (1, 7) }), "key {k}");
    }
    assert_eq!((ix.len(), ix.cold.len()), (0, 0));
    // A store into a cold block brings that key alone back, handing out
    // the entry it replaces. (Four keys free less in RAM than a new cold
    // block takes: six do not.)
    for k in 32..36 {
        ix.insert(k, backed(9), &b).unwrap();
    }
    assert!(!ix.make_cold(32, &b), "four keys stay in RAM");
    for k in 36..38 {
        ix.insert(k, backed(9), &b).unwrap();
    }
    assert!(ix.make_cold(32, &b));
    let old = ix.insert(33, Entry::same(5), &b).unwrap().unwrap();
    assert_eq!(old.record(), Some(9));
    assert_eq!((ix.blocks.len(), ix.cold.len(), ix.len()), (1, 1, 6));
    assert_eq!(ix.get(33), Some(Entry::same(5)));
    assert_eq!(ix.get(34).and_then(Entry::record), Some(9));
    assert!(!ix.make_cold(32, &b), "a non-zero same-filled page stays in RAM");
    for (k, w) in [(32, 6), (34, 7), (35, 8), (36, 9), (37, 10)] {
        assert_eq!(ix.insert(k, Entry::same(w), &b).unwrap().unwrap().record(), Some(9));
    }
    // In a range, from either form.
    for k in 48..64 {
        ix.insert(k, backed(if k < 56 { 1 } else { 2 }), &b).unwrap();
    }
    let mut out = Vec::new();
    ix.remove_range(&(50..58), &mut out, &b);
    ix.remove_range(&(0..50), &mut out, &b);
    assert!(ix.make_cold(60, &b));
    ix.remove_range(&(58..100), &mut out, &b);
    let recs = |out: &[Entry], r| out.iter().filter(|e| e.record() == Some(r)).count();
    assert_eq!((recs(&out, 1), recs(&out, 2)), (8, 8));
    assert_eq!(b.used(), ix.heap_bytes());
    // A lone written-back key beside a page in RAM stays where it is
    // (a cold block would cost more than its 16 bytes) until a cold
    // block covers it (one of its sixteen blocks went cold); then it goes
    // cold alone. One written with a dictionary stays.
    let obj = Entry::obj(zmem_alloc::Handle::from_raw(1), ObjInfo::raw());
    ix.insert(64, backed(3), &b).unwrap();
    ix.insert(65, obj, &b).unwrap();
    assert!(!ix.make_cold(64, &b));
    for k in 96..112 {
        ix.insert(k, backed(4), &b).unwrap();
    }
    assert!(ix.make_cold(96, &b));
    assert!(ix.make_cold(64, &b));
    assert_eq!((ix.get(64).and_then(Entry::record), ix.get(65)), (Some(3), Some(obj)));
    assert_eq!((ix.blocks[&4].present, ix.cold[&0].member_places()), (1 << 1, [64].into_iter().chain(96..112).collect()));
    let mut ext = Vec::new();
    ix.extents(&mut ext);
    ext.sort();
    assert_eq!(ext, vec![(3, 64, 1), (4, 96, 0xffff)]);
    let dict = Entry::backed(5, ObjInfo::with_dict(0, zmem_compress::Algorithm::Zstd, 100));
    ix.insert(80, dict, &b).unwrap();
    assert!(!ix.make_cold(80, &b));
    assert_eq!(b.used(), ix.heap_bytes());
}

/// A block of pages written back each in its own record (extents off,
/// the default) goes cold too: each key's record id kept in 4 bytes
/// where their high halves are few (the backing file's segment and
/// generation), a full block in under 10.5 bytes a key with its slot in
/// the map, where a block in RAM takes 18–20. It reads back the same, comes back to a
/// block when a key is stored, reports each record as an extent of one,
/// and every key leaving it names its own record.
#[test]
fn blocks_of_single_page_records_go_cold_too() {
    let b = Budget::new(None);
    let mut ix = BlockIndex::new();
    for k in 0..16 * 512u64 {
        ix.insert(k, if k % 16 == 5 { Entry::same(0) } else { backed(1000 + k) }, &b).unwrap();
    }
    let hot = ix.heap_bytes();
    for id in 0..512u64 {
        assert!(ix.make_cold(id << BLOCK_SHIFT, &b));
    }
    assert_eq!(b.used(), ix.heap_bytes());
    // (The map of blocks in RAM keeps its buckets, as a map does.)
    let per_key = (map_bytes(&ix.cold) + ix.cold_bytes) as f64 / ix.len() as f64;
    // (5.75 bytes a key of records, the rest the map's slots, at most
    // half its buckets empty.)
    assert!(per_key < 10.5 && per_key < hot as f64 / ix.len() as f64 * 0.55, "{per_key:.1} bytes a key, {hot} in RAM");
    assert!(ix.cold.values().all(|c| c.form() == "split"));
    assert_eq!(ix.backed_bytes(15 * 512), ix.heap_bytes() - map_bytes(&ix.blocks), "a cold block is all the written-back pages'");
    for k in 0..16 * 512u64 {
        let want = if k % 16 == 5 { Entry::same(0) } else { Entry::backed(1000 + k, ObjInfo::in_extent()) };
        assert_eq!(ix.get(k), Some(want), "key {k}");
    }
    let mut ext = Vec::new();
    ix.extents(&mut ext);
    assert_eq!(ext.len(), 15 * 512);
    assert!(ext.iter().all(|&(rec, base, live)| live.count_ones() == 1 && base + u64::from(live.trailing_zeros()) + 1000 == rec));
    // Every key that leaves names its own record, however it leaves.
    assert_eq!(ix.remove(3, &b).unwrap().record(), Some(1003));
    assert_eq!(ix.remove(5, &b).unwrap().record(), None, "a zero page names no record");
    let old = ix.insert(4, Entry::same(9), &b).unwrap().unwrap();
    assert_eq!(old.record(), Some(1004));
    assert_eq!(ix.get(6).and_then(Entry::record), Some(1006), "the other keys stay cold");
    assert_eq!((ix.blocks[&0].present, ix.cold[&0].member_places().len()), (1 << 4, 238));
    let mut out = Vec::new();
    ix.remove_range(&(16..40), &mut out, &b);
    assert_eq!(out.len(), 24);
    assert_eq!(out.iter().filter_map(|e| e.record()).collect::<Vec<_>>(), (16..40).filter(|k| k % 16 != 5).map(|k| 1000 + k).collect::<Vec<_>>());
    assert_eq!(ix.get(40).and_then(Entry::record), Some(1040));
    assert_eq!(b.used(), ix.heap_bytes());
    ix.remove_range(&(0..u64::MAX), &mut out, &b);
    assert_eq!((ix.len(), ix.heap_bytes() - map_bytes(&ix.blocks) - map_bytes(&ix.cold)), (0, 0));
    assert_eq!((ix.cold_members, ix.cold_zeros, ix.cold_bytes), (0, 0, 0));
    assert_eq!(b.used(), ix.heap_bytes());
}

/// Record ids in a cold block take their smallest form: one id for an
/// extent, 4 bytes a key and an index into the high halves they share
/// while that is smaller, else 8; each reads back as it went in, and a renamed record (the
/// cold store copied it) changes the form as needed, charged first:
/// a budget that refuses the growth leaves the block as it was.
#[test]
fn cold_record_ids_take_their_smallest_form_and_renames_keep_it_right() {
    // (As the backing file's: a length in bits 0..12, an offset above it.)
    let id = |seg: u64, off: u64| 1 << 56 | seg << 32 | (off * 37) << 12 | 100;
    // Low halves that differ in all 32 bits: with an index, past one
    // word a key.
    let wide = |seg: u64, k: u64| 1 << 56 | seg << 32 | (k * 0x9e37_79b9) & 0xffff_ffff;
    // Ids that differ in every bit: no form smaller than whole.
    let scattered = |k: u64| (k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let cases: [(Vec<u64>, &str); 18] = [
        (vec![id(3, 0); 16], "one"),
        ((0..16).map(|k| id(3, k)).collect(), "split"),
        ((0..16).map(|k| id(k % 4, k)).collect(), "split"),
        ((0..32).map(|k| id(k % 5, k)).collect(), "split"),
        ((0..32).map(|k| id(k % 17, k)).collect(), "split"),
        ((0..32).map(|k| id(k, k)).collect(), "split"),
        ((0..32).map(scattered).collect(), "whole"),
        ((0..32).map(|k| wide(k, k)).collect(), "split"),
        // Low halves alike but for a few bits, high halves too.
        ((0..32).map(|k| 1 << 56 | k << 32 | 0x8000_0000 | k).collect(), "split"),
        // 5 bits and 32: a key's 37 bits straddle three words; 8 and 32.
        ((0..256).map(|k| wide(k % 20, k)).collect(), "split"),
        ((0..256).map(|k| wide(k % 129, k)).collect(), "split"),
        ((0..256).map(|k| id(k % 100, k)).collect(), "split"),
        // 3, 5 and 6 bits: indexes that straddle words.
        ((0..48).map(|k| id(k % 7, k)).collect(), "split"),
        ((0..96).map(|k| id(k * 7 % 31, k)).collect(), "split"),
        ((0..256).map(|k| id(k * 5 % 64, k)).collect(), "split"),
        ((0..64).map(|k| id(k / 50, k)).collect(), "split"),
        ((0..64).map(|k| id(k % 4, k)).collect(), "split"),
        ((0..256).map(|k| id(k % 16, k)).collect(), "split"),
    ];
    for (ids, want) in &cases {
        let b = Budget::new(None);
        let mut ix = BlockIndex::new();
        for (k, &r) in ids.iter().enumerate() {
            ix.insert(k as u64, backed(r), &b).unwrap();
        }
        for block in 0..ids.len() as u64 / 16 {
            assert!(ix.make_cold(block << BLOCK_SHIFT, &b));
        }
        assert_eq!(ix.cold[&0].form(), *want, "{ids:x?}");
        for (k, &r) in ids.iter().enumerate() {
            assert_eq!(ix.get(k as u64).and_then(Entry::record), Some(r), "{want} key {k}");
        }
        assert_eq!(b.used(), ix.heap_bytes());
    }
    // Renames: within the high halves there are, to a seventeenth, and refused.
    let b = Budget::new(None);
    let mut ix = BlockIndex::new();
    for k in 0..32u64 {
        ix.insert(k, backed(id(k % 16, k)), &b).unwrap();
    }
    assert!(ix.make_cold(0, &b) && ix.make_cold(16, &b));
    assert!(ix.rename_record(0, id(5, 5), id(2, 99), &b), "a known high half");
    assert_eq!(ix.cold[&0].form(), "split");
    assert_eq!(ix.get(5).and_then(Entry::record), Some(id(2, 99)));
    assert!(!ix.rename_record(0, id(5, 5), id(2, 100), &b), "no key names it now");
    let tight = Budget::new(Some(b.used()));
    tight.force_charge(b.used());
    assert!(!ix.rename_record(0, id(6, 6), id(99, 6), &tight), "a seventeenth high half needs a 5-bit index");
    assert_eq!(ix.get(6).and_then(Entry::record), Some(id(6, 6)));
    assert_eq!(ix.cold[&0].form(), "split");
    assert!(ix.rename_record(0, id(6, 6), id(99, 6), &b));
    assert_eq!(ix.cold[&0].form(), "split");
    assert_eq!(ix.get(6).and_then(Entry::record), Some(id(99, 6)));
    assert_eq!(b.used(), ix.heap_bytes());
    for k in (0..32u64).filter(|&k| k != 5 && k != 6) {
        assert_eq!(ix.get(k).and_then(Entry::record), Some(id(k % 16, k)), "key {k}");
    }
    // Every key of an extent renamed at once keeps it one id.
    let mut ix = BlockIndex::new();
    for k in 16..32u64 {
        ix.insert(k, backed(id(7, 0)), &b).unwrap();
    }
    assert!(ix.make_cold(16, &b));
    ix.remove(17, &b);
    assert!(ix.rename_record(16, id(7, 0), id(8, 0), &b));
    assert_eq!(ix.cold[&0].form(), "one");
    assert_eq!(ix.get(31).and_then(Entry::record), Some(id(8, 0)));
}

/// `gather` packs the bits of a mask's runs to the low end and
/// `scatter` puts them back, whatever the mask.
#[test]
fn gather_and_scatter_are_pext_and_pdep() {
    assert_eq!(gather(0b1011_0110, 0b1111_0000), 0b1011);
    assert_eq!(gather(0b0011_0010, 0b1010_0110), 0b0101);
    assert_eq!(scatter(0b0101, 0b1010_0110), 0b0010_0010);
    let mut x = 0x1234_5678_9abc_def1u64;
    for _ in 0..10_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (v, m) = (x as u32, (x >> 32) as u32 & (x >> 16) as u32);
        let g = gather(v, m);
        assert!(u64::from(g) < 1u64 << m.count_ones(), "{v:x} {m:x}");
        assert_eq!(scatter(g, m), v & m, "{v:x} {m:x}");
        // Bit by bit, as pext would.
        let want = (0..32).filter(|&b| m >> b & 1 == 1).enumerate().fold(0u32, |w, (i, b)| w | (v >> b & 1) << i);
        assert_eq!(g, want, "{v:x} {m:x}");
    }
    assert_eq!((gather(u32::MAX, u32::MAX), scatter(u32::MAX, u32::MAX)), (u32::MAX, u32::MAX));
    assert_eq!((gather(7, 0), scatter(7, 0)), (0, 0));
}

/// A full cold block whose keys went out over a hundred segments (a
/// long-lived heap's, written back a few at a time) keeps of each
/// high half only the bits that differ (2 bytes, not 4), and of each
/// low half the offset and the span's low bits: about 5 bytes a key
/// with its map slot, where whole high halves and 28-bit low halves
/// took over 6.
#[test]
fn a_block_of_keys_from_many_segments_keeps_the_bits_that_differ() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // As the backing file's: generation, segment, offset and span in
    // 16-byte units (a compressed page: 40 to 257 units).
    let segs: Vec<u64> = (0..100).map(|_| ((1 + next() % 3) << 24) | (next() % 3000)).collect();
    let keys: Vec<(usize, u64)> = (0..COLD).map(|i| (i, segs[next() as usize % 100] << 32 | (next() % 65_536) << 12 | (40 + next() % 218))).collect();
    let c = ColdBlock::new(&keys, &[0; MASK_WORDS]);
    assert_eq!(c.form(), "split");
    assert_eq!(c.keys(), keys);
    let per_key = (c.heap_bytes() + slot_bytes::<ColdBlock>()) as f64 / COLD as f64;
    assert!(per_key < 5.25, "{per_key:.2} bytes a key");
}

/// One step of [`the_index_keeps_what_a_map_would`].
#[derive(Clone, Debug)]
enum Op {
    /// A same-filled page of this word (0: a zero-filled page, which
    /// goes cold with its block).
    Same(u64, u64),
    /// A written-back page naming record `r` (ids of up to 20 high
    /// halves: every form of a cold block's ids).
    Backed(u64, u64),
    Cold(u64),
    /// Make the blocks of `n` keys from `k` on cold at once.
    ColdAll(u64, u64),
    Remove(u64),
    Range(u64, u64),
    /// The cold store copied the record key `k`'s entry names to `r`.
    Rename(u64, u64),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    // Most keys in four blocks, so that blocks fill and go cold.
    let key = prop_oneof![3 => 0..64u64, 1 => 0..1024u64];
    // (Now and then a low half of any bits: masks of every shape.)
    let low = prop_oneof![6 => (0..6u64).prop_map(|l| l << 16 | 100), 1 => any::<u32>().prop_map(u64::from)];
    let rec = (0..20u64, low).prop_map(|(h, l)| 1 << 56 | h << 32 | l);
    prop_oneof![
        2 => (key.clone(), 0..3u64).prop_map(|(k, w)| Op::Same(k, w)),
        6 => (key.clone(), rec.clone()).prop_map(|(k, r)| Op::Backed(k, r)),
        2 => key.clone().prop_map(Op::Cold),
        1 => (key.clone(), 0..300u64).prop_map(|(k, n)| Op::ColdAll(k, n)),
        2 => key.clone().prop_map(Op::Remove),
        1 => (key.clone(), 0..300u64).prop_map(|(k, n)| Op::Range(k, n)),
        1 => (key, rec).prop_map(|(k, r)| Op::Rename(k, r)),
    ]
}

/// What an entry says, whichever map it came from.
fn view(e: Entry) -> (u8, u64) {
    match e.slot() {
        Slot::Same(w) => (0, w),
        Slot::Backed(r, _) => (1, r),
        _ => (2, 0),
    }
}

proptest::proptest! {
    /// The index against a map, whatever the order of stores,
    /// write-backs, blocks going cold, removals and renames: every key
    /// reads back what it was given, a key leaving hands out what it
    /// held, and the budget holds the bytes the index counts.
    #[test]
    fn the_index_keeps_what_a_map_would(ops in proptest::collection::vec(op(), 1..300)) {
        let b = Budget::new(None);
        let mut ix = BlockIndex::new();
        let mut model: std::collections::BTreeMap<u64, (u8, u64)> = Default::default();
        for op in ops {
            match op {
                Op::Same(k, w) | Op::Backed(k, w) => {
                    let e = if matches!(op, Op::Same(..)) { Entry::same(w) } else { backed(w) };
                    let old = ix.insert(k, e, &b).unwrap();
                    let was = model.insert(k, view(e));
                    proptest::prop_assert_eq!(old.map(view), was);
                }
                Op::Cold(k) => {
                    ix.make_cold(k, &b);
                }
                Op::ColdAll(k, n) => {
                    let keys: Vec<u64> = (k..k + n).rev().step_by(5).collect();
                    ix.make_cold_all(&keys, &b);
                }
                Op::Remove(k) => {
                    let old = ix.remove(k, &b);
                    let was = model.remove(&k);
                    proptest::prop_assert_eq!(old.map(view), was);
                }
                Op::Range(k, n) => {
                    let mut out = Vec::new();
                    ix.remove_range(&(k..k + n), &mut out, &b);
                    let gone: Vec<(u64, (u8, u64))> = model.range(k..k + n).map(|(&k, &v)| (k, v)).collect();
                    for (k, _) in &gone {
                        model.remove(k);
                    }
                    let mut want: Vec<(u8, u64)> = gone.iter().map(|&(_, v)| v).collect();
                    let mut got: Vec<(u8, u64)> = out.iter().map(|&e| view(e)).collect();
                    want.sort_unstable();
                    got.sort_unstable();
                    proptest::prop_assert_eq!(got, want);
                }
                Op::Rename(k, to) => {
                    let Some(&(1, from)) = model.get(&k) else { continue };
                    proptest::prop_assert!(ix.rename_record(k, from, to, &b));
                    let first = k & !MASK;
                    for (_, v) in model.range_mut(first..first + BLOCK as u64).filter(|(_, v)| **v == (1, from)) {
                        *v = (1, to);
                    }
                }
            }
            proptest::prop_assert_eq!(b.used(), ix.heap_bytes());
            proptest::prop_assert_eq!(ix.len(), model.len());
            proptest::prop_assert_eq!(ix.cold_members + ix.cold_zeros, ix.cold.values().map(|c| c.entries().count() as u64).sum::<u64>());
        }
        for k in 0..1024 {
            proptest::prop_assert_eq!(ix.get(k).map(view), model.get(&k).copied(), "key {}", k);
        }
        let mut all: Vec<(u64, (u8, u64))> = ix.iter().map(|(k, e, _)| (k, view(e))).collect();
        all.sort_unstable();
        proptest::prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    }
}

/// A key taken out of a cold block (a load of a written-back page)
/// leaves a bit in its gone mask, which the block gets the first time
/// (its 32 bytes charged) and the ids stay as they are; past one in
/// eight of its ids gone, the block is rebuilt with just its keys. A
/// budget that cannot pay for the mask has the block rebuilt at once.
#[test]
fn keys_taken_out_of_a_cold_block_are_marked_gone_until_one_in_eight() {
    let b = Budget::new(None);
    let mut ix = BlockIndex::new();
    // Records from three segments, a page each, every key of a cold block.
    let rec = |k: u64| 1 << 56 | (k % 3) << 32 | k << 12 | 100;
    for k in 0..COLD as u64 {
        ix.insert(k, backed(rec(k)), &b).unwrap();
    }
    let keys: Vec<u64> = (0..COLD as u64).collect();
    assert_eq!(ix.make_cold_all(&keys, &b), COLD / BLOCK);
    assert!(ix.blocks.is_empty());
    let built = ix.cold[&0].clone();
    let (full, ids) = (built.heap_bytes(), built.ids().to_vec());
    let check = |ix: &BlockIndex, gone: &[u64]| {
        for k in 0..COLD as u64 {
            let want = (!gone.contains(&k)).then(|| rec(k));
            assert_eq!(ix.get(k).and_then(|e| e.record()), want, "key {k}");
        }
        assert_eq!(b.used(), ix.heap_bytes());
        assert_eq!(ix.cold_members, (COLD - gone.len()) as u64);
    };
    let mut gone = Vec::new();
    for k in (0..COLD as u64).step_by(7).take(COLD / GONE_SHARE) {
        assert!(ix.remove(k, &b).is_some());
        gone.push(k);
        let c = &ix.cold[&0];
        assert_eq!((c.heap_bytes(), c.ids()), (full + MASK_BYTES, &ids[..]), "{} gone", gone.len());
        check(&ix, &gone);
    }
    // One more: rebuilt without them.
    assert!(ix.remove(3, &b).is_some());
    gone.push(3);
    let c = &ix.cold[&0];
    assert!(c.gone().is_none() && c.heap_bytes() < full, "{} bytes, {full} before", c.heap_bytes());
    assert_eq!(c.member_places().len(), COLD - gone.len());
    check(&ix, &gone);

    // With no room for a mask, a take rebuilds the block.
    let before = ix.cold[&0].heap_bytes();
    b.set_limit(Some(b.used()));
    assert!(ix.remove(5, &b).is_some());
    gone.push(5);
    let c = &ix.cold[&0];
    assert!(c.gone().is_none() && c.heap_bytes() <= before, "{} bytes, {before} before", c.heap_bytes());
    check(&ix, &gone);
    // And a key stored again leaves the block as a load's does.
    b.set_limit(None);
    ix.insert(10, backed(rec(10)), &b).unwrap();
    assert!(ix.cold[&0].gone().is_some() && !ix.cold[&0].is_member(10) && ix.blocks[&0].len() == 1);
    for k in 0..COLD as u64 {
        let want = (!gone.contains(&k)).then(|| rec(k));
        assert_eq!(ix.get(k).and_then(|e| e.record()), want, "key {k}");
    }
    assert_eq!(b.used(), ix.heap_bytes());
}

#[test]
fn a_key_that_needs_a_block_the_budget_cannot_pay_for_is_refused() {
    let b = Budget::new(None);
    let mut ix = BlockIndex::new();
    ix.insert(0, Entry::same(0), &b).unwrap();
    let limited = Budget::new(Some(b.used()));
    limited.force_charge(b.used());
    assert!(matches!(ix.insert(16, Entry::same(1), &limited), Err(AllocError::LimitReached { .. })));
    assert_eq!((ix.len(), ix.heap_bytes(), limited.used()), (1, b.used(), b.used()));
    // A new key of a block that exists needs its 16 bytes too; a key
    // replaced needs nothing.
    assert!(matches!(ix.insert(15, Entry::same(2), &limited), Err(AllocError::LimitReached { .. })));
    assert_eq!((ix.len(), ix.get(15), limited.used()), (1, None, b.used()));
    ix.insert(0, Entry::same(3), &limited).unwrap();
    ix.insert(15, Entry::same(2), &b).unwrap();
    assert_eq!((ix.len(), ix.get(0), ix.get(15)), (2, Some(Entry::same(3)), Some(Entry::same(2))));
}

/// A block's allocation grows and shrinks with its keys, which keep
/// their entries and access times whatever the order they come and go
/// in.
#[test]
fn a_block_keeps_its_keys_by_rank_in_just_their_room() {
    let b = Budget::new(None);
    let mut ix = BlockIndex::new();
    let order = [7usize, 0, 15, 3, 11, 1, 14, 8, 2, 13, 4, 9, 12, 5, 10, 6];
    for (n, &i) in order.iter().enumerate() {
        ix.insert(i as u64, Entry::same(100 + i as u64), &b).unwrap();
        ix.touch(i as u64, i as u32 + 1);
        assert_eq!((ix.blocks[&0].kept.len(), ix.block_bytes), (n + 1, kept_bytes(n + 1)));
        assert_eq!(b.used(), ix.heap_bytes());
    }
    for &i in order.iter().rev().step_by(2) {
        assert_eq!(ix.remove(i as u64, &b), Some(Entry::same(100 + i as u64)));
    }
    assert_eq!(ix.block_bytes, kept_bytes(8));
    assert_eq!(b.used(), ix.heap_bytes());
    for (n, &i) in order.iter().enumerate() {
        let want = (n % 2 == 0).then(|| Entry::same(100 + i as u64));
        assert_eq!(ix.get(i as u64), want, "key {i}");
        assert_eq!(ix.ac_time(i as u64), if n % 2 == 0 { i as u32 + 1 } else { 0 }, "key {i}");
    }
    let mut out = Vec::new();
    ix.remove_range(&(0..16), &mut out, &b);
    assert_eq!((out.len(), ix.len(), ix.blocks.len(), ix.block_bytes), (8, 0, 0, 0));
    assert_eq!(b.used(), ix.heap_bytes());
}

/// A written-back page costs the cold rate whatever its neighbours:
/// blocks half in RAM (every other key written back, one page a
/// record) keep their written-back keys cold, in under 10.5 bytes a
/// key, and their blocks in RAM shrink to the keys left. A record
/// named from both maps (written with a dictionary and without, in one
/// extent: never made so, but possible) is marked only when it leaves
/// the second.
#[test]
fn written_back_keys_go_cold_beside_keys_in_ram() {
    let b = Budget::new(None);
    let mut ix = BlockIndex::new();
    let obj = |k: u64| Entry::obj(zmem_alloc::Handle::from_raw(k + 1), ObjInfo::raw());
    let rec = |k: u64| 1 << 56 | 3 << 32 | k << 12 | 100;
    const N: u64 = 16 * 512;
    for k in 0..N {
        ix.insert(k, obj(k), &b).unwrap();
    }
    let full = ix.heap_bytes();
    for k in (0..N).filter(|k| k % 2 == 1) {
        ix.set(k, Entry::backed(rec(k), ObjInfo::raw()));
    }
    for id in 0..N / 16 {
        assert!(ix.make_cold(id << BLOCK_SHIFT, &b));
    }
    assert_eq!(b.used(), ix.heap_bytes());
    let per_backed = ix.backed_bytes(N / 2) as f64 / (N / 2) as f64;
    eprintln!("{per_backed:.1} bytes a written-back key; {} of {full}", ix.heap_bytes());
    assert!(per_backed <= 8.0, "{per_backed:.1} bytes a written-back key");
    assert_eq!(ix.block_bytes, (N / 16) * kept_bytes(8), "blocks in RAM hold 8 keys each");
    assert!(ix.heap_bytes() <= full, "{} of {full}", ix.heap_bytes());
    for k in 0..N {
        let want = if k % 2 == 1 { Entry::backed(rec(k), ObjInfo::in_extent()) } else { obj(k) };
        assert_eq!(ix.get(k), Some(want), "key {k}");
    }
    let mut ext = Vec::new();
    ix.extents(&mut ext);
    assert_eq!(ext.len() as u64, N / 2);
    // The keys in RAM alone: the objects.
    let mut in_ram: Vec<(u64, Entry)> = ix.iter_in_ram().map(|(k, e, _)| (k, e)).collect();
    in_ram.sort_unstable_by_key(|&(k, _)| k);
    assert_eq!(in_ram, (0..N).step_by(2).map(|k| (k, obj(k))).collect::<Vec<_>>());
    assert_eq!(ix.iter().count() as u64, N);
    // Stores to written-back keys bring them back one by one; the last
    // of a block's cold keys takes its cold block with it.
    for k in (0..16).filter(|k| k % 2 == 1) {
        assert_eq!(ix.insert(k, obj(k), &b).unwrap().unwrap().record(), Some(rec(k)));
    }
    assert!(ix.cold[&0].member_places().iter().all(|&i| i >= 16) && ix.blocks[&0].len() == 16);
    assert_eq!((ix.cold_members, ix.len() as u64), (N / 2 - 8, N));
    assert_eq!(b.used(), ix.heap_bytes());
    // One record named from both maps.
    let dict = Entry::backed(7, ObjInfo::with_dict(0, zmem_compress::Algorithm::Zstd, 100));
    ix.insert(N, dict, &b).unwrap();
    for k in N + 1..N + 8 {
        ix.insert(k, backed(7), &b).unwrap();
    }
    assert!(ix.make_cold(N, &b));
    assert_eq!((ix.blocks[&(N / 16)].present, ix.cold[&(N / 256)].member_places()), (1, (1..8).collect()));
    for k in N + 1..N + 7 {
        assert_eq!(ix.remove(k, &b).unwrap().record(), Some(7));
    }
    assert_eq!(ix.remove(N, &b), Some(dict), "from RAM");
    let mut out = Vec::new();
    ix.remove_range(&(N..N + 16), &mut out, &b);
    assert!(out.len() == 1 && out[0].record() == Some(7), "and from its cold block");
    ix.insert(N, dict, &b).unwrap();
    for k in N + 1..N + 8 {
        ix.insert(k, backed(7), &b).unwrap();
    }
    assert!(ix.make_cold(N, &b));
    ix.remove_range(&(N..N + 16), &mut out, &b);
    assert_eq!(out[1..].iter().filter(|e| e.record() == Some(7)).count(), 8, "across both maps");
    ix.remove_range(&(0..u64::MAX), &mut out, &b);
    assert_eq!((ix.len(), ix.cold_members, ix.cold_zeros, ix.block_bytes, ix.cold_bytes), (0, 0, 0, 0, 0));
    assert_eq!(b.used(), ix.heap_bytes());
}
