/*
 * cpu_hash_direct.c - the hash path's accumulate pass when the table stays in cache (few
 * voxels, float32 x/y/z, fused keys: no bounds pass first; see cpu_hash.c).
 *
 * Four points at a time: their x, y, z loaded as four 16-byte vectors and transposed (when
 * x, y, z are consecutive floats; three 4-byte loads each otherwise), the twelve floor
 * keys from three divisions, the 64-bit fused keys packed in vector registers. When the
 * four keys equal the current voxel's (organized frames: runs of ~5-10 points in one voxel)
 * the four points are added with no per-point branch; otherwise point by point, probing the
 * table only when the key changes. The current voxel's sums stay in registers: x and y as
 * one pair of doubles, z, the count, and the colour channels as four 32-bit lanes (exact,
 * flushed before they could overflow). Float sums are still taken point by point in input
 * order, so the bytes equal every other path's.
 *
 * Points outside the fused key range may land in a voxel of garbage key before the range
 * check (at each new voxel, and at the end) makes the pass give up; nothing is kept then.
 */
#include "cpu_internal.h"

#if SBV_SSE2 /* the whole file: elsewhere the hash path uses its pipelined pass */
#include <immintrin.h>

#define FB SBVI_FB
#define EMPTY_KEY SBVI_EMPTY_KEY
#define AI __attribute__((always_inline))

/* floor(q) biased by 2^20 (lanes of dropped points wrap; they are masked later) */
static inline AI __m128i floor_biased(__m128 P, __m128 V) {
    const __m128 q = _mm_div_ps(P, V); /* IEEE division, as floorf(p / v) */
    const __m128i t = _mm_cvttps_epi32(q);
    const __m128i down = _mm_castps_si128(_mm_cmpgt_ps(_mm_cvtepi32_ps(t), q)); /* -1: rounded up */
    return _mm_add_epi32(_mm_add_epi32(t, down), _mm_set1_epi32((int)SBVI_FBIAS));
}

/* Fused keys of four points (EMPTY_KEY for dropped ones); out-of-range lanes of finite
 * points are or-ed into *out. */
static inline AI void keys4(__m128 X, __m128 Y, __m128 Z, __m128 V, __m128i *out, uint64_t key[4]) {
    const __m128i ok = _mm_castps_si128(sbvi_finite4(X, Y, Z)), zi = _mm_setzero_si128();
    const __m128i ux = floor_biased(X, V), uy = floor_biased(Y, V), uz = floor_biased(Z, V);
    *out = _mm_or_si128(*out, _mm_and_si128(_mm_srli_epi32(_mm_or_si128(_mm_or_si128(ux, uy), uz), FB), ok));
    const __m128i bad = _mm_xor_si128(ok, _mm_set1_epi32(-1));
#define PACK(UNPACK)                                                                              \
    _mm_or_si128(_mm_or_si128(_mm_slli_epi64(UNPACK(ux, zi), 2 * FB), _mm_slli_epi64(UNPACK(uy, zi), FB)), \
                 _mm_or_si128(UNPACK(uz, zi), UNPACK(bad, bad)))
    _mm_storeu_si128((__m128i *)(void *)key, PACK(_mm_unpacklo_epi32));
    _mm_storeu_si128((__m128i *)(void *)(key + 2), PACK(_mm_unpackhi_epi32));
#undef PACK
}

#define PASS_NAME pass_sse
#define PASS_LANES 4
#include "cpu_hash_pass.h"
#undef PASS_NAME
#undef PASS_LANES

/* ---- eight points per group, keys in AVX2 registers (same operations lane by lane) ---- */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SBV_AVX2 1
#pragma GCC push_options
#pragma GCC target("avx2")

/* x, y, z of eight packed records (16-byte loads from rec + xo, r[j] kept for the sums),
 * their fused keys (EMPTY_KEY for dropped points); out-of-range lanes or-ed into *out. */
static inline AI void keys8(const unsigned char *rec, size_t stride, uint32_t xo, __m256 V,
                            __m128i *out, __m128 r[8], uint64_t key[8]) {
    __m256 q[4];
    for (int j = 0; j < 4; j++) {
        r[j] = _mm_loadu_ps((const float *)(const void *)(rec + (size_t)j * stride + xo));
        r[j + 4] = _mm_loadu_ps((const float *)(const void *)(rec + (size_t)(j + 4) * stride + xo));
        q[j] = _mm256_insertf128_ps(_mm256_castps128_ps256(r[j]), r[j + 4], 1);
    }
    const __m256 t0 = _mm256_unpacklo_ps(q[0], q[1]), t1 = _mm256_unpacklo_ps(q[2], q[3]);
    const __m256 t2 = _mm256_unpackhi_ps(q[0], q[1]), t3 = _mm256_unpackhi_ps(q[2], q[3]);
    const __m256 X = _mm256_shuffle_ps(t0, t1, 0x44), Y = _mm256_shuffle_ps(t0, t1, 0xee);
    const __m256 Z = _mm256_shuffle_ps(t2, t3, 0x44);
    const __m256 zero = _mm256_setzero_ps();
    const __m256i ok = _mm256_castps_si256(_mm256_and_ps(
        _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(X, X), zero, _CMP_EQ_OQ),
                      _mm256_cmp_ps(_mm256_sub_ps(Y, Y), zero, _CMP_EQ_OQ)),
        _mm256_cmp_ps(_mm256_sub_ps(Z, Z), zero, _CMP_EQ_OQ)));
    const __m256i bias = _mm256_set1_epi32((int)SBVI_FBIAS);
#define FLOOR8(P)                                                                                 \
    ({                                                                                            \
        const __m256 q_ = _mm256_div_ps(P, V);                                                    \
        const __m256i t_ = _mm256_cvttps_epi32(q_);                                               \
        _mm256_add_epi32(_mm256_add_epi32(t_, _mm256_castps_si256(_mm256_cmp_ps(                  \
                                                  _mm256_cvtepi32_ps(t_), q_, _CMP_GT_OQ))),      \
                         bias);                                                                   \
    })
    const __m256i ux = FLOOR8(X), uy = FLOOR8(Y), uz = FLOOR8(Z);
#undef FLOOR8
    const __m256i o = _mm256_and_si256(_mm256_srli_epi32(_mm256_or_si256(_mm256_or_si256(ux, uy), uz), FB), ok);
    *out = _mm_or_si128(*out, _mm_or_si128(_mm256_castsi256_si128(o), _mm256_extracti128_si256(o, 1)));
    const __m256i bad = _mm256_xor_si256(ok, _mm256_set1_epi32(-1));
#define PACK8(HALF)                                                                               \
    _mm256_or_si256(                                                                              \
        _mm256_or_si256(_mm256_slli_epi64(_mm256_cvtepu32_epi64(HALF(ux)), 2 * FB),               \
                        _mm256_slli_epi64(_mm256_cvtepu32_epi64(HALF(uy)), FB)),                  \
        _mm256_or_si256(_mm256_cvtepu32_epi64(HALF(uz)), _mm256_cvtepi32_epi64(HALF(bad))))
#define LO(v) _mm256_castsi256_si128(v)
#define HI(v) _mm256_extracti128_si256(v, 1)
    _mm256_storeu_si256((__m256i *)(void *)key, PACK8(LO));
    _mm256_storeu_si256((__m256i *)(void *)(key + 4), PACK8(HI));
#undef LO
#undef HI
#undef PACK8
}

#define PASS_NAME pass_avx2
#define PASS_LANES 8
#include "cpu_hash_pass.h"
#undef PASS_NAME
#undef PASS_LANES

static int avx2_xyz(job_t *job, sbvi_hstate *hs) { return pass_avx2(job, hs, SBVI_F_XYZ, 1, 0); }
static int avx2_color(job_t *job, sbvi_hstate *hs, int cin) {
    return cin ? pass_avx2(job, hs, SBVI_F_COLOR, 1, 1) : pass_avx2(job, hs, SBVI_F_COLOR, 1, 0);
}
#pragma GCC pop_options
#else
#define SBV_AVX2 0
#endif

#if SBV_AVX2
static int has_avx2(void) {
    static _Atomic int known = -1; /* -1: not asked yet */
    int v = known;
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") ? 1 : 0;
        if (getenv("SBV_NO_AVX2")) v = 0; /* tests: the SSE2 pass on any machine */
        known = v;
    }
    return v;
}
#endif

int sbvi_accumulate_direct(job_t *job, sbvi_hstate *hs, int fm) {
    const int packed = job->plan.xyz_packed;
#if SBV_AVX2
    const int avx2 = packed && has_avx2();
#endif
    if (fm == SBVI_F_COLOR) {
        uint32_t col_off = 0;
        for (size_t f = 0; f < job->in->n_fields; f++)
            if (job->in->fields[f].role < SBV_ROLE_X) col_off = job->in->fields[f].offset;
        const int cin = packed && col_off == job->plan.x_off + 12;
#if SBV_AVX2
        if (avx2) return avx2_color(job, hs, cin);
#endif
        if (cin) return pass_sse(job, hs, SBVI_F_COLOR, 1, 1);
        return packed ? pass_sse(job, hs, SBVI_F_COLOR, 1, 0) : pass_sse(job, hs, SBVI_F_COLOR, 0, 0);
    }
#if SBV_AVX2
    if (avx2) return avx2_xyz(job, hs);
#endif
    return packed ? pass_sse(job, hs, SBVI_F_XYZ, 1, 0) : pass_sse(job, hs, SBVI_F_XYZ, 0, 0);
}

#else /* !SBV_SSE2: the same direct pass in plain C (GCC vector extensions), four keys at a time */

#define EMPTY_KEY SBVI_EMPTY_KEY
#define FB SBVI_FB
#define FBIAS SBVI_FBIAS


typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));
typedef uint64_t v4q __attribute__((vector_size(32)));
typedef int64_t v4l __attribute__((vector_size(32)));

/* Fused keys of the four records at rec, rec + stride, ... (EMPTY_KEY for dropped points),
 * one lane per point: three divisions for four points instead of four, and the 64-bit
 * packing done in vector registers. Out-of-range lanes of finite points are or-ed into out. */
static inline __attribute__((always_inline)) void keys4_portable(const unsigned char *rec, size_t stride,
                                                        uint32_t xo, uint32_t yo, uint32_t zo,
                                                        float v, v4u *out, uint64_t key[4]) {
    float x[4], y[4], z[4];
    for (int j = 0; j < 4; j++) {
        memcpy(&x[j], rec + j * stride + xo, 4);
        memcpy(&y[j], rec + j * stride + yo, 4);
        memcpy(&z[j], rec + j * stride + zo, 4);
    }
    const v4f X = {x[0], x[1], x[2], x[3]}, Y = {y[0], y[1], y[2], y[3]};
    const v4f Z = {z[0], z[1], z[2], z[3]}, V = {v, v, v, v}, zero = {0, 0, 0, 0};
    const v4i fin = ((X - X) == zero) & ((Y - Y) == zero) & ((Z - Z) == zero);
    const v4u bias = {FBIAS, FBIAS, FBIAS, FBIAS};
    const v4f qx = X / V, qy = Y / V, qz = Z / V; /* IEEE division, as floorf(p / v) */
    const v4i tx = __builtin_convertvector(qx, v4i), ty = __builtin_convertvector(qy, v4i);
    const v4i tz = __builtin_convertvector(qz, v4i);
    const v4u ux = (v4u)tx + (v4u)(__builtin_convertvector(tx, v4f) > qx) + bias;
    const v4u uy = (v4u)ty + (v4u)(__builtin_convertvector(ty, v4f) > qy) + bias;
    const v4u uz = (v4u)tz + (v4u)(__builtin_convertvector(tz, v4f) > qz) + bias;
    *out |= ((ux | uy | uz) >> FB) & (v4u)fin;
    const v4q k = (__builtin_convertvector(ux, v4q) << (2 * FB)) |
                  (__builtin_convertvector(uy, v4q) << FB) | __builtin_convertvector(uz, v4q);
    const v4q keep = (v4q)__builtin_convertvector(fin, v4l);
    const v4q sel = (k & keep) | ((v4q){EMPTY_KEY, EMPTY_KEY, EMPTY_KEY, EMPTY_KEY} & ~keep);
    memcpy(key, &sel, sizeof sel);
}

static inline __attribute__((always_inline)) int accumulate_portable(job_t *job, sbvi_hstate *hs,
                                                                    const int fm) {
    const sbv_cloud *in = job->in;
    const size_t n = in->points, stride = job->stride;
    const sbv_plan *pl = &job->plan;
    const v4f vv = {pl->voxel_f, pl->voxel_f, pl->voxel_f, 1.0f};
    const v4u bias = {FBIAS, FBIAS, FBIAS, FBIAS};
    const uint32_t xo = pl->x_off, yo = pl->y_off, zo = pl->z_off;
    uint32_t col_off = 0;
    for (size_t f = 0; f < in->n_fields; f++)
        if (in->fields[f].role < SBV_ROLE_X) col_off = in->fields[f].offset;
    sbv_acc *const spare = hs->rows + hs->limit * hs->w;
    sbv_acc *row = spare;
    uint64_t cur = EMPTY_KEY;
    double sx = 0, sy = 0, sz = 0;
    int64_t cnt = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0;
    v4u out = {0, 0, 0, 0};
    uint64_t k4[4];
    /* The per-point work, for the groups of four and the tail alike. */
#define POINT(IDX, REC, KEY)                                                            \
    do {                                                                                  \
        float x, y, z;                                                                    \
        memcpy(&x, (REC) + xo, 4);                                                        \
        memcpy(&y, (REC) + yo, 4);                                                        \
        memcpy(&z, (REC) + zo, 4);                                                        \
        if (KEY != cur) {                                                                 \
            sbvi_flush_row(row, sx, sy, sz, cnt, fm == SBVI_F_COLOR, &c0, &c1, &c2, &c3);           \
            if (KEY == EMPTY_KEY) {                                                       \
                row = spare;                                                              \
            } else {                                                                      \
                const size_t before = hs->m;                                              \
                const int64_t v = sbvi_voxel_id(hs, KEY);                                      \
                if (v < 0 || (hs->m != before && sbvi_projected_over(hs, (IDX) + 1, n)))          \
                    return SBVI_HASH_FULL;                                                \
                row = hs->rows + (size_t)v * hs->w;                                       \
            }                                                                             \
            cur = KEY;                                                                    \
            sx = row[0].d;                                                                \
            sy = row[1].d;                                                                \
            sz = row[2].d;                                                                \
            cnt = row[3].i;                                                               \
            if (((IDX) & 4095) == 0 && (out[0] | out[1] | out[2] | out[3])) return SBVI_HASH_FULL;   \
        }                                                                                 \
        sx += (double)x;                                                                  \
        sy += (double)y;                                                                  \
        sz += (double)z;                                                                  \
        cnt++;                                                                            \
        if (fm == SBVI_F_COLOR) {                                                              \
            const unsigned char *c = (REC) + col_off;                                     \
            c0 += c[0];                                                                   \
            c1 += c[1];                                                                   \
            c2 += c[2];                                                                   \
            c3 += c[3];                                                                   \
        }                                                                                 \
    } while (0)
    const unsigned char *rec = job->data;
    size_t i = 0;
    for (; i + 4 <= n; i += 4, rec += 4 * stride) {
        keys4_portable(rec, stride, xo, yo, zo, pl->voxel_f, &out, k4);
        for (size_t j = 0; j < 4; j++) {
            const uint64_t key = k4[j];
            POINT(i + j, rec + j * stride, key);
        }
    }
    for (; i < n; i++, rec += stride) { /* the last n % 4 points, one at a time */
        float x, y, z;
        memcpy(&x, rec + xo, 4);
        memcpy(&y, rec + yo, 4);
        memcpy(&z, rec + zo, 4);
        const v4f p = {x, y, z, 0.0f};
        const v4i fin = (p - p) == (v4f){0, 0, 0, 0};
        const v4f q = p / vv;
        const v4i t = __builtin_convertvector(q, v4i);
        const v4u u = (v4u)t + (v4u)(__builtin_convertvector(t, v4f) > q) + bias;
        const int ok = fin[0] & fin[1] & fin[2];
        out |= (u >> FB) & (v4u)(v4i){ok, ok, ok, 0};
        uint64_t key = ((uint64_t)u[0] << (2 * FB)) | ((uint64_t)u[1] << FB) | (uint64_t)u[2];
        key = ok ? key : EMPTY_KEY;
        POINT(i, rec, key);
    }
#undef POINT
    sbvi_flush_row(row, sx, sy, sz, cnt, fm == SBVI_F_COLOR, &c0, &c1, &c2, &c3);
    return (out[0] | out[1] | out[2] | out[3]) ? SBVI_HASH_FULL : SBV_OK;
}

int sbvi_accumulate_direct(job_t *job, sbvi_hstate *hs, int fm) {
    if (fm == SBVI_F_COLOR) return accumulate_portable(job, hs, SBVI_F_COLOR);
    return accumulate_portable(job, hs, SBVI_F_XYZ);
}
#endif /* SBV_SSE2 */
