// Seed 000's exchange between IbgdaLinks of one process, as the group's
// collectives would run it (python/mooncake/_ep_ibgda.py), then activate():
// for tests that put every rank in one process (over the fake verbs provider,
// or in loopback on one real HCA).
#pragma once

#include <string>
#include <vector>

#include "mooncake-ep/ibgda/link.h"

namespace mooncake::ep::test {

inline Status connectLinksInProcess(const std::vector<IbgdaLink*>& links) {
    std::vector<IbgdaEndpoint::Words2> regions, gids;
    for (IbgdaLink* l : links) {
        regions.push_back(l->endpoint().regionWords());
        gids.push_back(l->endpoint().gidWords());
    }
    const int n = static_cast<int>(links.size());
    for (int r = 0; r < n; ++r) {
        // all_to_all: rank r receives from p what p made for r.
        std::vector<std::vector<int64_t>> from(static_cast<size_t>(n));
        for (int p = 0; p < n; ++p)
            from[p] = links[p]->endpoint().qpWordsFor(r);
        Status st = links[r]->endpoint().connect(regions, from, gids);
        if (st.ok())
            st = links[r]->activate();
        if (!st.ok())
            return st.withContext("rank " + std::to_string(r));
    }
    return Status::OK();
}

}  // namespace mooncake::ep::test
