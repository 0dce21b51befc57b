/*
 * simbridge_voxel.h - the one C ABI of simbridge's voxel-grid decimation kernels.
 *
 * Both the CPU kernel (voxel_cpu.c, plain C + pthreads) and the CUDA kernel (voxel_cuda.cu)
 * implement this header; the CPython glue (voxel_module.c) and the ctypes loader
 * (bridge/decimate/cuda.py) call it. Contract (docs/design.md section 3):
 *
 *   - points whose x, y or z is NaN/inf are dropped;
 *   - voxel key k = floor(p / voxel_size) per axis as int64, grid anchored at the origin;
 *     the division is done in float32 when x, y and z are all float32 (with
 *     (float)voxel_size, as Open3D's tensor API does) and in float64 otherwise;
 *     a key outside [-2^63, 2^63) is an error (SBV_EOVERFLOW), never clamped;
 *   - one output point per occupied voxel, sorted by (kx, ky, kz), in the input's layout:
 *     float fields = mean of the float64 sums (summed in input order), integer fields =
 *     mean rounded half away from zero (exact int64 arithmetic), packed colour fields =
 *     four uint8 channels averaged and rounded the same way; bytes not covered by a field
 *     are zero.
 *
 * Buffers are packed little-endian records of `stride` bytes. Nothing here touches Python.
 */
#ifndef SIMBRIDGE_VOXEL_H
#define SIMBRIDGE_VOXEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SBV_ABI_VERSION 1

/* Scalar types: the values of bridge.cloud.FieldType / PointCloud2. */
enum sbv_type {
    SBV_INT8 = 1,
    SBV_UINT8 = 2,
    SBV_INT16 = 3,
    SBV_UINT16 = 4,
    SBV_INT32 = 5,
    SBV_UINT32 = 6,
    SBV_FLOAT32 = 7,
    SBV_FLOAT64 = 8
};

/* What a field is to the kernel. Exactly one field each of X, Y, Z (float32/float64). */
enum sbv_role {
    SBV_ROLE_VALUE = 0, /* averaged as a number of its type */
    SBV_ROLE_COLOR = 1, /* 4-byte packed colour (rgb/rgba): four uint8 channels averaged */
    SBV_ROLE_X = 2,
    SBV_ROLE_Y = 3,
    SBV_ROLE_Z = 4
};

enum sbv_status {
    SBV_OK = 0,
    SBV_EINVAL = 1,    /* bad arguments or layout; message in err */
    SBV_EOVERFLOW = 2, /* a voxel key does not fit in int64 */
    SBV_ENOMEM = 3,    /* allocation failed (host or device) */
    SBV_EDEVICE = 4    /* no CUDA device, or a CUDA call failed */
};

#define SBV_MAX_FIELDS 64

typedef struct sbv_field {
    uint32_t offset; /* byte offset inside the record */
    uint32_t type;   /* enum sbv_type */
    uint32_t role;   /* enum sbv_role */
} sbv_field;

typedef struct sbv_cloud {
    const void *data;        /* points * stride bytes */
    size_t points;
    size_t stride;           /* bytes per record, > 0 */
    const sbv_field *fields; /* n_fields entries, non-overlapping, inside stride */
    size_t n_fields;         /* 3 .. SBV_MAX_FIELDS */
} sbv_cloud;

/*
 * Decimate `in` into `out` (capacity `out_capacity` records, same stride and fields).
 * An output never has more records than the input's finite points, so a capacity of
 * in->points always suffices. On success *out_points is the number of records written.
 * `threads` >= 1 splits the work across that many threads (the kernel may use fewer for
 * small clouds). Thread-safe: calls share no state. On error a message is written to
 * err (NUL-terminated, truncated to err_len) when err is not NULL.
 */
int sbv_downsample_cpu(const sbv_cloud *in, double voxel_size, int threads, void *out,
                       size_t out_capacity, size_t *out_points, char *err, size_t err_len);

/* Same contract on the first CUDA device (output identical to the CPU kernel's: see
 * native/README.md for the tolerance statement). Only in the CUDA library. */
int sbv_downsample_cuda(const sbv_cloud *in, double voxel_size, void *out, size_t out_capacity,
                        size_t *out_points, char *err, size_t err_len);

/* Number of CUDA devices (>= 0), or -1 with a message when the runtime cannot be used. */
int sbv_cuda_device_count(char *err, size_t err_len);

/* SBV_ABI_VERSION of the library, to refuse a stale build. */
int sbv_abi_version(void);

/* CPU kernel scratch (16 bytes per point) is cached per calling thread between calls, because
 * first touch of fresh memory is slow on VMs; a buffer larger than the keep limit is freed
 * after its call. sbv_scratch_keep sets the limit in bytes (default 64 MiB, shared by all
 * threads) and returns the previous one; SIZE_MAX only reads it. sbv_release_scratch frees
 * the calling thread's buffer now (it is also freed when the thread exits). */
size_t sbv_scratch_keep(size_t bytes);
void sbv_release_scratch(void);

/* CPU: one-thread calls whose estimated voxel count is at most this many hash-accumulate
 * instead of sorting points (native/README.md); the rest, or a cloud that turns out to have
 * more voxels, take the radix path. Same output either way. Sets the limit (0: never hash)
 * and returns the previous one; SIZE_MAX only reads it. For tests and tuning. */
size_t sbv_hash_voxels_max(size_t voxels);

/* CPU: calls by this thread so far that took a key frame guessed from the estimate's sample
 * instead of a bounds pass, and those of them where a point fell outside it (then the bounds
 * pass ran after all); reset != 0 also clears the back-off after misses (the next calls may
 * guess again). Same output either way: for tests and tuning. */
void sbv_frame_guesses(size_t *guessed, size_t *missed, int reset);

#ifdef __cplusplus
}
#endif

#endif /* SIMBRIDGE_VOXEL_H */
