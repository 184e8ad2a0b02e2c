//! Dictionaries: zstd's format, prepared once, used by zstd and lz4.
//!
//! A 4 KiB page is too short for a compressor to learn much from itself;
//! a dictionary trained on pages like it gives it the common strings (and,
//! for zstd, the entropy tables) up front. zram takes one as a file
//! (`algorithm_params dict=PATH`); a zmem pool trains its own.
//!
//! One [`Dictionary`] is the zstd dictionary (magic, id, entropy tables,
//! content) prepared for every use it will see, so that no page pays for
//! loading it (the 2026 kernel patch that did the same measured I/O over
//! 50 % faster than reloading per page):
//! * a `DDict` for zstd decompression, shared by every thread;
//! * a `CDict` per zstd level the pool compresses at, fixed at creation
//!   (a CDict holds match tables sized for its level; a level not
//!   prepared compresses without the dictionary, see [`Dictionary::supports`]);
//! * an lz4 stream over the content's last 64 KiB, lz4's window.
//!
//! Every thread keeps its own zstd contexts and lz4 working stream, so a
//! page costs one call into the library with no allocation.
//!
//! The dictionary id is the zstd frame's `Dictionary_ID`: a pool numbers
//! its dictionaries 1, 2, 3... (written over the trainer's random id, a
//! byte per frame instead of four), and zstd refuses to decode a frame
//! with a dictionary of another id, so a mixed-up dictionary is an error,
//! never wrong data. lz4 blocks carry no id: the pool's index entry names
//! the dictionary.

use std::cell::RefCell;

use zstd::zstd_safe::{self, CDict, DDict};

use crate::lz4c::DictStream;
use crate::{Algorithm, CompressError, Compressor};

/// zstd's dictionary magic number (little-endian in the first 4 bytes).
const ZSTD_DICT_MAGIC: u32 = 0xEC30_A437;

/// A dictionary, prepared for zstd (decompression and the given levels)
/// and lz4. Immutable and shared between threads.
pub struct Dictionary {
    id: u32,
    bytes: Box<[u8]>,
    ddict: DDict<'static>,
    cdicts: Vec<(i32, CDict<'static>)>,
    lz4: DictStream,
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary").field("id", &self.id).field("len", &self.bytes.len()).finish()
    }
}

impl Dictionary {
    /// Train a dictionary of at most `max_size` bytes on `samples` (pages
    /// laid end to end, `sizes` their lengths) with zstd's trainer, number
    /// it `id`, and prepare it for the zstd `levels`.
    pub fn train(id: u32, samples: &[u8], sizes: &[usize], max_size: usize, levels: &[i32]) -> Result<Dictionary, CompressError> {
        let bytes = zstd::dict::from_continuous(samples, sizes, max_size).map_err(|e| CompressError::Train(e.to_string()))?;
        Dictionary::from_bytes(id, bytes, levels)
    }

    /// Take a zstd dictionary (as `zstd --train` writes it), number it
    /// `id` (1 or more), and prepare it for the zstd `levels`. A file that
    /// is not a zstd dictionary, or whose tables do not load, is refused.
    pub fn from_bytes(id: u32, mut bytes: Vec<u8>, levels: &[i32]) -> Result<Dictionary, CompressError> {
        let corrupt = |msg: String| CompressError::BadDictionary(msg);
        if id == 0 {
            return Err(corrupt("dictionary id 0 means \"no dictionary\" to zstd".into()));
        }
        if bytes.len() < 8 || u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) != ZSTD_DICT_MAGIC {
            return Err(corrupt(format!(
                "{} bytes without zstd's dictionary magic number: not a zstd dictionary (train one with `zstd --train`, or let the pool train its own with --dict auto)",
                bytes.len()
            )));
        }
        bytes[4..8].copy_from_slice(&id.to_le_bytes());
        // zstd parses the entropy tables here and returns null if they are bad.
        let ddict = DDict::try_create(&bytes).ok_or_else(|| corrupt("zstd could not load its entropy tables".into()))?;
        if ddict.get_dict_id().map(|i| i.get()) != Some(id) {
            return Err(corrupt("zstd did not read back the dictionary id".into()));
        }
        let mut cdicts: Vec<(i32, CDict<'static>)> = Vec::new();
        for &level in levels {
            if cdicts.iter().any(|(l, _)| *l == level) {
                continue;
            }
            let c = CDict::try_create(&bytes, level).ok_or_else(|| corrupt(format!("zstd could not prepare it for level {level}")))?;
            cdicts.push((level, c));
        }
        let lz4 = DictStream::new(&bytes).ok_or_else(|| corrupt("liblz4 could not allocate a stream".into()))?;
        Ok(Dictionary { id, bytes: bytes.into_boxed_slice(), ddict, cdicts, lz4 })
    }

    /// The id frames written with it carry.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The dictionary in zstd's format (with its id), e.g. to save it.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Memory it holds: the bytes, zstd's prepared forms, lz4's stream.
    pub fn heap_bytes(&self) -> u64 {
        let cdicts: usize = self.cdicts.iter().map(|(_, c)| c.sizeof()).sum();
        (self.bytes.len() + self.ddict.sizeof() + cdicts + self.lz4.heap_bytes()) as u64
    }

    /// Whether `c` can compress with it: lz4, and zstd at a prepared level.
    pub fn supports(&self, c: Compressor) -> bool {
        match c.algorithm {
            Algorithm::Lz4 => true,
            Algorithm::Zstd => self.cdict(c.level).is_some(),
            Algorithm::Lzo => false,
        }
    }

    fn cdict(&self, level: i32) -> Option<&CDict<'static>> {
        self.cdicts.iter().find(|(l, _)| *l == level).map(|(_, c)| c)
    }

    /// Compress `src` into `dst` with `c` and this dictionary. Fails with
    /// [`CompressError::DoesNotFit`] as [`Compressor::compress`] does, and
    /// with [`CompressError::NoDictionary`] where `c` is not supported.
    pub fn compress(&self, c: Compressor, src: &[u8], dst: &mut [u8]) -> Result<usize, CompressError> {
        let capacity = dst.len();
        match c.algorithm {
            Algorithm::Lz4 => self.lz4.compress(src, dst).ok_or(CompressError::DoesNotFit { capacity }),
            Algorithm::Zstd => {
                let cdict = self.cdict(c.level).ok_or(CompressError::NoDictionary(c))?;
                DICT_CCTX.with_borrow_mut(|cctx| {
                    let cctx = cctx.get_or_insert_with(zstd_safe::CCtx::create);
                    cctx.compress_using_cdict(dst, src, cdict).map_err(|code| {
                        if code == zstd_dst_too_small() {
                            CompressError::DoesNotFit { capacity }
                        } else {
                            CompressError::Compress { alg: Algorithm::Zstd, msg: zstd_safe::get_error_name(code).to_string() }
                        }
                    })
                })
            }
            Algorithm::Lzo => Err(CompressError::NoDictionary(c)),
        }
    }

    /// Decompress `src`, written by `alg` with this dictionary, into `dst`,
    /// which must come out exactly full.
    pub fn decompress(&self, alg: Algorithm, src: &[u8], dst: &mut [u8]) -> Result<(), CompressError> {
        let expected = dst.len();
        let got = match alg {
            Algorithm::Lz4 => self
                .lz4
                .decompress(src, dst)
                .ok_or_else(|| CompressError::Corrupt { alg, msg: format!("malformed block for dictionary {}, or more than {expected} bytes", self.id) })?,
            Algorithm::Zstd => DICT_DCTX.with_borrow_mut(|dctx| {
                let dctx = dctx.get_or_insert_with(zstd_safe::DCtx::create);
                dctx.decompress_using_ddict(dst, src, &self.ddict)
                    .map_err(|code| CompressError::Corrupt { alg, msg: format!("{} (with dictionary {})", zstd_safe::get_error_name(code), self.id) })
            })?,
            Algorithm::Lzo => return Err(CompressError::NoDictionary(Compressor::new(alg))),
        };
        if got != expected {
            return Err(CompressError::WrongLength { alg, got, expected });
        }
        Ok(())
    }
}

/// zstd's error code for "destination buffer is too small".
fn zstd_dst_too_small() -> usize {
    // ZSTD_error_dstSize_tooSmall = 70; codes are returned as (size_t)-code.
    0usize.wrapping_sub(70)
}

thread_local! {
    static DICT_CCTX: RefCell<Option<zstd_safe::CCtx<'static>>> = const { RefCell::new(None) };
    static DICT_DCTX: RefCell<Option<zstd_safe::DCtx<'static>>> = const { RefCell::new(None) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of text-like records that share field names and vary in
    /// numbers: what a dictionary is made for.
    pub(crate) fn records(n: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut r = zmem_testkit::XorShift::from_state(seed | 1);
        (0..n)
            .map(|_| {
                let mut p = Vec::with_capacity(4096);
                while p.len() < 4096 {
                    let x = r.next_u64();
                    let line = format!("{{\"user_id\":{},\"session\":\"{:x}\",\"status\":\"active\",\"region\":\"eu-west-{}\"}}\n", x % 100000, x >> 20, x % 7);
                    p.extend_from_slice(line.as_bytes());
                }
                p.truncate(4096);
                p
            })
            .collect()
    }

    pub(crate) fn trained(id: u32, levels: &[i32]) -> Dictionary {
        let pages = records(200, 1);
        let sizes = vec![4096; pages.len()];
        Dictionary::train(id, &pages.concat(), &sizes, 16 << 10, levels).unwrap()
    }

    #[test]
    fn trained_dictionary_roundtrips_and_shrinks() {
        let d = trained(7, &[3]);
        assert_eq!(d.id(), 7);
        assert_eq!(zstd_safe::get_dict_id_from_dict(d.bytes()).map(|i| i.get()), Some(7));
        let pages = records(50, 99);
        for c in [Compressor::new(Algorithm::Lz4), Compressor::zstd(3).unwrap()] {
            let (mut plain, mut with) = (0, 0);
            for p in &pages {
                let mut z = vec![0u8; 8192];
                plain += c.compress(p, &mut z).unwrap();
                let n = d.compress(c, p, &mut z).unwrap();
                with += n;
                let mut out = vec![0u8; 4096];
                d.decompress(c.algorithm, &z[..n], &mut out).unwrap();
                assert_eq!(&out, p, "{c}");
                let mut short = vec![0u8; 4000];
                assert!(d.decompress(c.algorithm, &z[..n], &mut short).is_err());
            }
            assert!(with < plain, "{c}: {with} bytes with the dictionary, {plain} without");
        }
        assert!(d.heap_bytes() > d.bytes().len() as u64);
        assert!(d.supports(Compressor::zstd(3).unwrap()));
        assert!(!d.supports(Compressor::zstd(9).unwrap()));
        assert!(!d.supports(Compressor::new(Algorithm::Lzo)));
        let mut z = vec![0u8; 8192];
        assert_eq!(d.compress(Compressor::zstd(9).unwrap(), &pages[0], &mut z), Err(CompressError::NoDictionary(Compressor::zstd(9).unwrap())));
        let mut small = vec![0u8; 10];
        for c in [Compressor::new(Algorithm::Lz4), Compressor::zstd(3).unwrap()] {
            assert_eq!(d.compress(c, &pages[0], &mut small), Err(CompressError::DoesNotFit { capacity: 10 }), "{c}");
        }
    }

    #[test]
    fn another_dictionary_is_an_error_not_wrong_data() {
        let (a, b) = (trained(1, &[3]), trained(2, &[3]));
        let page = &records(1, 5)[0];
        let mut z = vec![0u8; 8192];
        let n = a.compress(Compressor::zstd(3).unwrap(), page, &mut z).unwrap();
        let mut out = vec![0u8; 4096];
        let e = b.decompress(Algorithm::Zstd, &z[..n], &mut out).unwrap_err();
        assert!(matches!(e, CompressError::Corrupt { alg: Algorithm::Zstd, .. }), "{e}");
        assert!(crate::decompress(Algorithm::Zstd, &z[..n], &mut out).is_err(), "a frame needs its dictionary");
    }

    #[test]
    fn bad_dictionaries_are_refused() {
        let good = trained(3, &[3]).bytes().to_vec();
        for (what, bytes, id) in [
            ("empty", Vec::new(), 1),
            ("no magic", b"just some text that is not a dictionary".to_vec(), 1),
            ("id zero", good.clone(), 0),
            ("tables cut", good[..40].to_vec(), 1),
        ] {
            let e = Dictionary::from_bytes(id, bytes, &[3]).unwrap_err();
            assert!(matches!(e, CompressError::BadDictionary(_)), "{what}: {e}");
        }
        let mut garbled = good.clone();
        for b in &mut garbled[8..200] {
            *b = 0xFF;
        }
        assert!(Dictionary::from_bytes(1, garbled, &[3]).is_err(), "garbled entropy tables");
        let d = Dictionary::from_bytes(9, good, &[3, 9, 3]).unwrap();
        assert_eq!(d.id(), 9);
        assert!(d.supports(Compressor::zstd(9).unwrap()));
    }
}
