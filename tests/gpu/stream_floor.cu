// The floor of stream-ordered I/O's machinery on this GPU, timed method against method in one
// run: what a stream-ordered read costs beyond its I/O when a host thread starts it on seeing a
// word the stream writes and the stream waits on a word the host writes (ugds's design), against
// a plain synchronize and a host function.
//
//   sync          cudaStreamSynchronize of an idle stream: the floor of any wait for a stream
//   hostfn        cudaLaunchHostFunc of an empty function, synchronized
//   echo          the stream writes a word (cuStreamWriteValue32 into mapped pinned memory), a
//                 host thread spinning on it writes a second word at once, the stream waits for
//                 that one (cuStreamWaitValue32), then synchronized
//   echo+passed   echo, plus the stream writing a third word after its wait (ugds marks groups
//                 the stream has passed that way)
//   echo+copy     echo, the host thread first copying 4 KiB pinned -> device on a stream of its
//                 own and synchronizing it (the fallback path's copy into GPU memory)
//   copy          the host copy alone: cudaMemcpyAsync 4 KiB pinned -> device + synchronize
// Every method runs ITER times, methods taking turns; p50 and p90 per method in microseconds, and
// echo - sync, the machinery's own cost. Each echo checks that the host saw the stream's value.
//
// nvcc -O2 -o stream_floor stream_floor.cu -lcuda -lpthread
// ./stream_floor [ITERATIONS]
#include <algorithm>
#include <atomic>
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

#include "gpu_check.h"

#define CU(x)                                                                                  \
  do {                                                                                         \
    CUresult r_ = (x);                                                                         \
    if (r_ != CUDA_SUCCESS) {                                                                  \
      const char *s_ = "?";                                                                    \
      cuGetErrorString(r_, &s_);                                                               \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);                           \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

// Words in mapped pinned host memory: [0] the stream writes (reached), [1] the host writes
// (done), [2] the stream writes after its wait (passed).
static volatile uint32_t *words;
static CUdeviceptr dwords;
static std::atomic<int> mode{0};  // 0: echo, 1: echo+copy, -1: stop
static void *pinned_src;
static void *dev_dst;
static cudaStream_t copy_stream;
static std::atomic<long> mismatches{0};

static void *echo_thread(void *) {
  CK(cudaSetDevice(0));
  uint32_t last = 0;
  for (;;) {
    int m = mode.load(std::memory_order_acquire);
    if (m < 0) return nullptr;
    uint32_t r = words[0];
    if (r == last) continue;
    if (r != last + 1) mismatches++;
    last = r;
    if (m == 1) {
      CK(cudaMemcpyAsync(dev_dst, pinned_src, 4096, cudaMemcpyHostToDevice, copy_stream));
      CK(cudaStreamSynchronize(copy_stream));
    }
    std::atomic_thread_fence(std::memory_order_release);
    words[1] = r;
  }
}

static void empty_fn(void *) {}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  CK(cudaSetDevice(0));
  CU(cuInit(0));
  void *h;
  CK(cudaHostAlloc(&h, 4096, cudaHostAllocMapped));
  memset(h, 0, 4096);
  words = (volatile uint32_t *)h;
  CU(cuMemHostGetDevicePointer(&dwords, h, 0));
  CK(cudaHostAlloc(&pinned_src, 4096, cudaHostAllocDefault));
  CK(cudaMalloc(&dev_dst, 4096));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  pthread_t th;
  pthread_create(&th, nullptr, echo_thread, nullptr);

  const char *names[] = {"sync", "hostfn", "echo", "echo+passed", "echo+copy", "copy"};
  const int n = sizeof(names) / sizeof(names[0]);
  std::vector<std::vector<double>> t(n);
  uint32_t ticket = 0;
  for (int i = 0; i < iters; i++) {
    for (int m = 0; m < n; m++) {
      double a = now_us();
      switch (m) {
        case 0:
          CK(cudaStreamSynchronize(s));
          break;
        case 1:
          CK(cudaLaunchHostFunc(s, empty_fn, nullptr));
          CK(cudaStreamSynchronize(s));
          break;
        case 2:
        case 3:
        case 4: {
          mode.store(m == 4 ? 1 : 0, std::memory_order_release);
          ticket++;
          CU(cuStreamWriteValue32((CUstream)s, dwords, ticket, CU_STREAM_WRITE_VALUE_DEFAULT));
          CU(cuStreamWaitValue32((CUstream)s, dwords + 4, ticket, CU_STREAM_WAIT_VALUE_GEQ));
          if (m == 3) CU(cuStreamWriteValue32((CUstream)s, dwords + 8, ticket, CU_STREAM_WRITE_VALUE_DEFAULT));
          CK(cudaStreamSynchronize(s));
          if (words[1] != ticket) mismatches++;
          break;
        }
        case 5:
          CK(cudaMemcpyAsync(dev_dst, pinned_src, 4096, cudaMemcpyHostToDevice, s));
          CK(cudaStreamSynchronize(s));
          break;
      }
      t[m].push_back(now_us() - a);
    }
  }
  mode.store(-1);
  pthread_join(th, nullptr);
  printf("stream machinery, p50 / p90 of %d each, methods taking turns (us):\n", iters);
  std::vector<double> p50(n);
  for (int m = 0; m < n; m++) {
    std::sort(t[m].begin(), t[m].end());
    p50[m] = t[m][t[m].size() / 2];
    printf("  %-12s %8.2f %8.2f\n", names[m], p50[m], t[m][t[m].size() * 9 / 10]);
  }
  printf("  echo - sync %.2f us, echo+passed - echo %.2f us, echo+copy - echo %.2f us (copy alone %.2f us)\n",
         p50[2] - p50[0], p50[3] - p50[2], p50[4] - p50[2], p50[5]);
  printf("STREAM-FLOOR %s (%ld mismatches)\n", mismatches.load() ? "FAIL" : "PASS", mismatches.load());
  return mismatches.load() ? 1 : 0;
}
