// MooncakeBackend's all_to_all entry points (single tensor with optional
// splits, and tensor lists) and barrier. See backend_gathers.cc for what
// every collective entry point does.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/collective_tensors.h"

namespace mooncake::pg {

using namespace collective_tensors;  // NOLINT(build/namespaces): this op family's helpers
using c10d::OpType;

// Byte counts and offsets of the per-rank blocks of `t` along dim 0: equal
// blocks when `splits` is empty, else splits[p] rows for rank p.
static void splitBytes(const at::Tensor& t, const std::vector<int64_t>& splits, int n,
                       const char* op, const char* name, std::vector<size_t>* bytes,
                       std::vector<size_t>* offsets) {
    TORCH_CHECK(t.dim() >= 1, "Mooncake PG: ", op, ": the ", name,
                " tensor must have at least one dimension to split along");
    const int64_t rows = t.size(0);
    int64_t row_elements = 1;
    for (int64_t d = 1; d < t.dim(); ++d)
        row_elements *= t.size(d);
    const size_t row_bytes = static_cast<size_t>(row_elements) * t.element_size();
    std::vector<int64_t> counts;
    if (splits.empty()) {
        TORCH_CHECK(rows % n == 0, "Mooncake PG: ", op, ": the ", name, " tensor's dim 0 (", rows,
                    ") is not divisible by the group size (", n,
                    "); pass split sizes or resize it");
        counts.assign(n, rows / n);
    } else {
        TORCH_CHECK(static_cast<int>(splits.size()) == n, "Mooncake PG: ", op, ": ", name,
                    "_split_sizes has ", splits.size(), " entries; expected one per rank (", n,
                    ")");
        int64_t sum = 0;
        for (size_t p = 0; p < splits.size(); ++p) {
            TORCH_CHECK(splits[p] >= 0, "Mooncake PG: ", op, ": ", name, "_split_sizes[", p,
                        "] is ", splits[p], "; split sizes must be non-negative");
            sum += splits[p];
        }
        TORCH_CHECK(sum == rows, "Mooncake PG: ", op, ": ", name, "_split_sizes sum to ", sum,
                    " rows but the ", name, " tensor has ", rows, " rows in dim 0");
        counts = splits;
    }
    bytes->resize(n);
    offsets->resize(n);
    size_t offset = 0;
    for (int p = 0; p < n; ++p) {
        (*bytes)[p] = static_cast<size_t>(counts[p]) * row_bytes;
        (*offsets)[p] = offset;
        offset += (*bytes)[p];
    }
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes, const c10d::AllToAllOptions& opts) {
    const char* op = "all_to_all_single";
    const DataType dtype = checkInOut(input, output, op, "input tensor", "output tensor");
    checkOutputDtype(output, input, op);
    const int n = groupSize();
    std::vector<size_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
    splitBytes(input, input_split_sizes, n, op, "input", &send_bytes, &send_offsets);
    splitBytes(output, output_split_sizes, n, op, "output", &recv_bytes, &recv_offsets);
    // Every rank must choose the same path. Only split sizes left out (equal
    // blocks by definition, on every rank) say the blocks are equal: a rank
    // whose own explicit splits happen to be equal cannot tell whether the
    // other ranks' are. Explicit splits take the direct all_to_all with split
    // sizes (or the host core when the buffers cannot be shared).
    const bool equal =
        input_split_sizes.empty() && output_split_sizes.empty() && input.numel() == output.numel();
    if (equal) {
        if (auto work = maybeKernel(
                KernelCall{device::CudaCollective::kAllToAll, op, OpType::ALLTOALL_BASE, input,
                           output, dtype, ReduceOp::kSum, 0,
                           static_cast<uint64_t>(input.numel() / n), n,
                           [this, send_bytes, send_offsets, recv_bytes, recv_offsets](
                               void* in, void* out, Deadline dl) {
                               return comm_->allToAllV(in, send_bytes, send_offsets, out,
                                                       recv_bytes, recv_offsets, dl);
                           }},
                opts.timeout, opts.asyncOp))
            return work;
    }
    if (!equal && input.is_cuda() && mayRunKernels(device::CudaCollective::kAllToAllV)) {
        // Each rank's sizes differ, so the route may not depend on them:
        // count 1 for all. The rows travel with the call (all_to_all_v_plan.h).
        device::AllToAllVRow row;
        for (int p = 0; p < n; ++p) {
            row.send_bytes.push_back(send_bytes[p]);
            row.send_offsets.push_back(send_offsets[p]);
            row.recv_bytes.push_back(recv_bytes[p]);
            row.recv_offsets.push_back(recv_offsets[p]);
        }
        row.input_bytes = bytesOf(input);
        row.output_bytes = bytesOf(output);
        if (auto work = maybeKernel(
                KernelCall{device::CudaCollective::kAllToAllV, op, OpType::ALLTOALL_BASE, input,
                           output, dtype, ReduceOp::kSum, 0, 1, n,
                           [this, send_bytes, send_offsets, recv_bytes, recv_offsets](
                               void* in, void* out, Deadline dl) {
                               return comm_->allToAllV(in, send_bytes, send_offsets, out,
                                                       recv_bytes, recv_offsets, dl);
                           },
                           false, at::Tensor(), std::move(row)},
                opts.timeout, opts.asyncOp))
            return work;
    }
    Staging st(op);
    const at::Tensor staged_in = st.in(input, "input tensor");
    const at::Tensor out = st.inOut(output, "output tensor");
    at::Tensor src = inBuffer(staged_in, out);
    at::Tensor dst = inOutBuffer(out);  // pieces from inactive ranks keep their values
    return enqueue(
        OpType::ALLTOALL_BASE, op, {output}, opts.timeout, GroupSized::kBlocks, std::move(st),
        [this, out, src, dst, send_bytes, send_offsets, recv_bytes, recv_offsets](Deadline dl) {
            MC_RETURN_IF_ERROR(comm_->allToAllV(ptrOf(src), send_bytes, send_offsets, ptrOf(dst),
                                                recv_bytes, recv_offsets, dl));
            copyBack(out, dst);
            return Status::OK();
        });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::alltoall(Tensors& outputs, Tensors& inputs,
                                                         const c10d::AllToAllOptions& opts) {
    const char* op = "all_to_all";
    const int n = groupSize();
    TORCH_CHECK(static_cast<int>(inputs.size()) == n && static_cast<int>(outputs.size()) == n,
                "Mooncake PG: all_to_all: got ", inputs.size(), " input and ", outputs.size(),
                " output tensors; expected one of each per rank of the group (", n, ")");
    TORCH_CHECK(n > 0 && inputs[0].defined(),
                "Mooncake PG: all_to_all: input_tensor_list[0] is "
                "undefined");
    const DataType dtype = checkDtype(inputs[0], op, "input_tensor_list[0]");
    std::vector<size_t> send_bytes(n), send_offsets(n), recv_bytes(n), recv_offsets(n);
    size_t send_at = 0, recv_at = 0;
    for (int p = 0; p < n; ++p) {
        const std::string idx = "[" + std::to_string(p) + "]";
        checkTensor(inputs[p], op, "input_tensor_list" + idx);
        checkTensor(outputs[p], op, "output_tensor_list" + idx);
        for (const at::Tensor* t : {&inputs[p], &outputs[p]}) {
            TORCH_CHECK(t->scalar_type() == inputs[0].scalar_type(),
                        "Mooncake PG: all_to_all: ", t == &inputs[p] ? "input" : "output",
                        "_tensor_list", idx, " has dtype ", dtypeName(t->scalar_type()),
                        "; expected ", dtypeName(inputs[0].scalar_type()),
                        " like input_tensor_list[0]");
        }
        send_bytes[p] = bytesOf(inputs[p]);
        send_offsets[p] = send_at;
        send_at += send_bytes[p];
        recv_bytes[p] = bytesOf(outputs[p]);
        recv_offsets[p] = recv_at;
        recv_at += recv_bytes[p];
    }
    if (inputs[0].is_cuda() && mayRunKernels(device::CudaCollective::kAllToAllV)) {
        // The kernels' all_to_all with split sizes (the direct path): the
        // list packed into one contiguous input on the caller's stream, one
        // contiguous output copied out to the list after the call, in stream
        // order. Route and count are the same on every rank (count 1, as for
        // split sizes); the rows travel with the call.
        const auto options = inputs[0].options();
        int64_t total_out = 0;
        for (const auto& o : outputs)
            total_out += o.numel();
        device::AllToAllVRow row;
        row.send_bytes = send_bytes;
        row.send_offsets = send_offsets;
        row.recv_bytes = recv_bytes;
        row.recv_offsets = recv_offsets;
        row.input_bytes = send_at;
        row.output_bytes = recv_at;
        KernelCall call{device::CudaCollective::kAllToAllV,
                        op,
                        OpType::ALLTOALL,
                        pack(inputs, options),
                        at::empty({total_out}, options),
                        dtype,
                        ReduceOp::kSum,
                        0,
                        1,
                        n,
                        [this, send_bytes, send_offsets, recv_bytes, recv_offsets](
                            void* in, void* out, Deadline dl) {
                            return comm_->allToAllV(in, send_bytes, send_offsets, out, recv_bytes,
                                                    recv_offsets, dl);
                        },
                        false,
                        at::Tensor(),
                        std::move(row)};
        call.output_blocks = outputs;
        call.held = inputs;
        call.results = outputs;
        if (auto work = maybeKernel(std::move(call), opts.timeout, opts.asyncOp))
            return work;
    }
    Staging st(op);
    const Tensors ins = st.in(inputs, "input_tensor_list");
    const Tensors outs = st.inOut(outputs, "output_tensor_list");
    const auto options = ins[0].options();
    return enqueue(
        OpType::ALLTOALL, op, outputs, opts.timeout, GroupSized::kBlocks, std::move(st),
        [this, outs, ins, options, send_bytes, send_offsets, recv_bytes,
         recv_offsets](Deadline dl) {
            at::Tensor flat_in = pack(ins, options);
            int64_t total_out = 0;
            for (const auto& o : outs)
                total_out += o.numel();
            at::Tensor flat_out = at::empty({total_out}, options);
            MC_RETURN_IF_ERROR(comm_->allToAllV(ptrOf(flat_in), send_bytes, send_offsets,
                                                ptrOf(flat_out), recv_bytes, recv_offsets, dl));
            int64_t offset = 0;
            for (size_t p = 0; p < outs.size(); ++p) {
                const at::Tensor& o = outs[p];
                if (blockWritten(comm_->active(), p))
                    o.copy_(flat_out.narrow(0, offset, o.numel()).view(o.sizes()));
                offset += o.numel();
            }
            return Status::OK();
        });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::barrier(const c10d::BarrierOptions& opts) {
    return enqueue(OpType::BARRIER, "barrier", {}, opts.timeout, GroupSized::kNo,
                   Staging("barrier"), [this](Deadline dl) { return comm_->barrier(dl); });
}

}  // namespace mooncake::pg
