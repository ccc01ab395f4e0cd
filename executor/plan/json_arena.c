/* SPDX-License-Identifier: MIT */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json_arena.h"

static _Thread_local struct mscx_json_arena *arena_current;
static pthread_once_t arena_once = PTHREAD_ONCE_INIT;

static int arena_owns(const struct mscx_json_arena *a, const void *p)
{
    for (unsigned i = a->nchunks; i-- > 0;)
        if ((const char *)p >= a->chunk[i] && (const char *)p < a->chunk[i] + a->size[i])
            return 1;
    return 0;
}

static void *arena_malloc(size_t n)
{
    struct mscx_json_arena *a = arena_current;
    if (a == NULL)
        return malloc(n);
    n = (n + 15) & ~(size_t)15;
    if (a->nchunks == 0 || a->used + n > a->size[a->nchunks - 1]) {
        if (a->nchunks == MSCX_JSON_ARENA_MAX_CHUNKS)
            return malloc(n); /* freed by arena_free's fallback path */
        /* chunks double, so a few cover any plan and ownership checks stay short */
        size_t sz = a->nchunks ? a->size[a->nchunks - 1] * 2 : (size_t)256 << 10;
        while (sz < n)
            sz *= 2;
        char *c = malloc(sz);
        if (c == NULL)
            return NULL;
        a->chunk[a->nchunks] = c;
        a->size[a->nchunks] = sz;
        a->nchunks++;
        a->used = 0;
    }
    void *p = a->chunk[a->nchunks - 1] + a->used;
    a->used += n;
    return p;
}

static void arena_free(void *p)
{
    struct mscx_json_arena *a = arena_current;
    if (p == NULL)
        return;
    for (; a != NULL; a = a->prev)
        if (arena_owns(a, p))
            return; /* released with the arena */
    free(p);
}

static void arena_install(void)
{
    json_malloc_t m;
    json_free_t f;
    json_get_alloc_funcs(&m, &f);
    if (m == malloc && f == free)
        json_set_alloc_funcs(arena_malloc, arena_free);
}

void mscx_json_arena_begin(struct mscx_json_arena *a)
{
    pthread_once(&arena_once, arena_install);
    memset(a, 0, sizeof(*a));
    a->prev = arena_current;
    arena_current = a;
}

void mscx_json_arena_end(struct mscx_json_arena *a)
{
    arena_current = a->prev;
    for (unsigned i = 0; i < a->nchunks; i++)
        free(a->chunk[i]);
    a->nchunks = 0;
}
