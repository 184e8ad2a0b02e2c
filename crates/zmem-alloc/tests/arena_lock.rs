//! `ArenaLock`: a process that holds an arena it does not use keeps the
//! arena's data in RAM (mapped, locked) without filling its holes, and a
//! refresh takes in what was written since and lets go of what was freed.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{fallocate, memfd_create, seek, FallocateFlags, MemfdFlags, SeekFrom};
use zmem_alloc::ArenaLock;

/// This process's `RssShmem`, bytes.
fn rss_shmem() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("RssShmem:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
}

/// The file's data ranges, as `lseek(SEEK_DATA/SEEK_HOLE)` says.
fn data(fd: &OwnedFd) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Ok(d) = seek(fd, SeekFrom::Data(pos)) {
        let h = seek(fd, SeekFrom::Hole(d)).unwrap();
        out.push((d, h));
        pos = h;
    }
    out
}

fn write_at(fd: &OwnedFd, at: u64, len: usize) {
    assert_eq!(rustix::io::pwrite(fd, &vec![7u8; len], at).unwrap(), len);
}

#[test]
fn a_lock_holds_the_data_leaves_the_holes_and_follows_the_file() {
    let fd = memfd_create("arena-lock-test", MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, 1 << 30).unwrap();
    write_at(&fd, 0, 64 << 10);
    write_at(&fd, 1 << 20, 128 << 10);
    write_at(&fd, 100 << 20, 4 << 10);
    let before = (data(&fd), rss_shmem());
    let mut lock = match ArenaLock::take(fd.as_fd()) {
        Ok(l) => l,
        Err(e) => {
            zmem_testkit::ci::skip(&format!("mlock2 refused ({e}): needs root or a big RLIMIT_MEMLOCK"));
            return;
        }
    };
    assert_eq!(lock.locked_bytes(), (64 + 128 + 4) << 10);
    assert_eq!(data(&fd), before.0, "the lock filled holes");
    assert!(rss_shmem() >= before.1 + ((64 + 128 + 4) << 10), "the data is not mapped: {} against {}", rss_shmem(), before.1);

    // Written since: taken in. Freed since: let go, and not filled again.
    write_at(&fd, 512 << 20, 256 << 10);
    fallocate(&fd, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, 1 << 20, 128 << 10).unwrap();
    assert_eq!(lock.refresh(fd.as_fd()).unwrap(), (64 + 4 + 256) << 10);
    assert_eq!(data(&fd), vec![(0, 64 << 10), (100 << 20, (100 << 20) + (4 << 10)), (512 << 20, (512 << 20) + (256 << 10))]);
    let held = rss_shmem();
    drop(lock);
    assert!(rss_shmem() + ((64 + 4 + 256) << 10) <= held, "dropped, the lock still maps the data");
}

#[test]
fn a_file_that_is_not_an_arena_is_refused() {
    let fd = memfd_create("arena-lock-empty", MemfdFlags::CLOEXEC).unwrap();
    assert!(ArenaLock::take(fd.as_fd()).is_err(), "an empty file");
}
