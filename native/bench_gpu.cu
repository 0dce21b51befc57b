/*
 * bench_gpu.cu - developer tool for scripts/gpu-check.sh (not part of the library): CUDA vs the
 * CPU kernel on the same synthetic lidar clouds, parity byte for byte, device-resident and
 * with-transfer rates at 10M points, batched vs unbatched 100k-point frames, and the C kernel on
 * every core (one frame per worker thread) on the same frames.
 *
 * Build: nvcc -O3 -std=c++17 -I native native/bench_gpu.cu native/voxel_cuda.cu native/voxel_cpu.c
 *        native/cpu_*.c -o bench_gpu   (see scripts/gpu-check.sh)
 */
#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "simbridge_voxel.h"

extern "C" int sbv_downsample_cuda_batch(const sbv_cloud *const *, const double *, size_t, void *const *,
                                         const size_t *, size_t *, int *, char *, size_t);
extern "C" int sbv_cuda_time_resident(const sbv_cloud *, double, int, double *, char *, size_t);
extern "C" void *sbv_cuda_host_alloc(size_t);
extern "C" void sbv_cuda_host_free(void *);

static double now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static const sbv_field XYZ[3] = {{0, 7, 2}, {4, 7, 3}, {8, 7, 4}};

/* A 64-beam sweep in firing order: ground ring, walls 15-40 m, far returns, near clutter. */
static std::vector<float> lidar(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(0, 1);
    std::normal_distribution<double> noise(0, 0.02);
    std::vector<float> p(3 * n);
    size_t cols = (n + 63) / 64;
    for (size_t i = 0; i < n; i++) {
        double elev = (-25.0 + 40.0 * (double)(i / cols) / 63.0) * M_PI / 180.0;
        double az = 2 * M_PI * (double)(i % cols) / (double)cols;
        double wall = 27 + 8 * sin(2 * az + 0.3) + 4 * sin(5 * az + 1.1);
        if (sin(3 * az) > 0.7) wall = 50 + 30 * u(rng);
        if (u(rng) < 0.02) wall = 1 + 3 * u(rng);
        double ground = elev < 0 ? 1.8 / std::max(sin(-elev), 1e-6) : 1e9;
        double r = std::min(std::max(std::min(wall, ground) + noise(rng), 1.0), 80.0);
        p[3 * i] = (float)(r * cos(elev) * cos(az));
        p[3 * i + 1] = (float)(r * cos(elev) * sin(az));
        p[3 * i + 2] = (float)(r * sin(elev));
    }
    return p;
}

static sbv_cloud cloud_of(const float *p, size_t n) { return sbv_cloud{p, n, 12, XYZ, 3}; }

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static int check(int rc, const char *what, const char *err) {
    if (rc) {
        printf("FAIL %s: status %d %s\n", what, rc, err);
        exit(1);
    }
    return rc;
}

struct Pool {
    const std::vector<std::vector<float>> *frames;
    double voxel;
    int next_start, step, rounds;
};

static void *cpu_worker(void *arg) {
    Pool *p = (Pool *)arg;
    std::vector<unsigned char> out(12 * 200000);
    char err[256];
    for (int r = 0; r < p->rounds; r++)
        for (size_t f = p->next_start; f < p->frames->size(); f += p->step) {
            const auto &fr = (*p->frames)[f];
            sbv_cloud c = cloud_of(fr.data(), fr.size() / 3);
            size_t m;
            sbv_downsample_cpu(&c, p->voxel, 1, out.data(), c.points, &m, err, sizeof err);
        }
    return nullptr;
}

int main(int argc, char **argv) {
    int cpus = argc > 1 ? atoi(argv[1]) : 16;
    char err[256];
    /* 1. parity and rates at 10M points */
    const size_t big = 10000000;
    std::vector<float> p = lidar(big, 1);
    for (double v : {0.05, 0.2}) {
        sbv_cloud c = cloud_of(p.data(), big);
        std::vector<unsigned char> a(12 * big), b(12 * big);
        size_t ma = 0, mb = 0;
        check(sbv_downsample_cpu(&c, v, cpus, a.data(), big, &ma, err, sizeof err), "cpu", err);
        check(sbv_downsample_cuda(&c, v, b.data(), big, &mb, err, sizeof err), "cuda", err);
        bool same = ma == mb && memcmp(a.data(), b.data(), 12 * ma) == 0;
        printf("10M lidar v%.2f: voxels cpu %zu cuda %zu, bytes identical: %s\n", v, ma, mb, same ? "yes" : "NO");
        double dev = 0;
        check(sbv_cuda_time_resident(&c, v, 10, &dev, err, sizeof err), "resident", err);
        std::vector<double> t_page, t_pin, t_cpu1, t_cpun;
        float *pinned = (float *)sbv_cuda_host_alloc(12 * big);
        memcpy(pinned, p.data(), 12 * big);
        sbv_cloud cp = cloud_of(pinned, big);
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            sbv_downsample_cuda(&c, v, b.data(), big, &mb, err, sizeof err);
            t_page.push_back(now() - t0);
            t0 = now();
            sbv_downsample_cuda(&cp, v, b.data(), big, &mb, err, sizeof err);
            t_pin.push_back(now() - t0);
            t0 = now();
            sbv_downsample_cpu(&c, v, cpus, a.data(), big, &ma, err, sizeof err);
            t_cpun.push_back(now() - t0);
        }
        for (int r = 0; r < 3; r++) {
            double t0 = now();
            sbv_downsample_cpu(&c, v, 1, a.data(), big, &ma, err, sizeof err);
            t_cpu1.push_back(now() - t0);
        }
        sbv_cuda_host_free(pinned);
        printf("10M lidar v%.2f: cuda device-resident %.2f Gpts/s | with transfers: pinned input %.2f Gpts/s, "
               "pageable input %.2f Gpts/s | C x1 %.1f Mpts/s, C x%d %.1f Mpts/s\n",
               v, big / dev / 1e9, big / median(t_pin) / 1e9, big / median(t_page) / 1e9,
               big / median(t_cpu1) / 1e6, cpus, big / median(t_cpun) / 1e6);
    }
    /* 2. 100k-point frames: batched vs one by one vs the C kernel on every core */
    const int nframes = 240;
    const size_t fp = 100000;
    std::vector<std::vector<float>> frames;
    for (int f = 0; f < nframes; f++) frames.push_back(lidar(fp, 100 + f));
    for (double v : {0.05, 0.2}) {
        std::vector<std::vector<unsigned char>> outs(nframes, std::vector<unsigned char>(12 * fp));
        std::vector<sbv_cloud> clouds;
        for (auto &fr : frames) clouds.push_back(cloud_of(fr.data(), fp));
        std::vector<const sbv_cloud *> cptr;
        for (auto &c : clouds) cptr.push_back(&c);
        std::vector<void *> optr;
        for (auto &o : outs) optr.push_back(o.data());
        std::vector<double> vox(nframes, v);
        std::vector<size_t> caps(nframes, fp), got(nframes);
        std::vector<int> st(nframes);
        bool parity = true;
        for (int batch : {1, 8, 40}) {
            std::vector<double> ts;
            for (int r = 0; r < 4; r++) {
                double t0 = now();
                for (int f = 0; f < nframes; f += batch) {
                    int k = std::min(batch, nframes - f);
                    check(sbv_downsample_cuda_batch(cptr.data() + f, vox.data() + f, k, optr.data() + f,
                                                    caps.data() + f, got.data() + f, st.data() + f, err,
                                                    sizeof err),
                          "batch", err);
                }
                ts.push_back(now() - t0);
            }
            if (batch == 40) {
                std::vector<unsigned char> ref(12 * fp);
                for (int f = 0; f < nframes; f += 17) {
                    size_t m;
                    sbv_downsample_cpu(&clouds[f], v, 1, ref.data(), fp, &m, err, sizeof err);
                    parity = parity && m == got[f] && memcmp(ref.data(), outs[f].data(), 12 * m) == 0;
                }
            }
            printf("100k frames v%.2f: cuda batch of %2d frames: %.2f Gpts/s\n", v, batch,
                   nframes * fp / median(ts) / 1e9);
        }
        std::vector<double> tc;
        for (int r = 0; r < 3; r++) {
            std::vector<pthread_t> th(cpus);
            std::vector<Pool> pools(cpus);
            double t0 = now();
            for (int t = 0; t < cpus; t++) {
                pools[t] = Pool{&frames, v, t, cpus, 1};
                pthread_create(&th[t], nullptr, cpu_worker, &pools[t]);
            }
            for (int t = 0; t < cpus; t++) pthread_join(th[t], nullptr);
            tc.push_back(now() - t0);
        }
        std::vector<double> t1;
        std::vector<unsigned char> o(12 * fp);
        for (int r = 0; r < 2; r++) {
            double t0 = now();
            for (auto &c : clouds) {
                size_t m;
                sbv_downsample_cpu(&c, v, 1, o.data(), fp, &m, err, sizeof err);
            }
            t1.push_back(now() - t0);
        }
        std::vector<double> tn;
        for (int r = 0; r < 2; r++) {
            double t0 = now();
            for (auto &c : clouds) {
                size_t m;
                sbv_downsample_cpu(&c, v, cpus, o.data(), fp, &m, err, sizeof err);
            }
            tn.push_back(now() - t0);
        }
        printf("100k frames v%.2f: C x1 one frame at a time %.1f Mpts/s; C x%d per frame %.1f Mpts/s; "
               "C %d workers x 1 thread %.1f Mpts/s; batch parity with CPU: %s\n",
               v, nframes * fp / median(t1) / 1e6, cpus, nframes * fp / median(tn) / 1e6, cpus,
               nframes * fp / median(tc) / 1e6, parity ? "yes" : "NO");
    }
    return 0;
}
