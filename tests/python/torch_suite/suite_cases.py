"""Which tests of torch's DistributedTest._DistTestBase run against mooncake-cpu, and why.

Plain data, read by dist_suite.py (the worker side) and test_torch_suite.py
(the CI comparison with gloo). Edit here, not there.
"""

# The curated selection: collectives, P2P, object collectives, coalesced ops,
# barriers, futures and subgroups. Some skip with both backends at the CI world
# size (e.g. "*_group" tests need 8 ranks); they stay listed so that a larger
# MC_TORCH_SUITE_WORLD_SIZE runs them.
CASES = [
    # group bookkeeping
    "test_get_rank", "test_get_backend", "test_Backend_enum_class",
    "test_destroy_group", "test_destroy_full_group",
    "test_get_rank_size_group", "test_get_rank_size_full_group",
    # barrier
    "test_barrier", "test_barrier_group", "test_barrier_full_group",
    "test_barrier_timeout_full_group",
    # P2P
    "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source",
    "test_isend", "test_irecv",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    # broadcast / reduce
    "test_broadcast", "test_broadcast_group", "test_broadcast_full_group",
    "test_reduce_sum", "test_reduce_product", "test_reduce_min", "test_reduce_max",
    "test_reduce_full_group_sum", "test_reduce_full_group_product",
    "test_reduce_full_group_min", "test_reduce_full_group_max",
    "test_reduce_group_sum", "test_reduce_sum_twice",
    # all_reduce
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_product",
    "test_all_reduce_min", "test_all_reduce_max",
    "test_all_reduce_full_group_sum", "test_all_reduce_full_group_product",
    "test_all_reduce_full_group_min", "test_all_reduce_full_group_max",
    "test_all_reduce_group_sum",
    "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
    # coalesced
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_min", "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_full_group_sum", "test_all_reduce_coalesced_full_group_max",
    "test_all_reduce_coalesced_max_complex_unsupported",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_full_group",
    "test_all_gather_coalesced_with_empty", "test_all_gather_coalesced_complex",
    # scatter / gather / all_gather
    "test_scatter_checks", "test_scatter", "test_scatter_full_group", "test_scatter_complex",
    "test_gather_checks", "test_gather", "test_gather_full_group",
    "test_all_gather", "test_all_gather_full_group", "test_all_gather_complex",
    # all_to_all
    "test_all_to_all_single_equal_split", "test_all_to_all_single_unequal_split",
    "test_all_to_all", "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_unequal_split_full_group", "test_all_to_all_full_group",
    # futures
    "test_get_future",
    # object collectives
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup",
    "test_gather_object", "test_gather_object_subgroup",
    "test_broadcast_object_list", "test_scatter_object_list",
    # subgroups
    "test_new_subgroups_with_group_param",
    "test_new_subgroups_by_enumeration_input_rank_exceeds_world_size",
    "test_new_subgroups_world_size_not_divisible_by_group_size",
    "test_new_subgroups_overlap_not_allowed",
]

# Feature sets of torch's DistTestCases that mooncake-cpu joins (it implements
# the feature on CPU tensors). Tests gated on these sets run instead of skipping.
FEATURE_SETS = ["subgroup", "plugin"]

# Tests the suite gates on a literal backend name (BACKEND != "gloo", a
# {"gloo"} set, "Only MPI ...") although mooncake-cpu implements what they
# test. Each entry: test -> (regex the suite's skip reason must match, so a
# torch upgrade that changes the gate is noticed, why mooncake-cpu qualifies).
UNGATED = {
    **{t: (r"GLOO Batch Send Recv CPU", "batch_isend_irecv with CPU tensors and tags")
       for t in ("test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags")},
    **{t: (r"requires backend .* to be one of \{'gloo'\}", "all_reduce_coalesced on CPU")
       for t in CASES if t.startswith("test_all_reduce_coalesced_") and "complex" not in t},
    **{t: (r"Only MPI supports", "all_to_all and all_to_all_single with CPU tensors")
       for t in CASES if t.startswith("test_all_to_all")},
    "test_get_future": (r"get_future is only supported", "Work.get_future() on CPU"),
    **{t: (r"requires backend .* to be one of", "object collectives over CPU tensors")
       for t in ("test_all_gather_object_default_pg", "test_all_gather_object_subgroup",
                 "test_gather_object", "test_gather_object_subgroup",
                 "test_broadcast_object_list", "test_scatter_object_list")},
    "test_barrier_timeout_full_group": (r"Only gloo backend supports timeouts",
                                        "new_group(timeout=) bounds a barrier"),
}

# Tests that need dist.recv() without a source (recv_anysource), marked as
# expected failures while it was missing. It is supported now; an entry added
# here again must fail (strict), so a stale entry is noticed.
NEEDS_RECV_ANYSOURCE: list = []

# Tests that pass with gloo but fail with mooncake-cpu for a known reason; also
# expected failures (strict).
UNSUPPORTED: dict = {}


def expected_failures() -> dict:
    """test -> reason, for every test expected to fail with mooncake-cpu."""
    out = {t: "needs recv from any source (recv_anysource)" for t in NEEDS_RECV_ANYSOURCE}
    out.update(UNSUPPORTED)
    return out
