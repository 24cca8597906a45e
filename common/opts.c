/* SPDX-License-Identifier: MIT */
/* Option table parsing for flags and INI files (libinih). */
#include "common/opts.h"

#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool name_eq(const char *opt, const char *key)
{
    for (; *opt && *key; opt++, key++) {
        char k = *key == '_' ? '-' : *key;
        if (*opt != k)
            return false;
    }
    return *opt == *key;
}

static int find_opt(const kv_optset *set, const char *key)
{
    for (size_t i = 0; i < set->n; i++)
        if (name_eq(set->opts[i].name, key))
            return (int)i;
    return -1;
}

static kv_err set_value(kv_optset *set, int i, const char *val, char *err, size_t errlen)
{
    const kv_opt *o = &set->opts[i];
    char *end = NULL;
    switch (o->type) {
    case KV_OPT_STR: {
        char *copy = strdup(val);
        if (!copy)
            return KV_RESOURCE_EXHAUSTED;
        if (set->owned[i])
            free(*(char **)o->ptr);
        *(char **)o->ptr = copy;
        set->owned[i] = true;
        return KV_OK;
    }
    case KV_OPT_INT: {
        errno = 0;
        long v = strtol(val, &end, 0);
        if (errno || end == val || *end || (o->min < o->max && (v < o->min || v > o->max))) {
            if (o->min < o->max)
                snprintf(err, errlen, "--%s: '%s' is not an integer in [%ld, %ld]", o->name, val,
                         o->min, o->max);
            else
                snprintf(err, errlen, "--%s: '%s' is not an integer", o->name, val);
            return KV_INVALID_ARGUMENT;
        }
        *(long *)o->ptr = v;
        return KV_OK;
    }
    case KV_OPT_DOUBLE: {
        errno = 0;
        double v = strtod(val, &end);
        if (errno || end == val || *end) {
            snprintf(err, errlen, "--%s: '%s' is not a number", o->name, val);
            return KV_INVALID_ARGUMENT;
        }
        *(double *)o->ptr = v;
        return KV_OK;
    }
    case KV_OPT_BOOL: {
        static const char *const t[] = {"1", "true", "on", "yes"};
        static const char *const f[] = {"0", "false", "off", "no"};
        for (int k = 0; k < 4; k++) {
            if (strcmp(val, t[k]) == 0) {
                *(bool *)o->ptr = true;
                return KV_OK;
            }
            if (strcmp(val, f[k]) == 0) {
                *(bool *)o->ptr = false;
                return KV_OK;
            }
        }
        snprintf(err, errlen, "--%s: '%s' is not on/off", o->name, val);
        return KV_INVALID_ARGUMENT;
    }
    case KV_OPT_ENUM:
        for (int k = 0; o->choices[k]; k++) {
            if (strcmp(val, o->choices[k]) == 0) {
                *(int *)o->ptr = k;
                return KV_OK;
            }
        }
        {
            int at = snprintf(err, errlen, "--%s: '%s' is not one of the accepted values:", o->name,
                              val);
            for (int k = 0; o->choices[k] && at > 0 && (size_t)at < errlen; k++)
                at += snprintf(err + at, errlen - (size_t)at, "%s%s", k ? "|" : " ", o->choices[k]);
        }
        return KV_INVALID_ARGUMENT;
    }
    return KV_INTERNAL;
}

typedef struct ini_ctx {
    kv_optset *set;
    char *err;
    size_t errlen;
    kv_err rv;
} ini_ctx;

static int opts_ini_handler(void *user, const char *section, const char *name, const char *value)
{
    ini_ctx *c = user;
    (void)section;
    int i = find_opt(c->set, name);
    if (i < 0) {
        snprintf(c->err, c->errlen, "unknown configuration key '%s'", name);
        c->rv = KV_INVALID_ARGUMENT;
        return 0;
    }
    c->rv = set_value(c->set, i, value, c->err, c->errlen);
    return c->rv == KV_OK;
}

static kv_err load_ini(kv_optset *set, const char *path, char *err, size_t errlen)
{
    ini_ctx c = {set, err, errlen, KV_OK};
    int line = ini_parse(path, opts_ini_handler, &c);
    if (line == -1) {
        snprintf(err, errlen, "--config %s: %s", path, strerror(errno));
        return KV_INVALID_ARGUMENT;
    }
    if (line != 0) {
        char inner[512];
        snprintf(inner, sizeof(inner), "%s", c.rv != KV_OK ? err : "syntax error");
        snprintf(err, errlen, "%s:%d: %s", path, line, inner);
        return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

void kv_opts_usage(const kv_optset *set, void *file)
{
    FILE *f = file;
    fprintf(f, "usage: %s [flags]%s%s\n\nflags:\n", set->prog, set->usage ? " " : "",
            set->usage ? set->usage : "");
    fprintf(f, "  --%-22s %s\n", "config FILE", "INI file with the same keys (flags override)");
    for (size_t i = 0; i < set->n; i++) {
        const kv_opt *o = &set->opts[i];
        char dflt[128] = "";
        switch (o->type) {
        case KV_OPT_STR:
            if (*(char **)o->ptr)
                snprintf(dflt, sizeof(dflt), " (default %s)", *(char **)o->ptr);
            break;
        case KV_OPT_INT:
            snprintf(dflt, sizeof(dflt), " (default %ld)", *(long *)o->ptr);
            break;
        case KV_OPT_DOUBLE:
            snprintf(dflt, sizeof(dflt), " (default %g)", *(double *)o->ptr);
            break;
        case KV_OPT_BOOL:
            snprintf(dflt, sizeof(dflt), " (default %s)", *(bool *)o->ptr ? "on" : "off");
            break;
        case KV_OPT_ENUM:
            snprintf(dflt, sizeof(dflt), " (default %s)", o->choices[*(int *)o->ptr]);
            break;
        }
        fprintf(f, "  --%-22s %s%s\n", o->name, o->help ? o->help : "", dflt);
    }
}

/* The option a flag word names: --name[=value] or a one-letter -x. */
static int flag_index(const kv_optset *set, const char *a, const char **eqval, char *err,
                      size_t errlen)
{
    *eqval = NULL;
    if (a[0] == '-' && a[1] && a[1] != '-' && !a[2]) {
        for (size_t k = 0; k < set->n; k++)
            if (set->opts[k].short_name == a[1])
                return (int)k;
        snprintf(err, errlen, "unknown flag %s (see --help)", a);
        return -1;
    }
    char name[128];
    const char *eq = strchr(a + 2, '=');
    size_t nlen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    if (nlen >= sizeof(name))
        nlen = sizeof(name) - 1;
    memcpy(name, a + 2, nlen);
    name[nlen] = '\0';
    int k = find_opt(set, name);
    if (k < 0)
        snprintf(err, errlen, "unknown flag --%s (see --help)", name);
    *eqval = eq ? eq + 1 : NULL;
    return k;
}

/* Handles argv[*i]: KV_OK (a flag, its value consumed), NOT_FOUND (not a
 * flag: a word), CANCELLED (--help, --version), or INVALID_ARGUMENT. */
static kv_err one_flag(kv_optset *set, int argc, char **argv, int *i, char *err, size_t errlen)
{
    char *a = argv[*i];
    if (strcmp(a, "--config") == 0) {
        (*i)++;
        return KV_OK;
    }
    if (strncmp(a, "--config=", 9) == 0)
        return KV_OK;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
        kv_opts_usage(set, stdout);
        return KV_CANCELLED;
    }
    if (strcmp(a, "--version") == 0) {
        printf("%s %s\n", set->prog, KV_VERSION);
        return KV_CANCELLED;
    }
    bool is_short = a[0] == '-' && a[1] && a[1] != '-' && !a[2];
    if (!is_short && (strncmp(a, "--", 2) != 0 || a[2] == '\0'))
        return KV_NOT_FOUND;
    const char *val;
    int k = flag_index(set, a, &val, err, errlen);
    if (k < 0)
        return KV_INVALID_ARGUMENT;
    if (!val && set->opts[k].type == KV_OPT_BOOL) {
        bool is_word = *i + 1 < argc &&
                       (strcmp(argv[*i + 1], "on") == 0 || strcmp(argv[*i + 1], "off") == 0 ||
                        strcmp(argv[*i + 1], "true") == 0 || strcmp(argv[*i + 1], "false") == 0);
        val = is_word ? argv[++*i] : "true";
    }
    if (!val) {
        if (*i + 1 >= argc) {
            snprintf(err, errlen, "--%s needs a value", set->opts[k].name);
            return KV_INVALID_ARGUMENT;
        }
        val = argv[++*i];
    }
    return set_value(set, k, val, err, errlen);
}

kv_err kv_opts_parse(kv_optset *set, int argc, char **argv, int *npos, char *err, size_t errlen)
{
    kv_err rv;
    if (!set->owned && !(set->owned = calloc(set->n ? set->n : 1, sizeof(bool))))
        return KV_RESOURCE_EXHAUSTED;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) { /* the INI file first */
        if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0) {
            const char *path = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!path) {
                snprintf(err, errlen, "--config needs a file name");
                return KV_INVALID_ARGUMENT;
            }
            if ((rv = load_ini(set, path, err, errlen)) != KV_OK)
                return rv;
        }
    }
    int pos = 0;
    bool words_only = false; /* after "--": every word is a non-flag word */
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (!words_only && strcmp(a, "--") == 0) {
            words_only = true;
            continue;
        }
        rv = words_only ? KV_NOT_FOUND : one_flag(set, argc, argv, &i, err, errlen);
        if (rv == KV_NOT_FOUND && !npos) { /* a flags-only program: a stray word is a mistake */
            snprintf(err, errlen, "unexpected argument '%s' (flags start with --, see --help)", a);
            return KV_INVALID_ARGUMENT;
        }
        if (rv == KV_NOT_FOUND)
            argv[++pos] = a;
        else if (rv != KV_OK)
            return rv;
    }
    if (npos)
        *npos = pos;
    return KV_OK;
}

void kv_opts_free(kv_optset *set)
{
    if (!set || !set->owned)
        return;
    for (size_t i = 0; i < set->n; i++) {
        if (set->owned[i]) {
            free(*(char **)set->opts[i].ptr);
            *(char **)set->opts[i].ptr = NULL;
        }
    }
    free(set->owned);
    set->owned = NULL;
}
