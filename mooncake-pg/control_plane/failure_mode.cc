#include "mooncake-pg/control_plane/failure_mode.h"

#include <string>

namespace mooncake::pg::control_plane {

const char* failureModeName(const FailureMode& mode) {
    if (mode.auto_deactivate_on_failure) {
        return mode.auto_sync_on_failure ? "pg-managed" : "pg-managed-deferred-sync";
    }
    return mode.auto_sync_on_failure ? "illegal" : "framework-managed";
}

Status validateFailureMode(const FailureMode& mode) {
    if (!mode.auto_deactivate_on_failure && mode.auto_sync_on_failure) {
        return InvalidArgument(
            "MooncakeBackendOptions: auto_sync_on_failure=True requires "
            "auto_deactivate_on_failure=True (automatic sync is only meaningful when Mooncake PG "
            "owns failure-driven deactivation); legal combinations are (True, True), "
            "(True, False) and (False, False); sync_after_failure() can still be called "
            "manually in any mode");
    }
    return Status::OK();
}

Status validateReconcileWindow(std::chrono::milliseconds window,
                               std::chrono::milliseconds collective_timeout) {
    if (window.count() <= 0) {
        return InvalidArgument("reconciliation window must be positive, got " +
                               std::to_string(window.count()) + " ms");
    }
    if (collective_timeout.count() > 0 && window <= collective_timeout) {
        return InvalidArgument("reconciliation window (" + std::to_string(window.count()) +
                               " ms) must exceed the collective timeout (" +
                               std::to_string(collective_timeout.count()) +
                               " ms), or members still blocked in a collective are judged dead");
    }
    return Status::OK();
}

}  // namespace mooncake::pg::control_plane
