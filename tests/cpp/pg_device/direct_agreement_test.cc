// When the members of a direct collective may skip the agreement exchange
// (mooncake-pg/device/direct_agreement.h): host-only, runs everywhere.
#include <gtest/gtest.h>

#include <vector>

#include "mooncake-pg/device/direct_agreement.h"

namespace mooncake::pg::device {
namespace {

std::vector<DirectOffer> offersOf(int members) {
    std::vector<DirectOffer> offers(static_cast<size_t>(members));
    for (int p = 0; p < members; ++p) {
        DirectOffer& o = offers[static_cast<size_t>(p)];
        o.in.allocation_id = 100 + p;
        o.in.allocation_bytes = 1 << 24;
        o.in.offset = 512 * p;
        o.in.ipc_handle[3] = static_cast<char>(p + 1);
        o.out = o.in;
        o.out.allocation_id = 200 + p;
        o.in_bytes = 1 << 22;
        o.out_bytes = 1 << 22;
        o.peers_read_outputs = 1;
        o.epoch = 7;
    }
    return offers;
}

void agreeOn(std::vector<DirectOffer>* offers, uint64_t digest) {
    for (DirectOffer& o : *offers)
        o.agreed_digest = digest;
}

TEST(DirectAgreement, CarriesOverOnlyWhenEveryMemberAgreedOnTheseOffers) {
    std::vector<DirectOffer> offers = offersOf(3);
    const uint64_t digest = directOffersDigest(offers);
    EXPECT_NE(0u, digest);
    EXPECT_FALSE(directAgreementCarriesOver(offers, digest)) << "nobody agreed on anything yet";
    agreeOn(&offers, digest);
    EXPECT_EQ(digest, directOffersDigest(offers)) << "the agreed digests are not part of it";
    EXPECT_TRUE(directAgreementCarriesOver(offers, digest));
    offers[1].agreed_digest = digest + 1;  // rank 1 agreed on something else last
    EXPECT_FALSE(directAgreementCarriesOver(offers, digest));
    EXPECT_FALSE(directAgreementCarriesOver({}, digest));
    agreeOn(&offers, 0);
    EXPECT_FALSE(directAgreementCarriesOver(offers, 0)) << "0 means none";
}

TEST(DirectAgreement, AnyChangeInAnyOfferChangesTheDigest) {
    const std::vector<DirectOffer> base = offersOf(3);
    const uint64_t digest = directOffersDigest(base);
    std::vector<void (*)(DirectOffer&)> changes = {
        [](DirectOffer& o) { o.in.allocation_id += 1; },
        [](DirectOffer& o) { o.in.allocation_bytes += 1; },
        [](DirectOffer& o) { o.in.offset += 256; },
        [](DirectOffer& o) { o.in.ipc_handle[63] ^= 1; },
        [](DirectOffer& o) { o.out.allocation_id += 1; },
        [](DirectOffer& o) { o.out.ipc_handle[0] ^= 1; },
        [](DirectOffer& o) { o.in_bytes += 4; },
        [](DirectOffer& o) { o.out_bytes -= 4; },
        [](DirectOffer& o) { o.peers_read_outputs = 0; },
        // The same buffers under all_to_all with split sizes and a plain one.
        [](DirectOffer& o) { o.inputs_bounded_by_owner = 1; },
        [](DirectOffer& o) { o.epoch += 1; },
    };
    for (size_t c = 0; c < changes.size(); ++c) {
        for (size_t member = 0; member < base.size(); ++member) {
            std::vector<DirectOffer> changed = base;
            changes[c](changed[member]);
            EXPECT_NE(digest, directOffersDigest(changed))
                << "change " << c << " of member " << member;
        }
    }
    // Order matters: the members' offers are in rank order.
    std::vector<DirectOffer> swapped = base;
    std::swap(swapped[0], swapped[2]);
    EXPECT_NE(digest, directOffersDigest(swapped));
    EXPECT_EQ(digest, directOffersDigest(offersOf(3))) << "deterministic";
}

}  // namespace
}  // namespace mooncake::pg::device
