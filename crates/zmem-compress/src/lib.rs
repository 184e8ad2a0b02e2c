//! Page compressors for zmem behind one tagged interface.
//!
//! Every compressed object in a zmem pool remembers which algorithm wrote it
//! (a one-byte [`Algorithm`] tag kept in the index entry), so a pool may change
//! its compressor at run time — as zram's `recomp_algorithm` and zswap's
//! `compressor` parameter allow — without ever breaking entries written before.
//!
//! Offered:
//! * **lz4** (default): the speed choice, and the algorithm kernel zram on this
//!   machine is compared against. The C library (liblz4, as in the kernel),
//!   in the one small unsafe module [`lz4c`]: it decodes 1.29 × as fast as
//!   the pure-Rust `lz4_flex` and is as safe on corrupt input.
//! * **zstd** at a configurable level: the ratio choice (the kernel's zram
//!   lacks it here), its fast levels (below 0) between it and lz4. One
//!   compression context per thread, reused.
//! * **lzo** (LZO1X-1): the kernel's historical default, through our own
//!   implementation in `zmem-lzo` (minilzo is GPL; we ship MIT OR Apache-2.0).
//!
//! lz4 and zstd also compress with a [`Dictionary`] (zstd's format,
//! trained on sample pages), prepared once and shared by every thread.
//!
//! Compression never allocates on the hot path for lz4 and lzo; zstd keeps a
//! thread-local context. Decompression is given the exact compressed length and
//! a destination of the exact original length, and fails with a typed error on
//! any mismatch or corrupt input: it never panics.

#![deny(unsafe_code)]

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

mod dict;
mod lz4c;

pub use dict::Dictionary;

/// The algorithm that wrote an object. The discriminant is what is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Algorithm {
    #[default]
    Lz4 = 0,
    Zstd = 1,
    Lzo = 2,
}

impl Algorithm {
    pub const ALL: [Algorithm; 3] = [Algorithm::Lz4, Algorithm::Zstd, Algorithm::Lzo];

    /// The tag stored with each object.
    pub fn tag(self) -> u8 {
        self as u8
    }

    /// Decode a stored tag.
    pub fn from_tag(tag: u8) -> Result<Algorithm, CompressError> {
        match tag {
            0 => Ok(Algorithm::Lz4),
            1 => Ok(Algorithm::Zstd),
            2 => Ok(Algorithm::Lzo),
            t => Err(CompressError::UnknownTag(t)),
        }
    }

    /// The name used on the command line and by the kernel's zram.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Lz4 => "lz4",
            Algorithm::Zstd => "zstd",
            Algorithm::Lzo => "lzo",
        }
    }

    /// Worst-case compressed size of `len` input bytes.
    pub fn compress_bound(self, len: usize) -> usize {
        match self {
            Algorithm::Lz4 => lz4c::compress_bound(len),
            Algorithm::Zstd => zstd::zstd_safe::compress_bound(len),
            Algorithm::Lzo => zmem_lzo::compress_bound(len),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors from compression and decompression. All are recoverable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompressError {
    #[error("unknown compressor `{0}`: choose one of lz4, zstd[:LEVEL], lzo")]
    UnknownAlgorithm(String),
    #[error("bad zstd level `{0}`: use an integer from 1 to 22 (for example zstd:3), or below 0 for zstd's fast levels (zstd:-1, faster and larger still further down)")]
    BadLevel(String),
    #[error("{alg} takes no level (`{spec}`): write `{alg}`, or use zstd:LEVEL for a tunable compressor")]
    NoLevel { alg: Algorithm, spec: String },
    #[error("unknown algorithm tag {0} in a stored object (corrupt index entry?)")]
    UnknownTag(u8),
    #[error("compressed output does not fit in {capacity} bytes")]
    DoesNotFit { capacity: usize },
    #[error("{alg} failed to compress: {msg}")]
    Compress { alg: Algorithm, msg: String },
    #[error("{alg} stream is corrupt: {msg}")]
    Corrupt { alg: Algorithm, msg: String },
    #[error("not a usable dictionary: {0}")]
    BadDictionary(String),
    #[error("could not train a dictionary: {0}")]
    Train(String),
    #[error("{0} cannot compress with this dictionary (lzo takes none; zstd only at the levels it was prepared for)")]
    NoDictionary(Compressor),
    #[error("{alg} stream decompressed to {got} bytes, expected {expected}")]
    WrongLength { alg: Algorithm, got: usize, expected: usize },
}

/// A configured compressor: algorithm plus level (level is used by zstd only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compressor {
    pub algorithm: Algorithm,
    pub level: i32,
}

impl Default for Compressor {
    fn default() -> Self {
        Compressor::new(Algorithm::Lz4)
    }
}

/// Default zstd level: 3, zstd's own default, well balanced for 4 KiB pages.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

impl Compressor {
    pub fn new(algorithm: Algorithm) -> Compressor {
        let level = if algorithm == Algorithm::Zstd { DEFAULT_ZSTD_LEVEL } else { 0 };
        Compressor { algorithm, level }
    }

    /// zstd at `level`: 1 to 22, or a fast level below 0 (zstd's
    /// `--fast=N` is level -N) down to the library's least.
    pub fn zstd(level: i32) -> Result<Compressor, CompressError> {
        if level == 0 || !zstd::compression_level_range().contains(&level) {
            return Err(CompressError::BadLevel(level.to_string()));
        }
        Ok(Compressor { algorithm: Algorithm::Zstd, level })
    }

    /// Compress `src` into `dst`; returns the compressed length.
    ///
    /// Fails with [`CompressError::DoesNotFit`] when the output would exceed
    /// `dst.len()`; a caller that sizes `dst` at its "huge" threshold learns in
    /// one call that the page is not worth storing compressed.
    pub fn compress(&self, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        let capacity = dst.len();
        match self.algorithm {
            Algorithm::Lz4 => lz4c::compress(src, dst).ok_or(CompressError::DoesNotFit { capacity }),
            Algorithm::Lzo => zmem_lzo::compress(src, dst).map_err(|e| match e {
                zmem_lzo::LzoError::OutputOverrun => CompressError::DoesNotFit { capacity },
                e => CompressError::Compress { alg: Algorithm::Lzo, msg: e.to_string() },
            }),
            Algorithm::Zstd => ZSTD_CCTX.with(|cell| {
                let mut slot = cell.borrow_mut();
                if slot.as_ref().map(|(lvl, _)| *lvl) != Some(self.level) {
                    let c = zstd::bulk::Compressor::new(self.level).map_err(|e| CompressError::Compress { alg: Algorithm::Zstd, msg: e.to_string() })?;
                    *slot = Some((self.level, c));
                }
                let (_, c) = slot.as_mut().expect("context was just installed");
                c.compress_to_buffer(src, dst).map_err(|_| CompressError::DoesNotFit { capacity })
            }),
        }
    }
}

impl fmt::Display for Compressor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.algorithm {
            Algorithm::Zstd => write!(f, "zstd:{}", self.level),
            a => f.write_str(a.name()),
        }
    }
}

impl FromStr for Compressor {
    type Err = CompressError;

    /// `lz4`, `lzo` (also `lzo-rle`/`lzo1x`), `zstd` or `zstd:LEVEL`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let (name, level) = match lower.split_once(':') {
            Some((n, l)) => (n, Some(l)),
            None => (lower.as_str(), None),
        };
        let alg = match name {
            "lz4" => Algorithm::Lz4,
            "zstd" => Algorithm::Zstd,
            "lzo" | "lzo1x" | "lzo-rle" => Algorithm::Lzo,
            _ => return Err(CompressError::UnknownAlgorithm(s.to_string())),
        };
        match (alg, level) {
            (Algorithm::Zstd, Some(l)) => {
                let lvl: i32 = l.parse().map_err(|_| CompressError::BadLevel(l.to_string()))?;
                Compressor::zstd(lvl)
            }
            (a, Some(_)) => Err(CompressError::NoLevel { alg: a, spec: s.trim().to_string() }),
            (a, None) => Ok(Compressor::new(a)),
        }
    }
}

thread_local! {
    static ZSTD_CCTX: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static ZSTD_DCTX: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Decompress `src`, written by `alg`, into `dst`, which must come out exactly full.
pub fn decompress(alg: Algorithm, src: &[u8], dst: &mut [u8]) -> Result<(), CompressError> {
    let expected = dst.len();
    let got = match alg {
        Algorithm::Lz4 => {
            lz4c::decompress(src, dst).ok_or_else(|| CompressError::Corrupt { alg, msg: format!("malformed block, or more than {expected} bytes") })?
        }
        Algorithm::Lzo => zmem_lzo::decompress(src, dst).map_err(|e| CompressError::Corrupt { alg, msg: e.to_string() })?,
        Algorithm::Zstd => ZSTD_DCTX.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| CompressError::Corrupt { alg, msg: e.to_string() })?);
            }
            let d = slot.as_mut().expect("context was just installed");
            d.decompress_to_buffer(src, dst).map_err(|e| CompressError::Corrupt { alg, msg: e.to_string() })
        })?,
    };
    if got != expected {
        return Err(CompressError::WrongLength { alg, got, expected });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Text, random bytes, zeros, one byte, nothing (`[1]` is random).
    pub(crate) fn sample_pages() -> Vec<Vec<u8>> {
        let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog 0123456789\n".iter().cycle().take(4096).copied().collect();
        let mut random = vec![0u8; 4096];
        zmem_testkit::XorShift::from_state(0x9e3779b97f4a7c15).fill(&mut random);
        vec![text, random, vec![0u8; 4096], vec![7u8; 1], Vec::new()]
    }

    #[test]
    fn roundtrip_every_algorithm() {
        for c in ["lz4", "zstd", "zstd:19", "zstd:-5", "lzo"] {
            let c: Compressor = c.parse().unwrap();
            for page in sample_pages() {
                let mut buf = vec![0u8; c.algorithm.compress_bound(page.len())];
                let n = c.compress(&page, &mut buf).unwrap();
                let mut out = vec![0u8; page.len()];
                decompress(c.algorithm, &buf[..n], &mut out).unwrap();
                assert_eq!(out, page, "{c}");
            }
        }
    }

    #[test]
    fn small_destination_reports_does_not_fit() {
        let random = &sample_pages()[1];
        for alg in Algorithm::ALL {
            let mut buf = vec![0u8; 3000];
            let err = Compressor::new(alg).compress(random, &mut buf).unwrap_err();
            assert_eq!(err, CompressError::DoesNotFit { capacity: 3000 }, "{alg}");
        }
    }

    #[test]
    fn wrong_length_and_corruption_are_errors() {
        let page = &sample_pages()[0];
        for alg in Algorithm::ALL {
            let c = Compressor::new(alg);
            let mut buf = vec![0u8; alg.compress_bound(page.len())];
            let n = c.compress(page, &mut buf).unwrap();
            let mut short = vec![0u8; 4095];
            assert!(decompress(alg, &buf[..n], &mut short).is_err(), "{alg}");
            let mut out = vec![0u8; 4096];
            assert!(decompress(alg, &buf[..n / 2], &mut out).is_err(), "{alg}");
        }
    }

    #[test]
    fn parse_names_and_errors() {
        assert_eq!("lz4".parse::<Compressor>().unwrap(), Compressor::new(Algorithm::Lz4));
        assert_eq!("zstd:7".parse::<Compressor>().unwrap().level, 7);
        assert_eq!("zstd".parse::<Compressor>().unwrap().level, DEFAULT_ZSTD_LEVEL);
        assert_eq!("lzo-rle".parse::<Compressor>().unwrap().algorithm, Algorithm::Lzo);
        assert!(matches!("brotli".parse::<Compressor>(), Err(CompressError::UnknownAlgorithm(_))));
        assert!(matches!("zstd:99".parse::<Compressor>(), Err(CompressError::BadLevel(_))));
        assert!(matches!("zstd:0".parse::<Compressor>(), Err(CompressError::BadLevel(_))));
        assert!(matches!("zstd:-9999999".parse::<Compressor>(), Err(CompressError::BadLevel(_))));
        assert_eq!("zstd:-3".parse::<Compressor>().unwrap().level, -3);
        assert_eq!("zstd:-3".parse::<Compressor>().unwrap().to_string(), "zstd:-3");
        let e = "lz4:3".parse::<Compressor>().unwrap_err();
        assert!(matches!(e, CompressError::NoLevel { alg: Algorithm::Lz4, .. }), "{e:?}");
        assert!(!e.to_string().contains("zstd level"), "{e}");
        assert!(matches!("lzo:1".parse::<Compressor>(), Err(CompressError::NoLevel { alg: Algorithm::Lzo, .. })));
        assert!(Algorithm::from_tag(9).is_err());
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_tag(a.tag()).unwrap(), a);
        }
    }

    proptest! {
        #[test]
        fn garbage_never_panics(alg in 0u8..3, data in proptest::collection::vec(any::<u8>(), 0..600)) {
            let alg = Algorithm::from_tag(alg).unwrap();
            let mut out = vec![0u8; 4096];
            let _ = decompress(alg, &data, &mut out);
        }

        /// A valid stream with bytes changed, cut or extended (what a
        /// corrupt record or a hostile image gives): an error or some page,
        /// never a panic or a write out of bounds (the decoders' unsafe
        /// code runs under valgrind's memcheck in scripts/test.sh).
        #[test]
        fn corrupted_streams_never_panic(
            alg in 0u8..3,
            seed in any::<u8>(),
            flips in proptest::collection::vec((any::<u16>(), any::<u8>()), 1..8),
            cut in 0usize..64,
            out_len in prop_oneof![Just(4096usize), 0usize..8192],
        ) {
            let alg = Algorithm::from_tag(alg).unwrap();
            let page: Vec<u8> = (0..4096).map(|i| ((i / 5) as u8).wrapping_mul(seed) ^ (i % 251) as u8).collect();
            let mut buf = vec![0u8; alg.compress_bound(page.len())];
            let n = Compressor::new(alg).compress(&page, &mut buf).unwrap();
            let mut z = buf[..n].to_vec();
            for (at, x) in flips {
                let i = at as usize % z.len();
                z[i] ^= x | 1;
            }
            z.truncate(z.len().saturating_sub(cut));
            let mut out = vec![0u8; out_len];
            let _ = decompress(alg, &z, &mut out);
            z.extend_from_slice(&[0xff; 32]);
            let _ = decompress(alg, &z, &mut out);
        }

        #[test]
        fn roundtrip_random(alg in 0u8..3, seed in any::<u8>(), len in 0usize..4097) {
            let alg = Algorithm::from_tag(alg).unwrap();
            let page: Vec<u8> = (0..len).map(|i| ((i / 7) as u8).wrapping_mul(seed)).collect();
            let c = Compressor::new(alg);
            let mut buf = vec![0u8; alg.compress_bound(len)];
            let n = c.compress(&page, &mut buf).unwrap();
            let mut out = vec![0u8; len];
            decompress(alg, &buf[..n], &mut out).unwrap();
            prop_assert_eq!(out, page);
        }
    }
}
