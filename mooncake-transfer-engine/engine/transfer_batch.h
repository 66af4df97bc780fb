// A batch of transfer requests as the engine keeps it (private to
// transfer_engine.cc and transfer_batches.cc).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/transport/transport.h"

namespace mooncake::te {

struct TransferEngine::Batch {
    size_t capacity = 0;
    std::shared_ptr<CompletionSignal> signal = std::make_shared<CompletionSignal>();
    // Guards `tasks`: one thread may submit while another waits or queries.
    std::mutex mu;
    std::vector<std::shared_ptr<TransferTask>> tasks;
    // tasks.size(), for checks that need no lock.
    std::atomic<size_t> count{0};

    std::vector<std::shared_ptr<TransferTask>> snapshot() {
        std::lock_guard<std::mutex> lock(mu);
        return tasks;
    }
    // Task i, or nullptr past the end; *more: whether tasks follow it. Tasks
    // are only appended and stay owned by `tasks`, so the pointer stays valid
    // while the batch lives.
    TransferTask* at(size_t i, bool* more) {
        std::lock_guard<std::mutex> lock(mu);
        *more = i + 1 < tasks.size();
        return i < tasks.size() ? tasks[i].get() : nullptr;
    }
    bool allDone() {
        std::lock_guard<std::mutex> lock(mu);
        for (const auto& t : tasks) {
            if (!t->done())
                return false;
        }
        return true;
    }
};

}  // namespace mooncake::te
