/*
 * cpu_sorted.c - the CPU kernel's main path: radix-sort packed 8-byte items.
 *
 * Each finite point becomes one uint64: key offsets (kx - kxmin, ky - kymin, kz - kzmin)
 * packed in the high bits, point index in the low bits. Where consecutive points share a key
 * (organized frames, lidar sweeps at fine voxels: ~1.5-2 points a run) one item stands for a
 * whole run: its first point's index, and its length in the lowest bits (job->lb). Then, each
 * step split over the job's threads:
 *
 *   B  pack the items, histogram of their top digit (up to 11 key bits);
 *   C  stable scatter into buckets by that digit (MSD pass);
 *   D  each thread LSD-radix-sorts a contiguous run of buckets on the remaining key bits
 *      only (a stable sort: the index bits keep each voxel's points in input order) and
 *      counts distinct keys;
 *   E  each thread reduces its voxels straight into the output at its prefix offset,
 *      prefetching the records it is about to gather (a run's records one after another).
 *
 * Why not a hash table: that costs a cache miss per point; these passes stream.
 */
#include "cpu_internal.h"

static inline uint64_t pack(const job_t *job, int64_t kx, int64_t ky, int64_t kz, size_t i) {
    uint64_t ux = (uint64_t)kx - (uint64_t)job->kmin[0];
    uint64_t uy = (uint64_t)ky - (uint64_t)job->kmin[1];
    uint64_t uz = (uint64_t)kz - (uint64_t)job->kmin[2];
    uint64_t key = shl(shl(ux, job->by) | uy, job->bz) | uz;
    return shl(key, job->ib) | shl((uint64_t)i, job->lb);
}

/* Run-length items (job->lb > 0): consecutive finite points with the same key become one item
 * whose index bits hold the run's first point and whose low lb bits hold its length - 1. A
 * dropped point ends a run, and so does an index that is a multiple of 2^lb (a run never
 * outgrows its length field, with no counter carried from point to point). Per-point items
 * are the same format with length 1, so both kinds may mix in one sort. */

/* Items of points [lo, hi) with float32 keys that fit int32 (job->keys_i32) from dst on, top
 * digits counted alternately in ha and hb; returns the end. rle: one item per run of equal
 * keys (then job->lb > 0), else one per point. */
static inline __attribute__((always_inline)) uint64_t *pack_i32(const job_t *job, size_t lo, size_t hi,
                                                                uint64_t *dst, uint32_t *ha, uint32_t *hb,
                                                                const int rle, uint32_t *key_or) {
    const size_t stride = job->stride;
    const int top_shift = job->top_shift; /* < 64: kb + ib < 64 here */
    const int64_t kmin0 = job->kmin[0], kmin1 = job->kmin[1], kmin2 = job->kmin[2];
    const int by = job->by, bz = job->bz, ib = job->ib, lb = job->lb;
    const size_t lm = ((size_t)1 << lb) - 1;
    const float v = job->plan.voxel_f;
    const uint32_t xo = job->plan.x_off, yo = job->plan.y_off, zo = job->plan.z_off;
    const unsigned char *rec = job->data + lo * stride;
    /* one SSE division for the three axes (divss is the slowest step of a scalar key) */
    typedef float v4f __attribute__((vector_size(16)));
    typedef uint32_t v4u __attribute__((vector_size(16)));
    typedef int32_t v4i __attribute__((vector_size(16)));
    const v4f vv = {v, v, v, 1.0f};
    const v4u km = {(uint32_t)kmin0, (uint32_t)kmin1, (uint32_t)kmin2, 0};
    /* Key offsets are masked to their fields, so an item stays well formed even when a point
     * lies outside a guessed key frame (job->guessed); the OR of the unmasked offsets shows
     * whether one did. */
    const uint32_t bx = (uint32_t)(job->kb - by - bz);
    const v4u kmask = {(uint32_t)(((uint64_t)1 << bx) - 1), (uint32_t)(((uint64_t)1 << by) - 1),
                       (uint32_t)(((uint64_t)1 << bz) - 1), 0};
    v4u kor = {0, 0, 0, 0};
    uint64_t cur = 0, prev = UINT64_MAX; /* rle: the open run's item; the previous point's (none) */
    size_t i = lo;
/* the item of point I (record REC), or DROP and leave the enclosing do-while */
#define ITEM1(I, REC, ITEM, DROP)                                                                 \
    float x, y, z;                                                                                \
    memcpy(&x, (REC) + xo, 4);                                                                    \
    memcpy(&y, (REC) + yo, 4);                                                                    \
    memcpy(&z, (REC) + zo, 4);                                                                    \
    if (!(isfinite(x) && isfinite(y) && isfinite(z))) {                                           \
        DROP;                                                                                     \
        break;                                                                                    \
    }                                                                                             \
    const v4f q = (v4f){x, y, z, 0.0f} / vv;                                                      \
    const v4i tr = __builtin_convertvector(q, v4i);                                               \
    const v4u uo = (v4u)tr + (v4u)(__builtin_convertvector(tr, v4f) > q) - km;                    \
    kor |= uo;                                                                                    \
    const v4u u = uo & kmask;                                                                     \
    const uint64_t ITEM = ((((uint64_t)u[0] << by | u[1]) << bz | u[2]) << ib) | ((uint64_t)(I) << lb)
/* item X, which starts a run when ST is 1: the open run is written (a store that is overwritten
 * when no run starts) and X opens the next, else the open run grows by one */
#define EMIT(X, ST)                                                                               \
    do {                                                                                          \
        const uint64_t st_ = (ST);                                                                \
        *dst = cur;                                                                               \
        dst += st_;                                                                               \
        ha[((X) >> top_shift)] += (uint32_t)st_;                                                  \
        uint32_t *sw_ = ha;                                                                       \
        ha = hb;                                                                                  \
        hb = sw_;                                                                                 \
        cur = SBV_UNPREDICTABLE(st_) ? (X) : cur + 1;                                             \
    } while (0)
/* a new run where the key changes or the index is a multiple of 2^lb */
#define RUN(X, I)                                                                                 \
    do {                                                                                          \
        const uint64_t x_ = (X);                                                                  \
        const uint64_t start_ = (((x_ ^ prev) >> ib) != 0) | (((I) & lm) == 0);                   \
        prev = x_;                                                                                \
        EMIT(x_, start_);                                                                         \
    } while (0)
#define ONE(I, REC)                                                                               \
    do {                                                                                          \
        ITEM1(I, REC, item, if (rle) prev = UINT64_MAX);                                          \
        if (rle) {                                                                                \
            RUN(item, I);                                                                         \
        } else {                                                                                  \
            *dst++ = item;                                                                        \
            ha[(item >> top_shift)]++;                                                           \
            uint32_t *sw = ha;                                                                    \
            ha = hb;                                                                              \
            hb = sw;                                                                              \
        }                                                                                         \
    } while (0)
    if (rle) { /* the first finite point opens the first run */
        for (; i < hi; i++, rec += stride) {
            int found = 0;
            do {
                ITEM1(i, rec, item, (void)0);
                cur = prev = item;
                ha[(item >> top_shift)]++;
                found = 1;
            } while (0);
            if (found) break;
        }
        if (i == hi) {
            for (int a = 0; a < 3; a++) key_or[a] = kor[a];
            return dst;
        }
        i++;
        rec += stride;
    }
#if SBV_SSE2
    /* Four points at a time (sbvi_load4; keys and items in SSE registers, the same formula);
     * a group with a dropped point goes point by point. */
    const size_t safe = sbvi_load16_points(job);
    const size_t hi4 = hi < safe ? hi : safe;
    const __m128 V = _mm_set1_ps(v);
    const __m128i KX = _mm_set1_epi32((int)kmin0), KY = _mm_set1_epi32((int)kmin1);
    const __m128i KZ = _mm_set1_epi32((int)kmin2), zi = _mm_setzero_si128();
    const __m128i shx = _mm_cvtsi32_si128(by + bz + ib), shy = _mm_cvtsi32_si128(bz + ib);
    const __m128i shz = _mm_cvtsi32_si128(ib);
    const __m128i MX = _mm_set1_epi32((int)kmask[0]), MY = _mm_set1_epi32((int)kmask[1]);
    const __m128i MZ = _mm_set1_epi32((int)kmask[2]);
    __m128i OX = zi, OY = zi, OZ = zi;
    for (; i + 4 <= hi4; i += 4, rec += 4 * stride) {
        __m128 r[4], X, Y, Z;
        sbvi_load4(rec, stride, &job->plan, job->plan.xyz_packed, r, &X, &Y, &Z);
        if (_mm_movemask_ps(sbvi_finite4(X, Y, Z)) != 15) {
            for (size_t j = 0; j < 4; j++) ONE(i + j, rec + j * stride);
            continue;
        }
#define UKEY(P, K)                                                                                \
    _mm_sub_epi32(_mm_add_epi32(_mm_cvttps_epi32(_mm_div_ps(P, V)),                               \
                                _mm_castps_si128(_mm_cmpgt_ps(                                    \
                                    _mm_cvtepi32_ps(_mm_cvttps_epi32(_mm_div_ps(P, V))), _mm_div_ps(P, V)))), \
                  K)
        const __m128i oux = UKEY(X, KX), ouy = UKEY(Y, KY), ouz = UKEY(Z, KZ);
#undef UKEY
        OX = _mm_or_si128(OX, oux);
        OY = _mm_or_si128(OY, ouy);
        OZ = _mm_or_si128(OZ, ouz);
        const __m128i ux = _mm_and_si128(oux, MX), uy = _mm_and_si128(ouy, MY);
        const __m128i uz = _mm_and_si128(ouz, MZ);
#define ITEMS(UNPACK, I0)                                                                         \
    _mm_or_si128(_mm_or_si128(_mm_sll_epi64(UNPACK(ux, zi), shx), _mm_sll_epi64(UNPACK(uy, zi), shy)), \
                 _mm_or_si128(_mm_sll_epi64(UNPACK(uz, zi), shz),                                 \
                              _mm_set_epi64x((long long)(((uint64_t)(I0) + 1) << lb),             \
                                             (long long)((uint64_t)(I0) << lb))))
        const __m128i i01 = ITEMS(_mm_unpacklo_epi32, i), i23 = ITEMS(_mm_unpackhi_epi32, i + 2);
#undef ITEMS
        if (rle) {
            /* lanes that start a run: key unlike the lane before (lanes 1-3 compared in the
             * vectors, lane 0 against the previous point) or an index that is a multiple of
             * 2^lb; a group of four starts (shuffled or sparse clouds) is stored whole */
            const __m128i eq = _mm_and_si128(_mm_and_si128(_mm_cmpeq_epi32(ux, _mm_slli_si128(ux, 4)),
                                                           _mm_cmpeq_epi32(uy, _mm_slli_si128(uy, 4))),
                                             _mm_cmpeq_epi32(uz, _mm_slli_si128(uz, 4)));
            const uint64_t x0 = (uint64_t)_mm_cvtsi128_si64(i01);
            const uint64_t x3 = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(i23, i23));
            const unsigned cont = ((unsigned)_mm_movemask_ps(_mm_castsi128_ps(eq)) & 14u) |
                                  (unsigned)(((x0 ^ prev) >> ib) == 0);
            const unsigned starts = (~cont | (1u << ((0 - i) & lm))) & 15u;
            prev = x3;
            const uint64_t xs[4] = {x0, (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(i01, i01)),
                                    (uint64_t)_mm_cvtsi128_si64(i23), x3};
            for (int j = 0; j < 4; j++) EMIT(xs[j], (starts >> j) & 1u);
        } else {
            _mm_storeu_si128((__m128i *)(void *)dst, i01);
            _mm_storeu_si128((__m128i *)(void *)(dst + 2), i23);
            ha[(dst[0] >> top_shift)]++;
            hb[(dst[1] >> top_shift)]++;
            ha[(dst[2] >> top_shift)]++;
            hb[(dst[3] >> top_shift)]++;
            dst += 4;
        }
    }
    {
        uint32_t o[3][4];
        _mm_storeu_si128((__m128i *)(void *)o[0], OX);
        _mm_storeu_si128((__m128i *)(void *)o[1], OY);
        _mm_storeu_si128((__m128i *)(void *)o[2], OZ);
        for (int a = 0; a < 3; a++) kor[a] |= o[a][0] | o[a][1] | o[a][2] | o[a][3];
    }
#endif
    for (; i < hi; i++, rec += stride) ONE(i, rec);
#undef ONE
#undef RUN
#undef EMIT
#undef ITEM1
    if (rle) *dst++ = cur; /* the last run */
    for (int a = 0; a < 3; a++) key_or[a] = kor[a];
    return dst;
}

/* Items of points [lo, hi) from dst on, their top-digit counts in hist; returns the end. */
static uint64_t *pack_block(job_t *job, size_t lo, size_t hi, uint64_t *dst, size_t *hist,
                            uint32_t *key_or) {
    memset(hist, 0, job->nbuckets * sizeof *hist);
    key_or[0] = key_or[1] = key_or[2] = 0;
    const size_t stride = job->stride;
    const int top_shift = job->top_shift;
    const int64_t kmin0 = job->kmin[0], kmin1 = job->kmin[1], kmin2 = job->kmin[2];
    const int by = job->by, bz = job->bz, ib = job->ib, lb = job->lb;
    if (job->plan.xyz_f32 && job->kb + ib < 64 && hi - lo < UINT32_MAX) {
        /* Four-byte loads (a 12-byte memcpy went through the stack and stalled), and two
         * histograms used alternately: neighbouring points share a top digit, and a single
         * counter would chain every increment through a store and a reload. */
        uint32_t h2[2][1 << SBV_TOP_BITS]; /* 16 KB */
        memset(h2[0], 0, job->nbuckets * sizeof h2[0][0]);
        memset(h2[1], 0, job->nbuckets * sizeof h2[1][0]);
        if (job->keys_i32) {
            dst = job->lb ? pack_i32(job, lo, hi, dst, h2[0], h2[1], 1, key_or)
                          : pack_i32(job, lo, hi, dst, h2[0], h2[1], 0, key_or);
        } else {
            uint32_t *h2a = h2[0], *h2b = h2[1];
            const float v = job->plan.voxel_f;
            const uint32_t xo = job->plan.x_off, yo = job->plan.y_off, zo = job->plan.z_off;
            const unsigned char *rec = job->data + lo * stride;
            for (size_t i = lo; i < hi; i++, rec += stride) {
                float x, y, z;
                memcpy(&x, rec + xo, 4);
                memcpy(&y, rec + yo, 4);
                memcpy(&z, rec + zo, 4);
                if (!(isfinite(x) && isfinite(y) && isfinite(z))) continue;
                uint64_t ux = (uint64_t)(floor_i64(x / v) - kmin0);
                uint64_t uy = (uint64_t)(floor_i64(y / v) - kmin1);
                uint64_t uz = (uint64_t)(floor_i64(z / v) - kmin2);
                uint64_t item = ((((ux << by) | uy) << bz | uz) << ib) | ((uint64_t)i << lb);
                *dst++ = item;
                h2a[shr(item, top_shift)]++;
                uint32_t *sw = h2a;
                h2a = h2b;
                h2b = sw;
            }
        }
        for (size_t b = 0; b < job->nbuckets; b++) hist[b] = (size_t)h2[0][b] + h2[1][b];
        return dst;
    }
    for (size_t i = lo; i < hi; i++) {
        double p[3];
        if (!load_xyz(job, job->data + i * stride, &p[0], &p[1], &p[2])) continue;
        uint64_t item = pack(job, (int64_t)key_of(job, p[0]), (int64_t)key_of(job, p[1]),
                             (int64_t)key_of(job, p[2]), i);
        *dst++ = item;
        hist[shr(item, top_shift)]++;
    }
    return dst;
}

/* Blocks of points, each with its own histogram row and item range, taken by whichever
 * thread is free; bucket-major, block-minor offsets then keep the scatter stable. */
static void phase_pack(job_t *job, int t) {
    (void)t;
    for (size_t b; (b = sbvi_claim(job, job->nblocks)) != SIZE_MAX;) {
        uint64_t *end = pack_block(job, sbvi_block_lo(job, b), sbvi_block_lo(job, b + 1),
                                   job->items + job->finite_base[b], job->hist + b * job->nbuckets,
                                   job->key_or[b]);
        job->block_end[b] = (size_t)(end - job->items);
    }
}

static void phase_scatter(job_t *job, int t) {
    (void)t;
    uint64_t *tmp = job->tmp;
    const int top_shift = job->top_shift;
    for (size_t b; (b = sbvi_claim(job, job->nblocks)) != SIZE_MAX;) {
        size_t *offs = job->hist + b * job->nbuckets;
        const uint64_t *src = job->items + job->finite_base[b];
        const uint64_t *end = job->items + job->block_end[b];
        for (; src < end; src++) tmp[offs[shr(*src, top_shift)]++] = *src;
    }
}

/* One LSD pass of a digit (width bits at shift sh) from src into dst, offsets from counts c. */
static inline void radix_pass(const uint64_t *src, uint64_t *dst, size_t n, int sh, int width, uint32_t *c) {
    const uint64_t mask = ((uint64_t)1 << width) - 1;
    uint32_t sum = 0;
    for (size_t d = 0; d <= mask; d++) {
        const uint32_t k = c[d];
        c[d] = sum;
        sum += k;
    }
    for (size_t i = 0; i < n; i++) dst[c[(src[i] >> sh) & mask]++] = src[i];
}

/* radix_bucket for at most two digits (up to 18 bits), 32-bit counts, both histograms from
 * one read with the digit extraction unrolled; the result ends in a. */
static void radix_two(uint64_t *a, uint64_t *b, size_t n, int lo_bit, int bits) {
    const int w0 = bits > 9 ? (bits + 1) / 2 : bits, w1 = bits - w0;
    const int s0 = lo_bit, s1 = lo_bit + w0;
    const uint64_t m0 = ((uint64_t)1 << w0) - 1, m1 = ((uint64_t)1 << w1) - 1;
    uint32_t c0[1 << 9], c1[1 << 9];
    memset(c0, 0, (m0 + 1) * sizeof c0[0]);
    memset(c1, 0, (m1 + 1) * sizeof c1[0]);
    for (size_t i = 0; i < n; i++) {
        const uint64_t v = a[i];
        c0[(v >> s0) & m0]++;
        c1[(v >> s1) & m1]++;
    }
    const int do0 = c0[(a[0] >> s0) & m0] != n, do1 = w1 > 0 && c1[(a[0] >> s1) & m1] != n;
    if (do0 && do1) {
        radix_pass(a, b, n, s0, w0, c0);
        radix_pass(b, a, n, s1, w1, c1);
    } else if (do0 || do1) {
        radix_pass(a, b, n, do0 ? s0 : s1, do0 ? w0 : w1, do0 ? c0 : c1);
        memcpy(a, b, n * sizeof *a);
    }
}

/* Stable LSD radix sort of a[0..n) on bits [lo_bit, lo_bit + bits), using b as scratch.
 * Leaves the result in a. */
static void radix_bucket(uint64_t *a, uint64_t *b, size_t n, int lo_bit, int bits) {
    if (n < 2 || bits <= 0) return;
    if (n <= SBV_SMALL_BUCKET) {
        /* items are unique (index in the low bits) and already in index order: sorting the
         * whole value is the same as a stable sort on the key bits. */
        for (size_t i = 1; i < n; i++) {
            uint64_t v = a[i];
            size_t j = i;
            for (; j > 0 && a[j - 1] > v; j--) a[j] = a[j - 1];
            a[j] = v;
        }
        return;
    }
    /* Digits of at most 9 bits, as even as possible (17 key bits: 9 + 8, two passes rather
     * than 8 + 8 + 1), and every digit's histogram from one read. */
    enum { MAXD = 8, MAXW = 9 };
    const int passes = (bits + MAXW - 1) / MAXW;
    if (passes <= 2 && n < UINT32_MAX) {
        radix_two(a, b, n, lo_bit, bits);
        return;
    }
    int width[MAXD], shift[MAXD];
    for (int p = 0, at = lo_bit, left = bits; p < passes; p++) {
        width[p] = (left + (passes - p) - 1) / (passes - p);
        shift[p] = at;
        at += width[p];
        left -= width[p];
    }
    size_t count[MAXD][1 << MAXW];
    for (int p = 0; p < passes; p++) memset(count[p], 0, ((size_t)1 << width[p]) * sizeof count[p][0]);
    for (size_t i = 0; i < n; i++)
        for (int p = 0; p < passes; p++)
            count[p][(a[i] >> shift[p]) & (((uint64_t)1 << width[p]) - 1)]++;
    uint64_t *src = a, *dst = b;
    for (int p = 0; p < passes; p++) {
        const uint64_t mask = ((uint64_t)1 << width[p]) - 1;
        const int sh = shift[p];
        size_t *c = count[p];
        if (c[(src[0] >> sh) & mask] == n) continue; /* one digit value: nothing to do */
        size_t sum = 0;
        for (size_t d = 0; d <= mask; d++) {
            const size_t k = c[d];
            c[d] = sum;
            sum += k;
        }
        for (size_t i = 0; i < n; i++) dst[c[(src[i] >> sh) & mask]++] = src[i];
        uint64_t *swap = src;
        src = dst;
        dst = swap;
    }
    if (src != a) memcpy(a, src, n * sizeof *a);
}

/* A bucket of at most this many items sorts through a buffer of its thread's that stays in
 * cache, not through its slice of job->items (dead after the scatter): that slice would be
 * read from memory and written back only to be read once more. */
#define SBV_SORT_LOCAL 4096

static void sort_run(job_t *job, size_t r) {
    static _Thread_local uint64_t local[SBV_SORT_LOCAL]; /* 32 KB */
    size_t voxels = 0;
    const int ib = job->ib;
    const int rest = job->top_shift - ib;
    for (size_t bkt = job->bucket_range[r]; bkt < job->bucket_range[r + 1]; bkt++) {
        size_t s = job->bucket_at[bkt], e = job->bucket_at[bkt + 1];
        if (s == e) continue;
        uint64_t *a = job->tmp + s;
        radix_bucket(a, e - s <= SBV_SORT_LOCAL ? local : job->items + s, e - s, ib, rest);
        voxels++;
        for (size_t i = 1; i < e - s; i++) voxels += shr(a[i], ib) != shr(a[i - 1], ib);
    }
    job->voxels[r] = voxels;
}

static void phase_sort(job_t *job, int t) {
    (void)t;
    for (size_t r; (r = sbvi_claim(job, job->nruns)) != SIZE_MAX;) sort_run(job, r);
}

static void reduce_run(job_t *job, size_t r) {
    const sbv_cloud *in = job->in;
    const int ib = job->ib;
    unsigned char *out = job->out + job->out_base[r] * job->stride;
    size_t s = job->bucket_at[job->bucket_range[r]];
    const size_t end = job->bucket_at[job->bucket_range[r + 1]];
    const uint64_t *a = job->tmp;
    const uint64_t mask = job->idx_mask;
    const unsigned char *data = job->data;
    const size_t stride = job->stride;
    /* Records are gathered in key order, i.e. from scattered input positions: prefetch a
     * few dozen ahead so the cache misses overlap instead of queueing. */
    size_t pf = s;
    /* the common lidar layout (float32 x, y, z and nothing else to average): no field loop */
    const int xyz_only = job->plan.xyz_packed && in->n_fields == 3;
    const uint32_t x_off = job->plan.x_off;
    const sbv_plan *pl = &job->plan;
    uint32_t col_off = UINT32_MAX; /* set when the fields are float32 x, y, z and one colour */
    if (pl->xyz_f32 && in->n_fields == 4)
        for (size_t f = 0; f < 4; f++)
            if (in->fields[f].role == SBV_ROLE_COLOR) col_off = in->fields[f].offset;
    while (s < end) {
        const uint64_t key = shr(a[s], ib);
        size_t e = s + 1;
        while (e < end && shr(a[e], ib) == key) e++;
        const size_t pf_end = e + SBV_PREFETCH < end ? e + SBV_PREFETCH : end;
        for (; pf < pf_end; pf++) {
            const unsigned char *rec = data + (a[pf] & mask) * stride;
            __builtin_prefetch(rec);
            __builtin_prefetch(rec + stride - 1);
        }
        if (xyz_only) {
            double sx = 0.0, sy = 0.0, sz = 0.0;
            for (size_t j = s; j < e; j++) {
                const unsigned char *rec = data + (a[j] & mask) * stride + x_off;
                float x, y, z; /* 4-byte loads: a 12-byte memcpy stalls through the stack */
                memcpy(&x, rec, 4);
                memcpy(&y, rec + 4, 4);
                memcpy(&z, rec + 8, 4);
                sx += (double)x;
                sy += (double)y;
                sz += (double)z;
            }
            const double c = (double)(e - s);
            float m[3] = {(float)(sx / c), (float)(sy / c), (float)(sz / c)};
            memset(out, 0, stride);
            memcpy(out + x_off, m, 12);
        } else if (col_off != UINT32_MAX) {
            /* float32 x, y, z and one packed colour (RGB-D frames): one gather per point */
            double sx = 0.0, sy = 0.0, sz = 0.0;
            int64_t c[4] = {0, 0, 0, 0};
            for (size_t j = s; j < e; j++) {
                const unsigned char *rec = data + (a[j] & mask) * stride;
                float x, y, z;
                memcpy(&x, rec + pl->x_off, 4);
                memcpy(&y, rec + pl->y_off, 4);
                memcpy(&z, rec + pl->z_off, 4);
                sx += (double)x;
                sy += (double)y;
                sz += (double)z;
                c[0] += rec[col_off];
                c[1] += rec[col_off + 1];
                c[2] += rec[col_off + 2];
                c[3] += rec[col_off + 3];
            }
            memset(out, 0, stride);
            sbv_store_float(out + pl->x_off, SBV_FLOAT32, sx, e - s);
            sbv_store_float(out + pl->y_off, SBV_FLOAT32, sy, e - s);
            sbv_store_float(out + pl->z_off, SBV_FLOAT32, sz, e - s);
            sbv_store_color(out + col_off, c, e - s);
        } else {
            sbv_reduce_voxel(data, stride, in->fields, in->n_fields, a + s, e - s, mask, out);
        }
        out += stride;
        s = e;
    }
}

/* reduce_run for run-length items (job->lb > 0; float32 x, y, z, alone or with one colour):
 * an item is (item & lm) + 1 consecutive records from index (item & mask) >> lb, summed in
 * that order, and a voxel's items are in index order, so every sum is the per-point one. */
static inline __attribute__((always_inline)) void reduce_runs(job_t *job, size_t r, const int xyz_only) {
    const sbv_cloud *in = job->in;
    const int ib = job->ib, lb = job->lb;
    unsigned char *out = job->out + job->out_base[r] * job->stride;
    size_t s = job->bucket_at[job->bucket_range[r]];
    const size_t end = job->bucket_at[job->bucket_range[r + 1]];
    const uint64_t *a = job->tmp;
    const uint64_t mask = job->idx_mask, lm = ((uint64_t)1 << lb) - 1;
    const unsigned char *data = job->data;
    const size_t stride = job->stride;
    const sbv_plan *pl = &job->plan;
    uint32_t col_off = 0;
    for (size_t f = 0; f < in->n_fields; f++)
        if (in->fields[f].role == SBV_ROLE_COLOR) col_off = in->fields[f].offset;
    size_t pf = s; /* prefetch: first and last record of the runs a few dozen items ahead */
    while (s < end) {
        const uint64_t key = shr(a[s], ib);
        size_t e = s + 1;
        while (e < end && shr(a[e], ib) == key) e++;
        const size_t pf_end = e + SBV_PREFETCH < end ? e + SBV_PREFETCH : end;
        for (; pf < pf_end; pf++) {
            const unsigned char *rec = data + ((a[pf] & mask) >> lb) * stride;
            __builtin_prefetch(rec);
            __builtin_prefetch(rec + ((a[pf] & lm) + 1) * stride - 1);
        }
        double sx = 0.0, sy = 0.0, sz = 0.0;
        int64_t c[4] = {0, 0, 0, 0};
        size_t count = 0;
        for (size_t j = s; j < e; j++) {
            const unsigned char *rec = data + ((a[j] & mask) >> lb) * stride;
            const size_t len = (size_t)(a[j] & lm) + 1;
            const unsigned char *last = rec + (len - 1) * stride;
            count += len;
            for (;; rec += stride) {
                float x, y, z; /* 4-byte loads: a 12-byte memcpy stalls through the stack */
                memcpy(&x, rec + pl->x_off, 4);
                memcpy(&y, rec + pl->y_off, 4);
                memcpy(&z, rec + pl->z_off, 4);
                sx += (double)x;
                sy += (double)y;
                sz += (double)z;
                if (!xyz_only) {
                    c[0] += rec[col_off];
                    c[1] += rec[col_off + 1];
                    c[2] += rec[col_off + 2];
                    c[3] += rec[col_off + 3];
                }
                if (rec == last) break;
            }
        }
        memset(out, 0, stride);
        sbv_store_float(out + pl->x_off, SBV_FLOAT32, sx, count);
        sbv_store_float(out + pl->y_off, SBV_FLOAT32, sy, count);
        sbv_store_float(out + pl->z_off, SBV_FLOAT32, sz, count);
        if (!xyz_only) sbv_store_color(out + col_off, c, count);
        out += stride;
        s = e;
    }
}

static void reduce_run_rle(job_t *job, size_t r) {
    if (job->in->n_fields == 3)
        reduce_runs(job, r, 1); /* a loop of its own: the colour sums' registers spill the rest */
    else
        reduce_runs(job, r, 0);
}

static void phase_reduce(job_t *job, int t) {
    (void)t;
    for (size_t r; (r = sbvi_claim(job, job->nruns)) != SIZE_MAX;) {
        if (job->lb)
            reduce_run_rle(job, r);
        else
            reduce_run(job, r);
    }
}

/* Points per run of equal keys, times 16: from 64 windows of 32 consecutive points spread
 * over the cloud (a dropped point ends a run). Lidar sweeps and depth frames at fine voxels:
 * ~1.4-2 points a run; shuffled or sparse clouds: ~1. */
static size_t run_length_x16(const job_t *job) {
    enum { WINDOWS = 64, WIDTH = 32 };
    const size_t n = job->in->points;
    size_t finite = 0, starts = 0;
    for (size_t w = 0; w < WINDOWS; w++) {
        size_t lo = (size_t)((unsigned __int128)n * w / WINDOWS);
        const size_t hi = lo + WIDTH < n ? lo + WIDTH : n;
        double prev[3] = {0.0, 0.0, 0.0};
        int live = 0;
        for (size_t i = lo; i < hi; i++) {
            double p[3];
            if (!load_xyz(job, job->data + i * job->stride, &p[0], &p[1], &p[2])) {
                live = 0;
                continue;
            }
            double k[3] = {key_of(job, p[0]), key_of(job, p[1]), key_of(job, p[2])};
            finite++;
            starts += !(live && k[0] == prev[0] && k[1] == prev[1] && k[2] == prev[2]);
            memcpy(prev, k, sizeof k);
            live = 1;
        }
    }
    return starts ? 16 * finite / starts : 0;
}

/* Steps B-E once bounds and key widths are known (job->kb, job->ib set). */
int sbvi_run_sorted(job_t *job, size_t nf, size_t *out_points, char *err, size_t err_len) {
#ifdef SBV_TIMING
    double sbv_t0 = sbv_now();
#endif
    job->top_bits = job->kb < SBV_TOP_BITS ? job->kb : SBV_TOP_BITS;
    job->keys_i32 = job->plan.xyz_f32;
    for (int a = 0; a < 3; a++) { /* every key and its truncation fit int32: vector keys */
        const int bits = a == 0 ? job->kb - job->by - job->bz : a == 1 ? job->by : job->bz;
        job->keys_i32 = job->keys_i32 && bits < 30 && job->kmin[a] >= -((int64_t)1 << 30) &&
                        job->kmin[a] + ((int64_t)1 << bits) <= ((int64_t)1 << 30);
    }
    /* Run-length items where the reduce reads runs (x, y, z only, or with one colour), the
     * keys are vector keys, the length field fits in the 64 bits and a sample says runs
     * average at least SBV_RUN_MIN_X16 / 16 points (fewer: the pack's extra work per point
     * costs more than the shorter scatter and sort save). */
    int runs = job->keys_i32 && job->kb + job->ib + SBV_RUN_BITS <= 63 &&
               (job->in->n_fields == 3 ? job->plan.xyz_packed : job->in->n_fields == 4);
    if (job->guessed && !job->keys_i32) return SBVI_GUESS_MISS; /* only vector keys check it */
    if (runs && job->in->n_fields == 4) {
        runs = 0;
        for (size_t f = 0; f < 4; f++) runs |= job->in->fields[f].role == SBV_ROLE_COLOR;
    }
    if (runs) {
        const size_t x16 = run_length_x16(job);
#ifdef SBV_TIMING
        fprintf(stderr, "points/run x16 %zu ", x16);
#endif
        runs = x16 >= SBV_RUN_MIN_X16;
    }
    job->lb = runs ? SBV_RUN_BITS : 0;
    job->ib += job->lb;
    job->idx_mask = job->ib >= 64 ? UINT64_MAX : ((uint64_t)1 << job->ib) - 1;
    job->top_shift = job->ib + job->kb - job->top_bits;
    job->nbuckets = (size_t)1 << job->top_bits;
    size_t hist_words = job->nblocks * job->nbuckets + job->nbuckets + 1;
    size_t bytes = 2 * nf * sizeof(uint64_t) + hist_words * sizeof(size_t);
    int cached = 0;
    unsigned char *mem = (unsigned char *)sbvi_scratch_get(bytes, &cached);
    if (!mem) {
        if (err && err_len) snprintf(err, err_len, "out of memory (%zu bytes of scratch)", bytes);
        return SBV_ENOMEM;
    }
    job->items = (uint64_t *)mem;
    job->tmp = job->items + nf;
    job->hist = (size_t *)(job->tmp + nf);
    job->bucket_at = job->hist + job->nblocks * job->nbuckets;

    atomic_store_explicit(&job->claim, 0, memory_order_relaxed);
    sbvi_run_phase(job, phase_pack);
    SBV_TICK("pack");
    if (job->guessed) { /* every key offset inside its field, or start again from bounds */
        const int bx = job->kb - job->by - job->bz;
        uint32_t o[3] = {0, 0, 0};
        for (size_t b = 0; b < job->nblocks; b++)
            for (int a = 0; a < 3; a++) o[a] |= job->key_or[b][a];
        if ((uint64_t)o[0] >> bx || (uint64_t)o[1] >> job->by || (uint64_t)o[2] >> job->bz) {
            sbvi_scratch_done(mem, cached);
            return SBVI_GUESS_MISS;
        }
    }
    /* bucket-major, block-minor offsets keep the scatter stable (computed row by row: a
     * column walk strides by a whole histogram) */
    size_t *at = job->bucket_at, *row = job->hist;
    const size_t nb = job->nbuckets;
    memcpy(at, row, nb * sizeof *at);
    for (size_t k = 1; k < job->nblocks; k++)
        for (size_t b = 0; b < nb; b++) at[b] += row[k * nb + b];
    size_t sum = 0;
    for (size_t b = 0; b < nb; b++) {
        const size_t c = at[b];
        at[b] = sum;
        sum += c;
    }
    at[nb] = sum;
    /* each block's row becomes its write offsets: the bucket's start plus earlier blocks' counts */
    size_t next[1 << SBV_TOP_BITS];
    memcpy(next, at, nb * sizeof *at);
    for (size_t k = 0; k < job->nblocks; k++)
        for (size_t b = 0; b < nb; b++) {
            const size_t c = row[k * nb + b];
            row[k * nb + b] = next[b];
            next[b] += c;
        }
    atomic_store_explicit(&job->claim, 0, memory_order_relaxed);
    sbvi_run_phase(job, phase_scatter);
    SBV_TICK("scatter");
    /* contiguous bucket runs of about 1 / nruns of the items each */
    const size_t nr = job->nruns;
    job->bucket_range[0] = 0;
    size_t b = 0;
    for (size_t r = 1; r < nr; r++) {
        size_t target = job->bucket_at[job->nbuckets] * r / nr; /* items, not points */
        while (b < job->nbuckets && job->bucket_at[b + 1] <= target) b++;
        job->bucket_range[r] = b;
    }
    job->bucket_range[nr] = job->nbuckets;
    atomic_store_explicit(&job->claim, 0, memory_order_relaxed);
    sbvi_run_phase(job, phase_sort);
    SBV_TICK("sort");
    size_t m = 0;
    for (size_t r = 0; r < nr; r++) {
        job->out_base[r] = m;
        m += job->voxels[r];
    }
    atomic_store_explicit(&job->claim, 0, memory_order_relaxed);
    sbvi_run_phase(job, phase_reduce);
    SBV_TICK("reduce");
#ifdef SBV_TIMING
    fprintf(stderr, "\n");
#endif
    sbvi_scratch_done(mem, cached);
    *out_points = m;
    return SBV_OK;
}
