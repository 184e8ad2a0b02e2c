//! The kernel yardstick for real (root, `/dev/zram0`): the same pages
//! through kernel zram, its `mm_stat` read back, and the device reset
//! afterwards, also when the run fails. The tests take turns at the machine
//! (`zmem_testkit::machine`): `/dev/zram0` is its one.

use std::path::Path;

use zmem_bench::kernel_zram::run;
use zmem_bench::PAGE_SIZE;
use zmem_testkit::ci::effective_uid;
use zmem_testkit::XorShift;

/// A zram attribute, trimmed.
fn attr(dev: &str, name: &str) -> String {
    std::fs::read_to_string(Path::new("/sys/block").join(dev).join(name)).unwrap().trim().to_string()
}

/// The test's turn at `/dev/zram0`, or `None` after a skip where the
/// machine has none to give.
fn zram_turn(test: &str) -> Option<zmem_testkit::machine::Turn> {
    let why = if effective_uid() != Some(0) {
        "not root"
    } else if !Path::new("/sys/block/zram0").exists() {
        "/sys/block/zram0 absent"
    } else {
        return Some(zmem_testkit::machine::turn());
    };
    zmem_testkit::ci::skip(&format!("{test}: {why}"));
    None
}

/// ~16 MiB: 4 MiB zeros, 4 MiB text, 4 MiB pseudo-random, 4 MiB mixed pages.
fn mixed_data() -> Vec<u8> {
    let mut v = Vec::with_capacity(16 << 20);
    v.resize(4 << 20, 0u8);
    let text = b"The quick brown fox jumps over the lazy dog; zram stores compressed pages in RAM. ";
    while v.len() < (8 << 20) {
        let n = text.len().min((8 << 20) - v.len());
        v.extend_from_slice(&text[..n]);
    }
    let mut r = XorShift::from_state(0x9E3779B97F4A7C15);
    while v.len() < (12 << 20) {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    for p in 0..(4 << 20) / PAGE_SIZE {
        let mut page = [0u8; PAGE_SIZE];
        match p % 3 {
            0 => page.fill(0xAB),
            1 => {
                for (i, b) in page.iter_mut().enumerate() {
                    *b = (i * p % 251) as u8;
                }
            }
            _ => page[..text.len()].copy_from_slice(text),
        }
        v.extend_from_slice(&page);
    }
    assert_eq!(v.len(), 16 << 20);
    v
}

#[test]
fn kernel_zram_round_trip() {
    let Some(_turn) = zram_turn("kernel_zram_round_trip") else { return };
    let data = mixed_data();
    let res = run(&data, "lz4").unwrap_or_else(|e| panic!("kernel zram run failed: {e}"));
    eprintln!("{}", serde_json::to_string_pretty(&res).unwrap());
    assert_eq!(res.algorithm, "lz4");
    // orig_data_size = pages_stored * 4K, same-filled pages included.
    assert_eq!(res.orig_bytes, data.len() as u64);
    assert!(res.same_pages > 0);
    assert!(res.same_pages >= 1024, "zero pages: {}", res.same_pages);
    assert!(res.mem_used_bytes > 0);
    assert!(res.compr_bytes > 0 && res.compr_bytes < data.len() as u64);
    assert!(res.huge_pages >= 1000, "random pages should be huge: {}", res.huge_pages);
    assert!(res.write_mbps > 0.0 && res.read_mbps > 0.0);
    // Device reset afterwards.
    assert_eq!(attr(&res.device, "disksize"), "0");
    assert_eq!(attr(&res.device, "initstate"), "0");
}

#[test]
fn kernel_zram_unknown_algorithm_resets() {
    let Some(_turn) = zram_turn("kernel_zram_unknown_algorithm_resets") else { return };
    let e = run(&vec![1u8; PAGE_SIZE * 4], "no-such-algo").unwrap_err();
    assert!(e.reason.contains("does not support"), "{e}");
    assert_eq!(attr("zram0", "disksize"), "0");
}
