// A small program written against NVIDIA's cuFile API (cufile.h), used unchanged with NVIDIA's
// libcufile and with ugds's libcufile_ugds (relinked, or LD_PRELOAD): GPU -> file -> GPU with
// cuFileWrite/cuFileRead, then a batch of reads, data checked on the host.
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <cufile.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1 << 20)

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE\n", argv[0]);
        return 2;
    }
    CUfileError_t st = cuFileDriverOpen();
    if (st.err != CU_FILE_SUCCESS) {
        printf("cuFileDriverOpen: %d\n", st.err);
        return 1;
    }
    int fd = open(argv[1], O_CREAT | O_RDWR | O_DIRECT, 0644);
    if (fd < 0 || ftruncate(fd, 32 * MiB)) {
        perror(argv[1]);
        return 1;
    }
    CUfileDescr_t d;
    memset(&d, 0, sizeof d);
    d.handle.fd = fd;
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    CUfileHandle_t fh;
    st = cuFileHandleRegister(&fh, &d);
    if (st.err != CU_FILE_SUCCESS) {
        printf("cuFileHandleRegister: %d\n", st.err);
        return 1;
    }
    size_t len = 8 * MiB;
    unsigned char *host = malloc(len), *back = malloc(len);
    for (size_t i = 0; i < len; i++) host[i] = (unsigned char)(i * 131 + 7);
    void *a, *b;
    cudaMalloc(&a, len);
    cudaMalloc(&b, len);
    cudaMemcpy(a, host, len, cudaMemcpyHostToDevice);
    cudaMemset(b, 0, len);
    if (cuFileBufRegister(a, len, 0).err || cuFileBufRegister(b, len, 0).err) {
        printf("cuFileBufRegister failed\n");
        return 1;
    }
    ssize_t n = cuFileWrite(fh, a, len, 4 * MiB, 0);
    ssize_t m = cuFileRead(fh, b, len, 4 * MiB, 0);
    cudaMemcpy(back, b, len, cudaMemcpyDeviceToHost);
    printf("cuFileWrite %zd, cuFileRead %zd, data %s\n", n, m, memcmp(host, back, len) ? "DIFFERS" : "identical");
    if (n != (ssize_t)len || m != (ssize_t)len || memcmp(host, back, len)) return 1;

    cudaMemset(b, 0, len);
    CUfileBatchHandle_t bh;
    if (cuFileBatchIOSetUp(&bh, 8).err) {
        printf("cuFileBatchIOSetUp failed\n");
        return 1;
    }
    CUfileIOParams_t io[8];
    for (int i = 0; i < 8; i++) {
        memset(&io[i], 0, sizeof io[i]);
        io[i].mode = CUFILE_BATCH;
        io[i].fh = fh;
        io[i].opcode = CUFILE_READ;
        io[i].cookie = (void *)(intptr_t)(i + 1);
        io[i].u.batch.devPtr_base = b;
        io[i].u.batch.devPtr_offset = (off_t)i * MiB;
        io[i].u.batch.file_offset = 4 * MiB + (off_t)i * MiB;
        io[i].u.batch.size = MiB;
    }
    if (cuFileBatchIOSubmit(bh, 8, io, 0).err) {
        printf("cuFileBatchIOSubmit failed\n");
        return 1;
    }
    CUfileIOEvents_t ev[8];
    unsigned got = 0;
    while (got < 8) {
        unsigned nr = 8 - got;
        struct timespec t = {5, 0};
        if (cuFileBatchIOGetStatus(bh, 1, &nr, ev + got, &t).err) {
            printf("cuFileBatchIOGetStatus failed\n");
            return 1;
        }
        got += nr;
    }
    int complete = 0;
    for (int i = 0; i < 8; i++) complete += ev[i].status == CUFILE_COMPLETE && ev[i].ret == MiB;
    cuFileBatchIODestroy(bh);
    cudaMemcpy(back, b, len, cudaMemcpyDeviceToHost);
    printf("batch: %d of 8 complete, data %s\n", complete, memcmp(host, back, len) ? "DIFFERS" : "identical");
    if (complete != 8 || memcmp(host, back, len)) return 1;
    cuFileBufDeregister(a);
    cuFileBufDeregister(b);
    cuFileHandleDeregister(fh);
    cuFileDriverClose();
    printf("cufile roundtrip: ok\n");
    return 0;
}
