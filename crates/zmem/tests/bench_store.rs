//! End-to-end: `zmem bench store` on data it makes itself.

use std::path::Path;
use std::process::Command;

use zmem_testkit::XorShift;

fn zmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_zmem"))
}

/// A small mixed data file: text, zeros, random bytes, a repeated block.
fn make_data(dir: &Path) -> std::path::PathBuf {
    let mut data = Vec::new();
    for i in 0..600 {
        data.extend_from_slice(format!("line {i}: the quick brown fox jumps over the lazy dog\n").as_bytes());
    }
    data.resize(data.len().next_multiple_of(4096), b'.');
    data.extend(std::iter::repeat_n(0u8, 64 * 1024));
    let mut random = vec![0u8; 32 * 1024];
    XorShift::from_state(0x1234_5678_9abc_def1).fill(&mut random);
    data.extend_from_slice(&random);
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    for _ in 0..8 {
        data.extend_from_slice(&block);
    }
    data.extend_from_slice(b"tail that is not a whole page");
    let p = dir.join("data.bin");
    std::fs::write(&p, &data).unwrap();
    p
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = zmem().args(["bench", "store"]).args(args).output().unwrap();
    assert!(out.status.success(), "zmem {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("--json prints one JSON object")
}

#[test]
fn reports_every_figure_and_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let f = make_data(dir.path());
    let len = std::fs::metadata(&f).unwrap().len();
    for comp in ["lz4", "zstd:3", "lzo"] {
        let v = run_json(&[f.to_str().unwrap(), "--json", "--no-kernel", "--repeat", "2", "--compressor", comp]);
        let pages = len.div_ceil(4096);
        assert_eq!(v["pages"], pages, "{comp}");
        assert_eq!(v["verified_pages"], pages);
        assert_eq!(v["orig_bytes"], pages * 4096);
        assert_eq!(v["same_pages"], 16, "64 KiB of zeros: {v}");
        assert_eq!(v["huge_pages"], 8, "32 KiB of random bytes: {v}");
        assert!(v["compr_bytes"].as_u64().unwrap() < pages * 4096);
        assert!(v["mem_used_bytes"].as_u64().unwrap() > 0);
        for k in ["store_mbps", "load_mbps", "raw_compress_mbps", "raw_decompress_mbps"] {
            assert!(v[k].as_f64().unwrap() > 0.0, "{k}");
        }
        assert!(v["kernel_zram"].is_null());
        assert!(v["kernel_zram_skipped"].as_str().unwrap().contains("--no-kernel"));
        let mm: Vec<u64> = v["mm_stat"].as_str().unwrap().split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(mm.len(), 9, "zram's nine fields");
        assert_eq!(mm[0], pages * 4096);
    }
}

#[test]
fn dedup_reports_shared_pages() {
    let dir = tempfile::tempdir().unwrap();
    let f = make_data(dir.path());
    let v = run_json(&[f.to_str().unwrap(), "--json", "--no-kernel", "--repeat", "1", "--dedup", "on", "--threads", "2"]);
    assert_eq!(v["dup_pages"], 7, "8 copies of one block: {v}");
    assert!(v["dup_data_size"].as_u64().unwrap() > 0);
    assert!(v["meta_data_size"].as_u64().unwrap() > 0);
    let off = run_json(&[f.to_str().unwrap(), "--json", "--no-kernel", "--repeat", "1"]);
    assert_eq!(off["dup_pages"], 0);
}

#[test]
fn reads_a_live_process() {
    let pid = std::process::id().to_string();
    let v = run_json(&["--pid", &pid, "--json", "--no-kernel", "--repeat", "1", "--max-bytes", "8M"]);
    assert!(v["pages"].as_u64().unwrap() > 0);
}

#[test]
fn bad_flags_and_inputs_are_clear_errors() {
    let cases: [(&[&str], &str); 5] = [
        (&["/nonexistent/zmem-input", "--no-kernel"], "/nonexistent/zmem-input"),
        (&["--compressor", "brotli", "/etc/hostname"], "unknown compressor"),
        (&["--threads", "0", "/etc/hostname"], "--threads"),
        (&["--dedup", "maybe", "/etc/hostname"], "expected on or off"),
        (&["--max-bytes", "12Q", "/etc/hostname"], "bad size unit"),
    ];
    for (args, want) in cases {
        let out = zmem().args(["bench", "store"]).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: stderr {err:?} lacks {want:?}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

/// As root with kernel zram present, the same pages go through /dev/zram0.
#[test]
fn compares_with_kernel_zram_when_root() {
    let root = zmem_testkit::ci::effective_uid() == Some(0);
    if !root || !Path::new("/sys/block/zram0").exists() {
        zmem_testkit::ci::skip("the kernel zram comparison needs root and /sys/block/zram0");
        return;
    }
    // /dev/zram0 is the machine's one.
    let _turn = zmem_testkit::machine::turn();
    let dir = tempfile::tempdir().unwrap();
    let f = make_data(dir.path());
    let v = run_json(&[f.to_str().unwrap(), "--json", "--repeat", "1"]);
    let k = &v["kernel_zram"];
    assert!(k.is_object(), "kernel_zram missing: {}", v["kernel_zram_skipped"]);
    assert_eq!(k["algorithm"], "lz4");
    assert_eq!(k["orig_bytes"], v["orig_bytes"]);
    assert_eq!(k["same_pages"], v["same_pages"]);
    assert!(k["mem_used_bytes"].as_u64().unwrap() > 0);
    assert!(v["mem_used_vs_kernel_zram"].as_f64().unwrap() > 0.0);
    // zram was reset afterwards.
    let disksize = std::fs::read_to_string("/sys/block/zram0/disksize").unwrap();
    assert_eq!(disksize.trim(), "0");
}
