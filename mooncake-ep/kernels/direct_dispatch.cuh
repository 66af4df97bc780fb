// Direct FP8 dispatch (on unless a rank sets MC_EP_DIRECT_DISPATCH=0; docs/ep-guide.md):
// senders write their rows straight into a packed FP8 receive (a slot) in
// the owner's buffer, each (sender, expert) at a range it reserves on the
// slot's per-expert row counter, so the receive copies nothing.
//
// Slots (EpLayout::direct*). The owner's host keeps kEpDirectSlots and hands
// the one an op wrote into to the caller as recv_x (views that give it back
// when freed). A sender's op N may run before the owner's host has issued op
// N (it waits only for the owner's op N-1 counts), so the owner names op N's
// slot one op ahead: its op N-1 send stores the name (op number N, slot) in
// its buffer before any op N-1 count goes out, and senders read it there.
// No free slot, or no name for the op (the first op, after a captured one):
// senders send messages and the receive copies, as without direct dispatch.
//
// The receive reads the name it published for the op, so wherever the rows
// went (the slot its host expects, another one after graph replays moved the
// op numbers, or messages), they end up in the op's outputs.
//
// A row counter is one u64: the low 32 bits of the op's number above the
// rows reserved so far. One tagged with an older op reads as empty (no reset
// between uses of a slot); one tagged with a newer op refuses, so a sender
// that stalled past its deadline never takes rows of a later op. Rows
// reserved by a sender whose count never arrives are a hole: the receive
// counts them and gives them src_info -1 (combine skips them).
#pragma once

#include <cstdint>

#include "mooncake-ep/kernels/device_sync.cuh"
#include "mooncake-ep/kernels/ep_kernels.h"
#include "mooncake-ep/kernels/message.cuh"

namespace mooncake::ep {

// A refused reservation (see above); also what a sender reports as its base.
inline constexpr uint32_t kEpDirectRefused = 0xfffffffeu;
// A reservation word some block of this grid is filling in.
inline constexpr uint32_t kEpDirectPending = 0xffffffffu;
// A name saying "no slot": send messages.
inline constexpr uint32_t kEpDirectNoSlot = 0xffffffffu;

// Reserves `rows` rows of op `seq` on `counter` (the owner's, mapped here;
// system scope: peers on other GPUs add to it too). Returns the first, or
// kEpDirectRefused.
__device__ inline uint32_t epDirectReserve(uint64_t* counter, uint64_t seq, uint32_t rows) {
    auto* word = reinterpret_cast<unsigned long long*>(counter);
    const uint32_t tag = static_cast<uint32_t>(seq);
    unsigned long long v = *reinterpret_cast<volatile unsigned long long*>(word);
    for (;;) {
        const int32_t age = static_cast<int32_t>(static_cast<uint32_t>(v >> 32) - tag);
        if (age > 0)
            return kEpDirectRefused;
        const uint32_t used = age == 0 ? static_cast<uint32_t>(v) : 0;
        const unsigned long long next =
            (static_cast<unsigned long long>(tag) << 32) | (used + rows);
        const unsigned long long seen = atomicCAS_system(word, v, next);
        if (seen == v)
            return used;
        v = seen;
    }
}

// The slot `buffer`'s owner named for its op `seq`, or -1 (no name for that
// op, or "none").
__device__ inline int epDirectNamedSlot(const void* buffer, const EpLayout& L, uint64_t seq) {
    const uint64_t name = *reinterpret_cast<const volatile uint64_t*>(
        static_cast<const char*>(buffer) + L.directNameOffset(static_cast<int>(seq & 1)));
    if (!epSignalMatches(name, seq))
        return -1;
    const uint32_t slot = epSignalPayload(name);
    return slot < static_cast<uint32_t>(kEpDirectSlots) ? static_cast<int>(slot) : -1;
}

// Stores this rank's name for its op `seq + 1` (a.next_slot, or none): by
// one thread, before any of op seq's counts goes out (they are release
// stores after a fence, which publish it).
__device__ inline void epDirectPublishName(const EpGroupArgs& g, const DispatchArgs& a,
                                           const EpLayout& L, uint64_t seq) {
    if (!a.direct)
        return;
    const uint32_t slot = a.next_slot >= 0 ? static_cast<uint32_t>(a.next_slot) : kEpDirectNoSlot;
    *reinterpret_cast<volatile uint64_t*>(static_cast<char*>(g.local_buffer) +
                                          L.directNameOffset(static_cast<int>((seq + 1) & 1))) =
        epMakeSignal(seq + 1, slot);
}

// Row `row` of the rows that start at `first` (payload rows of `hidden`
// bytes, one scale per kEpHiddenAlign of them, one source index).
__device__ inline EpRowDest epRowAfter(const EpRowDest& first, int64_t row, int64_t hidden) {
    return {first.payload + row * hidden, first.scales + row * (hidden / kEpHiddenAlign),
            first.src + row};
}

// Where row `row` (expert * capacity + index) of slot `slot` in `buffer` lives.
__device__ inline EpRowDest epDirectRow(char* buffer, const EpLayout& L, int slot, int64_t row) {
    const EpRowDest first = {buffer + L.directDataOffset(slot),
                             reinterpret_cast<float*>(buffer + L.directScalesOffset(slot)),
                             reinterpret_cast<int32_t*>(buffer + L.directSrcOffset(slot))};
    return epRowAfter(first, row, L.hidden);
}

// Slot `slot` of `buffer` and the base words of half `phase`, as pointers.
struct EpSlotView {
    EpRowDest first;                  // row 0 of the slot
    const unsigned long long* bases;  // [nle][num_ranks]
};

__device__ inline EpSlotView epSlotViewOf(char* buffer, const EpLayout& L, int slot, int phase) {
    return {epDirectRow(buffer, L, slot, 0),
            reinterpret_cast<const unsigned long long*>(buffer + L.directBaseOffset(phase, 0, 0))};
}

}  // namespace mooncake::ep
