// Runs a process's MemberAgent: the blocking API the torch layer calls
// (register, join_group, activate/deactivate_ranks, sync_after_failure), a
// thread that reads this process's inbox (mailbox.h), and the link probes the
// Coordinator's health decisions rest on.
//
// Every blocking call takes a Deadline and cannot hang: it returns the
// Coordinator's answer, the agent's own local timeout, or kTimeout naming
// what it waited for once the deadline passed. Calls that carry a deadline to
// the Coordinator (join_group, activate_ranks) pass it `answer_margin`
// earlier, so the Coordinator's verdict with its reason ("no online member
// proposed ...", "proposal failed: ...") arrives before the caller gives up.
//
// Probing. The endpoint a member publishes is the data-plane endpoint with
// its inbox appended (encodeEndpoint), so a peer knows where to send a Probe.
// When the agent asks for a probe round, the host sends a Probe to every
// listed peer, waits up to `probe_timeout` for the ProbeReplies and reports
// reached[slot] = the incarnation that answered. Rounds run one at a time; a
// request for different peers while one runs is queued (only the newest is
// kept), and one for the same peers is covered by the round in flight, whose
// report is sent after it. The thread answers Probes itself, so a process
// whose Python thread is blocked still answers.
//
// Evidence policy: a peer that this process's own data plane named in a
// failed_ranks_hint during the current epoch (syncAfterFailure or
// noteEvidence) is reported unreachable however it answers probes. That is
// what excludes a rank that is alive but stalled (its host thread answers,
// but it never enters collectives): the survivors report not reaching it, so
// it falls outside the healthy set. The suspicion ends when the epoch
// changes, i.e. when the active set was decided again.
//
// Threads: every method may be called from any thread. The view callback
// runs on the host thread, in order, never concurrently with itself; it may
// call the queries but not the blocking calls, leave() or stop(). A blocking
// call returns only after the callback ran for every view applied before the
// call completed, so the caller's own copy of the membership (active_ranks,
// size) is current when joinGroup or activateRanks returns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-pg/control_plane/mailbox.h"
#include "mooncake-pg/control_plane/member_agent.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg::control_plane {

struct MemberHostConfig {
    // agent.nonce == 0: drawn from the kernel's random source.
    MemberAgentConfig agent;
    std::string key_prefix;  // the group's prefix in the store
    // How long a probe round waits for replies. Keep it well below the
    // Coordinator's reconcile window: a report must arrive inside the window.
    Millis probe_timeout{2000};
    // Longest a single inbox read blocks: bounds stop() and timer lag.
    Millis poll_interval{50};
    // See the header comment: the Coordinator's deadline is ours minus this.
    Millis answer_margin{100};
    // An extension's registration is refused while its slot is still held
    // (e.g. by the Active process it replaces); start() retries this often.
    Millis register_retry{200};
};

// (active_mask, epoch, group_size): called whenever an applied view changed
// the epoch, i.e. the active set may differ; group_size = highest active
// rank + 1.
using ViewCallback =
    std::function<void(const std::vector<int32_t>& active_mask, uint32_t epoch, int group_size)>;

class MemberHost {
public:
    // Validates the config and starts the host thread (which only reads the
    // inbox until start() registers). `store` is not owned and must outlive
    // the host. `on_view` may be empty.
    static Result<std::unique_ptr<MemberHost>> create(MemberHostConfig config, KVStore* store,
                                                      ViewCallback on_view);
    // stop(); does not leave (call leave() first to give the slot up).
    ~MemberHost();
    MemberHost(const MemberHost&) = delete;
    MemberHost& operator=(const MemberHost&) = delete;

    // ---- blocking calls ----

    // Registers this process in its slot, with `endpoint` (the data-plane
    // endpoint; may be empty and published later). A founder returns once
    // the group bootstrapped (it is Active); an extension once it holds its
    // slot (Inactive), retrying while the slot is still held by another
    // process (which the Coordinator treats as evidence that it died).
    Status start(const std::string& endpoint, Deadline deadline);
    // Not blocking: the Coordinator learns it asynchronously.
    Status publishEndpoint(const std::string& endpoint);
    // Inactive -> AwaitingActivation; returns once the applied view shows
    // this slot Active (and the view callback has seen it), or with the
    // Coordinator's reason when no activation committed before `deadline`.
    Status joinGroup(Deadline deadline);
    // Also recover_ranks. Returns once the commit's view is applied here and
    // has been through the view callback.
    Status activateRanks(const std::vector<uint32_t>& ranks, Deadline deadline);
    Status deactivateRanks(const std::vector<uint32_t>& ranks, Deadline deadline);
    // Reports the evidence (failed_ranks_hint: empty or one 0/1 entry per
    // slot) and this process's links, waits for the reconciliation it joined
    // (if any) and returns with the latest view applied. `observed_epoch`:
    // the epoch whose op failed (0: the current one); a failure noted
    // earlier (noteEvidence) and not yet reported counts with its own epoch.
    // Evidence older than the Coordinator's epoch is stale: the sync then
    // returns at once with the newer view, and no reconciliation reopens.
    Status syncAfterFailure(bool local_success, const std::vector<uint8_t>& failed_ranks_hint,
                            Deadline deadline, uint64_t observed_epoch = 0);
    // Records data-plane evidence without reporting it (deferred sync): the
    // named ranks count as unreachable in this epoch's probe reports, and the
    // next syncAfterFailure reports the failure as one of `observed_epoch`
    // (0: the current one).
    void noteEvidence(const std::vector<uint8_t>& failed_ranks_hint, uint64_t observed_epoch = 0);
    // Gives the slot up (pending calls fail with kAborted) and stops the host.
    Status leave();
    // Stops the host thread without leaving (to the group this process just
    // disappears); blocking calls in flight return kAborted. Idempotent;
    // returns within about one poll interval.
    void stop();

    // ---- local queries (the mirror; never communicate) ----

    std::vector<int32_t> activeRanks() const;
    int groupSize() const;
    std::vector<bool> peerState(const std::vector<uint32_t>& ranks) const;
    int numSyncedRanks() const;
    uint64_t epoch() const;
    uint32_t incarnation() const;
    uint32_t rank() const { return rank_; }
    GroupView view() const;
    // The data-plane endpoint `rank` published (empty if none).
    std::string peerEndpoint(uint32_t rank) const;
    // Waits until `pred` holds for the mirror (checked at every applied view)
    // and the view callback has run for every view applied so far.
    Status awaitView(const std::function<bool(const GroupView&)>& pred, Deadline deadline) const;

private:
    struct ProbeRound {
        bool active = false;
        Millis deadline{0};
        std::vector<PeerToProbe> peers;        // as asked, to recognise repeats
        std::map<uint64_t, uint32_t> waiting;  // probe id -> slot
        std::vector<uint32_t> reached;
    };

    MemberHost(MemberHostConfig config, MemberAgent agent, KVStore* store, ViewCallback on_view);

    void run();
    // The rest runs with mu_ held.
    void execute(std::vector<AgentEffect> effects);
    void onBytes(Millis now, const std::string& bytes);
    bool admitPeer(const MessageHeader& h, const char* what) const;
    void answerProbe(const MessageHeader& h, const Probe& p);
    void onProbeReply(Millis now, const MessageHeader& h, const ProbeReply& r);
    void requestProbe(Millis now, ProbeLinks request);
    void startRound(Millis now, std::vector<PeerToProbe> peers);
    void finishRound(Millis now);
    void runTimers(Millis now);
    Millis nextWake(Millis now) const;
    void noteEvidenceLocked(const std::vector<uint8_t>& hint, uint64_t observed_epoch);
    bool suspected(uint32_t slot) const;
    ControlMessage peerMessage(MessageBody body) const;
    void push(const std::string& inbox, const std::string& bytes, const char* what);
    uint64_t beginOp();
    Millis wireTimeout(Deadline deadline) const;
    // Says what a call waited for when its deadline passed; runs with mu_ held.
    using Describe = std::function<std::string()>;
    // Waits for OpCompleted(id); mu_ must not be held.
    Status await(uint64_t id, Deadline deadline, const Describe& timed_out);
    Status issueAndAwait(const std::function<AgentEvent(uint64_t id)>& make, Deadline deadline,
                         const Describe& timed_out);

    const MemberHostConfig config_;
    const uint32_t rank_;
    const uint64_t nonce_;
    Mailbox mailbox_;
    const std::string inbox_;
    InboxReader reader_;  // host thread only
    const ViewCallback on_view_;

    mutable std::mutex mu_;
    mutable std::condition_variable cv_;  // ops completed, views applied, stop
    std::optional<MemberAgent> agent_;
    // A completion is handed to its caller only once every view the agent
    // applied before it has been through the view callback: otherwise
    // join_group could return while the torch layer's active_ranks and size
    // still show the old membership (the callback runs outside mu_).
    struct DoneOp {
        Status status;
        uint64_t views_before = 0;  // views_queued_ when it completed
    };
    std::set<uint64_t> waiting_ops_;
    std::map<uint64_t, DoneOp> done_ops_;
    uint64_t views_queued_ = 0;     // ViewApplied effects seen
    uint64_t views_delivered_ = 0;  // of those, passed to on_view_
    uint64_t next_request_ = 0;
    ProbeRound round_;
    uint64_t next_probe_id_ = 0;
    std::vector<bool> suspects_;
    // The agent's epoch, read without mu_: the torch layer asks for it on
    // every op, and mu_ is held while a message goes out through the store
    // (two round trips), which an op must not wait for.
    std::atomic<uint64_t> epoch_;
    uint64_t suspects_epoch_ = 0;
    // The oldest epoch of a failure noted and not yet reported (0: none).
    uint64_t unreported_failure_epoch_ = 0;
    std::deque<ViewApplied> views_to_deliver_;
    bool stopping_ = false;
    bool store_error_logged_ = false;  // host thread only
    std::atomic<bool> stop_flag_{false};
    std::thread thread_;
};

}  // namespace mooncake::pg::control_plane
