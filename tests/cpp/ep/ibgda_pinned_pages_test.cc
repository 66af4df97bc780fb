// PinnedPages' bookkeeping with the CUDA calls replaced by a recorder that
// behaves as cudaHostRegister does: a range fails as already registered when
// any of its pages is, and only a registration's own start unregisters it.
#include "mooncake-ep/ibgda/pinned_pages.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace mooncake::ep {
namespace {

constexpr uintptr_t kPage = 4096;

struct FakeCuda {
    std::map<uintptr_t, uintptr_t> registered;  // start -> end
    std::map<uintptr_t, uintptr_t> external;    // someone else's
    int registers = 0;
    int unregisters = 0;

    bool covered(uintptr_t begin, uintptr_t end) const {
        for (const auto* m : {&registered, &external}) {
            for (const auto& [b, e] : *m) {
                if (b < end && begin < e)
                    return true;
            }
        }
        return false;
    }
    // Every page of [begin, end) lies in one registration, as
    // cudaHostGetDevicePointer needs.
    bool mapped(uintptr_t begin, uintptr_t end) const {
        for (uintptr_t p = begin; p < end; p += kPage) {
            bool in = false;
            for (const auto* m : {&registered, &external}) {
                for (const auto& [b, e] : *m)
                    in = in || (b <= p && p < e);
            }
            if (!in)
                return false;
        }
        return true;
    }

    PinnedPages pages() {
        return PinnedPages(
            [this](uintptr_t begin, size_t bytes, bool) -> Result<bool> {
                if (covered(begin, begin + bytes))
                    return false;
                registered[begin] = begin + bytes;
                ++registers;
                return true;
            },
            [this](uintptr_t begin) {
                ASSERT_EQ(1u, registered.count(begin)) << "unregistered a start never registered";
                registered.erase(begin);
                ++unregisters;
            });
    }
};

TEST(IbgdaPinnedPages, TwoSpansSharingAPageAreBothMappedWhole) {
    FakeCuda cuda;
    PinnedPages pages = cuda.pages();
    // Queue pair 0 on pages [10, 12), queue pair 1 on [11, 14): page 11 shared.
    auto a = pages.acquire(10 * kPage, 12 * kPage, false);
    ASSERT_TRUE(a.ok()) << a.status().toString();
    auto b = pages.acquire(11 * kPage, 14 * kPage, false);
    ASSERT_TRUE(b.ok()) << b.status().toString();
    EXPECT_TRUE(cuda.mapped(10 * kPage, 14 * kPage));
    EXPECT_EQ(2, cuda.registers) << "only the pages no registration covered are registered";
    EXPECT_EQ((std::vector<uintptr_t>{10 * kPage, 12 * kPage}), b.value());
    // The first to go leaves the shared page mapped for the other.
    pages.release(a.value());
    EXPECT_TRUE(cuda.mapped(11 * kPage, 14 * kPage));
    EXPECT_EQ(0, cuda.unregisters);
    pages.release(b.value());
    EXPECT_EQ(2, cuda.unregisters);
    EXPECT_TRUE(cuda.registered.empty());
    EXPECT_EQ(0u, pages.registrations());
}

TEST(IbgdaPinnedPages, ASpanInsideAnotherRegistersNothingAndHoldsIt) {
    FakeCuda cuda;
    PinnedPages pages = cuda.pages();
    auto outer = pages.acquire(0, 8 * kPage, false);
    auto inner = pages.acquire(2 * kPage, 3 * kPage, true);
    ASSERT_TRUE(outer.ok() && inner.ok());
    EXPECT_EQ(1, cuda.registers);
    pages.release(outer.value());
    EXPECT_TRUE(cuda.mapped(2 * kPage, 3 * kPage)) << "still held by the inner span";
    pages.release(inner.value());
    EXPECT_EQ(1, cuda.unregisters);
}

TEST(IbgdaPinnedPages, ASpanBridgingTwoRegistrationsFillsTheGapsBetweenThem) {
    FakeCuda cuda;
    PinnedPages pages = cuda.pages();
    auto a = pages.acquire(2 * kPage, 4 * kPage, false);
    auto b = pages.acquire(6 * kPage, 7 * kPage, false);
    auto c = pages.acquire(1 * kPage, 9 * kPage, false);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_TRUE(cuda.mapped(1 * kPage, 9 * kPage));
    EXPECT_EQ(5, cuda.registers);  // a, b, then [1,2), [4,6), [7,9)
    EXPECT_EQ(5u, c.value().size());
    pages.release(c.value());
    pages.release(a.value());
    pages.release(b.value());
    EXPECT_EQ(5, cuda.unregisters);
}

TEST(IbgdaPinnedPages, PagesPinnedBySomeoneElseAreUsedAndNeverUnpinned) {
    FakeCuda cuda;
    cuda.external[3 * kPage] = 5 * kPage;
    PinnedPages pages = cuda.pages();
    auto a = pages.acquire(3 * kPage, 5 * kPage, false);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(0, cuda.registers);
    pages.release(a.value());
    EXPECT_EQ(0, cuda.unregisters);
    EXPECT_EQ(0u, pages.registrations());
}

TEST(IbgdaPinnedPages, AFailedRegistrationHoldsNothingAndUndoesItsOwn) {
    FakeCuda cuda;
    int calls = 0;
    PinnedPages pages(
        [&](uintptr_t begin, size_t bytes, bool) -> Result<bool> {
            if (++calls == 3)
                return Internal("cudaHostRegister: out of memory");
            cuda.registered[begin] = begin + bytes;
            return true;
        },
        [&](uintptr_t begin) { cuda.registered.erase(begin); });
    auto first = pages.acquire(4 * kPage, 5 * kPage, false);
    ASSERT_TRUE(first.ok());
    // [2,4) registers, then [5,7) fails: [2,4) is undone, page 4 stays the first's.
    auto bad = pages.acquire(2 * kPage, 7 * kPage, false);
    EXPECT_FALSE(bad.ok());
    EXPECT_NE(std::string::npos, bad.status().message().find("out of memory"));
    EXPECT_EQ(1u, pages.registrations());
    EXPECT_EQ(0u, cuda.registered.count(2 * kPage));
    EXPECT_EQ(1u, cuda.registered.count(4 * kPage));
    pages.release(first.value());
    EXPECT_TRUE(cuda.registered.empty());
    EXPECT_FALSE(pages.acquire(8 * kPage, 8 * kPage, false).ok()) << "an empty range";
}

}  // namespace
}  // namespace mooncake::ep
