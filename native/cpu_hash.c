/*
 * cpu_hash.c - one thread, few voxels: hash-accumulate in input order, then sort the voxels.
 *
 * Why: the radix path moves every point through pack, scatter, sort and a scattered gather
 * (five passes over n items). When the voxel set is small next to the cache, one streaming
 * pass that adds each point to its voxel's sums (an open-addressing table keyed by the
 * packed int64 key) followed by a sort of the m voxels (not the n points) does less work.
 * Consecutive points often share a voxel (organized frames row by row, lidar in firing
 * order), so the current voxel's x/y/z sums stay in registers until the key changes.
 *
 * For float32 x/y/z the pass needs no bounds pass before it ("fused"): keys are packed as
 * 21-bit fields biased by 2^20 (voxel keys within +-2^20 per axis: +-21 km at 2 cm), which
 * keeps (kx, ky, kz) order; only the m voxel keys are repacked to the tight width afterwards.
 * A point outside that range, like a voxel count past the limit, makes the pass give up
 * (SBVI_HASH_FULL) and the caller takes the bounds + radix path.
 *
 * Sums are taken point by point in input order (float64; integers exactly), the same
 * order as every other path, so the output bytes do not change. The estimate that picks
 * this path is in cpu_estimate.c.
 */
#include "cpu_internal.h"

#define EMPTY_KEY SBVI_EMPTY_KEY
#define FB SBVI_FB
#define FBIAS SBVI_FBIAS
#define FMASK (((uint64_t)1 << FB) - 1)
#define MIN_TABLE 1024
#define INITIAL_VOXELS 16384

static _Atomic size_t hash_limit = SBV_HASH_MAX_VOXELS;

size_t sbv_hash_voxels_max(size_t voxels) {
    if (voxels == SIZE_MAX) return hash_limit;
    return atomic_exchange(&hash_limit, voxels);
}

static inline size_t pow2_at_least(size_t x) {
    size_t p = MIN_TABLE;
    while (p < x) p <<= 1;
    return p;
}

void sbvi_rehash(sbvi_hstate *hs, size_t cap) {
    hs->mask = cap - 1;
    hs->shift = 64 - bit_width(cap - 1);
    memset(hs->table, 0xff, cap * sizeof *hs->table);
    for (size_t v = 0; v < hs->m; v++) {
        size_t h = (size_t)(sbvi_mix(hs->vkey[v]) >> hs->shift);
        while (hs->table[h].key != EMPTY_KEY) h = (h + 1) & hs->mask;
        hs->table[h] = (sbvi_slot){hs->vkey[v], v};
    }
}

enum { BLK = 32 }; /* points per pipeline block */
#define NO_VOXEL UINT32_MAX
#define F_XYZ SBVI_F_XYZ
#define F_COLOR SBVI_F_COLOR
#define F_ANY SBVI_F_ANY

/* Stage 1 of the pass for points [lo, hi): packed keys (EMPTY_KEY when not finite), and a
 * prefetch of the table slot of each key that differs from the one before it. */
static inline __attribute__((always_inline)) int stage_keys(const job_t *job, const sbvi_hstate *hs,
                                                            size_t lo, size_t hi, uint64_t *keys,
                                                            const int fast) {
    typedef float v4f __attribute__((vector_size(16)));
    typedef int32_t v4i __attribute__((vector_size(16)));
    const sbv_plan *pl = &job->plan;
    const size_t stride = job->stride;
    const int by = job->by, bz = job->bz;
    const v4f vv = {pl->voxel_f, pl->voxel_f, pl->voxel_f, 1.0f};
    typedef uint32_t v4u __attribute__((vector_size(16)));
    const v4u bias = {FBIAS, FBIAS, FBIAS, FBIAS};
    v4u out = {0, 0, 0, 0};
    uint64_t prev = EMPTY_KEY;
    const unsigned char *rec = job->data + lo * stride;
    for (size_t i = lo; i < hi; i++, rec += stride) {
        uint64_t key;
        if (fast) { /* branch-free: NaN holes in organized frames defeat prediction */
            float fx, fy, fz;
            memcpy(&fx, rec + pl->x_off, 4);
            memcpy(&fy, rec + pl->y_off, 4);
            memcpy(&fz, rec + pl->z_off, 4);
            const v4f p = {fx, fy, fz, 0.0f};
            const v4i fin = (p - p) == (v4f){0, 0, 0, 0}; /* false for NaN and +-inf */
            const v4f q = p / vv;                              /* IEEE division, as floorf(p / v) */
            const v4i t = __builtin_convertvector(q, v4i);     /* truncation */
            /* floor (-1 where t > q), biased; unsigned: lanes of dropped points wrap */
            const v4u u = (v4u)t + (v4u)(__builtin_convertvector(t, v4f) > q) + bias;
            const int ok = fin[0] & fin[1] & fin[2];
            out |= (u >> FB) & (v4u)(v4i){ok, ok, ok, 0}; /* out of range (finite points) */
            key = ((uint64_t)u[0] << (2 * FB)) | ((uint64_t)u[1] << FB) | (uint64_t)u[2];
            key = ok ? key : EMPTY_KEY;
        } else {
            double x, y, z;
            if (!load_xyz(job, rec, &x, &y, &z)) {
                keys[i - lo] = EMPTY_KEY;
                continue;
            }
            const uint64_t ux = (uint64_t)(int64_t)key_of(job, x) - (uint64_t)job->kmin[0];
            const uint64_t uy = (uint64_t)(int64_t)key_of(job, y) - (uint64_t)job->kmin[1];
            const uint64_t uz = (uint64_t)(int64_t)key_of(job, z) - (uint64_t)job->kmin[2];
            key = (shl(ux, by) | uy) << bz | uz;
        }
        keys[i - lo] = key;
        if (key != prev && key != EMPTY_KEY)
            __builtin_prefetch(&hs->table[(size_t)(sbvi_mix(key) >> hs->shift)]);
        prev = key;
    }
    return (out[0] | out[1] | out[2] | out[3]) ? SBVI_HASH_FULL : SBV_OK;
}

/* Stage 2: voxel number of each key (new voxels numbered in input order), prefetching the
 * voxel's row. Returns SBVI_HASH_FULL when the voxel limit is hit. */
static inline __attribute__((always_inline)) int stage_voxels(sbvi_hstate *hs, size_t lo, size_t count,
                                                              size_t n, const uint64_t *keys,
                                                              uint32_t *vids) {
    uint64_t prev = EMPTY_KEY;
    uint32_t vid = (uint32_t)hs->limit; /* EMPTY_KEY: the spare row */
    for (size_t j = 0; j < count; j++) {
        const uint64_t key = keys[j];
        if (key != prev) {
            prev = key;
            if (key == EMPTY_KEY) {
                vid = (uint32_t)hs->limit; /* the spare row: summed, never written out */
            } else {
                const size_t before = hs->m;
                const int64_t v = sbvi_voxel_id(hs, key);
                if (v < 0 || (hs->m != before && sbvi_projected_over(hs, lo + j + 1, n)))
                    return SBVI_HASH_FULL;
                vid = (uint32_t)v;
                __builtin_prefetch(hs->rows + (size_t)vid * hs->w);
            }
        }
        vids[j] = vid;
    }
    return SBV_OK;
}

/* The accumulate pass, pipelined over blocks of BLK points (keys two blocks ahead, voxel
 * numbers one block ahead, so table and row cache misses overlap). `fast`: float32 x/y/z
 * whose keys fit int32 (one SSE division for all three axes); `fm`: which other fields
 * (none, exactly one packed colour, anything). The current voxel's x/y/z sums and count
 * live in registers until the voxel changes; integer fields (colour channels) add up in
 * registers too (exact, so grouping does not matter); float fields are added to the row in
 * memory, in input order. */

static inline __attribute__((always_inline)) int accumulate(job_t *job, sbvi_hstate *hs, const int fast,
                                                             const int fm) {
    const sbv_cloud *in = job->in;
    const size_t n = in->points, stride = job->stride;
    const sbv_plan *pl = &job->plan;
    uint32_t col_off = 0;
    size_t others[SBV_MAX_FIELDS], n_others = 0;
    for (size_t f = 0; f < in->n_fields; f++) {
        if (in->fields[f].role >= SBV_ROLE_X) continue;
        others[n_others++] = f;
        col_off = in->fields[f].offset;
    }
    uint64_t keys[3][BLK];
    uint32_t vids[2][BLK];
    sbv_acc dummy[4 + 4 * SBV_MAX_FIELDS];
    sbv_acc *row = dummy;
    uint32_t cur = NO_VOXEL;
    double sx = 0, sy = 0, sz = 0;
    int64_t cnt = 0, c0 = 0, c1 = 0, c2 = 0, c3 = 0;
    const ptrdiff_t nb = (ptrdiff_t)((n + BLK - 1) / BLK);
    for (ptrdiff_t b = -2; b < nb; b++) {
        if (b + 2 < nb) {
            const size_t lo = (size_t)(b + 2) * BLK, hi = lo + BLK < n ? lo + BLK : n;
            if (stage_keys(job, hs, lo, hi, keys[(b + 2) % 3], fast) != SBV_OK) return SBVI_HASH_FULL;
        }
        if (b + 1 >= 0 && b + 1 < nb) {
            const size_t lo = (size_t)(b + 1) * BLK, hi = lo + BLK < n ? lo + BLK : n;
            if (stage_voxels(hs, lo, hi - lo, n, keys[(b + 1) % 3], vids[(b + 1) & 1]) != SBV_OK)
                return SBVI_HASH_FULL;
        }
        if (b < 0) continue;
        const size_t lo = (size_t)b * BLK, hi = lo + BLK < n ? lo + BLK : n;
        const uint32_t *vb = vids[b & 1];
        const unsigned char *rec = job->data + lo * stride;
        for (size_t j = 0; j < hi - lo; j++, rec += stride) {
            const uint32_t vid = vb[j];
            if (vid != cur) {
                sbvi_flush_row(row, sx, sy, sz, cnt, fm == F_COLOR, &c0, &c1, &c2, &c3);
                row = hs->rows + (size_t)vid * hs->w;
                cur = vid;
                sx = row[0].d;
                sy = row[1].d;
                sz = row[2].d;
                cnt = row[3].i;
            }
            if (fast) {
                float p[3];
                memcpy(&p[0], rec + pl->x_off, 4);
                memcpy(&p[1], rec + pl->y_off, 4);
                memcpy(&p[2], rec + pl->z_off, 4);
                sx += (double)p[0];
                sy += (double)p[1];
                sz += (double)p[2];
            } else {
                double x, y, z;
                if (!load_xyz(job, rec, &x, &y, &z)) continue;
                sx += x;
                sy += y;
                sz += z;
            }
            cnt++;
            if (fm == F_COLOR) {
                const unsigned char *c = rec + col_off;
                c0 += c[0];
                c1 += c[1];
                c2 += c[2];
                c3 += c[3];
            } else if (fm == F_ANY) {
                for (size_t o = 0; o < n_others; o++)
                    sbvi_add_field(in->fields[others[o]], rec, row + job->slot_of[others[o]]);
            }
        }
    }
    sbvi_flush_row(row, sx, sy, sz, cnt, fm == F_COLOR, &c0, &c1, &c2, &c3);
    return SBV_OK;
}

static int run_pass(job_t *job, sbvi_hstate *hs, int fast, int fm, int direct) {
    if (fast && direct && fm != F_ANY) return sbvi_accumulate_direct(job, hs, fm);
    if (fast) {
        if (fm == F_XYZ) return accumulate(job, hs, 1, F_XYZ);
        if (fm == F_COLOR) return accumulate(job, hs, 1, F_COLOR);
        return accumulate(job, hs, 1, F_ANY);
    }
    return accumulate(job, hs, 0, F_ANY);
}

/* Stable LSD radix sort of (key, voxel) pairs on key bits [0, bits); result in a. */
static void sort_pairs(sbvi_slot *a, sbvi_slot *b, size_t m, int bits) {
    if (m <= 32) {
        for (size_t i = 1; i < m; i++) {
            const sbvi_slot v = a[i];
            size_t j = i;
            for (; j > 0 && a[j - 1].key > v.key; j--) a[j] = a[j - 1];
            a[j] = v;
        }
        return;
    }
    enum { D = 8, R = 1 << D };
    const int passes = (bits + D - 1) / D;
    size_t count[8][R];
    memset(count, 0, (size_t)passes * sizeof count[0]);
    for (size_t i = 0; i < m; i++)
        for (int p = 0; p < passes; p++) count[p][(a[i].key >> (p * D)) & (R - 1)]++;
    sbvi_slot *src = a, *dst = b;
    for (int p = 0; p < passes; p++) {
        size_t *c = count[p];
        if (c[(src[0].key >> (p * D)) & (R - 1)] == m) continue; /* one digit value */
        size_t sum = 0;
        for (int d = 0; d < R; d++) {
            const size_t k = c[d];
            c[d] = sum;
            sum += k;
        }
        for (size_t i = 0; i < m; i++) dst[c[(src[i].key >> (p * D)) & (R - 1)]++] = src[i];
        sbvi_slot *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, m * sizeof *a);
}

/* Means in key order into the output (sbv_reduce_voxel's formulas, via sbvi_write_means). */
static void write_out(job_t *job, const sbvi_hstate *hs, const sbvi_slot *order, int fm) {
    const sbv_cloud *in = job->in;
    const sbv_plan *pl = &job->plan;
    const size_t stride = job->stride, m = hs->m, w = hs->w;
    unsigned char *out = job->out;
    const int xyz32 = fm != F_ANY && pl->xyz_f32;
    uint32_t col_off = 0;
    for (size_t f = 0; f < in->n_fields; f++)
        if (in->fields[f].role < SBV_ROLE_X) col_off = in->fields[f].offset;
    for (size_t j = 0; j < m; j++, out += stride) {
        if (j + 8 < m) __builtin_prefetch(hs->rows + order[j + 8].vid * w);
        const sbv_acc *r = hs->rows + order[j].vid * w;
        const size_t count = (size_t)r[3].i;
        if (!xyz32) {
            sbvi_write_means(in, job->slot_of, r, count, out);
            continue;
        }
        memset(out, 0, stride);
        const double c = (double)count;
        const float mx = (float)(r[0].d / c), my = (float)(r[1].d / c), mz = (float)(r[2].d / c);
        memcpy(out + pl->x_off, &mx, 4);
        memcpy(out + pl->y_off, &my, 4);
        memcpy(out + pl->z_off, &mz, 4);
        if (fm == F_COLOR) {
            const int64_t s[4] = {r[4].i, r[5].i, r[6].i, r[7].i};
            sbv_store_color(out + col_off, s, count);
        }
    }
}

/* Fused mode: bounds of the m voxel keys, then the keys repacked to the tight width
 * (kmin, by, bz, kb as the bounds pass would set them; (kx, ky, kz) order is kept). */
static void repack(job_t *job, sbvi_hstate *hs) {
    uint64_t lo[3] = {FMASK, FMASK, FMASK}, hi[3] = {0, 0, 0};
    for (size_t v = 0; v < hs->m; v++) {
        const uint64_t k = hs->vkey[v];
        for (int a = 0; a < 3; a++) {
            const uint64_t f = (k >> (FB * (2 - a))) & FMASK;
            lo[a] = f < lo[a] ? f : lo[a];
            hi[a] = f > hi[a] ? f : hi[a];
        }
    }
    int bits[3];
    for (int a = 0; a < 3; a++) {
        job->kmin[a] = (int64_t)lo[a] - FBIAS;
        bits[a] = bit_width(hi[a] - lo[a]);
    }
    job->by = bits[1];
    job->bz = bits[2];
    job->kb = bits[0] + bits[1] + bits[2];
    for (size_t v = 0; v < hs->m; v++) {
        const uint64_t k = hs->vkey[v];
        const uint64_t x = ((k >> (2 * FB)) & FMASK) - lo[0], y = ((k >> FB) & FMASK) - lo[1];
        hs->vkey[v] = (x << bits[1] | y) << bits[2] | ((k & FMASK) - lo[2]);
    }
}

/* The hash path. fused: float32 x/y/z, no bounds pass yet (job->kmin etc. unset); else after
 * the bounds pass with kb <= 63. Returns SBVI_HASH_FULL (nothing written) when the cloud does
 * not suit it. `cap`: output capacity in records. */
int sbvi_run_hash(job_t *job, int fused, size_t estimate, size_t cap, size_t *out_points,
                  char *err, size_t err_len) {
    const sbv_cloud *in = job->in;
    size_t limit = hash_limit;
    if (limit > in->points) limit = in->points;
    /* row layout: x, y, z sums and the count first, then every other field's slots */
    size_t w = 4, colors = 0, others = 0;
    for (size_t f = 0; f < in->n_fields; f++) {
        const sbv_field fd = in->fields[f];
        if (fd.role >= SBV_ROLE_X) {
            job->slot_of[f] = fd.role - SBV_ROLE_X;
            continue;
        }
        job->slot_of[f] = (uint32_t)w;
        w += fd.role == SBV_ROLE_COLOR ? 4 : 1;
        others++;
        colors += fd.role == SBV_ROLE_COLOR;
    }
    const int fm = others == 0 ? F_XYZ : (others == 1 && colors == 1) ? F_COLOR : F_ANY;
    const size_t max_table = pow2_at_least(2 * limit);
    const size_t table_bytes = max_table * sizeof(sbvi_slot);
    /* rows: limit voxels plus a spare one that sums the dropped points (no branch for them) */
    const size_t bytes = table_bytes + ((limit + 1) * w + limit) * sizeof(sbv_acc);
    int cached = 0;
    unsigned char *mem = (unsigned char *)sbvi_scratch_get(bytes, &cached);
    if (!mem) {
        if (err && err_len) snprintf(err, err_len, "out of memory (%zu bytes of scratch)", bytes);
        return SBV_ENOMEM;
    }
    sbvi_hstate hs = {0};
    hs.table = (sbvi_slot *)mem;
    hs.rows = (sbv_acc *)(mem + table_bytes);
    hs.vkey = (uint64_t *)(hs.rows + (limit + 1) * w);
    memset(hs.rows + limit * w, 0, w * sizeof *hs.rows);
    hs.w = w;
    hs.limit = limit;
    /* start at most L2-sized (the estimate can overshoot a lot) and grow by doubling */
    size_t start = estimate < limit ? estimate : limit;
    start = start < INITIAL_VOXELS ? start : INITIAL_VOXELS;
    const size_t want = pow2_at_least(2 * start + 2);
    sbvi_rehash(&hs, want < max_table ? want : max_table);
#ifdef SBV_TIMING
    double sbv_t0 = sbv_now();
#endif
    int rc = run_pass(job, &hs, fused, fm, estimate <= SBV_HASH_DIRECT_VOXELS);
    SBV_TICK("hash");
    const size_t nf = in->points - (size_t)hs.rows[limit * w + 3].i; /* spare row: dropped */
    if (rc == SBV_OK && nf > cap) {
        /* the output can have up to nf records; demand room for all of them */
        if (err && err_len) snprintf(err, err_len, "output capacity %zu < %zu finite points", cap, nf);
        rc = SBV_EINVAL;
    }
    if (rc != SBV_OK) {
        sbvi_scratch_done(mem, cached);
        return rc;
    }
    if (fused) repack(job, &hs);
    /* the table is no longer needed: its memory holds the (key, voxel) pairs to sort */
    sbvi_slot *pairs = hs.table, *tmp = hs.table + hs.m;
    for (size_t v = 0; v < hs.m; v++) pairs[v] = (sbvi_slot){hs.vkey[v], v};
    sort_pairs(pairs, tmp, hs.m, job->kb);
    SBV_TICK("sort");
    write_out(job, &hs, pairs, fm);
    SBV_TICK("write");
#ifdef SBV_TIMING
    fprintf(stderr, "estimate %zu voxels %zu\n", estimate, hs.m);
#endif
    *out_points = hs.m;
    sbvi_scratch_done(mem, cached);
    return SBV_OK;
}
