//! End-to-end: `zmem bench remote` on a small data set, against a Redis
//! cluster it starts itself, and (as root) the throttled disk. It checks
//! that every figure is measured, never how fast.

use std::process::Command;

fn zmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_zmem"))
}

#[test]
#[ignore = "slow: a whole benchmark against two clusters it starts; scripts/test.sh runs it (cargo test -- --ignored)"]
fn measures_both_cold_stores_and_reads_every_page_back() {
    if !zmem_testkit::redis_cluster::available() {
        zmem_testkit::ci::skip("redis-server and redis-cli are not installed (scripts/setup.sh installs them)");
        return;
    }
    let root = zmem_testkit::ci::effective_uid() == Some(0);
    // As root the bench throttles the root blkio cgroup, the machine's one.
    let _turn = root.then(zmem_testkit::machine::turn);
    let scratch = tempfile::Builder::new().prefix("zmem-bench-remote-").tempdir_in("/var/tmp").unwrap();
    let out = zmem()
        .args(["bench", "remote", "--max-bytes", "24M", "--samples", "300", "--json", "--scratch"])
        .arg(scratch.path())
        .args(if root { &[][..] } else { &["--no-disk"][..] })
        .output()
        .unwrap();
    assert!(out.status.success(), "zmem bench remote failed: {}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json prints one JSON object");
    let systems = r["systems"].as_array().unwrap();
    let names: Vec<&str> = systems.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, if root { vec!["disk", "cluster", "cluster-tls"] } else { vec!["cluster", "cluster-tls"] }, "{r}");
    let pages = r["pages"].as_u64().unwrap();
    for s in systems {
        let f = |k: &str| s[k].as_f64().unwrap_or_else(|| panic!("no {k}: {s}"));
        // A pool of 1/8 of the data writes nearly all of it back.
        assert!(f("written_back_pages") as u64 > pages / 2, "{s}");
        for k in ["store_mbps", "writeback_mbps", "load_mbps", "read_p50_us", "read_mean_us"] {
            assert!(f(k) > 0.0, "{k}: {s}");
        }
        assert!(f("read_p99_us") >= f("read_p50_us") && f("read_max_us") >= f("read_p99_us"), "{s}");
        // Compressed: less than a page per page, more than the header.
        assert!(f("bytes_per_page") > 36.0 && f("bytes_per_page") < 4096.0, "{s}");
        assert_eq!(f("failed_writebacks"), 0.0, "{s}");
    }
    let cluster = systems.iter().find(|s| s["name"] == "cluster").unwrap();
    assert!(cluster["replication_bytes_per_page"].as_f64().is_some_and(|b| b > 36.0), "the replicas got the records: {cluster}");
    assert!(std::fs::read_dir(scratch.path()).unwrap().next().is_none(), "the disk's image and mount point are removed");
}
