// Communicator: argument checks, membership and epochs; the algorithms live
// in core/collectives/, one per file.
#include "mooncake-pg/core/communicator.h"

#include <utility>

#include <algorithm>
#include <limits>
#include <string>

#include "mooncake-pg/core/collectives/collectives.h"
#include "mooncake-pg/core/collectives/rounds.h"

namespace mooncake::pg {

using coll::CallDesc;
using coll::OpKind;
using coll::Rounds;

class Communicator::Impl {
public:
    Impl(std::shared_ptr<Fabric> fabric, CommOptions options)
        : fabric_(std::move(fabric)), options_(options) {
        coll::CommState& s = state_;
        s.fabric = fabric_.get();
        if (s.fabric == nullptr) {
            init_ = InvalidArgument("communicator: null fabric");
            return;
        }
        s.rank = s.fabric->rank();
        s.size = s.fabric->size();
        s.layout = coll::Layout{options.window_offset, s.size, coll::slotPayloadBytes(options)};
        // Round 0 compares the value as 32 bits; clamping here keeps the
        // algorithm choice consistent with what was compared.
        s.one_shot_max =
            std::min<size_t>(options.one_shot_max_bytes, std::numeric_limits<uint32_t>::max());
        s.reduce_threads = options.reduce_threads;
        s.active.assign(s.size, 1);
        s.read_in_place.assign(s.size, 0);
        setMembers();
        const size_t need = windowBytesFor(s.size, options);
        if (options.window_offset % coll::kLineBytes != 0) {
            init_ =
                InvalidArgument("communicator: window_offset " +
                                std::to_string(options.window_offset) + " is not a multiple of 64");
        } else if (s.fabric->windowBytes() < options.window_offset ||
                   s.fabric->windowBytes() - options.window_offset < need) {
            init_ = InvalidArgument("communicator: the collective area needs " +
                                    std::to_string(need) + " bytes at offset " +
                                    std::to_string(options.window_offset) + " of a " +
                                    std::to_string(s.fabric->windowBytes()) + "-byte window");
        } else if (s.layout.chunk > std::numeric_limits<uint32_t>::max()) {
            init_ = InvalidArgument("communicator: chunk_bytes must be below 4 GiB");
        }
    }

    void setMembers() {
        coll::CommState& s = state_;
        s.members.clear();
        s.index = -1;
        for (int r = 0; r < s.size; ++r) {
            if (s.active[r] == 0)
                continue;
            if (r == s.rank)
                s.index = static_cast<int>(s.members.size());
            s.members.push_back(r);
        }
    }

    // Common preconditions of every call; clears the previous failure. The
    // signature belongs to this call whatever happens to it.
    Status begin(OpKind kind) {
        signature_ = std::exchange(next_signature_, 0);
        state_.failure.failed_ranks.clear();
        if (!init_.ok())
            return init_;
        if (!state_.broken.empty()) {
            return Aborted(std::string(coll::opKindName(kind)) +
                           ": a previous call left the ranks out of step (" + state_.broken +
                           "); setMembership with a new epoch first");
        }
        if (state_.index < 0) {
            return InvalidArgument(std::string(coll::opKindName(kind)) + ": rank " +
                                   std::to_string(state_.rank) + " is not active in epoch " +
                                   std::to_string(state_.view_epoch));
        }
        return Status::OK();
    }

    // begin(), then the call's own argument checks. The members that pass
    // them go on into round 0 and wait for this rank, so a failed check is
    // not simply returned: the call still runs round 0 to fail on every
    // member together, and the next call lines up.
    template <typename Checks>
    Status start(OpKind kind, Deadline deadline, Checks&& checks) {
        MC_RETURN_IF_ERROR(begin(kind));
        Status st = checks();
        if (st.ok())
            return st;
        CallDesc call{kind};
        call.failed_locally = true;
        Rounds rounds(state_, call, deadline);
        return rounds.failTogether(st);
    }

    // Token epochs wrap, so a flag of an epoch 2^16 older would read as a
    // current one: at every epoch change this rank clears from its window
    // every flag but those of the new epoch, its floor and the few epochs
    // after it (peers already further on). A flag written before the change
    // is told apart as long as this rank skips fewer than 2^16 -
    // coll::kEpochsAhead epochs at once. A peer's concurrent write makes the
    // exchange fail, and that newer value stays.
    void clearOlderFlags(uint64_t epoch) {
        coll::CommState& s = state_;
        const auto now = static_cast<uint16_t>(epoch & coll::kEpochMask);
        const uint64_t floor = coll::epochFloor(now);
        uint8_t* window = s.fabric->localWindow();
        for (int p = 0; p < s.size; ++p) {
            if (p == s.rank)
                continue;
            for (uint64_t off :
                 {s.layout.dataFlag(p), s.layout.ackFlag(p), s.layout.abortFlag(p)}) {
                auto* flag = reinterpret_cast<uint64_t*>(window + off);
                uint64_t v = __atomic_load_n(flag, __ATOMIC_ACQUIRE);
                const auto ahead = static_cast<uint16_t>((v >> coll::kRoundBits) - now);
                if (v == 0 || v == floor || ahead < coll::kEpochsAhead)
                    continue;
                (void)__atomic_compare_exchange_n(flag, &v, uint64_t{0}, false, __ATOMIC_ACQ_REL,
                                                  __ATOMIC_ACQUIRE);
            }
        }
    }
    // The end of a call: one that completed here waits for its last puts to
    // land (Fabric::flush), bounded by kFlushTimeoutMs within the call's
    // deadline. A peer that does not take them by then is stalled, and the
    // call's result here stands: the peer finds out in its own call.
    Status finish(Status st, Deadline deadline) {
        if (st.ok()) {
            const Deadline bound = Deadline::afterMs(kFlushTimeoutMs);
            (void)state_.fabric->flush(deadline.at() < bound.at() ? deadline : bound);
        }
        return st;
    }
    static constexpr int64_t kFlushTimeoutMs = 5000;

    CallDesc describe(CallDesc call) const {
        call.signature = signature_;
        return call;
    }

    uint64_t next_signature_ = 0;
    uint64_t signature_ = 0;  // of the current call

    Status checkRoot(OpKind kind, int root) const {
        if (root < 0 || root >= state_.size || state_.active[root] == 0) {
            return InvalidArgument(std::string(coll::opKindName(kind)) + ": root " +
                                   std::to_string(root) + " is not an active rank");
        }
        return Status::OK();
    }

    static Status checkReduction(OpKind kind, DataType dtype, ReduceOp op) {
        std::string why;
        if (!reduceOpSupported(op, dtype, &why)) {
            return InvalidArgument(std::string(coll::opKindName(kind)) + ": " + why);
        }
        return Status::OK();
    }

    static Status checkBuffer(OpKind kind, const char* name, const void* p, size_t bytes) {
        if (p == nullptr && bytes != 0) {
            return InvalidArgument(std::string(coll::opKindName(kind)) + ": " + name +
                                   " is null for " + std::to_string(bytes) + " bytes");
        }
        return Status::OK();
    }

    // bytes = count * element size, refusing overflow.
    static Status byteSize(OpKind kind, size_t count, size_t element, size_t* bytes) {
        if (element != 0 && count > std::numeric_limits<size_t>::max() / element) {
            return InvalidArgument(std::string(coll::opKindName(kind)) + ": count " +
                                   std::to_string(count) + " overflows");
        }
        *bytes = count * element;
        return Status::OK();
    }

    std::shared_ptr<Fabric> fabric_;
    CommOptions options_;
    coll::CommState state_;
    Status init_;
};

size_t Communicator::windowBytesFor(int size, const CommOptions& options) {
    return coll::Layout::bytes(size, coll::slotPayloadBytes(options));
}

Communicator::Communicator(std::shared_ptr<Fabric> fabric, CommOptions options)
    : impl_(std::make_unique<Impl>(std::move(fabric), options)) {}

Communicator::~Communicator() = default;

int Communicator::rank() const {
    return impl_->state_.rank;
}
int Communicator::size() const {
    return impl_->state_.size;
}
const std::vector<uint8_t>& Communicator::active() const {
    return impl_->state_.active;
}
const CollectiveFailure& Communicator::lastFailure() const {
    return impl_->state_.failure;
}

Status Communicator::setMembership(const std::vector<uint8_t>& active, uint64_t epoch) {
    coll::CommState& s = impl_->state_;
    MC_RETURN_IF_ERROR(impl_->init_);
    if (static_cast<int>(active.size()) != s.size) {
        return InvalidArgument("setMembership: mask has " + std::to_string(active.size()) +
                               " entries for " + std::to_string(s.size) + " ranks");
    }
    if (epoch < s.view_epoch) {
        return InvalidArgument("setMembership: epoch " + std::to_string(epoch) +
                               " is older than the current epoch " + std::to_string(s.view_epoch));
    }
    std::vector<uint8_t> mask(active.size());
    for (size_t r = 0; r < active.size(); ++r)
        mask[r] = active[r] != 0 ? 1 : 0;
    if (epoch == s.view_epoch) {
        if (mask == s.active)
            return Status::OK();
        // Ranks joining mid-epoch would not share the round counter.
        if (s.round != coll::kFirstRound) {
            return InvalidArgument(
                "setMembership: changing the active ranks after calls in "
                "epoch " +
                std::to_string(epoch) + " needs a new epoch");
        }
        s.active = std::move(mask);
        impl_->setMembers();
        return Status::OK();
    }
    const std::vector<int> old_members = s.members;
    s.active = std::move(mask);
    impl_->setMembers();
    impl_->clearOlderFlags(epoch);
    s.view_epoch = epoch;
    s.epoch = static_cast<uint32_t>(epoch & coll::kEpochMask);
    s.round = coll::kFirstRound;
    s.seq = 0;
    s.broken.clear();
    // Relearnt in the next call, in case a peer came back as a new process.
    s.read_in_place.assign(s.size, 0);
    if (s.index < 0)
        return Status::OK();
    // Tell every member that this rank will never read a message of an older
    // epoch again, so the slots those messages occupy are free. A member that
    // cannot be reached fails the next call instead. No op bounds these
    // writes; a member that cannot take one soon is stalled or dead.
    const Deadline notices = Deadline::afterMs(kMembershipNoticeTimeoutMs);
    for (int m : s.members) {
        if (m == s.rank)
            continue;
        (void)s.fabric->putFlag(m, s.layout.ackFlag(s.rank), coll::epochFloor(s.epoch), notices);
    }
    // A member this view dropped may still be inside a call of the old
    // epoch, waiting for ranks that will never send again: the notice ends
    // that call (rounds.h). It is dead or unreachable if the write fails.
    for (int m : old_members) {
        if (m != s.rank && s.active[m] == 0) {
            (void)s.fabric->putFlag(m, s.layout.abortFlag(s.rank),
                                    coll::encodeAbortNotice(s.epoch, coll::kRemovedReason, m),
                                    notices);
        }
    }
    return Status::OK();
}

Status Communicator::allReduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                               Deadline deadline) {
    constexpr OpKind kind = OpKind::kAllReduce;
    MC_RETURN_IF_ERROR(impl_->start(kind, deadline, [&]() -> Status {
        MC_RETURN_IF_ERROR(Impl::checkReduction(kind, dtype, op));
        size_t bytes = 0;
        MC_RETURN_IF_ERROR(Impl::byteSize(kind, count, dataTypeSize(dtype), &bytes));
        MC_RETURN_IF_ERROR(Impl::checkBuffer(kind, "in", in, bytes));
        return Impl::checkBuffer(kind, "out", out, bytes);
    }));
    Rounds rounds(impl_->state_, impl_->describe(CallDesc{kind, dtype, op, -1, count}), deadline);
    return impl_->finish(coll::allReduce(rounds, in, out, count, dtype, op), deadline);
}

Status Communicator::broadcast(void* buf, size_t bytes, int root, Deadline deadline) {
    constexpr OpKind kind = OpKind::kBroadcast;
    MC_RETURN_IF_ERROR(impl_->start(kind, deadline, [&]() -> Status {
        MC_RETURN_IF_ERROR(impl_->checkRoot(kind, root));
        return Impl::checkBuffer(kind, "buf", buf, bytes);
    }));
    Rounds rounds(impl_->state_,
                  impl_->describe(CallDesc{kind, DataType::kUInt8, ReduceOp::kSum, root, bytes}),
                  deadline);
    return impl_->finish(coll::broadcast(rounds, buf, bytes, root), deadline);
}

Status Communicator::reduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                            int root, Deadline deadline) {
    constexpr OpKind kind = OpKind::kReduce;
    MC_RETURN_IF_ERROR(impl_->start(kind, deadline, [&]() -> Status {
        MC_RETURN_IF_ERROR(impl_->checkRoot(kind, root));
        MC_RETURN_IF_ERROR(Impl::checkReduction(kind, dtype, op));
        size_t bytes = 0;
        MC_RETURN_IF_ERROR(Impl::byteSize(kind, count, dataTypeSize(dtype), &bytes));
        MC_RETURN_IF_ERROR(Impl::checkBuffer(kind, "in", in, bytes));
        if (rank() == root)
            return Impl::checkBuffer(kind, "out", out, bytes);
        return Status::OK();
    }));
    Rounds rounds(impl_->state_, impl_->describe(CallDesc{kind, dtype, op, root, count}), deadline);
    return impl_->finish(coll::reduce(rounds, in, out, count, dtype, op, root), deadline);
}

Status Communicator::allGather(const void* in, void* out, size_t bytes_per_rank,
                               Deadline deadline) {
    constexpr OpKind kind = OpKind::kAllGather;
    MC_RETURN_IF_ERROR(impl_->start(kind, deadline, [&]() -> Status {
        size_t total = 0;
        MC_RETURN_IF_ERROR(Impl::byteSize(kind, bytes_per_rank, size(), &total));
        MC_RETURN_IF_ERROR(Impl::checkBuffer(kind, "in", in, bytes_per_rank));
        return Impl::checkBuffer(kind, "out", out, total);
    }));
    Rounds rounds(
        impl_->state_,
        impl_->describe(CallDesc{kind, DataType::kUInt8, ReduceOp::kSum, -1, bytes_per_rank}),
        deadline);
    return impl_->finish(coll::allGather(rounds, in, out, bytes_per_rank), deadline);
}

Status Communicator::reduceScatter(const void* in, void* out, size_t count_per_rank, DataType dtype,
                                   ReduceOp op, Deadline deadline) {
    constexpr OpKind kind = OpKind::kReduceScatter;
    MC_RETURN_IF_ERROR(impl_->start(kind, deadline, [&]() -> Status {
        MC_RETURN_IF_ERROR(Impl::checkReduction(kind, dtype, op));
        size_t block = 0;
        size_t total = 0;
        MC_RETURN_IF_ERROR(Impl::byteSize(kind, count_per_rank, dataTypeSize(dtype), &block));
        MC_RETURN_IF_ERROR(Impl::byteSize(kind, block, size(), &total));
        MC_RETURN_IF_ERROR(Impl::checkBuffer(kind, "in", in, total));
        return Impl::checkBuffer(kind, "out", out, block);
    }));
    Rounds rounds(impl_->state_, impl_->describe(CallDesc{kind, dtype, op, -1, count_per_rank}),
                  deadline);
    return impl_->finish(coll::reduceScatter(rounds, in, out, count_per_rank, dtype, op), deadline);
}

Status Communicator::allToAllV(const void* in, const std::vector<size_t>& send_bytes,
                               const std::vector<size_t>& send_offsets, void* out,
                               const std::vector<size_t>& recv_bytes,
                               const std::vector<size_t>& recv_offsets, Deadline deadline) {
    constexpr OpKind kind = OpKind::kAllToAllV;
    MC_RETURN_IF_ERROR(impl_->start(kind, deadline, [&]() -> Status {
        const size_t n = static_cast<size_t>(size());
        if (send_bytes.size() != n || send_offsets.size() != n || recv_bytes.size() != n ||
            recv_offsets.size() != n) {
            return InvalidArgument("all_to_all_v: byte and offset vectors need " +
                                   std::to_string(n) + " entries each; got send_bytes " +
                                   std::to_string(send_bytes.size()) + ", send_offsets " +
                                   std::to_string(send_offsets.size()) + ", recv_bytes " +
                                   std::to_string(recv_bytes.size()) + ", recv_offsets " +
                                   std::to_string(recv_offsets.size()));
        }
        const int me = rank();
        if (send_bytes[me] != recv_bytes[me]) {
            return InvalidArgument("all_to_all_v: rank " + std::to_string(me) +
                                   " passed send_bytes[" + std::to_string(me) +
                                   "]=" + std::to_string(send_bytes[me]) + " but recv_bytes[" +
                                   std::to_string(me) + "]=" + std::to_string(recv_bytes[me]) +
                                   "; a rank's piece to itself must have one size");
        }
        size_t send_total = 0;
        size_t recv_total = 0;
        for (int m : impl_->state_.members) {
            send_total |= send_bytes[m];
            recv_total |= recv_bytes[m];
        }
        MC_RETURN_IF_ERROR(Impl::checkBuffer(kind, "in", in, send_total));
        MC_RETURN_IF_ERROR(Impl::checkBuffer(kind, "out", out, recv_total));
        if (in == out && (send_total | recv_total) != 0) {
            // Pieces received early would overwrite bytes still to be sent.
            return InvalidArgument("all_to_all_v: in and out must not be the same buffer");
        }
        return Status::OK();
    }));
    CallDesc call{kind, DataType::kUInt8, ReduceOp::kSum, -1, 0, &send_bytes, &recv_bytes};
    Rounds rounds(impl_->state_, impl_->describe(call), deadline);
    return impl_->finish(
        coll::allToAllV(rounds, in, send_bytes, send_offsets, out, recv_bytes, recv_offsets),
        deadline);
}

Status Communicator::gather(const void* in, void* out, size_t bytes_per_rank, int root,
                            Deadline deadline) {
    constexpr OpKind kind = OpKind::kGather;
    MC_RETURN_IF_ERROR(impl_->start(kind, deadline, [&]() -> Status {
        MC_RETURN_IF_ERROR(impl_->checkRoot(kind, root));
        size_t total = 0;
        MC_RETURN_IF_ERROR(Impl::byteSize(kind, bytes_per_rank, size(), &total));
        MC_RETURN_IF_ERROR(Impl::checkBuffer(kind, "in", in, bytes_per_rank));
        if (rank() == root)
            return Impl::checkBuffer(kind, "out", out, total);
        return Status::OK();
    }));
    Rounds rounds(
        impl_->state_,
        impl_->describe(CallDesc{kind, DataType::kUInt8, ReduceOp::kSum, root, bytes_per_rank}),
        deadline);
    return impl_->finish(coll::gather(rounds, in, out, bytes_per_rank, root), deadline);
}

Status Communicator::scatter(const void* in, void* out, size_t bytes_per_rank, int root,
                             Deadline deadline) {
    constexpr OpKind kind = OpKind::kScatter;
    MC_RETURN_IF_ERROR(impl_->start(kind, deadline, [&]() -> Status {
        MC_RETURN_IF_ERROR(impl_->checkRoot(kind, root));
        size_t total = 0;
        MC_RETURN_IF_ERROR(Impl::byteSize(kind, bytes_per_rank, size(), &total));
        if (rank() == root)
            MC_RETURN_IF_ERROR(Impl::checkBuffer(kind, "in", in, total));
        return Impl::checkBuffer(kind, "out", out, bytes_per_rank);
    }));
    Rounds rounds(
        impl_->state_,
        impl_->describe(CallDesc{kind, DataType::kUInt8, ReduceOp::kSum, root, bytes_per_rank}),
        deadline);
    return impl_->finish(coll::scatter(rounds, in, out, bytes_per_rank, root), deadline);
}

Status Communicator::barrier(Deadline deadline) {
    constexpr OpKind kind = OpKind::kBarrier;
    MC_RETURN_IF_ERROR(impl_->start(kind, deadline, [] { return Status::OK(); }));
    Rounds rounds(impl_->state_, impl_->describe(CallDesc{kind}), deadline);
    return impl_->finish(coll::barrier(rounds), deadline);
}

void Communicator::setNextCallSignature(uint64_t signature) {
    impl_->next_signature_ = signature;
}

}  // namespace mooncake::pg
