// The EP IBGDA path on a real NIC, for hosts that have one (none of the
// machines this project is tested on do: it skips there, saying why): two
// ranks in one process, each with its EP buffer in device memory registered
// through dma-buf and an IbgdaLink on the first IBGDA-capable HCA (filter:
// $MOONCAKE_PGTEST_DEVICE_FILTERS, comma-separated), their QPs connected in loopback
// through that HCA, then rounds of dispatch + combine checked against the CPU
// reference: the kernels post WQEs and ring doorbells from the GPU, the NIC
// moves every byte between the ranks. docs/rdma.md, "Checking it on a host
// with a NIC", runs it as
//   ep_tests --gtest_filter='IbgdaHardware.*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mooncake-transfer-engine/transport/rdma/rdma_transport.h"
#include "tests/cpp/ep/ibgda_links.h"
#include "tests/cpp/ep/ibgda_two_ranks.h"

namespace mooncake::ep {
namespace {

std::vector<std::string> filterFromEnv() {
    std::vector<std::string> out;
    const char* v = std::getenv("MOONCAKE_PGTEST_DEVICE_FILTERS");
    std::stringstream in(v ? v : "");
    for (std::string item; std::getline(in, item, ',');) {
        if (!item.empty())
            out.push_back(item);
    }
    return out;
}

TEST(IbgdaHardware, TwoRanksInLoopbackOnOneHcaCarryDispatchAndCombine) {
    SKIP_WITHOUT_GPU();
    const std::vector<std::string> filter = filterFromEnv();
    const te::IbgdaProbe probe = te::probeIbgda(te::RdmaOptions{filter, "", ""});
    if (!probe.status.ok())
        GTEST_SKIP() << "no IBGDA-capable NIC here: " << probe.status.message();
    const test::Shape s{2, 16, 64, 7168, 8};
    std::vector<std::unique_ptr<test::IbgdaTestRank>> ranks;
    std::vector<std::unique_ptr<IbgdaLink>> links;
    for (int r = 0; r < s.num_ranks; ++r) {
        ranks.push_back(std::make_unique<test::IbgdaTestRank>(s, r, /*buffer_on_device=*/true));
        ASSERT_TRUE(ranks.back()->ok);
        IbgdaEndpointOptions o;
        o.rank = r;
        o.num_ranks = s.num_ranks;
        o.buffer = ranks[r]->buffer;
        o.bytes = static_cast<size_t>(test::ibgdaTestBufferBytes(s));
        o.device_filter = filter;
        auto link = IbgdaLink::create(o);
        ASSERT_TRUE(link.ok()) << link.status().toString();
        links.push_back(std::move(link).value());
    }
    std::printf("IBGDA on %s, %d QPs per peer\n", links[0]->endpoint().deviceName().c_str(),
                links[0]->endpoint().qpsPerRank());
    const Status connected = test::connectLinksInProcess({links[0].get(), links[1].get()});
    ASSERT_TRUE(connected.ok()) << connected.toString();
    test::runIbgdaRounds(s, {ranks[0].get(), ranks[1].get()},
                         {links[0]->device(), links[1]->device()}, 4);
}

}  // namespace
}  // namespace mooncake::ep
