/* The C ABI's test suite: every function and its error paths, compiled with gcc against the
 * installed ugds.h and libugds.so.
 *
 *   ugds_test TARGET
 *
 * TARGET is /dev/ugdsN (direct path: the caller prepared [16 MiB, +1 MiB) with pattern seed
 * 0x16 through the kernel driver and checks [8 MiB, +2 MiB) for seed 0x8 afterwards) or a
 * regular file of at least 64 MiB (fallback path: this program prepares and checks those
 * ranges itself with pread/pwrite). Prints one line per check and `C-SUITE passed=N failed=M`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ugds.h>

static int passed, failed;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (cond) {                                                                        \
            passed++;                                                                      \
        } else {                                                                           \
            failed++;                                                                      \
            printf("not ok - %s:%d: ", __FILE__, __LINE__);                                \
            printf(__VA_ARGS__);                                                           \
            printf("\n");                                                                  \
        }                                                                                  \
    } while (0)

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

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s /dev/ugdsN|FILE\n", argv[0]);
        return 2;
    }
    const char *target = argv[1];
    int direct = strncmp(target, "/dev/ugds", 9) == 0;
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

    OK(uGDSDriverOpen());
    CHECK(strstr(uGDSGetErrorString(UGDS_MEMORY_NOT_REGISTERED), "not registered") != NULL, "error string");
    CHECK(strlen(uGDSGetErrorString(-EINVAL)) > 0, "errno string");

    /* Handles. */
    uGDSHandle_t h = NULL, h2 = NULL;
    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    FAILS_WITH(uGDSHandleRegister(&h, NULL), UGDS_INVALID_VALUE);
    uGDSDescr_t bad = d;
    bad.type = UGDS_HANDLE_TYPE_USERSPACE_FS;
    FAILS_WITH(uGDSHandleRegister(&h, &bad), UGDS_INVALID_VALUE);
    int devnull = open("/dev/null", O_RDWR);
    bad = d;
    bad.handle.fd = devnull;
    FAILS_WITH(uGDSHandleRegister(&h, &bad), UGDS_INVALID_FILE_TYPE);
    OK(uGDSHandleRegister(&h, &d));
    FAILS_WITH(uGDSHandleRegister(&h2, &d), UGDS_HANDLE_ALREADY_REGISTERED);
    uint64_t cap = 0;
    OK(uGDSGetDeviceCapacity(h, &cap));
    CHECK(cap >= 64 * MiB, "capacity %llu", (unsigned long long)cap);
    FAILS_WITH(uGDSGetDeviceCapacity((uGDSHandle_t)0x1234, &cap), UGDS_HANDLE_NOT_REGISTERED);

    /* Buffers. */
    size_t len = 4 * MiB;
    uint8_t *buf = aligned_alloc(4096, len);
    uint8_t *other = aligned_alloc(4096, MiB);
    memset(buf, 0xAB, len);
    FAILS_WITH(uGDSBufRegister(NULL, len, 0), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBufRegister(buf + 8, 4096, 0), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSBufRegister(buf, 0, 0), UGDS_INVALID_VALUE);
    uGDSBufConfig_t hip = {UGDS_BACKEND_HIP, false};
    FAILS_WITH(uGDSBufRegisterEx(buf, len, &hip), UGDS_PLATFORM_NOT_SUPPORTED);
    OK(uGDSBufRegister(buf, len, 0));
    FAILS_WITH(uGDSBufRegister(buf, len, 0), UGDS_MEMORY_ALREADY_REGISTERED);
    FAILS_WITH(uGDSBufRegister(buf + MiB, 4096, 0), UGDS_MEMORY_ALREADY_REGISTERED);
    uGDSDmabufExport_t ex;
    FAILS_WITH(uGDSExportDmabuf(buf, &ex), UGDS_INVALID_VALUE);
    FAILS_WITH(uGDSExportDmabuf(other, &ex), UGDS_MEMORY_NOT_REGISTERED);

    /* Sync I/O: read what the kernel wrote; write for the kernel to check. */
    CHECK(uGDSRead(h, buf, MiB, 16 * MiB, 0) == MiB, "read 1 MiB");
    CHECK(matches(0x16, 16 * MiB, buf, MiB), "read data matches the kernel-written pattern");
    CHECK(uGDSRead(h, buf, 4096, 16 * MiB + 8192, 3 * MiB) == 4096, "read at a buffer offset");
    CHECK(matches(0x16, 16 * MiB + 8192, buf + 3 * MiB, 4096), "buffer-offset read data");
    CHECK(uGDSRead(h, buf + MiB, 4096, 16 * MiB, 4096) == 4096, "read with base inside the buffer");
    CHECK(matches(0x16, 16 * MiB, buf + MiB + 4096, 4096), "interior base data");
    fill(0x8, 8 * MiB, buf, 2 * MiB);
    CHECK(uGDSWrite(h, buf, 2 * MiB, 8 * MiB, 0) == 2 * MiB, "write 2 MiB");

    /* Error paths change nothing. */
    memset(buf + 2 * MiB, 0xCD, MiB);
    CHECK(uGDSRead(h, other, 4096, 0, 0) == -UGDS_MEMORY_NOT_REGISTERED, "unregistered buffer");
    CHECK(uGDSRead((uGDSHandle_t)0x1234, buf, 4096, 0, 0) == -UGDS_HANDLE_NOT_REGISTERED, "unknown handle");
    CHECK(uGDSRead(h, buf, 4096, 100, 2 * MiB) == -EINVAL, "unaligned file offset");
    CHECK(uGDSRead(h, buf, 100, 0, 2 * MiB) == -EINVAL, "unaligned size");
    CHECK(uGDSRead(h, buf, 0, 0, 2 * MiB) == -EINVAL, "size 0");
    CHECK(uGDSRead(h, buf, 2 * MiB, 0, 3 * MiB) == -EINVAL, "past the buffer's end");
    CHECK(uGDSRead(h, buf, 4096, -4096, 2 * MiB) == -EINVAL, "negative offset");
    CHECK(uGDSWrite(h, buf, 4096, (off_t)cap, 2 * MiB) < 0 || !direct, "past the device's end");
    int untouched = 1;
    for (size_t i = 2 * MiB; i < 3 * MiB; i++) untouched &= buf[i] == 0xCD;
    CHECK(untouched, "failed calls wrote nothing into the buffer");

    /* Batch: 16 entries, reads and writes, one naming unregistered memory. */
    uGDSBatchHandle_t b;
    FAILS_WITH(uGDSBatchIOSetUp(&b, (uGDSHandle_t)0x1234, 16), UGDS_HANDLE_NOT_REGISTERED);
    FAILS_WITH(uGDSBatchIOSetUp(&b, h, 0), UGDS_INVALID_VALUE);
    OK(uGDSBatchIOSetUp(&b, h, 16));
    for (int round = 0; round < 10; round++) {
        uGDSIOParams_t io[17];
        for (int i = 0; i < 16; i++) {
            io[i].devPtr_base = buf;
            io[i].devPtr_offset = (off_t)(3 * MiB + i * 65536);
            io[i].size = 65536;
            io[i].cookie = (void *)(intptr_t)(i + 1);
            if (i < 8) {
                io[i].opcode = UGDS_READ;
                io[i].file_offset = 16 * MiB + i * 65536;
            } else {
                io[i].opcode = UGDS_WRITE;
                io[i].file_offset = 32 * MiB + i * 65536;
            }
        }
        io[5].devPtr_base = other;
        io[16] = io[0];
        FAILS_WITH(uGDSBatchIOSubmit(b, 17, io, 0), UGDS_BATCH_CAPACITY_EXCEEDED);
        OK(uGDSBatchIOSubmit(b, 16, io, 0));
        uGDSIOEvents_t ev[16];
        unsigned got = 0, complete = 0, invalid = 0;
        while (got < 16) {
            unsigned n = 16 - got;
            struct timespec t = {10, 0};
            OK(uGDSBatchIOGetStatus(b, 1, &n, ev + got, &t));
            got += n;
        }
        for (unsigned i = 0; i < 16; i++) {
            int c = (int)(intptr_t)ev[i].cookie;
            if (c == 6) {
                invalid += ev[i].status == UGDS_BATCH_INVALID && ev[i].ret == -UGDS_MEMORY_NOT_REGISTERED;
            } else {
                complete += ev[i].status == UGDS_BATCH_COMPLETE && ev[i].ret == 65536;
            }
        }
        CHECK(complete == 15 && invalid == 1, "round %d: %u complete, %u invalid", round, complete, invalid);
    }
    int batch_ok = 1;
    for (int i = 0; i < 8; i++)
        if (i != 5) batch_ok &= matches(0x16, 16 * MiB + i * 65536, buf + 3 * MiB + i * 65536, 65536);
    CHECK(batch_ok, "batch reads returned the kernel-written data");
    uGDSBatchIODestroy(b);

    /* Stream-ordered I/O on a CPU stream, with arguments bound by stream work. */
    void *s = NULL;
    OK(uGDSCpuStreamCreate(&s));
    OK(uGDSStreamRegister(s, 0));
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
        OK(uGDSCpuStreamLaunch(s, bind_args, &l[i]));
        OK(uGDSReadAsync(h, buf, &l[i].size, &l[i].foff, &l[i].boff, &l[i].bytes, s));
    }
    OK(uGDSCpuStreamSynchronize(s));
    int async_ok = 1;
    for (int i = 0; i < 32; i++) {
        if (i == 7) {
            CHECK(l[i].bytes == -EINVAL, "op 7: bad size reported as %zd", l[i].bytes);
            continue;
        }
        async_ok &= l[i].bytes == 32768 && matches(0x16, 16 * MiB + i * 32768, buf + i * 32768, 32768);
    }
    CHECK(async_ok, "32 late-bound async reads (one invalid) completed with correct data");
    FAILS_WITH(uGDSReadAsync(h, other, &l[0].size, &l[0].foff, &l[0].boff, &l[0].bytes, s), UGDS_MEMORY_NOT_REGISTERED);
    FAILS_WITH(uGDSReadAsync(h, buf, NULL, &l[0].foff, &l[0].boff, &l[0].bytes, s), UGDS_INVALID_VALUE);

    /* Deregistering while I/O is queued is refused, then succeeds once it is done. */
    atomic_store(&gate, 0);
    OK(uGDSCpuStreamLaunch(s, wait_gate, NULL));
    l[0].size = 4096; l[0].foff = 16 * MiB; l[0].boff = 0;
    OK(uGDSReadAsync(h, buf, &l[0].size, &l[0].foff, &l[0].boff, &l[0].bytes, s));
    FAILS_WITH(uGDSHandleDeregisterEx(h, 0), UGDS_BUSY);
    FAILS_WITH(uGDSBufDeregister(buf), UGDS_BUSY);
    atomic_store(&gate, 1);
    OK(uGDSCpuStreamSynchronize(s));
    CHECK(l[0].bytes == 4096, "the held op ran: %zd", l[0].bytes);
    OK(uGDSStreamDeregister(s));
    FAILS_WITH(uGDSStreamDeregister(s), UGDS_INVALID_VALUE);
    OK(uGDSCpuStreamDestroy(s));

    if (!direct) {
        uint8_t *p = aligned_alloc(4096, 2 * MiB);
        CHECK(pread(fd, p, 2 * MiB, 8 * MiB) == 2 * MiB && matches(0x8, 8 * MiB, p, 2 * MiB),
              "the kernel reads what uGDSWrite wrote");
        free(p);
    }

    OK(uGDSBufDeregister(buf));
    FAILS_WITH(uGDSBufDeregister(buf), UGDS_MEMORY_NOT_REGISTERED);
    CHECK(uGDSRead(h, buf, 4096, 0, 0) == -UGDS_MEMORY_NOT_REGISTERED, "deregistered buffer");
    OK(uGDSHandleDeregisterEx(h, 0));
    FAILS_WITH(uGDSHandleDeregisterEx(h, 0), UGDS_HANDLE_NOT_REGISTERED);
    OK(uGDSDriverClose());
    close(devnull);
    close(fd);
    free(buf);
    free(other);
    printf("C-SUITE passed=%d failed=%d\n", passed, failed);
    return failed ? 1 : 0;
}
