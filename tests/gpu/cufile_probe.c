// What NVIDIA cuFile does on a machine: opens the driver, reads a file into cudaMalloc'd memory
// at several sizes for one second each, prints GB/s. Built and run on the GPU machine by
// tests/gpu/run.sh next to `ugds bench-gpu`, so the two are measured in the same run.
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <cufile.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s FILE FILE_SIZE_MIB\n", argv[0]);
        return 2;
    }
    long long file_size = atoll(argv[2]) << 20;
    CUfileError_t st = cuFileDriverOpen();
    if (st.err != CU_FILE_SUCCESS) {
        printf("cuFileDriverOpen failed: %d (%s)\n", st.err, CUFILE_ERRSTR(st.err));
        return 0;
    }
    int fd = open(argv[1], O_RDONLY | O_DIRECT);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    CUfileDescr_t d = {0};
    d.handle.fd = fd;
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    CUfileHandle_t h;
    st = cuFileHandleRegister(&h, &d);
    if (st.err != CU_FILE_SUCCESS) {
        printf("cuFileHandleRegister failed: %d (%s)\n", st.err, CUFILE_ERRSTR(st.err));
        return 0;
    }
    size_t sizes[] = {4096, 65536, 1 << 20, 4 << 20, 16 << 20};
    printf("%8s %14s\n", "size", "cuFile GB/s");
    for (int i = 0; i < 5; i++) {
        size_t sz = sizes[i];
        void *dev;
        cudaMalloc(&dev, sz);
        cuFileBufRegister(dev, sz, 0);
        long long slots = file_size / sz, n = 0;
        unsigned long long x = 88172645463325252ULL;
        double t0 = now();
        while (now() - t0 < 1.0) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            ssize_t r = cuFileRead(h, dev, sz, (off_t)((x % slots) * sz), 0);
            if (r != (ssize_t)sz) {
                printf("cuFileRead returned %zd\n", r);
                break;
            }
            n++;
        }
        printf("%8zu %14.3f\n", sz, n * (double)sz / (now() - t0) / 1e9);
        cuFileBufDeregister(dev);
        cudaFree(dev);
    }
    cuFileHandleDeregister(h);
    cuFileDriverClose();
    return 0;
}
