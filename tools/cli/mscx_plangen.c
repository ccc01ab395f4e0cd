/* SPDX-License-Identifier: MIT */
/*
 * mscx-plangen: generate MSCCL++-format execution plans for the packet
 * collectives mscx ships (allreduce, allgather, reducescatter on one or
 * several nodes), validate them with the plan loader, fuse them and write
 * them in canonical form. `--all DIR` regenerates the shipped set in plans/.
 *
 * The algorithms are in plangen/pg_algo.c, the JSON builder in
 * plangen/pg_build.c. Output is deterministic: the same parameters always
 * give the same bytes.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "mscx/plan.h"
#include "plangen/plangen.h"

#define ARGS_OK (-1) /* what the argument parser returns when the command goes on */
#define K1 1024ull
#define M1 (1024ull * 1024ull)

struct pg_opts {
    bool fuse;
    bool raw; /* write the builder's JSON, unvalidated (debugging) */
    bool quiet;
};

/*
 * The shipped set. Thread blocks per rank stay small enough that every rank
 * of the largest plan fits on one GPU at once (the GPU test harness runs all
 * ranks on one device): nranks * blocks <= 128 (H100/H200: 132 SMs).
 */
struct pg_entry {
    const char *coll;
    const char *algo;
    uint32_t nranks, rpn;
    uint64_t min, max;
    uint32_t tpp, nthreads;
    uint32_t blocks;    /* oneshot, twophase: blocks per rank (0: tpp x peers) */
    const char *layout; /* twophase with blocks: "rows", "peer" or "cols" */
};

static const struct pg_entry pg_shipped[] = {
    /* one rank */
    {"allreduce", "copy", 1, 1, K1, 4 * M1, 1, 512, 0, NULL},
    {"allgather", "copy", 1, 1, K1, 4 * M1, 1, 512, 0, NULL},
    {"reducescatter", "copy", 1, 1, K1, 4 * M1, 1, 512, 0, NULL},
    /* one node */
    /*
     * The range splits and block counts were chosen by measurement: the
     * 2-rank upper ends against stock NCCL, the plans' structure against
     * other plans and against the MSCCL++ DSL's allreduce_pkt on the same
     * executor. plans/README.md gives the evidence for each range. 4 and 8
     * ranks keep 1 MB as their upper end until they are measured against
     * NCCL on 4 or 8 GPUs. The 8-rank two-phase AllReduce above 16 KB has
     * the DSL's own structure (rows, 8 blocks of 1024) with --layout peer
     * (the same ops per block; each peer's share scattered and gathered by
     * one block), so that out-of-place calls run split instead of staged.
     */
    {"allreduce", "oneshot", 2, 2, K1, 16 * K1, 2, 1024, 0, NULL},
    {"allreduce", "twophase", 2, 2, 16 * K1 + 1, 256 * K1, 8, 1024, 0, NULL},
    {"allreduce", "oneshot", 4, 4, K1, 4 * K1, 1, 512, 1, NULL},
    {"allreduce", "oneshot", 4, 4, 4 * K1 + 1, 16 * K1, 1, 512, 4, NULL},
    {"allreduce", "twophase", 4, 4, 16 * K1 + 1, M1, 4, 1024, 0, NULL},
    {"allreduce", "oneshot", 8, 8, K1, 16 * K1, 1, 512, 4, NULL},
    {"allreduce", "twophase", 8, 8, 16 * K1 + 1, M1, 1, 1024, 8, "peer"},
    {"allgather", "allpairs", 2, 2, K1, 32 * K1, 1, 512, 0, NULL},
    {"allgather", "allpairs", 2, 2, 32 * K1 + 1, 512 * K1, 8, 1024, 0, NULL},
    {"allgather", "allpairs", 4, 4, K1, 64 * K1, 1, 512, 0, NULL},
    {"allgather", "allpairs", 4, 4, 64 * K1 + 1, M1, 4, 1024, 0, NULL},
    {"allgather", "allpairs", 8, 8, K1, 64 * K1, 1, 512, 0, NULL},
    {"allgather", "allpairs", 8, 8, 64 * K1 + 1, M1, 2, 1024, 0, NULL},
    {"reducescatter", "allpairs", 2, 2, K1, 32 * K1, 1, 512, 0, NULL},
    {"reducescatter", "allpairs", 2, 2, 32 * K1 + 1, 256 * K1, 8, 1024, 0, NULL},
    {"reducescatter", "allpairs", 4, 4, K1, 64 * K1, 1, 512, 0, NULL},
    {"reducescatter", "allpairs", 4, 4, 64 * K1 + 1, M1, 4, 1024, 0, NULL},
    {"reducescatter", "allpairs", 8, 8, K1, 64 * K1, 1, 512, 0, NULL},
    {"reducescatter", "allpairs", 8, 8, 64 * K1 + 1, M1, 2, 1024, 0, NULL},
    /* two nodes */
    {"allreduce", "hier2", 4, 2, K1, 64 * K1, 1, 512, 0, NULL},
    {"allreduce", "hier2", 4, 2, 64 * K1 + 1, 2 * M1, 8, 1024, 0, NULL},
    {"allreduce", "hier2", 8, 4, K1, 64 * K1, 1, 512, 0, NULL},
    {"allreduce", "hier2", 8, 4, 64 * K1 + 1, 2 * M1, 4, 1024, 0, NULL},
    {"allreduce", "hier2", 16, 8, K1, 64 * K1, 1, 512, 0, NULL},
    {"allreduce", "hier2", 16, 8, 64 * K1 + 1, 2 * M1, 1, 1024, 0, NULL},
    {"allgather", "hier2", 4, 2, K1, 64 * K1, 1, 512, 0, NULL},
    {"allgather", "hier2", 4, 2, 64 * K1 + 1, 2 * M1, 8, 1024, 0, NULL},
    {"allgather", "hier2", 8, 4, K1, 64 * K1, 1, 512, 0, NULL},
    {"allgather", "hier2", 8, 4, 64 * K1 + 1, 2 * M1, 4, 1024, 0, NULL},
    {"allgather", "hier2", 16, 8, K1, 64 * K1, 1, 512, 0, NULL},
    {"allgather", "hier2", 16, 8, 64 * K1 + 1, 2 * M1, 1, 1024, 0, NULL},
    {"reducescatter", "hier2", 4, 2, K1, 64 * K1, 1, 512, 0, NULL},
    {"reducescatter", "hier2", 4, 2, 64 * K1 + 1, 2 * M1, 8, 1024, 0, NULL},
    {"reducescatter", "hier2", 8, 4, K1, 64 * K1, 1, 512, 0, NULL},
    {"reducescatter", "hier2", 8, 4, 64 * K1 + 1, 2 * M1, 4, 1024, 0, NULL},
    {"reducescatter", "hier2", 16, 8, K1, 64 * K1, 1, 512, 0, NULL},
    {"reducescatter", "hier2", 16, 8, 64 * K1 + 1, 2 * M1, 1, 1024, 0, NULL},
    /*
     * Broadcast, one plan per root (every plan of a communicator's rank
     * count is added at its setup, with its scratch): on one node LL packets
     * up to 64K; across nodes one LL range. Not measured yet. No direct
     * plans: they reach the peers' user buffers, whose handles every launch
     * would have to wait for on the host (the shim leaves them to NCCL).
     */
    {"broadcast", "copy", 1, 1, K1, 4 * M1, 1, 512, 0, NULL},
    {"broadcast", "oneshot", 2, 2, K1, 64 * K1, 2, 512, 0, NULL},
    {"broadcast", "oneshot", 4, 4, K1, 64 * K1, 1, 512, 0, NULL},
    {"broadcast", "oneshot", 8, 8, K1, 64 * K1, 1, 512, 0, NULL},
    {"broadcast", "hier2", 4, 2, K1, M1, 4, 1024, 0, NULL},
    {"broadcast", "hier2", 8, 4, K1, M1, 2, 1024, 0, NULL},
    {"broadcast", "hier2", 16, 8, K1, M1, 1, 1024, 0, NULL},
    /*
     * AlltoAll: LL packets up to 64 KB on one node (no direct plans, as for Broadcast); two nodes in
     * packets. Not measured yet.
     */
    {"alltoall", "copy", 1, 1, K1, 4 * M1, 1, 512, 0, NULL},
    {"alltoall", "oneshot", 2, 2, K1, 64 * K1, 4, 512, 0, NULL},
    {"alltoall", "oneshot", 4, 4, K1, 64 * K1, 2, 512, 0, NULL},
    {"alltoall", "oneshot", 8, 8, K1, 64 * K1, 1, 512, 0, NULL},
    {"alltoall", "hier2", 4, 2, K1, 2 * M1, 4, 1024, 0, NULL},
    {"alltoall", "hier2", 8, 4, K1, 2 * M1, 2, 1024, 0, NULL},
    {"alltoall", "hier2", 16, 8, K1, 2 * M1, 1, 1024, 0, NULL},
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: mscx-plangen --coll allreduce|allgather|reducescatter|broadcast|alltoall --algo ALGO\n"
        "                    --ranks N\n"
        "                    [--ranks-per-node P] [--min-size S] [--max-size S] [--tbs-per-peer T]\n"
        "                    [--root R]\n"
        "                    [--threads-per-block B] [--blocks G] [--layout rows|peer|cols]\n"
        "                    [--packet ll16|ll8] [--name NAME] [--no-fuse]\n"
        "                    [-o FILE]\n"
        "       mscx-plangen --all DIR [--no-fuse]\n"
        "algorithms: copy (one rank); oneshot, twophase (allreduce, one node);\n"
        "            allpairs (allgather, reducescatter, one node); hier2 (two or more nodes);\n"
        "            broadcast: oneshot, direct (one node), hier2; --root R its root (default 0)\n"
        "            alltoall: oneshot (LL packets, one node), direct (puts into the peers' outputs,\n"
        "            one node), hier2\n"
        "sizes take K, M or G suffixes (powers of 1024); the range of allgather is the output size\n"
        "--blocks G: oneshot with G thread blocks per rank (default: tbs-per-peer x (ranks - 1));\n"
        "            twophase with G blocks per rank, each rank's share in G sub-chunks (block b reduces\n"
        "            sub-chunk b), no per-peer slicing; --layout rows (default: the scatter and gather of\n"
        "            a peer's share are one op each, the MSCCL++ DSL's allreduce_pkt when G = ranks), peer\n"
        "            (as rows, a peer's share scattered and gathered by one block: out-of-place calls\n"
        "            run split, not staged) or cols (block b scatters, reduces and gathers sub-chunk b of\n"
        "            every rank)\n"
        "--raw writes the builder's JSON without validation or fusion (debugging)\n");
}

static int parse_size(const char *s, uint64_t *v_p)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    switch (*end) {
    case 'K':
    case 'k':
        v *= K1;
        end++;
        break;
    case 'M':
    case 'm':
        v *= M1;
        end++;
        break;
    case 'G':
    case 'g':
        v *= 1024 * M1;
        end++;
        break;
    default:
        break;
    }
    if (*end == '+') { /* "64K+1" */
        char *e2;
        unsigned long long add = strtoull(end + 1, &e2, 10);
        if (e2 == end + 1)
            return -1;
        v += add;
        end = e2;
    }
    if (*end)
        return -1;
    *v_p = v;
    return 0;
}

static int parse_u32(const char *s, uint32_t *v_p)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v > 0xffffffffu)
        return -1;
    *v_p = (uint32_t)v;
    return 0;
}

static int write_file(const char *path, const char *text)
{
    FILE *f = path ? fopen(path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "mscx-plangen: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t n = strlen(text);
    int rc = fwrite(text, 1, n, f) == n ? 0 : -1;
    if (n == 0 || text[n - 1] != '\n')
        rc |= fputc('\n', f) == EOF ? -1 : 0;
    if (path)
        rc |= fclose(f) ? -1 : 0;
    else
        rc |= fflush(f) ? -1 : 0;
    if (rc)
        fprintf(stderr, "mscx-plangen: cannot write %s\n", path ? path : "stdout");
    return rc;
}

/* Generate, validate, fuse, serialise. @return malloc'd JSON or NULL. */
static char *generate(const struct pg_params *par, const struct pg_opts *o)
{
    struct pg_plan p;
    struct mscx_plan *plan = NULL, *fused = NULL;
    struct mscx_fuse_stats st;
    char err[MSCX_PLAN_ERR_LEN];
    char *raw, *out = NULL;
    mscx_status_t s;

    if (pg_generate(par, &p) < 0)
        return NULL;
    raw = pg_plan_dump(&p);
    pg_plan_fini(&p);
    if (!raw || o->raw)
        return raw;

    s = mscx_plan_load_buffer(raw, strlen(raw), par->name ? par->name : "mscx-plangen", &plan, err,
                              sizeof(err));
    if (s != MSCX_OK) {
        fprintf(stderr, "mscx-plangen: generated plan does not load: %s\n", err);
        goto out;
    }
    if (o->fuse) {
        s = mscx_plan_fuse(plan, &fused, &st);
        if (s != MSCX_OK) {
            fprintf(stderr, "mscx-plangen: fusion failed: %s\n", mscx_status_str(s));
            goto out;
        }
        if (!o->quiet)
            fprintf(stderr, "mscx-plangen: %s: %u ops fused into %u\n", mscx_plan_name(fused), st.ops_before,
                    st.ops_after);
    }
    s = mscx_plan_to_json(fused ? fused : plan, &out);
    if (s != MSCX_OK) {
        fprintf(stderr, "mscx-plangen: cannot serialise: %s\n", mscx_status_str(s));
        out = NULL;
    }
out:
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
    free(raw);
    return out;
}

/* Write the plan of @p par into @p dir, named after the plan. @return 0 or 1. */
static int generate_into(const char *dir, const struct pg_params *par, const struct pg_opts *o)
{
    struct pg_plan p;
    char path[4096];
    /* the plan name is also the file name */
    if (pg_generate(par, &p) < 0)
        return 1;
    snprintf(path, sizeof(path), "%s/%s.json", dir, p.name);
    pg_plan_fini(&p);
    char *json = generate(par, o);
    if (!json)
        return 1;
    int rc = write_file(path, json);
    free(json);
    return rc ? 1 : 0;
}

static int generate_all(const char *dir, const struct pg_opts *o)
{
    if (mkdir(dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "mscx-plangen: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    for (size_t i = 0; i < sizeof(pg_shipped) / sizeof(pg_shipped[0]); i++) {
        const struct pg_entry *e = &pg_shipped[i];
        struct pg_params par = {
            .algo = e->algo,
            .nranks = e->nranks,
            .rpn = e->rpn,
            .min_size = e->min,
            .max_size = e->max,
            .tbs_per_peer = e->tpp,
            .nthreads = e->nthreads,
            .packet = "ll16",
            .blocks = e->blocks,
            .layout = e->layout,
        };
        if (mscx_coll_parse(e->coll, &par.coll) < 0)
            return 1;
        /* broadcast: one plan per root */
        uint32_t nroots = par.coll == MSCX_COLL_BROADCAST ? e->nranks : 1;
        for (par.root = 0; par.root < nroots; par.root++)
            if (generate_into(dir, &par, o))
                return 1;
    }
    return 0;
}

static const struct option longopts[] = {
    {"coll", required_argument, NULL, 'c'},
    {"algo", required_argument, NULL, 'a'},
    {"ranks", required_argument, NULL, 'n'},
    {"ranks-per-node", required_argument, NULL, 'p'},
    {"min-size", required_argument, NULL, 'm'},
    {"max-size", required_argument, NULL, 'M'},
    {"tbs-per-peer", required_argument, NULL, 't'},
    {"blocks", required_argument, NULL, 'G'},
    {"layout", required_argument, NULL, 'L'},
    {"threads-per-block", required_argument, NULL, 'b'},
    {"packet", required_argument, NULL, 'k'},
    {"name", required_argument, NULL, 'N'},
    {"root", required_argument, NULL, 'r'},
    {"no-fuse", no_argument, NULL, 'F'},
    {"raw", no_argument, NULL, 'R'},
    {"quiet", no_argument, NULL, 'q'},
    {"all", required_argument, NULL, 'A'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The command line. */
struct pg_cli {
    struct pg_params par;
    struct pg_opts o;
    const char *out, *all;
};

/* Apply option @p c, its value in optarg. @return 0, 1 for a bad value, -1 for an unknown option. */
static int set_option(int c, struct pg_cli *cli)
{
    struct pg_params *par = &cli->par;
    int bad = 0;
    switch (c) {
    case 'c':
        bad = mscx_coll_parse(optarg, &par->coll);
        break;
    case 'a':
        par->algo = optarg;
        break;
    case 'n':
        bad = parse_u32(optarg, &par->nranks);
        break;
    case 'p':
        bad = parse_u32(optarg, &par->rpn);
        break;
    case 'm':
        bad = parse_size(optarg, &par->min_size);
        break;
    case 'M':
        bad = parse_size(optarg, &par->max_size);
        break;
    case 't':
        bad = parse_u32(optarg, &par->tbs_per_peer);
        break;
    case 'G':
        bad = parse_u32(optarg, &par->blocks) || par->blocks == 0;
        break;
    case 'L':
        bad = strcmp(optarg, "rows") && strcmp(optarg, "cols");
        par->layout = optarg;
        break;
    case 'b':
        bad = parse_u32(optarg, &par->nthreads) || par->nthreads == 0 || par->nthreads > 1024;
        break;
    case 'k': /* plans are packet-format independent: a hint, checked and not recorded */
        bad = strcmp(optarg, "ll16") && strcmp(optarg, "ll8");
        par->packet = optarg;
        break;
    case 'N':
        par->name = optarg;
        break;
    case 'r':
        bad = parse_u32(optarg, &par->root);
        break;
    case 'F':
        cli->o.fuse = false;
        break;
    case 'R':
        cli->o.raw = true;
        break;
    case 'q':
        cli->o.quiet = true;
        break;
    case 'A':
        cli->all = optarg;
        break;
    case 'o':
        cli->out = optarg;
        break;
    default:
        return -1;
    }
    return bad != 0;
}

/* Parse the command line into @p cli; @return ARGS_OK, or the exit status (--help, a bad command line). */
static int parse_args(int argc, char **argv, struct pg_cli *cli)
{
    int c;
    while ((c = getopt_long(argc, argv, "o:hq", longopts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        int bad = set_option(c, cli);
        if (bad < 0) {
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "mscx-plangen: bad option value: %s\n", optarg);
            return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    return ARGS_OK;
}

int main(int argc, char **argv)
{
    struct pg_cli cli = {
        .par = {.coll = MSCX_COLL_COUNT,
                .algo = NULL,
                .min_size = K1,
                .max_size = M1,
                .tbs_per_peer = 1,
                .nthreads = 512,
                .packet = "ll16"},
        .o = {.fuse = true},
    };
    struct pg_params *par = &cli.par;
    int rc = parse_args(argc, argv, &cli);
    if (rc != ARGS_OK)
        return rc;
    if (cli.all) {
        cli.o.quiet = true;
        return generate_all(cli.all, &cli.o);
    }
    if (par->coll == MSCX_COLL_COUNT || !par->algo || !par->nranks) {
        usage(stderr);
        return 2;
    }
    if (!par->rpn)
        par->rpn = par->nranks;
    if (par->min_size > par->max_size) {
        fprintf(stderr, "mscx-plangen: --min-size is above --max-size\n");
        return 2;
    }
    char *json = generate(par, &cli.o);
    if (!json)
        return 1;
    rc = write_file(cli.out, json);
    free(json);
    return rc ? 1 : 0;
}
