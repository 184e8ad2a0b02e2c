//! The index entry: 12 bytes per stored key, nothing else.
//!
//! zram keeps `handle` + `flags` (size, same-filled bit, huge bit) per slot;
//! we keep the same information in 12 bytes (three u32 words, so a block of
//! entries packs without padding):
//!
//! * `meta` packs the kind (object / same-filled / deduplicated), the
//!   algorithm tag (or RAW for huge pages), the compressed length, and
//!   flags: referenced, the LRU generation, the recompression priority and
//!   "recompression cannot shrink it" (zram's `incompressible`).
//! * `data` is the allocator handle, the fill pattern of a same-filled page,
//!   or the content hash of a deduplicated object (the dedup table maps it to
//!   the shared handle and its reference count).

use zmem_alloc::Handle;
use zmem_compress::Algorithm;

pub(crate) const PAGE_SIZE: usize = 4096;
/// Dictionary slots a pool has: the tags from `TAG_DICT` on name a slot
/// and lz4 or zstd (tags 3..=12). `dict.rs` keeps the dictionaries.
pub(crate) const DICT_SLOTS: usize = 5;
/// Algorithm tag meaning "stored uncompressed as a whole page" (zram's huge)
/// because it compressed to at least the huge threshold.
pub(crate) const TAG_RAW: u8 = 0xF;
/// Stored raw because the compressor could not make it smaller than a page
/// at all (zram's "incompressible" writeback class).
pub(crate) const TAG_RAW_INCOMP: u8 = 0xE;
/// Tags 3..=12: written with the dictionary in slot (tag - 3) / 2, by lz4
/// (even offset) or zstd (odd); see `dict.rs`.
const TAG_DICT: u8 = 3;

const KIND_MASK: u32 = 0b11;
const KIND_OBJ: u32 = 0;
const KIND_SAME: u32 = 1;
const KIND_DEDUP: u32 = 2;
const KIND_BACKED: u32 = 3;
/// Set by a load: the LRU gives the entry a second chance (zswap's referenced bit).
const REF_BIT: u32 = 1 << 19;
const GEN_SHIFT: u32 = 20;
const GEN_MASK: u32 = 0xFF;
/// zram's recompression priority: 0 for the pool's compressor, 1..=3 for
/// the recompression algorithm that last rewrote the object.
const PRIO_SHIFT: u32 = 28;
const PRIO_MASK: u32 = 0b11;
/// zram's `incompressible` for recompression: no algorithm up to the top
/// priority made the object smaller, so it is not tried again.
const NO_RECOMP_BIT: u32 = 1 << 30;
const TAG_SHIFT: u32 = 2;
const LEN_SHIFT: u32 = 6;
const LEN_MASK: u32 = 0x1FFF;

/// How an object is encoded: algorithm tag (or raw) and its exact length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ObjInfo {
    pub tag: u8,
    pub len: u16,
}

impl ObjInfo {
    pub fn raw() -> ObjInfo {
        ObjInfo { tag: TAG_RAW, len: PAGE_SIZE as u16 }
    }
    /// What a cold block's entries say of a member's object: nothing (the
    /// extent's header has its tag and length), and no dictionary.
    pub fn in_extent() -> ObjInfo {
        ObjInfo { tag: 0, len: 0 }
    }
    pub fn raw_incompressible() -> ObjInfo {
        ObjInfo { tag: TAG_RAW_INCOMP, len: PAGE_SIZE as u16 }
    }
    pub fn is_incompressible(self) -> bool {
        self.tag == TAG_RAW_INCOMP
    }
    pub fn compressed(alg: Algorithm, len: usize) -> ObjInfo {
        ObjInfo { tag: alg.tag(), len: len as u16 }
    }
    pub fn is_huge(self) -> bool {
        self.tag == TAG_RAW || self.tag == TAG_RAW_INCOMP
    }
    /// Written by `alg` (lz4 or zstd) with the dictionary in `slot`.
    pub fn with_dict(slot: usize, alg: Algorithm, len: usize) -> ObjInfo {
        debug_assert!(slot < DICT_SLOTS && alg != Algorithm::Lzo);
        let tag = TAG_DICT + 2 * slot as u8 + (alg == Algorithm::Zstd) as u8;
        ObjInfo { tag, len: len as u16 }
    }
    /// The dictionary slot and algorithm of an object written with one.
    pub fn dict(self) -> Option<(usize, Algorithm)> {
        let off = self.tag.checked_sub(TAG_DICT)?;
        if off as usize >= 2 * DICT_SLOTS {
            return None;
        }
        Some(((off / 2) as usize, if off % 2 == 0 { Algorithm::Lz4 } else { Algorithm::Zstd }))
    }
    fn pack(self) -> u32 {
        ((self.tag as u32) << TAG_SHIFT) | ((self.len as u32 & LEN_MASK) << LEN_SHIFT)
    }
    fn unpack(meta: u32) -> ObjInfo {
        ObjInfo { tag: ((meta >> TAG_SHIFT) & 0xF) as u8, len: ((meta >> LEN_SHIFT) & LEN_MASK) as u16 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    meta: u32,
    /// The 64-bit payload as two words: 4-byte alignment keeps the entry at 12 bytes.
    data: [u32; 2],
}

fn split(v: u64) -> [u32; 2] {
    [v as u32, (v >> 32) as u32]
}

/// The decoded view of an [`Entry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    Obj(Handle, ObjInfo),
    Same(u64),
    Dedup(u64, ObjInfo),
    /// Written back: a record id in the backing store.
    Backed(u64, ObjInfo),
}

impl Entry {
    /// A free index slot (kind bits 3 are never used by a real entry).
    pub const EMPTY: Entry = Entry { meta: u32::MAX, data: [0, 0] };

    pub fn is_empty(self) -> bool {
        self.meta == u32::MAX
    }

    fn data(self) -> u64 {
        self.data[0] as u64 | ((self.data[1] as u64) << 32)
    }

    pub fn obj(h: Handle, info: ObjInfo) -> Entry {
        Entry { meta: KIND_OBJ | info.pack(), data: split(h.to_raw()) }
    }
    pub fn same(pattern: u64) -> Entry {
        Entry { meta: KIND_SAME, data: split(pattern) }
    }
    pub fn dedup(hash: u64, info: ObjInfo) -> Entry {
        Entry { meta: KIND_DEDUP | info.pack(), data: split(hash) }
    }
    pub fn backed(id: u64, info: ObjInfo) -> Entry {
        Entry { meta: KIND_BACKED | info.pack(), data: split(id) }
    }
    /// The LRU generation stamped on this entry (matches its LRU item).
    pub fn gen(self) -> u8 {
        ((self.meta >> GEN_SHIFT) & GEN_MASK) as u8
    }
    pub fn with_gen(self, gen: u8) -> Entry {
        Entry { meta: (self.meta & !(GEN_MASK << GEN_SHIFT)) | ((gen as u32) << GEN_SHIFT), ..self }
    }
    pub fn referenced(self) -> bool {
        self.meta & REF_BIT != 0
    }
    pub fn with_referenced(self, on: bool) -> Entry {
        let meta = if on { self.meta | REF_BIT } else { self.meta & !REF_BIT };
        Entry { meta, ..self }
    }
    /// Recompression priority of the algorithm that wrote the object.
    pub fn prio(self) -> u8 {
        ((self.meta >> PRIO_SHIFT) & PRIO_MASK) as u8
    }
    pub fn with_prio(self, prio: u8) -> Entry {
        Entry { meta: (self.meta & !(PRIO_MASK << PRIO_SHIFT)) | ((prio as u32 & PRIO_MASK) << PRIO_SHIFT), ..self }
    }
    /// Marked: recompression cannot shrink this object.
    pub fn no_recomp(self) -> bool {
        self.meta & NO_RECOMP_BIT != 0
    }
    pub fn with_no_recomp(self) -> Entry {
        Entry { meta: self.meta | NO_RECOMP_BIT, ..self }
    }
    /// The record a written-back entry names.
    pub fn record(self) -> Option<u64> {
        (!self.is_empty() && self.meta & KIND_MASK == KIND_BACKED).then(|| self.data())
    }
    /// This written-back entry naming record `id` instead (its record was
    /// copied by the cold store); flags kept.
    pub fn with_record(self, id: u64) -> Entry {
        debug_assert!(self.record().is_some());
        Entry { data: split(id), ..self }
    }
    /// The entry as the ledger keeps it (`ledger.rs`): its meta word less
    /// the flags that only steer this process (referenced, LRU generation),
    /// and its payload.
    pub fn to_raw(self) -> (u32, u64) {
        (self.with_referenced(false).with_gen(0).meta, self.data())
    }

    /// An entry from [`Entry::to_raw`]'s words, if they are one.
    pub fn from_raw(meta: u32, data: u64) -> Option<Entry> {
        let e = Entry { meta, data: split(data) };
        (!e.is_empty()).then_some(e)
    }

    pub fn slot(self) -> Slot {
        match self.meta & KIND_MASK {
            KIND_SAME => Slot::Same(self.data()),
            KIND_DEDUP => Slot::Dedup(self.data(), ObjInfo::unpack(self.meta)),
            KIND_BACKED => Slot::Backed(self.data(), ObjInfo::unpack(self.meta)),
            _ => Slot::Obj(Handle::from_raw(self.data()), ObjInfo::unpack(self.meta)),
        }
    }
}

/// If every 8-byte word of `page` is equal, that word (zram's same-filled page).
pub(crate) fn same_filled(page: &[u8]) -> Option<u64> {
    let mut words = page.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])));
    let first = words.next()?;
    // Check the last word first: most pages that differ at all differ there too.
    let last = u64::from_ne_bytes(page[page.len() - 8..].try_into().ok()?);
    if last != first {
        return None;
    }
    words.all(|w| w == first).then_some(first)
}

/// Fill `buf` with the repeated 8-byte `pattern`.
pub(crate) fn fill_pattern(buf: &mut [u8], pattern: u64) {
    let bytes = pattern.to_ne_bytes();
    for chunk in buf.chunks_exact_mut(8) {
        chunk.copy_from_slice(&bytes);
    }
}

/// One object written with a dictionary more (or less) in `counts`.
pub(crate) fn count_dict(counts: &mut [u64; DICT_SLOTS], info: ObjInfo, add: bool) {
    if let Some((slot, _)) = info.dict() {
        if add {
            counts[slot] += 1;
        } else {
            counts[slot] -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_roundtrip() {
        let h = Handle::from_raw(0xAB_1234_5678);
        let info = ObjInfo::compressed(Algorithm::Zstd, 4095);
        assert_eq!(Entry::obj(h, info).slot(), Slot::Obj(h, info));
        assert_eq!(Entry::same(u64::MAX).slot(), Slot::Same(u64::MAX));
        assert_eq!(Entry::dedup(7, ObjInfo::raw()).slot(), Slot::Dedup(7, ObjInfo::raw()));
        assert!(ObjInfo::raw().is_huge());
        assert_eq!(ObjInfo::unpack(ObjInfo::raw().pack()).len, 4096);
        assert_eq!(std::mem::size_of::<Entry>(), 12);
        assert!(!Entry::same(u64::MAX).is_empty() && Entry::EMPTY.is_empty());
        let b = Entry::backed(u64::MAX, ObjInfo::raw_incompressible()).with_gen(255).with_referenced(true);
        assert!(!b.is_empty());
        assert_eq!(b.slot(), Slot::Backed(u64::MAX, ObjInfo::raw_incompressible()));
        assert_eq!((b.gen(), b.referenced()), (255, true));
        assert!(!b.with_referenced(false).referenced());
        assert_eq!(b.with_gen(3).gen(), 3);
        let r = b.with_prio(3).with_no_recomp();
        assert_eq!((r.prio(), r.no_recomp(), r.gen(), r.referenced()), (3, true, 255, true));
        assert_eq!(r.slot(), b.slot(), "the recompression bits leave the payload alone");
        assert!(!r.is_empty(), "a marked entry is never the empty one");
        assert_eq!((b.prio(), b.no_recomp()), (0, false));
        assert_eq!(b.record(), Some(u64::MAX));
        assert_eq!((Entry::same(0).record(), Entry::EMPTY.record()), (None, None));
        for slot in 0..DICT_SLOTS {
            for alg in [Algorithm::Lz4, Algorithm::Zstd] {
                let i = ObjInfo::with_dict(slot, alg, 1234);
                assert_eq!(i.dict(), Some((slot, alg)));
                assert!(!i.is_huge() && i.tag < TAG_RAW_INCOMP);
                assert_eq!(Entry::obj(h, i).slot(), Slot::Obj(h, i));
            }
        }
        for a in Algorithm::ALL {
            assert_eq!(ObjInfo::compressed(a, 10).dict(), None);
        }
        assert_eq!((ObjInfo::raw().dict(), ObjInfo::raw_incompressible().dict()), (None, None));
    }

    #[test]
    fn same_filled_detection() {
        let mut p = vec![0u8; 4096];
        assert_eq!(same_filled(&p), Some(0));
        fill_pattern(&mut p, 0x0102030405060708);
        assert_eq!(same_filled(&p), Some(0x0102030405060708));
        p[2049] ^= 1;
        assert_eq!(same_filled(&p), None);
        let mut q = vec![0u8; 4096];
        q[4095] = 1;
        assert_eq!(same_filled(&q), None);
    }
}
