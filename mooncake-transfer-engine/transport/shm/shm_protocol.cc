#include "mooncake-transfer-engine/transport/shm/shm_protocol.h"

#include <optional>

#include "mooncake-transfer-engine/common/serialize.h"

namespace mooncake::te {

namespace {
constexpr uint8_t kExportVersion = 1;
constexpr uint32_t kWireMagic = 0x4853434d;  // "MCSH"
constexpr uint8_t kWireVersion = 1;
}  // namespace

std::string encodeShmExport(const ShmExport& e) {
    ByteWriter w;
    w.put(kExportVersion);
    w.put(e.alloc_id);
    w.put(e.base);
    w.put(e.length);
    return w.take();
}

Result<ShmExport> decodeShmExport(std::string_view bytes) {
    ByteReader r(bytes);
    uint8_t version = 0;
    ShmExport e;
    r.get(&version);
    r.get(&e.alloc_id);
    r.get(&e.base);
    r.get(&e.length);
    if (!r.ok() || !r.atEnd() || version != kExportVersion) {
        return InvalidArgument("malformed shm export (" + std::to_string(bytes.size()) + " bytes)");
    }
    if (e.length == 0 || e.base + e.length < e.base) {
        return InvalidArgument("shm export describes an empty or wrapping allocation");
    }
    return e;
}

namespace {

// Every socket message opens with magic, version and one kind byte (a
// request's op, a reply's code); only the fields after it differ.
ByteWriter startWireMessage(uint8_t kind) {
    ByteWriter w;
    w.put(kWireMagic);
    w.put(kWireVersion);
    w.put(kind);
    return w;
}

// Reads the opening startWireMessage wrote, then the rest through
// `read_fields`. Returns the kind byte, or nullopt when the opening is not
// ours, a field is short, or bytes are left over.
template <typename ReadFields>
std::optional<uint8_t> readWireMessage(std::string_view bytes, ReadFields&& read_fields) {
    ByteReader r(bytes);
    uint32_t magic = 0;
    uint8_t version = 0, kind = 0;
    r.get(&magic);
    r.get(&version);
    r.get(&kind);
    read_fields(r);
    if (!r.ok() || !r.atEnd() || magic != kWireMagic || version != kWireVersion) {
        return std::nullopt;
    }
    return kind;
}

}  // namespace

std::string encodeShmRequest(const ShmRequest& req) {
    ByteWriter w = startWireMessage(static_cast<uint8_t>(req.op));
    w.put(req.alloc_id);
    w.putString(req.secret);
    return w.take();
}

Result<ShmRequest> decodeShmRequest(std::string_view bytes) {
    ShmRequest req;
    const std::optional<uint8_t> op = readWireMessage(bytes, [&req](ByteReader& r) {
        r.get(&req.alloc_id);
        r.getString(&req.secret, kMaxShmSecretBytes);
    });
    if (!op)
        return InvalidArgument("malformed shm request");
    if (*op != static_cast<uint8_t>(ShmOp::kPing) &&
        *op != static_cast<uint8_t>(ShmOp::kOpenAllocation)) {
        return InvalidArgument("unknown shm op " + std::to_string(*op));
    }
    req.op = static_cast<ShmOp>(*op);
    return req;
}

std::string encodeShmReply(const ShmReply& rep) {
    ByteWriter w = startWireMessage(static_cast<uint8_t>(rep.code));
    w.put(rep.length);
    return w.take();
}

Result<ShmReply> decodeShmReply(std::string_view bytes) {
    ShmReply rep;
    const std::optional<uint8_t> code =
        readWireMessage(bytes, [&rep](ByteReader& r) { r.get(&rep.length); });
    if (!code || *code > static_cast<uint8_t>(ShmReplyCode::kInternal))
        return PeerFailure("malformed shm reply");
    rep.code = static_cast<ShmReplyCode>(*code);
    return rep;
}

Result<UniqueFd> shmCall(const std::string& socket_name, const ShmRequest& request,
                         Deadline deadline, uint64_t* length_out) {
    MC_ASSIGN_OR_RETURN(UniqueFd sock, connectAbstract(socket_name, deadline));
    MC_RETURN_IF_ERROR(sendPacket(sock.get(), encodeShmRequest(request), -1, deadline));
    MC_ASSIGN_OR_RETURN(Packet packet, recvPacket(sock.get(), kMaxShmReplyBytes, deadline));
    MC_ASSIGN_OR_RETURN(ShmReply reply, decodeShmReply(packet.bytes));
    switch (reply.code) {
        case ShmReplyCode::kOk:
            break;
        case ShmReplyCode::kDenied:
            return PermissionDenied("shm peer refused the group secret");
        case ShmReplyCode::kNotFound:
            return NotFound("shm peer has no accessible allocation " +
                            std::to_string(request.alloc_id));
        case ShmReplyCode::kBadRequest:
            return PeerFailure("shm peer rejected the request");
        case ShmReplyCode::kInternal:
            return PeerFailure("shm peer failed to serve the request");
    }
    if (request.op == ShmOp::kOpenAllocation && !packet.fd.valid()) {
        return PeerFailure("shm peer replied without a descriptor");
    }
    if (request.op == ShmOp::kPing && packet.fd.valid()) {
        return PeerFailure("shm peer sent an unexpected descriptor");
    }
    if (length_out)
        *length_out = reply.length;
    return std::move(packet.fd);
}

}  // namespace mooncake::te
