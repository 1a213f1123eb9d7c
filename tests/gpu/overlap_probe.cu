// Where a stream-ordered write's time goes when a kernel runs beside it: the shape of uGDS's
// bench_overlap (an asynchronous 1 MiB write on one stream, a busy kernel on another, both
// synchronized), with timestamps. For each iteration: when the enqueue returned, when the write's
// result word was set by the library (its host-side job is over), when the I/O stream's
// synchronize returned, and when the kernel's stream finished. Modes, taking turns:
//   sync        uGDSWrite, then the kernel, synchronized (bench_overlap's sequential loop)
//   async       uGDSWriteAsync alone, its stream synchronized
//   async+kern  uGDSWriteAsync and the kernel on another stream (bench_overlap's overlap loop)
//   kern        the kernel alone
// p50 per mode, in microseconds.
//
// nvcc -O2 -I<prefix>/include overlap_probe.cu -L<prefix>/lib -lugds -lcudart -o overlap_probe
// ./overlap_probe FILE [IO_SIZE_KIB] [ITERATIONS] [KERNEL_ITERS]
#include <algorithm>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ugds.h>
#include <unistd.h>
#include <vector>

#include "gpu_check.h"


__global__ void busy(float *out, size_t n, int iters) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = (float)i;
  for (int k = 0; k < iters; k++) v = v * 1.0001f + 0.0001f;
  out[i] = v;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE [IO_SIZE_KIB] [ITERATIONS] [KERNEL_ITERS]\n", argv[0]);
    return 2;
  }
  size_t io = (argc > 2 ? atol(argv[2]) : 1024) * 1024;
  int iters = argc > 3 ? atoi(argv[3]) : 200;
  int kiters = argc > 4 ? atoi(argv[4]) : 5000;
  CK(cudaSetDevice(0));
  if (uGDSDriverOpen().err != UGDS_SUCCESS) return 1;
  int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
  if (fd < 0 || ftruncate(fd, 64 << 20) != 0) return 1;
  uGDSDescr_t d;
  memset(&d, 0, sizeof d);
  d.handle.fd = fd;
  d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
  uGDSHandle_t fh;
  if (uGDSHandleRegister(&fh, &d).err != UGDS_SUCCESS) return 1;
  void *buf;
  CK(cudaMalloc(&buf, io));
  CK(cudaMemset(buf, 0x5a, io));
  if (uGDSBufRegister(buf, io, 0).err != UGDS_SUCCESS) return 1;
  size_t n = 256 * 1024;
  float *cbuf;
  CK(cudaMalloc(&cbuf, n * sizeof(float)));
  cudaStream_t sio, sk;
  CK(cudaStreamCreate(&sio));
  CK(cudaStreamCreate(&sk));
  uGDSStreamRegister(sio);
  size_t *size;
  off_t *foff, *boff;
  ssize_t *res;
  CK(cudaHostAlloc(&size, sizeof *size, 0));
  CK(cudaHostAlloc(&foff, sizeof *foff, 0));
  CK(cudaHostAlloc(&boff, sizeof *boff, 0));
  CK(cudaHostAlloc(&res, sizeof *res, 0));
  const char *names[] = {"sync", "async", "async+kern", "kern"};
  // [mode] -> per-iteration: total, job done (result set), io stream synced
  std::vector<double> total[4], job[4], iosync[4];
  long bad = 0;
  for (int i = 0; i < iters; i++) {
    for (int m = 0; m < 4; m++) {
      CK(cudaDeviceSynchronize());
      off_t off = (off_t)((i % 32) * io);
      double a = now_us(), j = 0, s = 0;
      if (m == 0) {
        if (uGDSWrite(fh, buf, io, off, 0) != (ssize_t)io) bad++;
        j = now_us();
        busy<<<(n + 255) / 256, 256>>>(cbuf, n, kiters);
        CK(cudaDeviceSynchronize());
        s = j;
      } else if (m == 3) {
        busy<<<(n + 255) / 256, 256, 0, sk>>>(cbuf, n, kiters);
        CK(cudaStreamSynchronize(sk));
      } else {
        *size = io;
        *foff = off;
        *boff = 0;
        *(volatile ssize_t *)res = 0;
        if (uGDSWriteAsync(fh, buf, size, foff, boff, res, sio).err != UGDS_SUCCESS) bad++;
        if (m == 2) busy<<<(n + 255) / 256, 256, 0, sk>>>(cbuf, n, kiters);
        while (*(volatile ssize_t *)res == 0) {
        }
        j = now_us();
        CK(cudaStreamSynchronize(sio));
        s = now_us();
        CK(cudaStreamSynchronize(sk));
        if (*res != (ssize_t)io) bad++;
      }
      double e = now_us();
      total[m].push_back(e - a);
      if (j) job[m].push_back(j - a);
      if (s) iosync[m].push_back(s - a);
    }
  }
  printf("%zu KiB writes, kernel_iters %d, p50 of %d each, modes taking turns (us):\n", io >> 10, kiters, iters);
  printf("  %-11s %10s %12s %12s\n", "mode", "total", "job done", "io synced");
  for (int m = 0; m < 4; m++)
    printf("  %-11s %10.1f %12.1f %12.1f\n", names[m], p50(total[m]), p50(job[m]), p50(iosync[m]));
  printf("OVERLAP-PROBE %s (%ld bad results)\n", bad ? "FAIL" : "PASS", bad);
  uGDSStreamDeregister(sio);
  uGDSBufDeregister(buf);
  uGDSHandleDeregister(fh);
  uGDSDriverClose();
  return bad ? 1 : 0;
}
