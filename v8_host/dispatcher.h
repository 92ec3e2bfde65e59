/*
 * The supervisor's side of every connection.  nginx's connections end in
 * the supervisor, never in a worker: it reads their frames, answers STATUS
 * itself, and hands each LOAD and CALL to an idle worker over that
 * worker's channel, then passes the reply back.  Calls wait in one queue
 * per plugin (its sha); plugins take turns for the next idle worker
 * (round robin), a plugin's calls go oldest first, and one plugin occupies
 * at most --plugin-workers workers at once, so a plugin whose hooks run
 * into the deadline slows only its own calls.
 */

#ifndef V8HOST_DISPATCHER_H
#define V8HOST_DISPATCHER_H

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <poll.h>
#include <sys/types.h>

#include "llmgw.h"
#include "options.h"
#include "source_store.h"
#include "stats.h"

namespace v8host {

class Dispatcher {
public:
    Dispatcher(const Options &o, int listen_fd, SharedStats *stats,
               SourceStore *store);
    ~Dispatcher();

    Dispatcher(const Dispatcher &) = delete;
    Dispatcher &operator=(const Dispatcher &) = delete;

    /* A worker started in slot; fd is the supervisor's end of its
       channel (the dispatcher closes it). */
    void attach(int slot, int fd, pid_t pid);

    /* The worker of slot ended with this wait status: the call it was
       running is answered (the plugin's fault) or its connection closed
       (the runtime's), and the plugin keeps the slot until the next
       attach. */
    void detach(int slot, int status);

    /* Appends the descriptors to watch; handle() takes them back, in the
       same order, after poll(). */
    void fill(std::vector<pollfd> *pfds);
    void handle(const pollfd *pfds, size_t n);

    /* Shutting down: nothing more is accepted or started; queued calls
       have their connections closed, running ones are answered, and each
       worker's channel is shut once it is idle. */
    void stop();

    /* The longest the loop may sleep: a resting listener (out of
       descriptors) is looked at again soon; running calls are checked
       against their deadline. */
    int64_t wait_limit_ms() const;

    /* A worker still running a call well past the deadline (stopped,
       wedged: its own watchdog did not end it) is killed. */
    void reclaim_stuck();

    /* In a worker just forked: the frames the supervisor held are freed
       (large ones go back to the system), so that a worker started while
       big frames wait does not carry them for its lifetime. */
    void forget_after_fork();

    /* Nothing is running or left to write to a client. */
    bool drained() const;

private:
    /* A connection from nginx: one frame at a time, answered in order. */
    struct Client {
        int            fd;
        unsigned       id;
        std::string    in;
        bool           have_header = false;
        llmgw_frame_t  hdr {};
        bool           queued = false;      /* its frame waits for a worker */
        unsigned       queued_turn = 0;     /* the loop turn it was queued in */
        bool           running = false;     /* ... or a worker runs it */
        std::string    out;
        size_t         out_off = 0;

        bool frame_ready() const {
            return have_header
                   && in.size() >= LLMGW_FRAME_HEADER_LEN + hdr.length;
        }
        bool writing() const { return out_off < out.size(); }
        bool busy() const { return queued || running || writing(); }
    };

    /* The supervisor's end of a worker's socketpair. */
    struct Channel {
        int            fd = -1;
        pid_t          pid = 0;
        bool           alive = false;       /* attached, not yet detached */
        bool           running = false;     /* a frame sent, no reply yet */
        unsigned       client = 0;          /* 0: the client went away */
        std::string    plugin;              /* running, or charged while
                                               the slot is down */
        bool           charged = false;
        bool           reclaimed = false;   /* killed as stuck */
        llmgw_frame_t  req {};              /* the frame running */
        std::chrono::steady_clock::time_point  started {};
        llmgw_frame_t  reply {};            /* its reply's header */
        std::string    out;
        size_t         out_off = 0;
        std::string    in;
    };

    struct Queue {
        std::deque<unsigned>  waiting;      /* client ids, oldest first */
        int                   occupied = 0; /* workers running its calls or
                                               down since one died in one */
        bool                  in_ring = false;
    };

    /* What each descriptor fill() handed out stands for. */
    struct Watch {
        enum { listener, client, channel } what;
        unsigned  id;                       /* client id or slot */
        int       fd;
    };

    void accept_some();
    size_t max_clients() const;
    void read_from(Client &c);
    bool check_header(Client &c);
    void advance(Client &c);
    void take_frame(Client &c);
    void flush(Client &c);
    void close_client(Client &c, const char *why);

    void dispatch();
    int idle_slot() const;
    Client *next_waiting(Queue &q);
    void start(int slot, Client &c, const std::string &plugin);
    void release(const std::string &plugin);
    void tidy(const std::string &plugin);

    void write_channel(int slot);
    void read_channel(int slot);
    void deliver(int slot);
    void break_channel(int slot, const char *why);
    void answer_death(Channel &ch, int slot, int status);

    std::string status_reply() const;

    const Options                                       &opts_;
    int                                                  listen_fd_;
    SharedStats                                         *stats_;
    SourceStore                                         *store_;
    int                                                  cap_;
    bool                                                 stopping_ = false;
    unsigned                                             next_id_ = 1;
    size_t                                               queued_ = 0;
    std::unordered_map<unsigned, std::unique_ptr<Client>> clients_;
    std::vector<Channel>                                 channels_;
    std::unordered_map<std::string, Queue>               queues_;
    std::deque<std::string>                              ring_;
    std::vector<Watch>                                   watched_;
    unsigned                                             turn_ = 0;
    std::chrono::steady_clock::time_point                accept_rest_until_ {};
    std::chrono::steady_clock::time_point                accept_warned_ {};
};

}  // namespace v8host

#endif
