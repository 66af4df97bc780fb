// libibverbs, loaded from libibverbs.so.1 at run time so the transfer engine
// links and runs on hosts without rdma-core (the headers are needed only to
// build). Only the calls the rdma transport makes are resolved; the data-path
// calls (ibv_post_send, ibv_poll_cq) are inline in verbs.h and go through the
// provider's function table, so they need no symbol. Never throws.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::rdma {

struct VerbsApi {
    // decltype ties each pointer to verbs.h. Taking the address of a name that
    // verbs.h also defines as a function-like macro (ibv_reg_mr,
    // ibv_query_port) names the exported function, not the macro.
    decltype(&::ibv_get_device_list) getDeviceList;
    decltype(&::ibv_free_device_list) freeDeviceList;
    decltype(&::ibv_get_device_name) getDeviceName;
    decltype(&::ibv_open_device) openDevice;
    decltype(&::ibv_close_device) closeDevice;
    decltype(&::ibv_query_device) queryDevice;
    decltype(&::ibv_query_port) queryPort;
    decltype(&::ibv_query_gid) queryGid;
    decltype(&::ibv_alloc_pd) allocPd;
    decltype(&::ibv_dealloc_pd) deallocPd;
    decltype(&::ibv_reg_mr) regMr;
    decltype(&::ibv_dereg_mr) deregMr;
    decltype(&::ibv_create_cq) createCq;
    decltype(&::ibv_destroy_cq) destroyCq;
    decltype(&::ibv_create_qp) createQp;
    decltype(&::ibv_modify_qp) modifyQp;
    decltype(&::ibv_destroy_qp) destroyQp;
    decltype(&::ibv_wc_status_str) wcStatusStr;
    // Optional (rdma-core >= 34 and a kernel with dma-buf support); nullptr
    // when absent: device memory then goes through host staging.
    decltype(&::ibv_reg_dmabuf_mr) regDmabufMr;

    // ibv_query_port as verbs.h's inline wrapper does it: the provider's
    // extended call when it has one (full struct), else the exported one.
    int portAttributes(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) const;

    // The library (libibverbs.so.1, or $MC_RDMA_VERBS_LIBRARY), loaded once
    // per process; kUnavailable naming why
    // (library missing, a symbol missing) otherwise.
    static Result<const VerbsApi*> get();
    // Loads from `library` (tests use a name that does not exist).
    static Result<VerbsApi> load(const char* library);
    // get() for "", else `library` loaded and kept for the process (a test's
    // library, loaded once per call).
    static Result<const VerbsApi*> getOrLoad(const std::string& library);
};

// The Status for a failed verbs call: the call, the errno name and text, and
// a code chosen by errno (see the table in verbs_api.cc). `detail` says what
// the call was for ("device mlx5_0 port 1").
Status verbsError(const std::string& call, int err, const std::string& detail = "");

// The Status for a work completion (IBV_WC_SUCCESS → OK). Errors that mean the
// peer (or the path to it) failed map to kPeerFailure, flushes after an
// earlier error to kAborted, our own bad requests to kInvalidArgument or
// kOutOfRange. `status_text` is ibv_wc_status_str's text when loaded.
Status completionError(int wc_status, const char* status_text, const std::string& detail);

// errno's symbolic name ("ENOMEM"), or "errno <n>".
std::string errnoName(int err);

}  // namespace mooncake::te::rdma
