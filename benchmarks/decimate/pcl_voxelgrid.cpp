// PCL VoxelGrid timing harness for benchmarks/decimate/cli.py (built on demand, never shipped).
// Usage: pcl_voxelgrid FILE HAS_RGB VOXEL REPEATS [wall|cpu]
//   FILE: little-endian records of float32 x, y, z (+ uint32 packed rgb when HAS_RGB is 1),
//   finite points only (PCL keeps NaN handling to the caller too). Prints
//   "<median seconds of filter()> <output points>". The cloud is loaded once; only filter() is
//   timed, after one warm-up call.
#include <pcl/filters/voxel_grid.h>
#include <pcl/point_types.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

static bool cpu_clock = false;

static double now() {
    if (cpu_clock) {
        timespec t;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
        return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class P>
static int run(const std::vector<char> &raw, size_t stride, float voxel, int reps) {
    typename pcl::PointCloud<P>::Ptr in(new pcl::PointCloud<P>);
    const size_t n = raw.size() / stride;
    in->resize(n);
    for (size_t i = 0; i < n; i++) {
        const char *r = raw.data() + i * stride;
        P &p = (*in)[i];
        std::copy(r, r + 12, reinterpret_cast<char *>(&p.x));
        if constexpr (sizeof(P) > sizeof(pcl::PointXYZ)) {
            uint32_t rgb;
            std::copy(r + 12, r + 16, reinterpret_cast<char *>(&rgb));
            p.rgba = rgb;
        }
    }
    in->is_dense = true;
    pcl::VoxelGrid<P> grid;
    grid.setInputCloud(in);
    grid.setLeafSize(voxel, voxel, voxel);
    pcl::PointCloud<P> out;
    grid.filter(out);
    std::vector<double> times;
    for (int k = 0; k < reps; k++) {
        const double t0 = now();
        grid.filter(out);
        times.push_back(now() - t0);
    }
    std::sort(times.begin(), times.end());
    std::printf("%.9f %zu\n", times[times.size() / 2], out.size());
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        std::fprintf(stderr, "usage: %s FILE HAS_RGB VOXEL REPEATS [wall|cpu]\n", argv[0]);
        return 2;
    }
    cpu_clock = argc == 6 && std::string(argv[5]) == "cpu";
    std::ifstream f(argv[1], std::ios::binary);
    std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const bool rgb = std::atoi(argv[2]) != 0;
    const float voxel = std::strtof(argv[3], nullptr);
    const int reps = std::max(1, std::atoi(argv[4]));
    return rgb ? run<pcl::PointXYZRGB>(raw, 16, voxel, reps) : run<pcl::PointXYZ>(raw, 12, voxel, reps);
}
