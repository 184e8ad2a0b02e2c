//! `zmem serve --origin`: the caching block device, with real origins and
//! real clients. NBD origins (another zmem; nbdkit with its error filter,
//! for an origin that fails) need no root; ext4 over a cached file needs
//! root and runs under CI.
//!
//! Everything set up is torn down by guards, in reverse order, even when
//! an assertion fails.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use zmem_export::Origin;
use zmem_nbd::NbdOrigin;

const T: Duration = Duration::from_secs(120);

/// A directory on a real disk (not tmpfs, which refuses O_DIRECT).
fn disk_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir_in("/var/tmp").unwrap()
}

/// The `origin` object of `zmem stat --json`.
fn origin_stats(s: &ZmemServer) -> serde_json::Value {
    s.stats()["origin"].clone()
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

#[test]
fn an_nbd_origin_is_cached_and_written_through() {
    require_tools!("nbdcopy", "sha256sum");
    let dir = disk_dir("zmem-origin-nbd-");
    let origin = ZmemServer::start("32M", &[]);
    let cache = ZmemServer::start_with(&["--origin", &origin.uri(), "--max-pool", "64M"]);
    assert!(cache.log_text().contains("caching nbd+unix://"), "{}", cache.log_text());
    let (src, back, direct) = (dir.path().join("src.img"), dir.path().join("back.img"), dir.path().join("direct.img"));
    std::fs::write(&src, test_data(32 << 20, 3)).unwrap();
    run_ok(Command::new("nbdcopy").arg(&src).arg(cache.uri()), T);
    // Every write reached the origin before it was answered.
    run_ok(Command::new("nbdcopy").arg(origin.uri()).arg(&direct), T);
    assert_eq!(sha256(&src), sha256(&direct), "the origin lacks writes");
    let before = origin_stats(&cache);
    run_ok(Command::new("nbdcopy").arg(cache.uri()).arg(&back), T);
    assert_eq!(sha256(&src), sha256(&back), "read back through the cache");
    let after = origin_stats(&cache);
    assert!(n(&after, "cache_hits") > n(&before, "cache_hits"), "{after}");
    assert!(n(&after, "origin_read_bytes") - n(&before, "origin_read_bytes") < 8 << 20, "kept pages came from the pool: {after}");
    let text = run_ok(Command::new(ZMEM).arg("stat").arg("--control").arg(&cache.control), T);
    assert!(text.contains("cache: ") && text.contains("hit rate") && text.contains("origin: nbd+unix://"), "{text}");
}

#[test]
fn a_bad_origin_is_refused_with_its_name() {
    let dir = disk_dir("zmem-origin-bad-");
    let tiny = dir.path().join("tiny.img");
    std::fs::write(&tiny, [0u8; 100]).unwrap();
    for (origin, want) in [
        (tiny.to_str().unwrap().to_string(), "less than one page"),
        ("/nonexistent/zmem-origin".to_string(), "/nonexistent/zmem-origin"),
        (format!("nbd+unix:///?socket={}/none.sock", dir.path().display()), "Connecting"),
        ("nbd+unix:///disk".to_string(), "socket=PATH"),
    ] {
        let out =
            run_timeout(Command::new(ZMEM).args(["serve", "--socket"]).arg(dir.path().join("s.sock")).args(["--control", "none", "--origin", &origin]), T);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{origin} accepted");
        assert!(err.contains(want), "{origin}: {err}");
    }
    let out = run_timeout(Command::new(ZMEM).args(["serve", "--size", "1M", "--origin", tiny.to_str().unwrap()]), T);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    // A --fuse directory that is not there: refused, and nothing left
    // listening.
    let sock = dir.path().join("f.sock");
    let out = run_timeout(
        Command::new(ZMEM).args(["serve", "--size", "1M", "--control", "none", "--socket"]).arg(&sock).arg("--fuse").arg(dir.path().join("no-such-dir")),
        T,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("mounting the FUSE file at") && err.contains("no-such-dir"), "{err}");
    assert!(!sock.exists(), "the socket of a server that did not start was removed");
}

/// ext4 on the caching device over a file on disk, with a cache far
/// smaller than the data: copy a tree, churn it (delete, rewrite, copy
/// again, fstrim), drop the kernel's page cache and read it all back
/// through the cache; fsck on the device; then stop everything, fsck the
/// origin file itself and check every file read straight from it. The
/// device is reached through nbdfuse (the NBD server) or through the
/// server's own FUSE file (`--fuse`).
#[test]
fn ext4_on_a_cached_file_over_nbd_survives_churn_and_matches_the_origin() {
    ext4_churn(false);
}

#[test]
fn ext4_on_a_cached_file_over_its_fuse_file_survives_churn_and_matches_the_origin() {
    ext4_churn(true);
}

fn ext4_churn(own_fuse: bool) {
    if !is_root() {
        skip!("needs root (loop devices, mount)");
    }
    require_tools!("nbdfuse", "losetup", "mkfs.ext4", "e2fsck", "fstrim", "mount", "umount", "sha256sum");
    if !Path::new("/dev/fuse").exists() {
        skip!("/dev/fuse is missing (no FUSE in this kernel)");
    }
    let work = disk_dir("zmem-origin-fs-");
    let origin = work.path().join("origin.img");
    std::fs::File::create(&origin).unwrap().set_len(256 << 20).unwrap();
    let src = work.path().join("src");
    make_tree(&src);

    let fuse_dir = work.path().join("fuse");
    std::fs::create_dir_all(&fuse_dir).unwrap();
    let mut args = vec!["--origin", origin.to_str().unwrap(), "--max-pool", "2M", "--compressor", "lz4"];
    if own_fuse {
        args.extend(["--fuse", fuse_dir.to_str().unwrap()]);
    }
    let mut server = ZmemServer::start_with(&args);
    // If the server is gone before it unmounted its file (or the test
    // failed with it still up): unmount it by hand.
    let _own_fuse = own_fuse.then(|| Undo::new(&["umount", fuse_dir.to_str().unwrap()]));
    assert!(server.log_text().contains("(O_DIRECT)"), "{}", server.log_text());
    let nbdfuse = (!own_fuse).then(|| Fuse::mount(&fuse_dir, &server.socket));
    let file = match &nbdfuse {
        Some(f) => f.file(),
        None => fuse_dir.join("image"),
    };
    let lo = Loop::attach(&file);
    run_ok(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", &lo.dev]), T);
    let mnt = work.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    run_ok(Command::new("mount").arg(&lo.dev).arg(&mnt), T);
    let umount = Undo::new(&["umount", mnt.to_str().unwrap()]);

    run_ok(Command::new("cp").arg("-a").arg(&src).arg(mnt.join("tree")), T);
    // Churn: delete half, rewrite some files in place, copy again, trim.
    for d in 0..3 {
        std::fs::remove_dir_all(mnt.join("tree").join(format!("d{d}"))).unwrap();
        std::fs::remove_dir_all(src.join(format!("d{d}"))).unwrap();
    }
    for i in [2u64, 4, 5] {
        let data = test_data(300_000 + i as usize, 99 + i);
        std::fs::write(src.join("d4").join(format!("f{i}")), &data).unwrap();
        std::fs::write(mnt.join("tree/d4").join(format!("f{i}")), &data).unwrap();
    }
    run_ok(Command::new("cp").arg("-a").arg(src.join("d5")).arg(mnt.join("copy")), T);
    run_ok(Command::new("cp").arg("-a").arg(src.join("d5")).arg(src.join("copy")), T);
    run_ok(&mut Command::new("sync"), T);
    run_ok(Command::new("fstrim").arg(&mnt), T);
    // Everything the kernel held goes; reads now come through the cache.
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert_eq!(checksums(&mnt.join("tree")), checksums_except(&src, "copy"), "tree differs");
    assert_eq!(checksums(&mnt.join("copy")), checksums(&src.join("copy")), "copy differs");
    let st = origin_stats(&server);
    eprintln!("{st}");
    assert!(n(&st, "cache_hits") > 0 && n(&st, "evicted_pages") > 0, "the 2M cache hit and dropped pages: {st}");
    // fstrim's discards: NBD TRIM over nbdfuse; over the FUSE file, the
    // loop device's hole punches, which must read back as zeroes and so
    // reach the origin as zeroings.
    let discards = if own_fuse { "origin_zeroes" } else { "origin_trims" };
    assert!(n(&st, discards) > 0 && n(&st, "origin_flushes") > 0, "{st}");
    assert_eq!(n(&st, "origin_errors"), 0);
    if own_fuse {
        let f = server.stats()["fuse"].clone();
        assert!(n(&f, "reads") > 0 && n(&f, "writes") > 0 && n(&f, "discards") > 0 && n(&f, "errors") == 0, "{f}");
        let text = run_ok(Command::new(ZMEM).arg("stat").arg("--control").arg(&server.control), T);
        assert!(text.contains("fuse: ") && text.contains(" discards, 0 errors"), "{text}");
    }

    umount.now();
    run_ok(Command::new("e2fsck").args(["-f", "-n", &lo.dev]), T);
    // The loop device's fsync reached the origin (FUSE's fsync or NBD's
    // FLUSH).
    let flushes = n(&origin_stats(&server), "origin_flushes");
    run_ok(Command::new("python3").args(["-c", "import os, sys; os.fsync(os.open(sys.argv[1], os.O_WRONLY))", &lo.dev]), T);
    assert!(n(&origin_stats(&server), "origin_flushes") > flushes, "a flush of the device flushed the origin");
    drop(lo);
    drop(nbdfuse);
    assert!(server.stop().is_some_and(|s| s.success()), "{}", server.log_text());
    if own_fuse {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        assert!(!mounts.contains(fuse_dir.to_str().unwrap()), "the server unmounted its FUSE file: {mounts}");
        assert!(server.log_text().contains("also serving the device as"), "{}", server.log_text());
    }

    // The origin alone: a clean file system holding every file.
    run_ok(Command::new("e2fsck").args(["-f", "-n"]).arg(&origin), T);
    let lo = Loop::attach(&origin);
    run_ok(Command::new("mount").args(["-o", "ro"]).arg(&lo.dev).arg(&mnt), T);
    let umount = Undo::new(&["umount", mnt.to_str().unwrap()]);
    assert_eq!(checksums(&mnt.join("tree")), checksums_except(&src, "copy"), "the origin's tree differs");
    assert_eq!(checksums(&mnt.join("copy")), checksums(&src.join("copy")), "the origin's copy differs");
    umount.now();
}

/// `checksums(root)` without the top-level directory `skip`.
fn checksums_except(root: &Path, skip: &str) -> String {
    sh(&format!("cd '{}' && find . -path './{skip}' -prune -o -type f -print0 | sort -z | xargs -0 sha256sum", root.display()), T)
}

/// `nbdkit` serving a file, with its error filter failing reads while one
/// trigger file exists and writes while another does; killed on drop.
struct FlakyOrigin {
    child: std::process::Child,
    socket: std::path::PathBuf,
    fail_reads: std::path::PathBuf,
    fail_writes: std::path::PathBuf,
}

impl FlakyOrigin {
    fn start(dir: &Path, file: &Path) -> FlakyOrigin {
        let socket = dir.join("nbdkit.sock");
        let (fail_reads, fail_writes) = (dir.join("fail-reads"), dir.join("fail-writes"));
        let child = Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(&socket)
            .args(["--filter=error", "file"])
            .arg(format!("file={}", file.display()))
            .args(["error=EIO", "error-pread-rate=100%", "error-pwrite-rate=100%"])
            .arg(format!("error-pread-file={}", fail_reads.display()))
            .arg(format!("error-pwrite-file={}", fail_writes.display()))
            .spawn()
            .expect("spawning nbdkit");
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(std::time::Instant::now() < end, "nbdkit did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        FlakyOrigin { child, socket, fail_reads, fail_writes }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    fn set(&self, trigger: &Path, on: bool) {
        if on {
            std::fs::write(trigger, "").unwrap();
        } else {
            std::fs::remove_file(trigger).unwrap();
        }
    }
}

impl Drop for FlakyOrigin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An origin that fails reads, then writes (nbdkit's error filter over a
/// file): those requests fail with EIO and nothing else does, on the same
/// connection; the failures leave nothing wrong in the cache, so once the
/// origin works again every page read through the cache is the file's.
#[test]
fn a_failing_origin_fails_those_requests_and_caches_nothing_wrong() {
    require_tools!("nbdkit");
    let work = disk_dir("zmem-origin-flaky-");
    let file = work.path().join("origin.img");
    let data = test_data(16 << 20, 5);
    std::fs::write(&file, &data).unwrap();
    let origin = FlakyOrigin::start(work.path(), &file);
    let server = ZmemServer::start_with(&["--origin", &origin.uri(), "--max-pool", "64M"]);
    let c = NbdOrigin::connect(&server.uri()).unwrap();
    assert_eq!(c.size(), 16 << 20);
    let mut b = vec![0u8; 1 << 20];
    for mb in 0..4u64 {
        c.read_at(&mut b, mb << 20).unwrap();
    }
    assert_eq!(b, &data[3 << 20..4 << 20]);

    // Reads the cache cannot answer fail; those it can still work.
    origin.set(&origin.fail_reads, true);
    let e = c.read_at(&mut b, 8 << 20).unwrap_err().to_string();
    assert!(e.contains("Input/output error"), "{e}");
    let kept = origin_stats(&server);
    assert!(n(&kept, "cache_refused") < 256, "test data is kept: {kept}");
    c.read_at(&mut b, 0).unwrap();
    assert_eq!(b, &data[..1 << 20]);
    // A partial-page write needs the page from the origin: it fails too.
    assert!(c.write_at(&[9u8; 512], (9 << 20) + 512, false).is_err());
    origin.set(&origin.fail_reads, false);

    // Writes fail, whole or partial, and leave the cached pages as the
    // origin still has them.
    origin.set(&origin.fail_writes, true);
    let e = c.write_at(&vec![0xAB; 1 << 20], 1 << 20, false).unwrap_err().to_string();
    assert!(e.contains("Input/output error"), "{e}");
    assert!(c.write_at(&[0xCD; 512], (2 << 20) + 1024, true).is_err());
    c.read_at(&mut b, 1 << 20).unwrap();
    assert_eq!(b, &data[1 << 20..2 << 20], "a failed write changed what is read");
    origin.set(&origin.fail_writes, false);
    c.write_at(&[0x11; 4096], 2 << 20, true).unwrap();
    assert_eq!(c.reconnects(), 0, "an error reply keeps the connection");
    let st = origin_stats(&server);
    assert!(n(&st, "origin_errors") >= 4, "{st}");

    // What the cache serves is what the file holds.
    let mut all = vec![0u8; 16 << 20];
    c.read_at(&mut all, 0).unwrap();
    c.flush().unwrap();
    let on_disk = std::fs::read(&file).unwrap();
    for p in 0..(16 << 20) / 4096 {
        assert!(all[p * 4096..(p + 1) * 4096] == on_disk[p * 4096..(p + 1) * 4096], "page {p} differs from the origin");
    }
    assert!(on_disk[2 << 20..(2 << 20) + 4096].iter().all(|&v| v == 0x11));
    assert!(on_disk[1 << 20..2 << 20] == data[1 << 20..2 << 20], "the failed writes left nothing");
}
