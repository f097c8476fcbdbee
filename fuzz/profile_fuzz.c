/* profile_fuzz.c - fuzz target for the shop-profile parser (src/reply/profile.c): the input is
 * a profiles config file. An accepted file must give a profile for every named shop (in
 * shop_id order) and the default; each profile written as JSON and read back through
 * reply_profile_from_json must write the same JSON again (nothing lost or invented). A refused
 * file must leave no result and say why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reply/reply.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

/* p as JSON, read back as shop_id's profile, as JSON again: the two texts are equal. */
static void round_trip(const struct reply_profiles *ps, const struct reply_profile *p)
{
    cJSON *j = reply_profile_to_json(p), *j2;
    struct reply_profile *back = NULL;
    struct ar_err err = {0};
    char *a, *b;
    enum ar_status st;
    if (!j)
        return; /* out of memory */
    /* the default profile's shop_id is "", which no shop may have: read it back as another
     * shop's (shop_ids left out of both texts) */
    cJSON_DeleteItemFromObjectCaseSensitive(j, "shop_id");
    st = reply_profile_from_json(ps, p->shop_id[0] ? p->shop_id : "fuzz-default", j, &back, &err);
    check(st == AR_OK || st == AR_ENOMEM);
    if (st == AR_OK) {
        j2 = reply_profile_to_json(back);
        if (j2)
            cJSON_DeleteItemFromObjectCaseSensitive(j2, "shop_id");
        a = cJSON_PrintUnformatted(j);
        b = j2 ? cJSON_PrintUnformatted(j2) : NULL;
        check(!a || !b || strcmp(a, b) == 0);
        cJSON_free(a);
        cJSON_free(b);
        cJSON_Delete(j2);
        reply_profile_destroy(back);
    }
    cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct reply_profiles *ps = NULL;
    struct ar_err err = {0};
    enum ar_status st = reply_profiles_parse((const char *)data, size, &ps, &err);
    if (st != AR_OK) {
        check(ps == NULL);
        check(st == AR_ENOMEM || err.msg[0] != '\0');
        return 0;
    }
    check(ps != NULL);
    int n = reply_profiles_count(ps);
    const struct reply_profile *def = reply_profiles_get(ps, NULL);
    check(n >= 0 && def != NULL);
    round_trip(ps, def);
    for (int i = 0; i < n; i++) {
        const struct reply_profile *p = reply_profiles_at(ps, i);
        check(p && p->shop_id);
        check(i == 0 || strcmp(reply_profiles_at(ps, i - 1)->shop_id, p->shop_id) < 0);
        check(reply_profiles_get(ps, p->shop_id) == p);
        check(p->min_chars <= p->max_chars);
        round_trip(ps, p);
    }
    reply_profiles_destroy(ps);
    return 0;
}
