/*
 * Supervisor process.  Signals are blocked and read from a signalfd in the
 * same poll() as the connections (dispatcher.cpp), so there is no handler
 * state to get wrong; the poll's timeout doubles as the restart throttle's
 * timer (php-fpm's shape).
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
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dispatcher.h"
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

/* The worker's end of its channel becomes descriptor 3; everything else
   the supervisor holds (the listener, nginx's connections, the other
   channels, the signalfd) is closed, so that a connection the supervisor
   closes is closed for nginx too. */
void
keep_only_channel(int fd)
{
    constexpr int kChannel = 3;

    if (fd != kChannel) {
        dup2(fd, kChannel);         /* dup2 clears FD_CLOEXEC */
    } else {
        fcntl(fd, F_SETFD, 0);
    }

    if (close_range(kChannel + 1, ~0U, 0) != 0) {
        long max = sysconf(_SC_OPEN_MAX);
        for (long i = kChannel + 1; i < max && i < 65536; i++) {
            close(static_cast<int>(i));
        }
    }
}

class Supervisor {
public:
    Supervisor(const Options &o, int listen_fd, SharedStats *stats,
               SourceStore *store)
        : opts_(o), listen_fd_(listen_fd), stats_(stats), store_(store),
          slots_(static_cast<size_t>(o.workers)),
          dispatcher_(o, listen_fd, stats, store)
    {}

    int run();

private:
    void spawn(int slot);
    void reap();
    void ended(size_t slot, pid_t pid, int status, bool restart);
    void shutdown(int signo);
    int take_signals();
    void poll_once(int64_t wait_ms);

    const Options      &opts_;
    int                 listen_fd_;
    SharedStats        *stats_;
    SourceStore        *store_;
    std::vector<Slot>   slots_;
    Dispatcher          dispatcher_;
    int                 signal_fd_ = -1;
    pid_t               self_ = getpid();
    std::vector<pollfd> pfds_;          /* kept: no allocation per poll */
};

void
Supervisor::spawn(int slot)
{
    int sv[2];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        log(Level::error, "socketpair() for worker %d: %s", slot,
            std::strerror(errno));
        slots_[slot].restart_at_ms = now_ms() + kRestartIntervalMs;
        return;
    }

    pid_t pid = fork();

    if (pid < 0) {
        log(Level::error, "fork() for worker %d: %s", slot, std::strerror(errno));
        close(sv[0]);
        close(sv[1]);
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

        keep_only_channel(sv[1]);
        dispatcher_.forget_after_fork();
        std::vector<pollfd>().swap(pfds_);
        _exit(run_worker(slot, 3, opts_, stats_, store_));
    }

    close(sv[1]);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);

    slots_[slot].pid = pid;
    slots_[slot].started_ms = now_ms();
    slots_[slot].restart_at_ms = 0;
    stats_reset_slot(&stats_->slot[slot], pid);
    dispatcher_.attach(slot, sv[0], pid);
}

void
Supervisor::ended(size_t i, pid_t pid, int status, bool restart)
{
    Slot &s = slots_[i];
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
    s.restart_at_ms = restart ? std::max(now, s.started_ms
                                              + kRestartIntervalMs)
                              : 0;
    stats_->slot[i].pid.store(0);

    if (restart) {
        stats_->slot[i].restarts.fetch_add(1);
        log(Level::warn, "worker %zu (pid %d) %s; restarting%s", i,
            static_cast<int>(pid), how,
            s.restart_at_ms > now ? " in under a second (throttled)" : "");
    }

    dispatcher_.detach(static_cast<int>(i), status);
}

void
Supervisor::reap()
{
    int status;
    pid_t pid;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (size_t i = 0; i < slots_.size(); i++) {
            if (slots_[i].pid == pid) {
                ended(i, pid, status, true);
            }
        }
    }
}

/* The signals that came: SIGCHLD is handled here, a stop signal returned
   (0: none). */
int
Supervisor::take_signals()
{
    signalfd_siginfo si;
    int stop = 0;

    while (read(signal_fd_, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGCHLD) {
            reap();
        } else if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
            stop = static_cast<int>(si.ssi_signo);
        } else if (si.ssi_signo == SIGHUP) {
            log(Level::info, "SIGHUP ignored (nothing to reload)");
        }
    }

    return stop;
}

void
Supervisor::poll_once(int64_t wait_ms)
{
    std::vector<pollfd> &pfds = pfds_;

    pfds.clear();
    pfds.push_back({ signal_fd_, POLLIN, 0 });
    dispatcher_.fill(&pfds);

    int n = poll(pfds.data(), pfds.size(), static_cast<int>(wait_ms));
    if (n < 0) {
        if (errno != EINTR) {
            log(Level::error, "poll(): %s", std::strerror(errno));
            usleep(10000);
        }
        return;
    }

    dispatcher_.handle(pfds.data() + 1, pfds.size() - 1);
}

void
Supervisor::shutdown(int signo)
{
    log(Level::info, "signal %d: stopping %zu worker(s)", signo, slots_.size());

    dispatcher_.stop();

    for (const Slot &s : slots_) {
        if (s.pid > 0) {
            kill(s.pid, SIGTERM);
        }
    }

    /* A worker finishes the call it is running; the deadline bounds it.
       Its reply is passed on, then the connections close. */
    int64_t give_up = now_ms() + opts_.deadline_ms + 2000;
    int64_t flush_by = 0;

    for (;;) {
        int status;
        pid_t pid;

        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            for (size_t i = 0; i < slots_.size(); i++) {
                if (slots_[i].pid == pid) {
                    ended(i, pid, status, false);
                }
            }
        }

        bool left = false;
        for (const Slot &s : slots_) {
            left = left || s.pid > 0;
        }

        int64_t now = now_ms();
        if (!left) {
            flush_by = flush_by > 0 ? flush_by : now + 1000;
            if (dispatcher_.drained() || now >= flush_by) {
                break;
            }
        }

        if (left && now >= give_up) {
            for (const Slot &s : slots_) {
                if (s.pid > 0) {
                    log(Level::warn, "worker pid %d did not stop; killing it",
                        static_cast<int>(s.pid));
                    kill(s.pid, SIGKILL);
                }
            }
            give_up = now + 1000;
        }

        poll_once(20);

        signalfd_siginfo si;
        while (read(signal_fd_, &si, sizeof(si)) == sizeof(si)) {
            /* children are reaped above; further stop signals change
               nothing */
        }
    }
}

int
Supervisor::run()
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);

    signal_fd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (signal_fd_ < 0) {
        log(Level::error, "signalfd(): %s", std::strerror(errno));
        return 1;
    }

    for (size_t i = 0; i < slots_.size(); i++) {
        spawn(static_cast<int>(i));
    }

    log(Level::info, "listening on %s with %d worker(s), at most %d per "
        "plugin", opts_.socket_path.c_str(), opts_.workers, plugin_cap(opts_));

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

        poll_once(std::min(wait_ms, dispatcher_.wait_limit_ms()));
        dispatcher_.reclaim_stuck();

        int stop = take_signals();
        if (stop != 0) {
            shutdown(stop);
            close(signal_fd_);
            return 0;
        }
    }
}

/* Every connection from nginx ends here, and a node has several nginx
   workers each with calls in flight: more than the usual 1024 descriptors
   may be needed. */
void
raise_descriptor_limit()
{
    rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            log(Level::warn, "setrlimit(RLIMIT_NOFILE): %s",
                std::strerror(errno));
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
    raise_descriptor_limit();

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
