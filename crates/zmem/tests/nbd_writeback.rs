//! `zmem serve --backing FILE --max-pool SIZE`: the writeback tier under the
//! block device, driven by a real client (nbdcopy), plus `zmem writeback`
//! and the writeback lines of `zmem stat`. No root needed.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

#[test]
fn block_device_over_a_small_pool_writes_back_and_reads_back() {
    require_tools!("nbdcopy", "sha256sum");
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    let s = ZmemServer::start("48M", &["--max-pool", "4M", "--backing", backing.to_str().unwrap()]);
    let src = fill_device(&s, dir.path(), 48 << 20, 7);

    let st = s.stats();
    let g = |k: &str| st["stats"][k].as_u64().unwrap_or_else(|| panic!("no stats.{k}: {st}"));
    assert!(g("written_back_pages") > 1000, "a 4 MiB pool must write back most of 48 MiB: {st}");
    assert!(g("pool_pages") * 4096 <= (4 << 20) + (256 << 10), "pool over max_pool: {st}");
    assert_eq!(g("bd_writes"), g("written_back_pages"));
    assert!(g("backing_bytes_written") < g("written_back_pages") * 4096, "writeback is compressed: {st}");
    assert!(std::fs::metadata(&backing).unwrap().len() > 0);

    // The whole device reads back exactly, most of it from the file.
    assert_reads_back(&s, &src, dir.path());
    assert!(s.stat_u64("bd_reads") > 0);

    // zramctl-like output names the tier.
    let text = run_ok(Command::new(ZMEM).arg("stat").arg("--control").arg(&s.control), Duration::from_secs(10));
    assert!(text.contains("bd_stat:") && text.contains("written back"), "{text}");
    assert!(text.contains("max_pool:"), "{text}");
}

#[test]
fn explicit_writeback_through_the_control_socket() {
    require_tools!("nbdcopy", "sha256sum");
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    let s = ZmemServer::start("16M", &["--backing", backing.to_str().unwrap()]);
    let src = dir.path().join("src.img");
    let back = dir.path().join("back.img");
    std::fs::write(&src, test_data(16 << 20, 8)).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(s.uri()), T);
    let wb = |args: &[&str]| run_ok(Command::new(ZMEM).arg("writeback").arg("--control").arg(&s.control).args(args), T);
    assert!(wb(&["--idle", "3600"]).starts_with("0 pages"), "nothing is an hour old");
    let out = wb(&["--all", "--limit", "100"]);
    assert!(out.starts_with("100 pages"), "{out}");
    assert_eq!(s.stat_u64("bd_count"), 100);
    let out = wb(&["--idle", "0"]);
    let n: u64 = out.split_whitespace().next().unwrap().parse().unwrap();
    assert!(n > 1000, "{out}");
    run_ok(Command::new("nbdcopy").arg(s.uri()).arg(&back), T);
    assert_eq!(sha256(&src), sha256(&back), "data read back differs");

    // Bad requests are clear errors, not crashes.
    let out = run_timeout(Command::new(ZMEM).arg("writeback").arg("--control").arg(&s.control), Duration::from_secs(10));
    assert!(!out.status.success(), "a mode is required");
    let st = s.stats();
    assert!(st["stats"]["mem_used_total"].as_u64().unwrap() > 0, "server still answers");
}

#[test]
fn writeback_without_a_backing_file_is_a_clear_error() {
    let s = ZmemServer::start("16M", &[]);
    let out = run_timeout(Command::new(ZMEM).args(["writeback", "--all", "--control"]).arg(&s.control), Duration::from_secs(10));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no backing store"), "{err}");
}
