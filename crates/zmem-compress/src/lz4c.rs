//! lz4 through the C library (liblz4 1.10, BSD-2-Clause, built from source
//! by `lz4-sys`, MIT): the only unsafe code of this crate.
//!
//! Why C and not `lz4_flex`: liblz4 decodes and encodes faster than both
//! of lz4_flex's decoders, safe and unsafe with bounds checks (`cargo bench
//! -p zmem-compress --bench lz4` measures it; docs/MEASUREMENTS.md
//! gives the figures). It is the code the kernel's
//! zram runs, and `LZ4_decompress_safe` is made for untrusted input: it
//! never reads past the source nor writes past the destination, whatever
//! the stream says, and reports a corrupt one as a negative length.
//!
//! The surface is safe functions over slices, and [`DictStream`], a
//! dictionary prepared once (`LZ4_loadDictSlow`) and attached to a
//! per-thread working stream for each page (`LZ4_attach_dictionary`, the
//! no-copy reuse liblz4 made stable in 1.10). Lengths that do not fit an
//! `int` are refused before any call.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::os::raw::{c_char, c_int};
use std::ptr::NonNull;

use lz4_sys::LZ4StreamEncode;

// Part of liblz4's stable API (lz4.h, 1.10) that lz4-sys does not declare;
// its static library, which lz4-sys links, defines them.
extern "C" {
    fn LZ4_loadDictSlow(stream: *mut LZ4StreamEncode, dict: *const c_char, dict_size: c_int) -> c_int;
    fn LZ4_attach_dictionary(working: *mut LZ4StreamEncode, dict: *const LZ4StreamEncode);
    fn LZ4_resetStream_fast(stream: *mut LZ4StreamEncode);
    fn LZ4_compress_fast_continue(
        stream: *mut LZ4StreamEncode,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
    fn LZ4_decompress_safe_usingDict(
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        dict: *const c_char,
        dict_size: c_int,
    ) -> c_int;
}

/// The most of a dictionary lz4 can use: its window is 64 KiB.
pub const DICT_WINDOW: usize = 64 << 10;

/// An lz4 dictionary, loaded once into a stream of its own (liblz4 hashes
/// it there), then only read: each compression attaches it to the calling
/// thread's working stream.
pub struct DictStream {
    /// Created by LZ4_createStream, loaded by LZ4_loadDictSlow, freed in Drop.
    stream: NonNull<LZ4StreamEncode>,
    /// The dictionary's bytes (its last 64 KiB); the stream points into
    /// them, so they live as long as it and never move (a boxed slice).
    dict: Box<[u8]>,
}

// SAFETY: after `new` the dictionary stream and its bytes are only read
// (LZ4_attach_dictionary takes the dictionary stream as const, and
// decompression reads the bytes), so sharing them between threads is safe;
// each thread compresses in its own working stream.
unsafe impl Send for DictStream {}
// SAFETY: as for Send: no method writes to the stream or the bytes.
unsafe impl Sync for DictStream {}

impl DictStream {
    /// Prepare the last 64 KiB of `content`. None if liblz4 cannot
    /// allocate a stream.
    pub fn new(content: &[u8]) -> Option<DictStream> {
        let dict: Box<[u8]> = content[content.len().saturating_sub(DICT_WINDOW)..].into();
        // SAFETY: LZ4_createStream allocates and initialises a stream, or
        // returns null (checked).
        let stream = NonNull::new(unsafe { lz4_sys::LZ4_createStream() })?;
        // SAFETY: the stream is live and ours; the dictionary is a live
        // slice of at most 64 KiB (fits an int) that outlives the stream
        // (both are owned by the DictStream, and Drop frees the stream).
        unsafe { LZ4_loadDictSlow(stream.as_ptr(), dict.as_ptr().cast(), dict.len() as c_int) };
        Some(DictStream { stream, dict })
    }

    /// Bytes this dictionary holds: the stream's tables and the bytes.
    pub fn heap_bytes(&self) -> usize {
        // sizeof(LZ4_stream_t) in lz4 1.10 (LZ4_STREAM_MINSIZE).
        16_416 + self.dict.len()
    }

    /// Compress `src` into `dst` with the dictionary; None when the output
    /// does not fit (or no working stream could be made).
    pub fn compress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        let src_len = c_int::try_from(src.len()).ok()?;
        let dst_len = c_int::try_from(dst.len()).unwrap_or(c_int::MAX);
        WORK.with(|w| {
            let work = w.get()?;
            // SAFETY: `work` is this thread's own live stream (see
            // WorkStream), initialised at creation, so the fast reset is
            // valid; the dictionary stream was loaded by LZ4_loadDictSlow
            // and is live for this call (borrowed through &self). The
            // attachment lasts this one compression, which reads `src_len`
            // bytes of `src` and writes at most `dst_len` to `dst`, two
            // live, non-overlapping slices; 0 means it did not fit.
            let n = unsafe {
                LZ4_resetStream_fast(work.as_ptr());
                LZ4_attach_dictionary(work.as_ptr(), self.stream.as_ptr());
                LZ4_compress_fast_continue(work.as_ptr(), src.as_ptr().cast(), dst.as_mut_ptr().cast(), src_len, dst_len, 1)
            };
            (n > 0).then_some(n as usize)
        })
    }

    /// Decompress `src`, written with this dictionary, into `dst`: the
    /// length written, or None for a corrupt stream (as `decompress`).
    pub fn decompress(&self, src: &[u8], dst: &mut [u8]) -> Option<usize> {
        let src_len = c_int::try_from(src.len()).ok()?;
        let dst_len = c_int::try_from(dst.len()).unwrap_or(c_int::MAX);
        // SAFETY: as in `decompress`; the dictionary is a live slice of at
        // most 64 KiB that the decoder only reads (a match may reach back
        // into it, never before its start).
        let n = unsafe {
            LZ4_decompress_safe_usingDict(src.as_ptr().cast(), dst.as_mut_ptr().cast(), src_len, dst_len, self.dict.as_ptr().cast(), self.dict.len() as c_int)
        };
        usize::try_from(n).ok()
    }
}

impl Drop for DictStream {
    fn drop(&mut self) {
        // SAFETY: the stream came from LZ4_createStream and is freed once;
        // no working stream still points at it (attachments end with the
        // compression call that made them).
        unsafe { lz4_sys::LZ4_freeStream(self.stream.as_ptr()) };
    }
}

/// A thread's working stream for dictionary compression, made on first use.
struct WorkStream(Cell<Option<NonNull<LZ4StreamEncode>>>);

impl WorkStream {
    fn get(&self) -> Option<NonNull<LZ4StreamEncode>> {
        if self.0.get().is_none() {
            // SAFETY: allocates and initialises a stream, or returns null.
            self.0.set(NonNull::new(unsafe { lz4_sys::LZ4_createStream() }));
        }
        self.0.get()
    }
}

impl Drop for WorkStream {
    fn drop(&mut self) {
        if let Some(s) = self.0.get() {
            // SAFETY: this thread's stream, made by LZ4_createStream, freed
            // once as the thread exits.
            unsafe { lz4_sys::LZ4_freeStream(s.as_ptr()) };
        }
    }
}

thread_local! {
    static WORK: WorkStream = const { WorkStream(Cell::new(None)) };
}

/// Compress `src` into `dst` (LZ4_compress_default, acceleration 1 like
/// the kernel's). None when the output does not fit in `dst`.
pub fn compress(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    let src_len = c_int::try_from(src.len()).ok()?;
    let dst_len = c_int::try_from(dst.len()).unwrap_or(c_int::MAX);
    // SAFETY: both pointers come from live slices that do not overlap (one
    // is borrowed shared, the other exclusively), and the lengths passed
    // are at most theirs. LZ4_compress_default reads `src_len` bytes,
    // writes at most `dst_len` and returns 0 when the output would not fit.
    let n = unsafe { lz4_sys::LZ4_compress_default(src.as_ptr().cast(), dst.as_mut_ptr().cast(), src_len, dst_len) };
    (n > 0).then_some(n as usize)
}

/// Decompress `src` into `dst`: the length written, or None when the
/// stream is corrupt or would not fit in `dst`.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    let src_len = c_int::try_from(src.len()).ok()?;
    let dst_len = c_int::try_from(dst.len()).unwrap_or(c_int::MAX);
    // SAFETY: as in `compress`; LZ4_decompress_safe is protected against
    // malicious input: it reads at most `src_len` bytes of `src`, writes at
    // most `dst_len` bytes to `dst`, and returns a negative value on a
    // malformed stream or a destination too small.
    let n = unsafe { lz4_sys::LZ4_decompress_safe(src.as_ptr().cast(), dst.as_mut_ptr().cast(), src_len, dst_len) };
    usize::try_from(n).ok()
}

/// LZ4_compressBound: the largest output of `len` input bytes.
pub fn compress_bound(len: usize) -> usize {
    // The formula of lz4.h (LZ4_COMPRESSBOUND), in usize so that no length
    // overflows an int: input + input/255 + 16.
    len + len / 255 + 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_matches_the_library() {
        for len in [0usize, 1, 255, 4096, 1 << 20] {
            // SAFETY: a pure function of an integer.
            let c = unsafe { lz4_sys::LZ4_compressBound(len as c_int) };
            assert_eq!(compress_bound(len), c as usize, "{len}");
        }
    }

    #[test]
    fn small_destinations_are_refused_not_overrun() {
        let page: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
        let mut big = vec![0u8; compress_bound(4096)];
        let n = compress(&page, &mut big).unwrap();
        let mut small = vec![0u8; n - 1];
        assert_eq!(compress(&page, &mut small), None);
        let mut out = vec![0u8; 4095];
        assert_eq!(decompress(&big[..n], &mut out), None, "4095 bytes cannot hold the page");
        let mut out = vec![0u8; 4096];
        assert_eq!(decompress(&big[..n], &mut out), Some(4096));
        assert_eq!(out, page);
    }

    #[test]
    fn dictionary_streams_roundtrip_and_help() {
        let page = crate::tests::sample_pages().swap_remove(1);
        // A dictionary that holds the page: its compression is a few matches.
        let mut content = vec![0u8; 1000];
        content.extend_from_slice(&page);
        let d = DictStream::new(&content).unwrap();
        let mut plain = vec![0u8; compress_bound(4096)];
        let plain_n = compress(&page, &mut plain).unwrap();
        let mut z = vec![0u8; compress_bound(4096)];
        let n = d.compress(&page, &mut z).unwrap();
        assert!(n * 10 < plain_n, "{n} with the dictionary, {plain_n} without");
        let mut out = vec![0u8; 4096];
        assert_eq!(d.decompress(&z[..n], &mut out), Some(4096));
        assert_eq!(out, page);
        // Twice: the working stream is reset between pages.
        assert_eq!(d.compress(&page, &mut z), Some(n));
        // Without the dictionary the stream does not decode to the page.
        assert!(decompress(&z[..n], &mut out).is_none_or(|_| out != page));
        let mut small = vec![0u8; n - 1];
        assert_eq!(d.compress(&page, &mut small), None);
        let big = vec![7u8; 200 << 10];
        assert_eq!(DictStream::new(&big).unwrap().dict.len(), DICT_WINDOW);
    }
}
