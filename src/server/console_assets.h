/* console_assets.h - the console's static files (web/console/), compiled into the binary by
 * tools/embed-console.sh (the Makefile writes $(BUILD)/gen/console_assets.c). */
#ifndef AR_SERVER_CONSOLE_ASSETS_H
#define AR_SERVER_CONSOLE_ASSETS_H

#include <stddef.h>

struct server_console_asset {
    const char *name;          /* file name under web/console/ ("index.html") */
    const char *type;          /* Content-Type */
    const unsigned char *data; /* (len,) followed by a 0 byte not counted */
    size_t len;
    const char *etag; /* a strong ETag, quoted: CRC of the bytes and their length */
};

extern const struct server_console_asset server_console_assets[];
extern const size_t server_console_n_assets;

#endif
