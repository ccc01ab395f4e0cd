/* SPDX-License-Identifier: MIT */
/*
 * The collective algorithms of mscx-plangen. All are LL packet algorithms
 * (except the one-rank copies): data travels as packets with the launch flag,
 * so the only synchronisation is packet polling, plus one barrier where a
 * port-channel transfer must wait for packets other blocks produce.
 *
 * Ops are emitted unfused (repkt + cpkt, repkt + ppkt, recpkt + rppkt,
 * separate ppkts); the fusion pass folds them. Every split of a buffer range
 * over several thread blocks uses tbg_info, and an op that reads a range a
 * later op of the same block overwrites uses the same slicing, so in-place
 * reads always precede writes within one block.
 *
 * Notation: N ranks, P ranks per node, M = N / P nodes, rank r = n * P + l,
 * T = thread blocks per peer group.
 */
#include <stdio.h>
#include <string.h>
#include "plangen.h"

#define A_PUSH(a, v) json_array_append_new((a), (v))

static struct pg_tbg pg_tbg(uint32_t id, uint32_t size)
{
    return (struct pg_tbg){.id = id, .size = size};
}

static const struct pg_tbg pg_whole = {0, 1};

/* Slot that sender @p g occupies in receiver @p p's per-peer region. */
static uint32_t pg_slot(uint32_t g, uint32_t p)
{
    return g < p ? g : g - 1;
}

/* The q-th peer of @p g among @p n ranks (skipping g). */
static uint32_t pg_peer(uint32_t g, uint32_t q)
{
    return q < g ? q : q + 1;
}

static json_t *pg_arr1(json_t *a)
{
    json_t *arr = json_array();
    A_PUSH(arr, a);
    return arr;
}

/* Block 0 of rank r ships scratch packets [src, src+1) to @p partner's scratch [dst, dst+1) over the port
 * channel. */
static void pg_port_ppkt(struct pg_plan *p, uint32_t r, uint32_t partner, uint32_t src, uint32_t dst)
{
    json_t *ch = json_array();
    A_PUSH(ch, json_integer(pg_tb_chan(p, r, 0, PG_CH_PORT, partner)));
    pg_op(p, r, 0, "ppkt", pg_arr1(pg_loc('s', src, 1)),
          pg_arr1(pg_rem(p, r, 0, PG_CH_PORT, partner, 's', dst, 1)), "port", ch, false, pg_whole);
}

/* ---- one rank ---- */

static int pg_copy(struct pg_plan *p)
{
    pg_plan_chunks(p, 1, 1, 0);
    if (pg_tb_new(p, 0) < 0)
        return -1;
    if (p->inplace)
        pg_op(p, 0, 0, "nop", NULL, NULL, NULL, NULL, false, pg_whole);
    else
        pg_op(p, 0, 0, "copy", pg_arr1(pg_loc('i', 0, 1)), pg_arr1(pg_loc('o', 0, 1)), NULL, NULL, false,
              pg_whole);
    return 0;
}

/* ---- allreduce, one node ---- */

/*
 * All-pairs one-shot: input is one chunk; scratch slot j holds rank j's
 * packets. Each block b of G = T(N-1) (or --blocks) takes slice b of the buffer and ppkts
 * it to slot g of every peer. Every rank then reduces in one order, rank 0's
 * data first and the others in rank order, so all ranks get the same bits:
 * rank g > 0 packs its own slice into its own slot g (cpkt), unpacks rank
 * 0's slice into the input (already sent and packed), and reduces that with
 * slots 1..N-1; rank 0 reduces its own input with slots 1..N-1. All ops of
 * a block use the same slice, so no block overwrites input another reads.
 */
static int pg_ar_oneshot(struct pg_plan *p, uint32_t N, uint32_t T, uint32_t B)
{
    uint32_t G = B ? B : T * (N - 1);
    pg_plan_chunks(p, 1, 1, N);
    for (uint32_t g = 0; g < N; g++) {
        pg_connect_node(p, g, N);
        if (pg_tbs_new(p, g, G) < 0)
            return -1;
        for (uint32_t b = 0; b < G; b++) {
            for (uint32_t q = 0; q < N - 1; q++) {
                uint32_t peer = pg_peer(g, q);
                pg_op(p, g, b, "ppkt", pg_arr1(pg_loc('i', 0, 1)),
                      pg_arr1(pg_rem(p, g, b, PG_CH_MEMORY, peer, 's', g, 1)), "memory", NULL, false,
                      pg_tbg(b, G));
            }
            if (g > 0) {
                pg_op(p, g, b, "cpkt", pg_arr1(pg_loc('i', 0, 1)), pg_arr1(pg_loc('s', g, 1)), NULL, NULL,
                      false, pg_tbg(b, G));
                pg_op(p, g, b, "upkt", pg_arr1(pg_loc('s', 0, 1)), pg_arr1(pg_loc('i', 0, 1)), NULL, NULL,
                      false, pg_tbg(b, G));
            }
            json_t *src = pg_arr1(pg_loc('i', 0, 1));
            for (uint32_t k = 1; k < N; k++)
                A_PUSH(src, pg_loc('s', k, 1));
            pg_op(p, g, b, "repkt", src, pg_arr1(pg_loc('i', 0, 1)), NULL, NULL, true, pg_tbg(b, G));
        }
    }
    return 0;
}

/*
 * One node, block b = q * T + t of rank g with G = T(N-1) blocks, chunk j
 * owned by rank j: ppkt chunk peer of the input to peer's scratch slot for
 * g (per-peer group q), then reduce the own chunk g with the N-1 slots into
 * @p dst (global group). Shared by two-phase allreduce and reducescatter.
 */
static void pg_scatter_reduce(struct pg_plan *p, uint32_t N, uint32_t T, uint32_t g, uint32_t q, uint32_t t,
                              json_t *dst)
{
    uint32_t G = T * (N - 1), b = q * T + t, peer = pg_peer(g, q);
    pg_op(p, g, b, "ppkt", pg_arr1(pg_loc('i', peer, 1)),
          pg_arr1(pg_rem(p, g, b, PG_CH_MEMORY, peer, 's', pg_slot(g, peer), 1)), "memory", NULL, false,
          pg_tbg(t, T));
    json_t *src = pg_arr1(pg_loc('i', g, 1));
    for (uint32_t k = 0; k < N - 1; k++)
        A_PUSH(src, pg_loc('s', k, 1));
    pg_op(p, g, b, "repkt", src, pg_arr1(dst), NULL, NULL, true, pg_tbg(b, G));
}

/*
 * Two-phase (section 4.1 of the format notes, with one chunk per rank): rank
 * g owns chunk g. Per-peer groups (T blocks for peer p) scatter chunk p to
 * p's scratch slot and later unpack p's result into chunk p; the global
 * group (all G = T(N-1) blocks) reduces chunk g and broadcasts the result
 * packets (repkt + ppkt -> respkt after fusion).
 * Scratch: [0, N-1) contributions, [N-1, 2(N-1)) results, by sender slot.
 */
static int pg_ar_twophase(struct pg_plan *p, uint32_t N, uint32_t T)
{
    uint32_t G = T * (N - 1);
    pg_plan_chunks(p, N, N, 2 * (N - 1));
    for (uint32_t g = 0; g < N; g++) {
        pg_connect_node(p, g, N);
        if (pg_tbs_new(p, g, G) < 0)
            return -1;
        for (uint32_t q = 0; q < N - 1; q++) {
            for (uint32_t t = 0; t < T; t++) {
                uint32_t b = q * T + t, peer = pg_peer(g, q);
                pg_scatter_reduce(p, N, T, g, q, t, pg_loc('i', g, 1));
                for (uint32_t k = 0; k < N - 1; k++) {
                    uint32_t dp = pg_peer(g, k);
                    pg_op(p, g, b, "ppkt", pg_arr1(pg_loc('i', g, 1)),
                          pg_arr1(pg_rem(p, g, b, PG_CH_MEMORY, dp, 's', N - 1 + pg_slot(g, dp), 1)),
                          "memory", NULL, false, pg_tbg(b, G));
                }
                pg_op(p, g, b, "upkt", pg_arr1(pg_loc('s', N - 1 + pg_slot(peer, g), 1)),
                      pg_arr1(pg_loc('i', peer, 1)), NULL, NULL, false, pg_tbg(t, T));
            }
        }
    }
    return 0;
}

/*
 * Two-phase with G blocks per rank and no thread-block-group slicing
 * (--blocks G): every rank's share is G whole sub-chunks, and block b
 * reduces sub-chunk b of it. Input: N * G chunks. Rank o owns sub-chunk
 * (o, b) for b < G; it sits at input chunk o * G + b (rows) or b * N + o
 * (cols). Scratch: contributions [0, R), results [R, 2R), R = (N-1) * G,
 * sub-chunk b of the sender in slot s at s * G + b (rows) or b * (N-1) + s
 * (cols), so that what one op moves is contiguous on both sides.
 *   rows (the MSCCL++ DSL's allreduce_pkt when G = N): the scatter of the
 *     q-th peer's row (G chunks, one ppkt) runs on block q % G and the
 *     unpack of peer p's row on block p % G, each in one op.
 *   peer: as rows, but the unpack of a peer's row runs on the block that
 *     scattered that row (block q % G for the q-th peer), so each input row
 *     is read and written by one block: an out-of-place call can run the
 *     program split (reads from the input, writes to the output,
 *     mscx_gpu_program_split) instead of staging a copy first. Same ops per
 *     block as rows.
 *   cols: block b handles column b alone, a two-phase allreduce of the
 *     contiguous piece [b * N, (b + 1) * N) with one block per rank: it
 *     sends chunk (p, b) to every peer p, reduces and broadcasts its own,
 *     and unpacks the others' results (two ops: the peers below and above).
 *     Blocks never wait on other blocks of their rank, only on block b of
 *     the peers, and all blocks do the same work.
 * Each sub-chunk is reduced once, by its owner (own data first, then the
 * peers in rank order), and everyone else receives the owner's bits, so all
 * ranks hold identical results, as with pg_ar_twophase.
 */
static uint32_t pg_tp_in(bool cols, uint32_t N, uint32_t G, uint32_t owner, uint32_t b)
{
    return cols ? b * N + owner : owner * G + b;
}

static uint32_t pg_tp_scr(bool cols, uint32_t N, uint32_t G, uint32_t slot, uint32_t b)
{
    return cols ? b * (N - 1) + slot : slot * G + b;
}

static int pg_ar_twophase_split(struct pg_plan *p, uint32_t N, uint32_t G, bool cols, bool peer_rows)
{
    const uint32_t R = (N - 1) * G;
    pg_plan_chunks(p, N * G, N * G, 2 * R);
    for (uint32_t g = 0; g < N; g++) {
        pg_connect_node(p, g, N);
        if (pg_tbs_new(p, g, G) < 0)
            return -1;
        for (uint32_t b = 0; b < G; b++) {
            /* 1. scatter: the peers' chunks to their contribution slots for g */
            for (uint32_t q = 0; q < N - 1; q++) {
                uint32_t peer = pg_peer(g, q), s = pg_slot(g, peer);
                if (cols)
                    pg_op(p, g, b, "ppkt", pg_arr1(pg_loc('i', pg_tp_in(cols, N, G, peer, b), 1)),
                          pg_arr1(pg_rem(p, g, b, PG_CH_MEMORY, peer, 's', pg_tp_scr(cols, N, G, s, b), 1)),
                          "memory", NULL, false, pg_whole);
                else if (q % G == b)
                    pg_op(p, g, b, "ppkt", pg_arr1(pg_loc('i', peer * G, G)),
                          pg_arr1(pg_rem(p, g, b, PG_CH_MEMORY, peer, 's', s * G, G)), "memory", NULL, false,
                          pg_whole);
            }
            /* 2. reduce own sub-chunk b, broadcast the result packets to the peers' result slots */
            uint32_t own = pg_tp_in(cols, N, G, g, b);
            json_t *src = pg_arr1(pg_loc('i', own, 1));
            for (uint32_t s = 0; s < N - 1; s++)
                A_PUSH(src, pg_loc('s', pg_tp_scr(cols, N, G, s, b), 1));
            pg_op(p, g, b, "repkt", src, pg_arr1(pg_loc('i', own, 1)), NULL, NULL, true, pg_whole);
            for (uint32_t k = 0; k < N - 1; k++) {
                uint32_t dp = pg_peer(g, k);
                pg_op(p, g, b, "ppkt", pg_arr1(pg_loc('i', own, 1)),
                      pg_arr1(pg_rem(p, g, b, PG_CH_MEMORY, dp, 's',
                                     R + pg_tp_scr(cols, N, G, pg_slot(g, dp), b), 1)),
                      "memory", NULL, false, pg_whole);
            }
            /* 3. gather: unpack the owners' results */
            if (cols) {
                /* owners p < g sit in slots [0, g), owners p > g in [g, N-1) */
                if (g > 0)
                    pg_op(p, g, b, "upkt", pg_arr1(pg_loc('s', R + pg_tp_scr(cols, N, G, 0, b), g)),
                          pg_arr1(pg_loc('i', pg_tp_in(cols, N, G, 0, b), g)), NULL, NULL, false, pg_whole);
                if (g < N - 1)
                    pg_op(p, g, b, "upkt", pg_arr1(pg_loc('s', R + pg_tp_scr(cols, N, G, g, b), N - 1 - g)),
                          pg_arr1(pg_loc('i', pg_tp_in(cols, N, G, g + 1, b), N - 1 - g)), NULL, NULL, false,
                          pg_whole);
            } else {
                for (uint32_t o = 0; o < N; o++)
                    if (o != g &&
                        (peer_rows ? pg_slot(o, g) : o) % G == b) /* pg_slot(o, g): o is g's q-th peer */
                        pg_op(p, g, b, "upkt", pg_arr1(pg_loc('s', R + pg_slot(o, g) * G, G)),
                              pg_arr1(pg_loc('i', o * G, G)), NULL, NULL, false, pg_whole);
            }
        }
    }
    return 0;
}

/* ---- allreduce, several nodes ---- */

/*
 * Hierarchical packet allreduce (section 4.2, generalised to M nodes as the
 * MSCCL++ multi-node default): input = P chunks, local rank l owns chunk l.
 * Scratch: [0, P) intra-node receive (slot p from local peer p); [P, P+M)
 * inter-node receive by node (own node's slot holds the packet copy of the
 * node-local sum, which the port block ships); [P+M, 2P+M) final results by
 * local rank (own slot holds the packet copy of the result).
 * Block 0 drives the port channels; blocks 1.. form per-peer groups (T each)
 * and together the global group of G = T(P-1) blocks. Each chunk's node sum
 * is computed once (by its owner), and the nodes' sums are folded in node
 * order on every node, so all ranks hold the same bits.
 */
static int pg_ar_hier(struct pg_plan *p, uint32_t N, uint32_t P, uint32_t T)
{
    uint32_t M = N / P, G = T * (P - 1);
    pg_plan_chunks(p, P, P, 2 * P + M);
    for (uint32_t r = 0; r < N; r++) {
        uint32_t n = r / P, l = r % P;
        if (pg_hier_rank(p, r, P, M, 1 + G) < 0)
            return -1;
        /* port block */
        pg_barrier(p, r, 0, 0, 1 + G);
        for (uint32_t m = 0; m < M; m++) {
            if (m == n)
                continue;
            pg_port_ppkt(p, r, m * P + l, P + n, P + n);
        }
        for (uint32_t q = 0; q < P - 1; q++) {
            for (uint32_t t = 0; t < T; t++) {
                uint32_t gb = q * T + t, b = 1 + gb;
                uint32_t pl = pg_peer(l, q), peer = n * P + pl;
                /* 1. intra-node scatter of chunk pl */
                pg_op(p, r, b, "ppkt", pg_arr1(pg_loc('i', pl, 1)),
                      pg_arr1(pg_rem(p, r, b, PG_CH_MEMORY, peer, 's', l, 1)), "memory", NULL, false,
                      pg_tbg(t, T));
                /* 2. node-local sum of chunk l, packet copy for the port block */
                json_t *src = pg_arr1(pg_loc('i', l, 1));
                for (uint32_t k = 0; k < P; k++)
                    if (k != l)
                        A_PUSH(src, pg_loc('s', k, 1));
                pg_op(p, r, b, "repkt", src, pg_arr1(pg_loc('i', l, 1)), NULL, NULL, true, pg_tbg(gb, G));
                pg_op(p, r, b, "cpkt", pg_arr1(pg_loc('i', l, 1)), pg_arr1(pg_loc('s', P + n, 1)), NULL, NULL,
                      false, pg_tbg(gb, G));
                /* 3. the port block may send once every block wrote its slice */
                pg_barrier(p, r, b, 0, 1 + G);
                /*
                 * 4. add the nodes' sums in node order on every node (identical
                 * bits everywhere): node n > 0 unpacks node 0's sum over its
                 * own (whose packet copy stays in slot P + n) and folds slots
                 * P + 1.. P + M - 1; packet copy to the own result slot
                 */
                if (n > 0)
                    pg_op(p, r, b, "upkt", pg_arr1(pg_loc('s', P, 1)), pg_arr1(pg_loc('i', l, 1)), NULL, NULL,
                          false, pg_tbg(gb, G));
                src = pg_arr1(pg_loc('i', l, 1));
                for (uint32_t m = 1; m < M; m++)
                    A_PUSH(src, pg_loc('s', P + m, 1));
                pg_op(p, r, b, "repkt", src, pg_arr1(pg_loc('i', l, 1)), NULL, NULL, true, pg_tbg(gb, G));
                pg_op(p, r, b, "cpkt", pg_arr1(pg_loc('i', l, 1)), pg_arr1(pg_loc('s', P + M + l, 1)), NULL,
                      NULL, false, pg_tbg(gb, G));
                /* 5. intra-node broadcast of the result packets */
                for (uint32_t k = 0; k < P - 1; k++) {
                    uint32_t dp = n * P + pg_peer(l, k);
                    pg_op(p, r, b, "rppkt", pg_arr1(pg_loc('s', P + M + l, 1)),
                          pg_arr1(pg_rem(p, r, b, PG_CH_MEMORY, dp, 's', P + M + l, 1)), "memory", NULL,
                          false, pg_tbg(gb, G));
                }
                /* 6. unpack peer pl's result into chunk pl */
                pg_op(p, r, b, "upkt", pg_arr1(pg_loc('s', P + M + pl, 1)), pg_arr1(pg_loc('i', pl, 1)), NULL,
                      NULL, false, pg_tbg(t, T));
            }
        }
    }
    return 0;
}

/* ---- allgather (out of place: input 1 chunk, output N chunks) ---- */

/* One node: ppkt own input to every peer's slot, unpack each peer's slot into its output chunk. */
static int pg_ag_allpairs(struct pg_plan *p, uint32_t N, uint32_t T)
{
    uint32_t G = T * (N - 1);
    pg_plan_chunks(p, 1, N, N - 1);
    for (uint32_t g = 0; g < N; g++) {
        pg_connect_node(p, g, N);
        if (pg_tbs_new(p, g, G) < 0)
            return -1;
        for (uint32_t q = 0; q < N - 1; q++) {
            for (uint32_t t = 0; t < T; t++) {
                uint32_t b = q * T + t, peer = pg_peer(g, q);
                pg_op(p, g, b, "ppkt", pg_arr1(pg_loc('i', 0, 1)),
                      pg_arr1(pg_rem(p, g, b, PG_CH_MEMORY, peer, 's', pg_slot(g, peer), 1)), "memory", NULL,
                      false, pg_tbg(t, T));
                pg_op(p, g, b, "copy", pg_arr1(pg_loc('i', 0, 1)), pg_arr1(pg_loc('o', g, 1)), NULL, NULL,
                      false, pg_tbg(b, G));
                pg_op(p, g, b, "upkt", pg_arr1(pg_loc('s', pg_slot(peer, g), 1)),
                      pg_arr1(pg_loc('o', peer, 1)), NULL, NULL, false, pg_tbg(t, T));
            }
        }
    }
    return 0;
}

/*
 * Several nodes. Scratch slot j (of N) receives rank j's data; slot r holds
 * r's own input as packets for the port block, which packs it, syncs its
 * threads and ships it to the same local rank of every other node. Each rank
 * forwards what it received over the port to its local peers (rppkt) and
 * unpacks everything into its output.
 */
static int pg_ag_hier(struct pg_plan *p, uint32_t N, uint32_t P, uint32_t T)
{
    uint32_t M = N / P, G = T * (P - 1);
    pg_plan_chunks(p, 1, N, N);
    for (uint32_t r = 0; r < N; r++) {
        uint32_t n = r / P, l = r % P;
        if (pg_hier_rank(p, r, P, M, 1 + G) < 0)
            return -1;
        pg_op(p, r, 0, "cpkt", pg_arr1(pg_loc('i', 0, 1)), pg_arr1(pg_loc('s', r, 1)), NULL, NULL, false,
              pg_whole);
        pg_op(p, r, 0, "nop", NULL, NULL, NULL, NULL, false, pg_whole);
        for (uint32_t m = 0; m < M; m++) {
            if (m == n)
                continue;
            pg_port_ppkt(p, r, m * P + l, r, r);
        }
        for (uint32_t q = 0; q < P - 1; q++) {
            for (uint32_t t = 0; t < T; t++) {
                uint32_t gb = q * T + t, b = 1 + gb;
                uint32_t pl = pg_peer(l, q), peer = n * P + pl;
                pg_op(p, r, b, "ppkt", pg_arr1(pg_loc('i', 0, 1)),
                      pg_arr1(pg_rem(p, r, b, PG_CH_MEMORY, peer, 's', r, 1)), "memory", NULL, false,
                      pg_tbg(t, T));
                pg_op(p, r, b, "copy", pg_arr1(pg_loc('i', 0, 1)), pg_arr1(pg_loc('o', r, 1)), NULL, NULL,
                      false, pg_tbg(gb, G));
                for (uint32_t m = 0; m < M; m++) {
                    if (m == n)
                        continue;
                    uint32_t src = m * P + l;
                    pg_op(p, r, b, "rppkt", pg_arr1(pg_loc('s', src, 1)),
                          pg_arr1(pg_rem(p, r, b, PG_CH_MEMORY, peer, 's', src, 1)), "memory", NULL, false,
                          pg_tbg(t, T));
                }
                for (uint32_t m = 0; m < M; m++) {
                    uint32_t j = m * P + pl;
                    pg_op(p, r, b, "upkt", pg_arr1(pg_loc('s', j, 1)), pg_arr1(pg_loc('o', j, 1)), NULL, NULL,
                          false, pg_tbg(t, T));
                }
                for (uint32_t m = 0; m < M; m++) {
                    if (m == n)
                        continue;
                    uint32_t j = m * P + l;
                    pg_op(p, r, b, "upkt", pg_arr1(pg_loc('s', j, 1)), pg_arr1(pg_loc('o', j, 1)), NULL, NULL,
                          false, pg_tbg(gb, G));
                }
            }
        }
    }
    return 0;
}

/* ---- reducescatter (out of place: input N chunks, output 1 chunk) ---- */

/* One node: ppkt chunk p to peer p's slot; reduce own chunk with the N-1 slots into the output. */
static int pg_rs_allpairs(struct pg_plan *p, uint32_t N, uint32_t T)
{
    uint32_t G = T * (N - 1);
    pg_plan_chunks(p, N, 1, N - 1);
    for (uint32_t g = 0; g < N; g++) {
        pg_connect_node(p, g, N);
        if (pg_tbs_new(p, g, G) < 0)
            return -1;
        for (uint32_t q = 0; q < N - 1; q++) {
            for (uint32_t t = 0; t < T; t++) {
                pg_scatter_reduce(p, N, T, g, q, t, pg_loc('o', 0, 1));
            }
        }
    }
    return 0;
}

/*
 * Several nodes. Local rank l collects, for every node m, its node's
 * contributions to the chunk of rank (m, l): packet slot p*M + m from local
 * peer p. For m != n it sums them (raw into scratch, packet copy for the port
 * block) and the port block ships the partial to (m, l); the final reduce
 * adds the own node's contributions and the partials that arrived.
 * Scratch: packets [0, PM) intra, [PM, PM+M) partials to send, [PM+M,
 * PM+2M) partials received (by node); raw partials at 2K + m, K = PM + 2M,
 * which is past every packet line.
 */
static int pg_rs_hier(struct pg_plan *p, uint32_t N, uint32_t P, uint32_t T)
{
    uint32_t M = N / P, G = T * (P - 1), K = P * M + 2 * M;
    pg_plan_chunks(p, N, 1, 2 * K + M);
    for (uint32_t r = 0; r < N; r++) {
        uint32_t n = r / P, l = r % P;
        if (pg_hier_rank(p, r, P, M, 1 + G) < 0)
            return -1;
        pg_barrier(p, r, 0, 0, 1 + G);
        for (uint32_t m = 0; m < M; m++) {
            if (m == n)
                continue;
            pg_port_ppkt(p, r, m * P + l, P * M + m, P * M + M + n);
        }
        for (uint32_t q = 0; q < P - 1; q++) {
            for (uint32_t t = 0; t < T; t++) {
                uint32_t gb = q * T + t, b = 1 + gb;
                uint32_t pl = pg_peer(l, q), peer = n * P + pl;
                for (uint32_t m = 0; m < M; m++)
                    pg_op(p, r, b, "ppkt", pg_arr1(pg_loc('i', m * P + pl, 1)),
                          pg_arr1(pg_rem(p, r, b, PG_CH_MEMORY, peer, 's', l * M + m, 1)), "memory", NULL,
                          false, pg_tbg(t, T));
                for (uint32_t m = 0; m < M; m++) {
                    if (m == n)
                        continue;
                    json_t *src = pg_arr1(pg_loc('i', m * P + l, 1));
                    for (uint32_t k = 0; k < P; k++)
                        if (k != l)
                            A_PUSH(src, pg_loc('s', k * M + m, 1));
                    pg_op(p, r, b, "repkt", src, pg_arr1(pg_loc('s', 2 * K + m, 1)), NULL, NULL, true,
                          pg_tbg(gb, G));
                    pg_op(p, r, b, "cpkt", pg_arr1(pg_loc('s', 2 * K + m, 1)),
                          pg_arr1(pg_loc('s', P * M + m, 1)), NULL, NULL, false, pg_tbg(gb, G));
                }
                pg_barrier(p, r, b, 0, 1 + G);
                json_t *src = pg_arr1(pg_loc('i', n * P + l, 1));
                for (uint32_t k = 0; k < P; k++)
                    if (k != l)
                        A_PUSH(src, pg_loc('s', k * M + n, 1));
                for (uint32_t m = 0; m < M; m++)
                    if (m != n)
                        A_PUSH(src, pg_loc('s', P * M + M + m, 1));
                pg_op(p, r, b, "repkt", src, pg_arr1(pg_loc('o', 0, 1)), NULL, NULL, true, pg_tbg(gb, G));
            }
        }
    }
    return 0;
}

/* ---- dispatch ---- */

static int pg_fail(const char *msg, const struct pg_params *par)
{
    fprintf(stderr, "mscx-plangen: %s (collective %s, algorithm %s, %u ranks, %u per node)\n", msg,
            mscx_coll_name(par->coll), par->algo, par->nranks, par->rpn);
    return -1;
}

int pg_generate(const struct pg_params *par, struct pg_plan *p)
{
    uint32_t N = par->nranks, P = par->rpn, T = par->tbs_per_peer;
    const char *a = par->algo;
    bool copy = strcmp(a, "copy") == 0;
    bool hier = strcmp(a, "hier2") == 0;
    int rc;

    if (N == 0 || P == 0 || N % P || T == 0)
        return pg_fail("ranks must be a positive multiple of ranks per node, tbs-per-peer positive", par);
    bool split = par->blocks && strcmp(a, "twophase") == 0;
    bool cols = par->layout && strcmp(par->layout, "cols") == 0;
    bool peer_rows = par->layout && strcmp(par->layout, "peer") == 0;
    if (par->blocks && strcmp(a, "oneshot") != 0 && !split)
        return pg_fail("--blocks is for the oneshot and twophase algorithms (the others slice per peer: "
                       "--tbs-per-peer)",
                       par);
    if (par->blocks > 64)
        return pg_fail("--blocks above 64", par);
    if (par->layout && (!split || (strcmp(par->layout, "rows") != 0 && !cols && !peer_rows)))
        return pg_fail("--layout is rows, peer or cols, for twophase with --blocks", par);
    if (copy != (N == 1))
        return pg_fail("the copy algorithm is for one rank, and one rank needs it", par);
    if (!copy && hier != (N > P))
        return pg_fail(hier ? "hier2 needs two or more nodes" : "this algorithm is for one node", par);
    if (hier && P < 2)
        return pg_fail("hier2 needs two or more ranks per node", par);
    if (par->coll != MSCX_COLL_ALLREDUCE && par->coll != MSCX_COLL_ALLGATHER &&
        par->coll != MSCX_COLL_REDUCESCATTER && par->coll != MSCX_COLL_BROADCAST &&
        par->coll != MSCX_COLL_ALLTOALL)
        return pg_fail("unsupported collective", par);
    bool bcast = par->coll == MSCX_COLL_BROADCAST;
    if (par->root && !bcast)
        return pg_fail("--root is for broadcast", par);
    bool bcast_direct = bcast && strcmp(a, "direct") == 0;
    if (bcast && !copy && !hier && strcmp(a, "oneshot") != 0 && !bcast_direct)
        return pg_fail(
            "broadcast runs copy on one rank, oneshot or direct on one node and hier2 across nodes", par);

    bool inplace = par->coll == MSCX_COLL_ALLREDUCE;
    bool simple = copy || (par->coll == MSCX_COLL_ALLTOALL && strcmp(a, "direct") == 0) || bcast_direct;
    if (pg_plan_init(p, par, !simple, inplace) < 0)
        return -1;
    if (par->name) {
        snprintf(p->name, sizeof(p->name), "%s", par->name);
    } else {
        char lo[32], hi[32];
        /* a range that starts just past a round size is labelled by that size: (64K, 1M] */
        pg_size_label(par->min_size % 1024 == 1 ? par->min_size - 1 : par->min_size, lo, sizeof(lo));
        pg_size_label(par->max_size, hi, sizeof(hi));
        /* twophase --blocks G: the layout and G are part of the name (twophase_rows8, _peer8, _cols8) */
        char lay[16] = "";
        if (split)
            snprintf(lay, sizeof(lay), "_%s%u", cols ? "cols" : peer_rows ? "peer" : "rows", par->blocks);
        else if (bcast)
            snprintf(lay, sizeof(lay), "_root%u", par->root);
        int len = snprintf(p->name, sizeof(p->name), "%s_n%u_rpn%u_%s%s_%s_%s", mscx_coll_name(par->coll), N,
                           P, a, lay, lo, hi);
        if (len < 0 || (size_t)len >= sizeof(p->name)) {
            pg_plan_fini(p);
            return pg_fail("plan name too long", par);
        }
    }

    if (copy)
        rc = pg_copy(p);
    else if (bcast)
        rc = pg_bcast(par, p, hier);
    else if (par->coll == MSCX_COLL_ALLTOALL)
        rc = pg_alltoall(par, p, hier);
    else if (par->coll == MSCX_COLL_ALLREDUCE && strcmp(a, "oneshot") == 0 && !hier)
        rc = pg_ar_oneshot(p, N, T, par->blocks);
    else if (par->coll == MSCX_COLL_ALLREDUCE && strcmp(a, "twophase") == 0 && split)
        rc = pg_ar_twophase_split(p, N, par->blocks, cols, peer_rows);
    else if (par->coll == MSCX_COLL_ALLREDUCE && strcmp(a, "twophase") == 0)
        rc = pg_ar_twophase(p, N, T);
    else if (par->coll == MSCX_COLL_ALLREDUCE && hier)
        rc = pg_ar_hier(p, N, P, T);
    else if (par->coll == MSCX_COLL_ALLGATHER && strcmp(a, "allpairs") == 0)
        rc = pg_ag_allpairs(p, N, T);
    else if (par->coll == MSCX_COLL_ALLGATHER && hier)
        rc = pg_ag_hier(p, N, P, T);
    else if (par->coll == MSCX_COLL_REDUCESCATTER && strcmp(a, "allpairs") == 0)
        rc = pg_rs_allpairs(p, N, T);
    else if (par->coll == MSCX_COLL_REDUCESCATTER && hier)
        rc = pg_rs_hier(p, N, P, T);
    else
        rc = pg_fail("unknown algorithm for this collective", par);
    if (rc < 0)
        pg_plan_fini(p);
    return rc;
}
