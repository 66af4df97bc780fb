#include "mooncake-pg/device/live_graph_calls.h"

namespace mooncake::pg::device {
namespace {

using SharedCount = std::shared_ptr<std::atomic<int64_t>>;

// Runs on CUDA's internal thread, which must not block or call CUDA.
void giveBack(void* held) {
    auto* count = static_cast<SharedCount*>(held);
    (*count)->fetch_sub(1, std::memory_order_acq_rel);
    delete count;
}

}  // namespace

LiveGraphCalls::LiveGraphCalls() : count_(std::make_shared<std::atomic<int64_t>>(0)) {}

void LiveGraphCalls::holdUntilGraphDestroyed(cudaStream_t stream) {
    count_->fetch_add(1, std::memory_order_acq_rel);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = nullptr;
    if (cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph) != cudaSuccess ||
        status != cudaStreamCaptureStatusActive || graph == nullptr) {
        (void)cudaGetLastError();
        return;
    }
    auto* held = new SharedCount(count_);
    cudaUserObject_t object = nullptr;
    if (cudaUserObjectCreate(&object, held, giveBack, 1, cudaUserObjectNoDestructorSync) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        delete held;
        return;
    }
    // The graph takes over the one reference: from now on only the graph's
    // end (or the failed move, released below) runs giveBack.
    if (cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove) != cudaSuccess) {
        (void)cudaGetLastError();
        // Our reference is still ours: releasing it runs giveBack, which
        // takes back the count added above; count it again, for good.
        count_->fetch_add(1, std::memory_order_acq_rel);
        (void)cudaUserObjectRelease(object, 1);
    }
}

}  // namespace mooncake::pg::device
