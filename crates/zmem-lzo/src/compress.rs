//! One-pass LZO1X-1 style compressor (safe Rust).

use crate::LzoError;

/// Largest hash table: 2^14 entries of 16-bit positions (32 KiB on the stack).
const MAX_HASH_BITS: u32 = 14;
/// Positions are stored relative to a window base; a window never exceeds
/// this many positions, so every candidate distance is <= `WINDOW - 1`, which
/// is within the format's M4 limit of 49151 (0xbfff).
const WINDOW: usize = 0xC000;
/// No match search starts within this many bytes of the end of the input
/// (4 bytes are read at each searched position; the rest are cheap literals).
const TAIL: usize = 8;

const M2_MAX_LEN: usize = 8;
const M2_MAX_DIST: usize = 0x800;
const M3_MAX_LEN: usize = 33;
const M3_MAX_DIST: usize = 0x4000;
const M4_MAX_LEN: usize = 9;

#[inline(always)]
fn read_u32(s: &[u8], i: usize) -> u32 {
    let b: [u8; 4] = s[i..i + 4].try_into().unwrap();
    u32::from_le_bytes(b)
}

#[inline(always)]
fn read_u64(s: &[u8], i: usize) -> u64 {
    let b: [u8; 8] = s[i..i + 8].try_into().unwrap();
    u64::from_le_bytes(b)
}

#[inline(always)]
fn hash(v: u32, bits: u32) -> usize {
    (v.wrapping_mul(0x9E37_79B1) >> (32 - bits)) as usize
}

/// Length of the common prefix of `s[a..]` and `s[b..]` (`a < b`).
#[inline(always)]
fn common_len(s: &[u8], mut a: usize, mut b: usize) -> usize {
    let start = b;
    let end = s.len();
    while b + 8 <= end {
        let x = read_u64(s, a) ^ read_u64(s, b);
        if x != 0 {
            return b - start + (x.trailing_zeros() / 8) as usize;
        }
        a += 8;
        b += 8;
    }
    while b < end && s[a] == s[b] {
        a += 1;
        b += 1;
    }
    b - start
}

/// Number of bytes needed for an extended count `rem` (>= 1): `rem / 255`
/// zero bytes (roughly) plus one final non-zero byte.
#[inline(always)]
fn ext_bytes(rem: usize) -> usize {
    (rem - 1) / 255 + 1
}

#[inline(always)]
fn put_ext(dst: &mut [u8], op: &mut usize, mut rem: usize) {
    while rem > 255 {
        dst[*op] = 0;
        *op += 1;
        rem -= 255;
    }
    dst[*op] = rem as u8;
    *op += 1;
}

/// Emits the literal run `src[from..to]` (possibly empty).
#[inline(always)]
fn emit_literals(dst: &mut [u8], op: &mut usize, src: &[u8], from: usize, to: usize) -> Result<(), LzoError> {
    let n = to - from;
    if n == 0 {
        return Ok(());
    }
    let o = *op;
    let header = if o == 0 && n <= 238 {
        1
    } else if n <= 3 {
        0
    } else if n <= 18 {
        1
    } else {
        1 + ext_bytes(n - 18)
    };
    if dst.len() - o < header + n {
        return Err(LzoError::OutputOverrun);
    }
    if o == 0 && n <= 238 {
        dst[0] = (17 + n) as u8;
        *op = 1;
    } else if n <= 3 {
        // Stored in the two low bits of the previous match's state byte.
        dst[o - 2] |= n as u8;
    } else if n <= 18 {
        dst[o] = (n - 3) as u8;
        *op += 1;
    } else {
        dst[o] = 0;
        *op += 1;
        put_ext(dst, op, n - 18);
    }
    let o = *op;
    if n <= 16 && src.len() - from >= 16 && dst.len() - o >= 16 {
        // Short run: copy a fixed 16 bytes when both sides have room; the
        // surplus is overwritten by later output.
        dst[o..o + 16].copy_from_slice(&src[from..from + 16]);
    } else {
        dst[o..o + n].copy_from_slice(&src[from..to]);
    }
    *op = o + n;
    Ok(())
}

/// Emits a match of `len >= 3` bytes at distance `1..=0xbfff`
/// (distances above 0x4000 require `len >= 3` and are M4).
#[inline(always)]
fn emit_match(dst: &mut [u8], op: &mut usize, dist: usize, len: usize) -> Result<(), LzoError> {
    let o = *op;
    if len <= M2_MAX_LEN && dist <= M2_MAX_DIST {
        if dst.len() - o < 2 {
            return Err(LzoError::OutputOverrun);
        }
        let d = dist - 1;
        dst[o] = (((len - 1) << 5) | ((d & 7) << 2)) as u8;
        dst[o + 1] = (d >> 3) as u8;
        *op = o + 2;
        return Ok(());
    }
    let (d, marker, max_short) = if dist <= M3_MAX_DIST {
        (dist - 1, 32usize, M3_MAX_LEN)
    } else {
        let d = dist - M3_MAX_DIST;
        (d, 16 | ((d >> 11) & 8), M4_MAX_LEN)
    };
    let need = if len <= max_short { 3 } else { 3 + ext_bytes(len - max_short) };
    if dst.len() - o < need {
        return Err(LzoError::OutputOverrun);
    }
    if len <= max_short {
        dst[o] = (marker | (len - 2)) as u8;
        *op = o + 1;
    } else {
        dst[o] = marker as u8;
        *op = o + 1;
        put_ext(dst, op, len - max_short);
    }
    let o = *op;
    dst[o] = ((d & 0x3f) << 2) as u8;
    dst[o + 1] = ((d >> 6) & 0xff) as u8;
    *op = o + 2;
    Ok(())
}

/// Compresses `src` into `dst` as an LZO1X stream (LZO1X-1 strategy).
///
/// Returns the number of bytes written. Fails with
/// [`LzoError::OutputOverrun`] if `dst` is too small; a `dst` of
/// [`compress_bound(src.len())`](crate::compress_bound) bytes always suffices.
/// Never panics and never writes outside `dst`; bytes of `dst` past the
/// returned length may have been overwritten.
pub fn compress(src: &[u8], dst: &mut [u8]) -> Result<usize, LzoError> {
    // Hash table size: about one entry per input byte (within a window),
    // between 2^10 and 2^14 entries; smaller tables are cheaper to clear.
    match src.len() {
        0..=1024 => compress_with::<{ 1 << 10 }>(src, dst),
        1025..=4096 => compress_with::<{ 1 << 12 }>(src, dst),
        4097..=8192 => compress_with::<{ 1 << 13 }>(src, dst),
        _ => compress_with::<{ 1 << MAX_HASH_BITS }>(src, dst),
    }
}

fn compress_with<const N: usize>(src: &[u8], dst: &mut [u8]) -> Result<usize, LzoError> {
    let bits = N.trailing_zeros();
    let len = src.len();
    let mut op = 0usize;
    let mut ii = 0usize; // start of pending literals

    if len > TAIL + 4 {
        let limit = len - TAIL;
        let mut table = [0u16; N];
        let mut ip = 0usize;
        let mut first_window = true;
        while ip < limit {
            let base = ip;
            let wend = limit.min(base + WINDOW);
            if !first_window {
                table.fill(0);
            }
            first_window = false;
            // Position `base` itself has offset 0, the value every slot holds.
            ip += 1;
            while ip < wend {
                let v = read_u32(src, ip);
                let h = hash(v, bits);
                let cand = base + table[h] as usize;
                table[h] = (ip - base) as u16;
                if cand >= ip || read_u32(src, cand) != v {
                    ip += 1 + ((ip - ii) >> 5);
                    continue;
                }
                let mut start = ip;
                let mut c = cand;
                // Extend backwards into pending literals (keeps >= 1 literal
                // at the very start so the first byte is a literal header).
                while start > ii && c > 0 && src[start - 1] == src[c - 1] {
                    start -= 1;
                    c -= 1;
                }
                let mlen = (ip - start) + 4 + common_len(src, cand + 4, ip + 4);
                emit_literals(dst, &mut op, src, ii, start)?;
                emit_match(dst, &mut op, start - c, mlen)?;
                ip = start + mlen;
                ii = ip;
            }
        }
    }

    emit_literals(dst, &mut op, src, ii, len)?;
    if dst.len() - op < 3 {
        return Err(LzoError::OutputOverrun);
    }
    dst[op] = 0x11;
    dst[op + 1] = 0;
    dst[op + 2] = 0;
    Ok(op + 3)
}
