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
//   echo+gpucopy  echo+copy, but the host thread queues the copy and, behind it on its own
//                 stream, the stream's write of the second word (cuStreamWriteValue32) and does
//                 not wait: the copy's end releases the waiting stream
//   eager         the host thread is told by the caller, not the stream, to answer (what starting
//                 a group at once on an idle stream would cost): only the wait and synchronize
//   eager+copy, eager+gpucopy   the same with the copy, synchronized or stream-signalled
//   eager+gpucopy+devword  eager+gpucopy, the word the copy's stream stores and the stream waits
//                 for in device memory instead of mapped pinned host memory
// Then what queueing costs the calling thread: a query of an idle stream, queueing a wait and a
// store.
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
// What the host thread does for the next ticket: how it learns of it, and its copy.
enum Copy { NONE, HOST_SYNCED, STREAM_SIGNALLED, STREAM_SIGNALLED_DEVWORD };
// A word in device memory, for the waits that only a stream stores into.
static CUdeviceptr devword;
static std::atomic<int> copy_kind{NONE};
static std::atomic<bool> eager{false};
static std::atomic<uint32_t> told{0};  // eager: the ticket the caller hands over
static std::atomic<bool> stop{false};
static void *pinned_src;
static void *dev_dst;
static cudaStream_t copy_stream;
static std::atomic<long> mismatches{0};

static void *echo_thread(void *) {
  CK(cudaSetDevice(0));
  uint32_t last = 0;
  while (!stop.load(std::memory_order_acquire)) {
    uint32_t r = eager.load(std::memory_order_acquire) ? told.load(std::memory_order_acquire) : words[0];
    if (r == last) continue;
    if (r != last + 1) mismatches++;
    last = r;
    int c = copy_kind.load(std::memory_order_acquire);
    if (c != NONE) CK(cudaMemcpyAsync(dev_dst, pinned_src, 4096, cudaMemcpyHostToDevice, copy_stream));
    if (c == STREAM_SIGNALLED || c == STREAM_SIGNALLED_DEVWORD) {
      CUdeviceptr w = c == STREAM_SIGNALLED ? dwords + 4 : devword;
      CU(cuStreamWriteValue32((CUstream)copy_stream, w, r, CU_STREAM_WRITE_VALUE_DEFAULT));
      continue;
    }
    if (c == HOST_SYNCED) CK(cudaStreamSynchronize(copy_stream));
    std::atomic_thread_fence(std::memory_order_release);
    words[1] = r;
  }
  return nullptr;
}

static void empty_fn(void *) {}

struct Method {
  const char *name;
  enum { SYNC, HOSTFN, ECHO, COPY } kind;
  bool passed;
  bool eager;
  Copy copy;
};

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
  CU(cuMemAlloc(&devword, 4));
  CU(cuMemsetD32(devword, 0, 1));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking));
  pthread_t th;
  pthread_create(&th, nullptr, echo_thread, nullptr);

  const Method methods[] = {
      {"sync", Method::SYNC, false, false, NONE},
      {"hostfn", Method::HOSTFN, false, false, NONE},
      {"echo", Method::ECHO, false, false, NONE},
      {"echo+passed", Method::ECHO, true, false, NONE},
      {"echo+copy", Method::ECHO, false, false, HOST_SYNCED},
      {"copy", Method::COPY, false, false, NONE},
      {"echo+gpucopy", Method::ECHO, false, false, STREAM_SIGNALLED},
      {"eager", Method::ECHO, false, true, NONE},
      {"eager+copy", Method::ECHO, false, true, HOST_SYNCED},
      {"eager+gpucopy", Method::ECHO, false, true, STREAM_SIGNALLED},
      {"eager+gpucopy+devword", Method::ECHO, false, true, STREAM_SIGNALLED_DEVWORD},
  };
  const int n = sizeof(methods) / sizeof(methods[0]);
  std::vector<std::vector<double>> t(n);
  uint32_t ticket = 0;
  for (int i = 0; i < iters; i++) {
    for (int m = 0; m < n; m++) {
      const Method &me = methods[m];
      // Set before the ticket exists: the host thread reads them after it sees the ticket.
      copy_kind.store(me.copy, std::memory_order_release);
      eager.store(me.eager, std::memory_order_release);
      double a = now_us();
      switch (me.kind) {
        case Method::SYNC:
          CK(cudaStreamSynchronize(s));
          break;
        case Method::HOSTFN:
          CK(cudaLaunchHostFunc(s, empty_fn, nullptr));
          CK(cudaStreamSynchronize(s));
          break;
        case Method::ECHO:
          ticket++;
          if (me.eager) {
            told.store(ticket, std::memory_order_release);
          } else {
            CU(cuStreamWriteValue32((CUstream)s, dwords, ticket, CU_STREAM_WRITE_VALUE_DEFAULT));
          }
          CU(cuStreamWaitValue32((CUstream)s, me.copy == STREAM_SIGNALLED_DEVWORD ? devword : dwords + 4, ticket,
                                 CU_STREAM_WAIT_VALUE_GEQ));
          if (me.passed) CU(cuStreamWriteValue32((CUstream)s, dwords + 8, ticket, CU_STREAM_WRITE_VALUE_DEFAULT));
          CK(cudaStreamSynchronize(s));
          if (me.copy != STREAM_SIGNALLED_DEVWORD && words[1] != ticket) mismatches++;
          // The next method may switch how tickets are handed over: both ways agree first.
          told.store(ticket, std::memory_order_release);
          words[0] = ticket;
          break;
        case Method::COPY:
          CK(cudaMemcpyAsync(dev_dst, pinned_src, 4096, cudaMemcpyHostToDevice, s));
          CK(cudaStreamSynchronize(s));
          break;
      }
      t[m].push_back(now_us() - a);
    }
  }
  stop.store(true);
  pthread_join(th, nullptr);
  printf("stream machinery, p50 / p90 of %d each, methods taking turns (us):\n", iters);
  std::vector<double> p(n);
  for (int m = 0; m < n; m++) {
    std::sort(t[m].begin(), t[m].end());
    p[m] = t[m][t[m].size() / 2];
    printf("  %-22s %8.2f %8.2f\n", methods[m].name, p[m], t[m][t[m].size() * 9 / 10]);
  }
  printf("  echo - sync %.2f us, echo+passed - echo %.2f us, echo+copy - echo %.2f us (copy alone %.2f us)\n",
         p[2] - p[0], p[3] - p[2], p[4] - p[2], p[5]);
  printf("  echo+gpucopy - echo %.2f us, eager - sync %.2f us, eager+copy - eager %.2f us, eager+gpucopy - eager %.2f us\n",
         p[6] - p[2], p[7] - p[0], p[8] - p[7], p[9] - p[7]);
  printf("  eager+gpucopy+devword - eager+gpucopy %.2f us\n", p[10] - p[9]);
  // What queueing costs the calling thread, p50 of ITER each: a query of an idle stream (how
  // ugds tells that a group may start at once), queueing a wait already satisfied, and queueing
  // a store; each pass ends with a synchronize, outside the timings.
  std::vector<double> api[3];
  for (int i = 0; i < iters; i++) {
    double a = now_us();
    CUresult qr = cuStreamQuery((CUstream)s);
    double b = now_us();
    if (qr != CUDA_SUCCESS) mismatches++;
    api[0].push_back(b - a);
    a = now_us();
    CU(cuStreamWaitValue32((CUstream)s, dwords + 4, 0, CU_STREAM_WAIT_VALUE_GEQ));
    b = now_us();
    api[1].push_back(b - a);
    a = now_us();
    CU(cuStreamWriteValue32((CUstream)s, dwords + 12, (uint32_t)i, CU_STREAM_WRITE_VALUE_DEFAULT));
    b = now_us();
    api[2].push_back(b - a);
    CK(cudaStreamSynchronize(s));
  }
  for (auto &v : api) std::sort(v.begin(), v.end());
  printf("  calling thread: cuStreamQuery (idle) %.2f us, queueing cuStreamWaitValue32 %.2f us, "
         "queueing cuStreamWriteValue32 %.2f us (p50)\n",
         api[0][iters / 2], api[1][iters / 2], api[2][iters / 2]);
  printf("STREAM-FLOOR %s (%ld mismatches)\n", mismatches.load() ? "FAIL" : "PASS", mismatches.load());
  return mismatches.load() ? 1 : 0;
}
