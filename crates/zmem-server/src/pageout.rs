//! Giving back the code a server ran only to start: the crate's other
//! `unsafe` (libc's `munlock`, `madvise` and `mlock2` take raw ranges).
//!
//! Under `mlockall(MCL_ONFAULT)` every page of the binary and its
//! libraries that has run stays locked and resident: argument parsing,
//! the pool's set-up, the mount, code that never runs again, held for the
//! server's life and taken from the memory of the processes whose pages
//! it serves. [`startup_code`] unlocks the file-backed read-only mappings,
//! asks the kernel to reclaim their pages (`MADV_PAGEOUT`; pages other
//! processes map too are left alone), and locks the ranges again on fault:
//! what the server runs from then on comes back, from the page cache or
//! the file, and is locked once more. Its anonymous memory (pool, tables,
//! buffers, stacks) is never touched here, nor is a read-only mapping
//! that holds anonymous pages (the binary's RELRO, written by the dynamic
//! linker before it was made read-only): `MADV_PAGEOUT` would swap those
//! out, onto the server's own swap device, and a swapoff of it then held
//! the server's mm while waiting on I/O only the server could do.

#![allow(unsafe_code)]

/// Drop the pages of this process's file-backed, read-only mappings (see
/// the module doc). Returns the bytes of the ranges it went over; a range
/// the kernel refuses is left as it was.
pub fn startup_code() -> std::io::Result<u64> {
    let maps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut bytes = 0;
    for (start, end) in file_ranges(&maps) {
        let (p, len) = (start as *mut libc::c_void, end - start);
        // SAFETY: [start, end) is a whole mapping of this process, as
        // /proc/self/maps gave it, file-backed and not writable: munlock
        // and mlock2 change only whether its pages are locked, and
        // MADV_PAGEOUT only whether its clean pages are resident (a page
        // dropped is read back from its file on the next access, with the
        // same bytes). Nothing here writes to or unmaps the range. Were
        // the mapping gone since the read (no thread of the server maps
        // or unmaps files), the calls fail with ENOMEM and change nothing.
        unsafe {
            if libc::munlock(p, len) != 0 {
                continue;
            }
            libc::madvise(p, len, libc::MADV_PAGEOUT);
            libc::mlock2(p, len, libc::MLOCK_ONFAULT);
        }
        bytes += len as u64;
    }
    Ok(bytes)
}

/// The `(start, end)` of each mapping in a `/proc/PID/smaps` text that a
/// file backs (its path is absolute), that cannot be written, and that
/// holds no anonymous page (`Anonymous: 0 kB`; a mapping without the
/// line is left alone too).
fn file_ranges(smaps: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    // The mapping being read, while its fields follow; kept once its
    // `Anonymous:` line says it holds none.
    let mut current = None;
    for l in smaps.lines() {
        if let Some(v) = l.strip_prefix("Anonymous:") {
            if let (Some(r), Some(0)) = (current.take(), v.trim().strip_suffix("kB").and_then(|k| k.trim().parse::<u64>().ok())) {
                out.push(r);
            }
            continue;
        }
        let mut f = l.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else { continue };
        // A mapping's header line: range, perms, offset, device, inode, path.
        current = None;
        if let Some(path) = f.nth(3) {
            // (Not shared memory, even mapped read-only: a memfd's path
            // starts with `/memfd:`, SysV's with `/SYSV`, and paging its
            // pages out would swap them, maybe onto the device they serve.)
            let shared_memory = path.starts_with("/memfd:") || path.starts_with("/SYSV") || path.starts_with("/dev/shm/") || perms.ends_with('s');
            if path.starts_with('/') && !perms.contains('w') && !shared_memory && a < b {
                current = Some((a, b));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_file_mappings_without_anonymous_pages() {
        let smaps = "\
55fca7bfb000-55fca7e03000 r--p 00000000 fe:01 123 /usr/bin/zmem
Rss:                 976 kB
Anonymous:             0 kB
55fca7e03000-55fca8544000 r-xp 00208000 fe:01 123 /usr/bin/zmem
Anonymous:             0 kB
55fca8544000-55fca8576000 r--p 00948000 fe:01 123 /usr/bin/zmem
Anonymous:           200 kB
55fca8576000-55fca8578000 rw-p 00979000 fe:01 123 /usr/bin/zmem
Anonymous:             8 kB
55fccdad3000-55fccdd9b000 rw-p 00000000 00:00 0   [heap]
Anonymous:          2820 kB
7fe7a4000000-7fe7a4294000 rw-p 00000000 00:00 0
Anonymous:          2640 kB
7fe7aa823000-7fe7aa979000 r-xp 00026000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7fe7aa979000-7fe7aa9cc000 r--p 0017c000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
VmFlags: rd mr mw me
7fff74661000-7fff74682000 r-xp 00000000 00:00 0   [vdso]
Anonymous:             0 kB
zz-1 r--p 0 0 0 /x
Anonymous:             0 kB
7db134fe6000-7db134fea000 r--s 00000000 00:01 32191 /memfd:zmem-arena (deleted)
Anonymous:             0 kB
7db134fea000-7db134feb000 r--s 00000000 fe:01 789 /var/lib/shared.db
Anonymous:             0 kB
";
        // The RELRO (anonymous pages in a read-only mapping), a mapping
        // whose Anonymous line is missing, and shared memory (a pool's
        // arena locked read-only by the swap keeper; any shared mapping)
        // are left alone.
        assert_eq!(file_ranges(smaps), vec![(0x55fca7bfb000, 0x55fca7e03000), (0x55fca7e03000, 0x55fca8544000), (0x7fe7aa823000, 0x7fe7aa979000)]);
    }

    #[test]
    fn file_pages_leave_and_the_code_runs_on() {
        // This test binary's code that has run is dropped (no other
        // process maps it); the test goes on running, its pages coming
        // back on fault, far fewer than were there.
        // (The other tests of this binary run on threads of their own and
        // fault code back in meanwhile: a try may see more, not less, so
        // the drop must show in one of a few tries, not in the first.)
        let rss_file = || crate::memory::now().expect("/proc/self/status").rss_file_bytes;
        let mut seen = Vec::new();
        for _ in 0..20 {
            let before = rss_file();
            assert!(startup_code().unwrap() > 0);
            let after = rss_file();
            if after < before {
                return;
            }
            seen.push((before, after));
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("file-backed RSS never fell (before, after each try): {seen:?}");
    }
}
