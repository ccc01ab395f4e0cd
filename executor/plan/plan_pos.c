/* SPDX-License-Identifier: MIT */
/*
 * Line and column of a JSON path. jansson keeps no positions per node, so on
 * an error the loader re-reads the text with this small tokenizer, following
 * the path ("gpus[1].threadblocks[0].ops[2].src_buff[0].index") and
 * remembering the deepest value on it. It runs only on the error path and
 * only over text that jansson has already accepted; it stops, never
 * crashes, on anything unexpected.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "plan_json_int.h"

#define MAX_COMPS 32
#define MAX_NEST 4096

struct comp {
    const char *key; /* NULL for an index */
    size_t keylen;
    size_t idx;
};

struct scan {
    const char *s;
    size_t len, pos;
    const struct comp *comps;
    int ncomp;
    size_t best_off;
    int best_depth;
    bool done, bad;
};

static int parse_path(const char *path, struct comp *comps)
{
    int n = 0;
    const char *p = path;
    while (*p && n < MAX_COMPS) {
        if (*p == '.') {
            p++;
        } else if (*p == '[') {
            char *end;
            comps[n].key = NULL;
            comps[n].idx = strtoul(p + 1, &end, 10);
            if (*end != ']')
                break;
            n++;
            p = end + 1;
        } else {
            size_t l = strcspn(p, ".[");
            comps[n].key = p;
            comps[n].keylen = l;
            n++;
            p += l;
        }
    }
    return n;
}

static void skip_ws(struct scan *sc)
{
    while (sc->pos < sc->len) {
        char ch = sc->s[sc->pos];
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r')
            break;
        sc->pos++;
    }
}

/* Skip a string starting at '"'; return the raw content span. */
static void skip_string(struct scan *sc, size_t *start_p, size_t *end_p)
{
    sc->pos++;
    *start_p = sc->pos;
    while (sc->pos < sc->len && sc->s[sc->pos] != '"') {
        if (sc->s[sc->pos] == '\\')
            sc->pos++;
        sc->pos++;
    }
    *end_p = sc->pos < sc->len ? sc->pos : sc->len;
    if (sc->pos >= sc->len)
        sc->bad = true;
    else
        sc->pos++;
}

static void scan_value(struct scan *sc, int depth, bool on_path);

static void scan_object(struct scan *sc, int depth, bool on_path)
{
    sc->pos++;
    for (;;) {
        size_t ks, ke;
        skip_ws(sc);
        if (sc->pos >= sc->len || sc->s[sc->pos] != '"') {
            if (sc->pos < sc->len && sc->s[sc->pos] == '}')
                sc->pos++;
            else
                sc->bad = true;
            return;
        }
        skip_string(sc, &ks, &ke);
        skip_ws(sc);
        if (sc->bad || sc->pos >= sc->len || sc->s[sc->pos] != ':') {
            sc->bad = true;
            return;
        }
        sc->pos++;
        bool child = false;
        if (on_path && depth < sc->ncomp && sc->comps[depth].key) {
            const struct comp *cp = &sc->comps[depth];
            child = cp->keylen == ke - ks && memcmp(cp->key, sc->s + ks, cp->keylen) == 0;
        }
        scan_value(sc, depth + 1, child);
        if (sc->done || sc->bad)
            return;
        skip_ws(sc);
        if (sc->pos < sc->len && sc->s[sc->pos] == ',') {
            sc->pos++;
            continue;
        }
        if (sc->pos < sc->len && sc->s[sc->pos] == '}')
            sc->pos++;
        else
            sc->bad = true;
        return;
    }
}

static void scan_array(struct scan *sc, int depth, bool on_path)
{
    size_t idx = 0;
    sc->pos++;
    skip_ws(sc);
    if (sc->pos < sc->len && sc->s[sc->pos] == ']') {
        sc->pos++;
        return;
    }
    for (;;) {
        bool child =
            on_path && depth < sc->ncomp && sc->comps[depth].key == NULL && sc->comps[depth].idx == idx;
        scan_value(sc, depth + 1, child);
        if (sc->done || sc->bad)
            return;
        idx++;
        skip_ws(sc);
        if (sc->pos < sc->len && sc->s[sc->pos] == ',') {
            sc->pos++;
            continue;
        }
        if (sc->pos < sc->len && sc->s[sc->pos] == ']')
            sc->pos++;
        else
            sc->bad = true;
        return;
    }
}

static void scan_value(struct scan *sc, int depth, bool on_path)
{
    skip_ws(sc);
    if (sc->pos >= sc->len || depth > MAX_NEST) {
        sc->bad = true;
        return;
    }
    if (on_path && depth > sc->best_depth) {
        sc->best_depth = depth;
        sc->best_off = sc->pos;
        if (depth == sc->ncomp) {
            sc->done = true;
            return;
        }
    }
    switch (sc->s[sc->pos]) {
    case '{':
        scan_object(sc, depth, on_path);
        break;
    case '[':
        scan_array(sc, depth, on_path);
        break;
    case '"': {
        size_t a, b;
        skip_string(sc, &a, &b);
        break;
    }
    default:
        while (sc->pos < sc->len && strchr(",}] \t\r\n", sc->s[sc->pos]) == NULL)
            sc->pos++;
        break;
    }
}

void mscx_plan_json_locate(const char *text, size_t len, const char *path, int *line_p, int *col_p)
{
    struct comp comps[MAX_COMPS];
    struct scan sc;
    int line = 1;
    size_t bol = 0;

    *line_p = 0;
    *col_p = 0;
    if (text == NULL || path == NULL)
        return;
    memset(&sc, 0, sizeof(sc));
    sc.s = text;
    sc.len = len;
    sc.comps = comps;
    sc.ncomp = parse_path(path, comps);
    sc.best_depth = -1;
    scan_value(&sc, 0, true);
    if (sc.best_depth < 0)
        return;
    for (size_t i = 0; i < sc.best_off && i < len; i++) {
        if (text[i] == '\n') {
            line++;
            bol = i + 1;
        }
    }
    *line_p = line;
    *col_p = (int)(sc.best_off - bol) + 1;
}
