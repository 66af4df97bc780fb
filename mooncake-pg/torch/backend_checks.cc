// MooncakeBackend's torch-boundary checks shared by every op: each throws
// c10::Error naming the op, the argument, its value and what was expected,
// before anything is transferred.
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/torch/backend.h"

namespace mooncake::pg {

// ---------------------------------------------------------------------------
// Torch-boundary checks.

void MooncakeBackend::checkOpen(const char* op) const {
    TORCH_CHECK(!closed_.load(), "Mooncake PG: ", op, " on group '", config_.group_name,
                "' after the group was shut down or aborted");
}

void MooncakeBackend::checkSingle(const std::vector<at::Tensor>& tensors, const char* op) const {
    TORCH_CHECK(tensors.size() == 1, "Mooncake PG: ", op,
                " takes exactly one tensor per call, got a list of ", tensors.size());
}

void MooncakeBackend::checkRank(int64_t rank, const char* op, const char* what) const {
    TORCH_CHECK(rank >= 0 && rank < groupSize(), "Mooncake PG: ", op, ": ", what, " rank ", rank,
                " is outside the group's ranks [0, ", groupSize(), ")");
}

void MooncakeBackend::checkTensor(const at::Tensor& t, const char* op,
                                  const std::string& what) const {
    TORCH_CHECK(t.defined(), "Mooncake PG: ", op, ": ", what, " is an undefined tensor");
    if (t.is_cuda()) {
        TORCH_CHECK(config_.is_cuda, "Mooncake PG: backend 'mooncake-cpu' takes CPU tensors, but ",
                    what, " of ", op, " is on ", t.device().str(),
                    "; move it to CPU, or use backend='mooncake' for CUDA tensors");
    } else {
        TORCH_CHECK(t.is_cpu(), "Mooncake PG: ", op, ": ", what, " is on device ", t.device().str(),
                    "; expected a ", config_.is_cuda ? "CUDA or CPU" : "CPU", " tensor");
    }
    TORCH_CHECK(t.layout() == at::kStrided, "Mooncake PG: ", op, ": ", what, " has layout ",
                t.layout(), "; only dense (strided) tensors are supported");
}

DataType MooncakeBackend::checkDtype(const at::Tensor& t, const char* op,
                                     const std::string& what) const {
    switch (t.scalar_type()) {
        case at::kFloat:
            return DataType::kFloat32;
        case at::kDouble:
            return DataType::kFloat64;
        case at::kHalf:
            return DataType::kFloat16;
        case at::kBFloat16:
            return DataType::kBFloat16;
        case at::kChar:
            return DataType::kInt8;
        case at::kByte:
            return DataType::kUInt8;
        case at::kShort:
            return DataType::kInt16;
        case at::kInt:
            return DataType::kInt32;
        case at::kLong:
            return DataType::kInt64;
        case at::kBool:
            return DataType::kBool;
        default:
            break;
    }
    TORCH_CHECK(false, "Mooncake PG: ", op, ": ", what, " has dtype ", dtypeName(t.scalar_type()),
                "; supported dtypes are float32, float64, float16, bfloat16, int8, uint8, int16, "
                "int32, int64 and bool");
}

ReduceOp MooncakeBackend::checkReduceOp(const c10d::ReduceOp& op, DataType dtype,
                                        const char* op_name) const {
    struct Entry {
        c10d::ReduceOp::RedOpType torch_op;
        ReduceOp core;
        const char* name;
    };
    static constexpr Entry kOps[] = {
        {c10d::ReduceOp::SUM, ReduceOp::kSum, "SUM"},
        {c10d::ReduceOp::AVG, ReduceOp::kAvg, "AVG"},
        {c10d::ReduceOp::PRODUCT, ReduceOp::kProduct, "PRODUCT"},
        {c10d::ReduceOp::MIN, ReduceOp::kMin, "MIN"},
        {c10d::ReduceOp::MAX, ReduceOp::kMax, "MAX"},
        {c10d::ReduceOp::BAND, ReduceOp::kBand, "BAND"},
        {c10d::ReduceOp::BOR, ReduceOp::kBor, "BOR"},
        {c10d::ReduceOp::BXOR, ReduceOp::kBxor, "BXOR"},
    };
    if (op.op_ == c10d::ReduceOp::PREMUL_SUM) {
        // Runs as SUM over inputs multiplied by the factor first
        // (premultiplied()), as NCCL defines it: floating-point inputs only.
        TORCH_CHECK(isFloatingPoint(dtype), "Mooncake PG: ", op_name,
                    ": ReduceOp.PREMUL_SUM is not supported for dtype torch.", dataTypeName(dtype),
                    " (its factor multiplies floating-point inputs only)");
        TORCH_CHECK(op.supplement_.defined(), "Mooncake PG: ", op_name,
                    ": ReduceOp.PREMUL_SUM carries no factor; make it with "
                    "torch.distributed._make_nccl_premul_sum(factor)");
        return ReduceOp::kSum;
    }
    for (const Entry& e : kOps) {
        if (e.torch_op != op.op_)
            continue;
        std::string why;
        if (!reduceOpSupported(e.core, dtype, &why)) {
            // Keep the core's reason, but name the op and dtype as torch does.
            const size_t cut = why.rfind(": ");
            TORCH_CHECK(false, "Mooncake PG: ", op_name, ": ReduceOp.", e.name,
                        " is not supported for dtype torch.", dataTypeName(dtype), " (",
                        cut == std::string::npos ? why : why.substr(cut + 2), ")");
        }
        return e.core;
    }
    TORCH_CHECK(false, "Mooncake PG: ", op_name, ": ReduceOp ", static_cast<int>(op.op_),
                " is not supported; use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR or "
                "PREMUL_SUM");
}

at::Tensor MooncakeBackend::premultiplied(const c10d::ReduceOp& op, const at::Tensor& t,
                                          bool in_place, const char* op_name) const {
    if (op.op_ != c10d::ReduceOp::PREMUL_SUM)
        return t;
    if (in_place)
        checkOpen(op_name);
    // checkReduceOp() has seen the supplement; torch makes it only through
    // _make_nccl_premul_sum, as this type (its own backend casts it alike).
    const auto& factor = static_cast<const c10d::NCCLPreMulSumSupplement&>(*op.supplement_);
    at::NoGradGuard no_grad;
    if (factor.tensor_factor.defined()) {
        // One element (torch checks), on any device: a CUDA factor is read in
        // the caller's stream order, never on the host.
        const at::Tensor f = factor.tensor_factor.to(t.device(), t.scalar_type()).reshape({});
        return in_place ? t.mul_(f) : t.mul(f);
    }
    const at::Scalar f(factor.double_factor);
    return in_place ? t.mul_(f) : t.mul(f);
}

std::chrono::milliseconds MooncakeBackend::opTimeout(std::chrono::milliseconds requested) const {
    if (requested.count() > 0)
        return requested;
    return std::chrono::milliseconds(timeout_ms_.load());
}

}  // namespace mooncake::pg
