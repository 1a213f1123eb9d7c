/*
 * A fake libamdhip64.so for ugds's host tests (tests only; never installed). It implements the
 * HIP functions ugds's gpu::hip loads, over host memory:
 *
 * - device memory is page-aligned malloc'd memory recorded in a table; hipPointerGetAttributes
 *   answers from the table, in ROCm 6's hipMemoryType numbering, or ROCm 5's when the
 *   environment variable FAKE_HIP_RUNTIME_VERSION is below 60000000 (it is also what
 *   hipRuntimeGetVersion returns; default 60032830, ROCm 6.0);
 * - pinned host memory (hipHostMalloc) is recorded too; memory allocated with
 *   hipHostMallocMapped has a "device address" that differs from its host address (a fixed
 *   tag added), so a caller that passes the host address where the device one is due fails;
 * - each stream is a thread running its queue in order: copies, host functions
 *   (hipLaunchHostFunc) and waits (hipStreamWaitValue32 spins on the word, with the flags'
 *   comparisons: Gte, Eq, And, Nor under the mask); hipStreamSynchronize waits for the queue;
 * - hipMemGetHandleForAddressRange returns hipErrorNotSupported (no dma-buf exporter here);
 * - FAKE_HIP_DEVICES devices (default 1); the current device is per thread (hipSetDevice,
 *   hipGetDevice; 0 on a thread that set none, as HIP); memory and streams belong to the device
 *   current when they were made (hipPointerGetAttributes, hipStreamGetDevice), and a copy on a
 *   stream is refused (hipErrorInvalidDevice) unless the stream's device is current: stricter
 *   than HIP, so a caller that forgets to select the device fails here.
 *
 * Declarations and values follow HIP's hip_runtime_api.h (ROCm 6.x); see userlib/src/gpu/hip.rs.
 * Built by userlib/tests/hip_fake.rs with: gcc -shared -fPIC -pthread.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int hipError_t;
typedef struct fake_stream *hipStream_t;
typedef void (*hipHostFn_t)(void *userData);

enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorNotInitialized = 3,
    hipErrorInvalidDevice = 101,
    hipErrorInvalidHandle = 400,
    hipErrorNotSupported = 801,
};

#define hipHostMallocMapped 0x2
#define hipStreamWaitValueGte 0x0
#define hipStreamWaitValueEq 0x1
#define hipStreamWaitValueAnd 0x2
#define hipStreamWaitValueNor 0x3

typedef struct {
    int type;
    int device;
    void *devicePointer;
    void *hostPointer;
    int isManaged;
    unsigned allocationFlags;
} hipPointerAttribute_t;

/* Added to a mapped host allocation's address to make its "device address". */
#define DEVICE_TAG ((uintptr_t)1 << 62) /* never set in a user-space address */

/* ---- allocations ---- */

enum kind { DEVICE, HOST };

struct alloc {
    char *base;
    size_t len;
    enum kind kind;
    unsigned flags;
    int device;
    struct alloc *next;
};

static pthread_mutex_t allocs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *allocs;
static int initialized;

/* The calling thread's current device (hipSetDevice). */
static __thread int current_device;

static int device_count(void) {
    const char *v = getenv("FAKE_HIP_DEVICES");
    return v && *v ? atoi(v) : 1;
}

static int runtime_version(void) {
    const char *v = getenv("FAKE_HIP_RUNTIME_VERSION");
    return v && *v ? atoi(v) : 60032830;
}

/* The allocation containing [p, p+len), or NULL. Caller holds allocs_lock. */
static struct alloc *find(const void *p, size_t len) {
    const char *c = p;
    for (struct alloc *a = allocs; a; a = a->next) {
        if (c >= a->base && c < a->base + a->len && len <= (size_t)(a->base + a->len - c)) {
            return a;
        }
    }
    return NULL;
}

static int is_kind(const void *p, size_t len, enum kind k) {
    pthread_mutex_lock(&allocs_lock);
    struct alloc *a = find(p, len);
    int r = a && a->kind == k;
    pthread_mutex_unlock(&allocs_lock);
    return r;
}

static hipError_t add(void **out, size_t size, enum kind k, unsigned flags) {
    if (!out || size == 0) {
        return hipErrorInvalidValue;
    }
    void *p = NULL;
    if (posix_memalign(&p, 4096, (size + 4095) & ~(size_t)4095) != 0) {
        return hipErrorOutOfMemory;
    }
    struct alloc *a = malloc(sizeof *a);
    if (!a) {
        free(p);
        return hipErrorOutOfMemory;
    }
    *a = (struct alloc){p, size, k, flags, current_device, NULL};
    pthread_mutex_lock(&allocs_lock);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&allocs_lock);
    *out = p;
    return hipSuccess;
}

static hipError_t drop(void *p, enum kind k) {
    if (!p) {
        return hipSuccess;
    }
    pthread_mutex_lock(&allocs_lock);
    for (struct alloc **a = &allocs; *a; a = &(*a)->next) {
        if ((*a)->base == p && (*a)->kind == k) {
            struct alloc *x = *a;
            *a = x->next;
            pthread_mutex_unlock(&allocs_lock);
            free(x->base);
            free(x);
            return hipSuccess;
        }
    }
    pthread_mutex_unlock(&allocs_lock);
    return hipErrorInvalidValue;
}

/* The host address of a mapped host allocation's device address (NULL if it is not one). */
static uint32_t *word_of(void *dev) {
    uintptr_t d = (uintptr_t)dev;
    if (!(d & DEVICE_TAG)) {
        return NULL;
    }
    void *h = (void *)(d & ~DEVICE_TAG);
    pthread_mutex_lock(&allocs_lock);
    struct alloc *a = find(h, 4);
    int ok = a && a->kind == HOST && (a->flags & hipHostMallocMapped) && ((uintptr_t)h % 4) == 0;
    pthread_mutex_unlock(&allocs_lock);
    return ok ? h : NULL;
}

/* ---- device management ---- */

hipError_t hipInit(unsigned int flags) {
    if (flags != 0) {
        return hipErrorInvalidValue;
    }
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return hipSuccess;
}

hipError_t hipRuntimeGetVersion(int *runtimeVersion) {
    if (!runtimeVersion) {
        return hipErrorInvalidValue;
    }
    *runtimeVersion = runtime_version();
    return hipSuccess;
}

hipError_t hipGetDeviceCount(int *count) {
    if (!count) {
        return hipErrorInvalidValue;
    }
    *count = device_count();
    return hipSuccess;
}

hipError_t hipSetDevice(int deviceId) {
    if (deviceId < 0 || deviceId >= device_count()) {
        return hipErrorInvalidDevice;
    }
    current_device = deviceId;
    return hipSuccess;
}

hipError_t hipGetDevice(int *deviceId) {
    if (!deviceId) {
        return hipErrorInvalidValue;
    }
    *deviceId = current_device;
    return hipSuccess;
}

hipError_t hipDeviceGet(int *device, int ordinal) {
    if (!device) {
        return hipErrorInvalidValue;
    }
    if (ordinal < 0 || ordinal >= device_count()) {
        return hipErrorInvalidDevice;
    }
    *device = ordinal;
    return hipSuccess;
}

hipError_t hipDeviceGetName(char *name, int len, int device) {
    if (!name || len <= 0) {
        return hipErrorInvalidValue;
    }
    if (device < 0 || device >= device_count()) {
        return hipErrorInvalidDevice;
    }
    strncpy(name, "Fake HIP device (ugds tests)", (size_t)len);
    name[len - 1] = 0;
    return hipSuccess;
}

const char *hipGetErrorName(hipError_t e) {
    switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNotInitialized: return "hipErrorNotInitialized";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    default: return "hipErrorUnknown";
    }
}

/* ---- memory ---- */

hipError_t hipMalloc(void **ptr, size_t size) {
    return add(ptr, size, DEVICE, 0);
}

hipError_t hipFree(void *ptr) {
    return drop(ptr, DEVICE);
}

hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags) {
    return add(ptr, size, HOST, flags);
}

hipError_t hipHostFree(void *ptr) {
    return drop(ptr, HOST);
}

hipError_t hipHostGetDevicePointer(void **devPtr, void *hstPtr, unsigned int flags) {
    if (!devPtr || !hstPtr || flags != 0) {
        return hipErrorInvalidValue;
    }
    pthread_mutex_lock(&allocs_lock);
    struct alloc *a = find(hstPtr, 1);
    int ok = a && a->kind == HOST && (a->flags & hipHostMallocMapped);
    pthread_mutex_unlock(&allocs_lock);
    if (!ok) {
        return hipErrorInvalidValue;
    }
    *devPtr = (void *)((uintptr_t)hstPtr | DEVICE_TAG);
    return hipSuccess;
}

hipError_t hipPointerGetAttributes(hipPointerAttribute_t *attributes, const void *ptr) {
    if (!attributes) {
        return hipErrorInvalidValue;
    }
    int v6 = runtime_version() >= 60000000;
    pthread_mutex_lock(&allocs_lock);
    struct alloc *a = find(ptr, 1);
    hipPointerAttribute_t r = {0};
    if (a) {
        r.type = a->kind == DEVICE ? (v6 ? 2 : 1) : (v6 ? 1 : 0);
        r.device = a->device;
        r.devicePointer = (void *)ptr;
        r.hostPointer = a->kind == HOST ? (void *)ptr : NULL;
        r.allocationFlags = a->flags;
    }
    pthread_mutex_unlock(&allocs_lock);
    if (!a) {
        if (!v6) {
            return hipErrorInvalidValue; /* ROCm 5: unknown pointers are an error */
        }
        r.type = 0; /* hipMemoryTypeUnregistered */
        r.device = -2;
    }
    *attributes = r;
    return hipSuccess;
}

hipError_t hipMemGetHandleForAddressRange(void *handle, void *dptr, size_t size, int handleType,
                                          unsigned long long flags) {
    (void)flags;
    if (!handle || !dptr || size == 0 || handleType != 1) {
        return hipErrorInvalidValue;
    }
    return hipErrorNotSupported;
}

/* ---- streams ---- */

enum op_kind { OP_COPY, OP_HOST_FN, OP_WAIT };

struct op {
    enum op_kind kind;
    void *dst;
    const void *src;
    size_t len;
    hipHostFn_t fn;
    void *data;
    uint32_t *word;
    uint32_t value, mask;
    unsigned flags;
    struct op *next;
};

struct fake_stream {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    struct op *head, *tail;
    int running;
    int closing;
    int device;
    pthread_t thread;
};

static int reached(uint32_t w, uint32_t value, unsigned flags, uint32_t mask) {
    switch (flags) {
    case hipStreamWaitValueGte: return (w & mask) >= value;
    case hipStreamWaitValueEq: return (w & mask) == value;
    case hipStreamWaitValueAnd: return ((w & mask) & value) != 0;
    default: return ~((w & mask) | (value & mask)) != 0;
    }
}

static void *stream_main(void *arg) {
    struct fake_stream *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->head && !s->closing) {
            pthread_cond_wait(&s->cv, &s->lock);
        }
        struct op *o = s->head;
        if (!o) {
            pthread_mutex_unlock(&s->lock);
            return NULL;
        }
        s->head = o->next;
        if (!s->head) {
            s->tail = NULL;
        }
        s->running = 1;
        pthread_mutex_unlock(&s->lock);
        switch (o->kind) {
        case OP_COPY:
            memcpy(o->dst, o->src, o->len);
            break;
        case OP_HOST_FN:
            o->fn(o->data);
            break;
        case OP_WAIT: {
            unsigned spins = 0;
            while (!reached(__atomic_load_n(o->word, __ATOMIC_ACQUIRE), o->value, o->flags, o->mask)) {
                if (++spins > 1000) {
                    struct timespec t = {0, 20000};
                    nanosleep(&t, NULL);
                }
            }
            break;
        }
        }
        free(o);
        pthread_mutex_lock(&s->lock);
        s->running = 0;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->lock);
    }
}

static hipError_t push(hipStream_t s, struct op o) {
    if (!s) {
        return hipErrorInvalidHandle; /* the null stream is not faked */
    }
    struct op *n = malloc(sizeof *n);
    if (!n) {
        return hipErrorOutOfMemory;
    }
    *n = o;
    n->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail) {
        s->tail->next = n;
    } else {
        s->head = n;
    }
    s->tail = n;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    return hipSuccess;
}

hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned int flags) {
    if (!stream || flags > 1) {
        return hipErrorInvalidValue;
    }
    struct fake_stream *s = calloc(1, sizeof *s);
    if (!s) {
        return hipErrorOutOfMemory;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->device = current_device;
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        free(s);
        return hipErrorOutOfMemory;
    }
    *stream = s;
    return hipSuccess;
}

hipError_t hipStreamGetDevice(hipStream_t s, int *device) {
    if (!device) {
        return hipErrorInvalidValue;
    }
    /* The null stream is the current device's. */
    *device = s ? s->device : current_device;
    return hipSuccess;
}

hipError_t hipStreamSynchronize(hipStream_t s) {
    if (!s) {
        return hipErrorInvalidHandle;
    }
    pthread_mutex_lock(&s->lock);
    while (s->head || s->running) {
        pthread_cond_wait(&s->cv, &s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return hipSuccess;
}

hipError_t hipStreamDestroy(hipStream_t s) {
    if (!s) {
        return hipErrorInvalidHandle;
    }
    /* As HIP: queued work completes first. */
    hipStreamSynchronize(s);
    pthread_mutex_lock(&s->lock);
    s->closing = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cv);
    free(s);
    return hipSuccess;
}

hipError_t hipMemcpyHtoDAsync(void *dst, const void *src, size_t sizeBytes, hipStream_t stream) {
    if (!src || !is_kind(dst, sizeBytes, DEVICE) || is_kind(src, sizeBytes, DEVICE)) {
        return hipErrorInvalidValue;
    }
    if (stream && stream->device != current_device) {
        return hipErrorInvalidDevice;
    }
    return push(stream, (struct op){.kind = OP_COPY, .dst = dst, .src = src, .len = sizeBytes});
}

hipError_t hipMemcpyDtoHAsync(void *dst, void *src, size_t sizeBytes, hipStream_t stream) {
    if (!dst || !is_kind(src, sizeBytes, DEVICE) || is_kind(dst, sizeBytes, DEVICE)) {
        return hipErrorInvalidValue;
    }
    if (stream && stream->device != current_device) {
        return hipErrorInvalidDevice;
    }
    return push(stream, (struct op){.kind = OP_COPY, .dst = dst, .src = src, .len = sizeBytes});
}

hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void *userData) {
    if (!fn) {
        return hipErrorInvalidValue;
    }
    return push(stream, (struct op){.kind = OP_HOST_FN, .fn = fn, .data = userData});
}

hipError_t hipStreamWaitValue32(hipStream_t stream, void *ptr, uint32_t value, unsigned int flags,
                                uint32_t mask) {
    uint32_t *w = word_of(ptr);
    if (!w || flags > hipStreamWaitValueNor) {
        return hipErrorInvalidValue;
    }
    return push(stream, (struct op){.kind = OP_WAIT, .word = w, .value = value, .mask = mask, .flags = flags});
}
