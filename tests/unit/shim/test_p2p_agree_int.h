/* SPDX-License-Identifier: MIT */
/*
 * Private header of the p2p agreement test, shared by test_p2p_agree.c and
 * test_p2p_agree_disagree.c: the scenario of a world of ranks (each rank's
 * vote in each round) and its results, the world helpers of
 * test_p2p_agree.c that the disagreement cases use, and the cases of
 * test_p2p_agree_disagree.c that test_p2p_agree.c adds.
 */
#ifndef MSCX_TEST_P2P_AGREE_INT_H
#define MSCX_TEST_P2P_AGREE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "shim_int.h"
#include "test_common.h"

#define MAXR 8
#define MAXROUNDS 200
#define SKIP (-1)      /* the rank did not vote in that round */
#define LONG_MS 10000u /* a timeout that a passing test never reaches */
#define QUICK_MS 1000u /* "at once": far below LONG_MS, generous for a loaded machine */
#define SHORT_MS 200u  /* the timeout of the rounds meant to time out */
#define BYTES 4096u

enum mode { THREADS, PROCS };

/* One rank's vote in one round. */
struct pt {
    struct shim_p2p_point p;
    uint64_t sent[MAXR], received[MAXR];
    uint64_t timeout_ms;
    uint32_t delay_us; /* before the vote */
};

struct scen;
/* Fill @p pt (set to yes at position 0, LONG_MS) for rank @p rank in round @p round; 0: it does not vote. */
typedef int (*point_fn)(const struct scen *sc, uint32_t round, uint32_t rank, struct pt *pt);

struct scen {
    uint32_t n, rounds;
    int sync; /* all ranks meet after each round */
    point_fn point;
    uint32_t arg; /* the rank that a scenario singles out */
};

/* In shared memory: seen by threads and forked ranks alike. */
struct world {
    pthread_barrier_t barrier;
    uint8_t secret[SHIM_SECRET_BYTES];
    const struct scen *sc;
    int open_st[MAXR];
    int result[MAXROUNDS][MAXR];
    uint32_t ms[MAXROUNDS][MAXR];
};

/* Every position of @p pt at @p k: k groups with every peer before this one. */
static inline void at(struct pt *pt, uint32_t n, uint64_t k)
{
    for (uint32_t j = 0; j < n; j++)
        pt->sent[j] = pt->received[j] = k;
}

/* test_p2p_agree.c */
struct world *world_ran(const struct scen *sc, enum mode m);
void world_free(struct world *w);
void expect_round(const struct world *w, enum mode m, uint32_t r, int want, uint32_t min_ms, uint32_t max_ms);

/* test_p2p_agree_disagree.c */
void p2p_agree_add_disagree_cases(TCase *tc);

#endif
