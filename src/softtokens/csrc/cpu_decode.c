/* A decode step's non-GEMM work on CPU, float32: each function replaces a run of small torch
 * operations of decode_forward.DecodeForward (see native_decode.py for why).
 *
 * Vectors are 16 lanes (GCC/Clang vector extensions: one AVX-512 register, two AVX2 ones, four
 * NEON ones) with an explicit summation tree, and the build turns off multiply-add contraction:
 * the same inputs give the same bits on any CPU, whatever its vector width. Elementwise products
 * and sums are the torch operations' own (the rotary embedding is bit for bit HF's); reductions
 * (dot products, the softmax's and RMSNorm's sums) add in another order than torch's kernels.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef int32_t v16i __attribute__((vector_size(64)));

#define LANES 16
#define MAX_CHUNKS 16 /* head_dim <= 256 */
#define MAX_GROUP 64  /* query heads per key/value head */

static inline v16 load16(const float *p) { v16 r; __builtin_memcpy(&r, p, sizeof r); return r; }
static inline void store16(float *p, v16 a) { __builtin_memcpy(p, &a, sizeof a); }

static inline float sum16(v16 a) {
    v8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
    return (c[0] + c[2]) + (c[1] + c[3]);
}

static inline v16 select16(v16i mask, v16 yes, v16 no) {
    return (v16)(((v16i)yes & mask) | ((v16i)no & ~mask));
}

/* exp(x) within 2 ulp on [-87.34, 88.72]: Cephes' expf, 2^n p(r) with |r| <= ln 2 / 2; x is
 * clamped to that range (below it exp(-87.34) ~ 1.2e-38 stands in for 0, which no sum with a
 * term near 1 can see). */
static inline v16 exp16(v16 x) {
    x = select16(x < -87.3365448f, x - x - 87.3365448f, x);
    x = select16(x > 88.7228390f, x - x + 88.7228390f, x);
    const v16 t = x * 1.44269504088896341f;
    const v16i n = __builtin_convertvector(t + select16(t < 0.f, t - t - 0.5f, t - t + 0.5f), v16i); /* round */
    const v16 nf = __builtin_convertvector(n, v16);
    const v16 r = x - nf * 0.693359375f + nf * 2.12194440e-4f; /* x - n ln 2, ln 2 in two parts */
    v16 p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    /* 2^n in two factors: n reaches 128 at the top of the range */
    const v16i half_n = n >> 1;
    return p * (v16)((half_n + 127) << 23) * (v16)((n - half_n + 127) << 23);
}

/* ------------------------------------------------------------------------- attention */

/* One query head: columns 0 .. len-1 of keys / values (the first `shared` from the shared copy).
 * `scores` holds at least len + LANES floats. Inlined with D a constant for the usual head sizes,
 * so the chunk loops unroll and the accumulators stay in registers. */
static inline __attribute__((always_inline)) void attend_head(
    const float *q, const float *keys, const float *values, const float *shared_keys,
    const float *shared_values, int64_t shared, int64_t len, float scale, float *scores,
    float *out, const int64_t D) {
    const int64_t chunks = D / LANES;
    v16 qc[MAX_CHUNKS], acc[MAX_CHUNKS];
    for (int64_t c = 0; c < chunks; ++c) qc[c] = load16(q + c * LANES);
    for (int64_t w = 0; w < len; ++w) {
        const float *k = w < shared ? shared_keys + w * D : keys + w * D;
        v16 a = qc[0] * load16(k);
        for (int64_t c = 1; c < chunks; ++c) a += qc[c] * load16(k + c * LANES);
        scores[w] = sum16(a) * scale;
    }
    float m = scores[0];
    for (int64_t w = 1; w < len; ++w) m = scores[w] > m ? scores[w] : m;
    const int64_t padded = (len + LANES - 1) / LANES * LANES;
    for (int64_t w = len; w < padded; ++w) scores[w] = m;
    for (int64_t w = 0; w < padded; w += LANES) store16(scores + w, exp16(load16(scores + w) - m));
    for (int64_t w = len; w < padded; ++w) scores[w] = 0.f;
    v16 total = load16(scores);
    for (int64_t w = LANES; w < padded; w += LANES) total += load16(scores + w);
    const float inv = 1.0f / sum16(total);
    for (int64_t c = 0; c < chunks; ++c) acc[c] = (v16){0};
    for (int64_t w = 0; w < len; ++w) {
        const float *v = w < shared ? shared_values + w * D : values + w * D;
        const float p = scores[w];
        for (int64_t c = 0; c < chunks; ++c) acc[c] += p * load16(v + c * LANES);
    }
    for (int64_t c = 0; c < chunks; ++c) store16(out + c * LANES, acc[c] * inv);
}

/* HF's rotary embedding, x * cos + rotate_half(x) * sin, with sin_signed = cat(-sin1, sin2):
 * rotate_half(x) * sin = roll(x, D/2) * sin_signed (negation is exact). */
static inline void rotate(const float *x, const float *cos, const float *sin_signed, float *out, int64_t D) {
    const int64_t half = D / 2;
    for (int64_t d = 0; d < half; ++d) out[d] = x[d] * cos[d] + x[d + half] * sin_signed[d];
    for (int64_t d = half; d < D; ++d) out[d] = x[d] * cos[d] + x[d - half] * sin_signed[d];
}

/* One decode position of a layer's attention, after the stacked q/k/v projection:
 *   qkv: (N, (H + 2 Hk) D) rows qkv_stride floats apart: queries, keys, values of the new token;
 *   cos, sin_signed: (positions, D) rotary tables; slot n's position is lengths[n];
 *   keys, values: (N, Hk, max_len, D) cache buffers: the rotated key and the value are written
 *     at column lengths[n], then slot n attends to its columns 0 .. lengths[n];
 *   shared_keys, shared_values: (Hk, shared, D), the shared prefix's columns (NULL if shared = 0);
 *   out: (N, H D), the attention outputs, heads in order.
 * Returns 0, or -1 for a shape it does not take, -2 when out of memory. */
int softtokens_decode_attention(const float *qkv, int64_t qkv_stride, const float *cos,
                                const float *sin_signed, int64_t positions, float *keys,
                                float *values, const int64_t *lengths, const float *shared_keys,
                                const float *shared_values, int64_t shared, float *out, int64_t N,
                                int64_t H, int64_t Hk, int64_t max_len, int64_t D, float scale,
                                int threads) {
    if (D % LANES || D > LANES * MAX_CHUNKS || Hk <= 0 || H % Hk || H / Hk > MAX_GROUP || max_len <= 0
        || positions <= 0)
        return -1;
    const int64_t G = H / Hk;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)(max_len + LANES + G * D));
        if (!scores) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t b = 0; b < N * Hk; ++b) {
            if (!scores) continue;
            const int64_t n = b / Hk, kv = b % Hk;
            const int64_t at = lengths[n] < 0 ? 0 : lengths[n];
            const int64_t row = at < positions ? at : positions - 1;
            const float *c = cos + row * D, *s = sin_signed + row * D;
            const float *x = qkv + n * qkv_stride;
            float *cache_k = keys + (n * Hk + kv) * max_len * D, *cache_v = values + (n * Hk + kv) * max_len * D;
            if (at < max_len) {
                rotate(x + (H + kv) * D, c, s, cache_k + at * D, D);
                for (int64_t d = 0; d < D; ++d) cache_v[at * D + d] = x[(H + Hk + kv) * D + d];
            }
            const int64_t len = at + 1 < max_len ? at + 1 : max_len;
            const float *sk = shared ? shared_keys + kv * shared * D : 0;
            const float *sv = shared ? shared_values + kv * shared * D : 0;
            const int64_t p = shared < len ? shared : len;
            float *q = scores + max_len + LANES;
            for (int64_t g = 0; g < G; ++g) {
                const int64_t h = kv * G + g;
                rotate(x + h * D, c, s, q, D);
                switch (D) {
                case 32: attend_head(q, cache_k, cache_v, sk, sv, p, len, scale, scores, out + (n * H + h) * D, 32); break;
                case 64: attend_head(q, cache_k, cache_v, sk, sv, p, len, scale, scores, out + (n * H + h) * D, 64); break;
                case 128: attend_head(q, cache_k, cache_v, sk, sv, p, len, scale, scores, out + (n * H + h) * D, 128); break;
                default: attend_head(q, cache_k, cache_v, sk, sv, p, len, scale, scores, out + (n * H + h) * D, D);
                }
            }
        }
        free(scores);
    }
    return failed ? -2 : 0;
}

/* ------------------------------------------------------------------------- elementwise */

/* HF's LlamaRMSNorm in float32 with the residual add before it: h += y (when y is not NULL),
 * out = weight * (h * rsqrt(mean(h^2) + eps)), rows of dim (a multiple of 16) floats. */
void softtokens_add_rms_norm(float *h, const float *y, const float *weight, float *out, int64_t rows,
                             int64_t dim, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        float *hr = h + r * dim;
        if (y)
            for (int64_t i = 0; i < dim; i += LANES) store16(hr + i, load16(hr + i) + load16(y + r * dim + i));
        v16 acc = (v16){0};
        for (int64_t i = 0; i < dim; i += LANES) { const v16 a = load16(hr + i); acc += a * a; }
        const float inv = 1.0f / sqrtf(sum16(acc) / (float)dim + eps);
        for (int64_t i = 0; i < dim; i += LANES)
            store16(out + r * dim + i, load16(weight + i) * (load16(hr + i) * inv));
    }
}

/* The SiLU-gated MLP's middle: out = silu(gate) * up = gate / (1 + exp(-gate)) * up, n floats
 * (a multiple of 16). */
void softtokens_silu_mul(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i += LANES) {
        const v16 g = load16(gate + i);
        store16(out + i, g / (1.0f + exp16(-g)) * load16(up + i));
    }
}
