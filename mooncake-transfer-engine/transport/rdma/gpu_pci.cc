#include "mooncake-transfer-engine/transport/rdma/gpu_pci.h"

#include <dlfcn.h>

namespace mooncake::te::rdma {

Result<std::string> cudaPciBusId(int ordinal) {
    struct Driver {
        int (*init)(unsigned);
        int (*deviceGet)(int*, int);
        int (*busId)(char*, int, int);
    };
    static const Driver driver = [] {
        Driver d{};
        void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            d.init = reinterpret_cast<int (*)(unsigned)>(::dlsym(lib, "cuInit"));
            d.deviceGet = reinterpret_cast<int (*)(int*, int)>(::dlsym(lib, "cuDeviceGet"));
            d.busId =
                reinterpret_cast<int (*)(char*, int, int)>(::dlsym(lib, "cuDeviceGetPCIBusId"));
            if (d.init && d.init(0) != 0)
                d.init = nullptr;
        }
        return d;
    }();
    if (!driver.init || !driver.deviceGet || !driver.busId)
        return Unavailable("no CUDA driver to map cuda:" + std::to_string(ordinal) +
                           " to a PCI device");
    int dev = 0;
    char id[32] = {0};
    if (driver.deviceGet(&dev, ordinal) != 0 || driver.busId(id, sizeof(id), dev) != 0)
        return Unavailable("CUDA device " + std::to_string(ordinal) + " does not exist");
    return std::string(id);
}

}  // namespace mooncake::te::rdma
