/* SPDX-License-Identifier: MIT */
/*
 * The one definition of what operations compute: element reductions, packet
 * lines and the chunk/byte geometry. Included by the host reference executor
 * (C) and by the CUDA kernels, so the two cannot drift.
 *
 * Reductions are defined bit for bit, as NCCL computes them: fp16 and bf16
 * sums and products widen to fp32, apply the operator in fp32 and round back
 * to nearest-even; min and max follow fminf/fmaxf (__hmin/__hmax), where a
 * NaN is ignored unless both operands are NaN; a NaN result is the GPU's
 * canonical NaN; integers wrap. Both
 * executors compute exactly this, in the same operand order: the accumulator
 * starts from the first operand (never from zero, which would be wrong for
 * min, max and prod) and folds the others in list order.
 */
#ifndef MSCX_OP_MATH_H
#define MSCX_OP_MATH_H

#include <stdint.h>
#include <string.h>
#include "mscx/dev_types.h"

#ifdef __CUDACC__
#define MSCX_HD __host__ __device__ __forceinline__
#else
#define MSCX_HD static inline
#endif

/* ---- scalar conversions, bit exact on host and device ---- */

MSCX_HD float mscx_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

MSCX_HD uint32_t mscx_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

MSCX_HD float mscx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while ((man & 0x400u) == 0) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0); /* inf, quiet NaN */
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return mscx_bits_f32(u);
}

MSCX_HD uint16_t mscx_f32_to_f16(float f)
{
    uint32_t u = mscx_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t man = u & 0x7fffffu;
    if (exp == 0xff) /* inf or NaN (canonical quiet NaN) */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal or zero in half precision */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u)))
        half++; /* may carry into the exponent, up to infinity: correct */
    return (uint16_t)(sign | half);
}

MSCX_HD float mscx_bf16_to_f32(uint16_t b)
{
    return mscx_bits_f32((uint32_t)b << 16);
}

MSCX_HD uint16_t mscx_f32_to_bf16(float f)
{
    uint32_t u = mscx_f32_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu))
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return (uint16_t)(u >> 16);
}

/* ---- element reductions ---- */

/* NCCL's canonical NaN, what the GPU's arithmetic and min/max make of NaN (fp32; fp16 and bf16). */
#define MSCX_NAN_F32 0x7fffffffu
#define MSCX_NAN_16 0x7fffu

/*
 * Min or max of two floats given as (bits, value), NCCL's fminf/fmaxf and
 * __hmin/__hmax: a NaN operand is ignored, two NaNs give the canonical NaN
 * @p nan, -0 orders below +0. The result is one operand's bits (or @p nan),
 * whatever the operand order, so min and max never depend on the order of
 * a fold.
 */
MSCX_HD uint32_t mscx_minmax_bits(unsigned op, uint32_t a, float fa, uint32_t b, float fb, uint32_t sign,
                                  uint32_t nan)
{
    int a_nan = fa != fa, b_nan = fb != fb;
    if (a_nan || b_nan)
        return a_nan && b_nan ? nan : a_nan ? b : a;
    int b_first; /* b orders below a */
    if (fa == fb)
        b_first = (b & sign) && !(a & sign); /* only a signed-zero pair differs here */
    else
        b_first = fb < fa;
    if (op == MSCX_REDOP_MIN)
        return b_first ? b : a;
    return b_first ? a : b;
}

/* One fp32 reduction, as bits. A NaN sum or product is the canonical NaN, as on the GPU. */
MSCX_HD uint32_t mscx_apply_f32(unsigned op, uint32_t a, uint32_t b)
{
    float fa = mscx_bits_f32(a), fb = mscx_bits_f32(b), r;
    switch (op) {
    case MSCX_REDOP_MIN:
    case MSCX_REDOP_MAX:
        return mscx_minmax_bits(op, a, fa, b, fb, 0x80000000u, MSCX_NAN_F32);
    case MSCX_REDOP_PROD:
        r = fa * fb;
        break;
    default:
        r = fa + fb;
        break;
    }
    return r != r ? MSCX_NAN_F32 : mscx_f32_bits(r);
}

MSCX_HD uint32_t mscx_apply_u32(unsigned op, uint32_t a, uint32_t b, int is_signed)
{
    switch (op) {
    case MSCX_REDOP_PROD:
        return a * b;
    case MSCX_REDOP_MIN:
        if (is_signed)
            return (int32_t)b < (int32_t)a ? b : a;
        return b < a ? b : a;
    case MSCX_REDOP_MAX:
        if (is_signed)
            return (int32_t)b > (int32_t)a ? b : a;
        return b > a ? b : a;
    default:
        return a + b;
    }
}

/*
 * Reduce one 16-bit element held in the low bits: min and max on the values
 * themselves (exact in fp32), sums and products in fp32 rounded once to the
 * type; a NaN result is the canonical NaN.
 */
MSCX_HD uint16_t mscx_reduce16(unsigned dtype, unsigned op, uint16_t a, uint16_t b)
{
    int bf = dtype == MSCX_DT_BF16;
    float fa = bf ? mscx_bf16_to_f32(a) : mscx_f16_to_f32(a);
    float fb = bf ? mscx_bf16_to_f32(b) : mscx_f16_to_f32(b);
    if (op == MSCX_REDOP_MIN || op == MSCX_REDOP_MAX)
        return (uint16_t)mscx_minmax_bits(op, a, fa, b, fb, 0x8000u, MSCX_NAN_16);
    float r = op == MSCX_REDOP_PROD ? fa * fb : fa + fb;
    if (r != r)
        return (uint16_t)MSCX_NAN_16;
    return bf ? mscx_f32_to_bf16(r) : mscx_f32_to_f16(r);
}

/**
 * Reduce one 32-bit word of payload: a single fp32/int32/uint32 element, or
 * two fp16/bf16 elements (the lower-addressed element in the low half).
 */
MSCX_HD uint32_t mscx_reduce_word(unsigned dtype, unsigned op, uint32_t a, uint32_t b)
{
    switch (dtype) {
    case MSCX_DT_FP32:
        return mscx_apply_f32(op, a, b);
    case MSCX_DT_INT32:
        return mscx_apply_u32(op, a, b, 1);
    case MSCX_DT_UINT32:
        return mscx_apply_u32(op, a, b, 0);
    case MSCX_DT_FP16:
    case MSCX_DT_BF16: {
        uint16_t lo = mscx_reduce16(dtype, op, (uint16_t)(a & 0xffffu), (uint16_t)(b & 0xffffu));
        uint16_t hi = mscx_reduce16(dtype, op, (uint16_t)(a >> 16), (uint16_t)(b >> 16));
        return (uint32_t)lo | ((uint32_t)hi << 16);
    }
    default:
        return a; /* not reducible: validated away before launch */
    }
}

/**
 * Fold @p n bytes of @p b into @p acc element by element (the reference
 * definition that both executors' vector paths must match). @p n is a
 * multiple of the element size.
 */
MSCX_HD void mscx_reduce_bytes(unsigned dtype, unsigned op, uint8_t *acc, const uint8_t *b, uint64_t n)
{
    uint64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t x, y;
        memcpy(&x, acc + i, 4);
        memcpy(&y, b + i, 4);
        x = mscx_reduce_word(dtype, op, x, y);
        memcpy(acc + i, &x, 4);
    }
    if (i + 2 <= n && (dtype == MSCX_DT_FP16 || dtype == MSCX_DT_BF16)) {
        uint16_t x, y;
        memcpy(&x, acc + i, 2);
        memcpy(&y, b + i, 2);
        x = mscx_reduce16(dtype, op, x, y);
        memcpy(acc + i, &x, 2);
    }
}

/* ---- scaled sums (PreMulSum; ncclAvg on floating types) ---- */

/* Whether @p dtype can be scaled: the floating types the executors reduce. */
MSCX_HD int mscx_dtype_scalable(unsigned dtype)
{
    return dtype == MSCX_DT_FP32 || dtype == MSCX_DT_FP16 || dtype == MSCX_DT_BF16;
}

/*
 * One fp32 product x * s, rounded once. A NaN product is the canonical NaN
 * 0x7fffffff, the one the GPU makes: then the sums that follow give the
 * same bits on the host and the device.
 */
MSCX_HD uint32_t mscx_scale_f32(uint32_t x, uint32_t s)
{
    float p = mscx_bits_f32(x) * mscx_bits_f32(s);
    return p != p ? 0x7fffffffu : mscx_f32_bits(p);
}

/*
 * One fp16 or bf16 product x * s: computed in fp32, where the product of two
 * such values is exact (11 + 11 or 8 + 8 significand bits), then rounded to
 * nearest-even once, which is the datatype's own multiplication (for bf16
 * products below 2^-126, fp32 subnormals, the fp32 result is already rounded).
 */
MSCX_HD uint16_t mscx_scale16(unsigned dtype, uint16_t x, uint16_t s)
{
    if (dtype == MSCX_DT_BF16)
        return mscx_f32_to_bf16(mscx_bf16_to_f32(x) * mscx_bf16_to_f32(s));
    return mscx_f32_to_f16(mscx_f16_to_f32(x) * mscx_f16_to_f32(s));
}

/* Multiply the @p n bytes at @p src by the scalar @p s (bits of @p dtype) into @p dst (may be @p src). */
MSCX_HD void mscx_scale_bytes(unsigned dtype, uint64_t s, uint8_t *dst, const uint8_t *src, uint64_t n)
{
    if (dtype == MSCX_DT_FP32) {
        for (uint64_t i = 0; i + 4 <= n; i += 4) {
            uint32_t x;
            memcpy(&x, src + i, 4);
            x = mscx_scale_f32(x, (uint32_t)s);
            memcpy(dst + i, &x, 4);
        }
        return;
    }
    for (uint64_t i = 0; i + 2 <= n; i += 2) {
        uint16_t x;
        memcpy(&x, src + i, 2);
        x = mscx_scale16(dtype, x, (uint16_t)s);
        memcpy(dst + i, &x, 2);
    }
}

/*
 * NCCL's ncclAvg scalar for @p nranks ranks, as bits of @p dtype: the double
 * 1.0 / nranks converted to fp32, and for fp16 and bf16 that fp32 value
 * rounded to the type (NCCL: __float2half(float(1.0 / nRanks))).
 */
MSCX_HD uint64_t mscx_avg_scalar_bits(unsigned dtype, uint32_t nranks)
{
    float f = (float)(1.0 / (double)(nranks ? nranks : 1));
    if (dtype == MSCX_DT_FP16)
        return mscx_f32_to_f16(f);
    if (dtype == MSCX_DT_BF16)
        return mscx_f32_to_bf16(f);
    return mscx_f32_bits(f);
}

/* ---- packet lines ---- */

/* Payload bytes per line and line bytes for a format. */
MSCX_HD uint32_t mscx_pkt_payload(unsigned fmt)
{
    return fmt == MSCX_PKT_LL8 ? 4u : 8u;
}

MSCX_HD uint32_t mscx_pkt_line(unsigned fmt)
{
    return fmt == MSCX_PKT_LL8 ? 8u : 16u;
}

/* Build the 8-byte half {data, flag} as one 64-bit value (data in the low, lower-addressed word). */
MSCX_HD uint64_t mscx_pkt_half(uint32_t data, uint32_t flag)
{
    return (uint64_t)data | ((uint64_t)flag << 32);
}

MSCX_HD int mscx_pkt_half_valid(uint64_t half, uint32_t flag)
{
    return (uint32_t)(half >> 32) == flag;
}

MSCX_HD uint32_t mscx_pkt_half_data(uint64_t half)
{
    return (uint32_t)half;
}

/**
 * Flags: the launch flag is a per-context counter kept in device memory and
 * advanced by the executor once per launch. It is never 0, so zeroed scratch
 * never matches. At the wrap it goes from 0xffffffff (odd) to 2 (even), not
 * to 1: consecutive launches must alternate scratch halves (see
 * mscx_scratch_offset), and 0xffffffff followed by 1 would put two launches
 * in a row on the same half.
 */
MSCX_HD uint32_t mscx_flag_next(uint32_t flag)
{
    uint32_t n = flag + 1u;
    return n == 0u ? 2u : n;
}

/* Scratch half used by a launch with @p flag: the second half on even flags. */
MSCX_HD uint64_t mscx_scratch_offset(uint32_t flag, uint64_t half)
{
    return (flag & 1u) ? 0u : half;
}

/* ---- geometry ---- */

/**
 * Slice @p total bytes (a multiple of @p unit) into @p n parts as evenly as
 * possible in whole units; the first (total/unit % n) parts get one unit more.
 */
MSCX_HD void mscx_slice(uint64_t total, uint32_t unit, uint32_t t, uint32_t n, uint64_t *off_p,
                        uint64_t *len_p)
{
    uint64_t units = total / unit;
    uint64_t per = units / n, rem = units % n;
    uint64_t start = per * t + (t < rem ? t : rem);
    *off_p = start * unit;
    *len_p = (per + (t < rem ? 1u : 0u)) * unit;
}

/**
 * Logical byte range [*off_p, *off_p + *len_p) of an operand, after
 * thread-block-group slicing (unit: @p slice_unit bytes).
 */
MSCX_HD void mscx_operand_range(const struct mscx_dev_op *op, const struct mscx_dev_operand *o, uint64_t slot,
                                uint32_t slice_unit, uint64_t *off_p, uint64_t *len_p)
{
    uint64_t off = (uint64_t)o->index * slot;
    uint64_t len = (uint64_t)o->size * slot;
    if (op->tbg_size > 1) {
        uint64_t so, sl;
        mscx_slice(len, slice_unit, op->tbg_id, op->tbg_size, &so, &sl);
        off += so;
        len = sl;
    }
    *off_p = off;
    *len_p = len;
}

/**
 * Map a logical offset of a raw buffer to its real byte offset and the number
 * of real bytes available there (0 past the chunk's or the buffer's end).
 * @param chunk real bytes per chunk; @param size real buffer size
 */
MSCX_HD uint64_t mscx_raw_map(uint64_t logical, uint64_t slot, uint64_t chunk, uint64_t size,
                              uint64_t *avail_p)
{
    uint64_t c = logical / slot, w = logical % slot;
    uint64_t real = c * chunk + w;
    uint64_t avail = 0;
    if (w < chunk && real < size) {
        avail = chunk - w;
        if (avail > size - real)
            avail = size - real;
    }
    *avail_p = avail;
    return real;
}

#endif /* MSCX_OP_MATH_H */
