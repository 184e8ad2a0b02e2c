//! The FUSE connection: `/dev/fuse` files, the mount, and the calls on
//! them. All of this crate's `unsafe` is here (one ioctl).
//!
//! A connection lives as long as any process holds one of its files: a
//! server that dies leaves it to whoever holds the others (a keeper, see
//! `zmem-swap`), and a new server given those files serves it on
//! ([`crate::Start::TakeOver`]). The requests the dead one had read and
//! not answered are still in the kernel's lists of the files they were
//! read from, and only while those files are open: a file's last close
//! ends its unanswered requests with an error (`fuse_dev_release`). So
//! every file a server reads requests from must also be held by the
//! keeper: the mount's file and one clone per worker
//! (`FUSE_DEV_IOC_CLONE`), all made before the first server starts. The
//! new server has them put back in the queue with `FUSE_NOTIFY_RESEND`
//! (Linux 6.9): resent requests carry the high bit in their `unique`,
//! which the reply echoes.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, UnmountFlags};

/// `FUSE_NOTIFY_RESEND`: put every request read and not answered back in
/// the queue.
const NOTIFY_RESEND: i32 = 7;

/// Open a new `/dev/fuse` file (close-on-exec).
fn open_dev() -> io::Result<OwnedFd> {
    Ok(rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?)
}

/// Mount a FUSE filesystem of type `fuse.zmem` at `mountpoint`, its root a
/// directory owned by the caller; returns the connection's first file.
/// Needs `CAP_SYS_ADMIN` (root).
pub(crate) fn mount(mountpoint: &Path, allow_other: bool) -> io::Result<OwnedFd> {
    let fd = open_dev()?;
    let (uid, gid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
    let mut data = format!("fd={},rootmode=40000,user_id={uid},group_id={gid},default_permissions", fd.as_raw_fd());
    if allow_other {
        data.push_str(",allow_other");
    }
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::NOATIME;
    let data = std::ffi::CString::new(data).map_err(io::Error::other)?;
    rustix::mount::mount("zmem", mountpoint, "fuse.zmem", flags, Some(data.as_c_str())).map_err(|e| {
        let e = io::Error::from(e);
        if e.kind() == io::ErrorKind::PermissionDenied {
            io::Error::new(e.kind(), format!("{e}: mounting a FUSE filesystem needs root (CAP_SYS_ADMIN)"))
        } else {
            e
        }
    })?;
    Ok(fd)
}

/// A second file of `fd`'s connection (`FUSE_DEV_IOC_CLONE`): requests
/// read through it are answered through it.
pub(crate) fn clone(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let new = open_dev()?;
    let old = fd.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE is _IOR(229, 0, uint32_t): the kernel
    // reads one u32 (the file descriptor to clone) through the pointer
    // Setter passes, which points at `old` for the call's duration; it
    // writes nothing back.
    unsafe {
        rustix::ioctl::ioctl(&new, rustix::ioctl::Setter::<{ rustix::ioctl::opcode::read::<u32>(229, 0) }, u32>::new(old))?;
    }
    Ok(new)
}

/// Have the kernel put every request read through any of the
/// connection's open files and not answered back in its queue.
pub(crate) fn resend(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&16u32.to_ne_bytes());
    h[4..8].copy_from_slice(&NOTIFY_RESEND.to_ne_bytes());
    let n = rustix::io::write(fd, &h)?;
    if n != h.len() {
        return Err(io::Error::other("short write of FUSE_NOTIFY_RESEND"));
    }
    Ok(())
}

/// What reading a request gave.
pub(crate) enum Read {
    /// A request of this many bytes.
    Request(usize),
    /// The connection is gone (unmounted or aborted).
    Gone,
}

/// Read one request into `buf` (at least the largest write and its
/// headers, or the kernel refuses the read).
pub(crate) fn read_request(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Read> {
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Ok(n) => return Ok(Read::Request(n)),
            // Interrupted, or the request went away before it was read.
            Err(rustix::io::Errno::INTR | rustix::io::Errno::NOENT | rustix::io::Errno::AGAIN) => continue,
            Err(rustix::io::Errno::NODEV) => return Ok(Read::Gone),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Send a reply (its header and its out arguments) in one write.
pub(crate) fn reply(fd: BorrowedFd<'_>, header: &[u8], body: &[u8]) -> io::Result<()> {
    match rustix::io::writev(fd, &[io::IoSlice::new(header), io::IoSlice::new(body)]) {
        Ok(_) => Ok(()),
        // The request was interrupted or the connection aborted: nobody
        // waits for this answer any more.
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NODEV) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Unmount `mountpoint`; the connection's readers then get `ENODEV`.
pub(crate) fn unmount(mountpoint: &Path) -> io::Result<()> {
    Ok(rustix::mount::unmount(mountpoint, UnmountFlags::empty())?)
}

/// Let `fd` pass to a program this process starts (clear close-on-exec).
pub fn inheritable(fd: impl AsFd) -> io::Result<()> {
    Ok(rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?)
}
