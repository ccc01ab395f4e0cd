/* SPDX-License-Identifier: MIT */
/* mscx-perf command line: nccl-tests' flags plus a few of our own. */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "perf.h"

static const char *const coll_names[PERF_COLL_COUNT] = {"allreduce", "allgather", "reducescatter",
                                                        "alltoall"};
static const char *const coll_progs[PERF_COLL_COUNT] = {"all_reduce_perf", "all_gather_perf",
                                                        "reduce_scatter_perf", "alltoall_perf"};
static const char *const type_names[PERF_TYPE_COUNT] = {"int8",   "uint8", "int32", "uint32", "int64",
                                                        "uint64", "half",  "float", "double", "bfloat16"};
static const size_t type_sizes[PERF_TYPE_COUNT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static const char *const op_names[PERF_OP_COUNT] = {"sum", "prod", "max", "min", "avg"};

const char *mscx_perf_coll_name(enum perf_coll c)
{
    return (unsigned)c < PERF_COLL_COUNT ? coll_names[c] : "unknown";
}

const char *mscx_perf_type_name(enum perf_type t)
{
    return (unsigned)t < PERF_TYPE_COUNT ? type_names[t] : "unknown";
}

const char *mscx_perf_op_name(enum perf_op op)
{
    return (unsigned)op < PERF_OP_COUNT ? op_names[op] : "none";
}

size_t mscx_perf_type_size(enum perf_type t)
{
    return (unsigned)t < PERF_TYPE_COUNT ? type_sizes[t] : 0;
}

int mscx_perf_type_is_float(enum perf_type t)
{
    return t == PERF_HALF || t == PERF_FLOAT || t == PERF_DOUBLE || t == PERF_BF16;
}

void mscx_perf_opts_default(struct perf_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->coll = PERF_ALLREDUCE;
    o->min_bytes = o->max_bytes = 32u << 20;
    o->step_bytes = 1u << 20;
    o->step_factor = 1;
    o->ngpus = 1;
    o->type_mask = 1u << PERF_FLOAT;
    o->op_mask = 1u << PERF_SUM;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->average = 1;
    o->device = -1;
}

int mscx_perf_parse_size(const char *s, uint64_t *v_p)
{
    char *end;
    unsigned long long v;
    uint64_t mul = 1;
    if (s == NULL || *s == '\0' || *s == '-')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    switch (*end) {
    case 'G':
    case 'g':
        mul = 1ull << 30;
        end++;
        break;
    case 'M':
    case 'm':
        mul = 1ull << 20;
        end++;
        break;
    case 'K':
    case 'k':
        mul = 1ull << 10;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || (v && UINT64_MAX / mul < v))
        return -1;
    *v_p = (uint64_t)v * mul;
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *v_p)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *v_p = (int)v;
    return 0;
}

static int lookup(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (strcasecmp(names[i], s) == 0)
            return i;
    return -1;
}

static int parse_one_type(const char *s, unsigned *mask_p)
{
    static const struct {
        const char *alias;
        enum perf_type t;
    } aliases[] = {
        {"int", PERF_INT32},  {"float16", PERF_HALF},   {"fp16", PERF_HALF},   {"float32", PERF_FLOAT},
        {"fp32", PERF_FLOAT}, {"float64", PERF_DOUBLE}, {"fp64", PERF_DOUBLE}, {"bf16", PERF_BF16},
    };
    int t;
    if (strcasecmp(s, "all") == 0) {
        *mask_p |= (1u << PERF_TYPE_COUNT) - 1;
        return 0;
    }
    t = lookup(type_names, PERF_TYPE_COUNT, s);
    for (size_t i = 0; t < 0 && i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcasecmp(aliases[i].alias, s) == 0)
            t = (int)aliases[i].t;
    if (t < 0)
        return -1;
    *mask_p |= 1u << t;
    return 0;
}

/* One type, "all", or a comma list of types. */
static int parse_type(const char *s, unsigned *mask_p)
{
    char buf[256], *save = NULL;
    unsigned mask = 0;
    snprintf(buf, sizeof(buf), "%s", s);
    if (*s == '\0')
        return -1;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (parse_one_type(t, &mask))
            return -1;
    if (mask == 0)
        return -1;
    *mask_p = mask;
    return 0;
}

static int parse_coll(const char *s, enum perf_coll *c_p)
{
    static const char *const alt[PERF_COLL_COUNT] = {"all_reduce", "all_gather", "reduce_scatter",
                                                     "all_to_all"};
    int c = lookup(coll_names, PERF_COLL_COUNT, s);
    if (c < 0)
        c = lookup(alt, PERF_COLL_COUNT, s);
    if (c < 0)
        return -1;
    *c_p = (enum perf_coll)c;
    return 0;
}

void mscx_perf_usage(FILE *out, const char *prog)
{
    fprintf(
        out,
        "usage: %s [options]\n"
        "  -b, --minbytes SIZE     smallest message (K/M/G suffixes; default 32M)\n"
        "  -e, --maxbytes SIZE     largest message (default 32M)\n"
        "  -f, --stepfactor N      multiply the size by N each step\n"
        "  -i, --stepbytes SIZE    add SIZE each step when -f is 1 (default 1M)\n"
        "  -g, --ngpus N           GPUs per process (only 1: one process per GPU)\n"
        "  -d, --datatype T        int8 uint8 int32 uint32 int64 uint64 half float double bfloat16, all,\n"
        "                          or a comma list\n"
        "  -o, --op OP             sum prod max min avg all; or a collective name (as --coll)\n"
        "  -n, --iters N           timed iterations (default 20)\n"
        "  -w, --warmup_iters N    warm-up iterations (default 5)\n"
        "  -c, --check 0|1         check results with exact-arithmetic inputs (default 1)\n"
        "  -G, --cudagraph N       capture the iterations in a CUDA graph, launch it N times\n"
        "  -a, --average 0-3       report time of rank 0, the average, minimum or maximum (default 1)\n"
        "      --coll C            allreduce allgather reducescatter alltoall (or run as all_reduce_perf "
        "...)\n"
        "      --nproc N           fork N ranks on this host (else mpirun/PMI environment, else 1)\n"
        "      --device D          CUDA device of local rank 0 (default: local rank)\n"
        "      --bootstrap-dir DIR shared directory for the unique id exchange\n"
        "      --json FILE         write the results as JSON\n"
        "      --progress          progress line on stderr (default when stderr is a terminal)\n"
        "      --executor N        N ranks on one GPU through the mscx executor (no NCCL)\n"
        "      --plan FILE         plan for --executor at every size (default: per size, the plan of\n"
        "                          MSCX_PLAN_DIR for the collective, rank count and size; n/a if none)\n"
        "      --baseline          with --executor: run the hand-written kernel of each size's plan's\n"
        "                          algorithm (allreduce; oneshot, twophase) instead of the executor;\n"
        "                          sizes, types and reductions it cannot run print n/a\n"
        "      --nccl-window       NCCL backend: buffers from ncclMemAlloc registered with\n"
        "                          ncclCommWindowRegister (NCCL_WIN_COLL_SYMMETRIC) where NCCL has it\n"
        "  -h, --help              this text\n",
        prog);
}

enum {
    OPT_COLL = 256,
    OPT_NPROC,
    OPT_JSON,
    OPT_PROGRESS,
    OPT_EXECUTOR,
    OPT_PLAN,
    OPT_BOOT,
    OPT_DEVICE,
    OPT_BASELINE,
    OPT_NCCL_WINDOW
};

static const struct option long_opts[] = {
    {"minbytes", required_argument, NULL, 'b'},
    {"maxbytes", required_argument, NULL, 'e'},
    {"stepfactor", required_argument, NULL, 'f'},
    {"stepbytes", required_argument, NULL, 'i'},
    {"ngpus", required_argument, NULL, 'g'},
    {"datatype", required_argument, NULL, 'd'},
    {"op", required_argument, NULL, 'o'},
    {"iters", required_argument, NULL, 'n'},
    {"warmup_iters", required_argument, NULL, 'w'},
    {"check", required_argument, NULL, 'c'},
    {"cudagraph", required_argument, NULL, 'G'},
    {"average", required_argument, NULL, 'a'},
    {"help", no_argument, NULL, 'h'},
    {"coll", required_argument, NULL, OPT_COLL},
    {"nproc", required_argument, NULL, OPT_NPROC},
    {"json", required_argument, NULL, OPT_JSON},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"executor", required_argument, NULL, OPT_EXECUTOR},
    {"plan", required_argument, NULL, OPT_PLAN},
    {"bootstrap-dir", required_argument, NULL, OPT_BOOT},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"baseline", no_argument, NULL, OPT_BASELINE},
    {"nccl-window", no_argument, NULL, OPT_NCCL_WINDOW},
    {NULL, 0, NULL, 0},
};

#define BAD(...)                                                                                             \
    do {                                                                                                     \
        snprintf(err, errlen, __VA_ARGS__);                                                                  \
        return -1;                                                                                           \
    } while (0)

/* The collective a program named like nccl-tests' (all_reduce_perf, ...) runs. */
static void coll_from_prog(int argc, char **argv, struct perf_opts *o)
{
    const char *base = argc > 0 && argv[0] ? strrchr(argv[0], '/') : NULL;
    base = base ? base + 1 : (argc > 0 && argv[0] ? argv[0] : "");
    for (int k = 0; k < PERF_COLL_COUNT; k++)
        if (strcmp(base, coll_progs[k]) == 0)
            o->coll = (enum perf_coll)k;
}

/* Apply one of our own options, or report a bad one; as set_option. */
static int set_own_option(int c, char **argv, struct perf_opts *o, char *err, size_t errlen)
{
    switch (c) {
    case OPT_COLL:
        if (parse_coll(optarg, &o->coll))
            BAD("unknown collective '%s' (allreduce, allgather, reducescatter, alltoall)", optarg);
        break;
    case OPT_NPROC:
        if (parse_int(optarg, 1, 1024, &o->nproc))
            BAD("bad process count for --nproc: '%s'", optarg);
        break;
    case OPT_EXECUTOR:
        if (parse_int(optarg, 1, 1024, &o->executor_nranks))
            BAD("bad rank count for --executor: '%s'", optarg);
        break;
    case OPT_DEVICE:
        if (parse_int(optarg, 0, 1023, &o->device))
            BAD("bad device for --device: '%s'", optarg);
        break;
    case OPT_JSON:
        o->json_path = optarg;
        break;
    case OPT_PLAN:
        o->plan_path = optarg;
        break;
    case OPT_BOOT:
        o->boot_dir = optarg;
        break;
    case OPT_PROGRESS:
        o->progress = 1;
        break;
    case OPT_BASELINE:
        o->baseline = 1;
        break;
    case OPT_NCCL_WINDOW:
        o->nccl_window = 1;
        break;
    case 'h':
        o->help = 1;
        break;
    case ':':
        BAD("option '%s' needs a value", argv[optind - 1]);
    default:
        BAD("unknown option '%s'", argv[optind - 1]);
    }
    return 0;
}

/* Apply option @p c, one of nccl-tests' (its value in optarg); @return 0, or -1 with the reason in @p err. */
static int set_option(int c, char **argv, struct perf_opts *o, char *err, size_t errlen)
{
    int v;
    uint64_t sz;
    switch (c) {
    case 'b':
        if (mscx_perf_parse_size(optarg, &o->min_bytes))
            BAD("bad size for -b: '%s'", optarg);
        break;
    case 'e':
        if (mscx_perf_parse_size(optarg, &o->max_bytes))
            BAD("bad size for -e: '%s'", optarg);
        break;
    case 'f':
        if (mscx_perf_parse_size(optarg, &sz) || sz == 0)
            BAD("bad step factor for -f: '%s' (a whole number >= 1)", optarg);
        o->step_factor = sz;
        break;
    case 'i':
        if (mscx_perf_parse_size(optarg, &o->step_bytes) || o->step_bytes == 0)
            BAD("bad step size for -i: '%s'", optarg);
        break;
    case 'g':
        if (parse_int(optarg, 1, 1, &o->ngpus))
            BAD("-g '%s': only one GPU per process is supported; start one process per GPU", optarg);
        break;
    case 'd':
        if (parse_type(optarg, &o->type_mask))
            BAD("unknown data type '%s'", optarg);
        break;
    case 'o':
        if (strcasecmp(optarg, "all") == 0)
            o->op_mask = (1u << PERF_OP_COUNT) - 1;
        else if ((v = lookup(op_names, PERF_OP_COUNT, optarg)) >= 0)
            o->op_mask = 1u << v;
        else if (parse_coll(optarg, &o->coll))
            BAD("unknown reduction or collective '%s'", optarg);
        break;
    case 'n':
        if (parse_int(optarg, 1, 1 << 30, &o->iters))
            BAD("bad iteration count for -n: '%s'", optarg);
        break;
    case 'w':
        if (parse_int(optarg, 0, 1 << 30, &o->warmup))
            BAD("bad warm-up count for -w: '%s'", optarg);
        break;
    case 'c':
        if (parse_int(optarg, 0, 1, &o->check))
            BAD("bad value for -c: '%s' (0 or 1)", optarg);
        break;
    case 'G':
        if (parse_int(optarg, 0, 1 << 20, &o->graph_iters))
            BAD("bad CUDA graph count for -G: '%s'", optarg);
        break;
    case 'a':
        if (parse_int(optarg, 0, 3, &o->average))
            BAD("bad value for -a: '%s' (0 rank 0, 1 average, 2 minimum, 3 maximum)", optarg);
        break;
    default:
        return set_own_option(c, argv, o, err, errlen);
    }
    return 0;
}

/* Options that contradict each other; what some of them imply. @return 0, or -1 with the reason in @p err. */
static int check_options(struct perf_opts *o, char *err, size_t errlen)
{
    if (o->min_bytes > o->max_bytes)
        BAD("-b %llu is larger than -e %llu", (unsigned long long)o->min_bytes,
            (unsigned long long)o->max_bytes);
    if (o->baseline && o->nproc)
        BAD("--baseline runs the hand-written kernel for all --executor N ranks in one process; "
            "it cannot be combined with --nproc");
    if (o->baseline && !o->executor_nranks)
        BAD("--baseline needs --executor N (the N ranks on one GPU it runs)");
    if (o->baseline && o->coll != PERF_ALLREDUCE)
        BAD("--baseline has hand-written kernels for allreduce only, not %s", coll_names[o->coll]);
    if (o->nccl_window && o->executor_nranks)
        BAD("--nccl-window registers the NCCL backend's buffers; it cannot be combined with --executor");
    if (o->executor_nranks && o->nproc)
        BAD("--executor runs all ranks in one process; it cannot be combined with --nproc");
    if (o->coll != PERF_ALLREDUCE && o->coll != PERF_REDUCESCATTER)
        o->op_mask = 1u << PERF_SUM; /* printed as "none" */
    if (o->op_mask & (1u << PERF_AVG)) {
        const unsigned fmask =
            (1u << PERF_HALF) | (1u << PERF_FLOAT) | (1u << PERF_DOUBLE) | (1u << PERF_BF16);
        if ((o->type_mask & fmask) == 0)
            BAD("-o avg needs a floating-point data type");
    }
    return 0;
}

int mscx_perf_args_parse(int argc, char **argv, struct perf_opts *o, char *err, size_t errlen)
{
    int c;

    mscx_perf_opts_default(o);
    coll_from_prog(argc, argv, o);
    optind = 0; /* full reset: the parser may run more than once per process */
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":b:e:f:i:g:d:o:n:w:c:G:a:h", long_opts, NULL)) != -1)
        if (set_option(c, argv, o, err, errlen))
            return -1;
    if (optind < argc)
        BAD("unexpected argument '%s'", argv[optind]);
    return check_options(o, err, errlen);
}
