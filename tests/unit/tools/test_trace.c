/* SPDX-License-Identifier: MIT */
/* The Chrome trace writer: valid JSON, one named track per rank and block, monotonic times. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mscx/dev_types.h"
#include "mscx/plan.h"
#include "mscx/trace.h"
#include "test_common.h"

#define NR 2
#define NB 3
#define NOPS 4

static struct mscx_trace_rec recs[NR][NB][NOPS];
static struct mscx_trace_block blocks[NR * NB];

/* Rank r block b op k runs [base + 1000k, base + 1000k + 700] ns; base varies by track. */
static size_t make_blocks(void)
{
    size_t n = 0;
    for (int r = NR - 1; r >= 0; r--) { /* out of order on purpose */
        for (int b = 0; b < NB; b++) {
            uint64_t base = 1000000 + 250 * (uint64_t)(r * NB + b);
            for (int k = 0; k < NOPS; k++)
                recs[r][b][k] =
                    (struct mscx_trace_rec){(uint32_t)k, MSCX_OP_PUT + (uint32_t)k, base + 1000 * (uint64_t)k,
                                            base + 1000 * (uint64_t)k + 700};
            blocks[n++] = (struct mscx_trace_block){(uint32_t)r, (uint32_t)b, recs[r][b], NOPS};
        }
    }
    /* Glitches: an unwritten record, an end before its start, an overlap. */
    recs[1][2][3].start_ns = 0;
    recs[0][1][1].end_ns = recs[0][1][1].start_ns - 5;
    recs[1][0][2].start_ns -= 800; /* starts before op 1 ended */
    return n;
}

static json_t *write_and_parse(size_t nblocks, size_t *nevents_p)
{
    char *text = NULL;
    size_t len = 0;
    json_error_t jerr;
    FILE *f = open_memstream(&text, &len);
    ck_assert_int_eq(mscx_trace_write(f, "8-rank allreduce", blocks, nblocks, nevents_p), MSCX_OK);
    fclose(f);
    json_t *root = json_loadb(text, len, 0, &jerr);
    ck_assert_msg(root != NULL, "invalid JSON: %s at line %d\n%s", jerr.text, jerr.line, text);
    free(text);
    return root;
}

START_TEST(test_trace_valid_tracks_monotonic)
{
    size_t nevents = 0, nb = make_blocks(), i;
    json_t *root = write_and_parse(nb, &nevents), *ev;
    json_t *events = json_object_get(root, "traceEvents");
    int pnames[NR] = {0}, tnames[NR][NB] = {{0}}, xcount[NR][NB] = {{0}};
    double last_end[NR][NB];
    ck_assert(json_is_array(events));
    ck_assert_uint_eq(nevents, NR * NB * NOPS - 1);
    for (int r = 0; r < NR; r++)
        for (int b = 0; b < NB; b++)
            last_end[r][b] = -1;
    json_array_foreach(events, i, ev)
    {
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        const char *name = json_string_value(json_object_get(ev, "name"));
        int pid = (int)json_integer_value(json_object_get(ev, "pid"));
        json_t *tidj = json_object_get(ev, "tid");
        int tid = (int)json_integer_value(tidj);
        ck_assert_ptr_nonnull(ph);
        ck_assert_int_lt(pid, NR);
        if (strcmp(ph, "M") == 0) {
            const char *v = json_string_value(json_object_get(json_object_get(ev, "args"), "name"));
            char want[32];
            if (strcmp(name, "process_name") == 0) {
                snprintf(want, sizeof(want), "rank %d", pid);
                ck_assert_str_eq(v, want);
                pnames[pid]++;
            } else if (strcmp(name, "thread_name") == 0) {
                snprintf(want, sizeof(want), "tb %d", tid);
                ck_assert_str_eq(v, want);
                tnames[pid][tid]++;
            }
            continue;
        }
        ck_assert_str_eq(ph, "X");
        ck_assert(json_is_integer(tidj));
        ck_assert_int_lt(tid, NB);
        double ts = json_number_value(json_object_get(ev, "ts")),
               dur = json_number_value(json_object_get(ev, "dur"));
        ck_assert(ts >= 0 && dur >= 0);
        ck_assert_msg(ts >= last_end[pid][tid] - 1e-9,
                      "rank %d tb %d: event at %.3f before previous end %.3f", pid, tid, ts,
                      last_end[pid][tid]);
        last_end[pid][tid] = ts + dur;
        xcount[pid][tid]++;
        ck_assert_str_eq(name, mscx_opcode_name((enum mscx_opcode)json_integer_value(
                                   json_object_get(json_object_get(ev, "args"), "opcode"))));
    }
    for (int r = 0; r < NR; r++) {
        ck_assert_int_eq(pnames[r], 1);
        for (int b = 0; b < NB; b++) {
            ck_assert_int_eq(tnames[r][b], 1);
            ck_assert_int_eq(xcount[r][b], (r == 1 && b == 2) ? NOPS - 1 : NOPS);
        }
    }
    /* Times are microseconds from the earliest start: rank 0 tb 0 op 1 starts at 1.000 us, lasts 0.700. */
    json_array_foreach(events, i, ev)
    {
        if (strcmp(json_string_value(json_object_get(ev, "ph")), "X") == 0 &&
            json_integer_value(json_object_get(ev, "pid")) == 0 &&
            json_integer_value(json_object_get(ev, "tid")) == 0 &&
            json_integer_value(json_object_get(json_object_get(ev, "args"), "op")) == 1) {
            ck_assert_double_eq_tol(json_number_value(json_object_get(ev, "ts")), 1.0, 1e-9);
            ck_assert_double_eq_tol(json_number_value(json_object_get(ev, "dur")), 0.7, 1e-9);
        }
    }
    json_decref(root);
}
END_TEST

START_TEST(test_trace_empty_and_errors)
{
    size_t nevents = 99, nb = make_blocks();
    json_t *root = write_and_parse(0, &nevents);
    ck_assert_uint_eq(nevents, 0);
    ck_assert_uint_eq(json_array_size(json_object_get(root, "traceEvents")), 0);
    json_decref(root);

    mscx_test_allow_warn("two tracks for rank");
    blocks[1] = blocks[0];
    FILE *f = fopen("/dev/null", "w");
    ck_assert_int_eq(mscx_trace_write(f, NULL, blocks, nb, NULL), MSCX_ERR_INVALID_ARG);
    fclose(f);
    mscx_test_allow_warn("cannot create");
    ck_assert_int_eq(mscx_trace_save("/nonexistent-dir/t.json", NULL, blocks, 1, NULL), MSCX_ERR_SYSTEM);
}
END_TEST

START_TEST(test_trace_save_file)
{
    char path[] = "/tmp/mscx-trace-XXXXXX";
    size_t nb = make_blocks(), nevents = 0;
    json_error_t jerr;
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(mscx_trace_save(path, "t", blocks, nb, &nevents), MSCX_OK);
    json_t *root = json_load_file(path, 0, &jerr);
    ck_assert_msg(root != NULL, "%s", jerr.text);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(root, "otherData"), "label")), "t");
    json_decref(root);
    unlink(path);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = mscx_tcase("trace");
    tcase_add_test(tc, test_trace_valid_tracks_monotonic);
    tcase_add_test(tc, test_trace_empty_and_errors);
    tcase_add_test(tc, test_trace_save_file);
    suite_add_tcase(s, tc);
    return s;
}
