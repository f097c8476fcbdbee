/* codec.c - request and response bodies: JSON (cJSON) and MessagePack, one tree for both.
 * MessagePack is read by a small checked reader (every count is checked against the bytes
 * left before anything is allocated) and written with msgpack-c's packer. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "server_internal.h"

/* ---- checks shared by both formats ------------------------------------------------------ */

static enum ar_status check_tree(const cJSON *j, int depth, struct ar_err *err)
{
    if ((cJSON_IsArray(j) || cJSON_IsObject(j)) && depth > SERVER_CODEC_MAX_DEPTH)
        return ar_err_set(err, AR_EFORMAT, 0, "nesting deeper than %d", SERVER_CODEC_MAX_DEPTH);
    if (j->string && !ar_utf8_valid(j->string, strlen(j->string)))
        return ar_err_set(err, AR_EFORMAT, 0, "invalid UTF-8 in a key");
    if (cJSON_IsNumber(j) && !isfinite(j->valuedouble))
        return ar_err_set(err, AR_EFORMAT, 0, "a number is out of range");
    if (cJSON_IsString(j) && !ar_utf8_valid(j->valuestring, strlen(j->valuestring)))
        return ar_err_set(err, AR_EFORMAT, 0, "invalid UTF-8 in a string");
    if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        for (const cJSON *c = j->child; c; c = c->next) {
            enum ar_status st = check_tree(c, depth + 1, err);
            if (st != AR_OK)
                return st;
        }
    }
    return AR_OK;
}

/* ---- MessagePack reader ------------------------------------------------------------------- */

struct mp_reader {
    const uint8_t *p, *end, *start;
    struct ar_err *err;
    const char *key; /* the innermost map key being read (names the field of an error) */
};

static enum ar_status mp_fail(struct mp_reader *r, const char *what)
{
    return ar_err_set(r->err, AR_EFORMAT, (uint64_t)(r->p - r->start), "msgpack: %s", what);
}

static bool mp_need(struct mp_reader *r, size_t n)
{
    return (size_t)(r->end - r->p) >= n;
}

static uint64_t mp_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Reads n big-endian bytes as an unsigned integer. */
static enum ar_status mp_uint(struct mp_reader *r, int n, uint64_t *v)
{
    if (!mp_need(r, (size_t)n))
        return mp_fail(r, "truncated");
    *v = mp_be(r->p, n);
    r->p += n;
    return AR_OK;
}

/* A string or bin payload of n bytes as a new NUL-terminated string (validated); is_key: a
 * map key. A NUL is refused as in JSON (server_codec_parse): the tree's strings end at one. */
static enum ar_status mp_str(struct mp_reader *r, uint64_t n, bool is_key, char **out)
{
    char *s;
    if (!mp_need(r, n))
        return mp_fail(r, "truncated string");
    if (memchr(r->p, 0, n)) {
        if (is_key || !r->key)
            return mp_fail(r, is_key ? "a key contains a NUL character" : "string contains NUL");
        return ar_err_set(r->err, AR_EFORMAT, (uint64_t)(r->p - r->start),
                          "msgpack: \"%.64s\" contains a NUL character", r->key);
    }
    if (!ar_utf8_valid((const char *)r->p, n))
        return mp_fail(r, "invalid UTF-8 in a string");
    s = ar_strndup((const char *)r->p, n);
    if (!s)
        return AR_ENOMEM;
    r->p += n;
    *out = s;
    return AR_OK;
}

static enum ar_status mp_value(struct mp_reader *r, int depth, cJSON **out);

static enum ar_status mp_array(struct mp_reader *r, uint64_t n, int depth, cJSON **out)
{
    cJSON *a;
    if (depth > SERVER_CODEC_MAX_DEPTH)
        return mp_fail(r, "nesting too deep");
    if (n > (uint64_t)(r->end - r->p)) /* each element takes at least one byte */
        return mp_fail(r, "array longer than the data");
    if (!(a = cJSON_CreateArray()))
        return AR_ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        cJSON *v = NULL;
        enum ar_status st = mp_value(r, depth + 1, &v);
        if (st != AR_OK) {
            cJSON_Delete(a);
            return st;
        }
        cJSON_AddItemToArray(a, v);
    }
    *out = a;
    return AR_OK;
}

static enum ar_status mp_key(struct mp_reader *r, char **key)
{
    uint64_t n = 0;
    enum ar_status st;
    uint8_t b;
    if (!mp_need(r, 1))
        return mp_fail(r, "truncated map");
    b = *r->p++;
    if (b >= 0xa0 && b <= 0xbf)
        n = b & 0x1f;
    else if (b == 0xd9 || b == 0xda || b == 0xdb) {
        if ((st = mp_uint(r, 1 << (b - 0xd9), &n)) != AR_OK)
            return st;
    } else {
        r->p--;
        return mp_fail(r, "map key is not a string");
    }
    return mp_str(r, n, true, key);
}

static enum ar_status mp_map(struct mp_reader *r, uint64_t n, int depth, cJSON **out)
{
    cJSON *o;
    if (depth > SERVER_CODEC_MAX_DEPTH)
        return mp_fail(r, "nesting too deep");
    if (n > (uint64_t)(r->end - r->p) / 2)
        return mp_fail(r, "map longer than the data");
    if (!(o = cJSON_CreateObject()))
        return AR_ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        char *key = NULL;
        cJSON *v = NULL;
        enum ar_status st = mp_key(r, &key);
        if (st == AR_OK) {
            const char *outer = r->key;
            r->key = key;
            st = mp_value(r, depth + 1, &v);
            r->key = outer;
        }
        if (st != AR_OK) {
            ar_free(key);
            cJSON_Delete(o);
            return st;
        }
        /* cJSON frees keys with its own allocator: it copies ours */
        bool added = cJSON_AddItemToObject(o, key, v);
        ar_free(key);
        if (!added) {
            cJSON_Delete(v);
            cJSON_Delete(o);
            return AR_ENOMEM;
        }
    }
    *out = o;
    return AR_OK;
}

static enum ar_status mp_number(cJSON **out, double v)
{
    if (!isfinite(v))
        return AR_EFORMAT;
    *out = cJSON_CreateNumber(v);
    return *out ? AR_OK : AR_ENOMEM;
}

static enum ar_status mp_value(struct mp_reader *r, int depth, cJSON **out)
{
    uint8_t b;
    uint64_t u = 0;
    enum ar_status st;
    if (!mp_need(r, 1))
        return mp_fail(r, "truncated");
    b = *r->p++;
    if (b <= 0x7f)
        return mp_number(out, b);
    if (b >= 0xe0)
        return mp_number(out, (int8_t)b);
    if (b >= 0x80 && b <= 0x8f)
        return mp_map(r, b & 0x0f, depth, out);
    if (b >= 0x90 && b <= 0x9f)
        return mp_array(r, b & 0x0f, depth, out);
    if (b >= 0xa0 && b <= 0xbf) {
        char *s = NULL;
        if ((st = mp_str(r, b & 0x1f, false, &s)) != AR_OK)
            return st;
        *out = cJSON_CreateString(s);
        ar_free(s);
        return *out ? AR_OK : AR_ENOMEM;
    }
    switch (b) {
    case 0xc0:
        *out = cJSON_CreateNull();
        return *out ? AR_OK : AR_ENOMEM;
    case 0xc2:
    case 0xc3:
        *out = cJSON_CreateBool(b == 0xc3);
        return *out ? AR_OK : AR_ENOMEM;
    case 0xc4: /* bin 8/16/32: read as a string */
    case 0xc5:
    case 0xc6:
    case 0xd9: /* str 8/16/32 */
    case 0xda:
    case 0xdb: {
        int nb = 1 << (b >= 0xd9 ? b - 0xd9 : b - 0xc4);
        char *s = NULL;
        if ((st = mp_uint(r, nb, &u)) != AR_OK || (st = mp_str(r, u, false, &s)) != AR_OK)
            return st;
        *out = cJSON_CreateString(s);
        ar_free(s);
        return *out ? AR_OK : AR_ENOMEM;
    }
    case 0xca: { /* float 32 */
        float f;
        uint32_t bits;
        if ((st = mp_uint(r, 4, &u)) != AR_OK)
            return st;
        bits = (uint32_t)u;
        memcpy(&f, &bits, 4);
        if (mp_number(out, (double)f) == AR_EFORMAT)
            return mp_fail(r, "non-finite number");
        return *out ? AR_OK : AR_ENOMEM;
    }
    case 0xcb: { /* float 64 */
        double d;
        if ((st = mp_uint(r, 8, &u)) != AR_OK)
            return st;
        memcpy(&d, &u, 8);
        if (mp_number(out, d) == AR_EFORMAT)
            return mp_fail(r, "non-finite number");
        return *out ? AR_OK : AR_ENOMEM;
    }
    case 0xcc: /* uint 8/16/32/64 */
    case 0xcd:
    case 0xce:
    case 0xcf:
        if ((st = mp_uint(r, 1 << (b - 0xcc), &u)) != AR_OK)
            return st;
        return mp_number(out, (double)u);
    case 0xd0: /* int 8/16/32/64 */
    case 0xd1:
    case 0xd2:
    case 0xd3: {
        int nb = 1 << (b - 0xd0);
        int64_t v;
        if ((st = mp_uint(r, nb, &u)) != AR_OK)
            return st;
        if (nb < 8 && (u >> (nb * 8 - 1)) & 1) /* sign-extend */
            u |= ~(uint64_t)0 << (nb * 8);
        memcpy(&v, &u, 8);
        return mp_number(out, (double)v);
    }
    case 0xdc: /* array 16/32 */
    case 0xdd:
        if ((st = mp_uint(r, b == 0xdc ? 2 : 4, &u)) != AR_OK)
            return st;
        return mp_array(r, u, depth, out);
    case 0xde: /* map 16/32 */
    case 0xdf:
        if ((st = mp_uint(r, b == 0xde ? 2 : 4, &u)) != AR_OK)
            return st;
        return mp_map(r, u, depth, out);
    default: /* 0xc1 (never used), ext and fixext */
        r->p--;
        if (b == 0xc1)
            return mp_fail(r, "reserved byte 0xc1");
        return mp_fail(r, "ext types are not supported");
    }
}

/* ---- parse / write ------------------------------------------------------------------------ */

enum ar_status server_codec_parse(enum server_codec_format fmt, const char *data, size_t len,
                                  cJSON **out, struct ar_err *err)
{
    cJSON *j = NULL;
    enum ar_status st;
    *out = NULL;
    if (fmt == SERVER_CODEC_MSGPACK) {
        struct mp_reader r = {(const uint8_t *)data, (const uint8_t *)data + len,
                              (const uint8_t *)data, err, NULL};
        if (len == 0)
            return ar_err_set(err, AR_EFORMAT, 0, "empty body");
        st = mp_value(&r, 1, &j);
        if (st != AR_OK)
            return st == AR_ENOMEM ? st : AR_EFORMAT;
        if (r.p != r.end) {
            cJSON_Delete(j);
            return ar_err_set(err, AR_EFORMAT, (uint64_t)(r.p - r.start),
                              "msgpack: trailing bytes after the value");
        }
    } else {
        const char *end = NULL;
        char field[96];
        size_t at = 0;
        if (len == 0)
            return ar_err_set(err, AR_EFORMAT, 0, "empty body");
        /* A NUL in a string, raw (never valid JSON) or escaped as \u0000 (valid JSON, but cJSON
         * decodes it into a 0 byte and every reader of the tree stops there: "victim\u0000x"
         * would be shop "victim"). No id or text of ours may hold one, and the tree cannot carry
         * one, so the body is refused, as MessagePack's reader refuses the same byte. The raw
         * text is scanned before parsing (ar_json_has_nul follows strings and escapes), which
         * also names the field. */
        if (ar_json_has_nul(data, len, &at, field, sizeof(field))) {
            if (field[0])
                return ar_err_set(err, AR_EFORMAT, at,
                                  "\"%s\" contains a NUL character (\\u0000) at byte %zu", field,
                                  at);
            return ar_err_set(err, AR_EFORMAT, at,
                              "invalid JSON: a NUL character (\\u0000) at byte %zu", at);
        }
        ar_json_oom_take();
        j = cJSON_ParseWithLengthOpts(data, len, &end, false);
        if (!j && ar_json_oom_take())
            return ar_err_set(err, AR_ENOMEM, 0, "out of memory parsing the body");
        if (!j) {
            size_t off = end && end >= data && end <= data + len ? (size_t)(end - data) : 0;
            return ar_err_set(err, AR_EFORMAT, off, "invalid JSON near byte %zu", off);
        }
        /* only whitespace may follow the value */
        for (const char *p = end; p < data + len; p++) {
            if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
                cJSON_Delete(j);
                return ar_err_set(err, AR_EFORMAT, (uint64_t)(p - data),
                                  "invalid JSON: trailing data at byte %zu", (size_t)(p - data));
            }
        }
        /* cJSON copies raw bytes of strings unchecked */
        if ((st = check_tree(j, 1, err)) != AR_OK) {
            cJSON_Delete(j);
            return st;
        }
    }
    *out = j;
    return AR_OK;
}

static int mp_write_cb(void *data, const char *buf, size_t len)
{
    return msgpack_sbuffer_write(data, buf, len);
}

static int mp_pack(msgpack_packer *pk, const cJSON *j)
{
    int rc = 0;
    if (cJSON_IsObject(j)) {
        size_t n = 0;
        for (const cJSON *c = j->child; c; c = c->next)
            n++;
        rc |= msgpack_pack_map(pk, n);
        for (const cJSON *c = j->child; c && !rc; c = c->next) {
            size_t kl = c->string ? strlen(c->string) : 0;
            rc |= msgpack_pack_str(pk, kl);
            rc |= msgpack_pack_str_body(pk, c->string ? c->string : "", kl);
            rc |= mp_pack(pk, c);
        }
    } else if (cJSON_IsArray(j)) {
        size_t n = 0;
        for (const cJSON *c = j->child; c; c = c->next)
            n++;
        rc |= msgpack_pack_array(pk, n);
        for (const cJSON *c = j->child; c && !rc; c = c->next)
            rc |= mp_pack(pk, c);
    } else if (cJSON_IsString(j) || cJSON_IsRaw(j)) {
        size_t n = j->valuestring ? strlen(j->valuestring) : 0;
        rc |= msgpack_pack_str(pk, n);
        rc |= msgpack_pack_str_body(pk, j->valuestring ? j->valuestring : "", n);
    } else if (cJSON_IsNumber(j)) {
        double v = j->valuedouble;
        if (isfinite(v) && v == floor(v) && fabs(v) < 9.2e18)
            rc |= msgpack_pack_int64(pk, (int64_t)v);
        else
            rc |= msgpack_pack_double(pk, v);
    } else if (cJSON_IsTrue(j)) {
        rc |= msgpack_pack_true(pk);
    } else if (cJSON_IsFalse(j)) {
        rc |= msgpack_pack_false(pk);
    } else {
        rc |= msgpack_pack_nil(pk);
    }
    return rc;
}

enum ar_status server_codec_write(enum server_codec_format fmt, const cJSON *j, char **out,
                                  size_t *len)
{
    *out = NULL;
    *len = 0;
    if (fmt == SERVER_CODEC_JSON) {
        char *s = cJSON_PrintUnformatted(j);
        if (!s)
            return AR_ENOMEM;
        *len = strlen(s);
        *out = ar_strndup(s, *len);
        cJSON_free(s);
        return *out ? AR_OK : AR_ENOMEM;
    }
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, mp_write_cb);
    if (mp_pack(&pk, j) != 0) {
        msgpack_sbuffer_destroy(&sb);
        return AR_ENOMEM;
    }
    *out = ar_malloc(sb.size ? sb.size : 1);
    if (*out) {
        memcpy(*out, sb.data, sb.size);
        *len = sb.size;
    }
    msgpack_sbuffer_destroy(&sb);
    return *out ? AR_OK : AR_ENOMEM;
}
