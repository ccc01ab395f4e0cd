/* SPDX-License-Identifier: MIT */
/**
 * @file fork.h
 * Process-wide mutexes across fork(). A child process (a DataLoader worker,
 * say) gets a copy of every lock in the state it had at the fork; one that
 * another thread held then would stay held forever in the child. Each
 * mutex registered here is taken before fork() and released after it, in
 * the parent and in the child, so the child finds every one free and the
 * data it guards consistent.
 */
#ifndef MSCX_FORK_H
#define MSCX_FORK_H

#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Order of the registered mutexes: a lock of a lower level is taken before
 * one of a higher level around fork(), so a mutex held while another is
 * taken must have the lower level.
 */
enum mscx_fork_level {
    MSCX_FORK_SHIM_CALLER = 10,  /* shim/caller.c */
    MSCX_FORK_SHIM_TABLE = 20,   /* shim/comm_table.c */
    MSCX_FORK_SHIM_FREE = 30,    /* shim/comm.c free list */
    MSCX_FORK_SHIM_SUMMARY = 40, /* shim/summary.c */
    MSCX_FORK_SHIM_WARN = 50,    /* shim/plans.c, and the shim's locks that hold no other */
    MSCX_FORK_LOG = 60,          /* executor/common/log.c */
    MSCX_FORK_ENV = 70,          /* executor/common/env.c */
};

/**
 * Hold @p m across every later fork(). Idempotent; thread-safe. At most 32
 * mutexes: more are refused with one WARN.
 * @return 0, or -1 when the table is full or pthread_atfork failed
 */
int mscx_fork_protect(pthread_mutex_t *m, enum mscx_fork_level level);

/** Tests: how many mutexes are registered. */
int mscx_fork_protected_count(void);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_FORK_H */
