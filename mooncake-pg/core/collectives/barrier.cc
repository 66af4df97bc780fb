// barrier: one header-only round. Nobody leaves it before every member has
// entered it, because each waits for every other member's message.
#include "mooncake-pg/core/collectives/collectives.h"

namespace mooncake::pg::coll {

Status barrier(Rounds& rounds) {
    MC_RETURN_IF_ERROR(rounds.receiveAll());
    return rounds.finishRound();
}

}  // namespace mooncake::pg::coll
