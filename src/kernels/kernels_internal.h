/* kernels_internal.h - shared inside kernels/ only: how each ISA file registers the entries
 * it implements. select.c builds the tables; each ISA file is compiled with its own -m flags
 * (Makefile FLAGS_<file>) and must not be called on a CPU without those features. */
#ifndef AR_KERNELS_INTERNAL_H
#define AR_KERNELS_INTERNAL_H

#include "kernels.h"
#include "quants.h"

/* Fill the entries this ISA implements; leave the others untouched (NULL). */
void kernels_fill_ref(struct kernel_ops *ops);         /* ref.c: fills every entry */
void kernels_fill_avx2(struct kernel_ops *ops);        /* avx2.c: needs avx2 fma f16c */
void kernels_fill_avx512(struct kernel_ops *ops);      /* avx512.c: + avx512f/bw/vl/dq */
void kernels_fill_avx512_vnni(struct kernel_ops *ops); /* avx512_vnni.c: + avx512vnni */

#endif
