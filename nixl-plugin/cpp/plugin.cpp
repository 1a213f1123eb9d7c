// The NIXL face of libplugin_UGDS.so: a subclass of NIXL's backend engine (declared in
// nixl_abi.h) whose every operation is one call into the Rust side (src/ffi.rs). Nothing is
// decided here: descriptor lists are flattened into plain arrays, results mapped back.
// No C++ exception leaves this file (NIXL's core and Rust are on either side).
#include "nixl_abi.h"

#include <cstring>
#include <new>

using namespace ugds_nixl::abi;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
void
BackendEngine::layoutCheck() {
    static_assert(offsetof(BackendEngine, backendType) == 0x08);
    static_assert(offsetof(BackendEngine, customParams) == 0x28);
    static_assert(offsetof(BackendEngine, telemetryEvents) == 0x60);
    static_assert(offsetof(BackendEngine, telemetryEventsMutex) == 0x78);
    static_assert(offsetof(BackendEngine, initErr) == 0xa0);
    static_assert(offsetof(BackendEngine, localAgent) == 0xa8);
    static_assert(offsetof(BackendEngine, enableTelemetry) == 0xc8);
}
#pragma GCC diagnostic pop

// One descriptor as the Rust side reads it (ffi.rs: Desc).
struct UgdsDesc {
    uint64_t addr;
    uint64_t len;
    uint64_t dev_id;
    void *md;
};

// The Rust side's functions (src/ffi.rs: Ops, in this order), set by ugds_nixl_cpp_plugin.
using Put = void (*)(void *ctx, const char *key, const char *value);
struct UgdsOps {
    void *(*engine_new)(const char *const *keys, const char *const *values, size_t n);
    void (*engine_free)(void *engine);
    int (*reg)(void *engine,
               int mem_type,
               uint64_t addr,
               uint64_t len,
               uint64_t dev_id,
               const char *meta,
               size_t meta_len,
               void **out);
    int (*dereg)(void *engine, void *md);
    int (*prep)(void *engine,
                int op,
                int local_type,
                const UgdsDesc *local,
                size_t n_local,
                int remote_type,
                const UgdsDesc *remote,
                size_t n_remote,
                void **out);
    int (*post)(void *engine, void *req);
    int (*check)(void *engine, void *req);
    int (*release)(void *engine, void *req);
    int (*query)(void *engine,
                 int mem_type,
                 uint64_t dev_id,
                 const char *meta,
                 size_t meta_len,
                 Put put,
                 void *ctx);
    void (*options)(Put put, void *ctx);
    const char *(*version)();
};

namespace {

const UgdsOps *ops = nullptr;

void
putParam(void *ctx, const char *key, const char *value) {
    static_cast<Params *>(ctx)->emplace(key, value);
}

// A registration: the Rust side's object.
class UgdsMD : public BackendMD {
public:
    void *rust;
    explicit UgdsMD(void *r) : BackendMD(true), rust(r) {}
};

// A prepared transfer: the Rust side's object.
class UgdsReqH : public BackendReqH {
public:
    void *rust;
    explicit UgdsReqH(void *r) : rust(r) {}
};

std::vector<UgdsDesc>
flatten(const DescList<MetaDesc> &l) {
    std::vector<UgdsDesc> out;
    out.reserve(l.descs.size());
    for (const MetaDesc &d : l.descs) {
        void *md = d.metadataP ? static_cast<UgdsMD *>(d.metadataP)->rust : nullptr;
        out.push_back(UgdsDesc{d.addr, d.len, d.devId, md});
    }
    return out;
}

class UgdsEngine : public BackendEngine {
    void *rust = nullptr;

public:
    explicit UgdsEngine(const InitParams *p) : BackendEngine(p) {
        std::vector<const char *> keys, values;
        for (const auto &kv : params()) {
            keys.push_back(kv.first.c_str());
            values.push_back(kv.second.c_str());
        }
        rust = ops->engine_new(keys.data(), values.data(), keys.size());
        initErr = rust == nullptr;
        setInitParam("ugds_version", ops->version());
        setInitParam("ugds_built_for_nixl", kNixlVersion);
    }

    ~UgdsEngine() override {
        ops->engine_free(rust);
    }

    bool
    supportsRemote() const override {
        return false;
    }
    bool
    supportsLocal() const override {
        return true;
    }
    bool
    supportsNotif() const override {
        return false;
    }
    MemList
    getSupportedMems() const override {
        return {DRAM_SEG, VRAM_SEG, BLK_SEG, FILE_SEG};
    }

    Status
    registerMem(const BlobDesc &mem, const MemType &type, BackendMD *&out) override {
        void *r = nullptr;
        int s = ops->reg(rust,
                                   type,
                                   mem.addr,
                                   mem.len,
                                   mem.devId,
                                   mem.metaInfo.data(),
                                   mem.metaInfo.size(),
                                   &r);
        if (s != NIXL_SUCCESS) {
            return Status(s);
        }
        out = new (std::nothrow) UgdsMD(r);
        if (!out) {
            ops->dereg(rust, r);
            return NIXL_ERR_BACKEND;
        }
        return NIXL_SUCCESS;
    }

    Status
    deregisterMem(BackendMD *meta) override {
        if (!meta) {
            return NIXL_ERR_INVALID_PARAM;
        }
        auto *md = static_cast<UgdsMD *>(meta);
        int s = ops->dereg(rust, md->rust);
        if (s == NIXL_SUCCESS) {
            delete md;
        }
        return Status(s);
    }

    Status
    connect(const std::string &) override {
        return NIXL_SUCCESS;
    }
    Status
    disconnect(const std::string &) override {
        return NIXL_SUCCESS;
    }
    // For local transfers the core asks for the target-side view of a registration: the same.
    Status
    loadLocalMD(BackendMD *input, BackendMD *&output) override {
        output = input;
        return NIXL_SUCCESS;
    }
    Status
    unloadMD(BackendMD *) override {
        return NIXL_SUCCESS;
    }

    Status
    prepXfer(const XferOp &op,
             const DescList<MetaDesc> &local,
             const DescList<MetaDesc> &remote,
             const std::string &remote_agent,
             BackendReqH *&handle,
             const OptArgs *) const override {
        if (remote_agent != localAgent) {
            return NIXL_ERR_NOT_SUPPORTED;
        }
        try {
            auto l = flatten(local);
            auto r = flatten(remote);
            void *req = nullptr;
            int s = ops->prep(
                rust, op, local.type, l.data(), l.size(), remote.type, r.data(), r.size(), &req);
            if (s != NIXL_SUCCESS) {
                return Status(s);
            }
            handle = new UgdsReqH(req);
            return NIXL_SUCCESS;
        }
        catch (const std::bad_alloc &) {
            return NIXL_ERR_BACKEND;
        }
    }

    Status
    postXfer(const XferOp &,
             const DescList<MetaDesc> &,
             const DescList<MetaDesc> &,
             const std::string &,
             BackendReqH *&handle,
             const OptArgs *) const override {
        if (!handle) {
            return NIXL_ERR_INVALID_PARAM;
        }
        return Status(ops->post(rust, static_cast<UgdsReqH *>(handle)->rust));
    }

    Status
    checkXfer(BackendReqH *handle) const override {
        if (!handle) {
            return NIXL_ERR_INVALID_PARAM;
        }
        return Status(ops->check(rust, static_cast<UgdsReqH *>(handle)->rust));
    }

    Status
    releaseReqH(BackendReqH *handle) const override {
        if (!handle) {
            return NIXL_ERR_INVALID_PARAM;
        }
        auto *h = static_cast<UgdsReqH *>(handle);
        int s = ops->release(rust, h->rust);
        delete h;
        return Status(s);
    }

    // Per descriptor: the target it names, its path (direct, remote, fallback) and capacity.
    Status
    queryMem(const DescList<BlobDesc> &descs, std::vector<QueryResp> &resp) const override {
        try {
            resp.clear();
            for (const BlobDesc &d : descs.descs) {
                Params p;
                int found = ops->query(rust,
                                            descs.type,
                                            d.devId,
                                            d.metaInfo.data(),
                                            d.metaInfo.size(),
                                            putParam,
                                            &p);
                if (found == 1) {
                    resp.emplace_back(std::move(p));
                } else {
                    resp.emplace_back(std::nullopt);
                }
            }
            return NIXL_SUCCESS;
        }
        catch (const std::bad_alloc &) {
            return NIXL_ERR_BACKEND;
        }
    }
};

BackendEngine *
createEngine(const InitParams *p) {
    try {
        return new UgdsEngine(p);
    }
    catch (...) {
        return nullptr;
    }
}

void
destroyEngine(BackendEngine *e) {
    delete e;
}

const char *
pluginName() {
    return "UGDS";
}

const char *
pluginVersion() {
    return ops->version();
}

Params
backendOptions() {
    Params p;
    ops->options(putParam, &p);
    return p;
}

MemList
backendMems() {
    return {DRAM_SEG, VRAM_SEG, BLK_SEG, FILE_SEG};
}

Plugin plugin = {kPluginApiVersion,
                 createEngine,
                 destroyEngine,
                 pluginName,
                 pluginVersion,
                 backendOptions,
                 backendMems};

} // namespace

// Called by nixl_plugin_init (src/lib.rs) once its load checks passed, with the Rust side's
// functions.
extern "C" void *
ugds_nixl_cpp_plugin(const UgdsOps *rust_ops) {
    ops = rust_ops;
    return &plugin;
}

// The NIXL release and plugin API this file was built for (the load checks name them).
extern "C" const char *
ugds_nixl_cpp_nixl_version() {
    return kNixlVersion;
}

extern "C" int
ugds_nixl_cpp_api_version() {
    return kPluginApiVersion;
}
