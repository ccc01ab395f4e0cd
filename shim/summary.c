/* SPDX-License-Identifier: MIT */
/*
 * The routing summary file (MSCX_SUMMARY_FILE): a JSON list with one object
 * per communicator of this process, added at its destroy/abort, and at exit
 * for communicators never destroyed. The format is the one
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
 * The first object of the process makes a new file (mkstemp beside it, then
 * rename); each later one is appended in place, so memory and the bytes
 * written per destroy stay the same however many communicators the process
 * makes. A path that is a symbolic link is refused. Nothing runs at load
 * time and the exit hook is registered by the first communicator setup.
 * The pid of the process that loaded the shim is recorded at load: a child
 * forked from it (a DataLoader worker) inherits its communicators and exit
 * hook, but writes no summary at all; a program exec'd under the preload is
 * a new owner.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm_int.h"
#include "mscx/fork.h"
#include "mscx/log.h"

static pthread_mutex_t sum_lock = PTHREAD_MUTEX_INITIALIZER;

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
static char *comm_json(const struct shim_stats *s, const void *comm, uint32_t rank, uint32_t nranks,
                       const char *at)
{
    struct sbuf b = {0};
    uint64_t routed = 0, total[SHIM_WHY_COUNT] = {0};
    for (int k = 0; k < SHIM_NSTAT_COLL; k++)
        for (int bk = 0; bk < SHIM_NBUCKETS; bk++)
            for (int w = 0; w < SHIM_WHY_COUNT; w++)
                total[w] += s->counts[k][bk][w];
    routed = total[SHIM_WHY_ROUTED];
    sb_printf(
        &b,
        "{\"comm\": \"%p\", \"rank\": %u, \"nranks\": %u, \"at\": \"%s\", \"routed\": %llu, \"fallback\": ",
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

/* Write all of @p n bytes at @p off. @return 0 or -1 */
static int pwrite_all(int fd, const char *p, size_t n, off_t off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

/*
 * A new file at @p path holding the list [@p objs]: written to a fresh
 * mkstemp file beside it, then renamed over it, so that a reader never sees
 * half of it and nothing is written through a link. @return 0 or -1
 */
static int file_create(const char *path, const char *objs)
{
    char tmp[PATH_MAX + 8];
    if (snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path) >= (int)sizeof(tmp))
        return -1;
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t n = strlen(objs);
    int ok = fchmod(fd, 0644) == 0 && pwrite_all(fd, "[", 1, 0) == 0 && pwrite_all(fd, objs, n, 1) == 0 &&
             pwrite_all(fd, "]\n", 2, (off_t)n + 1) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/*
 * Append @p objs to the list in this process's file @p path: the closing
 * "]\n" is overwritten by ",\n" @p objs "]\n", so the file stays one JSON
 * list and each destroy costs one object's bytes. Only a regular file of
 * ours that ends the list is extended. @return 0, or -1 when it is not there
 * or not such a file
 */
static int file_append(const char *path, const char *objs)
{
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat sb;
    char tail[2];
    int ok = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() && sb.st_size >= 3 &&
             pread(fd, tail, 2, sb.st_size - 2) == 2 && tail[0] == ']' && tail[1] == '\n';
    if (ok) {
        size_t n = strlen(objs);
        off_t at = sb.st_size - 2;
        ok = pwrite_all(fd, ",\n", 2, at) == 0 && pwrite_all(fd, objs, n, at + 2) == 0 &&
             pwrite_all(fd, "]\n", 2, at + 2 + (off_t)n) == 0;
    }
    close(fd);
    return ok ? 0 : -1;
}

/* @return 1 when @p path is a symbolic link (refused, with a WARN) */
static int refuse_link(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode))
        return 0;
    shim_warn_once("summary-link", "mscx: MSCX_SUMMARY_FILE %s is a symbolic link; no summary written", path);
    return 1;
}

/*
 * Add @p objs (one or more comma-separated objects) to this process's file.
 * The first write of the process makes a new file; later ones append. The
 * file moves with its rank suffix when a larger communicator comes. Called
 * with sum_lock held.
 */
static void write_objs(const char *objs)
{
    const struct mscx_config *cfg = shim_config();
    char path[PATH_MAX];
    if (!cfg || !cfg->summary_file[0] || !objs || !objs[0])
        return;
    if (file_name(cfg->summary_file, path, sizeof(path)) != 0) {
        shim_warn_once("summary-name", "mscx: MSCX_SUMMARY_FILE %s is too long; no summary written",
                       cfg->summary_file);
        return;
    }
    if (refuse_link(path))
        return;
    if (file_written[0] && strcmp(file_written, path) != 0 && rename(file_written, path) != 0)
        file_written[0] = '\0'; /* the old file is gone: start a new one */
    int done = file_written[0] && file_append(path, objs) == 0;
    if (!done && file_create(path, objs) != 0) {
        shim_warn_once("summary-write", "mscx: cannot write the routing summary %s: %s", path,
                       strerror(errno));
        return;
    }
    snprintf(file_written, sizeof(file_written), "%s", path);
}

struct json_list {
    char *text;
    size_t len;
};

static void append_json(void *obj, void *ctx)
{
    const struct shim_comm *c = obj;
    struct json_list *l = ctx;
    struct shim_stats snap;
    shim_stats_snapshot(c, &snap);
    char *one = shim_summary_json(&snap, c->comm, c->rank, c->nranks, "exit");
    char *q = one ? realloc(l->text, l->len + strlen(one) + 3) : NULL;
    if (q) {
        l->text = q;
        l->len += (size_t)sprintf(l->text + l->len, "%s%s", l->len ? ",\n" : "", one);
    }
    free(one);
}

/*
 * At exit: the communicators never destroyed. Reads counters only; the
 * table keeps every object it lists, with its reference, while it lists them.
 */
static char *live_json(void)
{
    struct json_list l = {NULL, 0};
    shim_table_each(append_json, &l);
    return l.text;
}

static void at_exit(void)
{
    if (!is_owner())
        return;
    char *live = live_json();
    pthread_mutex_lock(&sum_lock);
    write_objs(live);
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

char *shim_summary_json(const struct shim_stats *s, const void *comm, uint32_t rank, uint32_t nranks,
                        const char *at)
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
    write_objs(obj);
    pthread_mutex_unlock(&sum_lock);
    free(obj);
}
