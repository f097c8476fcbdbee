/* avx512_bf16.c - the avx512_vnni kernels built with -mavx512bf16 as well, chosen at run time
 * by select.c on CPUs with AVX512-BF16: the same source (avx512.c), where __AVX512BF16__ makes
 * the BF16 weight rows' products vdpbf16ps (float512.h) instead of widening to floats. */
#include "kernels_internal.h"

/* avx512.c's table filler becomes this file's */
#define kernels_fill_avx512 kernels_fill_avx512_bf16
#include "avx512.c"
