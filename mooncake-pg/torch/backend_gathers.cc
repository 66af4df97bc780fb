// MooncakeBackend's broadcast and gather-family entry points (all_gather and
// its variants, gather, scatter). Like every collective entry point, each
// validates its arguments on the caller's thread (so a bad call fails before
// anything is transferred), picks contiguous buffers for the core, and
// queues a closure that makes the core calls and copies results into the
// user's tensors. Closures hold the tensors they touch, so those outlive the
// op.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/collective_tensors.h"

namespace mooncake::pg {

using namespace collective_tensors;  // NOLINT(build/namespaces): this op family's helpers
using c10d::OpType;

c10::intrusive_ptr<c10d::Work> MooncakeBackend::broadcast(Tensors& tensors,
                                                          const c10d::BroadcastOptions& opts) {
    const char* op = "broadcast";
    checkSingle(tensors, op);
    checkRank(opts.rootRank, op, "root");
    TORCH_CHECK(opts.rootTensor == 0, "Mooncake PG: broadcast: root_tensor ", opts.rootTensor,
                " is out of range for a single-tensor call (expected 0)");
    const at::Tensor user = tensors[0];
    checkTensor(user, op, "tensor");
    const DataType dtype = checkDtype(user, op, "tensor");
    const int root = static_cast<int>(opts.rootRank);
    if (auto work = maybeKernel(
            KernelCall{device::CudaCollective::kBroadcast, op, OpType::BROADCAST, user, user, dtype,
                       ReduceOp::kSum, root, static_cast<uint64_t>(user.numel()), 0,
                       [this, user, root](void* in, void*, Deadline dl) {
                           comm_->setNextCallSignature(shapeSignature(user));
                           return comm_->broadcast(in, bytesOf(user), root, dl);
                       }},
            opts.timeout, opts.asyncOp))
        return work;
    Staging st(op);
    const at::Tensor t = st.inOut(user, "tensor");
    at::Tensor buf = inOutBuffer(t);
    return enqueue(OpType::BROADCAST, op, {user}, opts.timeout, GroupSized::kNo, std::move(st),
                   [this, t, buf, root](Deadline dl) {
                       comm_->setNextCallSignature(shapeSignature(buf));
                       MC_RETURN_IF_ERROR(comm_->broadcast(ptrOf(buf), bytesOf(buf), root, dl));
                       copyBack(t, buf);
                       return Status::OK();
                   });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::allgather(std::vector<Tensors>& outputs,
                                                          Tensors& inputs,
                                                          const c10d::AllgatherOptions& opts) {
    const char* op = "all_gather";
    checkSingle(inputs, op);
    TORCH_CHECK(outputs.size() == 1, "Mooncake PG: all_gather takes one output list, got ",
                outputs.size());
    checkTensor(inputs[0], op, "input tensor");
    const DataType dtype = checkDtype(inputs[0], op, "input tensor");
    checkPerRankList(outputs[0], inputs[0], op, "tensor_list");
    if (inputs[0].is_cuda() && mayRunKernels(device::CudaCollective::kAllGather)) {
        // The kernels gather into one contiguous tensor, copied out to the list.
        const at::Tensor input = inputs[0];
        KernelCall call{device::CudaCollective::kAllGather,
                        op,
                        OpType::ALLGATHER,
                        input,
                        at::empty({groupSize() * input.numel()}, input.options()),
                        dtype,
                        ReduceOp::kSum,
                        0,
                        static_cast<uint64_t>(input.numel()),
                        groupSize(),
                        [this, input](void* in, void* out, Deadline dl) {
                            comm_->setNextCallSignature(shapeSignature(input));
                            return comm_->allGather(in, out, bytesOf(input), dl);
                        }};
        call.output_blocks = outputs[0];
        call.results = outputs[0];
        if (auto work = maybeKernel(std::move(call), opts.timeout, opts.asyncOp))
            return work;
    }
    Staging st(op);
    const at::Tensor in = st.in(inputs[0], "input tensor");
    const Tensors outs = st.inOut(outputs[0], "tensor_list");
    at::Tensor src = inBuffer(in, at::Tensor());
    const int n = groupSize();
    return enqueue(
        OpType::ALLGATHER, op, outputs[0], opts.timeout, GroupSized::kBlocks, std::move(st),
        [this, outs, src, n](Deadline dl) {
            at::Tensor flat = at::empty({n * src.numel()}, src.options());
            comm_->setNextCallSignature(shapeSignature(src));
            MC_RETURN_IF_ERROR(comm_->allGather(ptrOf(src), ptrOf(flat), bytesOf(src), dl));
            for (int r = 0; r < n; ++r) {
                if (blockWritten(comm_->active(), static_cast<size_t>(r)))
                    outs[r].copy_(block(flat, r, outs[r]));
            }
            return Status::OK();
        });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
    const char* op = "all_gather_into_tensor";
    const DataType dtype = checkInOut(input, output, op, "input tensor", "output tensor");
    checkOutputDtype(output, input, op);
    checkGroupMultiple(output, "output", input, "input", groupSize(), op);
    if (auto work =
            maybeKernel(KernelCall{device::CudaCollective::kAllGather, op, OpType::_ALLGATHER_BASE,
                                   input, output, dtype, ReduceOp::kSum, 0,
                                   static_cast<uint64_t>(input.numel()), groupSize(),
                                   [this, input](void* in, void* out, Deadline dl) {
                                       comm_->setNextCallSignature(shapeSignature(input));
                                       return comm_->allGather(in, out, bytesOf(input), dl);
                                   }},
                        opts.timeout, opts.asyncOp))
        return work;
    Staging st(op);
    const at::Tensor staged_in = st.in(input, "input tensor");
    const at::Tensor out = st.inOut(output, "output tensor");
    at::Tensor src = inBuffer(staged_in, out);
    at::Tensor dst = inOutBuffer(out);  // blocks of inactive ranks keep their values
    return enqueue(
        OpType::_ALLGATHER_BASE, op, {output}, opts.timeout, GroupSized::kBlocks, std::move(st),
        [this, out, src, dst](Deadline dl) {
            comm_->setNextCallSignature(shapeSignature(src));
            MC_RETURN_IF_ERROR(comm_->allGather(ptrOf(src), ptrOf(dst), bytesOf(src), dl));
            copyBack(out, dst);
            return Status::OK();
        });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::allgather_into_tensor_coalesced(
    Tensors& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts) {
    const char* op = "all_gather_into_tensor_coalesced";
    checkOnePerInput(outputs, inputs, op);
    Tensors srcs, dsts;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const std::string idx = "[" + std::to_string(i) + "]";
        checkInOut(inputs[i], outputs[i], op, "inputs" + idx, "outputs" + idx);
        TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type(), "Mooncake PG: ", op,
                    ": outputs", idx, " has dtype ", dtypeName(outputs[i].scalar_type()),
                    " but inputs", idx, " has ", dtypeName(inputs[i].scalar_type()));
        TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * groupSize(), "Mooncake PG: ", op,
                    ": outputs", idx, " has ", outputs[i].numel(), " elements; expected ",
                    inputs[i].numel() * groupSize(), " (input elements x group size)");
    }
    if (coalescedPerTensor(inputs)) {
        return perTensor(OpType::COALESCED, inputs.size(),
                         [&](size_t i) { return _allgather_base(outputs[i], inputs[i], opts); });
    }
    Staging st(op);
    const Tensors ins = st.in(inputs, "inputs");
    const Tensors outs = st.inOut(outputs, "outputs");
    for (size_t i = 0; i < ins.size(); ++i) {
        srcs.push_back(inBuffer(ins[i], outs[i]));
        dsts.push_back(inOutBuffer(outs[i]));  // blocks of inactive ranks keep their values
    }
    return enqueue(OpType::COALESCED, op, outputs, opts.timeout, GroupSized::kBlocks, std::move(st),
                   [this, outs, srcs, dsts](Deadline dl) {
                       for (size_t i = 0; i < srcs.size(); ++i) {
                           MC_RETURN_IF_ERROR(comm_->allGather(ptrOf(srcs[i]), ptrOf(dsts[i]),
                                                               bytesOf(srcs[i]), dl));
                           copyBack(outs[i], dsts[i]);
                       }
                       return Status::OK();
                   });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::allgather_coalesced(
    std::vector<Tensors>& output_lists, Tensors& inputs, const c10d::AllgatherOptions& opts) {
    const char* op = "all_gather_coalesced";
    const int n = groupSize();
    TORCH_CHECK(static_cast<int>(output_lists.size()) == n, "Mooncake PG: ", op,
                ": output_tensor_lists has ", output_lists.size(),
                " lists; expected one per rank of the group (", n, ")");
    Tensors flat_outputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const std::string what = "input_tensor_list[" + std::to_string(i) + "]";
        checkTensor(inputs[i], op, what);
        checkDtype(inputs[i], op, what);
    }
    for (int r = 0; r < n; ++r) {
        TORCH_CHECK(output_lists[r].size() == inputs.size(), "Mooncake PG: ", op,
                    ": output_tensor_lists[", r, "] has ", output_lists[r].size(),
                    " tensors; expected one per input (", inputs.size(), ")");
        for (size_t i = 0; i < inputs.size(); ++i) {
            const at::Tensor& o = output_lists[r][i];
            const std::string what =
                "output_tensor_lists[" + std::to_string(r) + "][" + std::to_string(i) + "]";
            checkTensor(o, op, what);
            TORCH_CHECK(
                o.scalar_type() == inputs[i].scalar_type() && o.numel() == inputs[i].numel(),
                "Mooncake PG: ", op, ": ", what, " is ", dtypeName(o.scalar_type()), " with ",
                o.numel(), " elements; expected ", dtypeName(inputs[i].scalar_type()), " with ",
                inputs[i].numel(), " elements like input_tensor_list[", i, "]");
            flat_outputs.push_back(o);
        }
    }
    if (coalescedPerTensor(inputs)) {
        // Input i's all_gather into its list, output_tensor_lists[r][i] for
        // every rank r (the list form runs on the kernels).
        return perTensor(
            OpType::ALLGATHER_COALESCED, inputs.size(),
            [&](size_t i) {
                std::vector<Tensors> outs(1);
                for (int r = 0; r < n; ++r)
                    outs[0].push_back(output_lists[r][i]);
                Tensors in{inputs[i]};
                return allgather(outs, in, opts);
            },
            flat_outputs);
    }
    Staging st(op);
    Tensors srcs;
    for (const auto& t : st.in(inputs, "input_tensor_list"))
        srcs.push_back(inBuffer(t, at::Tensor()));
    std::vector<Tensors> outs;
    for (int r = 0; r < n; ++r)
        outs.push_back(st.inOut(output_lists[r], "output_tensor_lists[" + std::to_string(r) + "]"));
    return enqueue(OpType::ALLGATHER_COALESCED, op, flat_outputs, opts.timeout, GroupSized::kBlocks,
                   std::move(st), [this, outs, srcs, n](Deadline dl) {
                       for (size_t i = 0; i < srcs.size(); ++i) {
                           at::Tensor flat = at::empty({n * srcs[i].numel()}, srcs[i].options());
                           MC_RETURN_IF_ERROR(
                               comm_->allGather(ptrOf(srcs[i]), ptrOf(flat), bytesOf(srcs[i]), dl));
                           for (int r = 0; r < n; ++r) {
                               if (blockWritten(comm_->active(), static_cast<size_t>(r)))
                                   outs[r][i].copy_(block(flat, r, outs[r][i]));
                           }
                       }
                       return Status::OK();
                   });
}

// The per-rank list (gather_list / scatter_list) is checked and returned on
// the root; on other ranks it must be absent.
MooncakeBackend::RootedArgs MooncakeBackend::checkRooted(Tensors& locals,
                                                         std::vector<Tensors>& lists,
                                                         int64_t root_rank, const char* op,
                                                         const char* root_what,
                                                         const char* list_name) const {
    checkSingle(locals, op);
    checkRank(root_rank, op, root_what);
    RootedArgs args;
    args.local = locals[0];
    checkTensor(args.local, op, "tensor");
    checkDtype(args.local, op, "tensor");
    args.root = static_cast<int>(root_rank);
    args.is_root = args.root == config_.rank;
    if (args.is_root) {
        TORCH_CHECK(lists.size() == 1, "Mooncake PG: ", op, ": the root (rank ", args.root,
                    ") takes one ", list_name, ", got ", lists.size(), " lists");
        args.list = lists[0];
        checkPerRankList(args.list, args.local, op, list_name);
    } else {
        TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), "Mooncake PG: ", op,
                    ": only the root (rank ", args.root, ") takes a ", list_name, "; rank ",
                    config_.rank, " passed one");
    }
    return args;
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::gather(std::vector<Tensors>& outputs,
                                                       Tensors& inputs,
                                                       const c10d::GatherOptions& opts) {
    const char* op = "gather";
    const RootedArgs args = checkRooted(inputs, outputs, opts.rootRank, op, "dst", "gather_list");
    if (args.local.is_cuda() && mayRunKernels(device::CudaCollective::kGather)) {
        // The root's kernels gather into one contiguous tensor, copied out
        // to its list; the others' output is their own input, untouched.
        const at::Tensor local = args.local;
        const bool is_root = args.is_root;
        const int root = args.root;
        KernelCall call{device::CudaCollective::kGather,
                        op,
                        OpType::GATHER,
                        local,
                        is_root ? at::empty({groupSize() * local.numel()}, local.options()) : local,
                        checkDtype(local, op, "tensor"),
                        ReduceOp::kSum,
                        root,
                        static_cast<uint64_t>(local.numel()),
                        groupSize(),
                        [this, local, is_root, root](void* in, void* out, Deadline dl) {
                            comm_->setNextCallSignature(shapeSignature(local));
                            return comm_->gather(in, is_root ? out : nullptr, bytesOf(local), root,
                                                 dl);
                        }};
        call.output_blocks = args.list;
        call.results = args.list;
        if (auto work = maybeKernel(std::move(call), opts.timeout, opts.asyncOp))
            return work;
    }
    Staging st(op);
    const Tensors outs = st.inOut(args.list, "gather_list");
    const int root = args.root;
    const bool is_root = args.is_root;
    at::Tensor src = inBuffer(st.in(args.local, "tensor"), at::Tensor());
    const int n = groupSize();
    return enqueue(OpType::GATHER, op, args.list, opts.timeout, GroupSized::kRooted, std::move(st),
                   [this, outs, src, root, is_root, n](Deadline dl) {
                       at::Tensor flat;
                       if (is_root)
                           flat = at::empty({n * src.numel()}, src.options());
                       comm_->setNextCallSignature(shapeSignature(src));
                       MC_RETURN_IF_ERROR(comm_->gather(ptrOf(src), is_root ? ptrOf(flat) : nullptr,
                                                        bytesOf(src), root, dl));
                       for (size_t r = 0; r < outs.size(); ++r) {
                           if (blockWritten(comm_->active(), r))
                               outs[r].copy_(block(flat, static_cast<int64_t>(r), outs[r]));
                       }
                       return Status::OK();
                   });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::scatter(Tensors& outputs,
                                                        std::vector<Tensors>& inputs,
                                                        const c10d::ScatterOptions& opts) {
    const char* op = "scatter";
    const RootedArgs args = checkRooted(outputs, inputs, opts.rootRank, op, "src", "scatter_list");
    if (args.local.is_cuda() && mayRunKernels(device::CudaCollective::kScatter)) {
        // The root's list packed into one contiguous tensor on the caller's
        // stream; the others' input is their own output, which the kernels
        // only write.
        const at::Tensor local = args.local;
        const bool is_root = args.is_root;
        const int root = args.root;
        KernelCall call{device::CudaCollective::kScatter,
                        op,
                        OpType::SCATTER,
                        is_root ? pack(args.list, local.options()) : local,
                        local,
                        checkDtype(local, op, "tensor"),
                        ReduceOp::kSum,
                        root,
                        static_cast<uint64_t>(local.numel()),
                        groupSize(),
                        [this, local, is_root, root](void* in, void* out, Deadline dl) {
                            comm_->setNextCallSignature(shapeSignature(local));
                            return comm_->scatter(is_root ? in : nullptr, out, bytesOf(local), root,
                                                  dl);
                        }};
        call.held = args.list;
        if (auto work = maybeKernel(std::move(call), opts.timeout, opts.asyncOp))
            return work;
    }
    Staging st(op);
    const at::Tensor out = st.inOut(args.local, "tensor");
    const Tensors ins = st.in(args.list, "scatter_list");
    const int root = args.root;
    const bool is_root = args.is_root;
    at::Tensor dst = outBuffer(out);
    return enqueue(OpType::SCATTER, op, {args.local}, opts.timeout, GroupSized::kRooted,
                   std::move(st), [this, out, ins, dst, root, is_root](Deadline dl) {
                       at::Tensor flat;
                       if (is_root)
                           flat = pack(ins, dst.options());
                       comm_->setNextCallSignature(shapeSignature(dst));
                       MC_RETURN_IF_ERROR(comm_->scatter(is_root ? ptrOf(flat) : nullptr,
                                                         ptrOf(dst), bytesOf(dst), root, dl));
                       copyBack(out, dst);
                       return Status::OK();
                   });
}

}  // namespace mooncake::pg
