/*
 * A monotonic clock that tests can move forward: preloaded into nginx
 * (LD_PRELOAD), it adds the milliseconds written in the file that
 * LLMGW_TEST_CLOCK names to CLOCK_MONOTONIC and its variants, the clock
 * of nginx's timers and of the gateway's rate limit windows.  The wall
 * clock is left alone.  The file is read at every call (opened by path:
 * the test replaces it with a rename, so a reading is never half
 * written); a missing or unreadable file keeps the last shift.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


static char  path[4096];
static long long  shift_ms;
static int (*real_clock_gettime)(clockid_t, struct timespec *);


__attribute__((constructor)) static void
clock_init(void)
{
    const char  *p = getenv("LLMGW_TEST_CLOCK");

    real_clock_gettime = (int (*)(clockid_t, struct timespec *))
                         dlsym(RTLD_NEXT, "clock_gettime");

    /* nginx workers lose the environment: the path is kept here */
    if (p != NULL && strlen(p) < sizeof(path)) {
        strcpy(path, p);
    }
}


static void
clock_read_shift(void)
{
    int      fd;
    char     buf[32];
    ssize_t  n;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return;
    }

    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);

    if (n > 0) {
        buf[n] = '\0';
        shift_ms = atoll(buf);
    }
}


int
clock_gettime(clockid_t id, struct timespec *ts)
{
    int  rc;

    rc = real_clock_gettime(id, ts);

    if (rc != 0 || path[0] == '\0'
        || (id != CLOCK_MONOTONIC && id != CLOCK_MONOTONIC_COARSE
            && id != CLOCK_MONOTONIC_RAW && id != CLOCK_BOOTTIME))
    {
        return rc;
    }

    clock_read_shift();

    ts->tv_sec += shift_ms / 1000;
    ts->tv_nsec += (shift_ms % 1000) * 1000000;

    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000;
    }

    return rc;
}
