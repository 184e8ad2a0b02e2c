//! Record ids and the cluster keys they name.
//!
//! A record id is `generation << 14 | slot`: the generation is the store's
//! counter (never reused within a run, so a page written back twice has
//! two names), the slot is the cluster hash slot the store chose for the
//! record's batch. The key is `zm:NS:{TAG}:GEN` where `TAG` is a short
//! string whose CRC16 falls in that slot: Redis Cluster hashes only the
//! text between the first braces, so the store, not the hash of the whole
//! key, decides which node holds a record, and a batch can go to one
//! healthy master as one pipeline. The key names the slot and the
//! generation, so a read needs nothing but the id.

use std::sync::OnceLock;

/// Cluster hash slots.
pub const SLOTS: u16 = 16384;
const SLOT_BITS: u32 = 14;

/// The largest generation an id can carry.
pub const MAX_GEN: u64 = u64::MAX >> SLOT_BITS;

/// CRC16/XMODEM, Redis Cluster's key hash.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The slot of `key`, by the cluster's rule (the first non-empty `{…}`).
pub fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter().position(|&c| c == b'}').filter(|&close| close > 0).map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % SLOTS
}

/// For every slot, the shortest tag (in base 36) that hashes to it.
fn tags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut t: Vec<Option<String>> = vec![None; SLOTS as usize];
        let mut missing = SLOTS as usize;
        let mut i: u64 = 0;
        while missing > 0 {
            let s = base36(i);
            let slot = (crc16(s.as_bytes()) % SLOTS) as usize;
            if t[slot].is_none() {
                t[slot] = Some(s);
                missing -= 1;
            }
            i += 1;
        }
        t.into_iter().flatten().collect()
    })
}

fn base36(mut i: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut s = Vec::new();
    loop {
        s.push(DIGITS[(i % 36) as usize]);
        i /= 36;
        if i == 0 {
            break;
        }
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}

/// The id of generation `generation` in `slot`.
pub fn id(generation: u64, slot: u16) -> u64 {
    (generation << SLOT_BITS) | (slot % SLOTS) as u64
}

/// The slot and generation of `id`.
pub fn split(id: u64) -> (u16, u64) {
    ((id & (SLOTS as u64 - 1)) as u16, id >> SLOT_BITS)
}

/// The cluster key of record `id` in namespace `ns`.
pub fn key(ns: &str, id: u64) -> String {
    let (slot, generation) = split(id);
    format!("zm:{ns}:{{{}}}:{generation:x}", tags()[slot as usize])
}

/// The record id a key of namespace `ns` names (as [`key`] writes it);
/// None for anything else.
pub fn parse(ns: &str, k: &str) -> Option<u64> {
    let rest = k.strip_prefix("zm:")?.strip_prefix(ns)?.strip_prefix(":{")?;
    let (tag, generation) = rest.split_once("}:")?;
    let generation = u64::from_str_radix(generation, 16).ok().filter(|g| (1..=MAX_GEN).contains(g))?;
    let slot = crc16(tag.as_bytes()) % SLOTS;
    (tags()[slot as usize] == tag).then(|| id(generation, slot))
}

/// A `SCAN … MATCH` pattern for every record key of `ns` (the namespace's
/// glob characters escaped).
pub fn scan_pattern(ns: &str) -> String {
    let mut p = String::from("zm:");
    for c in ns.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push_str(":{*");
    p
}

/// The namespace's ownership key (who serves it now).
pub fn owner_key(ns: &str) -> String {
    format!("zm:{ns}:owner")
}

/// Whether `ns` can name a namespace: 1..=200 printable ASCII characters
/// without braces (a brace would move the hash tag) or spaces.
pub fn valid_namespace(ns: &str) -> bool {
    !ns.is_empty() && ns.len() <= 200 && ns.bytes().all(|b| b.is_ascii_graphic() && b != b'{' && b != b'}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_follow_the_cluster_spec() {
        // The Redis Cluster specification's test vector.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        // The redis crate's own routing agrees, tags included.
        use redis::cluster_routing::{Route, SlotAddr};
        for k in ["foo", "user:{1000}:a", "{}x", "a{b}c{d}", "zm:dev:{7}:1f"] {
            assert_eq!(Route::with_key(k, SlotAddr::Master), Route::new(slot_of(k.as_bytes()), SlotAddr::Master), "{k}");
        }
    }

    #[test]
    fn every_slot_has_a_tag_and_a_key_lands_in_its_slot() {
        assert_eq!(tags().len(), SLOTS as usize);
        for slot in [0u16, 1, 5000, 16383] {
            for generation in [1u64, 77, MAX_GEN] {
                let i = id(generation, slot);
                assert_eq!(split(i), (slot, generation));
                assert_eq!(slot_of(key("dev0", i).as_bytes()), slot);
                assert_eq!(parse("dev0", &key("dev0", i)), Some(i));
                assert_eq!(parse("dev", &key("dev0", i)), None, "another namespace's key");
            }
        }
    }

    #[test]
    fn namespaces_and_patterns() {
        assert!(valid_namespace("host1:zmem0"));
        assert!(!valid_namespace(""));
        assert!(!valid_namespace("a{b"));
        assert!(!valid_namespace("a b"));
        assert_eq!(scan_pattern("a*b"), "zm:a\\*b:{*");
        for other in ["zm:x:owner", "zm:x:{0}:", "zm:x:{0}:0", "zm:x:{0}:zz", "zm:x:{0:1", "zm:x:{notatag}:1", "zm:x:{0}:1:2"] {
            assert_eq!(parse("x", other), None, "{other}");
        }
        assert!(!owner_key("x").contains('{'));
    }
}
