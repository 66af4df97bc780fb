#include "mooncake-pg/control_plane/mailbox.h"

#include <chrono>
#include <cstdio>

namespace mooncake::pg::control_plane {
namespace {

std::string base(std::string_view prefix) {
    std::string key(prefix);
    if (!key.empty() && key.back() != '/')
        key += '/';
    return key + "cp/";
}

std::string hex16(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

}  // namespace

std::string coordinatorInboxKey(std::string_view prefix) {
    return base(prefix) + "coord";
}

std::string processInboxKey(std::string_view prefix, uint32_t slot, uint64_t nonce) {
    return base(prefix) + "proc/" + std::to_string(slot) + "/" + hex16(nonce);
}

std::string encodeEndpoint(std::string_view endpoint, uint64_t nonce) {
    if (endpoint.empty())
        return {};
    return std::string(endpoint) + std::string(kInboxMarker) + hex16(nonce);
}

std::optional<DecodedEndpoint> decodeEndpoint(std::string_view encoded) {
    // The last marker wins, so a data-plane endpoint may itself contain one.
    const size_t at = encoded.rfind(kInboxMarker);
    // An empty data-plane part is never encoded (an empty endpoint stays
    // empty); accepting it would probe a member that published nothing.
    if (at == std::string_view::npos || at == 0)
        return std::nullopt;
    std::string_view digits = encoded.substr(at + kInboxMarker.size());
    if (digits.size() != 16)
        return std::nullopt;
    uint64_t nonce = 0;
    for (char c : digits) {
        int v;
        if (c >= '0' && c <= '9') {
            v = c - '0';
        } else if (c >= 'a' && c <= 'f') {
            v = c - 'a' + 10;
        } else {
            return std::nullopt;
        }
        nonce = nonce << 4 | static_cast<uint64_t>(v);
    }
    return DecodedEndpoint{std::string(encoded.substr(0, at)), nonce};
}

Status Mailbox::send(const std::string& inbox, const ControlMessage& message) {
    return sendBytes(inbox, serialize(message));
}

Status Mailbox::sendBytes(const std::string& inbox, const std::string& bytes) {
    return store_->queuePush(inbox, bytes);
}

Result<std::string> Mailbox::receive(const std::string& inbox, Deadline deadline) {
    return store_->queuePop(inbox, deadline);
}

Millis hostNow() {
    return std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now().time_since_epoch());
}

void hostLog(LogLevel level, const std::string& text) {
    constexpr const char* kSubsys = "coord";
    if (logEnabled(level, kSubsys))
        logWrite(level, kSubsys, __FILE__, __LINE__, text);
}

}  // namespace mooncake::pg::control_plane
