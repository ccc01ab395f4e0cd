/* SPDX-License-Identifier: MIT */
/*
 * The registry of mutexes held across fork() (fork.h): one pthread_atfork
 * triple for all of them. The prepare handler takes every registered mutex
 * in level order; the parent and child handlers release them in reverse.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "mscx/fork.h"
#include "mscx/log.h"

#define FORK_MAX 32

struct fork_entry {
    pthread_mutex_t *m;
    int level;
};

static pthread_mutex_t fork_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fork_entry fork_locks[FORK_MAX]; /* sorted by level */
static int fork_n;
static int fork_installed;

static void fork_prepare(void)
{
    pthread_mutex_lock(&fork_reg_lock);
    for (int i = 0; i < fork_n; i++)
        pthread_mutex_lock(fork_locks[i].m);
}

static void fork_release(void)
{
    for (int i = fork_n - 1; i >= 0; i--)
        pthread_mutex_unlock(fork_locks[i].m);
    pthread_mutex_unlock(&fork_reg_lock);
}

/* Insert @p m at its level. With fork_reg_lock held. @return 0 or -1 when full */
static int fork_insert(pthread_mutex_t *m, int level)
{
    for (int i = 0; i < fork_n; i++)
        if (fork_locks[i].m == m)
            return 0;
    if (fork_n == FORK_MAX)
        return -1;
    int at = fork_n;
    while (at > 0 && fork_locks[at - 1].level > level) {
        fork_locks[at] = fork_locks[at - 1];
        at--;
    }
    fork_locks[at] = (struct fork_entry){m, level};
    fork_n++;
    return 0;
}

int mscx_fork_protect(pthread_mutex_t *m, enum mscx_fork_level level)
{
    int rc = 0, n;
    pthread_mutex_lock(&fork_reg_lock);
    if (!fork_installed) {
        if (pthread_atfork(fork_prepare, fork_release, fork_release) != 0)
            rc = -1;
        else
            fork_installed = 1;
    }
    if (rc == 0)
        rc = fork_insert(m, (int)level);
    n = fork_n;
    pthread_mutex_unlock(&fork_reg_lock);
    if (rc != 0)
        MSCX_WARN("internal bug: cannot hold a mutex across fork (%d registered); a forked child may hang",
                  n);
    return rc;
}

int mscx_fork_protected_count(void)
{
    pthread_mutex_lock(&fork_reg_lock);
    int n = fork_n;
    pthread_mutex_unlock(&fork_reg_lock);
    return n;
}
