/* metrics_internal.h - what metrics.c shares with the collectors beside it (process.c). */
#ifndef AR_METRICS_INTERNAL_H
#define AR_METRICS_INTERNAL_H

#include <stddef.h>

/* v as a sample value or le bound: the shortest of %.15g / %.17g that reads back exactly;
 * +Inf, -Inf and NaN as Prometheus spells them. */
void metrics_format_double(char *buf, size_t size, double v);

#endif
