// The host's side of direct FP8 dispatch's slots (kernels/direct_dispatch.cuh):
// which slot an op's outputs are views of, and which slot it names for the
// next op. Pure (no CUDA, no torch), so the tests drive it op by op.
//
// An op writes into the slot the previous op named (its senders read that
// name from the owner's buffer), when its outputs can be views: a direct
// FP8 op outside a graph capture. It names a slot that no view holds and
// that is not the one named for itself (whose senders may write into it even
// when its outputs are tensors of their own), or none.
#pragma once

#include <array>
#include <memory>

#include "mooncake-ep/core/buffer_layout.h"

namespace mooncake::ep {

class EpDirectSlots {
public:
    struct Choice {
        int out = -1;   // the slot the op's outputs are views of, or -1
        int next = -1;  // the slot it names for the next op, or -1
    };

    EpDirectSlots() {
        for (auto& token : tokens_)
            token = std::make_shared<int>(0);
    }

    // `direct`: every rank runs direct dispatch and the buffer has the slots.
    Choice choose(bool direct, bool use_fp8, bool capturing) const {
        Choice c;
        if (!direct || capturing)
            return c;  // a replay has no host to hand out or name a slot
        c.out = use_fp8 ? named_ : -1;
        for (int s = 0; s < kEpDirectSlots && c.next < 0; ++s) {
            // Only this pool holds the token: no view of the slot is alive.
            if (s != named_ && tokens_[s].use_count() == 1)
                c.next = s;
        }
        return c;
    }

    // After the op's kernels are queued: its name is now the one peers read.
    void launched(const Choice& c) { named_ = c.next; }

    // What each view of slot `slot` holds: the slot is not named again
    // until every copy is gone.
    std::shared_ptr<void> hold(int slot) const { return tokens_[slot]; }

private:
    std::array<std::shared_ptr<int>, kEpDirectSlots> tokens_;
    int named_ = -1;
};

}  // namespace mooncake::ep
