/* SPDX-License-Identifier: MIT */
/**
 * @file trace.h
 * Chrome trace JSON (the format Perfetto and chrome://tracing open) from
 * per-op timestamps recorded on the GPU.
 *
 * The GPU executor records one struct mscx_trace_rec per executed op per
 * thread block into a device buffer (MSCX_TRACE=path), copies the buffers
 * back after the run and hands them to mscx_trace_write() as one
 * struct mscx_trace_block per (rank, thread block). The output has one
 * track per rank (pid) and thread block (tid), named by "M" metadata events,
 * and one "X" complete event per record, in microseconds relative to the
 * earliest start in the input.
 */
#ifndef MSCX_TRACE_H
#define MSCX_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "mscx/dev_types.h" /* struct mscx_trace_rec, as the device writes it */
#include "mscx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The records of one thread block of one rank, in execution order. */
struct mscx_trace_block {
    uint32_t rank;
    uint32_t block;
    const struct mscx_trace_rec *recs;
    size_t nrecs;
};

/**
 * Write a Chrome trace JSON object to @p out.
 *
 * Within a track, events are emitted in start order and each event starts no
 * earlier than the previous one ended (a clock glitch is clamped, never
 * emitted out of order), so times are monotonic per track.
 * @param label     names the trace in its metadata ("" or NULL for none)
 * @param blocks    [nblocks] tracks; two blocks with the same rank and block
 *                  number are a caller bug
 * @param nevents_p receives the number of "X" events written; may be NULL
 * @return MSCX_OK, MSCX_ERR_INVALID_ARG, MSCX_ERR_NO_MEMORY, MSCX_ERR_SYSTEM (write failed)
 */
mscx_status_t mscx_trace_write(FILE *out, const char *label, const struct mscx_trace_block *blocks,
                               size_t nblocks, size_t *nevents_p);

/**
 * As mscx_trace_write(), to a new file at @p path (replaced if it exists).
 * @return as mscx_trace_write(); MSCX_ERR_SYSTEM when the file cannot be created
 */
mscx_status_t mscx_trace_save(const char *path, const char *label, const struct mscx_trace_block *blocks,
                              size_t nblocks, size_t *nevents_p);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_TRACE_H */
