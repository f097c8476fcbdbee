/* utf8.h - UTF-8 as Unicode defines it (chapter 3, table 3-7 "well-formed UTF-8 byte
 * sequences": no overlong forms, no surrogates U+D800..U+DFFF, nothing above U+10FFFF, no
 * truncated sequence), plus the two lax readings the tokenizer needs to split text exactly as
 * the reference tokenizers do. The one UTF-8 code of src/. */
#ifndef AR_BASE_UTF8_H
#define AR_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Decodes the well-formed sequence at s[0..n) into *cp (cp may be NULL) and returns its length
 * (1..4); 0 when s[0..n) does not start with one (n == 0, a byte that cannot lead or continue,
 * or a sequence cut short by n). */
size_t ar_utf8_decode(const char *s, size_t n, uint32_t *cp);

/* True when s[0..n) (n >= 1) is a proper beginning of a well-formed sequence: every byte there
 * is allowed, only more bytes are missing. A stream holds such bytes until the next piece. */
bool ar_utf8_incomplete(const char *s, size_t n);

/* True when all of s[0..n) is well-formed. */
bool ar_utf8_valid(const char *s, size_t n);

/* A copy of s[0..n) (NUL-terminated, ar_free) in which each byte that does not belong to a
 * well-formed sequence is replaced by U+FFFD; its length in *out_len (optional). NULL when out
 * of memory. */
char *ar_utf8_sanitize(const char *s, size_t n, size_t *out_len);

/* Writes cp (a scalar value: <= U+10FFFF, not a surrogate) to out[0..4) and returns its
 * length; 0 for anything else. */
static inline size_t ar_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        if (cp >= 0xd800 && cp <= 0xdfff)
            return 0;
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    if (cp > 0x10ffff)
        return 0;
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- lax readings (tokenizer) ------------------------------------------------------------ */
/* The reference tokenizers split text by the high bits of each lead byte, whatever follows;
 * these reproduce that and must not be used to validate. */

/* Length of the sequence a byte c leads, from its high 4 bits only: 1 for ASCII, continuation
 * and 0xc0/0xc1, 2 for 0xc_/0xd_, 3 for 0xe_, 4 for 0xf_ (0xf5..0xff included). */
static inline size_t ar_utf8_lax_len(uint8_t c)
{
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[c >> 4];
}

/* Decodes the sequence at s[0..n) of ar_utf8_lax_len(s[0]) bytes whose other bytes are all
 * continuation bytes, overlong forms and surrogates included, into *cp; returns its length, or 0
 * for a lone continuation or 0xc0..0xff byte not followed by enough continuation bytes. */
size_t ar_utf8_decode_lax(const char *s, size_t n, uint32_t *cp);

#endif
