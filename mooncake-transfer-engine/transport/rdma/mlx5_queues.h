// The producer side of an mlx5 send queue and the consumer side of its
// completion queue, for GPU-initiated RDMA (IBGDA): what an EP kernel does
// between encoding WQEs (mlx5_wqe.h) and seeing them complete. Header-only
// and __host__ __device__, like the encoder, so host tests run the same code
// against a software HCA (tests/cpp/rdma/soft_hca.h) and a kernel runs it
// against queues a NIC reads. It includes no rdma-core header; the tests
// check the CQE layout against <infiniband/mlx5dv.h>.
//
// Ordering, the part a NIC cannot forgive: every WQE byte is stored before
// the doorbell record announces it, and the record before the doorbell
// register is written (ringDoorbell). A CQE is read field by field only after
// its ownership byte says it belongs to the current pass (pollCompletion).
// Not yet run on hardware: see docs/rdma.md.
#pragma once

#include <cstdint>

#include "mooncake-transfer-engine/transport/rdma/mlx5_wqe.h"

namespace mooncake::te::rdma::mlx5 {

// CQE opcodes (the high nibble of the last byte) and the syndromes an
// IBGDA sender can meet; the values are mlx5dv.h's.
inline constexpr uint8_t kCqeRequester = 0x0;
inline constexpr uint8_t kCqeRequesterError = 0xd;
inline constexpr uint8_t kCqeResponderError = 0xe;
inline constexpr uint8_t kCqeInvalid = 0xf;
inline constexpr uint8_t kSyndromeLocalLength = 0x01;
inline constexpr uint8_t kSyndromeLocalQpOperation = 0x02;
inline constexpr uint8_t kSyndromeLocalProtection = 0x04;
inline constexpr uint8_t kSyndromeFlushed = 0x05;
inline constexpr uint8_t kSyndromeRemoteAccess = 0x13;
inline constexpr uint8_t kSyndromeRemoteOperation = 0x14;
inline constexpr uint8_t kSyndromeRetryExceeded = 0x15;

// A 64-byte CQE, by byte offset (big-endian fields).
inline constexpr uint32_t kCqeBytes = 64;
inline constexpr uint32_t kCqeByteCountOffset = 44;
inline constexpr uint32_t kCqeVendorSyndromeOffset = 54;  // error CQEs
inline constexpr uint32_t kCqeSyndromeOffset = 55;        // error CQEs
inline constexpr uint32_t kCqeWqeCounterOffset = 60;
inline constexpr uint32_t kCqeOpOwnOffset = 63;  // opcode << 4 | ... | owner
// The consumer counter in a CQ's doorbell record (24 bits, big-endian).
inline constexpr int kCqConsumerDoorbellIndex = 0;
// WQE counters are 16 bits on the wire: at most this many WQEs may be
// outstanding for a completion to name its WQE without ambiguity.
inline constexpr uint32_t kMaxSendQueueWqes = 1u << 15;

MC_HOST_DEVICE void orderStores() {
#if defined(__CUDA_ARCH__)
    __threadfence_system();  // the NIC reads over PCIe: system scope
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  // also orders write-combined UAR stores
#endif
}

// The 8-byte doorbell store to the UAR register (I/O memory). On the GPU an
// MMIO store: performed exactly once, never merged with another or split.
MC_HOST_DEVICE void storeDoorbell(volatile uint64_t* reg, uint64_t word) {
#if defined(__CUDA_ARCH__)
    asm volatile("st.mmio.relaxed.sys.global.b64 [%0], %1;" ::"l"(reg), "l"(word) : "memory");
#else
    *reg = word;
#endif
}

MC_HOST_DEVICE void orderLoads() {
#if defined(__CUDA_ARCH__)
    __threadfence_system();
#else
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
}

// One QP's send queue as its single producer sees it. `producer` and
// `consumer` count 64-byte basic blocks (BBs) since the QP was created; the
// WQE at count i lies in BB i mod wqe_count and carries i's low 16 bits.
struct SendQueue {
    unsigned char* wqes = nullptr;          // wqe_count BBs
    uint32_t wqe_count = 0;                 // a power of two, <= kMaxSendQueueWqes
    volatile uint32_t* dbrec = nullptr;     // the QP's doorbell record
    volatile uint64_t* doorbell = nullptr;  // the UAR register that takes the doorbell
    uint32_t qpn = 0;
    uint32_t producer = 0;  // BBs posted
    uint32_t consumer = 0;  // BBs the HCA has completed (from completions)
    // The UAR word of the last WQE posted (its control segment's head), kept
    // when it is written: ringing then reads nothing back from the WQE ring,
    // which for a GPU poster lies across PCIe in host memory.
    uint64_t doorbell_word = 0;
};

MC_HOST_DEVICE uint32_t freeBasicBlocks(const SendQueue& sq) {
    return sq.wqe_count - (sq.producer - sq.consumer);
}

MC_HOST_DEVICE unsigned char* basicBlockAt(const SendQueue& sq, uint32_t index) {
    return sq.wqes + static_cast<uint64_t>(index & (sq.wqe_count - 1)) * kBasicBlockBytes;
}

// Announces every WQE before `producer` and rings the doorbell with the last
// one's control segment (as kept in doorbell_word).
MC_HOST_DEVICE void ringDoorbell(const SendQueue& sq) {
    orderStores();
    updateSendDoorbellRecord(sq.dbrec, sq.producer);
    orderStores();
    storeDoorbell(sq.doorbell, sq.doorbell_word);
}

// Data followed by the count that makes it visible, on one QP: the receiver
// waits on the counter, so it must never see the count before the data. An
// RC QP executes the two in order at the responder, so no fence is needed.
struct PutWithCount {
    uint64_t local_addr = 0;  // the data, in memory registered under lkey
    uint32_t lkey = 0;
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    uint32_t length = 0;        // 0: only the count goes
    uint64_t counter_addr = 0;  // the peer's 8-byte counter (8-byte aligned)
    uint32_t counter_rkey = 0;
    uint64_t add = 0;
    uint64_t old_value_addr = 0;  // 8 local bytes for the counter's old value
    uint32_t old_value_lkey = 0;
};

MC_HOST_DEVICE uint32_t basicBlocksFor(const PutWithCount& p) {
    return p.length > 0 ? 2u : 1u;
}

// Writes one RDMA WRITE WQE (one BB) at the producer's position without
// announcing it: the caller has checked for room and rings the doorbell
// later (ringDoorbell covers every WQE before the producer). An unsignaled
// WRITE is retired by the next signaled WQE's completion.
MC_HOST_DEVICE void postWrite(SendQueue& sq, uint64_t local_addr, uint32_t lkey,
                              uint64_t remote_addr, uint32_t rkey, uint32_t length, bool signaled) {
    WriteWqe w{};
    w.wqe_index = static_cast<uint16_t>(sq.producer);
    w.qpn = sq.qpn;
    w.local_addr = local_addr;
    w.lkey = lkey;
    w.remote_addr = remote_addr;
    w.rkey = rkey;
    w.length = length;
    w.signaled = signaled;
    w.fence = false;
    sq.producer +=
        encodeRdma(basicBlockAt(sq, sq.producer), w, kOpcodeRdmaWrite, &sq.doorbell_word);
}

// Posts the WRITE (unsignaled) and the fetch-add (signaled: its completion
// retires both) and rings the doorbell. False, with nothing posted, when the
// queue lacks room: reap completions and try again.
MC_HOST_DEVICE bool postPutWithCount(SendQueue& sq, const PutWithCount& p) {
    if (freeBasicBlocks(sq) < basicBlocksFor(p))
        return false;
    if (p.length > 0)
        postWrite(sq, p.local_addr, p.lkey, p.remote_addr, p.rkey, p.length, false);
    FetchAddWqe a{};
    a.wqe_index = static_cast<uint16_t>(sq.producer);
    a.qpn = sq.qpn;
    a.result_addr = p.old_value_addr;
    a.lkey = p.old_value_lkey;
    a.remote_addr = p.counter_addr;
    a.rkey = p.counter_rkey;
    a.add = p.add;
    a.signaled = true;
    a.fence = false;
    sq.producer += encodeFetchAdd(basicBlockAt(sq, sq.producer), a, &sq.doorbell_word);
    ringDoorbell(sq);
    return true;
}

// A QP's completion queue as its single consumer sees it. Every put asks for
// one CQE and may take a single BB, so the CQ needs as many CQEs as the send
// queue has BBs: a smaller one can overrun, which a real HCA treats as fatal.
MC_HOST_DEVICE bool completionQueueFits(uint32_t wqe_count, uint32_t cqe_count) {
    return cqe_count >= wqe_count;
}

struct CompletionQueue {
    const unsigned char* cqes = nullptr;  // cqe_count CQEs of kCqeBytes
    uint32_t cqe_count = 0;               // a power of two
    volatile uint32_t* dbrec = nullptr;   // the CQ's doorbell record
    uint32_t consumer = 0;                // CQEs consumed since creation
};

struct Completion {
    uint8_t opcode = kCqeInvalid;  // kCqeRequester, or an error opcode
    uint8_t syndrome = 0;          // error CQEs only
    uint8_t vendor_syndrome = 0;
    uint16_t wqe_counter = 0;  // the completed WQE's index (low 16 bits)
};

MC_HOST_DEVICE bool isError(const Completion& c) {
    return c.opcode != kCqeRequester;
}

// Takes the next CQE if the HCA has written it in the current pass over the
// ring (its owner bit equals the pass's parity) and tells the HCA the slot
// is free again. False when there is none yet.
MC_HOST_DEVICE bool pollCompletion(CompletionQueue& cq, Completion* out) {
    const volatile unsigned char* cqe =
        cq.cqes + static_cast<uint64_t>(cq.consumer & (cq.cqe_count - 1)) * kCqeBytes;
    const uint8_t op_own = cqe[kCqeOpOwnOffset];
    const uint8_t pass_parity = (cq.consumer & cq.cqe_count) != 0 ? 1 : 0;
    if ((op_own >> 4) == kCqeInvalid || (op_own & 1) != pass_parity)
        return false;
    orderLoads();  // the rest of the CQE was written before its last byte
    out->opcode = op_own >> 4;
    out->syndrome = cqe[kCqeSyndromeOffset];
    out->vendor_syndrome = cqe[kCqeVendorSyndromeOffset];
    out->wqe_counter =
        static_cast<uint16_t>((cqe[kCqeWqeCounterOffset] << 8) | cqe[kCqeWqeCounterOffset + 1]);
    ++cq.consumer;
    cq.dbrec[kCqConsumerDoorbellIndex] = toBig32(cq.consumer & 0xffffffu);
    return true;
}

// Retires the send queue's WQEs up to and including the one a completion
// names (1-BB WQEs: what postPutWithCount posts).
MC_HOST_DEVICE void retireThrough(SendQueue& sq, uint16_t wqe_counter) {
    const uint16_t done = static_cast<uint16_t>(wqe_counter + 1u - sq.consumer);
    sq.consumer += done;
}

// Reaps every completion available: false, with *error set, at the first
// error completion (the QP is then in error and flushes what follows).
MC_HOST_DEVICE bool reapCompletions(CompletionQueue& cq, SendQueue& sq, Completion* error) {
    Completion c;
    while (pollCompletion(cq, &c)) {
        if (isError(c)) {
            *error = c;
            return false;
        }
        retireThrough(sq, c.wqe_counter);
    }
    return true;
}

// A counter that remote fetch-adds update. The add travels big-endian in the
// WQE, but the HCA applies it to memory in the host's byte order: mlx5_core
// puts ConnectX-4 and later in host-endianness mode for 8-byte atomics when
// they support it (older ones may use big-endian). Unverified on hardware.
MC_HOST_DEVICE uint64_t counterValue(const volatile uint64_t* counter) { return *counter; }

}  // namespace mooncake::te::rdma::mlx5
