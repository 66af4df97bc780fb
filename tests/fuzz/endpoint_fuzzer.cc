// Fuzzes decodeEndpoint, which splits the endpoint a member publishes (and
// the Coordinator relays to every other member) into the data-plane part and
// the inbox nonce. Whatever it accepts must come back from encodeEndpoint
// byte for byte, and every endpoint/nonce pair must survive the round trip.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake-pg/control_plane/mailbox.h"
#include "tests/fuzz/fuzz_require.h"
#include "tests/fuzz/fuzz_seeds.h"

namespace {
using namespace mooncake::pg::control_plane;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    auto decoded = decodeEndpoint(bytes);
    if (decoded.has_value()) {
        // Canonical: lower-case hex, exactly 16 digits after the last marker.
        MC_FUZZ_REQUIRE(encodeEndpoint(decoded->endpoint, decoded->nonce) == bytes);
    }
    // The other direction: any data-plane endpoint (even one containing the
    // marker) and any nonce decode back to themselves.
    if (size >= 8 && !bytes.empty()) {
        uint64_t nonce = 0;
        std::memcpy(&nonce, data, sizeof(nonce));
        const std::string_view endpoint = bytes.substr(8);
        if (!endpoint.empty()) {
            auto back = decodeEndpoint(encodeEndpoint(endpoint, nonce));
            MC_FUZZ_REQUIRE(back.has_value() && back->endpoint == endpoint && back->nonce == nonce);
        } else {
            MC_FUZZ_REQUIRE(encodeEndpoint(endpoint, nonce).empty());
        }
    }
    return 0;
}

namespace mooncake::fuzz {

std::vector<std::string> seedInputs() {
    return {
        encodeEndpoint("tcp://127.0.0.1:7000", 0x0123456789abcdefull),
        encodeEndpoint("seg|inbox=0000000000000001", 2),
        std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8) + "shm://x",
        "x|inbox=0123456789ABCDEF",
    };
}

}  // namespace mooncake::fuzz
