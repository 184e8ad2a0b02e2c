//! lz4 through the C library (liblz4 1.10, BSD-2-Clause, built from source
//! by `lz4-sys`, MIT): the only unsafe code of this crate.
//!
//! Why C and not `lz4_flex`: on the pages of `/usr/lib/x86_64-linux-gnu`
//! liblz4 decodes 1.29 × as fast as lz4_flex 0.11's safe decoder (3,415
//! against 2,654 MB/s; lz4_flex 0.14's unsafe decoder with bounds checks
//! was no faster, 2,552) and encodes 1.11 × as fast (613 against 554):
//! `cargo bench -p zmem-compress --bench lz4`. It is the code the kernel's
//! zram runs, and `LZ4_decompress_safe` is made for untrusted input: it
//! never reads past the source nor writes past the destination, whatever
//! the stream says, and reports a corrupt one as a negative length.
//!
//! The surface is two safe functions over slices; lengths that do not fit
//! an `int` are refused before any call.

#![allow(unsafe_code)]

use std::os::raw::c_int;

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
}
