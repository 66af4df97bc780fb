#include "tests/cpp/rdma/soft_hca.h"

#include <cstdio>
#include <cstring>

namespace mooncake::te::rdma::soft {
namespace {

std::string hex(uint64_t v) {
    char text[17];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(v));
    return text;
}

using mlx5::toBig32;
using mlx5::toBig64;

uint32_t loadBig32(const unsigned char* p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof(v));
    return toBig32(v);
}

uint64_t loadBig64(const unsigned char* p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof(v));
    return toBig64(v);
}

// One 64-byte CQE: every field first, the ownership byte last.
void writeCqe(unsigned char* cqe, uint16_t wqe_counter, uint8_t opcode, uint8_t syndrome,
              uint8_t owner) {
    std::memset(cqe, 0, mlx5::kCqeBytes - 1);
    cqe[mlx5::kCqeSyndromeOffset] = syndrome;
    cqe[mlx5::kCqeWqeCounterOffset] = static_cast<unsigned char>(wqe_counter >> 8);
    cqe[mlx5::kCqeWqeCounterOffset + 1] = static_cast<unsigned char>(wqe_counter);
    __atomic_store_n(&cqe[mlx5::kCqeOpOwnOffset], static_cast<unsigned char>(opcode << 4 | owner),
                     __ATOMIC_RELEASE);
}

}  // namespace

uint32_t SoftHca::registerMemory(const void* addr, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.push_back(Region{reinterpret_cast<uintptr_t>(addr), bytes});
    return static_cast<uint32_t>(regions_.size());  // keys start at 1
}

bool SoftHca::covers(uint32_t key, uint64_t addr, uint64_t bytes) const {
    if (hooks_.covers)
        return hooks_.covers(key, addr, bytes);
    if (key == 0 || key > regions_.size())
        return false;
    const Region& r = regions_[key - 1];
    return addr >= r.begin && bytes <= r.bytes && addr - r.begin <= r.bytes - bytes;
}

int SoftHca::createQueuePair(uint32_t wqe_count, uint32_t cqe_count, QueueMemory memory,
                             uint32_t first_index, uint32_t qpn) {
    auto q = std::make_unique<Qp>();
    auto own = [&q](size_t bytes) {
        q->owned.push_back(std::make_unique<unsigned char[]>(bytes));
        return q->owned.back().get();
    };
    if (!memory.wqes)
        memory.wqes = own(size_t{wqe_count} * mlx5::kBasicBlockBytes);
    if (!memory.cqes)
        memory.cqes = own(size_t{cqe_count} * mlx5::kCqeBytes);
    if (!memory.sq_dbrec)
        memory.sq_dbrec = reinterpret_cast<uint32_t*>(own(2 * sizeof(uint32_t)));
    if (!memory.cq_dbrec)
        memory.cq_dbrec = reinterpret_cast<uint32_t*>(own(sizeof(uint32_t)));
    if (!memory.doorbell)
        memory.doorbell = reinterpret_cast<uint64_t*>(own(sizeof(uint64_t)));
    std::memset(memory.wqes, 0, size_t{wqe_count} * mlx5::kBasicBlockBytes);
    for (uint32_t i = 0; i < cqe_count; ++i) {
        unsigned char* cqe = memory.cqes + size_t{i} * mlx5::kCqeBytes;
        std::memset(cqe, 0, mlx5::kCqeBytes);
        cqe[mlx5::kCqeOpOwnOffset] = mlx5::kCqeInvalid << 4;
    }
    memory.sq_dbrec[0] = 0;
    memory.sq_dbrec[1] = mlx5::sendDoorbellValue(first_index);
    memory.cq_dbrec[0] = 0;
    *memory.doorbell = 0;
    q->mem = memory;
    q->wqe_count = wqe_count;
    q->cqe_count = cqe_count;
    q->executed = q->first_index = first_index;
    std::lock_guard<std::mutex> lock(mu_);
    q->qpn = qpn != 0 ? qpn : 0x100 + static_cast<uint32_t>(qps_.size());
    qps_.push_back(std::move(q));
    return static_cast<int>(qps_.size()) - 1;
}

mlx5::SendQueue SoftHca::sendQueue(int qp) const {
    std::lock_guard<std::mutex> lock(mu_);
    const Qp& q = *qps_.at(static_cast<size_t>(qp));
    mlx5::SendQueue sq;
    sq.wqes = q.mem.wqes;
    sq.wqe_count = q.wqe_count;
    sq.dbrec = q.mem.sq_dbrec;
    sq.doorbell = q.mem.doorbell;
    sq.qpn = q.qpn;
    sq.producer = sq.consumer = q.first_index;
    return sq;
}

mlx5::CompletionQueue SoftHca::completionQueue(int qp) const {
    std::lock_guard<std::mutex> lock(mu_);
    const Qp& q = *qps_.at(static_cast<size_t>(qp));
    mlx5::CompletionQueue cq;
    cq.cqes = q.mem.cqes;
    cq.cqe_count = q.cqe_count;
    cq.dbrec = q.mem.cq_dbrec;
    return cq;
}

void SoftHca::checkDoorbellWord(Qp& q, uint64_t bell, uint16_t announced) {
    // A doorbell carries the head of the last WQE it announces. The WQE it
    // names must still be waiting (announced, not yet executed: its slot
    // cannot have been reused), and there its first 8 bytes must be the word.
    // (A later ring may have moved the record on since: any waiting WQE will do.)
    const auto named = static_cast<uint16_t>(toBig32(static_cast<uint32_t>(bell)) >> 8);
    // A poster updates the record before it rings, and rings with the last
    // WQE it posted, so the named WQE is announced and no earlier than the
    // one the previous doorbell named (16-bit indexes, compared modulo).
    if (static_cast<int16_t>(static_cast<uint16_t>(named - announced)) >= 0) {
        noteViolation("doorbell word of QP " + std::to_string(q.qpn) + " names WQE " +
                      std::to_string(named) + ", not announced by its doorbell record (" +
                      std::to_string(announced) + "): rung before the record was updated");
    } else if (q.rung && static_cast<int16_t>(static_cast<uint16_t>(named - q.last_named)) < 0) {
        noteViolation("doorbell word of QP " + std::to_string(q.qpn) + " names WQE " +
                      std::to_string(named) + ", before WQE " + std::to_string(q.last_named) +
                      " that an earlier doorbell named: a stale word");
    }
    q.rung = true;
    q.last_named = named;
    const auto waiting = static_cast<uint16_t>(announced - static_cast<uint16_t>(q.executed));
    if (static_cast<uint16_t>(named - static_cast<uint16_t>(q.executed)) >= waiting)
        return;  // executed already (or not announced yet): nothing left to compare
    uint64_t head = 0;
    std::memcpy(&head, q.mem.wqes + size_t{named & (q.wqe_count - 1)} * mlx5::kBasicBlockBytes, 8);
    if (head != bell) {
        noteViolation("doorbell word 0x" + hex(bell) + " of QP " + std::to_string(q.qpn) +
                      " is not the head of the WQE it names (index " + std::to_string(named) +
                      ": 0x" + hex(head) + ")");
    }
}

void SoftHca::noteViolation(const std::string& what) {
    if (violation_.empty())
        violation_ = what;
}

uint8_t SoftHca::execute(const Qp& q, const unsigned char* wqe, uint8_t opcode) {
    if (hooks_.peer_ready && !hooks_.peer_ready(q.qpn))
        return mlx5::kSyndromeRetryExceeded;  // the peer stopped acknowledging
    const unsigned char* raddr_seg = wqe + mlx5::kSegmentBytes;
    const uint64_t raddr = loadBig64(raddr_seg);
    const uint32_t rkey = loadBig32(raddr_seg + 8);
    if (opcode == mlx5::kOpcodeRdmaWrite) {
        const unsigned char* data = wqe + 2 * mlx5::kSegmentBytes;
        const uint32_t length = loadBig32(data);
        const uint32_t lkey = loadBig32(data + 4);
        const uint64_t laddr = loadBig64(data + 8);
        if (!covers(lkey, laddr, length))
            return mlx5::kSyndromeLocalProtection;
        if (!covers(rkey, raddr, length))
            return mlx5::kSyndromeRemoteAccess;
        std::memcpy(reinterpret_cast<void*>(raddr), reinterpret_cast<const void*>(laddr), length);
        return 0;
    }
    // Fetch-add: control | remote address | atomic | data (the old value).
    const uint64_t add = loadBig64(wqe + 2 * mlx5::kSegmentBytes);
    const unsigned char* data = wqe + 3 * mlx5::kSegmentBytes;
    const uint32_t length = loadBig32(data);
    const uint32_t lkey = loadBig32(data + 4);
    const uint64_t laddr = loadBig64(data + 8);
    if (length != 8)
        return mlx5::kSyndromeLocalLength;
    if (!covers(lkey, laddr, 8))
        return mlx5::kSyndromeLocalProtection;
    if (!covers(rkey, raddr, 8) || raddr % 8 != 0)
        return mlx5::kSyndromeRemoteAccess;
    // Host byte order in memory (see counterValue); release: the data of
    // earlier WRITEs is visible before the count.
    auto* counter = reinterpret_cast<uint64_t*>(raddr);
    const uint64_t old = __atomic_fetch_add(counter, add, __ATOMIC_RELEASE);
    std::memcpy(reinterpret_cast<void*>(laddr), &old, sizeof(old));
    return 0;
}

void SoftHca::complete(Qp& q, uint16_t wqe_index, uint8_t opcode, uint8_t syndrome) {
    const uint32_t consumed =
        toBig32(__atomic_load_n(q.mem.cq_dbrec, __ATOMIC_ACQUIRE)) & 0xffffffu;
    if (((q.cq_producer - consumed) & 0xffffffu) >= q.cqe_count) {
        noteViolation("CQ overrun on QP " + std::to_string(q.qpn) + ": " +
                      std::to_string(q.cq_producer) + " CQEs written, " + std::to_string(consumed) +
                      " consumed, " + std::to_string(q.cqe_count) + " slots");
        return;
    }
    unsigned char* cqe = q.mem.cqes + size_t{q.cq_producer & (q.cqe_count - 1)} * mlx5::kCqeBytes;
    writeCqe(cqe, wqe_index, opcode, syndrome, (q.cq_producer & q.cqe_count) != 0 ? 1 : 0);
    ++q.cq_producer;
}

size_t SoftHca::process(int qp) {
    std::lock_guard<std::mutex> lock(mu_);
    Qp& q = *qps_.at(static_cast<size_t>(qp));
    if (q.removed)
        return 0;
    const uint64_t bell = __atomic_load_n(q.mem.doorbell, __ATOMIC_ACQUIRE);
    const uint16_t announced = static_cast<uint16_t>(
        toBig32(__atomic_load_n(&q.mem.sq_dbrec[mlx5::kSendDoorbellIndex], __ATOMIC_ACQUIRE)));
    if (bell != q.last_doorbell) {
        q.last_doorbell = bell;
        ++q.doorbells;
        checkDoorbellWord(q, bell, announced);
    }
    size_t done = 0;
    while (static_cast<uint16_t>(q.executed) != announced) {
        const uint16_t index = static_cast<uint16_t>(q.executed);
        const unsigned char* wqe =
            q.mem.wqes + size_t{q.executed & (q.wqe_count - 1)} * mlx5::kBasicBlockBytes;
        const uint32_t w0 = loadBig32(wqe);
        const uint32_t w1 = loadBig32(wqe + 4);
        const auto opcode = static_cast<uint8_t>(w0 & 0xff);
        const bool signaled = (wqe[11] & mlx5::kCtrlCqUpdate) != 0;
        ++q.executed;
        ++done;
        if (q.in_error) {
            complete(q, index, mlx5::kCqeRequesterError, mlx5::kSyndromeFlushed);
            continue;
        }
        uint8_t syndrome = 0;
        if (static_cast<uint16_t>(w0 >> 8) != index || (w1 >> 8) != q.qpn) {
            noteViolation("WQE at index " + std::to_string(index) + " of QP " +
                          std::to_string(q.qpn) + " carries index " +
                          std::to_string(static_cast<uint16_t>(w0 >> 8)) + " and QPN " +
                          std::to_string(w1 >> 8));
            syndrome = mlx5::kSyndromeLocalQpOperation;
        } else if (opcode != mlx5::kOpcodeRdmaWrite && opcode != mlx5::kOpcodeAtomicFetchAdd) {
            noteViolation("unexpected opcode " + std::to_string(opcode));
            syndrome = mlx5::kSyndromeLocalQpOperation;
        } else {
            syndrome = execute(q, wqe, opcode);
        }
        if (syndrome != 0) {
            q.in_error = true;
            complete(q, index, mlx5::kCqeRequesterError, syndrome);
        } else if (signaled) {
            complete(q, index, mlx5::kCqeRequester, 0);
        }
    }
    return done;
}

size_t SoftHca::processAll() {
    size_t n = 0;
    {
        std::lock_guard<std::mutex> lock(mu_);
        n = qps_.size();
    }
    size_t done = 0;
    for (size_t i = 0; i < n; ++i)
        done += process(static_cast<int>(i));
    return done;
}

void SoftHca::removeQueuePair(int qp) {
    std::lock_guard<std::mutex> lock(mu_);
    qps_.at(static_cast<size_t>(qp))->removed = true;
}

void SoftHca::start() {
    running_ = true;
    thread_ = std::thread([this] {
        while (running_.load(std::memory_order_relaxed)) {
            if (processAll() == 0)
                std::this_thread::yield();
        }
    });
}

void SoftHca::stop() {
    running_ = false;
    if (thread_.joinable())
        thread_.join();
}

std::string SoftHca::violation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return violation_;
}

uint64_t SoftHca::doorbellsRung(int qp) const {
    std::lock_guard<std::mutex> lock(mu_);
    return qps_.at(static_cast<size_t>(qp))->doorbells;
}

}  // namespace mooncake::te::rdma::soft
