/* Weighted sums of jagged tokens, forward and backward, for x86-64 CPUs with AVX2 and FMA:
   out[b, m, :] = sum over the tokens i of example b of w[i, m] v[i, :], the last step of
   the summary's attention pooling (gem/model/jagged.py attention_pool).

   One pass over the tokens each way: an example's M x D sums stay in registers and cache
   instead of an (N, M, D) product and its scatter (forward), a gather of the output's
   gradient back to (N, M, D) and a product and a sum over it (backward). Examples are
   shared by OpenMP threads (torch's own, see loader.py), so no two write the same rows.
   Layouts, all contiguous float32: w, grad_w (N, M); v, grad_v (N, D); out, grad_out
   (B, M, D); offsets (B + 1) int64. D a multiple of 8. Python side: kernels/jagged_pool.py. */

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline float hsum8(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

int jagged_weighted_sum_forward(const float *w, const float *v, const int64_t *offsets, float *out,
                                int64_t batch, int64_t m, int64_t d, int threads) {
    if (d % 8) return 1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 8)
    for (int64_t b = 0; b < batch; ++b) {
        float *o = out + b * m * d;
        memset(o, 0, (size_t)(m * d) * sizeof(float));
        for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) {
            const float *vi = v + i * d;
            for (int64_t q = 0; q < m; ++q) {
                const __m256 wq = _mm256_set1_ps(w[i * m + q]);
                float *oq = o + q * d;
                for (int64_t c = 0; c < d; c += 8)
                    _mm256_storeu_ps(oq + c, _mm256_fmadd_ps(wq, _mm256_loadu_ps(vi + c), _mm256_loadu_ps(oq + c)));
            }
        }
    }
    return 0;
}

/* grad_w[i, m] = grad_out[b, m, :] . v[i, :]; grad_v[i, :] = sum_m w[i, m] grad_out[b, m, :];
   either may be NULL (not asked for). */
int jagged_weighted_sum_backward(const float *grad_out, const float *w, const float *v, const int64_t *offsets,
                                 float *grad_w, float *grad_v, int64_t batch, int64_t m, int64_t d, int threads) {
    if (d % 8) return 1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 8)
    for (int64_t b = 0; b < batch; ++b) {
        const float *g = grad_out + b * m * d;
        for (int64_t i = offsets[b]; i < offsets[b + 1]; ++i) {
            const float *vi = v + i * d;
            if (grad_w)
                for (int64_t q = 0; q < m; ++q) {
                    __m256 acc = _mm256_setzero_ps();
                    for (int64_t c = 0; c < d; c += 8)
                        acc = _mm256_fmadd_ps(_mm256_loadu_ps(g + q * d + c), _mm256_loadu_ps(vi + c), acc);
                    grad_w[i * m + q] = hsum8(acc);
                }
            if (grad_v) {
                float *gv = grad_v + i * d;
                for (int64_t c = 0; c < d; c += 8) {
                    __m256 acc = _mm256_setzero_ps();
                    for (int64_t q = 0; q < m; ++q)
                        acc = _mm256_fmadd_ps(_mm256_set1_ps(w[i * m + q]), _mm256_loadu_ps(g + q * d + c), acc);
                    _mm256_storeu_ps(gv + c, acc);
                }
            }
        }
    }
    return 0;
}
