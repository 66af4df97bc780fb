// MooncakeBackend's collective entry points. Each one validates its
// arguments on the caller's thread (so a bad call fails before anything is
// transferred), picks contiguous buffers for the core, and queues a closure
// that makes the core calls and copies results into the user's tensors.
// Closures hold the tensors they touch, so those outlive the op.
#include <utility>

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include "mooncake-pg/core/communicator.h"
#include "mooncake-pg/torch/backend.h"

namespace mooncake::pg {

namespace {

using c10d::OpType;
using Tensors = std::vector<at::Tensor>;

// The core takes raw pointers; an empty tensor may have none.
alignas(64) uint8_t kNoData[64];

void* ptrOf(const at::Tensor& t) {
    void* p = t.data_ptr();
    return p != nullptr ? p : kNoData;
}

size_t bytesOf(const at::Tensor& t) {
    return static_cast<size_t>(t.numel()) * t.element_size();
}

// A contiguous stand-in the core reads and writes for `t`: `t` itself, or a
// contiguous copy whose result copyBack() returns to `t`.
at::Tensor inOutBuffer(const at::Tensor& t) {
    return t.is_contiguous() ? t : t.contiguous();
}

// A contiguous stand-in the core only writes.
at::Tensor outBuffer(const at::Tensor& t) {
    return t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
}

// A contiguous stand-in the core only reads. Inputs that alias the output
// (in-place all_gather_into_tensor, as FSDP issues) are snapshotted, since
// the core writes the output while it still reads the input.
at::Tensor inBuffer(const at::Tensor& t, const at::Tensor& output) {
    if (output.defined() && at::get_overlap_status(t, output) != at::MemOverlapStatus::No) {
        return t.clone(at::MemoryFormat::Contiguous);
    }
    return t.is_contiguous() ? t : t.contiguous();
}

// Dtype and shape hashed (FNV-1a), so ranks whose calls move the same bytes
// with different tensors fail in the core's round-0 check instead of
// silently reinterpreting each other's data.
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
    return h | 1;  // never 0, which means "no signature"
}

void copyBack(const at::Tensor& user, const at::Tensor& buffer) {
    if (!buffer.is_same(user))
        user.copy_(buffer);
}

// Block `r` of a flat buffer holding equal blocks, shaped like `like`.
at::Tensor block(const at::Tensor& flat, int64_t r, const at::Tensor& like) {
    return flat.narrow(0, r * like.numel(), like.numel()).view(like.sizes());
}

// Flattens `parts` into one contiguous buffer, in order.
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

}  // namespace

c10::intrusive_ptr<c10d::Work> MooncakeBackend::broadcast(Tensors& tensors,
                                                          const c10d::BroadcastOptions& opts) {
    const char* op = "broadcast";
    checkSingle(tensors, op);
    checkRank(opts.rootRank, op, "root");
    TORCH_CHECK(opts.rootTensor == 0, "Mooncake PG: broadcast: root_tensor ", opts.rootTensor,
                " is out of range for a single-tensor call (expected 0)");
    const at::Tensor t = tensors[0];
    checkTensor(t, op, "tensor");
    checkDtype(t, op, "tensor");
    at::Tensor buf = inOutBuffer(t);
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(OpType::BROADCAST, op, {t}, opts.timeout, [this, t, buf, root](Deadline dl) {
        comm_->setNextCallSignature(shapeSignature(buf));
        MC_RETURN_IF_ERROR(comm_->broadcast(ptrOf(buf), bytesOf(buf), root, dl));
        copyBack(t, buf);
        return Status::OK();
    });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::allreduce(Tensors& tensors,
                                                          const c10d::AllreduceOptions& opts) {
    const char* op = "all_reduce";
    checkSingle(tensors, op);
    TORCH_CHECK(!opts.sparseIndices.has_value(),
                "Mooncake PG: all_reduce of sparse tensors is "
                "not supported");
    const at::Tensor t = tensors[0];
    checkTensor(t, op, "tensor");
    const DataType dtype = checkDtype(t, op, "tensor");
    const ReduceOp rop = checkReduceOp(opts.reduceOp, dtype, op);
    at::Tensor buf = inOutBuffer(t);
    return enqueue(OpType::ALLREDUCE, op, {t}, opts.timeout,
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
        bufs.push_back(inOutBuffer(tensors[i]));
    }
    return enqueue(
        OpType::ALLREDUCE_COALESCED, op, tensors, opts.timeout,
        [this, user = tensors, bufs, dtypes, rops](Deadline dl) {
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
    const at::Tensor t = tensors[0];
    checkTensor(t, op, "tensor");
    const DataType dtype = checkDtype(t, op, "tensor");
    const ReduceOp rop = checkReduceOp(opts.reduceOp, dtype, op);
    at::Tensor buf = inOutBuffer(t);
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(OpType::REDUCE, op, {t}, opts.timeout,
                   [this, t, buf, dtype, rop, root](Deadline dl) {
                       void* p = ptrOf(buf);
                       comm_->setNextCallSignature(shapeSignature(buf));
                       MC_RETURN_IF_ERROR(comm_->reduce(p, p, buf.numel(), dtype, rop, root, dl));
                       copyBack(t, buf);
                       return Status::OK();
                   });
}

// Checks a list of per-rank tensors against the local one: one per rank,
// same dtype, same element count.
static void checkPerRankList(const MooncakeBackend& backend, const Tensors& list,
                             const at::Tensor& like, const char* op, const char* list_name) {
    TORCH_CHECK(static_cast<int>(list.size()) == backend.groupSize(), "Mooncake PG: ", op, ": ",
                list_name, " has ", list.size(), " tensors; expected one per rank of the group (",
                backend.groupSize(), ")");
    for (size_t r = 0; r < list.size(); ++r) {
        TORCH_CHECK(list[r].defined() && list[r].scalar_type() == like.scalar_type(),
                    "Mooncake PG: ", op, ": ", list_name, "[", r, "] has dtype ",
                    list[r].defined() ? dtypeName(list[r].scalar_type()) : "undefined",
                    "; expected ", dtypeName(like.scalar_type()), " like the local tensor");
        TORCH_CHECK(list[r].numel() == like.numel(), "Mooncake PG: ", op, ": ", list_name, "[", r,
                    "] has ", list[r].numel(), " elements; expected ", like.numel(),
                    " like the local tensor");
    }
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::allgather(std::vector<Tensors>& outputs,
                                                          Tensors& inputs,
                                                          const c10d::AllgatherOptions& opts) {
    const char* op = "all_gather";
    checkSingle(inputs, op);
    TORCH_CHECK(outputs.size() == 1, "Mooncake PG: all_gather takes one output list, got ",
                outputs.size());
    const at::Tensor in = inputs[0];
    checkTensor(in, op, "input tensor");
    checkDtype(in, op, "input tensor");
    const Tensors outs = outputs[0];
    checkPerRankList(*this, outs, in, op, "tensor_list");
    for (size_t r = 0; r < outs.size(); ++r) {
        checkTensor(outs[r], op, "tensor_list[" + std::to_string(r) + "]");
    }
    at::Tensor src = inBuffer(in, at::Tensor());
    const int n = groupSize();
    return enqueue(OpType::ALLGATHER, op, outs, opts.timeout, [this, outs, src, n](Deadline dl) {
        at::Tensor flat = at::empty({n * src.numel()}, src.options());
        comm_->setNextCallSignature(shapeSignature(src));
        MC_RETURN_IF_ERROR(comm_->allGather(ptrOf(src), ptrOf(flat), bytesOf(src), dl));
        for (int r = 0; r < n; ++r)
            outs[r].copy_(block(flat, r, outs[r]));
        return Status::OK();
    });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
    const char* op = "all_gather_into_tensor";
    checkTensor(input, op, "input tensor");
    checkTensor(output, op, "output tensor");
    checkDtype(input, op, "input tensor");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "Mooncake PG: ", op,
                ": output tensor has dtype ", dtypeName(output.scalar_type()),
                " but the input has ", dtypeName(input.scalar_type()));
    TORCH_CHECK(output.numel() == input.numel() * groupSize(), "Mooncake PG: ", op,
                ": output tensor has ", output.numel(), " elements; expected input elements (",
                input.numel(), ") x group size (", groupSize(),
                ") = ", input.numel() * groupSize());
    at::Tensor src = inBuffer(input, output);
    at::Tensor dst = outBuffer(output);
    const at::Tensor out = output;
    return enqueue(
        OpType::_ALLGATHER_BASE, op, {out}, opts.timeout, [this, out, src, dst](Deadline dl) {
            comm_->setNextCallSignature(shapeSignature(src));
            MC_RETURN_IF_ERROR(comm_->allGather(ptrOf(src), ptrOf(dst), bytesOf(src), dl));
            copyBack(out, dst);
            return Status::OK();
        });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::allgather_into_tensor_coalesced(
    Tensors& outputs, Tensors& inputs, const c10d::AllgatherOptions& opts) {
    const char* op = "all_gather_into_tensor_coalesced";
    TORCH_CHECK(outputs.size() == inputs.size(), "Mooncake PG: ", op, ": ", outputs.size(),
                " outputs for ", inputs.size(), " inputs; expected one output per input");
    Tensors srcs, dsts;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const std::string idx = "[" + std::to_string(i) + "]";
        checkTensor(inputs[i], op, "inputs" + idx);
        checkTensor(outputs[i], op, "outputs" + idx);
        checkDtype(inputs[i], op, "inputs" + idx);
        TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type(), "Mooncake PG: ", op,
                    ": outputs", idx, " has dtype ", dtypeName(outputs[i].scalar_type()),
                    " but inputs", idx, " has ", dtypeName(inputs[i].scalar_type()));
        TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * groupSize(), "Mooncake PG: ", op,
                    ": outputs", idx, " has ", outputs[i].numel(), " elements; expected ",
                    inputs[i].numel() * groupSize(), " (input elements x group size)");
        srcs.push_back(inBuffer(inputs[i], outputs[i]));
        dsts.push_back(outBuffer(outputs[i]));
    }
    return enqueue(OpType::COALESCED, op, outputs, opts.timeout,
                   [this, outs = outputs, srcs, dsts](Deadline dl) {
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
    Tensors srcs, flat_outputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const std::string what = "input_tensor_list[" + std::to_string(i) + "]";
        checkTensor(inputs[i], op, what);
        checkDtype(inputs[i], op, what);
        srcs.push_back(inBuffer(inputs[i], at::Tensor()));
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
    return enqueue(OpType::ALLGATHER_COALESCED, op, flat_outputs, opts.timeout,
                   [this, outs = output_lists, srcs, n](Deadline dl) {
                       for (size_t i = 0; i < srcs.size(); ++i) {
                           at::Tensor flat = at::empty({n * srcs[i].numel()}, srcs[i].options());
                           MC_RETURN_IF_ERROR(
                               comm_->allGather(ptrOf(srcs[i]), ptrOf(flat), bytesOf(srcs[i]), dl));
                           for (int r = 0; r < n; ++r) {
                               outs[r][i].copy_(block(flat, r, outs[r][i]));
                           }
                       }
                       return Status::OK();
                   });
}

// The per-rank list of a rooted call (gather_list / scatter_list): checked
// and returned on the root; on other ranks it must be absent.
Tensors MooncakeBackend::rootList(std::vector<Tensors>& lists, const at::Tensor& like, int root,
                                  const char* op, const char* name) {
    Tensors list;
    if (root == config_.rank) {
        TORCH_CHECK(lists.size() == 1, "Mooncake PG: ", op, ": the root (rank ", root,
                    ") takes one ", name, ", got ", lists.size(), " lists");
        list = lists[0];
        checkPerRankList(*this, list, like, op, name);
        for (size_t r = 0; r < list.size(); ++r) {
            checkTensor(list[r], op, std::string(name) + "[" + std::to_string(r) + "]");
        }
    } else {
        TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), "Mooncake PG: ", op,
                    ": only the root (rank ", root, ") takes a ", name, "; rank ", config_.rank,
                    " passed one");
    }
    return list;
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::gather(std::vector<Tensors>& outputs,
                                                       Tensors& inputs,
                                                       const c10d::GatherOptions& opts) {
    const char* op = "gather";
    checkSingle(inputs, op);
    checkRank(opts.rootRank, op, "dst");
    const at::Tensor in = inputs[0];
    checkTensor(in, op, "tensor");
    checkDtype(in, op, "tensor");
    const int root = static_cast<int>(opts.rootRank);
    const bool is_root = root == config_.rank;
    const Tensors outs = rootList(outputs, in, root, op, "gather_list");
    at::Tensor src = inBuffer(in, at::Tensor());
    const int n = groupSize();
    return enqueue(
        OpType::GATHER, op, outs, opts.timeout, [this, outs, src, root, is_root, n](Deadline dl) {
            at::Tensor flat;
            if (is_root)
                flat = at::empty({n * src.numel()}, src.options());
            comm_->setNextCallSignature(shapeSignature(src));
            MC_RETURN_IF_ERROR(
                comm_->gather(ptrOf(src), is_root ? ptrOf(flat) : nullptr, bytesOf(src), root, dl));
            for (size_t r = 0; r < outs.size(); ++r) {
                outs[r].copy_(block(flat, static_cast<int64_t>(r), outs[r]));
            }
            return Status::OK();
        });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::scatter(Tensors& outputs,
                                                        std::vector<Tensors>& inputs,
                                                        const c10d::ScatterOptions& opts) {
    const char* op = "scatter";
    checkSingle(outputs, op);
    checkRank(opts.rootRank, op, "src");
    const at::Tensor out = outputs[0];
    checkTensor(out, op, "tensor");
    checkDtype(out, op, "tensor");
    const int root = static_cast<int>(opts.rootRank);
    const bool is_root = root == config_.rank;
    const Tensors ins = rootList(inputs, out, root, op, "scatter_list");
    at::Tensor dst = outBuffer(out);
    return enqueue(OpType::SCATTER, op, {out}, opts.timeout,
                   [this, out, ins, dst, root, is_root](Deadline dl) {
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

c10::intrusive_ptr<c10d::Work> MooncakeBackend::reduce_scatter(
    Tensors& outputs, std::vector<Tensors>& inputs, const c10d::ReduceScatterOptions& opts) {
    const char* op = "reduce_scatter";
    checkSingle(outputs, op);
    TORCH_CHECK(inputs.size() == 1, "Mooncake PG: reduce_scatter takes one input list, got ",
                inputs.size());
    const at::Tensor out = outputs[0];
    checkTensor(out, op, "output");
    const DataType dtype = checkDtype(out, op, "output");
    const ReduceOp rop = checkReduceOp(opts.reduceOp, dtype, op);
    const Tensors ins = inputs[0];
    checkPerRankList(*this, ins, out, op, "input_list");
    for (size_t r = 0; r < ins.size(); ++r) {
        checkTensor(ins[r], op, "input_list[" + std::to_string(r) + "]");
    }
    at::Tensor dst = outBuffer(out);
    return enqueue(OpType::REDUCE_SCATTER, op, {out}, opts.timeout,
                   [this, out, ins, dst, dtype, rop](Deadline dl) {
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
    checkTensor(input, op, "input tensor");
    checkTensor(output, op, "output tensor");
    const DataType dtype = checkDtype(input, op, "input tensor");
    const ReduceOp rop = checkReduceOp(opts.reduceOp, dtype, op);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "Mooncake PG: ", op,
                ": output tensor has dtype ", dtypeName(output.scalar_type()),
                " but the input has ", dtypeName(input.scalar_type()));
    TORCH_CHECK(input.numel() == output.numel() * groupSize(), "Mooncake PG: ", op,
                ": input tensor has ", input.numel(), " elements; expected output elements (",
                output.numel(), ") x group size (", groupSize(),
                ") = ", output.numel() * groupSize());
    at::Tensor src = inBuffer(input, output);
    at::Tensor dst = outBuffer(output);
    const at::Tensor out = output;
    return enqueue(OpType::_REDUCE_SCATTER_BASE, op, {out}, opts.timeout,
                   [this, out, src, dst, dtype, rop](Deadline dl) {
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
    TORCH_CHECK(outputs.size() == inputs.size(), "Mooncake PG: ", op, ": ", outputs.size(),
                " outputs for ", inputs.size(), " inputs; expected one output per input");
    Tensors srcs, dsts;
    std::vector<DataType> dtypes;
    std::vector<ReduceOp> rops;
    for (size_t i = 0; i < inputs.size(); ++i) {
        const std::string idx = "[" + std::to_string(i) + "]";
        checkTensor(inputs[i], op, "inputs" + idx);
        checkTensor(outputs[i], op, "outputs" + idx);
        dtypes.push_back(checkDtype(inputs[i], op, "inputs" + idx));
        rops.push_back(checkReduceOp(opts.reduceOp, dtypes.back(), op));
        TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type() &&
                        inputs[i].numel() == outputs[i].numel() * groupSize(),
                    "Mooncake PG: ", op, ": outputs", idx, " (",
                    dtypeName(outputs[i].scalar_type()), ", ", outputs[i].numel(),
                    " elements) does not match inputs", idx, " (",
                    dtypeName(inputs[i].scalar_type()), ", ", inputs[i].numel(),
                    " elements); expected the same dtype and input elements = output elements x ",
                    groupSize());
        srcs.push_back(inBuffer(inputs[i], outputs[i]));
        dsts.push_back(outBuffer(outputs[i]));
    }
    return enqueue(
        OpType::COALESCED, op, outputs, opts.timeout,
        [this, outs = outputs, srcs, dsts, dtypes, rops](Deadline dl) {
            for (size_t i = 0; i < srcs.size(); ++i) {
                MC_RETURN_IF_ERROR(comm_->reduceScatter(ptrOf(srcs[i]), ptrOf(dsts[i]),
                                                        dsts[i].numel(), dtypes[i], rops[i], dl));
                copyBack(outs[i], dsts[i]);
            }
            return Status::OK();
        });
}

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
    checkTensor(input, op, "input tensor");
    checkTensor(output, op, "output tensor");
    checkDtype(input, op, "input tensor");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "Mooncake PG: ", op,
                ": output tensor has dtype ", dtypeName(output.scalar_type()),
                " but the input has ", dtypeName(input.scalar_type()));
    const int n = groupSize();
    std::vector<size_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
    splitBytes(input, input_split_sizes, n, op, "input", &send_bytes, &send_offsets);
    splitBytes(output, output_split_sizes, n, op, "output", &recv_bytes, &recv_offsets);
    at::Tensor src = inBuffer(input, output);
    at::Tensor dst = outBuffer(output);
    const at::Tensor out = output;
    return enqueue(
        OpType::ALLTOALL_BASE, op, {out}, opts.timeout,
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
    checkDtype(inputs[0], op, "input_tensor_list[0]");
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
    const auto options = inputs[0].options();
    return enqueue(
        OpType::ALLTOALL, op, outputs, opts.timeout,
        [this, outs = outputs, ins = inputs, options, send_bytes, send_offsets, recv_bytes,
         recv_offsets](Deadline dl) {
            at::Tensor flat_in = pack(ins, options);
            int64_t total_out = 0;
            for (const auto& o : outs)
                total_out += o.numel();
            at::Tensor flat_out = at::empty({total_out}, options);
            MC_RETURN_IF_ERROR(comm_->allToAllV(ptrOf(flat_in), send_bytes, send_offsets,
                                                ptrOf(flat_out), recv_bytes, recv_offsets, dl));
            int64_t offset = 0;
            for (const auto& o : outs) {
                o.copy_(flat_out.narrow(0, offset, o.numel()).view(o.sizes()));
                offset += o.numel();
            }
            return Status::OK();
        });
}

c10::intrusive_ptr<c10d::Work> MooncakeBackend::barrier(const c10d::BarrierOptions& opts) {
    return enqueue(OpType::BARRIER, "barrier", {}, opts.timeout,
                   [this](Deadline dl) { return comm_->barrier(dl); });
}

}  // namespace mooncake::pg
