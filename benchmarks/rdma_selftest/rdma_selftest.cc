// rdma_selftest: checks the rdma transport on a host with an HCA.
//
//   rdma_selftest [device[:port]]
//
// 1. verbs loopback on one HCA: two RC QPs of this process connected to each
//    other through the QP transition table; RDMA WRITE, READ and 64-bit
//    fetch-and-add checked byte for byte; a WRITE with a wrong rkey must fail
//    with a remote access error (mapped to OUT_OF_RANGE).
// 2. the engine path: two TransferEngines in this process with
//    MC_RDMA_SAME_HOST=1, so the store handshake, chunked posting, completion
//    polling and deadlines run for real; WRITE and READ of 64 MiB checked; then
//    the peer shuts down and a WRITE to it must fail within the deadline.
// 3. IBGDA from the host: two QPs whose queues are located through mlx5 direct
//    verbs, driven by this thread with the code the GPU kernels run
//    (mlx5_queues.h): puts with counts checked byte for byte with the
//    fetch-add's old values, then a wrong rkey must complete with a remote
//    access error. Skipped, saying why, on a device that is not mlx5.
// Prints one line per check and exits 0 when all pass, 1 on a failure, 2 when
// there is no usable RDMA device (with the reason).
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake-transfer-engine/engine/transfer_engine.h"
#include "mooncake-transfer-engine/metadata/kv_store.h"
#include "mooncake-transfer-engine/transport/rdma/device_filter.h"
#include "mooncake-transfer-engine/transport/rdma/ibgda_qp.h"
#include "mooncake-transfer-engine/transport/rdma/queue_pair.h"
#include "mooncake-transfer-engine/transport/rdma/rdma_device.h"
#include "mooncake-transfer-engine/transport/rdma/verbs_api.h"

using namespace mooncake;
using namespace mooncake::te;
using namespace mooncake::te::rdma;

namespace {

int failures = 0;

void report(bool ok, const std::string& what, const std::string& detail = "") {
    std::printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what.c_str(), detail.empty() ? "" : ": ",
                detail.c_str());
    std::fflush(stdout);
    if (!ok)
        ++failures;
}

// Polls `cq` for one completion; the Status of it, or kTimeout.
Status waitOne(const VerbsApi& api, ibv_cq* cq, int64_t timeout_ms) {
    const Deadline deadline = Deadline::afterMs(timeout_ms);
    ibv_wc wc;
    while (!deadline.expired()) {
        const int n = ibv_poll_cq(cq, 1, &wc);
        if (n < 0)
            return Internal("ibv_poll_cq failed");
        if (n == 1)
            return completionError(wc.status, api.wcStatusStr(wc.status), "loopback");
    }
    return Timeout("no completion within " + std::to_string(timeout_ms) + " ms");
}

Status post(ibv_qp* qp, ibv_send_wr* wr) {
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(qp, wr, &bad);
    return rc == 0 ? Status::OK() : verbsError("ibv_post_send", rc);
}

int verbsLoopback(const VerbsApi& api, const DeviceFilterEntry& entry) {
    auto dev = RdmaDevice::open(api, entry);
    if (!dev.ok()) {
        report(false, "open " + entry.device, dev.status().toString());
        return 1;
    }
    RdmaDevice& d = *dev.value();
    std::printf("INFO device %s port %d link_layer %d lid %d mtu code %d\n", entry.device.c_str(),
                d.endpoint().port, d.endpoint().link_layer, d.endpoint().lid, d.endpoint().mtu);
    ibv_cq* cq = api.createCq(d.context(), 64, nullptr, nullptr, 0);
    if (!cq) {
        report(false, "ibv_create_cq", verbsError("ibv_create_cq", errno).toString());
        return 1;
    }
    auto a = QueuePair::create(api, d.pd(), cq, 16, "loopback A");
    auto b = QueuePair::create(api, d.pd(), cq, 16, "loopback B");
    if (!a.ok() || !b.ok()) {
        report(false, "create QPs", (a.ok() ? b.status() : a.status()).toString());
        return 1;
    }
    const QpLocal local = qpLocalFor(d);
    Status st = a.value()->connect(local, qpAddressOf(d, b.value()->qpn()));
    if (st.ok())
        st = b.value()->connect(local, qpAddressOf(d, a.value()->qpn()));
    report(st.ok(), "QP RESET->INIT->RTR->RTS (both ends)", st.ok() ? "" : st.toString());
    if (!st.ok())
        return 1;

    constexpr size_t kHalf = 1 << 20;
    std::vector<uint64_t> mem((2 * kHalf + 64) / 8, 0);
    char* base = reinterpret_cast<char*>(mem.data());
    auto mr = d.registerHost(base, mem.size() * 8);
    report(mr.ok(), "ibv_reg_mr host memory", mr.ok() ? "" : mr.status().toString());
    if (!mr.ok())
        return 1;
    for (size_t i = 0; i < kHalf; ++i)
        base[i] = static_cast<char>(i * 31 + 7);
    auto rdmaOp = [&](ibv_wr_opcode op, uint64_t local_addr, uint64_t remote_addr, uint32_t len,
                      uint32_t rkey) {
        ibv_sge sge{local_addr, len, mr.value()->lkey};
        ibv_send_wr wr;
        std::memset(&wr, 0, sizeof(wr));
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = op;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = rkey;
        Status s = post(a.value()->raw(), &wr);
        return s.ok() ? waitOne(api, cq, 5000) : s;
    };
    const uint64_t src = reinterpret_cast<uint64_t>(base);
    const uint64_t dst = src + kHalf;
    st = rdmaOp(IBV_WR_RDMA_WRITE, src, dst, kHalf, mr.value()->rkey);
    report(st.ok() && std::memcmp(base, base + kHalf, kHalf) == 0, "RDMA WRITE 1 MiB",
           st.ok() ? "" : st.toString());
    std::memset(base, 0, kHalf);
    st = rdmaOp(IBV_WR_RDMA_READ, src, dst, kHalf, mr.value()->rkey);
    bool same = st.ok();
    for (size_t i = 0; same && i < kHalf; ++i)
        same = base[i] == static_cast<char>(i * 31 + 7);
    report(same, "RDMA READ 1 MiB", st.ok() ? "" : st.toString());

    // Fetch-and-add: counter at dst, old values land at src.
    uint64_t* counter = reinterpret_cast<uint64_t*>(base + kHalf);
    uint64_t* result = reinterpret_cast<uint64_t*>(base);
    *counter = 40;
    bool atomics_ok = true;
    for (uint64_t add : {2ull, 5ull}) {
        const uint64_t before = *counter;
        ibv_sge sge{src, 8, mr.value()->lkey};
        ibv_send_wr wr;
        std::memset(&wr, 0, sizeof(wr));
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.atomic.remote_addr = dst;
        wr.wr.atomic.compare_add = add;
        wr.wr.atomic.rkey = mr.value()->rkey;
        st = post(a.value()->raw(), &wr);
        if (st.ok())
            st = waitOne(api, cq, 5000);
        atomics_ok = atomics_ok && st.ok() && *result == before;
    }
    report(atomics_ok && *counter == 47,
           "ATOMIC FETCH_AND_ADD (40 +2 +5 = 47, old values returned)",
           st.ok() ? "counter=" + std::to_string(*counter) : st.toString());

    st = rdmaOp(IBV_WR_RDMA_WRITE, src, dst, 64, mr.value()->rkey ^ 0x5a5a);
    report(st.code() == StatusCode::kOutOfRange, "WRITE with a wrong rkey fails as OUT_OF_RANGE",
           st.toString());
    d.deregister(mr.value());
    a.value().reset();
    b.value().reset();
    (void)api.destroyCq(cq);
    return 0;
}

void enginePath(const std::vector<std::string>& filter) {
    auto store = std::make_shared<InProcessKVStore>();
    auto options = [&](const char* name) {
        EngineOptions o;
        o.store = store;
        o.segment_name = name;
        o.secret = "selftest";
        o.key_prefix = "rdma-selftest";
        return o;
    };
    auto a = std::make_unique<TransferEngine>(options("a"));
    auto b = std::make_unique<TransferEngine>(options("b"));
    Status st = a->init("127.0.0.1", filter);
    if (st.ok())
        st = b->init("127.0.0.1", filter);
    report(st.ok() && a->rdmaStatus().ok(), "engines start with rdma",
           st.ok() ? a->rdmaStatus().toString() : st.toString());
    if (!st.ok() || !a->rdmaStatus().ok())
        return;
    constexpr size_t kBytes = 64 << 20;
    std::vector<char> src(kBytes), dst(kBytes, 0);
    for (size_t i = 0; i < kBytes; ++i)
        src[i] = static_cast<char>(i * 13 + 3);
    st = a->registerLocalMemory(src.data(), kBytes);
    if (st.ok())
        st = b->registerLocalMemory(dst.data(), kBytes);
    report(st.ok(), "register 64 MiB on both engines", st.toString());
    auto peer = a->openSegment("b");
    if (!st.ok() || !peer.ok())
        return;
    const uint64_t target = reinterpret_cast<uint64_t>(dst.data());
    auto via = a->transportFor(peer.value(), target, kBytes);
    report(via.ok() && via.value() == "rdma", "engine picks rdma",
           via.ok() ? via.value() : via.status().toString());
    auto run = [&](TransferOpcode op, int64_t timeout_ms) {
        auto batch = a->allocateBatchID(1);
        if (!batch.ok())
            return batch.status();
        TransferRequest req{op, src.data(), peer.value(), target, kBytes};
        Status s = a->submitTransfer(batch.value(), {req});
        if (s.ok())
            s = a->waitBatch(batch.value(), Deadline::afterMs(timeout_ms));
        (void)a->freeBatchID(batch.value());
        return s;
    };
    auto t0 = std::chrono::steady_clock::now();
    st = run(TransferOpcode::kWrite, 30000);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report(st.ok() && std::memcmp(src.data(), dst.data(), kBytes) == 0, "engine WRITE 64 MiB",
           st.ok() ? std::to_string(kBytes / secs / 1e9) + " GB/s (first call, with connect)"
                   : st.toString());
    std::memset(src.data(), 0, kBytes);
    st = run(TransferOpcode::kRead, 30000);
    report(st.ok() && std::memcmp(src.data(), dst.data(), kBytes) == 0, "engine READ 64 MiB",
           st.toString());
    // The peer goes away: its QPs are destroyed, so the next WRITE must fail
    // (retries exhausted) well inside the request deadline.
    b->shutdown();
    t0 = std::chrono::steady_clock::now();
    st = run(TransferOpcode::kWrite, 60000);
    const double fail_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report(!st.ok() && st.code() != StatusCode::kTimeout,
           "WRITE to a shut-down peer fails (not a hang)",
           st.toString() + " after " + std::to_string(fail_s) + " s");
}

}  // namespace

// Reaps until the send queue is empty or 5 s pass; false on an error CQE.
bool drain(mlx5::SendQueue& sq, mlx5::CompletionQueue& cq, mlx5::Completion* error,
           bool* timed_out) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    *timed_out = false;
    while (sq.consumer != sq.producer) {
        if (!mlx5::reapCompletions(cq, sq, error))
            return false;
        if (std::chrono::steady_clock::now() > deadline) {
            *timed_out = true;
            return false;
        }
    }
    return true;
}

void ibgdaLoopback(const VerbsApi& api, const DeviceFilterEntry& entry) {
    auto dv = Mlx5DirectApi::load("");
    if (!dv.ok()) {
        std::printf("SKIP IBGDA: %s\n", dv.status().toString().c_str());
        return;
    }
    auto dev = RdmaDevice::open(api, entry);
    if (!dev.ok()) {
        report(false, "open " + entry.device, dev.status().toString());
        return;
    }
    RdmaDevice& d = *dev.value();
    if (!dv->isSupported(d.context()->device)) {
        std::printf("SKIP IBGDA: %s is not an mlx5 device\n", entry.device.c_str());
        return;
    }
    auto a = IbgdaQueuePair::create(d, dv.value(), 64);
    auto b = IbgdaQueuePair::create(d, dv.value(), 64);
    report(a.ok() && b.ok(), "IBGDA queue pairs located through mlx5dv_init_obj",
           a.ok() ? (b.ok() ? "" : b.status().toString()) : a.status().toString());
    if (!a.ok() || !b.ok())
        return;
    const QpLocal local = qpLocalFor(d);
    Status st = a.value()->connect(local, qpAddressOf(d, b.value()->qpn()));
    if (st.ok())
        st = b.value()->connect(local, qpAddressOf(d, a.value()->qpn()));
    report(st.ok(), "IBGDA QPs RESET->INIT->RTR->RTS", st.ok() ? "" : st.toString());
    if (!st.ok())
        return;

    constexpr int kPuts = 256;
    constexpr uint32_t kBytes = 4096;
    std::vector<unsigned char> src(kPuts * size_t{kBytes}), dst(src.size(), 0);
    for (size_t i = 0; i < src.size(); ++i)
        src[i] = static_cast<unsigned char>(i * 7 + 3);
    std::vector<uint64_t> words(1 + kPuts, 0);  // the counter, then the old values
    auto src_mr = d.registerHost(src.data(), src.size());
    auto dst_mr = d.registerHost(dst.data(), dst.size());
    auto words_mr = d.registerHost(words.data(), words.size() * sizeof(uint64_t));
    if (!src_mr.ok() || !dst_mr.ok() || !words_mr.ok()) {
        report(false, "register IBGDA buffers", "ibv_reg_mr failed");
        return;
    }
    mlx5::SendQueue sq = a.value()->sendQueue();
    mlx5::CompletionQueue cq = a.value()->completionQueue();
    mlx5::Completion error;
    bool timed_out = false;
    bool ok = true;
    for (int i = 0; ok && i < kPuts; ++i) {
        mlx5::PutWithCount p;
        p.local_addr = reinterpret_cast<uint64_t>(src.data() + size_t{kBytes} * i);
        p.lkey = src_mr.value()->lkey;
        p.remote_addr = reinterpret_cast<uint64_t>(dst.data() + size_t{kBytes} * i);
        p.rkey = dst_mr.value()->rkey;
        p.length = kBytes;
        p.counter_addr = reinterpret_cast<uint64_t>(&words[0]);
        p.counter_rkey = words_mr.value()->rkey;
        p.add = 1;
        p.old_value_addr = reinterpret_cast<uint64_t>(&words[1 + i]);
        p.old_value_lkey = words_mr.value()->lkey;
        while (ok && !mlx5::postPutWithCount(sq, p))
            ok = drain(sq, cq, &error, &timed_out);
    }
    ok = ok && drain(sq, cq, &error, &timed_out);
    bool in_order = true;
    for (int i = 0; i < kPuts; ++i)
        in_order = in_order && words[1 + i] == static_cast<uint64_t>(i);
    report(ok && src == dst && mlx5::counterValue(&words[0]) == kPuts && in_order,
           "IBGDA 256 puts of 4 KiB with counts (bytes, counter, fetch-add old values)",
           timed_out ? "completions missing after 5 s"
           : !ok     ? "error completion, syndrome " + std::to_string(error.syndrome)
                     : "counter=" + std::to_string(mlx5::counterValue(&words[0])));

    mlx5::PutWithCount bad;
    bad.counter_addr = reinterpret_cast<uint64_t>(&words[0]);
    bad.counter_rkey = words_mr.value()->rkey ^ 0x5a5a;
    bad.add = 1;
    bad.old_value_addr = reinterpret_cast<uint64_t>(&words[1]);
    bad.old_value_lkey = words_mr.value()->lkey;
    const bool posted = mlx5::postPutWithCount(sq, bad);
    const bool failed = posted && !drain(sq, cq, &error, &timed_out) && !timed_out;
    report(failed && error.syndrome == mlx5::kSyndromeRemoteAccess,
           "IBGDA count with a wrong rkey completes with a remote access error",
           timed_out ? "no completion after 5 s" : "syndrome " + std::to_string(error.syndrome));
    for (ibv_mr* mr : {src_mr.value(), dst_mr.value(), words_mr.value()})
        d.deregister(mr);
}

int main(int argc, char** argv) {
    ::setenv("MC_RDMA_SAME_HOST", "1", 1);
    std::vector<std::string> filter;
    if (argc > 1)
        filter.push_back(argv[1]);
    auto parsed = parseDeviceFilter(filter);
    if (!parsed.ok()) {
        std::fprintf(stderr, "rdma_selftest: %s\n", parsed.status().toString().c_str());
        return 1;
    }
    auto api = VerbsApi::get();
    if (!api.ok()) {
        std::printf("NO_DEVICE %s\n", api.status().toString().c_str());
        return 2;
    }
    auto found = discoverDevices(*api.value(), parsed.value());
    if (!found.ok()) {
        std::printf("NO_DEVICE %s\n", found.status().toString().c_str());
        return 2;
    }
    if (verbsLoopback(*api.value(), found->selected.front()) == 0) {
        enginePath({found->selected.front().device});
        ibgdaLoopback(*api.value(), found->selected.front());
    }
    std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "OK", failures);
    return failures ? 1 : 0;
}
