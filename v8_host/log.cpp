/*
 * Logging to stderr.  Each line goes out in one write() so lines of the
 * supervisor and the workers (which share stderr) never interleave.
 */

#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <unistd.h>

#include "log.h"

namespace v8host {

static char role_[32] = "supervisor";

void
log_set_role(const char *role)
{
    std::snprintf(role_, sizeof(role_), "%s", role);
}

void
log(Level level, const char *fmt, ...)
{
    static const char *names[] = { "info", "warn", "error" };
    char line[1024];
    time_t now = time(nullptr);
    struct tm tm;

    gmtime_r(&now, &tm);
    int n = static_cast<int>(strftime(line, sizeof(line),
                                      "%Y-%m-%dT%H:%M:%SZ", &tm));
    n += std::snprintf(line + n, sizeof(line) - n, " llmgw-v8host[%d] %s %s: ",
                       static_cast<int>(getpid()), role_,
                       names[static_cast<int>(level)]);

    va_list ap;
    va_start(ap, fmt);
    int m = std::vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
    va_end(ap);

    size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
    if (len > sizeof(line) - 2) {
        len = sizeof(line) - 2;
    }
    line[len++] = '\n';

    ssize_t w = write(STDERR_FILENO, line, len);
    (void) w;
}

}  // namespace v8host
