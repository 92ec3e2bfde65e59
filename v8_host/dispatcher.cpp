/*
 * Dispatcher: nginx's connections, the plugin queues and the workers'
 * channels, on the supervisor's poll() loop.
 *
 * Bytes are read and written without blocking.  A frame header is checked
 * as soon as its 12 bytes are in (version, type, length against
 * --max-frame); a bad header closes that connection.  A connection with a
 * frame queued or running, or with a reply still being written, is not
 * read further (watched only for its closing): at most one request per
 * connection is in flight, and pipelined frames are answered in order.
 *
 * Which call runs next: the plugins with calls waiting form a ring; the
 * next idle worker goes to the first plugin of the ring that has fewer
 * than --plugin-workers workers, which then moves to the ring's end.
 * Within a plugin, calls run oldest first.  A worker that dies during a
 * call stays counted against that plugin until its replacement starts, so
 * that a plugin crashing workers cannot take the others' as well.
 */

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string_view>

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crypto_util.h"
#include "dispatcher.h"
#include "exit_status.h"
#include "json_text.h"
#include "log.h"
#include "request_body.h"

namespace v8host {

namespace {

constexpr size_t kMaxClients = 4096;
constexpr size_t kReadChunk = 65536;
constexpr int kAcceptsPerWake = 64;

/* The plugin a LOAD or CALL is for: the sha it names, or the sha of the
   source it brings.  "" for a body the worker will refuse anyway. */
std::string
plugin_of(uint8_t type, std::string_view body)
{
    std::string source, err;

    if (type == LLMGW_FRAME_LOAD) {
        return read_load_body(body, &source, &err) ? hex(sha256(source))
                                                   : std::string();
    }

    CallRequest req;
    if (!read_call_body(body, &req, &err)) {
        return std::string();
    }
    return req.has_source ? hex(sha256(req.source)) : req.sha;
}

/* Whether the client closed the connection (nothing more to read, EOF). */
bool
peer_gone(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK
                      && errno != EINTR);
}

/* Appends up to want bytes read from fd to *in: 1 some were read, 0 none
   are there yet, -1 EOF or an error (the peer is gone). */
int
read_more(int fd, std::string *in, size_t want)
{
    /* read into a scratch buffer, then only what came is appended: a
       string grown by want bytes first is zero-filled (64 KiB a frame) */
    static char scratch[kReadChunk];

    want = std::min(want, sizeof(scratch));
    ssize_t n = read(fd, scratch, want);

    if (n > 0) {
        in->append(scratch, static_cast<size_t>(n));
        return 1;
    }
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
           ? 0 : -1;
}

/* Sends what is left of *out from *off: 1 all of it (out is emptied), 0
   the socket is full, -1 the peer is gone. */
int
send_rest(int fd, std::string *out, size_t *off)
{
    while (*off < out->size()) {
        ssize_t n = send(fd, out->data() + *off, out->size() - *off,
                         MSG_NOSIGNAL);
        if (n < 0) {
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR
                   ? 0 : -1;
        }
        *off += static_cast<size_t>(n);
    }

    out->clear();
    out->shrink_to_fit();
    *off = 0;
    return 1;
}

}  // namespace

Dispatcher::Dispatcher(const Options &o, int listen_fd, SharedStats *stats,
    SourceStore *store)
    : opts_(o), listen_fd_(listen_fd), stats_(stats), store_(store),
      cap_(plugin_cap(o)), channels_(static_cast<size_t>(o.workers))
{
}

Dispatcher::~Dispatcher()
{
    for (auto &kv : clients_) {
        close(kv.second->fd);
    }
    for (Channel &ch : channels_) {
        if (ch.fd >= 0) {
            close(ch.fd);
        }
    }
}

/* ---- nginx's connections ---- */

/* At most kMaxClients, and always descriptors left for the workers'
   channels (a worker that ends is started again on a new one), the
   signal descriptor and the logs. */
size_t
Dispatcher::max_clients() const
{
    struct rlimit rl {};
    size_t reserve = 2 * channels_.size() + 32;
    size_t limit = kMaxClients;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        size_t fds = static_cast<size_t>(rl.rlim_cur);
        limit = std::min(limit, fds > reserve ? fds - reserve : 1);
    }
    return limit;
}

void
Dispatcher::accept_some()
{
    for (int i = 0; i < kAcceptsPerWake; i++) {
        int fd = accept4(listen_fd_, nullptr, nullptr,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS
                || errno == ENOMEM)
            {
                /* out of descriptors: the listener rests (it stays
                   readable and would spin the loop), and says so once */
                auto now = std::chrono::steady_clock::now();
                if (now - accept_warned_ > std::chrono::seconds(10)) {
                    accept_warned_ = now;
                    log(Level::error, "accept(): %s; new connections wait",
                        std::strerror(errno));
                }
                accept_rest_until_ = now + std::chrono::milliseconds(100);
            } else if (errno != EAGAIN && errno != EWOULDBLOCK
                       && errno != EINTR && errno != ECONNABORTED)
            {
                log(Level::error, "accept(): %s", std::strerror(errno));
            }
            return;
        }

        if (clients_.size() >= max_clients()) {
            log(Level::warn, "%zu connections open; refusing another",
                clients_.size());
            close(fd);
            continue;
        }

        auto c = std::make_unique<Client>();
        c->fd = fd;
        c->id = next_id_++;
        if (next_id_ == 0) {
            next_id_ = 1;           /* 0 means "no client" in a channel */
        }
        clients_[c->id] = std::move(c);
    }
}

bool
Dispatcher::check_header(Client &c)
{
    if (c.have_header || c.in.size() < LLMGW_FRAME_HEADER_LEN) {
        return true;
    }

    char err[160];
    const auto *p = reinterpret_cast<const uint8_t *>(c.in.data());

    if (llmgw_frame_decode(p, opts_.max_frame, &c.hdr, err, sizeof(err)) != 0) {
        close_client(c, err);
        return false;
    }

    if (c.hdr.type & LLMGW_FRAME_REPLY) {
        close_client(c, "a reply frame sent to the helper");
        return false;
    }

    c.have_header = true;
    return true;
}

void
Dispatcher::read_from(Client &c)
{
    while (!c.frame_ready()) {
        size_t want = kReadChunk;
        if (c.have_header) {
            want = LLMGW_FRAME_HEADER_LEN + c.hdr.length - c.in.size();
            want = want < kReadChunk ? want : kReadChunk;
        }

        int rc = read_more(c.fd, &c.in, want);

        if (rc <= 0) {
            if (rc < 0) {
                /* EOF or reset: the client went away; nothing to answer */
                close_client(c, nullptr);
            }
            return;
        }

        if (!check_header(c)) {
            return;
        }
    }
}

/* Takes the frames already buffered, one at a time: a pipelined header is
   looked at only once the reply to the previous frame is out. */
void
Dispatcher::advance(Client &c)
{
    unsigned id = c.id;

    while (clients_.count(id) != 0 && !c.busy() && check_header(c)
           && c.frame_ready())
    {
        take_frame(c);
    }
}

void
Dispatcher::take_frame(Client &c)
{
    size_t len = LLMGW_FRAME_HEADER_LEN + c.hdr.length;

    if (c.hdr.type == LLMGW_FRAME_STATUS) {
        /* answered here: the runtime's state shows even when every
           worker is busy */
        c.out = reply_frame(c.hdr, status_reply());
        c.out_off = 0;
        c.in.erase(0, len);
        c.have_header = false;
        flush(c);
        return;
    }

    if (stopping_) {
        close_client(c, nullptr);
        return;
    }

    std::string plugin = plugin_of(c.hdr.type,
        std::string_view(c.in).substr(LLMGW_FRAME_HEADER_LEN, c.hdr.length));
    Queue &q = queues_[plugin];

    q.waiting.push_back(c.id);
    c.queued = true;
    c.queued_turn = turn_;
    queued_++;

    if (!q.in_ring) {
        q.in_ring = true;
        ring_.push_back(std::move(plugin));
    }
}

void
Dispatcher::flush(Client &c)
{
    if (send_rest(c.fd, &c.out, &c.out_off) < 0) {
        close_client(c, nullptr);
    }
}

void
Dispatcher::close_client(Client &c, const char *why)
{
    if (why != nullptr) {
        log(Level::warn, "connection %u closed: %s", c.id, why);
    }
    if (c.queued) {
        queued_--;                  /* its queue entry is skipped later */
    }
    close(c.fd);
    clients_.erase(c.id);           /* c is gone from here on */
}

/* ---- the queues ---- */

int
Dispatcher::idle_slot() const
{
    for (size_t i = 0; i < channels_.size(); i++) {
        const Channel &ch = channels_[i];
        if (ch.alive && ch.fd >= 0 && !ch.running) {
            return static_cast<int>(i);
        }
    }
    return -1;
}

/* The oldest waiting client of q still connected; entries of clients that
   went away are dropped on the way. */
Dispatcher::Client *
Dispatcher::next_waiting(Queue &q)
{
    while (!q.waiting.empty()) {
        auto it = clients_.find(q.waiting.front());
        if (it != clients_.end() && it->second->queued) {
            return it->second.get();
        }
        q.waiting.pop_front();
    }
    return nullptr;
}

void
Dispatcher::dispatch()
{
    if (stopping_) {
        return;
    }

    for (;;) {
        int slot = idle_slot();
        bool progress = false;

        for (size_t n = ring_.size(); slot >= 0 && n > 0 && !progress; n--) {
            std::string plugin = std::move(ring_.front());
            ring_.pop_front();

            Queue &q = queues_[plugin];
            Client *c = next_waiting(q);

            if (c == nullptr) {
                q.in_ring = false;
                tidy(plugin);
                continue;
            }

            if (q.occupied >= cap_) {
                ring_.push_back(std::move(plugin));
                continue;
            }

            q.waiting.pop_front();
            c->queued = false;
            queued_--;
            progress = true;

            /* a call that waited: its caller may have given up meanwhile
               (one just read is still wanted) */
            if (c->queued_turn != turn_ && peer_gone(c->fd)) {
                /* nginx gave up on the call (its timeout closes the
                   connection) while it waited: nothing to run */
                close_client(*c, nullptr);
            } else {
                start(slot, *c, plugin);
            }

            if (next_waiting(q) != nullptr) {
                ring_.push_back(std::move(plugin));
            } else {
                q.in_ring = false;
                tidy(plugin);
            }
        }

        if (!progress) {
            return;
        }
    }
}

void
Dispatcher::start(int slot, Client &c, const std::string &plugin)
{
    Channel &ch = channels_[slot];
    size_t len = LLMGW_FRAME_HEADER_LEN + c.hdr.length;

    if (c.in.size() == len) {
        ch.out = std::move(c.in);
        c.in.clear();
    } else {
        ch.out.assign(c.in, 0, len);
        c.in.erase(0, len);
    }
    ch.out_off = 0;
    ch.req = c.hdr;
    ch.started = std::chrono::steady_clock::now();
    ch.running = true;
    ch.client = c.id;
    ch.plugin = plugin;
    ch.in.clear();

    c.have_header = false;
    c.running = true;

    queues_[plugin].occupied++;
    write_channel(slot);
}

void
Dispatcher::release(const std::string &plugin)
{
    auto it = queues_.find(plugin);

    if (it != queues_.end()) {
        it->second.occupied--;
        tidy(plugin);
    }
}

void
Dispatcher::tidy(const std::string &plugin)
{
    auto it = queues_.find(plugin);

    if (it != queues_.end() && it->second.occupied == 0
        && !it->second.in_ring && it->second.waiting.empty())
    {
        queues_.erase(it);
    }
}

/* ---- the workers' channels ---- */

void
Dispatcher::attach(int slot, int fd, pid_t pid)
{
    Channel &ch = channels_[slot];

    if (ch.charged) {
        ch.charged = false;
        release(ch.plugin);
    }

    ch = Channel {};
    ch.fd = fd;
    ch.pid = pid;
    ch.alive = true;

    dispatch();
}

void
Dispatcher::write_channel(int slot)
{
    Channel &ch = channels_[slot];

    if (ch.fd >= 0 && send_rest(ch.fd, &ch.out, &ch.out_off) < 0) {
        /* the worker is gone: detach() answers the call */
        close(ch.fd);
        ch.fd = -1;
    }
}

void
Dispatcher::read_channel(int slot)
{
    Channel &ch = channels_[slot];
    char err[160];

    while (ch.fd >= 0) {
        /* a channel carries one frame at a time: whatever is there is
           the reply's, so it is read in as few calls as it came */
        size_t old = ch.in.size();
        size_t want = old < LLMGW_FRAME_HEADER_LEN
                      ? kReadChunk
                      : std::min(LLMGW_FRAME_HEADER_LEN + ch.reply.length - old,
                                 kReadChunk);

        int rc = read_more(ch.fd, &ch.in, want);

        if (rc <= 0) {
            if (rc < 0) {
                /* the worker ended: detach() answers what it was running */
                close(ch.fd);
                ch.fd = -1;
            }
            return;
        }

        if (old < LLMGW_FRAME_HEADER_LEN
            && ch.in.size() >= LLMGW_FRAME_HEADER_LEN)
        {
            const auto *p = reinterpret_cast<const uint8_t *>(ch.in.data());

            if (!ch.running) {
                break_channel(slot, "a frame nobody asked for");
                return;
            }
            if (llmgw_frame_decode(p, opts_.max_frame, &ch.reply, err,
                                   sizeof(err)) != 0)
            {
                break_channel(slot, err);
                return;
            }
            if (ch.reply.type != (LLMGW_FRAME_REPLY | ch.req.type)
                || ch.reply.request_id != ch.req.request_id)
            {
                break_channel(slot, "a reply to another frame");
                return;
            }
        }

        if (ch.in.size() > LLMGW_FRAME_HEADER_LEN + ch.reply.length) {
            break_channel(slot, "more than its reply");
            return;
        }

        if (ch.in.size() == LLMGW_FRAME_HEADER_LEN + ch.reply.length) {
            deliver(slot);
            return;                 /* nothing more comes before a frame */
        }
    }
}

/* A worker broke the protocol: a bug, not the plugin's doing.  The worker
   is ended; its call is answered as the runtime's failure at detach(). */
void
Dispatcher::break_channel(int slot, const char *why)
{
    Channel &ch = channels_[slot];

    log(Level::error, "worker %d (pid %d): %s; ending it", slot,
        static_cast<int>(ch.pid), why);
    kill(ch.pid, SIGKILL);
    close(ch.fd);
    ch.fd = -1;
    ch.in.clear();
}

void
Dispatcher::deliver(int slot)
{
    Channel &ch = channels_[slot];
    auto it = clients_.find(ch.client);

    if (it != clients_.end()) {
        Client &c = *it->second;
        c.out = std::move(ch.in);
        c.out_off = 0;
        c.running = false;
        flush(c);
        if (clients_.count(ch.client) != 0) {
            advance(c);
        }
    }

    ch.in.clear();
    ch.running = false;
    ch.client = 0;
    release(ch.plugin);
    ch.plugin.clear();

    if (stopping_ && ch.fd >= 0) {
        shutdown(ch.fd, SHUT_WR);       /* the worker reads EOF and ends */
    }

    dispatch();
}

void
Dispatcher::detach(int slot, int status)
{
    Channel &ch = channels_[slot];

    ch.alive = false;               /* nothing more is started on it */

    /* a reply written just before the end is still delivered */
    if (ch.fd >= 0) {
        read_channel(slot);
    }
    if (ch.fd >= 0) {
        close(ch.fd);
        ch.fd = -1;
    }

    if (ch.running) {
        answer_death(ch, slot, status);
        ch.running = false;
        ch.client = 0;
        ch.charged = true;              /* until attach() */
    }

    ch.in.clear();
    ch.out.clear();
    ch.out_off = 0;
    ch.pid = 0;
}

/*
 * The worker died while it ran a call.  When the call ended it (it ignored
 * its deadline, exhausted memory V8 could not give, or crashed the
 * process), that is the plugin's failure, and the caller is told so like
 * any other hook failure.  Ended from outside (SIGKILL, SIGTERM), it is the
 * runtime's trouble: the connection is closed, as when the helper is down.
 */
void
Dispatcher::answer_death(Channel &ch, int slot, int status)
{
    const char *kind = nullptr;
    std::string message;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;

    if (code == kExitStuck) {
        kind = "timeout";
        message = "the hook ran past its deadline and ignored termination; "
                  "its worker was replaced";
    } else if (code == kExitOutOfMemory) {
        kind = "memory";
        message = "the hook ran out of memory; its worker was replaced";
    } else if (code == kExitFatal) {
        kind = "plugin";
        message = "the hook caused a fatal error in the plugin runtime; "
                  "its worker was replaced";
    } else if (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL
               || sig == SIGFPE || sig == SIGABRT || sig == SIGTRAP
               || sig == SIGSYS)
    {
        kind = "plugin";
        message = "the hook crashed its worker (signal " + std::to_string(sig)
                  + "); the worker was replaced";
    }

    log(Level::warn, "worker %d ended during a call of plugin %.16s: %s",
        slot, ch.plugin.empty() ? "(unreadable)" : ch.plugin.c_str(),
        kind != nullptr ? kind : "its connection is closed");

    auto it = clients_.find(ch.client);
    if (it == clients_.end()) {
        return;
    }

    Client &c = *it->second;
    c.running = false;

    if (kind == nullptr) {
        close_client(c, nullptr);
        return;
    }

    c.out = reply_frame(ch.req, error_reply(kind, message));
    c.out_off = 0;
    flush(c);
    if (clients_.count(ch.client) != 0) {
        advance(c);
    }
}

/* ---- the loop's side ---- */

void
Dispatcher::fill(std::vector<pollfd> *pfds)
{
    watched_.clear();

    if (!stopping_
        && std::chrono::steady_clock::now() >= accept_rest_until_)
    {
        watched_.push_back({ Watch::listener, 0, listen_fd_ });
        pfds->push_back({ listen_fd_, POLLIN, 0 });
    }

    for (const auto &kv : clients_) {
        const Client &c = *kv.second;
        /* a busy connection is watched for its closing only */
        short ev = c.writing() ? POLLOUT : c.busy() ? 0 : POLLIN;
        watched_.push_back({ Watch::client, c.id, c.fd });
        pfds->push_back({ c.fd, ev, 0 });
    }

    for (size_t i = 0; i < channels_.size(); i++) {
        const Channel &ch = channels_[i];
        if (ch.fd >= 0) {
            short ev = POLLIN;
            if (ch.out_off < ch.out.size()) {
                ev |= POLLOUT;
            }
            watched_.push_back({ Watch::channel, static_cast<unsigned>(i),
                                 ch.fd });
            pfds->push_back({ ch.fd, ev, 0 });
        }
    }
}

void
Dispatcher::handle(const pollfd *pfds, size_t n)
{
    bool accept = false;

    turn_++;

    for (size_t i = 0; i < n && i < watched_.size(); i++) {
        const Watch &w = watched_[i];
        short re = pfds[i].revents;

        if (re == 0) {
            continue;
        }

        if (w.what == Watch::listener) {
            accept = (re & POLLIN) != 0;
            continue;
        }

        if (w.what == Watch::channel) {
            Channel &ch = channels_[w.id];
            if (ch.fd != w.fd) {
                continue;               /* detached meanwhile */
            }
            if (re & POLLOUT) {
                write_channel(static_cast<int>(w.id));
            }
            if (re & (POLLIN | POLLHUP | POLLERR)) {
                read_channel(static_cast<int>(w.id));
            }
            continue;
        }

        auto it = clients_.find(w.id);
        if (it == clients_.end()) {
            continue;
        }
        Client &c = *it->second;

        if (c.writing()) {
            if (re & (POLLOUT | POLLHUP | POLLERR)) {
                flush(c);
                if (clients_.count(w.id) != 0) {
                    advance(c);
                }
            }
        } else if (c.busy()) {
            if (re & (POLLHUP | POLLERR)) {
                /* gone while its call waits or runs: a queued call is
                   not started, a running one's reply is dropped */
                close_client(c, nullptr);
            }
        } else {
            read_from(c);
            if (clients_.count(w.id) != 0) {
                advance(c);
            }
        }
    }

    if (accept) {
        accept_some();
    }

    if (stopping_) {
        std::vector<Client *> idle;
        for (auto &kv : clients_) {
            if (!kv.second->busy()) {
                idle.push_back(kv.second.get());
            }
        }
        for (Client *c : idle) {
            close_client(*c, nullptr);
        }
    }

    dispatch();
}

void
Dispatcher::forget_after_fork()
{
    for (auto &kv : clients_) {
        std::string().swap(kv.second->in);
        std::string().swap(kv.second->out);
    }
    clients_.clear();
    for (Channel &ch : channels_) {
        std::string().swap(ch.in);
        std::string().swap(ch.out);
    }
    queues_.clear();
    ring_.clear();
}

/* The worker's own watchdog ends it 2 s after the deadline. */
constexpr int64_t kReclaimAfterMs = 5000;

void
Dispatcher::reclaim_stuck()
{
    /* the worker's watchdog ends a call at its deadline, and a worker
       that ignores termination a few seconds later: this is for one that
       cannot even do that */
    auto limit = std::chrono::milliseconds(opts_.deadline_ms + kReclaimAfterMs);
    auto now = std::chrono::steady_clock::now();

    for (size_t i = 0; i < channels_.size(); i++) {
        Channel &ch = channels_[i];
        if (ch.running && ch.alive && ch.pid > 0 && !ch.reclaimed
            && now - ch.started > limit)
        {
            log(Level::warn, "worker %zu (pid %d) is still running a call "
                "of plugin %.16s %d ms past its deadline: killed", i,
                static_cast<int>(ch.pid), ch.plugin.c_str(),
                static_cast<int>(kReclaimAfterMs));
            ch.reclaimed = true;
            kill(ch.pid, SIGKILL);
        }
    }
}

int64_t
Dispatcher::wait_limit_ms() const
{
    return std::chrono::steady_clock::now() < accept_rest_until_ ? 100 : 1000;
}

void
Dispatcher::stop()
{
    stopping_ = true;

    std::vector<Client *> closing;
    for (auto &kv : clients_) {
        if (!kv.second->running && !kv.second->writing()) {
            closing.push_back(kv.second.get());
        }
    }
    for (Client *c : closing) {
        close_client(*c, nullptr);
    }

    ring_.clear();
    for (auto &kv : queues_) {
        kv.second.waiting.clear();
        kv.second.in_ring = false;
    }

    for (Channel &ch : channels_) {
        if (ch.fd >= 0 && !ch.running) {
            shutdown(ch.fd, SHUT_WR);
        }
    }
}

bool
Dispatcher::drained() const
{
    for (const auto &kv : clients_) {
        if (kv.second->running || kv.second->writing()) {
            return false;
        }
    }
    return true;
}

std::string
Dispatcher::status_reply() const
{
    std::vector<std::string> running(channels_.size());

    for (size_t i = 0; i < channels_.size(); i++) {
        if (channels_[i].running) {
            running[i] = channels_[i].plugin;
        }
    }

    return stats_reply(stats_, store_ != nullptr ? store_->count() : 0,
                       running, queued_);
}

}  // namespace v8host
