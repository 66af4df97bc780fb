#include "mooncake-pg/core/shared_engine.h"

#include <unistd.h>

#include <utility>

#include "mooncake-transfer-engine/common/logging.h"
#include "mooncake-transfer-engine/common/random.h"

namespace mooncake::pg {

namespace {
constexpr size_t kSecretBytes = 16;
constexpr char kPerGroup[] = "per-group";
constexpr char kSharedPrefix[] = "shared:";

std::string describeChoice(const std::string& choice) {
    if (choice == kPerGroup)
        return "its own per-group engine (no pg.set_transfer_engine)";
    return "a shared engine (pg.set_transfer_engine) on store " +
           choice.substr(sizeof(kSharedPrefix) - 1);
}
}  // namespace

Result<std::shared_ptr<SharedEngine>> SharedEngine::create(std::shared_ptr<KVStore> store,
                                                           SharedEngineOptions options) {
    if (!store)
        return InvalidArgument("SharedEngine: store is null");
    if (options.key_prefix.empty())
        return InvalidArgument("SharedEngine: key_prefix is empty; expected a non-empty prefix");
    if (options.timeout_ms <= 0) {
        return InvalidArgument("SharedEngine: timeout_ms=" + std::to_string(options.timeout_ms) +
                               "; expected a positive number of milliseconds");
    }
    const std::string& prefix = options.key_prefix;
    const Deadline deadline = Deadline::afterMs(options.timeout_ms);

    // The first engine of the store creates the secret and the store id; the
    // rest wait for them. add() is atomic on every store, so exactly one
    // engine wins the claim.
    MC_ASSIGN_OR_RETURN(int64_t claim, store->add(prefix + "/secret_claim", 1));
    std::string secret;
    std::string store_id;
    if (claim == 1) {
        secret = randomHex(kSecretBytes);
        store_id = randomHex(8);
        // The id first: a reader that sees the secret finds the id too.
        MC_RETURN_IF_ERROR(store->set(prefix + "/store_id", store_id));
        MC_RETURN_IF_ERROR(store->set(prefix + "/secret", secret));
    } else {
        auto got = store->get(prefix + "/secret", deadline);
        if (!got.ok()) {
            return got.status().withContext(
                "SharedEngine: waiting for the engine secret under '" + prefix +
                "/secret' (the first engine of this store claimed it but did not publish it)");
        }
        secret = std::move(got).value();
        MC_ASSIGN_OR_RETURN(store_id, store->get(prefix + "/store_id", deadline));
    }

    std::string name = options.segment_name;
    if (name.empty()) {
        name = "engine-" + std::to_string(::getpid()) + "-" + randomHex(6);
    } else {
        MC_ASSIGN_OR_RETURN(int64_t taken, store->add(prefix + "/name/" + name, 1));
        if (taken != 1) {
            return InvalidArgument("SharedEngine: segment_name '" + name +
                                   "' is already used by another engine on this store (prefix '" +
                                   prefix + "'); expected a unique name");
        }
    }

    std::shared_ptr<SharedEngine> self(new SharedEngine());
    te::EngineOptions eo;
    eo.store = std::move(store);
    eo.segment_name = name;
    eo.secret = secret;
    eo.key_prefix = prefix;
    eo.open_timeout_ms = options.timeout_ms;
    self->engine_ = std::make_unique<te::TransferEngine>(eo);
    self->store_id_ = store_id;
    self->key_prefix_ = prefix;
    MC_RETURN_IF_ERROR(self->engine_->init(options.host_ip, options.device_filter)
                           .withContext("SharedEngine: starting engine '" + name + "'"));
    return self;
}

SharedEngine::~SharedEngine() {
    if (engine_)
        engine_->shutdown();
}

Result<std::shared_ptr<te::TransferEngine>> SharedEngine::lease() {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
        return InvalidArgument("TransferEngine '" + engine_->segmentName() +
                               "' was closed; pass an open engine to pg.set_transfer_engine, or "
                               "None for per-group engines");
    }
    ++leases_;
    // The deleter keeps this object (and so the engine) alive until the
    // lease is returned.
    std::shared_ptr<SharedEngine> self = shared_from_this();
    return std::shared_ptr<te::TransferEngine>(engine_.get(),
                                               [self](te::TransferEngine*) { self->release(); });
}

void SharedEngine::release() {
    std::lock_guard<std::mutex> lock(mu_);
    --leases_;
}

int SharedEngine::leases() const {
    std::lock_guard<std::mutex> lock(mu_);
    return leases_;
}

Status SharedEngine::close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_)
        return Status::OK();
    if (leases_ > 0) {
        return InvalidArgument(std::to_string(leases_) +
                               " process group(s) still use this engine; destroy them "
                               "(dist.destroy_process_group) before closing it");
    }
    closed_ = true;
    engine_->shutdown();
    return Status::OK();
}

bool SharedEngine::closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
}

std::string engineChoice(const SharedEngine* shared) {
    if (shared == nullptr)
        return kPerGroup;
    return kSharedPrefix + shared->keyPrefix() + "/" + shared->storeId();
}

Status agreeOnEngine(KVStore& store, const std::string& group_key, int rank, int compare_ranks,
                     const std::string& mine, Deadline deadline) {
    const std::string base = group_key + "/engine/";
    MC_RETURN_IF_ERROR(store.set(base + std::to_string(rank), mine));
    std::string mismatch;
    for (int r = 0; r < compare_ranks; ++r) {
        if (r == rank)
            continue;
        auto theirs = store.get(base + std::to_string(r), deadline);
        if (!theirs.ok()) {
            return theirs.status().withContext("reading rank " + std::to_string(r) +
                                               "'s transfer-engine choice");
        }
        if (theirs.value() != mine) {
            mismatch += "; rank " + std::to_string(r) + " uses " + describeChoice(theirs.value());
        }
    }
    if (mismatch.empty())
        return Status::OK();
    if (compare_ranks > 1) {
        // Every founder fails here, and the one hosting the store (rank 0
        // under torchrun) takes the store with it when it exits: a rank still
        // reading the choices would report a dead store instead of this
        // reason. So each says it has read them, and returns once all have
        // (or at the deadline; a rank that never reads is stuck anyway).
        const std::string read = base + "read/";
        if (store.set(read + std::to_string(rank), "1").ok()) {
            for (int r = 0; r < compare_ranks; ++r) {
                if (r != rank && !store.get(read + std::to_string(r), deadline).ok())
                    break;
            }
        }
    }
    return InvalidArgument("the ranks disagree on the transfer engine: rank " +
                           std::to_string(rank) + " uses " + describeChoice(mine) + mismatch +
                           ". Every rank of a group must call pg.set_transfer_engine with engines "
                           "on the same store, or none of them");
}

}  // namespace mooncake::pg
