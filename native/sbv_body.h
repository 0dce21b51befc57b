/*
 * sbv_body.h - the parts of the voxel kernel written once for the CPU and CUDA builds:
 * field loads, key computation, layout checks and the per-voxel reduction. Everything is
 * static inline and marked host+device under nvcc, so both kernels compute keys and
 * means with literally the same code (and therefore the same results).
 */
#ifndef SBV_BODY_H
#define SBV_BODY_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "simbridge_voxel.h"

#ifdef __CUDACC__
#define SBV_HD static inline __host__ __device__
#else
#define SBV_HD static inline
#endif

/* Keys must lie in [-2^63, 2^63): both bounds are exact in float and double. */
#define SBV_KEY_LIMIT 9223372036854775808.0

typedef struct sbv_plan {
    uint32_t x_off, y_off, z_off;
    int xyz_f32;   /* all three float32: keys in float32 */
    int xyz_packed; /* float32 and consecutive (x, y, z): fast loads */
    float voxel_f;  /* (float)voxel_size */
    double voxel_d;
    uint32_t x_type, y_type, z_type;
} sbv_plan;

SBV_HD int sbv_type_size(uint32_t type) {
    switch (type) {
    case SBV_INT8: case SBV_UINT8: return 1;
    case SBV_INT16: case SBV_UINT16: return 2;
    case SBV_INT32: case SBV_UINT32: case SBV_FLOAT32: return 4;
    case SBV_FLOAT64: return 8;
    default: return 0;
    }
}

SBV_HD double sbv_load_f(const unsigned char *p, uint32_t type) {
    if (type == SBV_FLOAT32) { float f; memcpy(&f, p, 4); return (double)f; }
    double d; memcpy(&d, p, 8); return d;
}

SBV_HD int64_t sbv_load_i(const unsigned char *p, uint32_t type) {
    switch (type) {
    case SBV_INT8: { int8_t v; memcpy(&v, p, 1); return v; }
    case SBV_UINT8: return p[0];
    case SBV_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case SBV_UINT16: { uint16_t v; memcpy(&v, p, 2); return v; }
    case SBV_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { uint32_t v; memcpy(&v, p, 4); return v; }
    }
}

/* sum / count rounded half away from zero, exactly (|sum| < 2^62 for any real cloud). */
SBV_HD int64_t sbv_round_mean(int64_t sum, int64_t count) {
    uint64_t mag = (uint64_t)(sum < 0 ? -sum : sum);
    uint64_t q = (2 * mag + (uint64_t)count) / (2 * (uint64_t)count);
    return sum < 0 ? -(int64_t)q : (int64_t)q;
}

SBV_HD void sbv_store_i(unsigned char *p, uint32_t type, int64_t v) {
    switch (type) {
    case SBV_INT8: case SBV_UINT8: { uint8_t b = (uint8_t)v; memcpy(p, &b, 1); break; }
    case SBV_INT16: case SBV_UINT16: { uint16_t h = (uint16_t)v; memcpy(p, &h, 2); break; }
    default: { uint32_t w = (uint32_t)v; memcpy(p, &w, 4); break; }
    }
}

/*
 * Key of one coordinate (floor(p / voxel)) as a double holding an integer, or a value
 * outside [-2^63, 2^63) (including +-inf) when it overflows. In float32 mode the division
 * and floor happen in float32 exactly as NumPy and Open3D do them.
 */
SBV_HD double sbv_key_f32(float p, float voxel) { return (double)floorf(p / voxel); }
SBV_HD double sbv_key_f64(double p, double voxel) { return floor(p / voxel); }

SBV_HD int sbv_key_ok(double k) { return k >= -SBV_KEY_LIMIT && k < SBV_KEY_LIMIT; }

/* Final values from sums: the one place the averaging formulas live (both kernels and both
 * CPU paths call these, so every path rounds identically). */
SBV_HD void sbv_store_float(unsigned char *dst, uint32_t type, double sum, size_t count) {
    if (type == SBV_FLOAT32) {
        float m = (float)(sum / (double)count);
        memcpy(dst, &m, 4);
    } else {
        double m = sum / (double)count;
        memcpy(dst, &m, 8);
    }
}

SBV_HD void sbv_store_int(unsigned char *dst, uint32_t type, int64_t sum, size_t count) {
    sbv_store_i(dst, type, sbv_round_mean(sum, (int64_t)count));
}

SBV_HD void sbv_store_color(unsigned char *dst, const int64_t sum[4], size_t count) {
    for (int c = 0; c < 4; c++) dst[c] = (unsigned char)sbv_round_mean(sum[c], (int64_t)count);
}

/*
 * Mean of every field over the points idx[0..count) (record index = idx[j] & mask), in
 * that order, written as one zeroed output record. Sums: float64 for float fields, exact
 * int64 for integers and colour channels.
 */
SBV_HD void sbv_reduce_voxel(const unsigned char *data, size_t stride, const sbv_field *fields,
                             size_t n_fields, const uint64_t *idx, size_t count, uint64_t mask,
                             unsigned char *out) {
    memset(out, 0, stride);
    for (size_t f = 0; f < n_fields; f++) {
        const sbv_field fd = fields[f];
        const unsigned char *base = data + fd.offset;
        unsigned char *dst = out + fd.offset;
        if (fd.role == SBV_ROLE_COLOR) {
            int64_t c[4] = {0, 0, 0, 0};
            for (size_t j = 0; j < count; j++) {
                const unsigned char *p = base + (idx[j] & mask) * stride;
                c[0] += p[0]; c[1] += p[1]; c[2] += p[2]; c[3] += p[3];
            }
            sbv_store_color(dst, c, count);
        } else if (fd.type == SBV_FLOAT32 || fd.type == SBV_FLOAT64) {
            double s = 0.0;
            for (size_t j = 0; j < count; j++)
                s += sbv_load_f(base + (idx[j] & mask) * stride, fd.type);
            sbv_store_float(dst, fd.type, s, count);
        } else {
            int64_t s = 0;
            for (size_t j = 0; j < count; j++) s += sbv_load_i(base + (idx[j] & mask) * stride, fd.type);
            sbv_store_int(dst, fd.type, s, count);
        }
    }
}

/* Host-only: validate the layout and fill a plan. Returns SBV_OK or SBV_EINVAL + message. */
static inline int sbv_make_plan(const sbv_cloud *in, double voxel_size, sbv_plan *plan,
                                char *err, size_t err_len) {
#define SBV_FAIL(...) do { if (err && err_len) snprintf(err, err_len, __VA_ARGS__); return SBV_EINVAL; } while (0)
    if (!in || !plan) SBV_FAIL("null argument");
    if (in->stride == 0) SBV_FAIL("stride must be > 0");
    if (in->points && !in->data) SBV_FAIL("data is NULL");
    if (in->n_fields < 3 || in->n_fields > SBV_MAX_FIELDS || !in->fields)
        SBV_FAIL("need 3..%d fields, got %zu", SBV_MAX_FIELDS, in->n_fields);
    if (!(voxel_size > 0.0) || !isfinite(voxel_size)) SBV_FAIL("voxel_size must be finite and > 0");
    int seen[5] = {0, 0, 0, 0, 0};
    uint32_t off[3] = {0, 0, 0}, typ[3] = {0, 0, 0};
    for (size_t i = 0; i < in->n_fields; i++) {
        const sbv_field *f = &in->fields[i];
        int size = sbv_type_size(f->type);
        if (!size) SBV_FAIL("field %zu has unknown type %u", i, f->type);
        if ((size_t)f->offset + (size_t)size > in->stride)
            SBV_FAIL("field %zu (offset %u, %d bytes) exceeds stride %zu", i, f->offset, size, in->stride);
        if (f->role > SBV_ROLE_Z) SBV_FAIL("field %zu has unknown role %u", i, f->role);
        if (f->role == SBV_ROLE_COLOR && size != 4) SBV_FAIL("colour field %zu must be 4 bytes", i);
        if (f->role >= SBV_ROLE_X) {
            if (f->type != SBV_FLOAT32 && f->type != SBV_FLOAT64)
                SBV_FAIL("x/y/z fields must be float32 or float64");
            if (seen[f->role]++) SBV_FAIL("x, y and z must each appear once");
            off[f->role - SBV_ROLE_X] = f->offset;
            typ[f->role - SBV_ROLE_X] = f->type;
        }
        for (size_t j = 0; j < i; j++) {
            const sbv_field *g = &in->fields[j];
            if (f->offset < g->offset + (uint32_t)sbv_type_size(g->type) && g->offset < f->offset + (uint32_t)size)
                SBV_FAIL("fields %zu and %zu overlap", j, i);
        }
    }
    if (!seen[SBV_ROLE_X] || !seen[SBV_ROLE_Y] || !seen[SBV_ROLE_Z]) SBV_FAIL("x, y and z are required");
    plan->x_off = off[0]; plan->y_off = off[1]; plan->z_off = off[2];
    plan->x_type = typ[0]; plan->y_type = typ[1]; plan->z_type = typ[2];
    plan->xyz_f32 = typ[0] == SBV_FLOAT32 && typ[1] == SBV_FLOAT32 && typ[2] == SBV_FLOAT32;
    plan->xyz_packed = plan->xyz_f32 && off[1] == off[0] + 4 && off[2] == off[1] + 4;
    plan->voxel_d = voxel_size;
    plan->voxel_f = (float)voxel_size;
    if (plan->xyz_f32 && (!(plan->voxel_f > 0.0f) || isinf(plan->voxel_f)))
        SBV_FAIL("voxel_size %g is not representable as float32", voxel_size);
    return SBV_OK;
#undef SBV_FAIL
}

#endif /* SBV_BODY_H */
