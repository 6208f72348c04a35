/* The personalized FFN over jagged tokens, forward and backward, for x86-64 CPUs with
   AVX2 and FMA: act = silu(pre), pre = (up + shift[seg]) + up * scale[seg].

   film_silu_*: the FiLM + SiLU alone, one pass over the tokens each way, in place of the
   ~6 (forward) and ~10 (backward) whole-tensor passes of torch's elementwise ops: the
   backward reads grad_act and up once, writes grad_up once and sums the FiLM gradient of
   each example in its row of grad_film (tokens of an example are contiguous).

   film_ffn_*: the whole FFN, y = act W_down^T + b_down with up = x W_up^T + b_up, in
   blocks of FFN_ROWS tokens whose (rows, H) up, act and their gradients stay in L2: the
   up product, the FiLM + SiLU and the down product of a block run back to back on
   tile_gemm.h, and only up itself is written out (for the backward, when asked). The
   backward recomputes act from up block by block, and each thread sums its weight and bias
   gradients in its own buffers, added up after the join.

   Threads own whole examples (split at example boundaries, balanced by tokens), so no two
   write the same grad_film row. Layouts, all contiguous float32: x, y, grad_y (N, D); up,
   act, grad_act, grad_up (N, H); w_up (H, D), w_down (D, H) as nn.Linear holds them;
   film, grad_film (B, 2H), [scale | shift]; offsets (B + 1) int64. H and D multiples of 8.
   Python side: kernels/film_silu.py, kernels/film_ffn.py. */

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp8.h"
#include "tile_gemm.h"

#define FFN_ROWS 96 /* tokens per block: 96 x H=256 floats = 96 KiB per intermediate */


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
    /* film_ffn_* only */
    const float *x, *w_up, *b_up, *w_down, *b_down, *grad_y;
    float *up_out, *y, *grad_x;
    float *grad_w_up, *grad_b_up, *grad_w_down, *grad_b_down; /* this part's own sums */
    int64_t dim;
    int failed;
} Part;

static void forward_part(Part *p) {
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
static void backward_part(Part *p) {
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


/* A block's FiLM + SiLU in place, rows r0 .. r0 + rb - 1 of the tokens: buf holds x W_up^T
   on entry and act on exit; up = that + b_up goes to up_out when given (streamed: it is
   read again only by the backward). *b: the example of the block's first row (advanced). */
static void ffn_block_film(const Part *p, float *buf, int64_t r0, int64_t rb, int64_t *b) {
    const int64_t h = p->hidden;
    const int stream = p->up_out && (uintptr_t)p->up_out % 32 == 0;
    for (int64_t i = 0; i < rb; ++i) {
        while (p->offsets[*b + 1] <= r0 + i) ++*b;
        const float *scale = p->film + *b * 2 * h, *shift = scale + h;
        float *row = buf + i * h, *u_out = p->up_out ? p->up_out + (r0 + i) * h : 0;
        for (int64_t j = 0; j < h; j += 8) {
            const __m256 uj = _mm256_add_ps(_mm256_loadu_ps(row + j), _mm256_loadu_ps(p->b_up + j));
            if (stream) _mm256_stream_ps(u_out + j, uj);
            else if (u_out) _mm256_storeu_ps(u_out + j, uj);
            const __m256 pre = _mm256_fmadd_ps(uj, _mm256_loadu_ps(scale + j),
                                               _mm256_add_ps(uj, _mm256_loadu_ps(shift + j)));
            _mm256_storeu_ps(row + j, _mm256_mul_ps(pre, sigmoid8(pre)));
        }
    }
}

/* y = silu(FiLM(x W_up^T + b_up)) W_down^T + b_down for this part's tokens; w_up and
   w_down here are the transposes, (D, H) and (H, D), made once per call. */
static void ffn_forward_part(Part *p) {
    const int64_t d = p->dim, h = p->hidden;
    const int64_t t0 = p->offsets[p->first], t1 = p->offsets[p->last];
    float *buf = aligned_alloc(64, FFN_ROWS * h * sizeof(float));
    if (!buf) {
        p->failed = 1;
        return;
    }
    int64_t b = p->first;
    for (int64_t r0 = t0; r0 < t1; r0 += FFN_ROWS) {
        const int64_t rb = t1 - r0 < FFN_ROWS ? t1 - r0 : FFN_ROWS;
        gemm(rb, h, d, p->x + r0 * d, d, 1, p->w_up, h, buf, h, 0);
        ffn_block_film(p, buf, r0, rb, &b);
        for (int64_t i = 0; i < rb; ++i)
            memcpy(p->y + (r0 + i) * d, p->b_down, (size_t)d * sizeof(float));
        gemm(rb, d, h, buf, h, 1, p->w_down, d, p->y + r0 * d, d, 1);
    }
    free(buf);
    _mm_sfence(); /* streamed up visible to the caller after the team ends */
}

/* One block's gradients: act recomputed from up, d_act = grad_y W_down, then d_up (in place
   of d_act), the FiLM and bias gradients, grad_x = d_up W_up and this part's weight sums
   (grad_w_down += grad_y^T act, grad_w_up += d_up^T x). */
static void ffn_backward_part(Part *p) {
    const int64_t d = p->dim, h = p->hidden;
    const int64_t t0 = p->offsets[p->first], t1 = p->offsets[p->last];
    const __m256 one = _mm256_set1_ps(1.0f);
    float *g = aligned_alloc(64, FFN_ROWS * h * sizeof(float)), *act = aligned_alloc(64, FFN_ROWS * h * sizeof(float));
    if (!g || !act) {
        p->failed = 1;
        free(g);
        free(act);
        return;
    }
    int64_t b = p->first;
    for (int64_t r0 = t0; r0 < t1; r0 += FFN_ROWS) {
        const int64_t rb = t1 - r0 < FFN_ROWS ? t1 - r0 : FFN_ROWS;
        gemm(rb, h, d, p->grad_y + r0 * d, d, 1, p->w_down, h, g, h, 0);
        for (int64_t i = 0; i < rb; ++i) {
            while (p->offsets[b + 1] <= r0 + i) ++b;
            const float *scale = p->film + b * 2 * h, *shift = scale + h, *u = p->up + (r0 + i) * h;
            float *g_scale = p->grad_film ? p->grad_film + b * 2 * h : 0, *g_shift = g_scale ? g_scale + h : 0;
            float *gi = g + i * h, *ai = act + i * h;
            for (int64_t j = 0; j < h; j += 8) {
                const __m256 uj = _mm256_loadu_ps(u + j), sc = _mm256_loadu_ps(scale + j);
                const __m256 pre = _mm256_fmadd_ps(uj, sc, _mm256_add_ps(uj, _mm256_loadu_ps(shift + j)));
                const __m256 s = sigmoid8(pre);
                _mm256_storeu_ps(ai + j, _mm256_mul_ps(pre, s));
                const __m256 dsilu = _mm256_mul_ps(s, _mm256_fmadd_ps(pre, _mm256_sub_ps(one, s), one));
                const __m256 d_pre = _mm256_mul_ps(_mm256_loadu_ps(gi + j), dsilu);
                const __m256 d_up = _mm256_fmadd_ps(d_pre, sc, d_pre);
                _mm256_storeu_ps(gi + j, d_up);
                _mm256_storeu_ps(p->grad_b_up + j, _mm256_add_ps(d_up, _mm256_loadu_ps(p->grad_b_up + j)));
                if (g_scale) {
                    _mm256_storeu_ps(g_scale + j, _mm256_fmadd_ps(d_pre, uj, _mm256_loadu_ps(g_scale + j)));
                    _mm256_storeu_ps(g_shift + j, _mm256_add_ps(d_pre, _mm256_loadu_ps(g_shift + j)));
                }
            }
            const float *gy = p->grad_y + (r0 + i) * d;
            for (int64_t j = 0; j < d; j += 8)
                _mm256_storeu_ps(p->grad_b_down + j, _mm256_add_ps(_mm256_loadu_ps(gy + j), _mm256_loadu_ps(p->grad_b_down + j)));
        }
        gemm(d, h, rb, p->grad_y + r0 * d, 1, d, act, h, p->grad_w_down, h, 1);
        gemm(h, d, rb, g, 1, h, p->x + r0 * d, d, p->grad_w_up, d, 1);
        if (p->grad_x)
            gemm(rb, d, h, g, h, 1, p->w_up, d, p->grad_x + r0 * d, d, 0);
    }
    free(g);
    free(act);
}


/* dst (cols x rows) = src (rows x cols)^T */
static void transpose(const float *src, int64_t rows, int64_t cols, float *dst) {
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * cols + j];
}

#define MAX_THREADS 64

/* Splits examples [0, batch) into runs of about equal token counts, one per part (at most
   `threads`, one below 4,096 tokens: a thread costs more than it saves there); returns how
   many parts. */
static int split_parts(const Part *base, int64_t batch, int threads, Part *parts) {
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    const int64_t total = base->offsets[batch];
    if (total < 4096) threads = 1;
    int64_t b = 0;
    for (int t = 0; t < threads; t++) {
        parts[t] = *base;
        parts[t].first = b;
        const int64_t target = total * (t + 1) / threads;
        while (b < batch && (t == threads - 1 || base->offsets[b + 1] <= target)) b++;
        parts[t].last = b;
    }
    return threads;
}

/* `fn` on each part, one OpenMP thread each (torch's own threads, see loader.py). */
static void run_split(Part *parts, int count, void (*fn)(Part *)) {
#pragma omp parallel for num_threads(count) schedule(static, 1)
    for (int t = 0; t < count; t++)
        fn(&parts[t]);
}

static int run_parts(Part base, int64_t batch, int threads, void (*fn)(Part *)) {
    Part parts[MAX_THREADS];
    run_split(parts, split_parts(&base, batch, threads, parts), fn);
    return 0;
}

int film_silu_forward(const float *up, const float *film, const int64_t *offsets, float *act,
                      int64_t batch, int64_t hidden, int threads) {
    if (hidden % 8) return 1;
    const Part base = {.up = up, .film = film, .act = act, .offsets = offsets, .hidden = hidden};
    return run_parts(base, batch, threads, forward_part);
}

int film_silu_backward(const float *grad_act, const float *up, const float *film, const int64_t *offsets,
                       float *grad_up, float *grad_film, int64_t batch, int64_t hidden, int threads) {
    if (hidden % 8) return 1;
    const Part base = {.up = up, .film = film, .grad_act = grad_act, .grad_up = grad_up,
                       .grad_film = grad_film, .offsets = offsets, .hidden = hidden};
    return run_parts(base, batch, threads, backward_part);
}

/* y (N, D) and, where up is given, up (N, H) for the backward. 1: D or H not a multiple of
   8; 2: out of memory. */
int film_ffn_forward(const float *x, const float *w_up, const float *b_up, const float *film, const float *w_down,
                     const float *b_down, const int64_t *offsets, float *up, float *y, int64_t batch, int64_t dim,
                     int64_t hidden, int threads) {
    if (hidden % 8 || dim % 8) return 1;
    float *w_up_t = malloc((size_t)(dim * hidden) * sizeof(float)), *w_down_t = malloc((size_t)(dim * hidden) * sizeof(float));
    int status = 2;
    if (w_up_t && w_down_t) {
        transpose(w_up, hidden, dim, w_up_t);
        transpose(w_down, dim, hidden, w_down_t);
        const Part base = {.film = film, .offsets = offsets, .hidden = hidden, .x = x, .w_up = w_up_t,
                           .b_up = b_up, .w_down = w_down_t, .b_down = b_down, .up_out = up, .y = y, .dim = dim};
        Part parts[MAX_THREADS];
        const int count = split_parts(&base, batch, threads, parts);
        run_split(parts, count, ffn_forward_part);
        status = 0;
        for (int t = 0; t < count; t++)
            if (parts[t].failed) status = 2;
    }
    free(w_up_t);
    free(w_down_t);
    return status;
}

/* The gradients of film_ffn_forward's inputs from grad_y and its saved up; grad_x and
   grad_film may be NULL (not asked for); grad_film is summed into, so the caller zeroes it.
   1: D or H not a multiple of 8; 2: out of memory. */
int film_ffn_backward(const float *grad_y, const float *x, const float *up, const float *film, const float *w_up,
                      const float *w_down, const int64_t *offsets, float *grad_x, float *grad_film, float *grad_w_up,
                      float *grad_b_up, float *grad_w_down, float *grad_b_down, int64_t batch, int64_t dim,
                      int64_t hidden, int threads) {
    if (hidden % 8 || dim % 8) return 1;
    const Part base = {.up = up, .film = film, .grad_film = grad_film, .offsets = offsets, .hidden = hidden,
                       .x = x, .w_up = w_up, .w_down = w_down, .grad_y = grad_y, .grad_x = grad_x, .dim = dim};
    Part parts[MAX_THREADS];
    const int count = split_parts(&base, batch, threads, parts);
    const int64_t per = 2 * dim * hidden + hidden + dim; /* one part's weight and bias sums */
    float *sums = calloc((size_t)(count * per), sizeof(float));
    if (!sums) return 2;
    for (int t = 0; t < count; t++) {
        float *s = sums + t * per;
        parts[t].grad_w_up = s;
        parts[t].grad_w_down = s + dim * hidden;
        parts[t].grad_b_up = s + 2 * dim * hidden;
        parts[t].grad_b_down = s + 2 * dim * hidden + hidden;
    }
    run_split(parts, count, ffn_backward_part);
    int status = 0;
    for (int t = 0; t < count; t++)
        if (parts[t].failed) status = 2;
    for (int64_t i = 0; i < per; ++i) { /* the parts' sums, in part order */
        float total = 0.0f;
        for (int t = 0; t < count; t++) total += sums[t * per + i];
        if (i < dim * hidden) grad_w_up[i] = total;
        else if (i < 2 * dim * hidden) grad_w_down[i - dim * hidden] = total;
        else if (i < 2 * dim * hidden + hidden) grad_b_up[i - 2 * dim * hidden] = total;
        else grad_b_down[i - 2 * dim * hidden - hidden] = total;
    }
    free(sums);
    return status;
}
