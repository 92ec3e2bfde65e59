/*
 * A worker process: one isolate, serving the frames the supervisor hands
 * it over its channel, one at a time.
 */

#ifndef V8HOST_WORKER_H
#define V8HOST_WORKER_H

#include "options.h"
#include "source_store.h"
#include "stats.h"

namespace v8host {

/* Returns the process exit status. */
int run_worker(int slot, int channel, const Options &o, SharedStats *stats,
    SourceStore *store);

}  // namespace v8host

#endif
