/* autoreply.h - public C API of libautoreply.
 * Status codes, error details and logging shared by every module and by callers of the
 * library. Small and boring on purpose: no printing, no global error state. */
#ifndef AUTOREPLY_H
#define AUTOREPLY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_VERSION "0.1.0"

enum ar_status {
    AR_OK = 0,
    AR_ENOMEM,   /* an allocation failed */
    AR_EIO,      /* open/read/write/mmap failed */
    AR_EFORMAT,  /* bytes from a file or socket are malformed */
    AR_EINVAL,   /* a caller passed an invalid argument */
    AR_EBUSY,    /* a bounded resource is full: retry later */
    AR_ENOTSUP,  /* valid but not supported (tensor type, architecture ...) */
    AR_ERANGE,   /* a value is out of range (prompt longer than the context ...) */
    AR_ECANCELED, /* the operation was cancelled */
    AR_EUNAVAIL   /* a backend server (database, cache, broker) cannot be reached now: retry
                     later; the client reconnects by itself */
};

/* Static string, never NULL. Thread-safe. */
const char *ar_status_str(enum ar_status st);

/* Optional error detail filled by loaders and parsers next to the returned status. */
struct ar_err {
    enum ar_status code;
    uint64_t offset; /* byte offset in the input where the problem was found, or 0 */
    char msg[256];   /* one line, no trailing newline */
};

enum ar_log_level { AR_LOG_DEBUG = 0, AR_LOG_INFO, AR_LOG_WARN, AR_LOG_ERROR };

typedef void (*ar_log_fn)(enum ar_log_level level, const char *msg, void *user_data);

/* Sets the process-wide log sink (NULL restores the default: stderr, INFO and above).
 * Call before starting threads; the callback itself may be called from any thread. */
void ar_log_set(ar_log_fn fn, void *user_data);
void ar_log_set_level(enum ar_log_level min_level);

#ifdef __cplusplus
}
#endif
#endif
