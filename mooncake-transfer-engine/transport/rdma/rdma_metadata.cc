#include "mooncake-transfer-engine/transport/rdma/rdma_metadata.h"

#include "mooncake-transfer-engine/common/serialize.h"

namespace mooncake::te::rdma {

namespace {

constexpr uint32_t kEndpointMagic = 0x4d435245;  // "MCRE"
constexpr uint32_t kRegionMagic = 0x4d43524b;    // "MCRK"
constexpr uint32_t kQpMagic = 0x4d435251;        // "MCRQ"
constexpr size_t kMaxName = 255;

void putHeader(ByteWriter& w, uint32_t magic) {
    w.put(magic);
    w.put(kRdmaMetadataVersion);
}

Status readHeader(ByteReader& r, uint32_t magic, const char* what) {
    uint32_t m = 0;
    uint16_t version = 0;
    r.get(&m);
    r.get(&version);
    if (!r.ok() || m != magic)
        return InvalidArgument(std::string("not an rdma ") + what + " (bad magic)");
    if (version != kRdmaMetadataVersion)
        return InvalidArgument(std::string("rdma ") + what + " version " + std::to_string(version) +
                               ", expected " + std::to_string(kRdmaMetadataVersion) +
                               " (peers built from different releases?)");
    return Status::OK();
}

Status finish(const ByteReader& r, const char* what) {
    if (!r.ok())
        return InvalidArgument(std::string("truncated rdma ") + what);
    if (!r.atEnd())
        return InvalidArgument(std::string("rdma ") + what + " has " +
                               std::to_string(r.remaining()) + " bytes past its end");
    return Status::OK();
}

Status checkMtu(uint8_t mtu, const char* what) {
    if (mtu < 1 || mtu > 5)
        return InvalidArgument(std::string("rdma ") + what + " MTU code " + std::to_string(mtu) +
                               ", expected 1..5 (256..4096 bytes)");
    return Status::OK();
}

void putAddress(ByteWriter& w, const QpAddress& a) {
    for (uint8_t b : a.gid)
        w.put(b);
    w.put(a.lid);
    w.put(a.qpn);
    w.put(a.psn);
    w.put(a.mtu);
}

void getAddress(ByteReader& r, QpAddress* a) {
    for (uint8_t& b : a->gid)
        r.get(&b);
    r.get(&a->lid);
    r.get(&a->qpn);
    r.get(&a->psn);
    r.get(&a->mtu);
}

}  // namespace

std::string RdmaEndpoint::serialize() const {
    ByteWriter w;
    putHeader(w, kEndpointMagic);
    w.putString(device);
    w.put(port);
    w.put(gid_index);
    w.put(lid);
    for (uint8_t b : gid)
        w.put(b);
    w.put(mtu);
    w.put(link_layer);
    return w.take();
}

Result<RdmaEndpoint> RdmaEndpoint::parse(std::string_view bytes) {
    ByteReader r(bytes);
    MC_RETURN_IF_ERROR(readHeader(r, kEndpointMagic, "endpoint"));
    RdmaEndpoint e;
    r.getString(&e.device, kMaxName);
    r.get(&e.port);
    r.get(&e.gid_index);
    r.get(&e.lid);
    for (uint8_t& b : e.gid)
        r.get(&b);
    r.get(&e.mtu);
    r.get(&e.link_layer);
    MC_RETURN_IF_ERROR(finish(r, "endpoint"));
    if (e.device.empty())
        return InvalidArgument("rdma endpoint names no device");
    if (e.port == 0)
        return InvalidArgument("rdma endpoint port 0, expected 1..255");
    MC_RETURN_IF_ERROR(checkMtu(e.mtu, "endpoint"));
    return e;
}

std::string RegionKey::serialize() const {
    ByteWriter w;
    putHeader(w, kRegionMagic);
    w.put(raddr);
    w.put(length);
    w.put(rkey);
    return w.take();
}

Result<RegionKey> RegionKey::parse(std::string_view bytes) {
    ByteReader r(bytes);
    MC_RETURN_IF_ERROR(readHeader(r, kRegionMagic, "region key"));
    RegionKey k;
    r.get(&k.raddr);
    r.get(&k.length);
    r.get(&k.rkey);
    MC_RETURN_IF_ERROR(finish(r, "region key"));
    if (k.length == 0 || k.raddr + k.length < k.raddr)
        return InvalidArgument("rdma region key [" + std::to_string(k.raddr) + ", +" +
                               std::to_string(k.length) + ") is empty or wraps");
    return k;
}

std::string QpMessage::serialize() const {
    ByteWriter w;
    putHeader(w, kQpMagic);
    w.put(static_cast<uint8_t>(kind));
    w.putString(from);
    w.put(nonce);
    putAddress(w, address);
    w.putString(error);
    return w.take();
}

Result<QpMessage> QpMessage::parse(std::string_view bytes) {
    ByteReader r(bytes);
    MC_RETURN_IF_ERROR(readHeader(r, kQpMagic, "QP message"));
    QpMessage m;
    uint8_t kind = 0;
    r.get(&kind);
    r.getString(&m.from, kMaxName);
    r.get(&m.nonce);
    getAddress(r, &m.address);
    r.getString(&m.error, 4096);
    MC_RETURN_IF_ERROR(finish(r, "QP message"));
    if (kind != kRequest && kind != kReply)
        return InvalidArgument("rdma QP message kind " + std::to_string(kind) +
                               ", expected 1 (request) or 2 (reply)");
    m.kind = static_cast<Kind>(kind);
    if (m.from.empty())
        return InvalidArgument("rdma QP message names no sender");
    if (!m.error.empty())
        return m;  // a refusal carries no usable address
    if (m.address.qpn == 0 || m.address.qpn > 0xffffff)
        return InvalidArgument("rdma QP message QPN " + std::to_string(m.address.qpn) +
                               ", expected 1..0xffffff");
    if (m.address.psn > 0xffffff)
        return InvalidArgument("rdma QP message PSN " + std::to_string(m.address.psn) +
                               ", expected 0..0xffffff");
    MC_RETURN_IF_ERROR(checkMtu(m.address.mtu, "QP message"));
    return m;
}

}  // namespace mooncake::te::rdma
