// Device memory that other processes can map. Allocations are made with
// cuMemCreate and a POSIX file-descriptor handle, so they travel to same-host
// peers over the shm transport's descriptor server, which checks the group
// secret, exactly like a memfd: a peer that does not know the secret cannot
// map them (legacy cudaIpc handles, by contrast, are bearer tokens).
//
// This header is free of CUDA types; without CUDA support every call reports
// kUnavailable.
#pragma once

#include <charconv>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te {

// An allocation of ours, mapped read-write for its device.
class ExportableDeviceMemory {
public:
    virtual ~ExportableDeviceMemory() = default;
    virtual uint64_t addr() const = 0;
    // Rounded up to the allocation granularity.
    virtual uint64_t length() const = 0;
    virtual int device() const = 0;
    // A new descriptor for the allocation, owned by the caller.
    virtual Result<int> exportFd() const = 0;
};

Result<std::unique_ptr<ExportableDeviceMemory>> allocateExportableDeviceMemory(int device,
                                                                               uint64_t length);

// A peer's allocation mapped into this process for access from `device`.
class ImportedDeviceMemory {
public:
    virtual ~ImportedDeviceMemory() = default;
    virtual char* ptr() const = 0;
    virtual uint64_t length() const = 0;
};

// Maps the allocation behind `fd` (`length` bytes, as its owner reported).
// Does not take ownership of `fd`.
Result<std::unique_ptr<ImportedDeviceMemory>> importDeviceMemory(int fd, uint64_t length,
                                                                 int device);

// The ordinal in a region location "cuda:<n>", or -1 when `location` names no
// CUDA device.
inline int cudaOrdinal(std::string_view location) {
    constexpr std::string_view kPrefix = "cuda:";
    if (location.size() <= kPrefix.size() || location.substr(0, kPrefix.size()) != kPrefix)
        return -1;
    int ordinal = -1;
    const char* first = location.data() + kPrefix.size();
    const char* last = location.data() + location.size();
    auto [end, ec] = std::from_chars(first, last, ordinal);
    if (ec != std::errc() || end != last || ordinal < 0)
        return -1;
    return ordinal;
}

// Whether this process can use CUDA device memory, and why not.
Status deviceMemoryAvailable();

}  // namespace mooncake::te
