/*
 * Counters shared by the supervisor and its workers: an anonymous
 * MAP_SHARED region created before the first fork, one slot per worker.
 * The supervisor answers STATUS from it; a crashed worker cannot corrupt
 * more than relaxed atomic counters.
 */

#ifndef V8HOST_STATS_H
#define V8HOST_STATS_H

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace v8host {

struct WorkerStats {
    std::atomic<int64_t>   pid;
    std::atomic<uint64_t>  calls;       /* LOAD and CALL frames */
    std::atomic<uint64_t>  errors;      /* answered ok:false, kind plugin,
                                           internal or bad_request */
    std::atomic<uint64_t>  timeouts;
    std::atomic<uint64_t>  memory;      /* calls stopped at the heap cap */
    std::atomic<uint64_t>  restarts;    /* of this slot, by the supervisor */
    std::atomic<uint64_t>  plugins;     /* modules loaded right now */
};

struct SharedStats {
    int64_t      started_at;            /* unix seconds */
    int          nworkers;
    WorkerStats  slot[1];               /* nworkers of them */
};

/* nullptr when mmap fails. */
SharedStats *stats_create(int nworkers);

/* A new process in the slot: counters of the previous one start over,
   restarts carry on. */
void stats_reset_slot(WorkerStats *w, int64_t pid);

/* The STATUS reply body: the counters, the plugin each worker is running
   (its sha; "" when idle), the calls waiting for a worker; "pid" is the
   supervisor's. */
std::string stats_reply(const SharedStats *s, size_t sources,
    const std::vector<std::string> &running, size_t queued);

}  // namespace v8host

#endif
