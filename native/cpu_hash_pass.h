/*
 * cpu_hash_pass.h - the body of the hash path's direct pass (cpu_hash_direct.c includes it
 * twice: four points per group with SSE2, and eight per group, keys in AVX2 registers, in a
 * region compiled for AVX2 and called only where the CPU has it). PASS_NAME and PASS_LANES
 * are set by the includer; keys4/keys8, AI and the macros it needs come from there.
 */
/* cin: the colour is the 4 bytes right after z, so it is lane 3 of the 16-byte loads. */
static inline AI int PASS_NAME(job_t *job, sbvi_hstate *hs, const int fm, const int packed, const int cin) {
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
#if PASS_LANES == 8
    const __m256 V8 = _mm256_set1_ps(pl->voxel_f);
#endif
    uint64_t k[PASS_LANES];
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
    for (; i + PASS_LANES <= safe; i += PASS_LANES, rec += PASS_LANES * stride) {
        __m128 rr[PASS_LANES];
#if PASS_LANES == 8
        (void)packed; /* eight-point groups: packed x, y, z only */
        keys8(rec, stride, pl->x_off, V8, &out, rr, k);
#else
        __m128 X, Y, Z;
        sbvi_load4(rec, stride, pl, packed, rr, &X, &Y, &Z);
        keys4(X, Y, Z, V, &out, k);
#endif
        if (fm == SBVI_F_COLOR && (run += PASS_LANES) >= ((size_t)1 << 24)) FLUSH();
        for (size_t h = 0; h < PASS_LANES; h += 4) { /* four points at a time */
        const uint64_t *const kh = k + h;
        const __m128 *const r = rr + h;
        const unsigned char *const rech = rec + h * stride;
        const size_t ih = i + h;
        if (kh[0] == cur && kh[1] == cur && kh[2] == cur && kh[3] == cur) {
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
            for (int j = 0; j < 4; j++) ADD(r[j], rech + (size_t)j * stride);
            continue;
        }
        for (int j = 0; j < 4; j++) {
            if (kh[j] != cur) SWITCH(kh[j], ih + (size_t)j);
            if (cur == EMPTY_KEY)
                cnt++;
            else
                ADD(r[j], rech + (size_t)j * stride);
        }
        }
    }
    for (; i < n; i++, rec += stride) { /* the last points, one at a time */
        float x, y, z;
        memcpy(&x, rec + pl->x_off, 4);
        memcpy(&y, rec + pl->y_off, 4);
        memcpy(&z, rec + pl->z_off, 4);
        const __m128 r1 = _mm_setr_ps(x, y, z, 0.0f);
        keys4(_mm_set1_ps(x), _mm_set1_ps(y), _mm_set1_ps(z), V, &out, k);
        if (k[0] != cur) SWITCH(k[0], i);
        ADD(r1, rec);
    }
    FLUSH();
#undef ADD
#undef SWITCH
#undef FLUSH
    return OUT_OF_RANGE() ? SBVI_HASH_FULL : SBV_OK;
#undef OUT_OF_RANGE
}

