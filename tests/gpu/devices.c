/* Several CUDA contexts in one process, and one process per GPU, through a C face of the
 * library: libugds (uGDS's API) or, built with -DFACE_CUFILE, the cuFile drop-in.
 *
 *   devices FILE [--only N]
 *
 * Contexts: every device's primary context (what cudaSetDevice(N) makes current) and a second,
 * non-primary context on device 0 (cuCtxCreate); with --only N, device N's primary context
 * alone (the one-process-per-GPU case). For each context: its buffer registers and is read
 * while ANOTHER context is current (the memory's own context must serve it, and the caller's
 * current context must be the same afterwards); a stream-ordered read on its own stream; one
 * on the default stream with the context current (per-thread cudaSetDevice semantics); one on
 * another context's stream (mixing is handled: the stream orders, the buffer's context moves
 * the data); then one thread per context, all at once, each with its own context current.
 * Every read's bytes are checked. Ends with `DEVICES-SUITE face=F contexts=C passed=P failed=Q`.
 *
 * Build: nvcc -O2 -I PREFIX/include devices.c -L PREFIX/lib -lugds -lcuda -lpthread
 *        nvcc -O2 -DFACE_CUFILE devices.c -L PREFIX/lib -lcufile_ugds -lcuda -lpthread
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#ifdef FACE_CUFILE
/* The few cuFile declarations used (names, values and layouts of CUDA 13.0's cufile.h). */
typedef struct { int err; int cu_err; } Err;
typedef void *Handle;
typedef struct { int type; union { int fd; void *handle; } handle; const void *fs_ops; } Descr;
Err cuFileDriverOpen(void);
Err cuFileHandleRegister(Handle *fh, Descr *d);
Err cuFileBufRegister(const void *base, size_t len, int flags);
Err cuFileBufDeregister(const void *base);
ssize_t cuFileRead(Handle fh, void *base, size_t size, off_t foff, off_t boff);
Err cuFileReadAsync(Handle fh, void *base, size_t *size, off_t *foff, off_t *boff, ssize_t *bytes, CUstream s);
Err cuFileStreamRegister(CUstream s, unsigned flags);
#define FACE "cufile"
#define OPEN() cuFileDriverOpen()
#define BUF_REGISTER(p, n) cuFileBufRegister(p, n, 0)
#define READ cuFileRead
#define READ_ASYNC cuFileReadAsync
#define STREAM_REGISTER(s) cuFileStreamRegister(s, 0)
static Err handle_register(Handle *fh, int fd) {
    Descr d;
    memset(&d, 0, sizeof d);
    d.type = 1; /* CU_FILE_HANDLE_TYPE_OPAQUE_FD */
    d.handle.fd = fd;
    return cuFileHandleRegister(fh, &d);
}
#else
#include "ugds.h"
typedef uGDSError_t Err;
typedef uGDSHandle_t Handle;
#define FACE "ugds"
#define OPEN() uGDSDriverOpen()
#define BUF_REGISTER(p, n) uGDSBufRegister(p, n, 0)
#define READ uGDSRead
#define READ_ASYNC uGDSReadAsync
#define STREAM_REGISTER(s) uGDSStreamRegister(s)
static Err handle_register(Handle *fh, int fd) {
    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    return uGDSHandleRegister(fh, &d);
}
#endif

static int passed, failed;
#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (cond) {                                                              \
            __atomic_add_fetch(&passed, 1, __ATOMIC_RELAXED);                    \
        } else {                                                                 \
            __atomic_add_fetch(&failed, 1, __ATOMIC_RELAXED);                    \
            printf("not ok - line %d: ", __LINE__);                              \
            printf(__VA_ARGS__);                                                 \
            printf("\n");                                                        \
        }                                                                        \
    } while (0)
#define CU(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { printf("FATAL %s: %d\n", #call, r_); exit(2); } } while (0)

#define MiB (1024 * 1024)
#define FILE_SIZE (64 * MiB)
#define BUF (4 * MiB)
#define IO MiB
#define MAXC 10

static uint8_t byte_at(uint64_t off) { return (uint8_t)((off * 2654435761u) >> 13) ^ (uint8_t)(off >> 20); }

typedef struct {
    CUcontext ctx;
    const char *name;
    CUdeviceptr buf;
    CUstream stream;
} Ctx;

static Ctx ctxs[MAXC];
static int nctx;
static Handle fh;

static CUcontext current(void) {
    CUcontext c = NULL;
    cuCtxGetCurrent(&c);
    return c;
}

/* Whether `len` bytes at buf + boff of context c hold the file's bytes at foff. */
static int holds(const Ctx *c, size_t boff, uint64_t foff, size_t len) {
    CUcontext keep = current();
    uint8_t *h = malloc(len);
    CU(cuCtxSetCurrent(c->ctx));
    CU(cuMemcpyDtoH(h, c->buf + boff, len));
    CU(cuCtxSetCurrent(keep));
    int ok = 1;
    for (size_t i = 0; i < len && ok; i++) ok = h[i] == byte_at(foff + i);
    free(h);
    return ok;
}

static void scrub(const Ctx *c) {
    CUcontext keep = current();
    CU(cuCtxSetCurrent(c->ctx));
    CU(cuMemsetD8(c->buf, 0xEE, BUF));
    CU(cuCtxSetCurrent(keep));
}

/* One stream-ordered read of IO bytes into c's buffer at boff from foff, on stream s, with
 * `cur` current while queuing; the stream is then synchronised in its own context `sctx`. */
static void async_read(const Ctx *c, CUcontext cur, CUstream s, CUcontext sctx, off_t boff, off_t foff,
                       const char *what) {
    size_t size = IO;
    off_t fo = foff, bo = boff;
    ssize_t bytes = -12345;
    CU(cuCtxSetCurrent(cur));
    Err e = READ_ASYNC(fh, (void *)c->buf, &size, &fo, &bo, &bytes, s);
    CHECK(e.err == 0, "%s: %s ReadAsync returned %d (cu_err %d)", c->name, what, e.err, e.cu_err);
    CHECK(current() == cur, "%s: %s ReadAsync changed the caller's current context", c->name, what);
    CU(cuCtxSetCurrent(sctx));
    CUresult r = s ? cuStreamSynchronize(s) : cuCtxSynchronize();
    CHECK(r == CUDA_SUCCESS, "%s: %s synchronize: %d", c->name, what, r);
    CHECK(bytes == IO, "%s: %s read %zd bytes", c->name, what, bytes);
    CHECK(e.err != 0 || holds(c, boff, foff, IO), "%s: %s: wrong bytes in the buffer", c->name, what);
}

static void *worker(void *arg) {
    Ctx *c = arg;
    int i = (int)(c - ctxs);
    /* cudaSetDevice(N) on this thread: the context current here, for this thread alone. */
    CU(cuCtxSetCurrent(c->ctx));
    off_t foff = (off_t)(32 + i) * MiB, boff = 2 * MiB;
    ssize_t n = READ(fh, (void *)c->buf, IO, foff, boff);
    CHECK(n == IO, "%s (thread): Read returned %zd", c->name, n);
    CHECK(n != IO || holds(c, boff, foff, IO), "%s (thread): wrong bytes", c->name);
    CHECK(current() == c->ctx, "%s (thread): Read changed the thread's current context", c->name);
    async_read(c, c->ctx, NULL, c->ctx, 3 * MiB, (off_t)(48 + i) * MiB, "thread, default stream");
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [--only N]\n", argv[0]);
        return 2;
    }
    int only = argc >= 4 && !strcmp(argv[2], "--only") ? atoi(argv[3]) : -1;
    /* The file: byte_at(offset) everywhere. */
    int wfd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (wfd < 0) { perror(argv[1]); return 2; }
    uint8_t *chunk = malloc(MiB);
    for (uint64_t off = 0; off < FILE_SIZE; off += MiB) {
        for (size_t i = 0; i < MiB; i++) chunk[i] = byte_at(off + i);
        if (pwrite(wfd, chunk, MiB, (off_t)off) != MiB) { perror("pwrite"); return 2; }
    }
    fsync(wfd);
    close(wfd);
    free(chunk);

    CU(cuInit(0));
    int ndev = 0;
    CU(cuDeviceGetCount(&ndev));
    static char names[MAXC][32];
    for (int d = 0; d < ndev && nctx < MAXC - 1; d++) {
        if (only >= 0 && d != only) continue;
        CUdevice dev;
        CU(cuDeviceGet(&dev, d));
        CU(cuDevicePrimaryCtxRetain(&ctxs[nctx].ctx, dev));
        snprintf(names[nctx], sizeof names[nctx], "device %d primary", d);
        ctxs[nctx].name = names[nctx];
        nctx++;
        if (d == 0 && only < 0) {
            /* A second context on device 0, not the primary one. */
            CU(cuCtxCreate(&ctxs[nctx].ctx, NULL, 0, dev));
            CU(cuCtxPopCurrent(NULL));
            ctxs[nctx].name = "device 0 cuCtxCreate";
            nctx++;
        }
    }
    if (nctx == 0) { printf("no such device\n"); return 2; }
    for (int i = 0; i < nctx; i++) {
        CU(cuCtxSetCurrent(ctxs[i].ctx));
        CU(cuMemAlloc(&ctxs[i].buf, BUF));
        CU(cuStreamCreate(&ctxs[i].stream, CU_STREAM_NON_BLOCKING));
    }
    CU(cuCtxSetCurrent(ctxs[0].ctx));
    Err e = OPEN();
    CHECK(e.err == 0, "DriverOpen: %d", e.err);
    int fd = open(argv[1], O_RDWR | O_DIRECT);
    e = handle_register(&fh, fd);
    CHECK(e.err == 0, "HandleRegister: %d", e.err);

    for (int i = 0; i < nctx; i++) {
        Ctx *c = &ctxs[i];
        /* Another context is current while this one's memory is registered and read (with one
         * context only, none is). */
        CUcontext other = nctx > 1 ? ctxs[(i + 1) % nctx].ctx : NULL;
        Ctx *oc = nctx > 1 ? &ctxs[(i + 1) % nctx] : NULL;
        CU(cuCtxSetCurrent(other));
        e = BUF_REGISTER((void *)c->buf, BUF);
        CHECK(e.err == 0, "%s: BufRegister with another context current: %d", c->name, e.err);
        CHECK(current() == other, "%s: BufRegister changed the caller's current context", c->name);
        STREAM_REGISTER(c->stream);
        scrub(c);
        off_t foff = (off_t)(1 + i) * MiB;
        ssize_t n = READ(fh, (void *)c->buf, IO, foff, 0);
        CHECK(n == IO, "%s: Read with another context current returned %zd", c->name, n);
        CHECK(n != IO || holds(c, 0, foff, IO), "%s: Read: wrong bytes", c->name);
        CHECK(current() == other, "%s: Read changed the caller's current context", c->name);
        scrub(c);
        async_read(c, other, c->stream, c->ctx, 0, (off_t)(8 + i) * MiB, "own stream, another context current");
        scrub(c);
        async_read(c, c->ctx, NULL, c->ctx, MiB, (off_t)(16 + i) * MiB, "default stream");
        if (oc) {
            scrub(c);
            async_read(c, other, oc->stream, oc->ctx, 0, (off_t)(24 + i) * MiB, "another context's stream");
        }
    }
    pthread_t t[MAXC];
    for (int i = 0; i < nctx; i++) pthread_create(&t[i], NULL, worker, &ctxs[i]);
    for (int i = 0; i < nctx; i++) pthread_join(t[i], NULL);
    printf("DEVICES-SUITE face=%s contexts=%d passed=%d failed=%d\n", FACE, nctx, passed, failed);
    return failed ? 1 : 0;
}
