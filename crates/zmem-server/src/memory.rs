//! The server process's own memory: what it holds in RAM besides its pool.
//!
//! zram's tables, buffers and code are the kernel's; a userspace server's
//! are resident memory of its own, taken from the machine whose pages it
//! holds. The pool's `mem_used_total` counts compressed pages and every
//! table that grows with them; the rest of the process (its code that has
//! run, I/O buffers, thread stacks, malloc's free memory) is what this
//! reports, read from `/proc/self/status` and malloc on every request.

use serde::{Deserialize, Serialize};

/// The server's resident memory, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerMemory {
    /// Resident anonymous memory (`RssAnon`): the pool and its tables,
    /// I/O buffers, thread stacks, and what malloc holds free.
    pub rss_anon_bytes: u64,
    /// Resident file-backed memory (`RssFile`): the code and data of the
    /// binary and its libraries that have been touched.
    pub rss_file_bytes: u64,
    /// Resident shared memory (`RssShmem`): the pool's arena, its
    /// compressed pages and handle tables (a file in RAM that outlives
    /// the process).
    #[serde(default)]
    pub rss_shmem_bytes: u64,
    /// The most resident memory so far (`VmHWM`).
    pub rss_max_bytes: u64,
    /// Locked memory as the kernel counts it (`VmLck`): the whole size of
    /// every locked mapping, touched or not, so under `mlockall`'s
    /// `MCL_ONFAULT` far more than is resident.
    pub locked_bytes: u64,
    /// malloc's arenas: bytes handed out, and bytes free but still
    /// resident (under `mlockall` malloc cannot give those back).
    pub malloc_in_use_bytes: u64,
    pub malloc_free_bytes: u64,
}

impl ServerMemory {
    /// All resident memory (`VmRSS`).
    pub fn rss(&self) -> u64 {
        self.rss_anon_bytes + self.rss_file_bytes + self.rss_shmem_bytes
    }
}

/// This process's memory now; `None` where `/proc/self/status` cannot be
/// read or lacks the fields.
pub fn now() -> Option<ServerMemory> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let mut m = parse_status(&status)?;
    if let Some((in_use, free)) = crate::malloc::arenas() {
        (m.malloc_in_use_bytes, m.malloc_free_bytes) = (in_use, free);
    }
    Some(m)
}

/// The fields of a `/proc/PID/status` text (`NAME:  N kB` lines).
fn parse_status(status: &str) -> Option<ServerMemory> {
    let field = |name: &str| zmem_host::proc_kb_field(status, name);
    Some(ServerMemory {
        rss_anon_bytes: field("RssAnon")?,
        rss_file_bytes: field("RssFile")?,
        rss_shmem_bytes: field("RssShmem").unwrap_or(0),
        rss_max_bytes: field("VmHWM")?,
        locked_bytes: field("VmLck")?,
        ..ServerMemory::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_bytes() {
        let s = "Name:\tzmem\nVmHWM:\t   81044 kB\nVmLck:\t   24448 kB\nVmRSS:\t   24448 kB\nRssAnon:\t   17784 kB\nRssFile:\t    6664 kB\nRssShmem:\t       0 kB\n";
        let m = parse_status(s).unwrap();
        assert_eq!((m.rss_anon_bytes, m.rss_file_bytes, m.rss_max_bytes, m.locked_bytes), (17784 << 10, 6664 << 10, 81044 << 10, 24448 << 10));
        assert_eq!(m.rss(), 24448 << 10);
        let s = "VmHWM:\t 9 kB\nVmLck:\t 0 kB\nRssAnon:\t 1 kB\nRssFile:\t 2 kB\nRssShmem:\t 4 kB\n";
        assert_eq!(parse_status(s).unwrap().rss(), 7 << 10, "the pool's shared memory is resident memory");
        // A field missing or not in kB: no report rather than a wrong one.
        assert_eq!(parse_status("RssAnon:\t1 kB\nRssFile:\t2 kB\nVmHWM:\t3 kB\n"), None);
        assert_eq!(parse_status("RssAnon:\t1 MB\nRssFile:\t2 kB\nVmHWM:\t3 kB\nVmLck:\t0 kB\n"), None);
    }

    #[test]
    fn this_process_is_read() {
        let m = now().expect("/proc/self/status");
        assert!(m.rss_anon_bytes > 0 && m.rss_file_bytes > 0 && m.rss_max_bytes >= m.rss(), "{m:?}");
    }
}
