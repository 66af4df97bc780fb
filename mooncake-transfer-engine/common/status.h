// Status and Result<T>: the error currency of every torch-free core.
// A Status carries a code and a message that reads like a backtrace: each
// layer that forwards an error may prepend its own context with withContext().
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace mooncake {

enum class StatusCode {
    kOk = 0,
    kInvalidArgument,   // caller passed something wrong; nothing was transferred
    kNotFound,          // unknown segment, key or region
    kOutOfRange,        // address range outside a registered region
    kTimeout,           // a deadline passed
    kPeerFailure,       // a peer closed, crashed or answered with an error
    kPermissionDenied,  // wrong group secret
    kUnavailable,       // transport or resource not present on this machine
    kAborted,           // cancelled by shutdown or abort()
    kInternal,          // a bug or an OS call that should not fail
    kEpochChanged,      // a peer is in a newer membership epoch; nothing was
                        // transferred: apply the newer view, then retry
};

const char* statusCodeName(StatusCode code);

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status OK() { return Status(); }

    bool ok() const { return code_ == StatusCode::kOk; }
    StatusCode code() const { return code_; }
    const std::string& message() const { return message_; }
    std::string toString() const;

    // Prepends "context: " so errors read outermost first.
    Status withContext(std::string_view context) const;

private:
    StatusCode code_ = StatusCode::kOk;
    std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
inline Status PeerFailure(std::string m) { return {StatusCode::kPeerFailure, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status EpochChanged(std::string m) { return {StatusCode::kEpochChanged, std::move(m)}; }

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : value_(std::move(value)) {}  // NOLINT(implicit)
    Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

    bool ok() const { return value_.has_value(); }
    const Status& status() const { return status_; }
    T& value() & { return *value_; }
    const T& value() const& { return *value_; }
    T&& value() && { return std::move(*value_); }
    T* operator->() { return &*value_; }
    const T* operator->() const { return &*value_; }
    T& operator*() { return *value_; }

private:
    std::optional<T> value_;
    Status status_;
};

}  // namespace mooncake

// Returns early from the enclosing function with the failed status.
#define MC_RETURN_IF_ERROR(expr)                  \
    do {                                          \
        ::mooncake::Status _mc_st = (expr);       \
        if (!_mc_st.ok()) return _mc_st;          \
    } while (0)

#define MC_CONCAT_INNER(a, b) a##b
#define MC_CONCAT(a, b) MC_CONCAT_INNER(a, b)
#define MC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
    auto tmp = (expr);                           \
    if (!tmp.ok()) return tmp.status();          \
    lhs = std::move(tmp).value()
#define MC_ASSIGN_OR_RETURN(lhs, expr) \
    MC_ASSIGN_OR_RETURN_IMPL(MC_CONCAT(_mc_res_, __LINE__), lhs, expr)
