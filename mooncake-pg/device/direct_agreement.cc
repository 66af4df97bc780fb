#include "mooncake-pg/device/direct_agreement.h"

#include <cstring>

namespace mooncake::pg::device {
namespace {

// FNV-1a, 64 bits: a digest of a few hundred bytes per member.
constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void mix(uint64_t* h, const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
        *h ^= b[i];
        *h *= kFnvPrime;
    }
}

void mixDescriptor(uint64_t* h, const BufferDescriptor& d) {
    mix(h, &d.allocation_id, sizeof(d.allocation_id));
    mix(h, &d.allocation_bytes, sizeof(d.allocation_bytes));
    mix(h, &d.offset, sizeof(d.offset));
    mix(h, d.ipc_handle, sizeof(d.ipc_handle));
}

}  // namespace

uint64_t directOffersDigest(const std::vector<DirectOffer>& offers) {
    uint64_t h = kFnvOffset;
    for (const DirectOffer& o : offers) {
        mixDescriptor(&h, o.in);
        mixDescriptor(&h, o.out);
        for (uint64_t v :
             {o.in_bytes, o.out_bytes, o.peers_read_outputs, o.inputs_bounded_by_owner, o.epoch})
            mix(&h, &v, sizeof(v));
    }
    return h == 0 ? 1 : h;
}

bool directAgreementCarriesOver(const std::vector<DirectOffer>& offers, uint64_t digest) {
    if (offers.empty() || digest == 0)
        return false;
    for (const DirectOffer& o : offers) {
        if (o.agreed_digest != digest)
            return false;
    }
    return true;
}

}  // namespace mooncake::pg::device
