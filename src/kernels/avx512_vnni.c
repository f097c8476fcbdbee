/* avx512_vnni.c - the avx512.c kernels built with -mavx512vnni, chosen at run time by select.c
 * on CPUs with AVX512-VNNI: the same source, where __AVX512VNNI__ switches the 8-bit products to
 * vpdpbusd (unsigned weights with an exact offset correction) and the 16-bit scale products to
 * vpdpwssd. Compiled as its own file so that these instructions exist only in this object. */
#include "kernels_internal.h"

/* avx512.c's table filler becomes this file's */
#define kernels_fill_avx512 kernels_fill_avx512_vnni
#include "avx512.c"
