/* avx512.c - SIMD kernels for CPUs with avx512, chosen at run time by select.c. */
#include "kernels_internal.h"

void kernels_fill_avx512(struct kernel_ops *ops)
{
    (void)ops;
}
