/* SPDX-License-Identifier: MIT */
/*
 * A bump arena for jansson's allocations while one plan is parsed. Parsing a
 * plan makes hundreds of thousands of small nodes that all die together; with
 * malloc, their frees and glibc's consolidation cost as much as the parse.
 */
#ifndef MSCX_JSON_ARENA_H
#define MSCX_JSON_ARENA_H

#include <stddef.h>

#define MSCX_JSON_ARENA_MAX_CHUNKS 32

struct mscx_json_arena {
    char *chunk[MSCX_JSON_ARENA_MAX_CHUNKS];
    size_t size[MSCX_JSON_ARENA_MAX_CHUNKS];
    unsigned nchunks;
    size_t used; /* in the last chunk */
    struct mscx_json_arena *prev;
};

/*
 * Make jansson allocate from @p a on this thread until mscx_json_arena_end().
 * Other threads, and this thread outside the bracket, use malloc and free as
 * before. When some other code installed its own jansson allocator, the arena
 * stays unused and everything still works.
 */
void mscx_json_arena_begin(struct mscx_json_arena *a);

/* Stop using @p a and release its memory. Every JSON value made inside the
 * bracket must have been released (json_decref) before this call. */
void mscx_json_arena_end(struct mscx_json_arena *a);

#endif
