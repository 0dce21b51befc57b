/*
 * cpu_dense.c - coarse grids (at most ~0.75 key-grid cells per point): count, do not sort.
 *
 * Each point's cell number (mixed radix, so cells ascend in (kx, ky, kz) order) is counted
 * per thread; occupied cells are numbered in order; then each thread sums the points of its
 * own range of voxels in input order (from per-owner point lists when several threads
 * share the work, so no thread reads another's records) into per-voxel sums that stay in cache.
 * Owning whole voxels keeps every sum in the NumPy reference's order, so the output is
 * bit-identical for any thread count. 1.5-2x faster than sorting on such grids.
 */
#include "cpu_internal.h"

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

/* The thread that owns voxel v: voxels are split into nt contiguous ranges,
 * [ceil(t m / nt), ceil((t + 1) m / nt)) for thread t. */
static inline int owner_of(uint32_t v, int nt, size_t m) {
    return (int)(((uint64_t)v * (uint64_t)nt) / (uint64_t)m);
}

/* D2 (several threads): cell -> voxel number in place, and how many of this chunk's points
 * each owner thread will sum. */
static void dense_relabel(job_t *job, int t) {
    const uint32_t *map = job->chist;
    uint32_t *cell = job->cell;
    size_t *count = job->ocount[t];
    const int nt = job->nt;
    const size_t m = job->m;
    memset(count, 0, (size_t)nt * sizeof *count);
    for (size_t i = job->chunk[t]; i < job->chunk[t + 1]; i++) {
        if (cell[i] == SBV_DROPPED) continue;
        const uint32_t v = map[cell[i]];
        cell[i] = v;
        count[owner_of(v, nt, m)]++;
    }
}

/* D3 (several threads): each owner's point list, chunk after chunk, so in input order. */
static void dense_lists(job_t *job, int t) {
    const uint32_t *cell = job->cell;
    uint32_t *list = job->olist;
    size_t at[SBV_MAX_THREADS];
    const int nt = job->nt;
    const size_t m = job->m;
    memcpy(at, job->ocount[t], (size_t)nt * sizeof *at); /* offsets by now */
    for (size_t i = job->chunk[t]; i < job->chunk[t + 1]; i++)
        if (cell[i] != SBV_DROPPED) list[at[owner_of(cell[i], nt, m)]++] = (uint32_t)i;
}

static inline void add_record(const job_t *job, const unsigned char *rec, sbv_acc *a, int xyz_only) {
    if (xyz_only) {
        float p[3];
        memcpy(p, rec + job->plan.x_off, 12);
        a[0].d += (double)p[0];
        a[1].d += (double)p[1];
        a[2].d += (double)p[2];
        return;
    }
    sbvi_add_record(job->in, job->slot_of, rec, a);
}

/* D4: thread t sums the points of its voxels in input order (the order every other path
 * sums in, so results do not depend on the thread count), then writes their means. */
static void dense_accumulate(job_t *job, int t) {
    const size_t lo = job->vrange[t], hi = job->vrange[t + 1];
    const size_t stride = job->stride, slots = job->slots;
    const int xyz_only = job->plan.xyz_packed && job->in->n_fields == 3;
    sbv_acc *acc = job->acc;
    memset(acc + lo * slots, 0, (hi - lo) * slots * sizeof *acc);
    const uint32_t *cell = job->cell;
    if (job->nt == 1) { /* no lists: map cells to voxels on the fly */
        const uint32_t *map = job->chist;
        for (size_t i = 0; i < job->in->points; i++)
            if (cell[i] != SBV_DROPPED)
                add_record(job, job->data + i * stride, acc + (size_t)map[cell[i]] * slots, xyz_only);
    } else {
        const uint32_t *list = job->olist;
        for (size_t j = job->ostart[t]; j < job->ostart[t + 1]; j++) {
            const size_t i = list[j];
            add_record(job, job->data + i * stride, acc + (size_t)cell[i] * slots, xyz_only);
        }
    }
    /* means into the output, with the formulas of sbv_reduce_voxel */
    for (size_t v = lo; v < hi; v++)
        sbvi_write_means(job->in, job->slot_of, acc + v * slots, job->vcount[v], job->out + v * stride);
}

/* Whether the dense path applies; fills span/cells. */
int sbvi_dense_fits(job_t *job, const double klo[3], const double khi[3], size_t nf) {
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
    if (job->in->points >= (size_t)UINT32_MAX) return 0; /* point lists hold uint32 indices */
    job->cells = (size_t)cells;
    return 1;
}

int sbvi_run_dense(job_t *job, size_t cap, size_t *out_points, char *err, size_t err_len) {
    const size_t n = job->in->points, cells = job->cells;
    const int nt = job->nt;
    const size_t slots = sbvi_slots(job->in, job->slot_of);
    job->slots = slots;
    /* cells, owner lists, per-thread counts, voxel counts, then sums (m <= cells) */
    const size_t max_voxels = cells < n ? cells : n;
    size_t words = n + (nt > 1 ? n : 0) + (size_t)nt * cells + cells;
    words += words & 1; /* 8-byte alignment for the sums */
    size_t bytes = words * sizeof(uint32_t) + max_voxels * slots * sizeof(sbv_acc);
    int cached = 0;
    unsigned char *mem = (unsigned char *)sbvi_scratch_get(bytes, &cached);
    if (!mem) {
        if (err && err_len) snprintf(err, err_len, "out of memory (%zu bytes of scratch)", bytes);
        return SBV_ENOMEM;
    }
    job->cell = (uint32_t *)mem;
    job->olist = job->cell + n;
    job->chist = job->olist + (nt > 1 ? n : 0);
    job->vcount = job->chist + (size_t)nt * cells;
    job->acc = (sbv_acc *)((uint32_t *)mem + words);
    sbvi_run_phase(job, dense_cells);
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
    job->m = m;
    if (m > cap) {
        sbvi_scratch_done(mem, cached);
        if (err && err_len) snprintf(err, err_len, "output capacity %zu too small", cap);
        return SBV_EINVAL;
    }
    for (int t = 0; t <= nt; t++) job->vrange[t] = (m * (size_t)t + (size_t)nt - 1) / (size_t)nt;
    if (nt > 1) {
        sbvi_run_phase(job, dense_relabel);
        size_t at = 0; /* owner-major, chunk-minor: each owner's list in input order */
        for (int o = 0; o < nt; o++) {
            job->ostart[o] = at;
            for (int t = 0; t < nt; t++) {
                size_t c = job->ocount[t][o];
                job->ocount[t][o] = at;
                at += c;
            }
        }
        job->ostart[nt] = at;
        sbvi_run_phase(job, dense_lists);
    }
    sbvi_run_phase(job, dense_accumulate);
    sbvi_scratch_done(mem, cached);
    *out_points = m;
    return SBV_OK;
}
