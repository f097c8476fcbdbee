/* http_internal.h - shared by the HTTP core's files (http.c, http_reply.c, http_routes.c,
 * http_lifetime.c): the server, a connection and a request as they hold them, and the calls
 * between those files. Not part of the API; the handlers see server.h and server_internal.h.
 *
 * A request (struct server_req) is reference counted: one reference for the HTTP connection
 * (dropped when libmicrohttpd reports it complete), one while a handler owes its final reply,
 * one per streaming response object. Lock order: server.conn_mu before server_req.mu; nothing
 * is called out (handlers, abort hooks, libmicrohttpd entry points that may block) while
 * conn_mu is held. */
#ifndef AR_SERVER_HTTP_INTERNAL_H
#define AR_SERVER_HTTP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>
#define ZLIB_CONST /* next_in is const */
#include <zlib.h>

#include "server_internal.h"

struct route {
    char *method; /* owned */
    char *path;   /* owned */
    size_t path_len;
    server_handler_fn fn;
    void *user;
    unsigned flags;
    size_t max_body; /* resolved: never 0 */
};

/* One TCP connection (libmicrohttpd's socket context). */
struct conn {
    struct conn *prev, *next;
    int fd;
    bool receiving;    /* waiting for (the rest of) a request since phase_start */
    bool killed;       /* shut down by the watchdog */
    bool bad_target;   /* the current request's target holds a NUL (set by on_uri) */
    bool started;      /* a request line has come in since phase_start (set by on_uri) */
    bool in_body;      /* the request's headers are in, its body is coming */
    bool body_stalled; /* answered 408 by the watchdog: no body byte for body_timeout_s */
    double phase_start;
    double body_seen;       /* when the headers or the last body bytes came (with in_body) */
    struct server_req *req; /* the request whose handler runs or owes a reply */
};

struct arena_block {
    struct arena_block *next;
    void (*cleanup)(void *);
    _Alignas(16) unsigned char data[];
};

struct server_req {
    pthread_mutex_t mu;
    int refs; /* under mu */
    struct server *srv;
    struct MHD_Connection *conn; /* NULL once libmicrohttpd is done with it (under mu) */
    struct conn *cs;
    const struct route *route;
    char method[16];
    char *path; /* owned */
    char client[80];
    enum server_codec_format in_fmt, out_fmt;
    double t0;
    /* body */
    char *body; /* owned */
    size_t body_len, body_cap;
    uint64_t discarded;
    bool too_large;
    /* Content-Encoding of the body: inflated as it comes in, so that the route's limit holds
     * for what it decompresses to */
    enum { CODING_IDENTITY, CODING_GZIP, CODING_DEFLATE } coding;
    z_stream zs;
    bool zs_live;     /* zs is initialised (inflateEnd owed) */
    bool zs_end;      /* the compressed stream has ended */
    bool bad_coding;  /* the body is not valid data of its Content-Encoding */
    bool accept_gzip; /* Accept-Encoding allows gzip (set by admit, read-only afterwards) */
    cJSON *json;      /* owned */
    struct arena_block *arena;
    /* reply state, under mu */
    bool handled;     /* the request was fully received and dispatched */
    bool active;      /* a handler owes the final reply (holds a reference) */
    bool final;       /* the final reply has been made */
    bool reply_ready; /* a whole reply waits in out */
    int status;
    char *out; /* owned */
    size_t out_len;
    const char *out_type;
    bool out_gzip;    /* out is gzip-compressed */
    bool out_vary;    /* out's encoding depends on Accept-Encoding */
    char *hdrs[8][2]; /* owned extra headers */
    int n_hdrs;
    bool stream, stream_queued, stream_end;
    char *sbuf; /* owned stream bytes not yet taken by libmicrohttpd: sbuf[soff..slen) */
    size_t slen, scap, soff;
    bool suspended; /* we suspended the connection and owe it a resume */
    bool gone;      /* client gone or server stopping: discard replies */
    bool abort_called;
    void (*abort_fn)(struct server_req *, void *);
    void *abort_user;
};

struct health_check {
    char name[64];
    int (*fn)(void *user);
    void *user;
};

struct server {
    struct server_params p;
    char *host, *model_name; /* owned copies */
    /* the X-Autoreply-Instance value (owned): set by server_create when named, else by
     * server_start, which holds inst_mu until it is set so that no response goes out before */
    _Atomic(char *) instance;
    pthread_mutex_t inst_mu;
    pthread_mutex_t health_mu;
    struct health_check *checks; /* owned, (n_checks), under health_mu */
    int n_checks;
    struct MHD_Daemon *mhd;
    int port;
    struct route *routes; /* owned, (n_routes) */
    void *route_data[4];  /* owned by the routes' users: ar_free at destroy (server_keep) */
    int n_route_data;
    int n_routes;
    struct server_keys *keys;
    struct server_limiter *limiter;
    struct metrics_registry *metrics;
    bool own_metrics;
    struct server_http_metrics m;
    _Atomic(struct engine *) engine;
    const struct model *model;
    const struct tokenizer *tok;
    atomic_bool stopping;
    bool stopped;
    /* connections and requests owing replies */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv; /* n_active dropped, or the watchdog should stop */
    struct conn *conns;
    int n_conns;
    int n_active;
    bool hard_stop; /* no new handler may start */
    bool wd_run;
    bool wd_started;
    pthread_t wd;
};

/* ---- http.c: request lifetime and the libmicrohttpd callbacks ----------------------------- */

void server_req_destroy(struct server_req *r);
/* Drops a reference; the last one destroys r. */
void server_req_release(struct server_req *r);
/* Resumes the connection if we suspended it. Under r->mu. */
void server_req_wake(struct server_req *r);
/* The handler has made its final reply: drop its reference. Not under r->mu. */
void server_req_deactivate(struct server_req *r);
/* Calls the abort hook once (the client is gone). The caller holds a reference. */
void server_req_abort(struct server_req *r);
/* Writes an error answer on the socket itself, shuts its write side and drains what the client
 * sent (see http.c). */
void server_raw_answer(struct server *s, int fd, int status, const char *reason, const char *code,
                       const char *msg);
/* What server_start hands to MHD_start_daemon (cls: the server). */
enum MHD_Result server_on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls);
void server_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe);
void server_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe);
void *server_on_uri(void *cls, const char *uri, struct MHD_Connection *c);

/* ---- http_routes.c ----------------------------------------------------------------------- */

/* The route for method and path (the longest prefix or the exact path), or NULL; *path_known
 * tells whether any method has a route there, allow receives their methods ("GET, POST"). */
const struct route *server_find_route(const struct server *s, const char *method, const char *path,
                                      bool *path_known, char *allow, size_t allow_size);

#endif
