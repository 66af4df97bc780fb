// MooncakeBackendOptions: the pg_options of init_process_group/new_group for
// the `mooncake` and `mooncake-cpu` backends (seed 000 forms, with the seed
// 004 active_ranks forms kept as compatible overloads in bindings.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace mooncake::pg {

struct MooncakeBackendOptions : c10d::Backend::Options {
    MooncakeBackendOptions() : c10d::Backend::Options("mooncake") {}

    // Rank slots reserved for the group; 0 means "the group size at
    // creation". Fixed for the group's lifetime.
    int64_t max_group_size = 0;
    // A replacement or joining process that enters through join_group().
    bool is_extension = false;
    // Who owns failure-driven membership changes (PG or the framework), and
    // whether a failed op syncs with the Coordinator before completing.
    bool auto_deactivate_on_failure = true;
    bool auto_sync_on_failure = true;
    // Optional caller-owned mirror of the committed membership: contiguous
    // int32, max_group_size entries, on CPU or an accelerator. The backend
    // overwrites its contents.
    std::optional<at::Tensor> active_ranks;

    // Construct-time checks that need no group: throws c10::ValueError
    // naming the field, the value and what is expected.
    void validate() const;
    std::string toString() const;
};

}  // namespace mooncake::pg
