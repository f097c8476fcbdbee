/* normalize.h - review text to reply-cache key. Two reviews that differ only in width,
 * case, spacing, repeated punctuation or emoji, or a trailing filler ("太棒了！！！！" and
 * "太棒了!") get the same key, so the second one is answered from the cache.
 *
 * reply_normalize, step by step (UTF-8 in, valid UTF-8 out):
 *  1. Decoding: invalid UTF-8 (stray continuation bytes, overlong forms, surrogates, values
 *     above U+10FFFF, truncated sequences) is dropped one byte at a time, so the output is
 *     always valid UTF-8 and no input can crash it.
 *  2. Mapping: full-width ASCII U+FF01..U+FF5E -> U+0021..U+007E; ASCII A-Z -> a-z (only
 *     ASCII is case-folded); every Unicode space (tab, newlines, NBSP, U+2000..U+200A,
 *     U+2028/9, U+202F, U+205F, ideographic space U+3000) -> ' '. Dropped as invisible:
 *     other C0/C1 controls and DEL, zero-width space/joiners, word joiner, BOM, soft hyphen,
 *     variation selectors (so "❤️" == "❤"), emoji skin-tone modifiers, tag characters,
 *     the combining keycap.
 *  3. Spaces: runs collapse to one space, leading and trailing spaces go, and a space with
 *     a CJK ideograph, kana or CJK punctuation on both sides goes ("很 好" == "很好");
 *     spaces between Latin words and in Korean are kept.
 *  4. Repeats: a run of one punctuation mark or emoji collapses to a single one ("!!!" ->
 *     "!", "👍👍👍" -> "👍"); a run of three or more of any other character except an
 *     ASCII digit collapses to two ("好好好好" -> "好好", "soooo" -> "soo", while "good"
 *     and "好好" stay); digits are never collapsed ("1000" stays).
 *  5. Trailing filler: spaces, sentence-final punctuation ( . , ! ? ; : ~ … 。 ， 、 ！ ？ ～ 〜 ·
 *     and the like), emoji, and the particles 啦 哈 呀 哦 呢 啊 are removed from the end,
 *     repeatedly. 了, 吧 and 吗 are kept: they change meaning. When everything is filler
 *     ("哈哈哈", "👍👍") the text after step 4 is kept instead, so that a non-empty review
 *     never normalizes to the empty string.
 *
 * Depends on base only. All functions are pure and thread-safe. */
#ifndef AR_REPLY_NORMALIZE_H
#define AR_REPLY_NORMALIZE_H

#include <stddef.h>

#include "base/base.h"

/* Normalizes len bytes of text (need not be NUL-terminated; NULL is allowed when len is
 * 0). *out is a new NUL-terminated string of *out_len bytes, never longer than len; the
 * caller owns it (ar_free). */
enum ar_status reply_normalize(const char *text, size_t len, char **out, size_t *out_len);

/* "zh" when the text holds any CJK ideograph (U+3400..U+4DBF, U+4E00..U+9FFF,
 * U+F900..U+FAFF, U+20000..U+2FA1F), otherwise "en" (kana-only or Hangul-only text gives
 * "en" too). Static string. Invalid UTF-8 is skipped. */
const char *reply_guess_lang(const char *text, size_t len);

/* "neg" for 1-2 stars, "neu" for 3, "pos" for 4-5, NULL otherwise. Static string. */
const char *reply_rating_bucket(int rating);

/* The reply-cache key: shop_id "\x1f" bucket "\x1f" lang "\x1f" normalized text, where
 * bucket is reply_rating_bucket(rating) and lang NULL means reply_guess_lang(text).
 * shop_id and lang must be non-empty and hold no 0x1f byte, and the rating 1..5, else
 * AR_EINVAL; the normalized text never holds 0x1f (it is a control). *key_out is a new
 * NUL-terminated string of *key_len bytes; the caller owns it (ar_free). */
enum ar_status reply_normalize_key(const char *shop_id, int rating, const char *lang,
                                   const char *text, size_t len, char **key_out, size_t *key_len);

#endif
