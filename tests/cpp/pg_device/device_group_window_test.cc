// GroupWindow (group_window.h) between forked ranks on the one GPU, as the
// `mooncake` backend uses it: windows exchanged through the store and mapped
// through the engines, an all_reduce exact in epoch 1 with three members,
// then epoch 2 with two (the third gone) exact again; the abort word set by
// the host ends a wait on a silent peer with the reason the host gave,
// mapped to the CPU core's status; ranks with different slot sizes refuse
// each other naming the setting. Skips with the reason where no GPU is
// usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "mooncake-pg/device/all_reduce.h"
#include "mooncake-pg/device/group_window.h"
#include "mooncake-pg/device/routing.h"
#include "tests/cpp/pg_device/device_group_util.h"
#include "tests/cpp/pg_device/run_ranks.h"
#include "tests/cpp/pg_device/window_rank.h"

namespace mooncake::pg::device::test {
namespace {

constexpr uint64_t kSlot = 4096;  // 64 KiB messages run many chunks

TEST(DeviceGroupWindow, EpochsOfThreeThenTwoMembersAreExactAndTheAbortWordNamesTheDeadPeer) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    runRanks(3, [&](int rank) {
        WindowRank w;
        if (int rc = start(w, dir.path(), rank, kSlot); rc != 0)
            return rc;
        constexpr size_t kCount = 3 * 16384 + 5;  // two-shot, many chunks, a tail
        float* d = nullptr;
        CUDA_CHILD_OK(cudaMalloc(&d, kCount * sizeof(float)));
        const Deadline dl = Deadline::afterMs(kWaitMs);
        CHILD_OK(w.window->applyView({segment(0), segment(1), segment(2)}, 1, dl));
        for (int i = 0; i < 2; ++i) {
            if (int rc = sumOnce(w, rank, {0, 1, 2}, kCount, d); rc != 0)
                return rc;
            if (int rc = sumOnce(w, rank, {0, 1, 2}, 100, d); rc != 0)  // one-shot
                return rc;
        }
        CHILD_OK(barrier(*w.store, "epoch1", 3));
        if (rank == 2)
            return 0;  // leaves; the others go on without it
        CHILD_OK(w.window->applyView({segment(0), segment(1)}, 2, dl));
        CHILD_CHECK(w.window->epoch() == 2 && w.window->size() == 2);
        if (int rc = sumOnce(w, rank, {0, 1}, kCount, d); rc != 0)
            return rc;
        CHILD_OK(barrier(*w.store, "epoch2", 2));
        if (rank == 1) {
            // Silent, but its window stays mapped until rank 0 is done.
            CHILD_OK(barrier(*w.store, "done", 2));
            return 0;
        }
        // Rank 1 does not join: the host's evidence ends the wait, and the
        // status names it as the CPU core would.
        w.window->setAbort(abortPeerDead(1));
        w.window->setAbort(kAbortGroupAborted);  // the first reason stays
        CHILD_CHECK(w.window->abortReason() == abortPeerDead(1));
        auto call = w.window->nextCall(-1, w.stream);  // no deadline: only the abort
        CHILD_OK(call.status());
        DeviceGroupView v = call.value();
        v.max_blocks = 8;
        w.window->clearResult();
        CHILD_OK(allReduce(v, d, d, 100, DataType::kFloat32, ReduceOp::kSum, /*seq=*/0,
                           w.window->deviceResult(), w.stream));
        CUDA_CHILD_OK(cudaStreamSynchronize(w.stream));
        std::vector<int> failed;
        Status st = resultStatus(w.window->hostResult(), "all_reduce", &failed);
        CHILD_CHECK(st.code() == StatusCode::kPeerFailure);
        CHILD_CHECK(failed == std::vector<int>{1});
        w.window->clearAbort();
        CHILD_CHECK(w.window->abortReason() == 0);
        // The context is usable: a one-member view runs.
        CHILD_OK(w.window->applyView({segment(0)}, 3, dl));
        cudaFree(d);
        CHILD_OK(barrier(*w.store, "done", 2));
        return 0;
    });
}

TEST(DeviceGroupWindow, DifferentSlotSizesAreRefusedNamingTheSetting) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    runRanks(2, [&](int rank) {
        WindowRank w;
        if (int rc = start(w, dir.path(), rank, rank == 0 ? kSlot : 2 * kSlot); rc != 0)
            return rc;
        Status st = w.window->applyView({segment(0), segment(1)}, 1, Deadline::afterMs(kWaitMs));
        CHILD_CHECK(st.code() == StatusCode::kInvalidArgument);
        CHILD_CHECK(st.message().find("MC_PG_CUDA_SLOT_BYTES") != std::string::npos);
        return 0;
    });
}

TEST(DeviceGroupWindow, ViewArgumentsAreChecked) {
    SKIP_WITHOUT_GPU();
    TempDir dir;
    runRanks(1, [&](int rank) {
        WindowRank w;
        if (int rc = start(w, dir.path(), rank, kSlot); rc != 0)
            return rc;
        const Deadline dl = Deadline::afterMs(kWaitMs);
        CHILD_CHECK(w.window->applyView({segment(0)}, 0, dl).code() ==
                    StatusCode::kInvalidArgument);
        CHILD_CHECK(w.window->applyView({}, 1, dl).code() == StatusCode::kInvalidArgument);
        CHILD_CHECK(w.window->applyView({"a", "b", "c", "d", "e"}, 1, dl).code() ==
                    StatusCode::kInvalidArgument);
        CHILD_OK(w.window->applyView({segment(0)}, 1, dl));
        return 0;
    });
}

}  // namespace
}  // namespace mooncake::pg::device::test
