/*
 * The hook runner of one worker: loads plugin modules into their own
 * contexts, keeps them by sha (LRU), calls hooks with frozen JSON
 * arguments under the deadline and the heap cap, and classifies every
 * failure as the plugin's (shown, cleaned of secrets), a timeout, the
 * memory cap, or internal (logged, generic message).
 */

#ifndef V8HOST_RUNTIME_H
#define V8HOST_RUNTIME_H

#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine.h"
#include "source_store.h"
#include "watchdog.h"

namespace v8host {

struct Plugin;      /* a loaded module: runtime.cpp */

struct Limits {
    int     deadline_ms;
    int     heap_mb;
    size_t  max_frame;
};

enum class Outcome {
    ok, not_loaded, plugin, timeout, memory, internal, bad_request,
};

struct CallRequest {
    std::string               sha;
    std::string               source;       /* instead of sha: load first */
    bool                      has_source = false;
    std::string               hook;         /* "parseTaskResult",
                                               "native.decode", ... */
    std::string               args_json;    /* a JSON array */
    int                       deadline_ms = 0;   /* 0: the default */
    std::vector<std::string>  capabilities;
};

/* Plugins kept per worker; the least recently used one goes first. */
constexpr size_t kMaxPlugins = 64;

class Runtime {
public:
    /* store: shared with the other workers; may be nullptr. */
    Runtime(const Limits &limits, SourceStore *store);
    ~Runtime();

    Runtime(const Runtime &) = delete;
    Runtime &operator=(const Runtime &) = delete;

    /* Reply bodies (JSON text). */
    std::string load(std::string_view source, Outcome *outcome);
    std::string call(const CallRequest &req, Outcome *outcome);

    size_t plugins() const { return lru_.size(); }

private:
    std::string load_in_isolate(std::string_view source,
                                const std::string &sha, Outcome *outcome);
    std::string load_once(std::string_view source, const std::string &sha,
                          bool json_clone, Plugin *out, Outcome *outcome);
    /* spent_ms: what compiling the plugin for this frame took already */
    std::string call_in_isolate(Plugin &p, const CallRequest &req,
                                Outcome *outcome, int spent_ms);
    Outcome settle(bool fired, bool failed, bool terminated);
    std::string failure_reply(Outcome o, const std::string &what,
                              int budget_ms, const std::string &message,
                              bool list_errors);
    /* after_call: also when plugins keep over half the heap (not after a
       load, whose plugin is about to be called) */
    void replace_engine_if_needed(bool after_call);
    void remember(Plugin &&p);

    Limits                     limits_;
    SourceStore               *store_;
    Watchdog                   watchdog_;
    std::unique_ptr<Engine>    engine_;
    /* After engine_: plugins hold handles that must go before the isolate. */
    std::list<Plugin>          lru_;
    std::unordered_map<std::string, std::list<Plugin>::iterator>  index_;
};

}  // namespace v8host

#endif
