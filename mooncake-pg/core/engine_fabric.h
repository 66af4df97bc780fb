// EngineFabric: a Fabric whose windows are transfer-engine shared memory.
// Same-host peers' windows are mapped (puts are memcpy and atomic stores);
// other peers are written through the engine (tcp), staged through a
// registered bounce ring because the engine only sends registered memory.
// Each peer has a slice of that ring of its own, so a peer whose writes stop
// completing fills only its own slice and delays only puts to itself.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mooncake-pg/core/fabric.h"
#include "mooncake-pg/core/liveness_prober.h"
#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg {

struct EngineFabricOptions {
    int rank = 0;
    int size = 1;
    size_t window_bytes = 0;
    // Store prefix unique to this group instance (e.g. "<group>/<generation>").
    std::string group_key;
    std::string host_ip;
    std::vector<std::string> device_filter;
    // Ranks [0, connect_ranks) are connected at bootstrap (-1: all). The
    // rest are reserved slots that connectPeer() opens once they publish.
    int connect_ranks = -1;
    // Bootstrap deadline: how long to wait for peers to publish.
    int64_t bootstrap_timeout_ms = 300000;
    // Staging for puts to peers that are not mapped, split evenly between
    // the ranks (at least kMinOutboxBytes each).
    size_t bounce_bytes = 16 << 20;
    // Whether a same-host peer's process is checked by pid. Off, every peer
    // is checked like one on another host (tests of that path).
    bool probe_local_pids = true;
    // An engine owned by someone else (pg.set_transfer_engine): the fabric
    // allocates its window and bounce ring in it, frees exactly those on
    // destruction and never shuts it down. host_ip and device_filter are
    // then unused. Null: the fabric creates an engine of its own.
    std::shared_ptr<te::TransferEngine> engine;
};

class EngineFabric : public Fabric {
public:
    // Collective over the group: publishes this rank's window and opens every
    static Result<std::shared_ptr<EngineFabric>> create(std::shared_ptr<KVStore> store,
                                                        EngineFabricOptions options);
    ~EngineFabric() override;

    int rank() const override { return options_.rank; }
    int size() const override { return options_.size; }
    size_t windowBytes() const override { return options_.window_bytes; }
    uint8_t* localWindow() override { return window_; }
    Status put(int peer, uint64_t offset, const void* src, size_t len, Deadline deadline) override;
    Status putFlag(int peer, uint64_t offset, uint64_t value, Deadline deadline) override;
    uint8_t* peerWindow(int peer) override;
    // Transport evidence (failed writes) for every peer; for a peer on this
    // host also whether its process is gone, probed at most every
    // kLivenessProbeMs per peer so that callers may poll it in a spin loop.
    // Any other peer is probed through the engine (a PING over tcp) by a
    // background thread, at most every kRemoteProbeMs per peer; a refused or
    // reset connection marks it failed, a probe that times out proves
    // nothing (a slow link), leaving a dead host to the collective timeout.
    bool peerFailed(int peer) const override;
    // Drains every peer's outbox: the writes to peers reached through the
    // engine, which put() only queues.
    bool flush(Deadline deadline) override;
    static constexpr int64_t kLivenessProbeMs = 25;
    static constexpr size_t kMinOutboxBytes = 64 << 10;
    static constexpr int64_t kRemoteProbeMs = 100;

    // "<segment>#<window address>": what a peer passes to connectPeer().
    std::string endpoint() const;
    // Opens `peer`'s window from its endpoint: a reserved slot filled after
    // bootstrap, or a replacement process with a new segment. Clears the
    // peer's failed mark. Safe while other threads put to any peer, `peer`
    // included: each put goes either to the previous connection or to the
    // new one (a put to the previous process of the slot is lost).
    Status connectPeer(int peer, const std::string& endpoint, Deadline deadline);
    // The endpoint `peer` was last connected with ("" if never).
    std::string peerEndpoint(int peer) const;
    // The engine segment an endpoint names (what peers map device memory
    // of that process through).
    static std::string segmentOf(const std::string& endpoint);
    // segmentOf each of ranks [0, ranks)'s endpoints, this rank's own and
    // those never connected empty.
    std::vector<std::string> peerSegments(int ranks) const;

    // Records transport or protocol evidence that `peer` is dead.
    void markPeerFailed(int peer);
    // Whether every peer's window is mapped (pure shared-memory data path).
    bool allPeersMapped() const;
    te::TransferEngine& engine() { return *engine_; }

private:
    // One peer's connection, immutable once published: connectPeer installs
    // a new record rather than editing the current one, so the lock-free
    // readers on the put path see one whole connection, old or new, at the
    // cost of one acquire load. Replaced records live until the fabric does
    // (one per reconnect), so a reader may keep using the record it loaded;
    // the windows they point at stay mapped too (the shm transport keeps its
    // mappings until shutdown).
    struct Peer {
        te::SegmentID segment = -1;
        uint64_t window_addr = 0;
        uint8_t* mapped = nullptr;  // nullptr: reached through the engine
        std::string endpoint;
    };
    struct InFlight {
        te::BatchID batch;
        size_t bounce_begin;  // within the peer's outbox
        size_t bounce_len;
        te::SegmentID segment;  // the connection it went to
    };
    // One peer's slice of the bounce ring and the writes still reading it.
    // `mu` is held for a whole put to the peer, waits for its earlier writes
    // included; a timed mutex so that a second put to the same peer gives
    // up at its own deadline too. Lock order: an outbox's mu, then mu_.
    struct Outbox {
        std::timed_mutex mu;
        uint8_t* ring = nullptr;
        size_t cap = 0;
        std::deque<InFlight> inflight;
    };

    EngineFabric(std::shared_ptr<KVStore> store, EngineFabricOptions options);
    Status bootstrap();
    // An engine of the group's own, under the group secret.
    Status startOwnEngine(const std::string& secret);
    Status checkPut(int peer, uint64_t offset, size_t len) const;
    const Peer& peerRecord(int peer) const { return *peers_[peer].load(std::memory_order_acquire); }
    void publishPeer(int peer, Peer record);  // expects mu_ held
    Status remotePut(int peer, uint64_t offset, const void* src, size_t len, Deadline deadline);
    // Frees outbox space of the peer's completed writes, oldest first; with
    // `block` first waits, until `deadline`, for the oldest one (kTimeout
    // then). A failed write marks the peer failed if it went to the peer's
    // current connection, and is not an error of the call. Expects ob.mu held.
    Status reapLocked(int peer, Outbox& ob, bool block, Deadline deadline);
    // Waits for every write of the peer to finish; false at the deadline.
    bool drainLocked(int peer, Outbox& ob, Deadline deadline);

    std::shared_ptr<KVStore> store_;
    EngineFabricOptions options_;
    std::shared_ptr<te::TransferEngine> engine_;
    bool external_engine_ = false;
    uint8_t* window_ = nullptr;
    std::unique_ptr<std::atomic<const Peer*>[]> peers_;      // by rank, never null
    std::vector<std::unique_ptr<const Peer>> peer_records_;  // every published record; mu_
    std::unique_ptr<std::atomic<bool>[]> failed_;
    // By rank: pid of a same-host peer whose process can be probed (0: not
    // probed), its start time (to tell a reused pid apart) and when the next
    // probe is due (steady clock, ns).
    std::unique_ptr<std::atomic<int32_t>[]> local_pid_;
    std::unique_ptr<std::atomic<uint64_t>[]> local_start_;
    std::unique_ptr<std::atomic<int64_t>[]> next_probe_ns_;

    // Declared after engine_: stopped before the engine goes.
    std::unique_ptr<LivenessProber> prober_;

    std::string segment_name_;
    mutable std::mutex mu_;  // guards peer_records_ and publishing a record
    uint8_t* bounce_ = nullptr;
    std::unique_ptr<Outbox[]> outboxes_;  // by rank
    // Set by the first write through the engine; until then flush() has
    // nothing to wait for (every peer so far is mapped).
    std::atomic<bool> engine_writes_{false};
};

}  // namespace mooncake::pg
