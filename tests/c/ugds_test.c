/* libugds's compatibility suite: uGDS's C API, its semantics and every error path uGDS
 * defines, compiled with gcc against the installed ugds.h and libugds.so.
 *
 *   ugds_test TARGET
 *
 * TARGET is a ugds node /dev/ugds_drvN (direct path: the caller prepared [16 MiB, +1 MiB) with
 * pattern seed 0x16 through the kernel driver and checks [8 MiB, +2 MiB) for seed 0x8
 * afterwards), a ugds volume descriptor file NAME.ugds-volume (a striped volume: the caller
 * prepares and checks the same ranges through the volume), or a regular file of at least 64 MiB
 * (fallback path: this program prepares and checks those ranges itself), or, with
 * UGDS_TEST_NVMEOF=1, a namespace of the kernel's NVMe over Fabrics initiator (/dev/nvmeXnY;
 * registered through uGDS's NVMe-oF functions, prepared and checked as a file). Prints one line per failed check and
 * `C-SUITE passed=N failed=M`; the number of checks does not depend on timing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ugds.h>

#include "check.h"

#define OK(call) CHECK((call).err == UGDS_SUCCESS, "%s", #call)
#define FAILS_WITH(call, code) \
    do { uGDSError_t e_ = (call); CHECK(e_.err == (code), "%s returned %d, expected %s", #call, e_.err, #code); } while (0)

/* ugds's test pattern: byte o is byte o%8 (little endian) of splitmix64(seed ^ (o/8)). */
static uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static void fill(uint64_t seed, uint64_t off, uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t o = off + i;
        p[i] = (uint8_t)(splitmix64(seed ^ (o / 8)) >> (8 * (o % 8)));
    }
}
static int matches(uint64_t seed, uint64_t off, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t o = off + i;
        if (p[i] != (uint8_t)(splitmix64(seed ^ (o / 8)) >> (8 * (o % 8)))) return 0;
    }
    return 1;
}

#define MiB (1024 * 1024)

/* Stream work: a "kernel" before an async op that binds its arguments late. */
struct late { size_t size; off_t foff, boff; ssize_t bytes; size_t want_size; off_t want_foff, want_boff; };
static void bind_args(void *arg) {
    struct late *l = arg;
    l->size = l->want_size;
    l->foff = l->want_foff;
    l->boff = l->want_boff;
}
/* Stream work that holds the stream until released. */
static atomic_int gate;
static void wait_gate(void *arg) {
    (void)arg;
    while (!atomic_load(&gate)) usleep(100);
}

/* Collects exactly `want` events (GetStatus with *nr = 0: up to the batch's size). */
static unsigned collect(uGDSBatchHandle_t b, uGDSIOEvents_t *ev, unsigned want) {
    unsigned got = 0;
    for (int tries = 0; got < want && tries < 1000; tries++) {
        unsigned n = 0;
        struct timespec t = {10, 0};
        if (uGDSBatchIOGetStatus(b, want - got, &n, ev + got, &t).err != UGDS_SUCCESS) break;
        got += n;
    }
    return got;
}

static void before_open(void) {
    uGDSHandle_t h = NULL;
    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = 0;
    size_t sz = 4096;
    off_t o = 0;
    ssize_t bytes = 0;
    static char page[4096] __attribute__((aligned(4096)));
    FAILS_WITH(uGDSDriverClose(), UGDS_DRIVER_NOT_INITIALIZED);
    FAILS_WITH(uGDSHandleRegister(&h, &d), UGDS_DRIVER_NOT_INITIALIZED);
    FAILS_WITH(uGDSBufRegister(page, sizeof page, 0), UGDS_DRIVER_NOT_INITIALIZED);
    FAILS_WITH(uGDSReadAsync(NULL, page, &sz, &o, &o, &bytes, NULL), UGDS_DRIVER_NOT_INITIALIZED);
    OK(uGDSStreamRegister(NULL));
    OK(uGDSDriverOpen());
    OK(uGDSDriverOpen()); /* idempotent */
}

/* The child's part of the fork() checks: the parent's handle and buffer refuse I/O by name and
 * write nothing; the child opens the driver, registers a handle and the same memory afresh, and
 * reads correctly. Returns a bit per failed check (the exit code). */
static int forked_child(uGDSHandle_t h, uint8_t *buf, size_t len, const char *target, int direct) {
    int bad = 0;
    memset(buf, 0xEE, 4096);
    ssize_t r = uGDSRead(h, buf, 4096, 16 * MiB, 0);
    if (r != -EBADFD) bad |= 1;
    if (!strstr(ugdsxErrorString(r), "fork()")) bad |= 2;
    for (size_t i = 0; i < 4096; i++)
        if (buf[i] != 0xEE) { bad |= 4; break; }
    uint64_t cap = 0;
    if (uGDSGetDeviceCapacity(h, &cap).err != UGDS_DRIVER_NOT_INITIALIZED) bad |= 8;
    if (uGDSDriverOpen().err != UGDS_SUCCESS) bad |= 16;
    int fd2 = open(target, direct ? O_RDWR : (O_RDWR | O_DIRECT));
    uGDSDescr_t d2;
    memset(&d2, 0, sizeof d2);
    d2.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d2.handle.fd = fd2;
    uGDSHandle_t h3 = NULL;
    if (fd2 < 0 || uGDSHandleRegister(&h3, &d2).err != UGDS_SUCCESS) bad |= 32;
    if (uGDSBufRegister(buf, len, 0).err != UGDS_SUCCESS) bad |= 64;
    if (uGDSRead(h3, buf, MiB, 16 * MiB, 0) != MiB || !matches(0x16, 16 * MiB, buf, MiB)) bad |= 128;
    uGDSHandleDeregister(h3);
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s /dev/ugds_drvN|FILE\n", argv[0]);
        return 2;
    }
    const char *target = argv[1];
    /* UGDS_TEST_NVMEOF=1: TARGET is a namespace of the kernel's NVMe-oF initiator, registered
     * with uGDSHandleRegisterNvmeof[Ex] (prepared and checked by this program, as a file). */
    const char *nv = getenv("UGDS_TEST_NVMEOF");
    int nvmeof = nv && strcmp(nv, "1") == 0;
    struct stat sb;
    int direct = stat(target, &sb) == 0 && S_ISCHR(sb.st_mode); /* a ugds node */
    size_t tlen = strlen(target), slen = strlen(".ugds-volume");
    if (!direct && S_ISREG(sb.st_mode) && tlen > slen && strcmp(target + tlen - slen, ".ugds-volume") == 0)
        direct = 1; /* a volume descriptor: recognised by its name, as the library does */
    int fd = open(target, direct ? O_RDWR : (O_RDWR | O_DIRECT));
    if (fd < 0) {
        perror(target);
        return 2;
    }
    if (!direct) {
        /* Prepare what the direct-path caller prepares through the kernel. */
        uint8_t *p = aligned_alloc(4096, MiB);
        fill(0x16, 16 * MiB, p, MiB);
        CHECK(pwrite(fd, p, MiB, 16 * MiB) == MiB, "preparing the file");
        free(p);
    }

    before_open();
    CHECK(strcmp(uGDS_status_error(UGDS_MEMORY_NOT_REGISTERED), "memory not registered") == 0, "status string");
    CHECK(strcmp(UGDS_ERRSTR(-UGDS_BUSY), uGDS_status_error(UGDS_BUSY)) == 0, "UGDS_ERRSTR of a negative code");
    CHECK(IS_UGDS_ERR(-UGDS_INVALID_VALUE) && !IS_UGDS_ERR(-EINVAL), "IS_UGDS_ERR");
    CHECK(strstr(ugdsxErrorString(-EINVAL), "invalid") != NULL, "errno string");

    /* Handles. */
    uGDSHandle_t h = NULL, h2 = NULL;
    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    FAILS_WITH(uGDSHandleRegister(&h, NULL), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSHandleRegister(NULL, &d), UGDS_INVALID_VALUE);
    uGDSDescr_t bad = d;
    bad.type = UGDS_HANDLE_TYPE_USERSPACE_FS;
    FAILS_WITH(uGDSHandleRegister(&h, &bad), UGDS_INVALID_FILE_TYPE);
    bad.type = UGDS_HANDLE_TYPE_OPAQUE_WIN32;
    FAILS_WITH(uGDSHandleRegister(&h, &bad), UGDS_INVALID_FILE_TYPE);
    int devnull = open("/dev/null", O_RDWR);
    bad = d;
    bad.handle.fd = devnull;
    FAILS_WITH(uGDSHandleRegister(&h, &bad), UGDS_INVALID_FILE_TYPE);
    /* NVMe-oF handles take only a namespace of the kernel's NVMe-oF initiator. */
    FAILS_WITH(uGDSHandleRegisterNvmeof(NULL, fd), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSHandleRegisterNvmeof(&h, -1), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSHandleRegisterNvmeofEx(&h, devnull, 1), UGDS_INVALID_FILE_TYPE);
    if (nvmeof) {
        OK(uGDSHandleRegisterNvmeof(&h, fd));
    } else {
        FAILS_WITH(uGDSHandleRegisterNvmeof(&h, fd), UGDS_INVALID_FILE_TYPE);
        OK(uGDSHandleRegister(&h, &d));
    }
    CHECK(h != NULL && *(int *)h == fd, "the handle's first int is the registered fd");
    /* The same fd again: a second handle (any NVMe-oF flags are accepted). */
    if (nvmeof)
        OK(uGDSHandleRegisterNvmeofEx(&h2, fd, ~0u));
    else
        OK(uGDSHandleRegister(&h2, &d));
    CHECK(h2 != h && *(int *)h2 == fd, "a second handle on the same fd");
    OK(uGDSHandleDeregisterEx(h2, 0));
    CHECK(*(int *)h2 == fd, "a deregistered handle still reads as its fd");
    uint64_t cap = 0;
    OK(uGDSGetDeviceCapacity(h, &cap));
    CHECK(cap >= 64 * MiB, "capacity %llu", (unsigned long long)cap);
    FAILS_WITH(uGDSGetDeviceCapacity(h2, &cap), UGDS_HANDLE_NOT_REGISTERED);
    FAILS_WITH(uGDSGetDeviceCapacity((uGDSHandle_t)0x1234, &cap), UGDS_HANDLE_NOT_REGISTERED);
    FAILS_WITH(uGDSGetDeviceCapacity(NULL, &cap), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSGetDeviceCapacity(h, NULL), UGDS_INVALID_VALUE);
    OK(uGDSHandleDeregisterEx(NULL, 0));
    OK(uGDSHandleDeregisterEx((uGDSHandle_t)0x1234, 0));
    uGDSHandleDeregister(NULL);

    /* Buffers. */
    size_t len = 4 * MiB;
    uint8_t *buf = aligned_alloc(4096, len);
    uint8_t *other = aligned_alloc(4096, MiB);
    memset(buf, 0xAB, len);
    FAILS_WITH(uGDSBufRegister(NULL, len, 0), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBufRegister(buf + 8, 4096, 0), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBufRegister(buf, 0, 0), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBufRegister(buf, len, 0x8), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBufRegister(buf, len, NVM_MAP_DMABUF | NVM_MAP_FORCE_CUDA), UGDS_INVALID_VALUE);
    uGDSBufConfig_t cfg = {UGDS_BACKEND_HIP, false};
    FAILS_WITH(uGDSBufRegisterEx(buf, len, &cfg), UGDS_PLATFORM_NOT_SUPPORTED);
    cfg.backend = UGDS_BACKEND_DEFAULT;
    cfg.enable_export = true;
    FAILS_WITH(uGDSBufRegisterEx(buf, len, &cfg), UGDS_INVALID_VALUE);
    cfg.backend = (uGDSBackend_t)7;
    FAILS_WITH(uGDSBufRegisterEx(buf, len, &cfg), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBufRegisterEx(buf, len, NULL), UGDS_INVALID_VALUE);
    OK(uGDSBufRegister(buf, len, 0));
    FAILS_WITH(uGDSBufRegister(buf, len, 0), UGDS_MEMORY_ALREADY_REGISTERED);
    OK(uGDSBufRegister(buf + MiB, 4096, 0)); /* another base: its own registration */
    OK(uGDSBufDeregister(buf + MiB));
    uGDSDmabufExport_t ex;
    FAILS_WITH(uGDSExportDmabuf(buf, &ex), UGDS_IO_NOT_SUPPORTED);
    FAILS_WITH(uGDSExportDmabuf(other, &ex), UGDS_MEMORY_NOT_REGISTERED);
    FAILS_WITH(uGDSExportDmabuf(buf, NULL), UGDS_INVALID_VALUE);
    uGDSRDMARegion_t region;
    memset(&region, 0, sizeof region);
    FAILS_WITH(uGDSRDMARegister(buf, NULL, 0, &region), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSRDMARegister(buf, &region, 0, NULL), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSRDMARegister(other, &region, 0, &region), UGDS_MEMORY_NOT_REGISTERED);
    FAILS_WITH(uGDSRDMARegister(buf, &region, 0, &region), UGDS_IO_NOT_SUPPORTED); /* host memory */
    FAILS_WITH(uGDSRDMAUnregister(buf, &region), UGDS_INVALID_VALUE);                /* mr NULL */

    /* Sync I/O: read what the kernel wrote; write for the kernel to check. */
    RETURNS(uGDSRead(h, buf, MiB, 16 * MiB, 0), MiB);
    CHECK(matches(0x16, 16 * MiB, buf, MiB), "read data matches the kernel-written pattern");
    RETURNS(uGDSRead(h, buf, 4096, 16 * MiB + 8192, 3 * MiB), 4096);
    CHECK(matches(0x16, 16 * MiB + 8192, buf + 3 * MiB, 4096), "buffer-offset read data");
    fill(0x8, 8 * MiB, buf, 2 * MiB);
    RETURNS(uGDSWrite(h, buf, 2 * MiB, 8 * MiB, 0), 2 * MiB);
    /* Unregistered memory is registered for the call (uGDS's on-the-fly mapping). */
    memset(other, 0, MiB);
    RETURNS(uGDSRead(h, other, 8192, 16 * MiB + 4096, 0), 8192);
    CHECK(matches(0x16, 16 * MiB + 4096, other, 8192), "unregistered memory read");
    /* Our extension: a handle on a target named by path (the library opens it). */
    uGDSHandle_t ht = NULL;
    FAILS_WITH(ugdsxHandleRegisterTarget(NULL, target), UGDS_INVALID_VALUE);
    FAILS_WITH(ugdsxHandleRegisterTarget(&ht, NULL), UGDS_INVALID_VALUE);
    CHECK(ugdsxHandleRegisterTarget(&ht, "/nonexistent/ugds-target").err != UGDS_SUCCESS, "missing target refused");
    CHECK(ugdsxHandleRegisterTarget(&ht, target).err == UGDS_SUCCESS && ht != NULL, "handle on a named target");
    CHECK(ht != NULL && *(int *)ht == -1, "a named target's handle has no caller descriptor");
    memset(other, 0, MiB);
    RETURNS(uGDSRead(ht, other, 8192, 16 * MiB + 4096, 0), 8192);
    CHECK(matches(0x16, 16 * MiB + 4096, other, 8192), "read through the named target's handle");
    uGDSHandleDeregister(ht);

    /* Error paths return errnos and change nothing. */
    memset(buf + 2 * MiB, 0xCD, MiB);
    RETURNS(uGDSRead(NULL, buf, 4096, 0, 2 * MiB), -EINVAL);
    RETURNS(uGDSRead((uGDSHandle_t)0x1234, buf, 4096, 0, 2 * MiB), -EBADF);
    RETURNS(uGDSRead(h2, buf, 4096, 0, 2 * MiB), -EBADF);
    RETURNS(uGDSRead(h, NULL, 4096, 0, 0), -EINVAL);
    RETURNS(uGDSRead(h, buf, 4096, 100, 2 * MiB), -EINVAL);
    RETURNS(uGDSRead(h, buf, 100, 0, 2 * MiB), -EINVAL);
    RETURNS(uGDSRead(h, buf, 0, 0, 2 * MiB), -EINVAL);
    RETURNS(uGDSRead(h, buf, 2 * MiB, 0, 3 * MiB), -EINVAL);
    RETURNS(uGDSRead(h, buf, 4096, -1, 2 * MiB), -EINVAL);
    RETURNS(uGDSRead(h, buf, 4096, 0, -1), -EINVAL);
    CHECK(uGDSWrite(h, buf, 4096, (off_t)cap, 2 * MiB) < 0 || !direct, "past the device's end");
    int untouched = 1;
    for (size_t i = 2 * MiB; i < 3 * MiB; i++) untouched &= buf[i] == 0xCD;
    CHECK(untouched, "failed calls wrote nothing into the buffer");

    /* fork(): the child's read through the inherited handle fails by name (-EBADFD) and changes
     * nothing in either process; the child registers afresh and reads; the parent carries on. */
    memset(buf, 0x5A, 4096);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(forked_child(h, buf, len, target, direct));
    int wstatus = 0;
    CHECK(pid > 0 && waitpid(pid, &wstatus, 0) == pid && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0,
          "forked child: failed checks 0x%x (see forked_child), status %d", WEXITSTATUS(wstatus), wstatus);
    untouched = 1;
    for (size_t i = 0; i < 4096; i++) untouched &= buf[i] == 0x5A;
    CHECK(untouched, "the child's read did not reach the parent's buffer");
    RETURNS(uGDSRead(h, buf, MiB, 16 * MiB, 0), MiB);
    CHECK(matches(0x16, 16 * MiB, buf, MiB), "the parent reads after its child exited");

    /* Vectored I/O: two segments out of order in memory, contiguous in the file. */
    uGDSIoSegment_t segs[2] = {{buf, 3 * MiB + 65536, 65536}, {buf, 3 * MiB, 65536}};
    fill(0x44, 40 * MiB, buf + 3 * MiB + 65536, 65536);
    fill(0x44, 40 * MiB + 65536, buf + 3 * MiB, 65536);
    RETURNS(uGDSWritev(h, segs, 2, 40 * MiB), 131072);
    memset(buf + 3 * MiB, 0, 131072);
    RETURNS(uGDSReadv(h, segs, 2, 40 * MiB), 131072);
    CHECK(matches(0x44, 40 * MiB, buf + 3 * MiB + 65536, 65536) && matches(0x44, 40 * MiB + 65536, buf + 3 * MiB, 65536),
          "vectored round trip");
    RETURNS(uGDSReadv(h, NULL, 2, 0), -EINVAL);
    RETURNS(uGDSReadv(h, segs, 0, 0), -EINVAL);
    RETURNS(uGDSReadv(h, segs, UGDS_IOV_MAX + 1, 0), -EINVAL);
    RETURNS(uGDSReadv(NULL, segs, 2, 0), -EBADF);
    RETURNS(uGDSReadv(h, segs, 2, 100), -EINVAL);
    uGDSIoSegment_t badseg = {other, 0, 4096};
    RETURNS(uGDSReadv(h, &badseg, 1, 0), -EINVAL);
    badseg.base = buf;
    badseg.offset = 512;
    RETURNS(uGDSReadv(h, &badseg, 1, 0), -EINVAL);

    /* Batch: 16 entries, reads and writes, one naming unregistered memory. */
    uGDSBatchHandle_t b;
    FAILS_WITH(uGDSBatchIOSetUp(&b, (uGDSHandle_t)0x1234, 16), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBatchIOSetUp(&b, NULL, 16), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBatchIOSetUp(NULL, h, 16), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBatchIOSetUp(&b, h, 0), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBatchIOSetUp(&b, h, 129), UGDS_INVALID_VALUE);
    OK(uGDSBatchIOSetUp(&b, h, 16));
    FAILS_WITH(uGDSHandleDeregisterEx(h, 0), UGDS_BUSY); /* a batch holds the handle */
    uGDSIOParams_t io[17];
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < 16; i++) {
            io[i].devPtr_base = buf;
            io[i].devPtr_offset = (off_t)(3 * MiB + i * 65536);
            io[i].size = 65536;
            io[i].cookie = (void *)(intptr_t)(i + 1);
            io[i].opcode = i < 8 ? UGDS_READ : UGDS_WRITE;
            io[i].file_offset = i < 8 ? 16 * MiB + i * 65536 : 32 * MiB + i * 65536;
        }
        io[5].devPtr_base = other;
        io[16] = io[0];
        FAILS_WITH(uGDSBatchIOSubmit(b, 17, io, 0), UGDS_BATCH_CAPACITY_EXCEEDED);
        OK(uGDSBatchIOSubmit(b, 16, io, 0));
        uGDSIOEvents_t ev[16];
        unsigned got = collect(b, ev, 16), complete = 0, failed5 = 0;
        for (unsigned i = 0; i < got; i++) {
            int c = (int)(intptr_t)ev[i].cookie;
            if (c == 6) {
                failed5 += ev[i].status == UGDS_BATCH_FAILED && ev[i].ret == -EINVAL;
            } else {
                complete += ev[i].status == UGDS_BATCH_COMPLETE && ev[i].ret == 65536;
            }
        }
        CHECK(got == 16 && complete == 15 && failed5 == 1, "round %d: %u events, %u complete, %u failed", round, got,
              complete, failed5);
    }
    int batch_ok = 1;
    for (int i = 0; i < 8; i++)
        if (i != 5) batch_ok &= matches(0x16, 16 * MiB + i * 65536, buf + 3 * MiB + i * 65536, 65536);
    CHECK(batch_ok, "batch reads returned the kernel-written data");
    /* A bad value refuses the whole call; nothing runs. */
    io[3].size = 100;
    FAILS_WITH(uGDSBatchIOSubmit(b, 4, io, 0), UGDS_INVALID_VALUE);
    io[3].size = 65536;
    io[3].opcode = (uGDSOpcode_t)9;
    FAILS_WITH(uGDSBatchIOSubmit(b, 4, io, 0), UGDS_INVALID_VALUE);
    io[3].opcode = UGDS_READ;
    FAILS_WITH(uGDSBatchIOSubmit(b, 0, io, 0), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBatchIOSubmit(b, 4, NULL, 0), UGDS_INVALID_VALUE);
    /* Capacity counts what was submitted since the last full reap. */
    OK(uGDSBatchIOSubmit(b, 16, io, 0));
    {
        uGDSIOEvents_t ev[16];
        unsigned n = 8;
        struct timespec t = {10, 0};
        OK(uGDSBatchIOGetStatus(b, 8, &n, ev, &t));
        CHECK(n == 8, "min_nr 8 of 16 returned %u", n);
        FAILS_WITH(uGDSBatchIOSubmit(b, 1, io, 0), UGDS_BATCH_CAPACITY_EXCEEDED);
        CHECK(collect(b, ev, 8) == 8, "the other 8 events");
        OK(uGDSBatchIOSubmit(b, 1, io, 0));
        CHECK(collect(b, ev, 1) == 1 && ev[0].status == UGDS_BATCH_COMPLETE, "reusable after the full reap");
        /* An expired timeout is success with no events. */
        n = 4;
        struct timespec z = {0, 1000000};
        OK(uGDSBatchIOGetStatus(b, 1, &n, ev, &z));
        CHECK(n == 0, "timeout: %u events", n);
    }
    /* Vectored batch entries. */
    uGDSIOSegParams_t sp[2] = {{segs, 2, 40 * MiB, UGDS_READ, (void *)1}, {&badseg, 1, 0, UGDS_READ, (void *)2}};
    badseg.base = other;
    badseg.offset = 0;
    memset(buf + 3 * MiB, 0, 131072);
    OK(uGDSBatchIOSubmitv(b, 2, sp, 0));
    {
        uGDSIOEvents_t ev[2];
        unsigned got = collect(b, ev, 2), good = 0;
        for (unsigned i = 0; i < got; i++) {
            if (ev[i].cookie == (void *)1) good += ev[i].status == UGDS_BATCH_COMPLETE && ev[i].ret == 131072;
            if (ev[i].cookie == (void *)2) good += ev[i].status == UGDS_BATCH_FAILED && ev[i].ret == -EINVAL;
        }
        CHECK(got == 2 && good == 2, "vectored batch: %u events, %u as expected", got, good);
        CHECK(matches(0x44, 40 * MiB, buf + 3 * MiB + 65536, 65536), "vectored batch data");
    }
    sp[0].nr_segs = 0;
    FAILS_WITH(uGDSBatchIOSubmitv(b, 1, sp, 0), UGDS_INVALID_VALUE);
    uGDSBatchIODestroy(b);
    uGDSBatchIODestroy(NULL);

    /* Stream-ordered I/O on a CPU stream, with arguments bound by stream work. */
    void *s = NULL;
    OK(ugdsxCpuStreamCreate(&s));
    OK(uGDSStreamRegister(s));
    OK(uGDSStreamRegisterEx(s, UGDS_BACKEND_CUDA));
    FAILS_WITH(uGDSStreamRegisterEx(s, UGDS_BACKEND_DEFAULT), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSStreamRegisterEx(s, UGDS_BACKEND_HIP), UGDS_INVALID_VALUE);
    struct late l[32];
    memset(buf, 0, MiB);
    for (int i = 0; i < 32; i++) {
        l[i].size = 0;
        l[i].foff = -1;
        l[i].boff = -1;
        l[i].bytes = 12345;
        l[i].want_size = i == 7 ? 1000 : 32768;
        l[i].want_foff = 16 * MiB + i * 32768;
        l[i].want_boff = i * 32768;
        OK(ugdsxCpuStreamLaunch(s, bind_args, &l[i]));
        OK(uGDSReadAsync(h, buf, &l[i].size, &l[i].foff, &l[i].boff, &l[i].bytes, s));
    }
    OK(ugdsxCpuStreamSynchronize(s));
    int async_ok = 1;
    for (int i = 0; i < 32; i++) {
        if (i == 7) {
            CHECK(l[i].bytes == -EINVAL, "op 7: bad size reported as %zd", l[i].bytes);
            continue;
        }
        async_ok &= l[i].bytes == 32768 && matches(0x16, 16 * MiB + i * 32768, buf + i * 32768, 32768);
    }
    CHECK(async_ok, "32 late-bound async reads (one invalid) completed with correct data");
    FAILS_WITH(uGDSReadAsync(h, other, &l[0].size, &l[0].foff, &l[0].boff, &l[0].bytes, s), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSReadAsync(h, buf, NULL, &l[0].foff, &l[0].boff, &l[0].bytes, s), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSReadAsync(NULL, buf, &l[0].size, &l[0].foff, &l[0].boff, &l[0].bytes, s), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSReadAsync(h2, buf, &l[0].size, &l[0].foff, &l[0].boff, &l[0].bytes, s), UGDS_INVALID_VALUE);
    /* Vectored, stream-ordered: the result word is 0 until the stream gets there. */
    {
        off_t vfoff = 40 * MiB;
        ssize_t vbytes = 777;
        atomic_store(&gate, 0);
        OK(ugdsxCpuStreamLaunch(s, wait_gate, NULL));
        memset(buf + 3 * MiB, 0, 131072);
        OK(uGDSReadvAsync(h, segs, 2, &vfoff, &vbytes, s));
        CHECK(vbytes == 0, "vectored async result word zeroed at enqueue: %zd", vbytes);
        atomic_store(&gate, 1);
        OK(ugdsxCpuStreamSynchronize(s));
        CHECK(vbytes == 131072 && matches(0x44, 40 * MiB + 65536, buf + 3 * MiB, 65536), "vectored async read: %zd",
              vbytes);
        FAILS_WITH(uGDSReadvAsync(h, &badseg, 1, &vfoff, &vbytes, s), UGDS_INVALID_VALUE);
        FAILS_WITH(uGDSReadvAsync(h, segs, 0, &vfoff, &vbytes, s), UGDS_INVALID_VALUE);
    }

    /* Deregistering while I/O is queued is refused, then succeeds once it is done. */
    atomic_store(&gate, 0);
    OK(ugdsxCpuStreamLaunch(s, wait_gate, NULL));
    l[0].size = 4096; l[0].foff = 16 * MiB; l[0].boff = 0;
    OK(uGDSReadAsync(h, buf, &l[0].size, &l[0].foff, &l[0].boff, &l[0].bytes, s));
    FAILS_WITH(uGDSHandleDeregisterEx(h, 0), UGDS_BUSY);
    FAILS_WITH(uGDSBufDeregister(buf), UGDS_BUSY);
    FAILS_WITH(uGDSDriverClose(), UGDS_BUSY);
    atomic_store(&gate, 1);
    OK(ugdsxCpuStreamSynchronize(s));
    CHECK(l[0].bytes == 4096, "the held op ran: %zd", l[0].bytes);
    OK(uGDSStreamDeregister(s));
    OK(uGDSStreamDeregister(s)); /* as in uGDS: always succeeds */
    OK(ugdsxCpuStreamDestroy(s));

    if (!direct) {
        uint8_t *p = aligned_alloc(4096, 2 * MiB);
        CHECK(pread(fd, p, 2 * MiB, 8 * MiB) == 2 * MiB && matches(0x8, 8 * MiB, p, 2 * MiB),
              "the kernel reads what uGDSWrite wrote");
        free(p);
    }

    OK(uGDSBufDeregister(buf));
    FAILS_WITH(uGDSBufDeregister(buf), UGDS_MEMORY_NOT_REGISTERED);
    FAILS_WITH(uGDSBufDeregister(NULL), UGDS_MEMORY_NOT_REGISTERED);
    OK(uGDSBufRegister(buf, len, 0));

    /* Closing releases the buffers, keeps the handles; a second close is an error. */
    OK(uGDSDriverClose());
    FAILS_WITH(uGDSDriverClose(), UGDS_DRIVER_NOT_INITIALIZED);
    FAILS_WITH(uGDSBufDeregister(buf), UGDS_DRIVER_NOT_INITIALIZED);
    RETURNS(uGDSRead(h, buf, 4096, 16 * MiB, 0), 4096); /* the handle still works */
    OK(uGDSDriverOpen());
    FAILS_WITH(uGDSBufDeregister(buf), UGDS_MEMORY_NOT_REGISTERED); /* close released it */
    OK(uGDSHandleDeregisterEx(h, 0));
    OK(uGDSHandleDeregisterEx(h, 0)); /* already gone: success */
    OK(uGDSDriverClose());
    close(devnull);
    close(fd);
    free(buf);
    free(other);
    return CHECK_SUMMARY();
}
