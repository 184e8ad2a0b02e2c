//! LZO1X-1 compressor and bounds-checked ("safe") LZO1X decompressor.
//!
//! This crate produces and consumes the standard **LZO1X** stream format, the
//! one used by minilzo's `lzo1x_1_compress` / `lzo1x_decompress_safe` and by the
//! Linux kernel's `lzo` crypto backend for zram. Streams written here decode
//! with those implementations and vice versa.
//!
//! # Why our own implementation
//!
//! The reference implementations (LZO, minilzo, and their Rust ports such as
//! `rust-lzo`) are licensed under the GPL-2.0. zmem is `MIT OR Apache-2.0`, so
//! this crate is a fresh implementation written from the description of the
//! stream format below, not a translation of the GPL sources. The GPL code is
//! only used as a *dev-dependency* to cross-check compatibility in tests and
//! is never linked into zmem's binaries.
//!
//! # The LZO1X stream format
//!
//! A stream is a sequence of instructions. Each instruction is either a
//! *literal run* (copy bytes from the input) or a *match* (copy bytes from
//! earlier output at some distance). The decoder keeps a small piece of state,
//! `S`, which is the number of literals that were copied by the previous
//! instruction: `0`, `1..=3` (a match with "trailing literals"), or `4`
//! (meaning "a literal run of at least 4 bytes").
//!
//! Variable-length counts ("extended lengths") are written as a zero opcode
//! field followed by `k` zero bytes and one non-zero byte `b`; the value is
//! `base + 255 * k + b`.
//!
//! ## First byte
//! * `18..=255`: a literal run of `byte - 17` bytes follows (so the stream can
//!   start with 1..=238 literals). `S` becomes that count, capped at 4.
//! * `0..=17`: no special meaning; decode it as a normal instruction with
//!   `S = 0`.
//!
//! ## Instructions, by opcode byte `t`
//! * `t = 0..=15` and `S = 0`: **literal run** of `t + 3` bytes (4..=18); if
//!   `t = 0` the length is extended: `18 + 255 * k + b`. Then `S = 4`.
//! * `t = 0..=15` and `S = 1..=3`: **M1**, a 2-byte match at distance
//!   `1 + (t >> 2) + (next << 2)` (1..=1024). Two bytes long.
//! * `t = 0..=15` and `S = 4`: a 3-byte match at distance
//!   `2049 + (t >> 2) + (next << 2)` (2049..=3072). Two bytes long.
//! * `t = 64..=255`: **M2**, a match of `(t >> 5) + 1` bytes (3..=8) at distance
//!   `1 + ((t >> 2) & 7) + (next << 3)` (1..=2048). Two bytes long.
//! * `t = 32..=63`: **M3**, a match of `(t & 31) + 2` bytes (extended with base
//!   33 when `t & 31 = 0`), followed by a little-endian 16-bit word `w`;
//!   distance `1 + (w >> 2)` (1..=16384).
//! * `t = 16..=31`: **M4**, a match of `(t & 7) + 2` bytes (extended with base 9
//!   when `t & 7 = 0`), followed by a little-endian 16-bit word `w`; distance
//!   `16384 + ((t & 8) << 11) + (w >> 2)` (16385..=49151). A distance part of
//!   zero (`16384` exactly) is the **end-of-stream marker**; encoders write it
//!   as the three bytes `0x11 0x00 0x00`.
//!
//! After every match the low two bits of the instruction's second-to-last
//! byte (the opcode for M1/M2, the low byte of `w` for M3/M4) give the number
//! `0..=3` of literal bytes that follow the match directly, without any
//! header; `S` becomes that number. Literal runs of 4 or more bytes are
//! written as separate literal-run instructions, which is why a literal run
//! can only follow a match whose trailing-literal count is zero.
//!
//! # The compressor
//!
//! [`compress`] is a one-pass LZO1X-1 style compressor: a hash table of
//! 4-byte sequences (up to 2^14 entries of 16-bit positions) gives one
//! candidate per position; candidates are verified, extended forwards (and
//! backwards into pending literals), and emitted as M2/M3/M4 matches. Misses
//! skip ahead faster the longer the current literal run is, so incompressible
//! data is processed quickly. Input is handled in windows of 48 KiB so that
//! every distance fits the format's 49151-byte limit.
//!
//! # Example
//! ```
//! let page = b"hello hello hello hello, zram says hello hello".repeat(50);
//! let mut packed = vec![0u8; zmem_lzo::compress_bound(page.len())];
//! let n = zmem_lzo::compress(&page, &mut packed).unwrap();
//! let mut out = vec![0u8; page.len()];
//! let m = zmem_lzo::decompress(&packed[..n], &mut out).unwrap();
//! assert_eq!(&out[..m], &page[..]);
//! ```
//!
//! Note: both functions may use bytes of `dst` beyond the returned length as
//! scratch space; only `dst[..n]` is meaningful afterwards.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod compress;
mod decompress;

pub use compress::compress;
pub use decompress::decompress;

/// Errors returned by [`compress`] and [`decompress`].
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub enum LzoError {
    /// The destination buffer is too small.
    #[error("LZO: output buffer too small")]
    OutputOverrun,
    /// The compressed stream ended before the end-of-stream marker.
    #[error("LZO: compressed input is truncated")]
    InputOverrun,
    /// A match refers to data before the start of the output.
    #[error("LZO: match distance points before start of output")]
    LookbehindOverrun,
    /// The end-of-stream marker was found before the end of the input.
    #[error("LZO: trailing data after end-of-stream marker")]
    InputNotConsumed,
    /// The stream is malformed in some other way (e.g. a length overflows).
    #[error("LZO: corrupt compressed data")]
    Corrupt,
}

/// Worst-case compressed size for `len` input bytes: `len + len/16 + 64 + 3`.
///
/// A destination of at least this size never makes [`compress`] fail.
#[inline]
pub const fn compress_bound(len: usize) -> usize {
    len.saturating_add(len / 16 + 64 + 3)
}
