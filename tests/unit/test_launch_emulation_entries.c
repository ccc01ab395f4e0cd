/* SPDX-License-Identifier: MIT */
/*
 * The launch emulation's entries, run as mscx_entry_run runs them
 * (kernels/exec_ops.cuh): each entry's operands, located in the encoded
 * block record and checked against their buffer (user buffers, the
 * launch's half of a scratch) and alignment; whether every packet line it
 * reads carries the launch's flag; and the entry itself (pack, unpack,
 * forward, reduce-packets, copy, reduce) on the host.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "test_common.h"
#include "launch_abi.h"
#include "op_math.h"
#include "plan_model.h"
#include "test_launch_emulation_int.h"

/* ---- the entries, as mscx_entry_run runs them ---- */

const char *kind_name(uint32_t k)
{
    static const char *const names[] = {"generic", "pack", "unpack", "fwd",
                                        "redpkt",  "copy", "reduce", "skip"};
    return k < sizeof(names) / sizeof(names[0]) ? names[k] : "?";
}

static uint32_t ld32(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void st32(char *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

/* mscx_dvload / mscx_dvstore: @p nb (4, 8 or 16) payload bytes as words. */
static void vload(const char *p, uint32_t nb, uint32_t w[4])
{
    w[0] = w[1] = w[2] = w[3] = 0;
    memcpy(w, p, nb);
}

static void vstore(char *p, uint32_t nb, const uint32_t w[4])
{
    memcpy(p, w, nb);
}

/* mscx_dline_read's flag test: LL16 {d0, flag, d1, flag}, LL8 {d0, flag}. */
static int line_ready(const char *line, enum mscx_pkt_format pkt, uint32_t flag)
{
    if (pkt == MSCX_PKT_LL8)
        return ld32(line + 4) == flag;
    return ld32(line + 4) == flag && ld32(line + 12) == flag;
}

static void line_read(const char *line, enum mscx_pkt_format pkt, uint32_t w[4])
{
    w[0] = ld32(line);
    w[1] = pkt == MSCX_PKT_LL8 ? 0 : ld32(line + 8);
    w[2] = w[3] = 0;
}

static void line_store(char *line, enum mscx_pkt_format pkt, const uint32_t w[4], uint32_t flag)
{
    st32(line, w[0]);
    st32(line + 4, flag);
    if (pkt != MSCX_PKT_LL8) {
        st32(line + 8, w[1]);
        st32(line + 12, flag);
    }
}

/* mscx_dreduce<DT, nw>: the first @p nw words, acc op v. */
static void vreduce(const struct emu *e, uint32_t acc[4], const uint32_t v[4], uint32_t nw)
{
    for (uint32_t i = 0; i < nw; i++)
        acc[i] = mscx_reduce_word(e->dt, e->op, acc[i], v[i]);
}

static struct opnd opnd_at(const struct rank_st *R, uint32_t b, uint32_t j, uint32_t parity)
{
    const struct mscx_tagged_ptr *po =
        (const struct mscx_tagged_ptr *)(R->rec + (size_t)R->stride * b + 16u * (1u + R->kmax));
    uint64_t v0 = po[j].v[0], tag = v0 >> MSCX_TAGGED_TAG_SHIFT;
    struct opnd o = {NULL, tag};
    if (tag == 0)
        o.p = (char *)(uintptr_t)(parity ? po[j].v[1] : v0);
    else
        o.p = (char *)(tag == 1 ? R->in : R->out) + (v0 & MSCX_TAGGED_OFF_MASK);
    return o;
}

void emu_fail(const struct emu *e, const struct loc *L, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ck_abort_msg("%s: rank %u launch %u block %u entry %u (op %u %s, %s, %u units): %s", e->what, L->rank,
                 e->r[L->rank].launch + 1, L->block, L->entry, L->k->op,
                 mscx_opcode_name((enum mscx_opcode)L->k->opcode), kind_name(L->k->kind), L->k->units, msg);
}

/* Operand @p j covers @p bytes: inside its buffer (a scratch: the launch's half), and aligned. */
static void check_access(const struct emu *e, const struct loc *L, uint32_t j, const struct opnd *o,
                         uint64_t bytes, uint32_t align, const char *what)
{
    const struct rank_st *R = &e->r[L->rank];
    uintptr_t p = (uintptr_t)o->p;
    if (p & (align - 1u))
        emu_fail(e, L, "operand %u (%s) at %#llx not %u-byte aligned", j, what, (unsigned long long)p, align);
    if (o->tag != 0) {
        const uint8_t *base = o->tag == 1 ? R->in : R->out;
        uint64_t have = o->tag == 1 ? e->in_bytes : e->out_bytes, off = (uint64_t)(p - (uintptr_t)base);
        if (o->tag > 2 || off + bytes > have)
            emu_fail(e, L, "operand %u (%s) %s [%llu, +%llu) past %llu bytes", j, what,
                     o->tag == 1 ? "input" : "output", (unsigned long long)off, (unsigned long long)bytes,
                     (unsigned long long)have);
        return;
    }
    for (uint32_t q = 0; q < e->n; q++) {
        const struct rank_st *S = &e->r[q];
        uintptr_t s = (uintptr_t)S->scratch;
        if (!S->scratch || p < s || p >= s + S->scratch_bytes)
            continue;
        /* the launch's half of that scratch (mscx_scratch_offset): a peer may be in the other launch */
        uint64_t lo = mscx_scratch_offset(R->flag, S->half), len = S->half ? S->half : S->scratch_bytes;
        uint64_t off = (uint64_t)(p - s);
        if (off < lo || off + bytes > lo + len)
            emu_fail(
                e, L,
                "operand %u (%s) scratch of rank %u [%llu, +%llu) outside the half [%llu, +%llu) of flag %u",
                j, what, q, (unsigned long long)off, (unsigned long long)bytes, (unsigned long long)lo,
                (unsigned long long)len, R->flag);
        return;
    }
    emu_fail(e, L, "operand %u (%s) at %#llx is in no buffer", j, what, (unsigned long long)p);
}

/* The operands of entry @p L->k, each checked for the bytes it touches; @p is_line: packet lines. */
void entry_operands(const struct emu *e, const struct loc *L, struct opnd *P, uint8_t *is_line)
{
    const struct rank_st *R = &e->r[L->rank];
    const struct mscx_entry *k = L->k;
    const uint64_t pl = mscx_pkt_payload(e->pkt), ll = mscx_pkt_line(e->pkt), n = k->units;
    const struct mscx_record_head *h =
        (const struct mscx_record_head *)(R->rec + (size_t)R->stride * L->block);
    uint32_t no = (uint32_t)k->nsrc + k->ndst;
    if (k->kind == MSCX_ENTRY_SKIP)
        return; /* a fused unpack keeps its operands, unused */
    if (k->opnd + no > h->np)
        emu_fail(e, L, "operands [%u, +%u) past the block's %u", k->opnd, no, h->np);
    for (uint32_t j = 0; j < no; j++) {
        P[j] = opnd_at(R, L->block, k->opnd + j, R->flag & 1u);
        int line = 0, raw16 = 0;
        switch (k->kind) {
        case MSCX_ENTRY_PACK:
            line = j >= 1;
            break;
        case MSCX_ENTRY_UNPACK:
            line = j == 0;
            break;
        case MSCX_ENTRY_FWD:
            line = 1;
            break;
        case MSCX_ENTRY_REDPKT: /* src[0] flat unless lsrc0, src[fsrc] flat, dst[0] flat, the rest lines */
            line = j == 0 ? k->lsrc0 : j < k->nsrc ? j != k->fsrc : j != k->nsrc;
            break;
        default: /* COPY, REDUCE */
            raw16 = 1;
            break;
        }
        is_line[j] = (uint8_t)line;
        if (raw16)
            check_access(e, L, j, &P[j], n * 16u, 16u, "flat");
        else if (line)
            check_access(e, L, j, &P[j], n * ll, (uint32_t)ll, "lines");
        else
            check_access(e, L, j, &P[j], n * pl, (uint32_t)pl, "payload");
    }
}

/* @return 1 when every line the entry reads carries the flag, else 0 (the first missing one in @p wait). */
int entry_ready(const struct emu *e, const struct loc *L, const struct opnd *P, const uint8_t *is_line,
                char *wait, size_t wlen)
{
    const struct mscx_entry *k = L->k;
    const uint64_t ll = mscx_pkt_line(e->pkt);
    uint32_t nread = k->kind == MSCX_ENTRY_PACK ? 0 : k->kind == MSCX_ENTRY_REDPKT ? k->nsrc : 1;
    if (k->kind == MSCX_ENTRY_COPY || k->kind == MSCX_ENTRY_REDUCE || k->kind == MSCX_ENTRY_SKIP)
        nread = 0;
    for (uint32_t j = 0; j < nread; j++) {
        if (!is_line[j])
            continue;
        for (uint64_t u = 0; u < k->units; u++) {
            const char *line = P[j].p + u * ll;
            if (!line_ready(line, e->pkt, e->r[L->rank].flag)) {
                snprintf(wait, wlen, "operand %u unit %llu: line flags %#x/%#x", j, (unsigned long long)u,
                         ld32(line + 4), e->pkt == MSCX_PKT_LL8 ? ld32(line + 4) : ld32(line + 12));
                return 0;
            }
        }
    }
    return 1;
}

void entry_run(struct emu *e, const struct loc *L, const struct opnd *P)
{
    const struct mscx_entry *k = L->k;
    const enum mscx_pkt_format pkt = e->pkt;
    const uint32_t pl = mscx_pkt_payload(pkt), ll = mscx_pkt_line(pkt), nw = pl / 4u;
    const uint32_t flag = e->r[L->rank].flag, ns = k->nsrc, nd = k->ndst;
    uint32_t w[4], v[4];
    switch (k->kind) {
    case MSCX_ENTRY_PACK:
        for (uint64_t u = 0; u < k->units; u++) {
            vload(P[0].p + u * pl, pl, w);
            for (uint32_t j = 0; j < nd; j++)
                line_store(P[1 + j].p + u * ll, pkt, w, flag);
        }
        break;
    case MSCX_ENTRY_UNPACK:
        for (uint64_t u = 0; u < k->units; u++) {
            line_read(P[0].p + u * ll, pkt, w);
            vstore(P[1].p + u * pl, pl, w);
        }
        break;
    case MSCX_ENTRY_FWD:
        for (uint64_t u = 0; u < k->units; u++) {
            line_read(P[0].p + u * ll, pkt, w);
            for (uint32_t j = 0; j < nd; j++)
                line_store(P[1 + j].p + u * ll, pkt, w, flag);
        }
        break;
    case MSCX_ENTRY_REDPKT:
        if (!e->r[L->rank].a.reduce)
            emu_fail(e, L, "a reduction in a launch of the copy-only kernel");
        for (uint64_t u = 0; u < k->units; u++) {
            if (k->lsrc0)
                line_read(P[0].p + u * ll, pkt, w);
            else
                vload(P[0].p + u * pl, pl, w);
            for (uint32_t j = 1; j < ns; j++) {
                if (k->fsrc && j == k->fsrc) /* a fused pack: the flat bytes its lines were packed from */
                    vload(P[j].p + u * pl, pl, v);
                else
                    line_read(P[j].p + u * ll, pkt, v);
                vreduce(e, w, v, nw);
            }
            if (nd > 0)
                vstore(P[ns].p + u * pl, pl, w);
            for (uint32_t j = 1; j < nd; j++)
                line_store(P[ns + j].p + u * ll, pkt, w, flag);
        }
        break;
    case MSCX_ENTRY_COPY:
        if (P[0].p != P[1].p && P[0].p < P[1].p + k->units * 16u && P[1].p < P[0].p + k->units * 16u)
            emu_fail(e, L, "source and destination overlap (threads would race)");
        memcpy(P[1].p, P[0].p, k->units * 16u);
        break;
    case MSCX_ENTRY_REDUCE:
        if (!e->r[L->rank].a.reduce)
            emu_fail(e, L, "a reduction in a launch of the copy-only kernel");
        for (uint64_t u = 0; u < k->units; u++) {
            vload(P[0].p + u * 16u, 16u, w);
            for (uint32_t j = 1; j < ns; j++) {
                vload(P[j].p + u * 16u, 16u, v);
                vreduce(e, w, v, 4u);
            }
            for (uint32_t j = 0; j < nd; j++)
                vstore(P[ns + j].p + u * 16u, 16u, w);
        }
        break;
    case MSCX_ENTRY_SKIP:
        break;
    default:
        emu_fail(e, L, "entry kind %u is not emulated (the program was taken as whole)", k->kind);
    }
    e->entries_run++;
    e->units_run += k->units;
    e->fsrc_run += k->kind == MSCX_ENTRY_REDPKT && k->fsrc;
}
