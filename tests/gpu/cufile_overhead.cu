// The cuFile drop-in's overhead on the fallback path: 4 KiB random reads of a 1 GiB file into GPU
// memory through cuFileRead, four ways, alternating in rounds, medians:
//   (a) registered buffer, 4 KiB-aligned file offset  (baseline)
//   (b) unregistered buffer, aligned                   (staged through the library's buffers)
//   (c) registered buffer, offset + 1 byte             (bounce buffer)
//   (d) unregistered buffer, offset + 1 byte
// Prints each method's median latency and its ratio to (a) from the same run.
//
// Build against ugds's drop-in, or NVIDIA's libcufile, from the same source:
//   nvcc -O2 -DUSE_CUFILE_H cufile_overhead.cu -L PREFIX/lib/ugds-cufile -lcufile -lcudart \
//        -Xlinker -rpath=PREFIX/lib/ugds-cufile            (cufile.h from the CUDA toolkit)
//   nvcc -O2 cufile_overhead.cu -L PREFIX/lib/ugds-cufile -lcufile -lcudart ...
//        (without -DUSE_CUFILE_H: the few declarations below, same layout as cufile.h)
//   ./cufile_overhead FILE [rounds] [reads_per_round]
// Exit 0 = all methods ran and the data checks passed; 2 = cuFile refused (message printed).
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <algorithm>
#include <vector>

#ifdef USE_CUFILE_H
#include <cufile.h>
#else
extern "C" {
typedef struct CUfileError { int err; int cu_err; } CUfileError_t;
typedef void* CUfileHandle_t;
typedef struct CUfileDescr_t {
    int type;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1
    union { int fd; void* handle; } handle;
    const void* fs_ops;
} CUfileDescr_t;
#define CU_FILE_HANDLE_TYPE_OPAQUE_FD 1
CUfileError_t cuFileDriverOpen(void);
CUfileError_t cuFileDriverClose(void);
CUfileError_t cuFileHandleRegister(CUfileHandle_t* fh, CUfileDescr_t* descr);
void cuFileHandleDeregister(CUfileHandle_t fh);
CUfileError_t cuFileBufRegister(const void* bufPtr_base, size_t length, int flags);
CUfileError_t cuFileBufDeregister(const void* bufPtr_base);
ssize_t cuFileRead(CUfileHandle_t fh, void* bufPtr_base, size_t size, off_t file_offset, off_t bufPtr_offset);
}
#endif

static const size_t kFile = 1ull << 30;
static const size_t kIo = 4096;
static const size_t kBuf = 64 << 10;

static uint32_t word_at(uint64_t off4) { return (uint32_t)(off4 * 0x9E3779B1u) ^ 0xC0FFEE11u; }
static uint8_t byte_at(uint64_t off) {
    uint32_t w = word_at(off / 4);
    return (uint8_t)(w >> (8 * (off % 4)));
}

static double now_us() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static int make_file(const char* path) {
    struct stat st;
    if (stat(path, &st) == 0 && (size_t)st.st_size == kFile) {
        // Reuse only a file with our pattern (check a few words).
        int fd = open(path, O_RDONLY);
        uint32_t w[4];
        bool ok = fd >= 0 && pread(fd, w, 16, 4096 * 777) == 16;
        for (int i = 0; ok && i < 4; i++) ok = w[i] == word_at((4096 * 777) / 4 + i);
        if (fd >= 0) close(fd);
        if (ok) return 0;
    }
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) {
        printf("open %s: %s\n", path, strerror(errno));
        return -1;
    }
    const size_t chunk = 8 << 20;
    std::vector<uint32_t> w(chunk / 4);
    for (size_t off = 0; off < kFile; off += chunk) {
        for (size_t i = 0; i < w.size(); i++) w[i] = word_at(off / 4 + i);
        if (pwrite(fd, w.data(), chunk, off) != (ssize_t)chunk) {
            printf("pwrite: %s\n", strerror(errno));
            return -1;
        }
    }
    fsync(fd);
    close(fd);
    return 0;
}

struct Method {
    const char* name;
    bool registered;
    off_t delta;  // added to the 4 KiB-aligned file offset
};

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [rounds] [reads_per_round]\n", argv[0]);
        return 1;
    }
    const char* path = argv[1];
    int rounds = argc > 2 ? atoi(argv[2]) : 9;
    int per_round = argc > 3 ? atoi(argv[3]) : 400;
    if (make_file(path)) return 1;
    cudaSetDevice(0);
    cudaFree(0);

    CUfileError_t e = cuFileDriverOpen();
    if (e.err != 0) {
        printf("cuFileDriverOpen: err %d cu_err %d\n", (int)e.err, (int)e.cu_err);
        return 2;
    }
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) {
        printf("open O_DIRECT: %s\n", strerror(errno));
        return 1;
    }
    CUfileDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    CUfileHandle_t fh = nullptr;
    e = cuFileHandleRegister(&fh, &d);
    if (e.err != 0) {
        printf("cuFileHandleRegister: err %d cu_err %d\n", (int)e.err, (int)e.cu_err);
        return 2;
    }
    void *reg = nullptr, *unreg = nullptr;
    cudaMalloc(&reg, kBuf);
    cudaMalloc(&unreg, kBuf);
    e = cuFileBufRegister(reg, kBuf, 0);
    if (e.err != 0) {
        printf("cuFileBufRegister: err %d cu_err %d\n", (int)e.err, (int)e.cu_err);
        return 2;
    }

    const Method m[4] = {
        {"(a) registered, aligned", true, 0},
        {"(b) unregistered, aligned", false, 0},
        {"(c) registered, offset+1", true, 1},
        {"(d) unregistered, offset+1", false, 1},
    };
    const size_t slots = (kFile - 2 * kIo) / kIo;

    // Correctness first (not timed): 32 reads per method, compared byte for byte.
    std::vector<uint8_t> h(kIo);
    unsigned seed = 12345;
    for (int k = 0; k < 4; k++) {
        void* buf = m[k].registered ? reg : unreg;
        for (int i = 0; i < 32; i++) {
            off_t off = (off_t)(rand_r(&seed) % slots) * kIo + m[k].delta;
            off_t boff = (i % 4) * kIo;
            cudaMemset(buf, 0, kBuf);
            cudaDeviceSynchronize();
            ssize_t r = cuFileRead(fh, buf, kIo, off, boff);
            if (r != (ssize_t)kIo) {
                printf("%s: cuFileRead(off %lld) returned %zd\n", m[k].name, (long long)off, r);
                return 1;
            }
            cudaMemcpy(h.data(), (char*)buf + boff, kIo, cudaMemcpyDeviceToHost);
            for (size_t j = 0; j < kIo; j++)
                if (h[j] != byte_at(off + j)) {
                    printf("%s: data mismatch at file offset %lld + %zu\n", m[k].name, (long long)off, j);
                    return 1;
                }
        }
    }
    printf("data check: 4 methods x 32 reads byte for byte: ok\n");

    // Warm-up, then rounds; the order of methods rotates each round.
    std::vector<double> lat[4];
    std::vector<double> round_med[4];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 50; i++)
            cuFileRead(fh, m[k].registered ? reg : unreg, kIo, (off_t)(rand_r(&seed) % slots) * kIo + m[k].delta, 0);
    for (int r = 0; r < rounds; r++) {
        for (int j = 0; j < 4; j++) {
            int k = (j + r) % 4;
            void* buf = m[k].registered ? reg : unreg;
            std::vector<double> v;
            v.reserve(per_round);
            for (int i = 0; i < per_round; i++) {
                off_t off = (off_t)(rand_r(&seed) % slots) * kIo + m[k].delta;
                double t0 = now_us();
                ssize_t n = cuFileRead(fh, buf, kIo, off, 0);
                double t = now_us() - t0;
                if (n != (ssize_t)kIo) {
                    printf("%s: cuFileRead returned %zd\n", m[k].name, n);
                    return 1;
                }
                v.push_back(t);
            }
            round_med[k].push_back(median(v));
            lat[k].insert(lat[k].end(), v.begin(), v.end());
        }
    }
    double base = median(lat[0]);
    printf("4 KiB random reads of a 1 GiB file into GPU memory, %d rounds x %d reads per method\n", rounds, per_round);
    printf("| method | median us | p90 us | ratio to (a) | per-round medians' ratio to (a): min..max |\n");
    printf("| --- | ---: | ---: | ---: | --- |\n");
    for (int k = 0; k < 4; k++) {
        std::vector<double> s = lat[k];
        std::sort(s.begin(), s.end());
        double lo = 1e9, hi = 0;
        for (int r = 0; r < rounds; r++) {
            double q = round_med[k][r] / round_med[0][r];
            lo = std::min(lo, q);
            hi = std::max(hi, q);
        }
        printf("| %s | %.1f | %.1f | %.2fx | %.2f..%.2f |\n", m[k].name, median(lat[k]), s[s.size() * 9 / 10],
               median(lat[k]) / base, lo, hi);
    }
    cuFileBufDeregister(reg);
    cuFileHandleDeregister(fh);
    close(fd);
    cuFileDriverClose();
    cudaFree(reg);
    cudaFree(unreg);
    printf("CUFILE-OVERHEAD ok\n");
    return 0;
}
