#include "mooncake-pg/torch/store_adapter.h"

#include "mooncake-transfer-engine/common/logging.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

namespace mooncake::pg {

namespace {

// A bounded slice per store wait keeps a Deadline::never() caller responsive
// to store failures (a dead TCPStore server raises on the next wait) instead
// of depending on the store's own, possibly infinite, timeout.
constexpr std::chrono::milliseconds kMaxWaitSlice(60000);

// Maps whatever the c10d store threw to a Status. Called inside a catch.
Status statusFromCurrentException(const std::string& what_we_did) {
    try {
        throw;
    } catch (const c10::DistStoreError& e) {
        // TCPStore reports wait timeouts as DistStoreError.
        return Timeout(what_we_did + ": " + e.what_without_backtrace());
    } catch (const c10::NotImplementedError& e) {
        return Unavailable(what_we_did + ": " + e.what_without_backtrace());
    } catch (const c10::DistNetworkError& e) {
        return Unavailable(what_we_did + ": " + e.what_without_backtrace());
    } catch (const c10::Error& e) {
        return Internal(what_we_did + ": " + e.what_without_backtrace());
    } catch (const std::exception& e) {
        return Internal(what_we_did + ": " + e.what());
    } catch (...) {
        return Internal(what_we_did + ": unknown exception");
    }
}

}  // namespace

C10dStoreAdapter::C10dStoreAdapter(c10::intrusive_ptr<c10d::Store> store)
    : store_(std::move(store)) {}

std::shared_ptr<C10dStoreAdapter> C10dStoreAdapter::ownConnection(
    const c10::intrusive_ptr<c10d::Store>& store) {
    try {
        if (auto cloned = store->clone())
            return std::make_shared<C10dStoreAdapter>(std::move(cloned));
    } catch (const std::exception& e) {
        MC_LOG(kDebug, "pg") << "store clone failed, sharing the caller's connection: " << e.what();
    }
    return std::make_shared<C10dStoreAdapter>(store);
}

Status C10dStoreAdapter::set(const std::string& key, const std::string& value) {
    try {
        store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
        return Status::OK();
    } catch (...) {
        return statusFromCurrentException("store set '" + key + "'");
    }
}

Result<std::string> C10dStoreAdapter::get(const std::string& key, Deadline deadline) {
    const std::vector<std::string> keys{key};
    try {
        while (true) {
            if (store_->check(keys))
                break;
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining());
            if (left.count() <= 0) {
                return Timeout("key '" + key +
                               "' was not published in the store before the deadline");
            }
            // A zero timeout means "wait forever" to some stores; never pass it.
            auto slice = std::clamp(left, std::chrono::milliseconds(1), kMaxWaitSlice);
            try {
                store_->wait(keys, slice);
                break;
            } catch (const c10::DistStoreError&) {
                // This slice ran out; the loop re-checks the overall deadline.
                if (deadline.expired()) {
                    return Timeout("key '" + key +
                                   "' was not published in the store before the deadline");
                }
            }
        }
        std::vector<uint8_t> value = store_->get(key);
        return std::string(value.begin(), value.end());
    } catch (...) {
        return statusFromCurrentException("store get '" + key + "'");
    }
}

Result<int64_t> C10dStoreAdapter::add(const std::string& key, int64_t delta) {
    try {
        return store_->add(key, delta);
    } catch (...) {
        return statusFromCurrentException("store add '" + key + "'");
    }
}

Status C10dStoreAdapter::remove(const std::string& key) {
    if (skip_removes_.load())
        return Status::OK();
    try {
        store_->deleteKey(key);
        return Status::OK();
    } catch (...) {
        return statusFromCurrentException("store delete '" + key + "'");
    }
}

Status C10dStoreAdapter::queuePush(const std::string& key, const std::string& value) {
    try {
        store_->queuePush(key, std::vector<uint8_t>(value.begin(), value.end()));
        return Status::OK();
    } catch (...) {
        return statusFromCurrentException("store queue push '" + key + "'");
    }
}

Result<std::string> C10dStoreAdapter::queuePop(const std::string& key, Deadline deadline) {
    constexpr auto kMaxPoll = std::chrono::milliseconds(20);
    auto poll = std::chrono::milliseconds(1);
    try {
        while (true) {
            if (store_->queueLen(key) > 0) {
                try {
                    std::vector<uint8_t> value = store_->queuePop(key, /*block=*/false);
                    return std::string(value.begin(), value.end());
                } catch (const c10::DistQueueEmptyError&) {
                    // Another popper took it between queueLen and queuePop.
                }
            }
            if (deadline.expired()) {
                return Timeout("nothing was queued on '" + key + "' before the deadline");
            }
            std::this_thread::sleep_for(
                std::min<std::chrono::nanoseconds>(poll, deadline.remaining()));
            poll = std::min(poll * 2, kMaxPoll);
        }
    } catch (...) {
        return statusFromCurrentException("store queue pop '" + key + "'");
    }
}

}  // namespace mooncake::pg
