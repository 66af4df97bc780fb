// A software HCA for the IBGDA queue tests: it executes mlx5 WQEs from send
// queues in ordinary (or CUDA-pinned) host memory the way a ConnectX reads
// them, so the producer code of mlx5_queues.h can be run end to end without
// a NIC, from a host thread or from a kernel.
//
// What it models: the doorbell record as the only source of new work (the
// UAR write is recorded, not required), the WQE index and QPN in every
// control segment, RDMA WRITE and 64-bit fetch-add on registered memory with
// key and bounds checks, atomic operands in host byte order (mlx5_queues.h,
// counterValue), one CQE per signaled
// WQE with the owner bit of its pass, an error CQE naming the failed WQE,
// then the QP in error: every later WQE completes flushed. It does not model
// timing, reordering a real NIC may do across QPs, or memory registration by
// a kernel driver.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-transfer-engine/transport/rdma/mlx5_queues.h"

namespace mooncake::te::rdma::soft {

// The clock host tests give the IBGDA channel (its `now`, in the unit of its
// deadlines): steady nanoseconds.
inline int64_t steadyNowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Queue memory the caller provides (e.g. pinned so a kernel can use it), or
// that the HCA allocates.
struct QueueMemory {
    unsigned char* wqes = nullptr;  // wqe_count * 64 bytes
    unsigned char* cqes = nullptr;  // cqe_count * 64 bytes
    uint32_t* sq_dbrec = nullptr;   // 2 words
    uint32_t* cq_dbrec = nullptr;   // 1 word
    uint64_t* doorbell = nullptr;   // 1 word
};

class SoftHca {
public:
    // Where a host emulates more than this HCA (the fake verbs library): its
    // memory keys, and whether a QP's connected peer can still answer.
    struct Hooks {
        std::function<bool(uint32_t key, uint64_t addr, uint64_t bytes)> covers;
        std::function<bool(uint32_t qpn)> peer_ready;
    };
    SoftHca() = default;
    explicit SoftHca(Hooks hooks) : hooks_(std::move(hooks)) {}
    SoftHca(const SoftHca&) = delete;
    SoftHca& operator=(const SoftHca&) = delete;
    ~SoftHca() { stop(); }

    // Registers [addr, addr + bytes) for local and remote access; the key
    // serves as lkey and rkey.
    uint32_t registerMemory(const void* addr, uint64_t bytes);

    // A QP with its CQ; `memory` fields left null are allocated here. The
    // queues start at count `first_index` (tests of the 16-bit wrap), the
    // CQEs invalid. `qpn` 0: one is chosen.
    int createQueuePair(uint32_t wqe_count, uint32_t cqe_count, QueueMemory memory = {},
                        uint32_t first_index = 0, uint32_t qpn = 0);
    // QP `qp` executes nothing more (destroyed).
    void removeQueuePair(int qp);
    // The producer's and the consumer's views of QP `qp`.
    mlx5::SendQueue sendQueue(int qp) const;
    mlx5::CompletionQueue completionQueue(int qp) const;

    // Executes what QP `qp`'s doorbell record announces; the number of WQEs.
    size_t process(int qp);
    size_t processAll();
    // A thread running process() on every QP until stop().
    void start();
    void stop();

    // The first protocol violation seen ("" if none): a WQE index or QPN
    // that does not match, an unknown opcode, a CQ overrun, a doorbell word
    // that is not the head of the WQE it names, names a WQE its record has
    // not announced, or names one before the previous word's.
    std::string violation() const;
    uint64_t doorbellsRung(int qp) const;

private:
    struct Region {
        uintptr_t begin = 0;
        uint64_t bytes = 0;
    };
    struct Qp {
        QueueMemory mem;
        std::vector<std::unique_ptr<unsigned char[]>> owned;
        uint32_t wqe_count = 0;
        uint32_t cqe_count = 0;
        uint32_t qpn = 0;
        uint32_t executed = 0;     // WQEs taken from the send queue
        uint32_t cq_producer = 0;  // CQEs written
        uint32_t first_index = 0;
        uint64_t last_doorbell = 0;
        bool rung = false;        // a doorbell word was seen
        uint16_t last_named = 0;  // the WQE index the last one named
        uint64_t doorbells = 0;
        bool in_error = false;
        bool removed = false;
    };

    // The region `key` names if it covers [addr, addr + bytes).
    bool covers(uint32_t key, uint64_t addr, uint64_t bytes) const;
    // Runs one WQE; 0 on success, else the error syndrome.
    uint8_t execute(const Qp& q, const unsigned char* wqe, uint8_t opcode);
    void complete(Qp& q, uint16_t wqe_index, uint8_t opcode, uint8_t syndrome);
    void noteViolation(const std::string& what);
    // A new doorbell word of `q`, seen with its send record at `announced`.
    void checkDoorbellWord(Qp& q, uint64_t bell, uint16_t announced);

    Hooks hooks_;
    mutable std::mutex mu_;
    std::vector<Region> regions_;
    std::vector<std::unique_ptr<Qp>> qps_;
    std::string violation_;
    std::atomic<bool> running_{false};
    std::thread thread_;
};

}  // namespace mooncake::te::rdma::soft
