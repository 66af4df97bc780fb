// MooncakeBackend's reduction entry points: all_reduce (single and
// coalesced), reduce and reduce_scatter (list, tensor and coalesced). See
// backend_gathers.cc for what every collective entry point does.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/collective_tensors.h"

namespace mooncake::pg {

using namespace collective_tensors;  // NOLINT(build/namespaces): this op family's helpers
using c10d::OpType;

c10::intrusive_ptr<c10d::Work> MooncakeBackend::allreduce(Tensors& tensors,
                                                          const c10d::AllreduceOptions& opts) {
    const char* op = "all_reduce";
    checkSingle(tensors, op);
    TORCH_CHECK(!opts.sparseIndices.has_value(),
                "Mooncake PG: all_reduce of sparse tensors is "
                "not supported");
    const at::Tensor user = tensors[0];
    checkTensor(user, op, "tensor");
    const DataType dtype = checkDtype(user, op, "tensor");
    const ReduceOp rop = checkReduceOp(opts.reduceOp, dtype, op);
    // The result replaces the tensor anyway.
    premultiplied(opts.reduceOp, user, /*in_place=*/true, op);
    if (auto work = maybeKernel(
            KernelCall{device::CudaCollective::kAllReduce, op, OpType::ALLREDUCE, user, user, dtype,
                       rop, 0, static_cast<uint64_t>(user.numel()), 0,
                       [this, user, dtype, rop](void* in, void* out, Deadline dl) {
                           comm_->setNextCallSignature(shapeSignature(user));
                           return comm_->allReduce(in, out, user.numel(), dtype, rop, dl);
                       }},
            opts.timeout, opts.asyncOp))
        return work;
    Staging st(op);
    const at::Tensor t = st.inOut(user, "tensor");
    at::Tensor buf = inOutBuffer(t);
    return enqueue(OpType::ALLREDUCE, op, {user}, opts.timeout, GroupSized::kNo, std::move(st),
                   [this, t, buf, dtype, rop](Deadline dl) {
                       void* p = ptrOf(buf);
                       comm_->setNextCallSignature(shapeSignature(buf));
                       MC_RETURN_IF_ERROR(comm_->allReduce(p, p, buf.numel(), dtype, rop, dl));
                       copyBack(t, buf);
                       return Status::OK();
                   });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::allreduce_coalesced(
    Tensors& tensors, const c10d::AllreduceCoalescedOptions& opts) {
    const char* op = "all_reduce_coalesced";
    TORCH_CHECK(!tensors.empty(), "Mooncake PG: all_reduce_coalesced got an empty tensor list");
    std::vector<DataType> dtypes;
    std::vector<ReduceOp> rops;
    Tensors bufs;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const std::string what = "tensors[" + std::to_string(i) + "]";
        checkTensor(tensors[i], op, what);
        dtypes.push_back(checkDtype(tensors[i], op, what));
        rops.push_back(checkReduceOp(opts.reduceOp, dtypes.back(), op));
    }
    if (coalescedPerTensor(tensors)) {
        return perTensor(OpType::ALLREDUCE_COALESCED, tensors.size(), [&](size_t i) {
            Tensors single{tensors[i]};
            return allreduce(single, opts);  // AllreduceCoalescedOptions is an AllreduceOptions
        });
    }
    for (const auto& t : tensors)
        premultiplied(opts.reduceOp, t, /*in_place=*/true, op);
    Staging st(op);
    const Tensors staged = st.inOut(tensors, "tensors");
    for (const auto& t : staged)
        bufs.push_back(inOutBuffer(t));
    return enqueue(
        OpType::ALLREDUCE_COALESCED, op, tensors, opts.timeout, GroupSized::kNo, std::move(st),
        [this, user = staged, bufs, dtypes, rops](Deadline dl) {
            for (size_t i = 0; i < bufs.size(); ++i) {
                void* p = ptrOf(bufs[i]);
                comm_->setNextCallSignature(shapeSignature(bufs[i]));
                MC_RETURN_IF_ERROR(comm_->allReduce(p, p, bufs[i].numel(), dtypes[i], rops[i], dl));
                copyBack(user[i], bufs[i]);
            }
            return Status::OK();
        });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::reduce(Tensors& tensors,
                                                       const c10d::ReduceOptions& opts) {
    const char* op = "reduce";
    checkSingle(tensors, op);
    checkRank(opts.rootRank, op, "dst");
    const at::Tensor user = tensors[0];
    checkTensor(user, op, "tensor");
    const DataType dtype = checkDtype(user, op, "tensor");
    const ReduceOp rop = checkReduceOp(opts.reduceOp, dtype, op);
    const int root = static_cast<int>(opts.rootRank);
    // The root's tensor takes the result; the others keep their input, so
    // they reduce a premultiplied copy.
    const at::Tensor operand =
        premultiplied(opts.reduceOp, user, /*in_place=*/getRank() == root, op);
    if (user.is_cuda() && mayRunKernels(device::CudaCollective::kReduce)) {
        // The kernels run it as an all_reduce (all_reduce.h): a non-root's
        // result lands in a scratch tensor it drops, its own left as it was.
        const bool is_root = getRank() == root;
        const at::Tensor target =
            is_root ? user : at::empty_like(operand, at::MemoryFormat::Contiguous);
        if (auto work = maybeKernel(
                KernelCall{device::CudaCollective::kReduce, op, OpType::REDUCE, operand, target,
                           dtype, rop, root, static_cast<uint64_t>(user.numel()), 0,
                           [this, user, dtype, rop, root](void* in, void* out, Deadline dl) {
                               comm_->setNextCallSignature(shapeSignature(user));
                               return comm_->reduce(in, out, user.numel(), dtype, rop, root, dl);
                           },
                           false, is_root ? at::Tensor() : user},
                opts.timeout, opts.asyncOp))
            return work;
    }
    Staging st(op);
    const at::Tensor t = st.inOut(operand, "tensor");
    at::Tensor buf = inOutBuffer(t);
    return enqueue(OpType::REDUCE, op, {user}, opts.timeout, GroupSized::kNo, std::move(st),
                   [this, t, buf, dtype, rop, root](Deadline dl) {
                       void* p = ptrOf(buf);
                       comm_->setNextCallSignature(shapeSignature(buf));
                       MC_RETURN_IF_ERROR(comm_->reduce(p, p, buf.numel(), dtype, rop, root, dl));
                       copyBack(t, buf);
                       return Status::OK();
                   });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::reduce_scatter(
    Tensors& outputs, std::vector<Tensors>& inputs, const c10d::ReduceScatterOptions& opts) {
    const char* op = "reduce_scatter";
    checkSingle(outputs, op);
    TORCH_CHECK(inputs.size() == 1, "Mooncake PG: reduce_scatter takes one input list, got ",
                inputs.size());
    const at::Tensor user_out = outputs[0];
    checkTensor(user_out, op, "output");
    const DataType dtype = checkDtype(user_out, op, "output");
    const ReduceOp rop = checkReduceOp(opts.reduceOp, dtype, op);
    checkPerRankList(inputs[0], user_out, op, "input_list");
    Tensors operands;
    for (const auto& t : inputs[0])
        operands.push_back(premultiplied(opts.reduceOp, t, /*in_place=*/false, op));
    if (user_out.is_cuda() && mayRunKernels(device::CudaCollective::kReduceScatter)) {
        // The kernels take the list packed into one contiguous tensor, on
        // the caller's stream.
        KernelCall call{device::CudaCollective::kReduceScatter,
                        op,
                        OpType::REDUCE_SCATTER,
                        pack(operands, user_out.options()),
                        user_out,
                        dtype,
                        rop,
                        0,
                        static_cast<uint64_t>(user_out.numel()),
                        groupSize(),
                        [this, user_out, dtype, rop](void* in, void* out, Deadline dl) {
                            comm_->setNextCallSignature(shapeSignature(user_out));
                            return comm_->reduceScatter(in, out, user_out.numel(), dtype, rop, dl);
                        }};
        call.held = inputs[0];
        if (auto work = maybeKernel(std::move(call), opts.timeout, opts.asyncOp))
            return work;
    }
    Staging st(op);
    const at::Tensor out = st.inOut(user_out, "output");
    const Tensors ins = st.in(operands, "input_list");
    at::Tensor dst = outBuffer(out);
    return enqueue(OpType::REDUCE_SCATTER, op, {user_out}, opts.timeout, GroupSized::kBlocks,
                   std::move(st), [this, out, ins, dst, dtype, rop](Deadline dl) {
                       at::Tensor flat = pack(ins, dst.options());
                       comm_->setNextCallSignature(shapeSignature(dst));
                       MC_RETURN_IF_ERROR(comm_->reduceScatter(ptrOf(flat), ptrOf(dst), dst.numel(),
                                                               dtype, rop, dl));
                       copyBack(out, dst);
                       return Status::OK();
                   });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
    const char* op = "reduce_scatter_tensor";
    const DataType dtype = checkInOut(input, output, op, "input tensor", "output tensor");
    const ReduceOp rop = checkReduceOp(opts.reduceOp, dtype, op);
    checkOutputDtype(output, input, op);
    checkGroupMultiple(input, "input", output, "output", groupSize(), op);
    // The input is read only: a premultiplied copy (PREMUL_SUM).
    const at::Tensor operand = premultiplied(opts.reduceOp, input, /*in_place=*/false, op);
    if (auto work = maybeKernel(
            KernelCall{device::CudaCollective::kReduceScatter, op, OpType::_REDUCE_SCATTER_BASE,
                       operand, output, dtype, rop, 0, static_cast<uint64_t>(output.numel()),
                       groupSize(),
                       [this, output, dtype, rop](void* in, void* out, Deadline dl) {
                           comm_->setNextCallSignature(shapeSignature(output));
                           return comm_->reduceScatter(in, out, output.numel(), dtype, rop, dl);
                       }},
            opts.timeout, opts.asyncOp))
        return work;
    Staging st(op);
    const at::Tensor staged_in = st.in(operand, "input tensor");
    const at::Tensor out = st.inOut(output, "output tensor");
    at::Tensor src = inBuffer(staged_in, out);
    at::Tensor dst = outBuffer(out);
    return enqueue(OpType::_REDUCE_SCATTER_BASE, op, {output}, opts.timeout, GroupSized::kBlocks,
                   std::move(st), [this, out, src, dst, dtype, rop](Deadline dl) {
                       comm_->setNextCallSignature(shapeSignature(dst));
                       MC_RETURN_IF_ERROR(comm_->reduceScatter(ptrOf(src), ptrOf(dst), dst.numel(),
                                                               dtype, rop, dl));
                       copyBack(out, dst);
                       return Status::OK();
                   });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::reduce_scatter_tensor_coalesced(
    Tensors& outputs, Tensors& inputs, const c10d::ReduceScatterOptions& opts) {
    const char* op = "reduce_scatter_tensor_coalesced";
    checkOnePerInput(outputs, inputs, op);
    Tensors srcs, dsts;
    std::vector<DataType> dtypes;
    std::vector<ReduceOp> rops;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const std::string idx = "[" + std::to_string(i) + "]";
        dtypes.push_back(checkInOut(inputs[i], outputs[i], op, "inputs" + idx, "outputs" + idx));
        rops.push_back(checkReduceOp(opts.reduceOp, dtypes.back(), op));
        TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type() &&
                        inputs[i].numel() == outputs[i].numel() * groupSize(),
                    "Mooncake PG: ", op, ": outputs", idx, " (",
                    dtypeName(outputs[i].scalar_type()), ", ", outputs[i].numel(),
                    " elements) does not match inputs", idx, " (",
                    dtypeName(inputs[i].scalar_type()), ", ", inputs[i].numel(),
                    " elements); expected the same dtype and input elements = output elements x ",
                    groupSize());
    }
    if (coalescedPerTensor(inputs)) {
        return perTensor(OpType::COALESCED, inputs.size(), [&](size_t i) {
            return _reduce_scatter_base(outputs[i], inputs[i], opts);
        });
    }
    Tensors operands;
    for (const auto& t : inputs)
        operands.push_back(premultiplied(opts.reduceOp, t, /*in_place=*/false, op));
    Staging st(op);
    const Tensors ins = st.in(operands, "inputs");
    const Tensors outs = st.inOut(outputs, "outputs");
    for (size_t i = 0; i < ins.size(); ++i) {
        srcs.push_back(inBuffer(ins[i], outs[i]));
        dsts.push_back(outBuffer(outs[i]));
    }
    return enqueue(
        OpType::COALESCED, op, outputs, opts.timeout, GroupSized::kBlocks, std::move(st),
        [this, outs, srcs, dsts, dtypes, rops](Deadline dl) {
            for (size_t i = 0; i < srcs.size(); ++i) {
                MC_RETURN_IF_ERROR(comm_->reduceScatter(ptrOf(srcs[i]), ptrOf(dsts[i]),
                                                        dsts[i].numel(), dtypes[i], rops[i], dl));
                copyBack(outs[i], dsts[i]);
            }
            return Status::OK();
        });
}

}  // namespace mooncake::pg
