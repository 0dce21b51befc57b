/*
 * cpu_wide.c - keys too wide to pack: when key bits + index bits exceed 64 (coordinates
 * spread over more than ~2^40 voxels), a single-threaded comparison sort over
 * (kx, ky, kz, index). Slower, same result; real sensor clouds never get here.
 */
#include "cpu_internal.h"

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

int sbvi_run_wide(job_t *job, size_t nf, size_t cap, size_t *out_points, char *err,
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
