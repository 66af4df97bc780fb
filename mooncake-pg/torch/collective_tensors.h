// Internal to the collective entry points (backend_gathers.cc,
// backend_reductions.cc, backend_all_to_all.cc): the contiguous buffers the
// core reads and writes in place of the user's tensors, and the argument
// checks several ops share. Checks throw c10::Error naming the op, the
// argument, its value and what was expected. The MooncakeBackend checks only
// these files use (checkPerRankList, checkInOut) are defined in
// collective_tensors.cc too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace mooncake::pg::collective_tensors {

using Tensors = std::vector<at::Tensor>;

// The core takes raw pointers; an empty tensor may have none, so it gets the
// address of a static dummy block instead.
void* ptrOf(const at::Tensor& t);
size_t bytesOf(const at::Tensor& t);

// A contiguous stand-in the core reads and writes for `t`: `t` itself, or a
// contiguous copy whose result copyBack() returns to `t`.
at::Tensor inOutBuffer(const at::Tensor& t);
// A contiguous stand-in the core only writes.
at::Tensor outBuffer(const at::Tensor& t);
// A contiguous stand-in the core only reads. Inputs that alias the output
// (in-place all_gather_into_tensor, as FSDP issues) are snapshotted, since
// the core writes the output while it still reads the input.
at::Tensor inBuffer(const at::Tensor& t, const at::Tensor& output);
void copyBack(const at::Tensor& user, const at::Tensor& buffer);

// Dtype and shape hashed (FNV-1a), so ranks whose calls move the same bytes
// with different tensors fail in the core's round-0 check instead of
// silently reinterpreting each other's data. Never 0 ("no signature").
uint64_t shapeSignature(const at::Tensor& t);

// Whether the core writes rank r's block of a per-rank output: only active
// ranks' blocks are written (holes, and every other rank's block on a rank
// running local-only, keep what the user's tensor held).
inline bool blockWritten(const std::vector<uint8_t>& active, size_t r) {
    return r < active.size() && active[r] != 0;
}

// Block `r` of a flat buffer holding equal blocks, shaped like `like`.
at::Tensor block(const at::Tensor& flat, int64_t r, const at::Tensor& like);
// Flattens `parts` into one contiguous buffer, in order.
at::Tensor pack(const Tensors& parts, const at::TensorOptions& options);

// The single-tensor ops whose output and input must share a dtype.
void checkOutputDtype(const at::Tensor& output, const at::Tensor& input, const char* op);
// `whole` (named `whole_name`) must hold one block the size of `part` per
// rank of the group.
void checkGroupMultiple(const at::Tensor& whole, const char* whole_name, const at::Tensor& part,
                        const char* part_name, int group_size, const char* op);
// The coalesced ops take one output per input.
void checkOnePerInput(const Tensors& outputs, const Tensors& inputs, const char* op);

}  // namespace mooncake::pg::collective_tensors
