/*
 * cpu_internal.h - what the CPU kernel's files share (not part of the ABI): the job every
 * phase works on, fork-join over threads, per-thread scratch, and small inline helpers.
 *
 * Files: voxel_cpu.c (entry point, bounds, path choice), cpu_sorted.c (the radix-sort
 * path), cpu_dense.c (coarse grids: counting, no sort), cpu_wide.c (keys wider than 64
 * bits), cpu_hash.c (one thread, few voxels: hash-accumulate), cpu_estimate.c (voxel count
 * from a sample), cpu_scratch.c (cached scratch memory), cpu_team.c (helper threads).
 */
#ifndef SBV_CPU_INTERNAL_H
#define SBV_CPU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* SSE2 code paths (every x86-64 CPU); elsewhere, or with -DSBV_PORTABLE, the plain C ones. */
#if defined(__SSE2__) && !defined(SBV_PORTABLE)
#define SBV_SSE2 1
#include <emmintrin.h>
#else
#define SBV_SSE2 0
#endif

#include "sbv_body.h"

/* Internal symbols stay out of the shared library's exports. */
#define SBV_INTERNAL __attribute__((visibility("hidden")))

/* Below this many points per thread a cloud uses fewer threads (helpers are persistent,
 * cpu_team.c, so a phase costs microseconds to fork and join). */
#define SBV_MIN_POINTS_PER_THREAD 16384
#define SBV_MAX_THREADS 64
#define SBV_TOP_BITS 11
#define SBV_SMALL_BUCKET 48
#define SBV_PREFETCH 24
/* Sorted path: bits of a run-length item's length field (runs of up to 2^SBV_RUN_BITS points) */
#ifndef SBV_RUN_BITS
#define SBV_RUN_BITS 4
#endif
/* ...taken when a sample's points per run, times 16, reach this (24: 1.5 points a run) */
#ifndef SBV_RUN_MIN_X16
#define SBV_RUN_MIN_X16 24
#endif
/* Several threads: the cloud is bounded, packed and scattered in SBV_SPLIT blocks per thread,
 * the buckets sorted and reduced in SBV_RUN_SPLIT runs per thread, and threads claim blocks
 * and runs as they finish. The cost per item is uneven (a lidar sweep's upward beams scatter
 * to far more buckets than its ground rings: equal halves left one thread idle ~1 ms), and
 * the last run taken decides when a phase ends, so runs are small. */
#ifndef SBV_SPLIT
#define SBV_SPLIT 4
#endif
#ifndef SBV_RUN_SPLIT
#define SBV_RUN_SPLIT 16
#endif
#define SBV_MAX_PARTS (SBV_MAX_THREADS * SBV_SPLIT)
#define SBV_MAX_RUNS (SBV_MAX_THREADS * SBV_RUN_SPLIT)
/* Dense path when the key grid has at most this many cells per point (and at most
 * SBV_DENSE_MAX_CELLS cells): counting needs no sort, and the per-voxel sums stay in cache. */
#ifndef SBV_DENSE_CELLS_PER_POINT
#define SBV_DENSE_CELLS_PER_POINT 0.75
#endif
/* Hash path (cpu_hash.c, one thread): taken when the estimated voxel count is at most half
 * this (sbv_hash_voxels_max changes it at run time); gives up past it. */
#ifndef SBV_HASH_MAX_VOXELS
#define SBV_HASH_MAX_VOXELS ((size_t)1 << 17)
#endif
#define SBVI_HASH_FULL (-1)
/* sbvi_run_sorted with a guessed key frame: a point fell outside it (nothing written) */
#define SBVI_GUESS_MISS (-2)
/* Clouds of at least this many points skip the bounds pass when the estimate's sample gives
 * a key frame that holds every point (checked by the pack) */
#define SBV_GUESS_MIN_POINTS 32768
#define SBVI_EMPTY_KEY UINT64_MAX              /* no voxel: an empty slot, a dropped point */
#define SBVI_FB 21                             /* fused keys: bits per axis... */
#define SBVI_FBIAS ((int64_t)1 << (SBVI_FB - 1)) /* ...biased by 2^20 */
static inline uint64_t sbvi_mix(uint64_t key) { return key * 0x9E3779B97F4A7C15ull; }
/* Estimate up to which the hash table stays in L2: no pipeline (and worth one thread of two). */
#define SBV_HASH_DIRECT_VOXELS 16384
#define SBV_DENSE_MAX_CELLS ((size_t)1 << 22)
#define SBV_DENSE_MAX_HIST_BYTES ((size_t)64 << 20)

/* A condition the branch predictor cannot learn (GCC then emits a conditional move). */
#if defined(__has_builtin)
#if __has_builtin(__builtin_expect_with_probability)
#define SBV_UNPREDICTABLE(c) __builtin_expect_with_probability(!!(c), 1, 0.5)
#endif
#endif
#ifndef SBV_UNPREDICTABLE
#define SBV_UNPREDICTABLE(c) (c)
#endif

static inline uint64_t shl(uint64_t x, int s) { return s >= 64 ? 0 : x << s; }
static inline uint64_t shr(uint64_t x, int s) { return s >= 64 ? 0 : x >> s; }
static inline int bit_width(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

typedef struct job job_t;

/* One running sum: float64 for float fields, exact int64 for integers and colour channels. */
typedef union {
    double d;
    int64_t i;
} sbv_acc;

#define SBV_DROPPED UINT32_MAX


struct job {
    const sbv_cloud *in;
    sbv_plan plan;
    const unsigned char *data;
    size_t stride;
    int nt;
    size_t chunk[SBV_MAX_THREADS + 1];
    /* A, per block of points (bounds and pack: nblocks blocks, claimed) */
    int split;          /* blocks per thread (1 or SBV_SPLIT) */
    size_t nblocks, nruns;
    _Atomic size_t claim; /* next block or run to take */
    size_t finite[SBV_MAX_PARTS];
    double lo[SBV_MAX_PARTS][3], hi[SBV_MAX_PARTS][3];
    size_t finite_base[SBV_MAX_PARTS];
    /* key packing */
    int64_t kmin[3];
    int by, bz, ib, kb, top_bits, top_shift; /* ib: bits below the key (index, then lb) */
    int lb; /* sorted path: run-length bits under the index (0: one item per point) */
    int keys_i32; /* sorted path: float32 keys that fit int32 (vector key computation) */
    /* A key frame guessed from the estimate's sample instead of a bounds pass (see
     * sbvi_run_sorted): the sample's key bounds, and per block the OR of every key offset the
     * pack computed, which shows whether any point fell outside the guessed frame. */
    int sample_ok, guessed;
    int64_t sample_klo[3], sample_khi[3];
    uint32_t key_or[SBV_MAX_PARTS][3];
    uint64_t idx_mask;
    size_t nbuckets;
    size_t *hist;       /* nblocks * nbuckets, then offsets */
    size_t *bucket_at;  /* nbuckets + 1 */
    uint64_t *items, *tmp;
    size_t block_end[SBV_MAX_PARTS]; /* items of block b: [finite_base[b], block_end[b]) */
    size_t bucket_range[SBV_MAX_RUNS + 1]; /* run r: buckets [bucket_range[r], [r + 1]) */
    size_t voxels[SBV_MAX_RUNS];
    size_t out_base[SBV_MAX_RUNS];
    unsigned char *out;
    /* dense path */
    uint64_t span[3];
    size_t cells;
    uint32_t *cell;    /* per input point: grid cell, then voxel number; SBV_DROPPED if not finite */
    uint32_t *chist;   /* nt * cells counts, then chist[0..cells) = voxel number per cell */
    uint32_t *vcount;  /* points per voxel */
    size_t m;
    size_t slots;      /* accumulator slots per voxel (colour fields take 4) */
    uint32_t slot_of[SBV_MAX_FIELDS];
    sbv_acc *acc;      /* m * slots */
    size_t vrange[SBV_MAX_THREADS + 1];  /* voxels owned by each thread */
    uint32_t *olist;   /* point indices grouped by owner thread, in input order */
    size_t ocount[SBV_MAX_THREADS][SBV_MAX_THREADS]; /* [chunk][owner] counts, then offsets */
    size_t ostart[SBV_MAX_THREADS + 1];
};

#ifdef SBV_TIMING /* developer aid: per-phase wall times on stderr */
#include <time.h>
static inline double sbv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define SBV_TICK(label) do { double t_ = sbv_now(); fprintf(stderr, "%s %.2fms ", label, (t_ - sbv_t0) * 1e3); sbv_t0 = t_; } while (0)
#else
#define SBV_TICK(label) do { } while (0)
#endif

typedef void (*phase_fn)(job_t *, int);

/* Run fn(job, t) for t in [0, job->nt), the caller taking t = 0. */
SBV_INTERNAL int sbvi_run_phase(job_t *job, phase_fn fn);
/* Keep this thread's helpers 1..nt-1 awake and spinning (on: a call with nt threads starts and
 * its first phase follows the serial estimate) or let them sleep again (off: the call ends). */
SBV_INTERNAL void sbvi_team_hold(int nt, int on);

/* Points [lo, hi) of block b (nblocks equal blocks of the cloud). */
static inline size_t sbvi_block_lo(const job_t *job, size_t b) {
    return (size_t)((unsigned __int128)job->in->points * b / job->nblocks);
}
/* The next block or bucket run nobody has taken, or SIZE_MAX when all `parts` are taken. */
static inline size_t sbvi_claim(job_t *job, size_t parts) {
    const size_t k = atomic_fetch_add_explicit(&job->claim, 1, memory_order_relaxed);
    return k < parts ? k : SIZE_MAX;
}

/* A buffer of at least `bytes`, cached per calling thread when *cached is set on return. */
SBV_INTERNAL void *sbvi_scratch_get(size_t bytes, int *cached);
SBV_INTERNAL void sbvi_scratch_done(void *mem, int cached);

static inline int load_xyz(const job_t *job, const unsigned char *rec, double *x, double *y,
                           double *z) {
    const sbv_plan *pl = &job->plan;
    *x = sbv_load_f(rec + pl->x_off, pl->x_type);
    *y = sbv_load_f(rec + pl->y_off, pl->y_type);
    *z = sbv_load_f(rec + pl->z_off, pl->z_type);
    return isfinite(*x) && isfinite(*y) && isfinite(*z);
}

static inline double key_of(const job_t *job, double p) {
    return job->plan.xyz_f32 ? sbv_key_f32((float)p, job->plan.voxel_f)
                             : sbv_key_f64(p, job->plan.voxel_d);
}

/* floor(q) as int64 without a libm call; exact for |q| < 2^63, which the bounds check in
 * the bounds phase guarantees for every finite point (trunc(q) is exact, and (float)k == q
 * whenever |q| >= 2^24 because such floats are already integers). */
static inline int64_t floor_i64(float q) {
    int64_t k = (int64_t)q;
    return (float)k > q ? k - 1 : k;
}

#if SBV_SSE2
/* x, y, z of four records (SSE2), one vector per axis; r[j] = (x, y, z, ?) of record j. Packed:
 * 16-byte loads from rec + xo (the caller keeps them inside the cloud). */
static inline __attribute__((always_inline)) void sbvi_load4(const unsigned char *rec, size_t stride, const sbv_plan *pl,
                                  const int packed, __m128 r[4], __m128 *X, __m128 *Y, __m128 *Z) {
    for (int j = 0; j < 4; j++) {
        const unsigned char *p = rec + (size_t)j * stride;
        if (packed) {
            r[j] = _mm_loadu_ps((const float *)(const void *)(p + pl->x_off));
        } else {
            float x, y, z;
            memcpy(&x, p + pl->x_off, 4);
            memcpy(&y, p + pl->y_off, 4);
            memcpy(&z, p + pl->z_off, 4);
            r[j] = _mm_setr_ps(x, y, z, 0.0f);
        }
    }
    const __m128 t0 = _mm_unpacklo_ps(r[0], r[1]), t1 = _mm_unpacklo_ps(r[2], r[3]);
    const __m128 t2 = _mm_unpackhi_ps(r[0], r[1]), t3 = _mm_unpackhi_ps(r[2], r[3]);
    *X = _mm_movelh_ps(t0, t1);
    *Y = _mm_movehl_ps(t1, t0);
    *Z = _mm_movelh_ps(t2, t3);
}

#endif

/* How many leading points of the cloud sbvi_load4 may read with 16-byte loads (packed x, y,
 * z: the load runs 4 bytes past z, into the next record, never past the cloud). */
static inline size_t sbvi_load16_points(const job_t *job) {
    if (!job->plan.xyz_packed) return job->in->points;
    const size_t bytes = job->in->points * job->stride, xo = job->plan.x_off;
    const size_t safe = bytes >= xo + 16 ? (bytes - xo - 16) / job->stride + 1 : 0;
    return safe < job->in->points ? safe : job->in->points;
}

#if SBV_SSE2
/* All-ones lanes where x, y and z are all finite (p - p is NaN for NaN and +-inf). */
static inline __m128 sbvi_finite4(__m128 X, __m128 Y, __m128 Z) {
    const __m128 zero = _mm_setzero_ps();
    return _mm_and_ps(_mm_and_ps(_mm_cmpeq_ps(_mm_sub_ps(X, X), zero), _mm_cmpeq_ps(_mm_sub_ps(Y, Y), zero)),
                      _mm_cmpeq_ps(_mm_sub_ps(Z, Z), zero));
}
#endif

/* Store a voxel's running sums (kept in registers along a run of points in one voxel) back
 * into its row; the colour channels are added and their counters reset. */
static inline __attribute__((always_inline)) void sbvi_flush_row(sbv_acc *row, double sx, double sy,
                                                                 double sz, int64_t cnt, int color,
                                                                 int64_t *c0, int64_t *c1,
                                                                 int64_t *c2, int64_t *c3) {
    row[0].d = sx;
    row[1].d = sy;
    row[2].d = sz;
    row[3].i = cnt;
    if (color) {
        row[4].i += *c0;
        row[5].i += *c1;
        row[6].i += *c2;
        row[7].i += *c3;
        *c0 = *c1 = *c2 = *c3 = 0;
    }
}

/* Add one field of one record to its slot(s) of a voxel's sums. */
static inline void sbvi_add_field(const sbv_field fd, const unsigned char *rec, sbv_acc *s) {
    const unsigned char *q = rec + fd.offset;
    if (fd.role == SBV_ROLE_COLOR) {
        s[0].i += q[0];
        s[1].i += q[1];
        s[2].i += q[2];
        s[3].i += q[3];
    } else if (fd.type == SBV_FLOAT32 || fd.type == SBV_FLOAT64) {
        s->d += sbv_load_f(q, fd.type);
    } else {
        s->i += sbv_load_i(q, fd.type);
    }
}

/* Add one record's fields to its voxel's sums (slot_of: first slot of each field). */
static inline void sbvi_add_record(const sbv_cloud *in, const uint32_t *slot_of,
                                   const unsigned char *rec, sbv_acc *a) {
    for (size_t f = 0; f < in->n_fields; f++) sbvi_add_field(in->fields[f], rec, a + slot_of[f]);
}

/* One zeroed output record holding the means of a voxel's sums (sbv_reduce_voxel's formulas). */
static inline void sbvi_write_means(const sbv_cloud *in, const uint32_t *slot_of, const sbv_acc *a,
                                    size_t count, unsigned char *out) {
    memset(out, 0, in->stride);
    for (size_t f = 0; f < in->n_fields; f++) {
        const sbv_field fd = in->fields[f];
        const sbv_acc *s = a + slot_of[f];
        if (fd.role == SBV_ROLE_COLOR) {
            int64_t c[4] = {s[0].i, s[1].i, s[2].i, s[3].i};
            sbv_store_color(out + fd.offset, c, count);
        } else if (fd.type == SBV_FLOAT32 || fd.type == SBV_FLOAT64) {
            sbv_store_float(out + fd.offset, fd.type, s->d, count);
        } else {
            sbv_store_int(out + fd.offset, fd.type, s->i, count);
        }
    }
}

/* Accumulator slots per voxel (colour fields take 4); fills slot_of. */
static inline size_t sbvi_slots(const sbv_cloud *in, uint32_t *slot_of) {
    size_t slots = 0;
    for (size_t f = 0; f < in->n_fields; f++) {
        slot_of[f] = (uint32_t)slots;
        slots += in->fields[f].role == SBV_ROLE_COLOR ? 4 : 1;
    }
    return slots;
}

/* ---- the hash path's table (cpu_hash.c; its direct pass is in cpu_hash_direct.c) ---- */

typedef struct {
    uint64_t key;
    uint64_t vid;
} sbvi_slot;

typedef struct {
    sbvi_slot *table; /* open addressing, linear probing, SBVI_EMPTY_KEY marks a free slot */
    size_t mask;
    int shift;
    sbv_acc *rows;    /* w words per voxel: sum x, sum y, sum z, count, then the other fields */
    size_t w;
    uint64_t *vkey;   /* key of each voxel, by voxel number */
    size_t m, limit;
} sbvi_hstate;

enum { SBVI_F_XYZ = 0, SBVI_F_COLOR = 1, SBVI_F_ANY = 2 }; /* fields besides x/y/z */

SBV_INTERNAL void sbvi_rehash(sbvi_hstate *hs, size_t cap);

/* Number of the voxel with packed key `key`, its row created zeroed if new; -1 when the
 * voxel limit is hit. */
static inline int64_t sbvi_voxel_id(sbvi_hstate *hs, uint64_t key) {
    size_t h = (size_t)(sbvi_mix(key) >> hs->shift);
    for (;;) {
        const sbvi_slot *s = &hs->table[h];
        if (s->key == key) return (int64_t)s->vid;
        if (s->key == SBVI_EMPTY_KEY) break;
        h = (h + 1) & hs->mask;
    }
    if (hs->m == hs->limit) return -1;
    const size_t v = hs->m++;
    hs->table[h] = (sbvi_slot){key, v};
    hs->vkey[v] = key;
    memset(hs->rows + v * hs->w, 0, hs->w * sizeof *hs->rows);
    if (2 * hs->m > hs->mask + 1) sbvi_rehash(hs, 2 * (hs->mask + 1));
    return (int64_t)v;
}

/* Give up early when the voxels found so far, projected over the whole cloud, exceed the
 * limit (checked every 128 new voxels, after the first 1/16 of the points): the sampled
 * estimate can be far too low (lidar: a few dense voxels near the sensor, many sparse far
 * ones), and a late give-up would waste most of a pass. New voxels keep appearing at a
 * steady rate along scan lines and beams, so the projection is a fair guide. */
static inline int sbvi_projected_over(const sbvi_hstate *hs, size_t done, size_t n) {
    return (hs->m & 127) == 0 && done >= n / 16 &&
           (double)hs->m * (double)n > (double)hs->limit * (double)done;
}

/* The accumulate pass without a pipeline (fused float32 keys, table in cache); fm is
 * SBVI_F_XYZ or SBVI_F_COLOR. SBV_OK or SBVI_HASH_FULL. */
SBV_INTERNAL int sbvi_accumulate_direct(job_t *job, sbvi_hstate *hs, int fm);

/* The ways to finish once bounds are known (each writes job->out, sets *out_points). */
SBV_INTERNAL int sbvi_run_sorted(job_t *job, size_t nf, size_t *out_points, char *err, size_t err_len);
SBV_INTERNAL int sbvi_dense_fits(job_t *job, const double klo[3], const double khi[3], size_t nf);
SBV_INTERNAL int sbvi_run_dense(job_t *job, size_t cap, size_t *out_points, char *err, size_t err_len);
SBV_INTERNAL size_t sbvi_hash_estimate(job_t *job, int fused, size_t most);
SBV_INTERNAL int sbvi_run_hash(job_t *job, int fused, size_t estimate, size_t cap, size_t *out_points,
                               char *err, size_t err_len);
SBV_INTERNAL int sbvi_run_wide(job_t *job, size_t nf, size_t cap, size_t *out_points, char *err,
                               size_t err_len);

#endif /* SBV_CPU_INTERNAL_H */
