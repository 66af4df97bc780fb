#include "mooncake-transfer-engine/transport/rdma/verbs_api.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>

#include "mooncake-transfer-engine/common/env.h"

namespace mooncake::te::rdma {

Result<VerbsApi> VerbsApi::load(const char* library) {
    void* lib = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char* why = ::dlerror();
        return Unavailable(
            std::string("the verbs library is missing (rdma-core not installed?): ") +
            (why ? why : "dlopen failed"));
    }
    // Stays loaded for the life of the process: providers keep pointers into it.
    VerbsApi api{};
    std::string missing;
    auto resolve = [&](auto& fn, const char* name, bool required) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
        if (!fn && required)
            missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    resolve(api.getDeviceList, "ibv_get_device_list", true);
    resolve(api.freeDeviceList, "ibv_free_device_list", true);
    resolve(api.getDeviceName, "ibv_get_device_name", true);
    resolve(api.openDevice, "ibv_open_device", true);
    resolve(api.closeDevice, "ibv_close_device", true);
    resolve(api.queryDevice, "ibv_query_device", true);
    resolve(api.queryPort, "ibv_query_port", true);
    resolve(api.queryGid, "ibv_query_gid", true);
    resolve(api.allocPd, "ibv_alloc_pd", true);
    resolve(api.deallocPd, "ibv_dealloc_pd", true);
    resolve(api.regMr, "ibv_reg_mr", true);
    resolve(api.deregMr, "ibv_dereg_mr", true);
    resolve(api.createCq, "ibv_create_cq", true);
    resolve(api.destroyCq, "ibv_destroy_cq", true);
    resolve(api.createQp, "ibv_create_qp", true);
    resolve(api.modifyQp, "ibv_modify_qp", true);
    resolve(api.destroyQp, "ibv_destroy_qp", true);
    resolve(api.wcStatusStr, "ibv_wc_status_str", true);
    resolve(api.regDmabufMr, "ibv_reg_dmabuf_mr", false);
    if (!missing.empty())
        return Unavailable(std::string(library) + " lacks " + missing + " (rdma-core too old?)");
    return api;
}

Result<const VerbsApi*> VerbsApi::get() {
    // MC_RDMA_VERBS_LIBRARY: another verbs library (the tests' fake one).
    static const Result<VerbsApi> loaded =
        load(envString("MC_RDMA_VERBS_LIBRARY", "libibverbs.so.1").c_str());
    if (!loaded.ok())
        return loaded.status();
    return &loaded.value();
}

Result<const VerbsApi*> VerbsApi::getOrLoad(const std::string& library) {
    if (library.empty())
        return get();
    auto loaded = load(library.c_str());
    if (!loaded.ok())
        return loaded.status();
    return new VerbsApi(loaded.value());
}

int VerbsApi::portAttributes(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) const {
    std::memset(attr, 0, sizeof(*attr));
    if (verbs_context* vctx = verbs_get_ctx_op(ctx, query_port))
        return vctx->query_port(ctx, port, attr, sizeof(*attr));
    return queryPort(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

std::string errnoName(int err) {
    switch (err) {
        case EPERM:
            return "EPERM";
        case ENOENT:
            return "ENOENT";
        case EINTR:
            return "EINTR";
        case EIO:
            return "EIO";
        case ENXIO:
            return "ENXIO";
        case EBADF:
            return "EBADF";
        case EAGAIN:
            return "EAGAIN";
        case ENOMEM:
            return "ENOMEM";
        case EACCES:
            return "EACCES";
        case EFAULT:
            return "EFAULT";
        case EBUSY:
            return "EBUSY";
        case EEXIST:
            return "EEXIST";
        case ENODEV:
            return "ENODEV";
        case EINVAL:
            return "EINVAL";
        case ENFILE:
            return "ENFILE";
        case EMFILE:
            return "EMFILE";
        case ENOSPC:
            return "ENOSPC";
        case ERANGE:
            return "ERANGE";
        case ENOSYS:
            return "ENOSYS";
        case EPROTONOSUPPORT:
            return "EPROTONOSUPPORT";
        case EOPNOTSUPP:
            return "EOPNOTSUPP";
        case ENETDOWN:
            return "ENETDOWN";
        case ENETUNREACH:
            return "ENETUNREACH";
        case ECONNRESET:
            return "ECONNRESET";
        case ETIMEDOUT:
            return "ETIMEDOUT";
        case ECONNREFUSED:
            return "ECONNREFUSED";
        case EHOSTUNREACH:
            return "EHOSTUNREACH";
        default:
            return "errno " + std::to_string(err);
    }
}

namespace {

// errno → code. The verbs calls report through errno (or return it, like
// ibv_modify_qp); what the caller can do about it decides the code.
StatusCode codeForErrno(int err) {
    switch (err) {
        // A bad attribute, address or handle: ours to fix.
        case EINVAL:
        case EFAULT:
        case EBADF:
        case ERANGE:
            return StatusCode::kInvalidArgument;
        // Locked-memory limit (ulimit -l), /dev/infiniband permissions.
        case EPERM:
        case EACCES:
            return StatusCode::kPermissionDenied;
        // The device, driver or kernel cannot do it, or is out of resources:
        // the host is not fit for RDMA, tcp remains.
        case ENODEV:
        case ENXIO:
        case ENOENT:
        case ENOSYS:
        case EOPNOTSUPP:
        case EPROTONOSUPPORT:
        case ENOMEM:
        case ENOSPC:
        case EMFILE:
        case ENFILE:
        case EAGAIN:
        case EBUSY:
            return StatusCode::kUnavailable;
        case ETIMEDOUT:
            return StatusCode::kTimeout;
        // The fabric or the peer.
        case ENETDOWN:
        case ENETUNREACH:
        case EHOSTUNREACH:
        case ECONNRESET:
        case ECONNREFUSED:
        case EIO:
            return StatusCode::kPeerFailure;
        default:
            return StatusCode::kInternal;
    }
}

}  // namespace

Status verbsError(const std::string& call, int err, const std::string& detail) {
    std::string message = call + " failed: " + errnoName(err) + " (" + std::strerror(err) + ")";
    if (!detail.empty())
        message += " for " + detail;
    if (err == ENOMEM || err == EPERM)
        message += "; check `ulimit -l` (registered memory is locked) and /dev/infiniband access";
    return Status(codeForErrno(err), std::move(message));
}

Status completionError(int wc_status, const char* status_text, const std::string& detail) {
    if (wc_status == IBV_WC_SUCCESS)
        return Status::OK();
    StatusCode code = StatusCode::kInternal;
    switch (wc_status) {
        // The request itself was wrong on our side.
        case IBV_WC_LOC_LEN_ERR:
        case IBV_WC_LOC_QP_OP_ERR:
        case IBV_WC_LOC_EEC_OP_ERR:
        case IBV_WC_MW_BIND_ERR:
        case IBV_WC_LOC_RDD_VIOL_ERR:
            code = StatusCode::kInvalidArgument;
            break;
        // Keys or bounds: the local or remote region does not allow it.
        case IBV_WC_LOC_PROT_ERR:
        case IBV_WC_LOC_ACCESS_ERR:
        case IBV_WC_REM_ACCESS_ERR:
        case IBV_WC_REM_INV_RD_REQ_ERR:
            code = StatusCode::kOutOfRange;
            break;
        // An earlier error moved the QP to ERROR; this request never ran.
        case IBV_WC_WR_FLUSH_ERR:
            code = StatusCode::kAborted;
            break;
        // The peer is gone, stalled, or refused the operation.
        case IBV_WC_BAD_RESP_ERR:
        case IBV_WC_REM_INV_REQ_ERR:
        case IBV_WC_REM_OP_ERR:
        case IBV_WC_RETRY_EXC_ERR:
        case IBV_WC_RNR_RETRY_EXC_ERR:
        case IBV_WC_REM_ABORT_ERR:
        case IBV_WC_INV_EECN_ERR:
        case IBV_WC_INV_EEC_STATE_ERR:
        case IBV_WC_RESP_TIMEOUT_ERR:
            code = StatusCode::kPeerFailure;
            break;
        case IBV_WC_FATAL_ERR:
        case IBV_WC_GENERAL_ERR:
        case IBV_WC_TM_ERR:
        case IBV_WC_TM_RNDV_INCOMPLETE:
        default:
            code = StatusCode::kInternal;
            break;
    }
    std::string message =
        "work completion failed: " + std::string(status_text ? status_text : "status") + " (" +
        std::to_string(wc_status) + ")";
    if (!detail.empty())
        message += " for " + detail;
    return Status(code, std::move(message));
}

}  // namespace mooncake::te::rdma
