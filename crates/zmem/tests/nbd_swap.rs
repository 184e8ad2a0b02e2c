//! Swap on `zmem serve` (root only): nbdfuse + loop device + mkswap/swapon,
//! then a process in a memory cgroup (v1) limited to 64 MiB touches 160 MiB
//! and verifies every byte; what did not fit went to swap, i.e. into the
//! pool. The server and nbdfuse stay outside the cgroup, so reclaim inside
//! it cannot wait on itself.
//!
//! Guards undo everything (cgroup, swapon, loop device, FUSE mount, server)
//! in reverse order even when an assertion fails.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);
#[test]
fn swap_in_memory_cgroup() {
    if !is_root() {
        skip!("needs root (loop devices, swapon, cgroups)");
    }
    require_tools!("nbdfuse", "losetup", "mkswap", "swapon", "swapoff", "python3");
    if !Path::new("/dev/fuse").exists() {
        skip!("/dev/fuse is missing (no FUSE in this kernel)");
    }
    if !Path::new(CGROUP_V1).join("memory.limit_in_bytes").exists() {
        skip!("memory cgroup v1 is not mounted at {CGROUP_V1}");
    }
    // The machine's swap areas: other tests' swap would take part of the
    // workload's pages. Dropped last, after every guard below.
    let _turn = zmem_testkit::machine::turn();
    let server = ZmemServer::start("512M", &["--compressor", "lz4"]);
    let work = tempfile::Builder::new().prefix("zmem-swap-").tempdir().unwrap();
    let fuse = Fuse::mount(&work.path().join("fuse"), &server.socket);
    let lo = Loop::attach(&fuse.file());
    run_ok(Command::new("mkswap").arg(&lo.dev), T);
    run_ok(Command::new("swapon").args(["-p", "32767", &lo.dev]), T);
    let swap = Undo::new(&["swapoff", &lo.dev]);
    let stored_before = server.stat_u64("orig_data_size") / 4096;

    let cg = Cgroup::create(&format!("zmem-test-{}", std::process::id()), 64 << 20);
    let script = work.path().join("w.py");
    std::fs::write(&script, WORKLOAD).unwrap();
    // At most 24 MiB more if the kernel's reclaim stalls (see
    // Cgroup::run_riding_stalls): still 72 MiB or more to swap.
    let (out, raised) = cg.python_ok_riding_stalls(&script, "", T, 24 << 20);
    assert_eq!(out.trim(), "OK", "workload output: {out}");
    // Swap slots are not discarded when the workload exits, so what was
    // swapped out is still in the pool.
    let swapped_pages = server.stat_u64("orig_data_size") / 4096 - stored_before;
    let max_usage = cg.get("memory.max_usage_in_bytes");
    eprintln!(
        "cgroup max usage {} MiB (limit 64 MiB, raised by {} MiB); pages stored through swap: {swapped_pages}; pool: {}",
        max_usage >> 20,
        raised >> 20,
        server.stats()["mm_stat"]
    );
    assert!(max_usage <= (64 << 20) + raised);
    assert!(swapped_pages >= 8192, "at least 32 MiB should have gone to swap, got {swapped_pages} pages");
    drop(cg);
    swap.now();
    drop(lo);
    drop(fuse);
    assert!(!server.log_text().contains("panicked"));
}
