/* Register-tiled float32 GEMM for AVX2 + FMA, shared by the kernels of this folder:
   C = (accumulate ? C : 0) + A B in 6 x 16 tiles (12 accumulators) and 8-column panels,
   A read in place in either layout (row and column strides), B row-major. No packing:
   the callers' operands are small blocks that already sit in L1/L2. */
#ifndef GEM_KERNELS_TILE_GEMM_H
#define GEM_KERNELS_TILE_GEMM_H

#include <immintrin.h>
#include <stdint.h>

#define MR 6
#define NR 16
#define KC 256

/* C[mr x nr] = (accumulate ? C : 0) + sum_{p < kc} A(i, p) B(p, 0:nr), nr 16 or 8, with
   A(i, p) at a[i * a_rs + p * a_cs] (row- or column-major A without packing) and B rows ldb
   apart. */
static inline __attribute__((always_inline)) void tile(int mr, int nr, int64_t kc, const float *a,
                                                       int64_t a_rs, int64_t a_cs, const float *b,
                                                       int64_t ldb, float *c, int64_t ldc,
                                                       int accumulate) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
        if (i < mr) {
            acc[i][0] = accumulate ? _mm256_loadu_ps(c + i * ldc) : _mm256_setzero_ps();
            if (nr == 16) acc[i][1] = accumulate ? _mm256_loadu_ps(c + i * ldc + 8) : _mm256_setzero_ps();
        }
    }
    for (int64_t p = 0; p < kc; ++p) {
        const __m256 b0 = _mm256_loadu_ps(b + p * ldb);
        const __m256 b1 = nr == 16 ? _mm256_loadu_ps(b + p * ldb + 8) : b0;
        const float *ap = a + p * a_cs;
#pragma GCC unroll 6
        for (int i = 0; i < MR; ++i) {
            if (i < mr) {
                const __m256 ai = _mm256_broadcast_ss(ap + i * a_rs);
                acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
                if (nr == 16) acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
            }
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
        if (i < mr) {
            _mm256_storeu_ps(c + i * ldc, acc[i][0]);
            if (nr == 16) _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
        }
    }
}

/* The rows of one panel of C (nr columns at j) in MR-row tiles and a remainder tile. */
static inline __attribute__((always_inline)) void panel(int nr, int64_t m, int64_t kc, const float *a,
                                                        int64_t a_rs, int64_t a_cs, const float *bp,
                                                        int64_t ldb, float *c, int64_t ldc, int acc) {
    int64_t i = 0;
    for (; i + MR <= m; i += MR)
        tile(MR, nr, kc, a + i * a_rs, a_rs, a_cs, bp, ldb, c + i * ldc, ldc, acc);
    const float *ap = a + i * a_rs;
    float *cp = c + i * ldc;
    switch (m - i) {
        case 5: tile(5, nr, kc, ap, a_rs, a_cs, bp, ldb, cp, ldc, acc); break;
        case 4: tile(4, nr, kc, ap, a_rs, a_cs, bp, ldb, cp, ldc, acc); break;
        case 3: tile(3, nr, kc, ap, a_rs, a_cs, bp, ldb, cp, ldc, acc); break;
        case 2: tile(2, nr, kc, ap, a_rs, a_cs, bp, ldb, cp, ldc, acc); break;
        case 1: tile(1, nr, kc, ap, a_rs, a_cs, bp, ldb, cp, ldc, acc); break;
        default: break;
    }
}

/* C (m x n) = (accumulate ? C : 0) + A (m x kk) B (kk x n); n a multiple of 8 (panels of
   16 columns, then one of 8: a head dim of 8 or 24 computes no zero columns). */
static void gemm(int64_t m, int64_t n, int64_t kk, const float *a, int64_t a_rs, int64_t a_cs,
                 const float *b, int64_t ldb, float *c, int64_t ldc, int accumulate) {
    for (int64_t p0 = 0; p0 < kk; p0 += KC) {
        const int64_t kc = kk - p0 < KC ? kk - p0 : KC;
        const int acc = accumulate || p0 > 0;
        const float *ak = a + p0 * a_cs;
        int64_t j = 0;
        for (; j + NR <= n; j += NR)
            panel(NR, m, kc, ak, a_rs, a_cs, b + p0 * ldb + j, ldb, c + j, ldc, acc);
        if (j < n)
            panel(8, m, kc, ak, a_rs, a_cs, b + p0 * ldb + j, ldb, c + j, ldc, acc);
    }
}

#endif
