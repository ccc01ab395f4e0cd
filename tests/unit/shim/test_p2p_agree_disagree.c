/* SPDX-License-Identifier: MIT */
/*
 * Rounds of the p2p agreement that must not commit: a rank that says no,
 * positions that disagree between two ranks (one group ahead, or one
 * direction only), and bytes, dtype or the self pair that differ. Every rank
 * of such a round gets 0, and a later round at consistent positions
 * commits; ranks as threads and as forked processes, through the
 * agreement's interface in shim_int.h alone.
 */
#include <stdint.h>

#include "shim_int.h"
#include "test_common.h"
#include "test_p2p_agree_int.h"

/* ---- one rank says no ---- */

static int point_one_no(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    at(pt, sc->n, round);
    pt->p.yes = !(round == 0 && rank == sc->arg);
    return 1;
}

START_TEST(test_one_no)
{
    enum mode m = _i ? PROCS : THREADS;
    for (uint32_t no = 0; no < 4; no += 3) {
        struct scen sc = {4, 2, 1, point_one_no, no};
        struct world *w = world_ran(&sc, m);
        expect_round(w, m, 0, 0, 0, QUICK_MS);
        expect_round(w, m, 1, 1, 0, LONG_MS); /* all went to NCCL with the group: all at 1 */
        world_free(w);
    }
}
END_TEST

/* ---- positions that disagree: rank 2 is one group ahead with rank 3 ---- */

static int point_ahead(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    at(pt, sc->n, round);
    if (round == 0 && rank == 2)
        pt->sent[3] = pt->received[3] = 1;
    if (round == 1 && (rank == 2 || rank == 3)) /* rank 3 caught up with its extra group on NCCL */
        pt->sent[5 - rank] = pt->received[5 - rank] = 2;
    return 1;
}

/* ... and rank 1 sent one more to rank 0 than rank 0 received (one direction only). */
static int point_one_way(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    at(pt, sc->n, round);
    if (round == 0 && rank == 1)
        pt->sent[0] = 1;
    if (round == 1 && rank == 1)
        pt->sent[0] = 2;
    if (round == 1 && rank == 0)
        pt->received[1] = 2;
    return 1;
}

/*
 * point_ahead in a fixed order. arg 0: rank 2 posts, rank 3 finds it past its
 * group and stays out, then ranks 0 and 1 find rank 3's last vote on their
 * group. arg 1: ranks 0 to 2 post, and rank 3, staying out, ends their round.
 */
static int point_ahead_ordered(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    point_ahead(sc, round, rank, pt);
    static const uint32_t delay_ms[2][4] = {{100, 100, 0, 50}, {0, 0, 0, 50}};
    if (round == 0)
        pt->delay_us = delay_ms[sc->arg][rank] * 1000u;
    return 1;
}

START_TEST(test_positions_disagree)
{
    enum mode m = _i ? PROCS : THREADS;
    point_fn fns[] = {point_ahead, point_one_way, point_ahead_ordered, point_ahead_ordered};
    for (uint32_t k = 0; k < 4; k++) {
        struct scen sc = {4, 2, 1, fns[k], k == 3};
        struct world *w = world_ran(&sc, m);
        expect_round(w, m, 0, 0, 0, QUICK_MS);
        expect_round(w, m, 1, 1, 0, LONG_MS);
        world_free(w);
    }
}
END_TEST

/* ---- bytes, dtype or the self pair differ ---- */

static int point_mismatch(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt)
{
    at(pt, sc->n, round);
    if (round == 0 && rank == 1)
        pt->p.bytes = BYTES + 8;
    if (round == 1 && rank == 2)
        pt->p.dtype = ncclFloat16;
    if (round == 2 && rank == 3)
        pt->sent[3] = round + 1; /* a send to itself without its recv */
    if (round == 3) {
        /* positions missing: a no, which a rank that comes after its round cannot match to its group */
        pt->timeout_ms = SHORT_MS;
        if (rank == 0)
            pt->p.sent = NULL;
    }
    return 1;
}

START_TEST(test_bytes_dtype_differ)
{
    enum mode m = _i ? PROCS : THREADS;
    struct scen sc = {4, 5, 1, point_mismatch, 0};
    struct world *w = world_ran(&sc, m);
    for (uint32_t r = 0; r < 3; r++)
        expect_round(w, m, r, 0, 0, QUICK_MS);
    expect_round(w, m, 3, 0, 0, SHORT_MS + QUICK_MS);
    expect_round(w, m, 4, 1, 0, LONG_MS);
    world_free(w);
}
END_TEST

void p2p_agree_add_disagree_cases(TCase *tc)
{
    tcase_add_loop_test(tc, test_one_no, 0, 2);
    tcase_add_loop_test(tc, test_positions_disagree, 0, 2);
    tcase_add_loop_test(tc, test_bytes_dtype_differ, 0, 2);
}
