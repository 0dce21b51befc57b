/*
 * cpu_hash.c - finish the sorted path by buckets: hash-accumulate each MSD bucket's points into
 * a small table, then sort that bucket's voxels, not its points.
 *
 * Why: after the MSD scatter (cpu_sorted.c, steps B-C) a bucket holds the points of a narrow
 * key range, in input order: a few hundred points and a few dozen to a few hundred voxels on
 * sensor frames. The LSD passes that sort those points, and the reduce pass that then gathers
 * their records in key order, touch every point two to four more times. A table of the
 * bucket's voxels stays in L1; each point is summed into its voxel as it comes (in input
 * order, so the sums are the NumPy reference's bytes), and only the voxels are sorted.
 *
 *   H1 (threads over bucket runs)  per bucket: reset a table sized for it, sum each point's
 *      record into its voxel (a one-entry cache skips the probe for runs of one voxel), sort
 *      the bucket's new voxels by key; count voxels;
 *   H2 (same runs)                 means written at the thread's prefix offset.
 */
#include "cpu_internal.h"

#define SBV_TABLE_MIN_BITS 6
#define SBV_INSERTION_SORT 24

static inline size_t hash_slot(uint64_t key, int bits) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static int table_bits(size_t points) {
    int bits = SBV_TABLE_MIN_BITS;
    while (((size_t)1 << bits) < 2 * points) bits++;
    return bits;
}

/* The voxel number of `key` in the current bucket's table, created with zero sums when new.
 * The table has at least twice as many entries as the bucket has points: no growth. */
static inline uint32_t voxel_of(sbv_owner *o, uint64_t key, size_t slots) {
    const size_t mask = ((size_t)1 << o->tbits) - 1;
    size_t h = hash_slot(key, o->tbits);
    for (;;) {
        const uint32_t e = o->table[h];
        if (!e) break;
        if (o->vkey[e - 1] == key) return e - 1;
        h = (h + 1) & mask;
    }
    const uint32_t v = (uint32_t)o->m++;
    o->vkey[v] = key;
    o->vcnt[v] = 0;
    memset(o->acc + (size_t)v * slots, 0, slots * sizeof *o->acc);
    o->table[h] = v + 1;
    return v;
}

/* order[0..m) = voxel numbers base.. base+m in key order (LSD radix on (key, number) pairs). */
static void sort_voxels(sbv_owner *o, size_t base, size_t m, uint32_t *order, int kb) {
    const uint64_t *keys = o->vkey + base;
    if (m <= SBV_INSERTION_SORT) { /* keys are distinct */
        for (size_t i = 0; i < m; i++) {
            size_t j = i;
            for (; j > 0 && keys[order[j - 1] - base] > keys[i]; j--) order[j] = order[j - 1];
            order[j] = (uint32_t)(base + i);
        }
        return;
    }
    uint64_t *k = o->skey, *k2 = o->skey2;
    uint32_t *id = o->sid, *id2 = o->sid2;
    for (size_t v = 0; v < m; v++) {
        k[v] = keys[v];
        id[v] = (uint32_t)(base + v);
    }
    const int passes = (kb + 7) / 8;
    uint32_t hist[8][256];
    memset(hist, 0, (size_t)passes * sizeof hist[0]);
    for (size_t v = 0; v < m; v++)
        for (int p = 0; p < passes; p++) hist[p][(k[v] >> (8 * p)) & 255]++;
    for (int p = 0; p < passes; p++) {
        const int shift = 8 * p;
        if (hist[p][(k[0] >> shift) & 255] == m) continue; /* one digit value: nothing to do */
        uint32_t sum = 0;
        for (int d = 0; d < 256; d++) {
            const uint32_t c = hist[p][d];
            hist[p][d] = sum;
            sum += c;
        }
        for (size_t v = 0; v < m; v++) {
            const uint32_t at = hist[p][(k[v] >> shift) & 255]++;
            k2[at] = k[v];
            id2[at] = id[v];
        }
        uint64_t *tk = k;
        k = k2;
        k2 = tk;
        uint32_t *ti = id;
        id = id2;
        id2 = ti;
    }
    memcpy(order, id, m * sizeof *order);
}

static void phase_accumulate(job_t *job, int t) {
    sbv_owner *o = &job->owner[t];
    const size_t stride = job->stride, slots = job->slots;
    const unsigned char *data = job->data;
    const int xyz_only = job->plan.xyz_packed && job->in->n_fields == 3;
    const uint32_t x_off = job->plan.x_off;
    const int ib = job->ib;
    const uint64_t mask = job->idx_mask;
    const uint64_t *items = job->tmp;
    const size_t all_end = job->bucket_at[job->bucket_range[t + 1]];
    o->m = 0;
    for (size_t b = job->bucket_range[t]; b < job->bucket_range[t + 1]; b++) {
        const size_t s = job->bucket_at[b], e = job->bucket_at[b + 1];
        if (s == e) continue;
        o->tbits = table_bits(e - s);
        memset(o->table, 0, ((size_t)1 << o->tbits) * sizeof *o->table);
        const size_t base = o->m;
        uint64_t last = 0;
        sbv_acc *a = NULL;
        uint32_t v = 0;
        for (size_t j = s; j < e; j++) {
            const uint64_t item = items[j];
            if (j + SBV_PREFETCH < all_end)
                __builtin_prefetch(data + (items[j + SBV_PREFETCH] & mask) * stride);
            const unsigned char *rec = data + (item & mask) * stride;
            const uint64_t key = shr(item, ib);
            if (key != last || !a) {
                v = voxel_of(o, key, slots);
                a = o->acc + (size_t)v * slots;
                last = key;
            }
            o->vcnt[v]++;
            if (xyz_only) {
                float p[3];
                memcpy(p, rec + x_off, 12);
                a[0].d += (double)p[0];
                a[1].d += (double)p[1];
                a[2].d += (double)p[2];
            } else {
                sbvi_add_record(job->in, job->slot_of, rec, a);
            }
        }
        sort_voxels(o, base, o->m - base, o->order + base, job->kb);
    }
    job->voxels[t] = o->m;
}

static void phase_write(job_t *job, int t) {
    const sbv_owner *o = &job->owner[t];
    const size_t stride = job->stride, slots = job->slots;
    const int xyz_only = job->plan.xyz_packed && job->in->n_fields == 3;
    const uint32_t x_off = job->plan.x_off;
    unsigned char *out = job->out + job->out_base[t] * stride;
    for (size_t j = 0; j < o->m; j++, out += stride) {
        const uint32_t v = o->order[j];
        const sbv_acc *a = o->acc + (size_t)v * slots;
        if (xyz_only) {
            const double c = (double)o->vcnt[v];
            const float mean[3] = {(float)(a[0].d / c), (float)(a[1].d / c), (float)(a[2].d / c)};
            if (stride != 12) memset(out, 0, stride);
            memcpy(out + x_off, mean, 12);
        } else {
            sbvi_write_means(job->in, job->slot_of, a, o->vcnt[v], out);
        }
    }
}

static size_t align64(size_t b) { return (b + 63) & ~(size_t)63; }

/* Per thread: voxel arrays for as many voxels as it has points, a table and sort scratch for
 * its largest bucket. Voxel keys reuse job->items (free once the scatter has run). */
static size_t owner_bytes(size_t points, size_t biggest, size_t slots) {
    return align64(points * 4) * 2 + align64(points * slots * 8) +
           align64(((size_t)4 << table_bits(biggest))) + align64(biggest * 8) * 2 +
           align64(biggest * 4) * 2;
}

int sbvi_finish_hashed(job_t *job, size_t *out_points, char *err, size_t err_len) {
    const int nt = job->nt;
    const size_t slots = sbvi_slots(job->in, job->slot_of);
    job->slots = slots;
    size_t points[SBV_MAX_THREADS], biggest[SBV_MAX_THREADS], bytes = 0;
    for (int t = 0; t < nt; t++) {
        const size_t s = job->bucket_at[job->bucket_range[t]];
        points[t] = job->bucket_at[job->bucket_range[t + 1]] - s;
        biggest[t] = 1;
        for (size_t b = job->bucket_range[t]; b < job->bucket_range[t + 1]; b++) {
            const size_t c = job->bucket_at[b + 1] - job->bucket_at[b];
            biggest[t] = c > biggest[t] ? c : biggest[t];
        }
        bytes += owner_bytes(points[t], biggest[t], slots);
    }
    int cached = 0;
    unsigned char *mem = (unsigned char *)sbvi_scratch_get_slot(1, bytes, &cached);
    if (!mem) {
        if (err && err_len) snprintf(err, err_len, "out of memory (%zu bytes of scratch)", bytes);
        return SBV_ENOMEM;
    }
    unsigned char *p = mem;
    for (int t = 0; t < nt; t++) {
        sbv_owner *o = &job->owner[t];
        const size_t n = points[t], big = biggest[t];
        o->vkey = job->items + job->bucket_at[job->bucket_range[t]];
        o->vcnt = (uint32_t *)p;
        p += align64(n * 4);
        o->order = (uint32_t *)p;
        p += align64(n * 4);
        o->acc = (sbv_acc *)p;
        p += align64(n * slots * 8);
        o->table = (uint32_t *)p;
        p += align64((size_t)4 << table_bits(big));
        o->skey = (uint64_t *)p;
        p += align64(big * 8);
        o->skey2 = (uint64_t *)p;
        p += align64(big * 8);
        o->sid = (uint32_t *)p;
        p += align64(big * 4);
        o->sid2 = (uint32_t *)p;
        p += align64(big * 4);
    }
    sbvi_run_phase(job, phase_accumulate);
    size_t m = 0;
    for (int t = 0; t < nt; t++) {
        job->out_base[t] = m;
        m += job->voxels[t];
    }
    sbvi_run_phase(job, phase_write);
    sbvi_scratch_done_slot(1, mem, cached);
    *out_points = m;
    return SBV_OK;
}
