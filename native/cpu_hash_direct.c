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
#include <immintrin.h>

#include "cpu_internal.h"

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

int sbvi_accumulate_direct(job_t *job, sbvi_hstate *hs, int fm) {
    const int packed = job->plan.xyz_packed;
    const int avx2 = packed && has_avx2();
    if (fm == SBVI_F_COLOR) {
        uint32_t col_off = 0;
        for (size_t f = 0; f < job->in->n_fields; f++)
            if (job->in->fields[f].role < SBV_ROLE_X) col_off = job->in->fields[f].offset;
        const int cin = packed && col_off == job->plan.x_off + 12;
        if (avx2) return avx2_color(job, hs, cin);
        if (cin) return pass_sse(job, hs, SBVI_F_COLOR, 1, 1);
        return packed ? pass_sse(job, hs, SBVI_F_COLOR, 1, 0) : pass_sse(job, hs, SBVI_F_COLOR, 0, 0);
    }
    if (avx2) return avx2_xyz(job, hs);
    return packed ? pass_sse(job, hs, SBVI_F_XYZ, 1, 0) : pass_sse(job, hs, SBVI_F_XYZ, 0, 0);
}
