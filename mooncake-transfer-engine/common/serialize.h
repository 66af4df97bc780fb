// Little-endian byte writer/reader for metadata blobs and control messages.
// The reader never reads past its input: every accessor fails instead, so
// parsers built on it are safe on hostile bytes (they are fuzzed).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace mooncake {

class ByteWriter {
public:
    template <typename T>
    void put(T v) {
        static_assert(std::is_trivially_copyable_v<T>);
        char b[sizeof(T)];
        std::memcpy(b, &v, sizeof(T));
        out_.append(b, sizeof(T));
    }
    void putString(std::string_view s) {
        put<uint32_t>(static_cast<uint32_t>(s.size()));
        out_.append(s.data(), s.size());
    }
    const std::string& bytes() const { return out_; }
    std::string take() { return std::move(out_); }

private:
    std::string out_;
};

class ByteReader {
public:
    explicit ByteReader(std::string_view in) : in_(in) {}

    template <typename T>
    bool get(T* v) {
        static_assert(std::is_trivially_copyable_v<T>);
        if (in_.size() - pos_ < sizeof(T)) return fail();
        std::memcpy(v, in_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return true;
    }
    // Rejects strings longer than `max_len` before allocating.
    bool getString(std::string* s, size_t max_len = 1 << 20) {
        uint32_t n = 0;
        if (!get(&n)) return false;
        if (n > max_len || in_.size() - pos_ < n) return fail();
        s->assign(in_.data() + pos_, n);
        pos_ += n;
        return true;
    }
    bool ok() const { return ok_; }
    bool atEnd() const { return pos_ == in_.size(); }
    size_t remaining() const { return in_.size() - pos_; }

private:
    bool fail() {
        ok_ = false;
        pos_ = in_.size();
        return false;
    }
    std::string_view in_;
    size_t pos_ = 0;
    bool ok_ = true;
};

}  // namespace mooncake
