/* exp on 8 float lanes (AVX2 + FMA), shared by the kernels of this folder. */
#ifndef GEM_KERNELS_EXP8_H
#define GEM_KERNELS_EXP8_H

#include <immintrin.h>

/* exp on 8 lanes for x <= 88: x = n ln 2 + r with |r| <= ln(2) / 2, exp(r) by its degree-6
   Taylor polynomial (relative error < 2e-7), 2^n built in the exponent bits. Rounding
   x log2(e) by adding 1.5 * 2^23 (+ the exponent bias) leaves n + 127 in the low bits.
   Inputs below -87.3 give ~1e-38 instead of 0, which no softmax sum can see. */
static inline __m256 exp8(__m256 x) {
    const __m256 magic = _mm256_set1_ps(12582912.0f + 127.0f);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.0f / 720);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 120));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 24));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f / 6));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23)));
}

#endif
