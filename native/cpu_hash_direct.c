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
#include <emmintrin.h>

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

/* cin: the colour is the 4 bytes right after z, so it is lane 3 of the 16-byte loads. */
static inline AI int pass(job_t *job, sbvi_hstate *hs, const int fm, const int packed, const int cin) {
    const sbv_cloud *in = job->in;
    const size_t n = in->points, stride = job->stride;
    const sbv_plan *pl = &job->plan;
    uint32_t col_off = 0;
    for (size_t f = 0; f < in->n_fields; f++)
        if (in->fields[f].role < SBV_ROLE_X) col_off = in->fields[f].offset;
    /* groups of four while every 16-byte load stays inside the cloud */
    const size_t safe = sbvi_load16_points(job);
    sbv_acc *const spare = hs->rows + hs->limit * hs->w; /* dropped points: summed, not written */
    sbv_acc *row = spare;
    uint64_t cur = EMPTY_KEY;
    const __m128i zi = _mm_setzero_si128();
    __m128d sxy = _mm_setzero_pd(), sz = _mm_setzero_pd();
    int64_t cnt = 0;
    __m128i col = zi;  /* colour channel sums since the last flush, 32-bit lanes */
    size_t run = 0;    /* points in col: flushed before 2^24 of them (no lane overflow) */
    __m128i out = zi;
    const __m128 V = _mm_set1_ps(pl->voxel_f);
    uint64_t k[4];
#define OUT_OF_RANGE() (_mm_movemask_epi8(_mm_cmpeq_epi32(out, zi)) != 0xffff)
#define FLUSH()                                                                                   \
    do {                                                                                          \
        _mm_storeu_pd(&row[0].d, sxy);                                                            \
        _mm_store_sd(&row[2].d, sz);                                                              \
        row[3].i = cnt;                                                                           \
        if (fm == SBVI_F_COLOR) {                                                                 \
            uint32_t c_[4];                                                                       \
            _mm_storeu_si128((__m128i *)(void *)c_, col);                                         \
            row[4].i += c_[0];                                                                    \
            row[5].i += c_[1];                                                                    \
            row[6].i += c_[2];                                                                    \
            row[7].i += c_[3];                                                                    \
            col = zi;                                                                             \
            run = 0;                                                                              \
        }                                                                                         \
    } while (0)
#define SWITCH(KEY, IDX)                                                                          \
    do {                                                                                          \
        FLUSH();                                                                                  \
        if ((KEY) == EMPTY_KEY) {                                                                 \
            row = spare;                                                                          \
        } else {                                                                                  \
            const size_t before_ = hs->m;                                                         \
            const int64_t v_ = sbvi_voxel_id(hs, (KEY));                                          \
            if (v_ < 0 || (hs->m != before_ &&                                                    \
                           (sbvi_projected_over(hs, (IDX) + 1, n) || OUT_OF_RANGE())))            \
                return SBVI_HASH_FULL;                                                            \
            row = hs->rows + (size_t)v_ * hs->w;                                                  \
        }                                                                                         \
        cur = (KEY);                                                                              \
        sxy = _mm_loadu_pd(&row[0].d);                                                            \
        sz = _mm_load_sd(&row[2].d);                                                              \
        cnt = row[3].i;                                                                           \
    } while (0)
#define ADD(R, REC)                                                                               \
    do {                                                                                          \
        sxy = _mm_add_pd(sxy, _mm_cvtps_pd(R));                                                   \
        sz = _mm_add_sd(sz, _mm_cvtps_pd(_mm_movehl_ps(R, R)));                                   \
        cnt++;                                                                                    \
        if (fm == SBVI_F_COLOR) {                                                                 \
            int32_t w_;                                                                           \
            memcpy(&w_, (REC) + col_off, 4);                                                      \
            const __m128i b_ = _mm_unpacklo_epi8(_mm_cvtsi32_si128(w_), zi);                     \
            col = _mm_add_epi32(col, _mm_unpacklo_epi16(b_, zi));                                 \
        }                                                                                         \
    } while (0)
    const unsigned char *rec = job->data;
    size_t i = 0;
    for (; i + 4 <= safe; i += 4, rec += 4 * stride) {
        __m128 r[4], X, Y, Z;
        sbvi_load4(rec, stride, pl, packed, r, &X, &Y, &Z);
        keys4(X, Y, Z, V, &out, k);
        if (fm == SBVI_F_COLOR && (run += 4) >= ((size_t)1 << 24)) FLUSH();
        if (k[0] == cur && k[1] == cur && k[2] == cur && k[3] == cur) {
            if (cur == EMPTY_KEY) { /* dropped points: only their count is used */
                cnt += 4;
                continue;
            }
            if (fm == SBVI_F_COLOR && cin) {
                /* x, y, z one point at a time; the four colours, already loaded as lane 3 of
                 * r[], summed per channel in 16-bit lanes (4 * 255 fits) */
                for (int j = 0; j < 4; j++) {
                    sxy = _mm_add_pd(sxy, _mm_cvtps_pd(r[j]));
                    sz = _mm_add_sd(sz, _mm_cvtps_pd(_mm_movehl_ps(r[j], r[j])));
                }
                cnt += 4;
                const __m128i c4 = _mm_castps_si128(
                    _mm_movehl_ps(_mm_unpackhi_ps(r[2], r[3]), _mm_unpackhi_ps(r[0], r[1])));
                const __m128i s2 = _mm_add_epi16(_mm_unpacklo_epi8(c4, zi), _mm_unpackhi_epi8(c4, zi));
                col = _mm_add_epi32(col, _mm_unpacklo_epi16(_mm_add_epi16(s2, _mm_srli_si128(s2, 8)), zi));
                continue;
            }
            for (int j = 0; j < 4; j++) ADD(r[j], rec + (size_t)j * stride);
            continue;
        }
        for (int j = 0; j < 4; j++) {
            if (k[j] != cur) SWITCH(k[j], i + (size_t)j);
            if (cur == EMPTY_KEY)
                cnt++;
            else
                ADD(r[j], rec + (size_t)j * stride);
        }
    }
    for (; i < n; i++, rec += stride) { /* the last points, one at a time */
        float x, y, z;
        memcpy(&x, rec + pl->x_off, 4);
        memcpy(&y, rec + pl->y_off, 4);
        memcpy(&z, rec + pl->z_off, 4);
        const __m128 r = _mm_setr_ps(x, y, z, 0.0f);
        keys4(_mm_set1_ps(x), _mm_set1_ps(y), _mm_set1_ps(z), V, &out, k);
        if (k[0] != cur) SWITCH(k[0], i);
        ADD(r, rec);
    }
    FLUSH();
#undef ADD
#undef SWITCH
#undef FLUSH
    return OUT_OF_RANGE() ? SBVI_HASH_FULL : SBV_OK;
#undef OUT_OF_RANGE
}

int sbvi_accumulate_direct(job_t *job, sbvi_hstate *hs, int fm) {
    const int packed = job->plan.xyz_packed;
    if (fm == SBVI_F_COLOR) {
        uint32_t col_off = 0;
        for (size_t f = 0; f < job->in->n_fields; f++)
            if (job->in->fields[f].role < SBV_ROLE_X) col_off = job->in->fields[f].offset;
        if (packed && col_off == job->plan.x_off + 12) return pass(job, hs, SBVI_F_COLOR, 1, 1);
        return packed ? pass(job, hs, SBVI_F_COLOR, 1, 0) : pass(job, hs, SBVI_F_COLOR, 0, 0);
    }
    return packed ? pass(job, hs, SBVI_F_XYZ, 1, 0) : pass(job, hs, SBVI_F_XYZ, 0, 0);
}
