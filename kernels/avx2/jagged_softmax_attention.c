/* Jagged softmax attention, forward and backward, for x86-64 CPUs with AVX2 and FMA.

   One work item per (sequence, head); items run longest first on `threads` OpenMP threads
   (torch's own, see loader.py), each claiming the next item when done with one.
   Per item, query rows go in blocks (row_block): the block's scores against every key
   (rows x Lp, Lp = L rounded up to 16) are materialized in a per-thread buffer that
   stays in L2, so softmax needs no online rescaling and the forward stores only the
   per-row log-sum-exp. The backward recomputes the block's weights from it (flash style:
   no saved attention weights). Every product is one register-tiled GEMM (6 x 16 tiles,
   12 accumulators); score products apply the softmax in their tiles' epilogue
   (gemm_scores). Each item reads only its own tokens' rows, so nothing crosses
   sequences. Layouts: q, k (T, H, D), v, out (T, H, Dv), lse (T, H), all contiguous
   float32; D and Dv multiples of 8. Head-dim products run in panels of 16 columns and one
   of 8 where the dim leaves 8 over (a head dim of 8 computes no padding columns). Python
   side and the design notes: loader.py, kernels/README.md. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp8.h"
#include "tile_gemm.h"

#define ROW_BLOCK_FLOATS 24576 /* scores per row block: 96 KiB, so S and dP sit in L2 */
#define ROW_BLOCK_MIN 24       /* except on very long sequences (K of the dV, dK products) */
#define ROW_BLOCK_MAX 96

typedef struct {
    int64_t start, length, head;
} Item;

typedef struct {
    const float *q, *k, *v, *out, *grad_out, *lse_in;
    float *out_w, *lse_w, *dq, *dk, *dv;
    int64_t heads, dim, vdim;
    int64_t dim_p, vdim_p; /* dim and vdim rounded up to 8 */
    float scale;
    Item *items;
    int64_t num_items, max_length;
    int64_t next; /* atomic */
    int failed;   /* atomic: a workspace allocation failed */
} Problem;

static const int32_t kTailMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

static inline __m256 lanes_below(int64_t n) { /* lanes 0 .. n-1 set, n in 0..8 */
    return _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)(kTailMask + 8 - n)));
}


static inline float hsum8(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float hmax8(__m256 x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* Brings the next item's input rows toward L2 a few lines per score tile, so their
   memory latency overlaps this item's arithmetic (short sequences otherwise wait on it). */
typedef struct {
    const float *base[5];
    int64_t ld[5], lines[5]; /* row stride and cache lines per row of each tensor */
    int64_t count, rows, per_tile;
    int64_t tensor, row, line; /* cursor */
} Prefetcher;

static void prefetch_some(Prefetcher *pf) {
    for (int64_t k = 0; k < pf->per_tile && pf->tensor < pf->count; ++k) {
        const int64_t t = pf->tensor;
        _mm_prefetch((const char *)(pf->base[t] + pf->row * pf->ld[t] + pf->line * 16), _MM_HINT_T1);
        if (++pf->line == pf->lines[t]) {
            pf->line = 0;
            if (++pf->row == pf->rows) {
                pf->row = 0;
                ++pf->tensor;
            }
        }
    }
}

/* What gemm_scores does with a finished score tile instead of storing it as is. */
enum { SCALED_ROW_MAX, SOFTMAX_WEIGHTS, SOFTMAX_GRAD };

typedef struct {
    int mode;
    float scale;
    int64_t valid;     /* columns below this are keys; the rest is padding */
    float *row_max;    /* SCALED_ROW_MAX: 8 running maxima per row */
    const float *row;  /* SOFTMAX_WEIGHTS: log-sum-exp per row; SOFTMAX_GRAD: dO.O per row */
    int64_t row_stride;
    const float *p;    /* SOFTMAX_GRAD: the weights, laid out like C */
    Prefetcher *pf;    /* or NULL */
} Epilogue;

/* scale * S (padding -inf) with the rows' maxima, P = exp(scale * S - lse) (padding 0),
   or dS = P (dP - dO.O) scale, for a tile of mr rows and 16 columns of a score block,
   computed from A (row-major, lda) times B (kk x 16 panel, ldb) in registers. */
static inline __attribute__((always_inline)) void score_tile(int mr, int64_t kk, const float *a,
                                                             int64_t lda, const float *b, int64_t ldb,
                                                             float *c, int64_t ldc, int64_t row0,
                                                             int64_t col0, const Epilogue *e) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i)
        if (i < mr) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t p = 0; p < kk; ++p) {
        const __m256 b0 = _mm256_loadu_ps(b + p * ldb), b1 = _mm256_loadu_ps(b + p * ldb + 8);
#pragma GCC unroll 6
        for (int i = 0; i < MR; ++i) {
            if (i < mr) {
                const __m256 ai = _mm256_broadcast_ss(a + i * lda + p);
                acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
            }
        }
    }
    if (e->pf) prefetch_some(e->pf);
    const int64_t v0 = e->valid - col0, v1 = v0 - 8;
    const __m256 m0 = lanes_below(v0 < 0 ? 0 : (v0 > 8 ? 8 : v0));
    const __m256 m1 = lanes_below(v1 < 0 ? 0 : (v1 > 8 ? 8 : v1));
    const __m256 scale = _mm256_set1_ps(e->scale), neg_inf = _mm256_set1_ps(-INFINITY);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
        if (i >= mr) continue;
        __m256 x0 = acc[i][0], x1 = acc[i][1];
        if (e->mode == SCALED_ROW_MAX) {
            x0 = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(x0, scale), m0);
            x1 = _mm256_blendv_ps(neg_inf, _mm256_mul_ps(x1, scale), m1);
            float *mx = e->row_max + (row0 + i) * 8;
            _mm256_storeu_ps(mx, _mm256_max_ps(_mm256_loadu_ps(mx), _mm256_max_ps(x0, x1)));
        } else if (e->mode == SOFTMAX_WEIGHTS) {
            const __m256 l = _mm256_set1_ps(e->row[(row0 + i) * e->row_stride]);
            x0 = _mm256_and_ps(exp8(_mm256_fmsub_ps(x0, scale, l)), m0);
            x1 = _mm256_and_ps(exp8(_mm256_fmsub_ps(x1, scale, l)), m1);
        } else {
            const __m256 di = _mm256_set1_ps(e->row[(row0 + i) * e->row_stride]);
            const float *pw = e->p + (row0 + i) * ldc + col0;
            x0 = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(pw), _mm256_sub_ps(x0, di)), scale);
            x1 = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(pw + 8), _mm256_sub_ps(x1, di)), scale);
        }
        _mm256_storeu_ps(c + i * ldc, x0);
        _mm256_storeu_ps(c + i * ldc + 8, x1);
    }
}

/* C (m x n, ldc) = epilogue(A (m x kk, lda) B (kk x n, ldb)): a score block, n a multiple
   of 16; C's rows are rows 0 .. m-1 of the epilogue's row arrays and of P. */
static void gemm_scores(int64_t m, int64_t n, int64_t kk, const float *a, int64_t lda,
                        const float *b, int64_t ldb, float *c, int64_t ldc, const Epilogue *e) {
    for (int64_t j = 0; j < n; j += NR) {
        int64_t i = 0;
        for (; i + MR <= m; i += MR)
            score_tile(MR, kk, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, i, j, e);
        const float *ap = a + i * lda;
        float *cp = c + i * ldc + j;
        switch (m - i) {
            case 5: score_tile(5, kk, ap, lda, b + j, ldb, cp, ldc, i, j, e); break;
            case 4: score_tile(4, kk, ap, lda, b + j, ldb, cp, ldc, i, j, e); break;
            case 3: score_tile(3, kk, ap, lda, b + j, ldb, cp, ldc, i, j, e); break;
            case 2: score_tile(2, kk, ap, lda, b + j, ldb, cp, ldc, i, j, e); break;
            case 1: score_tile(1, kk, ap, lda, b + j, ldb, cp, ldc, i, j, e); break;
            default: break;
        }
    }
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Row stride for packed buffers: an odd number of cache lines, so the rows of a panel
   spread over every L1 set (a power-of-two stride maps them all to a few sets). */
static int64_t padded_stride(int64_t width) { return width % 32 == 0 ? width + 16 : width; }

/* dst (n rows of dp floats, padded_stride(dp) apart) = n rows of d floats, ld apart,
   then dp - d zeros. */
static void pack_rows(const float *src, int64_t ld, int64_t n, int64_t d, int64_t dp, float *dst) {
    const int64_t ldd = padded_stride(dp);
    if (d == dp && d <= 32) { /* short rows: a call to memcpy per row costs more than the copy */
        for (int64_t j = 0; j < n; ++j)
            for (int64_t c = 0; c < d; c += 8)
                _mm256_storeu_ps(dst + j * ldd + c, _mm256_loadu_ps(src + j * ld + c));
        return;
    }
    for (int64_t j = 0; j < n; ++j) {
        memcpy(dst + j * ldd, src + j * ld, (size_t)d * sizeof(float));
        if (dp > d) memset(dst + j * ldd + d, 0, (size_t)(dp - d) * sizeof(float));
    }
}

/* dst (d x ldt) = the first d columns of src^T for src (n rows, lds apart); columns
   n .. ldt-1 zero. */
static void pack_transposed(const float *src, int64_t lds, int64_t n, int64_t d, int64_t ldt, float *dst) {
    const int64_t full = d % 8 == 0 ? n / 8 * 8 : 0;
    for (int64_t c = 0; c < d; c += 8) /* 8 x 8 blocks transposed in registers */
        for (int64_t j = 0; j < full; j += 8) {
            const float *s = src + j * lds + c;
            __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + lds), r2 = _mm256_loadu_ps(s + 2 * lds),
                   r3 = _mm256_loadu_ps(s + 3 * lds), r4 = _mm256_loadu_ps(s + 4 * lds),
                   r5 = _mm256_loadu_ps(s + 5 * lds), r6 = _mm256_loadu_ps(s + 6 * lds),
                   r7 = _mm256_loadu_ps(s + 7 * lds);
            const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                         t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                         t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                         t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                         u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                         u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                         u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *o = dst + c * ldt + j;
            _mm256_storeu_ps(o, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(o + ldt, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(o + 2 * ldt, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(o + 3 * ldt, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(o + 4 * ldt, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(o + 5 * ldt, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(o + 6 * ldt, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(o + 7 * ldt, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    for (int64_t c = 0; c < d; ++c) {
        float *row = dst + c * ldt;
        for (int64_t j = full; j < n; ++j) row[j] = src[j * lds + c];
        memset(row + n, 0, (size_t)(ldt - n) * sizeof(float));
    }
}

static int64_t row_block(int64_t lp) {
    int64_t rows = ROW_BLOCK_FLOATS / lp / MR * MR;
    return rows < ROW_BLOCK_MIN ? ROW_BLOCK_MIN : (rows > ROW_BLOCK_MAX ? ROW_BLOCK_MAX : rows);
}

typedef struct {
    float *qc, *kc, *vc, *kt, *vt, *s, *dp, *dkc, *dvc, *row_max, *oc;
    float *di; /* one value per row: dO.O in the backward, 1 / the softmax sum in the forward */
} Workspace;

static float *alloc_floats(int64_t n) {
    return aligned_alloc(64, (size_t)round_up(n * (int64_t)sizeof(float), 64));
}

static int workspace_alloc(Workspace *w, const Problem *pb) {
    const int64_t lp = round_up(pb->max_length, NR), ld = padded_stride(lp), rows = row_block(lp);
    const int64_t dmax = pb->dim_p > pb->vdim_p ? pb->dim_p : pb->vdim_p;
    w->qc = alloc_floats(pb->max_length * padded_stride(pb->dim_p));
    w->kc = alloc_floats(pb->max_length * padded_stride(pb->dim_p));
    w->vc = alloc_floats(pb->max_length * padded_stride(pb->vdim_p));
    w->kt = alloc_floats(pb->dim * ld);
    w->vt = alloc_floats(pb->vdim * ld);
    /* row_block keeps rows * lp <= ROW_BLOCK_FLOATS, or rows == ROW_BLOCK_MIN on the
       longest; the stride's 16 extra columns add at most ROW_BLOCK_MAX * 16 floats */
    const int64_t bound = ROW_BLOCK_FLOATS + ROW_BLOCK_MAX * 16;
    const int64_t block = rows * ld > bound ? rows * ld : bound;
    w->s = alloc_floats(block);
    w->dp = alloc_floats(block);
    w->di = alloc_floats(lp);
    w->dkc = alloc_floats(pb->max_length * padded_stride(pb->dim_p));
    w->dvc = alloc_floats(pb->max_length * padded_stride(pb->vdim_p));
    w->row_max = alloc_floats(ROW_BLOCK_MAX * 8);
    w->oc = alloc_floats(ROW_BLOCK_MAX * padded_stride(dmax));
    return w->qc && w->kc && w->vc && w->kt && w->vt && w->s && w->dp && w->di && w->dkc && w->dvc && w->row_max && w->oc;
}

static void workspace_free(Workspace *w) {
    free(w->qc); free(w->kc); free(w->vc); free(w->kt); free(w->vt); free(w->s); free(w->dp);
    free(w->di); free(w->dkc); free(w->dvc); free(w->row_max); free(w->oc);
}

/* n rows of d floats (d a multiple of 8) from src (lds apart) to dst (ld apart), each
   times scale[j] if scale is given. Results are not read again here, so where alignment
   allows they bypass the caches (no read-for-ownership of the output's lines). */
static void store_rows(const float *src, int64_t lds, int64_t n, int64_t d, float *dst, int64_t ld,
                       const float *scale) {
    const int stream = ((uintptr_t)dst % 32 == 0) && (ld % 8 == 0);
    for (int64_t j = 0; j < n; ++j) {
        const __m256 f = _mm256_set1_ps(scale ? scale[j] : 1.0f);
        for (int64_t c = 0; c < d; c += 8) {
            const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(src + j * lds + c), f);
            if (stream) _mm256_stream_ps(dst + j * ld + c, x);
            else _mm256_storeu_ps(dst + j * ld + c, x);
        }
    }
}

/* Unnormalized softmax in place of `rows` rows of scaled scores (n valid columns, ld
   apart, padding -inf) whose maxima are the 8 lanes per row of row_max: exp(s - max),
   zeros from column n up to the next multiple of 8; inv[i] gets 1 / the row's sum and
   lse[i * lse_stride] its log-sum-exp. */
static void softmax_rows(float *s, int64_t rows, int64_t n, int64_t ld, const float *row_max,
                         float *inv, float *lse, int64_t lse_stride) {
    const int64_t full = n / 8 * 8, rest = n - full;
    const __m256 tail = lanes_below(rest);
    for (int64_t i = 0; i < rows; ++i) {
        float *row = s + i * ld;
        const float m = hmax8(_mm256_loadu_ps(row_max + i * 8));
        const __m256 vm = _mm256_set1_ps(m);
        __m256 sum = _mm256_setzero_ps();
        for (int64_t j = 0; j < full; j += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
            _mm256_storeu_ps(row + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        if (rest) {
            const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(row + full), vm)), tail);
            _mm256_storeu_ps(row + full, e);
            sum = _mm256_add_ps(sum, e);
        }
        const float total = hsum8(sum);
        inv[i] = 1.0f / total;
        lse[i * lse_stride] = m + logf(total);
    }
}

static void forward_item(const Problem *pb, const Item *it, Workspace *w, Prefetcher *pf) {
    const int64_t h = it->head, n = it->length, d = pb->dim, dv = pb->vdim, lp = round_up(n, NR);
    const int64_t ld = padded_stride(lp), ldq = pb->heads * d, ldv = pb->heads * dv, rows = row_block(lp);
    const int64_t dp = pb->dim_p, dvp = pb->vdim_p, pd = padded_stride(dp), pv = padded_stride(dvp);
    const int64_t first = it->start;
    float *out = pb->out_w + first * ldv + h * dv, *lse = pb->lse_w + first * pb->heads + h;
    pack_rows(pb->q + first * ldq + h * d, ldq, n, d, dp, w->qc);
    pack_rows(pb->k + first * ldq + h * d, ldq, n, d, dp, w->kc);
    pack_rows(pb->v + first * ldv + h * dv, ldv, n, dv, dvp, w->vc);
    pack_transposed(w->kc, pd, n, d, ld, w->kt);
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
        const int64_t rb = n - r0 < rows ? n - r0 : rows;
        for (int64_t i = 0; i < rb * 8; ++i) w->row_max[i] = -INFINITY;
        const Epilogue e = {.mode = SCALED_ROW_MAX, .scale = pb->scale, .valid = n, .row_max = w->row_max, .pf = pf};
        gemm_scores(rb, lp, d, w->qc + r0 * pd, pd, w->kt, ld, w->s, ld, &e);
        softmax_rows(w->s, rb, n, ld, w->row_max, w->di, lse + r0 * pb->heads, pb->heads);
        gemm(rb, dvp, n, w->s, ld, 1, w->vc, pv, w->oc, pv, 0);
        store_rows(w->oc, pv, rb, dv, out + r0 * ldv, ldv, w->di); /* normalized here, not P */
    }
}

static void backward_item(const Problem *pb, const Item *it, Workspace *w, Prefetcher *pf) {
    const int64_t h = it->head, n = it->length, d = pb->dim, dv = pb->vdim, lp = round_up(n, NR);
    const int64_t ld = padded_stride(lp), ldq = pb->heads * d, ldv = pb->heads * dv, rows = row_block(lp);
    const int64_t dp = pb->dim_p, dvp = pb->vdim_p, pd = padded_stride(dp), pv = padded_stride(dvp);
    const int64_t first = it->start;
    const float *o = pb->out + first * ldv + h * dv, *lse = pb->lse_in + first * pb->heads + h;
    float *dq = pb->dq + first * ldq + h * d, *dk = pb->dk + first * ldq + h * d;
    float *dv_out = pb->dv + first * ldv + h * dv;
    float *go = w->vc; /* dO packed; V only needs its transpose */
    pack_rows(pb->v + first * ldv + h * dv, ldv, n, dv, dvp, go);
    pack_transposed(go, pv, n, dv, ld, w->vt);
    pack_rows(pb->grad_out + first * ldv + h * dv, ldv, n, dv, dvp, go);
    pack_rows(pb->k + first * ldq + h * d, ldq, n, d, dp, w->kc);
    pack_transposed(w->kc, pd, n, d, ld, w->kt);
    pack_rows(pb->q + first * ldq + h * d, ldq, n, d, dp, w->qc);
    for (int64_t i = 0; i < n; ++i) { /* D_i = dO_i . O_i */
        __m256 acc = _mm256_setzero_ps();
        for (int64_t c = 0; c < dv; c += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(go + i * pv + c), _mm256_loadu_ps(o + i * ldv + c), acc);
        w->di[i] = hsum8(acc);
    }
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
        const int64_t rb = n - r0 < rows ? n - r0 : rows;
        const Epilogue weights = {.mode = SOFTMAX_WEIGHTS, .scale = pb->scale, .valid = n,
                                  .row = lse + r0 * pb->heads, .row_stride = pb->heads, .pf = pf};
        gemm_scores(rb, lp, d, w->qc + r0 * pd, pd, w->kt, ld, w->s, ld, &weights);
        const Epilogue grad = {.mode = SOFTMAX_GRAD, .scale = pb->scale, .valid = n,
                               .row = w->di + r0, .row_stride = 1, .p = w->s, .pf = pf};
        gemm_scores(rb, lp, dv, go + r0 * pv, pv, w->vt, ld, w->dp, ld, &grad);
        gemm(n, dvp, rb, w->s, 1, ld, go + r0 * pv, pv, w->dvc, pv, r0 > 0);     /* dV += P^T dO */
        gemm(rb, dp, n, w->dp, ld, 1, w->kc, pd, w->oc, pd, 0);                   /* dQ = dS K */
        store_rows(w->oc, pd, rb, d, dq + r0 * ldq, ldq, NULL);
        gemm(n, dp, rb, w->dp, 1, ld, w->qc + r0 * pd, pd, w->dkc, pd, r0 > 0);   /* dK += dS^T Q */
    }
    store_rows(w->dkc, pd, n, d, dk, ldq, NULL);
    store_rows(w->dvc, pv, n, dv, dv_out, ldv, NULL);
}

static void prefetch_tensor(Prefetcher *pf, const float *x, int64_t width, const Item *it,
                            int64_t heads) {
    pf->base[pf->count] = x + it->start * heads * width + it->head * width;
    pf->ld[pf->count] = heads * width;
    pf->lines[pf->count++] = (width + 15) / 16;
}

/* The upcoming item's input rows (q, k, v; and out, dO in the backward), spread over the
   score tiles of an item of `current` tokens (the forward has one score product per
   row block, the backward two). */
static void prefetcher_for(const Problem *pb, const Item *it, int64_t current, Prefetcher *pf) {
    memset(pf, 0, sizeof(*pf));
    pf->rows = it->length;
    prefetch_tensor(pf, pb->q, pb->dim, it, pb->heads);
    prefetch_tensor(pf, pb->k, pb->dim, it, pb->heads);
    prefetch_tensor(pf, pb->v, pb->vdim, it, pb->heads);
    if (pb->grad_out) {
        prefetch_tensor(pf, pb->out, pb->vdim, it, pb->heads);
        prefetch_tensor(pf, pb->grad_out, pb->vdim, it, pb->heads);
    }
    int64_t total = 0;
    for (int64_t t = 0; t < pf->count; ++t) total += pf->rows * pf->lines[t];
    const int64_t tiles = (current + MR - 1) / MR * (round_up(current, NR) / NR) * (pb->grad_out ? 2 : 1);
    pf->per_tile = (total + tiles - 1) / tiles;
}

static void worker(Problem *pb) {
    Workspace w;
    if (!workspace_alloc(&w, pb)) {
        workspace_free(&w);
        __atomic_store_n(&pb->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    /* Each thread claims its next item before working on the current one, to prefetch it. */
    int64_t i = __atomic_fetch_add(&pb->next, 1, __ATOMIC_RELAXED);
    while (i < pb->num_items) {
        const int64_t upcoming = __atomic_fetch_add(&pb->next, 1, __ATOMIC_RELAXED);
        Prefetcher pf;
        Prefetcher *p = upcoming < pb->num_items ? &pf : NULL;
        if (p) prefetcher_for(pb, pb->items + upcoming, pb->items[i].length, p);
        if (pb->grad_out) backward_item(pb, pb->items + i, &w, p);
        else forward_item(pb, pb->items + i, &w, p);
        i = upcoming;
    }
    workspace_free(&w);
    _mm_sfence(); /* streamed results visible to the caller after the team ends */
}

/* Longest first (balance), then by position: a sequence's heads follow each other. */
static int longest_first(const void *a, const void *b) {
    const Item *x = a, *y = b;
    if (x->length != y->length) return (x->length < y->length) - (x->length > y->length);
    if (x->start != y->start) return (x->start > y->start) - (x->start < y->start);
    return (x->head > y->head) - (x->head < y->head);
}

/* Items for every (sequence, head) with a non-empty kept span, longest first. */
static int run(Problem *pb, const int64_t *starts, const int64_t *lengths, int64_t num_seqs, int threads) {
    int64_t count = 0, max_length = 0;
    for (int64_t b = 0; b < num_seqs; ++b)
        if (lengths[b] > 0) {
            count += pb->heads;
            if (lengths[b] > max_length) max_length = lengths[b];
        }
    if (count == 0) return 0;
    pb->items = malloc((size_t)count * sizeof(Item));
    if (!pb->items) return 1;
    int64_t c = 0;
    for (int64_t b = 0; b < num_seqs; ++b)
        for (int64_t h = 0; h < pb->heads && lengths[b] > 0; ++h)
            pb->items[c++] = (Item){starts[b], lengths[b], h};
    qsort(pb->items, (size_t)count, sizeof(Item), longest_first);
    pb->num_items = count;
    pb->max_length = max_length;
    pb->next = 0;
    pb->failed = 0;
    if (threads < 1) threads = 1;
    if (threads > count) threads = (int)count;
#pragma omp parallel num_threads(threads)
    worker(pb); /* every thread takes the next item when done with one, until none is left */
    free(pb->items);
    return pb->failed || pb->next < count ? 1 : 0;
}

int jagged_softmax_forward(const float *q, const float *k, const float *v, float *out, float *lse,
                           const int64_t *starts, const int64_t *lengths, int64_t num_seqs,
                           int64_t heads, int64_t dim, int64_t vdim, float scale, int threads) {
    Problem pb = {.q = q, .k = k, .v = v, .out_w = out, .lse_w = lse,
                  .heads = heads, .dim = dim, .vdim = vdim, .dim_p = round_up(dim, 8),
                  .vdim_p = round_up(vdim, 8), .scale = scale};
    return run(&pb, starts, lengths, num_seqs, threads);
}

int jagged_softmax_backward(const float *grad_out, const float *q, const float *k, const float *v,
                            const float *out, const float *lse, float *dq, float *dk, float *dv,
                            const int64_t *starts, const int64_t *lengths, int64_t num_seqs,
                            int64_t heads, int64_t dim, int64_t vdim, float scale, int threads) {
    Problem pb = {.q = q, .k = k, .v = v, .out = out, .grad_out = grad_out, .lse_in = lse,
                  .dq = dq, .dk = dk, .dv = dv, .heads = heads, .dim = dim, .vdim = vdim,
                  .dim_p = round_up(dim, 8), .vdim_p = round_up(vdim, 8), .scale = scale};
    return run(&pb, starts, lengths, num_seqs, threads);
}
