//! A real filesystem on `zmem serve`, through the kernel (root only):
//! nbdfuse presents the export as a file, a loop device turns it into a
//! block device, ext4 goes on it. Copy a tree, delete part of it, fstrim
//! (the pool must shrink), unmount, fsck, remount, verify every checksum.
//!
//! Everything set up is torn down by guards, in reverse order, even when
//! an assertion fails.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(120);

#[test]
fn ext4_on_nbdfuse_loop_copy_trim_fsck_remount() {
    if !is_root() {
        skip!("needs root (loop devices, mount)");
    }
    require_tools!("nbdfuse", "losetup", "mkfs.ext4", "e2fsck", "fstrim", "mount", "umount", "sha256sum");
    if !Path::new("/dev/fuse").exists() {
        skip!("/dev/fuse is missing (no FUSE in this kernel)");
    }
    let server = ZmemServer::start("256M", &["--compressor", "lz4"]);
    let work = tempfile::Builder::new().prefix("zmem-fs-").tempdir().unwrap();
    let src = work.path().join("src");
    make_tree(&src);
    let want = checksums(&src);

    let fuse = Fuse::mount(&work.path().join("fuse"), &server.socket);
    let lo = Loop::attach(&fuse.file());
    run_ok(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", &lo.dev]), T);
    let mnt = work.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let m = || run_ok(Command::new("mount").arg(&lo.dev).arg(&mnt), T);
    m();
    let umount = Undo::new(&["umount", mnt.to_str().unwrap()]);

    run_ok(Command::new("cp").arg("-a").arg(&src).arg(mnt.join("tree")), T);
    run_ok(&mut Command::new("sync"), T);
    assert_eq!(checksums(&mnt.join("tree")), want, "copied tree differs");
    let full = server.stats()["stats"].clone();

    // Delete about half the data, fstrim: the pool must give memory back.
    for d in 0..3 {
        std::fs::remove_dir_all(mnt.join("tree").join(format!("d{d}"))).unwrap();
        std::fs::remove_dir_all(src.join(format!("d{d}"))).unwrap();
    }
    run_ok(&mut Command::new("sync"), T);
    let trimmed = run_ok(Command::new("fstrim").arg("-v").arg(&mnt), T);
    let after = server.stats()["stats"].clone();
    let g = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    eprintln!(
        "before trim: orig {} mem {}; after: orig {} mem {}; fstrim: {}",
        g(&full, "orig_data_size"),
        g(&full, "mem_used_total"),
        g(&after, "orig_data_size"),
        g(&after, "mem_used_total"),
        trimmed.trim()
    );
    assert!(g(&after, "orig_data_size") < g(&full, "orig_data_size") * 3 / 4, "trim must drop pages");
    assert!(g(&after, "mem_used_total") < g(&full, "mem_used_total"), "trim must free memory");
    let want = checksums(&src);
    assert_eq!(checksums(&mnt.join("tree")), want);

    // Unmount, fsck (read-only check, must be clean), remount, verify.
    umount.now();
    run_ok(Command::new("e2fsck").args(["-f", "-n", &lo.dev]), T);
    m();
    let umount = Undo::new(&["umount", mnt.to_str().unwrap()]);
    assert_eq!(checksums(&mnt.join("tree")), want, "tree differs after remount");
    umount.now();
    drop(lo);
    drop(fuse);
    assert!(!server.log_text().contains("dropping this connection"), "{}", server.log_text());
}
