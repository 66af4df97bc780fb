// Who owns failure-driven membership changes, and whether failed operations
// synchronize with the Coordinator before they complete.
#pragma once

#include <chrono>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg::control_plane {

struct FailureMode {
    // The Coordinator changes unhealthy Active members to Inactive when a
    // reconciliation window closes. Off: it only reports, and the framework
    // calls deactivate_ranks.
    bool auto_deactivate_on_failure = true;
    // A failed operation calls sync_after_failure before it completes.
    bool auto_sync_on_failure = true;
};

// "pg-managed", "pg-managed-deferred-sync", "framework-managed" or "illegal".
const char* failureModeName(const FailureMode& mode);

// Rejects (auto_deactivate=false, auto_sync=true): an automatic sync waits for
// a deactivation that nobody would perform.
Status validateFailureMode(const FailureMode& mode);

// The window collects link reports from every member; a member stuck in a
// collective cannot report until that collective times out, so a window that
// is not longer than the collective timeout would misjudge it as dead.
// `collective_timeout` of zero means "unknown" and skips that comparison.
Status validateReconcileWindow(std::chrono::milliseconds window,
                               std::chrono::milliseconds collective_timeout);

}  // namespace mooncake::pg::control_plane
