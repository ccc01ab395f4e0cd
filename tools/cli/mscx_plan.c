/* SPDX-License-Identifier: MIT */
/*
 * mscx-plan: check, describe, fuse and simulate MSCCL++ JSON execution plans.
 * Exit status: 0 success, 1 a plan failed (check or sim), 2 bad command line
 * or unusable input (file cannot be loaded or written).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "mscx/plan.h"
#include "mscx/sim.h"

#define EXIT_BAD_ARGS 2
#define ARGS_OK (-1) /* what a command's argument parser returns when the command goes on */
#define MAX_LIST 64

static const char *prog = "mscx-plan";

static const char usage_top[] =
    "usage: mscx-plan COMMAND [ARGS...]\n"
    "Work with MSCCL++ JSON execution plans.\n"
    "\n"
    "commands:\n"
    "  check FILE...     validate plans; fail those the executors cannot run\n"
    "  show FILE         describe a plan (ranks, thread blocks, ops, scratch)\n"
    "  fuse IN [-o OUT]  apply the fusion pass and write the fused plan\n"
    "  sim FILE          run the plan on the host executor and check the results\n"
    "\n"
    "Run 'mscx-plan COMMAND --help' for the options of a command.\n";

static const char usage_check[] =
    "usage: mscx-plan check FILE...\n"
    "Load and validate each plan. Prints 'OK FILE' for a good plan, or one line\n"
    "naming the file and the reason. A plan that loads but that our executors\n"
    "refuse to run (multicast/switch operations) also fails, with the reason.\n"
    "Exit status: 0 when every plan is good, 1 otherwise.\n";

static const char usage_show[] =
    "usage: mscx-plan show FILE [--size BYTES]...\n"
    "Describe a plan: ranks, thread blocks, op counts per type, channels, and the\n"
    "scratch needed for each size (default 1K, 64K and 1M, those within the plan's\n"
    "range). Also reports how many ops the fusion pass would remove.\n"
    "Sizes accept K, M and G suffixes (powers of 1024).\n";

static const char usage_fuse[] =
    "usage: mscx-plan fuse IN [-o OUT]\n"
    "Apply the fusion pass to plan IN and write the fused plan to OUT (standard\n"
    "output without -o). The fusion statistics go to standard error.\n";

static const char usage_sim[] =
    "usage: mscx-plan sim FILE [--size BYTES]... [--dtype T] [--op OP]\n"
    "                          [--packet ll8|ll16|all] [--iters N] [--seed S]\n"
    "Run the plan on the host reference executor for every (size, dtype, op,\n"
    "packet) case and compare with the collective's definition.\n"
    "  --size BYTES   message size (the size the plan's range refers to); K/M/G\n"
    "                 suffixes; repeatable. Default: the plan's minimum, its\n"
    "                 maximum capped at 1 MiB, and an odd size in between.\n"
    "  --dtype T      fp32 (default), fp16, bf16, int32, uint32, ..., or all\n"
    "  --op OP        sum (default), prod, min, max, or all\n"
    "  --packet P     ll16 (default), ll8, or all\n"
    "  --iters N      back-to-back launches per case (default 2)\n"
    "  --seed S       input and schedule seed (default 1)\n"
    "Prints one PASS/FAIL line per case and a summary line 'N passed, M failed'.\n"
    "Exit status: 0 when every case passed, 1 otherwise.\n";

__attribute__((format(printf, 2, 3))) static int bad_args(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s %s: ", prog, cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(run '%s %s --help' for usage)\n", prog, cmd);
    return EXIT_BAD_ARGS;
}

static bool is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/* Parse "123", "64K", "1M", "2G". @return 0 on success. */
static int parse_size(const char *s, uint64_t *v_p)
{
    char *end;
    uint64_t mult = 1, v;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    if (*end == 'K' || *end == 'k')
        mult = 1024, end++;
    else if (*end == 'M' || *end == 'm')
        mult = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mult = 1024ull * 1024 * 1024, end++;
    if (*end != '\0' || (v != 0 && mult > UINT64_MAX / v))
        return -1;
    *v_p = v * mult;
    return 0;
}

static int parse_u32(const char *s, uint32_t *v_p)
{
    char *end;
    unsigned long long v;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > UINT32_MAX)
        return -1;
    *v_p = (uint32_t)v;
    return 0;
}

/* Load quietly: the tool prints the one-line reason itself. */
static struct mscx_plan *load_plan(const char *path, char *err, size_t errlen)
{
    struct mscx_plan *plan = NULL;
    mscx_status_t st;
    err[0] = '\0';
    MSCX_NOWARN(st = mscx_plan_load(path, &plan, err, errlen));
    if (st != MSCX_OK) {
        if (err[0] == '\0')
            snprintf(err, errlen, "%s", mscx_status_str(st));
        return NULL;
    }
    return plan;
}

/* Print @p err so that it names @p path. */
static void print_error(FILE *out, const char *path, const char *err)
{
    if (strstr(err, path) != NULL)
        fprintf(out, "FAIL %s\n", err);
    else
        fprintf(out, "FAIL %s: %s\n", path, err);
}

static int cmd_check(int argc, char **argv)
{
    char err[MSCX_PLAN_ERR_LEN];
    int nfiles = 0, nbad = 0;
    for (int i = 0; i < argc; i++) {
        if (is_help(argv[i])) {
            fputs(usage_check, stdout);
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1] != '\0')
            return bad_args("check", "unknown option '%s'", argv[i]);
    }
    for (int i = 0; i < argc; i++) {
        struct mscx_plan *plan = load_plan(argv[i], err, sizeof(err));
        nfiles++;
        if (plan == NULL) {
            print_error(stdout, argv[i], err);
            nbad++;
            continue;
        }
        err[0] = '\0';
        if (mscx_plan_executable(plan, err, sizeof(err)) != MSCX_OK) {
            fprintf(stdout, "FAIL %s: cannot be executed: %s\n", argv[i], err[0] ? err : "unsupported");
            nbad++;
        } else {
            fprintf(stdout, "OK %s\n", argv[i]);
        }
        mscx_plan_destroy(plan);
    }
    if (nfiles == 0)
        return bad_args("check", "%s", "no plan file given");
    return nbad ? 1 : 0;
}

static void print_stats(FILE *out, const char *what, const struct mscx_fuse_stats *s)
{
    static const char *const rule_names[MSCX_FUSE_RULE_COUNT] = {
        "repkt+cpkt", "recpkt+ppkt", "recpkt+rppkt", "rppkt+rppkt", "repkt+ppkt", "other",
    };
    fprintf(out, "%s: %" PRIu32 " ops -> %" PRIu32 " ops (%" PRIu32 " removed)", what, s->ops_before,
            s->ops_after, s->ops_before - s->ops_after);
    for (int r = 0; r < MSCX_FUSE_RULE_COUNT; r++)
        if (s->rule_hits[r])
            fprintf(out, ", %s %" PRIu32, rule_names[r], s->rule_hits[r]);
    fputc('\n', out);
}

static int cmd_show(int argc, char **argv)
{
    uint64_t sizes[MAX_LIST];
    size_t nsizes = 0;
    const char *file = NULL;
    char err[MSCX_PLAN_ERR_LEN];
    for (int i = 0; i < argc; i++) {
        if (is_help(argv[i])) {
            fputs(usage_show, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--size") == 0) {
            if (i + 1 >= argc)
                return bad_args("show", "option %s needs a value", argv[i]);
            if (nsizes == MAX_LIST)
                return bad_args("show", "too many %s options", "--size");
            if (parse_size(argv[++i], &sizes[nsizes]))
                return bad_args("show", "bad value for --size: '%s'", argv[i]);
            nsizes++;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            return bad_args("show", "unknown option '%s'", argv[i]);
        } else if (file == NULL) {
            file = argv[i];
        } else {
            return bad_args("show", "unexpected argument '%s' (one plan at a time)", argv[i]);
        }
    }
    if (file == NULL)
        return bad_args("show", "%s", "no plan file given");
    struct mscx_plan *plan = load_plan(file, err, sizeof(err));
    if (plan == NULL) {
        print_error(stderr, file, err);
        return EXIT_BAD_ARGS;
    }
    if (nsizes == 0) {
        static const uint64_t defaults[] = {1024, 64 * 1024, 1024 * 1024};
        uint64_t lo, hi;
        mscx_plan_size_range(plan, &lo, &hi);
        for (size_t k = 0; k < sizeof(defaults) / sizeof(defaults[0]); k++)
            if (defaults[k] >= lo && defaults[k] <= hi)
                sizes[nsizes++] = defaults[k];
        if (nsizes == 0)
            sizes[nsizes++] = lo;
    }
    mscx_plan_describe(plan, stdout, sizes, nsizes);

    struct mscx_plan *fused = NULL;
    struct mscx_fuse_stats stats;
    mscx_status_t st;
    MSCX_NOWARN(st = mscx_plan_fuse(plan, &fused, &stats));
    if (st == MSCX_OK)
        print_stats(stdout, "fusible", &stats);
    else
        fprintf(stdout, "fusible: fusion pass failed (%s)\n", mscx_status_str(st));
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
    return 0;
}

static int cmd_fuse(int argc, char **argv)
{
    const char *in = NULL, *out = NULL;
    char err[MSCX_PLAN_ERR_LEN];
    int rc = EXIT_BAD_ARGS;
    for (int i = 0; i < argc; i++) {
        if (is_help(argv[i])) {
            fputs(usage_fuse, stdout);
            return 0;
        }
        if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--output") == 0) {
            if (i + 1 >= argc)
                return bad_args("fuse", "option %s needs a value", argv[i]);
            out = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            return bad_args("fuse", "unknown option '%s'", argv[i]);
        } else if (in == NULL) {
            in = argv[i];
        } else {
            return bad_args("fuse", "unexpected argument '%s'", argv[i]);
        }
    }
    if (in == NULL)
        return bad_args("fuse", "%s", "no input plan given");

    struct mscx_plan *plan = load_plan(in, err, sizeof(err)), *fused = NULL;
    struct mscx_fuse_stats stats;
    char *json = NULL;
    if (plan == NULL) {
        print_error(stderr, in, err);
        return EXIT_BAD_ARGS;
    }
    if (mscx_plan_fuse(plan, &fused, &stats) != MSCX_OK) {
        fprintf(stderr, "FAIL %s: the fusion pass failed\n", in);
        rc = 1;
        goto out_plan;
    }
    if (out != NULL) {
        if (mscx_plan_save(fused, out) != MSCX_OK) {
            fprintf(stderr, "FAIL %s: cannot write %s\n", in, out);
            goto out_fused;
        }
    } else {
        if (mscx_plan_to_json(fused, &json) != MSCX_OK) {
            fprintf(stderr, "FAIL %s: cannot serialise the fused plan\n", in);
            rc = 1;
            goto out_fused;
        }
        fputs(json, stdout);
        free(json);
    }
    print_stats(stderr, in, &stats);
    rc = 0;
out_fused:
    mscx_plan_destroy(fused);
out_plan:
    mscx_plan_destroy(plan);
    return rc;
}

struct sim_opts {
    uint64_t sizes[MAX_LIST];
    size_t nsizes;
    const char *dtype, *op, *packet;
    uint32_t iters, seed;
    const char *file;
};

struct sim_tally {
    unsigned npass, nfail, nskip;
};

static uint64_t lcm_u64(uint64_t a, uint64_t b)
{
    uint64_t x = a, y = b;
    while (y) {
        uint64_t t = x % y;
        x = y;
        y = t;
    }
    return a / x * b;
}

/* The plan's minimum, maximum capped at 1 MiB, and an odd number of elements in between. */
static size_t default_sizes(const struct mscx_plan *plan, uint64_t *sizes)
{
    /* whole elements of any dtype on every rank, in a count the plan's chunks accept */
    uint64_t lo, hi, unit = 8ull * lcm_u64(mscx_plan_nranks(plan), mscx_plan_elem_multiple(plan));
    size_t n = 0;
    mscx_plan_size_range(plan, &lo, &hi);
    if (hi > (1u << 20))
        hi = lo > (1u << 20) ? lo : (1u << 20);
    if (lo == 0)
        lo = unit;
    lo = (lo + unit - 1) / unit * unit;
    hi = hi / unit * unit;
    if (lo > hi)
        return 0;
    sizes[n++] = lo;
    if (hi != lo)
        sizes[n++] = hi;
    uint64_t k = ((lo + hi) / 2 / unit) | 1;
    while (k * unit > hi && k > 2)
        k -= 2;
    if (k * unit >= lo && k * unit <= hi && k * unit != lo && k * unit != hi)
        sizes[n++] = k * unit;
    return n;
}

static bool coll_reduces(enum mscx_coll c)
{
    return c == MSCX_COLL_ALLREDUCE || c == MSCX_COLL_REDUCESCATTER || c == MSCX_COLL_TEST;
}

/* The options of sim into @p o; @return ARGS_OK, or the exit status (--help, a bad command line). */
static int sim_args(int argc, char **argv, struct sim_opts *o)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            fputs(usage_sim, stdout);
            return 0;
        }
        bool takes = !strcmp(a, "--size") || !strcmp(a, "--dtype") || !strcmp(a, "--op") ||
                     !strcmp(a, "--packet") || !strcmp(a, "--iters") || !strcmp(a, "--seed");
        if (takes && i + 1 >= argc)
            return bad_args("sim", "option %s needs a value", a);
        if (!strcmp(a, "--size")) {
            if (o->nsizes == MAX_LIST)
                return bad_args("sim", "too many %s options", a);
            if (parse_size(argv[++i], &o->sizes[o->nsizes]))
                return bad_args("sim", "bad value for --size: '%s'", argv[i]);
            o->nsizes++;
        } else if (!strcmp(a, "--dtype")) {
            enum mscx_dtype d;
            o->dtype = argv[++i];
            if (strcmp(o->dtype, "all") && mscx_dtype_parse(o->dtype, &d))
                return bad_args("sim", "bad value for --dtype: '%s'", o->dtype);
        } else if (!strcmp(a, "--op")) {
            enum mscx_redop r;
            o->op = argv[++i];
            if (strcmp(o->op, "all") && mscx_redop_parse(o->op, &r))
                return bad_args("sim", "bad value for --op: '%s'", o->op);
        } else if (!strcmp(a, "--packet")) {
            o->packet = argv[++i];
            if (strcmp(o->packet, "all") && strcmp(o->packet, "ll8") && strcmp(o->packet, "ll16"))
                return bad_args("sim", "bad value for --packet: '%s' (ll8, ll16 or all)", o->packet);
        } else if (!strcmp(a, "--iters")) {
            if (parse_u32(argv[++i], &o->iters) || o->iters == 0)
                return bad_args("sim", "bad value for --iters: '%s'", argv[i]);
        } else if (!strcmp(a, "--seed")) {
            if (parse_u32(argv[++i], &o->seed))
                return bad_args("sim", "bad value for --seed: '%s'", argv[i]);
        } else if (a[0] == '-' && a[1] != '\0') {
            return bad_args("sim", "unknown option '%s'", a);
        } else if (o->file == NULL) {
            o->file = a;
        } else {
            return bad_args("sim", "unexpected argument '%s' (one plan at a time)", a);
        }
    }
    if (o->file == NULL)
        return bad_args("sim", "%s", "no plan file given");
    return ARGS_OK;
}

/* Run the case (@p size, @p dt, @p op) in each packet format selected; one PASS/FAIL line each. */
static void sim_packets(const struct mscx_plan *plan, const struct sim_opts *o, uint64_t size,
                        enum mscx_dtype dt, enum mscx_redop op, struct sim_tally *t)
{
    for (int p = 0; p < 2; p++) {
        enum mscx_pkt_format pkt = p == 0 ? MSCX_PKT_LL16 : MSCX_PKT_LL8;
        const char *pname = p == 0 ? "ll16" : "ll8";
        if (strcmp(o->packet, "all") && strcmp(o->packet, pname))
            continue;
        struct mscx_sim_case c = {
            .msg_bytes = size, .dtype = dt, .op = op, .pkt = pkt, .iters = o->iters, .seed = o->seed};
        struct mscx_sim_result res;
        memset(&res, 0, sizeof(res));
        mscx_status_t st = mscx_sim_check(plan, &c, &res);
        bool ok = st == MSCX_OK && res.pass;
        printf("%s %s size=%" PRIu64 " dtype=%s op=%s packet=%s iters=%" PRIu32 " %.3fs",
               ok ? "PASS" : "FAIL", o->file, size, mscx_dtype_name(dt), mscx_redop_name(op), pname, o->iters,
               res.seconds);
        if (st != MSCX_OK)
            printf(" %s: %s", mscx_status_str(st), res.msg[0] ? res.msg : "could not run");
        else if (!ok || res.msg[0])
            printf(" %s", res.msg);
        putchar('\n');
        fflush(stdout);
        if (ok)
            t->npass++;
        else
            t->nfail++;
    }
}

/* With --dtype all, a size that is not whole elements of a type is no case of that type. */
static bool whole_elements(const struct mscx_plan *plan, uint64_t size, enum mscx_dtype dt)
{
    uint64_t in, out, es = mscx_dtype_size(dt);
    mscx_coll_sizes(mscx_plan_collective(plan), mscx_plan_nranks(plan), size, &in, &out);
    return in % es == 0 && out % es == 0;
}

/* Every (dtype, op) case selected, at @p size. */
static void sim_size(const struct mscx_plan *plan, const struct sim_opts *o, uint64_t size,
                     struct sim_tally *t)
{
    bool all_dt = !strcmp(o->dtype, "all"), all_op = !strcmp(o->op, "all");
    for (int d = 0; d < MSCX_DT_COUNT; d++) {
        enum mscx_dtype dt = (enum mscx_dtype)d;
        if (!all_dt) {
            mscx_dtype_parse(o->dtype, &dt);
            if (d > 0)
                break;
        }
        for (int r = 0; r < MSCX_REDOP_COUNT; r++) {
            enum mscx_redop op = (enum mscx_redop)r;
            if (!all_op) {
                mscx_redop_parse(o->op, &op);
                if (r > 0)
                    break;
            } else if (r > 0 && !coll_reduces(mscx_plan_collective(plan))) {
                break; /* the op does not matter for data movement */
            }
            if ((all_dt || all_op) && !mscx_plan_supports(plan, dt, op))
                continue;
            if (all_dt && !whole_elements(plan, size, dt)) {
                t->nskip++;
                continue;
            }
            sim_packets(plan, o, size, dt, op, t);
        }
    }
}

static int cmd_sim(int argc, char **argv)
{
    struct sim_opts o = {.dtype = "fp32", .op = "sum", .packet = "ll16", .iters = 2, .seed = 1};
    struct sim_tally t = {0, 0, 0};
    char err[MSCX_PLAN_ERR_LEN];
    int rc = sim_args(argc, argv, &o);
    if (rc != ARGS_OK)
        return rc;

    struct mscx_plan *plan = load_plan(o.file, err, sizeof(err));
    if (plan == NULL) {
        print_error(stdout, o.file, err);
        fprintf(stdout, "0 passed, 1 failed\n");
        return 1;
    }
    if (o.nsizes == 0)
        o.nsizes = default_sizes(plan, o.sizes);
    for (size_t s = 0; s < o.nsizes; s++)
        sim_size(plan, &o, o.sizes[s], &t);
    mscx_plan_destroy(plan);
    if (t.nskip)
        printf("%u passed, %u failed, %u skipped\n", t.npass, t.nfail, t.nskip);
    else
        printf("%u passed, %u failed\n", t.npass, t.nfail);
    return t.nfail == 0 && t.npass > 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_top, stderr);
        return EXIT_BAD_ARGS;
    }
    if (is_help(argv[1])) {
        fputs(usage_top, stdout);
        return 0;
    }
    if (!strcmp(argv[1], "check"))
        return cmd_check(argc - 2, argv + 2);
    if (!strcmp(argv[1], "show"))
        return cmd_show(argc - 2, argv + 2);
    if (!strcmp(argv[1], "fuse"))
        return cmd_fuse(argc - 2, argv + 2);
    if (!strcmp(argv[1], "sim"))
        return cmd_sim(argc - 2, argv + 2);
    fprintf(stderr, "%s: unknown command '%s'\n\n%s", prog, argv[1], usage_top);
    return EXIT_BAD_ARGS;
}
