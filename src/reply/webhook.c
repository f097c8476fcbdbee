/* webhook.c - the plain HTTP/1.1 client that delivers a job's completion callback: one POST
 * per connection (Connection: close) to an http:// URL, every step bounded by one deadline, the
 * answer read only as far as its status line. No TLS (https:// is refused when the job is
 * created): callbacks go to a receiver on the operator's network, or through a local proxy. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "reply_internal.h"

/* The parts of http://host[:port][/path]. */
struct url_parts {
    char host[256];
    char port[8];
    const char *path; /* into the URL; "" means "/" */
};

static bool parse_url(const char *url, struct url_parts *u, char *why, size_t n)
{
    const char *p, *h, *end;
    size_t hl;
    if (!url || strlen(url) > STORE_URL_MAX) {
        snprintf(why, n, "callback_url must be at most %d bytes", STORE_URL_MAX);
        return false;
    }
    if (strncmp(url, "http://", 7) != 0) {
        snprintf(why, n, "callback_url must start with http:// (https is not supported)");
        return false;
    }
    h = url + 7;
    end = h + strcspn(h, "/?#");
    p = memchr(h, ':', (size_t)(end - h));
    hl = (size_t)((p ? p : end) - h);
    if (hl == 0 || hl >= sizeof(u->host) || memchr(h, '@', (size_t)(end - h)) || h[0] == '[') {
        snprintf(why, n, "callback_url needs a host name or IPv4 address (no user, no IPv6)");
        return false;
    }
    memcpy(u->host, h, hl);
    u->host[hl] = '\0';
    snprintf(u->port, sizeof(u->port), "80");
    if (p) {
        size_t pl = (size_t)(end - p - 1);
        long port;
        char num[8];
        if (pl == 0 || pl > 5 || strspn(p + 1, "0123456789") < pl) {
            snprintf(why, n, "callback_url has a bad port");
            return false;
        }
        memcpy(num, p + 1, pl);
        num[pl] = '\0';
        port = strtol(num, NULL, 10);
        if (port < 1 || port > 65535) {
            snprintf(why, n, "callback_url has a bad port");
            return false;
        }
        snprintf(u->port, sizeof(u->port), "%ld", port);
    }
    u->path = end;
    for (const char *c = url; *c; c++) {
        if ((unsigned char)*c <= 0x20 || *c == 0x7f) {
            snprintf(why, n, "callback_url must not contain spaces or control characters");
            return false;
        }
    }
    return true;
}

bool reply_callback_url_ok(const char *url, char *why, size_t n)
{
    struct url_parts u;
    return parse_url(url, &u, why, n);
}

/* Waits for events on fd until the deadline; false on timeout or error. */
static bool wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd pf = {fd, events, 0};
        double left = deadline - ar_time_s();
        int r;
        if (left <= 0)
            return false;
        r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r > 0)
            return (pf.revents & (events | POLLHUP)) != 0;
        if (r < 0 && errno != EINTR)
            return false;
    }
}

static int connect_to(const struct url_parts *u, double deadline, struct ar_err *err)
{
    struct addrinfo hints, *res = NULL;
    int fd = -1, rc;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    /* a name lookup cannot be bounded here; hosts are usually numeric or in /etc/hosts */
    if ((rc = getaddrinfo(u->host, u->port, &hints, &res)) != 0 || !res) {
        ar_err_set(err, AR_EUNAVAIL, 0, "callback: cannot resolve %s: %s", u->host,
                   gai_strerror(rc));
        return -1;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        int so_err = 0;
        socklen_t sl = sizeof(so_err);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        rc = connect(fd, res->ai_addr, res->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_err, &sl) == 0 && so_err == 0)
            rc = 0;
        if (rc != 0) {
            ar_err_set(err, AR_EUNAVAIL, 0, "callback: cannot connect to %s:%s", u->host, u->port);
            close(fd);
            fd = -1;
        }
    } else {
        ar_err_set(err, AR_EIO, 0, "callback: socket: %s", strerror(errno));
    }
    freeaddrinfo(res);
    return fd;
}

static bool send_all_by(int fd, const char *p, size_t n, double deadline)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            if (!wait_fd(fd, POLLOUT, deadline))
                return false;
        } else {
            return false;
        }
    }
    return true;
}

enum ar_status reply_http_post_json(const char *url, const char *body, size_t len, double timeout_s,
                                    int *status, struct ar_err *err)
{
    struct url_parts u;
    char why[160], head[2600], line[64];
    size_t got = 0;
    double deadline = ar_time_s() + (timeout_s > 0 ? timeout_s : 5);
    int fd, hn;
    *status = 0;
    if (!parse_url(url, &u, why, sizeof(why)))
        return ar_err_set(err, AR_EINVAL, 0, "%s", why);
    hn = snprintf(head, sizeof(head),
                  "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                  "Content-Length: %zu\r\nUser-Agent: autoreply\r\nConnection: close\r\n\r\n",
                  u.path[0] ? u.path : "/", u.host, u.port, len);
    if (hn < 0 || (size_t)hn >= sizeof(head))
        return ar_err_set(err, AR_EINVAL, 0, "callback: URL too long");
    if ((fd = connect_to(&u, deadline, err)) < 0)
        return err ? err->code : AR_EUNAVAIL;
    if (!send_all_by(fd, head, (size_t)hn, deadline) || !send_all_by(fd, body, len, deadline)) {
        close(fd);
        return ar_err_set(err, AR_EUNAVAIL, 0, "callback: sending to %s:%s failed", u.host, u.port);
    }
    /* "HTTP/1.x NNN": the status line is all that matters */
    while (got < sizeof(line) - 1 && !memchr(line, '\n', got)) {
        ssize_t k = recv(fd, line + got, sizeof(line) - 1 - got, 0);
        if (k > 0) {
            got += (size_t)k;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            if (!wait_fd(fd, POLLIN, deadline)) {
                close(fd);
                return ar_err_set(err, AR_EUNAVAIL, 0, "callback: %s:%s did not answer in time",
                                  u.host, u.port);
            }
        } else {
            break;
        }
    }
    close(fd);
    line[got] = '\0';
    if (got < 12 || strncmp(line, "HTTP/1.", 7) != 0 || line[8] != ' ' ||
        strspn(line + 9, "0123456789") < 3)
        return ar_err_set(err, AR_EFORMAT, 0, "callback: %s:%s sent no HTTP status line", u.host,
                          u.port);
    *status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
    return AR_OK;
}
