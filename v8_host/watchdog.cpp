/*
 * Watchdog thread.  TerminateExecution is called under the mutex, so once
 * disarm() returns no termination can arrive late and hit the next call.
 *
 * A few builtins loop in C++ without looking at the termination flag
 * (Array.prototype.indexOf over {length: 2**40}, say); a call still running
 * kGrace after its deadline fired ends the worker instead, and the
 * supervisor starts a new one.
 */

#include <unistd.h>

#include <v8.h>

#include "exit_status.h"
#include "log.h"
#include "watchdog.h"

namespace v8host {

Watchdog::Watchdog()
    : thread_([this] { run(); })
{
}

Watchdog::~Watchdog()
{
    {
        std::lock_guard<std::mutex> lock(mu_);
        quit_ = true;
    }
    cv_.notify_one();
    thread_.join();
}

void
Watchdog::arm(v8::Isolate *isolate, std::chrono::milliseconds budget)
{
    {
        std::lock_guard<std::mutex> lock(mu_);
        isolate_ = isolate;
        deadline_ = std::chrono::steady_clock::now() + budget;
        armed_ = true;
        fired_ = false;
    }
    cv_.notify_one();
}

bool
Watchdog::disarm()
{
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
    return fired_;
}

void
Watchdog::run()
{
    static constexpr std::chrono::milliseconds kGrace {2000};

    std::unique_lock<std::mutex> lock(mu_);

    while (!quit_) {
        if (!armed_) {
            cv_.wait(lock);
            continue;
        }

        if (fired_) {
            auto last = deadline_ + kGrace;
            if (cv_.wait_until(lock, last) == std::cv_status::timeout
                && armed_ && fired_
                && std::chrono::steady_clock::now() >= last)
            {
                log(Level::warn, "a call kept running %lld ms after its "
                    "deadline despite termination; worker exits",
                    static_cast<long long>(kGrace.count()));
                _exit(kExitStuck);
            }
            continue;
        }

        if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout
            && armed_ && !fired_
            && std::chrono::steady_clock::now() >= deadline_)
        {
            fired_ = true;
            isolate_->TerminateExecution();
        }
    }
}

}  // namespace v8host
