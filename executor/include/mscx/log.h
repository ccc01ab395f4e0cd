/* SPDX-License-Identifier: MIT */
/**
 * @file log.h
 * The one logger of mscx. Level and subsystem mask come from MSCX_DEBUG and
 * MSCX_DEBUG_SUBSYS (see env.h); the level is tested before any formatting.
 *
 * Message style: lower case, no '=', searchable values. Prefix the fault
 * owner where it is known: "plan bug:", "caller bug:", "internal bug:".
 */
#ifndef MSCX_LOG_H
#define MSCX_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

enum mscx_log_level {
    MSCX_LOG_NONE = 0,
    MSCX_LOG_VERSION = 1,
    MSCX_LOG_WARN = 2,
    MSCX_LOG_INFO = 3,
    MSCX_LOG_TRACE = 4,
};

enum mscx_log_subsys {
    MSCX_SUB_INIT = 1u << 0,
    MSCX_SUB_ENV = 1u << 1,
    MSCX_SUB_PLAN = 1u << 2,
    MSCX_SUB_EXEC = 1u << 3,
    MSCX_SUB_KERNEL = 1u << 4,
    MSCX_SUB_IPC = 1u << 5,
    MSCX_SUB_PROXY = 1u << 6,
    MSCX_SUB_IB = 1u << 7,
    MSCX_SUB_SHIM = 1u << 8,
    MSCX_SUB_NET = 1u << 9,
    MSCX_SUB_ALL = 0x3ffu,
};

/**
 * A replaceable log sink. @p msg is the fully formatted line without the
 * trailing newline.
 */
typedef void (*mscx_log_handler_fn)(enum mscx_log_level level, unsigned subsys, const char *file, int line,
                                    const char *msg, void *ctx);

/**
 * Replace the log sink; NULL restores the default (stderr or MSCX_DEBUG_FILE).
 * @param fn  the new handler or NULL
 * @param ctx passed back to @p fn
 */
void mscx_log_set_handler(mscx_log_handler_fn fn, void *ctx);

/** @return non-zero when a message of @p level for @p subsys would be emitted. */
int mscx_log_enabled(enum mscx_log_level level, unsigned subsys);

/** Format and emit one message. Use the macros below, which test the level first. */
void mscx_log_emit(enum mscx_log_level level, unsigned subsys, const char *file, int line, const char *fmt,
                   ...) __attribute__((format(printf, 5, 6)));

/** Set the level for this thread only to at most INFO while > 0; see MSCX_NOWARN. */
void mscx_log_nowarn_push(void);
void mscx_log_nowarn_pop(void);

#define MSCX_LOG_(lvl, sub, ...)                                                                             \
    do {                                                                                                     \
        if (mscx_log_enabled((lvl), (sub)))                                                                  \
            mscx_log_emit((lvl), (sub), __FILE__, __LINE__, __VA_ARGS__);                                    \
    } while (0)

#define MSCX_WARN(...) MSCX_LOG_(MSCX_LOG_WARN, MSCX_SUB_ALL, __VA_ARGS__)
#define MSCX_INFO(sub, ...) MSCX_LOG_(MSCX_LOG_INFO, (sub), __VA_ARGS__)
#define MSCX_TRACE(sub, ...) MSCX_LOG_(MSCX_LOG_TRACE, (sub), __VA_ARGS__)

/** Demote WARN to INFO inside the statement, for expected probe failures. */
#define MSCX_NOWARN(stmt)                                                                                    \
    do {                                                                                                     \
        mscx_log_nowarn_push();                                                                              \
        stmt;                                                                                                \
        mscx_log_nowarn_pop();                                                                               \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif /* MSCX_LOG_H */
