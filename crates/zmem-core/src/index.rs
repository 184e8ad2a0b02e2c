//! The key index of one shard: blocks of keys in RAM, and cold blocks.
//!
//! zram indexes its pages with a flat array sized for the whole disk (16
//! bytes per page, never counted in `mem_used_total`); zswap uses a tree (an
//! xarray today) per swap device. Our keys are page numbers from every
//! frontend (block-device offsets, swap slots, process page offsets, file
//! page indices), so they come in runs: a block id (`key >> 4`) names 16
//! consecutive keys, a cold block id (`key >> 8`) 256.
//!
//! A key is in at most one of two maps:
//!
//! * **In RAM** ([`Block`], by block id): the keys whose pages the pool
//!   holds (objects, same-filled pages, shared objects), and written-back
//!   keys that are not worth a cold block. A block keeps a mask of its keys
//!   and, by rank in it, each key's 12-byte entry with its last-access time
//!   (zram's `ac_time`): 16 bytes a key in one allocation of just their
//!   size, plus the block's 24-byte slot in the map. A full block costs
//!   about 20 bytes a key, a block of one key about 80 in all (a dense
//!   array of 16 would take 300 whatever it held). Empty blocks are freed
//!   at once.
//! * **Written back** ([`ColdBlock`], by cold block id): the keys of sixteen
//!   blocks (one shard's: `shard.rs` shards by cold block id) whose
//!   records were written without a dictionary, and their zero-filled
//!   pages, moved there once written back ([`BlockIndex::make_cold_all`]:
//!   the blocks of a writeback batch, one rebuild a cold block), in one
//!   allocation of just their size: a 256-bit mask of the written-back
//!   keys (and one of the zero-filled pages, if any) and each key's record
//!   id: an index of 1 to 8 bits into the high halves the ids share (a
//!   backing file's segment and generation: pages written back together)
//!   and its low half, each half packed in just the bits in which the
//!   block's halves differ (a backing file's offsets and the low bits of
//!   its spans; the low bits of its segments and generations), or 8 bytes
//!   where that is no smaller ([`encode_ids`]); a block whose keys all
//!   name one extent (`extent.rs`) keeps that one record. With its 24-byte
//!   slot in the map, about 4 bytes a key when full of keys written out
//!   together, 5 when they went out in a hundred segments. A written-back
//!   page needs nothing else of its entry: its encoding is in its record,
//!   and its flags and access time only matter in RAM. The entries are
//!   made up when asked for (written back, naming the record; or
//!   zero-filled). A key loaded back leaves a bit in a mask of gone keys
//!   (its id stays until one in eight of the block's ids are gone, and the
//!   block is rebuilt): a load does not decode and encode the block.
//!
//! So a written-back page costs the cold rate whatever its neighbours in
//! RAM, which keep only their own bytes; a store to a written-back key
//! moves that key alone back to RAM. A cold block is made only when it
//! costs no more than the bytes its keys free in RAM (a lone written-back
//! key among pages in RAM stays there at 16 bytes); once made, every
//! written-back key of its sixteen blocks joins it.
//!
//! Every entry naming a record that leaves the index is marked
//! ([`Entry::with_last`]) when no other key of its block names that record
//! in either map: an extent never spans blocks, so its last member is found
//! in the block alone, under the lock that removes it.
//!
//! A new key in RAM (16 bytes, or a new block) and any resize of a map are
//! charged to the pool's budget before the key goes in
//! ([`BlockIndex::insert`] is refused otherwise); the bytes held are kept
//! in a counter, so the index's share of `mem_used_total` costs nothing to
//! read.

use std::ops::Range;

use zmem_alloc::{AllocError, Budget};

use crate::charged::{map_bytes, map_insert_new, map_shrink, Map};
use crate::entry::{Entry, ObjInfo, Slot};

pub(crate) const BLOCK_SHIFT: u32 = 4;
const BLOCK: usize = 1 << BLOCK_SHIFT;
const MASK: u64 = BLOCK as u64 - 1;
/// A key's place in its block: `key & BLOCK_MASK`.
pub(crate) const BLOCK_MASK: u64 = MASK;

/// A key in RAM: its entry and its last-access time (zram's `ac_time`,
/// seconds since the pool was created), which every pool keeps: they name
/// idle pages for writeback and recompression. Side by side, as a load
/// reads the one and writes the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Kept {
    e: Entry,
    ac: u32,
}

/// Heap bytes of a block's `n` keys (with malloc's header: a request of
/// 16 n bytes takes a chunk of 16 n + 16).
fn kept_bytes(n: usize) -> u64 {
    if n == 0 {
        0
    } else {
        (n * std::mem::size_of::<Kept>() + 16) as u64
    }
}

/// Bytes a block id's slot takes in a map of `V` (buckets at most 7/8
/// full; a freed slot is not given back until the map is rebuilt).
fn slot_bytes<V>() -> u64 {
    std::mem::size_of::<(u64, V)>() as u64 + 1
}

/// The keys of a block that are in RAM (see the module notes): which are
/// here, and their entries by rank among them, in an allocation of just
/// their size (a key that comes or goes moves the rest: 16 bytes each).
#[derive(Debug)]
struct Block {
    present: u16,
    kept: Box<[Kept]>,
}

impl Block {
    fn one(i: usize, k: Kept) -> Block {
        Block { present: 1 << i, kept: Box::new([k]) }
    }
    fn len(&self) -> usize {
        self.kept.len()
    }
    fn bytes(&self) -> u64 {
        kept_bytes(self.kept.len())
    }
    fn has(&self, i: usize) -> bool {
        self.present >> i & 1 == 1
    }
    fn rank(&self, i: usize) -> usize {
        (self.present & ((1u16 << i) - 1)).count_ones() as usize
    }
    fn get(&self, i: usize) -> Option<&Kept> {
        self.has(i).then(|| &self.kept[self.rank(i)])
    }
    fn get_mut(&mut self, i: usize) -> Option<&mut Kept> {
        let r = self.rank(i);
        self.has(i).then(|| &mut self.kept[r])
    }
    /// Every key here, by place, with what it keeps.
    fn iter(&self) -> impl Iterator<Item = (usize, &Kept)> + '_ {
        (0..BLOCK).filter(|&i| self.has(i)).zip(self.kept.iter())
    }
    fn names(&self, rec: u64) -> bool {
        self.kept.iter().any(|k| k.e.record() == Some(rec))
    }
    /// Add key `i` (absent): [`Kept`]'s size more.
    fn add(&mut self, i: usize, k: Kept) {
        debug_assert!(!self.has(i));
        let r = self.rank(i);
        let mut v = Vec::with_capacity(self.kept.len() + 1);
        v.extend_from_slice(&self.kept[..r]);
        v.push(k);
        v.extend_from_slice(&self.kept[r..]);
        self.kept = v.into_boxed_slice();
        self.present |= 1 << i;
    }
    /// Take the keys of `mask` out, handing each to `out` with its place.
    /// Returns the bytes freed.
    fn take(&mut self, mask: u16, mut out: impl FnMut(usize, Entry)) -> u64 {
        let mask = mask & self.present;
        if mask == 0 {
            return 0;
        }
        let before = self.bytes();
        let mut v = Vec::with_capacity(self.kept.len() - mask.count_ones() as usize);
        for (i, k) in (0..BLOCK).filter(|&i| self.present >> i & 1 == 1).zip(self.kept.iter()) {
            if mask >> i & 1 == 1 {
                out(i, k.e);
            } else {
                v.push(*k);
            }
        }
        self.present &= !mask;
        self.kept = v.into_boxed_slice();
        before - self.bytes()
    }
    /// The keys that go to the cold block when the block is made cold:
    /// written back without a dictionary (which a cold block cannot name),
    /// and zero-filled pages. None unless one is written back.
    fn cold_keys(&self) -> (u16, u16) {
        let (mut backed, mut zeros) = (0u16, 0u16);
        for (i, k) in self.iter() {
            match k.e.slot() {
                Slot::Same(0) => zeros |= 1 << i,
                Slot::Backed(_, info) if info.dict().is_none() => backed |= 1 << i,
                _ => {}
            }
        }
        if backed == 0 {
            (0, 0)
        } else {
            (backed, zeros)
        }
    }
}
/// Keys a cold block covers (all in one index shard: `shard.rs`).
pub(crate) const COLD_SHIFT: u32 = 8;
const COLD: usize = 1 << COLD_SHIFT;
/// 32-bit words of a mask of a cold block's places.
const MASK_WORDS: usize = COLD / 32;
/// A bit for each place of a cold block.
type Mask = [u32; MASK_WORDS];

fn bit(m: &[u32], i: usize) -> bool {
    m[i / 32] >> (i % 32) & 1 == 1
}

/// The places set in `m`, ascending.
fn places(m: &[u32]) -> impl Iterator<Item = usize> + '_ {
    m.iter().enumerate().flat_map(|(w, &x)| {
        let mut x = x;
        std::iter::from_fn(move || {
            (x != 0).then(|| {
                let b = x.trailing_zeros() as usize;
                x &= x - 1;
                w * 32 + b
            })
        })
    })
}

/// The places in a cold block of block `id`'s keys.
fn cold_span(id: u64) -> Range<usize> {
    let first = (id as usize % (COLD / BLOCK)) * BLOCK;
    first..first + BLOCK
}

/// Block `id`'s keys of `m` (a bit each, by place in the block) as places
/// of its cold block.
fn span_mask(id: u64, m: u16) -> Mask {
    let start = cold_span(id).start;
    let mut out = [0; MASK_WORDS];
    out[start / 32] = u32::from(m) << (start % 32);
    out
}

/// The first word of a cold block's ids when every key names one record.
const ONE: u32 = u32::MAX;
/// The most distinct high halves split ids keep (an 8-bit index a key).
const SPLIT_HIGHS: usize = COLD;

/// Bits of a key's index into `h` high halves: just enough.
fn index_bits(h: usize) -> usize {
    (usize::BITS - h.saturating_sub(1).leading_zeros()) as usize
}

/// The runs of ones of a mask (a 32-bit one has at most 16), each as its
/// lowest bit and its ones shifted down: x86's `pext` (`gather`) and
/// `pdep` (`scatter`) through one mask, many values at a time.
struct Runs {
    n: usize,
    run: [(u32, u32); 16],
}

impl Runs {
    fn new(mask: u32) -> Runs {
        let mut r = Runs { n: 0, run: [(0, 0); 16] };
        let mut m = mask;
        while m != 0 {
            let lo = m.trailing_zeros();
            let ones = ((1u64 << (m >> lo).trailing_ones()) - 1) as u32;
            m &= !(ones << lo);
            r.run[r.n] = (lo, ones);
            r.n += 1;
        }
        r
    }
    fn gather(&self, v: u32) -> u32 {
        let (mut out, mut at) = (0, 0);
        for &(lo, ones) in &self.run[..self.n] {
            out |= (v >> lo & ones) << at;
            at += ones.count_ones();
        }
        out
    }
    fn scatter(&self, x: u32) -> u32 {
        let (mut out, mut at) = (0, 0);
        for &(lo, ones) in &self.run[..self.n] {
            out |= (x >> at & ones) << lo;
            at += ones.count_ones();
        }
        out
    }
}

/// The bits of `v` where `mask` has ones, packed to the low end in their
/// order (x86's `pext`).
#[cfg(test)]
fn gather(v: u32, mask: u32) -> u32 {
    Runs::new(mask).gather(v)
}

/// [`gather`]'s inverse: the low bits of `x` put back where `mask` has
/// ones (x86's `pdep`).
#[cfg(test)]
fn scatter(x: u32, mask: u32) -> u32 {
    Runs::new(mask).scatter(x)
}

/// Words of the split form's head: `h`, then the high halves' base and
/// mask, then the low halves'.
const SPLIT_HEAD: usize = 5;

/// Append the smallest form of `ids` (one per rank; nothing for none) to
/// `out`. `[ONE, low, high]` when they are all one record (an extent's).
/// Split where the ids share high halves (a cold store issues ids in runs
/// that share them: the backing file's are a segment and its generation
/// over an offset and a span, and the pages of a block tend to go out
/// together): `[h, high base, high mask, low base, low mask, the h high
/// halves, each rank's index into them and low half]`, where a half keeps
/// only the bits in which the halves differ (its mask: the bits where a
/// half differs from the base, which holds the rest), packed, and an index
/// takes just enough bits for h (none for one, 8 for 256). A backing
/// file's high halves differ in the low bits of their segment and
/// generation, its low halves in the offset and in the span's low bits,
/// so a key takes `index + 25` bits or so and a high half 2 bytes. Else,
/// where that is no smaller, whole: `[0, (low, high) per rank]`.
fn encode_ids(ids: &[u64], out: &mut Vec<u32>) {
    let Some(&first) = ids.first() else { return };
    if ids.iter().all(|&r| r == first) {
        out.extend([ONE, first as u32, (first >> 32) as u32]);
        return;
    }
    let high = |id: u64| (id >> 32) as u32;
    // Sorted, so a rank's index is a binary search (a block's rebuild is
    // on a load's path: no scan of up to 256 halves a key).
    let mut highs: Vec<u32> = ids.iter().map(|&id| high(id)).collect();
    highs.sort_unstable();
    highs.dedup();
    let (hb, lb) = (highs[0], first as u32);
    let hm = highs.iter().fold(0, |m, &x| m | (x ^ hb));
    let lm = ids.iter().fold(0, |m, &id| m | (id as u32 ^ lb));
    let (hw, lw) = (hm.count_ones() as usize, lm.count_ones() as usize);
    let bits = index_bits(highs.len());
    let high_words = (highs.len() * hw).div_ceil(32);
    let words = (ids.len() * (bits + lw)).div_ceil(32);
    if highs.len() > SPLIT_HIGHS || SPLIT_HEAD + high_words + words > 2 * ids.len() {
        out.push(0);
        out.extend(ids.iter().flat_map(|&id| [id as u32, (id >> 32) as u32]));
        return;
    }
    // (1 ≤ h ≤ 256: never 0 or ONE.)
    out.extend([highs.len() as u32, hb, hm, lb, lm]);
    let at = out.len();
    out.resize(at + high_words + words, 0);
    let (hr, lr) = (Runs::new(hm), Runs::new(lm));
    for (k, &x) in highs.iter().enumerate() {
        put_bits(&mut out[at..], k * hw, u64::from(hr.gather(x ^ hb)));
    }
    let keys = at + high_words;
    for (rank, &id) in ids.iter().enumerate() {
        let k = highs.partition_point(|&h| h < high(id)) as u64;
        put_bits(&mut out[keys..], rank * (bits + lw), k | u64::from(lr.gather(id as u32 ^ lb)) << bits);
    }
}

/// OR `v` (at most 40 bits) into `words` from bit `pos` on (a value may
/// straddle two or three words; bits past `words`' end must be 0).
fn put_bits(words: &mut [u32], pos: usize, v: u64) {
    let x = u128::from(v) << (pos % 32);
    for (i, w) in words[pos / 32..].iter_mut().take(3).enumerate() {
        *w |= (x >> (32 * i)) as u32;
    }
}

/// The `n` bits (at most 40) of `words` from bit `pos` on.
fn get_bits(words: &[u32], pos: usize, n: usize) -> u64 {
    if n == 0 {
        return 0;
    }
    let x = words[pos / 32..].iter().take(3).enumerate().fold(0u128, |x, (i, &w)| x | u128::from(w) << (32 * i));
    (x >> (pos % 32)) as u64 & ((1u64 << n) - 1)
}

fn join(low: u32, high: u32) -> u64 {
    u64::from(high) << 32 | u64::from(low)
}

/// The split form of [`encode_ids`], its head read once.
struct Split<'a> {
    h: usize,
    hb: u32,
    lb: u32,
    hw: usize,
    lw: usize,
    /// Bits of a key's index into the high halves (none with one).
    bits: usize,
    hr: Runs,
    lr: Runs,
    highs: &'a [u32],
    keys: &'a [u32],
}

impl<'a> Split<'a> {
    fn new(r: &'a [u32]) -> Split<'a> {
        let (h, [hb, hm, lb, lm]) = (r[0] as usize, [r[1], r[2], r[3], r[4]]);
        let (hw, lw) = (hm.count_ones() as usize, lm.count_ones() as usize);
        let (highs, keys) = r[SPLIT_HEAD..].split_at((h * hw).div_ceil(32));
        Split { h, hb, lb, hw, lw, bits: index_bits(h), hr: Runs::new(hm), lr: Runs::new(lm), highs, keys }
    }
    /// High half `k`.
    fn high(&self, k: usize) -> u32 {
        self.hb ^ self.hr.scatter(get_bits(self.highs, k * self.hw, self.hw) as u32)
    }
    /// Rank `rank`'s index into the high halves, and its low half.
    fn key(&self, rank: usize) -> (usize, u32) {
        let v = get_bits(self.keys, rank * (self.bits + self.lw), self.bits + self.lw);
        ((v & ((1 << self.bits) - 1)) as usize, self.lb ^ self.lr.scatter((v >> self.bits) as u32))
    }
}

/// The id of rank `rank` in ids made by [`encode_ids`].
fn decode_id(r: &[u32], rank: usize) -> u64 {
    match r[0] {
        ONE => join(r[1], r[2]),
        0 => join(r[1 + 2 * rank], r[2 + 2 * rank]),
        _ => {
            let s = Split::new(r);
            let (k, low) = s.key(rank);
            join(low, s.high(k))
        }
    }
}

/// The `n` ids made by [`encode_ids`], by rank, pushed to `out`: each
/// high half decoded once.
fn decode_ids(r: &[u32], n: usize, out: &mut Vec<u64>) {
    match r.first() {
        None => {}
        Some(&ONE) => out.extend(std::iter::repeat_n(join(r[1], r[2]), n)),
        Some(&0) => out.extend((0..n).map(|rank| join(r[1 + 2 * rank], r[2 + 2 * rank]))),
        Some(_) => {
            let s = Split::new(r);
            let highs: Vec<u32> = (0..s.h).map(|k| s.high(k)).collect();
            out.extend((0..n).map(|rank| {
                let (k, low) = s.key(rank);
                join(low, highs[k])
            }));
        }
    }
}

/// [`ColdBlock`]'s first word: the block keeps a mask of zero-filled
/// pages,
const HAS_ZEROS: u32 = 1;
/// and a mask of the written-back keys taken out since it was built.
const HAS_GONE: u32 = 2;
/// Heap bytes of a mask of a cold block's places.
const MASK_BYTES: u64 = (MASK_WORDS * 4) as u64;
/// A cold block keeps the ids of keys taken out while they are under one
/// in this many of its ids; the key past that rebuilds it without them.
const GONE_SHARE: usize = 8;

fn ones(m: &[u32]) -> usize {
    m.iter().map(|w| w.count_ones() as usize).sum()
}

/// The written-back keys and zero-filled pages of [`COLD`] consecutive
/// keys (sixteen blocks; see the module notes), in one allocation of just
/// their size: `[flags, the ranked keys' mask, the zero-filled pages' mask
/// (if flags has HAS_ZEROS), the gone keys' mask (if flags has HAS_GONE),
/// each ranked key's record id by its rank among them (encode_ids)]`.
/// Places are a key's low 8 bits. The ranked keys are the written-back
/// keys when the block was built; a key taken out since is gone (its id
/// stays, unread), so a load of a written-back page flips a bit where a
/// rebuild would decode and encode every id. Adding keys, renaming a
/// record, or gone keys past one in [`GONE_SHARE`] of the ids rebuild
/// it with just what it names.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ColdBlock(Box<[u32]>);

impl ColdBlock {
    /// The block of the written-back keys `keys` (place and record, by
    /// place) and zero-filled pages `zeros`.
    fn new(keys: &[(usize, u64)], zeros: &Mask) -> ColdBlock {
        let has_zeros = zeros.iter().any(|&w| w != 0);
        // (Either form of the ids takes at most 1 + 2 words a key.)
        let mut v = Vec::with_capacity(1 + 2 * MASK_WORDS + 1 + 2 * keys.len());
        v.push(if has_zeros { HAS_ZEROS } else { 0 });
        let mut ranked = [0u32; MASK_WORDS];
        for &(i, _) in keys {
            debug_assert!(i < COLD && !bit(&ranked, i));
            ranked[i / 32] |= 1 << (i % 32);
        }
        v.extend_from_slice(&ranked);
        if has_zeros {
            v.extend_from_slice(zeros);
        }
        let ids: Vec<u64> = keys.iter().map(|&(_, r)| r).collect();
        encode_ids(&ids, &mut v);
        ColdBlock(v.into_boxed_slice())
    }
    fn has(&self, flag: u32) -> bool {
        self.0[0] & flag != 0
    }
    /// The keys the ids are ranked by (written back when it was built).
    fn ranked(&self) -> &[u32] {
        &self.0[1..1 + MASK_WORDS]
    }
    fn zeros(&self) -> Option<&[u32]> {
        self.has(HAS_ZEROS).then(|| &self.0[1 + MASK_WORDS..1 + 2 * MASK_WORDS])
    }
    /// Where the gone keys' mask is (or would go).
    fn gone_at(&self) -> usize {
        1 + MASK_WORDS + if self.has(HAS_ZEROS) { MASK_WORDS } else { 0 }
    }
    fn gone(&self) -> Option<&[u32]> {
        let at = self.gone_at();
        self.has(HAS_GONE).then(|| &self.0[at..at + MASK_WORDS])
    }
    fn zero_mask(&self) -> Mask {
        let mut m = [0; MASK_WORDS];
        if let Some(z) = self.zeros() {
            m.copy_from_slice(z);
        }
        m
    }
    /// The written-back keys: ranked and not gone.
    fn member_mask(&self) -> Mask {
        let mut m = [0; MASK_WORDS];
        m.copy_from_slice(self.ranked());
        if let Some(g) = self.gone() {
            m.iter_mut().zip(g).for_each(|(a, b)| *a &= !b);
        }
        m
    }
    fn ids(&self) -> &[u32] {
        &self.0[self.gone_at() + if self.has(HAS_GONE) { MASK_WORDS } else { 0 }..]
    }
    fn is_member(&self, i: usize) -> bool {
        bit(self.ranked(), i) && !self.gone().is_some_and(|g| bit(g, i))
    }
    /// Key `i`'s rank among the ranked keys.
    fn rank(&self, i: usize) -> usize {
        let m = self.ranked();
        ones(&m[..i / 32]) + (m[i / 32] & ((1u32 << (i % 32)) - 1)).count_ones() as usize
    }
    fn rec(&self, i: usize) -> u64 {
        decode_id(self.ids(), self.rank(i))
    }
    fn entry(&self, i: usize) -> Entry {
        if self.is_member(i) {
            Entry::backed(self.rec(i), ObjInfo::in_extent())
        } else if self.zeros().is_some_and(|z| bit(z, i)) {
            Entry::same(0)
        } else {
            Entry::EMPTY
        }
    }
    /// Every written-back key's place and record, by place.
    fn keys(&self) -> Vec<(usize, u64)> {
        let ranked = self.ranked();
        let mut ids = Vec::with_capacity(ones(ranked));
        decode_ids(self.ids(), ones(ranked), &mut ids);
        let gone = self.gone();
        places(ranked).zip(ids).filter(|&(i, _)| !gone.is_some_and(|g| bit(g, i))).collect()
    }
    /// Every key's place and entry.
    #[cfg(test)]
    fn entries(&self) -> impl Iterator<Item = (usize, Entry)> + '_ {
        let backed = self.keys().into_iter().map(|(i, rec)| (i, Entry::backed(rec, ObjInfo::in_extent())));
        backed.chain(self.zeros().into_iter().flat_map(places).map(|i| (i, Entry::same(0))))
    }
    /// The places of `span` holding a written-back key.
    fn members_in(&self, span: Range<usize>) -> impl Iterator<Item = usize> + '_ {
        span.filter(|&i| self.is_member(i))
    }
    /// Whether a key of `span` (one block's) names `rec`.
    fn names(&self, span: Range<usize>, rec: u64) -> bool {
        self.members_in(span).any(|i| self.rec(i) == rec)
    }
    fn is_empty(&self) -> bool {
        self.member_mask().iter().chain(self.zeros().unwrap_or(&[])).all(|&w| w == 0)
    }
    /// Heap bytes beyond its slot in the map (with malloc's header).
    fn heap_bytes(&self) -> u64 {
        (self.0.len() * 4 + 16) as u64
    }
    /// `old`'s keys (if any) and the written-back keys `adds` (place and
    /// record, by place) and zero-filled pages `zeros`, none of them in
    /// `old`.
    fn with(old: Option<&ColdBlock>, adds: &[(usize, u64)], zeros: &Mask) -> ColdBlock {
        let mut keys = old.map_or_else(Vec::new, ColdBlock::keys);
        keys.extend_from_slice(adds);
        keys.sort_unstable_by_key(|&(i, _)| i);
        let mut z = old.map_or([0; MASK_WORDS], ColdBlock::zero_mask);
        z.iter_mut().zip(zeros).for_each(|(a, b)| *a |= b);
        ColdBlock::new(&keys, &z)
    }
    /// Take the keys of `mask` out, handing each to `out` with its place.
    /// Zero-filled pages and the written-back keys of a block with a gone
    /// mask leave in place; a block without one gets one if `grow` (its
    /// size more: the caller pays), else it is rebuilt without them, as it
    /// is when they would make too many gone or all. Returns the
    /// written-back keys and zero-filled pages taken.
    fn take(&mut self, mask: &Mask, grow: bool, mut out: impl FnMut(usize, Entry)) -> (u64, u64) {
        let (members, z) = (self.member_mask(), self.zero_mask());
        let (mut hit, mut zhit) = ([0u32; MASK_WORDS], [0u32; MASK_WORDS]);
        for w in 0..MASK_WORDS {
            hit[w] = mask[w] & members[w];
            zhit[w] = mask[w] & z[w];
        }
        // A store's new key in RAM asks here first: a key that is not in
        // the block costs nothing more.
        let (taken, zeros) = (ones(&hit), ones(&zhit));
        if taken + zeros == 0 {
            return (0, 0);
        }
        for i in places(&hit) {
            out(i, Entry::backed(self.rec(i), ObjInfo::in_extent()));
        }
        for i in places(&zhit) {
            out(i, Entry::same(0));
        }
        if zeros > 0 {
            let at = 1 + MASK_WORDS;
            self.0[at..at + MASK_WORDS].iter_mut().zip(&zhit).for_each(|(a, b)| *a &= !b);
        }
        if taken > 0 {
            let (ranked, gone) = (ones(self.ranked()), ones(self.gone().unwrap_or(&[])) + taken);
            if gone == ranked || gone * GONE_SHARE > ranked || !(grow || self.has(HAS_GONE)) {
                let kept: Vec<(usize, u64)> = self.keys().into_iter().filter(|&(i, _)| !bit(&hit, i)).collect();
                *self = ColdBlock::new(&kept, &self.zero_mask());
            } else if self.has(HAS_GONE) {
                let at = self.gone_at();
                self.0[at..at + MASK_WORDS].iter_mut().zip(&hit).for_each(|(a, b)| *a |= b);
            } else {
                let at = self.gone_at();
                let mut v = Vec::with_capacity(self.0.len() + MASK_WORDS);
                v.extend_from_slice(&self.0[..at]);
                v.extend_from_slice(&hit);
                v.extend_from_slice(&self.0[at..]);
                v[0] |= HAS_GONE;
                self.0 = v.into_boxed_slice();
            }
        }
        (taken as u64, zeros as u64)
    }
    /// The id form of the block's records, for the tests.
    #[cfg(test)]
    fn form(&self) -> &'static str {
        match self.ids().first() {
            None => "none",
            Some(&ONE) => "one",
            Some(&0) => "whole",
            Some(_) => "split",
        }
    }
    #[cfg(test)]
    fn member_places(&self) -> Vec<usize> {
        places(&self.member_mask()).collect()
    }
}

/// What [`take_keys`] took out of a block's two parts.
#[derive(Default)]
struct Taken {
    /// Bytes the block in RAM gave back, and the cold block.
    freed: u64,
    cold_freed: u64,
    /// Written-back keys and zero-filled pages taken from the cold block.
    members: u64,
    zeros: u64,
}

/// Take the keys of `mask` out of block `id`'s part in RAM and its part of
/// a cold block, pushing their entries to `out`: once each, an entry
/// naming a record that no key left in either part names is marked.
fn take_keys(id: u64, mut hot: Option<&mut Block>, mut cold: Option<&mut ColdBlock>, mask: u16, out: &mut Vec<Entry>) -> Taken {
    let first = out.len();
    let span = cold_span(id);
    let mut t = Taken::default();
    if let Some(b) = hot.as_deref_mut() {
        t.freed = b.take(mask, |_, e| out.push(e));
    }
    if let Some(c) = cold.as_deref_mut() {
        let before = c.heap_bytes();
        (t.members, t.zeros) = c.take(&span_mask(id, mask), false, |_, e| out.push(e));
        t.cold_freed = before - c.heap_bytes();
    }
    for j in first..out.len() {
        let Some(rec) = out[j].record() else { continue };
        let named = hot.as_deref().is_some_and(|b| b.names(rec)) || cold.as_deref().is_some_and(|c| c.names(span.clone(), rec));
        if !named && !out[first..j].iter().any(|o| o.record() == Some(rec)) {
            out[j] = out[j].with_last();
        }
    }
    t
}

/// A key's block id and its place in the block.
fn place(key: u64) -> (u64, usize) {
    (key >> BLOCK_SHIFT, (key & MASK) as usize)
}

/// A key's cold block id and its place there.
fn cold_place(key: u64) -> (u64, usize) {
    (key >> COLD_SHIFT, (key & (COLD as u64 - 1)) as usize)
}

#[derive(Default)]
pub(crate) struct BlockIndex {
    /// Blocks of keys in RAM, by block id (`key >> 4`).
    blocks: Map<Block>,
    /// Cold blocks, by `key >> 6` (a key is in at most one of the two maps).
    cold: Map<ColdBlock>,
    len: usize,
    /// Heap bytes of the blocks' keys (the maps' tables are read from the
    /// maps), and of the cold blocks' record lists.
    block_bytes: u64,
    cold_bytes: u64,
    /// Keys of the cold blocks: written back, and zero-filled.
    cold_members: u64,
    cold_zeros: u64,
}

impl BlockIndex {
    pub fn new() -> BlockIndex {
        BlockIndex::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn get(&self, key: u64) -> Option<Entry> {
        let (id, i) = place(key);
        if let Some(k) = self.blocks.get(&id).and_then(|b| b.get(i)) {
            return Some(k.e);
        }
        let (cid, ci) = cold_place(key);
        let e = self.cold.get(&cid)?.entry(ci);
        (!e.is_empty()).then_some(e)
    }

    #[cfg(test)]
    pub fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Last access time of `key` (0 if never recorded, or cold).
    #[cfg(test)]
    pub fn ac_time(&self, key: u64) -> u32 {
        let (id, i) = place(key);
        self.blocks.get(&id).and_then(|b| b.get(i)).map_or(0, |k| k.ac)
    }

    /// Record an access to a key in RAM.
    pub fn touch(&mut self, key: u64, now: u32) {
        let (id, i) = place(key);
        if let Some(k) = self.blocks.get_mut(&id).and_then(|b| b.get_mut(i)) {
            k.ac = now;
        }
    }

    /// A load's access to `key`: record the access time and let `mark`
    /// update the entry's flags, in
    /// one lookup; returns the entry as it is then. `None` if the key is
    /// absent. (A cold block's keys keep no access times and no flags:
    /// they are not in RAM.)
    pub fn access(&mut self, key: u64, now: u32, mark: impl FnOnce(&mut Entry)) -> Option<Entry> {
        let (id, i) = place(key);
        if let Some(k) = self.blocks.get_mut(&id).and_then(|b| b.get_mut(i)) {
            k.ac = now;
            mark(&mut k.e);
            return Some(k.e);
        }
        let (cid, ci) = cold_place(key);
        let e = self.cold.get(&cid)?.entry(ci);
        (!e.is_empty()).then_some(e)
    }

    /// Replace a key's entry in RAM without touching counts (flag updates,
    /// an object written back).
    pub fn set(&mut self, key: u64, e: Entry) {
        let (id, i) = place(key);
        if let Some(k) = self.blocks.get_mut(&id).and_then(|b| b.get_mut(i)) {
            k.e = e;
        }
    }

    /// Every entry with its key and last access time (0 in a cold block).
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (u64, Entry, u32)> + '_ {
        let cold = self.cold.iter().flat_map(|(&id, c)| c.entries().map(move |(i, e)| (id << COLD_SHIFT | i as u64, e, 0)));
        self.iter_in_ram().chain(cold)
    }

    /// The entries of the keys in RAM, with their keys and last access
    /// times: every object and shared object. No cold block is decoded:
    /// none of their keys is in RAM (written back, or zero-filled).
    pub fn iter_in_ram(&self) -> impl Iterator<Item = (u64, Entry, u32)> + '_ {
        self.blocks.iter().flat_map(|(&id, b)| b.iter().map(move |(i, k)| (id << BLOCK_SHIFT | i as u64, k.e, k.ac)))
    }

    /// Move the keys of the blocks of `keys` (any order) that are written
    /// back without a dictionary, with their zero-filled pages, to the
    /// cold blocks that cover them (see the module notes); a block left
    /// empty is freed. The blocks of one cold block go together (one
    /// rebuild for all). A cold block is made only if that takes no more
    /// bytes than the keys free in RAM (a few written-back keys among many
    /// in RAM cost less where they are); once made, it takes every such key
    /// of its sixteen blocks that comes. Returns the blocks whose keys
    /// moved: none if none is written back, if a new cold block would cost
    /// more, or if the budget cannot pay for the cold block's growth (the
    /// keys then stay).
    pub fn make_cold_all(&mut self, keys: &[u64], budget: &Budget) -> usize {
        let mut ids: Vec<u64> = keys.iter().map(|k| k >> BLOCK_SHIFT).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.chunk_by(|a, b| a >> (COLD_SHIFT - BLOCK_SHIFT) == b >> (COLD_SHIFT - BLOCK_SHIFT)).map(|g| self.make_cold_group(g, budget)).sum()
    }

    /// [`make_cold_all`](Self::make_cold_all) for `key`'s block alone.
    #[cfg(test)]
    pub fn make_cold(&mut self, key: u64, budget: &Budget) -> bool {
        self.make_cold_all(&[key], budget) > 0
    }

    /// [`make_cold_all`](Self::make_cold_all) for blocks `ids` of one cold block.
    fn make_cold_group(&mut self, ids: &[u64], budget: &Budget) -> usize {
        let (mut adds, mut zero_mask, mut freed_in_ram, mut moved) = (Vec::new(), [0u32; MASK_WORDS], 0, Vec::new());
        for &id in ids {
            let Some(b) = self.blocks.get(&id) else { continue };
            let (backed, zeros) = b.cold_keys();
            if backed == 0 {
                continue;
            }
            let span = cold_span(id);
            adds.extend(b.iter().filter(|&(i, _)| backed >> i & 1 == 1).filter_map(|(i, k)| Some((span.start + i, k.e.record()?))));
            zero_mask.iter_mut().zip(span_mask(id, zeros)).for_each(|(a, b)| *a |= b);
            freed_in_ram += b.bytes() - kept_bytes(b.len() - (backed | zeros).count_ones() as usize);
            moved.push((id, backed | zeros));
        }
        let Some(&(first, _)) = moved.first() else { return 0 };
        let cid = first >> (COLD_SHIFT - BLOCK_SHIFT);
        let old = self.cold.get(&cid);
        let c = ColdBlock::with(old, &adds, &zero_mask);
        let (before, after) = (old.map_or(0, ColdBlock::heap_bytes), c.heap_bytes());
        if old.is_none() && slot_bytes::<ColdBlock>() + after > freed_in_ram {
            return 0;
        }
        if after > before && budget.try_charge(after - before).is_err() {
            return 0;
        }
        match self.cold.get_mut(&cid) {
            Some(slot) => *slot = c,
            None => {
                if map_insert_new(&mut self.cold, cid, c, budget).is_err() {
                    budget.uncharge(after.saturating_sub(before));
                    return 0;
                }
            }
        }
        budget.uncharge(before.saturating_sub(after));
        self.cold_bytes = self.cold_bytes + after - before;
        self.cold_members += adds.len() as u64;
        self.cold_zeros += ones(&zero_mask) as u64;
        for &(id, m) in &moved {
            self.take_from_block(id, m, budget, |_, _| {});
        }
        moved.len()
    }

    /// Take the keys of `mask` out of block `id` in RAM (handing each to
    /// `out`), freeing the block if that empties it, and uncharge the bytes.
    /// Returns whether the block held any of them.
    fn take_from_block(&mut self, id: u64, mask: u16, budget: &Budget, out: impl FnMut(usize, Entry)) -> bool {
        let Some(b) = self.blocks.get_mut(&id).filter(|b| b.present & mask != 0) else { return false };
        let freed = b.take(mask, out);
        if b.len() == 0 {
            self.blocks.remove(&id);
            map_shrink(&mut self.blocks, budget);
        }
        self.block_bytes -= freed;
        budget.uncharge(freed);
        true
    }

    /// Take `key` out of its cold block, freeing the cold block if that
    /// empties it; returns its entry, not marked.
    fn take_cold(&mut self, key: u64, budget: &Budget) -> Option<Entry> {
        let (cid, ci) = cold_place(key);
        let c = self.cold.get_mut(&cid)?;
        let before = c.heap_bytes();
        let mut one = [0; MASK_WORDS];
        one[ci / 32] = 1 << (ci % 32);
        // A written-back key leaves its block a gone mark, which costs a
        // block without a gone mask one (else it is rebuilt).
        let had_gone = c.gone().is_some();
        let grow = had_gone || (c.is_member(ci) && budget.try_charge(MASK_BYTES).is_ok());
        let charged = if grow && !had_gone { MASK_BYTES } else { 0 };
        let mut old = None;
        let (members, zeros) = c.take(&one, grow, |_, e| old = Some(e));
        self.cold_members -= members;
        self.cold_zeros -= zeros;
        let mut after = c.heap_bytes();
        if c.is_empty() {
            self.cold.remove(&cid);
            after = 0;
        }
        // (A take grows a block by its gone mask at most: the charge.)
        self.cold_bytes = self.cold_bytes + after - before;
        budget.uncharge(before + charged - after);
        if after < before {
            map_shrink(&mut self.cold, budget);
        }
        old
    }

    /// Whether a key of block `id`, in either map, names record `rec`.
    fn names(&self, id: u64, rec: u64) -> bool {
        self.blocks.get(&id).is_some_and(|b| b.names(rec)) || self.cold.get(&(id >> (COLD_SHIFT - BLOCK_SHIFT))).is_some_and(|c| c.names(cold_span(id), rec))
    }

    /// `old`, taken from block `id`, marked if no key left there names its record.
    fn marked(&self, id: u64, old: Entry) -> Entry {
        match old.record() {
            Some(rec) if !self.names(id, rec) => old.with_last(),
            _ => old,
        }
    }

    /// Every extent the index names, with the first key of its block and
    /// the keys of the block that name it (pushed to `out`): what the
    /// tests below see of the records a block's keys share.
    #[cfg(test)]
    pub fn extents(&self, out: &mut Vec<(u64, u64, u16)>) {
        fn name(out: &mut Vec<(u64, u64, u16)>, first: usize, id: u64, i: usize, rec: u64) {
            match out[first..].iter_mut().find(|x| x.0 == rec) {
                Some(x) => x.2 |= 1 << i,
                None => out.push((rec, id << BLOCK_SHIFT, 1 << i)),
            }
        }
        let cold_of = |c: &ColdBlock, id: u64, first: usize, out: &mut Vec<(u64, u64, u16)>| {
            let span = cold_span(id);
            c.members_in(span.clone()).for_each(|i| name(out, first, id, i - span.start, c.rec(i)));
        };
        for (&id, b) in &self.blocks {
            let first = out.len();
            for (i, k) in b.iter() {
                if let Some(rec) = k.e.record() {
                    name(out, first, id, i, rec);
                }
            }
            if let Some(c) = self.cold.get(&(id >> (COLD_SHIFT - BLOCK_SHIFT))) {
                cold_of(c, id, first, out);
            }
        }
        for (&cid, c) in &self.cold {
            for id in (0..(COLD / BLOCK) as u64).map(|s| cid << (COLD_SHIFT - BLOCK_SHIFT) | s).filter(|id| !self.blocks.contains_key(id)) {
                let first = out.len();
                cold_of(c, id, first, out);
            }
        }
    }

    /// Make every key of `key`'s block that names record `from` name `to`
    /// (the cold store copied the record); returns whether one did. A cold
    /// block whose new form is larger is charged the difference first: if
    /// `budget` refuses it, nothing changes and this returns false (the
    /// keys keep naming `from`).
    pub fn rename_record(&mut self, key: u64, from: u64, to: u64, budget: &Budget) -> bool {
        let id = key >> BLOCK_SHIFT;
        let mut any = false;
        if let Some(c) = self.cold.get_mut(&(key >> COLD_SHIFT)) {
            let span = cold_span(id);
            let mut keys = c.keys();
            for k in keys.iter_mut().filter(|k| span.contains(&k.0) && k.1 == from) {
                k.1 = to;
                any = true;
            }
            if any {
                let renamed = ColdBlock::new(&keys, &c.zero_mask());
                let (old, new) = (c.heap_bytes(), renamed.heap_bytes());
                if new > old && budget.try_charge(new - old).is_err() {
                    return false;
                }
                budget.uncharge(old.saturating_sub(new));
                *c = renamed;
                self.cold_bytes = self.cold_bytes + new - old;
            }
        }
        if let Some(b) = self.blocks.get_mut(&id) {
            for k in b.kept.iter_mut().filter(|k| k.e.record() == Some(from)) {
                k.e = k.e.with_record(to);
                any = true;
            }
        }
        any
    }

    /// Insert or replace; returns the previous entry. A key new to RAM (a
    /// new block, or 16 bytes more in its block) is refused, changing
    /// nothing, if `budget` cannot pay for it and the map's growth.
    pub fn insert(&mut self, key: u64, e: Entry, budget: &Budget) -> Result<Option<Entry>, AllocError> {
        let (id, i) = place(key);
        let new = Kept { e, ac: 0 };
        match self.blocks.get_mut(&id) {
            Some(b) => {
                if let Some(k) = b.get_mut(i) {
                    let old = std::mem::replace(&mut k.e, e);
                    return Ok(Some(self.marked(id, old)));
                }
                let more = kept_bytes(b.len() + 1) - b.bytes();
                budget.try_charge(more)?;
                b.add(i, new);
                self.block_bytes += more;
            }
            None => {
                let bytes = kept_bytes(1);
                budget.try_charge(bytes)?;
                if let Err(err) = map_insert_new(&mut self.blocks, id, Block::one(i, new), budget) {
                    budget.uncharge(bytes);
                    return Err(err);
                }
                self.block_bytes += bytes;
            }
        }
        // A key is in at most one map: a written-back one comes back here.
        let old = self.take_cold(key, budget);
        if old.is_none() {
            self.len += 1;
        }
        Ok(old.map(|o| self.marked(id, o)))
    }

    /// Remove `key`; a block left empty is freed and its bytes uncharged.
    pub fn remove(&mut self, key: u64, budget: &Budget) -> Option<Entry> {
        let (id, i) = place(key);
        let mut old = Entry::EMPTY;
        if !self.take_from_block(id, 1 << i, budget, |_, e| old = e) {
            old = self.take_cold(key, budget)?;
        }
        self.len -= 1;
        Some(self.marked(id, old))
    }

    /// Remove every key in `range`, pushing the removed entries to `out`.
    pub fn remove_range(&mut self, range: &Range<u64>, out: &mut Vec<Entry>, budget: &Budget) {
        let before = out.len();
        let outside = |first: u64, shift: u32| {
            let base = first << shift;
            base > range.end.saturating_sub(1) || base.saturating_add((1 << shift) - 1) < range.start
        };
        let in_range = |id: u64| (0..BLOCK).filter(|&i| range.contains(&((id << BLOCK_SHIFT) + i as u64))).fold(0u16, |m, i| m | 1 << i);
        let mut t = Taken::default();
        let cold = &mut self.cold;
        self.blocks.retain(|&id, b| {
            if outside(id, BLOCK_SHIFT) {
                return true;
            }
            let x = take_keys(id, Some(b), cold.get_mut(&(id >> (COLD_SHIFT - BLOCK_SHIFT))), in_range(id), out);
            t.freed += x.freed;
            t.cold_freed += x.cold_freed;
            t.members += x.members;
            t.zeros += x.zeros;
            b.len() > 0
        });
        // The keys of cold blocks whose blocks have none in RAM (the
        // others' are out already); cold blocks left empty go.
        let mut cold_freed = 0;
        let blocks = &self.blocks;
        self.cold.retain(|&cid, c| {
            if !outside(cid, COLD_SHIFT) {
                for id in (0..(COLD / BLOCK) as u64).map(|s| cid << (COLD_SHIFT - BLOCK_SHIFT) | s) {
                    if !outside(id, BLOCK_SHIFT) && !blocks.contains_key(&id) {
                        let x = take_keys(id, None, Some(c), in_range(id), out);
                        t.cold_freed += x.cold_freed;
                        t.members += x.members;
                        t.zeros += x.zeros;
                    }
                }
            }
            if c.is_empty() {
                cold_freed += c.heap_bytes();
            }
            !c.is_empty()
        });
        self.cold_members -= t.members;
        self.cold_zeros -= t.zeros;
        self.cold_bytes -= t.cold_freed + cold_freed;
        self.len -= out.len() - before;
        self.block_bytes -= t.freed;
        budget.uncharge(t.freed + t.cold_freed + cold_freed);
        map_shrink(&mut self.blocks, budget);
        map_shrink(&mut self.cold, budget);
    }

    /// Written-back keys in cold blocks, and the cold blocks.
    pub fn cold_counts(&self) -> (u64, u64) {
        (self.cold_members, self.cold.len() as u64)
    }

    /// Heap bytes held: the maps' tables and every block (with malloc's header).
    pub fn heap_bytes(&self) -> u64 {
        map_bytes(&self.blocks) + map_bytes(&self.cold) + self.block_bytes + self.cold_bytes
    }

    /// The heap bytes held for the `backed` written-back keys (of
    /// [`len`](Self::len)): the cold blocks whole, and the blocks' share
    /// for the written-back keys they hold (those written with a
    /// dictionary, or too few to make a cold block of; every key of a
    /// block costs it alike).
    pub fn backed_bytes(&self, backed: u64) -> u64 {
        let cold = map_bytes(&self.cold) + self.cold_bytes;
        let hot_keys = self.len as u64 - self.cold_members - self.cold_zeros;
        let hot_backed = backed.saturating_sub(self.cold_members).min(hot_keys);
        let hot = map_bytes(&self.blocks) + self.block_bytes;
        cold + if hot_keys == 0 { 0 } else { (u128::from(hot) * u128::from(hot_backed) / u128::from(hot_keys)) as u64 }
    }
}

#[cfg(test)]
mod tests {
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

    /// A block of one extent's pages (and zero pages) is kept cold in 16
    /// bytes, reads back the same, comes back to a block when a key is
    /// stored, and the last of an extent's keys to leave is marked, however
    /// it leaves (removed, replaced, in a range), in either form.
    #[test]
    fn cold_blocks_and_the_last_member_of_an_extent() {
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
        // Removed one by one: the last member is marked, zero pages never.
        let mut marked = 0;
        for k in [16, 17, 18, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30] {
            marked += ix.remove(k, &b).unwrap().last() as u32;
        }
        assert_eq!(marked, 0);
        assert!(ix.remove(31, &b).unwrap().last(), "the extent's last key");
        assert!(!ix.remove(20, &b).unwrap().last());
        assert_eq!((ix.len(), ix.cold.len()), (0, 0));
        // A store into a cold block brings that key alone back; the entry
        // it replaces is marked only if it was the extent's last. (Four
        // keys free less in RAM than a new cold block takes: six do not.)
        for k in 32..36 {
            ix.insert(k, backed(9), &b).unwrap();
        }
        assert!(!ix.make_cold(32, &b), "four keys stay in RAM");
        for k in 36..38 {
            ix.insert(k, backed(9), &b).unwrap();
        }
        assert!(ix.make_cold(32, &b));
        let old = ix.insert(33, Entry::same(5), &b).unwrap().unwrap();
        assert!(old.record() == Some(9) && !old.last());
        assert_eq!((ix.blocks.len(), ix.cold.len(), ix.len()), (1, 1, 6));
        assert_eq!(ix.get(33), Some(Entry::same(5)));
        assert_eq!(ix.get(34).and_then(Entry::record), Some(9));
        assert!(!ix.make_cold(32, &b), "a non-zero same-filled page stays in RAM");
        for (k, w) in [(32, 6), (34, 7), (35, 8), (36, 9)] {
            assert!(!ix.insert(k, Entry::same(w), &b).unwrap().unwrap().last());
        }
        assert!(ix.insert(37, Entry::same(10), &b).unwrap().unwrap().last());
        // In a range: one mark per extent no key names any more.
        for k in 48..64 {
            ix.insert(k, backed(if k < 56 { 1 } else { 2 }), &b).unwrap();
        }
        let mut out = Vec::new();
        ix.remove_range(&(50..58), &mut out, &b);
        assert_eq!(out.iter().filter(|e| e.last()).count(), 0, "both extents keep keys");
        ix.remove_range(&(0..50), &mut out, &b);
        assert_eq!(out.iter().filter(|e| e.last()).count(), 1, "extent 1 is gone");
        assert!(ix.make_cold(60, &b));
        ix.remove_range(&(58..100), &mut out, &b);
        assert_eq!(out.iter().filter(|e| e.last()).count(), 2, "and extent 2, from its cold block");
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
    /// and every key leaving it is the last to name its record.
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
        // Every key that leaves is the last to name its record, however it leaves.
        assert!(ix.remove(3, &b).unwrap().last());
        assert!(!ix.remove(5, &b).unwrap().last(), "a zero page names no record");
        let old = ix.insert(4, Entry::same(9), &b).unwrap().unwrap();
        assert!(old.last() && old.record() == Some(1004));
        assert_eq!(ix.get(6).and_then(Entry::record), Some(1006), "the other keys stay cold");
        assert_eq!((ix.blocks[&0].present, ix.cold[&0].member_places().len()), (1 << 4, 238));
        let mut out = Vec::new();
        ix.remove_range(&(16..40), &mut out, &b);
        assert_eq!(out.len(), 24);
        assert_eq!(out.iter().filter(|e| e.last()).count(), 22, "one mark a record, none for the zero pages");
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
        /// reads back what it was given; a key leaving is marked the last
        /// exactly when no key left in its block names its record; and
        /// the budget holds the bytes the index counts.
        #[test]
        fn the_index_keeps_what_a_map_would(ops in proptest::collection::vec(op(), 1..300)) {
            let b = Budget::new(None);
            let mut ix = BlockIndex::new();
            let mut model: std::collections::BTreeMap<u64, (u8, u64)> = Default::default();
            let named_in_block = |model: &std::collections::BTreeMap<u64, (u8, u64)>, k: u64, r: u64| {
                let first = k & !MASK;
                model.range(first..first + BLOCK as u64).any(|(_, &v)| v == (1, r))
            };
            for op in ops {
                match op {
                    Op::Same(k, w) | Op::Backed(k, w) => {
                        let e = if matches!(op, Op::Same(..)) { Entry::same(w) } else { backed(w) };
                        let old = ix.insert(k, e, &b).unwrap();
                        let was = model.insert(k, view(e));
                        proptest::prop_assert_eq!(old.map(view), was);
                        if let Some(old) = old {
                            let last = was.is_some_and(|(kind, r)| kind == 1 && !named_in_block(&model, k, r));
                            proptest::prop_assert_eq!(old.last(), last, "key {}", k);
                        }
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
                        if let Some(old) = old {
                            let last = was.is_some_and(|(kind, r)| kind == 1 && !named_in_block(&model, k, r));
                            proptest::prop_assert_eq!(old.last(), last, "key {}", k);
                        }
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
                        // One mark for each record a block no longer names.
                        let mut gone_recs: Vec<(u64, u64)> = gone.iter().filter(|(_, v)| v.0 == 1).map(|&(k, v)| (k >> BLOCK_SHIFT, v.1)).collect();
                        gone_recs.sort_unstable();
                        gone_recs.dedup();
                        let marks = gone_recs.iter().filter(|&&(id, r)| !named_in_block(&model, id << BLOCK_SHIFT, r)).count();
                        proptest::prop_assert_eq!(out.iter().filter(|e| e.last()).count(), marks);
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
            assert!(ix.insert(k, obj(k), &b).unwrap().unwrap().last());
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
            assert!(!ix.remove(k, &b).unwrap().last());
        }
        assert!(!ix.remove(N, &b).unwrap().last(), "key N + 7 still names it, cold");
        let mut out = Vec::new();
        ix.remove_range(&(N..N + 16), &mut out, &b);
        assert!(out.len() == 1 && out[0].last());
        ix.insert(N, dict, &b).unwrap();
        for k in N + 1..N + 8 {
            ix.insert(k, backed(7), &b).unwrap();
        }
        assert!(ix.make_cold(N, &b));
        ix.remove_range(&(N..N + 16), &mut out, &b);
        assert_eq!(out[1..].iter().filter(|e| e.last()).count(), 1, "one mark across both maps");
        ix.remove_range(&(0..u64::MAX), &mut out, &b);
        assert_eq!((ix.len(), ix.cold_members, ix.cold_zeros, ix.block_bytes, ix.cold_bytes), (0, 0, 0, 0, 0));
        assert_eq!(b.used(), ix.heap_bytes());
    }
}
