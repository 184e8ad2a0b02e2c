//! The C ABI of `zmem-cache` (`include/zmem_cache.h`), so that C and C++
//! programs (a database, a file server) can embed the clean-page cache.
//!
//! The surface is ten functions over an opaque `zmem_cache *`. Each one
//! checks its pointers for null, turns every error into a negative code
//! (the header names them) and runs its body under `catch_unwind`, so no
//! panic ever crosses into C: a bug in zmem is `ZMEM_CACHE_EPANIC` and the
//! call did nothing. This is the only crate of zmem-cache with unsafe code:
//! dereferencing what C hands over, with a `// SAFETY:` note on each block.
//!
//! Ownership: `zmem_cache_new` returns a `Box` turned into a raw pointer;
//! `zmem_cache_free` takes it back. The caller must not use the pointer
//! after freeing it, nor free it while another thread uses it (the cache
//! itself is safe to share between threads).

#![allow(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};

use zmem_cache::{CacheConfig, CacheError, CleanCache, Get, PoolId, PoolOptions, PoolStats, Put, PAGE_SIZE};

pub const EINVAL: i32 = -1;
pub const ENOPOOL: i32 = -2;
pub const EENGINE: i32 = -3;
pub const EPANIC: i32 = -4;

/// The opaque handle C holds.
pub struct ZmemCache(CleanCache);

fn code(e: &CacheError) -> i32 {
    match e {
        CacheError::NoSuchPool(_) => ENOPOOL,
        CacheError::BadPageSize(_) | CacheError::Config(_) => EINVAL,
        CacheError::Engine(_) => EENGINE,
    }
}

/// Run `f` on the cache behind `c`, with no panic escaping.
fn with(c: *const ZmemCache, f: impl FnOnce(&CleanCache) -> Result<i64, CacheError>) -> i64 {
    if c.is_null() {
        return EINVAL as i64;
    }
    // SAFETY: a non-null pointer from zmem_cache_new, not yet freed (the
    // header's contract); the cache is Sync, so a shared reference from any
    // thread is sound.
    let cache = unsafe { &(*c).0 };
    match catch_unwind(AssertUnwindSafe(|| f(cache))) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => code(&e) as i64,
        Err(_) => EPANIC as i64,
    }
}

#[no_mangle]
pub extern "C" fn zmem_cache_new(memlimit: u64, dedup: i32) -> *mut ZmemCache {
    let r = catch_unwind(|| CleanCache::new(CacheConfig { memlimit, dedup: dedup != 0, ..CacheConfig::default() }));
    match r {
        Ok(Ok(c)) => Box::into_raw(Box::new(ZmemCache(c))),
        _ => std::ptr::null_mut(),
    }
}

/// # Safety
/// `c` is null or a pointer from `zmem_cache_new` not freed before, and no
/// other thread is using it.
#[no_mangle]
pub unsafe extern "C" fn zmem_cache_free(c: *mut ZmemCache) {
    if !c.is_null() {
        // SAFETY: by the contract above, we own the box and free it once.
        let b = unsafe { Box::from_raw(c) };
        let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
    }
}

#[no_mangle]
pub extern "C" fn zmem_cache_create_pool(c: *const ZmemCache, memlimit: u64) -> i64 {
    with(c, |cache| {
        let memlimit = (memlimit != 0).then_some(memlimit);
        Ok(cache.create_pool(PoolOptions { memlimit })?.0 as i64)
    })
}

/// A page C hands over: 4096 readable bytes, or None for null.
///
/// # Safety
/// `p` is null or points to at least 4096 readable bytes that nothing
/// writes during the call.
unsafe fn page_in<'a>(p: *const u8) -> Option<&'a [u8]> {
    // SAFETY: as the contract says.
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p, PAGE_SIZE) })
}

/// # Safety
/// `page` points to 4096 readable bytes (see the header).
#[no_mangle]
pub unsafe extern "C" fn zmem_cache_put(c: *const ZmemCache, pool: u32, inode: u64, index: u64, page: *const u8) -> i32 {
    // SAFETY: the caller's contract (4096 readable bytes, or null).
    let Some(page) = (unsafe { page_in(page) }) else { return EINVAL };
    with(c, |cache| Ok((cache.put(PoolId(pool), inode, index, page)? == Put::Stored) as i64)) as i32
}

/// # Safety
/// `buf` points to 4096 writable bytes that nothing else uses during the call.
#[no_mangle]
pub unsafe extern "C" fn zmem_cache_get(c: *const ZmemCache, pool: u32, inode: u64, index: u64, buf: *mut u8) -> i32 {
    if buf.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's contract: 4096 writable bytes, ours for the call.
    let buf = unsafe { std::slice::from_raw_parts_mut(buf, PAGE_SIZE) };
    with(c, |cache| Ok((cache.get(PoolId(pool), inode, index, buf)? == Get::Hit) as i64)) as i32
}

#[no_mangle]
pub extern "C" fn zmem_cache_invalidate_page(c: *const ZmemCache, pool: u32, inode: u64, index: u64) -> i32 {
    with(c, |cache| cache.invalidate_page(PoolId(pool), inode, index).map(|()| 0)) as i32
}

#[no_mangle]
pub extern "C" fn zmem_cache_invalidate_inode(c: *const ZmemCache, pool: u32, inode: u64) -> i32 {
    with(c, |cache| cache.invalidate_inode(PoolId(pool), inode).map(|()| 0)) as i32
}

#[no_mangle]
pub extern "C" fn zmem_cache_invalidate_pool(c: *const ZmemCache, pool: u32) -> i32 {
    with(c, |cache| cache.invalidate_pool(PoolId(pool)).map(|()| 0)) as i32
}

/// # Safety
/// `out` points to a writable `zmem_cache_stats`.
#[no_mangle]
pub unsafe extern "C" fn zmem_cache_pool_stats(c: *const ZmemCache, pool: u32, out: *mut PoolStats) -> i32 {
    if out.is_null() {
        return EINVAL;
    }
    with(c, |cache| {
        let v = cache.stats(PoolId(pool))?;
        // SAFETY: the caller's contract: a writable, aligned zmem_cache_stats,
        // whose layout PoolStats has (repr(C), the same u64 fields in order).
        unsafe { out.write(v) };
        Ok(0)
    }) as i32
}

#[cfg(test)]
mod tests {
    /// `zmem_cache_stats` in the header is twelve uint64_t.
    #[test]
    fn stats_layout_matches_the_header() {
        assert_eq!(std::mem::size_of::<super::PoolStats>(), 12 * 8);
        assert_eq!(std::mem::align_of::<super::PoolStats>(), 8);
    }
}
