// Choosing the healthy set when a reconciliation window closes.
//
// Input: the processes that sent a link report during the window and which
// pairs of them reported each other reachable (an edge needs both
// directions). Output: a set of processes that are pairwise connected (a
// clique), chosen to keep as many current Active members as possible, then as
// many processes as possible, then as few as possible that an Active member's
// data plane blamed in this window, then the lexicographically smallest rank
// list. The third rule decides between an accuser and the rank it blamed when
// only their link is missing: the window can close on everyone's link report
// while the other members are still inside the collective the blamed rank
// stalls (their own evidence not sent yet), and then nothing else tells the
// two apart; the accuser has shown its data plane works, the blamed has not.
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
// candidates that are Active members, `blamed[i]` (empty: none) candidates
// named in this window's negative evidence. Exact (branch and bound) up to
// kExactCandidateLimit candidates within kExactStepBudget search steps.
inline constexpr size_t kExactCandidateLimit = 256;
inline constexpr size_t kExactStepBudget = 1 << 16;
HealthyChoice chooseHealthySet(const LinkGraph& graph, const std::vector<bool>& preferred,
                               const std::vector<bool>& blamed = {});

}  // namespace mooncake::pg::control_plane
