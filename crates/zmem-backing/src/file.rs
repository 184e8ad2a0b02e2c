//! The I/O seam: [`BlockFile`] and its implementations — the real file
//! ([`OsFile`]) and two test doubles ([`MemFile`], [`FaultyFile`]).

use std::fs::{File, OpenOptions};
use std::io;
use std::io::Seek;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapMut;
use parking_lot::{Condvar, Mutex};

use crate::{BackingError, PAGE_SIZE};

/// Positioned I/O on the file behind a [`BackingStore`](crate::BackingStore).
///
/// This is a seam so that tests can inject faults ([`FaultyFile`]) or run
/// without a filesystem ([`MemFile`]). Implementations must be safe to call
/// from many threads at once (like `pread`/`pwrite`).
pub trait BlockFile: Send + Sync {
    /// Read up to `buf.len()` bytes at `off`; returns how many were read
    /// (0 at end of file).
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize>;
    /// Write up to `buf.len()` bytes at `off`; returns how many were written.
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<usize>;
    /// Make written data durable (`fdatasync`).
    fn sync(&self) -> io::Result<()>;
    /// Truncate or extend the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Its length in bytes (a block device's size).
    fn size(&self) -> io::Result<u64>;
    /// Reserve blocks for `len` bytes at `off` without changing the file's
    /// length (`fallocate` with `FALLOC_FL_KEEP_SIZE`); `ENOSPC` when the
    /// filesystem is full. Files that cannot reserve simply do not.
    fn allocate(&self, off: u64, len: u64) -> io::Result<()> {
        let _ = (off, len);
        Ok(())
    }
    /// `true` if offsets, lengths and buffer addresses passed to
    /// [`read_at`](Self::read_at)/[`write_at`](Self::write_at) must be
    /// multiples of 4096 (`O_DIRECT`).
    fn direct(&self) -> bool;
    /// The alignment reads need (offset and length; buffers are always
    /// 4096-aligned): 4096 under `O_DIRECT` unless the file says less.
    /// Writes stay 4096-aligned either way.
    fn read_align(&self) -> usize {
        if self.direct() {
            PAGE_SIZE
        } else {
            512
        }
    }
}

impl<T: BlockFile + ?Sized> BlockFile for std::sync::Arc<T> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        (**self).read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<usize> {
        (**self).write_at(buf, off)
    }
    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        (**self).set_len(len)
    }
    fn size(&self) -> io::Result<u64> {
        (**self).size()
    }
    fn allocate(&self, off: u64, len: u64) -> io::Result<()> {
        (**self).allocate(off, len)
    }
    fn direct(&self) -> bool {
        (**self).direct()
    }
    fn read_align(&self) -> usize {
        (**self).read_align()
    }
}

/// What [`OsFile::open`] does with data already at the path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Existing {
    /// Use an empty file or device, or one that already holds a zmem
    /// backing store (a restart); refuse anything else.
    #[default]
    Refuse,
    /// Overwrite whatever is there (the user asked for it: `--force`).
    Overwrite,
}

/// A real file or block device, opened with `O_DIRECT` when the filesystem
/// allows it.
///
/// Written-back pages were evicted from RAM to save memory; reading them
/// through the page cache would put them straight back in RAM (and write
/// them twice). `O_DIRECT` avoids that. Filesystems that refuse it (tmpfs,
/// some FUSE and network filesystems) get buffered I/O instead, and
/// [`OsFile::open`] says why.
///
/// A new file is created with mode `0600` (it holds compressed process
/// memory), an existing one is set to `0600`. Symbolic links are never
/// followed, and anything but a regular file or a block device is refused:
/// a backing store on `/dev/null` would acknowledge writes and lose them.
/// Every I/O error it returns names the file.
#[derive(Debug)]
pub struct OsFile {
    file: File,
    path: PathBuf,
    direct: bool,
    /// A block device's size (its length cannot change).
    device_bytes: Option<u64>,
}

/// Bytes read to recognise an existing zmem backing store: a record header
/// and the largest payload.
const SNIFF: usize = (crate::record::RECORD_HEADER_SIZE + crate::record::MAX_PAYLOAD).next_multiple_of(PAGE_SIZE);

impl OsFile {
    /// Open the backing store at `path`: create a regular file there, or use
    /// an existing regular file (truncated) or block device, as `existing`
    /// allows. Tries `O_DIRECT` first; if that does not work, uses buffered
    /// I/O and returns the reason as the second element. Either way an
    /// aligned write and read-back must work before the file is used.
    pub fn open(path: &Path, existing: Existing) -> Result<(OsFile, Option<String>), BackingError> {
        let refuse = |why: String| BackingError::Refused { path: path.to_owned(), why };
        let io_err = |op: &'static str, e: io::Error| BackingError::Io { op, source: io::Error::new(e.kind(), format!("{}: {e}", path.display())) };
        let create = match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => return Err(io_err("stat", e)),
            Ok(m) => {
                check_kind(m.file_type()).map_err(refuse)?;
                false
            }
        };
        // A filesystem without O_DIRECT may create the file and then fail
        // the open: the buffered retry then opens what was just created.
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(true);
            if create && direct {
                o.create_new(true).mode(0o600);
            } else if create {
                o.create(true).mode(0o600);
            }
            o.custom_flags(libc::O_NOFOLLOW | if direct { libc::O_DIRECT } else { 0 });
            o.open(path)
        };
        let (file, why) = match open(true) {
            Ok(f) => (f, None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(refuse(symlink_why())),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let f = open(false).map_err(|e2| match e2.raw_os_error() {
                    Some(libc::ELOOP) => refuse(symlink_why()),
                    _ => io_err("open", e2),
                })?;
                (f, Some(format!("opening it with O_DIRECT failed: {e}")))
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Err(refuse("it was created by someone else while zmem was opening it".into())),
            Err(e) => return Err(io_err("open", e)),
        };
        // What was opened is what was checked (nothing swapped it since).
        let meta = file.metadata().map_err(|e| io_err("stat", e))?;
        check_kind(meta.file_type()).map_err(refuse)?;
        let device_bytes = if meta.file_type().is_block_device() {
            Some((&file).seek(io::SeekFrom::End(0)).map_err(|e| io_err("seek", e))?)
        } else {
            file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(|e| io_err("chmod", e))?;
            None
        };
        let mut f = OsFile { file, path: path.to_owned(), direct: why.is_none(), device_bytes };
        if !create && existing == Existing::Refuse {
            if let Some(why) = f.check_unused().map_err(|e| io_err("read", e))? {
                return Err(refuse(why));
            }
        }
        let why = match (why, f.probe()) {
            (None, Ok(())) => None,
            (None, Err(e)) if f.device_bytes.is_none() => {
                // O_DIRECT opened but does not work here: buffered instead.
                f.file = open(false).map_err(|e| io_err("open", e))?;
                f.direct = false;
                f.probe().map_err(|e| io_err("probe", e))?;
                Some(format!("an O_DIRECT write/read test on it failed: {e}"))
            }
            (_, Err(e)) => return Err(io_err("probe", e)),
            (why, Ok(())) => why,
        };
        if let Some(why) = &why {
            let msg = format!(
                "O_DIRECT is not available for {} ({why}); using buffered I/O, so written-back pages \
                 will also occupy the page cache. Put the backing file on a filesystem that supports \
                 O_DIRECT (ext4, xfs, btrfs) to avoid double caching.",
                path.display()
            );
            tracing::warn!("{msg}");
            return Ok((f, Some(msg)));
        }
        Ok((f, None))
    }

    /// The backing file a server that died had open, as its keeper kept
    /// it (`file`, the same open file: `O_DIRECT` if it was opened so),
    /// for a store that takes its records over
    /// ([`BackingStore::adopt`](crate::BackingStore::adopt)). Nothing is
    /// written or cut here. `path` is what it was opened at, for messages.
    pub fn kept(file: File, path: &Path) -> Result<OsFile, BackingError> {
        let io_err = |op: &'static str, e: io::Error| BackingError::Io { op, source: io::Error::new(e.kind(), format!("{}: {e}", path.display())) };
        let meta = file.metadata().map_err(|e| io_err("stat", e))?;
        check_kind(meta.file_type()).map_err(|why| BackingError::Refused { path: path.to_owned(), why })?;
        let flags = rustix::fs::fcntl_getfl(&file).map_err(|e| io_err("fcntl", e.into()))?;
        let device_bytes = if meta.file_type().is_block_device() { Some((&file).seek(io::SeekFrom::End(0)).map_err(|e| io_err("seek", e))?) } else { None };
        Ok(OsFile { direct: flags.contains(rustix::fs::OFlags::DIRECT), file, path: path.to_owned(), device_bytes })
    }

    /// The open file, to hand to a keeper that outlives this process.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The path the file was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A block device's size in bytes (`None` for a regular file).
    pub fn device_bytes(&self) -> Option<u64> {
        self.device_bytes
    }

    /// An existing file or device may be used if it is empty (all zeros at
    /// its start, for a device) or starts with a zmem record (our own store,
    /// from an earlier run). `Some(why)` says why not.
    fn check_unused(&self) -> io::Result<Option<String>> {
        let len = match self.device_bytes {
            Some(n) => n,
            None => self.file.metadata()?.len(),
        };
        if len == 0 {
            return Ok(None);
        }
        let mut buf = MmapMut::map_anon(SNIFF)?;
        let want = SNIFF.min(len as usize);
        let mut got = 0;
        while got < want {
            match self.file.read_at(&mut buf[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let head = &buf[..got];
        let zeroed_device = self.device_bytes.is_some() && head.iter().all(|&b| b == 0);
        if zeroed_device || crate::record::is_record_start(head) {
            return Ok(None);
        }
        let what = if self.device_bytes.is_some() { "a block device whose first sectors hold data" } else { "a non-empty file" };
        Ok(Some(format!("it is {what} ({len} bytes) that is not a zmem backing store; pass --force to overwrite it")))
    }

    /// Write a page at offset 0 and read it back: the file must really keep
    /// what it is given (the regular file is then emptied again).
    fn probe(&self) -> io::Result<()> {
        let mut buf = MmapMut::map_anon(PAGE_SIZE)?;
        buf[..16].copy_from_slice(b"zmem-probe-page!");
        let n = self.file.write_at(&buf, 0)?;
        if n != PAGE_SIZE {
            return Err(io::Error::other("short probe write"));
        }
        buf.fill(0);
        let n = self.file.read_at(&mut buf, 0)?;
        if n != PAGE_SIZE || &buf[..16] != b"zmem-probe-page!" {
            return Err(io::Error::other("a probe read did not return what was written"));
        }
        if self.device_bytes.is_some() {
            buf.fill(0);
            self.file.write_at(&buf, 0)?;
            return Ok(());
        }
        self.file.set_len(0)
    }

    fn ctx(&self, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("{}: {e}", self.path.display()))
    }
}

fn symlink_why() -> String {
    "it is a symbolic link; name the file itself (links are not followed)".into()
}

/// A backing store is a regular file or a block device, nothing else.
fn check_kind(ft: std::fs::FileType) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let what = if ft.is_file() || ft.is_block_device() {
        return Ok(());
    } else if ft.is_symlink() {
        return Err(symlink_why());
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(format!("it is {what}; a backing store must be a regular file or a block device"))
}

impl BlockFile for OsFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.file.read_at(buf, off).map_err(|e| self.ctx(e))
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<usize> {
        self.file.write_at(buf, off).map_err(|e| self.ctx(e))
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data().map_err(|e| self.ctx(e))
    }
    fn size(&self) -> io::Result<u64> {
        match self.device_bytes {
            Some(n) => Ok(n),
            None => Ok(self.file.metadata().map_err(|e| self.ctx(e))?.len()),
        }
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.device_bytes.is_some() {
            // A device keeps its size; space past `len` is simply unused.
            return Ok(());
        }
        self.file.set_len(len).map_err(|e| self.ctx(e))
    }
    fn allocate(&self, off: u64, len: u64) -> io::Result<()> {
        if self.device_bytes.is_some() {
            return Ok(());
        }
        let flags = rustix::fs::FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(&self.file, flags, off, len) {
            Ok(()) => Ok(()),
            // Filesystems without fallocate: no reservation, as before.
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => Ok(()),
            Err(e) => Err(self.ctx(e.into())),
        }
    }
    fn direct(&self) -> bool {
        self.direct
    }
    fn read_align(&self) -> usize {
        if !self.direct {
            return 512;
        }
        // An O_DIRECT read on ext4 or xfs over 512-byte sectors may start
        // and end on any sector: a 1.5 KiB record then costs about 2 KiB
        // of disk reads, not 4 to 8 KiB (statx's STATX_DIOALIGN, Linux 6.1).
        use rustix::fs::{AtFlags, StatxFlags};
        match rustix::fs::statx(&self.file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
            Ok(st) if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 => {
                let (off, mem) = (st.stx_dio_offset_align as usize, st.stx_dio_mem_align as usize);
                if off.is_power_of_two() && (512..=PAGE_SIZE).contains(&off) && mem <= PAGE_SIZE {
                    off
                } else {
                    PAGE_SIZE
                }
            }
            _ => PAGE_SIZE,
        }
    }
}

/// An in-memory [`BlockFile`] — a **test double**, not for production.
///
/// With `direct = true` it enforces `O_DIRECT`'s rules (4096-aligned
/// offsets, lengths and buffer addresses, else `EINVAL`), so the aligned
/// I/O paths can be tested on any filesystem.
#[derive(Debug, Default)]
pub struct MemFile {
    data: Mutex<Vec<u8>>,
    direct: bool,
}

impl MemFile {
    /// An empty file; `direct` selects `O_DIRECT` alignment checking.
    pub fn new(direct: bool) -> MemFile {
        MemFile { data: Mutex::new(Vec::new()), direct }
    }

    /// Current length of the file.
    pub fn len(&self) -> u64 {
        self.data.lock().len() as u64
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check_aligned(&self, ptr: *const u8, len: usize, off: u64) -> io::Result<()> {
        let a = PAGE_SIZE as u64;
        if self.direct && !(off.is_multiple_of(a) && (len as u64).is_multiple_of(a) && (ptr as usize as u64).is_multiple_of(a)) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(())
    }
}

impl BlockFile for MemFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.check_aligned(buf.as_ptr(), buf.len(), off)?;
        let data = self.data.lock();
        let off = off as usize;
        if off >= data.len() {
            return Ok(0);
        }
        let n = buf.len().min(data.len() - off);
        buf[..n].copy_from_slice(&data[off..off + n]);
        Ok(n)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<usize> {
        self.check_aligned(buf.as_ptr(), buf.len(), off)?;
        let mut data = self.data.lock();
        let end = off as usize + buf.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[off as usize..end].copy_from_slice(buf);
        Ok(buf.len())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.data.lock().resize(len as usize, 0);
        Ok(())
    }
    fn direct(&self) -> bool {
        self.direct
    }
}

#[derive(Debug, Default)]
struct Faults {
    /// Fail the write whose 1-based number (counting all writes) is this.
    fail_write_no: Option<u64>,
    /// Writes that would end past this offset are cut short at it.
    space_limit: Option<u64>,
    fail_reads: bool,
    /// Flip bit `.1` of the byte at file offset `.0` in every read covering it.
    flip: Option<(u64, u8)>,
    /// While set, reads (writes) wait at the door: a slow or stuck disk.
    hold_reads: bool,
    hold_writes: bool,
    /// Every read takes at least this long: a slow disk.
    read_delay: Option<std::time::Duration>,
    /// Calls waiting at the door now.
    held: u64,
}

/// A fault-injecting wrapper around a [`BlockFile`] — a **test double**.
///
/// It models the ways a disk fails: a write that returns `EIO`
/// ([`fail_nth_write`](Self::fail_nth_write)), a full disk that accepts part
/// of a write and then nothing ([`set_space_limit`](Self::set_space_limit)),
/// reads that return `EIO` ([`fail_reads`](Self::fail_reads)) and silent
/// media corruption ([`flip_bit`](Self::flip_bit)). It also counts calls.
#[derive(Debug)]
pub struct FaultyFile<F: BlockFile> {
    inner: F,
    faults: Mutex<Faults>,
    door: Condvar,
    writes: AtomicU64,
    reads: AtomicU64,
}

impl<F: BlockFile> FaultyFile<F> {
    /// Wrap `inner` with no faults armed.
    pub fn new(inner: F) -> FaultyFile<F> {
        FaultyFile { inner, faults: Mutex::new(Faults::default()), door: Condvar::new(), writes: AtomicU64::new(0), reads: AtomicU64::new(0) }
    }
    /// Make the `n`th write from now (1 = the next one) fail with `EIO`
    /// without writing anything.
    pub fn fail_nth_write(&self, n: u64) {
        assert!(n >= 1, "n counts from 1");
        self.faults.lock().fail_write_no = Some(self.writes.load(Ordering::SeqCst) + n);
    }
    /// Pretend the disk is full at `limit` bytes: a write crossing it
    /// writes up to it and returns the short count; a write starting at or
    /// past it returns `Ok(0)`. `None` removes the limit.
    pub fn set_space_limit(&self, limit: Option<u64>) {
        self.faults.lock().space_limit = limit;
    }
    /// While `on`, every read fails with `EIO`.
    pub fn fail_reads(&self, on: bool) {
        self.faults.lock().fail_reads = on;
    }
    /// Flip bit `bit` (0..8) of the byte at file offset `off` in everything
    /// reads return, until called with `None`. The file itself is unchanged.
    pub fn flip_bit(&self, at: Option<(u64, u8)>) {
        self.faults.lock().flip = at;
    }
    /// While `on`, every read waits inside `read_at` until this is called
    /// with `false` (a stuck disk). See [`wait_held`](Self::wait_held).
    pub fn hold_reads(&self, on: bool) {
        self.faults.lock().hold_reads = on;
        self.door.notify_all();
    }
    /// Every read from now on takes at least `delay` (a slow disk); `None`
    /// for the inner file's own speed.
    pub fn delay_reads(&self, delay: Option<std::time::Duration>) {
        self.faults.lock().read_delay = delay;
    }
    /// While `on`, every write waits inside `write_at` until released.
    pub fn hold_writes(&self, on: bool) {
        self.faults.lock().hold_writes = on;
        self.door.notify_all();
    }
    /// Wait until at least `n` calls are held at the door, for at most
    /// `timeout`. Returns whether they were.
    pub fn wait_held(&self, n: u64, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut f = self.faults.lock();
        while f.held < n {
            if self.door.wait_until(&mut f, deadline).timed_out() {
                return f.held >= n;
            }
        }
        true
    }
    /// Wait here while `held(faults)` is set.
    fn door(&self, held: impl Fn(&Faults) -> bool) {
        let mut f = self.faults.lock();
        if !held(&f) {
            return;
        }
        f.held += 1;
        self.door.notify_all();
        while held(&f) {
            self.door.wait(&mut f);
        }
        f.held -= 1;
    }
    /// Number of `write_at` calls so far (including failed ones).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }
    /// Number of `read_at` calls so far (including failed ones).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }
    /// The wrapped file.
    pub fn inner(&self) -> &F {
        &self.inner
    }
}

impl<F: BlockFile> BlockFile for FaultyFile<F> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.door(|f| f.hold_reads);
        let (fail, flip, delay) = {
            let f = self.faults.lock();
            (f.fail_reads, f.flip, f.read_delay)
        };
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        if fail {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let n = self.inner.read_at(buf, off)?;
        if let Some((at, bit)) = flip {
            if at >= off && at < off + n as u64 {
                buf[(at - off) as usize] ^= 1 << (bit & 7);
            }
        }
        Ok(n)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<usize> {
        self.door(|f| f.hold_writes);
        let no = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        let limit = {
            let f = self.faults.lock();
            if f.fail_write_no == Some(no) {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            f.space_limit
        };
        match limit {
            Some(l) if off >= l => Ok(0),
            Some(l) if off + buf.len() as u64 > l => self.inner.write_at(&buf[..(l - off) as usize], off),
            _ => self.inner.write_at(buf, off),
        }
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn size(&self) -> io::Result<u64> {
        self.inner.size()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn allocate(&self, off: u64, len: u64) -> io::Result<()> {
        match self.faults.lock().space_limit {
            Some(l) if off + len > l => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            _ => self.inner.allocate(off, len),
        }
    }
    fn direct(&self) -> bool {
        self.inner.direct()
    }
    fn read_align(&self) -> usize {
        self.inner.read_align()
    }
}
