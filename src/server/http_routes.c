/* http_routes.c - the route table (server_add_route, matched by http.c: exact paths, else
 * the longest prefix; 405 with Allow for a known path) and the health checks of backends that
 * GET /health runs (server_add_health_check, server_health_run). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "http_internal.h"

/* How well rt matches path: 0 not at all, SIZE_MAX exactly, else the prefix length (so the
 * longest prefix wins and an exact route beats every prefix). */
static size_t route_match(const struct route *rt, const char *path)
{
    if (rt->flags & SERVER_ROUTE_PREFIX)
        return strncmp(rt->path, path, rt->path_len) == 0 ? rt->path_len : 0;
    return strcmp(rt->path, path) == 0 ? SIZE_MAX : 0;
}

const struct route *server_find_route(const struct server *s, const char *method, const char *path,
                                      bool *path_known, char *allow, size_t allow_size)
{
    const struct route *hit = NULL;
    size_t used = 0, best = 0;
    *path_known = false;
    allow[0] = '\0';
    for (int i = 0; i < s->n_routes; i++)
        best = AR_MAX(best, route_match(&s->routes[i], path));
    if (best == 0)
        return NULL;
    for (int i = 0; i < s->n_routes; i++) {
        const struct route *rt = &s->routes[i];
        if (route_match(rt, path) != best)
            continue;
        *path_known = true;
        used += (size_t)snprintf(allow + used, used < allow_size ? allow_size - used : 0, "%s%s",
                                 used ? ", " : "", rt->method);
        if (!strcmp(rt->method, method))
            hit = rt;
    }
    return hit;
}
enum ar_status server_keep(struct server *s, void *data)
{
    if (!s || !data || s->mhd || s->n_route_data == (int)AR_ARRAY_LEN(s->route_data))
        return AR_EINVAL;
    s->route_data[s->n_route_data++] = data;
    return AR_OK;
}

enum ar_status server_add_route(struct server *s, const struct server_route *r)
{
    struct route *nr;
    if (!r || !r->method || !r->path || !r->fn || s->mhd)
        return AR_EINVAL;
    for (int i = 0; i < s->n_routes; i++)
        if (!strcmp(s->routes[i].method, r->method) && !strcmp(s->routes[i].path, r->path) &&
            (s->routes[i].flags & SERVER_ROUTE_PREFIX) == (r->flags & SERVER_ROUTE_PREFIX))
            return AR_EINVAL;
    nr = ar_realloc(s->routes, (size_t)(s->n_routes + 1) * sizeof(*nr));
    if (!nr)
        return AR_ENOMEM;
    s->routes = nr;
    nr = &s->routes[s->n_routes];
    nr->method = ar_strdup(r->method);
    nr->path = ar_strdup(r->path);
    if (!nr->method || !nr->path) {
        ar_free(nr->method);
        ar_free(nr->path);
        return AR_ENOMEM;
    }
    nr->path_len = strlen(nr->path);
    nr->fn = r->fn;
    nr->user = r->user;
    nr->flags = r->flags;
    nr->max_body = r->max_body ? r->max_body : s->p.max_body;
    s->n_routes++;
    return AR_OK;
}
/* ---- health checks ---------------------------------------------------------------------- */

const char *server_health_str(int h)
{
    return h == SERVER_HEALTH_OK ? "ok" : h == SERVER_HEALTH_DEGRADED ? "degraded" : "down";
}

enum ar_status server_add_health_check(struct server *s, const char *name, int (*check)(void *user),
                                       void *user)
{
    struct health_check *nc;
    size_t len = name ? strlen(name) : 0;
    enum ar_status st = AR_OK;
    if (!s || !check || len == 0 || len >= sizeof(nc->name))
        return AR_EINVAL;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return AR_EINVAL;
    }
    pthread_mutex_lock(&s->health_mu);
    for (int i = 0; i < s->n_checks && st == AR_OK; i++)
        if (!strcmp(s->checks[i].name, name))
            st = AR_EINVAL;
    if (st == AR_OK) {
        nc = ar_realloc(s->checks, (size_t)(s->n_checks + 1) * sizeof(*nc));
        if (!nc) {
            st = AR_ENOMEM;
        } else {
            s->checks = nc;
            nc = &s->checks[s->n_checks++];
            memcpy(nc->name, name, len + 1);
            nc->fn = check;
            nc->user = user;
        }
    }
    pthread_mutex_unlock(&s->health_mu);
    return st;
}

int server_health_run(struct server *s, cJSON *backends, int *n)
{
    struct health_check *copy = NULL;
    int n_copy, worst = SERVER_HEALTH_OK;
    /* the checks run outside the lock (a check may take a moment) on a copy of the list */
    pthread_mutex_lock(&s->health_mu);
    n_copy = s->n_checks;
    if (n_copy && (copy = ar_malloc((size_t)n_copy * sizeof(*copy))))
        memcpy(copy, s->checks, (size_t)n_copy * sizeof(*copy));
    pthread_mutex_unlock(&s->health_mu);
    if (n_copy && !copy) { /* out of memory: we cannot tell, so we do not claim ok */
        if (n)
            *n = n_copy;
        return SERVER_HEALTH_DEGRADED;
    }
    for (int i = 0; i < n_copy; i++) {
        int h = copy[i].fn(copy[i].user);
        if (h != SERVER_HEALTH_OK && h != SERVER_HEALTH_DEGRADED)
            h = SERVER_HEALTH_DOWN;
        if (h > worst)
            worst = h;
        if (backends)
            cJSON_AddStringToObject(backends, copy[i].name, server_health_str(h));
    }
    ar_free(copy);
    if (n)
        *n = n_copy;
    return worst;
}
