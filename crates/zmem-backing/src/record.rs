//! The record format, which both halves of the crate read: the store
//! writes and verifies records (`store.rs`), and opening a file checks
//! whether it starts with one (`file.rs`), so as never to overwrite data
//! that is not a zmem backing store.
//!
//! A record is a 16-byte header and its payload (a compressed page, or
//! an extent of several, at most [`MAX_PAYLOAD`] bytes), all
//! little-endian:
//!
//! | bytes  | field                                            |
//! |--------|--------------------------------------------------|
//! | 0..2   | magic `0x5a4d` ("ZM" on disk)                    |
//! | 2..4   | payload length                                   |
//! | 4..12  | the key the page was stored under                |
//! | 12..16 | xxh3-64 of key and payload, low 32 bits          |
//!
//! The checksum covers the key, so a record read for the wrong key (a
//! stale id, a slot reused) fails verification like a corrupt one.

use std::ops::Range;

use xxhash_rust::xxh3::Xxh3;

/// The largest payload: what the tier hands a cold store (an extent).
pub const MAX_PAYLOAD: usize = zmem_core::MAX_RECORD_PAYLOAD;

/// Bytes of header before every record's payload.
pub const RECORD_HEADER_SIZE: usize = 16;
const RECORD_MAGIC: u16 = 0x5a4d; // "MZ" little-endian: "ZM"

pub(crate) fn checksum(key: u64, payload: &[u8]) -> u32 {
    let mut h = Xxh3::new();
    h.update(&key.to_le_bytes());
    h.update(payload);
    h.digest() as u32
}

pub(crate) fn put_record(dst: &mut [u8], key: u64, payload: &[u8]) {
    dst[0..2].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    dst[2..4].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    dst[4..12].copy_from_slice(&key.to_le_bytes());
    dst[12..16].copy_from_slice(&checksum(key, payload).to_le_bytes());
    dst[16..16 + payload.len()].copy_from_slice(payload);
}

/// The well-formed record `buf` starts with, of the length its header
/// gives (magic and checksum agree): `(key, payload)`.
pub(crate) fn parse(buf: &[u8]) -> Option<(u64, &[u8])> {
    let len = header_len(buf)?;
    if len as usize > MAX_PAYLOAD {
        return None;
    }
    verify(buf, len, None)
}

/// Whether `buf` starts with a well-formed record: the start of a zmem
/// backing store.
pub(crate) fn is_record_start(buf: &[u8]) -> bool {
    parse(buf).is_some()
}

/// The payload length a record's header gives (`None` if `rec` is too
/// short to have one).
pub(crate) fn header_len(rec: &[u8]) -> Option<u16> {
    rec.get(2..4).and_then(|b| b.try_into().ok()).map(u16::from_le_bytes)
}

/// Check a record's header against the length (and key) its id says;
/// returns `(key, payload)`.
pub(crate) fn verify(rec: &[u8], len: u16, key: Option<u64>) -> Option<(u64, &[u8])> {
    // Any of it may be missing (a short file): a field that is not there
    // is no record, never an out-of-range slice.
    let field = |r: Range<usize>| rec.get(r);
    let magic = u16::from_le_bytes(field(0..2)?.try_into().ok()?);
    let hlen = u16::from_le_bytes(field(2..4)?.try_into().ok()?);
    let hkey = u64::from_le_bytes(field(4..12)?.try_into().ok()?);
    let sum = u32::from_le_bytes(field(12..16)?.try_into().ok()?);
    let payload = rec.get(RECORD_HEADER_SIZE..RECORD_HEADER_SIZE + len as usize)?;
    (magic == RECORD_MAGIC && hlen == len && key.is_none_or(|k| k == hkey) && sum == checksum(hkey, payload)).then_some((hkey, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of 4 to 15 bytes whose length field reads as a page or less
    /// was sliced past its end (the header's key at 4..12).
    #[test]
    fn short_headers_are_no_record_and_no_panic() {
        for n in 0..=RECORD_HEADER_SIZE + 8 {
            for len in [0u16, 1, 8, 4096] {
                let mut buf = vec![0u8; n];
                if n >= 4 {
                    buf[..2].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
                    buf[2..4].copy_from_slice(&len.to_le_bytes());
                }
                assert!(!is_record_start(&buf) || n >= RECORD_HEADER_SIZE + len as usize, "{n} bytes, length {len}");
                assert!(verify(&buf, len, None).is_none() || n >= RECORD_HEADER_SIZE + len as usize);
            }
        }
    }

    #[test]
    fn a_whole_record_verifies_and_a_cut_one_does_not() {
        let payload = b"compressed page bytes";
        let mut buf = vec![0u8; RECORD_HEADER_SIZE + payload.len()];
        put_record(&mut buf, 42, payload);
        assert!(is_record_start(&buf));
        assert_eq!(verify(&buf, payload.len() as u16, Some(42)), Some((42, &payload[..])));
        assert_eq!(verify(&buf, payload.len() as u16, Some(43)), None, "another key's record");
        for cut in 0..buf.len() {
            assert!(!is_record_start(&buf[..cut]), "cut at {cut}");
        }
    }
}
