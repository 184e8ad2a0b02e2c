//! The slower device a caching export sits in front of (`zmem serve
//! --origin`): what it must offer, and the file or block device that
//! offers it.
//!
//! The export gives an origin only whole, aligned pages: every offset and
//! length is a multiple of [`ORIGIN_ALIGN`] and every buffer starts on
//! one. That is what `O_DIRECT` asks of a file or a 4Kn disk, so
//! [`FileOrigin`] opens its file that way where the file system allows: the
//! host's page cache would otherwise hold a second copy of what the zmem
//! pool holds compressed, and hide the device's speed from a benchmark.
//! Partial writes are merged into whole pages by the export, under its
//! page locks, before they reach here.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use rustix::fs::FallocateFlags;

/// Offsets, lengths and buffers given to an origin are multiples of this.
pub const ORIGIN_ALIGN: usize = 4096;

/// A device the export caches: reads of pages it does not hold, and every
/// write, go here. Ranges are [`ORIGIN_ALIGN`]-aligned and within
/// [`size`](Origin::size); buffers start on an aligned address.
pub trait Origin: Send + Sync {
    /// Bytes the origin holds (the export serves this, rounded down to
    /// whole pages).
    fn size(&self) -> u64;
    /// Fill `buf` from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write `buf` at `offset`; with `fua`, durable before it returns.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()>;
    /// Make every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Discard a range (a hint: what it reads as afterwards is up to the
    /// origin; the export drops its cached copies either way).
    fn trim(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Make a range read as zeroes.
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;
    /// What it is, for messages: a path or a URI, and how it is opened.
    fn describe(&self) -> String;
}

/// A regular file or a block device as an origin.
pub struct FileOrigin {
    file: File,
    size: u64,
    direct: bool,
    desc: String,
}

impl FileOrigin {
    /// Open `path` for reading and writing, with `O_DIRECT` unless its
    /// file system refuses it (tmpfs does; the file is then opened without,
    /// and [`direct`](Self::direct) says so). Anything other than a regular
    /// file or a block device, or one smaller than a page, is refused.
    pub fn open(path: &Path) -> io::Result<FileOrigin> {
        let named = |e: io::Error, what: &str| io::Error::new(e.kind(), format!("origin {}: {what}: {e}", path.display()));
        let open = |flags: i32| OpenOptions::new().read(true).write(true).custom_flags(flags).open(path);
        let (mut file, direct) = match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(0).map_err(|e| named(e, "cannot open it"))?, false),
            Err(e) => return Err(named(e, "cannot open it for reading and writing")),
        };
        let ft = file.metadata().map_err(|e| named(e, "stat"))?.file_type();
        if !ft.is_file() && !ft.is_block_device() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("origin {}: not a regular file or a block device", path.display())));
        }
        // A block device's size is where a seek to its end lands.
        let size = file.seek(SeekFrom::End(0)).map_err(|e| named(e, "finding its size"))?;
        if size < ORIGIN_ALIGN as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("origin {}: {size} bytes is less than one page", path.display())));
        }
        let desc = format!("{}{}", path.display(), if direct { " (O_DIRECT)" } else { " (buffered: its file system refuses O_DIRECT)" });
        Ok(FileOrigin { file, size, direct, desc })
    }

    /// Whether the file is opened with `O_DIRECT`.
    pub fn direct(&self) -> bool {
        self.direct
    }
}

impl Origin for FileOrigin {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, mut buf: &[u8], mut offset: u64, fua: bool) -> io::Result<()> {
        let flags = if fua { rustix::io::ReadWriteFlags::DSYNC } else { rustix::io::ReadWriteFlags::empty() };
        while !buf.is_empty() {
            match rustix::io::pwritev2(&self.file, &[IoSlice::new(buf)], offset, flags) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the origin took no bytes")),
                Ok(n) => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        match rustix::fs::fallocate(&self.file, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, offset, len) {
            // A hint the origin cannot take is no error.
            Err(rustix::io::Errno::OPNOTSUPP) => Ok(()),
            r => r.map_err(Into::into),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        match rustix::fs::fallocate(&self.file, FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE, offset, len) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(e.into()),
        }
        // No ZERO_RANGE here: write the zeroes.
        write_zero_buffers(self, offset, len)
    }

    fn describe(&self) -> String {
        self.desc.clone()
    }
}

/// WRITE_ZEROES for an origin that has no cheaper way: write zero-filled
/// buffers (1 MiB at a time, aligned) over the range.
pub fn write_zero_buffers(o: &(impl Origin + ?Sized), offset: u64, len: u64) -> io::Result<()> {
    let mut zeroes = AlignedBuf::new();
    let chunk = zeroes.get(len.min(1 << 20) as usize);
    chunk.fill(0);
    let (mut pos, end) = (offset, offset + len);
    while pos < end {
        let n = (end - pos).min(chunk.len() as u64) as usize;
        o.write_at(&chunk[..n], pos, false)?;
        pos += n as u64;
    }
    Ok(())
}

/// A reusable buffer whose slices start on an [`ORIGIN_ALIGN`] boundary
/// (what `O_DIRECT` needs), made from a slightly larger `Vec`.
#[derive(Default)]
pub struct AlignedBuf(Vec<u8>);

impl AlignedBuf {
    pub fn new() -> AlignedBuf {
        AlignedBuf(Vec::new())
    }

    /// An aligned slice of `len` bytes (contents unspecified).
    pub fn get(&mut self, len: usize) -> &mut [u8] {
        if self.0.len() < len + ORIGIN_ALIGN {
            self.0 = vec![0; len + ORIGIN_ALIGN];
        }
        let start = self.0.as_ptr().align_offset(ORIGIN_ALIGN);
        &mut self.0[start..start + len]
    }

    /// Give back memory beyond `keep` bytes.
    pub fn shrink(&mut self, keep: usize) {
        if self.0.len() > keep + ORIGIN_ALIGN {
            self.0 = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        let mut b = AlignedBuf::new();
        for len in [1, 4096, 5000, 1 << 20] {
            let s = b.get(len);
            assert_eq!(s.len(), len);
            assert_eq!(s.as_ptr() as usize % ORIGIN_ALIGN, 0);
        }
    }

    #[test]
    fn a_file_origin_reads_writes_zeroes_and_trims() {
        let dir = tempfile::tempdir_in(std::env::var_os("CARGO_TARGET_TMPDIR").unwrap_or_else(|| "/var/tmp".into())).unwrap();
        let path = dir.path().join("origin.img");
        std::fs::write(&path, vec![7u8; 64 << 10]).unwrap();
        let o = FileOrigin::open(&path).unwrap();
        assert_eq!(o.size(), 64 << 10);
        let mut b = AlignedBuf::new();
        let page = b.get(8192);
        page.fill(0xA5);
        o.write_at(page, 4096, true).unwrap();
        o.write_zeroes(16384, 8192).unwrap();
        o.trim(32768, 4096).unwrap();
        o.flush().unwrap();
        let all = std::fs::read(&path).unwrap();
        assert!(all[..4096].iter().all(|&v| v == 7));
        assert!(all[4096..12288].iter().all(|&v| v == 0xA5));
        assert!(all[16384..24576].iter().all(|&v| v == 0));
        assert!(all[40960..].iter().all(|&v| v == 7));
        let back = b.get(8192);
        o.read_at(back, 4096).unwrap();
        assert!(back.iter().all(|&v| v == 0xA5));
        // Too small, or not a file: refused with the path in the message.
        std::fs::write(dir.path().join("tiny"), [1u8; 100]).unwrap();
        let e = FileOrigin::open(&dir.path().join("tiny")).err().unwrap().to_string();
        assert!(e.contains("tiny") && e.contains("less than one page"), "{e}");
        let e = FileOrigin::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("origin"), "{e}");
    }
}
