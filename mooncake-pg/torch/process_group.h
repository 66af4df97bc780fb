// MooncakeProcessGroup: what the backend creator hands torch. torch uses a
// creator's ProcessGroup as the group itself (and then registers no backend
// of its own), so this is the object dist.get_world_size() asks: getSize()
// follows the committed membership. Its collectives are the default
// ProcessGroup ones, which go through the c10d dispatcher to the registered
// MooncakeBackend; dispatcher-routed callers (functional collectives,
// _get_backend, P2P) therefore reach the same implementation.
#pragma once

#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "mooncake-pg/torch/backend.h"
#include "mooncake-pg/torch/options.h"

namespace mooncake::pg {

class MooncakeProcessGroup final : public c10d::ProcessGroup {
public:
    MooncakeProcessGroup(const c10::intrusive_ptr<c10d::Store>& store,
                         c10::intrusive_ptr<MooncakeBackend> backend);

    // Highest active in-group rank + 1 (seed 000), not the slot count.
    int getSize() const override;
    const std::string getBackendName() const override;

    // Each op screens tensor devices, then takes the default dispatcher
    // path. The dispatcher hands devices without a c10d kernel (meta) to
    // no-op fakes that never reach the backend, so they are caught here.
    using Work = c10d::Work;
    template <typename T>
    using Ptr = c10::intrusive_ptr<T>;
    using Tensors = std::vector<at::Tensor>;
    Ptr<Work> broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override;
    Ptr<Work> allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override;
    Ptr<Work> allreduce_coalesced(Tensors& tensors,
                                  const c10d::AllreduceCoalescedOptions& opts) override;
    Ptr<Work> reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override;
    Ptr<Work> allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                        const c10d::AllgatherOptions& opts) override;
    Ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                              const c10d::AllgatherOptions& opts) override;
    Ptr<Work> allgather_coalesced(std::vector<Tensors>& output_lists, Tensors& inputs,
                                  const c10d::AllgatherOptions& opts) override;
    Ptr<Work> allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                              const c10d::AllgatherOptions& opts) override;
    Ptr<Work> gather(std::vector<Tensors>& outputs, Tensors& inputs,
                     const c10d::GatherOptions& opts) override;
    Ptr<Work> scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                      const c10d::ScatterOptions& opts) override;
    Ptr<Work> reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                             const c10d::ReduceScatterOptions& opts) override;
    Ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                   const c10d::ReduceScatterOptions& opts) override;
    Ptr<Work> reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                              const c10d::ReduceScatterOptions& opts) override;
    Ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                            std::vector<int64_t>& output_split_sizes,
                            std::vector<int64_t>& input_split_sizes,
                            const c10d::AllToAllOptions& opts) override;
    Ptr<Work> alltoall(Tensors& outputs, Tensors& inputs,
                       const c10d::AllToAllOptions& opts) override;
    Ptr<Work> send(Tensors& tensors, int dst_rank, int tag) override;
    Ptr<Work> recv(Tensors& tensors, int src_rank, int tag) override;

    const c10::intrusive_ptr<MooncakeBackend>& mooncakeBackend() const { return backend_; }

private:
    // Screens each argument (a tensor, a list or a list of lists) of `op`,
    // in order; defined in process_group.cc, its only user.
    template <typename... Args>
    void screenAll(const char* op, const Args&... args) const;

    c10::intrusive_ptr<MooncakeBackend> backend_;
};

// The extended-API creator: validates `options` (may be null), bootstraps a
// MooncakeBackend over the group's store and wraps it. Blocks until every
// rank of the group has joined or the group timeout passes.
c10::intrusive_ptr<MooncakeProcessGroup> createMooncakeProcessGroup(
    const c10d::DistributedBackendOptions& dist_options,
    c10::intrusive_ptr<MooncakeBackendOptions> options, bool is_cuda);

// Process-wide settings read when a group is created (pg.set_host_ip,
// pg.set_device_filter); they do not affect existing groups.
void setHostIp(const std::string& host_ip);
void setDeviceFilter(const std::vector<std::string>& filter);
// pg.set_transfer_engine: later groups use `engine` (null: their own).
void setTransferEngine(std::shared_ptr<SharedEngine> engine);

}  // namespace mooncake::pg
