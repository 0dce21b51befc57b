/*
 * voxel_cuda.cu - the CUDA voxel-grid kernel behind native/simbridge_voxel.h, batched.
 *
 * A batch is any number of frames with one layout (stride and fields), each with its own voxel
 * size. Per batch: one transfer in, one sort, one transfer out, all on the calling thread's
 * own stream with its own cached device and pinned host buffers (so worker threads submitting
 * batches at once overlap transfers with each other's kernels, and nothing is allocated per
 * call once the buffers have grown):
 *
 *   1. keys:   a thread per point loads x, y, z (sbv_body.h), drops non-finite points, computes
 *              the int64 keys with the CPU kernel's sbv_key_* and folds per-frame key bounds
 *              (warp-reduced atomics); overflow is flagged per frame;
 *   2. plan:   the host reads the bounds back (one small copy) and picks bit widths;
 *   3. pack:   one 64-bit item key per point: frame number in the top bits, then the key offsets
 *              (kx, ky, kz); dropped points get all ones and sort last;
 *   4. sort:   one CUB radix sort of (item key, point index) pairs over the bits in use; radix
 *              sort is stable, so each voxel's points stay in input order;
 *   5. reduce: voxel starts where the key changes; a thread per voxel sums its points in input
 *              order in float64 with sbv_reduce_voxel, the CPU kernel's own code.
 *
 * Every voxel is summed sequentially in input order in float64 (no atomics on sums, no
 * fast-math), so the output equals the CPU kernel's bit for bit; the tests only claim the
 * tolerance in native/README.md. Keys wider than 64 bits with the frame number are refused
 * (SBV_EINVAL; the Python side decimates that frame on the CPU).
 */
#include <cuda_runtime.h>
#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "sbv_body.h"

namespace {

struct FieldTable {
    sbv_field f[SBV_MAX_FIELDS];
    unsigned n;
};

constexpr unsigned T = 256;
constexpr int MAX_BATCH = 4096;

/* Per frame on the device: key bounds (as offset-free int64), flags, point range. */
struct FrameDev {
    unsigned long long start, count; /* points of the frame in the batch */
    double voxel_d;
    float voxel_f;
    int overflow;
    long long lo[3], hi[3];
    unsigned long long finite;
    unsigned long long voxels;
    int by, bz, kb; /* filled by the host after the plan step */
};

__device__ inline unsigned frame_of(const FrameDev *fr, unsigned nframes, unsigned long long i) {
    unsigned a = 0, b = nframes; /* last frame whose start <= i */
    while (b - a > 1) {
        unsigned mid = (a + b) / 2;
        if (fr[mid].start <= i) a = mid; else b = mid;
    }
    return a;
}

__device__ inline bool point_keys(const unsigned char *rec, const sbv_plan &plan, const FrameDev &f,
                                  long long k[3], bool *overflow) {
    double x = sbv_load_f(rec + plan.x_off, plan.x_type);
    double y = sbv_load_f(rec + plan.y_off, plan.y_type);
    double z = sbv_load_f(rec + plan.z_off, plan.z_type);
    *overflow = false;
    if (!(isfinite(x) && isfinite(y) && isfinite(z))) return false;
    double q[3];
    if (plan.xyz_f32) {
        q[0] = sbv_key_f32((float)x, f.voxel_f);
        q[1] = sbv_key_f32((float)y, f.voxel_f);
        q[2] = sbv_key_f32((float)z, f.voxel_f);
    } else {
        q[0] = sbv_key_f64(x, f.voxel_d);
        q[1] = sbv_key_f64(y, f.voxel_d);
        q[2] = sbv_key_f64(z, f.voxel_d);
    }
    if (!(sbv_key_ok(q[0]) && sbv_key_ok(q[1]) && sbv_key_ok(q[2]))) {
        *overflow = true;
        return false;
    }
    for (int a = 0; a < 3; a++) k[a] = (long long)q[a];
    return true;
}

__global__ void bounds_kernel(const unsigned char *data, size_t n, size_t stride, sbv_plan plan,
                              FrameDev *fr, unsigned nframes) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const unsigned lane = threadIdx.x & 31;
    bool valid = false, over = false;
    unsigned f = 0;
    long long k[3] = {0, 0, 0};
    if (i < n) {
        f = frame_of(fr, nframes, i);
        valid = point_keys(data + i * stride, plan, fr[f], k, &over);
        if (over) atomicOr(&fr[f].overflow, 1);
    }
    /* warp-level pre-reduction when the whole warp is in one frame (the usual case) */
    const unsigned f0 = __shfl_sync(0xffffffffu, f, 0);
    const bool same = __all_sync(0xffffffffu, i >= n || f == f0);
    if (same) {
        long long lo[3], hi[3];
        for (int a = 0; a < 3; a++) {
            lo[a] = valid ? k[a] : LLONG_MAX;
            hi[a] = valid ? k[a] : LLONG_MIN;
        }
        unsigned cnt = valid;
        for (int off = 16; off; off >>= 1) {
            for (int a = 0; a < 3; a++) {
                lo[a] = min(lo[a], __shfl_down_sync(0xffffffffu, lo[a], off));
                hi[a] = max(hi[a], __shfl_down_sync(0xffffffffu, hi[a], off));
            }
            cnt += __shfl_down_sync(0xffffffffu, cnt, off);
        }
        if (lane == 0 && cnt) {
            for (int a = 0; a < 3; a++) {
                atomicMin(&fr[f0].lo[a], lo[a]);
                atomicMax(&fr[f0].hi[a], hi[a]);
            }
            atomicAdd(&fr[f0].finite, (unsigned long long)cnt);
        }
    } else if (valid) {
        for (int a = 0; a < 3; a++) {
            atomicMin(&fr[f].lo[a], k[a]);
            atomicMax(&fr[f].hi[a], k[a]);
        }
        atomicAdd(&fr[f].finite, 1ull);
    }
}

__global__ void pack_kernel(const unsigned char *data, size_t n, size_t stride, sbv_plan plan,
                            const FrameDev *fr, unsigned nframes, int frame_shift,
                            unsigned long long *keys, unsigned *idx) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned f = frame_of(fr, nframes, i);
    long long k[3];
    bool over;
    unsigned long long key = ~0ull;
    if (fr[f].finite && point_keys(data + i * stride, plan, fr[f], k, &over)) {
        const FrameDev &d = fr[f];
        unsigned long long ux = (unsigned long long)k[0] - (unsigned long long)d.lo[0];
        unsigned long long uy = (unsigned long long)k[1] - (unsigned long long)d.lo[1];
        unsigned long long uz = (unsigned long long)k[2] - (unsigned long long)d.lo[2];
        key = (((ux << d.by) | uy) << d.bz) | uz;
        if (frame_shift < 64) key |= (unsigned long long)f << frame_shift;
    }
    keys[i] = key;
    idx[i] = (unsigned)i;
}

__global__ void heads_kernel(const unsigned long long *keys, size_t nf, unsigned *head) {
    size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (j >= nf) return;
    head[j] = j == 0 || keys[j] != keys[j - 1];
}

__global__ void reduce_kernel(const unsigned char *data, size_t stride, FieldTable table,
                              const unsigned *idx, const unsigned long long *keys, size_t nf,
                              const unsigned *starts, size_t m, int frame_shift, FrameDev *fr,
                              unsigned char *out) {
    size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (v >= m) return;
    const size_t s = starts[v], e = v + 1 < m ? starts[v + 1] : nf;
    unsigned char *dst = out + v * stride;
    memset(dst, 0, stride);
    for (unsigned f = 0; f < table.n; f++) {
        const sbv_field fd = table.f[f];
        const unsigned char *base = data + fd.offset;
        if (fd.role == SBV_ROLE_COLOR) {
            int64_t c[4] = {0, 0, 0, 0};
            for (size_t j = s; j < e; j++) {
                const unsigned char *p = base + (size_t)idx[j] * stride;
                c[0] += p[0]; c[1] += p[1]; c[2] += p[2]; c[3] += p[3];
            }
            sbv_store_color(dst + fd.offset, c, e - s);
        } else if (fd.type == SBV_FLOAT32 || fd.type == SBV_FLOAT64) {
            double sum = 0.0;
            for (size_t j = s; j < e; j++) sum += sbv_load_f(base + (size_t)idx[j] * stride, fd.type);
            sbv_store_float(dst + fd.offset, fd.type, sum, e - s);
        } else {
            int64_t sum = 0;
            for (size_t j = s; j < e; j++) sum += sbv_load_i(base + (size_t)idx[j] * stride, fd.type);
            sbv_store_int(dst + fd.offset, fd.type, sum, e - s);
        }
    }
    const unsigned f = frame_shift < 64 ? (unsigned)(keys[s] >> frame_shift) : 0;
    atomicAdd(&fr[f].voxels, 1ull);
}

struct Status {
    int rc;
    char *err;
    size_t err_len;
    bool fail(int code, const char *what, const char *detail) {
        if (err && err_len) snprintf(err, err_len, "%s: %s", what, detail);
        rc = code;
        return false;
    }
    bool check(cudaError_t s, const char *what) {
        if (s == cudaSuccess) return true;
        return fail(s == cudaErrorMemoryAllocation ? SBV_ENOMEM : SBV_EDEVICE, what, cudaGetErrorString(s));
    }
};

/* A device or pinned buffer that only grows. */
template <bool Pinned>
struct Buf {
    void *p = nullptr;
    size_t size = 0;
    bool reserve(size_t bytes, Status &st, const char *what) {
        if (bytes <= size) return true;
        release();
        size_t want = bytes + bytes / 4 + 4096;
        cudaError_t e = Pinned ? cudaMallocHost(&p, want) : cudaMalloc(&p, want);
        if (e != cudaSuccess) {
            p = nullptr;
            return st.check(e, what);
        }
        size = want;
        return true;
    }
    void release() {
        if (p) {
            if (Pinned) cudaFreeHost(p); else cudaFree(p);
        }
        p = nullptr;
        size = 0;
    }
    template <class X> X *as() const { return static_cast<X *>(p); }
};

/* Everything one calling thread reuses between batches. */
struct Ctx {
    cudaStream_t stream = nullptr;
    Buf<false> in, keys, keys2, idx, idx2, head, starts, temp, out, frames, nsel;
    Buf<true> h_in, h_out, h_frames;
    ~Ctx() {
        for (auto *b : {&in, &keys, &keys2, &idx, &idx2, &head, &starts, &temp, &out, &frames, &nsel})
            b->release();
        for (auto *b : {&h_in, &h_out, &h_frames}) b->release();
        if (stream) cudaStreamDestroy(stream);
    }
};

/* Kept for the thread's lifetime and not freed at thread exit: destructors that run after the
 * statically linked CUDA runtime has shut down (process exit) must not call into it. */
thread_local Ctx *tls_ctx = nullptr;

Ctx *ctx(Status &st) {
    if (!tls_ctx) {
        Ctx *c = new Ctx();
        if (!st.check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "stream")) {
            delete c;
            return nullptr;
        }
        tls_ctx = c;
    }
    return tls_ctx;
}

int bit_width(unsigned long long x) { return x ? 64 - __builtin_clzll(x) : 0; }

bool is_pinned(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

/*
 * The batch: frames[i] has the same stride and fields as frames[0]. On success each
 * out_points[i] is set (status[i] = SBV_OK), or status[i] is SBV_EOVERFLOW / SBV_EINVAL for a
 * frame that cannot be done here (the caller decimates it otherwise). `resident_reps` > 0:
 * after the upload, run steps 1-5 that many times and put the mean device time in *seconds
 * (the benchmark's device-resident figure), then finish normally.
 */
int run_batch(const sbv_cloud *const *frames, const double *voxels, size_t count, void *const *outs,
              const size_t *caps, size_t *out_points, int *status, int resident_reps, double *seconds,
              Status &st) {
    const sbv_cloud *c0 = frames[0];
    sbv_plan plan;
    int rc = sbv_make_plan(c0, voxels[0], &plan, st.err, st.err_len);
    if (rc) return rc;
    const size_t stride = c0->stride;
    std::vector<FrameDev> fr(count);
    size_t n = 0;
    for (size_t f = 0; f < count; f++) {
        const sbv_cloud *c = frames[f];
        if (c->stride != stride || c->n_fields != c0->n_fields ||
            memcmp(c->fields, c0->fields, c->n_fields * sizeof(sbv_field)) != 0) {
            st.fail(SBV_EINVAL, "batch", "every frame of a batch must share one layout");
            return st.rc;
        }
        sbv_plan p;
        rc = sbv_make_plan(c, voxels[f], &p, st.err, st.err_len);
        if (rc) return rc;
        fr[f] = FrameDev{};
        fr[f].start = n;
        fr[f].count = c->points;
        fr[f].voxel_d = voxels[f];
        fr[f].voxel_f = (float)voxels[f];
        for (int a = 0; a < 3; a++) {
            fr[f].lo[a] = LLONG_MAX;
            fr[f].hi[a] = LLONG_MIN;
        }
        n += c->points;
        out_points[f] = 0;
        status[f] = SBV_OK;
    }
    if (n == 0) return SBV_OK;
    if (n > 0xffffffffull) {
        st.fail(SBV_EINVAL, "batch", "more than 2^32 points");
        return st.rc;
    }
    Ctx *cx = ctx(st);
    if (!cx) return st.rc;
    cudaStream_t s = cx->stream;
    const size_t bytes = n * stride;
    if (!cx->in.reserve(bytes, st, "device input") || !cx->keys.reserve(n * 8, st, "keys") ||
        !cx->keys2.reserve(n * 8, st, "keys") || !cx->idx.reserve(n * 4, st, "index") ||
        !cx->idx2.reserve(n * 4, st, "index") || !cx->head.reserve(n * 4, st, "heads") ||
        !cx->starts.reserve(n * 4, st, "starts") || !cx->out.reserve(bytes, st, "device output") ||
        !cx->frames.reserve(count * sizeof(FrameDev), st, "frames") ||
        !cx->nsel.reserve(sizeof(unsigned long long), st, "count") ||
        !cx->h_frames.reserve(count * sizeof(FrameDev), st, "frames"))
        return st.rc;
    /* 1 transfer in: a single pinned or large frame straight from its memory, else gathered */
    unsigned char *d_in = cx->in.as<unsigned char>();
    if (count == 1 && (is_pinned(frames[0]->data) || bytes > ((size_t)64 << 20))) {
        if (!st.check(cudaMemcpyAsync(d_in, frames[0]->data, bytes, cudaMemcpyHostToDevice, s), "copy in"))
            return st.rc;
    } else {
        if (!cx->h_in.reserve(bytes, st, "pinned input")) return st.rc;
        unsigned char *h = cx->h_in.as<unsigned char>();
        for (size_t f = 0; f < count; f++)
            memcpy(h + fr[f].start * stride, frames[f]->data, frames[f]->points * stride);
        if (!st.check(cudaMemcpyAsync(d_in, h, bytes, cudaMemcpyHostToDevice, s), "copy in")) return st.rc;
    }
    FrameDev *d_fr = cx->frames.as<FrameDev>();
    FrameDev *h_fr = cx->h_frames.as<FrameDev>();
    cudaEvent_t ev0 = nullptr, ev1 = nullptr;
    const int reps = resident_reps > 0 ? resident_reps : 1;
    size_t m = 0;
    int frame_shift = 64;
    for (int rep = 0; rep < reps; rep++) {
        if (rep == 0 && resident_reps > 0) {
            cudaEventCreate(&ev0);
            cudaEventCreate(&ev1);
            cudaEventRecord(ev0, s);
        }
        memcpy(h_fr, fr.data(), count * sizeof(FrameDev));
        cudaMemcpyAsync(d_fr, h_fr, count * sizeof(FrameDev), cudaMemcpyHostToDevice, s);
        const unsigned blocks = (unsigned)((n + T - 1) / T);
        bounds_kernel<<<blocks, T, 0, s>>>(d_in, n, stride, plan, d_fr, (unsigned)count);
        if (!st.check(cudaGetLastError(), "bounds kernel")) return st.rc;
        /* 2 plan: bounds back (one small copy), bit widths per frame */
        cudaMemcpyAsync(h_fr, d_fr, count * sizeof(FrameDev), cudaMemcpyDeviceToHost, s);
        if (!st.check(cudaStreamSynchronize(s), "bounds")) return st.rc;
        int kb_max = 0;
        for (size_t f = 0; f < count; f++) {
            FrameDev &d = h_fr[f];
            d.by = d.bz = d.kb = 0;
            if (d.overflow) {
                status[f] = SBV_EOVERFLOW;
                d.finite = 0;
            }
            if (!d.finite) {
                for (int a = 0; a < 3; a++) d.lo[a] = d.hi[a] = 0;
                continue;
            }
            int bits[3];
            for (int a = 0; a < 3; a++)
                bits[a] = bit_width((unsigned long long)d.hi[a] - (unsigned long long)d.lo[a]);
            d.by = bits[1];
            d.bz = bits[2];
            d.kb = bits[0] + bits[1] + bits[2];
            kb_max = d.kb > kb_max ? d.kb : kb_max;
        }
        const int fbits = bit_width(count - 1);
        if (kb_max + fbits > 63) { /* keep all ones free for dropped points */
            st.fail(SBV_EINVAL, "batch", "voxel keys too wide for the GPU path (> 63 bits with frame bits)");
            return st.rc;
        }
        frame_shift = fbits ? kb_max : 64;
        const int end_bit = kb_max + fbits;
        cudaMemcpyAsync(d_fr, h_fr, count * sizeof(FrameDev), cudaMemcpyHostToDevice, s);
        /* frames with no finite point, or an overflow, pack every point as dropped (all ones) */
        pack_kernel<<<blocks, T, 0, s>>>(d_in, n, stride, plan, d_fr, (unsigned)count, frame_shift,
                                         cx->keys.as<unsigned long long>(), cx->idx.as<unsigned>());
        if (!st.check(cudaGetLastError(), "pack kernel")) return st.rc;
        /* 4 sort (CUB, stable), bits [0, end_bit) plus the all-ones bit pattern of dropped points */
        size_t nf = 0;
        for (size_t f = 0; f < count; f++) nf += status[f] == SBV_OK ? h_fr[f].finite : 0;
        cub::DoubleBuffer<unsigned long long> dk(cx->keys.as<unsigned long long>(), cx->keys2.as<unsigned long long>());
        cub::DoubleBuffer<unsigned> dv(cx->idx.as<unsigned>(), cx->idx2.as<unsigned>());
        const int sort_end = end_bit < 64 ? end_bit + 1 : 64; /* one more bit: dropped points last */
        size_t temp_bytes = 0;
        cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, dk, dv, (int)n, 0, sort_end, s);
        if (!cx->temp.reserve(temp_bytes, st, "sort scratch")) return st.rc;
        if (!st.check(cub::DeviceRadixSort::SortPairs(cx->temp.p, temp_bytes, dk, dv, (int)n, 0, sort_end, s),
                      "sort"))
            return st.rc;
        const unsigned long long *keys = dk.Current();
        const unsigned *idx = dv.Current();
        if (nf == 0) break;
        /* 5 voxel starts, then a thread per voxel */
        const unsigned fblocks = (unsigned)((nf + T - 1) / T);
        heads_kernel<<<fblocks, T, 0, s>>>(keys, nf, cx->head.as<unsigned>());
        size_t sel_bytes = 0;
        thrust::counting_iterator<unsigned> counter(0);
        cub::DeviceSelect::Flagged(nullptr, sel_bytes, counter, cx->head.as<unsigned>(), cx->starts.as<unsigned>(),
                                   cx->nsel.as<unsigned long long>(), (int)nf, s);
        if (!cx->temp.reserve(sel_bytes, st, "select scratch")) return st.rc;
        cub::DeviceSelect::Flagged(cx->temp.p, sel_bytes, counter, cx->head.as<unsigned>(), cx->starts.as<unsigned>(),
                                   cx->nsel.as<unsigned long long>(), (int)nf, s);
        unsigned long long h_m = 0;
        cudaMemcpyAsync(&h_m, cx->nsel.p, sizeof h_m, cudaMemcpyDeviceToHost, s);
        if (!st.check(cudaStreamSynchronize(s), "select")) return st.rc;
        m = (size_t)h_m;
        FieldTable table;
        table.n = (unsigned)c0->n_fields;
        for (size_t f = 0; f < c0->n_fields; f++) table.f[f] = c0->fields[f];
        reduce_kernel<<<(unsigned)((m + T - 1) / T), T, 0, s>>>(d_in, stride, table, idx, keys, nf,
                                                               cx->starts.as<unsigned>(), m, frame_shift,
                                                               d_fr, cx->out.as<unsigned char>());
        if (!st.check(cudaGetLastError(), "reduce kernel")) return st.rc;
        if (rep + 1 == reps && resident_reps > 0) {
            cudaEventRecord(ev1, s);
            cudaEventSynchronize(ev1);
            float ms = 0;
            cudaEventElapsedTime(&ms, ev0, ev1);
            if (seconds) *seconds = ms / 1e3 / reps;
            cudaEventDestroy(ev0);
            cudaEventDestroy(ev1);
        }
    }
    /* one transfer out: every frame's voxels, in frame order, then the per-frame counts */
    if (m) {
        if (!cx->h_out.reserve(m * stride, st, "pinned output")) return st.rc;
        cudaMemcpyAsync(cx->h_out.p, cx->out.p, m * stride, cudaMemcpyDeviceToHost, s);
    }
    cudaMemcpyAsync(h_fr, d_fr, count * sizeof(FrameDev), cudaMemcpyDeviceToHost, s);
    if (!st.check(cudaStreamSynchronize(s), "copy out")) return st.rc;
    size_t at = 0;
    for (size_t f = 0; f < count; f++) {
        const size_t v = status[f] == SBV_OK ? (size_t)h_fr[f].voxels : 0;
        if (v > caps[f]) {
            status[f] = SBV_EINVAL;
        } else if (status[f] == SBV_OK) {
            memcpy(outs[f], cx->h_out.as<unsigned char>() + at * stride, v * stride);
            out_points[f] = v;
        }
        at += v;
    }
    return SBV_OK;
}

int guarded(const sbv_cloud *const *frames, const double *voxels, size_t count, void *const *outs,
            const size_t *caps, size_t *out_points, int *status, int reps, double *seconds, char *err,
            size_t err_len) {
    Status st{SBV_OK, err, err_len};
    if (err && err_len) err[0] = '\0';
    if (count == 0) return SBV_OK;
    if (count > MAX_BATCH) {
        st.fail(SBV_EINVAL, "batch", "too many frames");
        return st.rc;
    }
    char detail[128];
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= 0) {
        cudaGetLastError();
        snprintf(detail, sizeof detail, "none found");
        st.fail(SBV_EDEVICE, "no CUDA device", detail);
        return st.rc;
    }
    try {
        int rc = run_batch(frames, voxels, count, outs, caps, out_points, status, reps, seconds, st);
        return rc ? rc : st.rc;
    } catch (const std::bad_alloc &) {
        st.fail(SBV_ENOMEM, "CUDA", "out of host memory");
        return st.rc;
    }
}

}  // namespace

extern "C" int sbv_abi_version(void) { return SBV_ABI_VERSION; }

extern "C" int sbv_cuda_device_count(char *err, size_t err_len) {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaErrorNoDevice) return 0;
    if (status != cudaSuccess) {
        if (err && err_len) snprintf(err, err_len, "%s", cudaGetErrorString(status));
        return -1;
    }
    return count;
}

extern "C" int sbv_downsample_cuda_batch(const sbv_cloud *const *frames, const double *voxels,
                                         size_t count, void *const *outs, const size_t *caps,
                                         size_t *out_points, int *status, char *err, size_t err_len) {
    return guarded(frames, voxels, count, outs, caps, out_points, status, 0, nullptr, err, err_len);
}

extern "C" int sbv_cuda_time_resident(const sbv_cloud *in, double voxel_size, int reps,
                                      double *seconds, char *err, size_t err_len) {
    if (reps < 1) reps = 1;
    std::vector<unsigned char> out(in->points * in->stride + 1);
    void *o = out.data();
    size_t cap = in->points, got = 0;
    int status = 0;
    int rc = guarded(&in, &voxel_size, 1, &o, &cap, &got, &status, reps, seconds, err, err_len);
    return rc ? rc : status;
}

extern "C" void *sbv_cuda_host_alloc(size_t bytes) {
    void *p = nullptr;
    return cudaMallocHost(&p, bytes ? bytes : 1) == cudaSuccess ? p : nullptr;
}

extern "C" void sbv_cuda_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

extern "C" int sbv_downsample_cuda(const sbv_cloud *in, double voxel_size, void *out,
                                   size_t out_capacity, size_t *out_points, char *err,
                                   size_t err_len) {
    if (!out_points) return SBV_EINVAL;
    *out_points = 0;
    sbv_plan plan;
    int rc = sbv_make_plan(in, voxel_size, &plan, err, err_len);
    if (rc != SBV_OK || in->points == 0) return rc;
    if (!out) {
        if (err && err_len) snprintf(err, err_len, "out: NULL");
        return SBV_EINVAL;
    }
    int status = SBV_OK;
    rc = guarded(&in, &voxel_size, 1, &out, &out_capacity, out_points, &status, 0, nullptr, err, err_len);
    if (rc) return rc;
    if (status == SBV_EOVERFLOW && err && err_len)
        snprintf(err, err_len, "voxel index floor(p / %g) exceeds the int64 range; use a larger voxel_size",
                 voxel_size);
    if (status == SBV_EINVAL && err && err_len) snprintf(err, err_len, "output capacity too small");
    return status;
}
