/* The cuFile drop-in's compatibility suite: cuFile's documented semantics, linked against the
 * installed drop-in (`-L PREFIX/lib/ugds-cufile -lcufile`, i.e. libcufile.so.0) the way a cuFile
 * program links against NVIDIA's library.
 *
 *   cufile_test FILE
 *
 * FILE: a regular file of at least 64 MiB (the fallback path). The suite runs under a
 * cufile.json of its own (FILE.json, named by CUFILE_ENV_PATH_JSON as cuFile reads it). NVIDIA's cufile.h is not part of
 * this repository, so the few declarations used are written out below (names, values and
 * layouts from cufile.h of CUDA 13.0). Prints failed checks and `C-SUITE passed=N failed=M`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

typedef struct { int err; int cu_err; } CUfileError_t;
typedef void *CUfileHandle_t;
typedef void *CUfileBatchHandle_t;
typedef struct {
    int type;
    union { int fd; void *handle; } handle;
    const void *fs_ops;
} CUfileDescr_t;
typedef struct {
    int mode;
    union { struct { void *devPtr_base; off_t file_offset; off_t devPtr_offset; size_t size; } batch; } u;
    CUfileHandle_t fh;
    int opcode;
    void *cookie;
} CUfileIOParams_t;
typedef struct { void *cookie; int status; size_t ret; } CUfileIOEvents_t;

enum { CU_FILE_SUCCESS = 0, CU_FILE_DRIVER_NOT_INITIALIZED = 5001, CU_FILE_INVALID_FILE_TYPE = 5018,
       CU_FILE_INVALID_VALUE = 5022, CU_FILE_MEMORY_ALREADY_REGISTERED = 5023,
       CU_FILE_MEMORY_NOT_REGISTERED = 5024, CU_FILE_HANDLE_NOT_REGISTERED = 5027,
       CU_FILE_HANDLE_ALREADY_REGISTERED = 5028 };
enum { CUFILE_COMPLETE = 0x10, CUFILE_INVALID = 0x04, CUFILE_FAILED = 0x40 };

CUfileError_t cuFileDriverOpen(void);
CUfileError_t cuFileDriverClose(void);
long cuFileUseCount(void);
CUfileError_t cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *descr);
void cuFileHandleDeregister(CUfileHandle_t fh);
CUfileError_t cuFileBufRegister(const void *bufPtr_base, size_t length, int flags);
CUfileError_t cuFileBufDeregister(const void *bufPtr_base);
ssize_t cuFileRead(CUfileHandle_t fh, void *bufPtr_base, size_t size, off_t file_offset, off_t bufPtr_offset);
ssize_t cuFileWrite(CUfileHandle_t fh, const void *bufPtr_base, size_t size, off_t file_offset, off_t bufPtr_offset);
CUfileError_t cuFileBatchIOSetUp(CUfileBatchHandle_t *batch_idp, unsigned nr);
CUfileError_t cuFileBatchIOSubmit(CUfileBatchHandle_t batch_idp, unsigned nr, CUfileIOParams_t *iocbp, unsigned flags);
CUfileError_t cuFileBatchIOGetStatus(CUfileBatchHandle_t batch_idp, unsigned min_nr, unsigned *nr,
                                     CUfileIOEvents_t *iocbp, struct timespec *timeout);
CUfileError_t cuFileBatchIOCancel(CUfileBatchHandle_t batch_idp);
void cuFileBatchIODestroy(CUfileBatchHandle_t batch_idp);
CUfileError_t cuFileGetVersion(int *version);
CUfileError_t cuFileGetParameterSizeT(int param, size_t *value);
CUfileError_t cuFileSetParameterBool(int param, bool value);
enum { CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB = 5, CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE = 9,
       CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE = 1, CU_FILE_IO_NOT_SUPPORTED = 5008 };

#define OK(call) CHECK((call).err == CU_FILE_SUCCESS, "%s returned %d", #call, (call).err)
#define FAILS_WITH(call, code) \
    do { CUfileError_t e_ = (call); CHECK(e_.err == (code), "%s returned %d, expected %s", #call, e_.err, #code); } while (0)

#define MiB (1024 * 1024)

static uint8_t byte_at(uint64_t off) { return (uint8_t)((off * 2654435761u) >> 13); }
static void fill(uint8_t *p, uint64_t off, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = byte_at(off + i);
}
static int matches(const uint8_t *p, uint64_t off, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != byte_at(off + i)) return 0;
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE\n", argv[0]);
        return 2;
    }
    /* The file: 64 MiB of the pattern, written with plain POSIX calls. */
    int fd = open(argv[1], O_RDWR); /* no O_DIRECT: the library opens its own */
    if (fd < 0) {
        perror(argv[1]);
        return 2;
    }
    uint8_t *init = malloc(MiB);
    for (int i = 0; i < 64; i++) {
        fill(init, (uint64_t)i * MiB, MiB);
        CHECK(pwrite(fd, init, MiB, (off_t)i * MiB) == MiB, "preparing the file");
    }
    CHECK(ftruncate(fd, 64 * MiB) == 0, "file length");
    fsync(fd);

    /* The configuration file, as cuFile finds it: comments allowed; read at the first call.
     * 1 MiB pieces make the large reads below run in several; 8 entries bound a batch. */
    char json[4096];
    snprintf(json, sizeof json, "%s.json", argv[1]);
    FILE *jf = fopen(json, "w");
    CHECK(jf != NULL, "writing %s", json);
    if (jf) {
        fputs("{\n  // as NVIDIA's file: comments, and sections ugds has no use for\n"
              "  \"logging\": { \"level\": \"ERROR\" },\n"
              "  \"properties\": { \"max_direct_io_size_kb\": 1024, /* 1 MiB */ \"io_batchsize\": 8 },\n"
              "  \"fs\": { \"generic\": { \"posix_unaligned_writes\": false } }\n}\n",
              jf);
        fclose(jf);
    }
    setenv("CUFILE_ENV_PATH_JSON", json, 1);
    size_t piece = 0, batch_max = 0;
    OK(cuFileGetParameterSizeT(CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB, &piece));
    OK(cuFileGetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, &batch_max));
    CHECK(piece == 1024 && batch_max == 8, "cufile.json read: max_direct_io_size_kb %zu, io_batchsize %zu", piece,
          batch_max);

    /* No cuFileDriverOpen: the first call opens the library. */
    CUfileHandle_t fh = NULL, fh2 = NULL;
    CUfileDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = 1;
    d.handle.fd = fd;
    OK(cuFileHandleRegister(&fh, &d));
    CHECK(cuFileUseCount() >= 1, "use count after the implicit open");
    FAILS_WITH(cuFileHandleRegister(&fh2, &d), CU_FILE_HANDLE_ALREADY_REGISTERED);
    FAILS_WITH(cuFileHandleRegister(&fh2, NULL), CU_FILE_INVALID_VALUE);
    CUfileDescr_t bad = d;
    bad.type = 2;
    FAILS_WITH(cuFileHandleRegister(&fh2, &bad), CU_FILE_INVALID_FILE_TYPE);
    int version = 0;
    OK(cuFileGetVersion(&version));
    CHECK(version >= 1150, "version %d", version);

    /* Unregistered, unaligned host memory; any size and offset. */
    uint8_t *m = malloc(3 * MiB + 17);
    uint8_t *u = m + 3; /* not even 4-byte aligned */
    memset(u, 0, 100);
    RETURNS(cuFileRead(fh, u, 100, 7, 0), 100);
    CHECK(matches(u, 7, 100), "unaligned read into unregistered memory");
    RETURNS(cuFileRead(fh, m, 2 * MiB + 5, 4096 * 3 + 1, 9), 2 * MiB + 5);
    CHECK(matches(m + 9, 4096 * 3 + 1, 2 * MiB + 5), "a 2 MiB + 5 read at an odd offset");
    RETURNS(cuFileRead(fh, u, 0, 0, 0), 0);
    RETURNS(cuFileRead(fh, u, 100, 64 * MiB - 40, 0), 40); /* short at the end of the file */
    CHECK(matches(u, 64 * MiB - 40, 40), "short read data");

    /* Unaligned writes: read-modify-write of the edge blocks keeps the neighbours. */
    fill(u, 1000000 + 5, 3000);
    for (int i = 0; i < 3000; i++) u[i] ^= 0x5A;
    RETURNS(cuFileWrite(fh, u, 3000, 1000000 + 5, 0), 3000);
    uint8_t *chk = malloc(8192);
    CHECK(pread(fd, chk, 8192, 1000000 + 5 - 3000) == 8192, "reading back with pread");
    int rmw = matches(chk, 1000000 + 5 - 3000, 3000) && matches(chk + 6000, 1000000 + 5 + 3000, 8192 - 6000);
    for (int i = 0; i < 3000; i++) rmw &= chk[3000 + i] == (uint8_t)(byte_at(1000000 + 5 + i) ^ 0x5A);
    CHECK(rmw, "unaligned write: new bytes in place, neighbours unchanged");
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && st.st_size == 64 * MiB, "a write inside the file keeps its length");
    /* Extending the file by an unaligned amount: exactly to the written end. */
    fill(u, 64 * MiB + 100, 333);
    RETURNS(cuFileWrite(fh, u, 333, 64 * MiB + 100, 0), 333);
    CHECK(fstat(fd, &st) == 0 && st.st_size == 64 * MiB + 433, "file length %lld after an extending write",
          (long long)st.st_size);
    CHECK(pread(fd, chk, 533, 64 * MiB - 100) == 533 && matches(chk, 64 * MiB - 100, 100) &&
              chk[100] == 0 && chk[199] == 0 && matches(chk + 200, 64 * MiB + 100, 333),
          "extending write: old tail, zero gap, new bytes");
    CHECK(ftruncate(fd, 64 * MiB) == 0, "restoring the length");

    /* Registered malloc'ed memory (not page aligned) works, registration errors are cuFile's. */
    OK(cuFileBufRegister(u, 2 * MiB, 0));
    FAILS_WITH(cuFileBufRegister(u, 2 * MiB, 0), CU_FILE_MEMORY_ALREADY_REGISTERED);
    FAILS_WITH(cuFileBufRegister(NULL, 4096, 0), CU_FILE_INVALID_VALUE);
    RETURNS(cuFileRead(fh, u, MiB, 5 * MiB, 4096), MiB);
    CHECK(matches(u + 4096, 5 * MiB, MiB), "read into registered, unaligned host memory");
    RETURNS(cuFileRead(fh, u, 1000, 5 * MiB + 3, 1), 1000);
    CHECK(matches(u + 1, 5 * MiB + 3, 1000), "unaligned read into registered memory");
    /* fork(): the child's read through the inherited handle is CU_FILE_DRIVER_NOT_INITIALIZED
     * and writes nothing; a handle of its own reads; the parent carries on. */
    memset(u, 0x5A, 4096);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int bad = 0;
        memset(u, 0xEE, 4096);
        if (cuFileRead(fh, u, 4096, 5 * MiB, 0) != -CU_FILE_DRIVER_NOT_INITIALIZED) bad |= 1;
        for (int i = 0; i < 4096; i++)
            if (u[i] != 0xEE) { bad |= 2; break; }
        int fd2 = open(argv[1], O_RDWR);
        CUfileDescr_t d2 = d;
        d2.handle.fd = fd2;
        CUfileHandle_t fh3 = NULL;
        if (cuFileHandleRegister(&fh3, &d2).err != CU_FILE_SUCCESS) bad |= 4;
        if (cuFileRead(fh3, u, 4096, 5 * MiB, 0) != 4096 || !matches(u, 5 * MiB, 4096)) bad |= 8;
        _exit(bad);
    }
    int wstatus = 0;
    CHECK(pid > 0 && waitpid(pid, &wstatus, 0) == pid && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0,
          "forked child: failed checks 0x%x, status %d", WEXITSTATUS(wstatus), wstatus);
    int kept = 1;
    for (int i = 0; i < 4096; i++) kept &= u[i] == 0x5A;
    CHECK(kept, "the child's read did not reach the parent's buffer");
    RETURNS(cuFileRead(fh, u, 4096, 5 * MiB, 0), 4096);
    CHECK(matches(u, 5 * MiB, 4096), "the parent reads after its child exited");

    OK(cuFileBufDeregister(u));
    FAILS_WITH(cuFileBufDeregister(u), CU_FILE_MEMORY_NOT_REGISTERED);

    /* A batch across two files, unaligned entries, unregistered memory. */
    char path2[4096];
    snprintf(path2, sizeof path2, "%s.second", argv[1]);
    int fd2 = open(path2, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd2 >= 0 && ftruncate(fd2, 4 * MiB) == 0, "second file");
    CUfileDescr_t d2 = d;
    d2.handle.fd = fd2;
    OK(cuFileHandleRegister(&fh2, &d2));
    CUfileBatchHandle_t b;
    FAILS_WITH(cuFileBatchIOSetUp(&b, 0), CU_FILE_INVALID_VALUE);
    FAILS_WITH(cuFileBatchIOSetUp(&b, 9), CU_FILE_INVALID_VALUE); /* io_batchsize 8 */
    OK(cuFileBatchIOSetUp(&b, 8));
    uint8_t *bb = malloc(8 * 70000);
    for (int round = 0; round < 3; round++) {
        CUfileIOParams_t io[8];
        for (int i = 0; i < 8; i++) {
            memset(&io[i], 0, sizeof io[i]);
            io[i].mode = 1;
            io[i].u.batch.devPtr_base = bb;
            io[i].u.batch.devPtr_offset = i * 70000;
            io[i].u.batch.size = 65536 + i * 111;
            io[i].u.batch.file_offset = 100 + i * 70001;
            io[i].fh = i % 2 ? fh2 : fh;
            io[i].opcode = i % 2; /* reads from the first file, writes to the second */
            io[i].cookie = (void *)(intptr_t)(i + 1);
            if (i % 2) fill(bb + i * 70000, 7 * MiB + i, io[i].u.batch.size);
        }
        OK(cuFileBatchIOSubmit(b, 8, io, 0));
        CUfileIOEvents_t ev[8];
        unsigned got = 0, good = 0;
        for (int tries = 0; got < 8 && tries < 1000; tries++) {
            unsigned n = 8 - got;
            struct timespec t = {10, 0};
            if (cuFileBatchIOGetStatus(b, 1, &n, ev + got, &t).err) break;
            got += n;
        }
        for (unsigned k = 0; k < got; k++) {
            int i = (int)(intptr_t)ev[k].cookie - 1;
            good += i >= 0 && i < 8 && ev[k].status == CUFILE_COMPLETE && ev[k].ret == 65536 + (size_t)i * 111;
        }
        int data = 1;
        for (int i = 0; i < 8; i += 2) data &= matches(bb + i * 70000, 100 + i * 70001, 65536 + i * 111);
        for (int i = 1; i < 8; i += 2) {
            uint8_t *p = malloc(65536 + i * 111);
            data &= pread(fd2, p, 65536 + i * 111, 100 + i * 70001) == 65536 + i * 111 &&
                    matches(p, 7 * MiB + i, 65536 + i * 111);
            free(p);
        }
        CHECK(got == 8 && good == 8 && data, "round %d: %u events, %u complete, data %d", round, got, good, data);
        /* Re-register the second file between rounds: the batch must keep working. */
        cuFileHandleDeregister(fh2);
        OK(cuFileHandleRegister(&fh2, &d2));
    }
    /* An entry naming a deregistered handle is invalid; the others still run. */
    {
        CUfileHandle_t stale = fh2;
        cuFileHandleDeregister(fh2);
        OK(cuFileHandleRegister(&fh2, &d2));
        CUfileIOParams_t io[2];
        memset(io, 0, sizeof io);
        for (int i = 0; i < 2; i++) {
            io[i].mode = 1;
            io[i].u.batch.devPtr_base = bb;
            io[i].u.batch.size = 4096;
            io[i].opcode = 0;
            io[i].cookie = (void *)(intptr_t)(i + 1);
        }
        io[0].fh = stale;
        io[1].fh = fh2;
        OK(cuFileBatchIOSubmit(b, 2, io, 0));
        CUfileIOEvents_t ev[2];
        unsigned got = 0, ok = 0;
        for (int tries = 0; got < 2 && tries < 1000; tries++) {
            unsigned n = 2 - got;
            if (cuFileBatchIOGetStatus(b, 1, &n, ev + got, NULL).err) break;
            got += n;
        }
        for (unsigned k = 0; k < got; k++) {
            if (ev[k].cookie == (void *)1) ok += ev[k].status == CUFILE_INVALID;
            if (ev[k].cookie == (void *)2) ok += ev[k].status == CUFILE_COMPLETE && ev[k].ret == 4096;
        }
        CHECK(got == 2 && ok == 2, "stale handle: %u events, %u as expected", got, ok);
        RETURNS(cuFileRead(stale, bb, 4096, 0, 0), -EBADF);
    }
    OK(cuFileBatchIOCancel(b));
    cuFileBatchIODestroy(b);

    /* A handle keeps its descriptor's access mode: no read through O_WRONLY, no write through
     * O_RDONLY (CU_FILE_INVALID_FILE_OPEN_FLAG, 5019), and no data moves. */
    {
        int wo = open(argv[1], O_WRONLY), ro = open(argv[1], O_RDONLY);
        CUfileHandle_t wfh = NULL, rfh = NULL;
        CUfileDescr_t dw = d, dr = d;
        dw.handle.fd = wo;
        dr.handle.fd = ro;
        OK(cuFileHandleRegister(&wfh, &dw));
        OK(cuFileHandleRegister(&rfh, &dr));
        memset(bb, 0, 8192);
        RETURNS(cuFileRead(wfh, bb, 4096, 0, 0), -5019);
        RETURNS(cuFileRead(wfh, bb, 100, 7, 0), -5019);
        int untouched = 1;
        for (int i = 0; i < 8192; i++) untouched &= bb[i] == 0;
        CHECK(untouched, "a write-only handle's read moved no data");
        RETURNS(cuFileWrite(rfh, bb, 4096, 0, 0), -5019);
        RETURNS(cuFileWrite(rfh, bb, 100, 7, 0), -5019);
        CHECK(pread(fd, chk, 4096, 0) == 4096 && matches(chk, 0, 4096), "a read-only handle's write changed nothing");
        fill(bb, 0, 4096);
        RETURNS(cuFileWrite(wfh, bb, 4096, 0, 0), 4096);
        RETURNS(cuFileRead(rfh, bb, 4096, 0, 0), 4096);
        CHECK(matches(bb, 0, 4096), "each handle does what its mode allows");
        cuFileHandleDeregister(wfh);
        cuFileHandleDeregister(rfh);
        close(wo);
        close(ro);
    }

    cuFileHandleDeregister(fh2);
    cuFileHandleDeregister(fh);
    OK(cuFileDriverClose());

    /* A parameter set while the library is closed takes effect: no compatibility mode, so a
     * file (the fallback path) is not registered. */
    OK(cuFileSetParameterBool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, false));
    FAILS_WITH(cuFileHandleRegister(&fh, &d), CU_FILE_IO_NOT_SUPPORTED);
    OK(cuFileDriverClose());
    unlink(json);
    close(fd2);
    unlink(path2);
    close(fd);
    free(m);
    free(chk);
    free(bb);
    free(init);
    return CHECK_SUMMARY();
}
