/*
 * One line per event on stderr: time, process role, level, message.
 * Never log plugin source, arguments or results: they may hold secrets.
 */

#ifndef V8HOST_LOG_H
#define V8HOST_LOG_H

namespace v8host {

enum class Level { info, warn, error };

/* "supervisor" or "worker 1": printed in every line of this process. */
void log_set_role(const char *role);

void log(Level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

}  // namespace v8host

#endif
