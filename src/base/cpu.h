/* cpu.h - run-time CPU feature detection (CPUID + XGETBV: the OS must also save the
 * registers). Kernels are chosen from this at start-up, never at build time only. */
#ifndef AR_CPU_H
#define AR_CPU_H

#include <stdbool.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

struct ar_cpu_features {
    bool sse42, avx, avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
    bool avxvnni;
    bool amx; /* advertised only: AMX faults on use on the machines we know; never used */
    /* CPUID's vendor and family (base family, plus the extended one where the base is 15):
     * AMD Zen 4 is 0x19, Zen 5 0x1a. Kernels choose only what measurements on each support
     * (see kernels.h, "tuning"); the instruction set comes from the flags above. */
    bool amd;
    int family;
};

/* Detects once and caches; thread-safe after the first call returns. */
const struct ar_cpu_features *ar_cpu_features_get(void);
/* One line such as "avx2 fma f16c avx512f avx512bw avx512vl avx512vnni" into buf. */
void ar_cpu_features_str(const struct ar_cpu_features *cpu, char *buf, int size);

/* One step of a spin-wait loop: PAUSE on x86 (saves power, frees the sibling hyper-thread, and
 * avoids the memory-order flush when the awaited store lands); nothing elsewhere. */
static inline void ar_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

#endif
