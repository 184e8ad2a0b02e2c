//! `zmem bench cache` end to end, as root, at a small size: both runs
//! complete, the report shows the cache doing its job, and the machine is
//! as it was afterwards (no loop device, mount, cgroup or throttle left).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{is_root, run_ok, ZMEM};

/// What the bench changes: it must be the same after it (loop devices and
/// mounts: its own, under `workdir`; other tests may attach theirs).
fn machine(workdir: &Path) -> String {
    let mut s = String::new();
    for f in ["read_iops_device", "write_iops_device", "read_bps_device", "write_bps_device"] {
        s += &std::fs::read_to_string(format!("/sys/fs/cgroup/blkio/blkio.throttle.{f}")).unwrap_or_default();
    }
    s += &format!("loops={:?}", common::loops_under(workdir));
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    s += &mounts.lines().filter(|l| l.contains(workdir.to_str().unwrap())).collect::<Vec<_>>().join("\n");
    s += &format!("cgroup={} workdir={}", Path::new("/sys/fs/cgroup/memory/zmem-bench-cache").exists(), workdir.exists());
    s
}

#[test]
fn bench_cache_reports_both_runs_and_leaves_nothing_behind() {
    if !is_root() {
        skip!("needs root (loop devices, mounts, cgroups, blkio)");
    }
    for t in ["fio", "nbdfuse", "losetup", "mkfs.ext4"] {
        if !common::have(t) {
            skip!("`{t}` is not installed (scripts/setup.sh installs it)");
        }
    }
    // The bench throttles the root blkio cgroup.
    let _turn = zmem_testkit::machine::turn();
    for frontend in ["fuse", "nbd"] {
        one_run(frontend);
    }
}

fn one_run(frontend: &str) {
    let workdir = Path::new("/var/tmp/zmem-test-bench-cache");
    let before = machine(workdir);
    let out = run_ok(
        Command::new(ZMEM)
            .args([
                "bench",
                "cache",
                "--budget",
                "96M",
                "--data-bytes",
                "96M",
                "--warm-passes",
                "1",
                "--random-secs",
                "2",
                "--json",
                "--frontend",
                frontend,
                "--workdir",
            ])
            .arg(workdir),
        Duration::from_secs(600),
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(v["frontend"], frontend);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!((runs[0]["target"].as_str(), runs[1]["target"].as_str()), (Some("direct"), Some("zmem")));
    for r in runs {
        let phases = r["phases"].as_array().unwrap();
        let names: Vec<_> = phases.iter().map(|p| p["phase"].as_str().unwrap()).collect();
        assert_eq!(names, ["seq cold", "seq warm", "random"]);
        assert!(phases.iter().all(|p| p["mb_per_s"].as_f64().unwrap() > 0.0), "{r}");
        // The cold pass reads the data set (96 MiB) from the origin.
        assert!(phases[0]["origin"]["read_bytes"].as_u64().unwrap() > 32 << 20, "{r}");
    }
    let z = &runs[1]["zmem"];
    assert!(z["hits"].as_u64().unwrap() > 0 && z["pool_pages"].as_u64().unwrap() > 0, "{z}");
    assert!(z["rss"].as_u64().unwrap() > 0 && z["budget"]["updates"].as_u64().unwrap() > 0, "the reader's limit followed zmem: {z}");
    assert!(v["data_bytes"].as_u64().unwrap() >= 96 << 20);
    assert!(v["ratios"]["origin_read_ops"].as_f64().unwrap() > 0.0);
    assert_eq!(machine(workdir), before, "the bench ({frontend}) left something behind");
}
