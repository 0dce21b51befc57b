/*
 * cpu_estimate.c - how many voxels a cloud has, roughly, from a sample: picks between the
 * hash path (cpu_hash.c) and the radix path (cpu_sorted.c) before either touches the cloud.
 */
#include "cpu_internal.h"

#define SAMPLE 2048      /* points sampled, at least... */
#define SAMPLE_MAX 16384 /* ...and at most; n / 64 in between */

/* Packed key of point i: offsets from kmin (by/bz bits for y/z) or, fused, biased 21-bit
 * fields; SBVI_EMPTY_KEY if not finite, FUSED_OUT if a fused key is out of range. */
#define FUSED_OUT (UINT64_MAX - 1)
static inline uint64_t sample_key(const job_t *job, size_t i, int fused) {
    if (fused) { /* float32 x, y, z: keys as floorf(p / v), like the pass */
        const unsigned char *rec = job->data + i * job->stride;
        const sbv_plan *pl = &job->plan;
        float c[3];
        memcpy(&c[0], rec + pl->x_off, 4);
        memcpy(&c[1], rec + pl->y_off, 4);
        memcpy(&c[2], rec + pl->z_off, 4);
        if (!(isfinite(c[0]) && isfinite(c[1]) && isfinite(c[2]))) return SBVI_EMPTY_KEY;
        uint64_t key = 0;
        for (int a = 0; a < 3; a++) {
            const float k = floorf(c[a] / pl->voxel_f);
            if (!(k >= (float)-SBVI_FBIAS && k < (float)SBVI_FBIAS)) return FUSED_OUT;
            key = key << SBVI_FB | (uint64_t)((int64_t)k + SBVI_FBIAS);
        }
        return key;
    }
    double p[3];
    if (!load_xyz(job, job->data + i * job->stride, &p[0], &p[1], &p[2])) return SBVI_EMPTY_KEY;
    uint64_t u[3];
    for (int a = 0; a < 3; a++) {
        const double k = key_of(job, p[a]);
        if (fused) {
            if (!(k >= (double)-SBVI_FBIAS && k < (double)SBVI_FBIAS)) return FUSED_OUT;
            u[a] = (uint64_t)((int64_t)k + SBVI_FBIAS);
        } else {
            u[a] = (uint64_t)(int64_t)k - (uint64_t)job->kmin[a];
        }
    }
    if (fused) return u[0] << (2 * SBVI_FB) | u[1] << SBVI_FB | u[2];
    return (shl(u[0], job->by) | u[1]) << job->bz | u[2];
}

/* Voxels in the cloud, estimated from a pseudo-random sample: distinct keys d, keys seen
 * once f1 and twice f2, then Chao1 (d + f1^2 / 2 f2), capped at `most`; `most` also when the
 * sample is mostly singletons (the hash path is not worth it). Cheap (n / 64 key
 * computations, 2048..16384) and a lower bound in practice (lidar: 6-20x low for a few
 * dense voxels near the sensor and many sparse ones), so the caller keeps a margin and
 * the pass gives up early when its own count runs away. SIZE_MAX when a fused key is out
 * of range. */
size_t sbvi_hash_estimate(job_t *job, int fused, size_t most) {
    const size_t n = job->in->points;
    const int all = n <= 2 * SAMPLE; /* small clouds: every point, an exact count */
    /* The sample grows with the cloud: a sample of fixed size sees a 1M-point sweep and a
     * 100k-point one of the same scene alike, though the big one has many more sparse voxels. */
    size_t samples = n / 64 < SAMPLE ? SAMPLE : n / 64 > SAMPLE_MAX ? SAMPLE_MAX : n / 64;
    if (all) samples = n;
    enum { CAP = 2 * SAMPLE_MAX };
    static _Thread_local uint64_t keys[CAP]; /* 320 KB with hits: too much for a stack */
    static _Thread_local uint16_t hits[CAP];
    size_t cap = 4 * SAMPLE;
    while (cap < 2 * samples) cap <<= 1;
    const int cshift = 64 - bit_width(cap - 1);
    memset(keys, 0xff, cap * sizeof keys[0]);
    memset(hits, 0, cap * sizeof hits[0]);
    size_t seen = 0, d = 0;
    /* fused: the sample's key bounds per axis, for a guessed key frame (voxel_cpu.c) */
    job->sample_ok = 0;
    for (int a = 0; a < 3; a++) {
        job->sample_klo[a] = INT64_MAX;
        job->sample_khi[a] = INT64_MIN;
    }
    for (size_t s = 0; s < samples; s++) {
        /* pseudo-random positions (a stride would alias with scan lines and lidar beams),
         * each a cache miss: prefetch a few samples ahead so the misses overlap */
        const size_t i = all ? s : (size_t)(((sbvi_mix(s + 1) >> 32) * (uint64_t)n) >> 32);
        if (!all)
            __builtin_prefetch(job->data +
                               (size_t)(((sbvi_mix(s + 17) >> 32) * (uint64_t)n) >> 32) * job->stride);
        const uint64_t k = sample_key(job, i, fused);
        if (k == SBVI_EMPTY_KEY) continue;
        if (k == FUSED_OUT) {
            job->sample_ok = 0;
            return SIZE_MAX;
        }
        seen++;
        if (fused) {
            for (int a = 0; a < 3; a++) {
                const int64_t key = (int64_t)(k >> (SBVI_FB * (2 - a)) & (((uint64_t)1 << SBVI_FB) - 1)) -
                                    SBVI_FBIAS;
                job->sample_klo[a] = key < job->sample_klo[a] ? key : job->sample_klo[a];
                job->sample_khi[a] = key > job->sample_khi[a] ? key : job->sample_khi[a];
            }
            job->sample_ok = 1;
        }
        size_t h = (size_t)(sbvi_mix(k) >> cshift);
        while (keys[h] != k && keys[h] != SBVI_EMPTY_KEY) h = (h + 1) & (cap - 1);
        if (keys[h] == SBVI_EMPTY_KEY) {
            keys[h] = k;
            d++;
        }
        hits[h]++;
        if (s + 1 == SAMPLE && samples > SAMPLE && 100 * d > 97 * seen)
            return most; /* already plain: nearly every sampled point in a voxel of its own */
    }
    if (all) return d;
    if (seen == 0) return most;
    size_t c1 = 0, c2 = 0;
    for (size_t h = 0; h < cap; h++) {
        c1 += hits[h] == 1;
        c2 += hits[h] == 2;
    }
    const double f1 = (double)c1, f2 = (double)c2;
    /* Mostly singletons: few points per voxel, so nearly every point would probe the table
     * (and the table is large): the radix path streams better there. */
    if (f1 > 0.75 * (double)seen) return most;
    double est = (double)d + f1 * (f1 - 1) / (2 * (f2 + 1));
#ifdef SBV_TIMING
    fprintf(stderr, "seen %zu d %zu f1 %g f2 %g ", seen, d, f1, f2);
#endif
    return est >= (double)most ? most : (size_t)est;
}

