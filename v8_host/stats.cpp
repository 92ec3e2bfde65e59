/*
 * Shared counters.
 */

#include <ctime>
#include <new>
#include <sys/mman.h>
#include <unistd.h>

#include "json_text.h"
#include "stats.h"

namespace v8host {

SharedStats *
stats_create(int nworkers)
{
    size_t size = sizeof(SharedStats) + sizeof(WorkerStats) * (nworkers - 1);
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED) {
        return nullptr;
    }

    auto *s = static_cast<SharedStats *>(p);
    s->started_at = time(nullptr);
    s->nworkers = nworkers;

    for (int i = 0; i < nworkers; i++) {
        WorkerStats *w = new (&s->slot[i]) WorkerStats();
        w->restarts.store(0);
        stats_reset_slot(w, 0);
    }

    return s;
}

void
stats_reset_slot(WorkerStats *w, int64_t pid)
{
    w->pid.store(pid, std::memory_order_relaxed);
    w->calls.store(0, std::memory_order_relaxed);
    w->errors.store(0, std::memory_order_relaxed);
    w->timeouts.store(0, std::memory_order_relaxed);
    w->memory.store(0, std::memory_order_relaxed);
    w->plugins.store(0, std::memory_order_relaxed);
}

std::string
stats_reply(const SharedStats *s, size_t sources,
    const std::vector<std::string> &running, size_t queued)
{
    std::string out = "{\"ok\":true,\"workers\":[";

    for (int i = 0; i < s->nworkers; i++) {
        const WorkerStats &w = s->slot[i];
        auto get = [](const std::atomic<uint64_t> &a) {
            return std::to_string(a.load(std::memory_order_relaxed));
        };

        if (i > 0) {
            out += ',';
        }
        out += "{\"slot\":" + std::to_string(i)
               + ",\"pid\":" + std::to_string(w.pid.load())
               + ",\"calls\":" + get(w.calls)
               + ",\"errors\":" + get(w.errors)
               + ",\"timeouts\":" + get(w.timeouts)
               + ",\"memory\":" + get(w.memory)
               + ",\"restarts\":" + get(w.restarts)
               + ",\"plugins\":" + get(w.plugins)
               + ",\"busy\":";
        if (static_cast<size_t>(i) < running.size() && !running[i].empty()) {
            out += "true,\"plugin\":";
            append_json_string(out, running[i]);
        } else {
            out += "false";
        }
        out += '}';
    }

    out += "],\"pid\":" + std::to_string(getpid())
           + ",\"sources\":" + std::to_string(sources)
           + ",\"queued\":" + std::to_string(queued)
           + ",\"uptime_s\":" + std::to_string(time(nullptr) - s->started_at)
           + "}";
    return out;
}

}  // namespace v8host
