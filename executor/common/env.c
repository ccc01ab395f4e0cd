/* SPDX-License-Identifier: MIT */
/*
 * Every MSCX_* variable, in one declarative table. The table is parsed once
 * into an immutable struct mscx_config; this is the only file that reads the
 * environment (a lint test greps for getenv elsewhere). A variable that names
 * something to load (a library, the plans) is read with secure_getenv.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mscx/env.h"
#include "mscx/dev_types.h"
#include "mscx/fork.h"
#include "mscx/log.h"

enum env_type { ENV_BOOL, ENV_U64, ENV_STR, ENV_LEVEL, ENV_SUBSYS, ENV_PACKET };

struct env_var {
    const char *name;
    enum env_type type;
    const char *dflt; /* as the user would write it */
    const char *help;
    size_t offset;
};

#define CFG(f) offsetof(struct mscx_config, f)

static const struct env_var env_table[] = {
    {"MSCX_DEBUG", ENV_LEVEL, "WARN", "log level: NONE, VERSION, WARN, INFO or TRACE", CFG(debug_level)},
    {"MSCX_DEBUG_SUBSYS", ENV_SUBSYS, "ALL",
     "comma list of INIT,ENV,PLAN,EXEC,KERNEL,IPC,PROXY,IB,SHIM,NET,ALL; a leading ^ inverts",
     CFG(debug_subsys)},
    {"MSCX_DEBUG_FILE", ENV_STR, "", "write the log to this file (%h host, %p pid) instead of stderr",
     CFG(debug_file)},
    {"MSCX_PLAN_DIR", ENV_STR, "", "directory of execution plans; empty for the plans installed with mscx",
     CFG(plan_dir)},
    {"MSCX_DISABLE", ENV_BOOL, "0", "1: pure pass-through to NCCL, no CUDA calls of ours", CFG(disable)},
    {"MSCX_FORCE_FALLBACK", ENV_STR, "", "comma list of collectives kept on NCCL (allreduce,allgather,...)",
     CFG(force_fallback)},
    {"MSCX_STRICT", ENV_BOOL, "0", "1: a plan that cannot be used is an init error instead of a fallback",
     CFG(strict)},
    {"MSCX_NCCL_LIB", ENV_STR, "", "path of the real libnccl to forward to", CFG(nccl_lib)},
    {"MSCX_SUMMARY_FILE", ENV_STR, "",
     "shim: write the routing summary as JSON here at destroy/exit (.<rank> appended unless the path has %p)",
     CFG(summary_file)},
    {"MSCX_TIMEOUT_MS", ENV_U64, "0",
     "0: a collective waits for its peers as long as NCCL does (until an abort or the application's "
     "watchdog); N > 0 (opt-in): a wait of more than N ms in a kernel, the proxy or a setup exchange fails "
     "the collective with an error that stays on the communicator",
     CFG(timeout_ms)},
    {"MSCX_SIM_TIMEOUT_MS", ENV_U64, "20000", "host reference executor wait limit in ms",
     CFG(sim_timeout_ms)},
    {"MSCX_PACKET", ENV_PACKET, "auto", "packet format: auto, ll16 or ll8", CFG(packet)},
    {"MSCX_EXEC_COMPILE", ENV_BOOL, "1",
     "0: the GPU executor interprets every op (no per-size compiled program); for comparisons",
     CFG(exec_compile)},
    {"MSCX_PDL", ENV_BOOL, "1",
     "1: launch executor kernels with programmatic dependent launch (Hopper and later), so that a launch's "
     "start "
     "overlaps the end of the kernel before it on the stream; 0: plain stream order",
     CFG(pdl)},
    {"MSCX_TRACE", ENV_STR, "", "write a Chrome trace of executor ops to this path", CFG(trace)},
    {"MSCX_SCRATCH_MAX", ENV_U64, "268435456", "largest scratch buffer of one plan context, in bytes",
     CFG(scratch_max)},
    {"MSCX_IBV_SO", ENV_STR, "libibverbs.so.1", "libibverbs to dlopen", CFG(ibv_so)},
    {"MSCX_IB_HCA", ENV_STR, "", "RDMA device to use (default: the one closest to the GPU)", CFG(ib_hca)},
    {"MSCX_TRANSPORT", ENV_STR, "auto",
     "port channel transport between nodes: auto (ib when libibverbs opens and has a device, else tcp), ib "
     "or tcp",
     CFG(transport)},
    {"MSCX_SOCKET_IFNAME", ENV_STR, "",
     "network interface whose IPv4 address TCP listens on and advertises (e.g. eth0, lo); default: the first "
     "non-loopback interface that is up with an IPv4 address, else loopback",
     CFG(socket_ifname)},
    {"MSCX_VIRTUAL_NODES", ENV_U64, "0",
     "tests only: split one host's ranks into this many nodes by rank (rank / (nranks / N)); must divide the "
     "rank count; port channels between them use TCP",
     CFG(virtual_nodes)},
};

#define ENV_COUNT (sizeof(env_table) / sizeof(env_table[0]))

/* Variables that name something to load: read with secure_getenv (unset in a setuid process). */
static const char *const env_secure[] = {"MSCX_PLAN_DIR", "MSCX_NCCL_LIB", "MSCX_IBV_SO"};

static const char *env_read(const char *name)
{
    for (size_t i = 0; i < sizeof(env_secure) / sizeof(env_secure[0]); i++)
        if (strcmp(name, env_secure[i]) == 0)
            return secure_getenv(name);
    return getenv(name);
}

struct env_state {
    struct mscx_config cfg;
    char *values[ENV_COUNT]; /* owned copies of the raw strings in effect */
    char *strs[ENV_COUNT];   /* owned parsed string values */
    mscx_status_t status;
    char bad[512];
};

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void env_fork_init(void)
{
    mscx_fork_protect(&env_lock, MSCX_FORK_ENV);
}
static struct env_state *env_current;
static char *env_override_val[ENV_COUNT];
static int env_override_set[ENV_COUNT];
static atomic_int env_warned;
/* set by mscx_config_mark_degraded(); cleared when the environment is parsed again */
static atomic_int env_marked;
static char env_marked_why[512];

static int parse_bool(const char *s, int *out)
{
    if (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on"))
        *out = 1;
    else if (!strcmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off"))
        *out = 0;
    else
        return -1;
    return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int parse_level(const char *s, int *out)
{
    static const char *names[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE"};
    for (int i = 0; i < 5; i++)
        if (!strcasecmp(s, names[i])) {
            *out = i;
            return 0;
        }
    return -1;
}

static int parse_subsys(const char *s, unsigned *out)
{
    static const struct {
        const char *n;
        unsigned v;
    } names[] = {{"INIT", MSCX_SUB_INIT},   {"ENV", MSCX_SUB_ENV},       {"PLAN", MSCX_SUB_PLAN},
                 {"EXEC", MSCX_SUB_EXEC},   {"KERNEL", MSCX_SUB_KERNEL}, {"IPC", MSCX_SUB_IPC},
                 {"PROXY", MSCX_SUB_PROXY}, {"IB", MSCX_SUB_IB},         {"SHIM", MSCX_SUB_SHIM},
                 {"NET", MSCX_SUB_NET},     {"ALL", MSCX_SUB_ALL}};
    int invert = 0;
    unsigned mask = 0;
    if (*s == '^') {
        invert = 1;
        s++;
    }
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        unsigned v = 0;
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            if (strlen(names[i].n) == len && !strncasecmp(s, names[i].n, len))
                v = names[i].v;
        if (!v)
            return -1;
        mask |= v;
        s += len;
        if (*s == ',')
            s++;
    }
    *out = invert ? (MSCX_SUB_ALL & ~mask) : mask;
    return 0;
}

static int parse_packet(const char *s, int *out)
{
    if (!strcasecmp(s, "auto"))
        *out = -1;
    else if (!strcasecmp(s, "ll16"))
        *out = MSCX_PKT_LL16;
    else if (!strcasecmp(s, "ll8"))
        *out = MSCX_PKT_LL8;
    else
        return -1;
    return 0;
}

static const char *expect_text(enum env_type t)
{
    switch (t) {
    case ENV_BOOL:
        return "0 or 1";
    case ENV_U64:
        return "an unsigned integer";
    case ENV_LEVEL:
        return "NONE, VERSION, WARN, INFO or TRACE";
    case ENV_SUBSYS:
        return "a comma list of subsystem names";
    case ENV_PACKET:
        return "auto, ll16 or ll8";
    default:
        return "a string";
    }
}

#define ENV_FIELD(st, e, T) ((T *)((char *)&(st)->cfg + (e)->offset))

/* Parse one value; @return 0 or -1 */
static int env_apply(struct env_state *st, size_t i, const char *val)
{
    const struct env_var *e = &env_table[i];
    switch (e->type) {
    case ENV_BOOL:
        return parse_bool(val, ENV_FIELD(st, e, int));
    case ENV_U64:
        return parse_u64(val, ENV_FIELD(st, e, uint64_t));
    case ENV_LEVEL:
        return parse_level(val, ENV_FIELD(st, e, int));
    case ENV_SUBSYS:
        return parse_subsys(val, ENV_FIELD(st, e, unsigned));
    case ENV_PACKET:
        return parse_packet(val, ENV_FIELD(st, e, int));
    case ENV_STR:
        free(st->strs[i]);
        st->strs[i] = strdup(val);
        if (!st->strs[i])
            return -1;
        *ENV_FIELD(st, e, const char *) = st->strs[i];
        return 0;
    }
    return -1;
}

static struct env_state *env_build(void)
{
    struct env_state *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    st->status = MSCX_OK;
    for (size_t i = 0; i < ENV_COUNT; i++) {
        const struct env_var *e = &env_table[i];
        /* defaults always parse */
        if (env_apply(st, i, e->dflt) != 0) {
            st->status = MSCX_ERR_INTERNAL;
            snprintf(st->bad, sizeof(st->bad), "internal bug: default of %s does not parse", e->name);
        }
        const char *val = env_override_set[i] ? env_override_val[i] : env_read(e->name);
        if (!val)
            continue;
        st->values[i] = strdup(val);
        if (env_apply(st, i, val) != 0 && st->status == MSCX_OK) {
            st->status = MSCX_ERR_INVALID_ARG;
            snprintf(st->bad, sizeof(st->bad),
                     "bad environment value: %s '%.200s': expected %s; mscx routes nothing in this process, "
                     "every call goes to NCCL (with MSCX_STRICT=1 communicator init fails instead)",
                     e->name, val, expect_text(e->type));
            env_apply(st, i, e->dflt);
        }
    }
    return st;
}

static void env_free(struct env_state *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < ENV_COUNT; i++) {
        free(st->values[i]);
        free(st->strs[i]);
    }
    free(st);
}

static void env_init_once(void)
{
    env_current = env_build();
}

static void env_report(struct env_state *st)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&env_warned, &expected, 1))
        return;
    if (st->status != MSCX_OK) {
        MSCX_WARN("%s", st->bad);
        return;
    }
    for (size_t i = 0; i < ENV_COUNT; i++)
        if (st->values[i])
            MSCX_INFO(MSCX_SUB_ENV, "%s set by environment to %s", env_table[i].name, st->values[i]);
}

/* The state in effect, reported once. NULL on no memory. */
static struct env_state *env_state_get(void)
{
    pthread_once(&env_once, env_init_once);
    pthread_mutex_lock(&env_lock);
    struct env_state *st = env_current;
    pthread_mutex_unlock(&env_lock);
    if (st && !atomic_load(&env_warned))
        env_report(st);
    return st;
}

mscx_status_t mscx_config_get(const struct mscx_config **cfg_p)
{
    struct env_state *st = env_state_get();
    if (!st)
        return MSCX_ERR_NO_MEMORY;
    if (st->status != MSCX_OK)
        return st->status;
    *cfg_p = &st->cfg;
    return MSCX_OK;
}

mscx_status_t mscx_config_get_lenient(const struct mscx_config **cfg_p)
{
    struct env_state *st = env_state_get();
    if (!st)
        return MSCX_ERR_NO_MEMORY;
    *cfg_p = &st->cfg;
    return st->status;
}

int mscx_config_degraded(void)
{
    struct env_state *st = env_state_get();
    return !st || st->status != MSCX_OK || atomic_load_explicit(&env_marked, memory_order_acquire);
}

const char *mscx_config_degraded_reason(void)
{
    struct env_state *st = env_state_get();
    if (!st)
        return "no memory to parse the MSCX_* environment";
    if (st->status != MSCX_OK)
        return st->bad;
    return atomic_load_explicit(&env_marked, memory_order_acquire) ? env_marked_why : "";
}

void mscx_config_mark_degraded(const char *why)
{
    pthread_mutex_lock(&env_lock);
    int first = !atomic_load_explicit(&env_marked, memory_order_relaxed);
    if (first) {
        snprintf(env_marked_why, sizeof(env_marked_why), "%s", why);
        atomic_store_explicit(&env_marked, 1, memory_order_release);
    }
    pthread_mutex_unlock(&env_lock);
    if (first)
        MSCX_WARN("%s", why);
}

/*
 * Old states are kept until exit: a caller may still hold a pointer into one.
 * Overrides are for tests, so the few bytes do not matter.
 */
static struct env_state *env_retired[64];
static size_t env_nretired;

static mscx_status_t env_rebuild(void)
{
    struct env_state *st = env_build();
    if (!st)
        return MSCX_ERR_NO_MEMORY;
    pthread_mutex_lock(&env_lock);
    if (env_current && env_nretired < 64)
        env_retired[env_nretired++] = env_current;
    else
        env_free(env_current);
    env_current = st;
    atomic_store(&env_marked, 0);
    pthread_mutex_unlock(&env_lock);
    atomic_store(&env_warned, 0);
    return st->status;
}

mscx_status_t mscx_config_override(const char *name, const char *value)
{
    pthread_once(&env_once, env_init_once);
    for (size_t i = 0; i < ENV_COUNT; i++) {
        if (strcmp(env_table[i].name, name) != 0)
            continue;
        pthread_mutex_lock(&env_lock);
        free(env_override_val[i]);
        env_override_val[i] = value ? strdup(value) : NULL;
        env_override_set[i] = value != NULL;
        pthread_mutex_unlock(&env_lock);
        mscx_status_t st = env_rebuild();
        const struct mscx_config *cfg;
        if (st != MSCX_OK)
            (void)mscx_config_get(&cfg); /* reports the bad value once */
        return st;
    }
    return MSCX_ERR_INVALID_ARG;
}

void mscx_config_reset(void)
{
    pthread_once(&env_once, env_init_once);
    pthread_mutex_lock(&env_lock);
    for (size_t i = 0; i < ENV_COUNT; i++) {
        free(env_override_val[i]);
        env_override_val[i] = NULL;
        env_override_set[i] = 0;
    }
    pthread_mutex_unlock(&env_lock);
    (void)env_rebuild();
}

void mscx_config_dump(FILE *out)
{
    pthread_once(&env_once, env_init_once);
    pthread_mutex_lock(&env_lock);
    struct env_state *st = env_current;
    for (size_t i = 0; i < ENV_COUNT; i++) {
        const struct env_var *e = &env_table[i];
        fprintf(out, "%-20s default %-16s current %-16s %s\n", e->name, e->dflt[0] ? e->dflt : "\"\"",
                st && st->values[i] ? st->values[i] : "(unset)", e->help);
    }
    pthread_mutex_unlock(&env_lock);
}

const char *mscx_env_python(const char *name)
{
    static const char *const names[] = {"VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME", "HOME"};
    for (size_t i = 0; name && i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(name, names[i]) != 0)
            continue;
        const char *v = secure_getenv(name); /* where libraries are looked for */
        return v && *v ? v : NULL;
    }
    return NULL;
}

int mscx_path_relative(const char *path)
{
    return path && path[0] != '/' && strchr(path, '/') != NULL;
}
