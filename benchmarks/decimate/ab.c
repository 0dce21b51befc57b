/*
 * ab.c - two builds of the CPU kernel side by side in one process (used by
 * ab.sh): both shared libraries are loaded, called alternately on the same cloud, and
 * timed with the calling thread's CPU time, so a shared machine's load hits both alike.
 *
 *   decimate_ab A.so B.so CLOUD VOXEL CALLS [THREADS]
 *
 * CLOUD: packed float32 records, x, y, z (.s12) or x, y, z, rgb (.s16). Prints min and median
 * ms of each, B's time over A's, and whether the two outputs are the same bytes (exit 3 if not).
 * With THREADS > 1: thread scaling instead, wall clock; each round calls A and B with one
 * thread and with THREADS (four calls, order rotating), and each build's speed-up is the
 * median over rounds of (one-thread time / THREADS-thread time) of that round, so a slow
 * spell of the shared machine hits both sides of every ratio alike.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "simbridge_voxel.h"

typedef int (*downsample_fn)(const sbv_cloud *, double, int, void *, size_t, size_t *, char *, size_t);

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* THREADS > 1: per build, one-thread time over THREADS-thread time, median of per-round ratios. */
static int scaling(downsample_fn fn[2], char **argv, const sbv_cloud *cloud, size_t len, double voxel,
                   int calls, int threads) {
    void *out[4];
    double *t[4], *ratio[2];
    size_t m[4];
    char err[256];
    for (int k = 0; k < 4; k++) {
        out[k] = malloc(len);
        t[k] = malloc(sizeof(double) * (size_t)calls);
        if (!out[k] || !t[k]) return 2;
    }
    ratio[0] = malloc(sizeof(double) * (size_t)calls);
    ratio[1] = malloc(sizeof(double) * (size_t)calls);
    if (!ratio[0] || !ratio[1]) return 2;
    for (int r = -2; r < calls; r++) { /* call k: build k / 2, threads 1 (k even) or THREADS */
        for (int j = 0; j < 4; j++) {
            const int k = (j + (r & 3)) & 3;
            const double t0 = wall_now();
            const int rc = fn[k / 2](cloud, voxel, k & 1 ? threads : 1, out[k], cloud->points, &m[k], err, sizeof err);
            const double dt = wall_now() - t0;
            if (rc) {
                fprintf(stderr, "%s: status %d: %s\n", argv[1 + k / 2], rc, err);
                return 1;
            }
            if (r >= 0) t[k][r] = dt;
        }
        if (r >= 0)
            for (int b = 0; b < 2; b++) ratio[b][r] = t[2 * b][r] / t[2 * b + 1][r];
    }
    for (int k = 0; k < 4; k++) qsort(t[k], (size_t)calls, sizeof(double), by_value);
    for (int b = 0; b < 2; b++) qsort(ratio[b], (size_t)calls, sizeof(double), by_value);
    int same = 1;
    for (int k = 1; k < 4; k++) same = same && m[k] == m[0] && !memcmp(out[k], out[0], m[0] * cloud->stride);
    const char *name = strrchr(argv[3], '/');
    name = name ? name + 1 : argv[3];
    const int h = calls / 2;
    printf("%-20.20s v%-5g n=%-8zu wall med ms: A x1 %7.3f x%d %7.3f  B x1 %7.3f x%d %7.3f  "
           "x%d/x1 A %.2f B %.2f  %s\n",
           name, voxel, cloud->points, t[0][h] * 1e3, threads, t[1][h] * 1e3, t[2][h] * 1e3, threads,
           t[3][h] * 1e3, threads, ratio[0][h], ratio[1][h], same ? "same bytes" : "DIFFERENT");
    return same ? 0 : 3;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: decimate_ab A.so B.so CLOUD VOXEL CALLS [THREADS]\n");
        return 2;
    }
    downsample_fn fn[2];
    for (int k = 0; k < 2; k++) {
        void *lib = dlopen(argv[1 + k], RTLD_NOW | RTLD_LOCAL);
        if (!lib || !(fn[k] = (downsample_fn)dlsym(lib, "sbv_downsample_cpu"))) {
            fprintf(stderr, "%s: %s\n", argv[1 + k], dlerror());
            return 2;
        }
    }
    FILE *fp = fopen(argv[3], "rb");
    if (!fp) return 2;
    fseek(fp, 0, SEEK_END);
    const long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *data = malloc((size_t)len);
    if (!data || fread(data, 1, (size_t)len, fp) != (size_t)len) return 2;
    fclose(fp);
    const size_t stride = strstr(argv[3], ".s16") ? 16 : 12;
    const sbv_field fields[4] = {{0, SBV_FLOAT32, SBV_ROLE_X}, {4, SBV_FLOAT32, SBV_ROLE_Y},
                                 {8, SBV_FLOAT32, SBV_ROLE_Z}, {12, SBV_UINT32, SBV_ROLE_COLOR}};
    const sbv_cloud cloud = {data, (size_t)len / stride, stride, fields, stride == 16 ? 4 : 3};
    const double voxel = atof(argv[4]);
    const int calls = atoi(argv[5]);
    const int threads = argc == 7 ? atoi(argv[6]) : 1;
    if (calls < 1 || threads < 1) return 2;
    if (threads > 1) return scaling(fn, argv, &cloud, (size_t)len, voxel, calls, threads);
    void *out[2] = {malloc((size_t)len), malloc((size_t)len)};
    double *t[2] = {malloc(sizeof(double) * (size_t)calls), malloc(sizeof(double) * (size_t)calls)};
    size_t m[2] = {0, 0};
    char err[256];
    for (int r = -2; r < calls; r++) { /* two warm-up rounds; the order alternates */
        for (int k0 = 0; k0 < 2; k0++) {
            const int k = (r & 1) ? 1 - k0 : k0;
            const double t0 = cpu_now();
            const int rc = fn[k](&cloud, voxel, 1, out[k], cloud.points, &m[k], err, sizeof err);
            const double dt = cpu_now() - t0;
            if (rc) {
                fprintf(stderr, "%s: status %d: %s\n", argv[1 + k], rc, err);
                return 1;
            }
            if (r >= 0) t[k][r] = dt;
        }
    }
    for (int k = 0; k < 2; k++) qsort(t[k], (size_t)calls, sizeof(double), by_value);
    const int same = m[0] == m[1] && !memcmp(out[0], out[1], m[0] * stride);
    const char *name = strrchr(argv[3], '/');
    name = name ? name + 1 : argv[3];
    const int h = calls / 2;
    printf("%-28.28s v%-5g n=%-8zu voxels=%-7zu A min %7.3f med %7.3f ms  B min %7.3f med %7.3f ms"
           "  B/A min %.2f med %.2f  %s\n",
           name, voxel, cloud.points, m[1], t[0][0] * 1e3, t[0][h] * 1e3, t[1][0] * 1e3,
           t[1][h] * 1e3, t[1][0] / t[0][0], t[1][h] / t[0][h], same ? "same bytes" : "DIFFERENT");
    return same ? 0 : 3;
}
