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
//! among them (`zmem bench cache`: sequential re-reads 4.5 × the bare
//! disk through this file, 1.5–2.2 × through nbdfuse).
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
//! Each request costs a read and a write on `/dev/fuse` and a switch to a
//! worker thread; several workers (each with its own cloned fd) serve
//! requests in parallel. The kernel's FUSE-over-io_uring transport would
//! cut the syscalls; this crate uses the classic device until a benchmark
//! shows the syscalls are what limits swap.

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
    /// Threads reading `/dev/fuse` (each with its own cloned descriptor).
    pub threads: usize,
    /// Let users other than the mounter open the file (`allow_other`). The
    /// file's mode is 0600 either way.
    pub allow_other: bool,
}

impl Default for FuseConfig {
    fn default() -> Self {
        FuseConfig { file_name: "image".into(), threads: 2, allow_other: false }
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
}

/// The filesystem: one directory holding one file over the export.
struct ImageFs {
    export: Arc<Export>,
    name: String,
    uid: u32,
    gid: u32,
    born: SystemTime,
    stats: Arc<FuseStats>,
    /// Read buffers, one per worker, allocated and written when the image
    /// is mounted: a read faults in no new memory. (A swap server whose
    /// page faults land in a full memory cgroup can end up waiting on its
    /// own swap-out.)
    bufs: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl ImageFs {
    fn attr(&self, ino: INodeNo) -> FileAttr {
        let (kind, perm, size, nlink) = if ino == ROOT { (FileType::Directory, 0o700, 0, 2) } else { (FileType::RegularFile, 0o600, self.export.size(), 1) };
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
            crtime: self.born,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn failed(&self, e: &ExportError) -> Errno {
        self.stats.errors.fetch_add(1, Relaxed);
        Errno::from_i32(e.errno() as i32)
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
        if parent == ROOT && name == OsStr::new(&self.name) {
            reply.entry(&TTL, &self.attr(FILE), fuser::Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == ROOT || ino == FILE {
            reply.attr(&TTL, &self.attr(ino));
        } else {
            reply.error(Errno::ENOENT);
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
        // The size is the device's; owners and modes are fixed. Times are
        // accepted and ignored (tools touch them).
        let size_ok = size.is_none_or(|s| ino == FILE && s == self.export.size());
        if ino != FILE && ino != ROOT || !size_ok || mode.is_some() || uid.is_some() || gid.is_some() {
            reply.error(Errno::EPERM);
            return;
        }
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == FILE {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        } else {
            reply.error(Errno::EISDIR);
        }
    }

    fn read(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, size: u32, _flags: OpenFlags, _lock_owner: Option<LockOwner>, reply: ReplyData) {
        if ino != FILE {
            reply.error(Errno::EISDIR);
            return;
        }
        // A read past the end is short (zero bytes at or after it).
        let n = (size as u64).min(self.export.size().saturating_sub(offset)) as usize;
        let mut buf = self.bufs.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
        if buf.len() < n {
            buf.resize(n, 0);
        }
        match self.export.read(offset, &mut buf[..n]) {
            Ok(()) => {
                self.stats.reads.fetch_add(1, Relaxed);
                self.stats.bytes_read.fetch_add(n as u64, Relaxed);
                reply.data(&buf[..n]);
            }
            Err(e) => reply.error(self.failed(&e)),
        }
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
        if ino != FILE {
            reply.error(Errno::EISDIR);
            return;
        }
        // The file cannot grow: a write past its end is ENOSPC, as on a
        // block device.
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > self.export.size()) {
            self.stats.errors.fetch_add(1, Relaxed);
            reply.error(Errno::ENOSPC);
            return;
        }
        match self.export.write(offset, data) {
            Ok(()) => {
                self.stats.writes.fetch_add(1, Relaxed);
                self.stats.bytes_written.fetch_add(data.len() as u64, Relaxed);
                reply.written(data.len() as u32);
            }
            Err(e) => reply.error(self.failed(&e)),
        }
    }

    fn fallocate(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        if ino != FILE {
            reply.error(Errno::EISDIR);
            return;
        }
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let known = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        let end = offset.checked_add(length);
        if mode & !known != 0 || (punch && !keep) || end.is_none() {
            reply.error(Errno::EOPNOTSUPP);
            return;
        }
        let size = self.export.size();
        // Past the end: nothing to free or zero there, and the file cannot grow.
        let length = end.unwrap_or(u64::MAX).min(size).saturating_sub(offset);
        if offset >= size {
            if punch || keep {
                reply.ok();
            } else {
                reply.error(Errno::ENOSPC);
            }
            return;
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
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.failed(&e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Every write is in the pool before it is answered; a cache's
        // origin is flushed (a loop device's FLUSH arrives as this fsync).
        match self.export.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.failed(&e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == ROOT {
            reply.opened(FileHandle(0), FopenFlags::empty());
        } else {
            reply.error(Errno::ENOTDIR);
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            reply.error(Errno::ENOTDIR);
            return;
        }
        let entries = [(ROOT, FileType::Directory, "."), (ROOT, FileType::Directory, ".."), (FILE, FileType::RegularFile, &*self.name)];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
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
        let blocks = self.export.size() / 4096;
        reply.statfs(blocks, 0, 0, 2, 0, 4096, 255, 4096);
    }
}

/// A mounted image; unmounts (and stops its threads) when dropped or on
/// [`Mounted::unmount`].
pub struct Mounted {
    session: Option<BackgroundSession>,
    stats: Arc<FuseStats>,
}

impl Mounted {
    pub fn stats(&self) -> &Arc<FuseStats> {
        &self.stats
    }

    /// Unmount and wait for the session's threads.
    pub fn unmount(mut self) -> io::Result<()> {
        match self.session.take() {
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if let Err(e) = s.umount_and_join() {
                tracing::warn!("unmounting the zmem FUSE image failed: {e}");
            }
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
    let fs = ImageFs {
        export,
        name: cfg.file_name.clone(),
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
        born: SystemTime::now(),
        stats: Arc::clone(&stats),
        // Not zero: calloc would leave the pages untouched.
        bufs: std::sync::Mutex::new((0..threads).map(|_| vec![0xa5u8; MAX_IO as usize]).collect()),
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
    let session = fuser::Session::new(fs, mountpoint, &config)?.spawn()?;
    Ok(Mounted { session: Some(session), stats })
}
