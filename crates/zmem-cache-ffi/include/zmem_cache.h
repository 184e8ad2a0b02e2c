/* zmem_cache.h: the C ABI of zmem-cache, a compressed second-chance cache
 * for clean pages (zcache's role). Link with -lzmemcache.
 *
 * A page is 4096 bytes, named by (pool, inode, index). The cache may drop
 * any page at any time: a get is a hit with the bytes last put, or a miss;
 * never older bytes after an invalidate or a newer put.
 *
 * Return values: >= 0 is success (see each function); negative is an
 * error: */
#ifndef ZMEM_CACHE_H
#define ZMEM_CACHE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZMEM_CACHE_PAGE_SIZE 4096
#define ZMEM_CACHE_EINVAL (-1)  /* a null pointer or a bad setting */
#define ZMEM_CACHE_ENOPOOL (-2) /* no such pool */
#define ZMEM_CACHE_EENGINE (-3) /* the engine failed (see the log) */
#define ZMEM_CACHE_EPANIC (-4)  /* a bug in zmem: the call did nothing */

typedef struct zmem_cache zmem_cache;

typedef struct zmem_cache_stats {
    uint64_t hits, misses, puts, refused_puts, evictions, invalidations;
    uint64_t pages, orig_bytes, compr_bytes, mem_used_bytes, cap_bytes, inodes;
} zmem_cache_stats;

/* A cache whose pools together hold at most memlimit bytes (>= 1 MiB),
 * sharing pages between equal ones if dedup. NULL on a bad setting. */
zmem_cache *zmem_cache_new(uint64_t memlimit, int dedup);
/* Free the cache and every page in it. NULL is ignored. */
void zmem_cache_free(zmem_cache *cache);

/* A new pool with its own limit (0: only the global one): its id (>= 0). */
int64_t zmem_cache_create_pool(zmem_cache *cache, uint64_t memlimit);
/* Keep a page: 1 stored, 0 refused (compresses too poorly, or no room). */
int zmem_cache_put(zmem_cache *cache, uint32_t pool, uint64_t inode, uint64_t index, const uint8_t *page);
/* Copy a page into buf: 1 hit, 0 miss (buf is then unspecified). */
int zmem_cache_get(zmem_cache *cache, uint32_t pool, uint64_t inode, uint64_t index, uint8_t *buf);
/* Forget a page, all pages of an inode, or a whole pool: 0. */
int zmem_cache_invalidate_page(zmem_cache *cache, uint32_t pool, uint64_t inode, uint64_t index);
int zmem_cache_invalidate_inode(zmem_cache *cache, uint32_t pool, uint64_t inode);
int zmem_cache_invalidate_pool(zmem_cache *cache, uint32_t pool);
/* A pool's counters into *out: 0. */
int zmem_cache_pool_stats(zmem_cache *cache, uint32_t pool, zmem_cache_stats *out);

#ifdef __cplusplus
}
#endif

#endif
