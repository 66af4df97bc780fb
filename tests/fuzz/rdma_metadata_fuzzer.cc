// Fuzzes the rdma metadata parsers (RdmaEndpoint, RegionKey, QpMessage),
// which read what other processes publish in the store. Each must reject or
// accept any bytes without reading out of bounds, and what it accepts must
// be canonical: re-serializing gives the same bytes. The first input byte
// picks the parser.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake-transfer-engine/transport/rdma/rdma_metadata.h"
#include "tests/fuzz/fuzz_require.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {

using mooncake::te::rdma::QpMessage;
using mooncake::te::rdma::RdmaEndpoint;
using mooncake::te::rdma::RegionKey;

template <typename T>
void roundTrip(std::string_view bytes) {
    auto parsed = T::parse(bytes);
    if (!parsed.ok())
        return;
    const std::string again = parsed.value().serialize();
    MC_FUZZ_REQUIRE(again == bytes);
    auto reparsed = T::parse(again);
    MC_FUZZ_REQUIRE(reparsed.ok() && reparsed.value() == parsed.value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0)
        return 0;
    const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
    switch (data[0] % 3) {
        case 0:
            roundTrip<RdmaEndpoint>(bytes);
            break;
        case 1:
            roundTrip<RegionKey>(bytes);
            break;
        default:
            roundTrip<QpMessage>(bytes);
            break;
    }
    return 0;
}

namespace mooncake::fuzz {

std::vector<std::string> seedInputs() {
    RdmaEndpoint e;
    e.device = "mlx5_0";
    e.port = 1;
    e.lid = 7;
    e.gid[10] = e.gid[11] = 0xff;
    QpMessage m;
    m.from = "rank-1";
    m.nonce = 42;
    m.address.qpn = 0x123;
    m.address.psn = 0x456;
    QpMessage refusal = m;
    refusal.kind = QpMessage::kReply;
    refusal.error = "refused";
    return {std::string(1, '\0') + e.serialize(),
            std::string(1, '\1') + RegionKey{0x1000, 0x2000, 9}.serialize(),
            std::string(1, '\2') + m.serialize(), std::string(1, '\2') + refusal.serialize()};
}

}  // namespace mooncake::fuzz
