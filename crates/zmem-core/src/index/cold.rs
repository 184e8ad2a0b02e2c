//! Cold blocks: the written-back keys of sixteen index blocks (256 keys)
//! in one allocation of just their size (see `index.rs`'s design notes):
//! a mask of the keys, one of their zero-filled pages, one of the keys
//! loaded back since, and each key's record id packed in just the bits in
//! which the block's ids differ ([`encode_ids`]).

use std::ops::Range;

use super::*;

/// Keys a cold block covers (all in one index shard: `shard.rs`).
pub(crate) const COLD_SHIFT: u32 = 8;
pub(super) const COLD: usize = 1 << COLD_SHIFT;
/// 32-bit words of a mask of a cold block's places.
pub(super) const MASK_WORDS: usize = COLD / 32;
/// A bit for each place of a cold block.
pub(super) type Mask = [u32; MASK_WORDS];

pub(super) fn bit(m: &[u32], i: usize) -> bool {
    m[i / 32] >> (i % 32) & 1 == 1
}

/// The places set in `m`, ascending.
pub(super) fn places(m: &[u32]) -> impl Iterator<Item = usize> + '_ {
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
pub(super) fn cold_span(id: u64) -> Range<usize> {
    let first = (id as usize % (COLD / BLOCK)) * BLOCK;
    first..first + BLOCK
}

/// Block `id`'s keys of `m` (a bit each, by place in the block) as places
/// of its cold block.
pub(super) fn span_mask(id: u64, m: u16) -> Mask {
    let start = cold_span(id).start;
    let mut out = [0; MASK_WORDS];
    out[start / 32] = u32::from(m) << (start % 32);
    out
}

/// The first word of a cold block's ids when every key names one record.
pub(super) const ONE: u32 = u32::MAX;
/// The most distinct high halves split ids keep (an 8-bit index a key).
pub(super) const SPLIT_HIGHS: usize = COLD;

/// Bits of a key's index into `h` high halves: just enough.
pub(super) fn index_bits(h: usize) -> usize {
    (usize::BITS - h.saturating_sub(1).leading_zeros()) as usize
}

/// The runs of ones of a mask (a 32-bit one has at most 16), each as its
/// lowest bit and its ones shifted down: x86's `pext` (`gather`) and
/// `pdep` (`scatter`) through one mask, many values at a time.
pub(super) struct Runs {
    n: usize,
    run: [(u32, u32); 16],
}

impl Runs {
    pub(super) fn new(mask: u32) -> Runs {
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
    pub(super) fn gather(&self, v: u32) -> u32 {
        let (mut out, mut at) = (0, 0);
        for &(lo, ones) in &self.run[..self.n] {
            out |= (v >> lo & ones) << at;
            at += ones.count_ones();
        }
        out
    }
    pub(super) fn scatter(&self, x: u32) -> u32 {
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
pub(super) fn gather(v: u32, mask: u32) -> u32 {
    Runs::new(mask).gather(v)
}

/// [`gather`]'s inverse: the low bits of `x` put back where `mask` has
/// ones (x86's `pdep`).
#[cfg(test)]
pub(super) fn scatter(x: u32, mask: u32) -> u32 {
    Runs::new(mask).scatter(x)
}

/// Words of the split form's head: `h`, then the high halves' base and
/// mask, then the low halves'.
pub(super) const SPLIT_HEAD: usize = 5;

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
pub(super) fn encode_ids(ids: &[u64], out: &mut Vec<u32>) {
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
pub(super) fn put_bits(words: &mut [u32], pos: usize, v: u64) {
    let x = u128::from(v) << (pos % 32);
    for (i, w) in words[pos / 32..].iter_mut().take(3).enumerate() {
        *w |= (x >> (32 * i)) as u32;
    }
}

/// The `n` bits (at most 40) of `words` from bit `pos` on.
pub(super) fn get_bits(words: &[u32], pos: usize, n: usize) -> u64 {
    if n == 0 {
        return 0;
    }
    let x = words[pos / 32..].iter().take(3).enumerate().fold(0u128, |x, (i, &w)| x | u128::from(w) << (32 * i));
    (x >> (pos % 32)) as u64 & ((1u64 << n) - 1)
}

pub(super) fn join(low: u32, high: u32) -> u64 {
    u64::from(high) << 32 | u64::from(low)
}

/// The split form of [`encode_ids`], its head read once.
pub(super) struct Split<'a> {
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
    pub(super) fn new(r: &'a [u32]) -> Split<'a> {
        let (h, [hb, hm, lb, lm]) = (r[0] as usize, [r[1], r[2], r[3], r[4]]);
        let (hw, lw) = (hm.count_ones() as usize, lm.count_ones() as usize);
        let (highs, keys) = r[SPLIT_HEAD..].split_at((h * hw).div_ceil(32));
        Split { h, hb, lb, hw, lw, bits: index_bits(h), hr: Runs::new(hm), lr: Runs::new(lm), highs, keys }
    }
    /// High half `k`.
    pub(super) fn high(&self, k: usize) -> u32 {
        self.hb ^ self.hr.scatter(get_bits(self.highs, k * self.hw, self.hw) as u32)
    }
    /// Rank `rank`'s index into the high halves, and its low half.
    pub(super) fn key(&self, rank: usize) -> (usize, u32) {
        let v = get_bits(self.keys, rank * (self.bits + self.lw), self.bits + self.lw);
        ((v & ((1 << self.bits) - 1)) as usize, self.lb ^ self.lr.scatter((v >> self.bits) as u32))
    }
}

/// The id of rank `rank` in ids made by [`encode_ids`].
pub(super) fn decode_id(r: &[u32], rank: usize) -> u64 {
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
pub(super) fn decode_ids(r: &[u32], n: usize, out: &mut Vec<u64>) {
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
pub(super) const HAS_ZEROS: u32 = 1;
/// and a mask of the written-back keys taken out since it was built.
pub(super) const HAS_GONE: u32 = 2;
/// Heap bytes of a mask of a cold block's places.
pub(super) const MASK_BYTES: u64 = (MASK_WORDS * 4) as u64;
/// A cold block keeps the ids of keys taken out while they are under one
/// in this many of its ids; the key past that rebuilds it without them.
pub(super) const GONE_SHARE: usize = 8;

pub(super) fn ones(m: &[u32]) -> usize {
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
pub(super) struct ColdBlock(Box<[u32]>);

impl ColdBlock {
    /// The block of the written-back keys `keys` (place and record, by
    /// place) and zero-filled pages `zeros`.
    pub(super) fn new(keys: &[(usize, u64)], zeros: &Mask) -> ColdBlock {
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
    pub(super) fn has(&self, flag: u32) -> bool {
        self.0[0] & flag != 0
    }
    /// The keys the ids are ranked by (written back when it was built).
    pub(super) fn ranked(&self) -> &[u32] {
        &self.0[1..1 + MASK_WORDS]
    }
    pub(super) fn zeros(&self) -> Option<&[u32]> {
        self.has(HAS_ZEROS).then(|| &self.0[1 + MASK_WORDS..1 + 2 * MASK_WORDS])
    }
    /// Where the gone keys' mask is (or would go).
    pub(super) fn gone_at(&self) -> usize {
        1 + MASK_WORDS + if self.has(HAS_ZEROS) { MASK_WORDS } else { 0 }
    }
    pub(super) fn gone(&self) -> Option<&[u32]> {
        let at = self.gone_at();
        self.has(HAS_GONE).then(|| &self.0[at..at + MASK_WORDS])
    }
    pub(super) fn zero_mask(&self) -> Mask {
        let mut m = [0; MASK_WORDS];
        if let Some(z) = self.zeros() {
            m.copy_from_slice(z);
        }
        m
    }
    /// The written-back keys: ranked and not gone.
    pub(super) fn member_mask(&self) -> Mask {
        let mut m = [0; MASK_WORDS];
        m.copy_from_slice(self.ranked());
        if let Some(g) = self.gone() {
            m.iter_mut().zip(g).for_each(|(a, b)| *a &= !b);
        }
        m
    }
    pub(super) fn ids(&self) -> &[u32] {
        &self.0[self.gone_at() + if self.has(HAS_GONE) { MASK_WORDS } else { 0 }..]
    }
    pub(super) fn is_member(&self, i: usize) -> bool {
        bit(self.ranked(), i) && !self.gone().is_some_and(|g| bit(g, i))
    }
    /// Key `i`'s rank among the ranked keys.
    pub(super) fn rank(&self, i: usize) -> usize {
        let m = self.ranked();
        ones(&m[..i / 32]) + (m[i / 32] & ((1u32 << (i % 32)) - 1)).count_ones() as usize
    }
    pub(super) fn rec(&self, i: usize) -> u64 {
        decode_id(self.ids(), self.rank(i))
    }
    pub(super) fn entry(&self, i: usize) -> Entry {
        if self.is_member(i) {
            Entry::backed(self.rec(i), ObjInfo::in_extent())
        } else if self.zeros().is_some_and(|z| bit(z, i)) {
            Entry::same(0)
        } else {
            Entry::EMPTY
        }
    }
    /// Every written-back key's place and record, by place.
    pub(super) fn keys(&self) -> Vec<(usize, u64)> {
        let ranked = self.ranked();
        let mut ids = Vec::with_capacity(ones(ranked));
        decode_ids(self.ids(), ones(ranked), &mut ids);
        let gone = self.gone();
        places(ranked).zip(ids).filter(|&(i, _)| !gone.is_some_and(|g| bit(g, i))).collect()
    }
    /// Every key's place and entry.
    #[cfg(test)]
    pub(super) fn entries(&self) -> impl Iterator<Item = (usize, Entry)> + '_ {
        let backed = self.keys().into_iter().map(|(i, rec)| (i, Entry::backed(rec, ObjInfo::in_extent())));
        backed.chain(self.zeros().into_iter().flat_map(places).map(|i| (i, Entry::same(0))))
    }
    /// The places of `span` holding a written-back key (`Index::extents`).
    #[cfg(test)]
    pub(super) fn members_in(&self, span: Range<usize>) -> impl Iterator<Item = usize> + '_ {
        span.filter(|&i| self.is_member(i))
    }
    pub(super) fn is_empty(&self) -> bool {
        self.member_mask().iter().chain(self.zeros().unwrap_or(&[])).all(|&w| w == 0)
    }
    /// Heap bytes beyond its slot in the map (with malloc's header).
    pub(super) fn heap_bytes(&self) -> u64 {
        (self.0.len() * 4 + 16) as u64
    }
    /// `old`'s keys (if any) and the written-back keys `adds` (place and
    /// record, by place) and zero-filled pages `zeros`, none of them in
    /// `old`.
    pub(super) fn with(old: Option<&ColdBlock>, adds: &[(usize, u64)], zeros: &Mask) -> ColdBlock {
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
    pub(super) fn take(&mut self, mask: &Mask, grow: bool, mut out: impl FnMut(usize, Entry)) -> (u64, u64) {
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
    pub(super) fn form(&self) -> &'static str {
        match self.ids().first() {
            None => "none",
            Some(&ONE) => "one",
            Some(&0) => "whole",
            Some(_) => "split",
        }
    }
    #[cfg(test)]
    pub(super) fn member_places(&self) -> Vec<usize> {
        places(&self.member_mask()).collect()
    }
}
