// A single-threaded epoll reactor. All socket work of the TCP transport runs
// on its thread, so connection state needs no locks; other threads only hand
// work over through the owner's queue and wake the loop via an eventfd.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "mooncake-transfer-engine/common/status.h"

namespace mooncake::te::tcp {

class EventHandler {
public:
    virtual ~EventHandler() = default;
    // `events` is the epoll mask (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP...).
    virtual void handleEvents(uint32_t events) = 0;
};

class EventLoop {
public:
    // The owner's callbacks; both run on the loop thread.
    class Hooks {
    public:
        virtual ~Hooks() = default;
        // wakeup() was called since the last onWakeup(): take over work
        // queued by other threads.
        virtual void onWakeup() = 0;
        // After every batch of events: housekeeping (timeouts, freeing closed
        // connections). Returns how long the loop may sleep, in ms (-1 = until
        // an event), so an idle transport does not wake up at all.
        virtual int onIteration() = 0;
    };

    EventLoop() = default;
    ~EventLoop();
    EventLoop(const EventLoop&) = delete;
    EventLoop& operator=(const EventLoop&) = delete;

    // Creates the epoll and eventfd descriptors; the thread starts in run().
    Status open();
    Status run(Hooks* hooks, const std::string& thread_name);
    // Any thread, after queueing work for onWakeup(). Writes the eventfd
    // only when the loop is (about to be) blocked in epoll_wait; a loop busy
    // with events picks the work up before it blocks again.
    void wakeup();
    // Any thread but the loop's. Idempotent; joins the thread. Descriptors stay
    // open until destruction so late unwatch() calls stay harmless.
    void stop();
    bool inLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

    // Registration; the handler must outlive its registration.
    Status watch(int fd, uint32_t events, EventHandler* handler);
    Status rewatch(int fd, uint32_t events, EventHandler* handler);
    void unwatch(int fd);

private:
    void loop();

    int epfd_ = -1;
    int wakefd_ = -1;
    Hooks* hooks_ = nullptr;
    std::thread thread_;
    std::atomic<bool> stopping_{false};
    // wakeup() was called and onWakeup() has not run since.
    std::atomic<bool> work_{false};
    // The loop is in epoll_wait or about to enter it. With work_ this is a
    // Dekker pair (both seq_cst): the loop sets polling_ then reads work_,
    // wakeup() sets work_ then reads polling_, so at least one of them sees
    // the other and no wakeup is lost.
    std::atomic<bool> polling_{false};
};

}  // namespace mooncake::te::tcp
