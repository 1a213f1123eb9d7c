/* uGDS's public API as data: every function of uGDS's header (ScaleX-IO/uGDS include/ugds.h,
 * the version with vectored I/O and RDMA) redeclared with its exact signature, every constant
 * with its value, every type by its tag and typedef name. Compiled after our ugds.h
 * (`cargo xtask header --check`): a C or C++ compiler rejects any redeclaration whose type
 * differs from ours. xtask also checks that our header declares no other function besides
 * the `ugdsx*` extensions. */
#include "ugds.h"

#ifdef __cplusplus
extern "C" {
#endif
uGDSError_t uGDSDriverOpen(void);
uGDSError_t uGDSDriverClose(void);
uGDSError_t uGDSHandleRegister(uGDSHandle_t *fh, uGDSDescr_t *descr);
uGDSError_t uGDSGetDeviceCapacity(uGDSHandle_t fh, uint64_t *capacity_bytes);
/* NVMe-oF handles (the newer uGDS): signatures as uGDS's own NVMe-oF tests call them (no
 * stored version of its header declares them; the flag constant's value is not public). */
uGDSError_t uGDSHandleRegisterNvmeof(uGDSHandle_t *fh, int fd);
uGDSError_t uGDSHandleRegisterNvmeofEx(uGDSHandle_t *fh, int fd, unsigned flags);
void uGDSHandleDeregister(uGDSHandle_t fh);
uGDSError_t uGDSHandleDeregisterEx(uGDSHandle_t fh, int timeout_sec);
uGDSError_t uGDSBufRegister(const void *bufPtr_base, size_t length, int flags);
uGDSError_t uGDSBufDeregister(const void *bufPtr_base);
uGDSError_t uGDSBufRegisterEx(const void *bufPtr_base, size_t length, const uGDSBufConfig_t *config);
uGDSError_t uGDSExportDmabuf(const void *bufPtr_base, uGDSDmabufExport_t *out);
uGDSError_t uGDSRDMARegister(const void *bufPtr_base, void *pd, int access_flags, uGDSRDMARegion_t *region);
uGDSError_t uGDSRDMAUnregister(const void *bufPtr_base, uGDSRDMARegion_t *region);
ssize_t uGDSRead(uGDSHandle_t fh, void *bufPtr_base, size_t size, off_t file_offset, off_t bufPtr_offset);
ssize_t uGDSWrite(uGDSHandle_t fh, const void *bufPtr_base, size_t size, off_t file_offset, off_t bufPtr_offset);
uGDSError_t uGDSBatchIOSetUp(uGDSBatchHandle_t *batch, uGDSHandle_t fh, unsigned nr);
uGDSError_t uGDSBatchIOSubmit(uGDSBatchHandle_t batch, unsigned nr, uGDSIOParams_t *iocb, unsigned flags);
uGDSError_t uGDSBatchIOGetStatus(uGDSBatchHandle_t batch, unsigned min_nr, unsigned *nr, uGDSIOEvents_t *events,
                                 struct timespec *timeout);
void uGDSBatchIODestroy(uGDSBatchHandle_t batch);
ssize_t uGDSReadv(uGDSHandle_t fh, const uGDSIoSegment_t *segs, unsigned nr_segs, off_t file_offset);
ssize_t uGDSWritev(uGDSHandle_t fh, const uGDSIoSegment_t *segs, unsigned nr_segs, off_t file_offset);
uGDSError_t uGDSBatchIOSubmitv(uGDSBatchHandle_t batch, unsigned nr, uGDSIOSegParams_t *iocb, unsigned flags);
uGDSError_t uGDSReadvAsync(uGDSHandle_t fh, uGDSIoSegment_t *segs, unsigned nr_segs, off_t *file_offset_p,
                           ssize_t *bytes_read_p, void *stream);
uGDSError_t uGDSWritevAsync(uGDSHandle_t fh, uGDSIoSegment_t *segs, unsigned nr_segs, off_t *file_offset_p,
                            ssize_t *bytes_written_p, void *stream);
uGDSError_t uGDSReadAsync(uGDSHandle_t fh, void *bufPtr_base, size_t *size_p, off_t *file_offset_p,
                          off_t *bufPtr_offset_p, ssize_t *bytes_read_p, void *stream);
uGDSError_t uGDSWriteAsync(uGDSHandle_t fh, void *bufPtr_base, size_t *size_p, off_t *file_offset_p,
                           off_t *bufPtr_offset_p, ssize_t *bytes_written_p, void *stream);
uGDSError_t uGDSStreamRegister(void *stream);
uGDSError_t uGDSStreamRegisterEx(void *stream, uGDSBackend_t backend);
uGDSError_t uGDSStreamDeregister(void *stream);
#ifdef __cplusplus
}
#endif

/* Types by uGDS's tags and typedef names, with their fields. */
static void uses_the_types(void) {
    struct uGDSError e = {UGDS_SUCCESS, 0};
    uGDSError_t e2 = e;
    enum uGDSOpError op = e2.err;
    uGDSOpError op2 = op;
    enum uGDSHandleType ht = UGDS_HANDLE_TYPE_OPAQUE_FD;
    uGDSDescr_t d;
    struct uGDSDescr_t *dp = &d;
    d.type = ht;
    d.handle.fd = 3;
    d.handle.handle = 0;
    enum uGDSBackend be = UGDS_BACKEND_HIP;
    uGDSBackend_t be2 = be;
    struct uGDSBufConfig bc;
    uGDSBufConfig_t *bcp = &bc;
    bc.backend = be2;
    bc.enable_export = true;
    struct uGDSDmabufExport de;
    uGDSDmabufExport_t *dep = &de;
    de.fd = 0;
    de.offset = 0;
    de.length = 0;
    struct uGDSRDMARegion rr;
    uGDSRDMARegion_t *rrp = &rr;
    rr.mr = 0;
    rr.iova = 0;
    rr.lkey = 0;
    rr.rkey = 0;
    rr.token = 0;
    enum uGDSOpcode oc = UGDS_WRITE;
    uGDSOpcode_t oc2 = oc;
    enum uGDSBatchStatus bs = UGDS_BATCH_COMPLETE;
    uGDSBatchStatus_t bs2 = bs;
    struct uGDSIOParams p;
    uGDSIOParams_t *pp = &p;
    p.devPtr_base = 0;
    p.file_offset = 0;
    p.devPtr_offset = 0;
    p.size = 0;
    p.opcode = oc2;
    p.cookie = 0;
    struct uGDSIOEvents ev;
    uGDSIOEvents_t *evp = &ev;
    ev.cookie = 0;
    ev.status = bs2;
    ev.ret = 0;
    struct uGDSIoSegment sg;
    uGDSIoSegment_t *sgp = &sg;
    sg.base = 0;
    sg.offset = 0;
    sg.size = 0;
    struct uGDSIOSegParams sp;
    uGDSIOSegParams_t *spp = &sp;
    sp.segs = sgp;
    sp.nr_segs = 1;
    sp.file_offset = 0;
    sp.opcode = UGDS_READ;
    sp.cookie = 0;
    uGDSHandle_t h = 0;
    uGDSBatchHandle_t b = 0;
    (void)op2; (void)dp; (void)bcp; (void)dep; (void)rrp; (void)pp; (void)evp; (void)spp; (void)h; (void)b;
    (void)uGDS_status_error(UGDS_BUSY);
    (void)UGDS_ERRSTR(-UGDS_INVALID_VALUE);
    (void)IS_UGDS_ERR(-UGDS_INVALID_VALUE);
}

#ifdef __cplusplus
#define VALUE(name, v) static_assert((name) == (v), #name)
#else
#define VALUE(name, v) _Static_assert((name) == (v), #name)
#endif
VALUE(UGDS_BASE_ERR, 5000);
VALUE(NVM_MAP_DMABUF, 0x1);
VALUE(NVM_MAP_RDMA, 0x2);
VALUE(NVM_MAP_FORCE_CUDA, 0x4);
VALUE(UGDS_REGISTER_DMABUF, 0x1);
VALUE(UGDS_IOV_MAX, 1024);
VALUE(UGDS_BATCH_IOV_MAX, 128);
VALUE(UGDS_SUCCESS, 0);
VALUE(UGDS_DRIVER_NOT_INITIALIZED, 5001);
VALUE(UGDS_DRIVER_INVALID_PROPS, 5002);
VALUE(UGDS_DRIVER_UNSUPPORTED_LIMIT, 5003);
VALUE(UGDS_DRIVER_VERSION_MISMATCH, 5004);
VALUE(UGDS_DRIVER_VERSION_READ_ERROR, 5005);
VALUE(UGDS_DRIVER_CLOSING, 5006);
VALUE(UGDS_PLATFORM_NOT_SUPPORTED, 5007);
VALUE(UGDS_IO_NOT_SUPPORTED, 5008);
VALUE(UGDS_DEVICE_NOT_SUPPORTED, 5009);
VALUE(UGDS_NVFS_DRIVER_ERROR, 5010);
VALUE(UGDS_CUDA_DRIVER_ERROR, 5011);
VALUE(UGDS_CUDA_POINTER_INVALID, 5012);
VALUE(UGDS_CUDA_MEMORY_TYPE_INVALID, 5013);
VALUE(UGDS_CUDA_POINTER_RANGE_ERROR, 5014);
VALUE(UGDS_CUDA_CONTEXT_MISMATCH, 5015);
VALUE(UGDS_INVALID_MAPPING_SIZE, 5016);
VALUE(UGDS_INVALID_MAPPING_RANGE, 5017);
VALUE(UGDS_INVALID_FILE_TYPE, 5018);
VALUE(UGDS_INVALID_FILE_OPEN_FLAG, 5019);
VALUE(UGDS_DIO_NOT_SET, 5020);
VALUE(UGDS_INVALID_VALUE, 5022);
VALUE(UGDS_MEMORY_ALREADY_REGISTERED, 5023);
VALUE(UGDS_MEMORY_NOT_REGISTERED, 5024);
VALUE(UGDS_PERMISSION_DENIED, 5025);
VALUE(UGDS_DRIVER_ALREADY_OPEN, 5026);
VALUE(UGDS_HANDLE_NOT_REGISTERED, 5027);
VALUE(UGDS_HANDLE_ALREADY_REGISTERED, 5028);
VALUE(UGDS_DEVICE_NOT_FOUND, 5029);
VALUE(UGDS_INTERNAL_ERROR, 5030);
VALUE(UGDS_GETNEWFD_FAILED, 5031);
VALUE(UGDS_NVFS_SETUP_ERROR, 5033);
VALUE(UGDS_IO_DISABLED, 5034);
VALUE(UGDS_GPU_MEMORY_PINNING_FAILED, 5036);
VALUE(UGDS_BATCH_CAPACITY_EXCEEDED, 5040);
VALUE(UGDS_RDMA_MR_STILL_ACTIVE, 5041);
VALUE(UGDS_BUSY, 5042);
VALUE(UGDS_OUT_OF_MEMORY, 5043);
VALUE(UGDS_HANDLE_TYPE_OPAQUE_FD, 1);
VALUE(UGDS_HANDLE_TYPE_OPAQUE_WIN32, 2);
VALUE(UGDS_HANDLE_TYPE_USERSPACE_FS, 3);
VALUE(UGDS_BACKEND_DEFAULT, 0);
VALUE(UGDS_BACKEND_CUDA, 1);
VALUE(UGDS_BACKEND_HIP, 2);
VALUE(UGDS_READ, 0);
VALUE(UGDS_WRITE, 1);
VALUE(UGDS_BATCH_WAITING, 0x01);
VALUE(UGDS_BATCH_PENDING, 0x02);
VALUE(UGDS_BATCH_INVALID, 0x04);
VALUE(UGDS_BATCH_COMPLETE, 0x10);
VALUE(UGDS_BATCH_TIMEOUT, 0x20);
VALUE(UGDS_BATCH_FAILED, 0x40);
/* Layouts on x86_64 (LP64). */
VALUE(sizeof(uGDSError_t), 8);
VALUE(sizeof(uGDSDescr_t), 16);
VALUE(sizeof(uGDSBufConfig_t), 8);
VALUE(sizeof(uGDSDmabufExport_t), 24);
VALUE(sizeof(uGDSRDMARegion_t), 32);
VALUE(sizeof(uGDSIOParams_t), 48);
VALUE(sizeof(uGDSIOEvents_t), 24);
VALUE(sizeof(uGDSIoSegment_t), 24);
VALUE(sizeof(uGDSIOSegParams_t), 40);

int main(void) {
    uses_the_types();
    return 0;
}
