// Control messages carried through the group's key-value store.
//
// The store is the one rendezvous every process of a group already shares
// (torch hands the backend a c10d Store), so the control plane needs no
// listening sockets of its own. Keys, under the group's key prefix:
//
//   <prefix>/cp/coord                    the Coordinator's inbox
//   <prefix>/cp/proc/<slot>/<nonce>      one process's inbox
//
// An inbox is built from the calls every c10d Store implements (set, get,
// add, wait/check, deleteKey), not from store queues, which FileStore lacks:
//
//   <inbox>/count    how many messages were ever sent to it (add)
//   <inbox>/<n>      message n, n = 1, 2, ... (set by its sender)
//
// A sender claims the next number with add(count, 1) and then sets the
// message under it; the inbox's only reader takes them in order and deletes
// each after reading it. Two senders never share a number, and the reader
// sees every sender's messages in the order that sender sent them.
//
// A sender that died between add and set leaves a hole (a number never
// written); the reader skips it, logged, once open for `hole_timeout`.
//
// <nonce> is the process's random registration nonce (16 hex digits), so a
// replacement in the same slot never reads mail meant for its predecessor and
// a late message for a dead process lands where nobody looks.
//
// Peers find each other's inbox through the endpoint a member publishes in
// the membership table: the host appends "|inbox=<nonce>" to the data-plane
// endpoint it is given (encodeEndpoint), and decodes it when probing.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "mooncake-pg/control_plane/events.h"
#include "mooncake-pg/control_plane/messages.h"
#include "mooncake-transfer-engine/common/deadline.h"
#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/common/status.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"

namespace mooncake::pg::control_plane {

std::string coordinatorInboxKey(std::string_view prefix);
std::string processInboxKey(std::string_view prefix, uint32_t slot, uint64_t nonce);

// What encodeEndpoint adds to a data-plane endpoint.
inline constexpr std::string_view kInboxMarker = "|inbox=";
inline constexpr size_t kEncodedEndpointOverhead = kInboxMarker.size() + 16;
// The longest data-plane endpoint that still fits the wire limit once encoded.
inline constexpr size_t kMaxDataEndpointBytes = kMaxEndpointBytes - kEncodedEndpointOverhead;

// "<endpoint>|inbox=<16 hex digits>". An empty endpoint stays empty: a member
// that has not published one is neither probed nor counted as synced.
std::string encodeEndpoint(std::string_view endpoint, uint64_t nonce);

struct DecodedEndpoint {
    std::string endpoint;  // the data-plane part
    uint64_t nonce = 0;
};
// nullopt when the marker or a well-formed nonce is missing.
std::optional<DecodedEndpoint> decodeEndpoint(std::string_view encoded);

// Sends to inboxes of one group. The store is not owned and must outlive the
// Mailbox; it is used from several threads, which every KVStore allows.
class Mailbox {
public:
    Mailbox(KVStore* store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}

    const std::string& prefix() const { return prefix_; }
    std::string coordinatorInbox() const { return coordinatorInboxKey(prefix_); }
    std::string processInbox(uint32_t slot, uint64_t nonce) const {
        return processInboxKey(prefix_, slot, nonce);
    }

    Status send(const std::string& inbox, const ControlMessage& message);
    Status sendBytes(const std::string& inbox, const std::string& bytes);

private:
    KVStore* store_;
    std::string prefix_;
};

// How long a reader keeps looking for a claimed but unwritten message number
// before it gives the number up. A live sender writes within microseconds of
// its claim; only a sender that died in between (or a process stopped for
// this long between two store calls) leaves one open that long.
inline constexpr Millis kDefaultHoleTimeout{2000};

// The single reader of one inbox. Not thread-safe: one thread calls receive().
//
// Messages are read in number order, except that a number claimed but not
// yet written (a hole) does not hold up the numbers after it: a sender that
// died between its claim and its write would otherwise delay every other
// sender's messages by the hole timeout (a dead rank's last probe reply held
// up the survivors' replies past their probe timeout, and a survivor was
// deactivated). A hole's message is still delivered if it is written before
// the hole timeout. Each sender's own messages stay in order: a sender writes
// one message before it claims the next, so once any later message has been
// read, every hole still open belongs to another sender.
class InboxReader {
public:
    InboxReader(KVStore* store, std::string inbox, Millis hole_timeout = kDefaultHoleTimeout)
        : store_(store), inbox_(std::move(inbox)), hole_timeout_(hole_timeout) {}

    const std::string& inbox() const { return inbox_; }
    // The next message's raw bytes (the caller parses and decides what to do
    // with garbage), or kTimeout when none arrived before `deadline`; another
    // code when the store failed.
    Result<std::string> receive(Deadline deadline);
    // Message numbers given up on so far (holes).
    uint64_t skipped() const { return skipped_; }

    // A wait for the next number wakes this often to see whether it was
    // claimed meanwhile (the hosts wait in shorter slices anyway) ...
    static constexpr Millis kHoleCheck{20};
    // ... and this often while holes are open, to look at them again.
    static constexpr Millis kHolePoll{5};

private:
    // Moves the holes' messages written since into ready_, gives up the holes
    // older than the hole timeout.
    Status pollHoles();
    // Reads message `n` (known written), deletes its key and files it in ready_.
    void take(int64_t n, std::string bytes);

    KVStore* store_;
    std::string inbox_;
    Millis hole_timeout_;
    int64_t next_ = 1;                      // the lowest number never looked at
    std::map<int64_t, Millis> holes_;       // claimed, unwritten: since when
    std::map<int64_t, std::string> ready_;  // read, not yet delivered
    uint64_t skipped_ = 0;
    bool remove_failed_logged_ = false;
};

// Steady time as the state machines count it (their Tick/Received `now`).
Millis hostNow();

// Logs a host-side message under the control plane's subsystem ("coord").
void hostLog(LogLevel level, const std::string& text);

}  // namespace mooncake::pg::control_plane
