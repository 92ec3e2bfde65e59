/*
 * The supervisor: owns the listening socket, forks the workers (pre-fork,
 * all accept on the same socket), restarts one that exits or crashes (at
 * most once per second per slot), and stops them on SIGTERM/SIGINT.
 * It never initializes V8, so nothing a plugin does can reach it.
 */

#ifndef V8HOST_SUPERVISOR_H
#define V8HOST_SUPERVISOR_H

#include "options.h"

namespace v8host {

/* Returns the process exit status. */
int run_supervisor(const Options &o);

}  // namespace v8host

#endif
