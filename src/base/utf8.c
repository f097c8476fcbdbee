/* utf8.c - UTF-8 decoding and validation (see utf8.h). */
#include "utf8.h"

#include "base.h"

/* Length of the sequence c leads and the range of its second byte, which is what table 3-7
 * narrows (overlongs after 0xe0/0xf0, surrogates after 0xed, > U+10FFFF after 0xf4); 0 when c
 * cannot lead a sequence of two or more bytes. */
static size_t lead(uint8_t c, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        return 2;
    if (c >= 0xe0 && c <= 0xef) {
        if (c == 0xe0)
            *lo = 0xa0;
        else if (c == 0xed)
            *hi = 0x9f;
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (c == 0xf0)
            *lo = 0x90;
        else if (c == 0xf4)
            *hi = 0x8f;
        return 4;
    }
    return 0;
}

/* How many bytes of s[0..n) (n >= 1, s[0] >= 0x80) are allowed where they are, up to the
 * sequence's length *len (0 when s[0] cannot lead). */
static size_t allowed(const uint8_t *s, size_t n, size_t *len)
{
    uint8_t lo, hi;
    size_t k = 1;
    *len = lead(s[0], &lo, &hi);
    if (!*len)
        return 0;
    for (; k < *len && k < n; k++)
        if (s[k] < (k == 1 ? lo : 0x80) || s[k] > (k == 1 ? hi : 0xbf))
            break;
    return k;
}

size_t ar_utf8_decode(const char *str, size_t n, uint32_t *cp)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t len, k;
    uint32_t v;
    if (n == 0)
        return 0;
    if (s[0] < 0x80) {
        if (cp)
            *cp = s[0];
        return 1;
    }
    k = allowed(s, n, &len);
    if (!len || k < len)
        return 0;
    v = s[0] & (0x7fu >> len);
    for (size_t i = 1; i < len; i++)
        v = (v << 6) | (s[i] & 0x3fu);
    if (cp)
        *cp = v;
    return len;
}

bool ar_utf8_incomplete(const char *str, size_t n)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t len;
    if (n == 0 || s[0] < 0x80)
        return false;
    return allowed(s, n, &len) == n && n < len;
}

bool ar_utf8_valid(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t k = ar_utf8_decode(s + i, n - i, NULL);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

char *ar_utf8_sanitize(const char *s, size_t n, size_t *out_len)
{
    char *out;
    size_t i = 0, o = 0;
    if (n > (SIZE_MAX - 1) / 3)
        return NULL;
    out = ar_malloc(n * 3 + 1); /* each bad byte becomes 3 bytes */
    if (!out)
        return NULL;
    while (i < n) {
        size_t k = ar_utf8_decode(s + i, n - i, NULL);
        if (k) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    if (out_len)
        *out_len = o;
    return out;
}

size_t ar_utf8_decode_lax(const char *str, size_t n, uint32_t *cp)
{
    const uint8_t *s = (const uint8_t *)str;
    size_t len;
    uint32_t c;
    if (n == 0)
        return 0;
    len = ar_utf8_lax_len(s[0]);
    if (len == 1) {
        *cp = s[0];
        return s[0] < 0x80 ? 1 : 0;
    }
    if (len > n)
        return 0;
    c = s[0] & (0xffu >> (len + 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3fu);
    }
    *cp = c;
    return len;
}
