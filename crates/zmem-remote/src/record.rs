//! The record a page becomes on the cluster, and the checks that refuse a
//! wrong answer.
//!
//! ```text
//! 0      4        8          16          24     28          36
//! | ZMR1 | ns_tag | page key | record id | len  | xxh3-64   | object (len bytes)
//! ```
//!
//! All fields little-endian. `ns_tag` is a hash of the namespace, so a
//! record of another device never passes for one of ours; `page key` is the
//! key the engine wrote it under; `record id` is the id the store issued
//! (its generation: a page written back again gets a new one, so an older
//! copy can never answer for the newer); the checksum covers the header
//! before it and the object. A read checks all of them: a value that
//! fails any check is refused as [`RecordError`], never handed on.

/// Bytes before the object.
pub const HEADER: usize = 36;
const MAGIC: &[u8; 4] = b"ZMR1";

/// Why a value is not the record that was asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("{len} bytes is shorter than a record header ({HEADER})")]
    Short { len: usize },
    #[error("no record magic (the value is not a zmem record)")]
    Magic,
    #[error("the record belongs to another namespace (tag {found:#x}, this store's is {want:#x})")]
    Namespace { found: u32, want: u32 },
    #[error("the record was written for page {found:#x}, not {want:#x}")]
    Key { found: u64, want: u64 },
    #[error("the record is generation {found:#x}, not the {want:#x} asked for (an older or newer copy)")]
    Generation { found: u64, want: u64 },
    #[error("the header says {said} object bytes, the value holds {held}")]
    Length { said: usize, held: usize },
    #[error("checksum mismatch (stored {stored:#x}, computed {computed:#x})")]
    Checksum { stored: u64, computed: u64 },
}

/// A namespace's tag (the first 32 bits of its xxh3).
pub fn ns_tag(namespace: &str) -> u32 {
    xxhash_rust::xxh3::xxh3_64(namespace.as_bytes()) as u32
}

/// Append the record of `object` (page `key`, id `id`) to `out`.
pub fn encode(out: &mut Vec<u8>, ns: u32, key: u64, id: u64, object: &[u8]) {
    let start = out.len();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&ns.to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(object.len() as u32).to_le_bytes());
    let sum = checksum(&out[start..], object);
    out.extend_from_slice(&sum.to_le_bytes());
    out.extend_from_slice(object);
}

fn checksum(head: &[u8], object: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(head);
    h.update(object);
    h.digest()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The object in `value`, if `value` is the record of page `key` with id
/// `id` in namespace `ns`, whole.
pub fn decode(value: &[u8], ns: u32, key: u64, id: u64) -> Result<&[u8], RecordError> {
    if value.len() < HEADER {
        return Err(RecordError::Short { len: value.len() });
    }
    if &value[..4] != MAGIC {
        return Err(RecordError::Magic);
    }
    let found = u32_at(value, 4);
    if found != ns {
        return Err(RecordError::Namespace { found, want: ns });
    }
    let found = u64_at(value, 8);
    if found != key {
        return Err(RecordError::Key { found, want: key });
    }
    let found = u64_at(value, 16);
    if found != id {
        return Err(RecordError::Generation { found, want: id });
    }
    let said = u32_at(value, 24) as usize;
    let object = &value[HEADER..];
    if said != object.len() {
        return Err(RecordError::Length { said, held: object.len() });
    }
    let stored = u64_at(value, 28);
    let computed = checksum(&value[..28], object);
    if stored != computed {
        return Err(RecordError::Checksum { stored, computed });
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_record_reads_back_and_every_wrong_field_is_named() {
        let mut r = Vec::new();
        encode(&mut r, 7, 42, 0x1_0005, b"compressed bytes");
        assert_eq!(decode(&r, 7, 42, 0x1_0005).unwrap(), b"compressed bytes");
        assert_eq!(decode(&r, 8, 42, 0x1_0005), Err(RecordError::Namespace { found: 7, want: 8 }));
        assert_eq!(decode(&r, 7, 43, 0x1_0005), Err(RecordError::Key { found: 42, want: 43 }));
        assert_eq!(decode(&r, 7, 42, 0x2_0005), Err(RecordError::Generation { found: 0x1_0005, want: 0x2_0005 }));
        assert_eq!(decode(&r[..HEADER - 1], 7, 42, 0x1_0005), Err(RecordError::Short { len: HEADER - 1 }));
        assert!(matches!(decode(&r[..r.len() - 1], 7, 42, 0x1_0005), Err(RecordError::Length { .. })));
        let mut flipped = r.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(decode(&flipped, 7, 42, 0x1_0005), Err(RecordError::Checksum { .. })));
        assert_eq!(decode(b"not a record at all, but long enough to look", 7, 42, 1), Err(RecordError::Magic));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Any bytes at all: a refusal or the exact object, never a panic;
        /// and any one flipped bit of a real record is refused.
        #[test]
        fn decode_never_panics_and_catches_any_flipped_bit(junk in proptest::collection::vec(any::<u8>(), 0..200),
                                                          obj in proptest::collection::vec(any::<u8>(), 0..300),
                                                          bit in any::<usize>()) {
            let _ = decode(&junk, 1, 2, 3);
            let mut r = Vec::new();
            encode(&mut r, 1, 2, 3, &obj);
            prop_assert_eq!(decode(&r, 1, 2, 3).unwrap(), &obj[..]);
            let b = bit % (r.len() * 8);
            r[b / 8] ^= 1 << (b % 8);
            prop_assert!(decode(&r, 1, 2, 3).is_err());
        }
    }
}
