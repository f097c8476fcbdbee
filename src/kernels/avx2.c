/* avx2.c - SIMD kernels for CPUs with avx2, chosen at run time by select.c. */
#include "kernels_internal.h"

void kernels_fill_avx2(struct kernel_ops *ops)
{
    (void)ops;
}
