//! `zmem bench blockdev` runs end to end (numbers are printed, never judged).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn bench_blockdev_smoke() {
    require_tools!("fio", "nbdcopy");
    // A small fill source (the default is a 700 MB tar of /usr/lib): text
    // with some structure, so it compresses like real data, partly.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.bin");
    let mut d = Vec::with_capacity(17 << 20);
    let mut i = 0u64;
    while d.len() < (17 << 20) {
        d.extend_from_slice(format!("line {i} of the fill data, {:x}\n", i * 2654435761).as_bytes());
        i += 1;
    }
    std::fs::write(&data, &d).unwrap();
    let out = run_ok(
        Command::new(ZMEM).args(["bench", "blockdev", "--size", "16M", "--runtime", "1", "--no-nbdkit", "--no-zram", "--json", "--data"]).arg(&data),
        Duration::from_secs(120),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let t = &v["targets"][0];
    assert_eq!(t["target"], "zmem");
    ran_every_job(t, &out);
    assert_eq!(v["targets"][1]["skipped"], "--no-nbdkit");
    assert_eq!((v["targets"][2]["target"].as_str(), v["targets"][2]["skipped"].as_str()), (Some("nbdkit-raw"), Some("--no-nbdkit")));
    assert_eq!(v["targets"][3]["target"], "zram");
    // The whole device was filled from --data; randwrite's compressibility
    // was measured on it.
    assert_eq!(v["fill_bytes"], 16 << 20);
    assert_eq!(v["data"], data.to_str().unwrap());
    let pct = v["compress_percentage"].as_u64().unwrap();
    assert!(pct > 0 && pct < 100, "{out}");
    assert!(v["ratios"]["zmem_vs_nbdkit"].is_null());
    assert!(v["ratios"]["zmem_vs_nbdkit_raw"].is_null());
    // As root, the swap frontend's device (FUSE file + loop) too, and it
    // left no loop device and no mount behind.
    let fuse = &v["targets"][4];
    assert_eq!(fuse["target"], "zmem-fuse");
    assert_eq!(v["targets"].as_array().map(Vec::len), Some(5), "{out}");
    if is_root() {
        assert!(fuse["skipped"].is_null(), "{out}");
        ran_every_job(fuse, &out);
    } else {
        assert_eq!(fuse["skipped"], "needs root");
    }
    if is_root() {
        let loops = run_ok(Command::new("losetup").arg("-a"), Duration::from_secs(10));
        assert!(!loops.contains("zmem-bench-"), "a loop device is left: {loops}");
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        assert!(!mounts.contains("zmem-bench-"), "a mount is left: {mounts}");
    }
}

/// Every job ran on target `t` and measured something (how fast is not a
/// test's business), and the target reported its memory.
fn ran_every_job(t: &serde_json::Value, out: &str) {
    let jobs: Vec<&str> = t["jobs"].as_array().unwrap().iter().map(|j| j["job"].as_str().unwrap()).collect();
    assert_eq!(jobs, ["fill", "randread", "read-qd1", "randwrite", "seqread"], "{out}");
    for j in t["jobs"].as_array().unwrap() {
        assert!(j["iops"].as_f64().unwrap() > 0.0 && j["mean_us"].as_f64().unwrap() > 0.0, "{out}");
        // The server's CPU per request, for every job but the fill.
        assert_eq!(j["server_us_per_io"].is_number(), j["job"] != "fill", "{out}");
    }
    assert!(t["mem_used_bytes"].as_u64().unwrap() > 0, "{out}");
}
