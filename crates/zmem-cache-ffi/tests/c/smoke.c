/* The C ABI from C: what an embedding program does, checked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zmem_cache.h"

#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                     \
        }                                                                 \
    } while (0)

static void fill(uint8_t *p, uint64_t seed) {
    for (int i = 0; i < ZMEM_CACHE_PAGE_SIZE; i++)
        p[i] = "abcdefgh"[(i / 64 + seed) % 8] ^ (uint8_t)(seed * (i % 7 == 0));
}

int main(void) {
    static uint8_t page[ZMEM_CACHE_PAGE_SIZE], buf[ZMEM_CACHE_PAGE_SIZE], want[ZMEM_CACHE_PAGE_SIZE];
    CHECK(zmem_cache_new(1000, 0) == NULL); /* below 1 MiB */
    zmem_cache *c = zmem_cache_new(64 << 20, 0);
    CHECK(c != NULL);
    int64_t pool = zmem_cache_create_pool(c, 0);
    CHECK(pool >= 0);

    for (uint64_t i = 0; i < 100; i++) {
        fill(page, i);
        CHECK(zmem_cache_put(c, (uint32_t)pool, i % 10, i / 10, page) == 1);
    }
    for (uint64_t i = 0; i < 100; i++) {
        fill(want, i);
        CHECK(zmem_cache_get(c, (uint32_t)pool, i % 10, i / 10, buf) == 1);
        CHECK(memcmp(buf, want, sizeof buf) == 0);
    }
    CHECK(zmem_cache_invalidate_inode(c, (uint32_t)pool, 3) == 0);
    CHECK(zmem_cache_get(c, (uint32_t)pool, 3, 0, buf) == 0);
    CHECK(zmem_cache_invalidate_page(c, (uint32_t)pool, 4, 0) == 0);
    CHECK(zmem_cache_get(c, (uint32_t)pool, 4, 0, buf) == 0);
    CHECK(zmem_cache_get(c, (uint32_t)pool, 4, 1, buf) == 1);

    /* A page that does not compress to half a page is refused. */
    unsigned x = 12345;
    for (int i = 0; i < ZMEM_CACHE_PAGE_SIZE; i++) {
        x = x * 1103515245u + 12345u;
        page[i] = (uint8_t)(x >> 16);
    }
    CHECK(zmem_cache_put(c, (uint32_t)pool, 99, 0, page) == 0);

    zmem_cache_stats st;
    CHECK(zmem_cache_pool_stats(c, (uint32_t)pool, &st) == 0);
    CHECK(st.puts == 101 && st.refused_puts == 1 && st.hits == 101 && st.misses == 2);
    CHECK(st.pages == 89);

    /* Errors, not crashes. */
    CHECK(zmem_cache_get(c, 77, 0, 0, buf) == ZMEM_CACHE_ENOPOOL);
    CHECK(zmem_cache_put(c, (uint32_t)pool, 0, 0, NULL) == ZMEM_CACHE_EINVAL);
    CHECK(zmem_cache_get(NULL, 0, 0, 0, buf) == ZMEM_CACHE_EINVAL);
    CHECK(zmem_cache_pool_stats(c, (uint32_t)pool, NULL) == ZMEM_CACHE_EINVAL);
    CHECK(zmem_cache_invalidate_pool(c, (uint32_t)pool) == 0);
    CHECK(zmem_cache_get(c, (uint32_t)pool, 1, 1, buf) == ZMEM_CACHE_ENOPOOL);

    zmem_cache_free(c);
    zmem_cache_free(NULL);
    puts("ok");
    return 0;
}
