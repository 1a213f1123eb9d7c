// Stream lifetime against libugds (uGDS's C API): the library must never touch an application
// stream after the call that used it returned.
//
//   nvcc -I PREFIX/include stream_lifetime.cu -L PREFIX/lib -lugds -lcudart -Xlinker -rpath=PREFIX/lib
//   ./stream_lifetime /tmp/file          (exit 0 = every case passed)
//
// Each case runs in its own child process (forked before the parent touches CUDA), so a crash
// (SIGSEGV in the library at close or at exit) is reported as that case's failure:
//   A  ReadAsync on a stream, cudaStreamSynchronize, cudaStreamDestroy, then
//      uGDSStreamDeregister(destroyed stream), BufDeregister, HandleDeregister, DriverClose.
//   B  8 ReadAsyncs queued, cudaStreamDestroy at once (no cudaStreamSynchronize ever), wait for
//      the reads by polling the bytes words the library writes, then StreamDeregister and close.
//   C  as B, but the application never calls uGDSStreamDeregister or BufDeregister: it destroys
//      the stream and calls uGDSDriverClose (the case that crashed in drop_in_place<State>).
// Every case checks the bytes read against the file's pattern.
#include <ugds.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vector>

static const size_t kChunk = 128 << 10;   // one read
static const int kReads = 8;              // reads queued per case
static const size_t kBuf = kChunk * kReads;
static const off_t kBase = 1 << 20;       // file offset of the first read
static const char* g_path;

static uint32_t word_at(uint64_t file_off) { return (uint32_t)((file_off / 4) * 2654435761u) ^ 0x5a5a1234u; }

#define CHECK(cond, ...)                                              \
    do {                                                              \
        if (!(cond)) {                                                \
            printf("  FAIL (%s:%d): ", __func__, __LINE__);           \
            printf(__VA_ARGS__);                                      \
            printf("\n");                                             \
            fflush(stdout);                                           \
            _exit(1);                                                 \
        }                                                             \
    } while (0)
#define CK_UGDS(st, what) CHECK((st).err == 0, "%s: err %d (%s) cu_err %d", what, (int)(st).err, uGDS_status_error((st).err), (st).cu_err)
#define CK_CUDA(x, what)                                                              \
    do {                                                                              \
        cudaError_t _e = (x);                                                         \
        CHECK(_e == cudaSuccess, "%s: %s", what, cudaGetErrorString(_e));             \
    } while (0)

static double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void make_file() {
    int fd = open(g_path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    CHECK(fd >= 0, "open %s: %s", g_path, strerror(errno));
    size_t len = kBase + kBuf + (1 << 20);
    std::vector<uint32_t> w(len / 4);
    for (size_t i = 0; i < w.size(); i++) w[i] = word_at(i * 4);
    CHECK(pwrite(fd, w.data(), len, 0) == (ssize_t)len, "pwrite");
    fsync(fd);
    close(fd);
}

static void check_data(void* d_buf) {
    std::vector<uint32_t> h(kBuf / 4);
    CK_CUDA(cudaMemcpy(h.data(), d_buf, kBuf, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = 0; i < h.size(); i++)
        CHECK(h[i] == word_at(kBase + i * 4), "data mismatch at byte %zu: 0x%08x != 0x%08x", i * 4, h[i],
              word_at(kBase + i * 4));
}

struct Ctx {
    int fd;
    uGDSHandle_t fh;
    void* d_buf;
    cudaStream_t stream;
    size_t size[kReads];
    off_t foff[kReads], boff[kReads];
    volatile ssize_t bytes[kReads];
};

static void setup(Ctx& c) {
    CK_CUDA(cudaSetDevice(0), "cudaSetDevice");
    CK_UGDS(uGDSDriverOpen(), "uGDSDriverOpen");
    c.fd = open(g_path, O_RDWR);
    CHECK(c.fd >= 0, "open: %s", strerror(errno));
    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = c.fd;
    c.fh = nullptr;
    CK_UGDS(uGDSHandleRegister(&c.fh, &d), "uGDSHandleRegister");
    CK_CUDA(cudaMalloc(&c.d_buf, kBuf), "cudaMalloc");
    CK_CUDA(cudaMemset(c.d_buf, 0, kBuf), "cudaMemset");
    CK_CUDA(cudaDeviceSynchronize(), "sync");
    CK_UGDS(uGDSBufRegister(c.d_buf, kBuf, 0), "uGDSBufRegister");
    CK_CUDA(cudaStreamCreate(&c.stream), "cudaStreamCreate");
    CK_UGDS(uGDSStreamRegister(c.stream), "uGDSStreamRegister");
}

static void enqueue(Ctx& c, int n) {
    for (int i = 0; i < n; i++) {
        c.size[i] = kChunk;
        c.foff[i] = kBase + (off_t)i * kChunk;
        c.boff[i] = (off_t)i * kChunk;
        c.bytes[i] = -999999;
        CK_UGDS(uGDSReadAsync(c.fh, c.d_buf, &c.size[i], &c.foff[i], &c.boff[i], (ssize_t*)&c.bytes[i], c.stream),
                "uGDSReadAsync");
    }
}

static void wait_bytes(Ctx& c, int n) {
    double t0 = now_s();
    for (;;) {
        int done = 0;
        for (int i = 0; i < n; i++) done += c.bytes[i] != -999999;
        if (done == n) break;
        CHECK(now_s() - t0 < 30, "reads not done after 30 s (%d of %d)", done, n);
        usleep(1000);
    }
    for (int i = 0; i < n; i++) CHECK(c.bytes[i] == (ssize_t)kChunk, "read %d returned %zd", i, (ssize_t)c.bytes[i]);
}

static uGDSError_t buf_deregister_retry(void* p) {
    double t0 = now_s();
    uGDSError_t st;
    while ((st = uGDSBufDeregister(p)).err == UGDS_BUSY && now_s() - t0 < 10) usleep(1000);
    return st;
}

static void case_a() {
    Ctx c;
    setup(c);
    enqueue(c, 1);
    CK_CUDA(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");
    CHECK(c.bytes[0] == (ssize_t)kChunk, "bytes %zd", (ssize_t)c.bytes[0]);
    CK_CUDA(cudaStreamDestroy(c.stream), "cudaStreamDestroy");
    CK_UGDS(uGDSStreamDeregister(c.stream), "uGDSStreamDeregister (stream already destroyed)");
    CK_UGDS(buf_deregister_retry(c.d_buf), "uGDSBufDeregister");
    uGDSHandleDeregister(c.fh);
    close(c.fd);
    CK_UGDS(uGDSDriverClose(), "uGDSDriverClose");
    // Check only the first chunk (one read was queued).
    std::vector<uint32_t> h(kChunk / 4);
    CK_CUDA(cudaMemcpy(h.data(), c.d_buf, kChunk, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = 0; i < h.size(); i++) CHECK(h[i] == word_at(kBase + i * 4), "data mismatch at %zu", i * 4);
    cudaFree(c.d_buf);
}

static void case_b() {
    Ctx c;
    setup(c);
    enqueue(c, kReads);
    CK_CUDA(cudaStreamDestroy(c.stream), "cudaStreamDestroy (reads still queued)");
    wait_bytes(c, kReads);
    CK_UGDS(uGDSStreamDeregister(c.stream), "uGDSStreamDeregister (stream already destroyed)");
    CK_UGDS(buf_deregister_retry(c.d_buf), "uGDSBufDeregister");
    uGDSHandleDeregister(c.fh);
    close(c.fd);
    CK_UGDS(uGDSDriverClose(), "uGDSDriverClose");
    check_data(c.d_buf);
    cudaFree(c.d_buf);
}

static void case_c() {
    Ctx c;
    setup(c);
    enqueue(c, kReads);
    CK_CUDA(cudaStreamDestroy(c.stream), "cudaStreamDestroy (reads still queued)");
    wait_bytes(c, kReads);
    // No StreamDeregister, no BufDeregister, no HandleDeregister: straight to DriverClose.
    CK_UGDS(uGDSDriverClose(), "uGDSDriverClose (stream destroyed, never deregistered)");
    check_data(c.d_buf);
    close(c.fd);
    // Exit through exit() so atexit handlers and library destructors run.
    exit(0);
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE\n", argv[0]);
        return 2;
    }
    g_path = argv[1];
    make_file();
    struct {
        const char* name;
        void (*fn)();
    } cases[] = {
        {"A: read async, sync, destroy stream, StreamDeregister, DriverClose", case_a},
        {"B: 8 reads async, destroy stream without synchronizing, StreamDeregister, DriverClose", case_b},
        {"C: 8 reads async, destroy stream without synchronizing, DriverClose with nothing deregistered", case_c},
    };
    int failed = 0;
    for (auto& k : cases) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(60);
            k.fn();
            fflush(stdout);
            exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (WIFSIGNALED(status))
            printf("%s  %s (killed by signal %d: %s)\n", "FAIL", k.name, WTERMSIG(status), strsignal(WTERMSIG(status)));
        else
            printf("%s  %s (exit %d)\n", ok ? "PASS" : "FAIL", k.name, WEXITSTATUS(status));
        failed += !ok;
    }
    unlink(g_path);
    printf("STREAM-LIFETIME %s (%d of 3 failed)\n", failed ? "FAIL" : "PASS", failed);
    return failed ? 1 : 0;
}
