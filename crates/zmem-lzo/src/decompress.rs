//! Bounds-checked LZO1X decompressor (safe Rust).
//!
//! Every read of the input and every write of the output is checked, so any
//! byte string yields either `Ok(n)` or an error; nothing panics and nothing
//! is accessed out of bounds. Fast paths copy fixed-size chunks whenever both
//! buffers have enough slack, which lets the compiler turn them into plain
//! loads and stores.

use crate::LzoError;

#[inline(always)]
fn next_byte(src: &[u8], ip: &mut usize) -> Result<usize, LzoError> {
    match src.get(*ip) {
        Some(&b) => {
            *ip += 1;
            Ok(b as usize)
        }
        None => Err(LzoError::InputOverrun),
    }
}

/// Reads the rest of an extended count: zero bytes each add 255, the first
/// non-zero byte ends it. Returns `base + 255 * zeros + last` (checked, so
/// hostile input cannot overflow the length even on 32-bit targets).
#[cold]
fn ext_len(src: &[u8], ip: &mut usize, base: usize) -> Result<usize, LzoError> {
    let rest = src.get(*ip..).ok_or(LzoError::InputOverrun)?;
    let zeros = rest.iter().position(|&b| b != 0).ok_or(LzoError::InputOverrun)?;
    let last = rest[zeros] as usize;
    *ip += zeros + 1;
    zeros.checked_mul(255).and_then(|z| z.checked_add(base + last)).ok_or(LzoError::Corrupt)
}

#[inline(always)]
fn read_le16(src: &[u8], ip: &mut usize) -> Result<usize, LzoError> {
    let i = *ip;
    if src.len() - i < 2 {
        return Err(LzoError::InputOverrun);
    }
    *ip = i + 2;
    Ok(src[i] as usize | (src[i + 1] as usize) << 8)
}

/// Copies `n` literal bytes from `src[*ip..]` to `dst[*op..]`.
#[inline(always)]
fn copy_literals(src: &[u8], ip: &mut usize, dst: &mut [u8], op: &mut usize, n: usize) -> Result<(), LzoError> {
    let (i, o) = (*ip, *op);
    if dst.len() - o < n {
        return Err(LzoError::OutputOverrun);
    }
    if src.len() - i < n {
        return Err(LzoError::InputOverrun);
    }
    if src.len() - i - n >= 16 && dst.len() - o - n >= 16 {
        // Slack on both sides: copy in 16-byte chunks, possibly a little past
        // the end of the run (the surplus is overwritten later).
        let mut k = 0;
        loop {
            let chunk: [u8; 16] = src[i + k..i + k + 16].try_into().unwrap();
            dst[o + k..o + k + 16].copy_from_slice(&chunk);
            k += 16;
            if k >= n {
                break;
            }
        }
    } else {
        dst[o..o + n].copy_from_slice(&src[i..i + n]);
    }
    *ip = i + n;
    *op = o + n;
    Ok(())
}

/// Copies the 0..=3 trailing literals of a match.
#[inline(always)]
fn copy_few(src: &[u8], ip: &mut usize, dst: &mut [u8], op: &mut usize, n: usize) -> Result<(), LzoError> {
    let (i, o) = (*ip, *op);
    if src.len() - i >= 4 && dst.len() - o >= 4 {
        // n <= 3, so both ranges are in bounds; the 4th byte is scratch.
        let chunk: [u8; 4] = src[i..i + 4].try_into().unwrap();
        dst[o..o + 4].copy_from_slice(&chunk);
        *ip = i + n;
        *op = o + n;
        Ok(())
    } else {
        copy_literals(src, ip, dst, op, n)
    }
}

/// Copies a match of `len` bytes from `dist` bytes back in `dst`.
#[inline(always)]
fn copy_match(dst: &mut [u8], op: &mut usize, dist: usize, len: usize) -> Result<(), LzoError> {
    let o = *op;
    if dist > o {
        return Err(LzoError::LookbehindOverrun);
    }
    if dst.len() - o < len {
        return Err(LzoError::OutputOverrun);
    }
    let m = o - dist;
    if dist >= 16 && dst.len() - o - len >= 16 {
        // Chunks never read bytes written by the same chunk (dist >= 16).
        let mut k = 0;
        loop {
            let chunk: [u8; 16] = dst[m + k..m + k + 16].try_into().unwrap();
            dst[o + k..o + k + 16].copy_from_slice(&chunk);
            k += 16;
            if k >= len {
                break;
            }
        }
    } else if dist >= 8 && dst.len() - o - len >= 8 {
        let mut k = 0;
        loop {
            let chunk: [u8; 8] = dst[m + k..m + k + 8].try_into().unwrap();
            dst[o + k..o + k + 8].copy_from_slice(&chunk);
            k += 8;
            if k >= len {
                break;
            }
        }
    } else if dist == 1 {
        let b = dst[m];
        dst[o..o + len].fill(b);
    } else if dist >= len {
        dst.copy_within(m..m + len, o);
    } else {
        // Overlapping copy: byte by byte repeats the pattern.
        for k in 0..len {
            dst[o + k] = dst[m + k];
        }
    }
    *op = o + len;
    Ok(())
}

/// Decompresses the LZO1X stream `src` into `dst`.
///
/// Returns the number of bytes written to `dst`. Any input is accepted
/// without panicking; malformed or truncated input yields an error:
/// [`LzoError::InputOverrun`] if the stream ends early,
/// [`LzoError::OutputOverrun`] if `dst` is too small,
/// [`LzoError::LookbehindOverrun`] for a match reaching before the start of
/// the output, [`LzoError::InputNotConsumed`] if bytes follow the end marker.
/// Bytes of `dst` past the returned length may have been overwritten.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<usize, LzoError> {
    let mut ip = 0usize;
    let mut op = 0usize;
    // Literals copied by the previous instruction: 0, 1..=3, or 4 (= a run).
    let mut state: usize = 0;

    match src.first() {
        None => return Err(LzoError::InputOverrun),
        Some(&b) if b > 17 => {
            ip = 1;
            let n = b as usize - 17;
            copy_literals(src, &mut ip, dst, &mut op, n)?;
            state = n.min(4);
        }
        Some(_) => {}
    }

    loop {
        let t = next_byte(src, &mut ip)?;
        let (dist, len);
        if t >= 64 {
            // M2: 3..=8 bytes, distance 1..=2048.
            let hi = next_byte(src, &mut ip)?;
            dist = 1 + ((t >> 2) & 7) + (hi << 3);
            len = (t >> 5) + 1;
            copy_match(dst, &mut op, dist, len)?;
            state = t & 3;
        } else if t >= 32 {
            // M3: distance 1..=16384.
            len = if t & 31 == 0 { ext_len(src, &mut ip, 33)? } else { 2 + (t & 31) };
            let w = read_le16(src, &mut ip)?;
            dist = 1 + (w >> 2);
            copy_match(dst, &mut op, dist, len)?;
            state = w & 3;
        } else if t >= 16 {
            // M4: distance 16385..=49151, or the end-of-stream marker.
            len = if t & 7 == 0 { ext_len(src, &mut ip, 9)? } else { 2 + (t & 7) };
            let w = read_le16(src, &mut ip)?;
            let d = ((t & 8) << 11) + (w >> 2);
            if d == 0 {
                return if ip == src.len() { Ok(op) } else { Err(LzoError::InputNotConsumed) };
            }
            dist = d + 0x4000;
            copy_match(dst, &mut op, dist, len)?;
            state = w & 3;
        } else if state == 0 {
            // Literal run of 4.. bytes; no trailing-literal bits follow it.
            let n = if t == 0 { ext_len(src, &mut ip, 18)? } else { 3 + t };
            copy_literals(src, &mut ip, dst, &mut op, n)?;
            state = 4;
            continue;
        } else {
            let hi = next_byte(src, &mut ip)?;
            if state < 4 {
                // M1: 2 bytes, distance 1..=1024.
                dist = 1 + (t >> 2) + (hi << 2);
                len = 2;
            } else {
                // After a literal run: 3 bytes, distance 2049..=3072.
                dist = 0x801 + (t >> 2) + (hi << 2);
                len = 3;
            }
            copy_match(dst, &mut op, dist, len)?;
            state = t & 3;
        }
        if state != 0 {
            copy_few(src, &mut ip, dst, &mut op, state)?;
        }
    }
}
