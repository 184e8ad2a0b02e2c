//! The FUSE requests the image's file system answers, in the kernel's wire
//! format, for the io_uring transport ([`crate::uring`]).
//!
//! The classic transport reads whole requests from `/dev/fuse` and fuser
//! parses them; over io_uring the kernel splits a request into three parts
//! in buffers the server registered: the `fuse_in_header`, the opcode's
//! fixed argument (`op_in`) and the rest (a name, written data) in the
//! payload buffer, and it takes the reply the same way: a `fuse_out_header`
//! and the out arguments in the payload. fuser has no io_uring transport,
//! so this module decodes those parts and encodes the replies for the few
//! operations a one-file file system has; every other opcode is `ENOSYS`.
//!
//! Nothing here trusts the kernel's lengths: a short argument is `EINVAL`,
//! never a panic, and every reply fits the payload buffer or is `ERANGE`.
//! The answers themselves come from [`FileOps`], the same methods fuser's
//! transport calls, so the two transports cannot disagree.

use crate::{Errno, FileOps};

/// `struct fuse_in_header`.
pub(crate) const IN_HEADER: usize = 40;
/// `struct fuse_out_header`.
pub(crate) const OUT_HEADER: usize = 16;

const LOOKUP: u32 = 1;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const OPEN: u32 = 14;
const READ: u32 = 15;
const WRITE: u32 = 16;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FSYNC: u32 = 20;
const GETXATTR: u32 = 22;
const LISTXATTR: u32 = 23;
const FLUSH: u32 = 25;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const ACCESS: u32 = 34;
const DESTROY: u32 = 38;
const FALLOCATE: u32 = 43;

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
    pub(crate) fn parse(b: &[u8]) -> Option<InHeader> {
        let b = b.get(..IN_HEADER)?;
        Some(InHeader { opcode: u32_at(b, 4)?, unique: u64_at(b, 8)?, nodeid: u64_at(b, 16)? })
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
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

/// Writes a reply's out arguments into the payload buffer.
struct Out<'a> {
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

    /// `valid` seconds and nanoseconds of a cached entry or attribute.
    fn ttl(&mut self) -> Result<(), Errno> {
        self.u64(crate::TTL.as_secs())
    }
}

/// Answer one request: `op_in` is its fixed argument, `payload[..len]` the
/// rest. The reply's out arguments are written over `payload`; returns the
/// error (0 or a negated errno) and the out arguments' length.
pub(crate) fn dispatch(ops: &FileOps, h: &InHeader, op_in: &[u8], payload: &mut [u8], len: usize) -> (i32, usize) {
    let len = len.min(payload.len());
    let mut out = Out { buf: payload, len: 0 };
    match answer(ops, h, op_in, len, &mut out) {
        Ok(()) => (0, out.len),
        Err(e) => (-e.code(), 0),
    }
}

fn answer(ops: &FileOps, h: &InHeader, op_in: &[u8], len: usize, out: &mut Out) -> Result<(), Errno> {
    let arg32 = |at| u32_at(op_in, at).ok_or(Errno::EINVAL);
    let arg64 = |at| u64_at(op_in, at).ok_or(Errno::EINVAL);
    match h.opcode {
        LOOKUP => {
            // The name, NUL-terminated.
            let raw = out.buf.get(..len).ok_or(Errno::EINVAL)?;
            let name = raw.split(|&c| c == 0).next().unwrap_or_default();
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
            // The data goes straight into the payload buffer: no copy.
            let dst = out.buf.get_mut(..size).ok_or(Errno::ERANGE)?;
            out.len = ops.read(h.nodeid, offset, dst)?;
            Ok(())
        }
        WRITE => {
            let (offset, size) = (arg64(8)?, arg32(16)? as usize);
            if size != len {
                return Err(Errno::EINVAL);
            }
            // (Copied out before the reply overwrites the payload.)
            let n = ops.write(h.nodeid, offset, &out.buf[..len])?;
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

    #[test]
    fn headers_parse_and_encode_in_the_kernels_layout() {
        let mut b = [0u8; IN_HEADER];
        b[4..8].copy_from_slice(&READ.to_ne_bytes());
        b[8..16].copy_from_slice(&77u64.to_ne_bytes());
        b[16..24].copy_from_slice(&2u64.to_ne_bytes());
        assert_eq!(InHeader::parse(&b), Some(InHeader { opcode: READ, unique: 77, nodeid: 2 }));
        assert_eq!(InHeader::parse(&b[..20]), None, "a short header is refused, not read past");
        let o = out_header(77, -5, 8);
        assert_eq!((u32_at(&o, 0), u32_at(&o, 4), u64_at(&o, 8)), (Some(24), Some((-5i32) as u32), Some(77)));
    }

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

    fn req(opcode: u32, nodeid: u64) -> InHeader {
        InHeader { opcode, unique: 9, nodeid }
    }

    /// `fuse_read_in` / `fuse_write_in`: offset at 8, size at 16.
    fn rw_in(offset: u64, size: u32) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[8..16].copy_from_slice(&offset.to_ne_bytes());
        b[16..20].copy_from_slice(&size.to_ne_bytes());
        b
    }

    #[test]
    fn requests_are_answered_as_the_kernel_expects() {
        let ops = ops();
        let mut payload = vec![0u8; 1 << 16];
        // LOOKUP of the file: fuse_entry_out (128 bytes), inode 2, its size.
        payload[..6].copy_from_slice(b"image\0");
        let (err, n) = dispatch(&ops, &req(LOOKUP, 1), &[], &mut payload, 6);
        assert_eq!((err, n), (0, 128));
        assert_eq!((u64_at(&payload, 0), u64_at(&payload, 40 + 8)), (Some(2), Some(1 << 20)));
        payload[..4].copy_from_slice(b"xyz\0");
        assert_eq!(dispatch(&ops, &req(LOOKUP, 1), &[], &mut payload, 4), (-libc::ENOENT, 0));
        // A write, then a read of it, past the end short, and a write past
        // the end refused.
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        payload[..data.len()].copy_from_slice(&data);
        assert_eq!(dispatch(&ops, &req(WRITE, 2), &rw_in(4000, 5000), &mut payload, 5000), (0, 8));
        assert_eq!(u32_at(&payload, 0), Some(5000));
        assert_eq!(dispatch(&ops, &req(READ, 2), &rw_in(4000, 5000), &mut payload, 0), (0, 5000));
        assert_eq!(&payload[..5000], &data[..]);
        assert_eq!(dispatch(&ops, &req(READ, 2), &rw_in((1 << 20) - 10, 4096), &mut payload, 0), (0, 10));
        payload[..4096].fill(1);
        assert_eq!(dispatch(&ops, &req(WRITE, 2), &rw_in(1 << 20, 4096), &mut payload, 4096), (-libc::ENOSPC, 0));
        // A write whose data is not all there is refused, not half done.
        assert_eq!(dispatch(&ops, &req(WRITE, 2), &rw_in(0, 4096), &mut payload, 100), (-libc::EINVAL, 0));
        // The directory: three entries, the file last.
        let (err, n) = dispatch(&ops, &req(READDIR, 1), &rw_in(0, 4096), &mut payload, 0);
        assert_eq!(err, 0);
        assert_eq!(n, 32 + 32 + 32, "three 8-byte-aligned dirents");
        assert_eq!(&payload[64 + 24..64 + 29], b"image");
        // Opening: the file for direct I/O, the root as a directory.
        assert_eq!(dispatch(&ops, &req(OPEN, 2), &[0; 8], &mut payload, 0), (0, 16));
        assert_eq!(u32_at(&payload, 8), Some(FOPEN_DIRECT_IO));
        assert_eq!(dispatch(&ops, &req(OPEN, 1), &[0; 8], &mut payload, 0), (-libc::EISDIR, 0));
        assert_eq!(dispatch(&ops, &req(OPENDIR, 2), &[0; 8], &mut payload, 0), (-libc::ENOTDIR, 0));
        // Unknown and unsupported requests: ENOSYS.
        assert_eq!(dispatch(&ops, &req(9999, 2), &[], &mut payload, 0), (-libc::ENOSYS, 0));
        assert_eq!(ops.stats.reads.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    proptest::proptest! {
        /// Whatever the kernel (or a bug) puts in the buffers, an answer
        /// comes back and nothing panics or reads past a buffer.
        #[test]
        fn no_request_panics(opcode in 0u32..64, nodeid in 0u64..4, op_in in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128),
                             payload_len in 0usize..9000, len in 0usize..20000) {
            let ops = ops();
            let mut payload = vec![0x5au8; payload_len];
            let (err, n) = dispatch(&ops, &req(opcode, nodeid), &op_in, &mut payload, len);
            proptest::prop_assert!(err <= 0 && n <= payload.len());
            proptest::prop_assert!(err == 0 || n == 0);
        }
    }

    #[test]
    fn out_arguments_never_overrun_the_payload() {
        let mut small = [0u8; 10];
        let mut out = Out { buf: &mut small, len: 0 };
        assert_eq!(out.u64(1), Ok(()));
        assert_eq!(out.u64(2), Err(Errno::ERANGE));
        assert_eq!(out.len, 8);
    }
}
