/*
 * voxel_cpu.c - the CPU voxel-grid kernel (plain C11 + pthreads, no Python).
 *
 * Why this shape: the hot path is "group 1M points by a 3-D integer key". A hash table
 * costs a cache miss per point; sorting 8-byte items that hold the packed key in the high
 * bits and the point index in the low bits streams through memory instead, and a stable
 * sort on the key bits alone keeps each voxel's points in input order (so float sums match
 * the NumPy reference bit for bit). Steps, each split over `threads` chunks:
 *
 *   A  bounds: finite count and min/max of x, y, z per chunk (key bounds follow because
 *      floor(p / v) is monotonic in p), overflow check, bit widths of the three key spans;
 *   B  pack one item per finite point, histogram of its top digit (up to 11 bits);
 *   C  stable scatter into buckets by that digit (MSD pass);
 *   D  each thread LSD-radix-sorts a contiguous run of buckets on the remaining key bits
 *      and counts distinct keys;
 *   E  each thread reduces its voxels straight into the output at its prefix offset.
 *
 * When key bits + index bits exceed 64 (coordinates spread over > ~2^40 voxels) a
 * single-threaded comparison sort over (kx, ky, kz, index) takes over: slower, same result.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "sbv_body.h"

#define SBV_SCRATCH_KEEP_DEFAULT ((size_t)64 << 20)
#define SBV_MIN_POINTS_PER_THREAD 65536
#define SBV_MAX_THREADS 64
#define SBV_TOP_BITS 11
#define SBV_SMALL_BUCKET 48
#define SBV_PREFETCH 24
/* Dense path when the key grid has at most this many cells per point (and at most
 * SBV_DENSE_MAX_CELLS cells): counting needs no sort, and the per-voxel sums stay in cache. */
#ifndef SBV_DENSE_CELLS_PER_POINT
#define SBV_DENSE_CELLS_PER_POINT 0.75
#endif
#define SBV_DENSE_MAX_CELLS ((size_t)1 << 22)
#define SBV_DENSE_MAX_HIST_BYTES ((size_t)64 << 20)

typedef struct {
    void *p;
    size_t size;
} scratch_t;

/* Per calling thread: pool threads each reuse their own buffers (first touch of fresh
 * memory is slow on these VMs; see DESIGN.md section 8). A pthread key, not just
 * _Thread_local, so the buffer is freed when its thread exits. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_free(void *arg) {
    scratch_t *s = (scratch_t *)arg;
    if (!s) return;
    free(s->p);
    free(s);
}

static void scratch_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }

static scratch_t *scratch_slot(int create) {
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_key_ok) return NULL;
    scratch_t *s = (scratch_t *)pthread_getspecific(scratch_key);
    if (!s && create) {
        s = (scratch_t *)calloc(1, sizeof *s);
        if (s && pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            s = NULL;
        }
    }
    return s;
}

/* Returns a buffer of at least `bytes` and whether it is cached (*cached = 1) or must be
 * freed by the caller (the key could not be created). */
static void *scratch_get(size_t bytes, int *cached) {
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    scratch_t *s = scratch_slot(1);
    *cached = s != NULL;
    if (!s) return aligned_alloc(64, rounded);
    if (s->size >= bytes) return s->p;
    free(s->p);
    s->p = aligned_alloc(64, rounded);
    s->size = s->p ? rounded : 0;
    return s->p;
}

static _Atomic size_t scratch_keep = SBV_SCRATCH_KEEP_DEFAULT;

size_t sbv_scratch_keep(size_t bytes) {
    if (bytes == SIZE_MAX) return scratch_keep;
    return atomic_exchange(&scratch_keep, bytes);
}

static void scratch_done(void *mem, int cached) {
    if (!cached) {
        free(mem);
        return;
    }
    scratch_t *s = scratch_slot(0);
    if (s && s->size > scratch_keep) sbv_release_scratch();
}

void sbv_release_scratch(void) {
    scratch_t *s = scratch_slot(0);
    if (!s) return;
    free(s->p);
    s->p = NULL;
    s->size = 0;
}

int sbv_abi_version(void) { return SBV_ABI_VERSION; }

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
    /* A */
    size_t finite[SBV_MAX_THREADS];
    double lo[SBV_MAX_THREADS][3], hi[SBV_MAX_THREADS][3];
    size_t finite_base[SBV_MAX_THREADS];
    /* key packing */
    int64_t kmin[3];
    int by, bz, ib, kb, top_bits, top_shift;
    uint64_t idx_mask;
    size_t nbuckets;
    size_t *hist;       /* nt * nbuckets, then offsets */
    size_t *bucket_at;  /* nbuckets + 1 */
    uint64_t *items, *tmp;
    size_t bucket_range[SBV_MAX_THREADS + 1];
    size_t voxels[SBV_MAX_THREADS];
    size_t out_base[SBV_MAX_THREADS];
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
    size_t vrange[SBV_MAX_THREADS + 1];
};

typedef void (*phase_fn)(job_t *, int);

#ifdef SBV_TIMING /* developer aid: per-phase wall times on stderr */
#include <time.h>
static double sbv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define SBV_TICK(label) do { double t_ = sbv_now(); fprintf(stderr, "%s %.2fms ", label, (t_ - sbv_t0) * 1e3); sbv_t0 = t_; } while (0)
#else
#define SBV_TICK(label) do { } while (0)
#endif

typedef struct {
    job_t *job;
    int t;
    phase_fn fn;
} task_t;

static void *trampoline(void *arg) {
    task_t *task = (task_t *)arg;
    task->fn(task->job, task->t);
    return NULL;
}

/* Fork-join one phase over nt threads (the caller runs chunk 0). Thread creation costs
 * tens of microseconds, nothing next to a phase over >= 64k points per thread. */
static int run_phase(job_t *job, phase_fn fn) {
    pthread_t tid[SBV_MAX_THREADS];
    task_t task[SBV_MAX_THREADS];
    int started = 0, rc = SBV_OK;
    for (int t = 1; t < job->nt; t++) {
        task[t] = (task_t){job, t, fn};
        if (pthread_create(&tid[t], NULL, trampoline, &task[t]) != 0) {
            rc = SBV_ENOMEM;
            break;
        }
        started = t;
    }
    fn(job, 0);
    for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
    if (rc != SBV_OK) /* run the chunks whose thread did not start, here */
        for (int t = started + 1; t < job->nt; t++) fn(job, t);
    return SBV_OK;
}

static inline int load_xyz(const job_t *job, const unsigned char *rec, double *x, double *y,
                           double *z) {
    const sbv_plan *pl = &job->plan;
    *x = sbv_load_f(rec + pl->x_off, pl->x_type);
    *y = sbv_load_f(rec + pl->y_off, pl->y_type);
    *z = sbv_load_f(rec + pl->z_off, pl->z_type);
    return isfinite(*x) && isfinite(*y) && isfinite(*z);
}

static void phase_bounds(job_t *job, int t) {
    double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
    size_t count = 0;
    const size_t stride = job->stride;
    const unsigned char *rec = job->data + job->chunk[t] * stride;
    const unsigned char *end = job->data + job->chunk[t + 1] * stride;
    if (job->plan.xyz_packed) {
        float flo[3] = {INFINITY, INFINITY, INFINITY}, fhi[3] = {-INFINITY, -INFINITY, -INFINITY};
        const unsigned char *xp = rec + job->plan.x_off;
        for (; rec < end; rec += stride, xp += stride) {
            float p[3];
            memcpy(p, xp, 12);
            if (!(isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2]))) continue;
            count++;
            for (int a = 0; a < 3; a++) {
                flo[a] = p[a] < flo[a] ? p[a] : flo[a];
                fhi[a] = p[a] > fhi[a] ? p[a] : fhi[a];
            }
        }
        for (int a = 0; a < 3; a++) { lo[a] = flo[a]; hi[a] = fhi[a]; }
    } else {
        for (; rec < end; rec += stride) {
            double p[3];
            if (!load_xyz(job, rec, &p[0], &p[1], &p[2])) continue;
            count++;
            for (int a = 0; a < 3; a++) {
                lo[a] = p[a] < lo[a] ? p[a] : lo[a];
                hi[a] = p[a] > hi[a] ? p[a] : hi[a];
            }
        }
    }
    job->finite[t] = count;
    memcpy(job->lo[t], lo, sizeof lo);
    memcpy(job->hi[t], hi, sizeof hi);
}

static inline double key_of(const job_t *job, double p) {
    return job->plan.xyz_f32 ? sbv_key_f32((float)p, job->plan.voxel_f)
                             : sbv_key_f64(p, job->plan.voxel_d);
}

/* floor(q) as int64 without a libm call; exact for |q| < 2^63, which the bounds check in
 * downsample() guarantees for every finite point (trunc(q) is exact, and (float)k == q
 * whenever |q| >= 2^24 because such floats are already integers). */
static inline int64_t floor_i64(float q) {
    int64_t k = (int64_t)q;
    return (float)k > q ? k - 1 : k;
}

static inline uint64_t pack(const job_t *job, int64_t kx, int64_t ky, int64_t kz, size_t i) {
    uint64_t ux = (uint64_t)kx - (uint64_t)job->kmin[0];
    uint64_t uy = (uint64_t)ky - (uint64_t)job->kmin[1];
    uint64_t uz = (uint64_t)kz - (uint64_t)job->kmin[2];
    uint64_t key = shl(shl(ux, job->by) | uy, job->bz) | uz;
    return shl(key, job->ib) | (uint64_t)i;
}

static void phase_pack(job_t *job, int t) {
    size_t *hist = job->hist + (size_t)t * job->nbuckets;
    memset(hist, 0, job->nbuckets * sizeof *hist);
    uint64_t *dst = job->items + job->finite_base[t];
    const size_t stride = job->stride;
    const int top_shift = job->top_shift;
    const int64_t kmin0 = job->kmin[0], kmin1 = job->kmin[1], kmin2 = job->kmin[2];
    const int by = job->by, bz = job->bz, ib = job->ib;
    if (job->plan.xyz_packed && job->kb + ib < 64) {
        const float v = job->plan.voxel_f;
        const unsigned char *xp = job->data + job->chunk[t] * stride + job->plan.x_off;
        for (size_t i = job->chunk[t]; i < job->chunk[t + 1]; i++, xp += stride) {
            float p[3];
            memcpy(p, xp, 12);
            if (!(isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2]))) continue;
            uint64_t ux = (uint64_t)(floor_i64(p[0] / v) - kmin0);
            uint64_t uy = (uint64_t)(floor_i64(p[1] / v) - kmin1);
            uint64_t uz = (uint64_t)(floor_i64(p[2] / v) - kmin2);
            uint64_t item = ((((ux << by) | uy) << bz | uz) << ib) | (uint64_t)i;
            *dst++ = item;
            hist[shr(item, top_shift)]++;
        }
        return;
    }
    for (size_t i = job->chunk[t]; i < job->chunk[t + 1]; i++) {
        double p[3];
        if (!load_xyz(job, job->data + i * stride, &p[0], &p[1], &p[2])) continue;
        uint64_t item = pack(job, (int64_t)key_of(job, p[0]), (int64_t)key_of(job, p[1]),
                             (int64_t)key_of(job, p[2]), i);
        *dst++ = item;
        hist[shr(item, top_shift)]++;
    }
}

static void phase_scatter(job_t *job, int t) {
    size_t *offs = job->hist + (size_t)t * job->nbuckets;
    const uint64_t *src = job->items + job->finite_base[t];
    const uint64_t *end = src + job->finite[t];
    uint64_t *tmp = job->tmp;
    const int top_shift = job->top_shift;
    for (; src < end; src++) tmp[offs[shr(*src, top_shift)]++] = *src;
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
    uint64_t *src = a, *dst = b;
    for (int shift = lo_bit; shift < lo_bit + bits; shift += 8) {
        int width = lo_bit + bits - shift < 8 ? lo_bit + bits - shift : 8;
        uint64_t mask = ((uint64_t)1 << width) - 1;
        size_t count[256] = {0};
        for (size_t i = 0; i < n; i++) count[(src[i] >> shift) & mask]++;
        if (count[(src[0] >> shift) & mask] == n) continue; /* one digit value: nothing to do */
        size_t sum = 0;
        for (size_t d = 0; d <= mask; d++) {
            size_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) dst[count[(src[i] >> shift) & mask]++] = src[i];
        uint64_t *swap = src;
        src = dst;
        dst = swap;
    }
    if (src != a) memcpy(a, src, n * sizeof *a);
}

static void phase_sort(job_t *job, int t) {
    size_t voxels = 0;
    const int ib = job->ib;
    const int rest = job->top_shift - ib;
    for (size_t bkt = job->bucket_range[t]; bkt < job->bucket_range[t + 1]; bkt++) {
        size_t s = job->bucket_at[bkt], e = job->bucket_at[bkt + 1];
        if (s == e) continue;
        uint64_t *a = job->tmp + s;
        radix_bucket(a, job->items + s, e - s, ib, rest);
        voxels++;
        for (size_t i = 1; i < e - s; i++) voxels += shr(a[i], ib) != shr(a[i - 1], ib);
    }
    job->voxels[t] = voxels;
}

static void phase_reduce(job_t *job, int t) {
    const sbv_cloud *in = job->in;
    const int ib = job->ib;
    unsigned char *out = job->out + job->out_base[t] * job->stride;
    size_t s = job->bucket_at[job->bucket_range[t]];
    const size_t end = job->bucket_at[job->bucket_range[t + 1]];
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
                float p[3];
                memcpy(p, data + (a[j] & mask) * stride + x_off, 12);
                sx += (double)p[0];
                sy += (double)p[1];
                sz += (double)p[2];
            }
            const double c = (double)(e - s);
            float m[3] = {(float)(sx / c), (float)(sy / c), (float)(sz / c)};
            memset(out, 0, stride);
            memcpy(out + x_off, m, 12);
        } else {
            sbv_reduce_voxel(data, stride, in->fields, in->n_fields, a + s, e - s, mask, out);
        }
        out += stride;
        s = e;
    }
}

/* ---- dense grids: count cells, no sort (when the grid is small next to the cloud) ---- */

/* D1: grid cell of every point (mixed radix, so cells ascend in (kx, ky, kz) order) and a
 * per-thread count per cell. */
static void dense_cells(job_t *job, int t) {
    uint32_t *hist = job->chist + (size_t)t * job->cells;
    memset(hist, 0, job->cells * sizeof *hist);
    const size_t stride = job->stride;
    const uint64_t sy = job->span[1], sz = job->span[2];
    const int64_t kmin0 = job->kmin[0], kmin1 = job->kmin[1], kmin2 = job->kmin[2];
    uint32_t *cell = job->cell;
    if (job->plan.xyz_packed) {
        const float v = job->plan.voxel_f;
        const unsigned char *xp = job->data + job->chunk[t] * stride + job->plan.x_off;
        for (size_t i = job->chunk[t]; i < job->chunk[t + 1]; i++, xp += stride) {
            float p[3];
            memcpy(p, xp, 12);
            if (!(isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2]))) {
                cell[i] = SBV_DROPPED;
                continue;
            }
            uint64_t ux = (uint64_t)(floor_i64(p[0] / v) - kmin0);
            uint64_t uy = (uint64_t)(floor_i64(p[1] / v) - kmin1);
            uint64_t uz = (uint64_t)(floor_i64(p[2] / v) - kmin2);
            uint32_t c = (uint32_t)((ux * sy + uy) * sz + uz);
            cell[i] = c;
            hist[c]++;
        }
        return;
    }
    for (size_t i = job->chunk[t]; i < job->chunk[t + 1]; i++) {
        double p[3];
        if (!load_xyz(job, job->data + i * stride, &p[0], &p[1], &p[2])) {
            cell[i] = SBV_DROPPED;
            continue;
        }
        uint64_t u[3];
        for (int a = 0; a < 3; a++) u[a] = (uint64_t)(int64_t)key_of(job, p[a]) - (uint64_t)job->kmin[a];
        uint32_t c = (uint32_t)((u[0] * sy + u[1]) * sz + u[2]);
        cell[i] = c;
        hist[c]++;
    }
}

/* D2: cell number -> voxel number, in place over the chunk. */
static void dense_relabel(job_t *job, int t) {
    const uint32_t *map = job->chist;
    uint32_t *cell = job->cell;
    for (size_t i = job->chunk[t]; i < job->chunk[t + 1]; i++)
        if (cell[i] != SBV_DROPPED) cell[i] = map[cell[i]];
}

/* D3: each thread owns a range of voxels and sums its points in input order (the order
 * every other path sums in), so results do not depend on the thread count. */
static void dense_accumulate(job_t *job, int t) {
    const uint32_t lo = (uint32_t)job->vrange[t], width = (uint32_t)(job->vrange[t + 1] - lo);
    const uint32_t *cell = job->cell;
    const size_t n = job->in->points, stride = job->stride, slots = job->slots;
    const sbv_field *fields = job->in->fields;
    const size_t n_fields = job->in->n_fields;
    sbv_acc *acc = job->acc;
    const int xyz_only = job->plan.xyz_packed && n_fields == 3;
    const uint32_t x_off = job->plan.x_off;
    for (size_t i = 0; i < n; i++) {
        const uint32_t v = cell[i];
        if (v - lo >= width) continue; /* other thread's voxel, or SBV_DROPPED */
        const unsigned char *rec = job->data + i * stride;
        sbv_acc *a = acc + (size_t)v * slots;
        if (xyz_only) {
            float p[3];
            memcpy(p, rec + x_off, 12);
            a[0].d += (double)p[0];
            a[1].d += (double)p[1];
            a[2].d += (double)p[2];
            continue;
        }
        for (size_t f = 0; f < n_fields; f++) {
            const sbv_field fd = fields[f];
            const unsigned char *q = rec + fd.offset;
            sbv_acc *s = a + job->slot_of[f];
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
    }
    /* D4: means into the output, same formulas as sbv_reduce_voxel */
    for (size_t v = lo; v < (size_t)lo + width; v++) {
        unsigned char *out = job->out + v * stride;
        const sbv_acc *a = acc + v * slots;
        const size_t count = job->vcount[v];
        memset(out, 0, stride);
        for (size_t f = 0; f < n_fields; f++) {
            const sbv_field fd = fields[f];
            const sbv_acc *s = a + job->slot_of[f];
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
}

/* Whether the dense path applies; fills span/cells. */
static int dense_fits(job_t *job, const double klo[3], const double khi[3], size_t nf) {
    uint64_t cells = 1;
    for (int a = 0; a < 3; a++) {
        uint64_t span = (uint64_t)(int64_t)khi[a] - (uint64_t)(int64_t)klo[a] + 1;
        if (span == 0 || span > SBV_DENSE_MAX_CELLS) return 0;
        cells *= span;
        if (cells > SBV_DENSE_MAX_CELLS) return 0;
        job->span[a] = span;
    }
    if ((double)cells > SBV_DENSE_CELLS_PER_POINT * (double)nf && cells > 4096) return 0;
    if ((size_t)job->nt * cells * sizeof(uint32_t) > SBV_DENSE_MAX_HIST_BYTES) return 0;
    job->cells = (size_t)cells;
    return 1;
}

static int run_dense(job_t *job, size_t cap, size_t *out_points, char *err, size_t err_len) {
    const size_t n = job->in->points, cells = job->cells;
    const int nt = job->nt;
    size_t bytes = n * sizeof(uint32_t) + ((size_t)nt * cells + cells) * sizeof(uint32_t);
    int cached = 0;
    unsigned char *mem = (unsigned char *)scratch_get(bytes, &cached);
    if (!mem) {
        if (err && err_len) snprintf(err, err_len, "out of memory (%zu bytes of scratch)", bytes);
        return SBV_ENOMEM;
    }
    job->cell = (uint32_t *)mem;
    job->chist = job->cell + n;
    job->vcount = job->chist + (size_t)nt * cells;
    run_phase(job, dense_cells);
    size_t m = 0;
    for (size_t c = 0; c < cells; c++) { /* merge counts; chist[0..cells) becomes the map */
        size_t total = 0;
        for (int t = 0; t < nt; t++) total += job->chist[(size_t)t * cells + c];
        if (total) {
            job->vcount[m] = (uint32_t)total;
            job->chist[c] = (uint32_t)m++;
        } else {
            job->chist[c] = SBV_DROPPED;
        }
    }
    int rc = SBV_OK;
    if (m > cap) {
        if (err && err_len) snprintf(err, err_len, "output capacity %zu too small", cap);
        rc = SBV_EINVAL;
    }
    size_t slots = 0;
    for (size_t f = 0; f < job->in->n_fields; f++) {
        job->slot_of[f] = (uint32_t)slots;
        slots += job->in->fields[f].role == SBV_ROLE_COLOR ? 4 : 1;
    }
    job->slots = slots;
    job->m = m;
    job->acc = rc == SBV_OK ? (sbv_acc *)calloc(m * slots, sizeof(sbv_acc)) : NULL;
    if (rc == SBV_OK && !job->acc) {
        if (err && err_len) snprintf(err, err_len, "out of memory for %zu voxel sums", m);
        rc = SBV_ENOMEM;
    }
    if (rc == SBV_OK) {
        if (nt > 1) run_phase(job, dense_relabel);
        else dense_relabel(job, 0);
        for (int t = 0; t <= nt; t++) job->vrange[t] = m * (size_t)t / (size_t)nt;
        run_phase(job, dense_accumulate);
        *out_points = m;
    }
    free(job->acc);
    job->acc = NULL;
    scratch_done(mem, cached);
    return rc;
}

/* ---- wide keys: comparison sort over (kx, ky, kz, index) ---- */

typedef struct {
    int64_t k[3];
    uint64_t i;
} wide_t;

static int wide_cmp(const void *pa, const void *pb) {
    const wide_t *a = (const wide_t *)pa, *b = (const wide_t *)pb;
    for (int d = 0; d < 3; d++)
        if (a->k[d] != b->k[d]) return a->k[d] < b->k[d] ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static int run_wide(job_t *job, size_t nf, size_t cap, size_t *out_points, char *err,
                    size_t err_len) {
    wide_t *w = (wide_t *)malloc(nf * sizeof *w);
    uint64_t *idx = (uint64_t *)malloc(nf * sizeof *idx);
    if (!w || !idx) {
        free(w);
        free(idx);
        if (err && err_len) snprintf(err, err_len, "out of memory for %zu points", nf);
        return SBV_ENOMEM;
    }
    size_t j = 0;
    for (size_t i = 0; i < job->in->points; i++) {
        double p[3];
        if (!load_xyz(job, job->data + i * job->stride, &p[0], &p[1], &p[2])) continue;
        for (int a = 0; a < 3; a++) w[j].k[a] = (int64_t)key_of(job, p[a]);
        w[j++].i = i;
    }
    qsort(w, nf, sizeof *w, wide_cmp);
    for (size_t i = 0; i < nf; i++) idx[i] = w[i].i;
    size_t m = 0, s = 0;
    while (s < nf) {
        size_t e = s + 1;
        while (e < nf && !memcmp(w[e].k, w[s].k, sizeof w[s].k)) e++;
        if (m >= cap) {
            free(w);
            free(idx);
            if (err && err_len) snprintf(err, err_len, "output capacity %zu too small", cap);
            return SBV_EINVAL;
        }
        sbv_reduce_voxel(job->data, job->stride, job->in->fields, job->in->n_fields, idx + s,
                         e - s, UINT64_MAX, job->out + m * job->stride);
        m++;
        s = e;
    }
    free(w);
    free(idx);
    *out_points = m;
    return SBV_OK;
}

/* ---- entry point ---- */

static int downsample(job_t *job, double voxel_size, int threads, size_t cap, size_t *out_points,
                      char *err, size_t err_len) {
    const sbv_cloud *in = job->in;
    const size_t n = in->points;
    int nt = threads < 1 ? 1 : threads > SBV_MAX_THREADS ? SBV_MAX_THREADS : threads;
    size_t by_size = n / SBV_MIN_POINTS_PER_THREAD;
    if ((size_t)nt > by_size) nt = by_size ? (int)by_size : 1;
    job->nt = nt;
    for (int t = 0; t <= nt; t++) job->chunk[t] = n * (size_t)t / (size_t)nt;

#ifdef SBV_TIMING
    double sbv_t0 = sbv_now();
#endif
    run_phase(job, phase_bounds);
    SBV_TICK("bounds");
    size_t nf = 0;
    double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
    for (int t = 0; t < nt; t++) {
        job->finite_base[t] = nf;
        nf += job->finite[t];
        for (int a = 0; a < 3; a++) {
            lo[a] = job->lo[t][a] < lo[a] ? job->lo[t][a] : lo[a];
            hi[a] = job->hi[t][a] > hi[a] ? job->hi[t][a] : hi[a];
        }
    }
    *out_points = 0;
    if (nf == 0) return SBV_OK;
    if (nf > cap) {
        /* the output can have up to nf records; demand room for all of them */
        if (err && err_len) snprintf(err, err_len, "output capacity %zu < %zu finite points", cap, nf);
        return SBV_EINVAL;
    }
    int bits[3];
    double klo3[3], khi3[3];
    for (int a = 0; a < 3; a++) {
        double klo = key_of(job, lo[a]), khi = key_of(job, hi[a]);
        klo3[a] = klo;
        khi3[a] = khi;
        if (!sbv_key_ok(klo) || !sbv_key_ok(khi)) {
            if (err && err_len)
                snprintf(err, err_len,
                         "voxel index floor(p / %g) exceeds the int64 range on axis %c "
                         "(coordinates %g..%g); use a larger voxel_size",
                         voxel_size, "xyz"[a], lo[a], hi[a]);
            return SBV_EOVERFLOW;
        }
        job->kmin[a] = (int64_t)klo;
        bits[a] = bit_width((uint64_t)(int64_t)khi - (uint64_t)(int64_t)klo);
    }
    if (dense_fits(job, klo3, khi3, nf)) return run_dense(job, cap, out_points, err, err_len);
    job->by = bits[1];
    job->bz = bits[2];
    job->kb = bits[0] + bits[1] + bits[2];
    job->ib = bit_width(n - 1);
    job->idx_mask = job->ib >= 64 ? UINT64_MAX : ((uint64_t)1 << job->ib) - 1;
    if (job->kb + job->ib > 64) return run_wide(job, nf, cap, out_points, err, err_len);

    job->top_bits = job->kb < SBV_TOP_BITS ? job->kb : SBV_TOP_BITS;
    job->top_shift = job->ib + job->kb - job->top_bits;
    job->nbuckets = (size_t)1 << job->top_bits;
    size_t hist_words = (size_t)nt * job->nbuckets + job->nbuckets + 1;
    size_t bytes = 2 * nf * sizeof(uint64_t) + hist_words * sizeof(size_t);
    int cached = 0;
    unsigned char *mem = (unsigned char *)scratch_get(bytes, &cached);
    if (!mem) {
        if (err && err_len) snprintf(err, err_len, "out of memory (%zu bytes of scratch)", bytes);
        return SBV_ENOMEM;
    }
    job->items = (uint64_t *)mem;
    job->tmp = job->items + nf;
    job->hist = (size_t *)(job->tmp + nf);
    job->bucket_at = job->hist + (size_t)nt * job->nbuckets;

    run_phase(job, phase_pack);
    SBV_TICK("pack");
    /* bucket-major, thread-minor offsets keep the scatter stable */
    size_t sum = 0;
    for (size_t b = 0; b < job->nbuckets; b++) {
        job->bucket_at[b] = sum;
        for (int t = 0; t < nt; t++) {
            size_t *h = job->hist + (size_t)t * job->nbuckets + b;
            size_t c = *h;
            *h = sum;
            sum += c;
        }
    }
    job->bucket_at[job->nbuckets] = sum;
    run_phase(job, phase_scatter);
    SBV_TICK("scatter");
    /* contiguous bucket runs of about nf / nt items per thread */
    job->bucket_range[0] = 0;
    size_t b = 0;
    for (int t = 1; t < nt; t++) {
        size_t target = nf * (size_t)t / (size_t)nt;
        while (b < job->nbuckets && job->bucket_at[b + 1] <= target) b++;
        job->bucket_range[t] = b;
    }
    job->bucket_range[nt] = job->nbuckets;
    run_phase(job, phase_sort);
    SBV_TICK("sort");
    size_t m = 0;
    for (int t = 0; t < nt; t++) {
        job->out_base[t] = m;
        m += job->voxels[t];
    }
    run_phase(job, phase_reduce);
    SBV_TICK("reduce");
#ifdef SBV_TIMING
    fprintf(stderr, "\n");
#endif
    scratch_done(mem, cached);
    *out_points = m;
    return SBV_OK;
}

int sbv_downsample_cpu(const sbv_cloud *in, double voxel_size, int threads, void *out,
                       size_t out_capacity, size_t *out_points, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!out_points) return SBV_EINVAL;
    *out_points = 0;
    job_t *job = (job_t *)calloc(1, sizeof *job);
    if (!job) return SBV_ENOMEM;
    int rc = sbv_make_plan(in, voxel_size, &job->plan, err, err_len);
    if (rc == SBV_OK && in->points && !out) {
        if (err && err_len) snprintf(err, err_len, "out is NULL");
        rc = SBV_EINVAL;
    }
    if (rc == SBV_OK && in->points) {
        job->in = in;
        job->data = (const unsigned char *)in->data;
        job->stride = in->stride;
        job->out = (unsigned char *)out;
        rc = downsample(job, voxel_size, threads, out_capacity, out_points, err, err_len);
    }
    free(job);
    return rc;
}
