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
//! [`mount`] mounts the filesystem (`mount(2)`, so root) and serves it
//! itself: workers read requests from `/dev/fuse` (one cloned file each)
//! and answer them (`proto.rs` decodes the few requests a one-file file
//! system gets). The root directory holds one file, whose size is the
//! [`Export`]'s. Reads and
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
//! # Outliving a server
//! The connection lives as long as any process holds one of its files
//! ([`Channel`]). A process that keeps them (zmem-server's keeper) can start
//! a new server on them when the last one dies or is replaced:
//! [`Start::TakeOver`] has the kernel send again what the last one had
//! read and not answered (`FUSE_NOTIFY_RESEND`, Linux 6.9), so the
//! processes waiting on those requests see a pause, not an error
//! (`dev.rs`). fuser, which this crate used before, cannot start on a
//! connection past its INIT, hence the own loop.
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

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use zmem_export::{Export, ExportError};

mod dev;
mod proto;
pub use dev::inheritable;

/// An error a request is answered with (a positive errno).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Errno(i32);

impl Errno {
    const ENOENT: Errno = Errno(libc::ENOENT);
    const EPERM: Errno = Errno(libc::EPERM);
    const EISDIR: Errno = Errno(libc::EISDIR);
    const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    const ENOSPC: Errno = Errno(libc::ENOSPC);
    const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    const EINVAL: Errno = Errno(libc::EINVAL);
    const ERANGE: Errno = Errno(libc::ERANGE);
    const ENOSYS: Errno = Errno(libc::ENOSYS);
    const ENODATA: Errno = Errno(libc::ENODATA);
    const EPROTO: Errno = Errno(libc::EPROTO);

    fn code(self) -> i32 {
        self.0
    }
}

/// The root directory's inode and the file's.
const ROOT: u64 = 1;
const FILE: u64 = 2;
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
    /// Requests the kernel sent again because a server before this one had
    /// read them and died or was replaced before it answered.
    pub resent: AtomicU64,
    /// Reads served by the read threads ([`FuseConfig::read_threads`]).
    pub reads_handed_off: AtomicU64,
    /// How long reads and writes take to run.
    pub latency: zmem_core::LatencyHistogram,
}

/// What the file system answers, apart from the wire format: one directory
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
        let (mode, size, nlink) = if ino == ROOT { (libc::S_IFDIR | 0o700, 0, 2) } else { (libc::S_IFREG | 0o600, self.export.size(), 1) };
        Attr { ino, size, mode, nlink, uid: self.uid, gid: self.gid, time: self.born }
    }

    fn failed(&self, e: &ExportError) -> Errno {
        self.stats.errors.fetch_add(1, Relaxed);
        Errno(e.errno() as i32)
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, Errno> {
        if parent == ROOT && name == self.name.as_bytes() {
            Ok(self.attr(FILE))
        } else {
            Err(Errno::ENOENT)
        }
    }

    fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        if ino == ROOT || ino == FILE {
            Ok(self.attr(ino))
        } else {
            Err(Errno::ENOENT)
        }
    }

    /// The size is the device's; owners and modes are fixed (`fixed`: the
    /// request would change them). Times are accepted and ignored (tools
    /// touch them).
    fn setattr(&self, ino: u64, size: Option<u64>, fixed: bool) -> Result<Attr, Errno> {
        let size_ok = size.is_none_or(|s| ino == FILE && s == self.export.size());
        if ino != FILE && ino != ROOT || !size_ok || fixed {
            return Err(Errno::EPERM);
        }
        Ok(self.attr(ino))
    }

    /// Open the file (`dir` false) or the root (`dir` true); the file is
    /// opened for direct I/O (returns whether).
    fn open(&self, ino: u64, dir: bool) -> Result<bool, Errno> {
        match dir {
            false if ino == FILE => Ok(true),
            false => Err(Errno::EISDIR),
            true if ino == ROOT => Ok(false),
            true => Err(Errno::ENOTDIR),
        }
    }

    /// Whether a read of `size` bytes at `offset` may wait for a disk
    /// (`Export::read_may_wait`).
    fn read_may_wait(&self, ino: u64, offset: u64, size: u32) -> bool {
        ino == FILE && self.export.read_may_wait(offset, size.into())
    }

    /// Read into `buf` from `offset`; returns the bytes read (short at the
    /// end of the file).
    fn read(&self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        if ino != FILE {
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
        if ino != FILE {
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
        if ino != FILE {
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
        if ino != ROOT {
            return Err(Errno::ENOTDIR);
        }
        let dir = u32::from(libc::DT_DIR);
        Ok([(ROOT, dir, "."), (ROOT, dir, ".."), (FILE, u32::from(libc::DT_REG), &*self.name)])
    }

    /// A full device of one file: nothing free, two inodes.
    fn statfs(&self) -> Statfs {
        let b = BLKSIZE as u64;
        Statfs { blocks: self.export.size() / b, bfree: 0, bavail: 0, files: 2, ffree: 0, bsize: BLKSIZE, namelen: 255, frsize: BLKSIZE }
    }
}

/// The largest read handed to a read thread ([`FuseConfig::read_threads`]):
/// a swap-in and the kernel's read-ahead around it. Larger reads are
/// served where they were read, so a read thread's buffer stays small.
pub const HANDED_OFF_MAX: u32 = 128 << 10;

/// Reads waiting for a read thread at most (the kernel's
/// `max_background`: as many as it sends at once); past it a read is
/// served where it was read.
const HANDED_OFF_QUEUE: usize = 256;

/// Whether requests are still taken, and how many are being answered: a
/// server that leaves its connection to the next one ([`Mounted::leave`])
/// finishes what it started and leaves the rest unanswered, for the
/// kernel to send again.
#[derive(Default)]
struct Gate {
    closed: AtomicBool,
    active: AtomicUsize,
}

impl Gate {
    /// Enter to answer a request just read; false once closed (the request
    /// is left unanswered, and [`Gate::leave`] is not called).
    fn enter(&self) -> bool {
        self.active.fetch_add(1, SeqCst);
        if self.closed.load(SeqCst) {
            self.active.fetch_sub(1, SeqCst);
            return false;
        }
        true
    }

    fn leave(&self) {
        self.active.fetch_sub(1, SeqCst);
    }
}

/// A read handed to a read thread: answered through the file it was read from.
struct ReadJob {
    fd: Arc<OwnedFd>,
    unique: u64,
    ino: u64,
    offset: u64,
    size: u32,
}

/// Serve `job` into `buf` (grown to its size if short) and answer it.
fn answer_read(ops: &FileOps, job: &ReadJob, buf: &mut Vec<u8>) {
    let size = job.size as usize;
    if buf.len() < size {
        buf.resize(size, 0);
    }
    let (err, n) = match ops.read(job.ino, job.offset, &mut buf[..size]) {
        Ok(n) => (0, n),
        Err(e) => (-e.code(), 0),
    };
    send(&job.fd, job.unique, err, &buf[..n]);
}

/// Answer request `unique` through `fd`.
fn send(fd: &OwnedFd, unique: u64, err: i32, body: &[u8]) {
    if let Err(e) = dev::reply(fd.as_fd(), &proto::out_header(unique, err, body.len()), body) {
        tracing::warn!("answering FUSE request {unique:#x}: {e}");
    }
}

/// Start `n` read threads, each with its buffer written now (a read
/// faults in no new memory, as a worker's reply buffer); they end once
/// every sender of the returned queue is dropped and it is drained.
fn start_readers(ops: &Arc<FileOps>, gate: &Arc<Gate>, n: usize) -> io::Result<(crossbeam_channel::Sender<ReadJob>, Vec<std::thread::JoinHandle<()>>)> {
    let (tx, rx) = crossbeam_channel::bounded::<ReadJob>(HANDED_OFF_QUEUE);
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let (ops, gate, rx) = (Arc::clone(ops), Arc::clone(gate), rx.clone());
        threads.push(std::thread::Builder::new().name(format!("zmem-fuse-rd{i}")).spawn(move || {
            let mut buf = vec![0xa5u8; HANDED_OFF_MAX as usize];
            for job in rx {
                ops.stats.reads_handed_off.fetch_add(1, Relaxed);
                answer_read(&ops, &job, &mut buf);
                gate.leave();
            }
        })?);
    }
    Ok((tx, threads))
}

/// A read request's offset and size (`fuse_read_in`), if well formed.
fn read_args(args: &[u8]) -> Option<(u64, u32)> {
    Some((proto::u64_at(args, 8)?, proto::u32_at(args, 16)?))
}

/// What a request buffer must hold: the largest write and its headers
/// (the kernel refuses a read into less).
const REQUEST_BUF: usize = MAX_IO as usize + 4096;

/// A worker: read requests from `fd` and answer them, until the
/// connection is gone.
fn work(ops: &FileOps, gate: &Gate, fd: &Arc<OwnedFd>, readers: Option<&crossbeam_channel::Sender<ReadJob>>) {
    // Zeroed, so left untouched until the kernel writes a request there:
    // memory only for the largest request actually sent.
    let mut req = vec![0u8; REQUEST_BUF];
    // Written now (not zero: calloc would leave the pages untouched), at
    // the size of a swap-in and the kernel's read-ahead around it: such a
    // read faults in no new memory (a swap server whose page faults land
    // in a full memory cgroup can end up waiting on its own swap-out). A
    // larger read grows it once.
    let mut out = vec![0xa5u8; HANDED_OFF_MAX as usize];
    loop {
        let n = match dev::read_request(fd.as_fd(), &mut req) {
            Ok(dev::Read::Request(n)) => n,
            Ok(dev::Read::Gone) => return,
            Err(e) => {
                tracing::error!("reading FUSE requests: {e}; this worker stops");
                return;
            }
        };
        let Some((h, args)) = proto::InHeader::parse(&req[..n]) else {
            tracing::warn!("a FUSE request shorter than its header ({n} bytes): ignored");
            continue;
        };
        if h.unique & RESENT != 0 {
            ops.stats.resent.fetch_add(1, Relaxed);
        }
        if !proto::answered(h.opcode) {
            continue;
        }
        if !gate.enter() {
            // This server is leaving: the request stays with the kernel,
            // which sends it to the next one. Nothing more is read here.
            loop {
                std::thread::park();
            }
        }
        if let (proto::READ, Some((offset, size))) = (h.opcode, read_args(args)) {
            let job = ReadJob { fd: Arc::clone(fd), unique: h.unique, ino: h.nodeid, offset, size };
            match readers {
                Some(tx) if size <= HANDED_OFF_MAX && ops.read_may_wait(h.nodeid, offset, size) => match tx.try_send(job) {
                    // (The read thread leaves the gate.)
                    Ok(()) => continue,
                    // The queue is full (or the threads are gone): serve it here.
                    Err(e) => answer_read(ops, &e.into_inner(), &mut out),
                },
                _ if size <= MAX_IO => answer_read(ops, &job, &mut out),
                _ => send(fd, h.unique, -libc::EINVAL, &[]),
            }
        } else {
            let (err, len) = proto::dispatch(ops, &h, args, &mut out);
            send(fd, h.unique, err, &out[..len]);
        }
        gate.leave();
    }
}

/// The bit the kernel sets in a request's `unique` when it sends it again
/// (`FUSE_UNIQUE_RESEND`): a server before this one had read it.
const RESENT: u64 = 1 << 63;

/// The files of one FUSE connection: the mount's first, then one clone per
/// worker. Whoever holds them keeps the connection, and the requests read
/// through them and not yet answered (`dev.rs`).
pub struct Channel {
    fds: Vec<Arc<OwnedFd>>,
}

impl Channel {
    /// Mount a new FUSE filesystem at `mountpoint` (an existing empty
    /// directory) with a file for each of `workers` workers (1 to 64).
    /// Needs root.
    pub fn mount(mountpoint: &Path, workers: usize, allow_other: bool) -> io::Result<Channel> {
        let first = dev::mount(mountpoint, allow_other)?;
        let mut fds = vec![Arc::new(first)];
        for _ in 0..workers.clamp(1, 64) {
            match dev::clone(fds[0].as_fd()) {
                Ok(fd) => fds.push(Arc::new(fd)),
                Err(e) => {
                    let _ = dev::unmount(mountpoint);
                    return Err(e);
                }
            }
        }
        Ok(Channel { fds })
    }

    /// The files another process kept (in [`Channel::fds`]'s order).
    pub fn from_fds(fds: Vec<OwnedFd>) -> io::Result<Channel> {
        if fds.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a FUSE channel needs its files"));
        }
        Ok(Channel { fds: fds.into_iter().map(Arc::new).collect() })
    }

    /// Its files, the mount's first.
    pub fn fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.fds.iter().map(|f| f.as_fd())
    }

    /// The files workers read: the clones (the mount's file where there
    /// are none).
    fn worker_fds(&self) -> &[Arc<OwnedFd>] {
        if self.fds.len() > 1 {
            &self.fds[1..]
        } else {
            &self.fds
        }
    }
}

/// How a server starts on a [`Channel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// A connection just mounted: the kernel's INIT comes first.
    Fresh,
    /// A connection another server served and left (it died or was
    /// replaced): its unanswered requests are sent again.
    TakeOver,
}

/// Answer the kernel's INIT, the first request on a new connection.
fn handshake(ops: &FileOps, fd: &OwnedFd) -> io::Result<()> {
    let mut req = vec![0u8; REQUEST_BUF];
    let n = match dev::read_request(fd.as_fd(), &mut req)? {
        dev::Read::Request(n) => n,
        dev::Read::Gone => return Err(io::Error::other("the FUSE connection went away before INIT")),
    };
    let (h, args) = proto::InHeader::parse(&req[..n]).ok_or_else(|| io::Error::other("a short FUSE request before INIT"))?;
    if h.opcode != proto::INIT {
        send(fd, h.unique, -libc::EIO, &[]);
        return Err(io::Error::other(format!("the first FUSE request was opcode {}, not INIT", h.opcode)));
    }
    let mut out = [0u8; 128];
    let (err, len) = proto::dispatch(ops, &h, args, &mut out);
    send(fd, h.unique, err, &out[..len]);
    if err != 0 {
        return Err(io::Error::from_raw_os_error(-err));
    }
    Ok(())
}

/// A served image; unmounts (and stops its threads) when dropped or on
/// [`Mounted::unmount`].
pub struct Mounted {
    mountpoint: std::path::PathBuf,
    stats: Arc<FuseStats>,
    gate: Arc<Gate>,
    workers: Vec<std::thread::JoinHandle<()>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    channel: Option<Channel>,
}

impl Mounted {
    pub fn stats(&self) -> &Arc<FuseStats> {
        &self.stats
    }

    /// The connection's files ([`Channel::fds`]), for a keeper to hold.
    pub fn fds(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.channel.iter().flat_map(Channel::fds)
    }

    /// Unmount and wait for the threads.
    pub fn unmount(mut self) -> io::Result<()> {
        self.stop()
    }

    /// Stop taking requests and finish those being answered (waiting at
    /// most `limit`), leaving the connection mounted for the next server
    /// ([`Start::TakeOver`]): the process exits next. Returns whether every
    /// request taken was answered (if not, the next server gets the rest
    /// again, as after a crash).
    pub fn leave(self, limit: Duration) -> bool {
        self.gate.closed.store(true, SeqCst);
        let end = std::time::Instant::now() + limit;
        while self.gate.active.load(SeqCst) > 0 && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        let drained = self.gate.active.load(SeqCst) == 0;
        // Neither unmount nor close: the files stay open (the keeper holds
        // them too) until the process exits.
        std::mem::forget(self);
        drained
    }

    fn stop(&mut self) -> io::Result<()> {
        let Some(channel) = self.channel.take() else { return Ok(()) };
        let r = dev::unmount(&self.mountpoint);
        // The workers end at ENODEV, and with them the read threads' queue.
        // (If the unmount failed, the threads are left to the process's exit.)
        let limit = if r.is_ok() { Duration::from_secs(5) } else { Duration::ZERO };
        join_within(std::mem::take(&mut self.workers), limit, "a FUSE worker");
        join_within(std::mem::take(&mut self.readers), limit, "a FUSE read thread");
        drop(channel);
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

/// Serve `export` as the file `cfg.file_name` on `channel`, the FUSE
/// connection mounted at `mountpoint` ([`Channel::mount`], here or by the
/// process that kept it): one worker per file of the channel.
pub fn serve(export: Arc<Export>, mountpoint: &Path, channel: Channel, cfg: &FuseConfig, start: Start) -> io::Result<Mounted> {
    if cfg.file_name.is_empty() || cfg.file_name.contains('/') || cfg.file_name == "." || cfg.file_name == ".." {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad file name {:?}", cfg.file_name)));
    }
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
    let gate = Arc::new(Gate::default());
    let mut m = Mounted { mountpoint: mountpoint.to_path_buf(), stats, gate: Arc::clone(&gate), workers: Vec::new(), readers: Vec::new(), channel: None };
    if start == Start::Fresh {
        handshake(&ops, &channel.fds[0])?;
    }
    let queue = match cfg.read_threads {
        n if n > 0 => {
            let (tx, threads) = start_readers(&ops, &gate, n.min(64))?;
            m.readers = threads;
            Some(tx)
        }
        _ => None,
    };
    let fds: Vec<Arc<OwnedFd>> = channel.worker_fds().to_vec();
    m.channel = Some(channel);
    for (i, fd) in fds.into_iter().enumerate() {
        let (ops, gate, queue) = (Arc::clone(&ops), Arc::clone(&gate), queue.clone());
        // (On an error, `m` drops: unmount, and the threads end.)
        m.workers.push(std::thread::Builder::new().name(format!("zmem-fuse{i}")).spawn(move || work(&ops, &gate, &fd, queue.as_ref()))?);
    }
    drop(queue);
    if start == Start::TakeOver {
        let fd = m.channel.as_ref().map(|c| Arc::clone(&c.fds[0]));
        if let Some(fd) = fd {
            if let Err(e) = dev::resend(fd.as_fd()) {
                // Before Linux 6.9: what the last server had read and not
                // answered is never answered (its processes wait).
                tracing::error!("FUSE_NOTIFY_RESEND failed ({e}; it needs Linux 6.9): the requests the last server left unanswered stay so");
            }
        }
    }
    Ok(m)
}

/// Mount `export` as the file `cfg.file_name` in a new FUSE filesystem at
/// `mountpoint` (an existing empty directory) and serve it. Needs root.
pub fn mount(export: Arc<Export>, mountpoint: &Path, cfg: &FuseConfig) -> io::Result<Mounted> {
    let channel = Channel::mount(mountpoint, cfg.threads, cfg.allow_other)?;
    match serve(export, mountpoint, channel, cfg, Start::Fresh) {
        Ok(m) => Ok(m),
        Err(e) => {
            // (serve dropped the channel on its error paths after INIT; a
            // failed INIT leaves the mount to undo here.)
            let _ = dev::unmount(mountpoint);
            Err(e)
        }
    }
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
