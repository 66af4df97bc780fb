// KernelCall: one collective on CUDA tensors as the device kernels take it
// (mooncake-pg/device/), built by the collective entry points once their
// arguments are checked. MooncakeBackend::maybeKernel asks the CUDA
// executor's route() for it and, when the kernels take it, queues it on the
// worker (cuda_collectives.cc); otherwise the entry point stages the op as
// before.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "mooncake-pg/core/types.h"
#include "mooncake-pg/device/all_to_all_v_plan.h"
#include "mooncake-pg/device/routing.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

struct KernelCall {
    device::CudaCollective collective = device::CudaCollective::kAllReduce;
    const char* op_name = "";
    c10d::OpType type = c10d::OpType::UNKNOWN;
    // all_reduce and broadcast: the same tensor (in place).
    at::Tensor input;
    at::Tensor output;
    DataType dtype = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;  // reductions
    int root = 0;                  // broadcast, reduce
    // Elements per rank as the kernel takes them (device::RouteQuery::count).
    uint64_t count = 0;
    // all_gather, reduce_scatter, all_to_all: the blocks the tensors hold
    // (the group size at issue); 0 for the others.
    int blocks = 0;
    // The same op through the host core, on host copies of the contiguous
    // input and output: for a membership view the kernels cannot take (an
    // inactive member, a block count that no longer matches the group).
    std::function<Status(void* in, void* out, Deadline)> host_core;
    // Set by maybeKernel when the caller's stream is being captured into a
    // CUDA graph (docs/design/pg-cuda.md, CUDA graphs): the kernels are
    // queued into the graph; the direct path and the host core are ruled out.
    bool captured = false;
    // What the Work returns, when not `output`: a reduce's non-roots pass
    // their tensor here and a scratch `output` the kernels fill (they run
    // the reduce as an all_reduce; all_reduce.h).
    at::Tensor work_output = {};
    // all_to_all with split sizes: this rank's row, in bytes of the
    // contiguous input and output (all_to_all_v_plan.h).
    device::AllToAllVRow splits = {};
    // List forms, which the kernels run on a contiguous `output` (or
    // `input`) made at issue: after the call, in stream order, block r of
    // `output` is copied into output_blocks[r] (all_gather's list, a
    // gather's list on its root). On the host core's path only the blocks
    // of active ranks are, the ones the core wrote.
    std::vector<at::Tensor> output_blocks = {};
    // Further tensors the op reads, held until it completes and checked to
    // be on the op's device (the list a contiguous `input` was packed from).
    std::vector<at::Tensor> held = {};
    // What the Work returns, when not `work_output` or `output` (the list;
    // empty on a gather's non-roots).
    std::optional<std::vector<at::Tensor>> results = std::nullopt;
};

}  // namespace mooncake::pg
