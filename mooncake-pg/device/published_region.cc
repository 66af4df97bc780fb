#include "mooncake-pg/device/published_region.h"

#include <sstream>

namespace mooncake::pg::device {

Status publishRegion(KVStore& store, const std::string& key, const PublishedRegion& region) {
    std::ostringstream value;
    value << region.addr << ' ' << region.unit << ' ' << region.bytes;
    return store.set(key, value.str());
}

Result<PublishedRegion> readRegion(KVStore& store, const std::string& key, const std::string& what,
                                   Deadline deadline) {
    MC_ASSIGN_OR_RETURN(std::string value, store.get(key, deadline));
    std::istringstream in(value);
    PublishedRegion region;
    in >> region.addr >> region.unit >> region.bytes;
    if (!in || region.addr == 0)
        return Internal(what + " published as '" + value + "'");
    return region;
}

Result<char*> mapRegion(te::TransferEngine& engine, const std::string& segment, uint64_t addr,
                        uint64_t bytes, Deadline deadline) {
    MC_ASSIGN_OR_RETURN(te::SegmentID id, engine.openSegment(segment, deadline));
    // Opened before the peer registered its memory, the cached descriptor
    // lacks it.
    MC_RETURN_IF_ERROR(engine.refreshSegment(id, deadline));
    MC_ASSIGN_OR_RETURN(void* mapped, engine.mapRemote(id, addr, bytes));
    return static_cast<char*>(mapped);
}

}  // namespace mooncake::pg::device
