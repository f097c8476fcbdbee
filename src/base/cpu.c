/* cpu.c - CPUID/XGETBV feature detection for x86-64; other machines report no features. */
#include "cpu.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static unsigned long long xgetbv0(void)
{
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static void detect(struct ar_cpu_features *c)
{
    unsigned int a, b, cx, d;
    memset(c, 0, sizeof(*c));
    if (!__get_cpuid(0, &a, &b, &cx, &d))
        return;
    c->amd = b == 0x68747541u && d == 0x69746e65u && cx == 0x444d4163u; /* "AuthenticAMD" */
    if (!__get_cpuid(1, &a, &b, &cx, &d))
        return;
    c->family = (int)((a >> 8) & 0xf);
    if (c->family == 0xf)
        c->family += (int)((a >> 20) & 0xff);
    c->sse42 = (cx >> 20) & 1;
    bool osxsave = (cx >> 27) & 1;
    bool avx_hw = (cx >> 28) & 1;
    bool fma_hw = (cx >> 12) & 1;
    bool f16c_hw = (cx >> 29) & 1;
    unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm_os = (xcr0 & 0x6) == 0x6;
    bool zmm_os = (xcr0 & 0xe6) == 0xe6;
    c->avx = avx_hw && ymm_os;
    c->fma = fma_hw && c->avx;
    c->f16c = f16c_hw && c->avx;
    if (__get_cpuid_max(0, NULL) < 7)
        return;
    __cpuid_count(7, 0, a, b, cx, d);
    c->avx2 = ((b >> 5) & 1) && c->avx;
    c->avx512f = ((b >> 16) & 1) && zmm_os;
    c->avx512dq = ((b >> 17) & 1) && c->avx512f;
    c->avx512bw = ((b >> 30) & 1) && c->avx512f;
    c->avx512vl = ((b >> 31) & 1) && c->avx512f;
    c->avx512vnni = ((cx >> 11) & 1) && c->avx512f;
    c->amx = (d >> 24) & 1;
    __cpuid_count(7, 1, a, b, cx, d);
    c->avxvnni = ((a >> 4) & 1) && c->avx2;
    c->avx512bf16 = ((a >> 5) & 1) && c->avx512f;
}
#else
static void detect(struct ar_cpu_features *c)
{
    memset(c, 0, sizeof(*c));
}
#endif

const struct ar_cpu_features *ar_cpu_features_get(void)
{
    static struct ar_cpu_features cached;
    static volatile int done;
    if (!done) {
        struct ar_cpu_features tmp;
        detect(&tmp);
        cached = tmp;
        __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    }
    return &cached;
}

void ar_cpu_features_str(const struct ar_cpu_features *c, char *buf, int size)
{
    snprintf(buf, (size_t)size, "%s%s%s%s%s%s%s%s%s%s",
             c->avx2 ? "avx2 " : "", c->fma ? "fma " : "", c->f16c ? "f16c " : "",
             c->avx512f ? "avx512f " : "", c->avx512bw ? "avx512bw " : "",
             c->avx512vl ? "avx512vl " : "", c->avx512vnni ? "avx512vnni " : "",
             c->avx512bf16 ? "avx512bf16 " : "", c->avxvnni ? "avxvnni " : "",
             c->amx ? "amx(unused) " : "");
    size_t n = strlen(buf);
    if (n && buf[n - 1] == ' ')
        buf[n - 1] = '\0';
}
