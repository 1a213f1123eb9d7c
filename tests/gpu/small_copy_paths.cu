// Ways to get a small read into GPU memory, timed against each other in one run (issue 17:
// "read small I/O straight into memory the GPU can map where that is faster; measure both").
//
//   copy+sync     cudaMemcpyAsync pinned -> device, cudaStreamSynchronize (what ugds does)
//   copy+poll     the same, waited for by polling cudaStreamQuery
//   memcpy        cudaMemcpy (the synchronous call) from pinned memory
//   kernel+sync   a kernel on the GPU copies from mapped pinned host memory (zero-copy reads over
//                 PCIe) into device memory; cudaStreamSynchronize
//   kernel+poll   the same, polled
//   pageable      cudaMemcpy from ordinary (pageable) host memory; whether its data had landed
//                 when it returned is checked by a kernel on another stream right after
//   pageable+sync the same, then the legacy stream synchronized (the copy has surely landed)
//   pageable-async+sync  cudaMemcpyAsync from pageable memory on our stream, synchronized
// and, with the disk: pread O_DIRECT into the pinned (or pageable) buffer, then copy+sync,
// kernel+sync or pageable+sync.
// Each variant checks that the bytes arrived (a pattern that changes every iteration).
// Also probes whether the CPU can map the GPU memory's dma-buf (mmap of the exported fd), which
// would let the CPU write small reads straight into GPU memory.
//
// nvcc -O2 -o small_copy_paths small_copy_paths.cu -lcuda
// ./small_copy_paths FILE [ITERATIONS]   (FILE: at least 64 MiB, read with O_DIRECT)
#include <algorithm>
#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#include "gpu_check.h"

// 16-byte loads from mapped host memory, one per thread.
__global__ void copy16(const uint4 *src, uint4 *dst, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

static void fill(unsigned char *p, size_t len, unsigned seed) {
  for (size_t i = 0; i < len; i += 4) *(unsigned *)(p + i) = seed * 2654435761u + (unsigned)i;
}

static bool check(const unsigned char *dev, size_t len, unsigned seed, unsigned char *tmp) {
  CK(cudaMemcpy(tmp, dev, len, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < len; i += 4)
    if (*(unsigned *)(tmp + i) != seed * 2654435761u + (unsigned)i) return false;
  return true;
}

enum {
  COPY_SYNC, COPY_POLL, MEMCPY, KERNEL_SYNC, KERNEL_POLL, PAGEABLE, PAGEABLE_SYNC, PAGEABLE_ASYNC, DISK, DISK_COPY,
  DISK_KERNEL, DISK_PAGEABLE, NV
};
static const char *names[NV] = {"copy+sync",     "copy+poll",      "memcpy", "kernel+sync",
                                "kernel+poll",   "pageable",       "pageable+sync", "pageable-async+sync",
                                "disk",          "disk+copy",      "disk+kernel", "disk+pageable+sync"};

// Counts words of dst that differ from the pattern of `seed` (a copy that had not landed yet).
__global__ void stale(const unsigned *dst, size_t words, unsigned seed, unsigned *bad) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < words && dst[i] != seed * 2654435761u + (unsigned)(i * 4)) atomicAdd(bad, 1u);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE [ITERATIONS]\n", argv[0]);
    return 2;
  }
  int iters = argc > 2 ? atoi(argv[2]) : 2000;
  int fd = open(argv[1], O_RDONLY | O_DIRECT);
  if (fd < 0) {
    perror("open");
    return 2;
  }
  off_t fsize = lseek(fd, 0, SEEK_END);
  if (fsize < (64 << 20)) {
    fprintf(stderr, "%s: need at least 64 MiB\n", argv[1]);
    return 2;
  }
  CK(cudaSetDeviceFlags(cudaDeviceMapHost));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t max = 64 << 10;
  unsigned char *pinned, *mapped, *dev, *tmp = (unsigned char *)malloc(max), *pageable;
  // Ordinary host memory (never registered with CUDA), aligned for O_DIRECT.
  if (posix_memalign((void **)&pageable, 4096, max)) return 2;
  unsigned *stale_count;
  CK(cudaMallocManaged((void **)&stale_count, sizeof(unsigned)));
  *stale_count = 0;
  CK(cudaHostAlloc((void **)&pinned, max, cudaHostAllocDefault));
  CK(cudaHostAlloc((void **)&mapped, max, cudaHostAllocMapped));
  unsigned char *mapped_dev;
  CK(cudaHostGetDevicePointer((void **)&mapped_dev, mapped, 0));
  CK(cudaMalloc((void **)&dev, 2 << 20));
  int failures = 0;

  // Can the CPU map GPU memory through its dma-buf?
  {
    int dfd = -1;
    CUresult r = cuMemGetHandleForAddressRange(&dfd, (CUdeviceptr)dev, 2 << 20,
                                               CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CUDA_SUCCESS) {
      printf("dma-buf export: CUresult %d\n", (int)r);
    } else {
      void *m = mmap(nullptr, 2 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, dfd, 0);
      if (m == MAP_FAILED)
        printf("mmap of the GPU memory's dma-buf: refused (%s): the CPU cannot write GPU memory this way\n",
               strerror(errno));
      else {
        printf("mmap of the GPU memory's dma-buf: mapped at %p\n", m);
        munmap(m, 2 << 20);
      }
      close(dfd);
    }
  }

  for (size_t len : {(size_t)4096, (size_t)65536}) {
    std::vector<double> t[NV];
    unsigned seed = 1;
    int threads = 256, blocks = (int)((len / 16 + threads - 1) / threads);
    for (int it = 0; it < iters + 50; it++) {
      for (int v = 0; v < NV; v++) {
        seed++;
        off_t off = ((off_t)(rand() % (int)((fsize - (off_t)max) / 4096))) * 4096;
        double t0, t1;
        bool ok = true;
        switch (v) {
        case COPY_SYNC:
        case COPY_POLL:
          fill(pinned, len, seed);
          t0 = now_us();
          CK(cudaMemcpyAsync(dev, pinned, len, cudaMemcpyHostToDevice, s));
          if (v == COPY_SYNC)
            CK(cudaStreamSynchronize(s));
          else
            while (cudaStreamQuery(s) == cudaErrorNotReady) {
            }
          t1 = now_us();
          ok = check(dev, len, seed, tmp);
          break;
        case MEMCPY:
          fill(pinned, len, seed);
          t0 = now_us();
          CK(cudaMemcpy(dev, pinned, len, cudaMemcpyHostToDevice));
          t1 = now_us();
          ok = check(dev, len, seed, tmp);
          break;
        case KERNEL_SYNC:
        case KERNEL_POLL:
          fill(mapped, len, seed);
          t0 = now_us();
          copy16<<<blocks, threads, 0, s>>>((const uint4 *)mapped_dev, (uint4 *)dev, len / 16);
          if (v == KERNEL_SYNC)
            CK(cudaStreamSynchronize(s));
          else
            while (cudaStreamQuery(s) == cudaErrorNotReady) {
            }
          t1 = now_us();
          ok = check(dev, len, seed, tmp);
          break;
        case PAGEABLE:
          // Whether the copy has landed when the call returns: a kernel on the non-blocking
          // stream (not ordered after the legacy stream's copy) looks at once.
          fill(pageable, len, seed);
          t0 = now_us();
          CK(cudaMemcpy(dev, pageable, len, cudaMemcpyHostToDevice));
          t1 = now_us();
          stale<<<blocks, threads, 0, s>>>((const unsigned *)dev, len / 4, seed, stale_count);
          CK(cudaStreamSynchronize(s));
          ok = check(dev, len, seed, tmp);
          break;
        case PAGEABLE_SYNC:
          fill(pageable, len, seed);
          t0 = now_us();
          CK(cudaMemcpy(dev, pageable, len, cudaMemcpyHostToDevice));
          CK(cudaStreamSynchronize(0));
          t1 = now_us();
          ok = check(dev, len, seed, tmp);
          break;
        case PAGEABLE_ASYNC:
          fill(pageable, len, seed);
          t0 = now_us();
          CK(cudaMemcpyAsync(dev, pageable, len, cudaMemcpyHostToDevice, s));
          CK(cudaStreamSynchronize(s));
          t1 = now_us();
          ok = check(dev, len, seed, tmp);
          break;
        case DISK:
        case DISK_COPY:
        case DISK_KERNEL:
        case DISK_PAGEABLE: {
          unsigned char *buf = v == DISK_KERNEL ? mapped : v == DISK_PAGEABLE ? pageable : pinned;
          t0 = now_us();
          ok = pread(fd, buf, len, off) == (ssize_t)len;
          if (v == DISK_COPY) {
            CK(cudaMemcpyAsync(dev, pinned, len, cudaMemcpyHostToDevice, s));
            CK(cudaStreamSynchronize(s));
          } else if (v == DISK_PAGEABLE) {
            CK(cudaMemcpy(dev, pageable, len, cudaMemcpyHostToDevice));
            CK(cudaStreamSynchronize(0));
          } else if (v == DISK_KERNEL) {
            copy16<<<blocks, threads, 0, s>>>((const uint4 *)mapped_dev, (uint4 *)dev, len / 16);
            CK(cudaStreamSynchronize(s));
          }
          t1 = now_us();
          if (ok && v != DISK) {
            CK(cudaMemcpy(tmp, dev, len, cudaMemcpyDeviceToHost));
            ok = memcmp(tmp, buf, len) == 0;
          }
          break;
        }
        }
        if (!ok) failures++;
        if (it >= 50) t[v].push_back(t1 - t0);
      }
    }
    printf("\n%zu bytes, p50 of %d each, methods taking turns:\n", len, iters);
    for (int v = 0; v < NV; v++) printf("  %-12s %8.2f us\n", names[v], p50(t[v]));
    printf("  stale words seen right after the pageable cudaMemcpy returned: %u\n", *stale_count);
    *stale_count = 0;
    printf("  ratios: pageable+sync / copy+sync %.2fx, disk+pageable+sync / disk+copy %.2fx\n",
           p50(t[PAGEABLE_SYNC]) / p50(t[COPY_SYNC]), p50(t[DISK_PAGEABLE]) / p50(t[DISK_COPY]));
    printf("  ratios: kernel+sync / copy+sync %.2fx, disk+kernel / disk+copy %.2fx; disk+copy - disk %.2f us, "
           "disk+kernel - disk %.2f us\n",
           p50(t[KERNEL_SYNC]) / p50(t[COPY_SYNC]), p50(t[DISK_KERNEL]) / p50(t[DISK_COPY]),
           p50(t[DISK_COPY]) - p50(t[DISK]), p50(t[DISK_KERNEL]) - p50(t[DISK]));
  }
  // Many small copies at once (a batch whose reads completed together): one cudaMemcpyAsync
  // each, against one cuMemcpyBatchAsync for all; time to issue them, and until they are done.
  for (int count : {8, 32}) {
    const size_t len = 4096;
    unsigned char *src;
    CK(cudaHostAlloc((void **)&src, count * len, cudaHostAllocDefault));
    std::vector<CUdeviceptr> dsts(count), srcs(count);
    std::vector<size_t> sizes(count, len);
    for (int i = 0; i < count; i++) {
      dsts[i] = (CUdeviceptr)(dev + i * 65536);
      srcs[i] = (CUdeviceptr)(src + i * len);
    }
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t attr_idx = 0;
    std::vector<double> issue[2], done[2];
    unsigned seed = 7;
    for (int it = 0; it < iters + 50; it++) {
      for (int v = 0; v < 2; v++) {
        seed++;
        for (int i = 0; i < count; i++) fill(src + i * len, len, seed + i);
        double t0 = now_us();
        if (v == 0) {
          for (int i = 0; i < count; i++)
            CK(cudaMemcpyAsync((void *)dsts[i], (void *)srcs[i], len, cudaMemcpyHostToDevice, s));
        } else {
          CUresult r = cuMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), count, &attr, &attr_idx, 1, s);
          if (r != CUDA_SUCCESS) {
            printf("cuMemcpyBatchAsync: CUresult %d\n", (int)r);
            return 1;
          }
        }
        double t1 = now_us();
        CK(cudaStreamSynchronize(s));
        double t2 = now_us();
        for (int i = 0; i < count; i++)
          if (!check((unsigned char *)dsts[i], len, seed + i, tmp)) failures++;
        if (it >= 50) {
          issue[v].push_back(t1 - t0);
          done[v].push_back(t2 - t0);
        }
      }
    }
    printf("\n%d copies of 4096 bytes, p50 of %d: one cudaMemcpyAsync each: issue %.2f us, done %.2f us; "
           "one cuMemcpyBatchAsync: issue %.2f us, done %.2f us (done: %.2fx)\n",
           count, iters, p50(issue[0]), p50(done[0]), p50(issue[1]), p50(done[1]), p50(done[1]) / p50(done[0]));
    CK(cudaFreeHost(src));
  }
  printf("\nSMALL-COPY-PATHS %s (%d data mismatches)\n", failures ? "FAILED" : "ok", failures);
  return failures ? 1 : 0;
}
