//! Extents: the written-back objects of one index block in one record.
//!
//! # Why
//! A page written back alone costs a record in the cold store (its
//! offset in its segment's list: 2 bytes in the backing file's tables)
//! and its record id in the index (4-8 bytes in a cold block, and its
//! share of the block's masks and slot), whoever reads it: about 7 bytes
//! of RAM for a page that is not in RAM. Under
//! a build's swap storm the pool's cap then holds tables, not pages.
//! zram's flat table costs it 16 bytes a slot it does not count; zswap's
//! overflow is the kernel's swap map, a byte or two a slot.
//!
//! # What
//! Every page the tier writes back is the one member of an extent: this
//! header, then the object as it was in RAM (no recompression: no CPU
//! spent). The entry names the extent's record; when a block holds
//! nothing else (same-filled zero pages aside), the index keeps its keys
//! in a cold block (`index.rs`) instead of 16 entries and their access
//! times: one id for the whole cold block when they are all it holds,
//! else 4 bytes a key. The format (and the index) allow up to 16 members,
//! one index block's pages in one record, freed with the last of them
//! (`Entry::last`); the shrinker wrote such extents once (`--extents`,
//! tried and not kept: a load read its whole extent; docs/experiments/),
//! and now writes one member a record.
//!
//! # Format
//! | bytes       | field                                             |
//! |-------------|---------------------------------------------------|
//! | 0           | magic `0xE7`                                      |
//! | 1           | members `n`, 1..=16                               |
//! | 2..2+4n     | per member: index in its block (0..16), the       |
//! |             | object's algorithm tag, its length (u16 LE)       |
//! | 2+4n..      | the objects, in the members' order                |
//!
//! The cold store checks the record (checksum, key, length); this checks
//! that the header agrees with the payload, so a bad one is an error, not
//! a panic or another page's bytes.

use std::ops::Range;

use crate::entry::{ObjInfo, PAGE_SIZE};

const MAGIC: u8 = 0xE7;
/// Members an extent may have: the keys of one index block.
pub(crate) const MAX_MEMBERS: usize = 1 << crate::index::BLOCK_SHIFT;

/// Bytes of header for `n` members.
pub(crate) fn header_len(n: usize) -> usize {
    2 + 4 * n
}

/// Write the header of an extent whose members are `(index in block,
/// object info)`, in the order their bytes will follow.
pub(crate) fn put_header(members: &[(u8, ObjInfo)], out: &mut Vec<u8>) {
    debug_assert!((1..=MAX_MEMBERS).contains(&members.len()));
    out.push(MAGIC);
    out.push(members.len() as u8);
    for &(idx, info) in members {
        out.push(idx);
        out.push(info.tag);
        out.extend_from_slice(&info.len.to_le_bytes());
    }
}

/// Why a record is not a well-formed extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ExtentError {
    #[error("the record is not an extent (bad magic or member count)")]
    NotExtent,
    #[error("the extent's header does not agree with its length")]
    BadLength,
    #[error("the extent has no member {0}")]
    NoMember(u8),
}

/// The members' headers of the extent `payload` (4 bytes each), checked
/// against its length: each object within a page, and the objects
/// filling the payload to its end.
fn header(payload: &[u8]) -> Result<&[u8], ExtentError> {
    let (&magic, rest) = payload.split_first().ok_or(ExtentError::NotExtent)?;
    let (&n, _) = rest.split_first().ok_or(ExtentError::NotExtent)?;
    let n = n as usize;
    if magic != MAGIC || !(1..=MAX_MEMBERS).contains(&n) {
        return Err(ExtentError::NotExtent);
    }
    let head = payload.get(2..header_len(n)).ok_or(ExtentError::BadLength)?;
    let mut total = header_len(n);
    for m in head.chunks_exact(4) {
        let len = u16::from_le_bytes([m[2], m[3]]) as usize;
        if len > PAGE_SIZE || m[1] > 0xF {
            return Err(ExtentError::BadLength);
        }
        total += len;
    }
    if total != payload.len() {
        return Err(ExtentError::BadLength);
    }
    Ok(head)
}

/// The members of a checked header, in order: index in the block, how
/// the object is encoded, and where it lies in the payload.
fn walk(head: &[u8]) -> impl Iterator<Item = (u8, ObjInfo, Range<usize>)> + '_ {
    let mut off = 2 + head.len();
    head.chunks_exact(4).map(move |m| {
        let len = u16::from_le_bytes([m[2], m[3]]);
        off += len as usize;
        (m[0], ObjInfo { tag: m[1], len }, off - len as usize..off)
    })
}

/// Where member `idx` lies in `payload`, and how it is encoded (a load's
/// path: nothing allocated).
pub(crate) fn find(payload: &[u8], idx: u8) -> Result<(ObjInfo, Range<usize>), ExtentError> {
    walk(header(payload)?).find(|m| m.0 == idx).map(|(_, info, r)| (info, r)).ok_or(ExtentError::NoMember(idx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zmem_compress::Algorithm;

    fn extent(members: &[(u8, &[u8])]) -> Vec<u8> {
        let infos: Vec<(u8, ObjInfo)> = members.iter().map(|&(i, b)| (i, ObjInfo::compressed(Algorithm::Lz4, b.len()))).collect();
        let mut out = Vec::new();
        put_header(&infos, &mut out);
        assert_eq!(out.len(), header_len(members.len()));
        for (_, b) in members {
            out.extend_from_slice(b);
        }
        out
    }

    #[test]
    fn members_are_found_by_their_index() {
        let (a, b, c) = (vec![1u8; 10], vec![2u8; 4096], vec![]);
        let x = extent(&[(3, &a), (0, &b), (15, &c)]);
        for (idx, want) in [(3u8, &a), (0, &b), (15, &c)] {
            let (info, r) = find(&x, idx).unwrap();
            assert_eq!((&x[r], info.len as usize, info.tag), (&want[..], want.len(), Algorithm::Lz4.tag()));
        }
        assert_eq!(find(&x, 4), Err(ExtentError::NoMember(4)));
    }

    #[test]
    fn malformed_extents_are_errors_never_panics() {
        let good = extent(&[(1, &[9u8; 100]), (2, &[8u8; 50])]);
        assert_eq!(find(&[], 0), Err(ExtentError::NotExtent));
        assert_eq!(find(&[MAGIC], 0), Err(ExtentError::NotExtent));
        assert_eq!(find(&[MAGIC, 0], 0), Err(ExtentError::NotExtent));
        assert_eq!(find(&[MAGIC, 17], 0), Err(ExtentError::NotExtent));
        assert_eq!(find(&good[..good.len() - 1], 1), Err(ExtentError::BadLength));
        let mut long = good.clone();
        long.push(0);
        assert_eq!(find(&long, 1), Err(ExtentError::BadLength));
        let mut huge = good.clone();
        huge[4..6].copy_from_slice(&5000u16.to_le_bytes());
        assert_eq!(find(&huge, 2), Err(ExtentError::BadLength));
        // Every cut and every single-byte change: an answer or an error.
        for cut in 0..good.len() {
            let _ = find(&good[..cut], 1);
        }
        for i in 0..good.len() {
            for v in [0u8, 1, 0x7F, 0xFF] {
                let mut bad = good.clone();
                bad[i] = v;
                if let Ok((_, r)) = find(&bad, 1) {
                    assert!(r.end <= bad.len());
                }
            }
        }
    }
}
