/* jsonpatch.c - JSON Patch (RFC 6902) over cJSON trees, with JSON Pointers (RFC 6901). A patch
 * is applied to a copy of the document, so a failing operation leaves the caller's document as
 * it was; the sessions (sessions.c) swap the copy in only when every operation succeeded. Depth
 * and size of the result are bounded while the patch runs (a chain of copy operations doubles a
 * document each time). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

static enum server_jsonpatch_result fail(struct server_jsonpatch_err *e,
                                         enum server_jsonpatch_result r, int op, const char *fmt,
                                         ...) AR_PRINTF(4, 5);

static enum server_jsonpatch_result
fail(struct server_jsonpatch_err *e, enum server_jsonpatch_result r, int op, const char *fmt, ...)
{
    va_list ap;
    if (!e)
        return r;
    e->result = r;
    e->op = op;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return r;
}

/* ---- pointers ------------------------------------------------------------------------------ */

/* The next reference token of pointer p (at a '/'), unescaped into a new string (ar_free);
 * *next is where the following one starts ('/' or the end). NULL: a '~' not followed by '0' or
 * '1' (*bad set), or out of memory (*bad clear). */
static char *ptr_token(const char *p, const char **next, bool *bad)
{
    size_t n = strcspn(p + 1, "/"), k = 0;
    char *t = ar_malloc(n + 1);
    *bad = false;
    if (!t)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        char c = p[1 + i];
        if (c == '~') {
            char d = i + 1 < n ? p[2 + i] : '\0';
            if (d != '0' && d != '1') {
                ar_free(t);
                *bad = true;
                return NULL;
            }
            c = d == '0' ? '~' : '/';
            i++;
        }
        t[k++] = c;
    }
    t[k] = '\0';
    *next = p + 1 + n;
    return t;
}

/* An array index token: "0" or digits without a leading zero, below 2^31. */
static bool ptr_index(const char *t, int *idx)
{
    long v = 0;
    if (!t[0] || (t[0] == '0' && t[1]))
        return false;
    for (const char *c = t; *c; c++) {
        if (*c < '0' || *c > '9' || (v = v * 10 + (*c - '0')) > 0x7fffffff)
            return false;
    }
    *idx = (int)v;
    return true;
}

/* The child of container c named by token t, or NULL. */
static cJSON *child_of(cJSON *c, const char *t)
{
    int idx;
    if (cJSON_IsObject(c))
        return cJSON_GetObjectItemCaseSensitive(c, t);
    if (cJSON_IsArray(c) && ptr_index(t, &idx))
        return cJSON_GetArrayItem(c, idx);
    return NULL;
}

/* A parsed location: the container holding the target and the last token (owned), or the
 * whole document (parent NULL) for "". depth: reference tokens in the pointer. */
struct loc {
    cJSON *parent;
    char *last;
    int depth;
};

/* Resolves every token of path but the last, which must name an existing container.
 * SERVER_JSONPATCH_EINVAL with a message otherwise. */
static enum server_jsonpatch_result locate(cJSON *root, const char *path, struct loc *l, int op,
                                           const char *what, struct server_jsonpatch_err *e)
{
    const char *p = path, *next;
    cJSON *cur = root;
    bool bad;
    l->parent = NULL;
    l->last = NULL;
    l->depth = 0;
    if (!*p)
        return SERVER_JSONPATCH_OK;
    if (*p != '/')
        return fail(e, SERVER_JSONPATCH_EINVAL, op,
                    "'%s' \"%.64s\" is not a JSON Pointer (starts with '/')", what, path);
    for (;;) {
        char *t = ptr_token(p, &next, &bad);
        if (!t)
            return bad ? fail(e, SERVER_JSONPATCH_EINVAL, op,
                              "'%s' \"%.64s\": '~' must be followed by 0 or 1", what, path)
                       : fail(e, SERVER_JSONPATCH_ENOMEM, op, "out of memory");
        l->depth++;
        if (!*next) {
            if (!cJSON_IsObject(cur) && !cJSON_IsArray(cur)) {
                ar_free(t);
                return fail(e, SERVER_JSONPATCH_EINVAL, op,
                            "'%s' \"%.64s\": the parent is not an object or an array", what, path);
            }
            l->parent = cur;
            l->last = t;
            return SERVER_JSONPATCH_OK;
        }
        cur = child_of(cur, t);
        ar_free(t);
        if (!cur)
            return fail(e, SERVER_JSONPATCH_EINVAL, op, "'%s' \"%.64s\" does not exist", what,
                        path);
        p = next;
    }
}

static void loc_fini(struct loc *l)
{
    ar_free(l->last);
    l->last = NULL;
}

/* The existing value at l (the document itself for ""), or NULL. */
static cJSON *loc_value(cJSON *root, const struct loc *l)
{
    return l->parent ? child_of(l->parent, l->last) : root;
}

const cJSON *server_jsonpatch_get(const cJSON *doc, const char *pointer)
{
    struct loc l;
    const cJSON *v;
    cJSON *root;
    /* locate only reads: the walk is shared with the operations, which write */
    memcpy(&root, &doc, sizeof(root));
    if (!pointer || locate(root, pointer, &l, 0, "path", NULL) != SERVER_JSONPATCH_OK)
        return NULL;
    v = loc_value(root, &l);
    loc_fini(&l);
    return v;
}

/* ---- values -------------------------------------------------------------------------------- */

/* Nesting of v (a scalar: 1) and its node count, stopping once either passes its bound. */
static void measure(const cJSON *v, int depth, int max_depth, size_t *nodes, size_t max_nodes,
                    int *deepest)
{
    if (depth > *deepest)
        *deepest = depth;
    (*nodes)++;
    if (depth > max_depth || *nodes > max_nodes)
        return;
    for (const cJSON *c = v->child; c && (cJSON_IsArray(v) || cJSON_IsObject(v)); c = c->next) {
        measure(c, depth + 1, max_depth, nodes, max_nodes, deepest);
        if (*deepest > max_depth || *nodes > max_nodes)
            return;
    }
}

struct member {
    const char *name;
    const cJSON *v;
    int idx;
};

static int member_cmp(const void *x, const void *y)
{
    const struct member *a = x, *b = y;
    int c = strcmp(a->name, b->name);
    return c ? c : (a->idx > b->idx) - (a->idx < b->idx);
}

/* o's members sorted by name, each name once (its first occurrence: the one a pointer finds);
 * *n of them. NULL when out of memory. */
static struct member *members_sorted(const cJSON *o, int *n)
{
    int k = 0, m = 0;
    struct member *a = ar_malloc((size_t)AR_MAX(cJSON_GetArraySize(o), 1) * sizeof(*a));
    if (!a)
        return NULL;
    for (const cJSON *c = o->child; c; c = c->next, k++)
        a[k] = (struct member){c->string ? c->string : "", c, k};
    qsort(a, (size_t)k, sizeof(*a), member_cmp);
    for (int i = 0; i < k; i++)
        if (m == 0 || strcmp(a[m - 1].name, a[i].name))
            a[m++] = a[i];
    *n = m;
    return a;
}

/* Objects: the same names with equal values, in any order. Sorting keeps this O(n log n) on
 * large objects; out of memory counts as unequal. */
static bool object_equal(const cJSON *a, const cJSON *b)
{
    int na = 0, nb = 0;
    struct member *ma = members_sorted(a, &na), *mb = ma ? members_sorted(b, &nb) : NULL;
    bool same = ma && mb && na == nb;
    for (int i = 0; same && i < na; i++)
        same = !strcmp(ma[i].name, mb[i].name) && server_jsonpatch_equal(ma[i].v, mb[i].v);
    ar_free(ma);
    ar_free(mb);
    return same;
}

bool server_jsonpatch_equal(const cJSON *a, const cJSON *b)
{
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
        return a->valuedouble == b->valuedouble;
    if (cJSON_IsString(a) && cJSON_IsString(b))
        return strcmp(a->valuestring, b->valuestring) == 0;
    if (cJSON_IsBool(a) && cJSON_IsBool(b))
        return cJSON_IsTrue(a) == cJSON_IsTrue(b);
    if (cJSON_IsNull(a) && cJSON_IsNull(b))
        return true;
    if (cJSON_IsArray(a) && cJSON_IsArray(b)) {
        const cJSON *x = a->child, *y = b->child;
        for (; x && y; x = x->next, y = y->next)
            if (!server_jsonpatch_equal(x, y))
                return false;
        return !x && !y;
    }
    if (cJSON_IsObject(a) && cJSON_IsObject(b))
        return object_equal(a, b);
    return false;
}

/* cJSON_InsertItemInArray of some cJSON builds (Debian's 1.7.15) refuses to insert before any
 * element but the first, so the elements from idx on are moved behind the new one by hand. */
bool server_jsonpatch_array_insert(cJSON *arr, int idx, cJSON *item)
{
    cJSON *tail = cJSON_CreateArray(), *at;
    if (!tail)
        return false;
    while ((at = cJSON_GetArrayItem(arr, idx)))
        cJSON_AddItemToArray(tail, cJSON_DetachItemViaPointer(arr, at));
    cJSON_AddItemToArray(arr, item);
    while ((at = tail->child))
        cJSON_AddItemToArray(arr, cJSON_DetachItemViaPointer(tail, at));
    cJSON_Delete(tail);
    return true;
}

/* ---- operations ---------------------------------------------------------------------------- */

struct state {
    cJSON *root;
    const struct server_jsonpatch_limits *lim;
    size_t nodes; /* of root, kept up to date by add */
    int op;
    struct server_jsonpatch_err *e;
};

/* Puts v (owned) at l: a new or replaced member, an array element inserted before the index
 * (or appended for "-" or the length), or the whole document. Takes v in every case. */
static enum server_jsonpatch_result put(struct state *s, struct loc *l, cJSON *v, const char *path)
{
    size_t nodes = 0;
    int deepest = 0, idx;
    measure(v, 1, s->lim->max_depth, &nodes, s->lim->max_nodes, &deepest);
    if (l->depth + deepest > s->lim->max_depth) {
        cJSON_Delete(v);
        return fail(s->e, SERVER_JSONPATCH_ETOOBIG, s->op,
                    "the document would nest deeper than %d levels", s->lim->max_depth);
    }
    if (!l->parent) {
        cJSON_Delete(s->root);
        s->root = v;
        s->nodes = nodes;
        return SERVER_JSONPATCH_OK;
    }
    if (s->nodes + nodes > s->lim->max_nodes) {
        cJSON_Delete(v);
        return fail(s->e, SERVER_JSONPATCH_ETOOBIG, s->op,
                    "the document would hold more than %zu values", s->lim->max_nodes);
    }
    if (cJSON_IsObject(l->parent)) {
        cJSON *old = cJSON_GetObjectItemCaseSensitive(l->parent, l->last);
        if (old) {
            size_t on = 0;
            int od = 0;
            measure(old, 1, INT32_MAX, &on, SIZE_MAX, &od);
            s->nodes -= AR_MIN(on, s->nodes);
            cJSON_ReplaceItemInObjectCaseSensitive(l->parent, l->last, v);
        } else if (!cJSON_AddItemToObject(l->parent, l->last, v)) {
            cJSON_Delete(v);
            return fail(s->e, SERVER_JSONPATCH_ENOMEM, s->op, "out of memory");
        }
        s->nodes += nodes;
        return SERVER_JSONPATCH_OK;
    }
    {
        int n = cJSON_GetArraySize(l->parent);
        if (!strcmp(l->last, "-"))
            idx = n;
        else if (!ptr_index(l->last, &idx) || idx > n) {
            cJSON_Delete(v);
            return fail(s->e, SERVER_JSONPATCH_EINVAL, s->op,
                        "'path' \"%.64s\": index out of bounds (the array has %d elements)", path,
                        n);
        }
        if (idx == n ? !cJSON_AddItemToArray(l->parent, v)
                     : !server_jsonpatch_array_insert(l->parent, idx, v)) {
            cJSON_Delete(v);
            return fail(s->e, SERVER_JSONPATCH_ENOMEM, s->op, "out of memory");
        }
    }
    s->nodes += nodes;
    return SERVER_JSONPATCH_OK;
}

/* Detaches the value at l (which must exist; not the whole document); NULL with an error. */
static cJSON *take(struct state *s, struct loc *l, const char *what, const char *path)
{
    cJSON *v;
    size_t nodes = 0;
    int deepest = 0;
    if (!l->parent) {
        fail(s->e, SERVER_JSONPATCH_EINVAL, s->op,
             "'%s' \"\" (the whole document) cannot be removed", what);
        return NULL;
    }
    if (!(v = child_of(l->parent, l->last))) {
        fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "'%s' \"%.64s\" does not exist", what, path);
        return NULL;
    }
    cJSON_DetachItemViaPointer(l->parent, v);
    measure(v, 1, INT32_MAX, &nodes, SIZE_MAX, &deepest);
    s->nodes -= AR_MIN(nodes, s->nodes);
    return v;
}

static const char *str_member(const cJSON *op, const char *name)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(op, name);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

/* A member name given twice makes the operation ambiguous (RFC 6902 section 4 leaves it to
 * the JSON parser; cJSON keeps both, so it is refused here). */
static bool has_duplicate_member(const cJSON *op)
{
    for (const cJSON *a = op->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && !strcmp(a->string, b->string))
                return true;
    return false;
}

static enum server_jsonpatch_result apply_one(struct state *s, const cJSON *op)
{
    const char *name, *path, *from = NULL;
    const cJSON *value = NULL;
    struct loc l = {0}, f = {0};
    enum server_jsonpatch_result r;
    cJSON *v;
    if (!cJSON_IsObject(op))
        return fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "an operation must be an object");
    if (has_duplicate_member(op))
        return fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "an operation names a member twice");
    if (!(name = str_member(op, "op")))
        return fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "'op' must be a string");
    if (!(path = str_member(op, "path")))
        return fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "'path' must be a string");
    if (!strcmp(name, "add") || !strcmp(name, "replace") || !strcmp(name, "test")) {
        if (!(value = cJSON_GetObjectItemCaseSensitive(op, "value")))
            return fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "'%s' needs a 'value'", name);
    } else if (!strcmp(name, "move") || !strcmp(name, "copy")) {
        if (!(from = str_member(op, "from")))
            return fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "'%s' needs a string 'from'", name);
    } else if (strcmp(name, "remove") != 0) {
        return fail(s->e, SERVER_JSONPATCH_EINVAL, s->op,
                    "'op' \"%.32s\" is not add, remove, replace, move, copy or test", name);
    }
    if ((r = locate(s->root, path, &l, s->op, "path", s->e)) != SERVER_JSONPATCH_OK)
        return r;

    if (!strcmp(name, "test")) {
        const cJSON *cur = loc_value(s->root, &l);
        if (!cur)
            r = fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "'path' \"%.64s\" does not exist", path);
        else if (!server_jsonpatch_equal(cur, value))
            r = fail(s->e, SERVER_JSONPATCH_ETEST, s->op,
                     "test failed: \"%.64s\" holds another value", path);
    } else if (!strcmp(name, "remove")) {
        if (!(v = take(s, &l, "path", path)))
            r = s->e->result;
        cJSON_Delete(v);
    } else if (!strcmp(name, "add")) {
        if (!(v = cJSON_Duplicate(value, true)))
            r = fail(s->e, SERVER_JSONPATCH_ENOMEM, s->op, "out of memory");
        else
            r = put(s, &l, v, path);
    } else if (!strcmp(name, "replace")) {
        if (!loc_value(s->root, &l))
            r = fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "'path' \"%.64s\" does not exist", path);
        else if (l.parent && cJSON_IsArray(l.parent)) {
            /* in place: an array's put would insert */
            if (!(v = cJSON_Duplicate(value, true)))
                r = fail(s->e, SERVER_JSONPATCH_ENOMEM, s->op, "out of memory");
            else {
                cJSON_Delete(take(s, &l, "path", path));
                r = put(s, &l, v, path);
            }
        } else if (!(v = cJSON_Duplicate(value, true))) {
            r = fail(s->e, SERVER_JSONPATCH_ENOMEM, s->op, "out of memory");
        } else {
            r = put(s, &l, v, path);
        }
    } else { /* move, copy */
        bool move = !strcmp(name, "move");
        size_t fl = strlen(from);
        if ((r = locate(s->root, from, &f, s->op, "from", s->e)) != SERVER_JSONPATCH_OK) {
            loc_fini(&l);
            return r;
        }
        if (!loc_value(s->root, &f)) {
            r = fail(s->e, SERVER_JSONPATCH_EINVAL, s->op, "'from' \"%.64s\" does not exist", from);
        } else if (move && !strcmp(from, path)) {
            r = SERVER_JSONPATCH_OK; /* nothing moves */
        } else if (move && !strncmp(path, from, fl) && path[fl] == '/') {
            r = fail(s->e, SERVER_JSONPATCH_EINVAL, s->op,
                     "'from' \"%.64s\" cannot move into its own child \"%.64s\"", from, path);
        } else if (move) {
            /* removal first: the path is read in the document without the moved value */
            loc_fini(&l);
            if (!(v = take(s, &f, "from", from)))
                r = s->e->result;
            else if ((r = locate(s->root, path, &l, s->op, "path", s->e)) != SERVER_JSONPATCH_OK)
                cJSON_Delete(v);
            else
                r = put(s, &l, v, path);
        } else if (!(v = cJSON_Duplicate(loc_value(s->root, &f), true))) {
            r = fail(s->e, SERVER_JSONPATCH_ENOMEM, s->op, "out of memory");
        } else {
            r = put(s, &l, v, path);
        }
        loc_fini(&f);
    }
    loc_fini(&l);
    return r;
}

struct server_jsonpatch_limits server_jsonpatch_default_limits(void)
{
    struct server_jsonpatch_limits l = {.max_depth = 64, .max_nodes = 1u << 20};
    return l;
}

enum server_jsonpatch_result server_jsonpatch_apply(const cJSON *doc, const cJSON *patch,
                                                    const struct server_jsonpatch_limits *lim,
                                                    cJSON **out, struct server_jsonpatch_err *e)
{
    struct server_jsonpatch_limits def = server_jsonpatch_default_limits();
    struct server_jsonpatch_err local;
    struct state s = {0};
    int deepest = 0;
    *out = NULL;
    if (!e)
        e = &local;
    memset(e, 0, sizeof(*e));
    e->op = -1;
    s.lim = lim ? lim : &def;
    s.e = e;
    if (!cJSON_IsArray(patch))
        return fail(e, SERVER_JSONPATCH_EINVAL, -1, "a JSON Patch is an array of operations");
    if (!(s.root = cJSON_Duplicate(doc, true)))
        return fail(e, SERVER_JSONPATCH_ENOMEM, -1, "out of memory");
    measure(s.root, 1, INT32_MAX, &s.nodes, SIZE_MAX, &deepest);
    for (const cJSON *op = patch->child; op; op = op->next, s.op++) {
        enum server_jsonpatch_result r = apply_one(&s, op);
        if (r != SERVER_JSONPATCH_OK) {
            cJSON_Delete(s.root);
            return r;
        }
    }
    *out = s.root;
    return SERVER_JSONPATCH_OK;
}
