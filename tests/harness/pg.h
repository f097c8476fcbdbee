/* pg.h - a fresh PostgreSQL database per test on the server AR_TEST_PG_URL names (tests/run.sh
 * starts one): created with a random name, its URL handed to the test, dropped at the end. A
 * test that needs PostgreSQL fails, never skips, when the variable is missing. */
#ifndef AR_TEST_PG_H
#define AR_TEST_PG_H

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct th_pg_db {
    char name[48];   /* the database's name */
    char url[512];   /* its URL: AR_TEST_PG_URL with the database replaced */
    char admin[512]; /* the server's URL as given */
};

/* Writes base with its database name replaced by db and, when extra is not NULL, the URI
 * parameter extra (e.g. "options=-c%20lock_timeout%3D1000") added. */
static inline int th_pg_url_with(char *out, size_t size, const char *base, const char *db,
                                 const char *extra)
{
    const char *scheme = strstr(base, "://");
    const char *slash = scheme ? strchr(scheme + 3, '/') : NULL;
    const char *query;
    size_t host_len;
    int n;
    if (!scheme)
        return -1;
    query = strchr(scheme + 3, '?');
    if (slash && query && slash > query)
        slash = NULL;
    host_len = slash ? (size_t)(slash - base) : query ? (size_t)(query - base) : strlen(base);
    n = snprintf(out, size, "%.*s/%s%s%s%s", (int)host_len, base, db, query ? query : "",
                 extra ? (query ? "&" : "?") : "", extra ? extra : "");
    return n > 0 && (size_t)n < size ? 0 : -1;
}

/* Runs sql on the server's URL; 0 when it succeeded, else prints why and returns -1. */
static inline int th_pg_admin(const char *admin_url, const char *sql)
{
    PGconn *c = PQconnectdb(admin_url);
    PGresult *r;
    int ok;
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "pg: cannot connect to %s: %s", admin_url, PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    r = PQexec(c, sql);
    ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok)
        fprintf(stderr, "pg: %s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
    return ok ? 0 : -1;
}

/* Creates a database with a random name; -1 (with a message) when AR_TEST_PG_URL is missing
 * or the server refuses. */
static inline int th_pg_create(struct th_pg_db *db)
{
    const char *base = getenv("AR_TEST_PG_URL");
    char sql[128];
    unsigned long long r;
    FILE *f;
    memset(db, 0, sizeof(*db));
    if (!base || !*base) {
        fprintf(stderr, "AR_TEST_PG_URL is not set: start PostgreSQL (tests/run.sh, or "
                        "deploy/services.sh start postgres DIR) and export its URL\n");
        return -1;
    }
    f = fopen("/dev/urandom", "rb");
    if (!f || fread(&r, sizeof(r), 1, f) != 1)
        r = (unsigned long long)time(NULL) * 2654435761u ^ (unsigned long long)getpid();
    if (f)
        fclose(f);
    snprintf(db->name, sizeof(db->name), "ar_test_%016llx", r);
    snprintf(db->admin, sizeof(db->admin), "%s", base);
    if (th_pg_url_with(db->url, sizeof(db->url), base, db->name, NULL) != 0) {
        fprintf(stderr, "pg: cannot make a URL from %s\n", base);
        return -1;
    }
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", db->name);
    return th_pg_admin(base, sql);
}

/* Drops the database (closing what still uses it). */
static inline int th_pg_drop(struct th_pg_db *db)
{
    char sql[128];
    if (!db->name[0])
        return 0;
    snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", db->name);
    return th_pg_admin(db->admin, sql);
}

/* Runs sql in the test database and returns the first column of the first row as a number
 * (-1 when there is none or it failed). */
static inline long long th_pg_scalar(const struct th_pg_db *db, const char *sql)
{
    PGconn *c = PQconnectdb(db->url);
    PGresult *r = NULL;
    long long v = -1;
    if (PQstatus(c) == CONNECTION_OK) {
        r = PQexec(c, sql);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
            v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        else if (PQresultStatus(r) != PGRES_TUPLES_OK)
            fprintf(stderr, "pg: %s: %s", sql, PQerrorMessage(c));
    }
    PQclear(r);
    PQfinish(c);
    return v;
}

#endif
