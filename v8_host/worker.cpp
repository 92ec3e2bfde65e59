/*
 * Worker event loop.
 *
 * poll() over the listening socket and every accepted connection; bytes are
 * read without blocking, so a slow client only delays others between
 * calls (JS runs one call at a time per worker).  A frame header is checked
 * as soon as its 12 bytes are in (version, type, length against
 * --max-frame); a bad header closes that connection.  A connection with a
 * complete frame, or with a reply still being written, is not read
 * further: at most one request per connection is in flight.
 */

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine.h"
#include "json_text.h"
#include "llmgw.h"
#include "log.h"
#include "request_body.h"
#include "runtime.h"
#include "worker.h"

namespace v8host {

namespace {

volatile sig_atomic_t stop_requested = 0;

void
on_term(int)
{
    stop_requested = 1;
}

constexpr size_t kMaxConnections = 1024;
constexpr size_t kReadChunk = 65536;

struct Conn {
    int            fd;
    unsigned       id;
    std::string    in;
    bool           have_header = false;
    llmgw_frame_t  hdr {};
    std::string    out;
    size_t         out_off = 0;
    bool           closed = false;

    bool frame_ready() const {
        return have_header && in.size() >= LLMGW_FRAME_HEADER_LEN + hdr.length;
    }
    bool writing() const { return out_off < out.size(); }
    /* A frame to serve, or a header to check, without reading more. */
    bool buffered() const {
        return frame_ready()
               || (!have_header && in.size() >= LLMGW_FRAME_HEADER_LEN);
    }
};

class Worker {
public:
    Worker(int slot, int listen_fd, const Options &o, SharedStats *stats,
           SourceStore *store)
        : listen_fd_(listen_fd), opts_(o),
          stats_(&stats->slot[slot]), shared_(stats), store_(store),
          runtime_(Limits { o.deadline_ms, o.heap_mb, o.max_frame }, store)
    {}

    int run();

private:
    void accept_one();
    void read_from(Conn &c);
    bool check_header(Conn &c);
    void serve(Conn &c);
    void flush(Conn &c);
    static bool peer_gone(const Conn &c);
    void close_conn(Conn &c, const char *why);

    std::string handle(uint8_t type, std::string_view body, Outcome *o);
    void count(uint8_t type, Outcome o);

    int                                  listen_fd_;
    const Options                       &opts_;
    WorkerStats                         *stats_;
    SharedStats                         *shared_;
    SourceStore                         *store_;
    Runtime                              runtime_;
    std::vector<std::unique_ptr<Conn>>   conns_;
    unsigned                             next_id_ = 1;
};

void
Worker::close_conn(Conn &c, const char *why)
{
    if (c.closed) {
        return;
    }
    if (why != nullptr) {
        log(Level::warn, "connection %u closed: %s", c.id, why);
    }
    close(c.fd);
    c.closed = true;
}

void
Worker::accept_one()
{
    /*
     * One connection per wake-up: the listening socket stays readable for
     * the other workers, so connections spread over them instead of one
     * worker taking every pending one.
     */
    for (;;) {
        int fd = accept4(listen_fd_, nullptr, nullptr,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR
                && errno != ECONNABORTED)
            {
                log(Level::error, "accept(): %s", std::strerror(errno));
            }
            return;
        }

        if (conns_.size() >= kMaxConnections) {
            log(Level::warn, "%zu connections open; refusing another",
                conns_.size());
            close(fd);
            continue;
        }

        auto c = std::make_unique<Conn>();
        c->fd = fd;
        c->id = next_id_++;
        conns_.push_back(std::move(c));
        return;
    }
}

bool
Worker::check_header(Conn &c)
{
    if (c.have_header || c.in.size() < LLMGW_FRAME_HEADER_LEN) {
        return true;
    }

    char err[160];
    const auto *p = reinterpret_cast<const uint8_t *>(c.in.data());

    if (llmgw_frame_decode(p, opts_.max_frame, &c.hdr, err, sizeof(err)) != 0) {
        close_conn(c, err);
        return false;
    }

    if (c.hdr.type & LLMGW_FRAME_REPLY) {
        close_conn(c, "a reply frame sent to the helper");
        return false;
    }

    c.have_header = true;
    return true;
}

void
Worker::read_from(Conn &c)
{
    while (!c.frame_ready()) {
        size_t want = kReadChunk;
        if (c.have_header) {
            want = LLMGW_FRAME_HEADER_LEN + c.hdr.length - c.in.size();
            want = want < kReadChunk ? want : kReadChunk;
        }

        size_t old = c.in.size();
        c.in.resize(old + want);
        ssize_t n = read(c.fd, &c.in[old], want);

        if (n <= 0) {
            c.in.resize(old);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK
                          || errno == EINTR))
            {
                return;
            }
            /* EOF or reset: the client went away; nothing to answer. */
            close_conn(c, nullptr);
            return;
        }

        c.in.resize(old + static_cast<size_t>(n));

        if (!check_header(c)) {
            return;
        }
    }
}

/* Whether the client closed the connection (nothing more to read, EOF). */
bool
Worker::peer_gone(const Conn &c)
{
    char b;
    ssize_t n = recv(c.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK
                      && errno != EINTR);
}

void
Worker::flush(Conn &c)
{
    while (c.writing()) {
        ssize_t n = send(c.fd, c.out.data() + c.out_off,
                         c.out.size() - c.out_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                return;
            }
            close_conn(c, nullptr);
            return;
        }
        c.out_off += static_cast<size_t>(n);
    }

    c.out.clear();
    c.out_off = 0;
}

void
Worker::count(uint8_t type, Outcome o)
{
    if (type == LLMGW_FRAME_STATUS) {
        return;
    }

    stats_->calls.fetch_add(1, std::memory_order_relaxed);

    switch (o) {
    case Outcome::timeout:
        stats_->timeouts.fetch_add(1, std::memory_order_relaxed);
        break;
    case Outcome::memory:
        stats_->memory.fetch_add(1, std::memory_order_relaxed);
        break;
    case Outcome::plugin:
    case Outcome::internal:
    case Outcome::bad_request:
        stats_->errors.fetch_add(1, std::memory_order_relaxed);
        break;
    default:
        break;
    }

    stats_->plugins.store(runtime_.plugins(), std::memory_order_relaxed);
}

std::string
Worker::handle(uint8_t type, std::string_view body, Outcome *o)
{
    std::string err;

    *o = Outcome::ok;

    if (type == LLMGW_FRAME_STATUS) {
        return stats_reply(shared_, store_ != nullptr ? store_->count() : 0);
    }

    try {
        if (type == LLMGW_FRAME_LOAD) {
            std::string source;
            if (read_load_body(body, &source, &err)) {
                return runtime_.load(source, o);
            }
        } else {
            CallRequest req;
            if (read_call_body(body, &req, &err)) {
                return runtime_.call(req, o);
            }
        }

    } catch (const std::bad_alloc &) {
        /* a result too large for the worker's memory (RLIMIT_DATA), met
           outside JavaScript, where V8's own handler does not see it */
        *o = Outcome::memory;
        log(Level::warn, "a %s ran out of the worker's memory",
            type == LLMGW_FRAME_LOAD ? "LOAD" : "CALL");
        return error_reply("memory", "the plugin's result does not fit in "
                                     "the runtime's memory");
    }

    *o = Outcome::bad_request;
    return error_reply("bad_request", err);
}

void
Worker::serve(Conn &c)
{
    llmgw_frame_t req = c.hdr;
    std::string_view body(c.in.data() + LLMGW_FRAME_HEADER_LEN, req.length);
    Outcome outcome;
    std::string reply = handle(req.type, body, &outcome);

    count(req.type, outcome);

    if (reply.size() > opts_.max_frame) {
        log(Level::error, "reply of %zu bytes over the frame limit",
            reply.size());
        reply = error_reply("internal", "the reply is over the frame limit");
    }

    llmgw_frame_t rf { LLMGW_FRAME_VERSION,
                       static_cast<uint8_t>(LLMGW_FRAME_REPLY | req.type),
                       req.request_id, static_cast<uint32_t>(reply.size()) };
    uint8_t hdr[LLMGW_FRAME_HEADER_LEN];
    llmgw_frame_encode(&rf, hdr);

    c.out.assign(reinterpret_cast<char *>(hdr), sizeof(hdr));
    c.out += reply;
    c.out_off = 0;

    c.in.erase(0, LLMGW_FRAME_HEADER_LEN + req.length);
    c.have_header = false;
}

int
Worker::run()
{
    std::vector<pollfd> pfds;

    while (!stop_requested) {
        pfds.clear();
        pfds.push_back({ listen_fd_, POLLIN, 0 });

        for (const auto &c : conns_) {
            short ev = c->writing() ? POLLOUT
                       : c->frame_ready() ? 0 : POLLIN;
            pfds.push_back({ c->fd, ev, 0 });
        }

        /* A frame already complete in a buffer needs no waiting. */
        bool ready = false;
        for (const auto &c : conns_) {
            ready = ready || (!c->writing() && c->buffered());
        }

        int n = poll(pfds.data(), pfds.size(), ready ? 0 : 1000);
        if (n < 0 && errno != EINTR) {
            log(Level::error, "poll(): %s", std::strerror(errno));
            return 1;
        }

        size_t count = conns_.size();   /* accepted below are polled later */

        for (size_t i = 0; i < count && n > 0; i++) {
            Conn &c = *conns_[i];
            short re = pfds[i + 1].revents;

            if (re & POLLOUT) {
                flush(c);
            } else if (re & (POLLIN | POLLHUP | POLLERR)) {
                read_from(c);
            }
        }

        if (n > 0 && (pfds[0].revents & POLLIN)) {
            accept_one();
        }

        /* One request per connection per round: fair between clients.
           A pipelined next header is checked only once the reply to the
           previous frame is out. */
        for (size_t i = 0; i < count && !stop_requested; i++) {
            Conn &c = *conns_[i];
            if (!c.closed && !c.writing() && check_header(c)
                && c.frame_ready())
            {
                if (peer_gone(c)) {
                    /* nginx gave up on the call (its timeout closes the
                       connection) while it waited: nothing to run */
                    close_conn(c, nullptr);
                    continue;
                }
                serve(c);
                flush(c);
            }
        }

        conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                    [](const std::unique_ptr<Conn> &c) {
                                        return c->closed;
                                    }),
                     conns_.end());
    }

    for (auto &c : conns_) {
        close(c->fd);
    }

    return 0;
}

}  // namespace

int
run_worker(int slot, int listen_fd, const Options &o, SharedStats *stats,
    SourceStore *store)
{
    char role[32];
    std::snprintf(role, sizeof(role), "worker %d", slot);
    log_set_role(role);

    struct sigaction sa {};
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);       /* no SA_RESTART: poll wakes */
    signal(SIGINT, SIG_IGN);                /* the supervisor forwards it */
    signal(SIGPIPE, SIG_IGN);

    /*
     * Memory outside V8's heap cap (one huge string is allowed past it
     * before the call is stopped, ArrayBuffers, malloc) is bounded too: at
     * --max-memory-mb (8 x the heap cap + 1 GiB) of data a worker's
     * allocations fail, and
     * V8's out-of-memory handler ends it (the supervisor starts another).
     */
    struct rlimit rl;
    rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(
        o.max_memory_mb > 0 ? o.max_memory_mb
                            : static_cast<long>(o.heap_mb) * 8 + 1024) << 20;
    if (setrlimit(RLIMIT_DATA, &rl) != 0) {
        log(Level::warn, "setrlimit(RLIMIT_DATA): %s", std::strerror(errno));
    }

    v8_process_init();

    Worker w(slot, listen_fd, o, stats, store);
    log(Level::info, "ready (heap %d MiB, deadline %d ms)", o.heap_mb,
        o.deadline_ms);

    int rc = w.run();
    log(Level::info, "stopping");
    return rc;
}

}  // namespace v8host
