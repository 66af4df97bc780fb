// mlx5 send-queue WQE encoding for GPU-initiated RDMA (IBGDA): the bytes an
// EP kernel writes into a send queue that lives in GPU-visible memory, and the
// doorbell record it updates before ringing the UAR. Header-only and
// __host__ __device__ so the same code runs in kernels and in host tests; it
// includes no rdma-core header (the tests check every byte against
// <infiniband/mlx5dv.h>'s structs and constants instead).
//
// One WQE is one or more 16-byte segments in a 64-byte basic block (BB):
//   RDMA WRITE/READ: control | remote address | data            (ds = 3)
//   fetch-add:       control | remote address | atomic | data   (ds = 4)
// Every multi-byte field is big-endian. The count that follows a WRITE on the
// same QP needs no fence: an RC QP executes WRITEs and atomics in order at the
// responder, so the count is visible only after the data it counts.
// Not yet run on hardware: see docs/rdma.md.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MC_HOST_DEVICE inline
#endif

// The encoders store big-endian fields through 32-bit words of a
// little-endian machine (x86, ARM in LE mode, every NVIDIA GPU).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "mlx5_wqe.h assumes little-endian");

namespace mooncake::te::rdma::mlx5 {

// PRM opcodes and control flags (the same values as mlx5dv.h's enums).
inline constexpr uint8_t kOpcodeRdmaWrite = 0x08;
inline constexpr uint8_t kOpcodeRdmaRead = 0x10;
inline constexpr uint8_t kOpcodeAtomicFetchAdd = 0x12;
inline constexpr uint8_t kCtrlCqUpdate = 2 << 2;  // a CQE for this WQE
inline constexpr uint8_t kCtrlSolicited = 1 << 1;
inline constexpr uint8_t kCtrlFence = 4 << 5;  // wait for earlier READs/atomics
inline constexpr uint8_t kCtrlSmallFence = 1 << 5;
inline constexpr uint32_t kSegmentBytes = 16;
inline constexpr uint32_t kBasicBlockBytes = 64;
// Index of the send counter in a QP's doorbell record (the receive one is 0).
inline constexpr int kSendDoorbellIndex = 1;

MC_HOST_DEVICE uint32_t toBig32(uint32_t v) {
    return (v >> 24) | ((v >> 8) & 0x0000ff00u) | ((v << 8) & 0x00ff0000u) | (v << 24);
}
MC_HOST_DEVICE uint64_t toBig64(uint64_t v) {
    return (static_cast<uint64_t>(toBig32(static_cast<uint32_t>(v))) << 32) |
           toBig32(static_cast<uint32_t>(v >> 32));
}

// The first 8 bytes of a control segment (opmod, WQE index, opcode; QPN,
// data-segment count), as they lie in memory: also the word the UAR doorbell
// takes for that WQE (uarDoorbellWord), so a poster can keep it instead of
// reading the WQE back.
MC_HOST_DEVICE uint64_t controlSegmentHead(uint16_t wqe_index, uint8_t opcode, uint8_t opmod,
                                           uint32_t qpn, uint8_t ds) {
    const uint32_t w0 = toBig32((static_cast<uint32_t>(opmod) << 24) |
                                (static_cast<uint32_t>(wqe_index) << 8) | opcode);
    const uint32_t w1 = toBig32(((qpn & 0xffffffu) << 8) | ds);
    return static_cast<uint64_t>(w0) | (static_cast<uint64_t>(w1) << 32);
}

// Fills `seg` (16 bytes, 4-byte aligned) with a control segment.
// `wqe_index` is the producer index of the WQE's first BB (16 bits on the wire).
// Returns its first 8 bytes (controlSegmentHead).
MC_HOST_DEVICE uint64_t writeControlSegment(void* seg, uint16_t wqe_index, uint8_t opcode,
                                            uint8_t opmod, uint32_t qpn, uint8_t ds,
                                            uint8_t fm_ce_se, uint32_t imm_be = 0) {
    uint32_t* w = static_cast<uint32_t*>(seg);
    const uint64_t head = controlSegmentHead(wqe_index, opcode, opmod, qpn, ds);
    w[0] = static_cast<uint32_t>(head);
    w[1] = static_cast<uint32_t>(head >> 32);
    // signature (byte 8) and dci_stream_channel_id (bytes 9-10) stay zero;
    // fm_ce_se is byte 11, read as a little-endian word's top byte.
    w[2] = static_cast<uint32_t>(fm_ce_se) << 24;
    w[3] = imm_be;
    return head;
}

MC_HOST_DEVICE void writeRemoteAddressSegment(void* seg, uint64_t raddr, uint32_t rkey) {
    uint32_t* w = static_cast<uint32_t*>(seg);
    const uint64_t be = toBig64(raddr);
    w[0] = static_cast<uint32_t>(be);
    w[1] = static_cast<uint32_t>(be >> 32);
    w[2] = toBig32(rkey);
    w[3] = 0;
}

MC_HOST_DEVICE void writeDataSegment(void* seg, uint32_t byte_count, uint32_t lkey, uint64_t addr) {
    uint32_t* w = static_cast<uint32_t*>(seg);
    w[0] = toBig32(byte_count);
    w[1] = toBig32(lkey);
    const uint64_t be = toBig64(addr);
    w[2] = static_cast<uint32_t>(be);
    w[3] = static_cast<uint32_t>(be >> 32);
}

MC_HOST_DEVICE void writeAtomicSegment(void* seg, uint64_t swap_add, uint64_t compare) {
    uint32_t* w = static_cast<uint32_t*>(seg);
    const uint64_t a = toBig64(swap_add);
    const uint64_t c = toBig64(compare);
    w[0] = static_cast<uint32_t>(a);
    w[1] = static_cast<uint32_t>(a >> 32);
    w[2] = static_cast<uint32_t>(c);
    w[3] = static_cast<uint32_t>(c >> 32);
}

// 16-byte segments of the WQEs below (the control segment's DS field):
// control, remote address, data; control, remote address, atomic, data.
inline constexpr uint8_t kRdmaWqeDs = 3;
inline constexpr uint8_t kFetchAddWqeDs = 4;

struct WriteWqe {
    uint16_t wqe_index;
    uint32_t qpn;
    uint64_t local_addr;
    uint32_t lkey;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t length;
    bool signaled;  // ask for a CQE
    bool fence;     // wait for earlier READs/atomics of this QP first
};

// RDMA WRITE (or READ with `opcode` = kOpcodeRdmaRead) into one BB at `wqe`
// (64 bytes, 16-byte aligned); returns the number of BBs used (1). The
// WQE's doorbell word (its control segment's head) goes to `doorbell_word`
// if given.
MC_HOST_DEVICE uint32_t encodeRdma(void* wqe, const WriteWqe& w, uint8_t opcode = kOpcodeRdmaWrite,
                                   uint64_t* doorbell_word = nullptr) {
    char* p = static_cast<char*>(wqe);
    const uint8_t flags = (w.signaled ? kCtrlCqUpdate : 0) | (w.fence ? kCtrlFence : 0);
    const uint64_t head = writeControlSegment(p, w.wqe_index, opcode, 0, w.qpn, kRdmaWqeDs, flags);
    if (doorbell_word != nullptr)
        *doorbell_word = head;
    writeRemoteAddressSegment(p + kSegmentBytes, w.remote_addr, w.rkey);
    writeDataSegment(p + 2 * kSegmentBytes, w.length, w.lkey, w.local_addr);
    // The unused fourth segment is zeroed so a WQE never carries stale bytes.
    uint32_t* tail = reinterpret_cast<uint32_t*>(p + 3 * kSegmentBytes);
    tail[0] = tail[1] = tail[2] = tail[3] = 0;
    return 1;
}

struct FetchAddWqe {
    uint16_t wqe_index;
    uint32_t qpn;
    uint64_t result_addr;  // local 8 bytes that receive the old value
    uint32_t lkey;
    uint64_t remote_addr;  // 8-byte aligned
    uint32_t rkey;
    uint64_t add;
    bool signaled;
    bool fence;
};

// 64-bit fetch-and-add into one BB at `wqe`; returns the number of BBs (1).
// Its doorbell word goes to `doorbell_word` if given.
MC_HOST_DEVICE uint32_t encodeFetchAdd(void* wqe, const FetchAddWqe& a,
                                       uint64_t* doorbell_word = nullptr) {
    char* p = static_cast<char*>(wqe);
    const uint8_t flags = (a.signaled ? kCtrlCqUpdate : 0) | (a.fence ? kCtrlFence : 0);
    const uint64_t head =
        writeControlSegment(p, a.wqe_index, kOpcodeAtomicFetchAdd, 0, a.qpn, kFetchAddWqeDs, flags);
    if (doorbell_word != nullptr)
        *doorbell_word = head;
    writeRemoteAddressSegment(p + kSegmentBytes, a.remote_addr, a.rkey);
    writeAtomicSegment(p + 2 * kSegmentBytes, a.add, 0);
    writeDataSegment(p + 3 * kSegmentBytes, 8, a.lkey, a.result_addr);
    return 1;
}

// The value of the send doorbell record after WQEs up to (not including)
// producer index `pi` are posted: pi's low 16 bits, big-endian.
MC_HOST_DEVICE uint32_t sendDoorbellValue(uint32_t pi) {
    return toBig32(pi & 0xffffu);
}

// Publishes the producer index in the QP's doorbell record (two 32-bit
// big-endian counters: receive, send). The caller orders the WQE stores
// before this store and this store before the UAR write (a fence on the GPU,
// a write barrier on the host), then writes the first 8 bytes of the last
// WQE's control segment to the UAR: see uarDoorbellWord.
MC_HOST_DEVICE void updateSendDoorbellRecord(volatile uint32_t* dbrec, uint32_t pi) {
    dbrec[kSendDoorbellIndex] = sendDoorbellValue(pi);
}

// The 64-bit word the UAR doorbell takes: the first 8 bytes of the control
// segment, exactly as they lie in memory.
MC_HOST_DEVICE uint64_t uarDoorbellWord(const void* ctrl_seg) {
    const uint32_t* w = static_cast<const uint32_t*>(ctrl_seg);
    return static_cast<uint64_t>(w[0]) | (static_cast<uint64_t>(w[1]) << 32);
}

}  // namespace mooncake::te::rdma::mlx5
