// Fabric: the symmetric windows of one group. Every rank owns a window of the
// same size that its peers write into; the collective and P2P protocols of
// the core are written only against this interface, so they run unchanged on
// shared memory (same host), TCP through the transfer engine (other hosts)
// and, in unit tests, on threads of one process (ThreadFabric).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::pg {

class Fabric {
public:
    virtual ~Fabric() = default;

    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual size_t windowBytes() const = 0;

    // This rank's window. Peers' puts land here; read it with acquire loads
    // of the flags written by putFlag before touching the data they guard.
    virtual uint8_t* localWindow() = 0;

    // Copies [src, src + len) into `peer`'s window at `offset`. `src` may be
    // any local memory. Puts to one peer are applied in issue order, and a
    // putFlag issued after a put to the same peer becomes visible after it.
    // May return before the bytes land (transport queues); a failure of a
    // queued put surfaces from a later call on this fabric for that peer.
    // A put that must wait (for staging space while the peer's earlier
    // puts are still in flight) gives up with kTimeout at `deadline`, which
    // is no evidence that the peer died; waiting on one peer never delays
    // puts to another.
    virtual Status put(int peer, uint64_t offset, const void* src, size_t len,
                       Deadline deadline) = 0;

    // Stores the 8-byte `value` at `offset` (8-aligned) of `peer`'s window with
    // release semantics, ordered after every earlier put to `peer`.
    virtual Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline deadline) = 0;

    // A direct load/store pointer to `peer`'s window when it is mapped in this
    // process (shared memory), nullptr otherwise. Algorithms may use it to
    // read peer data in place; they must work without it.
    virtual uint8_t* peerWindow(int peer) = 0;

    // Whether `peer` is known to be dead (transport evidence). Used to fail
    // waits early instead of running to the deadline.
    virtual bool peerFailed(int peer) const = 0;

    // Hints that a waiter is spinning on a flag in the local window; fabrics
    // backed by a transport thread can use it to poll faster.
    virtual void waitHint() {}
    // Waits until every put issued so far has landed in its peer's window
    // (or failed), at most until `deadline`; false if some had not by then.
    // A call that completed here flushes before it returns: peers still
    // inside it need this rank's last messages, and a process that exits or
    // is killed right after would take queued ones with it. Fabrics whose
    // puts land before put() returns have nothing to wait for.
    virtual bool flush(Deadline deadline) {
        (void)deadline;
        return true;
    }
};

// Reads an 8-byte flag in the local window with acquire semantics.
uint64_t loadFlag(const uint8_t* window, uint64_t offset);

// Waits until the flag at `offset` of the local window satisfies
// `pred(value)`, polling with back-off (spin, then yield, then short sleeps).
// kTimeout at the deadline; kPeerFailure as soon as fabric.peerFailed(peer)
// when `peer` >= 0.
template <typename Pred>
Status waitFlag(Fabric& fabric, uint64_t offset, Pred pred, Deadline deadline, int peer);

// One rank of a group of `size` with no peers reachable: the fabric of a rank
// that is not an active member, whose collectives run local-only (a
// Communicator over it, with only this rank active, reads and writes this
// rank's blocks only). Puts to peers fail.
class SoloFabric : public Fabric {
public:
    SoloFabric(int rank, int size, size_t window_bytes);
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    size_t windowBytes() const override { return window_bytes_; }
    uint8_t* localWindow() override { return window_.get(); }
    Status put(int peer, uint64_t offset, const void* src, size_t len, Deadline deadline) override;
    Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline deadline) override;
    uint8_t* peerWindow(int) override { return nullptr; }
    bool peerFailed(int peer) const override { return peer != rank_; }

private:
    int rank_;
    int size_;
    size_t window_bytes_;
    std::unique_ptr<uint8_t[]> window_;
};

// N ranks as threads of one process: windows are heap arrays, put is memcpy.
// For unit tests of the protocols without sockets.
class ThreadFabricGroup {
public:
    ThreadFabricGroup(int size, size_t window_bytes);
    // The fabric of `rank`; valid while the group lives.
    std::shared_ptr<Fabric> fabric(int rank);
    // Makes every put/putFlag to or from `rank` fail and marks it failed.
    void kill(int rank);

private:
    friend class ThreadFabric;
    int size_;
    size_t window_bytes_;
    std::vector<std::unique_ptr<uint8_t[]>> windows_;
    std::vector<std::shared_ptr<Fabric>> fabrics_;
    std::unique_ptr<std::atomic<bool>[]> dead_;
};

}  // namespace mooncake::pg

#include "mooncake-pg/core/fabric_wait.h"
