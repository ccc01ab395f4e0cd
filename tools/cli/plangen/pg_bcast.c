/* SPDX-License-Identifier: MIT */
/*
 * Broadcast from root R (out of place: input and output one chunk each; on
 * every rank but the root the input is never touched). In oneshot and hier2
 * LL packets carry the data with the launch flag, so packet polling is the
 * only synchronisation; direct is a Simple plan with signals.
 *
 * oneshot (one node): the root's per-peer groups (T blocks for each peer)
 * ppkt the input straight into every peer's scratch slot 0, and all root
 * blocks copy the input to the output; each peer unpacks slot 0 into its
 * output over all its blocks. Every rank declares the same scratch (the
 * halves of a double-buffered scratch sit at the same offset everywhere).
 *
 * direct (one node, Simple, no scratch): the root's per-peer groups put the
 * input straight into every peer's output over the memory channel. The
 * group's first block and the peer's one block first exchange a signal (the
 * peer has entered this launch, so nothing before it still uses its
 * output); the group meets at its barrier (id q), puts, meets again, and the
 * first block signals that the data is there, which the peer waits for. All
 * root blocks copy the input to the output.
 *
 * hier2 (two or more nodes, P ranks per node, M nodes): the root's block 0
 * packs its input into its scratch slot 0 and ships it over the port
 * channel to its counterpart (same local index) on every other node; its
 * other blocks ppkt the input to the local peers and copy it to the output.
 * A counterpart forwards the packets that arrive in its slot 0 to its own
 * node's peers (rppkt, one group of T blocks per peer) and unpacks them;
 * every other rank unpacks slot 0.
 *
 * Notation as in pg_algo.c: rank r = n * P + l, T = thread blocks per peer
 * group, G = T(P-1).
 */
#include <stdio.h>
#include <string.h>
#include "plangen.h"

static json_t *bc_arr1(json_t *a)
{
    json_t *arr = json_array();
    json_array_append_new(arr, a);
    return arr;
}

static struct pg_tbg bc_tbg(uint32_t id, uint32_t size)
{
    return (struct pg_tbg){.id = id, .size = size};
}

/* The q-th rank of node @p n other than local index @p l. */
static uint32_t bc_local_peer(uint32_t n, uint32_t P, uint32_t l, uint32_t q)
{
    return n * P + (q < l ? q : q + 1);
}

/* Blocks [b0, b0 + G) of rank r: unpack scratch slot 0 into the output, sliced over the G blocks. */
static void bc_unpack(struct pg_plan *p, uint32_t r, uint32_t b0, uint32_t G)
{
    for (uint32_t b = 0; b < G; b++)
        pg_op(p, r, b0 + b, "upkt", bc_arr1(pg_loc('s', 0, 1)), bc_arr1(pg_loc('o', 0, 1)), NULL, NULL, false,
              bc_tbg(b, G));
}

/*
 * Blocks [b0, b0 + G) of rank r send to its node's P-1 peers, T blocks per
 * peer: @p op is "ppkt" (from the input) or "rppkt" (the packets in scratch
 * slot 0); every block then writes its slice of the output: a copy of the
 * input (@p op "ppkt") or an unpack of slot 0.
 */
static void bc_fan_out(struct pg_plan *p, uint32_t r, uint32_t P, uint32_t T, uint32_t b0, const char *op)
{
    uint32_t n = r / P, l = r % P, G = T * (P - 1);
    bool from_input = op[0] == 'p';
    for (uint32_t q = 0; q < P - 1; q++) {
        for (uint32_t t = 0; t < T; t++) {
            uint32_t b = b0 + q * T + t, peer = bc_local_peer(n, P, l, q);
            json_t *src = from_input ? pg_loc('i', 0, 1) : pg_loc('s', 0, 1);
            pg_op(p, r, b, op, bc_arr1(src), bc_arr1(pg_rem(p, r, b, PG_CH_MEMORY, peer, 's', 0, 1)),
                  "memory", NULL, false, bc_tbg(t, T));
        }
    }
    for (uint32_t b = 0; b < G; b++) {
        if (from_input)
            pg_op(p, r, b0 + b, "copy", bc_arr1(pg_loc('i', 0, 1)), bc_arr1(pg_loc('o', 0, 1)), NULL, NULL,
                  false, bc_tbg(b, G));
        else
            pg_op(p, r, b0 + b, "upkt", bc_arr1(pg_loc('s', 0, 1)), bc_arr1(pg_loc('o', 0, 1)), NULL, NULL,
                  false, bc_tbg(b, G));
    }
}

static int bc_oneshot(struct pg_plan *p, uint32_t N, uint32_t T, uint32_t R)
{
    uint32_t G = T * (N - 1);
    pg_plan_chunks(p, 1, 1, 1);
    for (uint32_t r = 0; r < N; r++) {
        if (pg_hier_rank(p, r, N, 1, G) < 0)
            return -1;
        if (r == R)
            bc_fan_out(p, r, N, T, 0, "ppkt");
        else
            bc_unpack(p, r, 0, G);
    }
    return 0;
}

/* A signal or wait of block @p b of rank @p r on its memory channel to @p peer. */
static void bc_sync(struct pg_plan *p, uint32_t r, uint32_t b, const char *name, uint32_t peer)
{
    json_t *ch = json_array();
    json_array_append_new(ch, json_integer(pg_tb_chan(p, r, b, PG_CH_MEMORY, peer)));
    pg_op(p, r, b, name, NULL, NULL, "memory", ch, false, bc_tbg(0, 1));
}

static int bc_direct(struct pg_plan *p, uint32_t N, uint32_t T, uint32_t R)
{
    uint32_t G = T * (N - 1);
    pg_plan_chunks(p, 1, 1, 0);
    for (uint32_t r = 0; r < N; r++) {
        if (pg_hier_rank(p, r, N, 1, r == R ? G : 1) < 0)
            return -1;
        if (r != R) {
            bc_sync(p, r, 0, "signal", R);
            bc_sync(p, r, 0, "wait", R);
            bc_sync(p, r, 0, "wait", R);
            continue;
        }
        for (uint32_t q = 0; q < N - 1; q++) {
            for (uint32_t t = 0; t < T; t++) {
                uint32_t b = q * T + t, peer = bc_local_peer(0, N, R, q);
                if (t == 0) {
                    bc_sync(p, r, b, "signal", peer);
                    bc_sync(p, r, b, "wait", peer);
                }
                if (T > 1)
                    pg_barrier(p, r, b, q, T);
                pg_op(p, r, b, "copy", bc_arr1(pg_loc('i', 0, 1)), bc_arr1(pg_loc('o', 0, 1)), NULL, NULL,
                      false, bc_tbg(b, G));
                pg_op(p, r, b, "put", bc_arr1(pg_loc('i', 0, 1)),
                      bc_arr1(pg_rem(p, r, b, PG_CH_MEMORY, peer, 'o', 0, 1)), "memory", NULL, false,
                      bc_tbg(t, T));
                if (T > 1)
                    pg_barrier(p, r, b, q, T);
                if (t == 0)
                    bc_sync(p, r, b, "signal", peer);
            }
        }
    }
    return 0;
}

/* Block 0 of the root: pack the input into slot 0, sync its threads, ship slot 0 to every counterpart. */
static void bc_port_block(struct pg_plan *p, uint32_t R, uint32_t P, uint32_t M)
{
    uint32_t n = R / P, l = R % P;
    pg_op(p, R, 0, "cpkt", bc_arr1(pg_loc('i', 0, 1)), bc_arr1(pg_loc('s', 0, 1)), NULL, NULL, false,
          bc_tbg(0, 1));
    pg_op(p, R, 0, "nop", NULL, NULL, NULL, NULL, false, bc_tbg(0, 1));
    for (uint32_t m = 0; m < M; m++) {
        if (m == n)
            continue;
        uint32_t partner = m * P + l;
        json_t *ch = json_array();
        json_array_append_new(ch, json_integer(pg_tb_chan(p, R, 0, PG_CH_PORT, partner)));
        pg_op(p, R, 0, "ppkt", bc_arr1(pg_loc('s', 0, 1)),
              bc_arr1(pg_rem(p, R, 0, PG_CH_PORT, partner, 's', 0, 1)), "port", ch, false, bc_tbg(0, 1));
    }
}

static int bc_hier(struct pg_plan *p, uint32_t N, uint32_t P, uint32_t T, uint32_t R)
{
    uint32_t M = N / P, G = T * (P - 1);
    pg_plan_chunks(p, 1, 1, 1);
    for (uint32_t r = 0; r < N; r++) {
        if (pg_hier_rank(p, r, P, M, r == R ? 1 + G : G) < 0)
            return -1;
        if (r == R) {
            bc_port_block(p, r, P, M);
            bc_fan_out(p, r, P, T, 1, "ppkt");
        } else if (r % P == R % P) {
            bc_fan_out(p, r, P, T, 0, "rppkt");
        } else {
            bc_unpack(p, r, 0, G);
        }
    }
    return 0;
}

int pg_bcast(const struct pg_params *par, struct pg_plan *p, bool hier)
{
    uint32_t N = par->nranks, P = par->rpn, T = par->tbs_per_peer;
    if (par->root >= N) {
        fprintf(stderr, "mscx-plangen: --root %u is not a rank of the %u ranks\n", par->root, N);
        return -1;
    }
    if (hier)
        return bc_hier(p, N, P, T, par->root);
    if (strcmp(par->algo, "direct") == 0)
        return bc_direct(p, N, T, par->root);
    return bc_oneshot(p, N, T, par->root);
}
