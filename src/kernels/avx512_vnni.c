/* avx512_vnni.c - SIMD kernels for CPUs with avx512_vnni, chosen at run time by select.c. */
#include "kernels_internal.h"

void kernels_fill_avx512_vnni(struct kernel_ops *ops)
{
    (void)ops;
}
