//! Where benchmark pages come from.
//!
//! A [`PageSet`] is a flat buffer whose length is a multiple of
//! [`PAGE_SIZE`], plus a list of human-readable sources (file paths, or
//! `pid N <range> <name>` for process memory). It can be filled from
//!
//! * files and directories ([`read_paths`]): each file is cut into 4 KiB
//!   pages, the tail page zero-padded; directories are walked recursively in
//!   sorted order;
//! * the anonymous private memory of a live process ([`read_process`]),
//!   read through `/proc/PID/mem`;
//! * a built-in "realistic" process ([`spawn_default_process`]) — a Python
//!   interpreter holding dicts, strings, lists and numbers — whose memory is
//!   then read with [`read_process`].

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{anyhow, bail, Context};

/// Size of one page, in bytes.
pub const PAGE_SIZE: usize = 4096;

/// A set of pages: `data.len()` is always a multiple of [`PAGE_SIZE`].
#[derive(Debug, Clone, Default)]
pub struct PageSet {
    /// Page contents, concatenated.
    pub data: Vec<u8>,
    /// Where the pages came from (file paths, or process regions).
    pub sources: Vec<String>,
}

impl PageSet {
    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.data.len() / PAGE_SIZE
    }

    /// Page `i`. Panics if `i >= self.pages()` (like slice indexing).
    pub fn page(&self, i: usize) -> &[u8] {
        &self.data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
    }

    /// Iterate over all pages.
    pub fn iter(&self) -> std::slice::ChunksExact<'_, u8> {
        self.data.chunks_exact(PAGE_SIZE)
    }

    /// Total size in bytes.
    pub fn len_bytes(&self) -> usize {
        self.data.len()
    }

    /// True if there are no pages.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Byte budget, rounded up to whole pages. `None` = unlimited.
fn page_budget(max_bytes: Option<u64>) -> usize {
    match max_bytes {
        None => usize::MAX,
        Some(b) => {
            let pages = b.div_ceil(PAGE_SIZE as u64);
            usize::try_from(pages.saturating_mul(PAGE_SIZE as u64)).unwrap_or(usize::MAX)
        }
    }
}

/// Append `reader`'s content to `out` as whole pages (tail zero-padded),
/// never letting `out` grow beyond `limit` bytes. Returns bytes of content
/// read (before padding).
pub fn append_pages<R: Read>(out: &mut Vec<u8>, mut reader: R, limit: usize) -> io::Result<u64> {
    let start = out.len();
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while out.len() < limit {
        let want = buf.len().min(limit - out.len());
        let n = match reader.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Do not leave a half-read file behind.
                out.truncate(start);
                return Err(e);
            }
        };
        out.extend_from_slice(&buf[..n]);
        total += n as u64;
    }
    let rem = out.len() % PAGE_SIZE;
    if rem != 0 {
        // `limit` is a multiple of PAGE_SIZE, so padding never exceeds it.
        out.resize(out.len() + (PAGE_SIZE - rem), 0);
    }
    Ok(total)
}

/// Read files and directories into pages.
///
/// * A regular file is cut into 4 KiB pages, the last one zero-padded; an
///   empty file contributes no pages.
/// * A directory is walked recursively; entries are visited in sorted
///   (byte-wise path) order so the result is deterministic. Inside a walk,
///   symlinks, special files (FIFOs, sockets, devices) and unreadable
///   entries are skipped with a `tracing::warn!`.
/// * Paths given explicitly must exist (a missing one is an error);
///   explicit symlinks are followed, explicit special files are rejected.
/// * Reading stops once `max_bytes` (rounded up to a whole page) is
///   reached; the last file may be cut short.
pub fn read_paths(paths: &[PathBuf], max_bytes: Option<u64>) -> anyhow::Result<PageSet> {
    let limit = page_budget(max_bytes);
    let mut set = PageSet::default();
    for p in paths {
        if set.data.len() >= limit {
            break;
        }
        let meta = fs::metadata(p).map_err(|e| anyhow!("cannot read {}: {}", p.display(), describe_io(&e)))?;
        if meta.is_dir() {
            walk_dir(p, &mut set, limit)?;
        } else if meta.is_file() {
            let f = File::open(p).map_err(|e| anyhow!("cannot open {}: {}", p.display(), describe_io(&e)))?;
            let n = append_pages(&mut set.data, f, limit).map_err(|e| anyhow!("cannot read {}: {}", p.display(), describe_io(&e)))?;
            if n > 0 {
                set.sources.push(p.display().to_string());
            }
        } else {
            bail!("{} is not a regular file or directory", p.display());
        }
    }
    Ok(set)
}

fn walk_dir(dir: &Path, set: &mut PageSet, limit: usize) -> anyhow::Result<()> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            tracing::warn!("skipping directory {}: {}", dir.display(), describe_io(&e));
            return Ok(());
        }
    };
    let mut entries: Vec<PathBuf> = Vec::new();
    for ent in rd {
        match ent {
            Ok(ent) => entries.push(ent.path()),
            Err(e) => tracing::warn!("error listing {}: {}", dir.display(), describe_io(&e)),
        }
    }
    entries.sort();
    for path in entries {
        if set.data.len() >= limit {
            return Ok(());
        }
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("skipping {}: {}", path.display(), describe_io(&e));
                continue;
            }
        };
        let ft = meta.file_type();
        if ft.is_symlink() {
            tracing::debug!("skipping symlink {}", path.display());
        } else if ft.is_dir() {
            walk_dir(&path, set, limit)?;
        } else if ft.is_file() {
            let f = match File::open(&path) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!("skipping unreadable {}: {}", path.display(), describe_io(&e));
                    continue;
                }
            };
            match append_pages(&mut set.data, f, limit) {
                Ok(0) => {}
                Ok(_) => set.sources.push(path.display().to_string()),
                Err(e) => tracing::warn!("skipping unreadable {}: {}", path.display(), describe_io(&e)),
            }
        } else {
            tracing::warn!("skipping special file {}", path.display());
        }
    }
    Ok(())
}

/// One parsed line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    pub start: u64,
    pub end: u64,
    /// The 4-character permission string, e.g. `rw-p`.
    pub perms: String,
    pub offset: u64,
    pub dev: String,
    pub inode: u64,
    /// Pathname or pseudo-name (`[heap]`, `[stack]`, `[anon:foo]`); `None`
    /// for an unnamed anonymous mapping.
    pub pathname: Option<String>,
}

impl MapsEntry {
    pub fn readable(&self) -> bool {
        self.perms.as_bytes().first() == Some(&b'r')
    }

    pub fn private(&self) -> bool {
        self.perms.as_bytes().get(3) == Some(&b'p')
    }

    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Anonymous memory: no pathname and no inode, or `[heap]`, `[stack]`
    /// (`[stack:TID]` on old kernels) or a named anonymous mapping
    /// (`[anon:NAME]`). Kernel-provided pseudo mappings (`[vvar]`,
    /// `[vdso]`, `[vsyscall]`, …) and file mappings are not anonymous.
    pub fn is_anonymous(&self) -> bool {
        match &self.pathname {
            None => self.inode == 0,
            Some(p) => p == "[heap]" || p == "[stack]" || p.starts_with("[stack:") || p.starts_with("[anon:"),
        }
    }

    /// What [`read_process`] reads: readable, private, anonymous.
    pub fn is_candidate(&self) -> bool {
        self.readable() && self.private() && self.is_anonymous() && !self.is_empty()
    }
}

/// Split off the next whitespace-delimited token.
fn next_token(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start();
    if s.is_empty() {
        return None;
    }
    let end = s.find(|c: char| c.is_ascii_whitespace()).unwrap_or(s.len());
    Some((&s[..end], &s[end..]))
}

/// Parse one line of `/proc/PID/maps`:
/// `start-end perms offset dev inode [pathname]`. The pathname may contain
/// spaces (it is everything after the inode, leading padding removed);
/// a ` (deleted)` suffix is kept as is.
pub fn parse_maps_line(line: &str) -> anyhow::Result<MapsEntry> {
    let bad = || anyhow!("malformed /proc/PID/maps line: {line:?}");
    let (range, rest) = next_token(line).ok_or_else(bad)?;
    let (perms, rest) = next_token(rest).ok_or_else(bad)?;
    let (offset, rest) = next_token(rest).ok_or_else(bad)?;
    let (dev, rest) = next_token(rest).ok_or_else(bad)?;
    let (inode, rest) = next_token(rest).ok_or_else(bad)?;
    let (start, end) = range.split_once('-').ok_or_else(bad)?;
    let start = u64::from_str_radix(start, 16).map_err(|_| bad())?;
    let end = u64::from_str_radix(end, 16).map_err(|_| bad())?;
    if end < start || perms.len() != 4 || !dev.contains(':') {
        return Err(bad());
    }
    let offset = u64::from_str_radix(offset, 16).map_err(|_| bad())?;
    let inode: u64 = inode.parse().map_err(|_| bad())?;
    let name = rest.trim_start().trim_end_matches(['\n', '\r']);
    Ok(MapsEntry {
        start,
        end,
        perms: perms.to_string(),
        offset,
        dev: dev.to_string(),
        inode,
        pathname: if name.is_empty() { None } else { Some(name.to_string()) },
    })
}

/// Parse a whole `/proc/PID/maps` file; malformed lines are skipped with a
/// warning.
pub fn parse_maps(text: &str) -> Vec<MapsEntry> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| match parse_maps_line(l) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::warn!("{e}");
                None
            }
        })
        .collect()
}

/// Human description of an I/O error, with a hint for permission problems.
fn describe_io(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied (run as root or same user)".to_string(),
        Some(libc::ENOENT) => "no such file or directory".to_string(),
        Some(libc::ESRCH) => "no such process".to_string(),
        _ => e.to_string(),
    }
}

fn proc_error(pid: u32, what: &str, e: &io::Error) -> anyhow::Error {
    if e.raw_os_error() == Some(libc::ENOENT) && !Path::new(&format!("/proc/{pid}")).exists() {
        return anyhow!("cannot read /proc/{pid}/{what}: no such process {pid}");
    }
    anyhow!("cannot read /proc/{pid}/{what}: {}", describe_io(e))
}

/// Read the anonymous private memory of process `pid`.
///
/// Regions are taken from `/proc/PID/maps` (readable, private, and either
/// unnamed with inode 0, `[heap]`, `[stack]` or `[anon:…]`; `[vvar]`,
/// `[vdso]`, `[vsyscall]` and file mappings are skipped) and read through
/// `/proc/PID/mem` with `pread` at each virtual address, 1 MiB at a time.
/// A chunk that fails to read is retried page by page; pages that still
/// fail (typically `EIO`) are skipped, not fatal. Pages never touched by the
/// process read as zeros (the kernel maps the shared zero page), exactly
/// as zram would see them if they were swapped.
///
/// Reading stops once `max_bytes` (rounded up to a whole page) is reached.
/// Requires ptrace-read access to the target: root, or the same user with a
/// permissive `kernel.yama.ptrace_scope`.
pub fn read_process(pid: u32, max_bytes: Option<u64>) -> anyhow::Result<PageSet> {
    let limit = page_budget(max_bytes);
    let maps_text = fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| proc_error(pid, "maps", &e))?;
    let mem = File::open(format!("/proc/{pid}/mem")).map_err(|e| proc_error(pid, "mem", &e))?;
    let regions: Vec<MapsEntry> = parse_maps(&maps_text).into_iter().filter(MapsEntry::is_candidate).collect();

    let mut set = PageSet::default();
    let mut chunk = vec![0u8; 1 << 20];
    let mut failed_pages = 0u64;
    let mut any_ok = false;
    let mut first_err: Option<io::Error> = None;
    'regions: for r in &regions {
        let before = set.data.len();
        let mut addr = r.start;
        while addr < r.end {
            if set.data.len() >= limit {
                break 'regions;
            }
            let want = ((r.end - addr) as usize).min(chunk.len()).min(limit - set.data.len());
            let want = want - want % PAGE_SIZE;
            if want == 0 {
                break;
            }
            match read_full_at(&mem, &mut chunk[..want], addr) {
                Ok(()) => {
                    set.data.extend_from_slice(&chunk[..want]);
                    any_ok = true;
                }
                Err(_) => {
                    // Retry page by page; skip the pages that fail.
                    for off in (0..want).step_by(PAGE_SIZE) {
                        let page = &mut chunk[off..off + PAGE_SIZE];
                        match read_full_at(&mem, page, addr + off as u64) {
                            Ok(()) => {
                                set.data.extend_from_slice(page);
                                any_ok = true;
                            }
                            Err(e) => {
                                failed_pages += 1;
                                if first_err.is_none() {
                                    first_err = Some(e);
                                }
                            }
                        }
                    }
                }
            }
            addr += want as u64;
        }
        let got = set.data.len() - before;
        if got > 0 {
            let name = r.pathname.as_deref().unwrap_or("[anon]");
            set.sources.push(format!("pid {pid} {:x}-{:x} {name} ({} pages)", r.start, r.end, got / PAGE_SIZE));
        }
    }
    if failed_pages > 0 {
        tracing::warn!("pid {pid}: {failed_pages} pages could not be read and were skipped");
    }
    if !any_ok {
        if let Some(e) = first_err {
            // Nothing at all was readable: that is an access problem, not a
            // few unreadable pages.
            return Err(proc_error(pid, "mem", &e));
        }
    }
    Ok(set)
}

/// `pread` until `buf` is full; a short read at end of mapping is an error.
fn read_full_at(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    if offset > i64::MAX as u64 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    f.read_exact_at(buf, offset)
}

const DEFAULT_PROCESS_SCRIPT: &str = r#"
import os, random, sys, time
target = int(sys.argv[1])
random.seed(20240611)
words = ("the of and to in is was for on that with as by at from his her this which "
         "memory page swap zram zswap compress kernel process thread lock queue user "
         "alpha beta gamma delta epsilon request response header status error value "
         "name id count total price order customer address city country email date").split()
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
store = []
index = {}
i = 0
while rss() < target:
    for _ in range(2000):
        name = " ".join(random.choice(words) for _ in range(random.randint(2, 8)))
        rec = {
            "id": i,
            "name": name,
            "email": "%s.%d@example.com" % (random.choice(words), i),
            "score": random.random() * 100.0,
            "count": random.randint(0, 1 << 20),
            "tags": [random.choice(words) for _ in range(random.randint(0, 5))],
            "token": os.urandom(12).hex(),
            "history": list(range(i % 17)),
        }
        store.append(rec)
        index[name + str(i)] = rec
        if i % 7 == 0:
            store.append(("log line %d: %s processed in %.3f ms" % (i, name, random.random() * 10)) * 3)
        i += 1
sys.stdout.write("ready %d %d\n" % (i, rss()))
sys.stdout.flush()
while True:
    time.sleep(3600)
"#;

/// Start a realistic live process holding about `bytes` of heap data (a
/// `python3` interpreter building dicts, strings, lists, ints and floats),
/// and wait until it has finished building it. The caller should read it
/// with [`read_process`] and must kill it (`child.kill()` + `child.wait()`).
pub fn spawn_default_process(bytes: usize) -> anyhow::Result<Child> {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(DEFAULT_PROCESS_SCRIPT)
        .arg(bytes.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start python3 for the default data set (is python3 installed?)")?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("cannot capture python3's output");
    };
    let mut line = String::new();
    let res = BufReader::new(stdout).read_line(&mut line);
    match res {
        Ok(_) if line.starts_with("ready") => {
            tracing::debug!("default process {}: {}", child.id(), line.trim());
            Ok(child)
        }
        other => {
            let _ = child.kill();
            let status = child.wait();
            Err(anyhow!(
                "default data-set process (python3) did not become ready: {}; exit status {:?}",
                match other {
                    Ok(_) => format!("unexpected output {:?}", line.trim()),
                    Err(e) => e.to_string(),
                },
                status.ok()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn maps_line_anonymous() {
        let e = parse_maps_line("7f3a1c000000-7f3a1c021000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(e.start, 0x7f3a1c000000);
        assert_eq!(e.end, 0x7f3a1c021000);
        assert_eq!(e.perms, "rw-p");
        assert_eq!(e.inode, 0);
        assert_eq!(e.pathname, None);
        assert!(e.is_candidate());
        assert_eq!(e.len(), 0x21000);
    }

    #[test]
    fn maps_line_named() {
        let heap = parse_maps_line("55d0c8a4e000-55d0c8a6f000 rw-p 00000000 00:00 0                          [heap]").unwrap();
        assert_eq!(heap.pathname.as_deref(), Some("[heap]"));
        assert!(heap.is_candidate());
        let stack = parse_maps_line("7ffc1a2b3000-7ffc1a2d4000 rw-p 00000000 00:00 0                          [stack]").unwrap();
        assert!(stack.is_candidate());
        let named = parse_maps_line("7f00-8f00 rw-p 00000000 00:00 0   [anon:scudo primary]").unwrap();
        assert_eq!(named.pathname.as_deref(), Some("[anon:scudo primary]"));
        assert!(named.is_candidate());
        for pseudo in ["[vvar]", "[vdso]", "[vsyscall]", "[vvar_vclock]"] {
            let l = format!("7ffc1a3f0000-7ffc1a3f4000 r--p 00000000 00:00 0  {pseudo}");
            let e = parse_maps_line(&l).unwrap();
            assert!(!e.is_candidate(), "{pseudo}");
        }
        let file = parse_maps_line("7f3a1c200000-7f3a1c228000 r--p 00000000 fd:01 1311234   /usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        assert_eq!(file.inode, 1311234);
        assert!(!file.is_candidate());
        let spaces = parse_maps_line("1000-2000 rw-p 00001000 fd:01 42  /tmp/my file (deleted)").unwrap();
        assert_eq!(spaces.pathname.as_deref(), Some("/tmp/my file (deleted)"));
        assert_eq!(spaces.offset, 0x1000);
        let shared = parse_maps_line("1000-2000 rw-s 00000000 00:01 7 /dev/zero (deleted)").unwrap();
        assert!(!shared.is_candidate());
        let noread = parse_maps_line("1000-2000 ---p 00000000 00:00 0").unwrap();
        assert!(!noread.is_candidate());
        let vsys = parse_maps_line("ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]").unwrap();
        assert_eq!(vsys.start, 0xffffffffff600000);
        assert!(!vsys.is_candidate());
    }

    #[test]
    fn maps_line_malformed() {
        for l in [
            "",
            "garbage",
            "1000-2000",
            "1000-2000 rw-p",
            "1000-2000 rw-p 0 00:00",
            "zz-2000 rw-p 00000000 00:00 0",
            "2000-1000 rw-p 00000000 00:00 0",
            "1000 rw-p 00000000 00:00 0",
            "1000-2000 rw-p 00000000 00:00 x",
            "1000-2000 rwxpq 00000000 00:00 0",
            "1000-2000 rw-p 00000000 0000 0",
            "ffffffffffffffffffff-1 rw-p 0 00:00 0",
        ] {
            assert!(parse_maps_line(l).is_err(), "{l:?}");
        }
        let v = parse_maps("1000-2000 rw-p 00000000 00:00 0\nbad line\n\n3000-4000 r--p 00000000 00:00 0 [heap]\n");
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn cutting_pads_tail() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let content: Vec<u8> = (0..(PAGE_SIZE * 2 + 100)).map(|i| (i % 251) as u8 + 1).collect();
        fs::write(&a, &content).unwrap();
        let set = read_paths(std::slice::from_ref(&a), None).unwrap();
        assert_eq!(set.pages(), 3);
        assert_eq!(set.data.len(), 3 * PAGE_SIZE);
        assert_eq!(&set.data[..content.len()], &content[..]);
        assert!(set.page(2)[100..].iter().all(|&b| b == 0));
        assert_eq!(set.page(2)[..100], content[2 * PAGE_SIZE..]);
        assert_eq!(set.iter().count(), 3);
        assert_eq!(set.sources, vec![a.display().to_string()]);
    }

    #[test]
    fn empty_file_has_no_pages() {
        let dir = tempfile::tempdir().unwrap();
        let e = dir.path().join("empty");
        fs::write(&e, b"").unwrap();
        let set = read_paths(&[e], None).unwrap();
        assert_eq!(set.pages(), 0);
        assert!(set.is_empty());
        assert!(set.sources.is_empty());
        // Exactly one page: no padding page added.
        let one = dir.path().join("one");
        fs::write(&one, vec![7u8; PAGE_SIZE]).unwrap();
        assert_eq!(read_paths(&[one], None).unwrap().pages(), 1);
    }

    #[test]
    fn directory_walk_sorted_skips_symlinks_and_fifos() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir(d.join("sub")).unwrap();
        fs::write(d.join("b"), [b'b'; 10]).unwrap();
        fs::write(d.join("a"), [b'a'; 10]).unwrap();
        fs::write(d.join("sub/c"), [b'c'; 10]).unwrap();
        fs::write(d.join("empty"), b"").unwrap();
        std::os::unix::fs::symlink(d.join("a"), d.join("link")).unwrap();
        let fifo = d.join("fifo");
        let st = Command::new("mkfifo").arg(&fifo).status();
        let set = read_paths(&[d.to_path_buf()], None).unwrap();
        assert_eq!(set.pages(), 3);
        assert_eq!(set.page(0)[0], b'a');
        assert_eq!(set.page(1)[0], b'b');
        assert_eq!(set.page(2)[0], b'c');
        assert_eq!(set.sources.len(), 3);
        if st.map(|s| s.success()).unwrap_or(false) {
            // An explicit special file is an error, not a hang.
            assert!(read_paths(&[fifo], None).is_err());
        }
    }

    #[test]
    fn max_bytes_stops_reading() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let mut f = File::create(&a).unwrap();
        f.write_all(&vec![1u8; PAGE_SIZE * 10]).unwrap();
        drop(f);
        let set = read_paths(&[a.clone(), a.clone()], Some(3 * PAGE_SIZE as u64)).unwrap();
        assert_eq!(set.pages(), 3);
        let set = read_paths(std::slice::from_ref(&a), Some(1)).unwrap();
        assert_eq!(set.pages(), 1);
        let set = read_paths(&[a.clone(), a], Some(15 * PAGE_SIZE as u64)).unwrap();
        assert_eq!(set.pages(), 15);
    }

    #[test]
    fn missing_path_is_clear_error() {
        let err = read_paths(&[PathBuf::from("/nonexistent/zmem-bench")], None).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/zmem-bench") && msg.contains("no such file"), "{msg}");
    }

    #[test]
    fn read_own_process() {
        // Make sure there is some recognisable anonymous memory.
        let marker: Vec<u8> = b"zmem-bench-marker!".repeat(100_000);
        let set = read_process(std::process::id(), Some(256 << 20)).unwrap();
        assert!(set.pages() > 0);
        assert_eq!(set.data.len() % PAGE_SIZE, 0);
        assert!(!set.sources.is_empty());
        assert!(set.data.len() <= 256 << 20);
        drop(marker);
    }

    #[test]
    fn read_missing_process_is_clear_error() {
        // PIDs are < 2^22 on Linux.
        let err = read_process(u32::MAX - 1, None).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("no such process"), "{msg}");
    }

    #[test]
    fn default_process_is_readable() {
        let mut child = match spawn_default_process(24 << 20) {
            Ok(c) => c,
            Err(e) => {
                zmem_testkit::ci::skip(&format!("default_process_is_readable: {e:#}"));
                return;
            }
        };
        let res = read_process(child.id(), Some(64 << 20));
        let _ = child.kill();
        let _ = child.wait();
        let set = res.unwrap();
        assert!(set.pages() > 1000, "only {} pages", set.pages());
        let hay = &set.data;
        assert!(hay.windows(12).any(|w| w == b"@example.com"), "python strings not found");
    }
}
