/* SPDX-License-Identifier: MIT */
/*
 * The fusion pass and the plan writer.
 *
 * Each rule is exercised on a small two-rank plan written inline: the rule
 * must fire the expected number of times, and the fused plan must compute
 * exactly what the original computes (host executor, same inputs, every
 * input and output byte compared, LL16 and LL8), besides passing the checked
 * simulation. Cases that must not fuse are checked to stay unchanged.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/hostexec.h"
#include "mscx/plan.h"
#include "mscx/sim.h"
#include "plan_model.h"
#include "test_common.h"

/* ---- inline plan builder ---- */

#define L(t, i) "{\"type\": \"" t "\", \"index\": " #i ", \"size\": 1}"
#define R(b, i) "{\"buffer_id\": " #b ", \"index\": " #i ", \"size\": 1}"
#define OP(name, src, dst, extra)                                                                            \
    "{\"name\": \"" name "\", \"src_buff\": [" src "], \"dst_buff\": [" dst "]" extra "},"
#define MEM ", \"channel_type\": \"memory\""
#define PORT(c) ", \"channel_ids\": [" c "], \"channel_type\": \"port\""
#define SUM ", \"reduce_op\": \"sum\""
#define TBG(i, n) ", \"tbg_info\": {\"tb_id\": " #i ", \"tbg_size\": " #n "}"
#define SYNC(name, ct, c) "{\"name\": \"" name "\", \"channel_ids\": [" c "], \"channel_type\": \"" ct "\"},"

/*
 * Rank template: two memory and two port channels to the peer, remote buffer
 * 0 = the peer's scratch, 1 = the peer's input, reachable over both types.
 * "@R" is the rank, "@P" the peer, "@O" the ops (a trailing comma is removed).
 */
static const char gpu_tmpl[] =
    "{\"id\": @R, \"input_chunks\": 4, \"output_chunks\": 4, \"scratch_chunks\": 12,"
    " \"threadblocks\": [{\"id\": 0, \"ops\": [@O],"
    "  \"channels\": [{\"channel_type\": \"memory\", \"channel_ids\": [0, 1]},"
    "                {\"channel_type\": \"port\", \"channel_ids\": [0, 1]}],"
    "  \"remote_buffer_refs\": [{\"access_channel_type\": \"memory\", \"remote_buffer_ids\": [0, 1]},"
    "                          {\"access_channel_type\": \"port\", \"remote_buffer_ids\": [0, 1]}]}],"
    " \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [@P, @P]},"
    "              {\"channel_type\": \"port\", \"connected_to\": [@P, @P]}],"
    " \"remote_buffers\": [{\"rank\": @P, \"type\": \"s\", \"access_channel_types\": [\"memory\", \"port\"]},"
    "                     {\"rank\": @P, \"type\": \"i\", \"access_channel_types\": [\"memory\", \"port\"]}],"
    " \"semaphores\": []}";

static void append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = realloc(*buf, *cap);
        ck_assert_ptr_nonnull(*buf);
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
}

static char *build_plan(const char *name, const char *proto, const char *ops)
{
    char *buf = NULL, num[16];
    size_t len = 0, cap = 0, opslen = strlen(ops);
    char head[256];
    snprintf(head, sizeof(head),
             "{\"name\": \"%s\", \"collective\": \"test\", \"protocol\": \"%s\", \"inplace\": false,"
             " \"reuse_resources\": false, \"gpus\": [",
             name, proto);
    append(&buf, &len, &cap, head, strlen(head));
    if (opslen > 0 && ops[opslen - 1] == ',')
        opslen--;
    for (int r = 0; r < 2; r++) {
        for (const char *p = gpu_tmpl; *p; p++) {
            if (p[0] == '@' && (p[1] == 'R' || p[1] == 'P')) {
                snprintf(num, sizeof(num), "%d", p[1] == 'R' ? r : 1 - r);
                append(&buf, &len, &cap, num, strlen(num));
                p++;
            } else if (p[0] == '@' && p[1] == 'O') {
                append(&buf, &len, &cap, ops, opslen);
                p++;
            } else {
                append(&buf, &len, &cap, p, 1);
            }
        }
        if (r == 0)
            append(&buf, &len, &cap, ", ", 2);
    }
    /* Packet plans double-buffer scratch: without it a peer one launch ahead could overwrite unread packets.
     */
    snprintf(head, sizeof(head),
             "], \"num_threads_per_block\": 128, \"use_double_scratch_buffer\": %s,"
             " \"buffer_alignment\": 16, \"min_message_size\": 0, \"max_message_size\": 1048576}",
             strcmp(proto, "LL") == 0 ? "true" : "false");
    append(&buf, &len, &cap, head, strlen(head));
    return buf;
}

static struct mscx_plan *load_inline(const char *name, const char *proto, const char *ops)
{
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    char *json = build_plan(name, proto, ops);
    mscx_status_t st = mscx_plan_load_buffer(json, strlen(json), name, &plan, err, sizeof(err));
    ck_assert_msg(st == MSCX_OK, "%s does not load: %s", name, err);
    free(json);
    return plan;
}

/* ---- comparing two plans on the host executor ---- */

struct capture {
    uint64_t in_bytes, out_bytes;
    uint32_t iters;
    enum mscx_dtype dtype;
    uint8_t *in[2], *out[2];
};

static void cap_fill(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                     uint64_t out_bytes)
{
    struct capture *c = ctx;
    if (out != in)
        memset(out, 0x5a, out_bytes); /* so that bytes nobody writes are compared too */
    mscx_sim_fill(c->dtype, MSCX_REDOP_SUM, 2, rank, iter, 7, in, in_bytes);
}

static void cap_collect(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                        const void *out, uint64_t out_bytes)
{
    struct capture *c = ctx;
    if (iter + 1 != c->iters || rank >= 2)
        return;
    memcpy(c->in[rank], in, in_bytes);
    memcpy(c->out[rank], out, out_bytes);
}

static void run_capture(const struct mscx_plan *plan, uint64_t bytes, enum mscx_pkt_format pkt,
                        uint32_t iters, struct capture *c)
{
    char err[512];
    struct mscx_hostexec_cfg cfg;
    memset(c, 0, sizeof(*c));
    mscx_coll_sizes(mscx_plan_collective(plan), 2, bytes, &c->in_bytes, &c->out_bytes);
    c->iters = iters;
    c->dtype = MSCX_DT_FP32;
    for (int r = 0; r < 2; r++) {
        c->in[r] = calloc(1, c->in_bytes + 1);
        c->out[r] = calloc(1, c->out_bytes + 1);
    }
    memset(&cfg, 0, sizeof(cfg));
    cfg.in_bytes = c->in_bytes;
    cfg.out_bytes = c->out_bytes;
    cfg.dtype = MSCX_DT_FP32;
    cfg.op = MSCX_REDOP_SUM;
    cfg.pkt = pkt;
    cfg.iters = iters;
    cfg.fill = cap_fill;
    cfg.collect = cap_collect;
    cfg.ctx = c;
    mscx_status_t st = mscx_hostexec_run(plan, &cfg, err, sizeof(err));
    ck_assert_msg(st == MSCX_OK, "%s: host executor failed: %s", mscx_plan_name(plan), err);
}

static void free_capture(struct capture *c)
{
    for (int r = 0; r < 2; r++) {
        free(c->in[r]);
        free(c->out[r]);
    }
}

/* The fused plan must produce the same bytes as the original, LL16 and LL8, and pass the checked simulation.
 */
static void check_same_results(const struct mscx_plan *a, const struct mscx_plan *b, uint32_t iters)
{
    static const uint64_t sizes[] = {4096, 1004};
    for (int p = 0; p < 2; p++) {
        enum mscx_pkt_format pkt = p ? MSCX_PKT_LL8 : MSCX_PKT_LL16;
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            struct capture ca, cb;
            run_capture(a, sizes[s], pkt, iters, &ca);
            run_capture(b, sizes[s], pkt, iters, &cb);
            for (int r = 0; r < 2; r++) {
                ck_assert_msg(memcmp(ca.in[r], cb.in[r], ca.in_bytes) == 0,
                              "%s: rank %d input differs (%s, %llu B)", mscx_plan_name(a), r,
                              p ? "ll8" : "ll16", (unsigned long long)sizes[s]);
                ck_assert_msg(memcmp(ca.out[r], cb.out[r], ca.out_bytes) == 0,
                              "%s: rank %d output differs (%s, %llu B)", mscx_plan_name(a), r,
                              p ? "ll8" : "ll16", (unsigned long long)sizes[s]);
            }
            free_capture(&ca);
            free_capture(&cb);
            for (int which = 0; which < 2; which++) {
                struct mscx_sim_case c = {.msg_bytes = sizes[s],
                                          .dtype = MSCX_DT_FP32,
                                          .op = MSCX_REDOP_SUM,
                                          .pkt = pkt,
                                          .iters = iters,
                                          .seed = 3};
                struct mscx_sim_result res;
                mscx_status_t st = mscx_sim_check(which ? b : a, &c, &res);
                ck_assert_msg(st == MSCX_OK && res.pass, "%s (%s): sim failed: %s", mscx_plan_name(a),
                              which ? "fused" : "original", res.msg);
            }
        }
    }
}

static void check_round_trip(const struct mscx_plan *plan, const char *what);

/* ---- the rules ---- */

struct fuse_case {
    const char *name;
    const char *proto;
    const char *ops;                     /* per rank */
    uint32_t ops_after;                  /* per rank */
    uint32_t hits[MSCX_FUSE_RULE_COUNT]; /* per rank */
    uint32_t iters;
};

static const struct fuse_case fuse_cases[] = {
    {"repkt_cpkt",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("repkt", L("i", 0) "," L("s", 0), L("i", 0), SUM)
         OP("cpkt", L("i", 0), L("s", 2), "") OP("upkt", L("s", 2), L("o", 0), ""),
     3,
     {[MSCX_FUSE_REPKT_CPKT] = 1},
     3},
    {"recpkt_ppkt",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("recpkt", L("i", 0) "," L("s", 0), L("i", 0) "," L("s", 2), SUM)
         OP("ppkt", L("i", 0), R(0, 1), MEM) OP("upkt", L("s", 1), L("o", 0), "")
             OP("upkt", L("s", 2), L("o", 1), ""),
     4,
     {[MSCX_FUSE_RECPKT_PPKT] = 1},
     3},
    {"chain_recspkt",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("repkt", L("i", 0) "," L("s", 0), L("i", 0), SUM)
         OP("cpkt", L("i", 0), L("s", 2), "") OP("ppkt", L("i", 0), R(0, 1), MEM)
             OP("rppkt", L("s", 2), R(0, 3), MEM) OP("upkt", L("s", 1), L("o", 0), "")
                 OP("upkt", L("s", 3), L("o", 1), ""),
     4,
     {[MSCX_FUSE_REPKT_CPKT] = 1, [MSCX_FUSE_RECPKT_PPKT] = 1, [MSCX_FUSE_RECPKT_RPPKT] = 1},
     3},
    {"rppkt_rppkt",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("rppkt", L("s", 0), R(0, 1), MEM)
         OP("rppkt", L("s", 0), R(0, 2), MEM) OP("upkt", L("s", 1), L("o", 0), "")
             OP("upkt", L("s", 2), L("o", 1), ""),
     4,
     {[MSCX_FUSE_RPPKT_RPPKT] = 1},
     3},
    {"repkt_ppkt",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("repkt", L("i", 0) "," L("s", 0), L("i", 0), SUM)
         OP("ppkt", L("i", 0), R(0, 1), MEM) OP("upkt", L("s", 1), L("o", 0), ""),
     3,
     {[MSCX_FUSE_REPKT_PPKT] = 1},
     3},
    {"respkt_ppkt",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("respkt", L("i", 0) "," L("s", 0), L("i", 0) "," R(0, 1), MEM SUM)
         OP("ppkt", L("i", 0), R(0, 2), MEM) OP("upkt", L("s", 1), L("o", 0), "")
             OP("upkt", L("s", 2), L("o", 1), ""),
     4,
     {[MSCX_FUSE_REPKT_PPKT] = 1},
     3},
    {"ppkt_repkt_repkt",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("ppkt", L("i", 1), R(0, 1), MEM)
         OP("repkt", L("i", 0) "," L("s", 0), L("i", 0), SUM)
             OP("repkt", L("i", 0) "," L("s", 1), L("i", 0), SUM),
     2,
     {[MSCX_FUSE_OTHER] = 2},
     3},
    {"re_put",
     "Simple",
     SYNC("signal", "memory", "0") SYNC("wait", "memory", "0")
         OP("re", L("i", 0) "," L("i", 1), L("o", 0), SUM) OP("put", L("o", 0), R(0, 0), MEM)
             SYNC("signal", "memory", "1") SYNC("wait", "memory", "1") OP("copy", L("s", 0), L("o", 1), ""),
     6,
     {[MSCX_FUSE_OTHER] = 1},
     1},
    {"rre_rre_put",
     "Simple",
     SYNC("signal", "memory", "0") SYNC("wait", "memory", "0") OP("copy", L("i", 0), L("o", 0), "")
         OP("rre", L("o", 0) "," R(1, 0), L("o", 0), MEM SUM) OP("rre", L("o", 0) "," R(1, 1), L("o", 0),
                                                                 MEM SUM) OP("put", L("o", 0), R(0, 0), MEM)
             SYNC("signal", "memory", "1") SYNC("wait", "memory", "1") OP("copy", L("s", 0), L("o", 1), ""),
     7,
     {[MSCX_FUSE_OTHER] = 2},
     1},
    {"get_get",
     "Simple",
     SYNC("signal", "memory", "0") SYNC("wait", "memory", "0")
         OP("get", R(1, 0), L("o", 0), ", \"channel_ids\": [0]" MEM)
             OP("get", R(1, 1), L("o", 1), ", \"channel_ids\": [0]" MEM) SYNC("signal", "memory", "1")
                 SYNC("wait", "memory", "1"),
     5,
     {[MSCX_FUSE_OTHER] = 1},
     1},
    {"put_put_signal_signal",
     "Simple",
     OP("put", L("i", 0), R(0, 0), MEM) OP("put", L("i", 1), R(0, 1), MEM) SYNC("signal", "memory", "0")
         SYNC("signal", "memory", "1") SYNC("wait", "memory", "0") SYNC("wait", "memory", "1")
             OP("copy", L("s", 0), L("o", 0), "") OP("copy", L("s", 1), L("o", 1), ""),
     5,
     {[MSCX_FUSE_OTHER] = 3},
     1},
    {"pws_pws",
     "Simple",
     OP("pws", L("i", 0), R(0, 0), PORT("0")) OP("pws", L("i", 1), R(0, 1), PORT("1"))
         SYNC("wait", "port", "0") SYNC("wait", "port", "1") OP("copy", L("s", 0), L("o", 0), "")
             OP("copy", L("s", 1), L("o", 1), ""),
     4,
     {[MSCX_FUSE_OTHER] = 2},
     1},
    {"pwsf_pwsf",
     "Simple",
     OP("pwsf", L("i", 0), R(0, 0), PORT("0")) OP("pwsf", L("i", 1), R(0, 1), PORT("1"))
         SYNC("wait", "port", "0") SYNC("wait", "port", "1") OP("copy", L("s", 0), L("o", 0), "")
             OP("copy", L("s", 1), L("o", 1), ""),
     4,
     {[MSCX_FUSE_OTHER] = 2},
     1},
    {"port_put_flush_flush",
     "Simple",
     OP("put", L("i", 0), R(0, 0), PORT("0")) OP("put", L("i", 1), R(0, 1), PORT("1"))
         SYNC("flush", "port", "0") SYNC("flush", "port", "1") SYNC("signal", "port", "0") SYNC(
             "wait", "port", "0") OP("copy", L("s", 0), L("o", 0), "") OP("copy", L("s", 1), L("o", 1), ""),
     6,
     {[MSCX_FUSE_OTHER] = 2},
     1},
    /* ---- cases that must not fuse ---- */
    {"no_tbg_differs",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("repkt", L("i", 0) "," L("s", 0), L("i", 0), SUM TBG(0, 1))
         OP("cpkt", L("i", 0), L("s", 2), "") OP("upkt", L("s", 2), L("o", 0), ""),
     4,
     {0},
     3},
    {"no_port_ppkt_after_repkt",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("repkt", L("s", 4) "," L("s", 0), L("s", 4), SUM)
         OP("ppkt", L("s", 4), R(0, 2), PORT("0")),
     3,
     {0},
     3},
    {"no_port_put_after_re",
     "Simple",
     OP("re", L("i", 0) "," L("i", 1), L("o", 0), SUM) OP("put", L("o", 0), R(0, 0), PORT("0")),
     2,
     {0},
     1},
    {"no_operand_mismatch",
     "LL",
     OP("ppkt", L("i", 0), R(0, 0), MEM) OP("repkt", L("i", 0) "," L("s", 0), L("i", 0), SUM)
         OP("cpkt", L("i", 1), L("s", 2), "") OP("upkt", L("s", 2), L("o", 0), ""),
     4,
     {0},
     3},
    {"no_signal_same_channel",
     "Simple",
     SYNC("signal", "memory", "0") SYNC("signal", "memory", "0") SYNC("wait", "memory", "0")
         SYNC("wait", "memory", "0"),
     4,
     {0},
     1},
    {"no_reduce_not_in_place",
     "Simple",
     OP("re", L("i", 0) "," L("i", 1), L("o", 0), SUM) OP("re", L("i", 0) "," L("i", 2), L("o", 0), SUM),
     2,
     {0},
     1},
};

START_TEST(test_rule)
{
    const struct fuse_case *fc = &fuse_cases[_i];
    struct mscx_plan *plan = load_inline(fc->name, fc->proto, fc->ops), *fused = NULL;
    struct mscx_fuse_stats st;
    uint32_t before = plan->gpus[0].nops;
    ck_assert_int_eq(mscx_plan_fuse(plan, &fused, &st), MSCX_OK);
    ck_assert_uint_eq(st.ops_before, 2 * before);
    ck_assert_msg(st.ops_after == 2 * fc->ops_after, "%s: %u ops after fusion, expected %u", fc->name,
                  st.ops_after, 2 * fc->ops_after);
    for (int r = 0; r < MSCX_FUSE_RULE_COUNT; r++)
        ck_assert_msg(st.rule_hits[r] == 2 * fc->hits[r], "%s: rule %d fired %u times, expected %u", fc->name,
                      r, st.rule_hits[r], 2 * fc->hits[r]);
    ck_assert(fused->fused);
    ck_assert_uint_eq(fused->fuse.ops_after, st.ops_after);
    ck_assert_uint_eq(fused->gpus[1].nops, fc->ops_after);
    /* The original is untouched. */
    ck_assert_uint_eq(plan->gpus[0].nops, before);
    check_round_trip(plan, fc->name);
    check_round_trip(fused, fc->name);
    if (strncmp(fc->name, "no_", 3) != 0) /* the non-fusion plans only need to load */
        check_same_results(plan, fused, fc->iters);
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
}
END_TEST

START_TEST(test_fused_ops_shape)
{
    /* recpkt + rppkt: the rppkt's destination is appended after the packet copy. */
    struct mscx_plan *plan = load_inline(fuse_cases[2].name, "LL", fuse_cases[2].ops), *fused = NULL;
    ck_assert_int_eq(mscx_plan_fuse(plan, &fused, NULL), MSCX_OK);
    const struct mscx_gpu *g = &fused->gpus[0];
    const struct mscx_dev_op *op = &g->ops[g->tb[0].op_begin + 1];
    ck_assert_uint_eq(op->opcode, MSCX_OP_REDUCE_COPY_SEND_PACKETS);
    ck_assert_uint_eq(op->chan_type, MSCX_CHAN_MEMORY);
    ck_assert_uint_eq(op->nsrc, 2);
    ck_assert_uint_eq(op->ndst, 4);
    ck_assert_uint_eq(op->dst[0].type, MSCX_BUF_INPUT);
    ck_assert_uint_eq(op->dst[1].type, MSCX_BUF_SCRATCH);
    ck_assert_uint_eq(op->dst[1].index, 2);
    ck_assert(op->dst[2].flags & MSCX_OPND_REMOTE);
    ck_assert_uint_eq(op->dst[2].index, 1);
    ck_assert_uint_eq(op->dst[3].index, 3);
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
}
END_TEST

START_TEST(test_operand_limit)
{
    /* 1 + 5 and 1 + 5 packet sources would need 11 operands: the limit stops the fusion. */
    static const char ops[] =
        OP("repkt", L("o", 0) "," L("s", 0) "," L("s", 1) "," L("s", 2) "," L("s", 3) "," L("s", 4),
           L("o", 0), SUM)
            OP("repkt", L("o", 0) "," L("s", 5) "," L("s", 6) "," L("s", 7) "," L("s", 8) "," L("s", 9),
               L("o", 0), SUM) OP("repkt", L("o", 0) "," L("s", 10), L("o", 0), SUM);
    struct mscx_plan *plan = load_inline("limit", "LL", ops), *fused = NULL;
    struct mscx_fuse_stats st;
    ck_assert_int_eq(mscx_plan_fuse(plan, &fused, &st), MSCX_OK);
    /* The first two cannot merge (11 > 10); the second and third can (6 + 1 = 7). */
    ck_assert_uint_eq(fused->gpus[0].nops, 2);
    ck_assert_uint_eq(fused->gpus[0].ops[0].nsrc, 6);
    ck_assert_uint_eq(fused->gpus[0].ops[1].nsrc, 7);
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
}
END_TEST

START_TEST(test_channel_limit)
{
    /* Nine signals on distinct channels: eight merge, the ninth stays on its own. */
    char ops[2048] = "", waits[2048] = "";
    char json[16384];
    size_t n = 0, m = 0;
    for (int k = 0; k < 9; k++) {
        n += (size_t)snprintf(ops + n, sizeof(ops) - n,
                              "%s{\"name\": \"signal\", \"channel_ids\": [%d], "
                              "\"channel_type\": \"memory\"}",
                              k ? ", " : "", k);
        m += (size_t)snprintf(waits + m, sizeof(waits) - m,
                              "%s{\"name\": \"wait\", \"channel_ids\": [%d], "
                              "\"channel_type\": \"memory\"}",
                              k ? ", " : "", k);
    }
    snprintf(
        json, sizeof(json),
        "{\"name\": \"chanlimit\", \"collective\": \"test\", \"protocol\": \"Simple\", \"inplace\": false,"
        " \"gpus\": [{\"id\": 0, \"input_chunks\": 1, \"output_chunks\": 1, \"scratch_chunks\": 0,"
        " \"threadblocks\": [{\"id\": 0, \"ops\": [%s], \"channels\": [{\"channel_type\": \"memory\","
        " \"channel_ids\": [0, 1, 2, 3, 4, 5, 6, 7, 8]}], \"remote_buffer_refs\": []}],"
        " \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [1, 1, 1, 1, 1, 1, 1, 1, 1]}],"
        " \"remote_buffers\": [], \"semaphores\": []},"
        " {\"id\": 1, \"input_chunks\": 1, \"output_chunks\": 1, \"scratch_chunks\": 0,"
        " \"threadblocks\": [{\"id\": 0, \"ops\": [%s], \"channels\": [{\"channel_type\": \"memory\","
        " \"channel_ids\": [0, 1, 2, 3, 4, 5, 6, 7, 8]}], \"remote_buffer_refs\": []}],"
        " \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [0, 0, 0, 0, 0, 0, 0, 0, 0]}],"
        " \"remote_buffers\": [], \"semaphores\": []}]}",
        ops, waits);
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL, *fused = NULL;
    ck_assert_msg(mscx_plan_load_buffer(json, strlen(json), "chanlimit", &plan, err, sizeof(err)) == MSCX_OK,
                  "%s", err);
    ck_assert_int_eq(mscx_plan_fuse(plan, &fused, NULL), MSCX_OK);
    ck_assert_uint_eq(fused->gpus[0].nops, 2);
    ck_assert_uint_eq(fused->gpus[0].ops[0].nchan, MSCX_MAX_CHAN_PER_OP);
    ck_assert_uint_eq(fused->gpus[0].ops[1].nchan, 1);
    ck_assert_uint_eq(fused->gpus[1].nops, 2);
    ck_assert_uint_eq(fused->gpus[1].ops[0].opcode, MSCX_OP_WAIT);
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
}
END_TEST

START_TEST(test_pipeline_boundary)
{
    /* Two copies... no rule merges copies, so use puts: one before the pipeline, two inside, one after. */
    static const char ops[] =
        OP("put", L("i", 0), R(0, 0), MEM) "{\"name\": \"pipeline\", \"iter_context\": {\"unit_size\": 1024, "
                                           "\"num_chunks\": 1}, \"ops\": [" OP("put", L("i", 1), R(0, 1), MEM)
                                               OP("put", L("i", 2), R(0, 2), MEM) "{\"name\": \"nop\"}]}," OP(
                                                   "put", L("i", 3), R(0, 3), MEM);
    struct mscx_plan *plan = load_inline("pipe", "Simple", ops), *fused = NULL;
    struct mscx_fuse_stats st;
    ck_assert_int_eq(mscx_plan_fuse(plan, &fused, &st), MSCX_OK);
    const struct mscx_gpu *g = &fused->gpus[0];
    ck_assert_uint_eq(g->nops, 5); /* put, pipeline{put(2 pairs), nop}, put */
    ck_assert_uint_eq(g->ops[1].opcode, MSCX_OP_PIPELINE);
    ck_assert_uint_eq(g->ops[1].pipe_nops, 2);
    ck_assert_uint_eq(g->ops[2].nsrc, 2);
    ck_assert_uint_eq(g->ops[4].nsrc, 1);
    ck_assert_uint_eq(st.rule_hits[MSCX_FUSE_OTHER], 2);
    /* Written and read back, the body is nested again. */
    char *a = NULL, *b = NULL, err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *back = NULL;
    ck_assert_int_eq(mscx_plan_to_json(fused, &a), MSCX_OK);
    ck_assert_msg(mscx_plan_load_buffer(a, strlen(a), "pipe-back", &back, err, sizeof(err)) == MSCX_OK, "%s",
                  err);
    ck_assert_uint_eq(back->gpus[0].ops[1].pipe_nops, 2);
    ck_assert_int_eq(mscx_plan_to_json(back, &b), MSCX_OK);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
    mscx_plan_destroy(back);
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
}
END_TEST

/* ---- fixtures ---- */

static int list_json(const char *dir, char names[][128], int max)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    ck_assert_msg(d != NULL, "cannot open %s", dir);
    while ((e = readdir(d)) != NULL && n < max) {
        size_t len = strlen(e->d_name);
        if (len > 5 && strcmp(e->d_name + len - 5, ".json") == 0)
            snprintf(names[n++], 128, "%s", e->d_name);
    }
    closedir(d);
    ck_assert_int_gt(n, 0);
    return n;
}

static struct mscx_plan *load_file(const char *path)
{
    char err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    ck_assert_msg(mscx_plan_load(path, &plan, err, sizeof(err)) == MSCX_OK, "%s does not load: %s", path,
                  err);
    return plan;
}

static void assert_same_ops(const struct mscx_plan *a, const struct mscx_plan *b, const char *what)
{
    ck_assert_uint_eq(a->nranks, b->nranks);
    for (uint32_t r = 0; r < a->nranks; r++) {
        const struct mscx_gpu *ga = &a->gpus[r], *gb = &b->gpus[r];
        ck_assert_msg(ga->nops == gb->nops && ga->ntb == gb->ntb, "%s: rank %u shape differs", what, r);
        for (uint32_t i = 0; i < ga->nops; i++)
            ck_assert_msg(memcmp(&ga->ops[i], &gb->ops[i], sizeof(ga->ops[i])) == 0,
                          "%s: rank %u op %u differs", what, r, i);
        for (uint32_t t = 0; t < ga->ntb; t++)
            ck_assert_msg(ga->tb[t].op_begin == gb->tb[t].op_begin && ga->tb[t].nops == gb->tb[t].nops,
                          "%s: rank %u tb %u differs", what, r, t);
    }
}

/* load -> to_json -> load gives the same ops; our own output is a fixed point. */
static void check_round_trip(const struct mscx_plan *plan, const char *what)
{
    char *a = NULL, *b = NULL, err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *back = NULL;
    ck_assert_int_eq(mscx_plan_to_json(plan, &a), MSCX_OK);
    ck_assert_msg(mscx_plan_load_buffer(a, strlen(a), what, &back, err, sizeof(err)) == MSCX_OK,
                  "%s: our output does not load: %s", what, err);
    assert_same_ops(plan, back, what);
    ck_assert_int_eq(back->fused, plan->fused);
    ck_assert_int_eq(mscx_plan_to_json(back, &b), MSCX_OK);
    ck_assert_msg(strcmp(a, b) == 0, "%s: writing the reloaded plan changes the output", what);
    free(a);
    free(b);
    mscx_plan_destroy(back);
}

START_TEST(test_round_trip_fixtures)
{
    static const char *const dirs[] = {"mscclpp-op-plans", "mscclpp-algo-plans"};
    char names[64][128], path[9400];
    for (size_t d = 0; d < 2; d++) {
        const char *dir = mscx_test_ref(dirs[d]);
        char dirbuf[1024];
        snprintf(dirbuf, sizeof(dirbuf), "%s", dir);
        int n = list_json(dirbuf, names, 64);
        for (int i = 0; i < n; i++) {
            /* refused at load: they signal and wait on different channel pairs (see test_plan.c) */
            if (strstr(names[i], "signal_wait_fuse_test") != NULL)
                continue;
            snprintf(path, sizeof(path), "%s/%s", dirbuf, names[i]);
            struct mscx_plan *plan = load_file(path), *fused = NULL;
            check_round_trip(plan, names[i]);
            ck_assert_int_eq(mscx_plan_fuse(plan, &fused, NULL), MSCX_OK);
            check_round_trip(fused, names[i]);
            mscx_plan_destroy(fused);
            mscx_plan_destroy(plan);
        }
    }
}
END_TEST

/* The DSL already fused these: fusing again changes nothing, and they still run. */
static const char *const prefused[] = {
    "flush_fuse_test.json",  "get_fuse_test.json",           "put_fuse_test.json",
    "reduce_fuse_test.json", "reduce_copy_packet_test.json", "reduce_copy_send_packet_test.json",
};

START_TEST(test_prefused_fixture)
{
    char path[1024], err[MSCX_PLAN_ERR_LEN];
    snprintf(path, sizeof(path), "%s/%s", mscx_test_ref("mscclpp-op-plans"), prefused[_i]);
    struct mscx_plan *plan = load_file(path), *fused = NULL;
    struct mscx_fuse_stats st;
    ck_assert_int_eq(mscx_plan_fuse(plan, &fused, &st), MSCX_OK);
    ck_assert_msg(st.ops_after == st.ops_before, "%s: %u -> %u ops", prefused[_i], st.ops_before,
                  st.ops_after);
    assert_same_ops(plan, fused, prefused[_i]);
    /*
     * The packet fixtures also run. (Some Simple ones are DSL op demonstrations
     * that race or wait on unpaired channels by design; fusion leaves their ops
     * unchanged, as asserted above.)
     */
    if (strstr(prefused[_i], "packet") != NULL && mscx_plan_executable(fused, err, sizeof(err)) == MSCX_OK) {
        struct mscx_sim_case c = {.msg_bytes = 4096,
                                  .dtype = MSCX_DT_FP32,
                                  .op = MSCX_REDOP_SUM,
                                  .pkt = MSCX_PKT_LL16,
                                  .iters = 1,
                                  .seed = 1};
        struct mscx_sim_result res;
        ck_assert_int_eq(mscx_sim_check(fused, &c, &res), MSCX_OK);
        ck_assert_msg(res.pass, "%s: %s", prefused[_i], res.msg);
    }
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
}
END_TEST

static const char *const algo_plans[] = {"allreduce_pkt_n2.json", "allreduce_pkt_n4.json",
                                         "allreduce_pkt_n8.json"};

START_TEST(test_algo_plan)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", mscx_test_ref("mscclpp-algo-plans"), algo_plans[_i]);
    struct mscx_plan *plan = load_file(path), *fused = NULL;
    struct mscx_fuse_stats st;
    uint64_t lo, hi;
    ck_assert_int_eq(mscx_plan_fuse(plan, &fused, &st), MSCX_OK);
    ck_assert_uint_le(st.ops_after, st.ops_before);
    mscx_plan_size_range(fused, &lo, &hi);
    uint64_t n = mscx_plan_nranks(fused);
    uint64_t sizes[] = {n * 4 * 256, n * 4 * 1001};
    for (size_t s = 0; s < 2; s++) {
        if (sizes[s] < lo || sizes[s] > hi)
            continue;
        for (int p = 0; p < 2; p++) {
            struct mscx_sim_case c = {.msg_bytes = sizes[s],
                                      .dtype = MSCX_DT_FP32,
                                      .op = MSCX_REDOP_SUM,
                                      .pkt = p ? MSCX_PKT_LL8 : MSCX_PKT_LL16,
                                      .iters = 3,
                                      .seed = 5};
            struct mscx_sim_result res;
            ck_assert_int_eq(mscx_sim_check(fused, &c, &res), MSCX_OK);
            ck_assert_msg(res.pass, "%s fused, %llu B: %s", algo_plans[_i], (unsigned long long)sizes[s],
                          res.msg);
        }
    }
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
}
END_TEST

START_TEST(test_extension_written)
{
    struct mscx_plan *plan = load_inline("ext", "LL", fuse_cases[0].ops), *fused = NULL;
    char *a = NULL, *b = NULL;
    ck_assert_int_eq(mscx_plan_to_json(plan, &a), MSCX_OK);
    ck_assert_ptr_null(strstr(a, "\"mscx\""));
    ck_assert_ptr_null(strstr(a, "tbg_info"));
    ck_assert_int_eq(mscx_plan_fuse(plan, &fused, NULL), MSCX_OK);
    ck_assert_int_eq(mscx_plan_to_json(fused, &b), MSCX_OK);
    ck_assert_ptr_nonnull(strstr(b, "\"mscx\""));
    ck_assert_ptr_nonnull(strstr(b, "\"ops_before\": 8"));
    ck_assert_ptr_nonnull(strstr(b, "\"ops_after\": 6"));
    ck_assert_ptr_nonnull(strstr(b, "\"recpkt\""));
    free(a);
    free(b);
    mscx_plan_destroy(fused);
    mscx_plan_destroy(plan);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("fuse");
    TCase *tc = mscx_tcase("rules");
    tcase_add_loop_test(tc, test_rule, 0, (int)(sizeof(fuse_cases) / sizeof(fuse_cases[0])));
    tcase_add_test(tc, test_fused_ops_shape);
    tcase_add_test(tc, test_operand_limit);
    tcase_add_test(tc, test_channel_limit);
    tcase_add_test(tc, test_pipeline_boundary);
    suite_add_tcase(s, tc);
    tc = mscx_tcase("fixtures");
    tcase_add_test(tc, test_round_trip_fixtures);
    tcase_add_loop_test(tc, test_prefused_fixture, 0, (int)(sizeof(prefused) / sizeof(prefused[0])));
    tcase_add_loop_test(tc, test_algo_plan, 0, (int)(sizeof(algo_plans) / sizeof(algo_plans[0])));
    tcase_add_test(tc, test_extension_written);
    suite_add_tcase(s, tc);
    return s;
}
