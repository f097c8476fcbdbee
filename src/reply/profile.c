/* profile.c - shop profiles from a JSON config file (reply.h describes the format): the
 * built-in default, per-shop overrides that start from it, and the system prompt each
 * profile puts first in every prompt of its shop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reply_internal.h"

struct reply_profiles {
    struct reply_profile def;
    struct reply_profile *shops; /* owned, (n_shops), sorted by shop_id */
    int n_shops;
};

static const char *const default_sensitive[] = {
    "假货", "诈骗", "过敏", "投诉", "起诉", "报警", "律师",
    "fake", "scam", "fraud", "allergic", "lawyer", "lawsuit"};

static void words_free(char **w, int n)
{
    for (int i = 0; w && i < n; i++)
        ar_free(w[i]);
    ar_free(w);
}

static void profile_fini(struct reply_profile *p)
{
    ar_free(p->shop_id);
    ar_free(p->name);
    ar_free(p->persona);
    ar_free(p->refund_policy);
    ar_free(p->signature);
    ar_free(p->system);
    ar_free(p->system_base);
    words_free(p->banned, p->n_banned);
    words_free(p->sensitive, p->n_sensitive);
    memset(p, 0, sizeof(*p));
}

static char *dup_or_null(const char *s)
{
    return s ? ar_strdup(s) : NULL;
}

static enum ar_status words_dup(char **src, int n, char ***out)
{
    *out = NULL;
    if (n == 0)
        return AR_OK;
    *out = ar_calloc((size_t)n, sizeof(char *));
    if (!*out)
        return AR_ENOMEM;
    for (int i = 0; i < n; i++)
        if (!((*out)[i] = ar_strdup(src[i])))
            return AR_ENOMEM; /* the caller frees the partial copy (n entries, NULLs ok) */
    return AR_OK;
}

/* Deep copy of src into dst (zeroed); on failure dst holds what was copied (fini frees). */
static enum ar_status profile_copy(struct reply_profile *dst, const struct reply_profile *src)
{
    enum ar_status st;
    *dst = *src;
    dst->shop_id = dup_or_null(src->shop_id);
    dst->name = dup_or_null(src->name);
    dst->persona = dup_or_null(src->persona);
    dst->refund_policy = dup_or_null(src->refund_policy);
    dst->signature = dup_or_null(src->signature);
    dst->system = dup_or_null(src->system);
    dst->system_base = dup_or_null(src->system_base);
    dst->banned = dst->sensitive = NULL;
    dst->n_banned = dst->n_sensitive = 0;
    if ((src->shop_id && !dst->shop_id) || (src->name && !dst->name) ||
        (src->persona && !dst->persona) || (src->refund_policy && !dst->refund_policy) ||
        (src->signature && !dst->signature) || (src->system && !dst->system) ||
        (src->system_base && !dst->system_base))
        return AR_ENOMEM;
    st = words_dup(src->banned, src->n_banned, &dst->banned);
    dst->n_banned = dst->banned ? src->n_banned : 0;
    if (st != AR_OK)
        return st;
    st = words_dup(src->sensitive, src->n_sensitive, &dst->sensitive);
    dst->n_sensitive = dst->sensitive ? src->n_sensitive : 0;
    return st;
}

static enum ar_status builtin_default(struct reply_profile *p)
{
    memset(p, 0, sizeof(*p));
    p->shop_id = ar_strdup("");
    p->name = ar_strdup("");
    p->lang_policy = REPLY_LANG_SAME;
    p->min_chars = 2;
    p->max_chars = 300;
    p->mode = REPLY_MODE_SUGGEST;
    p->auto_min_rating = 4;
    p->hold_needs_human = true;
    p->candidates = 2; /* 3 measured 2.5x the latency of 1 on a 2-core CPU (docs/benchmarks.md) */
    p->aspect_notes = true;
    p->n_sensitive = (int)AR_ARRAY_LEN(default_sensitive);
    p->sensitive = ar_calloc(AR_ARRAY_LEN(default_sensitive), sizeof(char *));
    if (!p->shop_id || !p->name || !p->sensitive)
        return AR_ENOMEM;
    for (size_t i = 0; i < AR_ARRAY_LEN(default_sensitive); i++)
        if (!(p->sensitive[i] = ar_strdup(default_sensitive[i])))
            return AR_ENOMEM;
    return AR_OK;
}

/* The stable system prompt: base (the model card's default unless system_prompt replaced
 * it), then persona and refund policy, each on its own line, only when set. */
static enum ar_status build_system(struct reply_profile *p, const char *base)
{
    struct ar_buf b = {0};
    ar_buf_puts(&b, base ? base : REPLY_DEFAULT_SYSTEM_PROMPT);
    if (p->persona && *p->persona) {
        ar_buf_puts(&b, "\n");
        ar_buf_puts(&b, p->persona);
    }
    if (p->refund_policy && *p->refund_policy) {
        ar_buf_puts(&b, "\n");
        ar_buf_puts(&b, p->refund_policy);
    }
    ar_free(p->system);
    p->system = ar_buf_take(&b, NULL);
    if (base != p->system_base) {
        char *keep = base ? ar_strdup(base) : NULL;
        if (base && !keep)
            return AR_ENOMEM;
        ar_free(p->system_base);
        p->system_base = keep;
    }
    return p->system ? AR_OK : AR_ENOMEM;
}

/* ---- parsing ------------------------------------------------------------------------------ */

static enum ar_status set_str(char **dst, const cJSON *v, const char *where, const char *key,
                              struct ar_err *err)
{
    if (!cJSON_IsString(v))
        return ar_err_set(err, AR_EFORMAT, 0, "%s.%s: expected a string", where, key);
    if (!ar_utf8_valid(v->valuestring, strlen(v->valuestring)))
        return ar_err_set(err, AR_EFORMAT, 0, "%s.%s: invalid UTF-8", where, key);
    ar_free(*dst);
    *dst = ar_strdup(v->valuestring);
    return *dst ? AR_OK : AR_ENOMEM;
}

static enum ar_status set_int(int *dst, const cJSON *v, int lo, int hi, const char *where,
                              const char *key, struct ar_err *err)
{
    /* the range first: converting a double outside int's range is undefined (found by
     * fuzz/profile_fuzz.c) */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != (double)(int)v->valuedouble)
        return ar_err_set(err, AR_EFORMAT, 0, "%s.%s: expected an integer in [%d, %d]", where,
                          key, lo, hi);
    *dst = (int)v->valuedouble;
    return AR_OK;
}

static enum ar_status set_words(char ***dst, int *n_dst, const cJSON *v, const char *where,
                                const char *key, struct ar_err *err)
{
    int n;
    char **w;
    const cJSON *it;
    if (!cJSON_IsArray(v))
        return ar_err_set(err, AR_EFORMAT, 0, "%s.%s: expected an array of strings", where, key);
    n = cJSON_GetArraySize(v);
    if (n > REPLY_WORDS_MAX)
        return ar_err_set(err, AR_EFORMAT, 0, "%s.%s: more than %d words", where, key,
                          REPLY_WORDS_MAX);
    w = n ? ar_calloc((size_t)n, sizeof(char *)) : NULL;
    if (n && !w)
        return AR_ENOMEM;
    n = 0;
    cJSON_ArrayForEach(it, v)
    {
        if (!cJSON_IsString(it) || !*it->valuestring ||
            !ar_utf8_valid(it->valuestring, strlen(it->valuestring))) {
            words_free(w, n);
            return ar_err_set(err, AR_EFORMAT, 0,
                              "%s.%s: every word must be a non-empty UTF-8 string", where, key);
        }
        if (!(w[n] = ar_strdup(it->valuestring))) {
            words_free(w, n);
            return AR_ENOMEM;
        }
        n++;
    }
    words_free(*dst, *n_dst);
    *dst = w;
    *n_dst = n;
    return AR_OK;
}

/* Applies the members of object o onto p. *base receives system_prompt (borrowed from o). */
static enum ar_status apply(struct reply_profile *p, const cJSON *o, const char *where,
                            const char **base, struct ar_err *err)
{
    const cJSON *v;
    enum ar_status st = AR_OK;
    if (!cJSON_IsObject(o))
        return ar_err_set(err, AR_EFORMAT, 0, "%s: expected an object", where);
    cJSON_ArrayForEach(v, o)
    {
        const char *k = v->string;
        if (!strcmp(k, "name"))
            st = set_str(&p->name, v, where, k, err);
        else if (!strcmp(k, "persona"))
            st = set_str(&p->persona, v, where, k, err);
        else if (!strcmp(k, "refund_policy"))
            st = set_str(&p->refund_policy, v, where, k, err);
        else if (!strcmp(k, "signature"))
            st = set_str(&p->signature, v, where, k, err);
        else if (!strcmp(k, "system_prompt")) {
            if (!cJSON_IsString(v) || !*v->valuestring)
                return ar_err_set(err, AR_EFORMAT, 0, "%s.%s: expected a non-empty string",
                                  where, k);
            *base = v->valuestring;
        } else if (!strcmp(k, "lang")) {
            const char *s = cJSON_IsString(v) ? v->valuestring : "";
            if (!strcmp(s, "same"))
                p->lang_policy = REPLY_LANG_SAME;
            else if (!strcmp(s, "zh"))
                p->lang_policy = REPLY_LANG_ZH;
            else if (!strcmp(s, "en"))
                p->lang_policy = REPLY_LANG_EN;
            else
                return ar_err_set(err, AR_EFORMAT, 0, "%s.lang: expected \"same\", \"zh\" or "
                                  "\"en\"", where);
        } else if (!strcmp(k, "mode")) {
            const char *s = cJSON_IsString(v) ? v->valuestring : "";
            if (!strcmp(s, "off"))
                p->mode = REPLY_MODE_OFF;
            else if (!strcmp(s, "suggest"))
                p->mode = REPLY_MODE_SUGGEST;
            else if (!strcmp(s, "auto"))
                p->mode = REPLY_MODE_AUTO;
            else
                return ar_err_set(err, AR_EFORMAT, 0,
                                  "%s.mode: expected \"off\", \"suggest\" or \"auto\"", where);
        } else if (!strcmp(k, "min_chars"))
            st = set_int(&p->min_chars, v, 0, 100000, where, k, err);
        else if (!strcmp(k, "max_chars"))
            st = set_int(&p->max_chars, v, 1, 100000, where, k, err);
        else if (!strcmp(k, "auto_min_rating"))
            st = set_int(&p->auto_min_rating, v, 1, 5, where, k, err);
        else if (!strcmp(k, "hold_needs_human")) {
            if (!cJSON_IsBool(v))
                return ar_err_set(err, AR_EFORMAT, 0, "%s.%s: expected true or false", where, k);
            p->hold_needs_human = cJSON_IsTrue(v);
        } else if (!strcmp(k, "candidates"))
            st = set_int(&p->candidates, v, 1, 8, where, k, err);
        else if (!strcmp(k, "aspect_notes")) {
            if (!cJSON_IsBool(v))
                return ar_err_set(err, AR_EFORMAT, 0, "%s.%s: expected true or false", where, k);
            p->aspect_notes = cJSON_IsTrue(v);
        } else if (!strcmp(k, "banned_words"))
            st = set_words(&p->banned, &p->n_banned, v, where, k, err);
        else if (!strcmp(k, "sensitive_words"))
            st = set_words(&p->sensitive, &p->n_sensitive, v, where, k, err);
        else
            return ar_err_set(err, AR_EFORMAT, 0, "%s: unknown member \"%s\"", where, k);
        if (st != AR_OK)
            return st;
    }
    if (p->min_chars > p->max_chars)
        return ar_err_set(err, AR_EFORMAT, 0, "%s: min_chars %d is above max_chars %d", where,
                          p->min_chars, p->max_chars);
    return AR_OK;
}

static int cmp_shop(const void *a, const void *b)
{
    return strcmp(((const struct reply_profile *)a)->shop_id,
                  ((const struct reply_profile *)b)->shop_id);
}

void reply_profiles_destroy(struct reply_profiles *ps)
{
    if (!ps)
        return;
    profile_fini(&ps->def);
    for (int i = 0; i < ps->n_shops; i++)
        profile_fini(&ps->shops[i]);
    ar_free(ps->shops);
    ar_free(ps);
}

enum ar_status reply_profiles_default(struct reply_profiles **out)
{
    enum ar_status st;
    struct reply_profiles *ps = ar_calloc(1, sizeof(*ps));
    if (!ps)
        return AR_ENOMEM;
    if ((st = builtin_default(&ps->def)) != AR_OK || (st = build_system(&ps->def, NULL)) != AR_OK) {
        reply_profiles_destroy(ps);
        return st;
    }
    *out = ps;
    return AR_OK;
}

enum ar_status reply_profiles_parse(const char *json, size_t len, struct reply_profiles **out,
                                    struct ar_err *err)
{
    enum ar_status st;
    struct reply_profiles *ps = NULL;
    cJSON *root = NULL;
    const cJSON *v, *shops = NULL;
    const char *def_base = NULL;
    if (!json)
        return ar_err_set(err, AR_EINVAL, 0, "no config text");
    ar_json_oom_take();
    root = cJSON_ParseWithLength(json, len);
    if (!root && ar_json_oom_take())
        return ar_err_set(err, AR_ENOMEM, 0, "shops config: out of memory");
    if (!root)
        return ar_err_set(err, AR_EFORMAT, 0, "shops config: not valid JSON");
    if (!cJSON_IsObject(root)) {
        st = ar_err_set(err, AR_EFORMAT, 0, "shops config: expected an object");
        goto fail;
    }
    if ((st = reply_profiles_default(&ps)) != AR_OK)
        goto fail;
    cJSON_ArrayForEach(v, root)
    {
        if (!strcmp(v->string, "default")) {
            if ((st = apply(&ps->def, v, "default", &def_base, err)) != AR_OK)
                goto fail;
        } else if (!strcmp(v->string, "shops")) {
            if (!cJSON_IsObject(v)) {
                st = ar_err_set(err, AR_EFORMAT, 0, "shops: expected an object of profiles");
                goto fail;
            }
            shops = v;
        } else {
            st = ar_err_set(err, AR_EFORMAT, 0, "shops config: unknown member \"%s\"", v->string);
            goto fail;
        }
    }
    if ((st = build_system(&ps->def, def_base)) != AR_OK)
        goto fail;
    if (shops && cJSON_GetArraySize(shops) > 0) {
        int n = cJSON_GetArraySize(shops);
        ps->shops = ar_calloc((size_t)n, sizeof(*ps->shops));
        if (!ps->shops) {
            st = AR_ENOMEM;
            goto fail;
        }
        cJSON_ArrayForEach(v, shops)
        {
            struct reply_profile *p = &ps->shops[ps->n_shops];
            const char *base = def_base;
            char where[STORE_ID_MAX + 16];
            size_t id_len = strlen(v->string);
            snprintf(where, sizeof(where), "shops.%s", v->string);
            if (id_len == 0 || id_len > STORE_ID_MAX || memchr(v->string, 0x1f, id_len) ||
                !ar_utf8_valid(v->string, id_len)) {
                st = ar_err_set(err, AR_EFORMAT, 0, "shops: bad shop id \"%.64s\"", v->string);
                goto fail;
            }
            ps->n_shops++;
            if ((st = profile_copy(p, &ps->def)) != AR_OK)
                goto fail;
            ar_free(p->shop_id);
            if (!(p->shop_id = ar_strdup(v->string))) {
                st = AR_ENOMEM;
                goto fail;
            }
            if ((st = apply(p, v, where, &base, err)) != AR_OK ||
                (st = build_system(p, base)) != AR_OK)
                goto fail;
        }
        qsort(ps->shops, (size_t)ps->n_shops, sizeof(*ps->shops), cmp_shop);
        for (int i = 1; i < ps->n_shops; i++)
            if (!strcmp(ps->shops[i - 1].shop_id, ps->shops[i].shop_id)) {
                st = ar_err_set(err, AR_EFORMAT, 0, "shops: \"%s\" is named twice",
                                ps->shops[i].shop_id);
                goto fail;
            }
    }
    cJSON_Delete(root);
    *out = ps;
    return AR_OK;
fail:
    if (st == AR_ENOMEM)
        ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    cJSON_Delete(root);
    reply_profiles_destroy(ps);
    return st;
}

enum ar_status reply_profiles_load(const char *path, struct reply_profiles **out,
                                   struct ar_err *err)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    enum ar_status st;
    if (!f)
        return ar_err_set(err, AR_EIO, 0, "%s: %s", path, strerror(errno));
    for (;;) {
        size_t got;
        if (n + 4096 > cap) {
            char *p;
            cap = cap ? cap * 2 : 8192;
            if (cap > (16u << 20)) {
                fclose(f);
                ar_free(buf);
                return ar_err_set(err, AR_EFORMAT, 0, "%s: larger than 16 MiB", path);
            }
            if (!(p = ar_realloc(buf, cap))) {
                fclose(f);
                ar_free(buf);
                return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
            }
            buf = p;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        fclose(f);
        ar_free(buf);
        return ar_err_set(err, AR_EIO, 0, "%s: read error", path);
    }
    fclose(f);
    st = reply_profiles_parse(buf, n, out, err);
    ar_free(buf);
    return st;
}

const struct reply_profile *reply_profiles_get(const struct reply_profiles *ps,
                                               const char *shop_id)
{
    int lo = 0, hi = ps->n_shops - 1;
    if (!shop_id)
        return &ps->def;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(shop_id, ps->shops[mid].shop_id);
        if (c == 0)
            return &ps->shops[mid];
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return &ps->def;
}

int reply_profiles_count(const struct reply_profiles *ps)
{
    return ps->n_shops;
}

const struct reply_profile *reply_profiles_at(const struct reply_profiles *ps, int i)
{
    return ps && i >= 0 && i < ps->n_shops ? &ps->shops[i] : NULL;
}

void reply_profile_destroy(struct reply_profile *p)
{
    if (!p)
        return;
    profile_fini(p);
    ar_free(p);
}

enum ar_status reply_profile_from_json(const struct reply_profiles *ps, const char *shop_id,
                                       const cJSON *o, struct reply_profile **out,
                                       struct ar_err *err)
{
    struct reply_profile *p;
    cJSON *copy = NULL;
    const cJSON *id;
    const char *base;
    enum ar_status st;
    size_t id_len = shop_id ? strlen(shop_id) : 0;
    *out = NULL;
    if (!ps || id_len == 0 || id_len > STORE_ID_MAX || memchr(shop_id, 0x1f, id_len) ||
        !ar_utf8_valid(shop_id, id_len))
        return ar_err_set(err, AR_EINVAL, 0, "shop_id must be 1..%d bytes of UTF-8", STORE_ID_MAX);
    if (!cJSON_IsObject(o))
        return ar_err_set(err, AR_EFORMAT, 0, "shop: expected an object");
    id = cJSON_GetObjectItemCaseSensitive(o, "shop_id");
    if (id) {
        if (!cJSON_IsString(id) || strcmp(id->valuestring, shop_id) != 0)
            return ar_err_set(err, AR_EFORMAT, 0, "shop.shop_id: \"%.64s\" is not the shop's id",
                              cJSON_IsString(id) ? id->valuestring : "(not a string)");
        if (!(copy = cJSON_Duplicate(o, 1)))
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        cJSON_DeleteItemFromObjectCaseSensitive(copy, "shop_id");
        o = copy;
    }
    p = ar_calloc(1, sizeof(*p));
    if (!p) {
        cJSON_Delete(copy);
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    }
    /* the default's base prompt unless the object replaces it */
    st = profile_copy(p, &ps->def);
    base = ps->def.system_base;
    if (st == AR_OK) {
        ar_free(p->shop_id);
        p->shop_id = ar_strdup(shop_id);
        st = p->shop_id ? AR_OK : AR_ENOMEM;
    }
    if (st == AR_OK)
        st = apply(p, o, "shop", &base, err);
    if (st == AR_OK)
        st = build_system(p, base);
    cJSON_Delete(copy);
    if (st != AR_OK) {
        if (st == AR_ENOMEM)
            ar_err_set(err, AR_ENOMEM, 0, "out of memory");
        reply_profile_destroy(p);
        return st;
    }
    *out = p;
    return AR_OK;
}

static bool add_words(cJSON *j, const char *name, char *const *w, int n)
{
    cJSON *arr = cJSON_AddArrayToObject(j, name);
    for (int i = 0; arr && i < n; i++) {
        cJSON *s = cJSON_CreateString(w[i]);
        if (!s || !cJSON_AddItemToArray(arr, s)) {
            cJSON_Delete(s);
            return false;
        }
    }
    return arr != NULL;
}

/* Adds name: v when v is set (a profile keeps NULL for members never given). */
static bool add_opt(cJSON *j, const char *name, const char *v)
{
    return !v || cJSON_AddStringToObject(j, name, v) != NULL;
}

cJSON *reply_profile_to_json(const struct reply_profile *p)
{
    static const char *const langs[] = {"same", "zh", "en"};
    static const char *const modes[] = {"off", "suggest", "auto"};
    cJSON *j = cJSON_CreateObject();
    bool ok = j && p;
    ok = ok && cJSON_AddStringToObject(j, "shop_id", p->shop_id ? p->shop_id : "") &&
         cJSON_AddStringToObject(j, "name", p->name ? p->name : "") &&
         add_opt(j, "persona", p->persona) && add_opt(j, "system_prompt", p->system_base) &&
         cJSON_AddStringToObject(j, "lang", langs[p->lang_policy % 3]) &&
         cJSON_AddNumberToObject(j, "min_chars", p->min_chars) &&
         cJSON_AddNumberToObject(j, "max_chars", p->max_chars) &&
         add_opt(j, "refund_policy", p->refund_policy) &&
         add_words(j, "banned_words", p->banned, p->n_banned) &&
         add_words(j, "sensitive_words", p->sensitive, p->n_sensitive) &&
         add_opt(j, "signature", p->signature) &&
         cJSON_AddStringToObject(j, "mode", modes[p->mode % 3]) &&
         cJSON_AddNumberToObject(j, "auto_min_rating", p->auto_min_rating) &&
         cJSON_AddBoolToObject(j, "hold_needs_human", p->hold_needs_human) &&
         cJSON_AddNumberToObject(j, "candidates", p->candidates) &&
         cJSON_AddBoolToObject(j, "aspect_notes", p->aspect_notes);
    if (!ok) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}
