/*
 * A worker process: one isolate, accepting on the shared listening socket
 * (pre-fork), serving each connection one frame at a time.
 */

#ifndef V8HOST_WORKER_H
#define V8HOST_WORKER_H

#include "options.h"
#include "source_store.h"
#include "stats.h"

namespace v8host {

/* Returns the process exit status. */
int run_worker(int slot, int listen_fd, const Options &o, SharedStats *stats,
    SourceStore *store);

}  // namespace v8host

#endif
