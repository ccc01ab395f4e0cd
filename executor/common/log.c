/* SPDX-License-Identifier: MIT */
/*
 * The logger. Formatting happens only after mscx_log_enabled() said yes, into
 * a stack buffer, and the line is written with one write(2) so that lines of
 * different threads never interleave.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mscx/env.h"
#include "mscx/fork.h"
#include "mscx/log.h"

static mscx_log_handler_fn log_handler;
static void *log_handler_ctx;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void log_fork_init(void)
{
    mscx_fork_protect(&log_lock, MSCX_FORK_LOG);
}
static int log_fd = -1;
static char log_fd_path[512];
static __thread int log_nowarn_depth;

void mscx_log_set_handler(mscx_log_handler_fn fn, void *ctx)
{
    pthread_mutex_lock(&log_lock);
    log_handler = fn;
    log_handler_ctx = ctx;
    pthread_mutex_unlock(&log_lock);
}

void mscx_log_nowarn_push(void)
{
    log_nowarn_depth++;
}

void mscx_log_nowarn_pop(void)
{
    if (log_nowarn_depth > 0)
        log_nowarn_depth--;
}

int mscx_log_enabled(enum mscx_log_level level, unsigned subsys)
{
    const struct mscx_config *cfg;
    int max_level = MSCX_LOG_WARN;
    unsigned mask = MSCX_SUB_ALL;

    mscx_status_t st = mscx_config_get_lenient(&cfg);
    if (st == MSCX_OK || st == MSCX_ERR_INVALID_ARG) {
        max_level = cfg->debug_level;
        mask = cfg->debug_subsys;
    }
    if (level == MSCX_LOG_WARN && log_nowarn_depth > 0)
        level = MSCX_LOG_INFO;
    if ((int)level > max_level)
        return 0;
    /* warnings are never filtered by subsystem */
    return level <= MSCX_LOG_WARN || (subsys & mask) != 0;
}

static const char *level_name(enum mscx_log_level level)
{
    switch (level) {
    case MSCX_LOG_WARN:
        return "WARN";
    case MSCX_LOG_INFO:
        return "INFO";
    case MSCX_LOG_TRACE:
        return "TRACE";
    default:
        return "VERSION";
    }
}

/*
 * MSCX_DEBUG_FILE cannot be opened: one WARN on stderr, written directly (the
 * log lock is held), and the log goes to stderr until the setting changes.
 */
static void log_open_failed(const char *path, const char *why)
{
    char host[64], out[1200];
    if (gethostname(host, sizeof(host)) != 0)
        strcpy(host, "?");
    host[sizeof(host) - 1] = '\0';
    int n = snprintf(out, sizeof(out),
                     "%s:%d:%ld [mscx] WARN cannot open MSCX_DEBUG_FILE %s (%s): the log goes to stderr\n",
                     host, (int)getpid(), (long)syscall(SYS_gettid), path, why);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(out))
        n = (int)sizeof(out) - 1;
    ssize_t w = write(STDERR_FILENO, out, (size_t)n);
    (void)w;
}

static int log_open_fd(void)
{
    const struct mscx_config *cfg;

    mscx_status_t st = mscx_config_get_lenient(&cfg);
    if ((st != MSCX_OK && st != MSCX_ERR_INVALID_ARG) || cfg->debug_file[0] == '\0')
        return STDERR_FILENO;
    if (strcmp(log_fd_path, cfg->debug_file) == 0)
        return log_fd >= 0 ? log_fd : STDERR_FILENO; /* opened, or failed and warned once */
    if (log_fd >= 0)
        close(log_fd);
    /* %h and %p expand to host name and pid, as NCCL_DEBUG_FILE does */
    char path[512];
    size_t o = 0;
    for (const char *p = cfg->debug_file; *p && o + 64 < sizeof(path); p++) {
        if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%d", (int)getpid());
            p++;
        } else if (p[0] == '%' && p[1] == 'h') {
            char host[64];
            if (gethostname(host, sizeof(host)) != 0)
                strcpy(host, "unknown");
            host[sizeof(host) - 1] = '\0';
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%s", host);
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o] = '\0';
    /* never through a symbolic link: in a shared directory it could point anywhere */
    log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0644);
    snprintf(log_fd_path, sizeof(log_fd_path), "%s", cfg->debug_file);
    if (log_fd < 0)
        log_open_failed(path, errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    return log_fd >= 0 ? log_fd : STDERR_FILENO;
}

void mscx_log_emit(enum mscx_log_level level, unsigned subsys, const char *file, int line, const char *fmt,
                   ...)
{
    char msg[1536];
    va_list ap;

    if (level == MSCX_LOG_WARN && log_nowarn_depth > 0)
        level = MSCX_LOG_INFO;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&log_lock);
    if (log_handler) {
        mscx_log_handler_fn fn = log_handler;
        void *ctx = log_handler_ctx;
        pthread_mutex_unlock(&log_lock);
        fn(level, subsys, file, line, msg, ctx);
        return;
    }
    int fd = log_open_fd();
    pthread_mutex_unlock(&log_lock);

    char host[64];
    if (gethostname(host, sizeof(host)) != 0)
        strcpy(host, "?");
    host[sizeof(host) - 1] = '\0';
    char out[1800];
    int n = snprintf(out, sizeof(out), "%s:%d:%ld [mscx] %s %s\n", host, (int)getpid(),
                     (long)syscall(SYS_gettid), level_name(level), msg);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(out))
        n = (int)sizeof(out) - 1;
    ssize_t w = write(fd, out, (size_t)n);
    (void)w;
}
