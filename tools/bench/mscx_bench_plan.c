/* SPDX-License-Identifier: MIT */
/*
 * mscx-bench-plan [FILE]: time plan loading plus validation. Without FILE it
 * synthesizes a valid ~2 MB plan in memory (8 ranks, many blocks of put,
 * copy and packet ops). Prints the median over several runs, in ms and MB/s,
 * against the 50 ms target for a 2 MB plan.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mscx/hostexec.h"
#include "mscx/plan.h"

#define RUNS 9
#define TARGET_MS 50.0
#define SYNTH_BYTES (2u << 20)

struct sbuf {
    char *p;
    size_t len, cap;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = b->cap * 2 + (size_t)n + 1;
        b->p = realloc(b->p, b->cap);
        if (b->p == NULL) {
            fprintf(stderr, "mscx-bench-plan: out of memory\n");
            exit(1);
        }
    }
}

/* One rank: memory channels and scratch remote buffers to every other rank, @p ntb blocks of @p nops ops. */
static void synth_rank(struct sbuf *b, uint32_t r, uint32_t n, uint32_t ntb, uint32_t nops)
{
    const uint32_t chunks = 64;
    sb_printf(
        b, "%s{\"id\":%u,\"input_chunks\":%u,\"output_chunks\":%u,\"scratch_chunks\":%u,\"threadblocks\":[",
        r ? "," : "", r, chunks, chunks, chunks);
    for (uint32_t t = 0; t < ntb; t++) {
        sb_printf(b, "%s{\"id\":%u,\"ops\":[", t ? "," : "", t);
        for (uint32_t j = 0; j < nops; j++) {
            uint32_t k = (t * nops + j) % chunks, peer = j % (n - 1);
            const char *sep = j ? "," : "";
            switch (j % 4) {
            case 0:
                sb_printf(
                    b,
                    "%s{\"name\":\"put\",\"src_buff\":[{\"type\":\"i\",\"index\":%u,\"size\":1}],"
                    "\"dst_buff\":[{\"buffer_id\":%u,\"index\":%u,\"size\":1}],\"channel_type\":\"memory\"}",
                    sep, k, peer, k);
                break;
            case 1:
                sb_printf(b,
                          "%s{\"name\":\"copy\",\"src_buff\":[{\"type\":\"i\",\"index\":%u,\"size\":1}],"
                          "\"dst_buff\":[{\"type\":\"o\",\"index\":%u,\"size\":1}]}",
                          sep, k, k);
                break;
            case 2:
                sb_printf(
                    b,
                    "%s{\"name\":\"ppkt\",\"src_buff\":[{\"type\":\"i\",\"index\":%u,\"size\":1}],"
                    "\"dst_buff\":[{\"buffer_id\":%u,\"index\":%u,\"size\":1}],\"channel_type\":\"memory\"}",
                    sep, k, peer, k);
                break;
            default:
                sb_printf(
                    b,
                    "%s{\"name\":\"repkt\",\"src_buff\":[{\"type\":\"i\",\"index\":%u,\"size\":1},"
                    "{\"type\":\"s\",\"index\":%u,\"size\":1}],\"dst_buff\":[{\"type\":\"i\",\"index\":%u,"
                    "\"size\":1}],\"channel_type\":\"memory\",\"reduce_op\":\"sum\"}",
                    sep, k, k, k);
                break;
            }
        }
        sb_printf(b, "],\"channels\":[{\"channel_type\":\"memory\",\"channel_ids\":[");
        for (uint32_t p = 0; p + 1 < n; p++)
            sb_printf(b, "%s%u", p ? "," : "", p);
        sb_printf(b,
                  "]}],\"remote_buffer_refs\":[{\"access_channel_type\":\"memory\",\"remote_buffer_ids\":[");
        for (uint32_t p = 0; p + 1 < n; p++)
            sb_printf(b, "%s%u", p ? "," : "", p);
        sb_printf(b, "]}]}");
    }
    sb_printf(b, "],\"channels\":[{\"channel_type\":\"memory\",\"connected_to\":[");
    for (uint32_t p = 0, k = 0; p < n; p++)
        if (p != r)
            sb_printf(b, "%s%u", k++ ? "," : "", p);
    sb_printf(b, "]}],\"remote_buffers\":[");
    for (uint32_t p = 0, k = 0; p < n; p++)
        if (p != r)
            sb_printf(b, "%s{\"rank\":%u,\"type\":\"s\",\"access_channel_types\":[\"memory\"]}",
                      k++ ? "," : "", p);
    sb_printf(b, "],\"semaphores\":[]}");
}

static char *synth_plan(size_t target, size_t *len_p)
{
    struct sbuf b = {NULL, 0, 0};
    const uint32_t n = 8, ntb = 16;
    /* about 150 bytes per op */
    uint32_t nops = (uint32_t)(target / 150 / n / ntb);
    if (nops > 1000)
        nops = 1000;
    sb_printf(&b, "{\"name\":\"bench\",\"collective\":\"allreduce\",\"protocol\":\"LL\",\"inplace\":false,"
                  "\"num_threads_per_block\":1024,\"use_double_scratch_buffer\":true,\"buffer_alignment\":16,"
                  "\"min_message_size\":0,\"max_message_size\":18446744073709551615,\"gpus\":[");
    for (uint32_t r = 0; r < n; r++)
        synth_rank(&b, r, n, ntb, nops);
    sb_printf(&b, "]}");
    *len_p = b.len;
    return b.p;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Load+validate @p runs times; @return the median in ms, or a negative value on failure. */
static double bench_load(const char *json, size_t len, const char *origin, int runs, double *cpu_p)
{
    double t[RUNS], c[RUNS];
    char err[MSCX_PLAN_ERR_LEN];
    for (int i = 0; i < runs; i++) {
        struct mscx_plan *p = NULL;
        double t0 = now_ms(), c0 = cpu_ms();
        mscx_status_t st = mscx_plan_load_buffer(json, len, origin, &p, err, sizeof(err));
        t[i] = now_ms() - t0;
        c[i] = cpu_ms() - c0;
        if (st != MSCX_OK) {
            fprintf(stderr, "mscx-bench-plan: %s\n", err);
            return -1;
        }
        mscx_plan_destroy(p);
    }
    qsort(t, (size_t)runs, sizeof(double), cmp_double);
    qsort(c, (size_t)runs, sizeof(double), cmp_double);
    *cpu_p = c[runs / 2];
    return t[runs / 2];
}

static void fill_bytes(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                       uint64_t out_bytes)
{
    (void)ctx;
    (void)out;
    (void)out_bytes;
    memset(in, (int)(rank + iter) & 0x3f, in_bytes);
}

/*
 * Host-executor throughput: a shipped AllReduce plan run for all its ranks on
 * CPU threads. Reports time per launch and payload bytes per second per rank.
 * @return 0 when it ran, 1 when no plan could be found
 */
static int bench_hostexec(const char *plan_path)
{
    static const uint64_t sizes[] = {4096, 65536, 1u << 20};
    struct mscx_plan *plan = NULL;
    char err[MSCX_PLAN_ERR_LEN];
    if (mscx_plan_load(plan_path, &plan, err, sizeof(err)) != MSCX_OK) {
        printf("host executor: cannot load %s: %s\n", plan_path, err);
        return 1;
    }
    uint64_t lo, hi;
    mscx_plan_size_range(plan, &lo, &hi);
    printf("host executor: %s (%u ranks)\n", plan_path, mscx_plan_nranks(plan));
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        uint64_t msg = sizes[k], in, out;
        if (msg < lo || msg > hi)
            continue;
        mscx_coll_sizes(mscx_plan_collective(plan), mscx_plan_nranks(plan), msg, &in, &out);
        struct mscx_hostexec_cfg cfg = {0};
        cfg.in_bytes = in;
        cfg.out_bytes = out;
        cfg.dtype = MSCX_DT_FP32;
        cfg.op = MSCX_REDOP_SUM;
        cfg.pkt = MSCX_PKT_LL16;
        cfg.iters = 8;
        cfg.fill = fill_bytes;
        double t0 = now_ms();
        mscx_status_t st = mscx_hostexec_run(plan, &cfg, err, sizeof(err));
        double ms = now_ms() - t0;
        if (st != MSCX_OK) {
            printf("  %8llu B: failed: %s\n", (unsigned long long)msg, err);
            continue;
        }
        printf("  %8llu B: %8.1f us per launch, %7.1f MB/s per rank\n", (unsigned long long)msg,
               ms * 1e3 / cfg.iters, (double)msg * cfg.iters / (ms / 1e3) / 1e6);
    }
    mscx_plan_destroy(plan);
    return 0;
}

int main(int argc, char **argv)
{
    char *json;
    size_t len;
    const char *origin = "synthetic";

    const char *sim_plan = "plans/allreduce_n8_rpn8_oneshot_1K_16K.json";
    if (argc >= 3 && strcmp(argv[1], "--sim-plan") == 0) {
        sim_plan = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc > 2 || (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0))) {
        fprintf(stderr,
                "usage: mscx-bench-plan [--sim-plan PLAN] [FILE]\n"
                "Times loading and validating FILE (default: a synthetic ~2 MB plan) against the 50 ms\n"
                "per 2 MB target, then the host executor on PLAN (default: %s).\n",
                sim_plan);
        return argc > 2 ? 2 : 0;
    }
    if (argc == 2) {
        FILE *f = fopen(argv[1], "rb");
        if (f == NULL) {
            perror(argv[1]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, 0, SEEK_SET);
        json = malloc(sz > 0 ? (size_t)sz : 1);
        len = fread(json, 1, sz > 0 ? (size_t)sz : 0, f);
        fclose(f);
        origin = argv[1];
    } else {
        json = synth_plan(SYNTH_BYTES, &len);
    }
    double cpu;
    double ms = bench_load(json, len, origin, RUNS, &cpu);
    if (ms < 0) {
        free(json);
        return 1;
    }
    double mb = len / 1e6;
    double scaled = ms * (SYNTH_BYTES / (double)len);
    printf("plan:        %s, %.2f MB\n", origin, mb);
    printf("load+validate median of %d: %.2f ms wall (%.2f ms cpu), %.1f MB/s\n", RUNS, ms, cpu,
           mb / (ms / 1e3));
    printf("target:      %.0f ms per 2 MB; this rate gives %.2f ms per 2 MB: %s\n", TARGET_MS, scaled,
           scaled <= TARGET_MS ? "ok" : "TOO SLOW");
    bench_hostexec(sim_plan);
    free(json);
    return scaled <= TARGET_MS ? 0 : 3;
}
