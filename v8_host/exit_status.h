/*
 * How a worker ends when a call cannot be finished in the process.  The
 * supervisor reads the status to answer that call: the plugin ran out of
 * memory, ignored its deadline, or broke V8; the runtime itself is fine.
 */

#ifndef V8HOST_EXIT_STATUS_H
#define V8HOST_EXIT_STATUS_H

namespace v8host {

constexpr int kExitOutOfMemory = 70;    /* V8 could not allocate */
constexpr int kExitStuck = 71;          /* still running 2 s after the
                                           deadline, termination ignored */
constexpr int kExitFatal = 72;          /* a V8 fatal error */

}  // namespace v8host

#endif
