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

// get() polls check() for waits shorter than kWaitAbove, sleeping kMinPoll
// at first and doubling up to kMaxPoll. The interval is per thread and lasts
// across calls: a thread that keeps finding nothing (an idle inbox reader)
// settles at kMaxPoll, and one that finds a key starts fast again.
constexpr std::chrono::milliseconds kWaitAbove(1000);
constexpr std::chrono::microseconds kMinPoll(200);
constexpr std::chrono::microseconds kMaxPoll(5000);
thread_local std::chrono::microseconds tl_poll = kMinPoll;

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
    if (gone_.load())
        return goneStatus("store set '" + key + "'");
    try {
        store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
        return Status::OK();
    } catch (...) {
        return failed("store set '" + key + "'");
    }
}

Result<std::string> C10dStoreAdapter::get(const std::string& key, Deadline deadline) {
    if (gone_.load())
        return goneStatus("store get '" + key + "'");
    const std::vector<std::string> keys{key};
    const auto timeout = [&key] {
        return Timeout("key '" + key + "' was not published in the store before the deadline");
    };
    try {
        while (true) {
            if (store_->check(keys)) {
                tl_poll = kMinPoll;
                break;
            }
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining());
            if (left.count() <= 0)
                return timeout();
            if (left < kWaitAbove) {
                // Short waits (inbox reads, every poll interval) poll: a
                // TCPStore wait that times out logs a warning each time.
                std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(tl_poll, left));
                tl_poll = std::min(tl_poll * 2, kMaxPoll);
                continue;
            }
            // Long waits block in the store, ending kWaitAbove before the
            // deadline so that the store's own timeout rarely fires; the
            // rest is polled. A zero timeout means "forever" to some stores.
            auto slice = std::clamp(left - kWaitAbove, std::chrono::milliseconds(1), kMaxWaitSlice);
            const auto started = std::chrono::steady_clock::now();
            try {
                store_->wait(keys, slice);
                break;
            } catch (const c10::DistNetworkError&) {
                throw;
            } catch (const c10::Error&) {
                // The slice ran out (TCPStore raises DistStoreError,
                // HashStore and FileStore a plain c10::Error): re-check.
                // An error long before the slice ended is no timeout.
                if (std::chrono::steady_clock::now() - started < slice / 2)
                    throw;
            }
        }
        std::vector<uint8_t> value = store_->get(key);
        return std::string(value.begin(), value.end());
    } catch (...) {
        return failed("store get '" + key + "'");
    }
}

Result<int64_t> C10dStoreAdapter::add(const std::string& key, int64_t delta) {
    if (gone_.load())
        return goneStatus("store add '" + key + "'");
    try {
        return store_->add(key, delta);
    } catch (...) {
        return failed("store add '" + key + "'");
    }
}

Status C10dStoreAdapter::remove(const std::string& key) {
    if (skip_removes_.load())
        return Status::OK();
    if (gone_.load())
        return goneStatus("store delete '" + key + "'");
    try {
        store_->deleteKey(key);
        return Status::OK();
    } catch (...) {
        return failed("store delete '" + key + "'");
    }
}

Status C10dStoreAdapter::failed(const std::string& what_we_did) {
    try {
        throw;
    } catch (const c10::DistNetworkError&) {
        if (!gone_.exchange(true)) {
            MC_LOG(kDebug, "pg") << what_we_did << ": the store is unreachable; "
                                 << "later calls fail without trying it";
        }
    } catch (...) {
    }
    return statusFromCurrentException(what_we_did);
}

Status C10dStoreAdapter::goneStatus(const std::string& what_we_did) const {
    return Unavailable(what_we_did + ": the store's server was unreachable earlier " +
                       "(its host process exited?); not tried again");
}

Status C10dStoreAdapter::checkRequiredCalls(const std::string& scratch) {
    const std::string key = scratch + "/key";
    const std::string counter = scratch + "/counter";
    const std::vector<std::string> keys{key};
    const char* call = "";
    try {
        call = "set";
        store_->set(key, std::vector<uint8_t>{'1'});
        call = "check";
        (void)store_->check(keys);
        call = "wait";
        store_->wait(keys, std::chrono::milliseconds(kMaxWaitSlice));
        call = "get";
        (void)store_->get(key);
        call = "add";
        (void)store_->add(counter, 0);
        call = "deleteKey";
        (void)store_->deleteKey(key);
        (void)store_->deleteKey(counter);
        return Status::OK();
    } catch (const std::exception& e) {
        const std::string what = e.what();
        const bool missing = dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr ||
                             what.find("pure virtual") != std::string::npos ||
                             what.find("not implemented") != std::string::npos;
        const std::string head = std::string("the c10d Store ") +
                                 (missing ? "does not implement " : "failed ") + call +
                                 "; Mooncake PG's control plane needs set, get, add, check, "
                                 "wait and deleteKey: ";
        return missing ? InvalidArgument(head + what) : Unavailable(head + what);
    }
}

}  // namespace mooncake::pg
