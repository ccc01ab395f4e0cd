/* SPDX-License-Identifier: MIT */
/* mscx-info --explain: what ran and why, from a routing summary file. */
#ifndef MSCX_SUMMARY_EXPLAIN_H
#define MSCX_SUMMARY_EXPLAIN_H

#include <stdio.h>

/**
 * Read the shim's routing summary @p path (MSCX_SUMMARY_FILE's JSON) and
 * print, per communicator, collective and size bucket, the calls routed and
 * those that went to NCCL with each reason in words.
 * @return 0, or 1 after a message on @p err naming the file and what is wrong
 */
int mscx_summary_explain(const char *path, FILE *out, FILE *err);

#endif /* MSCX_SUMMARY_EXPLAIN_H */
