/* SPDX-License-Identifier: MIT */
/*
 * AlltoAll (out of place: input and output N chunks each; input chunk j goes
 * to rank j, output chunk q came from rank q). The one-rank plan is the copy
 * of pg_algo.c.
 *
 * oneshot (one node, LL packets): per-peer groups (T blocks for each peer)
 * ppkt input chunk p straight into peer p's scratch slot for this rank and
 * unpack p's slot for this rank into output chunk p; all blocks copy input
 * chunk g to output chunk g. Scratch: N-1 slots, by sender.
 *
 * direct (one node, Simple): per-peer groups put input chunk p straight into
 * output chunk g of peer p over the memory channel. The group's first block
 * signals the peer and waits for its signal (the peer has entered this
 * launch, so nothing of the launch before still uses its output); the group
 * meets at its barrier (id q), puts, meets again, and the first block
 * signals that the data is there and waits for the peer's. Only one block per
 * channel signals and waits, so the k-th signal pairs with the k-th wait.
 * All blocks copy input chunk g to output chunk g. No scratch.
 *
 * hier2 (two or more nodes, LL packets): blocks for ranks on the own node go
 * as in oneshot over memory channels. A block for rank (m, x) of another
 * node m travels over the port channel to the counterpart (m, l), which
 * forwards it to (m, x) over its memory channel (rppkt) or, when x = l,
 * unpacks it. Block 0 packs the P blocks for each other node into a staging
 * area, synchronises its threads and ships each node's area in one port
 * transfer; the per-peer groups (T blocks for each local peer) send, forward
 * and unpack. Scratch (3N slots): [0, N) receive by source rank; [N, 2N)
 * staging by destination rank; [2N, 3N) relay, 2N + m * P + x holding the
 * block of source (m, l) for destination (n, x).
 *
 * Notation as in pg_algo.c: N ranks, P per node, M = N / P nodes, rank
 * r = n * P + l, T = thread blocks per peer group, G = T(P-1).
 */
#include <stdio.h>
#include <string.h>
#include "plangen.h"

static json_t *a2a_arr1(json_t *a)
{
    json_t *arr = json_array();
    json_array_append_new(arr, a);
    return arr;
}

static struct pg_tbg a2a_tbg(uint32_t id, uint32_t size)
{
    return (struct pg_tbg){.id = id, .size = size};
}

static const struct pg_tbg a2a_whole = {0, 1};

/* Slot that sender @p g occupies in receiver @p p's per-peer region. */
static uint32_t a2a_slot(uint32_t g, uint32_t p)
{
    return g < p ? g : g - 1;
}

/* The q-th local index other than @p l. */
static uint32_t a2a_peer(uint32_t l, uint32_t q)
{
    return q < l ? q : q + 1;
}

/* A signal or wait of block @p b of rank @p g on its memory channel to @p peer. */
static void a2a_sync(struct pg_plan *p, uint32_t g, uint32_t b, const char *name, uint32_t peer)
{
    json_t *ch = json_array();
    json_array_append_new(ch, json_integer(pg_tb_chan(p, g, b, PG_CH_MEMORY, peer)));
    pg_op(p, g, b, name, NULL, NULL, "memory", ch, false, a2a_whole);
}

static void a2a_copy_own(struct pg_plan *p, uint32_t g, uint32_t b, uint32_t G)
{
    pg_op(p, g, b, "copy", a2a_arr1(pg_loc('i', g, 1)), a2a_arr1(pg_loc('o', g, 1)), NULL, NULL, false,
          a2a_tbg(b, G));
}

static int a2a_oneshot(struct pg_plan *p, uint32_t N, uint32_t T)
{
    uint32_t G = T * (N - 1);
    pg_plan_chunks(p, N, N, N - 1);
    for (uint32_t g = 0; g < N; g++) {
        if (pg_hier_rank(p, g, N, 1, G) < 0)
            return -1;
        for (uint32_t q = 0; q < N - 1; q++) {
            for (uint32_t t = 0; t < T; t++) {
                uint32_t b = q * T + t, peer = a2a_peer(g, q);
                pg_op(p, g, b, "ppkt", a2a_arr1(pg_loc('i', peer, 1)),
                      a2a_arr1(pg_rem(p, g, b, PG_CH_MEMORY, peer, 's', a2a_slot(g, peer), 1)), "memory",
                      NULL, false, a2a_tbg(t, T));
                a2a_copy_own(p, g, b, G);
                pg_op(p, g, b, "upkt", a2a_arr1(pg_loc('s', a2a_slot(peer, g), 1)),
                      a2a_arr1(pg_loc('o', peer, 1)), NULL, NULL, false, a2a_tbg(t, T));
            }
        }
    }
    return 0;
}

static int a2a_direct(struct pg_plan *p, uint32_t N, uint32_t T)
{
    uint32_t G = T * (N - 1);
    pg_plan_chunks(p, N, N, 0);
    for (uint32_t g = 0; g < N; g++) {
        if (pg_hier_rank(p, g, N, 1, G) < 0)
            return -1;
        for (uint32_t q = 0; q < N - 1; q++) {
            for (uint32_t t = 0; t < T; t++) {
                uint32_t b = q * T + t, peer = a2a_peer(g, q);
                if (t == 0) {
                    a2a_sync(p, g, b, "signal", peer);
                    a2a_sync(p, g, b, "wait", peer);
                }
                if (T > 1)
                    pg_barrier(p, g, b, q, T);
                a2a_copy_own(p, g, b, G);
                pg_op(p, g, b, "put", a2a_arr1(pg_loc('i', peer, 1)),
                      a2a_arr1(pg_rem(p, g, b, PG_CH_MEMORY, peer, 'o', g, 1)), "memory", NULL, false,
                      a2a_tbg(t, T));
                if (T > 1)
                    pg_barrier(p, g, b, q, T);
                if (t == 0) {
                    a2a_sync(p, g, b, "signal", peer);
                    a2a_sync(p, g, b, "wait", peer);
                }
            }
        }
    }
    return 0;
}

/* Block 0 of rank r: pack the blocks for every other node, then ship each node's P of them to its
 * counterpart. */
static void a2a_hier_port(struct pg_plan *p, uint32_t r, uint32_t P, uint32_t M)
{
    uint32_t N = P * M, n = r / P, l = r % P;
    for (uint32_t m = 0; m < M; m++)
        if (m != n)
            pg_op(p, r, 0, "cpkt", a2a_arr1(pg_loc('i', m * P, P)), a2a_arr1(pg_loc('s', N + m * P, P)), NULL,
                  NULL, false, a2a_whole);
    pg_op(p, r, 0, "nop", NULL, NULL, NULL, NULL, false, a2a_whole);
    for (uint32_t m = 0; m < M; m++) {
        if (m == n)
            continue;
        uint32_t partner = m * P + l;
        json_t *ch = json_array();
        json_array_append_new(ch, json_integer(pg_tb_chan(p, r, 0, PG_CH_PORT, partner)));
        pg_op(p, r, 0, "ppkt", a2a_arr1(pg_loc('s', N + m * P, P)),
              a2a_arr1(pg_rem(p, r, 0, PG_CH_PORT, partner, 's', 2 * N + n * P, P)), "port", ch, false,
              a2a_whole);
    }
}

/* Per-peer block b = 1 + q * T + t of rank r for local peer index x = a2a_peer(l, q). */
static void a2a_hier_peer(struct pg_plan *p, uint32_t r, uint32_t P, uint32_t M, uint32_t q, uint32_t t,
                          uint32_t T)
{
    uint32_t N = P * M, n = r / P, l = r % P, G = T * (P - 1), gb = q * T + t, b = 1 + gb;
    uint32_t x = a2a_peer(l, q), peer = n * P + x;
    struct pg_tbg part = a2a_tbg(t, T), all = a2a_tbg(gb, G);
    pg_op(p, r, b, "ppkt", a2a_arr1(pg_loc('i', peer, 1)),
          a2a_arr1(pg_rem(p, r, b, PG_CH_MEMORY, peer, 's', r, 1)), "memory", NULL, false, part);
    pg_op(p, r, b, "copy", a2a_arr1(pg_loc('i', r, 1)), a2a_arr1(pg_loc('o', r, 1)), NULL, NULL, false, all);
    for (uint32_t m = 0; m < M; m++) {
        if (m == n)
            continue;
        uint32_t src = m * P + l; /* the source whose block for peer waits in the relay */
        pg_op(p, r, b, "rppkt", a2a_arr1(pg_loc('s', 2 * N + m * P + x, 1)),
              a2a_arr1(pg_rem(p, r, b, PG_CH_MEMORY, peer, 's', src, 1)), "memory", NULL, false, part);
    }
    for (uint32_t m = 0; m < M; m++) {
        uint32_t src = m * P + x; /* from the local peer itself, or forwarded by it */
        pg_op(p, r, b, "upkt", a2a_arr1(pg_loc('s', src, 1)), a2a_arr1(pg_loc('o', src, 1)), NULL, NULL,
              false, part);
    }
    for (uint32_t m = 0; m < M; m++) {
        if (m == n)
            continue;
        uint32_t src = m * P + l; /* the counterpart's block for this rank, in the relay */
        pg_op(p, r, b, "upkt", a2a_arr1(pg_loc('s', 2 * N + m * P + l, 1)), a2a_arr1(pg_loc('o', src, 1)),
              NULL, NULL, false, all);
    }
}

static int a2a_hier(struct pg_plan *p, uint32_t N, uint32_t P, uint32_t T)
{
    uint32_t M = N / P, G = T * (P - 1);
    pg_plan_chunks(p, N, N, 3 * N);
    for (uint32_t r = 0; r < N; r++) {
        if (pg_hier_rank(p, r, P, M, 1 + G) < 0)
            return -1;
        a2a_hier_port(p, r, P, M);
        for (uint32_t q = 0; q < P - 1; q++)
            for (uint32_t t = 0; t < T; t++)
                a2a_hier_peer(p, r, P, M, q, t, T);
    }
    return 0;
}

int pg_alltoall(const struct pg_params *par, struct pg_plan *p, bool hier)
{
    uint32_t N = par->nranks, P = par->rpn, T = par->tbs_per_peer;
    if (par->blocks) {
        fprintf(stderr, "mscx-plangen: alltoall slices per peer (--tbs-per-peer), --blocks does not apply\n");
        return -1;
    }
    if (hier)
        return a2a_hier(p, N, P, T);
    if (strcmp(par->algo, "oneshot") == 0)
        return a2a_oneshot(p, N, T);
    if (strcmp(par->algo, "direct") == 0)
        return a2a_direct(p, N, T);
    fprintf(stderr,
            "mscx-plangen: alltoall runs copy (one rank), oneshot or direct (one node) and hier2 "
            "(several nodes), not %s\n",
            par->algo);
    return -1;
}
