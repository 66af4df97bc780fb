#include "mooncake-pg/control_plane/healthy_set.h"

#include <cstdint>

namespace mooncake::pg::control_plane {
namespace {

// Score = (#preferred) * A + (#members) * B - (#blamed), B = n + 1 and
// A = B * (n + 1): any extra Active member beats any number of extra
// non-Active ones, size breaks ties among equals, and fewer blamed members
// break ties among sets of one size. Every weight stays positive.
int64_t weightOf(bool preferred, bool blamed, size_t n) {
    const int64_t b = static_cast<int64_t>(n) + 1;
    return (preferred ? b * b : 0) + b - (blamed ? 1 : 0);
}

bool isBlamed(const std::vector<bool>& blamed, size_t v) {
    return v < blamed.size() && blamed[v];
}

// Branch and bound over cliques. Candidates are expanded in ascending index
// order, "include" before "exclude", so among sets of equal score (hence equal
// size) the first one found is the lexicographically smallest; a later set
// therefore replaces the best only when strictly better, and a branch whose
// bound cannot beat the best is cut.
class ExactSearch {
public:
    ExactSearch(const LinkGraph& g, const std::vector<bool>& preferred,
                const std::vector<bool>& blamed)
        : g_(g), weight_(g.size()) {
        for (size_t i = 0; i < g.size(); ++i)
            weight_[i] = weightOf(preferred[i], isBlamed(blamed, i), g.size());
    }

    bool run() {
        std::vector<size_t> all(g_.size());
        for (size_t i = 0; i < all.size(); ++i)
            all[i] = i;
        expand(all, 0);
        return !aborted_;
    }
    const std::vector<size_t>& best() const { return best_; }

private:
    void expand(const std::vector<size_t>& cand, int64_t score) {
        if (aborted_)
            return;
        if (++steps_ > kExactStepBudget) {
            aborted_ = true;
            return;
        }
        if (cand.empty()) {
            if (score > best_score_) {
                best_score_ = score;
                best_ = current_;
            }
            return;
        }
        // suffix[k] = total weight of cand[k..]: the most this branch can add.
        std::vector<int64_t> suffix(cand.size() + 1, 0);
        for (size_t k = cand.size(); k > 0; --k)
            suffix[k - 1] = suffix[k] + weight_[cand[k - 1]];
        for (size_t k = 0; k < cand.size(); ++k) {
            if (score + suffix[k] <= best_score_)
                return;
            size_t v = cand[k];
            std::vector<size_t> next;
            for (size_t j = k + 1; j < cand.size(); ++j) {
                if (g_.connected(v, cand[j]))
                    next.push_back(cand[j]);
            }
            current_.push_back(v);
            expand(next, score + weight_[v]);
            current_.pop_back();
            if (aborted_)
                return;
        }
    }

    const LinkGraph& g_;
    std::vector<int64_t> weight_;
    std::vector<size_t> current_;
    std::vector<size_t> best_;
    int64_t best_score_ = -1;
    size_t steps_ = 0;
    bool aborted_ = false;
};

// Repeatedly drops the candidate with the most missing edges (non-Active
// first, then blamed, then the highest index) until the rest is a clique,
// then re-adds dropped candidates that fit, Active ones and low indices first.
std::vector<size_t> greedy(const LinkGraph& g, const std::vector<bool>& preferred,
                           const std::vector<bool>& blamed) {
    const size_t n = g.size();
    std::vector<bool> in(n, true);
    std::vector<size_t> missing(n, 0);
    for (size_t a = 0; a < n; ++a) {
        for (size_t b = 0; b < n; ++b) {
            if (!g.connected(a, b))
                ++missing[a];
        }
    }
    std::vector<size_t> dropped;
    for (;;) {
        size_t victim = n;
        for (size_t v = 0; v < n; ++v) {
            if (!in[v] || missing[v] == 0)
                continue;
            if (victim == n) {
                victim = v;
                continue;
            }
            // The scan is ascending, so a later index wins a full tie.
            bool more = missing[v] > missing[victim];
            bool same = missing[v] == missing[victim];
            // Among equals: drop non-Active first, then blamed.
            bool keep_victim = preferred[v] != preferred[victim]
                                   ? preferred[v]
                                   : isBlamed(blamed, victim) && !isBlamed(blamed, v);
            if (more || (same && !keep_victim))
                victim = v;
        }
        if (victim == n)
            break;
        in[victim] = false;
        dropped.push_back(victim);
        for (size_t u = 0; u < n; ++u) {
            if (in[u] && !g.connected(victim, u))
                --missing[u];
        }
    }
    for (int pass = 0; pass < 2; ++pass) {
        for (size_t v = 0; v < n; ++v) {
            if (in[v] || preferred[v] != (pass == 0))
                continue;
            bool fits = true;
            for (size_t u = 0; u < n && fits; ++u)
                fits = !in[u] || g.connected(v, u);
            if (fits)
                in[v] = true;
        }
    }
    std::vector<size_t> members;
    for (size_t v = 0; v < n; ++v) {
        if (in[v])
            members.push_back(v);
    }
    return members;
}

}  // namespace

HealthyChoice chooseHealthySet(const LinkGraph& graph, const std::vector<bool>& preferred,
                               const std::vector<bool>& blamed) {
    HealthyChoice choice;
    if (graph.size() == 0)
        return choice;
    if (graph.size() <= kExactCandidateLimit) {
        ExactSearch search(graph, preferred, blamed);
        if (search.run()) {
            choice.members = search.best();
            return choice;
        }
    }
    choice.exact = false;
    choice.members = greedy(graph, preferred, blamed);
    return choice;
}

}  // namespace mooncake::pg::control_plane
