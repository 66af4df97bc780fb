// Choosing the healthy set when a reconciliation window closes.
//
// Input: the processes that sent a link report during the window and which
// pairs of them reported each other reachable (an edge needs both
// directions). Output: a set of processes that are pairwise connected (a
// clique), chosen to keep as many current Active members as possible, then as
// many processes as possible, then the lexicographically smallest rank list.
// Only the Coordinator evaluates this and it broadcasts the outcome, so the
// rule must be deterministic but members never have to agree on it.
#pragma once

#include <cstddef>
#include <vector>

namespace mooncake::pg::control_plane {

// Symmetric adjacency over candidate indices 0..n-1 (self-edges ignored).
class LinkGraph {
public:
    explicit LinkGraph(size_t n) : n_(n), adj_(n, std::vector<bool>(n, false)) {}
    size_t size() const { return n_; }
    void connect(size_t a, size_t b) {
        adj_[a][b] = true;
        adj_[b][a] = true;
    }
    bool connected(size_t a, size_t b) const { return a == b || adj_[a][b]; }

private:
    size_t n_;
    std::vector<std::vector<bool>> adj_;
};

struct HealthyChoice {
    std::vector<size_t> members;  // ascending candidate indices
    // False when the graph was too large or too fragmented for the exact
    // search and a deterministic greedy rule chose instead.
    bool exact = true;
};

// Candidate indices must be in ascending rank order; `preferred[i]` marks
// candidates that are Active members. Exact (branch and bound) up to
// kExactCandidateLimit candidates within kExactStepBudget search steps.
inline constexpr size_t kExactCandidateLimit = 256;
inline constexpr size_t kExactStepBudget = 1 << 16;
HealthyChoice chooseHealthySet(const LinkGraph& graph, const std::vector<bool>& preferred);

}  // namespace mooncake::pg::control_plane
