//! A zmem pool as one file in a FUSE filesystem.
//!
//! # Why
//! Swap needs a kernel block device. zram is one inside the kernel; a
//! userspace zram needs a kernel driver to carry its requests out. The NBD
//! driver does that where the kernel has it, but many kernels (this VM's
//! among them) have no `nbd` module, and the workaround, nbdfuse plus a
//! loop device, puts a second process and an NBD socket on every page's
//! path. FUSE is in every distribution kernel: zmem serves the pool as one
//! regular file, `image`, in a filesystem of its own, and a loop device with
//! direct I/O over that file is the block device. A page the kernel swaps
//! out goes loop → FUSE → this process → the pool: one hop. `zmem serve
//! --fuse` serves any export this way, the caching device of `--origin`
//! among them (`zmem bench cache` compares it with nbdfuse).
//!
//! # How
//! [`mount`] builds the filesystem on [`fuser`] (pure Rust, no libfuse): the
//! root directory holds one file, whose size is the [`Export`]'s. Reads and
//! writes go to the export (page `i` of the file is pool key `i`; partial
//! pages are read-modify-written under the export's per-page lock), so the
//! file and an NBD export of the same pool are byte for byte the same
//! device. The file is opened with `FOPEN_DIRECT_IO`, so the kernel keeps
//! no page cache of it (a swapped-out page must not sit in RAM twice, and
//! loop's direct I/O needs it). `fallocate(PUNCH_HOLE)`, which a loop
//! device sends for a discard (swap's freed slots with `swapon --discard`),
//! drops the pages from the pool: zram's `notify_free`. `ZERO_RANGE` stores
//! zero pages; plain allocation succeeds and changes nothing (the pool
//! gives memory on write). Everything else that would change the tree
//! (create, rename, truncate to another size) is refused with `EPERM`.
//!
//! # Trade-offs
//! Each request costs a read and a write on `/dev/fuse` and hand-offs
//! between threads: the loop device's worker, a FUSE worker here, the
//! block layer's completion. The syscalls are cheap; the hand-offs are
//! not, because each is a wake-up, and a wake-up that crosses to a CPU
//! asleep is the dearest thing on the path (on a VM most of all). zram has
//! none: the kernel calls it in the faulting thread. `zmem bench
//! blockdev`'s `read-qd1` job measures one synchronous 4 KiB read through
//! this file against zram (figures in docs/MEASUREMENTS.md). Several workers (each
//! with its own cloned fd) serve requests in parallel. (The kernel's
//! FUSE-over-io_uring transport was tried and lost on swap: its
//! measurements are in docs/experiments/, its code in git history.)

#![deny(unsafe_code)]

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags, KernelConfig, LockOwner, MountOption,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, SessionACL, WriteFlags,
};
use zmem_export::{Export, ExportError};

const ROOT: INodeNo = INodeNo::ROOT;
const FILE: INodeNo = INodeNo(2);
/// Attributes never change behind the kernel's back: cache them for long.
const TTL: Duration = Duration::from_secs(3600);
/// Largest read or write the kernel may send (FUSE's own maximum).
const MAX_IO: u32 = 1 << 20;

/// How the filesystem is mounted.
#[derive(Clone, Debug)]
pub struct FuseConfig {
    /// Name of the one file in the filesystem's root.
    pub file_name: String,
    /// Threads reading `/dev/fuse` (each with its own cloned descriptor;
    /// 1 to 64, others are brought into that range).
    pub threads: usize,
    /// Let users other than the mounter open the file (`allow_other`). The
    /// file's mode is 0600 either way.
    pub allow_other: bool,
    /// Threads that serve, off the `/dev/fuse` workers, the reads that may
    /// wait for a disk (a page written back to the pool's cold store, or
    /// one a cache must fetch from its origin: `Export::read_may_wait`) of
    /// at most [`HANDED_OFF_MAX`] bytes: the workers go on to the requests
    /// the pool answers from RAM, and the disk gets as many reads at once
    /// as there are threads here, not as there are workers. 0 serves every
    /// read on the worker that read it; more than 64 are 64.
    pub read_threads: usize,
}

impl Default for FuseConfig {
    fn default() -> Self {
        FuseConfig { file_name: "image".into(), threads: 2, allow_other: false, read_threads: 0 }
    }
}

/// Requests served, by kind (for `zmem stat` and the path-cost figures).
#[derive(Debug, Default)]
pub struct FuseStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub discards: AtomicU64,
    pub errors: AtomicU64,
    /// Reads served by the read threads ([`FuseConfig::read_threads`]).
    pub reads_handed_off: AtomicU64,
    /// How long reads and writes take to run.
    pub latency: zmem_core::LatencyHistogram,
}

/// What the file system answers, apart from fuser's types: one directory
/// holding one file over the export.
struct FileOps {
    export: Arc<Export>,
    name: String,
    uid: u32,
    gid: u32,
    /// Mount time (seconds and nanoseconds since the epoch): every time
    /// stamp the file system shows.
    born: (u64, u32),
    stats: Arc<FuseStats>,
}

/// An inode's attributes.
struct Attr {
    ino: u64,
    size: u64,
    /// File type and permission bits (`st_mode`).
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    time: (u64, u32),
}

/// The block size the file system reports (`st_blksize`, `f_bsize`).
const BLKSIZE: u32 = 4096;

impl Attr {
    /// 512-byte blocks (`st_blocks`).
    fn blocks(&self) -> u64 {
        self.size.div_ceil(512)
    }
}

/// `statfs`, in `struct fuse_kstatfs`'s order.
struct Statfs {
    blocks: u64,
    bfree: u64,
    bavail: u64,
    files: u64,
    ffree: u64,
    bsize: u32,
    namelen: u32,
    frsize: u32,
}

impl FileOps {
    fn attr(&self, ino: u64) -> Attr {
        let (mode, size, nlink) = if ino == ROOT.0 { (libc::S_IFDIR | 0o700, 0, 2) } else { (libc::S_IFREG | 0o600, self.export.size(), 1) };
        Attr { ino, size, mode, nlink, uid: self.uid, gid: self.gid, time: self.born }
    }

    fn failed(&self, e: &ExportError) -> Errno {
        self.stats.errors.fetch_add(1, Relaxed);
        Errno::from_i32(e.errno() as i32)
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, Errno> {
        if parent == ROOT.0 && name == self.name.as_bytes() {
            Ok(self.attr(FILE.0))
        } else {
            Err(Errno::ENOENT)
        }
    }

    fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        if ino == ROOT.0 || ino == FILE.0 {
            Ok(self.attr(ino))
        } else {
            Err(Errno::ENOENT)
        }
    }

    /// The size is the device's; owners and modes are fixed (`fixed`: the
    /// request would change them). Times are accepted and ignored (tools
    /// touch them).
    fn setattr(&self, ino: u64, size: Option<u64>, fixed: bool) -> Result<Attr, Errno> {
        let size_ok = size.is_none_or(|s| ino == FILE.0 && s == self.export.size());
        if ino != FILE.0 && ino != ROOT.0 || !size_ok || fixed {
            return Err(Errno::EPERM);
        }
        Ok(self.attr(ino))
    }

    /// Open the file (`dir` false) or the root (`dir` true); the file is
    /// opened for direct I/O (returns whether).
    fn open(&self, ino: u64, dir: bool) -> Result<bool, Errno> {
        match dir {
            false if ino == FILE.0 => Ok(true),
            false => Err(Errno::EISDIR),
            true if ino == ROOT.0 => Ok(false),
            true => Err(Errno::ENOTDIR),
        }
    }

    /// Whether a read of `size` bytes at `offset` may wait for a disk
    /// (`Export::read_may_wait`).
    fn read_may_wait(&self, ino: u64, offset: u64, size: u32) -> bool {
        ino == FILE.0 && self.export.read_may_wait(offset, size.into())
    }

    /// Read into `buf` from `offset`; returns the bytes read (short at the
    /// end of the file).
    fn read(&self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        if ino != FILE.0 {
            return Err(Errno::EISDIR);
        }
        let n = (buf.len() as u64).min(self.export.size().saturating_sub(offset)) as usize;
        let t = std::time::Instant::now();
        self.export.read(offset, &mut buf[..n]).map_err(|e| self.failed(&e))?;
        self.stats.latency.observe(t.elapsed());
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.bytes_read.fetch_add(n as u64, Relaxed);
        Ok(n)
    }

    fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        if ino != FILE.0 {
            return Err(Errno::EISDIR);
        }
        // The file cannot grow: a write past its end is ENOSPC, as on a
        // block device.
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > self.export.size()) {
            self.stats.errors.fetch_add(1, Relaxed);
            return Err(Errno::ENOSPC);
        }
        let t = std::time::Instant::now();
        self.export.write(offset, data).map_err(|e| self.failed(&e))?;
        self.stats.latency.observe(t.elapsed());
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats.bytes_written.fetch_add(data.len() as u64, Relaxed);
        Ok(data.len() as u32)
    }

    fn fallocate(&self, ino: u64, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        if ino != FILE.0 {
            return Err(Errno::EISDIR);
        }
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let known = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        let end = offset.checked_add(length);
        if mode & !known != 0 || (punch && !keep) || end.is_none() {
            return Err(Errno::EOPNOTSUPP);
        }
        let size = self.export.size();
        // Past the end: nothing to free or zero there, and the file cannot grow.
        let length = end.unwrap_or(u64::MAX).min(size).saturating_sub(offset);
        if offset >= size {
            return if punch || keep { Ok(()) } else { Err(Errno::ENOSPC) };
        }
        let r = if punch {
            // Whole pages leave the pool; the edges of partial pages are zeroed.
            self.stats.discards.fetch_add(1, Relaxed);
            self.export.write_zeroes(offset, length, false)
        } else if zero {
            self.export.write_zeroes(offset, length, true)
        } else {
            Ok(())
        };
        r.map_err(|e| self.failed(&e))
    }

    /// Every write is in the pool before it is answered; a cache's origin
    /// is flushed (a loop device's FLUSH arrives as this fsync).
    fn fsync(&self) -> Result<(), Errno> {
        self.export.flush().map_err(|e| self.failed(&e))
    }

    /// The root's entries: inode, `DT_*` type, name.
    fn readdir(&self, ino: u64) -> Result<[(u64, u32, &str); 3], Errno> {
        if ino != ROOT.0 {
            return Err(Errno::ENOTDIR);
        }
        let dir = u32::from(libc::DT_DIR);
        Ok([(ROOT.0, dir, "."), (ROOT.0, dir, ".."), (FILE.0, u32::from(libc::DT_REG), &*self.name)])
    }

    /// A full device of one file: nothing free, two inodes.
    fn statfs(&self) -> Statfs {
        let b = BLKSIZE as u64;
        Statfs { blocks: self.export.size() / b, bfree: 0, bavail: 0, files: 2, ffree: 0, bsize: BLKSIZE, namelen: 255, frsize: BLKSIZE }
    }
}

/// fuser's side: the `/dev/fuse` loop, and INIT.
struct ImageFs {
    ops: Arc<FileOps>,
    /// Read buffers, one per worker, allocated and written when the image
    /// is mounted for a swap-in and the kernel's read-ahead around it
    /// ([`HANDED_OFF_MAX`]): such a read faults in no new memory. (A swap
    /// server whose page faults land in a full memory cgroup can end up
    /// waiting on its own swap-out.) A larger read grows its buffer once;
    /// buffers of the largest request ([`MAX_IO`]) held a swap server's
    /// memory for reads a swap device is not sent.
    bufs: std::sync::Mutex<Vec<Vec<u8>>>,
    /// The read threads' queue ([`FuseConfig::read_threads`]); dropped
    /// with the session, which ends them.
    readers: Option<crossbeam_channel::Sender<ReadJob>>,
}

/// The largest read handed to a read thread ([`FuseConfig::read_threads`]):
/// a swap-in and the kernel's read-ahead around it. Larger reads are
/// served where they were read, so a read thread's buffer stays small.
pub const HANDED_OFF_MAX: u32 = 128 << 10;

/// Reads waiting for a read thread at most (the kernel's
/// `max_background`: as many as it sends at once); past it a read is
/// served where it was read.
const HANDED_OFF_QUEUE: usize = 256;

/// A read handed to a read thread.
struct ReadJob {
    ino: u64,
    offset: u64,
    size: u32,
    reply: ReplyData,
}

/// Serve `job` into `buf` (grown to its size if short) and answer it.
fn answer_read(ops: &FileOps, job: ReadJob, buf: &mut Vec<u8>) {
    let size = job.size as usize;
    if buf.len() < size {
        buf.resize(size, 0);
    }
    match ops.read(job.ino, job.offset, &mut buf[..size]) {
        Ok(n) => job.reply.data(&buf[..n]),
        Err(e) => job.reply.error(e),
    }
}

/// Start `n` read threads, each with its buffer written now (a read
/// faults in no new memory, as [`ImageFs::bufs`]); they end once the
/// returned queue is dropped and drained.
fn start_readers(ops: &Arc<FileOps>, n: usize) -> io::Result<(crossbeam_channel::Sender<ReadJob>, Vec<std::thread::JoinHandle<()>>)> {
    let (tx, rx) = crossbeam_channel::bounded::<ReadJob>(HANDED_OFF_QUEUE);
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let (ops, rx) = (Arc::clone(ops), rx.clone());
        threads.push(std::thread::Builder::new().name(format!("zmem-fuse-rd{i}")).spawn(move || {
            let mut buf = vec![0xa5u8; HANDED_OFF_MAX as usize];
            for job in rx {
                ops.stats.reads_handed_off.fetch_add(1, Relaxed);
                answer_read(&ops, job, &mut buf);
            }
        })?);
    }
    Ok((tx, threads))
}

/// Join `threads`, waiting at most `limit` in all: one still running then
/// (`what`) is left to the process's exit.
fn join_within(threads: Vec<std::thread::JoinHandle<()>>, limit: Duration, what: &str) {
    let end = std::time::Instant::now() + limit;
    for t in threads {
        while !t.is_finished() && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        if t.is_finished() {
            let _ = t.join();
        } else {
            tracing::warn!("{what} did not end at unmount; leaving it");
        }
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    let t = SystemTime::UNIX_EPOCH + Duration::new(a.time.0, a.time.1);
    let kind = if a.mode & libc::S_IFMT == libc::S_IFDIR { FileType::Directory } else { FileType::RegularFile };
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks(),
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind,
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

impl Filesystem for ImageFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Big requests where the kernel allows them; parallel direct I/O.
        let _ = config.set_max_write(MAX_IO);
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO | InitFlags::FUSE_PARALLEL_DIROPS);
        let _ = config.set_max_background(256);
        let _ = config.set_congestion_threshold(192);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.ops.lookup(parent.0, name.as_encoded_bytes()) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), fuser::Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.ops.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.ops.setattr(ino.0, size, mode.is_some() || uid.is_some() || gid.is_some()) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.ops.open(ino.0, false) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, size: u32, _flags: OpenFlags, _lock_owner: Option<LockOwner>, reply: ReplyData) {
        let job = ReadJob { ino: ino.0, offset, size, reply };
        let job = match &self.readers {
            Some(tx) if size <= HANDED_OFF_MAX && self.ops.read_may_wait(ino.0, offset, size) => match tx.try_send(job) {
                Ok(()) => return,
                // The queue is full (or the threads are gone): serve it here.
                Err(e) => e.into_inner(),
            },
            _ => job,
        };
        let mut buf = self.bufs.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
        answer_read(&self.ops, job, &mut buf);
        self.bufs.lock().unwrap_or_else(|p| p.into_inner()).push(buf);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.ops.write(ino.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        match self.ops.fallocate(ino.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.ops.fsync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.ops.open(ino.0, true) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = match self.ops.readdir(ino.0) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            let kind = if *kind == u32::from(libc::DT_DIR) { FileType::Directory } else { FileType::RegularFile };
            if reply.add(INodeNo(*ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: fuser::ReplyXattr) {
        // No extended attributes (the kernel asks for security.capability
        // before every write by a privileged process).
        reply.error(Errno::ENODATA);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.ops.statfs();
        reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize);
    }
}

/// A mounted image; unmounts (and stops its threads) when dropped or on
/// [`Mounted::unmount`].
pub struct Mounted {
    session: Option<BackgroundSession>,
    stats: Arc<FuseStats>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Mounted {
    pub fn stats(&self) -> &Arc<FuseStats> {
        &self.stats
    }

    /// Unmount and wait for the session's threads.
    pub fn unmount(mut self) -> io::Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> io::Result<()> {
        let r = match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        };
        // (If the unmount failed, the threads are left to the process's exit.)
        let limit = if r.is_ok() { Duration::from_secs(5) } else { Duration::ZERO };
        // The session's end dropped the read threads' queue.
        join_within(std::mem::take(&mut self.readers), limit, "a FUSE read thread");
        r
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("unmounting the zmem FUSE image failed: {e}");
        }
    }
}

/// Mount `export` as the file `cfg.file_name` in a new FUSE filesystem at
/// `mountpoint` (an existing empty directory). Needs root, or a user
/// allowed to mount FUSE filesystems.
pub fn mount(export: Arc<Export>, mountpoint: &Path, cfg: &FuseConfig) -> io::Result<Mounted> {
    if cfg.file_name.is_empty() || cfg.file_name.contains('/') || cfg.file_name == "." || cfg.file_name == ".." {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad file name {:?}", cfg.file_name)));
    }
    let threads = cfg.threads.clamp(1, 64);
    let stats = Arc::new(FuseStats::default());
    let born = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let ops = Arc::new(FileOps {
        export,
        name: cfg.file_name.clone(),
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
        born: (born.as_secs(), born.subsec_nanos()),
        stats: Arc::clone(&stats),
    });
    // (On an error below, the filesystem, and with it the read threads'
    // queue, is dropped: the threads end on their own.)
    let (queue, readers) = match cfg.read_threads {
        n if n > 0 => {
            let (tx, threads) = start_readers(&ops, n.min(64))?;
            (Some(tx), threads)
        }
        _ => (None, Vec::new()),
    };
    let fs = ImageFs {
        ops: Arc::clone(&ops),
        // Not zero: calloc would leave the pages untouched.
        bufs: std::sync::Mutex::new((0..threads).map(|_| vec![0xa5u8; HANDED_OFF_MAX as usize]).collect()),
        readers: queue,
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("zmem".into()),
        MountOption::Subtype("zmem".into()),
        MountOption::NoExec,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
    ];
    config.acl = if cfg.allow_other { SessionACL::All } else { SessionACL::Owner };
    config.n_threads = Some(threads);
    config.clone_fd = true;
    let session = fuser::Session::new(fs, mountpoint, &config)?;
    Ok(Mounted { session: Some(session.spawn()?), stats, readers })
}
