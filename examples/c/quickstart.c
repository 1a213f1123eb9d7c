/* ugds from C with host memory: read/write, a batch, stream-ordered reads on a CPU stream.
 *
 *   cc quickstart.c $(pkg-config --cflags --libs ugds) -o quickstart
 *   ./quickstart /dev/ugds_drv0  # a controller bound to ugds (direct path)
 *   ./quickstart data.bin        # a file of at least 16 MiB (fallback path: io_uring + O_DIRECT)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ugds.h>

#define MiB (1 << 20)

static int fail(const char *what, long code) {
    fprintf(stderr, "quickstart: %s: %ld (%s)\n", what, code, ugdsxErrorString(code));
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s /dev/ugds_drvN|FILE\n", argv[0]);
        return 2;
    }
    /* A character device (a ugds node) cannot be opened with O_DIRECT; a file or block device
     * is opened with it, for the fallback path. */
    struct stat st;
    int is_dev = stat(argv[1], &st) == 0 && S_ISCHR(st.st_mode);
    int fd = open(argv[1], O_RDWR | (is_dev ? 0 : O_DIRECT));
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    uGDSDescr_t d = {.type = UGDS_HANDLE_TYPE_OPAQUE_FD, .handle.fd = fd};
    uGDSHandle_t h;
    uGDSError_t e = uGDSDriverOpen();
    if (e.err) return fail("uGDSDriverOpen", e.err);
    if ((e = uGDSHandleRegister(&h, &d)).err) return fail("uGDSHandleRegister", e.err);

    /* Host memory must be page aligned; any length. */
    uint8_t *buf = aligned_alloc(4096, 2 * MiB);
    if ((e = uGDSBufRegister(buf, 2 * MiB, 0)).err) return fail("uGDSBufRegister", e.err);

    /* 1. Write 1 MiB, read it back into the other half. */
    for (int i = 0; i < MiB; i++) buf[i] = (uint8_t)(i * 7 + 1);
    ssize_t n = uGDSWrite(h, buf, MiB, 4 * MiB, 0);
    if (n != MiB) return fail("uGDSWrite", n);
    n = uGDSRead(h, buf, MiB, 4 * MiB, MiB);
    if (n != MiB) return fail("uGDSRead", n);
    if (memcmp(buf, buf + MiB, MiB)) return fail("read-back differs", 0);
    printf("read/write: 1 MiB written and read back\n");

    /* 2. A batch of 8 reads of 64 KiB. */
    uGDSBatchHandle_t b;
    if ((e = uGDSBatchIOSetUp(&b, h, 8)).err) return fail("uGDSBatchIOSetUp", e.err);
    uGDSIOParams_t io[8];
    for (int i = 0; i < 8; i++) {
        io[i] = (uGDSIOParams_t){.devPtr_base = buf, .file_offset = 4 * MiB + i * 65536,
                                 .devPtr_offset = MiB + i * 65536, .size = 65536,
                                 .opcode = UGDS_READ, .cookie = (void *)(intptr_t)i};
    }
    if ((e = uGDSBatchIOSubmit(b, 8, io, 0)).err) return fail("uGDSBatchIOSubmit", e.err);
    uGDSIOEvents_t ev[8];
    unsigned done = 0;
    while (done < 8) {
        unsigned nr = 8 - done;
        if ((e = uGDSBatchIOGetStatus(b, 1, &nr, ev + done, NULL)).err) return fail("uGDSBatchIOGetStatus", e.err);
        done += nr;
    }
    for (int i = 0; i < 8; i++)
        if (ev[i].status != UGDS_BATCH_COMPLETE) return fail("batch entry", ev[i].ret);
    uGDSBatchIODestroy(b);
    printf("batch: 8 reads complete\n");

    /* 3. Stream-ordered reads: arguments are read when the stream reaches each one. */
    void *s;
    if ((e = ugdsxCpuStreamCreate(&s)).err) return fail("ugdsxCpuStreamCreate", e.err);
    size_t size[4];
    off_t foff[4], boff[4];
    ssize_t bytes[4];
    for (int i = 0; i < 4; i++) {
        size[i] = 65536;
        foff[i] = 4 * MiB + i * 65536;
        boff[i] = MiB + i * 65536;
        if ((e = uGDSReadAsync(h, buf, &size[i], &foff[i], &boff[i], &bytes[i], s)).err)
            return fail("uGDSReadAsync", e.err);
    }
    ugdsxCpuStreamSynchronize(s);
    for (int i = 0; i < 4; i++)
        if (bytes[i] != 65536) return fail("async read", bytes[i]);
    ugdsxCpuStreamDestroy(s);
    printf("async: 4 stream-ordered reads complete\n");

    uGDSBufDeregister(buf);
    uGDSHandleDeregister(h);
    uGDSDriverClose();
    close(fd);
    free(buf);
    printf("quickstart: ok\n");
    return 0;
}
