#include "mooncake-pg/torch/staging.h"

#include <c10/util/Exception.h>

namespace mooncake::pg {

void Staging::checkDevice(const at::Tensor& user, const std::string& what) {
    if (!device_.has_value()) {
        device_ = user.device();
    } else {
        TORCH_CHECK(user.device() == *device_, "Mooncake PG: ", op_, ": ", what, " is on ",
                    user.device().str(), " but the op's first tensor is on ", device_->str(),
                    "; every tensor of one op must be on the same device");
    }
}

at::Tensor Staging::add(const at::Tensor& user, const std::string& what, bool copy_out,
                        bool copy_in) {
    if (!user.defined())
        return user;
    checkDevice(user, what);
    if (!user.is_cuda())
        return user;
    // Contiguous whatever the user's strides: the core sees flat bytes.
    at::Tensor host = at::empty(user.sizes(), user.options().device(c10::kCPU).pinned_memory(true),
                                at::MemoryFormat::Contiguous);
    entries_.push_back(Entry{user, host, copy_out, copy_in});
    return host;
}

void Staging::onDevice(const at::Tensor& user, const std::string& what) {
    if (!user.defined())
        return;
    checkDevice(user, what);
    entries_.push_back(Entry{user, at::Tensor(), false, false});
}

bool Staging::hasMirrors() const {
    for (const auto& e : entries_) {
        if (e.host.defined() && e.copy_in)
            return true;
    }
    return false;
}

at::Tensor Staging::in(const at::Tensor& user, const std::string& what) {
    return add(user, what, /*copy_out=*/false);
}

at::Tensor Staging::inOut(const at::Tensor& user, const std::string& what) {
    return add(user, what, /*copy_out=*/true);
}

at::Tensor Staging::out(const at::Tensor& user, const std::string& what) {
    return add(user, what, /*copy_out=*/true, /*copy_in=*/false);
}

Staging::Tensors Staging::in(const Tensors& users, const std::string& what) {
    Tensors out;
    out.reserve(users.size());
    for (size_t i = 0; i < users.size(); ++i)
        out.push_back(in(users[i], what + "[" + std::to_string(i) + "]"));
    return out;
}

Staging::Tensors Staging::inOut(const Tensors& users, const std::string& what) {
    Tensors out;
    out.reserve(users.size());
    for (size_t i = 0; i < users.size(); ++i)
        out.push_back(inOut(users[i], what + "[" + std::to_string(i) + "]"));
    return out;
}

}  // namespace mooncake::pg
