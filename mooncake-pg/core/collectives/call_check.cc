#include "mooncake-pg/core/collectives/call_check.h"

#include <cstdio>

#include <string>
#include <tuple>

namespace mooncake::pg::coll {
namespace {

struct Difference {
    const char* field = nullptr;
    std::string value;      // the differing member's
    std::string reference;  // the lowest member's
};

std::string kindName(uint8_t v) {
    return opKindName(static_cast<OpKind>(v));
}
std::string dtypeName(uint8_t v) {
    return dataTypeName(static_cast<DataType>(v));
}
std::string opName(uint8_t v) {
    return reduceOpName(static_cast<ReduceOp>(v));
}

// What the count field means for each collective (its name in messages);
// nullptr when the collective does not compare it.
const char* countField(OpKind kind) {
    switch (kind) {
        case OpKind::kAllReduce:
        case OpKind::kReduce:
            return "count";
        case OpKind::kBroadcast:
            return "bytes";
        case OpKind::kAllGather:
        case OpKind::kGather:
        case OpKind::kScatter:
            return "bytes_per_rank";
        case OpKind::kReduceScatter:
            return "count_per_rank";
        case OpKind::kAllToAllV:
        case OpKind::kBarrier:
            return nullptr;
    }
    return nullptr;
}

bool usesReduction(OpKind kind) {
    return kind == OpKind::kAllReduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter;
}

bool usesRoot(OpKind kind) {
    return kind == OpKind::kBroadcast || kind == OpKind::kReduce || kind == OpKind::kGather ||
           kind == OpKind::kScatter;
}

std::string hexSignature(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(v));
    return buf;
}

bool differs(const MsgHeader& h, const MsgHeader& ref, Difference* d) {
    auto set = [&](const char* field, std::string value, std::string reference) {
        d->field = field;
        d->value = std::move(value);
        d->reference = std::move(reference);
        return true;
    };
    // The collective itself first: the other fields mean nothing across
    // different collectives.
    if (h.kind != ref.kind)
        return set("collective", kindName(h.kind), kindName(ref.kind));
    if (h.seq != ref.seq) {
        return set("call_sequence", std::to_string(h.seq), std::to_string(ref.seq));
    }
    if (h.chunk_bytes != ref.chunk_bytes) {
        return set("chunk_bytes", std::to_string(h.chunk_bytes), std::to_string(ref.chunk_bytes));
    }
    if (h.one_shot_max != ref.one_shot_max) {
        return set("one_shot_max_bytes", std::to_string(h.one_shot_max),
                   std::to_string(ref.one_shot_max));
    }
    const auto kind = static_cast<OpKind>(h.kind);
    if (usesReduction(kind)) {
        if (h.dtype != ref.dtype)
            return set("dtype", dtypeName(h.dtype), dtypeName(ref.dtype));
        if (h.op != ref.op)
            return set("op", opName(h.op), opName(ref.op));
    }
    if (usesRoot(kind) && h.root != ref.root) {
        return set("root", std::to_string(h.root), std::to_string(ref.root));
    }
    const char* count = countField(kind);
    if (count != nullptr && h.count != ref.count) {
        return set(count, std::to_string(h.count), std::to_string(ref.count));
    }
    if (h.signature != ref.signature) {
        // Same sizes but different shapes or dtypes (e.g. [2, 6] vs [3, 4], or
        // float32 vs int32 in a broadcast): the bytes would line up while
        // meaning different things.
        return set("tensor shape/dtype signature", hexSignature(h.signature),
                   hexSignature(ref.signature));
    }
    return false;
}

Status checkAllToAllV(const CommState& state, const CallDesc& call,
                      const std::vector<MsgHeader>& headers) {
    uint64_t digest = 0;
    for (int m : state.members)
        digest += headers[m].digest;

    // The pairs this rank is part of: the smallest (sender, receiver) that
    // disagrees, so both ends of a pair word the error identically.
    const auto& send = *call.send_bytes;
    const auto& recv = *call.recv_bytes;
    const int me = state.rank;
    bool found = false;
    std::tuple<int, int, uint64_t, uint64_t> worst;  // sender, receiver, send, recv
    auto consider = [&](int s, int r, uint64_t sent, uint64_t expected) {
        auto candidate = std::make_tuple(s, r, sent, expected);
        if (!found || std::tie(s, r) < std::tie(std::get<0>(worst), std::get<1>(worst))) {
            worst = candidate;
            found = true;
        }
    };
    for (int p : state.members) {
        if (p == me)
            continue;
        if (headers[p].pair_bytes != recv[p])
            consider(p, me, headers[p].pair_bytes, recv[p]);
        if (headers[p].count != send[p])
            consider(me, p, send[p], headers[p].count);
    }
    if (found) {
        const auto& [s, r, sent, expected] = worst;
        return InvalidArgument("all_to_all_v: rank " + std::to_string(s) + " passed send_bytes[" +
                               std::to_string(r) + "]=" + std::to_string(sent) + ", rank " +
                               std::to_string(r) + " passed recv_bytes[" + std::to_string(s) +
                               "]=" + std::to_string(expected));
    }
    if (digest != 0) {
        return InvalidArgument(
            "all_to_all_v: some rank's recv_bytes[sender] differs from that sender's "
            "send_bytes[receiver]; the two ranks concerned name the pair");
    }
    return Status::OK();
}

}  // namespace

Status checkCallHeaders(const CommState& state, const CallDesc& call,
                        const std::vector<MsgHeader>& headers) {
    const int ref_rank = state.members.front();
    const MsgHeader& ref = headers[ref_rank];
    for (int m : state.members) {
        if (m == ref_rank)
            continue;
        Difference d;
        if (differs(headers[m], ref, &d)) {
            return InvalidArgument(std::string(opKindName(call.kind)) + ": rank " +
                                   std::to_string(m) + " passed " + d.field + "=" + d.value +
                                   ", rank " + std::to_string(ref_rank) + " passed " + d.field +
                                   "=" + d.reference);
        }
    }
    if (call.kind == OpKind::kAllToAllV)
        return checkAllToAllV(state, call, headers);
    return Status::OK();
}

}  // namespace mooncake::pg::coll
