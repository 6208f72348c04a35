/* The personalized FFN's FiLM + SiLU over jagged tokens, forward and backward, for x86-64
   CPUs with AVX2 and FMA: act = silu(pre), pre = (up + shift[seg]) + up * scale[seg].

   One pass over the tokens each way, in place of the ~6 (forward) and ~10 (backward)
   whole-tensor passes of torch's elementwise ops: the backward reads grad_act and up once,
   writes grad_up once and sums the FiLM gradient of each example in its row of
   grad_film (tokens of an example are contiguous). Threads own whole examples (split at
   example boundaries, balanced by tokens), so no two write the same grad_film row.
   Layouts, all contiguous: up, act, grad_act, grad_up (N, H) float32; film, grad_film
   (B, 2H) float32, [scale | shift]; offsets (B + 1) int64. H a multiple of 8. Python
   side: kernels/film_silu.py. */

#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>

#include "exp8.h"


/* 1 / (1 + exp(-x)); exp8 takes arguments up to 88, and 1 / (1 + e^88) is 0 in float anyway */
static inline __m256 sigmoid8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 neg = _mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), _mm256_set1_ps(88.0f));
    return _mm256_div_ps(one, _mm256_add_ps(one, exp8(neg)));
}

typedef struct {
    const float *up, *film, *grad_act;
    float *act, *grad_up, *grad_film;
    const int64_t *offsets;
    int64_t hidden, first, last; /* examples [first, last) */
} Part;

static void forward_part(const Part *p) {
    const int64_t h = p->hidden;
    for (int64_t b = p->first; b < p->last; b++) {
        const float *scale = p->film + b * 2 * h, *shift = scale + h;
        for (int64_t i = p->offsets[b]; i < p->offsets[b + 1]; i++) {
            const float *u = p->up + i * h;
            float *a = p->act + i * h;
            for (int64_t j = 0; j < h; j += 8) {
                const __m256 uj = _mm256_loadu_ps(u + j);
                const __m256 pre = _mm256_fmadd_ps(uj, _mm256_loadu_ps(scale + j),
                                                   _mm256_add_ps(uj, _mm256_loadu_ps(shift + j)));
                _mm256_storeu_ps(a + j, _mm256_mul_ps(pre, sigmoid8(pre)));
            }
        }
    }
}

/* d_pre = grad_act * s * (1 + pre * (1 - s)), s = sigmoid(pre); grad_up = d_pre * (1 + scale);
   grad_scale[b] += d_pre * up; grad_shift[b] += d_pre. */
static void backward_part(const Part *p) {
    const int64_t h = p->hidden;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t b = p->first; b < p->last; b++) {
        const float *scale = p->film + b * 2 * h, *shift = scale + h;
        float *g_scale = p->grad_film ? p->grad_film + b * 2 * h : 0, *g_shift = g_scale ? g_scale + h : 0;
        for (int64_t i = p->offsets[b]; i < p->offsets[b + 1]; i++) {
            const float *u = p->up + i * h, *g = p->grad_act + i * h;
            float *gu = p->grad_up ? p->grad_up + i * h : 0;
            for (int64_t j = 0; j < h; j += 8) {
                const __m256 uj = _mm256_loadu_ps(u + j), sc = _mm256_loadu_ps(scale + j);
                const __m256 pre = _mm256_fmadd_ps(uj, sc, _mm256_add_ps(uj, _mm256_loadu_ps(shift + j)));
                const __m256 s = sigmoid8(pre);
                const __m256 dsilu = _mm256_mul_ps(s, _mm256_fmadd_ps(pre, _mm256_sub_ps(one, s), one));
                const __m256 d_pre = _mm256_mul_ps(_mm256_loadu_ps(g + j), dsilu);
                if (gu)
                    _mm256_storeu_ps(gu + j, _mm256_fmadd_ps(d_pre, sc, d_pre));
                if (g_scale) {
                    _mm256_storeu_ps(g_scale + j, _mm256_fmadd_ps(d_pre, uj, _mm256_loadu_ps(g_scale + j)));
                    _mm256_storeu_ps(g_shift + j, _mm256_add_ps(d_pre, _mm256_loadu_ps(g_shift + j)));
                }
            }
        }
    }
}

static void *run_forward(void *arg) { forward_part((const Part *)arg); return 0; }
static void *run_backward(void *arg) { backward_part((const Part *)arg); return 0; }

#define MAX_THREADS 64

/* Splits examples [0, batch) into `threads` runs of about equal token counts and runs
   `fn` on each, the last on the calling thread. */
static int run_parts(Part base, int64_t batch, int threads, void *(*fn)(void *)) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    const int64_t total = base.offsets[batch];
    if (total < 4096) threads = 1; /* a few thousand tokens: a thread costs more than it saves */
    Part parts[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int64_t b = 0;
    for (int t = 0; t < threads; t++) {
        parts[t] = base;
        parts[t].first = b;
        const int64_t target = total * (t + 1) / threads;
        while (b < batch && (t == threads - 1 || base.offsets[b + 1] <= target)) b++;
        parts[t].last = b;
    }
    char joinable[MAX_THREADS] = {0};
    for (int t = 0; t < threads - 1; t++) {
        if (pthread_create(&ids[t], 0, fn, &parts[t]) == 0)
            joinable[t] = 1;
        else
            fn(&parts[t]); /* no thread to be had: this one does the part */
    }
    fn(&parts[threads - 1]);
    for (int t = 0; t < threads - 1; t++)
        if (joinable[t])
            pthread_join(ids[t], 0);
    return 0;
}

int film_silu_forward(const float *up, const float *film, const int64_t *offsets, float *act,
                      int64_t batch, int64_t hidden, int threads) {
    if (hidden % 8) return 1;
    Part base = {up, film, 0, act, 0, 0, offsets, hidden, 0, 0};
    return run_parts(base, batch, threads, run_forward);
}

int film_silu_backward(const float *grad_act, const float *up, const float *film, const int64_t *offsets,
                       float *grad_up, float *grad_film, int64_t batch, int64_t hidden, int threads) {
    if (hidden % 8) return 1;
    Part base = {up, film, grad_act, 0, grad_up, grad_film, offsets, hidden, 0, 0};
    return run_parts(base, batch, threads, run_backward);
}
