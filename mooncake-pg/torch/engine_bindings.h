// The Python TransferEngine class (mooncake.engine.TransferEngine) and
// pg.set_transfer_engine, registered into the versioned pg extension module.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace mooncake::pg {

void defineEngineBindings(pybind11::module_& m);

}  // namespace mooncake::pg
