// Our own declaration of the part of NIXL's backend plugin ABI that libplugin_UGDS.so touches.
//
// It matches NIXL 1.5.1 (the PyPI wheel nixl-cu12 1.5.1, built with GCC 14 against libstdc++'s
// C++11 ABI), plugin API version 1. What it must agree on with the NIXL that loads the plugin:
// - the enums' values (memory segment types, transfer operations, status codes);
// - the data layout of the engine base class, which NIXL's core reads through its own inline
//   accessors (backend type, custom parameters, init error flag, local agent name), and of
//   the init parameters, descriptors and descriptor lists it hands to the engine;
// - the order of the engine's virtual functions (27 vtable slots, destructors first);
// - the plugin record that nixl_plugin_init returns.
// The offsets below were read off NIXL 1.5.1's own POSIX plugin (its constructor's stores and
// its vtable's relocations) and are checked at compile time. NIXL's headers are not used.
// Nothing here is defined by NIXL at link time: the plugin links no NIXL library.
#ifndef UGDS_NIXL_ABI_H
#define UGDS_NIXL_ABI_H

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ugds_nixl::abi {

// The NIXL release whose ABI this file declares.
inline constexpr const char *kNixlVersion = "1.5.1";
// NIXL's NIXL_PLUGIN_API_VERSION for backend plugins in that release.
inline constexpr int kPluginApiVersion = 1;

enum MemType : int { DRAM_SEG = 0, VRAM_SEG = 1, BLK_SEG = 2, OBJ_SEG = 3, FILE_SEG = 4 };
enum XferOp : int { NIXL_READ = 0, NIXL_WRITE = 1 };
enum Status : int {
    NIXL_IN_PROG = 1,
    NIXL_SUCCESS = 0,
    NIXL_ERR_NOT_POSTED = -1,
    NIXL_ERR_INVALID_PARAM = -2,
    NIXL_ERR_BACKEND = -3,
    NIXL_ERR_NOT_FOUND = -4,
    NIXL_ERR_MISMATCH = -5,
    NIXL_ERR_NOT_ALLOWED = -6,
    NIXL_ERR_REPOST_ACTIVE = -7,
    NIXL_ERR_UNKNOWN = -8,
    NIXL_ERR_NOT_SUPPORTED = -9,
};
enum class ThreadSync : int { None = 0, Strict = 1, Rw = 2 };

using Params = std::unordered_map<std::string, std::string>;
using MemList = std::vector<MemType>;
using QueryResp = std::optional<Params>;

// The init parameters NIXL's core hands to the engine's constructor.
struct InitParams {
    std::string localAgent;
    std::string type;
    Params *customParams;
    bool enableProgTh;
    uint64_t pthrDelay;
    ThreadSync syncMode;
    bool enableTelemetry;
};
static_assert(offsetof(InitParams, type) == 0x20);
static_assert(offsetof(InitParams, customParams) == 0x40);
static_assert(offsetof(InitParams, syncMode) == 0x58);
static_assert(offsetof(InitParams, enableTelemetry) == 0x5c);

struct BasicDesc {
    uintptr_t addr;
    size_t len;
    uint64_t devId;
};

struct BlobDesc : BasicDesc {
    std::string metaInfo;
};

// The common base of what registerMem hands back (the core keeps the pointer).
class BackendMD {
protected:
    bool isPrivateMD;

public:
    explicit BackendMD(bool is_private) : isPrivateMD(is_private) {}
    virtual ~BackendMD() {}
};

// The common base of a request handle.
class BackendReqH {
public:
    virtual ~BackendReqH() {}
};

struct MetaDesc : BasicDesc {
    BackendMD *metadataP;
};
static_assert(sizeof(MetaDesc) == 32);

struct RemoteMetaDesc : MetaDesc {
    std::string remoteAgent;
};

// A descriptor list as the core builds it: a vtable (the core's), the segment type, the
// descriptors. Only read here, never made, copied or destroyed: no virtual functions declared.
template<class T> struct DescList {
    const void *vtable;
    MemType type;
    std::vector<T> descs;
};
static_assert(offsetof(DescList<MetaDesc>, type) == 8);
static_assert(offsetof(DescList<MetaDesc>, descs) == 16);

// Optional arguments of a transfer (notifications, which this backend does not support).
struct OptArgs {
    std::string notifMsg;
    bool hasNotif;
    std::string customParam;
};

// What the core's telemetry vector holds (an event type and a value); the engine never adds
// one (only its own code could), so the vector stays empty and no element is touched here.
struct TelemetryEvent {
    uint32_t type;
    uint64_t value;
};
static_assert(sizeof(TelemetryEvent) == 16);

// The engine base class: its members (which the core reads through its inline accessors)
// and its virtual functions, in NIXL 1.5.1's order. The defaults return what NIXL's do.
class BackendEngine {
private:
    std::string backendType;
    Params customParams;
    std::vector<TelemetryEvent> telemetryEvents;
    std::mutex telemetryEventsMutex;

protected:
    bool initErr = false;
    const std::string localAgent;
    const bool enableTelemetry;

    // Adds a key to the parameters the core reports for this backend (an existing key stays).
    void
    setInitParam(const std::string &key, const std::string &value) {
        customParams.emplace(key, value);
    }

public:
    explicit BackendEngine(const InitParams *p)
        : backendType(p->type),
          customParams(*p->customParams),
          localAgent(p->localAgent),
          enableTelemetry(p->enableTelemetry) {}
    BackendEngine(const BackendEngine &) = delete;
    void
    operator=(const BackendEngine &) = delete;

    const Params &
    params() const noexcept {
        return customParams;
    }

    // The members' offsets, as NIXL 1.5.1's core reads them (static_asserts in plugin.cpp).
    static void
    layoutCheck();

    // Slots 0 and 1: the complete and the deleting destructor.
    virtual ~BackendEngine() = default;
    // 2-5
    virtual bool
    supportsRemote() const = 0;
    virtual bool
    supportsLocal() const = 0;
    virtual bool
    supportsNotif() const = 0;
    virtual MemList
    getSupportedMems() const = 0;
    // 6-10
    virtual Status
    registerMem(const BlobDesc &mem, const MemType &type, BackendMD *&out) = 0;
    virtual Status
    deregisterMem(BackendMD *meta) = 0;
    virtual Status
    connect(const std::string &remote_agent) = 0;
    virtual Status
    disconnect(const std::string &remote_agent) = 0;
    virtual Status
    unloadMD(BackendMD *input) = 0;
    // 11-14
    virtual Status
    prepXfer(const XferOp &op,
             const DescList<MetaDesc> &local,
             const DescList<MetaDesc> &remote,
             const std::string &remote_agent,
             BackendReqH *&handle,
             const OptArgs *opt_args) const = 0;
    virtual Status
    postXfer(const XferOp &op,
             const DescList<MetaDesc> &local,
             const DescList<MetaDesc> &remote,
             const std::string &remote_agent,
             BackendReqH *&handle,
             const OptArgs *opt_args) const = 0;
    virtual Status
    checkXfer(BackendReqH *handle) const = 0;
    virtual Status
    releaseReqH(BackendReqH *handle) const = 0;
    // 15-17: memory views (remote, then local), release.
    virtual Status
    prepMemView(const DescList<RemoteMetaDesc> &, void *&, const OptArgs *) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual Status
    prepMemView(const DescList<MetaDesc> &, void *&, const OptArgs *) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual void
    releaseMemView(void *) const {}
    // 18-21: remote operation (not supported here).
    virtual Status
    getPublicData(const BackendMD *, std::string &) const {
        return NIXL_ERR_BACKEND;
    }
    virtual Status
    getConnInfo(std::string &) const {
        return NIXL_ERR_BACKEND;
    }
    virtual Status
    loadRemoteConnInfo(const std::string &, const std::string &) {
        return NIXL_ERR_BACKEND;
    }
    virtual Status
    loadRemoteMD(const BlobDesc &, const MemType &, const std::string &, BackendMD *&) {
        return NIXL_ERR_BACKEND;
    }
    // 22
    virtual Status
    loadLocalMD(BackendMD *, BackendMD *&) {
        return NIXL_ERR_BACKEND;
    }
    // 23-24: notifications (not supported here).
    virtual Status
    getNotifs(std::vector<std::pair<std::string, std::string>> &) {
        return NIXL_ERR_BACKEND;
    }
    virtual Status
    genNotif(const std::string &, const std::string &) const {
        return NIXL_ERR_BACKEND;
    }
    // 25
    virtual Status
    queryMem(const DescList<BlobDesc> &, std::vector<QueryResp> &) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    // 26: the cost estimate (duration, error margin, method, the agent's optional arguments).
    virtual Status
    estimateXferCost(const XferOp &,
                     const DescList<MetaDesc> &,
                     const DescList<MetaDesc> &,
                     const std::string &,
                     BackendReqH *const &,
                     std::chrono::microseconds &,
                     std::chrono::microseconds &,
                     int &,
                     const void *) const {
        return NIXL_ERR_NOT_SUPPORTED;
    }
};

// The plugin record nixl_plugin_init returns (the core checks api_version first).
struct Plugin {
    int api_version;
    BackendEngine *(*create_engine)(const InitParams *init_params);
    void (*destroy_engine)(BackendEngine *engine);
    const char *(*get_plugin_name)();
    const char *(*get_plugin_version)();
    Params (*get_backend_options)();
    MemList (*get_backend_mems)();
};

} // namespace ugds_nixl::abi

#endif
