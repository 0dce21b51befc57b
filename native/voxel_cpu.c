/*
 * voxel_cpu.c - the CPU voxel-grid kernel (plain C11 + pthreads, no Python): entry point.
 *
 * Step A (bounds, split over `threads` chunks): finite count and min/max of x, y, z;
 * key bounds follow because floor(p / v) is monotonic in p, so the int64 overflow check
 * happens once, here (float32 clouds the estimate sent to the radix path first try a key frame
 * guessed from its sample instead: guess_frame). The key spans then pick one of three ways to
 * finish:
 *
 *   cpu_dense.c   coarse grids (<= ~0.75 cells per point): count cells, no sort;
 *   cpu_hash.c    one thread and few voxels: hash-accumulate, then sort the voxels
 *                 (cpu_estimate.c guesses the voxel count first);
 *   cpu_sorted.c  the general case: radix-sort 8-byte (packed key, index) items;
 *   cpu_wide.c    keys + index wider than 64 bits: comparison sort, single thread.
 *
 * All three sum each voxel's points in input order in float64 (integers exactly), so every
 * path, at every thread count, returns the NumPy reference's bytes.
 */
#define _GNU_SOURCE
#include "cpu_internal.h"


int sbv_abi_version(void) { return SBV_ABI_VERSION; }

/* Finite count and min/max of x, y, z over points [first, last) into block b's slots. */
static void bounds_block(job_t *job, size_t b, size_t first, size_t last) {
    double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
    size_t count = 0;
    const size_t stride = job->stride;
    const unsigned char *rec = job->data + first * stride;
    const unsigned char *end = job->data + last * stride;
    if (job->plan.xyz_f32) {
        /* four-byte loads: a 12-byte memcpy went through the stack and stalled (a branch-free
         * variant measured slower on lidar, and the NaN-holed organized frames mostly take
         * the hash path, which needs no bounds pass) */
        float lx = INFINITY, ly = INFINITY, lz = INFINITY;
        float hx = -INFINITY, hy = -INFINITY, hz = -INFINITY;
        const uint32_t xo = job->plan.x_off, yo = job->plan.y_off, zo = job->plan.z_off;
#if SBV_SSE2
        /* four points at a time (sbvi_load4): dropped points' lanes become +-inf */
        const size_t safe = sbvi_load16_points(job), hi4 = last < safe ? last : safe;
        const __m128 pinf = _mm_set1_ps(INFINITY), ninf = _mm_set1_ps(-INFINITY);
        __m128 LX = pinf, LY = pinf, LZ = pinf, HX = ninf, HY = ninf, HZ = ninf;
        for (size_t i = first; i + 4 <= hi4; i += 4, rec += 4 * stride) {
            __m128 r[4], X, Y, Z;
            sbvi_load4(rec, stride, &job->plan, job->plan.xyz_packed, r, &X, &Y, &Z);
            const __m128 fin = sbvi_finite4(X, Y, Z);
            count += (size_t)((0x4332322132212110ull >> (4 * _mm_movemask_ps(fin))) & 15); /* popcount */
#define KEEP(P, E) _mm_or_ps(_mm_and_ps(fin, P), _mm_andnot_ps(fin, E))
            LX = _mm_min_ps(LX, KEEP(X, pinf));
            LY = _mm_min_ps(LY, KEEP(Y, pinf));
            LZ = _mm_min_ps(LZ, KEEP(Z, pinf));
            HX = _mm_max_ps(HX, KEEP(X, ninf));
            HY = _mm_max_ps(HY, KEEP(Y, ninf));
            HZ = _mm_max_ps(HZ, KEEP(Z, ninf));
#undef KEEP
        }
        float l4[3][4], h4[3][4];
        _mm_storeu_ps(l4[0], LX);
        _mm_storeu_ps(l4[1], LY);
        _mm_storeu_ps(l4[2], LZ);
        _mm_storeu_ps(h4[0], HX);
        _mm_storeu_ps(h4[1], HY);
        _mm_storeu_ps(h4[2], HZ);
        for (int j = 0; j < 4; j++) {
            lx = l4[0][j] < lx ? l4[0][j] : lx;
            ly = l4[1][j] < ly ? l4[1][j] : ly;
            lz = l4[2][j] < lz ? l4[2][j] : lz;
            hx = h4[0][j] > hx ? h4[0][j] : hx;
            hy = h4[1][j] > hy ? h4[1][j] : hy;
            hz = h4[2][j] > hz ? h4[2][j] : hz;
        }
#endif
        for (; rec < end; rec += stride) { /* the rest, one at a time */
            float x, y, z;
            memcpy(&x, rec + xo, 4);
            memcpy(&y, rec + yo, 4);
            memcpy(&z, rec + zo, 4);
            if (!(isfinite(x) && isfinite(y) && isfinite(z))) continue;
            count++;
            lx = x < lx ? x : lx;
            ly = y < ly ? y : ly;
            lz = z < lz ? z : lz;
            hx = x > hx ? x : hx;
            hy = y > hy ? y : hy;
            hz = z > hz ? z : hz;
        }
        lo[0] = lx;
        lo[1] = ly;
        lo[2] = lz;
        hi[0] = hx;
        hi[1] = hy;
        hi[2] = hz;
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
    job->finite[b] = count;
    memcpy(job->lo[b], lo, sizeof lo);
    memcpy(job->hi[b], hi, sizeof hi);
}

/* Blocks taken by whichever thread is free (a helper just woken starts late and slow). */
static void phase_bounds(job_t *job, int t) {
    (void)t;
    for (size_t b; (b = sbvi_claim(job, job->nblocks)) != SIZE_MAX;)
        bounds_block(job, b, sbvi_block_lo(job, b), sbvi_block_lo(job, b + 1));
}

/* A key frame from the estimate's sample (job->sample_klo/khi) instead of a bounds pass: per
 * axis the sample's key span padded by a sixteenth (at least 2 keys) on each side, in as many
 * bits as that needs, the spare keys split evenly below and above. The pack checks that every
 * point fell inside it (sbvi_run_sorted); a sample of n / 64 points misses a few outliers,
 * rarely more than a sixteenth of the span beyond. 0 when the exact path must decide (a
 * dense grid is possible, or keys and index would not fit 63 bits). */
static int guess_frame(job_t *job, size_t n) {
    int bits[3];
    double klo[3], khi[3];
    for (int a = 0; a < 3; a++) {
        const int64_t lo = job->sample_klo[a], hi = job->sample_khi[a];
        const uint64_t span = (uint64_t)(hi - lo), pad = span / 16 > 2 ? span / 16 : 2;
        bits[a] = bit_width(span + 2 * pad);
        const uint64_t window = ((uint64_t)1 << bits[a]) - 1;
        job->kmin[a] = lo - (int64_t)((window - span) / 2);
        klo[a] = (double)lo;
        khi[a] = (double)hi;
    }
    if (sbvi_dense_fits(job, klo, khi, n)) return 0; /* the sample's span: cells at most */
    job->by = bits[1];
    job->bz = bits[2];
    job->kb = bits[0] + bits[1] + bits[2];
    job->ib = bit_width(n - 1);
    if (job->kb + job->ib > 63) return 0;
    job->idx_mask = ((uint64_t)1 << job->ib) - 1;
    for (size_t b = 0; b < job->nblocks; b++) job->finite_base[b] = sbvi_block_lo(job, b);
    return 1;
}

/* Per calling thread: calls that guessed, guesses that missed, and the back-off after a miss
 * (a cloud whose sample misses its extremes, e.g. long-tailed lidar ranges, misses again in
 * the next frames of its stream; each miss costs a pack): the next `skip` calls take the
 * bounds pass, where `skip` doubles with each miss (at most 63) and halves with each hit. */
static _Thread_local size_t guesses, misses;
static _Thread_local unsigned backoff, skip;

void sbv_frame_guesses(size_t *guessed, size_t *missed, int reset) {
    if (guessed) *guessed = guesses;
    if (missed) *missed = misses;
    if (reset) backoff = skip = 0;
}

/* Whether the back-off lets this call guess. */
static int may_guess(void) {
    if (skip) {
        skip--;
        return 0;
    }
    return 1;
}

/* Count a guess that ran, and move the back-off by its outcome. */
static void guess_outcome(int missed) {
    guesses++;
    if (missed) {
        misses++;
        backoff = backoff * 2 + 1 < 63 ? backoff * 2 + 1 : 63;
        skip = backoff;
    } else {
        backoff >>= 1;
    }
}

/* ---- entry point ---- */

/* Threads a call uses: as asked, at most one per SBV_MIN_POINTS_PER_THREAD points. */
static int threads_for(size_t n, int threads) {
    int nt = threads < 1 ? 1 : threads > SBV_MAX_THREADS ? SBV_MAX_THREADS : threads;
    const size_t by_size = n / SBV_MIN_POINTS_PER_THREAD;
    if ((size_t)nt > by_size) nt = by_size ? (int)by_size : 1;
    return nt;
}

static int downsample(job_t *job, double voxel_size, int threads, size_t cap, size_t *out_points,
                      char *err, size_t err_len) {
    const sbv_cloud *in = job->in;
    const size_t n = in->points;
    const int nt = threads_for(n, threads);
    job->nt = nt;
    for (int t = 0; t <= nt; t++) job->chunk[t] = n * (size_t)t / (size_t)nt;
    job->split = nt > 1 ? SBV_SPLIT : 1;
    job->nblocks = (size_t)nt * (size_t)job->split;
    job->nruns = nt > 1 ? (size_t)nt * SBV_RUN_SPLIT : 1;

    /* One thread, float32 x/y/z, few voxels: the hash path needs no bounds pass first. */
    const size_t limit = sbv_hash_voxels_max(SIZE_MAX);
    int tried_hash = 0;
    *out_points = 0;
    if (nt <= 2 && job->plan.xyz_f32 && limit) {
        tried_hash = 1;
        const size_t estimate = sbvi_hash_estimate(job, 1, n);
#ifdef SBV_TIMING
        fprintf(stderr, "fused estimate %zu ", estimate);
#endif
        /* The estimate is rough (low for lidar); the pass also gives up early when it must.
         * With two threads, one hashing thread still beats two sorting ones when the table
         * stays in cache (measured 2-2.5x one sorting thread vs ~1.7x for two). */
        if (estimate <= limit / 2 && (nt == 1 || estimate <= SBV_HASH_DIRECT_VOXELS)) {
            sbvi_team_hold(nt, 0); /* one thread hashes: the helper need not spin meanwhile */
            job->nt = 1;
            int rc = sbvi_run_hash(job, 1, estimate, cap, out_points, err, err_len);
            job->nt = nt;
            if (rc != SBVI_HASH_FULL) return rc;
        }
    }
    /* Float32 x/y/z: the estimate's sample has given key bounds; a frame padded around them
     * usually holds every point, and then the pack needs no bounds pass before it (items at
     * most one per point, so n stands in for the finite count). */
    if (tried_hash && job->sample_ok && n >= SBV_GUESS_MIN_POINTS && cap >= n && may_guess() &&
        guess_frame(job, n)) {
        job->guessed = 1;
        const int rc = sbvi_run_sorted(job, n, out_points, err, err_len);
        job->guessed = 0;
        guess_outcome(rc == SBVI_GUESS_MISS);
        if (rc != SBVI_GUESS_MISS) return rc;
#ifdef SBV_TIMING
        fprintf(stderr, "guess missed ");
#endif
    }
#ifdef SBV_TIMING
    double sbv_t0 = sbv_now();
#endif
    atomic_store_explicit(&job->claim, 0, memory_order_relaxed);
    sbvi_run_phase(job, phase_bounds);
    SBV_TICK("bounds");
    size_t nf = 0;
    double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
    for (size_t b = 0; b < job->nblocks; b++) {
        job->finite_base[b] = nf;
        nf += job->finite[b];
        for (int a = 0; a < 3; a++) {
            lo[a] = job->lo[b][a] < lo[a] ? job->lo[b][a] : lo[a];
            hi[a] = job->hi[b][a] > hi[a] ? job->hi[b][a] : hi[a];
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
    job->by = bits[1];
    job->bz = bits[2];
    job->kb = bits[0] + bits[1] + bits[2];
    if (sbvi_dense_fits(job, klo3, khi3, nf)) return sbvi_run_dense(job, cap, out_points, err, err_len);
    if (nt == 1 && !tried_hash && job->kb <= 63 && limit) {
        const size_t estimate = sbvi_hash_estimate(job, 0, nf);
        if (estimate <= limit / 2) {
            int rc = sbvi_run_hash(job, 0, estimate, cap, out_points, err, err_len);
            if (rc != SBVI_HASH_FULL) return rc;
        }
    }
    job->ib = bit_width(n - 1);
    job->idx_mask = job->ib >= 64 ? UINT64_MAX : ((uint64_t)1 << job->ib) - 1;
    if (job->kb + job->ib > 64) return sbvi_run_wide(job, nf, cap, out_points, err, err_len);
    return sbvi_run_sorted(job, nf, out_points, err, err_len);
}

int sbv_downsample_cpu(const sbv_cloud *in, double voxel_size, int threads, void *out,
                       size_t out_capacity, size_t *out_points, char *err, size_t err_len) {
    if (err && err_len) err[0] = '\0';
    if (!out_points) return SBV_EINVAL;
    *out_points = 0;
    /* The job lives in thread-local storage: no allocation per call (it is ~50 KB). Only the
     * fields below are set here; every path sets the rest before reading them. */
    static _Thread_local job_t tls_job;
    job_t *job = &tls_job;
    memset(&job->plan, 0, sizeof job->plan);
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
        /* helpers woken now are awake when the first phase starts (after the estimate) */
        const int held = threads_for(in->points, threads);
        sbvi_team_hold(held, 1);
        rc = downsample(job, voxel_size, threads, out_capacity, out_points, err, err_len);
        sbvi_team_hold(held, 0);
    }
    return rc;
}
