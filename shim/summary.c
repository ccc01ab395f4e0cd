/* SPDX-License-Identifier: MIT */
/*
 * The routing summary file (MSCX_SUMMARY_FILE): a JSON list with one object
 * per communicator of this process, rewritten whole at every destroy/abort and
 * once at exit for communicators never destroyed. The format is the one
 * tools/ab/mscx-ab parses:
 *
 *   [{"comm": "0x...", "rank": 0, "nranks": 1, "at": "destroy",
 *     "routed": 12, "fallback": {"size": 3},
 *     "buckets": [{"coll": "allreduce", "bucket": "<=1K", "max_bytes": 1024,
 *                  "routed": 12, "fallback": {}}, ...],
 *     "plans": [{"plan": "allreduce_n1_rpn1_copy_1K_4M", "coll": "allreduce",
 *                "min_bytes": 1024, "max_bytes": 4194304, "calls": 12}],
 *     "plans_omitted": 0}]
 *
 * "plans" names every plan that ran calls of the communicator (the first
 * SHIM_NSTAT_PLANS of them; "plans_omitted" counts the others).
 *
 * The file name gets ".<rank>" appended (the rank in the largest communicator
 * this process has seen), unless it contains "%p", which becomes the pid.
 * Writing is a small fopen/fprintf/rename; nothing runs at load time and the
 * exit hook is registered by the first communicator setup. The pid of the
 * process that loaded the shim is recorded at load: a child forked from it
 * (a DataLoader worker) inherits its communicators and exit hook, but writes
 * no summary at all; a program exec'd under the preload is a new owner.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mscx/fork.h"
#include "mscx/log.h"
#include "shim_int.h"

static pthread_mutex_t sum_lock = PTHREAD_MUTEX_INITIALIZER;

static char *done_json;         /* objects of finished communicators, comma separated */
static size_t done_len, done_cap;
static uint32_t file_rank, file_nranks;
static char file_written[PATH_MAX];
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static pid_t owner_pid; /* the process that loaded the shim: the only one that writes */

/* Non-zero in the process that loaded the shim, zero in a child forked from it. */
static int is_owner(void)
{
    return owner_pid == getpid();
}

__attribute__((constructor)) static void summary_fork_init(void)
{
    owner_pid = getpid();
    mscx_fork_protect(&sum_lock, MSCX_FORK_SHIM_SUMMARY);
}

struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        if (b->oom)
            return;
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* @p len bytes of @p str as a JSON string: quotes, backslashes and control bytes escaped. */
static void json_str(struct sbuf *b, const char *str, size_t len)
{
    sb_printf(b, "\"");
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)str[i];
        if (ch == '"' || ch == '\\')
            sb_printf(b, "\\%c", ch);
        else if (ch < 0x20)
            sb_printf(b, "\\u%04x", ch);
        else
            sb_printf(b, "%c", ch);
    }
    sb_printf(b, "\"");
}

static void reasons_json(struct sbuf *b, const uint64_t *why)
{
    int first = 1;
    sb_printf(b, "{");
    for (int w = 1; w < SHIM_WHY_COUNT; w++)
        if (why[w]) {
            sb_printf(b, "%s\"%s\": %llu", first ? "" : ", ", shim_reason_name((enum shim_reason)w),
                      (unsigned long long)why[w]);
            first = 0;
        }
    sb_printf(b, "}");
}

/* One communicator's object. @return malloc'd text or NULL. */
static char *comm_json(const struct shim_stats *s, const void *comm, uint32_t rank, uint32_t nranks, const char *at)
{
    struct sbuf b = {0};
    uint64_t routed = 0, total[SHIM_WHY_COUNT] = {0};
    for (int k = 0; k < SHIM_NSTAT_COLL; k++)
        for (int bk = 0; bk < SHIM_NBUCKETS; bk++)
            for (int w = 0; w < SHIM_WHY_COUNT; w++)
                total[w] += s->counts[k][bk][w];
    routed = total[SHIM_WHY_ROUTED];
    sb_printf(&b, "{\"comm\": \"%p\", \"rank\": %u, \"nranks\": %u, \"at\": \"%s\", \"routed\": %llu, \"fallback\": ",
              comm, rank, nranks, at, (unsigned long long)routed);
    reasons_json(&b, total);
    sb_printf(&b, ", \"buckets\": [");
    int first = 1;
    for (int k = 0; k < SHIM_NSTAT_COLL; k++)
        for (int bk = 0; bk < SHIM_NBUCKETS; bk++) {
            const uint64_t *why = s->counts[k][bk];
            uint64_t any = 0;
            for (int w = 0; w < SHIM_WHY_COUNT; w++)
                any += why[w];
            if (!any)
                continue;
            sb_printf(&b, "%s\n  {\"coll\": \"%s\", \"bucket\": \"%s\", ", first ? "" : ",",
                      mscx_coll_name((enum mscx_coll)k), shim_bucket_name(bk));
            if (bk < SHIM_NBUCKETS - 1)
                sb_printf(&b, "\"max_bytes\": %llu, ", (unsigned long long)shim_bucket_limit(bk));
            sb_printf(&b, "\"routed\": %llu, \"fallback\": ", (unsigned long long)why[SHIM_WHY_ROUTED]);
            reasons_json(&b, why);
            sb_printf(&b, "}");
            first = 0;
        }
    sb_printf(&b, "], \"plans\": [");
    for (size_t i = 0; i < s->nplans; i++) {
        const struct shim_plan_use *u = &s->plans[i];
        sb_printf(&b, "%s\n  {\"plan\": ", i ? "," : "");
        json_str(&b, u->name, u->name_len);
        sb_printf(&b, ", \"coll\": \"%s\", \"min_bytes\": %llu, \"max_bytes\": %llu, \"calls\": %llu}",
                  mscx_coll_name(u->coll), (unsigned long long)u->min_bytes, (unsigned long long)u->max_bytes,
                  (unsigned long long)u->calls);
    }
    sb_printf(&b, "], \"plans_omitted\": %zu}", s->plans_omitted);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* The file name for this process. @return 0, or -1 when too long. */
static int file_name(const char *pattern, char *out, size_t len)
{
    const char *pp = strstr(pattern, "%p");
    int n;
    if (pp)
        n = snprintf(out, len, "%.*s%ld%s", (int)(pp - pattern), pattern, (long)getpid(), pp + 2);
    else
        n = snprintf(out, len, "%s.%u", pattern, file_rank);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* Rewrite the file with the finished objects plus @p extra (may be NULL). Called with sum_lock held. */
static void write_file(const char *extra)
{
    const struct mscx_config *cfg = shim_config();
    char path[PATH_MAX], tmp[PATH_MAX + 16];
    if (!cfg || !cfg->summary_file[0])
        return;
    if (file_name(cfg->summary_file, path, sizeof(path)) != 0) {
        shim_warn_once("summary-name", "mscx: MSCX_SUMMARY_FILE %s is too long; no summary written",
                       cfg->summary_file);
        return;
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        shim_warn_once("summary-open", "mscx: cannot write the routing summary %s", tmp);
        return;
    }
    int sep = done_len > 0 && extra && extra[0];
    fprintf(f, "[%s%s%s]\n", done_json ? done_json : "", sep ? ",\n" : "", extra ? extra : "");
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        shim_warn_once("summary-write", "mscx: cannot write the routing summary %s", path);
        unlink(tmp);
        return;
    }
    if (file_written[0] && strcmp(file_written, path) != 0)
        unlink(file_written); /* the rank suffix changed: a larger communicator came later */
    snprintf(file_written, sizeof(file_written), "%s", path);
}


static void at_exit(void)
{
    if (!is_owner())
        return;
    char *live = shim_comm_live_json();
    pthread_mutex_lock(&sum_lock);
    if (done_len || (live && live[0]))
        write_file(live);
    pthread_mutex_unlock(&sum_lock);
    free(live);
}

static void register_exit(void)
{
    atexit(at_exit);
}

void shim_summary_note_comm(uint32_t rank, uint32_t nranks)
{
    const struct mscx_config *cfg = shim_config();
    if (!cfg || !cfg->summary_file[0])
        return;
    pthread_once(&exit_once, register_exit);
    if (!is_owner())
        return;
    pthread_mutex_lock(&sum_lock);
    if (nranks > file_nranks) {
        file_nranks = nranks;
        file_rank = rank;
    }
    pthread_mutex_unlock(&sum_lock);
}

char *shim_summary_json(const struct shim_stats *s, const void *comm, uint32_t rank, uint32_t nranks, const char *at)
{
    return comm_json(s, comm, rank, nranks, at);
}

void shim_summary_finish(const struct shim_stats *s, const void *comm, uint32_t rank, uint32_t nranks,
                         const char *at)
{
    const struct mscx_config *cfg = shim_config();
    if (!cfg || !cfg->summary_file[0] || !is_owner())
        return;
    char *obj = comm_json(s, comm, rank, nranks, at);
    if (!obj)
        return;
    pthread_mutex_lock(&sum_lock);
    size_t n = strlen(obj), need = done_len + n + 3;
    if (need > done_cap) {
        size_t cap = done_cap ? done_cap * 2 : 4096;
        while (cap < need)
            cap *= 2;
        char *q = realloc(done_json, cap);
        if (q) {
            done_json = q;
            done_cap = cap;
        }
    }
    if (need <= done_cap) {
        done_len += (size_t)sprintf(done_json + done_len, "%s%s", done_len ? ",\n" : "", obj);
        write_file(NULL);
    }
    pthread_mutex_unlock(&sum_lock);
    free(obj);
}
