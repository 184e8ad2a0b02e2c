//! `zmem recompress` and `zmem serve --recompress-idle`: zram's
//! recompression on a block device driven by a real client (nbdcopy). No
//! root needed.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use zmem_testkit::XorShift;

const T: Duration = Duration::from_secs(120);

/// Pages of bytes from a 64-symbol alphabet: lz4 finds nothing to match
/// (stored raw, zram's huge pages), zstd's entropy coder takes a quarter off.
fn six_bit_image(bytes: usize, seed: u64) -> Vec<u8> {
    let mut r = XorShift::from_state(seed | 1);
    (0..bytes).map(|_| b'0' + r.below(64) as u8).collect()
}

#[test]
fn recompress_through_the_control_socket() {
    require_tools!("nbdcopy", "sha256sum");
    let dir = tempfile::tempdir().unwrap();
    let s = ZmemServer::start("8M", &["--recomp-algo", "zstd:3"]);
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    std::fs::write(&src, six_bit_image(8 << 20, 3)).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(s.uri()), T);
    assert_eq!(s.stat_u64("huge_pages"), 2048, "lz4 leaves every page raw");
    let before = s.stat_u64("mem_used_total");
    let rc = |args: &[&str]| run_ok(Command::new(ZMEM).arg("recompress").arg("--control").arg(&s.control).args(args), T);
    assert!(rc(&["--idle", "1h"]).starts_with("0 pages"), "nothing is an hour old");
    let out = rc(&["--huge", "--limit", "100"]);
    assert!(out.starts_with("100 pages recompressed"), "{out}");
    let out = rc(&["--threshold", "4000", "--algo", "zstd:3"]);
    assert!(out.starts_with("1948 pages recompressed"), "{out}");
    assert_eq!(s.stat_u64("huge_pages"), 0);
    assert_eq!(s.stat_u64("recompressed_pages"), 2048);
    let after = s.stat_u64("mem_used_total");
    assert!(after * 10 < before * 9, "recompression freed memory: {before} -> {after}");
    run_ok(Command::new("nbdcopy").arg(s.uri()).arg(&back), T);
    assert_eq!(sha256(&src), sha256(&back), "data read back differs");
    let text = run_ok(Command::new(ZMEM).arg("stat").arg("--control").arg(&s.control), T);
    assert!(text.contains("recompress: 2048 pages rewritten smaller"), "{text}");

    // An algorithm the server was not given is a clear error.
    let out = run_timeout(Command::new(ZMEM).args(["recompress", "--algo", "zstd:19", "--control"]).arg(&s.control), T);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--recomp-algo zstd:19") && err.contains("zstd:3"), "{err}");
}

#[test]
fn serve_recompresses_idle_pages_in_the_background() {
    require_tools!("nbdcopy", "sha256sum");
    let dir = tempfile::tempdir().unwrap();
    let s = ZmemServer::start("8M", &["--recompress-idle", "0s", "--recompress-cpu", "50"]);
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    std::fs::write(&src, six_bit_image(8 << 20, 4)).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(s.uri()), T);
    let t = Instant::now();
    while s.stat_u64("recompressed_pages") < 2048 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.stat_u64("recompressed_pages"), 2048, "every page was idle and shrinks with zstd:9");
    run_ok(Command::new("nbdcopy").arg(s.uri()).arg(&back), T);
    assert_eq!(sha256(&src), sha256(&back), "data read back differs");
}

#[test]
fn bad_recompression_flags_are_refused() {
    for (args, says) in [
        (&["--recomp-algo", "brotli"][..], "brotli"),
        (&["--recomp-algo", "zstd:1", "--recomp-algo", "zstd:3", "--recomp-algo", "zstd:9", "--recomp-algo", "zstd:19"][..], "at most 3"),
        (&["--recompress-idle", "5x"][..], "bad duration"),
        (&["--recompress-cpu", "20"][..], "--recompress-idle"),
    ] {
        let out = run_timeout(Command::new(ZMEM).args(["serve", "--size", "1M", "--socket", "/nonexistent/zmem.sock"]).args(args), T);
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
