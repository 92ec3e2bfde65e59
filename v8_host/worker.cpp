/*
 * Worker loop.  The supervisor hands a worker one frame at a time over its
 * channel (one end of a socketpair) and reads the reply before it sends the
 * next; JS runs one call at a time anyway, so blocking reads and writes are
 * all a worker needs.  Which call runs where, and when, is the
 * supervisor's business (dispatcher.cpp).
 */

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include <sys/resource.h>
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

class Worker {
public:
    Worker(int slot, int channel, const Options &o, SharedStats *stats,
           SourceStore *store)
        : channel_(channel), opts_(o), stats_(&stats->slot[slot]),
          runtime_(Limits { o.deadline_ms, o.heap_mb, o.max_frame }, store)
    {}

    int run();

private:
    bool read_frame(llmgw_frame_t *hdr, std::string *body);
    bool read_exact(char *p, size_t n, bool may_stop);
    bool write_all(const std::string &data);

    std::string serve(const llmgw_frame_t &req, std::string_view body);
    std::string handle(uint8_t type, std::string_view body, Outcome *o);
    void count(Outcome o);

    int             channel_;
    const Options  &opts_;
    WorkerStats    *stats_;
    Runtime         runtime_;
};

/* may_stop: a SIGTERM between frames ends the wait (false); inside a frame
   the rest is read, the supervisor having sent it whole. */
bool
Worker::read_exact(char *p, size_t n, bool may_stop)
{
    size_t got = 0;

    while (got < n) {
        ssize_t r = read(channel_, p + got, n - got);

        if (r > 0) {
            got += static_cast<size_t>(r);
            continue;
        }
        if (r < 0 && errno == EINTR) {
            if (stop_requested && may_stop && got == 0) {
                return false;
            }
            continue;
        }
        if (r < 0) {
            log(Level::error, "reading the channel: %s", std::strerror(errno));
        }
        return false;
    }

    return true;
}

bool
Worker::read_frame(llmgw_frame_t *hdr, std::string *body)
{
    /* One read takes the header and, mostly, the whole body: the
       supervisor sends one frame and waits for its reply, so nothing of
       a next frame can be in it. */
    static char first[16384];
    uint8_t head[LLMGW_FRAME_HEADER_LEN];
    char err[160];
    size_t got = 0;

    while (got < LLMGW_FRAME_HEADER_LEN) {
        ssize_t r = read(channel_, first + got, sizeof(first) - got);

        if (r > 0) {
            got += static_cast<size_t>(r);
            continue;
        }
        if (r < 0 && errno == EINTR) {
            if (stop_requested && got == 0) {
                return false;
            }
            continue;
        }
        if (r < 0) {
            log(Level::error, "reading the channel: %s", std::strerror(errno));
        }
        return false;
    }

    std::memcpy(head, first, sizeof(head));

    if (llmgw_frame_decode(head, opts_.max_frame, hdr, err, sizeof(err)) != 0
        || (hdr->type & LLMGW_FRAME_REPLY))
    {
        log(Level::error, "the supervisor sent a bad frame: %s",
            (hdr->type & LLMGW_FRAME_REPLY) ? "a reply" : err);
        return false;
    }

    size_t have = got - LLMGW_FRAME_HEADER_LEN;

    if (have > hdr->length) {
        log(Level::error, "the supervisor sent more than one frame");
        return false;
    }

    body->resize(hdr->length);
    std::memcpy(body->data(), first + LLMGW_FRAME_HEADER_LEN, have);
    return read_exact(body->data() + have, body->size() - have, false);
}

bool
Worker::write_all(const std::string &data)
{
    size_t off = 0;

    while (off < data.size()) {
        ssize_t n = write(channel_, data.data() + off, data.size() - off);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            log(Level::error, "writing the channel: %s", std::strerror(errno));
            return false;
        }
        off += static_cast<size_t>(n);
    }

    return true;
}

void
Worker::count(Outcome o)
{
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

    try {
        if (type == LLMGW_FRAME_LOAD) {
            std::string source;
            if (read_load_body(body, &source, &err)) {
                return runtime_.load(source, o);
            }
        } else if (type == LLMGW_FRAME_CALL) {
            CallRequest req;
            if (read_call_body(body, &req, &err)) {
                return runtime_.call(req, o);
            }
        } else {
            err = "a worker serves LOAD and CALL only";
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

/* The reply frame, header included. */
std::string
Worker::serve(const llmgw_frame_t &req, std::string_view body)
{
    Outcome outcome;
    std::string reply = handle(req.type, body, &outcome);

    count(outcome);

    if (reply.size() > opts_.max_frame) {
        log(Level::error, "reply of %zu bytes over the frame limit",
            reply.size());
        reply = error_reply("internal", "the reply is over the frame limit");
    }

    return reply_frame(req, reply);
}

int
Worker::run()
{
    llmgw_frame_t req;
    std::string body;

    /* A call under way when SIGTERM comes is finished and answered. */
    while (!stop_requested && read_frame(&req, &body)) {
        if (!write_all(serve(req, body))) {
            return 1;
        }
    }

    return 0;
}

}  // namespace

int
run_worker(int slot, int channel, const Options &o, SharedStats *stats,
    SourceStore *store)
{
    char role[32];
    std::snprintf(role, sizeof(role), "worker %d", slot);
    log_set_role(role);

    struct sigaction sa {};
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);       /* no SA_RESTART: a wait for
                                               the next frame ends */
    signal(SIGINT, SIG_IGN);                /* the supervisor forwards it */
    signal(SIGHUP, SIG_IGN);                /* as the supervisor does */
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

    Worker w(slot, channel, o, stats, store);
    log(Level::info, "ready (heap %d MiB, deadline %d ms)", o.heap_mb,
        o.deadline_ms);

    int rc = w.run();
    log(Level::info, "stopping");
    return rc;
}

}  // namespace v8host
