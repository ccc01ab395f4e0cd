/* SPDX-License-Identifier: MIT */
/*
 * Host-side agreement of the ranks of one communicator, all on this host,
 * on whether a group of ncclSend/ncclRecv (one send and one recv of equal
 * size to and from every peer) runs as one alltoall plan. One POSIX
 * shared-memory segment per communicator, named from its secret, holds a
 * process-shared robust mutex, the current round (posted_mask, read_mask,
 * outcome PENDING/COMMIT/ABANDON) and each rank's last entry {bytes, dtype,
 * yes, sent[], received[]} (positions: the sends to and recvs from each
 * rank issued on the communicator before the group).
 *
 * A vote of rank r, with a deadline of timeout_ms:
 *  1. Lock. While the round is decided but not yet read by all of its
 *     posters, unlock, back off and retry (at the deadline: return 0).
 *  2. When some rank's last entry stands past r's group with r (it issued
 *     more operations with r than r had before this group), r's operations
 *     it matches are behind it, on NCCL: do not post (the round open now may
 *     be a later group's), return 0; if a rank posted in the round needs an
 *     operation of r of this group or before, decide the round ABANDON.
 *  3. Else post r's entry, set its bit. It must agree with every rank posted
 *     in this round (for each posted j: r.sent[j] == j.received[r],
 *     r.received[j] == j.sent[r], equal bytes and dtype, both yes), hold
 *     r.sent[r] == r.received[r], and match no rank's last entry outside the
 *     round (a rank at the same positions there voted on this group in a
 *     round that ended without r, and went to NCCL). Any failure, or a no:
 *     ABANDON. All nranks posted and every poster's process alive: COMMIT.
 *     Unlock.
 *  4. Wait unlocked (sched_yield, then short sleeps) until the round is
 *     decided; at the deadline, or when a posted rank's process is gone,
 *     decide it ABANDON.
 *  5. Load the outcome; lock, set r's bit in read_mask; the last poster to
 *     read resets the round (masks 0, outcome PENDING, round++); unlock.
 *     Return outcome == COMMIT.
 * A vote that stops at step 2 leaves its entry as r's last vote all the
 * same, outside the round, for the ranks still to come to its group, which
 * then give up at once instead of at their deadlines.
 *
 * The outcome is decided once per round, by compare-and-swap from PENDING:
 * the committer under the lock, a waiter at its deadline without it (a
 * stuck lock holder cannot keep a poster waiting). Only the last of the
 * round's posters to read it sets it back to PENDING. So every poster of a
 * round returns the same result, and a rank that never posted returns 0.
 *
 * Why COMMIT is safe: it needs all nranks entries of one round, all yes, with
 * consistent pair positions. NCCL matches rank r's k-th send to j with j's
 * k-th recv from r, whatever the grouping; r's group holds one send to and
 * one recv from each j, and r.sent[j] == j.received[r] says that r's send
 * is the one j's group receives (and the reverse for r.received[j]). So
 * every rank's group holds exactly the operations NCCL would match with the
 * others' groups: the same logical group, run by every rank as the plan.
 * Any other outcome sends every poster of the round to NCCL, and a rank that
 * never posted went to NCCL too; NCCL then matches the operations itself.
 * The checks against last entries (steps 2, 3) only keep a rank from
 * posting or add ABANDONs, which is always safe; they rely on each rank
 * voting at most once per group.
 *
 * Failures: every wait is bounded. A process that dies holding the lock
 * (robust mutex: EOWNERDEAD), a poster whose process is gone (kill(pid, 0)
 * gives ESRCH, for posters in our PID namespace), a rank posting twice in
 * one round, or a lock that cannot be taken to end a round, decide the
 * round ABANDON (when still PENDING) and mark the segment broken: every
 * later vote returns 0 at once. A dead rank never votes again, so the
 * communicator could not commit anyway.
 *
 * The name carries a 64-bit FNV-1a hash of the secret (never the secret); a
 * second, differently seeded hash stored in the segment is checked by every
 * rank, so that two communicators share a segment only when both hashes
 * collide. Every opener sizes the object (growing it from 0 zero-fills it)
 * and the first to map it initialises it. The rank whose open completes the
 * set of ranks that mapped it unlinks the name, so that no process that
 * ends without closing leaves it behind; rank 0 and the last handle to close
 * unlink it too (when not every rank came, or a rank came after the others
 * left and made a fresh one).
 */
#define _GNU_SOURCE /* pthread_mutex_clocklock */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mscx/log.h"
#include "shim_int.h"

#define AGREE_MAGIC 0x6d7363782d703270ull /* "mscx-p2p" */
#define AGREE_VERSION 2u
#define AGREE_NAME_MAX 48
#define AGREE_READ_GRACE_MS 1000u /* the bound on taking the lock to finish a read */
#define AGREE_SPINS 64            /* sched_yield rounds before sleeping */
#define AGREE_LIVENESS_MS 10u     /* how often a waiter looks for posters that died */
#define AGREE_STALE_S 60          /* a segment of dead openers is removed once unchanged this long */

_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "atomics must be lock-free to be shared between processes");

enum agree_init { INIT_FRESH = 0, INIT_BUSY = 1, INIT_READY = 2 };
enum agree_outcome { OUT_PENDING = 0, OUT_COMMIT = 1, OUT_ABANDON = 2 };

struct agree_entry {
    uint64_t bytes;
    int32_t dtype;
    int32_t yes;
    uint32_t voted; /* non-zero once this rank has voted with positions: the entry holds its last vote */
    uint32_t pad;
    int64_t pid;        /* the poster's process, for the liveness check */
    uint64_t pidns;     /* its PID namespace (inode of /proc/self/ns/pid), 0 unknown */
    int64_t opener;     /* the process that opened it as this rank, for the stale-segment check */
    uint64_t opener_ns; /* its PID namespace */
    uint64_t sent[SHIM_P2P_AGREE_MAX_RANKS];
    uint64_t received[SHIM_P2P_AGREE_MAX_RANKS];
};

struct agree_seg {
    _Atomic uint32_t init; /* enum agree_init: the first mapper initialises the rest */
    uint32_t version;
    uint64_t magic;
    uint64_t check; /* the second hash of the secret */
    uint32_t nranks;
    _Atomic uint32_t attached; /* handles mapping it */
    _Atomic uint64_t opened;   /* the ranks that have mapped it: all of them, and the name goes */
    _Atomic uint32_t broken;   /* non-zero: every vote returns 0 */
    _Atomic uint32_t outcome;  /* enum agree_outcome of the current round */
    uint64_t round;            /* the fields from here on change under the mutex only */
    uint64_t posted_mask;
    uint64_t read_mask;
    pthread_mutex_t mutex;
    struct agree_entry e[SHIM_P2P_AGREE_MAX_RANKS];
};

struct shim_p2p_agree {
    struct agree_seg *seg;
    uint32_t rank, nranks;
    int ready; /* 1: the segment was seen initialised and matching; -1: not matching */
    int64_t pid;
    uint64_t pidns;
    uint64_t check;
    uint64_t round; /* the round of this rank's last post, for the log */
    char name[AGREE_NAME_MAX];
};

/* ---- time, hashing ---- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t deadline_after(uint64_t ms)
{
    uint64_t now = now_ns();
    uint64_t span = ms > UINT64_MAX / 2000000u ? UINT64_MAX / 2 : ms * 1000000u;
    return now + span;
}

static struct timespec to_timespec(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    return ts;
}

static uint64_t pid_namespace(void)
{
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

static uint64_t rank_bit(uint32_t rank)
{
    return 1ull << rank;
}

static uint64_t full_mask(uint32_t nranks)
{
    return nranks >= 64 ? ~0ull : rank_bit(nranks) - 1;
}

/* Back off while waiting: a few yields, then sleeps of 20 us growing to 1 ms. */
static void back_off(unsigned *spins)
{
    if (*spins < AGREE_SPINS) {
        (*spins)++;
        sched_yield();
        return;
    }
    unsigned k = *spins - AGREE_SPINS;
    struct timespec ts = {0, k >= 6 ? 1000000L : 20000L << k};
    if (k < 6)
        (*spins)++;
    nanosleep(&ts, NULL);
}

/* ---- the segment ---- */

static int seg_init_mutex(pthread_mutex_t *m)
{
    pthread_mutexattr_t attr;
    if (pthread_mutexattr_init(&attr) != 0)
        return -1;
    int rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (rc == 0)
        rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    if (rc == 0)
        rc = pthread_mutex_init(m, &attr);
    pthread_mutexattr_destroy(&attr);
    return rc == 0 ? 0 : -1;
}

/* Decide the current round @p out if it is still undecided. */
static void decide(struct agree_seg *s, uint32_t out)
{
    uint32_t pending = OUT_PENDING;
    atomic_compare_exchange_strong_explicit(&s->outcome, &pending, out, memory_order_acq_rel,
                                            memory_order_acquire);
}

/* The segment can no longer commit: the current round, if undecided, and every later vote give 0. */
static void mark_broken(struct agree_seg *s)
{
    atomic_store_explicit(&s->broken, 1, memory_order_release);
    decide(s, OUT_ABANDON);
}

static int is_broken(const struct agree_seg *s)
{
    return atomic_load_explicit(&s->broken, memory_order_acquire) != 0;
}

/* The first mapper initialises the segment; the others find it ready later. */
static void seg_init_once(struct shim_p2p_agree *a)
{
    struct agree_seg *s = a->seg;
    uint32_t fresh = INIT_FRESH;
    if (!atomic_compare_exchange_strong_explicit(&s->init, &fresh, INIT_BUSY, memory_order_acq_rel,
                                                 memory_order_acquire))
        return;
    s->version = AGREE_VERSION;
    s->magic = AGREE_MAGIC;
    s->check = a->check;
    s->nranks = a->nranks;
    if (seg_init_mutex(&s->mutex) != 0) {
        MSCX_WARN("p2p agreement %s: rank %u: cannot initialise its process-shared mutex", a->name, a->rank);
        atomic_store_explicit(&s->broken, 1, memory_order_release);
    }
    atomic_store_explicit(&s->init, INIT_READY, memory_order_release);
}

/* Non-zero once the segment is initialised and is this communicator's; waits until @p deadline. */
static int seg_ready(struct shim_p2p_agree *a, uint64_t deadline)
{
    if (a->ready)
        return a->ready > 0;
    struct agree_seg *s = a->seg;
    unsigned spins = 0;
    while (atomic_load_explicit(&s->init, memory_order_acquire) != INIT_READY) {
        if (now_ns() >= deadline)
            return 0;
        back_off(&spins);
    }
    if (s->magic != AGREE_MAGIC || s->version != AGREE_VERSION || s->check != a->check ||
        s->nranks != a->nranks) {
        MSCX_WARN("p2p agreement %s: rank %u: the segment is not this communicator's (version %u, %u ranks, "
                  "expected %u)",
                  a->name, a->rank, s->version, s->nranks, a->nranks);
        mark_broken(s);
        a->ready = -1;
        return 0;
    }
    a->ready = 1;
    return 1;
}

/*
 * Take the mutex, waiting until @p deadline. A holder that died leaves the
 * segment broken (it may have left it half-written); the lock is then held
 * and made consistent. @return 0 with the lock held, -1 without it.
 */
static int seg_lock(struct shim_p2p_agree *a, uint64_t deadline)
{
    struct timespec abs = to_timespec(deadline);
    int rc = pthread_mutex_clocklock(&a->seg->mutex, CLOCK_MONOTONIC, &abs);
    if (rc == 0)
        return 0;
    if (rc == EOWNERDEAD) {
        MSCX_WARN("p2p agreement %s: rank %u: a rank died holding its lock; sends and recvs of this "
                  "communicator go to NCCL",
                  a->name, a->rank);
        pthread_mutex_consistent(&a->seg->mutex);
        mark_broken(a->seg);
        return 0;
    }
    if (rc != ETIMEDOUT) {
        MSCX_WARN("p2p agreement %s: rank %u: its lock failed: %s", a->name, a->rank, strerror(rc));
        mark_broken(a->seg);
    }
    return -1;
}

static void seg_unlock(struct shim_p2p_agree *a)
{
    pthread_mutex_unlock(&a->seg->mutex);
}

/* ---- a vote ---- */

/* Non-zero when posted rank @p j's process is known to be gone. */
static int poster_dead(const struct shim_p2p_agree *a, uint32_t j)
{
    const struct agree_entry *e = &a->seg->e[j];
    if (e->pid == a->pid || e->pid <= 0 || e->pidns == 0 || e->pidns != a->pidns)
        return 0;
    return kill((pid_t)e->pid, 0) != 0 && errno == ESRCH;
}

/* Under the lock: the first posted rank whose process is gone, or -1 (each process asked once in a row). */
static int find_dead_poster(const struct shim_p2p_agree *a)
{
    uint64_t m = a->seg->posted_mask;
    int64_t last = a->pid;
    for (uint32_t j = 0; j < a->nranks; j++) {
        if (!(m & rank_bit(j)) || a->seg->e[j].pid == last)
            continue;
        last = a->seg->e[j].pid;
        if (poster_dead(a, j))
            return (int)j;
    }
    return -1;
}

static void note_dead(struct shim_p2p_agree *a, int j)
{
    MSCX_WARN("p2p agreement %s: rank %u: rank %d's process is gone; sends and recvs of this communicator go "
              "to NCCL",
              a->name, a->rank, j);
    mark_broken(a->seg);
}

static void fill_entry(const struct shim_p2p_agree *a, const struct shim_p2p_point *p, struct agree_entry *e)
{
    size_t n = a->nranks * sizeof(uint64_t);
    e->bytes = p->bytes;
    e->dtype = p->dtype;
    e->yes = p->yes && p->sent && p->received;
    e->voted = p->sent && p->received; /* positions to compare later ranks with */
    e->pid = a->pid;
    e->pidns = a->pidns;
    if (p->sent && p->received) {
        memcpy(e->sent, p->sent, n);
        memcpy(e->received, p->received, n);
    } else {
        memset(e->sent, 0, n);
        memset(e->received, 0, n);
    }
}

/* Whether rank r's entry @p me and rank j's entry @p other stand at the same positions of their pair. */
static int positions_match(const struct agree_entry *me, uint32_t r, const struct agree_entry *other,
                           uint32_t j)
{
    return me->sent[j] == other->received[r] && me->received[j] == other->sent[r];
}

/* Whether rank r's entry @p me and rank j's entry @p other, both of this round, may commit together. */
static int entries_agree(const struct agree_entry *me, uint32_t r, const struct agree_entry *other,
                         uint32_t j)
{
    return other->yes && me->bytes == other->bytes && me->dtype == other->dtype &&
           positions_match(me, r, other, j);
}

/*
 * Under the lock: whether this rank's fresh entry agrees with every entry
 * posted before it in this round, and no rank not in this round has voted
 * on this same group already (its last entry at the same pair positions:
 * that vote ended without this rank, so that rank sent the group to NCCL).
 */
static int entry_consistent(const struct shim_p2p_agree *a)
{
    const struct agree_seg *s = a->seg;
    const struct agree_entry *me = &s->e[a->rank];
    if (!me->yes || me->sent[a->rank] != me->received[a->rank])
        return 0;
    for (uint32_t j = 0; j < a->nranks; j++) {
        const struct agree_entry *other = &s->e[j];
        if (j == a->rank)
            continue;
        if (s->posted_mask & rank_bit(j)) {
            if (!entries_agree(me, a->rank, other, j))
                return 0;
        } else if (other->voted && positions_match(me, a->rank, other, j)) {
            return 0;
        }
    }
    return 1;
}

/*
 * Under the lock: whether some rank's last entry stands past this rank's
 * group (it has issued more operations with this rank than this rank had
 * before its group): the operation of ours that it matches is behind it, on
 * NCCL, and this group cannot run as the plan. Such a vote does not post,
 * so that the round it would spoil, a later group's, stays open; it leaves
 * its entry as its last vote, outside the round.
 */
static int group_passed(const struct shim_p2p_agree *a, const struct shim_p2p_point *p)
{
    if (!p->sent || !p->received)
        return 0;
    for (uint32_t j = 0; j < a->nranks; j++) {
        const struct agree_entry *other = &a->seg->e[j];
        if (j != a->rank && other->voted &&
            (other->received[a->rank] > p->sent[j] || other->sent[a->rank] > p->received[j]))
            return 1;
    }
    return 0;
}

/*
 * Under the lock, for a vote that does not post: whether a rank posted in
 * this round needs one of this rank's operations of this group or before
 * (they all go to NCCL now), so that the round can never commit.
 */
static int round_doomed(const struct shim_p2p_agree *a, const struct shim_p2p_point *p)
{
    const struct agree_seg *s = a->seg;
    for (uint32_t j = 0; j < a->nranks; j++) {
        const struct agree_entry *other = &s->e[j];
        if (j != a->rank && (s->posted_mask & rank_bit(j)) && other->voted &&
            (other->received[a->rank] <= p->sent[j] || other->sent[a->rank] <= p->received[j]))
            return 1;
    }
    return 0;
}

/* Under the lock, in an undecided round: post, and decide when this entry settles the round. */
static void post_entry(struct shim_p2p_agree *a, const struct shim_p2p_point *p)
{
    struct agree_seg *s = a->seg;
    a->round = s->round;
    fill_entry(a, p, &s->e[a->rank]);
    s->posted_mask |= rank_bit(a->rank);
    if (!entry_consistent(a)) {
        decide(s, OUT_ABANDON);
        return;
    }
    if (s->posted_mask != full_mask(a->nranks))
        return;
    int dead = find_dead_poster(a);
    if (dead >= 0)
        note_dead(a, dead);
    else
        decide(s, OUT_COMMIT);
}

/* Steps 2 and 3, under the lock in an undecided round. @return 1 when this vote posted. */
static int post_or_pass(struct shim_p2p_agree *a, const struct shim_p2p_point *p)
{
    struct agree_seg *s = a->seg;
    if (s->posted_mask & rank_bit(a->rank)) {
        MSCX_WARN("internal bug: p2p agreement %s: rank %u voted twice in one round", a->name, a->rank);
        mark_broken(s);
        return 0;
    }
    if (group_passed(a, p)) {
        if (round_doomed(a, p))
            decide(s, OUT_ABANDON);
        fill_entry(a, p, &s->e[a->rank]); /* its last vote, for the ranks that come to this group */
        return 0;
    }
    post_entry(a, p);
    return 1;
}

/*
 * Steps 1 to 3: wait for a round open to posts, then post. @return 1 when
 * posted (the round's outcome is this vote's result), 0 when not.
 */
static int post(struct shim_p2p_agree *a, const struct shim_p2p_point *p, uint64_t deadline)
{
    struct agree_seg *s = a->seg;
    for (unsigned spins = 0;; back_off(&spins)) {
        if (is_broken(s) || seg_lock(a, deadline) != 0)
            return 0;
        int broken = is_broken(s);
        int open = !broken && atomic_load_explicit(&s->outcome, memory_order_acquire) == OUT_PENDING;
        int posted = open && post_or_pass(a, p);
        seg_unlock(a);
        if (broken || open)
            return posted;
        if (now_ns() >= deadline) /* the previous round is still being read by its posters */
            return 0;
    }
}

/* Every AGREE_LIVENESS_MS of waiting: a posted rank whose process is gone ends the round. */
static void check_liveness(struct shim_p2p_agree *a)
{
    if (seg_lock(a, deadline_after(1)) != 0)
        return;
    int dead = find_dead_poster(a);
    if (dead >= 0)
        note_dead(a, dead);
    seg_unlock(a);
}

/* Step 4: until the round is decided; at @p deadline this rank decides ABANDON. */
static void wait_decided(struct shim_p2p_agree *a, uint64_t deadline)
{
    struct agree_seg *s = a->seg;
    uint64_t next_check = now_ns() + AGREE_LIVENESS_MS * 1000000u;
    for (unsigned spins = 0; atomic_load_explicit(&s->outcome, memory_order_acquire) == OUT_PENDING;
         back_off(&spins)) {
        uint64_t now = now_ns();
        if (now >= deadline) {
            decide(s, OUT_ABANDON);
            MSCX_INFO(MSCX_SUB_SHIM, "p2p agreement %s: rank %u: round %llu not complete in time", a->name,
                      a->rank, (unsigned long long)a->round);
            return;
        }
        if (now >= next_check) {
            check_liveness(a);
            next_check = now + AGREE_LIVENESS_MS * 1000000u;
        }
    }
}

/* Step 5: this poster has read the outcome; the last reader opens the next round. */
static void finish_read(struct shim_p2p_agree *a)
{
    struct agree_seg *s = a->seg;
    if (seg_lock(a, deadline_after(AGREE_READ_GRACE_MS)) != 0) {
        MSCX_WARN("p2p agreement %s: rank %u: cannot take its lock to end a round", a->name, a->rank);
        atomic_store_explicit(&s->broken, 1, memory_order_release);
        return;
    }
    s->read_mask |= rank_bit(a->rank);
    if ((s->read_mask & s->posted_mask) == s->posted_mask) {
        s->posted_mask = 0;
        s->read_mask = 0;
        s->round++;
        atomic_store_explicit(&s->outcome, OUT_PENDING, memory_order_release);
    }
    seg_unlock(a);
}

int shim_p2p_agree_vote(struct shim_p2p_agree *a, const struct shim_p2p_point *p, uint64_t timeout_ms)
{
    if (!a || !p)
        return 0;
    uint64_t deadline = deadline_after(timeout_ms);
    if (!seg_ready(a, deadline) || !post(a, p, deadline))
        return 0;
    wait_decided(a, deadline);
    uint32_t out = atomic_load_explicit(&a->seg->outcome, memory_order_acquire);
    finish_read(a);
    return out == OUT_COMMIT;
}

/* ---- open, close ---- */

/*
 * Whether the segment @p s (mapped from /dev/shm) was left by processes
 * that are all gone: every rank that opened it recorded its pid there, in
 * this PID namespace, and none of them is alive. A segment of a live
 * communicator, of another namespace, or whose openers are not all known
 * is never taken for stale.
 */
static int seg_stale(const struct agree_seg *s, uint64_t pidns)
{
    if (atomic_load_explicit(&s->init, memory_order_acquire) != INIT_READY || s->magic != AGREE_MAGIC ||
        s->version != AGREE_VERSION || s->nranks == 0 || s->nranks > SHIM_P2P_AGREE_MAX_RANKS)
        return 0;
    uint64_t opened = atomic_load_explicit(&s->opened, memory_order_acquire);
    if (opened == 0)
        return 0;
    for (uint32_t r = 0; r < s->nranks; r++) {
        if (!(opened & rank_bit(r)))
            continue;
        const struct agree_entry *e = &s->e[r];
        if (e->opener <= 0 || e->opener_ns == 0 || e->opener_ns != pidns)
            return 0;
        if (e->opener == (int64_t)getpid() || kill((pid_t)e->opener, 0) == 0 || errno != ESRCH)
            return 0;
    }
    return 1;
}

/*
 * Remove the agreement segments that processes of this user left behind
 * when they died between creating one and the last rank's open (the name
 * goes once every rank has it mapped). A segment changed in the last
 * AGREE_STALE_S seconds is left alone: its communicator's other ranks may
 * still be opening it, and they would rather find its dead opener there
 * than wait for a vote that never comes. @return how many
 */
static unsigned reap_stale(void)
{
    uint64_t ns = pid_namespace();
    DIR *d = ns ? opendir("/dev/shm") : NULL;
    unsigned n = 0;
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char name[AGREE_NAME_MAX];
        struct stat sb;
        if (strncmp(de->d_name, "mscx-p2p-", 9) != 0 ||
            snprintf(name, sizeof(name), "/%s", de->d_name) >= (int)sizeof(name) ||
            fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode) ||
            sb.st_uid != geteuid() || (size_t)sb.st_size != sizeof(struct agree_seg) ||
            time(NULL) - sb.st_mtime < AGREE_STALE_S)
            continue;
        int fd = shm_open(name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0);
        void *p = fd >= 0 ? mmap(NULL, sizeof(struct agree_seg), PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        if (fd >= 0)
            close(fd);
        if (p == MAP_FAILED)
            continue;
        int stale = seg_stale(p, ns);
        munmap(p, sizeof(struct agree_seg));
        if (stale && shm_unlink(name) == 0) {
            n++;
            MSCX_INFO(MSCX_SUB_SHIM, "removed %s, left by processes that are gone", name);
        }
    }
    closedir(d);
    return n;
}

static void agree_name(const uint8_t secret[SHIM_SECRET_BYTES], char name[AGREE_NAME_MAX], uint64_t *check_p)
{
    uint64_t h = shim_fnv1a(SHIM_FNV_BASIS, secret, SHIM_SECRET_BYTES);
    static const uint8_t salt[] = "mscx-p2p-agree-check";
    *check_p = shim_fnv1a(shim_fnv1a(SHIM_FNV_BASIS, salt, sizeof(salt)), secret, SHIM_SECRET_BYTES);
    snprintf(name, AGREE_NAME_MAX, "/mscx-p2p-%016llx", (unsigned long long)h);
}

/* Open or create the object @p name, sized for a segment. @return its fd, or -1 (logged). */
static int open_object(const char *name, uint32_t rank)
{
    int fd = shm_open(name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        MSCX_WARN("p2p agreement %s: rank %u: shm_open: %s", name, rank, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        MSCX_WARN("p2p agreement %s: rank %u: fstat: %s", name, rank, strerror(errno));
        goto err_close;
    }
    /* Every opener sizes it: growing from 0 zero-fills, the same size again changes nothing. */
    if (sb.st_size != 0 && (size_t)sb.st_size != sizeof(struct agree_seg)) {
        MSCX_WARN("p2p agreement %s: rank %u: it has %lld bytes, expected %zu", name, rank,
                  (long long)sb.st_size, sizeof(struct agree_seg));
        goto err_close;
    }
    if (ftruncate(fd, (off_t)sizeof(struct agree_seg)) != 0) {
        MSCX_WARN("p2p agreement %s: rank %u: ftruncate to %zu bytes: %s", name, rank,
                  sizeof(struct agree_seg), strerror(errno));
        goto err_close;
    }
    return fd;
err_close:
    close(fd);
    return -1;
}

mscx_status_t shim_p2p_agree_open(const uint8_t secret[SHIM_SECRET_BYTES], uint32_t rank, uint32_t nranks,
                                  struct shim_p2p_agree **a_p)
{
    if (!secret || !a_p || nranks == 0 || rank >= nranks)
        return MSCX_ERR_INVALID_ARG;
    if (nranks > SHIM_P2P_AGREE_MAX_RANKS)
        return MSCX_ERR_UNSUPPORTED;
    struct shim_p2p_agree *a = calloc(1, sizeof(*a));
    if (!a)
        return MSCX_ERR_NO_MEMORY;
    a->rank = rank;
    a->nranks = nranks;
    a->pid = (int64_t)getpid();
    a->pidns = pid_namespace();
    agree_name(secret, a->name, &a->check);
    reap_stale();
    int fd = open_object(a->name, rank);
    if (fd < 0)
        goto err_free;
    void *p = mmap(NULL, sizeof(struct agree_seg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        MSCX_WARN("p2p agreement %s: rank %u: mmap: %s", a->name, rank, strerror(errno));
        close(fd);
        goto err_free;
    }
    close(fd);
    a->seg = p;
    atomic_fetch_add_explicit(&a->seg->attached, 1, memory_order_acq_rel);
    seg_init_once(a);
    a->seg->e[rank].opener = a->pid;
    a->seg->e[rank].opener_ns = a->pidns;
    uint64_t before = atomic_fetch_or_explicit(&a->seg->opened, rank_bit(rank), memory_order_acq_rel);
    if (before != full_mask(nranks) && (before | rank_bit(rank)) == full_mask(nranks))
        shm_unlink(a->name); /* every rank has it mapped: nothing is left behind when a process dies */
    *a_p = a;
    return MSCX_OK;
err_free:
    free(a);
    return MSCX_ERR_SYSTEM;
}

void shim_p2p_agree_close(struct shim_p2p_agree *a)
{
    if (!a)
        return;
    uint32_t left = atomic_fetch_sub_explicit(&a->seg->attached, 1, memory_order_acq_rel) - 1;
    munmap(a->seg, sizeof(struct agree_seg));
    if (a->rank == 0 || left == 0)
        shm_unlink(a->name); /* ENOENT when the other one already did */
    free(a);
}
