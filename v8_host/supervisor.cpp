/*
 * Supervisor process.  Signals are blocked and taken synchronously with
 * sigtimedwait(), so there is no handler state to get wrong; the wait's
 * timeout doubles as the restart throttle's timer (php-fpm's shape).
 */

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "source_store.h"
#include "stats.h"
#include "supervisor.h"
#include "worker.h"

namespace v8host {

namespace {

constexpr int64_t kRestartIntervalMs = 1000;

int64_t
now_ms()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

struct Slot {
    pid_t    pid = 0;
    int64_t  started_ms = 0;
    int64_t  restart_at_ms = 0;     /* 0: none pending */
};

/* Unlinks a stale socket file; refuses when a helper still answers on it
   or the path is not a socket. */
int
make_listener(const std::string &path)
{
    sockaddr_un addr {};

    if (path.size() >= sizeof(addr.sun_path)) {
        log(Level::error, "socket path is longer than %zu bytes: %s",
            sizeof(addr.sun_path) - 1, path.c_str());
        return -1;
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);

    struct stat st;
    if (lstat(path.c_str(), &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            log(Level::error, "%s exists and is not a socket", path.c_str());
            return -1;
        }

        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bool live = probe >= 0
                    && connect(probe, reinterpret_cast<sockaddr *>(&addr),
                               sizeof(addr)) == 0;
        if (probe >= 0) {
            close(probe);
        }
        if (live) {
            log(Level::error, "another helper is listening on %s",
                path.c_str());
            return -1;
        }
        unlink(path.c_str());
    }

    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        log(Level::error, "socket(): %s", std::strerror(errno));
        return -1;
    }

    if (bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0
        || listen(fd, 512) != 0)
    {
        log(Level::error, "cannot listen on %s: %s", path.c_str(),
            std::strerror(errno));
        close(fd);
        return -1;
    }

    /* nginx workers run as another user (nobody) and must connect. */
    if (chmod(path.c_str(), 0666) != 0) {
        log(Level::warn, "chmod 0666 %s: %s", path.c_str(), std::strerror(errno));
    }

    return fd;
}

class Supervisor {
public:
    Supervisor(const Options &o, int listen_fd, SharedStats *stats,
               SourceStore *store)
        : opts_(o), listen_fd_(listen_fd), stats_(stats), store_(store),
          slots_(static_cast<size_t>(o.workers))
    {}

    int run();

private:
    void spawn(int slot);
    void reap();
    void shutdown(int signo);

    const Options      &opts_;
    int                 listen_fd_;
    SharedStats        *stats_;
    SourceStore        *store_;
    std::vector<Slot>   slots_;
    pid_t               self_ = getpid();
};

void
Supervisor::spawn(int slot)
{
    pid_t pid = fork();

    if (pid < 0) {
        log(Level::error, "fork() for worker %d: %s", slot, std::strerror(errno));
        slots_[slot].restart_at_ms = now_ms() + kRestartIntervalMs;
        return;
    }

    if (pid == 0) {
        /* A worker must not outlive its supervisor. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != self_) {
            _exit(0);
        }

        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        signal(SIGCHLD, SIG_DFL);

        _exit(run_worker(slot, listen_fd_, opts_, stats_, store_));
    }

    slots_[slot].pid = pid;
    slots_[slot].started_ms = now_ms();
    slots_[slot].restart_at_ms = 0;
    stats_reset_slot(&stats_->slot[slot], pid);
}

void
Supervisor::reap()
{
    int status;
    pid_t pid;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (size_t i = 0; i < slots_.size(); i++) {
            Slot &s = slots_[i];
            if (s.pid != pid) {
                continue;
            }

            char how[64];
            if (WIFSIGNALED(status)) {
                std::snprintf(how, sizeof(how), "killed by signal %d",
                              WTERMSIG(status));
            } else {
                std::snprintf(how, sizeof(how), "exited with status %d",
                              WEXITSTATUS(status));
            }

            int64_t now = now_ms();
            s.pid = 0;
            s.restart_at_ms = std::max(now, s.started_ms + kRestartIntervalMs);
            stats_->slot[i].pid.store(0);
            stats_->slot[i].restarts.fetch_add(1);

            log(Level::warn, "worker %zu (pid %d) %s; restarting%s", i,
                static_cast<int>(pid), how,
                s.restart_at_ms > now ? " in under a second (throttled)" : "");
        }
    }
}

void
Supervisor::shutdown(int signo)
{
    log(Level::info, "signal %d: stopping %zu worker(s)", signo, slots_.size());

    for (const Slot &s : slots_) {
        if (s.pid > 0) {
            kill(s.pid, SIGTERM);
        }
    }

    /* A worker finishes the call it is running; the deadline bounds it. */
    int64_t give_up = now_ms() + opts_.deadline_ms + 2000;

    for (;;) {
        int status;
        pid_t pid;

        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            for (Slot &s : slots_) {
                if (s.pid == pid) {
                    s.pid = 0;
                }
            }
        }

        bool left = false;
        for (const Slot &s : slots_) {
            left = left || s.pid > 0;
        }
        if (!left) {
            break;
        }

        if (now_ms() >= give_up) {
            for (const Slot &s : slots_) {
                if (s.pid > 0) {
                    log(Level::warn, "worker pid %d did not stop; killing it",
                        static_cast<int>(s.pid));
                    kill(s.pid, SIGKILL);
                }
            }
            give_up = now_ms() + 1000;
        }
        usleep(20000);
    }
}

int
Supervisor::run()
{
    for (size_t i = 0; i < slots_.size(); i++) {
        spawn(static_cast<int>(i));
    }

    log(Level::info, "listening on %s with %d worker(s)",
        opts_.socket_path.c_str(), opts_.workers);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);

    for (;;) {
        int64_t now = now_ms();
        int64_t wait_ms = 1000;

        for (size_t i = 0; i < slots_.size(); i++) {
            Slot &s = slots_[i];
            if (s.pid == 0 && s.restart_at_ms > 0) {
                if (s.restart_at_ms <= now) {
                    spawn(static_cast<int>(i));
                } else {
                    wait_ms = std::min(wait_ms, s.restart_at_ms - now);
                }
            }
        }

        timespec ts { static_cast<time_t>(wait_ms / 1000),
                      static_cast<long>((wait_ms % 1000) * 1000000) };
        siginfo_t info;
        int sig = sigtimedwait(&set, &info, &ts);

        if (sig == SIGCHLD) {
            reap();
        } else if (sig == SIGTERM || sig == SIGINT) {
            shutdown(sig);
            return 0;
        } else if (sig == SIGHUP) {
            log(Level::info, "SIGHUP ignored (nothing to reload)");
        }
    }
}

}  // namespace

int
run_supervisor(const Options &o)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    signal(SIGPIPE, SIG_IGN);

    int fd = make_listener(o.socket_path);
    if (fd < 0) {
        return 1;
    }

    SharedStats *stats = stats_create(o.workers);
    if (stats == nullptr) {
        log(Level::error, "mmap of the shared counters failed: %s",
            std::strerror(errno));
        unlink(o.socket_path.c_str());
        return 1;
    }

    SourceStore *store = nullptr;
    if (o.source_cache_mb > 0) {
        store = SourceStore::create(static_cast<size_t>(o.source_cache_mb) << 20);
        if (store == nullptr) {
            log(Level::warn, "no shared source store (%s): each worker keeps "
                "only what it loaded itself", std::strerror(errno));
        }
    }

    if (!o.pidfile.empty()) {
        FILE *f = std::fopen(o.pidfile.c_str(), "w");
        if (f == nullptr) {
            log(Level::error, "cannot write pidfile %s: %s", o.pidfile.c_str(),
                std::strerror(errno));
            unlink(o.socket_path.c_str());
            return 1;
        }
        std::fprintf(f, "%d\n", static_cast<int>(getpid()));
        std::fclose(f);
    }

    int rc = Supervisor(o, fd, stats, store).run();

    close(fd);
    unlink(o.socket_path.c_str());
    if (!o.pidfile.empty()) {
        unlink(o.pidfile.c_str());
    }
    log(Level::info, "stopped");
    return rc;
}

}  // namespace v8host
