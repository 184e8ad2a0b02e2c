mod common;

use common::*;
use proptest::prelude::*;
use zmem_lzo::{compress, compress_bound, decompress, LzoError};

fn roundtrip(data: &[u8]) {
    let c = our_compress(data);
    assert!(c.len() <= compress_bound(data.len()));
    let d = our_decompress(&c, data.len()).expect("decompress our own output");
    assert_eq!(d.len(), data.len());
    assert!(d == data, "roundtrip mismatch");
}

#[test]
fn empty_input_is_just_the_end_marker() {
    assert_eq!(our_compress(&[]), vec![0x11, 0, 0]);
    assert_eq!(our_decompress(&[0x11, 0, 0], 0).unwrap(), Vec::<u8>::new());
}

#[test]
fn roundtrip_all_kinds_and_edge_sizes() {
    for (i, &len) in SIZES.iter().enumerate() {
        for (kind, data) in all_kinds(len, i as u64 + 1) {
            let c = our_compress(&data);
            let d = our_decompress(&c, len).unwrap_or_else(|e| panic!("{kind} {len}: {e:?}"));
            assert!(d == data, "{kind} len {len} mismatch");
        }
    }
}

#[test]
fn compressible_data_actually_compresses() {
    let z = our_compress(&[0u8; 4096]);
    assert!(z.len() < 40, "4 KiB of zeros -> {} bytes", z.len());
    let t = text(4096, 7);
    let c = our_compress(&t);
    assert!(c.len() < t.len() / 2, "text -> {} bytes", c.len());
    let r = random(4096, 7);
    let c = our_compress(&r);
    assert!(c.len() <= compress_bound(4096));
}

#[test]
fn long_distance_matches_m4() {
    // A random block, compressible filler, then the block again at a distance
    // that needs M3 (<= 16 KiB) or M4 (> 16 KiB), or is beyond the 48 KiB
    // window (must fall back to literals).
    for gap in [16_383usize, 16_384, 16_385, 20_000, 40_000, 49_150, 49_151, 49_152, 60_000] {
        let head = random(4000, gap as u64);
        let mut base = head.clone();
        base.extend_from_slice(&text(gap - 4000, 3));
        let mut v = base.clone();
        v.extend_from_slice(&head);
        v.extend_from_slice(&random(100, 1));
        roundtrip(&v);
        let with = our_compress(&v).len();
        let without = our_compress(&base).len();
        if gap <= 49_000 {
            assert!(with < without + 1000, "gap {gap}: no long match used ({with} vs {without})");
        }
    }
}

#[test]
fn real_pages_roundtrip() {
    let data = real_data(4 << 20);
    if data.is_empty() {
        zmem_testkit::ci::skip("no real data (files under /usr/lib) available");
        return;
    }
    let mut total_c = 0;
    for page in data.chunks(4096) {
        let c = our_compress(page);
        total_c += c.len();
        let d = our_decompress(&c, page.len()).unwrap();
        assert!(d == page);
    }
    eprintln!("real pages: {} -> {} bytes", data.len(), total_c);
    // Whole buffer at once (multiple 48 KiB windows).
    roundtrip(&data[..data.len().min(1 << 20)]);
}

#[test]
fn compress_exact_dst_and_too_small_dst() {
    for (i, &len) in [0usize, 1, 3, 4, 17, 100, 4096, 70_000].iter().enumerate() {
        for (kind, data) in all_kinds(len, 100 + i as u64) {
            let c = our_compress(&data);
            let mut dst = vec![0u8; c.len()];
            assert_eq!(compress(&data, &mut dst), Ok(c.len()), "{kind} {len}: exact fit");
            assert_eq!(dst, c);
            // Every smaller destination must fail cleanly.
            let step = (c.len() / 97).max(1);
            let mut sz = 0;
            while sz < c.len() {
                let mut small = vec![0u8; sz];
                assert_eq!(compress(&data, &mut small), Err(LzoError::OutputOverrun), "{kind} {len}: dst {sz} of {}", c.len());
                sz += step;
            }
            let mut small = vec![0u8; c.len() - 1];
            assert_eq!(compress(&data, &mut small), Err(LzoError::OutputOverrun));
        }
    }
}

#[test]
fn decompress_into_larger_dst() {
    let data = text(5000, 3);
    let c = our_compress(&data);
    let mut out = vec![0xAAu8; 9000];
    let n = decompress(&c, &mut out).unwrap();
    assert_eq!(n, 5000);
    assert_eq!(&out[..n], &data[..]);
}

fn data_strategy() -> impl Strategy<Value = Vec<u8>> {
    let size = prop_oneof![prop::sample::select(SIZES.to_vec()), 0usize..300, 0usize..10_000,];
    (size, any::<u64>(), 0u8..5).prop_map(|(len, seed, kind)| match kind {
        0 => vec![0u8; len],
        1 => random(len, seed),
        2 => text(len, seed),
        3 => repetitive(len, seed),
        _ => {
            // small alphabet random: many short matches (M2 with trailing literals)
            random(len, seed).into_iter().map(|b| b & 3).collect()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn prop_roundtrip(data in data_strategy()) {
        let c = our_compress(&data);
        prop_assert!(c.len() <= compress_bound(data.len()));
        let d = our_decompress(&c, data.len()).unwrap();
        prop_assert_eq!(d, data);
    }

    #[test]
    fn prop_roundtrip_arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..3000)) {
        let c = our_compress(&data);
        let d = our_decompress(&c, data.len()).unwrap();
        prop_assert_eq!(d, data);
    }
}
