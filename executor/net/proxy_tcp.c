/* SPDX-License-Identifier: MIT */
/*
 * The proxy's network link (proxy.h): one port channel over the TCP or
 * RDMA transport of transport.h, sources staged through a registered host
 * bounce buffer. Also where the receiver of a late-bound put finds the
 * buffer it goes to.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>

#include "mscx/dev_types.h"
#include "mscx/log.h"
#include "proxy.h"

/* ---------------------------------------------------------------- the link */

struct ptcp_link {
    struct mscx_ptcp_link_params p;
    uint64_t boff; /* async_src: next free byte of the bounce ring */
};

mscx_status_t mscx_plink_tcp_create(const struct mscx_ptcp_link_params *p, void **link_p)
{
    if (!p || !p->tp || !p->conn || !p->bounce_mr || !p->bounce || p->bounce_bytes < 8 ||
        p->bounce_bytes % 8 || !p->stage || !link_p) {
        MSCX_WARN("caller bug: bad %s link parameters", p && p->tp ? p->tp->name : "network");
        return MSCX_ERR_INVALID_ARG;
    }
    struct ptcp_link *l = calloc(1, sizeof(*l));
    if (!l)
        return MSCX_ERR_NO_MEMORY;
    l->p = *p;
    *link_p = l;
    return MSCX_OK;
}

void mscx_plink_tcp_destroy(void *link)
{
    free(link);
}

/*
 * The source is staged into the host bounce buffer piece by piece, and each
 * piece is written with @p w (bytes [@p o, o + n) of the source, staged at
 * bounce offset @p boff) to where @p dst says.
 * TCP: the transport's put returns once the bytes are in the socket, so the
 * bounce buffer may be reused as soon as it returns.
 * RDMA (async_src): the NIC reads the bounce buffer after the put returns, so
 * it is used as a ring; before the ring wraps, a flush of the connection
 * waits until every earlier write completed (and with it, read its bytes).
 * Pieces and ring offsets stay multiples of 8, so a packet put's 8-byte units
 * never straddle two writes.
 */
typedef mscx_status_t (*ptcp_write_fn)(struct ptcp_link *l, const void *dst, uint64_t boff, uint64_t o,
                                       uint64_t n, uint64_t deadline_ns);

static mscx_status_t ptcp_staged(struct ptcp_link *l, const void *src, uint64_t len, ptcp_write_fn w,
                                 const void *dst, uint64_t deadline_ns)
{
    for (uint64_t o = 0; o < len;) {
        uint64_t boff = l->p.async_src ? l->boff : 0;
        if (boff >= l->p.bounce_bytes) {
            MSCX_CHECK(l->p.tp->flush(l->p.conn, deadline_ns));
            l->boff = boff = 0;
        }
        uint64_t room = l->p.bounce_bytes - boff;
        uint64_t n = len - o < room ? len - o : room;
        char *b = (char *)l->p.bounce + boff;
        MSCX_CHECK(l->p.stage(l->p.stage_ctx, b, (const char *)src + o, (size_t)n));
        MSCX_CHECK(w(l, dst, boff, o, n, deadline_ns));
        if (l->p.async_src)
            l->boff = (boff + n + 7u) / 8u * 8u;
        o += n;
    }
    return MSCX_OK;
}

/* Where a put into the peer's registered region goes. */
struct ptcp_region_dst {
    uint64_t off;
    unsigned tp_flags;
};

static mscx_status_t ptcp_write_region(struct ptcp_link *l, const void *dst, uint64_t boff, uint64_t o,
                                       uint64_t n, uint64_t deadline_ns)
{
    const struct ptcp_region_dst *d = dst;
    return l->p.tp->put(l->p.conn, l->p.bounce_mr, boff, &l->p.dst, d->off + o, n, d->tp_flags, deadline_ns);
}

static mscx_status_t ptcp_put(void *link, const void *src, uint64_t dst_off, uint64_t len, unsigned tp_flags,
                              uint64_t deadline_ns)
{
    const struct ptcp_region_dst d = {dst_off, tp_flags};
    return ptcp_staged(link, src, len, ptcp_write_region, &d, deadline_ns);
}

/* Into the peer's late-bound region: the receiver resolves (buffer, launch) itself. */
static mscx_status_t ptcp_write_late(struct ptcp_link *l, const void *dst, uint64_t boff, uint64_t o,
                                     uint64_t n, uint64_t deadline_ns)
{
    const struct mscx_puser *u = dst;
    return l->p.tp->put_late(l->p.conn, l->p.bounce_mr, boff, &l->p.user, u->buf, u->launch, u->off + o, n, 0,
                             deadline_ns);
}

static mscx_status_t ptcp_put_user(void *link, const void *src, const struct mscx_puser *dst, uint64_t len,
                                   uint64_t deadline_ns)
{
    struct ptcp_link *l = link;
    if (!l->p.tp->put_late || l->p.user.tp == 0) {
        MSCX_WARN("internal bug: the %s link to rank %u has no late-bound region of the peer", l->p.tp->name,
                  l->p.peer);
        return MSCX_ERR_INTERNAL;
    }
    return ptcp_staged(l, src, len, ptcp_write_late, dst, deadline_ns);
}

static mscx_status_t ptcp_signal(void *link, uint64_t deadline_ns)
{
    struct ptcp_link *l = link;
    return l->p.tp->signal(l->p.conn, &l->p.tok, l->p.tok_off, deadline_ns);
}

static mscx_status_t ptcp_flush(void *link, int local, uint64_t deadline_ns)
{
    struct ptcp_link *l = link;
    if (local)
        return MSCX_OK; /* the staging copy read every source before its put was issued */
    MSCX_CHECK(l->p.tp->flush(l->p.conn, deadline_ns));
    l->boff = 0; /* every write completed: the whole ring is free */
    return MSCX_OK;
}

static mscx_status_t ptcp_check(void *link)
{
    struct ptcp_link *l = link;
    return l->p.ep ? l->p.tp->progress(l->p.ep) : MSCX_OK;
}

const struct mscx_plink_ops mscx_plink_tcp = {
    .name = "tcp",
    .put = ptcp_put,
    .put_user = ptcp_put_user,
    .signal = ptcp_signal,
    .flush = ptcp_flush,
    .check = ptcp_check,
};

const struct mscx_plink_ops mscx_plink_ib = {
    .name = "ib",
    .put = ptcp_put,
    .signal = ptcp_signal,
    .flush = ptcp_flush,
    .check = ptcp_check,
};

/* ---------------------------------------------------------------- late-bound puts, at the receiver */

mscx_status_t mscx_late_pick(const struct mscx_late_pub *pub, uint32_t rank, const char *plan, uint32_t buf,
                             uint32_t launch, uint64_t off, uint64_t len, void **dst_p)
{
    const char *bn = buf == MSCX_BUF_INPUT ? "input" : "output";
    if ((buf != MSCX_BUF_INPUT && buf != MSCX_BUF_OUTPUT) || launch == 0) {
        MSCX_WARN("peer bug: rank %u plan %s: a put names buffer %u of launch %u", rank, plan, buf, launch);
        return MSCX_ERR_REMOTE;
    }
    if (pub->flag != launch) {
        /* flags wrap (0xffffffff, then 2): compare by distance; 0 was never a launch */
        if (pub->flag != 0 && (int32_t)(pub->flag - launch) > 0) {
            MSCX_WARN(
                "rank %u plan %s: a put into this rank's %s buffer of launch %u arrived after launch %u had "
                "replaced that launch's buffers; failing",
                rank, plan, bn, launch, pub->flag);
            return MSCX_ERR_INTERNAL;
        }
        return MSCX_INPROGRESS;
    }
    uint32_t t = buf == MSCX_BUF_OUTPUT;
    if (!pub->ptr[t] || off > pub->bytes[t] || len > pub->bytes[t] - off) {
        MSCX_WARN("peer bug: rank %u plan %s: a put into this rank's %s buffer of launch %u (%" PRIu64
                  " bytes at offset %" PRIu64 ") reaches past its %" PRIu64 " bytes",
                  rank, plan, bn, launch, len, off, pub->bytes[t]);
        return MSCX_ERR_REMOTE;
    }
    *dst_p = (char *)pub->ptr[t] + off;
    return MSCX_OK;
}
