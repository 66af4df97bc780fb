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

std::string countKey(const std::string& inbox) {
    return inbox + "/count";
}

std::string messageKey(const std::string& inbox, int64_t n) {
    return inbox + "/" + std::to_string(n);
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
    auto n = store_->add(countKey(inbox), 1);
    if (!n.ok())
        return n.status().withContext("claiming a message number in " + inbox);
    return store_->set(messageKey(inbox, n.value()), bytes);
}

Result<std::string> InboxReader::receive(Deadline deadline) {
    while (true) {
        MC_RETURN_IF_ERROR(pollHoles());
        if (!ready_.empty()) {
            auto first = ready_.begin();
            std::string bytes = std::move(first->second);
            ready_.erase(first);
            return bytes;
        }
        // Wait for the next number, waking now and then to see whether it
        // was claimed (a hole to look past) and, with holes open, for them.
        const Millis slice = holes_.empty() ? kHoleCheck : kHolePoll;
        const Deadline wait = deadline.remaining() < slice ? deadline : Deadline::after(slice);
        auto got = store_->get(messageKey(inbox_, next_), wait);
        if (got.ok()) {
            take(next_++, std::move(got).value());
            continue;  // a hole written meanwhile goes first
        }
        if (got.status().code() != StatusCode::kTimeout)
            return got.status();
        auto count = store_->add(countKey(inbox_), 0);
        if (!count.ok())
            return count.status();
        if (count.value() >= next_) {
            // Claimed but unwritten: look past it.
            holes_.emplace(next_++, hostNow());
            continue;
        }
        if (deadline.expired())
            return got.status();
    }
}

Status InboxReader::pollHoles() {
    const Millis now = hostNow();
    for (auto it = holes_.begin(); it != holes_.end();) {
        const int64_t n = it->first;
        // One look, no wait: an expired deadline.
        auto got = store_->get(messageKey(inbox_, n), Deadline::afterMs(0));
        if (got.ok()) {
            take(n, std::move(got).value());
            it = holes_.erase(it);
            continue;
        }
        if (got.status().code() != StatusCode::kTimeout)
            return got.status();
        if (now - it->second >= hole_timeout_) {
            hostLog(LogLevel::kWarn, "skipped message " + std::to_string(n) + " of " + inbox_ +
                                         ": its sender claimed the number " +
                                         std::to_string(hole_timeout_.count()) +
                                         " ms ago and never wrote it (did it die?)");
            ++skipped_;
            it = holes_.erase(it);
            continue;
        }
        ++it;
    }
    return Status::OK();
}

void InboxReader::take(int64_t n, std::string bytes) {
    ready_.emplace(n, std::move(bytes));
    // The reader is the only one who looks at this key again; a store that
    // cannot delete only costs memory, so say so once and carry on.
    Status removed = store_->remove(messageKey(inbox_, n));
    if (!removed.ok() && !remove_failed_logged_) {
        hostLog(LogLevel::kWarn, "cannot delete read messages of " + inbox_ +
                                     " (they stay in the store): " + removed.toString());
        remove_failed_logged_ = true;
    }
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
