/* shops.c - shop profiles saved through the API (reply.h): validated with the config file's
 * parser, kept in the store as JSON text, and looked up per review with a short cache so that
 * a fleet on one database picks a change up within REPLY_SHOP_REFRESH_S. Profiles are never
 * freed while the service lives: a request may hold the one it started with while a put
 * replaces it (puts are rare; each keeps its old profile until the service is destroyed). */
#include <stdio.h>
#include <string.h>

#include "reply_internal.h"

/* A shop looked up: its stored profile (NULL: none stored) and the JSON it was parsed from. */
struct reply_shop {
    char *shop_id;
    struct reply_profile *prof;
    char *json;       /* NULL: none stored */
    double loaded_at; /* ar_time_s() of the last read from the store */
    struct reply_shop *next;
};

struct reply_retired {
    struct reply_profile *prof;
    struct reply_retired *next;
};

void reply_shops_init(struct reply_service *svc)
{
    pthread_mutex_init(&svc->shops_mu, NULL);
}

void reply_shops_fini(struct reply_service *svc)
{
    while (svc->shops) {
        struct reply_shop *e = svc->shops;
        svc->shops = e->next;
        reply_profile_destroy(e->prof);
        ar_free(e->json);
        ar_free(e->shop_id);
        ar_free(e);
    }
    while (svc->retired) {
        struct reply_retired *r = svc->retired;
        svc->retired = r->next;
        reply_profile_destroy(r->prof);
        ar_free(r);
    }
    pthread_mutex_destroy(&svc->shops_mu);
}

/* With shops_mu held. */
static struct reply_shop *shop_find(struct reply_service *svc, const char *shop_id)
{
    for (struct reply_shop *e = svc->shops; e; e = e->next)
        if (!strcmp(e->shop_id, shop_id))
            return e;
    return NULL;
}

/* Installs what the store holds for shop_id (json NULL: nothing; prof parsed from it, taken)
 * with shops_mu held; the profile it replaces is retired. Returns the entry (NULL: out of
 * memory, prof freed). */
static struct reply_shop *shop_install(struct reply_service *svc, const char *shop_id,
                                       const char *json, struct reply_profile *prof)
{
    struct reply_shop *e = shop_find(svc, shop_id);
    if (!e) {
        e = ar_calloc(1, sizeof(*e));
        if (!e || !(e->shop_id = ar_strdup(shop_id))) {
            ar_free(e);
            reply_profile_destroy(prof);
            return NULL;
        }
        e->next = svc->shops;
        svc->shops = e;
    }
    e->loaded_at = ar_time_s();
    if ((json == NULL) == (e->json == NULL) && (!json || !strcmp(json, e->json))) {
        reply_profile_destroy(prof); /* unchanged: keep the one requests hold */
        return e;
    }
    {
        char *copy = json ? ar_strdup(json) : NULL;
        struct reply_retired *r = e->prof ? ar_calloc(1, sizeof(*r)) : NULL;
        if ((json && !copy) || (e->prof && !r)) {
            /* keep the old one rather than free what a request may hold */
            ar_free(copy);
            ar_free(r);
            reply_profile_destroy(prof);
            return e;
        }
        if (r) {
            r->prof = e->prof;
            r->next = svc->retired;
            svc->retired = r;
        }
        ar_free(e->json);
        e->json = copy;
        e->prof = prof;
    }
    return e;
}

/* Parses a stored profile; NULL (with a warning) when it no longer parses, e.g. after the
 * config file's default changed in a way it contradicts. */
static struct reply_profile *parse_stored(struct reply_service *svc, const char *shop_id,
                                          const char *json)
{
    struct ar_err err = {AR_OK, 0, {0}};
    struct reply_profile *p = NULL;
    cJSON *o = cJSON_Parse(json);
    if (!o || reply_profile_from_json(svc->p.profiles, shop_id, o, &p, &err) != AR_OK)
        AR_WARN("reply: the stored profile of shop %s does not parse (%s); using the config "
                "file's",
                shop_id, o ? err.msg : "not JSON");
    cJSON_Delete(o);
    return p;
}

/* Reads shop_id's stored profile now and installs it. *fresh (may be NULL) says whether the
 * store answered. Returns the profile to use. */
static const struct reply_profile *shop_load(struct reply_service *svc, const char *shop_id,
                                             bool *fresh)
{
    struct ar_err err = {AR_OK, 0, {0}};
    const struct reply_profile *use;
    struct reply_profile *p = NULL;
    struct reply_shop *e;
    char *json = NULL;
    bool found = false;
    enum ar_status st = store_shop_get(svc->p.store, shop_id, &json, NULL, &found, &err);
    if (fresh)
        *fresh = st == AR_OK;
    if (st == AR_OK && found)
        p = parse_stored(svc, shop_id, json);
    pthread_mutex_lock(&svc->shops_mu);
    if (st != AR_OK) {
        /* the store is away: the last profile read, tried again after the refresh period */
        AR_WARN("reply: reading the profile of shop %s: %s: %s", shop_id, ar_status_str(st),
                err.msg);
        e = shop_find(svc, shop_id);
        if (e)
            e->loaded_at = ar_time_s();
    } else {
        e = shop_install(svc, shop_id, found && p ? json : NULL, p);
    }
    use = e && e->prof ? e->prof : reply_profiles_get(svc->p.profiles, shop_id);
    pthread_mutex_unlock(&svc->shops_mu);
    ar_free(json);
    return use;
}

const struct reply_profile *reply_profile_of(struct reply_service *svc, const char *shop_id)
{
    const struct reply_profile *use = NULL;
    struct reply_shop *e;
    pthread_mutex_lock(&svc->shops_mu);
    e = shop_find(svc, shop_id);
    if (e && ar_time_s() - e->loaded_at < REPLY_SHOP_REFRESH_S)
        use = e->prof ? e->prof : reply_profiles_get(svc->p.profiles, shop_id);
    pthread_mutex_unlock(&svc->shops_mu);
    return use ? use : shop_load(svc, shop_id, NULL);
}

const struct reply_profile *reply_service_profile(struct reply_service *svc, const char *shop_id)
{
    return reply_profile_of(svc, shop_id);
}

/* Whether the config file names shop_id. */
static bool in_config(const struct reply_profiles *ps, const char *shop_id)
{
    return reply_profiles_get(ps, shop_id) != reply_profiles_get(ps, NULL);
}

static cJSON *shown(const struct reply_profile *p, const char *shop_id, const char *source)
{
    cJSON *j = reply_profile_to_json(p);
    if (j && p->shop_id && !p->shop_id[0]) /* the default profile shown for a shop */
        cJSON_ReplaceItemInObjectCaseSensitive(j, "shop_id", cJSON_CreateString(shop_id));
    if (j && !cJSON_AddStringToObject(j, "source", source)) {
        cJSON_Delete(j);
        j = NULL;
    }
    return j;
}

enum ar_status reply_service_put_shop(struct reply_service *svc, const char *shop_id,
                                      const cJSON *profile, cJSON **out, struct ar_err *err)
{
    struct reply_profile *p = NULL;
    cJSON *copy;
    char *json;
    enum ar_status st;
    if (out)
        *out = NULL;
    if ((st = reply_profile_from_json(svc->p.profiles, shop_id, profile, &p, err)) != AR_OK)
        return st;
    /* stored as given, without shop_id (the key already says it) */
    copy = cJSON_Duplicate(profile, 1);
    if (copy)
        cJSON_DeleteItemFromObjectCaseSensitive(copy, "shop_id");
    json = copy ? cJSON_PrintUnformatted(copy) : NULL;
    cJSON_Delete(copy);
    if (!json) {
        reply_profile_destroy(p);
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    }
    st = store_shop_put(svc->p.store, shop_id, json, err);
    if (st == AR_OK) {
        struct reply_shop *e;
        pthread_mutex_lock(&svc->shops_mu);
        e = shop_install(svc, shop_id, json, p);
        if (out && e && e->prof)
            *out = shown(e->prof, shop_id, "store");
        pthread_mutex_unlock(&svc->shops_mu);
        if (out && !*out)
            st = ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    } else {
        reply_profile_destroy(p);
    }
    cJSON_free(json);
    return st;
}

enum ar_status reply_service_get_shop(struct reply_service *svc, const char *shop_id, cJSON **out,
                                      struct ar_err *err)
{
    const struct reply_profile *p;
    const char *source;
    bool fresh = false;
    *out = NULL;
    p = shop_load(svc, shop_id, &fresh);
    if (!fresh)
        return ar_err_set(err, AR_EUNAVAIL, 0, "the store cannot be read now");
    source = p != reply_profiles_get(svc->p.profiles, shop_id) ? "store"
             : in_config(svc->p.profiles, shop_id)             ? "config"
                                                               : "default";
    *out = shown(p, shop_id, source);
    return *out ? AR_OK : ar_err_set(err, AR_ENOMEM, 0, "out of memory");
}

struct shop_list {
    struct reply_service *svc;
    cJSON *arr;
    bool oom;
};

/* Inserts j into arr keeping shop_id order; an entry of the same shop is replaced (a stored
 * profile wins over the config file's). */
static bool insert_sorted(cJSON *arr, cJSON *j)
{
    const char *id = cJSON_GetObjectItemCaseSensitive(j, "shop_id")->valuestring;
    int i = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        int c = strcmp(id, cJSON_GetObjectItemCaseSensitive(it, "shop_id")->valuestring);
        if (c == 0)
            return cJSON_ReplaceItemInArray(arr, i, j);
        if (c < 0)
            return cJSON_InsertItemInArray(arr, i, j);
        i++;
    }
    return cJSON_AddItemToArray(arr, j);
}

static bool list_stored(const char *shop_id, const char *json, int64_t updated_s, void *user)
{
    struct shop_list *l = user;
    struct reply_profile *p = parse_stored(l->svc, shop_id, json);
    cJSON *j;
    (void)updated_s;
    if (!p)
        return true; /* shown as the config file's (what answers use) */
    j = shown(p, shop_id, "store");
    reply_profile_destroy(p);
    if (!j || !insert_sorted(l->arr, j)) {
        cJSON_Delete(j);
        l->oom = true;
        return false;
    }
    return true;
}

enum ar_status reply_service_list_shops(struct reply_service *svc, cJSON **out, struct ar_err *err)
{
    struct shop_list l = {svc, cJSON_CreateArray(), false};
    enum ar_status st;
    *out = NULL;
    for (int i = 0; l.arr && i < reply_profiles_count(svc->p.profiles); i++) {
        const struct reply_profile *p = reply_profiles_at(svc->p.profiles, i);
        cJSON *j = shown(p, p->shop_id, "config");
        if (!j || !cJSON_AddItemToArray(l.arr, j)) {
            cJSON_Delete(j);
            l.oom = true;
            break;
        }
    }
    if (!l.arr || l.oom) {
        cJSON_Delete(l.arr);
        return ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    }
    st = store_shops_list(svc->p.store, list_stored, &l, err);
    if (l.oom)
        st = ar_err_set(err, AR_ENOMEM, 0, "out of memory");
    if (st != AR_OK) {
        cJSON_Delete(l.arr);
        return st;
    }
    *out = l.arr;
    return AR_OK;
}

bool reply_check_edit(const struct reply_profile *p, const char *text, char *why, size_t n)
{
    size_t len = text ? strlen(text) : 0;
    int w;
    const char *s = text;
    while (s && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'))
        s++;
    if (!s || !*s) {
        snprintf(why, n, "reply must not be empty");
        return false;
    }
    if (len > REPLY_TEXT_MAX || !ar_utf8_valid(text, len)) {
        snprintf(why, n, "reply must be at most %d bytes of UTF-8", REPLY_TEXT_MAX);
        return false;
    }
    w = reply_find_word(text, len, p->banned, p->n_banned);
    if (w >= 0) {
        snprintf(why, n, "reply holds \"%.64s\", a banned word of shop %.64s", p->banned[w],
                 p->shop_id && p->shop_id[0] ? p->shop_id : "(default)");
        return false;
    }
    return true;
}
