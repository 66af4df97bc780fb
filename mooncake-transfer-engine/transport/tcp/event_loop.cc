#include "mooncake-transfer-engine/transport/tcp/event_loop.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>

#include "mooncake-transfer-engine/common/logging.h"

namespace mooncake::te::tcp {
namespace {

constexpr int kMaxEventsPerWait = 64;

Status errnoStatus(const char* what) {
    return Internal(std::string(what) + ": " + std::strerror(errno));
}

}  // namespace

EventLoop::~EventLoop() {
    stop();
    if (wakefd_ >= 0)
        ::close(wakefd_);
    if (epfd_ >= 0)
        ::close(epfd_);
}

Status EventLoop::open() {
    epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0)
        return errnoStatus("epoll_create1");
    wakefd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakefd_ < 0)
        return errnoStatus("eventfd");
    // The eventfd's handler is the loop itself, marked by a null pointer.
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev) != 0)
        return errnoStatus("epoll_ctl(eventfd)");
    return Status::OK();
}

Status EventLoop::run(Hooks* hooks, const std::string& thread_name) {
    if (epfd_ < 0)
        return Internal("EventLoop::run before open");
    hooks_ = hooks;
    try {
        thread_ = std::thread([this] { loop(); });
    } catch (const std::exception& e) {
        return Internal(std::string("starting the tcp event loop thread: ") + e.what());
    }
    // Best effort: a name makes the thread easy to spot in top/gdb.
    (void)pthread_setname_np(thread_.native_handle(), thread_name.substr(0, 15).c_str());
    return Status::OK();
}

namespace {

void signal(int wakefd) {
    uint64_t one = 1;
    // EAGAIN means the counter is already non-zero: the loop will wake anyway.
    while (::write(wakefd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
}

}  // namespace

void EventLoop::wakeup() {
    // An earlier caller that set work_ already woke the loop, or saw it awake.
    if (wakefd_ < 0 || work_.exchange(true))
        return;
    if (polling_.load())
        signal(wakefd_);
}

void EventLoop::stop() {
    if (stopping_.exchange(true)) {
        if (thread_.joinable() && !inLoopThread())
            thread_.join();
        return;
    }
    if (wakefd_ >= 0)
        signal(wakefd_);
    if (thread_.joinable() && !inLoopThread())
        thread_.join();
}

Status EventLoop::watch(int fd, uint32_t events, EventHandler* handler) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = handler;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0)
        return errnoStatus("epoll_ctl(ADD)");
    return Status::OK();
}

Status EventLoop::rewatch(int fd, uint32_t events, EventHandler* handler) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = handler;
    if (::epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) != 0)
        return errnoStatus("epoll_ctl(MOD)");
    return Status::OK();
}

void EventLoop::unwatch(int fd) {
    if (epfd_ >= 0 && fd >= 0)
        (void)::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

void EventLoop::loop() {
    epoll_event events[kMaxEventsPerWait];
    int timeout_ms = 0;
    while (!stopping_.load(std::memory_order_acquire)) {
        polling_.store(true);
        int n = ::epoll_wait(epfd_, events, kMaxEventsPerWait, work_.load() ? 0 : timeout_ms);
        polling_.store(false, std::memory_order_relaxed);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            MC_LOG(kError, "tcp") << "epoll_wait failed: " << std::strerror(errno);
            break;
        }
        // A handler must never take the whole transport down: whatever escapes
        // is logged and the loop carries on with the next event.
        try {
            bool woken = false;
            for (int i = 0; i < n; ++i) {
                auto* handler = static_cast<EventHandler*>(events[i].data.ptr);
                if (handler == nullptr) {
                    woken = true;
                    continue;
                }
                handler->handleEvents(events[i].events);
            }
            if (woken) {
                uint64_t count = 0;
                while (::read(wakefd_, &count, sizeof(count)) < 0 && errno == EINTR) {
                }
            }
            if (stopping_.load(std::memory_order_acquire))
                break;
            // Cleared before taking the work, so a wakeup() racing with
            // onWakeup() sets it again and is seen on the next round.
            if (work_.exchange(false))
                hooks_->onWakeup();
            timeout_ms = hooks_->onIteration();
        } catch (const std::exception& e) {
            MC_LOG(kError, "tcp") << "event loop handler threw: " << e.what();
            timeout_ms = 1;
        } catch (...) {
            MC_LOG(kError, "tcp") << "event loop handler threw an unknown exception";
            timeout_ms = 1;
        }
    }
    MC_LOG(kDebug, "tcp") << "event loop exiting";
}

}  // namespace mooncake::te::tcp
