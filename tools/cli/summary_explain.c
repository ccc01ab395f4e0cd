/* SPDX-License-Identifier: MIT */
/*
 * mscx-info --explain. The summary is a JSON list of communicators, each
 * with "rank", "nranks", "routed", "fallback" (reason name -> calls) and
 * "buckets" (one per collective and size bucket, with the same counts).
 * Reason names are stable; docs/routing.md's table lists them.
 */
#include <jansson.h>
#include <string.h>

#include "summary_explain.h"

struct reason_text {
    const char *name, *text;
};

static const struct reason_text reasons[] = {
    {"no-state", "the communicator has no mscx state (disabled, no plan for its size, or setup fell back)"},
    {"forced", "MSCX_FORCE_FALLBACK names the collective"},
    {"group",
     "its ncclGroupStart group ended in ncclGroupSimulateEnd, which runs nothing: NCCL simulated it"},
    {"dtype", "no plan supports the datatype"},
    {"op", "no plan supports the reduction, or mscx does not run it (ncclAvg of integers; a PreMulSum op of "
           "another datatype or communicator, or destroyed)"},
    {"size", "no plan covers the message size"},
    {"root", "no broadcast plan for this root (each broadcast plan serves one root)"},
    {"no-plan", "no plan for this collective and rank count"},
    {"launch", "the executor refused the launch before enqueueing anything"},
    {"window", "a buffer lies in an NCCL window the application registered (ncclCommWindowRegister), and the "
               "plan was not measured faster than NCCL's symmetric kernels there"},
    {"sendrecv",
     "a group of one ncclSend and one ncclRecv per rank, counted as an AlltoAll, went to NCCL: it "
     "was not captured in a CUDA graph, its buffers were not one contiguous block per side with "
     "the rank itself included, or not every rank agreed to run the same group"},
    {"config",
     "an nccl<Coll>Config call whose ncclCollConfig_t selects NCCL's algorithm or protocol "
     "(algSelection), asks for a launch-completion event, or is not a valid config: NCCL serves it"},
};

static const char *reason_text(const char *name)
{
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (!strcmp(reasons[i].name, name))
            return reasons[i].text;
    return "a reason this tool does not know (a newer shim?)";
}

static json_int_t int_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? json_integer_value(v) : 0;
}

static const char *str_of(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "?";
}

/* "  fell back N: reason (text)" per reason of @p fb. */
static void print_fallback(const json_t *fb, FILE *out)
{
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)fb, name, v)
    {
        if (json_is_integer(v) && json_integer_value(v) > 0)
            fprintf(out, "      to NCCL %lld: %s (%s)\n", (long long)json_integer_value(v), name,
                    reason_text(name));
    }
}

static int check_comm(const json_t *c, size_t i, const char *path, FILE *err)
{
    if (!json_is_object(c) || !json_is_integer(json_object_get(c, "nranks")) ||
        !json_is_array(json_object_get(c, "buckets"))) {
        fprintf(err, "mscx-info: %s: entry %zu: expected an object with \"nranks\" and \"buckets\"\n", path,
                i);
        return 1;
    }
    return 0;
}

static void print_comm(const json_t *c, FILE *out)
{
    fprintf(out, "comm %s: rank %lld of %lld, at %s: %lld calls routed\n", str_of(c, "comm"),
            (long long)int_of(c, "rank"), (long long)int_of(c, "nranks"), str_of(c, "at"),
            (long long)int_of(c, "routed"));
    size_t j;
    json_t *b;
    json_array_foreach(json_object_get(c, "buckets"), j, b)
    {
        fprintf(out, "  %s %s: routed %lld\n", str_of(b, "coll"), str_of(b, "bucket"),
                (long long)int_of(b, "routed"));
        const json_t *fb = json_object_get(b, "fallback");
        if (json_is_object(fb))
            print_fallback(fb, out);
    }
    /* the plans that ran those calls (summaries of older shims have none) */
    json_array_foreach(json_object_get(c, "plans"), j, b) fprintf(
        out, "  plan %s (%s, %lld-%lld bytes): %lld calls\n", str_of(b, "plan"), str_of(b, "coll"),
        (long long)int_of(b, "min_bytes"), (long long)int_of(b, "max_bytes"), (long long)int_of(b, "calls"));
    if (int_of(c, "plans_omitted") > 0)
        fprintf(out, "  and %lld more plans\n", (long long)int_of(c, "plans_omitted"));
}

int mscx_summary_explain(const char *path, FILE *out, FILE *err)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        fprintf(err, "mscx-info: %s:%d:%d: %s\n", path, je.line, je.column, je.text);
        return 1;
    }
    int rc = 0;
    if (!json_is_array(root)) {
        fprintf(err, "mscx-info: %s: expected a list of communicators\n", path);
        rc = 1;
    }
    size_t i;
    json_t *c;
    json_array_foreach(rc ? NULL : root, i, c)
    {
        if (check_comm(c, i, path, err)) {
            rc = 1;
            break;
        }
    }
    json_array_foreach(rc ? NULL : root, i, c) print_comm(c, out);
    if (!rc && json_array_size(root) == 0)
        fprintf(out, "no communicator in %s\n", path);
    json_decref(root);
    return rc;
}
