//! The FUSE requests the image's file system answers, in the kernel's wire
//! format (`include/uapi/linux/fuse.h`): a request is a `fuse_in_header`,
//! the opcode's fixed argument and the rest (a name, written data); a
//! reply is a `fuse_out_header` and the out arguments. This module decodes
//! requests and encodes replies for the few operations a one-file file
//! system has, INIT among them; every other opcode is `ENOSYS`. The
//! answers come from [`FileOps`].
//!
//! Nothing here trusts the kernel's lengths: a short argument is `EINVAL`,
//! never a panic, and every reply fits its buffer or is `ERANGE`.

use crate::{Errno, FileOps, MAX_IO};

/// `struct fuse_in_header`.
pub(crate) const IN_HEADER: usize = 40;
/// `struct fuse_out_header`.
pub(crate) const OUT_HEADER: usize = 16;
/// `struct fuse_write_in`: what precedes a write's data.
pub(crate) const WRITE_IN: usize = 40;

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const OPEN: u32 = 14;
pub(crate) const READ: u32 = 15;
const WRITE: u32 = 16;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FSYNC: u32 = 20;
const GETXATTR: u32 = 22;
const LISTXATTR: u32 = 23;
const FLUSH: u32 = 25;
pub(crate) const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const ACCESS: u32 = 34;
const INTERRUPT: u32 = 36;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;
const FALLOCATE: u32 = 43;

/// The protocol version answered: 7.31 has every structure this module
/// writes at its full size, and `FUSE_MAX_PAGES`.
const MAJOR: u32 = 7;
const MINOR: u32 = 31;
/// INIT flags asked for, where the kernel offers them: reads and direct
/// I/O in parallel, writes past 4 KiB, requests up to [`MAX_IO`].
const ASYNC_READ: u32 = 1 << 0;
const BIG_WRITES: u32 = 1 << 5;
const ASYNC_DIO: u32 = 1 << 15;
const PARALLEL_DIROPS: u32 = 1 << 18;
const MAX_PAGES: u32 = 1 << 22;
/// Requests the kernel keeps in flight at once (`max_background`), and
/// where it starts to hold writers back.
const MAX_BACKGROUND: u16 = 256;
const CONGESTION_THRESHOLD: u16 = 192;

/// `FOPEN_DIRECT_IO`.
const FOPEN_DIRECT_IO: u32 = 1;
/// `setattr` valid bits that would change what the file is.
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;

/// A request's header: what it is and whom to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
}

impl InHeader {
    /// The header of request `b` (as read), and its arguments: the bytes
    /// after the header, as long as the header says (never past `b`).
    pub(crate) fn parse(b: &[u8]) -> Option<(InHeader, &[u8])> {
        let len = u32_at(b, 0)? as usize;
        let b = b.get(..len)?;
        let h = InHeader { opcode: u32_at(b, 4)?, unique: u64_at(b, 8)?, nodeid: u64_at(b, 16)? };
        Some((h, b.get(IN_HEADER..)?))
    }
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The out header for `unique`: `error` is 0 or a negated errno.
pub(crate) fn out_header(unique: u64, error: i32, payload: usize) -> [u8; OUT_HEADER] {
    let mut h = [0u8; OUT_HEADER];
    h[0..4].copy_from_slice(&((OUT_HEADER + payload) as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// Whether the kernel waits for an answer to `opcode` (it does not for
/// forgets and interrupts).
pub(crate) fn answered(opcode: u32) -> bool {
    !matches!(opcode, FORGET | BATCH_FORGET | INTERRUPT)
}

/// Writes a reply's out arguments into a buffer.
pub(crate) struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Out<'_> {
    fn bytes(&mut self, b: &[u8]) -> Result<(), Errno> {
        let end = self.len + b.len();
        self.buf.get_mut(self.len..end).ok_or(Errno::ERANGE)?.copy_from_slice(b);
        self.len = end;
        Ok(())
    }

    fn u16(&mut self, v: u16) -> Result<(), Errno> {
        self.bytes(&v.to_ne_bytes())
    }

    fn u32(&mut self, v: u32) -> Result<(), Errno> {
        self.bytes(&v.to_ne_bytes())
    }

    fn u64(&mut self, v: u64) -> Result<(), Errno> {
        self.bytes(&v.to_ne_bytes())
    }

    /// `struct fuse_attr` (88 bytes).
    fn attr(&mut self, a: &crate::Attr) -> Result<(), Errno> {
        for v in [a.ino, a.size, a.blocks(), a.time.0, a.time.0, a.time.0] {
            self.u64(v)?;
        }
        for v in [a.time.1, a.time.1, a.time.1, a.mode, a.nlink, a.uid, a.gid, 0, crate::BLKSIZE, 0] {
            self.u32(v)?;
        }
        Ok(())
    }

    /// `valid` seconds of a cached entry or attribute.
    fn ttl(&mut self) -> Result<(), Errno> {
        self.u64(crate::TTL.as_secs())
    }
}

/// Answer INIT (`args`: `struct fuse_init_in`) into `out`: `struct
/// fuse_init_out`, 64 bytes. A kernel older than 7.31 is refused.
fn init(args: &[u8], out: &mut Out) -> Result<(), Errno> {
    let (major, minor) = (u32_at(args, 0).ok_or(Errno::EINVAL)?, u32_at(args, 4).ok_or(Errno::EINVAL)?);
    let (readahead, offered) = (u32_at(args, 8).ok_or(Errno::EINVAL)?, u32_at(args, 12).ok_or(Errno::EINVAL)?);
    if major != MAJOR || minor < MINOR {
        tracing::error!("the kernel speaks FUSE {major}.{minor}; zmem needs {MAJOR}.{MINOR} or later (Linux 5.1)");
        return Err(Errno::EPROTO);
    }
    out.u32(MAJOR)?;
    out.u32(MINOR)?;
    out.u32(readahead)?;
    out.u32(offered & (ASYNC_READ | BIG_WRITES | ASYNC_DIO | PARALLEL_DIROPS | MAX_PAGES))?;
    out.u16(MAX_BACKGROUND)?;
    out.u16(CONGESTION_THRESHOLD)?;
    out.u32(MAX_IO)?;
    out.u32(1)?; // time_gran: nanoseconds
    out.u16((MAX_IO / 4096) as u16)?; // max_pages
    out.u16(0)?; // map_alignment
    out.u32(0)?; // flags2
    out.u32(0)?; // max_stack_depth
    out.bytes(&[0u8; 24])
}

/// Answer one request (`args`: what follows its header) into `out`;
/// returns the error (0 or a negated errno) and the out arguments' length.
/// A read's data goes straight into `out`, which must hold its size.
pub(crate) fn dispatch(ops: &FileOps, h: &InHeader, args: &[u8], out: &mut [u8]) -> (i32, usize) {
    let mut out = Out { buf: out, len: 0 };
    match answer(ops, h, args, &mut out) {
        Ok(()) => (0, out.len),
        Err(e) => (-e.code(), 0),
    }
}

fn answer(ops: &FileOps, h: &InHeader, args: &[u8], out: &mut Out) -> Result<(), Errno> {
    let arg32 = |at| u32_at(args, at).ok_or(Errno::EINVAL);
    let arg64 = |at| u64_at(args, at).ok_or(Errno::EINVAL);
    match h.opcode {
        INIT => init(args, out),
        LOOKUP => {
            // The name, NUL-terminated.
            let name = args.split(|&c| c == 0).next().unwrap_or_default();
            let a = ops.lookup(h.nodeid, name)?;
            out.u64(a.ino)?;
            out.u64(0)?; // generation
            out.ttl()?;
            out.ttl()?;
            out.u32(0)?;
            out.u32(0)?;
            out.attr(&a)
        }
        GETATTR => attr_out(out, &ops.getattr(h.nodeid)?),
        SETATTR => {
            let valid = arg32(0)?;
            let size = if valid & FATTR_SIZE != 0 { Some(arg64(16)?) } else { None };
            let fixed = valid & (FATTR_MODE | FATTR_UID | FATTR_GID) != 0;
            attr_out(out, &ops.setattr(h.nodeid, size, fixed)?)
        }
        OPEN | OPENDIR => {
            let direct = ops.open(h.nodeid, h.opcode == OPENDIR)?;
            out.u64(0)?;
            out.u32(if direct { FOPEN_DIRECT_IO } else { 0 })?;
            out.u32(0)
        }
        READ => {
            let (offset, size) = (arg64(8)?, arg32(16)? as usize);
            let dst = out.buf.get_mut(..size).ok_or(Errno::ERANGE)?;
            out.len = ops.read(h.nodeid, offset, dst)?;
            Ok(())
        }
        WRITE => {
            let (offset, size) = (arg64(8)?, arg32(16)? as usize);
            let data = args.get(WRITE_IN..).filter(|d| d.len() == size).ok_or(Errno::EINVAL)?;
            let n = ops.write(h.nodeid, offset, data)?;
            out.u32(n)?;
            out.u32(0)
        }
        STATFS => {
            // struct fuse_kstatfs: then a padding word and six spare ones.
            let s = ops.statfs();
            for v in [s.blocks, s.bfree, s.bavail, s.files, s.ffree] {
                out.u64(v)?;
            }
            for v in [s.bsize, s.namelen, s.frsize, 0, 0, 0, 0, 0, 0, 0] {
                out.u32(v)?;
            }
            Ok(())
        }
        RELEASE | RELEASEDIR | FLUSH | ACCESS | DESTROY => Ok(()),
        FSYNC => ops.fsync(),
        // No extended attributes (the kernel asks for security.capability
        // before every write by a privileged process).
        GETXATTR => Err(Errno::ENODATA),
        LISTXATTR => {
            if arg32(0)? == 0 {
                out.u32(0)?;
                out.u32(0)?;
            }
            Ok(())
        }
        READDIR => {
            let (offset, size) = (arg64(8)?, arg32(16)? as usize);
            let cap = size.min(out.buf.len());
            for (i, (ino, kind, name)) in ops.readdir(h.nodeid)?.iter().enumerate().skip(offset as usize) {
                // struct fuse_dirent, padded to 8 bytes.
                let rec = (24 + name.len()).next_multiple_of(8);
                if out.len + rec > cap {
                    break;
                }
                out.u64(*ino)?;
                out.u64(i as u64 + 1)?;
                out.u32(name.len() as u32)?;
                out.u32(*kind)?;
                out.bytes(name.as_bytes())?;
                out.bytes(&[0u8; 8][..rec - 24 - name.len()])?;
            }
            Ok(())
        }
        FALLOCATE => ops.fallocate(h.nodeid, arg64(8)?, arg64(16)?, arg32(24)? as i32),
        _ => Err(Errno::ENOSYS),
    }
}

/// `struct fuse_attr_out`.
fn attr_out(out: &mut Out, a: &crate::Attr) -> Result<(), Errno> {
    out.ttl()?;
    out.u32(0)?;
    out.u32(0)?;
    out.attr(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops() -> FileOps {
        let pool = std::sync::Arc::new(zmem_core::Pool::new(zmem_core::PoolConfig::default()).unwrap());
        FileOps {
            export: std::sync::Arc::new(zmem_export::Export::new(pool, 1 << 20)),
            name: "image".into(),
            uid: 0,
            gid: 0,
            born: (1, 2),
            stats: Default::default(),
        }
    }

    /// A whole request as the kernel writes it: header, then `args`.
    fn request(opcode: u32, nodeid: u64, args: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; IN_HEADER];
        b[0..4].copy_from_slice(&((IN_HEADER + args.len()) as u32).to_ne_bytes());
        b[4..8].copy_from_slice(&opcode.to_ne_bytes());
        b[8..16].copy_from_slice(&9u64.to_ne_bytes());
        b[16..24].copy_from_slice(&nodeid.to_ne_bytes());
        b.extend_from_slice(args);
        b
    }

    /// Parse `req` and answer it into `out`.
    fn run(ops: &FileOps, req: &[u8], out: &mut [u8]) -> (i32, usize) {
        let (h, args) = InHeader::parse(req).expect("a whole request");
        dispatch(ops, &h, args, out)
    }

    /// `fuse_read_in` / `fuse_write_in`: offset at 8, size at 16.
    fn rw_in(offset: u64, size: u32) -> Vec<u8> {
        let mut b = vec![0u8; 40];
        b[8..16].copy_from_slice(&offset.to_ne_bytes());
        b[16..20].copy_from_slice(&size.to_ne_bytes());
        b
    }

    #[test]
    fn headers_parse_and_encode_in_the_kernels_layout() {
        let req = request(READ, 2, &rw_in(0, 4096));
        let (h, args) = InHeader::parse(&req).unwrap();
        assert_eq!(h, InHeader { opcode: READ, unique: 9, nodeid: 2 });
        assert_eq!(args.len(), 40);
        assert_eq!(InHeader::parse(&req[..20]), None, "a short header is refused, not read past");
        assert_eq!(InHeader::parse(&req[..60]), None, "a request shorter than its header says is refused");
        let o = out_header(77, -5, 8);
        assert_eq!((u32_at(&o, 0), u32_at(&o, 4), u64_at(&o, 8)), (Some(24), Some((-5i32) as u32), Some(77)));
        assert!(answered(READ) && !answered(FORGET) && !answered(INTERRUPT));
    }

    #[test]
    fn init_asks_only_what_the_kernel_offers() {
        let mut init_in = vec![0u8; 64];
        init_in[0..4].copy_from_slice(&7u32.to_ne_bytes());
        init_in[4..8].copy_from_slice(&45u32.to_ne_bytes());
        init_in[8..12].copy_from_slice(&(128u32 << 10).to_ne_bytes());
        init_in[12..16].copy_from_slice(&(ASYNC_READ | MAX_PAGES | (1 << 3)).to_ne_bytes());
        let mut out = [0u8; 128];
        assert_eq!(run(&ops(), &request(INIT, 0, &init_in), &mut out), (0, 64));
        assert_eq!((u32_at(&out, 0), u32_at(&out, 4), u32_at(&out, 8)), (Some(7), Some(MINOR), Some(128 << 10)));
        assert_eq!(u32_at(&out, 12), Some(ASYNC_READ | MAX_PAGES), "only offered flags, only ours");
        assert_eq!((u32_at(&out, 20), u16::from_ne_bytes([out[28], out[29]])), (Some(MAX_IO), (MAX_IO / 4096) as u16));
        init_in[4..8].copy_from_slice(&30u32.to_ne_bytes());
        assert_eq!(run(&ops(), &request(INIT, 0, &init_in), &mut out), (-libc::EPROTO, 0), "too old a kernel");
    }

    #[test]
    fn requests_are_answered_as_the_kernel_expects() {
        let ops = ops();
        let mut out = vec![0u8; 1 << 16];
        // LOOKUP of the file: fuse_entry_out (128 bytes), inode 2, its size.
        assert_eq!(run(&ops, &request(LOOKUP, 1, b"image\0"), &mut out), (0, 128));
        assert_eq!((u64_at(&out, 0), u64_at(&out, 40 + 8)), (Some(2), Some(1 << 20)));
        assert_eq!(run(&ops, &request(LOOKUP, 1, b"xyz\0"), &mut out), (-libc::ENOENT, 0));
        // A write, then a read of it, past the end short, and a write past
        // the end refused.
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let write = |offset, size, data: &[u8]| [rw_in(offset, size), data.to_vec()].concat();
        assert_eq!(run(&ops, &request(WRITE, 2, &write(4000, 5000, &data)), &mut out), (0, 8));
        assert_eq!(u32_at(&out, 0), Some(5000));
        assert_eq!(run(&ops, &request(READ, 2, &rw_in(4000, 5000)), &mut out), (0, 5000));
        assert_eq!(&out[..5000], &data[..]);
        assert_eq!(run(&ops, &request(READ, 2, &rw_in((1 << 20) - 10, 4096)), &mut out), (0, 10));
        assert_eq!(run(&ops, &request(WRITE, 2, &write(1 << 20, 4096, &[1; 4096])), &mut out), (-libc::ENOSPC, 0));
        // A write whose data is not all there is refused, not half done.
        assert_eq!(run(&ops, &request(WRITE, 2, &write(0, 4096, &[1; 100])), &mut out), (-libc::EINVAL, 0));
        // A read larger than the reply buffer: ERANGE, nothing written past it.
        assert_eq!(run(&ops, &request(READ, 2, &rw_in(0, 4096)), &mut out[..100]), (-libc::ERANGE, 0));
        // The directory: three entries, the file last.
        let (err, n) = run(&ops, &request(READDIR, 1, &rw_in(0, 4096)), &mut out);
        assert_eq!((err, n), (0, 32 + 32 + 32), "three 8-byte-aligned dirents");
        assert_eq!(&out[64 + 24..64 + 29], b"image");
        // Opening: the file for direct I/O, the root as a directory.
        assert_eq!(run(&ops, &request(OPEN, 2, &[0; 8]), &mut out), (0, 16));
        assert_eq!(u32_at(&out, 8), Some(FOPEN_DIRECT_IO));
        assert_eq!(run(&ops, &request(OPEN, 1, &[0; 8]), &mut out), (-libc::EISDIR, 0));
        assert_eq!(run(&ops, &request(OPENDIR, 2, &[0; 8]), &mut out), (-libc::ENOTDIR, 0));
        // A discard drops the page (punch hole, keep size).
        let mut fa = vec![0u8; 32];
        fa[16..24].copy_from_slice(&8192u64.to_ne_bytes());
        fa[24..28].copy_from_slice(&(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).to_ne_bytes());
        assert_eq!(run(&ops, &request(FALLOCATE, 2, &fa), &mut out), (0, 0));
        assert_eq!(run(&ops, &request(READ, 2, &rw_in(4000, 100)), &mut out), (0, 100));
        assert!(out[..100].iter().all(|&b| b == 0));
        // Unknown and unsupported requests: ENOSYS.
        assert_eq!(run(&ops, &request(9999, 2, &[]), &mut out), (-libc::ENOSYS, 0));
        assert_eq!(ops.stats.reads.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    proptest::proptest! {
        /// Whatever the kernel (or a bug) puts in a request, an answer
        /// comes back and nothing panics or reads past a buffer.
        #[test]
        fn no_request_panics(opcode in 0u32..64, nodeid in 0u64..4, args in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..9000),
                             out_len in 0usize..9000, claimed in 0u32..20000) {
            let ops = ops();
            let mut req = request(opcode, nodeid, &args);
            req[0..4].copy_from_slice(&claimed.to_ne_bytes());
            let mut out = vec![0x5au8; out_len];
            if let Some((h, args)) = InHeader::parse(&req) {
                let (err, n) = dispatch(&ops, &h, args, &mut out);
                proptest::prop_assert!(err <= 0 && n <= out.len());
                proptest::prop_assert!(err == 0 || n == 0);
            }
        }
    }

    #[test]
    fn out_arguments_never_overrun_the_buffer() {
        let mut small = [0u8; 10];
        let mut out = Out { buf: &mut small, len: 0 };
        assert_eq!(out.u64(1), Ok(()));
        assert_eq!(out.u64(2), Err(Errno::ERANGE));
        assert_eq!(out.len, 8);
    }
}
