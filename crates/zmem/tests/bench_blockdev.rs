//! `zmem bench blockdev` runs end to end (numbers are printed, never judged).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn bench_blockdev_smoke() {
    require_tools!("fio");
    let out = run_ok(
        Command::new(ZMEM).args([
            "bench",
            "blockdev",
            "--size",
            "16M",
            "--runtime",
            "1",
            "--no-nbdkit",
            "--no-zram",
            "--json",
        ]),
        Duration::from_secs(120),
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let t = &v["targets"][0];
    assert_eq!(t["target"], "zmem");
    let jobs: Vec<&str> = t["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job"].as_str().unwrap())
        .collect();
    assert_eq!(jobs, ["fill", "randread", "randwrite", "seqread"]);
    // It ran and measured something; how fast is not a test's business.
    assert!(
        t["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["iops"].as_f64().unwrap() > 0.0),
        "{out}"
    );
    assert!(t["mem_used_bytes"].as_u64().unwrap() > 0);
    assert_eq!(v["targets"][1]["skipped"], "--no-nbdkit");
}
