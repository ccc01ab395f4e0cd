/* SPDX-License-Identifier: MIT */
/* Host reference executor: every opcode on small inline plans, both packet formats. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hostexec_int.h"
#include "mscx/hostexec.h"
#include "mscx/plan.h"
#include "op_math.h"
#include "plan_model.h"
#include "test_common.h"

#define MAXR 2
#define BUFMAX 16384

/* Operands, JSON with single quotes (turned into double quotes on load). */
#define L(t, i) "{'type':'" t "','index':" #i ",'size':1}"
#define R(b, i) "{'buffer_id':" #b ",'index':" #i ",'size':1}"
/* remote buffer ids in the two-rank plans: 0 peer scratch, 1 peer output, 2 peer input */

struct cap {
    uint8_t in[MAXR][BUFMAX], out[MAXR][BUFMAX], scr[MAXR][BUFMAX];
    uint64_t in_len[MAXR], out_len[MAXR], scr_len[MAXR];
    uint32_t last_iter[MAXR];
};

static struct mscx_plan *load_plan(const char *fmt, ...)
{
    static char buf[16384], err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    for (char *p = buf; *p; p++)
        if (*p == '\'')
            *p = '"';
    mscx_status_t st = mscx_plan_load_buffer(buf, strlen(buf), "inline", &plan, err, sizeof(err));
    ck_assert_msg(st == MSCX_OK, "load failed: %s\n%s", err, buf);
    return plan;
}

#define HDR                                                                                                  \
    "{'name':'t','collective':'test','protocol':'%s','inplace':false,'use_double_scratch_buffer':%s,"        \
    "'buffer_alignment':16,'num_threads_per_block':1024,'min_message_size':0,"                               \
    "'max_message_size':1048576,'gpus':["

/* One rank, one or two thread blocks. */
static struct mscx_plan *plan1(bool dbl, int ic, int oc, int sc, const char *sem, const char *tb0,
                               const char *tb1)
{
    char tbs[8192];
    snprintf(tbs, sizeof(tbs), "{'id':0,'ops':[%s],'channels':[],'remote_buffer_refs':[]}%s%s%s", tb0,
             tb1 ? ",{'id':1,'ops':[" : "", tb1 ? tb1 : "",
             tb1 ? "],'channels':[],'remote_buffer_refs':[]}" : "");
    return load_plan(HDR "{'id':0,'input_chunks':%d,'output_chunks':%d,'scratch_chunks':%d,'channels':[],"
                         "'remote_buffers':[],'semaphores':[%s],'threadblocks':[%s]}]}",
                     "LL", dbl ? "true" : "false", ic, oc, sc, sem ? sem : "", tbs);
}

/* Two ranks running the same ops towards each other over one memory and one port channel. */
static struct mscx_plan *plan2(bool dbl, int ic, int oc, int sc, const char *ops)
{
    char g[2][6144];
    for (int r = 0; r < 2; r++)
        snprintf(g[r], sizeof(g[r]),
                 "{'id':%d,'input_chunks':%d,'output_chunks':%d,'scratch_chunks':%d,"
                 "'channels':[{'channel_type':'memory','connected_to':[%d]},{'channel_type':'port','"
                 "connected_to':[%d]}],"
                 "'remote_buffers':[{'rank':%d,'type':'s','access_channel_types':['memory','port']},"
                 "{'rank':%d,'type':'o','access_channel_types':['memory','port']},"
                 "{'rank':%d,'type':'i','access_channel_types':['memory','port']}],'semaphores':[],"
                 "'threadblocks':[{'id':0,'ops':[%s],"
                 "'channels':[{'channel_type':'memory','channel_ids':[0]},{'channel_type':'port','channel_"
                 "ids':[0]}],"
                 "'remote_buffer_refs':[{'access_channel_type':'memory','remote_buffer_ids':[0,1,2]},"
                 "{'access_channel_type':'port','remote_buffer_ids':[0,1,2]}]}]}",
                 r, ic, oc, sc, 1 - r, 1 - r, 1 - r, 1 - r, 1 - r, ops);
    return load_plan(HDR "%s,%s]}", "LL", dbl ? "true" : "false", g[0], g[1]);
}

/* Input element e of rank r in launch it (int32). */
static int32_t val(uint32_t r, uint32_t it, uint64_t e)
{
    return (int32_t)(r * 1000 + it * 100 + e + 1);
}

static void fill_cb(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                    uint64_t out_bytes)
{
    (void)ctx;
    memset(out, 0xee, out_bytes); /* peers touch our buffers only once our launch has started */
    for (uint64_t e = 0; e < in_bytes / 4; e++) {
        int32_t v = val(rank, iter, e);
        memcpy((uint8_t *)in + 4 * e, &v, 4);
    }
}

static void collect_cb(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                       const void *out, uint64_t out_bytes)
{
    struct cap *c = ctx;
    c->last_iter[rank] = iter;
}

static void final_cb(void *ctx, uint32_t rank, const uint8_t *in, uint64_t in_bytes, const uint8_t *out,
                     uint64_t out_bytes, const uint8_t *scratch, uint64_t scratch_bytes)
{
    struct cap *c = ctx;
    ck_assert_uint_le(in_bytes, BUFMAX);
    ck_assert_uint_le(out_bytes, BUFMAX);
    ck_assert_uint_le(scratch_bytes, BUFMAX);
    memcpy(c->in[rank], in, in_bytes);
    memcpy(c->out[rank], out, out_bytes);
    memcpy(c->scr[rank], scratch, scratch_bytes);
    c->in_len[rank] = in_bytes;
    c->out_len[rank] = out_bytes;
    c->scr_len[rank] = scratch_bytes;
}

static mscx_status_t run_plan(struct mscx_plan *plan, enum mscx_pkt_format pkt, uint64_t in_bytes,
                              uint64_t out_bytes, uint32_t iters, uint32_t seed, struct cap *c, char *err)
{
    struct mscx_hostexec_cfg cfg;
    struct hx_hooks hooks = {NULL, final_cb};
    memset(&cfg, 0, sizeof(cfg));
    memset(c, 0, sizeof(*c));
    cfg.in_bytes = in_bytes;
    cfg.out_bytes = out_bytes;
    cfg.dtype = MSCX_DT_INT32;
    cfg.op = MSCX_REDOP_SUM;
    cfg.pkt = pkt;
    cfg.iters = iters;
    cfg.sched_seed = seed;
    cfg.timeout_ms = 5000;
    cfg.fill = fill_cb;
    cfg.collect = collect_cb;
    cfg.ctx = c;
    return mscx_hostexec_run_hooks(plan, &cfg, &hooks, err, 512);
}

static int32_t word(const uint8_t *p, uint64_t i)
{
    int32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

#define RUN_OK(plan, pkt, in, out, iters, c)                                                                 \
    do {                                                                                                     \
        char err_[512] = "";                                                                                 \
        mscx_status_t st_ = run_plan(plan, pkt, in, out, iters, 7, c, err_);                                 \
        ck_assert_msg(st_ == MSCX_OK, "run failed: %s", err_);                                               \
    } while (0)

/* Output words [o0, o0+n) of rank r equal input words of rank src in launch it (from index i0). */
static void expect_copy(const struct cap *c, uint32_t r, uint64_t o0, uint32_t src, uint32_t it, uint64_t i0,
                        uint64_t n)
{
    for (uint64_t e = 0; e < n; e++)
        ck_assert_msg(word(c->out[r], o0 + e) == val(src, it, i0 + e), "rank %u out word %llu: %d != %d", r,
                      (unsigned long long)(o0 + e), word(c->out[r], o0 + e), val(src, it, i0 + e));
}

static enum mscx_pkt_format fmt_i(int i)
{
    return i ? MSCX_PKT_LL8 : MSCX_PKT_LL16;
}

/* cpkt: exact line layout in scratch, zero padding past a 20-byte input (slot 32). */
START_TEST(test_cpkt_layout)
{
    enum mscx_pkt_format f = fmt_i(_i);
    struct cap *c = malloc(sizeof(*c));
    struct mscx_plan *p = plan1(
        false, 1, 1, 1, NULL, "{'name':'cpkt','src_buff':[" L("i", 0) "],'dst_buff':[" L("s", 0) "]}", NULL);
    RUN_OK(p, f, 20, 20, 1, c);
    ck_assert_uint_eq(c->scr_len[0], 64);
    for (uint32_t w = 0; w < 8; w++) { /* payload words: 5 values then padding */
        int32_t want = w < 5 ? val(0, 0, w) : 0;
        uint64_t data_at = f == MSCX_PKT_LL16 ? (w / 2) * 4 + (w % 2) * 2 : w * 2; /* in 32-bit words */
        ck_assert_int_eq(word(c->scr[0], data_at), want);
        ck_assert_int_eq(word(c->scr[0], data_at + 1), 1); /* flag of launch 1 */
    }
    mscx_plan_destroy(p);
    free(c);
}
END_TEST

/* cpkt + upkt, double scratch: halves alternate with the flag parity, flags advance over launches. */
START_TEST(test_double_scratch_flags)
{
    enum mscx_pkt_format f = fmt_i(_i);
    struct cap *c = malloc(sizeof(*c));
    struct mscx_plan *p =
        plan1(true, 1, 1, 1, NULL,
              "{'name':'cpkt','src_buff':[" L("i", 0) "],'dst_buff':[" L(
                  "s", 0) "]},"
                          "{'name':'upkt','src_buff':[" L("s", 0) "],'dst_buff':[" L("o", 0) "]}",
              NULL);
    for (uint32_t iters = 1; iters <= 4; iters++) {
        RUN_OK(p, f, 20, 20, iters, c);
        ck_assert_uint_eq(c->scr_len[0], 128);
        expect_copy(c, 0, 0, 0, iters - 1, 0, 5);
        uint32_t lo = iters % 2 ? iters : iters - 1; /* last odd flag, in the first half */
        uint32_t hi = iters % 2 ? iters - 1 : iters; /* last even flag, second half */
        ck_assert_int_eq(word(c->scr[0], 1), (int32_t)lo);
        ck_assert_int_eq(word(c->scr[0] + 64, 1), (int32_t)hi);
        ck_assert_int_eq(word(c->scr[0] + 64, 0), iters >= 2 ? val(0, hi - 1, 0) : 0);
    }
    mscx_plan_destroy(p);
    free(c);
}
END_TEST

/* memory ppkt to the peer, then upkt: out[r] = in[peer], 3 launches, odd size. */
START_TEST(test_ppkt_memory)
{
    enum mscx_pkt_format f = fmt_i(_i);
    struct cap *c = malloc(sizeof(*c));
    struct mscx_plan *p =
        plan2(true, 1, 1, 1,
              "{'name':'ppkt','channel_type':'memory','src_buff':[" L("i", 0) "],'dst_buff':[" R(
                  0, 0) "]},"
                        "{'name':'upkt','src_buff':[" L("s", 0) "],'dst_buff':[" L("o", 0) "]}");
    RUN_OK(p, f, 36, 36, 3, c);
    for (uint32_t r = 0; r < 2; r++)
        expect_copy(c, r, 0, 1 - r, 2, 0, 9);
    mscx_plan_destroy(p);
    free(c);
}
END_TEST

/* cpkt locally, then port ppkt / memory rppkt / port rppkt to the peer, then upkt. */
START_TEST(test_forward_packets)
{
    static const char *const fwd[3] = {
        "{'name':'ppkt','channel_type':'port','channel_ids':[0],'src_buff':[" L("s", 1) "],'dst_buff':[" R(
            0, 0) "]}",
        "{'name':'rppkt','channel_type':'memory','src_buff':[" L("s", 1) "],'dst_buff':[" R(0, 0) "]}",
        "{'name':'rppkt','channel_type':'port','channel_ids':[0],'src_buff':[" L("s", 1) "],'dst_buff':[" R(
            0, 0) "]}",
    };
    struct cap *c = malloc(sizeof(*c));
    for (int k = 0; k < 3; k++) {
        char ops[2048];
        snprintf(ops, sizeof(ops),
                 "{'name':'cpkt','src_buff':[" L("i", 0) "],'dst_buff':[" L(
                     "s", 1) "]},%s,"
                             "{'name':'upkt','src_buff':[" L("s", 0) "],'dst_buff':[" L("o", 0) "]}",
                 fwd[k]);
        struct mscx_plan *p = plan2(true, 1, 1, 2, ops);
        RUN_OK(p, fmt_i(_i), 52, 52, 3, c);
        for (uint32_t r = 0; r < 2; r++)
            expect_copy(c, r, 0, 1 - r, 2, 0, 13);
        mscx_plan_destroy(p);
    }
    free(c);
}
END_TEST

/* The packet reduce family: out = in[r] + in[peer]; remote/local packet copies of the result. */
START_TEST(test_packet_reduces)
{
    static const char *const red[4] = {
        /* repkt, then our own ppkt of the result into the peer's s1 */
        "{'name':'repkt','src_buff':[" L("i", 0) "," L("s", 0) "],'dst_buff':[" L(
            "o", 0) "]},"
                    "{'name':'ppkt','channel_type':'memory','src_buff':[" L("o",
                                                                            0) "],'dst_buff':[" R(0, 1) "]}",
        "{'name':'respkt','channel_type':'memory','src_buff':[" L("i", 0) "," L("s", 0) "],'dst_buff':[" L(
            "o", 0) "," R(0, 1) "]}",
        "{'name':'recpkt','src_buff':[" L("i", 0) "," L("s", 0) "],'dst_buff':[" L("o", 0) "," L(
            "s", 2) "]},"
                    "{'name':'rppkt','channel_type':'memory','src_buff':[" L("s",
                                                                             2) "],'dst_buff':[" R(0, 1) "]}",
        "{'name':'recspkt','channel_type':'memory','src_buff':[" L("i", 0) "," L("s", 0) "],'dst_buff':[" L(
            "o", 0) "," L("s", 2) "," R(0, 1) "]}",
    };
    struct cap *c = malloc(sizeof(*c));
    for (int k = 0; k < 4; k++) {
        char ops[2048];
        snprintf(ops, sizeof(ops),
                 "{'name':'ppkt','channel_type':'memory','src_buff':[" L("i", 0) "],'dst_buff':[" R(
                     0, 0) "]},%s,"
                           "{'name':'upkt','src_buff':[" L("s", 1) "],'dst_buff':[" L("o", 1) "]}",
                 red[k]);
        struct mscx_plan *p = plan2(true, 1, 2, 3, ops);
        RUN_OK(p, fmt_i(_i), 20, 40, 3, c);
        for (uint32_t r = 0; r < 2; r++)
            for (uint64_t e = 0; e < 5; e++) {
                int32_t sum = val(0, 2, e) + val(1, 2, e);
                ck_assert_int_eq(word(c->out[r], e), sum);
                ck_assert_int_eq(word(c->out[r], 5 + e), sum);
            }
        if (k >= 2) /* local packet copy of the result in s2 */
            ck_assert_int_eq(word(c->scr[0] + 4 * 32, 1), 3);
        mscx_plan_destroy(p);
    }
    free(c);
}
END_TEST

#define SIGWAIT(kind)                                                                                        \
    "{'name':'" kind "signal','channel_type':'memory','channel_ids':[0]},"                                   \
    "{'name':'" kind "wait','channel_type':'memory','channel_ids':[0]}"

/* Raw memory-channel operations with signal/wait: put, pws, get, rre, rres, res, copy. */
START_TEST(test_memory_raw)
{
    static const char *const ops[] = {
        "{'name':'put','channel_type':'memory','src_buff':[" L("i", 0) "],'dst_buff':[" R(1, 0) "]}," SIGWAIT(
            "") ",{'name':'nop'}",
        "{'name':'pws','channel_type':'memory','src_buff':[" L("i", 0) "],'dst_buff':[" R(1, 0) "]}," SIGWAIT(
            "rlx"),
        SIGWAIT("") ",{'name':'get','channel_type':'memory','src_buff':[" R(2, 0) "],'dst_buff':[" L(
            "o", 0) "]}," SIGWAIT(""),
    };
    struct cap *c = malloc(sizeof(*c));
    for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
        struct mscx_plan *p = plan2(false, 1, 1, 0, ops[k]);
        RUN_OK(p, fmt_i(_i), 36, 36, 3, c);
        for (uint32_t r = 0; r < 2; r++)
            expect_copy(c, r, 0, 1 - r, 2, 0, 9);
        mscx_plan_destroy(p);
    }
    /* rre into o0, rres also writes the peer's o1, res reduces two local chunks and sends */
    struct mscx_plan *p =
        plan2(false, 1, 2, 0,
              SIGWAIT("") ",{'name':'rres','channel_type':'memory','src_buff':[" L("i", 0) "," R(
                  2, 0) "],"
                        "'dst_buff':[" L("o", 0) "," R(1, 1) "]}," SIGWAIT(
                            "") ","
                                "{'name':'rre','channel_type':'memory','src_buff':[" L("i", 0) "," R(
                                    2, 0) "],'dst_buff':[" L("o", 0) "]}," SIGWAIT(""));
    RUN_OK(p, fmt_i(_i), 20, 40, 3, c);
    for (uint32_t r = 0; r < 2; r++)
        for (uint64_t e = 0; e < 5; e++) {
            ck_assert_int_eq(word(c->out[r], e), val(0, 2, e) + val(1, 2, e));
            ck_assert_int_eq(word(c->out[r], 5 + e), val(0, 2, e) + val(1, 2, e));
        }
    mscx_plan_destroy(p);
    p = plan2(false, 2, 2, 0,
              "{'name':'res','channel_type':'memory','src_buff':[" L("i", 0) "," L(
                  "i", 1) "],"
                          "'dst_buff':[" L("o", 0) "," R(1, 1) "]}," SIGWAIT(
                              "") ",{'name':'copy','src_buff':[" L("i", 1) "],'dst_buff':[" L("i", 0) "]}");
    RUN_OK(p, fmt_i(_i), 40, 40, 1, c);
    for (uint32_t r = 0; r < 2; r++)
        for (uint64_t e = 0; e < 5; e++) {
            ck_assert_int_eq(word(c->out[r], e), val(r, 0, e) + val(r, 0, 5 + e));
            ck_assert_int_eq(word(c->out[r], 5 + e), val(1 - r, 0, e) + val(1 - r, 0, 5 + e));
            ck_assert_int_eq(word(c->in[r], e), val(r, 0, 5 + e)); /* copy */
        }
    mscx_plan_destroy(p);
    free(c);
}
END_TEST

#define PSIGWAIT                                                                                             \
    "{'name':'signal','channel_type':'port','channel_ids':[0]},"                                             \
    "{'name':'wait','channel_type':'port','channel_ids':[0]}"

/* Port channels: put + flush + signal/wait, pws + wait, pwsf + wait. */
START_TEST(test_port_raw)
{
    static const char *const ops[] = {
        "{'name':'put','channel_type':'port','channel_ids':[0],'src_buff':[" L("i", 0) "],'dst_buff':[" R(
            1, 0) "]},"
                  "{'name':'flush','channel_type':'port','channel_ids':[0]}," PSIGWAIT,
        "{'name':'pws','channel_type':'port','channel_ids':[0],'src_buff':[" L("i", 0) "],'dst_buff':[" R(
            1, 0) "]},"
                  "{'name':'wait','channel_type':'port','channel_ids':[0]}",
        "{'name':'pwsf','channel_type':'port','channel_ids':[0],'src_buff':[" L("i", 0) "],'dst_buff':[" R(
            1, 0) "]},"
                  "{'name':'wait','channel_type':'port','channel_ids':[0]}",
    };
    struct cap *c = malloc(sizeof(*c));
    for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
        struct mscx_plan *p = plan2(false, 1, 1, 0, ops[k]);
        RUN_OK(p, fmt_i(_i), 36, 36, 1, c);
        for (uint32_t r = 0; r < 2; r++)
            expect_copy(c, r, 0, 1 - r, 0, 0, 9);
        mscx_plan_destroy(p);
    }
    free(c);
}
END_TEST

/* barrier and semaphores order two blocks of one rank; pipeline copies in 16-byte units. */
START_TEST(test_block_sync)
{
    struct cap *c = malloc(sizeof(*c));
    struct mscx_plan *p = plan1(false, 1, 2, 0, NULL,
                                "{'name':'copy','src_buff':[" L("i", 0) "],'dst_buff':[" L(
                                    "o", 0) "]},"
                                            "{'name':'barrier','barrier_id':3,'num_threadblocks':2}",
                                "{'name':'barrier','barrier_id':3,'num_threadblocks':2},"
                                "{'name':'copy','src_buff':[" L("o", 0) "],'dst_buff':[" L("o", 1) "]}");
    RUN_OK(p, fmt_i(_i), 64, 128, 3, c);
    expect_copy(c, 0, 16, 0, 2, 0, 16);
    mscx_plan_destroy(p);
    p = plan1(false, 1, 2, 0, "{'init_value':0}",
              "{'name':'copy','src_buff':[" L("i", 0) "],'dst_buff':[" L(
                  "o", 0) "]},"
                          "{'name':'sem_release','semaphore_ids':[0]}",
              "{'name':'sem_acquire','semaphore_ids':[0]},{'name':'nop'},"
              "{'name':'copy','src_buff':[" L("o", 0) "],'dst_buff':[" L("o", 1) "]}");
    RUN_OK(p, fmt_i(_i), 64, 128, 3, c);
    expect_copy(c, 0, 16, 0, 2, 0, 16);
    mscx_plan_destroy(p);
    p = plan1(false, 1, 1, 0, NULL,
              "{'name':'pipeline','iter_context':{'unit_size':16,'num_chunks':1},'ops':["
              "{'name':'copy','src_buff':[" L("i", 0) "],'dst_buff':[" L("o", 0) "]}]}",
              NULL);
    RUN_OK(p, fmt_i(_i), 100, 100, 2, c);
    expect_copy(c, 0, 0, 0, 1, 0, 25);
    mscx_plan_destroy(p);
    free(c);
}
END_TEST

struct dt_case {
    enum mscx_dtype dt;
    uint32_t a, b, want[4]; /* sum, prod, min, max */
};

static const struct dt_case dt_cases[5] = {
    {MSCX_DT_FP32, 0x40400000u, 0xc0000000u, {0x3f800000u, 0xc0c00000u, 0xc0000000u, 0x40400000u}},
    {MSCX_DT_FP16, 0x4200u, 0xc000u, {0x3c00u, 0xc600u, 0xc000u, 0x4200u}},
    {MSCX_DT_BF16, 0x4040u, 0xc000u, {0x3f80u, 0xc0c0u, 0xc000u, 0x4040u}},
    {MSCX_DT_INT32, 3u, 0xfffffffeu, {1u, 0xfffffffau, 0xfffffffeu, 3u}},
    {MSCX_DT_UINT32, 3u, 0xfffffffeu, {1u, 0xfffffffau, 3u, 0xfffffffeu}},
};

struct dt_ctx {
    const struct dt_case *dc;
    uint32_t es;
    uint8_t out[64];
};

static void dt_fill(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                    uint64_t out_bytes)
{
    struct dt_ctx *d = ctx;
    for (uint64_t e = 0; e < in_bytes / d->es; e++) {
        uint32_t v = e < in_bytes / d->es / 2 ? d->dc->a : d->dc->b;
        memcpy((uint8_t *)in + e * d->es, &v, d->es); /* little endian: low bytes */
    }
    memset(out, 0xee, out_bytes);
}

static void dt_collect(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                       const void *out, uint64_t out_bytes)
{
    struct dt_ctx *d = ctx;
    memcpy(d->out, out, out_bytes);
}

/* Every reducible dtype with every operator, through re and through cpkt + repkt (3 elements, odd). */
START_TEST(test_dtype_ops)
{
    struct mscx_plan *p[2];
    p[0] = plan1(false, 2, 1, 0, NULL,
                 "{'name':'re','src_buff':[" L("i", 0) "," L("i", 1) "],'dst_buff':[" L("o", 0) "]}", NULL);
    p[1] = plan1(
        false, 2, 1, 1, NULL,
        "{'name':'cpkt','src_buff':[" L("i", 1) "],'dst_buff':[" L(
            "s", 0) "]},"
                    "{'name':'repkt','src_buff':[" L("i", 0) "," L("s", 0) "],'dst_buff':[" L("o", 0) "]}",
        NULL);
    for (int k = 0; k < 2; k++)
        for (int d = 0; d < 5; d++)
            for (int op = 0; op < 4; op++) {
                struct dt_ctx dc = {&dt_cases[d], mscx_dtype_size(dt_cases[d].dt), {0}};
                struct mscx_hostexec_cfg cfg;
                char err[512];
                memset(&cfg, 0, sizeof(cfg));
                cfg.in_bytes = 6 * dc.es;
                cfg.out_bytes = 3 * dc.es;
                cfg.dtype = dt_cases[d].dt;
                cfg.op = (enum mscx_redop)op;
                cfg.pkt = fmt_i(_i);
                cfg.iters = 2;
                cfg.fill = dt_fill;
                cfg.collect = dt_collect;
                cfg.ctx = &dc;
                ck_assert_int_eq(mscx_hostexec_run(p[k], &cfg, err, sizeof(err)), MSCX_OK);
                for (int e = 0; e < 3; e++) {
                    uint32_t got = 0;
                    memcpy(&got, dc.out + e * dc.es, dc.es);
                    ck_assert_msg(got == dt_cases[d].want[op], "%s %s elem %d: got 0x%x want 0x%x",
                                  mscx_dtype_name(cfg.dtype), mscx_redop_name(cfg.op), e, got,
                                  dt_cases[d].want[op]);
                }
            }
    mscx_plan_destroy(p[0]);
    mscx_plan_destroy(p[1]);
}
END_TEST

/* A packet nobody sends and a signal nobody gives end in a timeout that names the op. */
START_TEST(test_timeout)
{
    struct mscx_plan *p[2];
    static const char *const want[2] = {
        "rank 0 tb 0 op 1 (upkt): waiting for packet line 0",
        "rank 1 tb 0 op 1 (wait): waiting for signal on memory channel 0 from rank 0"};
    p[0] =
        plan1(false, 1, 1, 1, NULL,
              "{'name':'nop'},{'name':'upkt','src_buff':[" L("s", 0) "],'dst_buff':[" L("o", 0) "]}", NULL);
    /* the validator refuses an unmatched wait: turn rank 0's signal into a nop after loading */
    p[1] = plan2(false, 1, 1, 0, SIGWAIT(""));
    ck_assert_uint_eq(p[1]->gpus[0].ops[0].opcode, MSCX_OP_SIGNAL);
    p[1]->gpus[0].ops[0].opcode = MSCX_OP_NOP;
    mscx_test_allow_warn("waiting for");
    for (int k = 0; k < 2; k++) {
        struct mscx_hostexec_cfg cfg;
        char err[512] = "";
        struct timespec t0, t1;
        memset(&cfg, 0, sizeof(cfg));
        cfg.in_bytes = cfg.out_bytes = 64;
        cfg.dtype = MSCX_DT_FP32;
        cfg.pkt = fmt_i(_i);
        cfg.iters = 1 + (k == 0); /* one launch: only rank 1 can be stuck */
        cfg.timeout_ms = 300;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ck_assert_int_eq(mscx_hostexec_run(p[k], &cfg, err, sizeof(err)), MSCX_ERR_TIMEOUT);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        ck_assert_msg(s < 1.2, "timeout took %.2f s", s);
        ck_assert_msg(strstr(err, want[k]) != NULL, "message '%s' lacks '%s'", err, want[k]);
        mscx_plan_destroy(p[k]);
    }
}
END_TEST

/* The same plan under different schedules gives the same bytes. */
START_TEST(test_sched_seeds)
{
    struct cap *a = malloc(sizeof(*a)), *b = malloc(sizeof(*b));
    struct mscx_plan *p =
        plan2(true, 1, 2, 3,
              "{'name':'ppkt','channel_type':'memory','src_buff':[" L("i", 0) "],'dst_buff':[" R(
                  0, 0) "]},"
                        "{'name':'recspkt','channel_type':'memory','src_buff':[" L("i", 0) "," L(
                            "s", 0) "],"
                                    "'dst_buff':[" L("o", 0) "," L("s", 2) "," R(
                                        0, 1) "]},"
                                              "{'name':'upkt','src_buff':[" L("s", 1) "],'dst_buff':[" L(
                                                  "o", 1) "]}");
    char err[512];
    ck_assert_int_eq(run_plan(p, fmt_i(_i), 1000, 2000, 4, 11, a, err), MSCX_OK);
    ck_assert_int_eq(run_plan(p, fmt_i(_i), 1000, 2000, 4, 12, b, err), MSCX_OK);
    ck_assert_mem_eq(a->out, b->out, sizeof(a->out));
    ck_assert_mem_eq(a->scr, b->scr, sizeof(a->scr));
    for (uint64_t e = 0; e < 250; e++)
        ck_assert_int_eq(word(a->out[1], e), val(0, 3, e) + val(1, 3, e));
    mscx_plan_destroy(p);
    free(a);
    free(b);
}
END_TEST

/* Rank 1 refills its buffers late in every launch after the first, as a slow caller would. */
static void slow_fill_cb(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                         uint64_t out_bytes)
{
    if (rank == 1 && iter > 0) {
        struct timespec ts = {0, 30 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    memset(out, 0xee, out_bytes);
    for (uint64_t e = 0; e < in_bytes / 4; e++) {
        int32_t v = val(rank, iter, e);
        memcpy((uint8_t *)in + 4 * e, &v, 4);
    }
}

/*
 * A peer's input or output is touched only once that peer has started the same launch: rank 1 refills both
 * late, and rank 0's put into rank 1's output and get of rank 1's input, which no wait orders after that
 * (only a signal after them), still see the refilled buffers. Without the wait the put lands before the
 * refill overwrites it, and the get reads the previous launch's input.
 */
START_TEST(test_peer_start)
{
    static const char *const ops[] = {
        "{'name':'put','channel_type':'memory','src_buff':[" L("i", 0) "],"
                                                                       "'dst_buff':[" R(1,
                                                                                        0) "]}," SIGWAIT(""),
        "{'name':'get','channel_type':'memory','src_buff':[" R(2, 0) "],"
                                                                     "'dst_buff':[" L("o",
                                                                                      0) "]}," SIGWAIT(""),
    };
    struct cap *c = malloc(sizeof(*c));
    for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
        struct mscx_plan *p = plan2(false, 1, 1, 0, ops[k]);
        struct mscx_hostexec_cfg cfg;
        struct hx_hooks hooks = {NULL, final_cb};
        char err[512];
        memset(&cfg, 0, sizeof(cfg));
        memset(c, 0, sizeof(*c));
        cfg.in_bytes = cfg.out_bytes = 36;
        cfg.dtype = MSCX_DT_INT32;
        cfg.pkt = fmt_i(_i);
        cfg.iters = 3;
        cfg.timeout_ms = 5000;
        cfg.fill = slow_fill_cb;
        cfg.collect = collect_cb;
        cfg.ctx = c;
        ck_assert_msg(mscx_hostexec_run_hooks(p, &cfg, &hooks, err, sizeof(err)) == MSCX_OK, "%s", err);
        for (uint32_t r = 0; r < 2; r++)
            expect_copy(c, r, 0, 1 - r, 2, 0, 9);
        mscx_plan_destroy(p);
    }
    free(c);
}
END_TEST

/* ---- a thread-block group at sizes that end in partial chunks and elements ---- */

#define TBG_MAX 4200

struct tbg_ctx {
    enum mscx_dtype dt;
    uint32_t es;
    uint8_t in[2][3][TBG_MAX], out[2][3][TBG_MAX]; /* [rank][launch] */
};

/* Element e of rank r's input in launch it: a small integer in [-8, 8] as the dtype holds it. */
static void tbg_elem(enum mscx_dtype dt, uint32_t r, uint32_t it, uint64_t e, uint8_t *p)
{
    int32_t v = (int32_t)((e * 7 + r * 13 + it * 5) % 17) - 8;
    uint32_t u = (uint32_t)v;
    uint16_t h;
    switch (dt) {
    case MSCX_DT_FP32:
        u = mscx_f32_bits((float)v);
        break;
    case MSCX_DT_FP16:
        h = mscx_f32_to_f16((float)v);
        u = h;
        break;
    case MSCX_DT_BF16:
        h = mscx_f32_to_bf16((float)v);
        u = h;
        break;
    default:
        break;
    }
    memcpy(p, &u, mscx_dtype_size(dt));
}

static void tbg_fill(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                     uint64_t out_bytes)
{
    struct tbg_ctx *t = ctx;
    for (uint64_t e = 0; e < in_bytes / t->es; e++)
        tbg_elem(t->dt, rank, iter, e, (uint8_t *)in + e * t->es);
    memset(out, 0xee, out_bytes);
    memcpy(t->in[rank][iter], in, in_bytes);
}

static void tbg_collect(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                        const void *out, uint64_t out_bytes)
{
    struct tbg_ctx *t = ctx;
    memcpy(t->out[rank][iter], out, out_bytes);
}

/*
 * What rank @p r's output holds after launch @p it of tbg_reduce_send_ordered_test (@p n bytes): chunk 0 is
 * its in[j] op in[c + j] (0 past the short chunk 1), chunk 1 its peer's in[j] op in[c + j], element by
 * element.
 */
static void tbg_want(const struct tbg_ctx *t, uint64_t n, enum mscx_redop op, uint32_t r, uint32_t it,
                     uint8_t *want)
{
    const uint32_t es = t->es;
    const uint64_t c = (n / es + 1) / 2 * es; /* chunk 0's bytes; chunk 1 has n - c */
    const uint8_t *mine = t->in[r][it], *peer = t->in[1 - r][it];
    for (uint64_t j = 0; j < c; j += es) {
        uint8_t other[4] = {0, 0, 0, 0};
        if (j < n - c)
            memcpy(other, mine + c + j, es);
        memcpy(want + j, mine + j, es);
        mscx_reduce_bytes(t->dt, (unsigned)op, want + j, other, es);
    }
    for (uint64_t j = 0; j < n - c; j += es) {
        memcpy(want + c + j, peer + j, es);
        mscx_reduce_bytes(t->dt, (unsigned)op, want + c + j, peer + c + j, es);
    }
}

/* Three launches at @p n bytes; every rank's output at the end of each of its own launches is checked. */
static void tbg_case(const struct mscx_plan *p, struct tbg_ctx *t, uint64_t n, enum mscx_dtype dt,
                     enum mscx_redop op, enum mscx_pkt_format pkt, uint32_t seed)
{
    struct mscx_hostexec_cfg cfg;
    char err[512];
    uint8_t want[TBG_MAX];
    memset(&cfg, 0, sizeof(cfg));
    memset(t, 0, sizeof(*t));
    t->dt = dt;
    t->es = mscx_dtype_size(dt);
    cfg.in_bytes = cfg.out_bytes = n;
    cfg.dtype = dt;
    cfg.op = op;
    cfg.pkt = pkt;
    cfg.iters = 3;
    cfg.sched_seed = seed;
    cfg.timeout_ms = 5000;
    cfg.fill = tbg_fill;
    cfg.collect = tbg_collect;
    cfg.ctx = t;
    ck_assert_msg(mscx_hostexec_run(p, &cfg, err, sizeof(err)) == MSCX_OK, "%s", err);
    for (uint32_t it = 0; it < 3; it++)
        for (uint32_t r = 0; r < 2; r++) {
            tbg_want(t, n, op, r, it, want);
            uint64_t b = 0;
            while (b < n && t->out[r][it][b] == want[b])
                b++;
            ck_assert_msg(b == n, "%llu B %s %s %s launch %u rank %u: output byte %llu: 0x%02x, want 0x%02x",
                          (unsigned long long)n, mscx_dtype_name(dt), mscx_redop_name(op),
                          pkt == MSCX_PKT_LL8 ? "ll8" : "ll16", it, r, (unsigned long long)b,
                          t->out[r][it][b], want[b]);
        }
}

/*
 * tbg_reduce_send_ordered_test (each rank reduces its input chunks 0 and 1 over a group of four blocks into
 * its output chunk 0 and its peer's output chunk 1, the slices joined by barriers before block 0 signals) at
 * sizes that do not split into two whole chunks of 16-byte units: every reducible dtype and every operator.
 */
START_TEST(test_tbg_partial_sizes)
{
    static const uint64_t sizes[] = {4, 12, 36, 100, 1000, 4096 + 12}; /* whole elements of every dtype */
    static const enum mscx_dtype dts[] = {MSCX_DT_FP32, MSCX_DT_FP16, MSCX_DT_BF16, MSCX_DT_INT32,
                                          MSCX_DT_UINT32};
    struct mscx_plan *p = NULL;
    char err[MSCX_PLAN_ERR_LEN];
    const char *path = mscx_test_src("tests/data/regressions/tbg_reduce_send_ordered_test.json");
    ck_assert_msg(mscx_plan_load(path, &p, err, sizeof(err)) == MSCX_OK, "%s", err);
    struct tbg_ctx *t = malloc(sizeof(*t));
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
        for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++)
            for (int op = 0; op < MSCX_REDOP_COUNT; op++)
                tbg_case(p, t, sizes[si], dts[d], (enum mscx_redop)op, fmt_i(_i),
                         (uint32_t)(si * 31 + d * 7 + (size_t)op + 1));
    free(t);
    mscx_plan_destroy(p);
}
END_TEST

/* The launch flag never takes 0 and alternates scratch halves across its wrap. */
START_TEST(test_flag_wrap_parity)
{
    uint32_t f = 0xfffffff0u;
    for (int i = 0; i < 40; i++) {
        uint32_t n = mscx_flag_next(f);
        ck_assert_uint_ne(n, 0);
        ck_assert_msg(mscx_scratch_offset(n, 64) != mscx_scratch_offset(f, 64),
                      "flags %#x and %#x share a half", f, n);
        f = n;
    }
    ck_assert_uint_eq(mscx_flag_next(0xffffffffu), 2u);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("hostexec");
    TCase *tc = mscx_tcase("ops");
    tcase_add_loop_test(tc, test_cpkt_layout, 0, 2);
    tcase_add_loop_test(tc, test_double_scratch_flags, 0, 2);
    tcase_add_loop_test(tc, test_ppkt_memory, 0, 2);
    tcase_add_loop_test(tc, test_forward_packets, 0, 2);
    tcase_add_loop_test(tc, test_packet_reduces, 0, 2);
    tcase_add_loop_test(tc, test_memory_raw, 0, 2);
    tcase_add_loop_test(tc, test_port_raw, 0, 2);
    tcase_add_loop_test(tc, test_block_sync, 0, 2);
    tcase_add_loop_test(tc, test_dtype_ops, 0, 2);
    tcase_add_loop_test(tc, test_timeout, 0, 2);
    tcase_add_loop_test(tc, test_sched_seeds, 0, 2);
    tcase_add_loop_test(tc, test_peer_start, 0, 2);
    tcase_add_loop_test(tc, test_tbg_partial_sizes, 0, 2);
    tcase_add_test(tc, test_flag_wrap_parity);
    suite_add_tcase(s, tc);
    return s;
}
