/* The CPU lookup in one pass: out[i] = round(token[ids[i]] + position[pos_i]), fp32 add.
 *
 * Built by service/engine/kernel.py (gcc, -O3, no fast-math, no FP contraction: every
 * sum and rounding is the IEEE one torch computes, bit for bit) and called through ctypes,
 * which releases the GIL for the call. Each row is read from the tables once and written
 * to the answer once, already in the wire dtype: no fp32 intermediate, no second pass to
 * add, no third to cast. The next row's cache lines are prefetched while this one is
 * summed (uniform ids make every row a DRAM miss).
 *
 * Every index is checked against its table before anything is written: a caller bug
 * can make this return an error, never read outside a table.
 *
 * embed_rows_guarded writes into a client's shared-memory mapping. Its owner may shrink
 * the object at any moment, and a store past the object's end raises SIGBUS; the guard
 * (install_guard, once per process) turns a SIGBUS raised while this thread is inside a
 * guarded call into a return code (siglongjmp out of the row loop, which holds no lock
 * and allocates nothing), and hands any other SIGBUS to the handler that was there before
 * (Python's faulthandler, or the default: the process dies as it would have).
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

enum { OUT_F32 = 0, OUT_BF16 = 1, OUT_F16 = 2 };

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* c10::BFloat16's round-to-nearest-even (NaN never reaches here: tables are finite). */
static inline uint16_t to_bf16(float f) {
    uint32_t u = bits_of(f);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* IEEE round-to-nearest-even, overflow to inf: c10::Half's conversion for every finite
 * input (one vcvtps2ph per 8 values where the CPU has F16C, libgcc's exact routine else). */
static inline uint16_t to_f16(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* One fp16 row with F16C: 8 sums per vcvtps2ph (gcc does not vectorise the cast above). */
__attribute__((target("avx2,f16c")))
static void row_f16c(uint16_t *restrict r, const float *restrict a, const float *restrict b,
                     int64_t dim) {
    int64_t j = 0;
    for (; j + 8 <= dim; j += 8) {
        __m256 v = _mm256_loadu_ps(a + j);
        if (b != 0) v = _mm256_add_ps(v, _mm256_loadu_ps(b + j));
        _mm_storeu_si128((__m128i *)(r + j),
                         _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; j < dim; j++) r[j] = to_f16(b != 0 ? a[j] + b[j] : a[j]);
}

static inline void prefetch_row(const float *row, int64_t dim) {
    for (int64_t j = 0; j < dim; j += 16) __builtin_prefetch(row + j, 0, 0);
}

#define ROW_LOOP(BODY)                                                             \
    for (int64_t i = 0; i < n; i++) {                                              \
        if (i + 1 < n) prefetch_row(table + ids[i + 1] * dim, dim);                \
        const float *restrict a = table + ids[i] * dim;                            \
        const float *restrict b = pos == 0 ? 0                                     \
            : pos + (positions != 0 ? positions[i] : start + i) * dim;            \
        BODY                                                                       \
    }

/* Returns 0, or -1 (nothing written) when an index is outside its table. */
__attribute__((target_clones("arch=x86-64-v3", "default")))
int embed_rows(const float *restrict table, int64_t table_rows, int64_t dim,
               const int64_t *restrict ids, int64_t n,
               const float *restrict pos, int64_t pos_rows,
               const int64_t *restrict positions, int64_t start,
               void *restrict out, int kind) {
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= table_rows) return -1;
        if (pos != 0) {
            int64_t p = positions != 0 ? positions[i] : start + i;
            if (p < 0 || p >= pos_rows) return -1;
        }
    }
    if (kind == OUT_F32) {
        float *restrict o = out;
        ROW_LOOP(
            float *restrict r = o + i * dim;
            if (b == 0) memcpy(r, a, (size_t)dim * sizeof(float));
            else for (int64_t j = 0; j < dim; j++) r[j] = a[j] + b[j];
        )
    } else if (kind == OUT_BF16) {
        uint16_t *restrict o = out;
        ROW_LOOP(
            uint16_t *restrict r = o + i * dim;
            if (b == 0) for (int64_t j = 0; j < dim; j++) r[j] = to_bf16(a[j]);
            else for (int64_t j = 0; j < dim; j++) r[j] = to_bf16(a[j] + b[j]);
        )
    } else if (kind == OUT_F16) {
        uint16_t *restrict o = out;
        const int f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
        ROW_LOOP(
            uint16_t *restrict r = o + i * dim;
            if (f16c) row_f16c(r, a, b, dim);
            else if (b == 0) for (int64_t j = 0; j < dim; j++) r[j] = to_f16(a[j]);
            else for (int64_t j = 0; j < dim; j++) r[j] = to_f16(a[j] + b[j]);
        )
    } else {
        return -2;
    }
    return 0;
}

/* initial-exec: the handler must not allocate TLS; set before the first guarded store. */
static __thread sigjmp_buf *guard_jump __attribute__((tls_model("initial-exec")));
static struct sigaction previous_bus;
static int guard_installed;

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    sigjmp_buf *jump = guard_jump;
    if (jump != 0) {
        guard_jump = 0;
        siglongjmp(*jump, 1);
    }
    if (previous_bus.sa_flags & SA_SIGINFO) {
        previous_bus.sa_sigaction(sig, info, context);
    } else if (previous_bus.sa_handler != SIG_DFL && previous_bus.sa_handler != SIG_IGN) {
        previous_bus.sa_handler(sig);
    } else {
        signal(SIGBUS, SIG_DFL);
        raise(SIGBUS);
    }
}

int install_guard(void) {
    if (guard_installed) return 0;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &previous_bus) != 0) return -1;
    guard_installed = 1;
    return 0;
}

/* embed_rows into memory its owner may shrink: -3 (rows partly written) on SIGBUS. */
int embed_rows_guarded(const float *table, int64_t table_rows, int64_t dim,
                       const int64_t *ids, int64_t n, const float *pos, int64_t pos_rows,
                       const int64_t *positions, int64_t start, void *out, int kind) {
    sigjmp_buf jump;
    if (!guard_installed) return -4;
    if (sigsetjmp(jump, 1) != 0) return -3;
    guard_jump = &jump;
    int rc = embed_rows(table, table_rows, dim, ids, n, pos, pos_rows, positions, start, out,
                        kind);
    guard_jump = 0;
    return rc;
}
