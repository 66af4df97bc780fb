#include "mooncake-pg/torch/collective_tensors.h"

#include <string>

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/torch/backend.h"

namespace mooncake::pg::collective_tensors {

namespace {
alignas(64) uint8_t kNoData[64];
}  // namespace

void* ptrOf(const at::Tensor& t) {
    void* p = t.data_ptr();
    return p != nullptr ? p : kNoData;
}

size_t bytesOf(const at::Tensor& t) {
    return static_cast<size_t>(t.numel()) * t.element_size();
}

at::Tensor inOutBuffer(const at::Tensor& t) {
    return t.is_contiguous() ? t : t.contiguous();
}

at::Tensor outBuffer(const at::Tensor& t) {
    return t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
}

at::Tensor inBuffer(const at::Tensor& t, const at::Tensor& output) {
    if (output.defined() && at::get_overlap_status(t, output) != at::MemOverlapStatus::No) {
        return t.clone(at::MemoryFormat::Contiguous);
    }
    return t.is_contiguous() ? t : t.contiguous();
}

void copyBack(const at::Tensor& user, const at::Tensor& buffer) {
    if (!buffer.is_same(user))
        user.copy_(buffer);
}

uint64_t shapeSignature(const at::Tensor& t) {
    constexpr uint64_t kOffset = 1469598103934665603ull;
    constexpr uint64_t kPrime = 1099511628211ull;
    uint64_t h = kOffset;
    auto mix = [&](int64_t v) {
        for (int i = 0; i < 8; ++i) {
            h ^= static_cast<uint64_t>(v >> (8 * i)) & 0xff;
            h *= kPrime;
        }
    };
    mix(static_cast<int64_t>(t.scalar_type()));
    mix(t.dim());
    for (int64_t s : t.sizes())
        mix(s);
    return h | 1;
}

at::Tensor block(const at::Tensor& flat, int64_t r, const at::Tensor& like) {
    return flat.narrow(0, r * like.numel(), like.numel()).view(like.sizes());
}

at::Tensor pack(const Tensors& parts, const at::TensorOptions& options) {
    int64_t total = 0;
    for (const auto& p : parts)
        total += p.numel();
    at::Tensor flat = at::empty({total}, options);
    int64_t offset = 0;
    for (const auto& p : parts) {
        flat.narrow(0, offset, p.numel()).view(p.sizes()).copy_(p);
        offset += p.numel();
    }
    return flat;
}

void checkOutputDtype(const at::Tensor& output, const at::Tensor& input, const char* op) {
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "Mooncake PG: ", op,
                ": output tensor has dtype ", dtypeName(output.scalar_type()),
                " but the input has ", dtypeName(input.scalar_type()));
}

void checkGroupMultiple(const at::Tensor& whole, const char* whole_name, const at::Tensor& part,
                        const char* part_name, int group_size, const char* op) {
    TORCH_CHECK(whole.numel() == part.numel() * group_size, "Mooncake PG: ", op, ": ", whole_name,
                " tensor has ", whole.numel(), " elements; expected ", part_name, " elements (",
                part.numel(), ") x group size (", group_size, ") = ", part.numel() * group_size);
}

void checkOnePerInput(const Tensors& outputs, const Tensors& inputs, const char* op) {
    TORCH_CHECK(outputs.size() == inputs.size(), "Mooncake PG: ", op, ": ", outputs.size(),
                " outputs for ", inputs.size(), " inputs; expected one output per input");
}

}  // namespace mooncake::pg::collective_tensors

namespace mooncake::pg {

// The MooncakeBackend checks that only the collective entry points use.

// Every size, dtype and element count first, then each tensor's device and
// layout, so the first mismatch reported is the same whatever the devices.
void MooncakeBackend::checkPerRankList(const collective_tensors::Tensors& list,
                                       const at::Tensor& like, const char* op,
                                       const char* list_name) const {
    TORCH_CHECK(static_cast<int>(list.size()) == groupSize(), "Mooncake PG: ", op, ": ", list_name,
                " has ", list.size(), " tensors; expected one per rank of the group (", groupSize(),
                ")");
    for (size_t r = 0; r < list.size(); ++r) {
        TORCH_CHECK(list[r].defined() && list[r].scalar_type() == like.scalar_type(),
                    "Mooncake PG: ", op, ": ", list_name, "[", r, "] has dtype ",
                    list[r].defined() ? dtypeName(list[r].scalar_type()) : "undefined",
                    "; expected ", dtypeName(like.scalar_type()), " like the local tensor");
        TORCH_CHECK(list[r].numel() == like.numel(), "Mooncake PG: ", op, ": ", list_name, "[", r,
                    "] has ", list[r].numel(), " elements; expected ", like.numel(),
                    " like the local tensor");
    }
    for (size_t r = 0; r < list.size(); ++r) {
        checkTensor(list[r], op, std::string(list_name) + "[" + std::to_string(r) + "]");
    }
}

DataType MooncakeBackend::checkInOut(const at::Tensor& input, const at::Tensor& output,
                                     const char* op, const std::string& input_what,
                                     const std::string& output_what) const {
    checkTensor(input, op, input_what);
    checkTensor(output, op, output_what);
    return checkDtype(input, op, input_what);
}

}  // namespace mooncake::pg
