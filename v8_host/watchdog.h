/*
 * The per-call deadline: a thread that calls TerminateExecution on the
 * isolate when an armed deadline passes (workerd, deno_core).  Terminating
 * is the only thing it does to the isolate; everything else stays on the
 * worker's thread.
 */

#ifndef V8HOST_WATCHDOG_H
#define V8HOST_WATCHDOG_H

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace v8 { class Isolate; }

namespace v8host {

class Watchdog {
public:
    Watchdog();
    ~Watchdog();

    Watchdog(const Watchdog &) = delete;
    Watchdog &operator=(const Watchdog &) = delete;

    void arm(v8::Isolate *isolate, std::chrono::milliseconds budget);

    /* Stops watching; true when the deadline fired (TerminateExecution was
       called and the caller must cancel it). */
    bool disarm();

private:
    void run();

    std::mutex                             mu_;
    std::condition_variable                cv_;
    v8::Isolate                           *isolate_ = nullptr;
    std::chrono::steady_clock::time_point  deadline_;
    bool                                   armed_ = false;
    bool                                   fired_ = false;
    bool                                   quit_ = false;
    std::thread                            thread_;
};

/* Arms on construction, disarms on scope exit unless disarmed before. */
class DeadlineScope {
public:
    DeadlineScope(Watchdog &w, v8::Isolate *isolate,
                  std::chrono::milliseconds budget)
        : w_(w)
    {
        w_.arm(isolate, budget);
    }

    ~DeadlineScope() { if (armed_) w_.disarm(); }

    bool disarm() { armed_ = false; return w_.disarm(); }

private:
    Watchdog  &w_;
    bool       armed_ = true;
};

}  // namespace v8host

#endif
