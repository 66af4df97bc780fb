// The members' offers for a direct device collective (cuda_direct.cc), and
// when the members may skip the exchange that confirms "every member mapped
// every buffer". A call runs two host exchanges: the offers, then whether
// each member could map the others' buffers. The second is only needed the
// first time a set of offers is seen: once every member has mapped exactly
// these buffers (mappings are cached per process and never closed), mapping
// them again cannot fail. So every member offers, with its buffers, the
// digest of the last set of offers the group agreed on; when every member's
// digest equals the digest of the offers just exchanged, the agreement
// carries over. The decision uses only exchanged bytes, so every member
// takes it the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "mooncake-pg/device/peer_buffers.h"

namespace mooncake::pg::device {

// Fixed layout: exchanged as bytes between processes of one build.
struct DirectOffer {
    BufferDescriptor in;
    BufferDescriptor out;
    uint64_t in_bytes = 0;   // the bytes this member maps of each peer's input
    uint64_t out_bytes = 0;  // and of each peer's output
    uint64_t peers_read_outputs = 0;
    // 1: a member maps each peer's input by that peer's in_bytes (all_to_all
    // with split sizes); 0: by its own. Without it the same buffers offered
    // to a plain all_to_all after a split one would carry the agreement over
    // to bounds never checked.
    uint64_t inputs_bounded_by_owner = 0;
    uint64_t epoch = 0;  // the membership epoch the member applied
    // directOffersDigest of the last offers every member mapped; 0: none.
    uint64_t agreed_digest = 0;
};

// A digest of everything in `offers` but their agreed_digest; never 0.
uint64_t directOffersDigest(const std::vector<DirectOffer>& offers);

// True when every member's agreed_digest is `digest` (directOffersDigest of
// these offers): each of them has mapped exactly these buffers before.
bool directAgreementCarriesOver(const std::vector<DirectOffer>& offers, uint64_t digest);

}  // namespace mooncake::pg::device
