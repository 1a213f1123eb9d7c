// ugds with CUDA memory: read/write, a batch, stream-ordered I/O between kernels, dma-buf export.
//
//   nvcc quickstart.cu -I$PREFIX/include -L$PREFIX/lib -lugds -lcuda -o quickstart
//   ./quickstart data.bin      # a file of at least 64 MiB (fallback path), or /dev/ugds_drvN
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ugds.h>

#define MiB (1 << 20)

__global__ void fill(unsigned *p, unsigned n, unsigned seed) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = i * 2654435761u ^ seed;
}

__global__ void count_diff(const unsigned *a, const unsigned *b, unsigned n, unsigned *out) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && a[i] != b[i]) atomicAdd(out, 1u);
}

static int fail(const char *what, long code) {
    fprintf(stderr, "cuda quickstart: %s: %ld (%s)\n", what, code, ugdsxErrorString(code));
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s /dev/ugds_drvN|FILE\n", argv[0]);
        return 2;
    }
    /* A character device (a ugds node) cannot be opened with O_DIRECT; a file or block device
     * is opened with it, for the fallback path. */
    struct stat st;
    int is_dev = stat(argv[1], &st) == 0 && S_ISCHR(st.st_mode);
    int fd = open(argv[1], O_RDWR | (is_dev ? 0 : O_DIRECT));
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    const size_t len = 16 * MiB;
    const unsigned words = len / 4;
    unsigned *a, *b, *diff;
    cudaMalloc(&a, len);
    cudaMalloc(&b, len);
    cudaMalloc(&diff, 4);
    cudaMemset(b, 0, len);
    cudaMemset(diff, 0, 4);

    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    uGDSHandle_t h;
    uGDSError_t e = uGDSDriverOpen();
    if (e.err) return fail("uGDSDriverOpen", e.err);
    if ((e = uGDSHandleRegister(&h, &d)).err) return fail("uGDSHandleRegister", e.err);
    uGDSBufConfig_t cfg = {UGDS_BACKEND_CUDA, true};
    if ((e = uGDSBufRegisterEx(a, len, &cfg)).err) return fail("uGDSBufRegisterEx(a)", e.err);
    if ((e = uGDSBufRegister(b, len, 0)).err) return fail("uGDSBufRegister(b)", e.err);

    // 1. GPU -> file -> GPU.
    fill<<<words / 256, 256>>>(a, words, 42);
    cudaDeviceSynchronize();
    ssize_t n = uGDSWrite(h, a, len, 0, 0);
    if (n != (ssize_t)len) return fail("uGDSWrite", n);
    n = uGDSRead(h, b, len, 0, 0);
    if (n != (ssize_t)len) return fail("uGDSRead", n);
    count_diff<<<words / 256, 256>>>(a, b, words, diff);
    unsigned bad = 1;
    cudaMemcpy(&bad, diff, 4, cudaMemcpyDeviceToHost);
    if (bad) return fail("sync round trip: words differ", bad);
    printf("read/write: 16 MiB GPU -> file -> GPU, identical\n");

    // 2. A batch of 16 reads of 1 MiB into b.
    cudaMemset(b, 0, len);
    uGDSBatchHandle_t bt;
    if ((e = uGDSBatchIOSetUp(&bt, h, 16)).err) return fail("uGDSBatchIOSetUp", e.err);
    uGDSIOParams_t io[16];
    for (int i = 0; i < 16; i++) {
        io[i].devPtr_base = b;
        io[i].file_offset = (off_t)i * MiB;
        io[i].devPtr_offset = (off_t)i * MiB;
        io[i].size = MiB;
        io[i].opcode = UGDS_READ;
        io[i].cookie = (void *)(intptr_t)i;
    }
    if ((e = uGDSBatchIOSubmit(bt, 16, io, 0)).err) return fail("uGDSBatchIOSubmit", e.err);
    uGDSIOEvents_t ev[16];
    unsigned got = 0;
    while (got < 16) {
        unsigned nr = 16 - got;
        if ((e = uGDSBatchIOGetStatus(bt, 1, &nr, ev + got, NULL)).err) return fail("uGDSBatchIOGetStatus", e.err);
        got += nr;
    }
    for (int i = 0; i < 16; i++)
        if (ev[i].status != UGDS_BATCH_COMPLETE) return fail("batch entry", ev[i].ret);
    uGDSBatchIODestroy(bt);
    cudaMemset(diff, 0, 4);
    count_diff<<<words / 256, 256>>>(a, b, words, diff);
    cudaMemcpy(&bad, diff, 4, cudaMemcpyDeviceToHost);
    if (bad) return fail("batch: words differ", bad);
    printf("batch: 16 x 1 MiB reads into GPU memory, identical\n");

    // 3. In stream order: kernel -> write -> read -> kernel, the I/O's arguments in host memory.
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if ((e = uGDSStreamRegister(s)).err) return fail("uGDSStreamRegister", e.err);
    size_t size = len;
    off_t foff = 32 * MiB, boff = 0;
    ssize_t wbytes = 0, rbytes = 0;
    cudaMemsetAsync(b, 0, len, s);
    cudaMemsetAsync(diff, 0, 4, s);
    fill<<<words / 256, 256, 0, s>>>(a, words, 7);
    if ((e = uGDSWriteAsync(h, a, &size, &foff, &boff, &wbytes, s)).err) return fail("uGDSWriteAsync", e.err);
    if ((e = uGDSReadAsync(h, b, &size, &foff, &boff, &rbytes, s)).err) return fail("uGDSReadAsync", e.err);
    count_diff<<<words / 256, 256, 0, s>>>(a, b, words, diff);
    cudaMemcpyAsync(&bad, diff, 4, cudaMemcpyDeviceToHost, s);
    cudaStreamSynchronize(s);
    if (wbytes != (ssize_t)len || rbytes != (ssize_t)len) return fail("async results", wbytes != (ssize_t)len ? wbytes : rbytes);
    if (bad) return fail("async: words differ", bad);
    printf("async: kernel -> write -> read -> kernel in one stream, identical\n");
    uGDSStreamDeregister(s);

    // 4. Export the GPU buffer as a dma-buf (for RDMA NICs and other importers).
    uGDSDmabufExport_t x;
    if ((e = uGDSExportDmabuf(a, &x)).err) return fail("uGDSExportDmabuf", e.err);
    printf("dma-buf: fd %d, %zu bytes\n", x.fd, x.length);
    close(x.fd);

    uGDSBufDeregister(a);
    uGDSBufDeregister(b);
    uGDSHandleDeregister(h);
    uGDSDriverClose();
    printf("cuda quickstart: ok\n");
    return 0;
}
