// Staging: the tensors one op hands the core, as the op's executor sees them.
//
// The core reads and writes host memory only. For CPU tensors the core works
// on the user's tensors (each call returns its argument); for CUDA tensors
// each call returns a pinned host mirror of the user's tensor, which the
// CUDA executor fills before the core op (inputs) and copies back after it
// (in-out tensors), both on the group's communication stream. The entry
// points are written once against what these calls return, so a collective
// runs the same host code whichever device its tensors are on.
//
// The first tensor added fixes the op's device; every later one must be on
// the same device (else a c10::Error naming both).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace mooncake::pg {

class Staging {
public:
    using Tensors = std::vector<at::Tensor>;
    struct Entry {
        at::Tensor user;
        at::Tensor host;  // undefined for onDevice tensors
        // Copied back to `user` after the core op: the core wrote `host`.
        bool copy_out = false;
        // Filled from `user` before the core op.
        bool copy_in = true;
    };

    explicit Staging(const char* op) : op_(op) {}

    // Read by the core.
    at::Tensor in(const at::Tensor& user, const std::string& what);
    // Read and written by the core. Outputs are staged in-out as well: an
    // op may leave parts of an output untouched (blocks of inactive ranks),
    // and those must keep the user's values.
    at::Tensor inOut(const at::Tensor& user, const std::string& what);
    // Written whole by the core, never read (a P2P recv): no copy of the
    // user's old values, which could land after the core's writes.
    at::Tensor out(const at::Tensor& user, const std::string& what);
    Tensors in(const Tensors& users, const std::string& what);
    Tensors inOut(const Tensors& users, const std::string& what);
    // Read and written on the device by a kernel (route() chose kKernel):
    // no mirror, only held, with the same device check as the others.
    void onDevice(const at::Tensor& user, const std::string& what);

    // Whether the op's tensors are on a CUDA device (then entries() are the
    // mirrors to fill and drain).
    bool onCuda() const { return device_.has_value() && device_->is_cuda(); }
    c10::Device device() const { return device_.value_or(c10::Device(c10::kCPU)); }
    const std::vector<Entry>& entries() const { return entries_; }
    // Whether any entry has a host mirror to fill before the core runs
    // (mirrors of `out` tensors are not filled).
    bool hasMirrors() const;

    // The op runs on the device kernels, which a CUDA graph can capture
    // (CudaExecutor::issue refuses every other op under capture).
    void allowCapture() { capturable_ = true; }
    bool capturable() const { return capturable_; }
    // The op's device work goes on the caller's current stream instead of
    // the group's (a synchronous kernel op; mirrors would still use the
    // group's).
    void onCallerStream() { on_caller_stream_ = true; }
    bool callerStream() const { return on_caller_stream_; }
    // Whether the caller's stream is being captured, when the entry point
    // asked already (CudaExecutor::issue then need not ask again).
    void setCallerCapturing(bool capturing) { caller_capturing_ = capturing; }
    const std::optional<bool>& callerCapturing() const { return caller_capturing_; }
    const char* op() const { return op_; }

private:
    void checkDevice(const at::Tensor& user, const std::string& what);
    at::Tensor add(const at::Tensor& user, const std::string& what, bool copy_out,
                   bool copy_in = true);

    const char* op_;
    std::optional<c10::Device> device_;
    std::vector<Entry> entries_;
    bool capturable_ = false;
    bool on_caller_stream_ = false;
    std::optional<bool> caller_capturing_;
};

}  // namespace mooncake::pg
