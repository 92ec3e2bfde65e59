/*
 * The task engine (see task.h): the submit, query and poll flows as state
 * machines without I/O.
 *
 * Submit: decode (native routes) -> model, origin and channel checks ->
 * price -> extractUsage -> reserve -> buildSubmitRequest -> descriptor
 * checks -> send (JSON or an SSE stream read event by event) ->
 * parseSubmitResponse -> extractUsageOnSubmit -> (an immediate result:
 * extractUsageOnComplete) -> the task row and its ledger rows in one
 * statement -> render.  A retryable failure before the vendor accepted the
 * submit moves to the next channel; nothing is retried after that.
 *
 * Poll: buildQueryRequest (or buildBatchQueryRequest) -> send -> classify
 * the HTTP status as the contract's table says -> parseTaskResult (or
 * parseBatchResult) -> extractUsageOnComplete at SUCCESS -> one update
 * statement that settles or refunds exactly once.
 */

#include "task.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "inbound.h"
#include "internal.h"
#include "ssedelta.h"
#include "taskprice.h"

using namespace llmgw;

namespace {

constexpr size_t kMaxTaskBody = 1024 * 1024;     /* persisted data, events */
constexpr size_t kMaxTaskText = 1024;  /* a fail reason, a progress: cut */
constexpr size_t kErrBody = LLMGW_ERROR_BODY_MAX;  /* kept of an error body */
/* creates of a task the vendor took, sent again while the database cannot
   be reached: about 30 s of an outage with llmgw_pg_timeout's default */
constexpr int kCreateTries = 6;
/* how long parseSubmitResponse waits for a plugin runtime that is down or
   busy once the vendor took the submit (a runtime worker that hangs is
   replaced after llmgw_v8host_timeout's default and 5 s), and between tries */
constexpr int64_t kRuntimeWaitMs = 30000;
constexpr int64_t kRuntimeRetryMs = 1000;
/* a poll that timed out this close to the end of its request's wait was
   ended by the wait (nginx's clock lags the engine's by a little) */
constexpr int64_t kWaitSlackMs = 250;

const char *const kStatuses[] = {
    "NOT_START", "SUBMITTED", "QUEUED", "IN_PROGRESS", "SUCCESS", "FAILURE",
    "UNKNOWN"
};

bool
known_status(std::string_view s)
{
    for (const char *k : kStatuses) {
        if (s == k) {
            return true;
        }
    }
    return false;
}

bool
terminal(std::string_view s)
{
    return s == "SUCCESS" || s == "FAILURE";
}

/* Persisted data and state are at most 1 MiB each, encoded; nothing is
   cut (spec, Limits).  Any JSON value: a scalar counts as well. */
bool
over_task_limit(const json_t *v)
{
    return v != nullptr
           && json_dumpb(v, nullptr, 0, JSON_COMPACT | JSON_ENCODE_ANY)
              > kMaxTaskBody;
}

/* A submit answer that the next channel may do better with (contract
   facts: 429 and 5xx except 504; the vendor did not take the task). */
bool
retryable_status(int s)
{
    return s == 429 || (s >= 500 && s != 504);
}

json_t *
jstr(std::string_view s)
{
    return json_stringn(s.data(), s.size());
}

/* A result's progress as stored: a string (cut to kMaxTaskText), a number
   as a percentage; nullptr for anything else. */
Json
progress_of(const json_t *p)
{
    if (json_is_string(p)) {
        std::string_view v(json_string_value(p), json_string_length(p));
        return Json(jstr(utf8_prefix(v, kMaxTaskText)));
    }
    if (json_is_number(p)) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%g%%", json_number_value(p));
        return Json(json_string(buf));
    }
    return nullptr;
}

std::string
public_task_id()
{
    static const char alnum[] =
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    unsigned char raw[24];

    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        throw std::runtime_error("no randomness");
    }

    std::string id = "task_";
    for (unsigned char b : raw) {
        id += alnum[b % 62];
    }
    return id;
}

/* Splits a path into segments ("/a/b/" -> a, b). */
std::vector<std::string_view>
segments(std::string_view path)
{
    std::vector<std::string_view> out;
    size_t i = 0;

    while (i < path.size()) {
        while (i < path.size() && path[i] == '/') {
            i++;
        }
        size_t j = path.find('/', i);
        if (j == std::string_view::npos) {
            j = path.size();
        }
        if (j > i) {
            out.push_back(path.substr(i, j - i));
        }
        i = j;
    }

    return out;
}

/* A route path parameter: ":name" or "{name}"; its name, else empty. */
std::string_view
param_name(std::string_view seg)
{
    if (seg.size() > 1 && seg.front() == ':') {
        return seg.substr(1);
    }
    if (seg.size() > 2 && seg.front() == '{' && seg.back() == '}') {
        return seg.substr(1, seg.size() - 2);
    }
    return {};
}

/* Matches a route pattern; params collects {name: value} when given. */
bool
path_match(std::string_view pattern, std::string_view path, json_t *params)
{
    auto p = segments(pattern);
    auto s = segments(path);

    if (p.size() != s.size()) {
        return false;
    }

    for (size_t i = 0; i < p.size(); i++) {
        std::string_view name = param_name(p[i]);

        if (name.empty()) {
            if (p[i] != s[i]) {
                return false;
            }
        } else if (params != nullptr) {
            json_object_setn_new(params, name.data(), name.size(), jstr(s[i]));
        }
    }

    return true;
}

/*
 * Whether route pattern a is more specific than b, for a path both match:
 * at the first segment where one is a literal and the other a parameter,
 * the literal wins.  So a route forced over another plugin's ("/:x/submit"
 * beside "/acme/submit") never takes the paths the other names.
 */
bool
more_specific(std::string_view a, std::string_view b)
{
    auto x = segments(a);
    auto y = segments(b);

    for (size_t i = 0; i < x.size() && i < y.size(); i++) {
        bool px = !param_name(x[i]).empty();
        bool py = !param_name(y[i]).empty();

        if (px != py) {
            return py;
        }
    }

    return false;
}

bool
exports_has(const json_t *manifest, std::string_view name)
{
    size_t   i;
    json_t  *e;

    json_array_foreach(json_object_get(manifest, "exports"), i, e) {
        if (json_is_string(e) && json_string_value(e) == name) {
            return true;
        }
    }
    return false;
}

std::string
upper(std::string_view s)
{
    std::string out(s);
    for (char &c : out) {
        if (c >= 'a' && c <= 'z') {
            c = static_cast<char>(c - 'a' + 'A');
        }
    }
    return out;
}

/* Any JSON value (state and bodies may be scalars); null when unreadable. */
Json
json_any(const char *data, size_t len)
{
    json_error_t e;
    json_t *j = json_loadb(data ? data : "", len,
                           JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    return Json(j != nullptr ? j : json_null());
}

/* The body a parse hook sees: JSON when it parses, else the text. */
json_t *
body_value(std::string_view body)
{
    json_error_t e;
    json_t *j = json_loadb(body.data(), body.size(),
                           JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    return j != nullptr ? j : jstr(utf8_prefix(body, body.size()));
}

/*
 * The task's data after a parse result (a TaskResult of v1.d.ts, from a
 * poll or a submit's immediate): its "data" member replaces the old data,
 * else its other members are merged into it.  nullptr: the data stays.
 */
json_t *
result_data(const json_t *r, const json_t *old)
{
    json_t *data = json_object_get(r, "data");

    if (data != nullptr) {
        return json_incref(data);
    }

    Json rest(json_object());
    const char *k;
    json_t *v;

    json_object_foreach(const_cast<json_t *>(r), k, v) {
        std::string_view key(k);
        if (key != "status" && key != "progress" && key != "reason"
            && key != "state" && key != "taskId")
        {
            json_object_set(rest.get(), k, v);
        }
    }

    if (json_object_size(rest.get()) == 0) {
        return nullptr;
    }

    json_t *merged = json_is_object(old) ? json_deep_copy(old)
                                         : json_object();
    json_object_update(merged, rest.get());
    return merged;
}


/* The pieces of a claimed or looked-up task row the engine uses. */
struct TaskRow {
    Json         row;
    std::string  task_id, upstream_id, plugin, model, upstream_model, action;
    std::string  status;
    int64_t      channel_id = 0;
    int64_t      failures = 0;
    int64_t      quota = 0;
    double       group_ratio = 1.0;
};

TaskRow
task_row(json_t *row)
{
    TaskRow t;

    t.row = Json(json_incref(row));
    t.task_id = json_str(row, "task_id");
    t.upstream_id = json_str(row, "upstream_task_id");
    t.plugin = json_str(row, "plugin_key");
    t.model = json_str(row, "model");
    t.upstream_model = json_str(row, "upstream_model");
    t.action = json_str(row, "action");
    t.status = json_str(row, "status");
    t.channel_id = json_int(row, "channel_id", 0);
    t.failures = json_int(row, "poll_failures", 0);
    t.quota = json_int(row, "quota", 0);
    t.group_ratio = json_num(row, "group_ratio", 1.0);
    return t;
}

/* What renderers see of a task (no private fields). */
json_t *
task_view(const json_t *row)
{
    json_t *v = json_object();

    json_object_set_new(v, "task_id", jstr(json_str(row, "task_id")));
    json_object_set_new(v, "status", jstr(json_str(row, "status")));

    for (const char *k : { "progress", "fail_reason" }) {
        json_t *x = json_object_get(row, k);
        json_object_set_new(v, k, json_is_string(x) ? json_incref(x)
                                                     : json_string(""));
    }

    for (const char *k : { "created_at", "updated_at", "finished_at" }) {
        json_t *x = json_object_get(row, k);
        json_object_set_new(v, k, json_is_number(x) ? json_incref(x)
                                                     : json_null());
    }

    json_t *d = json_object_get(row, "data");
    json_object_set_new(v, "data", d ? json_incref(d) : json_null());

    json_t *p = json_object_get(row, "properties");
    if (json_is_object(p)) {
        json_object_set(v, "properties", p);
    }

    return v;
}

/* The generic API's view: the renderer's view plus model, action, plugin. */
json_t *
api_view(const json_t *row)
{
    json_t *v = task_view(row);

    json_object_set_new(v, "model", jstr(json_str(row, "model")));
    json_object_set_new(v, "action", jstr(json_str(row, "action")));
    std::string_view plugin = json_str(row, "plugin_key");
    json_object_set_new(v, "plugin",
                        jstr(plugin.empty() ? json_str(row, "plugin") : plugin));
    return v;
}

/* A member of a parsed client body: of its JSON value, or the first value
   of a form or multipart field. */
json_t *
body_member(const json_t *dbody, const char *k)
{
    const json_t *value = json_object_get(dbody, "value");

    if (value != nullptr) {
        return json_object_get(value, k);
    }
    return json_array_get(json_object_get(json_object_get(dbody, "fields"),
                                          k), 0);
}

/* Whether a parsed client body may hold a request: a JSON object, a form
   or multipart fields; not nothing, nor a JSON array, string, number or
   null (the model endpoints answer those invalid_json too). */
bool
json_object_body(const json_t *dbody)
{
    std::string_view kind = json_str(dbody, "kind");

    return kind == "json" ? json_is_object(json_object_get(dbody, "value"))
                          : kind != "none";
}

struct HookReply {
    bool         ok = false;
    Json         result;
    std::string  kind, message;

    /* The call failed through the plugin's own doing: it threw, returned
       what cannot be read, ran past its deadline or out of memory.  Any
       other failure is the runtime's (down, restarting, busy, or no answer
       within llmgw_v8host_timeout). */
    bool plugin_fault() const
    {
        return !ok && (kind == "plugin" || kind == "timeout"
                       || kind == "memory");
    }
};

HookReply
hook_reply(int rc, const char *reply, size_t len)
{
    HookReply h;

    if (rc != 0) {
        /* 1: the call returned more than the gateway takes, the plugin's
           doing; else the runtime failed */
        h.kind = rc == 1 ? "plugin" : "internal";
        h.message = std::string(reply ? reply : "", len);
        return h;
    }

    Json r = json_parse(reply, len);

    if (!json_is_object(r.get())) {
        /* a whole reply the runtime wrote for this call: what the hook
           returned is what cannot be read (the runtime refuses results
           nested too deeply itself) */
        json_error_t jerr;
        Json again(json_loadb(reply, len, JSON_DECODE_ANY, &jerr));

        h.kind = "plugin";
        h.message = std::string("its result cannot be read (")
                    + (again ? "not a reply object" : jerr.text) + ")";
        return h;
    }

    if (json_is_true(json_object_get(r.get(), "ok"))) {
        h.ok = true;
        h.result = Json(json_incref(json_object_get(r.get(), "result")));
        if (!h.result) {
            h.result = Json(json_null());
        }
        return h;
    }

    json_t *e = json_object_get(r.get(), "error");
    h.kind = json_str(e, "kind");
    h.message = json_str(e, "message");
    if (h.message.empty()) {
        h.message = "the hook failed";
    }
    return h;
}

} /* namespace */


/* ------------------------------------------------------------------ */

struct llmgw_tjob_s {
    enum Mode { REQUEST, POLL } mode = REQUEST;

    enum Phase {
        START,
        /* request */
        DECODED, LOOKED_UP_QUERY, ORIGINS, CHANNEL, USAGE, RESERVED,
        BUILT, SENT, STREAMING, EVENT, PARSED, SUBMIT_USAGE, FINAL_USAGE,
        CREATED, RENDERED, ERROR_RENDERED, RUNTIME_SLEPT,
        REFUSED,            /* refused before the job: native.error */
        /* a request waiting for its task */
        WAIT_SLEPT, WAIT_CLAIMED, WAIT_LOOKED, WAIT_RELEASED, DOWNLOADED,
        /* artifacts */
        ART_LOOKED, ART_LISTED, CONTENT_BUILT, PIPED,
        /* host_responses */
        RESP_ARTIFACTS, RESP_FINAL, RESP_EVENTS, EMITTED,
        /* a created task failed and refunded: its render failed */
        VOIDED,
        /* poll */
        POLL_BUILD, POLL_BUILT, POLL_SENT, POLL_PARSED, POLL_USAGE,
        POLL_SAVE, POLL_SAVED,
        FINISHED
    } phase = START;

    const llmgw_snapshot_t  *snap = nullptr;
    llmgw_task_conf_t        conf {};
    llmgw_tstep_t            step {};
    bool                     busy = false;

    /* step storage */
    std::string              step_body, step_sql, param[4];
    llmgw_outbound_t         out {};
    bool                     have_out = false;

    /* the plugin */
    long                     plugin = -1;
    const json_t            *manifest = nullptr;
    SnapPluginInfo           pinfo {};
    std::string              sha;
    const json_t            *route = nullptr;   /* meta.routes entry */
    llmgw_troute_e           route_kind = LLMGW_TROUTE_NONE;
    llmgw_tproto_e           proto = LLMGW_TPROTO_NONE;
    std::string              protocol;          /* host_video, host_image */
    Json                     proto_view;        /* the task it renders */
    /* host_image: waiting for the task, polling it in between */
    std::chrono::steady_clock::time_point wait_start;
    bool                     waiting = false;
    /* the vendor accepted the submit (a 2xx answer, an event stream) */
    bool                     submit_taken = false;
    /* the vendor's answer waiting for the runtime (kRuntimeWaitMs) */
    std::chrono::steady_clock::time_point runtime_wait_start;
    bool                     runtime_waiting = false;
    Phase                    runtime_phase = START;
    bool                     wait_over = false;  /* a poll ran to its end */
    bool                     in_request_poll = false;
    /* the wait ended while its poll called a hook: the client has its
       504 (early_*), and the poll goes on without it */
    bool                     wait_answered = false;
    std::string              early_body;
    llmgw_tstep_t            early_step {};
    /* a failure from here fails and refunds the task this request created
       (its result was not rendered); voided once that was asked */
    bool                     void_on_fail = false;
    bool                     voided = false;
    /* host_image with response_format b64_json: the answer, its downloads */
    Json                     image_out;
    size_t                   download_at = 0;
    std::chrono::steady_clock::time_point download_start;
    bool                     downloading = false;

    /* artifacts: the task, the key asked for, the answer's head */
    Json                     art_row;
    std::string              artifact_key;
    std::string              origin;
    bool                     signed_link = false;
    bool                     pipe_redirect = false;
    std::string              pipe_error;
    std::vector<std::string> pipe_hdrs;        /* name, value, ... */

    /* host_responses: the request's mode, a stream's progress */
    bool                     resp_stream = false;
    bool                     resp_background = false;
    bool                     made_background = false;  /* the task read */
    bool                     emitting = false;   /* the stream's head sent */
    bool                     stream_done = false;
    bool                     arts_injected = false;
    Json                     resp_state;
    std::string              last_rendered;      /* the view last rendered */
    std::string              producer_version;

    /* the client request */
    std::string              method, path, args, content_type, request_id;
    std::string_view         body;        /* the caller's, see task.h */
    std::string              headers_json, group;
    const llmgw_token_t     *token = nullptr;
    double                   group_ratio = 1.0;
    uint64_t                 seed = 0;
    llmgw_inbound_t         *inbound = nullptr;
    Json                     decode_ctx, intent, request_body, files;
    std::string              model, action, upstream_model, task_id;
    std::string              query_id;          /* GET by id */
    Json                     origins;           /* OriginTask list */
    int64_t                  pinned_channel = 0;

    /* channels */
    const llmgw_channel_t   *channels[16] {};
    size_t                   nchannels = 0, current = 0;
    /* the submit's tries, for the log: where it last went, and as what */
    const llmgw_channel_t   *sent_channel = nullptr;
    std::string              sent_model;
    unsigned                 tries = 0;
    std::string_view         base_url;
    const json_t            *channel_settings = nullptr;
    Json                     driver_ctx;

    /* billing */
    const json_t            *price = nullptr;
    Json                     schema;
    Json                     usage;
    int64_t                  quota_reserve = 0, quota_submit = -1;
    int64_t                  final_quota = -1;
    bool                     reserved = false, charged = false;

    /* the vendor's answer */
    int                      redirects = 0;
    int                      http_status = 0;
    Json                     http_headers;
    std::string              http_body;
    Json                     submit;            /* parseSubmitResponse */
    Json                     immediate;         /* final at once */
    Json                     started;           /* an immediate result the
                                                   task goes on from */
    Json                     task_data;         /* the row's, after */
    Json                     task_state;        /* an immediate result */
    Json                     created;           /* the task row */
    Json                     unkept;            /* the result the row lacks */

    /* an SSE submit */
    bool                     sse = false, sse_delta = false;
    bool                     stream_ok = false, stream_ended = false;
    bool                     stream_cancelled = false;
    std::string              stream_error;
    llmgw_sse_t             *sse_parser = nullptr;
    llmgw_sse_acc_t         *acc = nullptr;
    std::deque<std::string>  events;
    Json                     sse_state;
    Json                     sse_body;

    /* an error being answered */
    int                      err_status = 0;
    std::string              err_type, err_code, err_message;
    Json                     err_body;          /* upstream error contract */

    /* polling */
    std::string              owner;
    std::vector<TaskRow>     tasks;
    bool                     batch = false;
    Json                     results;           /* per task, by index */
    Json                     updates;
    size_t                   usage_at = 0;      /* next SUCCESS to price */
    /* a batch save that failed is saved task by task; an update the
     * database refuses becomes a counted poll failure */
    size_t                   save_at = 0;
    bool                     save_single = false;
    bool                     save_refused = false;
    int                      create_tries = 0;   /* sent again */
    std::string              poll_reason;

    HookReply                hook;

    /* results of the other steps */
    Json                     sql_result;
    std::string              sql_error;
    std::string              send_error;
    std::string              transport_error;
    bool                     transport_timeout = false;
    bool                     transport_sent = false;
    llmgw_verdict_t          reserve_refusal {};
    bool                     multi_query = false;
    Json                     origin_ids;
    bool                     phase_after_cancel = false;
    int64_t                  sse_idle_ms = 30000;

  public:
    /* what the caller may log after a poll job */
    bool                     auth_warning = false;
    std::vector<std::string> poll_log;

    ~llmgw_tjob_s()
    {
        if (have_out) {
            llmgw_outbound_free(&out);
        }
        if (inbound != nullptr) {
            llmgw_inbound_free(inbound);
        }
        if (sse_parser != nullptr) {
            llmgw_sse_free(sse_parser);
        }
        if (acc != nullptr) {
            llmgw_sse_acc_free(acc);
        }
    }

    /* ---- steps ---- */

    const llmgw_tstep_t *emit(llmgw_tstep_e kind)
    {
        if (kind == LLMGW_TSTEP_DONE && in_request_poll) {
            /* a poll made while a request waits: the request goes on,
               unless it was answered while the poll went on */
            in_request_poll = false;
            mode = REQUEST;
            return wait_answered ? image_wait() : wait_look();
        }
        step.kind = kind;
        if ((kind == LLMGW_TSTEP_HTTP || kind == LLMGW_TSTEP_HOOK)
            && in_request_poll)
        {
            /* a poll made while a request waits ends with the wait (a
               hook's answer is awaited without the client) */
            step.deadline_ms = std::max<int64_t>(wait_left_ms(), 1);
        }
        busy = kind != LLMGW_TSTEP_WAIT && kind != LLMGW_TSTEP_SLEEP
               && kind != LLMGW_TSTEP_RESPOND
               && kind != LLMGW_TSTEP_DONE && kind != LLMGW_TSTEP_HTTP_CANCEL
               && !(kind == LLMGW_TSTEP_HTTP && sse_mode_step);
        return &step;
    }

    bool sse_mode_step = false;

    /* Milliseconds since *start, set by the first call (*started). */
    static int64_t waited_ms(bool *started,
        std::chrono::steady_clock::time_point *start)
    {
        auto now = std::chrono::steady_clock::now();

        if (!*started) {
            *started = true;
            *start = now;
        }
        return std::chrono::duration_cast<std::chrono::milliseconds>(
                   now - *start).count();
    }

    /* What is left of llmgw_task_wait_timeout for a waiting request. */
    int64_t wait_left_ms() const
    {
        auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - wait_start)
                          .count();
        return conf.wait_ms - waited;
    }

    /* A pause of ms, then the step of phase next. */
    const llmgw_tstep_t *sleep_then(int64_t ms, Phase next)
    {
        step = llmgw_tstep_t {};
        step.amount = ms;
        phase = next;
        return emit(LLMGW_TSTEP_SLEEP);
    }

    const llmgw_tstep_t *call(const char *hook_name, json_t *args_steal,
        Phase next)
    {
        Json args(args_steal);
        Json frame(json_object());

        json_object_set_new(frame.get(), "sha", json_string(sha.c_str()));
        json_object_set_new(frame.get(), "hook", json_string(hook_name));
        json_object_set(frame.get(), "args", args.get());

        json_t *caps = json_object_get(manifest, "requiredCapabilities");
        if (json_is_array(caps) && json_array_size(caps) > 0) {
            json_object_set(frame.get(), "capabilities", caps);
        }

        step_body = json_dump(frame.get());
        hook_name_ = hook_name;
        return send_hook(next);
    }

    /* the hook call in step_body, sent (again) */
    const llmgw_tstep_t *send_hook(Phase next)
    {
        step = llmgw_tstep_t {};
        step.sha = sha.c_str();
        step.body = str(step_body);
        step.channel_id = channel_id();
        phase = next;
        return emit(LLMGW_TSTEP_HOOK);
    }

    /*
     * The hook call just made, sent again in a while when the runtime was
     * down or busy (not the plugin's fault) and kRuntimeWaitMs have not
     * passed since the first such failure; else nullptr.  For the calls
     * after the vendor took a submit: giving up would leave a task the
     * vendor works on (and bills) that nobody saves, polls or charges.
     */
    const llmgw_tstep_t *await_runtime()
    {
        if (hook.ok || (hook.kind != "internal" && hook.kind != "not_loaded")) {
            return nullptr;
        }

        int64_t waited = waited_ms(&runtime_waiting, &runtime_wait_start);
        if (waited >= kRuntimeWaitMs) {
            return nullptr;
        }

        runtime_phase = phase;
        return sleep_then(std::min(kRuntimeRetryMs, kRuntimeWaitMs - waited),
                          RUNTIME_SLEPT);
    }

    std::string hook_name_;

    const llmgw_tstep_t *sql(const char *text, Phase next, int nparams,
        int learn)
    {
        step_sql = text;
        step = llmgw_tstep_t {};
        step.sql = step_sql.c_str();
        step.nparams = nparams;
        for (int i = 0; i < nparams; i++) {
            step.params[i] = param[i].c_str();
        }
        step.learn = learn;
        phase = next;
        return emit(LLMGW_TSTEP_SQL);
    }

    int64_t channel_id() const
    {
        if (mode == POLL) {
            return tasks.empty() ? 0 : tasks[0].channel_id;
        }
        return current < nchannels ? channels[current]->id : 0;
    }

    /* ---- answering ---- */

    const llmgw_tstep_t *respond(int status, const std::string &text)
    {
        step_body = text;
        step = llmgw_tstep_t {};
        step.status = status;
        step.body = str(step_body);
        step.channel_id = channel_id();
        phase = FINISHED;
        return emit(LLMGW_TSTEP_RESPOND);
    }

    const llmgw_tstep_t *respond_json(int status, const json_t *j)
    {
        return respond(status, json_dump(j));
    }

    /* Refuses in the error contract, or through the plugin's native.error
     * on its own routes. */
    const llmgw_tstep_t *fail(int status, const char *type, const char *code,
        std::string message)
    {
        err_status = status;
        err_type = type;
        err_code = code;
        err_message = std::move(message);

        if (void_on_fail && created && !voided) {
            /* a finished task is voided (sql/028); one still running (a
               stream's render failed before its end) fails as a poll
               would fail it: either way FAILURE and refunded */
            voided = true;
            param[0] = task_id;
            param[1] = std::string(utf8_prefix(
                "the result could not be rendered: " + err_message, 1000));
            return sql("with v as (select llmgw_task_void($1, $2) as r) "
                       "select case when (r ->> 'voided')::boolean then r "
                       "else (select u || jsonb_build_object('voided', "
                       "u -> 'applied' ? $1) from llmgw_task_update(null, "
                       "jsonb_build_array(jsonb_build_object('task_id', $1, "
                       "'status', 'FAILURE', 'fail_reason', $2))) as u) end "
                       "from v", VOIDED, 2, 1);
        }

        return error_answer();
    }

    /* A submit's non-2xx answer, which may quote the channel key. */
    const llmgw_tstep_t *fail_upstream(int status, std::string_view body_text)
    {
        const char *key = current < nchannels ? channels[current]->key : "";
        llmgw_buf_t b = llmgw_upstream_error_json(status, body_text.data(),
                                                  body_text.size(), str(key),
                                                  str(request_id));
        Json j = json_parse(b.data, b.len);
        llmgw_buf_free(&b);

        json_t *e = json_object_get(j.get(), "error");
        err_status = status;
        err_type = "upstream_error";
        err_code = std::string(json_str(e, "code"));
        err_message = std::string(json_str(e, "message"));

        /* the message already ends with the request id */
        std::string suffix = " (request id: " + request_id + ")";
        if (err_message.size() >= suffix.size()
            && err_message.compare(err_message.size() - suffix.size(),
                                   suffix.size(), suffix) == 0)
        {
            err_message.resize(err_message.size() - suffix.size());
        }

        return error_answer();
    }

    const llmgw_tstep_t *error_answer()
    {
        if (route_kind == LLMGW_TROUTE_NATIVE && manifest != nullptr
            && exports_has(manifest, "native.error") && decode_ctx
            && phase != ERROR_RENDERED)
        {
            json_t *info = json_object();
            json_object_set_new(info, "code", jstr(err_code));
            json_object_set_new(info, "message", jstr(err_message));
            json_object_set_new(info, "httpStatus", json_integer(err_status));
            json_object_set_new(info, "retryable",
                                json_boolean(err_status == 429
                                             || err_status >= 500));
            json_t *a = json_array();
            json_array_append(a, decode_ctx.get());
            json_array_append_new(a, info);
            return call("native.error", a, ERROR_RENDERED);
        }

        return contract_error();
    }

    const llmgw_tstep_t *contract_error()
    {
        llmgw_buf_t b = llmgw_error_json(str(err_message), str(err_type),
                                         str(err_code), str(request_id));
        std::string text(b.data ? b.data : "", b.len);
        llmgw_buf_free(&b);

        if (emitting) {
            /* a stream under way ends with the error as its last event */
            Json e = json_parse(text.data(), text.size());
            json_t *err = json_object_get(e.get(), "error");
            json_object_set_new(err, "type", json_string("error"));
            json_object_set_new(err, "status", json_integer(err_status));
            json_object_set_new(err, "error_type", jstr(err_type));
            return respond(200, "event: error\ndata: " + json_dump(err)
                                + "\n\n");
        }

        return respond(err_status, text);
    }

    const llmgw_tstep_t *plugin_failed(const char *what)
    {
        std::string m = hook_name_ + " failed";
        if (what != nullptr) {
            m = what;
        }
        if (hook.kind == "timeout") {
            m += ": the hook ran past its deadline";
        } else if (hook.kind == "memory") {
            m += ": the hook ran out of memory";
        } else if (hook.kind == "internal" || hook.kind == "not_loaded"
                   || hook.kind == "bad_request")
        {
            if (submit_taken && !charged) {
                /* a retry would start a second task at the vendor */
                return fail(502, "gateway_error", "plugin_unavailable",
                            "the plugin runtime could not read the vendor's "
                            "answer to the submit"
                            + (runtime_waiting
                               ? " within "
                                 + std::to_string(kRuntimeWaitMs / 1000)
                                 + " s"
                               : std::string())
                            + ": the vendor may have started the task, "
                            "which is neither saved nor charged");
            }
            if (charged && !task_id.empty()
                && !(void_on_fail && created && !voided))
            {
                return fail(502, "gateway_error", "plugin_unavailable",
                            "the plugin runtime is unavailable; task "
                            + task_id + " goes on, and is settled when it "
                            "ends");
            }
            return fail(502, "gateway_error", "plugin_unavailable",
                        "the plugin runtime is unavailable; retry shortly");
        } else if (!hook.message.empty()) {
            m += ": " + hook.message;
        }
        return fail(500, "gateway_error", "plugin_error", m);
    }

    /* extractUsage's facts priced into *into (no facts price too: the
     * per-call price); nullptr, or the refusal to answer. */
    const llmgw_tstep_t *take_usage(int64_t *into)
    {
        std::string err;
        int64_t q = 0;

        if (!hook.ok) {
            return plugin_failed(nullptr);
        }
        if (!usage_quota(hook.result.get(), &q, err)) {
            return fail(500, "gateway_error", "plugin_error",
                        hook_name_ + ": " + err);
        }
        *into = q;
        return nullptr;
    }

    /*
     * A usage hook's facts once the vendor has accepted the task: it is
     * created whatever the hook did, since the vendor works on it (and
     * bills for it) already.  A hook that fails, or facts the schema
     * refuses, leave *into alone (the charge so far stands, as when a
     * poll's extractUsageOnComplete fails) and are noted in the error log.
     */
    void take_usage_after_submit(int64_t *into)
    {
        std::string err;
        int64_t q = 0;

        bool waited = runtime_waiting;
        runtime_waiting = false;

        if (!hook.ok && !hook.plugin_fault()) {
            poll_log.push_back(task_id + ": " + hook_name_ + ": the plugin "
                               "runtime was unavailable"
                               + (waited ? " for "
                                           + std::to_string(kRuntimeWaitMs
                                                            / 1000) + " s"
                                         : std::string())
                               + " (" + hook.message
                               + "); the charge so far stands");
            return;
        }
        if (!hook.ok) {
            err = hook.kind == "timeout" ? "the hook ran past its deadline"
                : hook.kind == "memory" ? "the hook ran out of memory"
                : hook.message;
            poll_log.push_back(task_id + ": " + hook_name_ + " failed: " + err
                               + "; the charge so far stands");
            return;
        }
        if (!usage_quota(hook.result.get(), &q, err)) {
            poll_log.push_back(task_id + ": " + hook_name_ + ": " + err
                               + "; the charge so far stands");
            return;
        }
        if (!json_is_null(hook.result.get())) {
            *into = q;
        }
    }

    /*
     * A hook failed during a poll.  The plugin's failure (it threw, ran out
     * of time or memory) counts against the tasks; the runtime being down
     * or busy is the host's trouble and does not: the tasks are simply
     * polled again next time, so an outage cannot fail them all.
     */
    const llmgw_tstep_t *hook_failed_while_polling()
    {
        if (hook.plugin_fault()) {
            return fail_all(hook_name_ + " failed: "
                            + (hook.kind == "plugin" ? hook.message
                                                     : hook.kind));
        }

        poll_log.push_back(hook_name_ + ": the plugin runtime is unavailable ("
                           + hook.message + "); polled again later");
        return poll_save();
    }

    /* Every task of a poll job failed this time for one reason. */
    const llmgw_tstep_t *fail_all(const std::string &reason)
    {
        for (size_t i = 0; i < tasks.size(); i++) {
            poll_failure(i, reason);
        }
        return poll_save();
    }

    /* ---- the machine ---- */

    const llmgw_tstep_t *next();
    const llmgw_tstep_t *next_request();
    const llmgw_tstep_t *next_poll();

    /* request helpers */
    const llmgw_tstep_t *start_request();
    const llmgw_tstep_t *image_wait();
    const llmgw_tstep_t *image_download();
    const llmgw_tstep_t *image_downloaded();
    std::string wait_timeout() const;
    const llmgw_tstep_t *answer_wait_now();
    int64_t download_left_ms();
    void download_failed(const std::string &why);
    const llmgw_tstep_t *wait_claimed();
    const llmgw_tstep_t *wait_look();
    const llmgw_tstep_t *wait_looked();
    const llmgw_tstep_t *start_protocol();
    bool protocol_reads(const json_t *row) const;
    const llmgw_tstep_t *protocol_decode(json_t *dbody);
    bool protocol_takes(std::string_view kind) const;
    const llmgw_tstep_t *protocol_body_refused();
    const llmgw_tstep_t *responses_mode(const json_t *dbody);
    const llmgw_tstep_t *responses_render();
    const llmgw_tstep_t *responses_hook();
    const llmgw_tstep_t *responses_artifacts();
    const llmgw_tstep_t *responses_final();
    const llmgw_tstep_t *responses_events();
    const llmgw_tstep_t *responses_emitted();
    const llmgw_tstep_t *responses_answer(json_t *obj);
    void response_members(json_t *obj);
    json_t *pending_response();
    json_t *artifact_task_arg(const json_t *view);
    void note_row(const json_t *row)
    {
        producer_version = std::string(json_str(row, "plugin_version"));
        made_background = json_is_true(json_object_get(row, "background"));
        if (action.empty()) {
            action = std::string(json_str(row, "action"));
        }
    }
    const llmgw_tstep_t *start_artifacts();
    const llmgw_tstep_t *artifacts_looked();
    const llmgw_tstep_t *artifacts_listed(const json_t *list);
    const llmgw_tstep_t *content_built();
    const llmgw_tstep_t *piped();
    const llmgw_tstep_t *pipe(bool again);
    int pipe_head(int status, const llmgw_str_t *names,
        const llmgw_str_t *values, size_t n, llmgw_tpipe_head_t *head);

    /* The task asked for is not the caller's to see (or not there). */
    const llmgw_tstep_t *task_not_found()
    {
        return fail(404, "gateway_error", "task_not_found",
                    "task " + shown(utf8_prefix(query_id, 100))
                    + " not found");
    }

    /* The caller's task by its public id (a lookup statement). */
    const llmgw_tstep_t *lookup(const std::string &id, Phase next)
    {
        Json ids(json_array());
        json_array_append_new(ids.get(), jstr(id));
        param[0] = std::to_string(llmgw_token_user_id(token));
        param[1] = json_dump_pg(ids.get());
        return sql("select llmgw_task_lookup($1::bigint, $2::jsonb)", next,
                   2, 0);
    }

    /* The model a request or an intent names: nullptr, or the refusal. */
    const llmgw_tstep_t *take_model(const json_t *m)
    {
        if (m == nullptr || json_is_null(m)
            || (json_is_string(m) && json_string_length(m) == 0))
        {
            return fail(400, "gateway_error", "model_not_specified",
                        "Model name not specified");
        }

        if (!json_is_string(m)) {
            return fail(400, "gateway_error", "invalid_request",
                        "model must be a string");
        }

        /* the whole name, a NUL in it too: a name no channel serves */
        model.assign(json_string_value(m), json_string_length(m));

        if (model.size() > kMaxModelName) {
            return fail(400, "gateway_error", "invalid_request",
                        "model: a model name has at most "
                        + std::to_string(kMaxModelName) + " bytes");
        }
        return nullptr;
    }
    const llmgw_tstep_t *render_protocol(json_t *view);

    /* The route's renderer over a task view (or a list of them). */
    const llmgw_tstep_t *render_native(json_t *view_steal)
    {
        std::string renderer(json_str(route, "render"));
        json_t *a = json_array();
        json_array_append(a, decode_ctx.get());
        json_array_append_new(a, view_steal);
        return call(("native." + renderer).c_str(), a, RENDERED);
    }

    /*
     * The request that follows a redirect answer to out, checked against
     * the same rules (content: a content request's): out becomes it; else
     * false and err says why.
     */
    bool follow_redirect(int status, std::string_view location, bool content,
        std::string &err)
    {
        llmgw_desc_policy_t p;
        std::vector<llmgw_str_t> hosts;
        std::vector<llmgw_file_t> f;
        llmgw_outbound_t nxt {};
        char e[512];

        policy(p, hosts, f, mode == REQUEST && !content, content);

        if (llmgw_descriptor_redirect(&out, status, str(location), &p, &nxt,
                                      e, sizeof(e)) != 0)
        {
            err = std::string("redirect refused: ") + e;
            return false;
        }

        llmgw_outbound_free(&out);
        out = nxt;
        redirects++;
        return true;
    }
    const llmgw_tstep_t *protocol_rendered();
    json_t *native_ctx();
    const llmgw_tstep_t *after_intent();
    const llmgw_tstep_t *choose_channel();
    const llmgw_tstep_t *extract_usage();
    const llmgw_tstep_t *build_submit();
    const llmgw_tstep_t *send(const char *what, bool content = false);
    const llmgw_tstep_t *after_send();
    bool another_channel(bool retryable) const;
    bool retains() const;
    const llmgw_tstep_t *next_channel();
    const llmgw_tstep_t *transport_failed();
    const llmgw_tstep_t *parse_submit(json_t *body);
    const llmgw_tstep_t *after_parse();
    const llmgw_tstep_t *after_submit_usage();
    const llmgw_tstep_t *create_task();
    const llmgw_tstep_t *render_created();
    json_t *created_view(bool api);
    void redact_hook_result();
    const llmgw_tstep_t *stream_next();
    const llmgw_tstep_t *answer_query(json_t *rows);

    json_t *build_driver_ctx();
    json_t *channel_ctx(const llmgw_channel_t *c, std::string_view url,
        const json_t *settings, json_t *into);
    bool usage_quota(const json_t *facts, int64_t *quota, std::string &err);
    void policy(llmgw_desc_policy_t &p, std::vector<llmgw_str_t> &hosts,
        std::vector<llmgw_file_t> &f, bool submit, bool content);

    /* poll helpers */
    const llmgw_tstep_t *poll_build();
    const llmgw_tstep_t *poll_sent();
    const llmgw_tstep_t *poll_parsed();
    const llmgw_tstep_t *poll_usage();
    const llmgw_tstep_t *poll_save();
    const llmgw_tstep_t *poll_save_one();
    const llmgw_tstep_t *poll_saved();
    json_t *query_ctx(const TaskRow &t);
    json_t *unchanged(const TaskRow &t) const;
    void poll_failure(size_t i, const std::string &reason);
    void poll_result(size_t i, const json_t *result, bool parse_2xx);
    void poll_terminal(size_t i, const char *status, const std::string &reason);
};


/* ------------------------------------------------------------------ */
/* requests                                                            */

json_t *
llmgw_tjob_s::channel_ctx(const llmgw_channel_t *c, std::string_view url,
    const json_t *settings, json_t *ctx)
{
    (void) settings;

    std::string key = c ? c->key : "";
    bool peer = c != nullptr && c->type == 60;

    json_object_set_new(ctx, "baseUrl", jstr(url));

    json_t *auth = json_object();
    json_object_set_new(auth, "apiKey", jstr(key));
    json_object_set_new(auth, "authHeader", jstr("Bearer " + key));
    json_object_set_new(ctx, "auth", auth);
    json_object_set_new(ctx, "apiKey", jstr(key));
    json_object_set_new(ctx, "authHeader", jstr("Bearer " + key));

    json_t *up = json_object();
    json_object_set_new(up, "kind", json_string(peer ? "peer_gateway"
                                                     : "vendor"));
    json_object_set_new(ctx, "upstream", up);
    return ctx;
}


json_t *
llmgw_tjob_s::build_driver_ctx()
{
    const llmgw_channel_t *c = channels[current];
    json_t *ctx = json_object();

    json_object_set(ctx, "requestBody",
                    request_body ? request_body.get() : json_null());

    Json hdrs = json_parse(headers_json.data(), headers_json.size());
    json_object_set_new(ctx, "requestHeaders",
                        hdrs ? json_incref(hdrs.get()) : json_object());
    json_object_set_new(ctx, "action", jstr(action));
    json_object_set_new(ctx, "model", jstr(model));
    json_object_set_new(ctx, "upstreamModel", jstr(upstream_model));
    json_object_set(ctx, "files", files ? files.get() : json_array());
    json_object_set_new(ctx, "publicTaskId", jstr(task_id));

    if (origins) {
        json_object_set(ctx, "originTasks", origins.get());
    }

    return channel_ctx(c, base_url, channel_settings, ctx);
}


void
llmgw_tjob_s::policy(llmgw_desc_policy_t &p, std::vector<llmgw_str_t> &hosts,
    std::vector<llmgw_file_t> &f, bool submit, bool content)
{
    size_t   i;
    json_t  *h;

    std::memset(&p, 0, sizeof(p));

    json_array_foreach(json_object_get(manifest, "allowedHosts"), i, h) {
        if (json_is_string(h)) {
            hosts.push_back(llmgw_str_t { json_string_value(h),
                                          json_string_length(h) });
        }
    }

    const llmgw_channel_t *c = nullptr;

    if (mode == POLL) {
        c = snap_poll_channel(snap, tasks[0].channel_id, &base_url,
                              &channel_settings);
    } else {
        c = channels[current];
    }

    p.base_url = str(base_url);
    p.credential = c ? llmgw_str_t { c->key, std::strlen(c->key) }
                     : llmgw_str_t { "", 0 };
    p.allowed_hosts = hosts.data();
    p.nallowed = hosts.size();
    p.allow_sse = submit
                  && json_has_string(json_object_get(manifest, "submitResponseTypes"),
                            "sse");
    p.allow_credentialless = content;

    if (inbound != nullptr && submit) {
        const llmgw_file_t *files_p = nullptr;
        size_t n = llmgw_inbound_files(inbound, &files_p);
        f.assign(files_p, files_p + n);
    }

    p.files = f.data();
    p.nfiles = f.size();
    p.max_file_bytes = conf.max_file_bytes;
    p.max_total_bytes = conf.max_total_bytes;
}


bool
llmgw_tjob_s::usage_quota(const json_t *facts, int64_t *quota,
    std::string &err)
{
    char e[512];
    std::string facts_text = facts ? json_dump(facts) : "null";
    std::string schema_text = schema ? json_dump(schema.get()) : "{}";

    if (facts != nullptr && !json_is_null(facts)
        && llmgw_task_usage_check(schema_text.data(), schema_text.size(),
                                  facts_text.data(), facts_text.size(), e,
                                  sizeof(e)) != 0)
    {
        err = e;
        return false;
    }

    std::string entry = json_dump(price);

    if (llmgw_task_quota_schema(entry.data(), entry.size(),
                                schema_text.data(), schema_text.size(),
                                facts_text.data(), facts_text.size(),
                                group_ratio, quota, e, sizeof(e))
        != 0)
    {
        err = e;
        return false;
    }

    usage = Json(facts ? json_incref(const_cast<json_t *>(facts))
                       : json_null());
    return true;
}


/* A native route's NativeDecodeContext (v1.d.ts), its body still none. */
json_t *
llmgw_tjob_s::native_ctx()
{
    json_t *ctx = json_object();

    json_object_set_new(ctx, "method", jstr(method));
    json_object_set_new(ctx, "path", jstr(path));

    json_t *params = json_object();
    path_match(json_str(route, "path"), path, params);
    json_object_set_new(ctx, "params", params);

    llmgw_buf_t q = llmgw_query_json(str(args));
    Json qj = json_parse(q.data, q.len);
    llmgw_buf_free(&q);
    json_object_set_new(ctx, "query",
                        qj ? json_incref(qj.get()) : json_object());

    json_t *none = json_object();
    json_object_set_new(none, "kind", json_string("none"));
    json_object_set_new(ctx, "body", none);
    return ctx;
}


const llmgw_tstep_t *
llmgw_tjob_s::start_request()
{
    llmgw_verdict_t v;

    if (route_kind == LLMGW_TROUTE_GET) {
        query_id = std::string(segments(path).back());
        return lookup(query_id, LOOKED_UP_QUERY);
    }

    if (route_kind == LLMGW_TROUTE_ARTIFACTS
        || route_kind == LLMGW_TROUTE_CONTENT
        || proto == LLMGW_TPROTO_VIDEO_CONTENT)
    {
        return start_artifacts();
    }

    if (route_kind == LLMGW_TROUTE_NATIVE) {
        /* first, so that native.error shapes a refused body too: the
           body a decoder could not be given is none */
        decode_ctx = Json(native_ctx());
    }

    if (route_kind == LLMGW_TROUTE_PROTOCOL) {
        const llmgw_tstep_t *s = start_protocol();
        if (s != nullptr) {
            return s;
        }
    }

    if (route_kind == LLMGW_TROUTE_PROTOCOL && !body.empty()) {
        /* a Content-Type no endpoint takes is refused as one the
           protocol's create does not take: naming what it takes */
        const char *k = llmgw_inbound_type_kind(str(content_type));
        if (k == nullptr || !protocol_takes(k)) {
            return protocol_body_refused();
        }
    }

    inbound = llmgw_inbound_parse(str(content_type), body.data(), body.size(),
                                  conf.max_file_bytes, conf.max_total_bytes,
                                  &v);
    if (inbound == nullptr) {
        return fail(v.status, v.type, v.code, v.message);
    }

    llmgw_buf_t decoded = llmgw_inbound_json(inbound);
    Json dbody = json_parse(decoded.data, decoded.len);
    llmgw_buf_free(&decoded);

    files = Json(json_incref(json_object_get(dbody.get(), "files")));
    if (!files) {
        files = Json(json_array());
    }

    if (route_kind == LLMGW_TROUTE_PROTOCOL) {
        return protocol_decode(dbody.get());
    }

    if (route_kind == LLMGW_TROUTE_SUBMIT) {
        /* POST /v1/tasks/{pluginKey}: the body is the request body */
        if (!json_object_body(dbody.get())) {
            return fail(400, "gateway_error", "invalid_json",
                        "invalid JSON request body");
        }

        json_t *value = json_object_get(dbody.get(), "value");
        request_body = Json(json_incref(value ? value : dbody.get()));

        intent = Json(json_object());
        json_object_set_new(intent.get(), "kind", json_string("submit"));

        json_t *m = body_member(dbody.get(), "model");
        if (m != nullptr) {
            json_object_set(intent.get(), "model", m);
        }
        json_t *a = body_member(dbody.get(), "action");
        if (json_is_string(a)) {
            json_object_set(intent.get(), "action", a);
        }
        json_t *o = value ? json_object_get(value, "originTaskIds") : nullptr;
        if (o != nullptr) {
            json_object_set(intent.get(), "originTaskIds", o);
        }
        return after_intent();
    }

    /* a native route */
    json_object_set(decode_ctx.get(), "body", dbody.get());

    json_t *params = json_object_get(decode_ctx.get(), "params");
    std::string_view type = json_str(route, "type");

    if (type == "query") {
        std::string_view name = json_str(route, "taskIdParam");
        if (name.empty()) {
            name = "task_id";
        }
        query_id = std::string(json_str(params, std::string(name).c_str()));
        return lookup(query_id, LOOKED_UP_QUERY);
    }

    std::string decoder(json_str(route, "decode"));
    json_t *a = json_array();
    json_array_append(a, decode_ctx.get());
    return call(("native." + decoder).c_str(), a, DECODED);
}


/* Checks the submit intent: model, route models, key, origins. */
const llmgw_tstep_t *
llmgw_tjob_s::after_intent()
{
    llmgw_verdict_t v;

    if (!json_is_object(intent.get())) {
        return fail(500, "gateway_error", "plugin_error",
                    hook_name_ + " returned no intent object");
    }

    std::string_view kind = json_str(intent.get(), "kind");

    if (kind == "query") {
        json_t *ids = json_object_get(intent.get(), "taskIds");
        if (!json_is_array(ids)) {
            return fail(500, "gateway_error", "plugin_error",
                        hook_name_ + " returned a query without taskIds");
        }
        query_id = "";
        param[0] = std::to_string(llmgw_token_user_id(token));
        param[1] = json_dump_pg(ids);
        multi_query = true;
        return sql("select llmgw_task_lookup($1::bigint, $2::jsonb)",
                   LOOKED_UP_QUERY, 2, 0);
    }

    if (kind != "submit") {
        return fail(500, "gateway_error", "plugin_error",
                    hook_name_ + " returned an intent of unknown kind");
    }

    const llmgw_tstep_t *refused = take_model(json_object_get(intent.get(),
                                                              "model"));
    if (refused != nullptr) {
        return refused;
    }

    json_t *a = json_object_get(intent.get(), "action");
    if (a != nullptr && !json_is_null(a) && !json_is_string(a)) {
        return fail(500, "gateway_error", "plugin_error",
                    hook_name_ + " returned an action that is not a string");
    }
    action = std::string(json_str(intent.get(), "action"));

    if (route != nullptr || route_kind == LLMGW_TROUTE_PROTOCOL) {
        json_t *allowed = json_object_get(route, "models");
        if (json_is_array(allowed) && !json_has_string(allowed, model)) {
            return fail(400, "gateway_error", "invalid_request",
                        "model " + shown(model)
                        + " is not served by this route");
        }

        json_t *rb = json_object_get(intent.get(), "requestBody");
        if (rb != nullptr) {
            request_body = Json(json_incref(rb));
        } else {
            request_body = Json(json_incref(
                               json_object_get(decode_ctx.get(), "body")));
        }
    }

    if (llmgw_token_check_model(token, str(model), &v) != 0) {
        return fail(v.status, v.type, v.code, v.message);
    }

    json_t *ids = json_object_get(intent.get(), "originTaskIds");

    if (ids != nullptr && !json_is_null(ids)) {
        size_t   i;
        json_t  *id;

        if (!json_is_array(ids)) {
            return fail(400, "gateway_error", "invalid_origin_task",
                        "originTaskIds must be an array of task ids");
        }
        json_array_foreach(ids, i, id) {
            if (!json_is_string(id)) {
                return fail(400, "gateway_error",
                            "invalid_origin_task",
                            "originTaskIds must be an array of task ids");
            }
        }

        if (json_array_size(ids) > 0) {
            param[0] = std::to_string(llmgw_token_user_id(token));
            param[1] = json_dump_pg(ids);
            origin_ids = Json(json_incref(ids));
            return sql("select llmgw_task_lookup($1::bigint, $2::jsonb)",
                       ORIGINS, 2, 0);
        }
    }

    return choose_channel();
}


const llmgw_tstep_t *
llmgw_tjob_s::choose_channel()
{
    if (pinned_channel != 0) {
        const json_t *settings = nullptr;
        const llmgw_channel_t *c = snap_channel(snap, pinned_channel, nullptr,
                                                &settings);
        nchannels = 0;
        /* the origin's channel, when it still serves this model to the
           key's group: the same rules as any choice */
        if (c != nullptr
            && snap_task_channel_serves(snap, pinfo.key, manifest, model,
                                        group, c->id))
        {
            channels[nchannels++] = c;
        }
    } else {
        size_t max = std::min<size_t>(sizeof(channels) / sizeof(channels[0]),
                                      static_cast<size_t>(conf.max_tries));
        nchannels = snap_task_channels(snap, pinfo.key, manifest, model,
                                       group, seed, channels, max);
    }

    if (nchannels == 0 && pinned_channel != 0) {
        return fail(400, "gateway_error", "invalid_origin_task",
                    "the channel of the origin tasks does not serve model "
                    + shown(model) + " in group " + group);
    }

    if (nchannels == 0) {
        return fail(503, "gateway_error", "model_not_found",
                    "no available channel for model "
                    + shown(model) + " in group " + group + " (plugin "
                    + std::string(pinfo.key) + ")");
    }

    current = 0;

    /* the price: "<plugin>::<model>" first, then the model */
    price = snap_price_entry(snap, std::string(pinfo.key) + "::" + model);
    if (price == nullptr) {
        price = snap_price_entry(snap, model);
    }

    if (price == nullptr) {
        return fail(400, "gateway_error", "model_price_error",
                    "model " + shown(model)
                    + " has no price; an administrator sets one with PUT "
                    "/api/pricing (a price of 0 makes it free)");
    }

    task_id = public_task_id();
    return extract_usage();
}


/* Prepares the current channel and prices the request from extractUsage. */
const llmgw_tstep_t *
llmgw_tjob_s::extract_usage()
{
    const llmgw_channel_t *c = channels[current];

    snap_channel(snap, c->id, &base_url, &channel_settings);

    llmgw_str_t um = llmgw_channel_map_model(snap, c, str(model));
    upstream_model = std::string(sv(um));

    schema = Json(usage_schema(manifest, upstream_model, model));

    driver_ctx = Json(build_driver_ctx());

    if (exports_has(manifest, "extractUsage")) {
        json_t *a = json_array();
        json_array_append(a, driver_ctx.get());
        return call("extractUsage", a, USAGE);
    }

    hook = HookReply {};
    hook.ok = true;
    hook.result = Json(json_null());
    phase = USAGE;
    return next_request();
}


const llmgw_tstep_t *
llmgw_tjob_s::build_submit()
{
    json_t *a = json_array();
    json_array_append(a, driver_ctx.get());
    return call("buildSubmitRequest", a, BUILT);
}


/* Checks a descriptor (the hook's result) and sends it. */
const llmgw_tstep_t *
llmgw_tjob_s::send(const char *what, bool content)
{
    llmgw_desc_policy_t p;
    std::vector<llmgw_str_t> hosts;
    std::vector<llmgw_file_t> f;
    char e[512];

    policy(p, hosts, f, mode == REQUEST && !content, content);

    if (have_out) {
        llmgw_outbound_free(&out);
        have_out = false;
    }

    std::string d = json_dump(hook.result.get());

    if (llmgw_descriptor_build(d.data(), d.size(), &p, &out, e, sizeof(e))
        != 0)
    {
        send_error = std::string(what) + ": " + e;
        return nullptr;
    }

    have_out = true;
    redirects = 0;

    step = llmgw_tstep_t {};
    step.out = &out;
    step.channel_id = channel_id();
    step.resend = mode == POLL;
    sse_mode_step = mode == REQUEST && out.sse;
    step.timeout_ms = sse_mode_step ? sse_idle_ms : 0;

    if (mode == REQUEST && sent_channel != channels[current]) {
        sent_channel = channels[current];
        sent_model = upstream_model;
        tries++;
    }

    if (sse_mode_step) {
        sse = true;
        sse_delta = json_has_string(json_object_get(manifest, "requiredCapabilities"),
                           "submit-sse-delta@1");
        /* each try reads its own stream */
        if (sse_parser != nullptr) {
            llmgw_sse_free(sse_parser);
        }
        sse_parser = llmgw_sse_new(kMaxTaskBody);
        if (acc != nullptr) {
            llmgw_sse_acc_free(acc);
            acc = nullptr;
        }
        if (sse_delta) {
            acc = llmgw_sse_acc_new();
        }
    }

    return emit(LLMGW_TSTEP_HTTP);
}


const llmgw_tstep_t *
llmgw_tjob_s::after_send()
{
    /* a redirect is re-checked against the same rules */
    if (http_status >= 301 && http_status <= 308 && http_status != 304
        && http_status != 305 && http_status != 306)
    {
        const char *loc = nullptr;
        json_t *l = json_object_get(http_headers.get(), "location");
        if (json_is_array(l) && json_array_size(l) > 0) {
            loc = json_string_value(json_array_get(l, 0));
        }

        if (loc != nullptr && redirects < conf.max_redirects) {
            std::string err;

            if (!follow_redirect(http_status, loc, false, err)) {
                return fail(502, "gateway_error", "invalid_descriptor", err);
            }

            step = llmgw_tstep_t {};
            step.out = &out;
            step.channel_id = channel_id();
            phase = SENT;
            return emit(LLMGW_TSTEP_HTTP);
        }
    }

    if (http_status < 200 || http_status > 299) {
        if (another_channel(retryable_status(http_status))) {
            return next_channel();
        }
        return fail_upstream(http_status, http_body);
    }

    return parse_submit(body_value(http_body));
}


/* Whether the route keeps the results of its tasks (retainResult). */
bool
llmgw_tjob_s::retains() const
{
    if (route_kind == LLMGW_TROUTE_PROTOCOL) {
        /* an image final at once is answered inline and not kept */
        return !(protocol == "host_image" && immediate);
    }
    return !json_is_false(route ? json_object_get(route, "retainResult")
                                : nullptr);
}


/* Whether a try that failed before the vendor accepted the submit goes on
   to the next channel; a submit that names origin tasks has one. */
bool
llmgw_tjob_s::another_channel(bool retryable) const
{
    return retryable && current + 1 < nchannels && pinned_channel == 0;
}


/* The next channel's try, a JSON or SSE submit, from a clean slate. */
const llmgw_tstep_t *
llmgw_tjob_s::next_channel()
{
    current++;

    http_status = 0;
    http_body.clear();
    http_headers.reset();
    transport_error.clear();

    sse = false;
    stream_ok = false;
    stream_ended = false;
    stream_cancelled = false;
    stream_error.clear();
    events.clear();
    sse_state.reset();

    return extract_usage();
}


/* The vendor could not be reached, or did not answer in time. */
const llmgw_tstep_t *
llmgw_tjob_s::transport_failed()
{
    /* once the vendor may have the submit, trying elsewhere could make a
       second billed task */
    if (another_channel(!transport_sent && !transport_timeout)) {
        return next_channel();
    }

    return fail(transport_timeout ? 504 : 502, "upstream_error",
                "do_request_failed",
                "the task upstream could not be reached: " + transport_error);
}


const llmgw_tstep_t *
llmgw_tjob_s::parse_submit(json_t *body_steal)
{
    Json b(body_steal);
    json_t *resp = json_object();

    json_object_set_new(resp, "statusCode", json_integer(http_status));
    json_object_set(resp, "headers",
                    http_headers ? http_headers.get() : json_object());
    json_object_set(resp, "body", b.get());
    submit_taken = true;

    json_t *a = json_array();
    json_array_append(a, driver_ctx.get());
    json_array_append_new(a, resp);
    return call("parseSubmitResponse", a, PARSED);
}


const llmgw_tstep_t *
llmgw_tjob_s::after_parse()
{
    json_t *r = hook.result.get();

    if (!json_is_object(r)) {
        return fail(500, "gateway_error", "plugin_error",
                    "parseSubmitResponse must return an object");
    }

    if (json_object_get(r, "clientResponse") != nullptr) {
        return fail(500, "gateway_error", "plugin_error",
                    "parseSubmitResponse returned clientResponse, which API "
                    "v1 does not support");
    }

    json_t *tid = json_object_get(r, "taskId");
    json_t *imm = json_object_get(r, "immediate");

    if (imm != nullptr && !json_is_null(imm)) {
        std::string_view st = json_str(imm, "status");

        if (!json_is_object(imm) || !known_status(st) || st == "UNKNOWN") {
            return fail(500, "gateway_error", "plugin_error",
                        "parseSubmitResponse: immediate must be a result "
                        "with a standard status other than UNKNOWN");
        }
        /* a status the task goes on from (the vendor took the job and
           works on it) is stored, and the task polled as any other */
        (terminal(st) ? immediate : started) = Json(json_incref(imm));
    }

    if (!immediate
        && (!json_is_string(tid) || json_string_length(tid) == 0))
    {
        return fail(500, "gateway_error", "plugin_error",
                    "parseSubmitResponse returned no taskId");
    }

    submit = Json(json_incref(r));

    /* an immediate result changes them as a poll's result would */
    task_data = Json(json_incref(json_object_get(r, "taskData")));
    task_state = Json(json_incref(json_object_get(r, "state")));

    if (immediate || started) {
        json_t *res = immediate ? immediate.get() : started.get();
        Json d(result_data(res, task_data.get()));
        if (d) {
            task_data = std::move(d);
        }
        json_t *s = json_object_get(res, "state");
        if (s != nullptr) {
            task_state = Json(json_incref(s));
        }
    }

    /*
     * What would be stored over the limit is refused as a poll's result
     * would be; here, after the vendor answered, like any other result the
     * contract does not allow: nothing is stored or charged.  The data of a
     * result final at once on a retainResult false route is not stored.
     */
    const char *big = nullptr;

    if (over_task_limit(task_data.get()) && (retains() || !immediate)) {
        big = "data";
    } else if (over_task_limit(task_state.get())) {
        big = "state";
    }

    if (big != nullptr) {
        return fail(500, "gateway_error", "plugin_error",
                    std::string("parseSubmitResponse: the task's ") + big
                    + " is larger than 1 MiB encoded (nothing is cut)");
    }

    if (exports_has(manifest, "extractUsageOnSubmit")) {
        json_t *a = json_array();
        json_array_append(a, driver_ctx.get());
        json_t *td = json_object_get(r, "taskData");
        json_array_append_new(a, td ? json_incref(td) : json_null());
        return call("extractUsageOnSubmit", a, SUBMIT_USAGE);
    }

    return after_submit_usage();
}


const llmgw_tstep_t *
llmgw_tjob_s::after_submit_usage()
{
    if (immediate
        && std::string_view(json_str(immediate.get(), "status")) == "SUCCESS"
        && exports_has(manifest, "extractUsageOnComplete"))
    {
        json_t *view = json_object();
        json_object_set_new(view, "task_id", jstr(task_id));
        json_object_set_new(view, "status", json_string("SUCCESS"));
        json_t *data = task_data.get();
        json_object_set_new(view, "data", data ? json_incref(data)
                                               : json_null());
        json_t *a = json_array();
        json_array_append_new(a, view);
        json_array_append(a, immediate.get());
        json_array_append_new(a, data ? json_incref(data) : json_null());
        return call("extractUsageOnComplete", a, FINAL_USAGE);
    }

    return create_task();
}


const llmgw_tstep_t *
llmgw_tjob_s::create_task()
{
    json_t *r = submit.get();
    Json t(json_object());

    std::string status = "SUBMITTED";
    json_t *data = task_data.get();
    json_t *state = task_state.get();
    std::string progress, reason;

    if (immediate) {
        status = std::string(json_str(immediate.get(), "status"));
        progress = status == "SUCCESS" ? "100%" : "";
        reason = std::string(json_str(immediate.get(), "reason"));
        if (status == "FAILURE" && reason.empty()) {
            reason = "the task failed";
        }
    } else if (started) {
        status = std::string(json_str(started.get(), "status"));
        Json p(progress_of(json_object_get(started.get(), "progress")));
        if (p) {
            progress = json_string_value(p.get());
        }
    }

    std::string_view upstream_id = json_str(r, "taskId");

    json_object_set_new(t.get(), "task_id", jstr(task_id));
    json_object_set_new(t.get(), "upstream_task_id", jstr(upstream_id));
    json_object_set_new(t.get(), "plugin_key", jstr(pinfo.key));
    json_object_set_new(t.get(), "plugin_version", jstr(pinfo.version));
    json_object_set_new(t.get(), "channel_id",
                        json_integer(channels[current]->id));
    json_object_set_new(t.get(), "user_id",
                        json_integer(llmgw_token_user_id(token)));
    json_object_set_new(t.get(), "token_id",
                        json_integer(llmgw_token_id(token)));
    json_object_set_new(t.get(), "request_id", jstr(request_id));
    json_object_set_new(t.get(), "action", jstr(action));
    json_object_set_new(t.get(), "model", jstr(model));
    json_object_set_new(t.get(), "upstream_model", jstr(upstream_model));
    /* a protocol's retrievals read only the tasks made through it */
    json_object_set_new(t.get(), "protocol", jstr(protocol));
    json_object_set_new(t.get(), "background", json_boolean(resp_background));

    bool retain = retains();

    /* retainResult false: a finished task's result reaches the client
       through this submit's answer only; the row keeps no data */
    if (!retain && terminal(status)) {
        unkept = Json(data ? json_incref(data) : json_null());
        data = nullptr;
    }

    json_object_set_new(t.get(), "status", jstr(status));
    json_object_set_new(t.get(), "progress", jstr(progress));
    json_object_set_new(t.get(), "fail_reason",
                        jstr(utf8_prefix(reason, kMaxTaskText)));
    json_object_set_new(t.get(), "data", data ? json_incref(data)
                                              : json_null());
    json_object_set_new(t.get(), "state", state ? json_incref(state)
                                                : json_null());

    json_object_set_new(t.get(), "retain_result", json_boolean(retain));
    json_object_set_new(t.get(), "quota_reserve", json_integer(quota_reserve));
    json_object_set_new(t.get(), "quota_submit",
                        quota_submit >= 0 ? json_integer(quota_submit)
                                          : json_null());
    json_object_set_new(t.get(), "final_quota",
                        final_quota >= 0 ? json_integer(final_quota)
                                         : json_null());
    json_object_set(t.get(), "usage", usage ? usage.get() : json_null());
    json_object_set_new(t.get(), "group_ratio", json_real(group_ratio));
    json_object_set(t.get(), "price", const_cast<json_t *>(price));
    json_object_set_new(t.get(), "poll_interval_ms",
                        json_integer(conf.poll_interval_ms));
    json_object_set_new(t.get(), "timeout_ms", json_integer(conf.timeout_ms));

    /* data and state are capped (after_parse); this bounds the rest */
    if (json_dumpb(t.get(), nullptr, 0, JSON_COMPACT) > 4 * kMaxTaskBody) {
        return fail(500, "gateway_error", "plugin_error",
                    "the task the plugin's results describe is larger than "
                    "the host keeps");
    }

    param[0] = json_dump_pg(t.get());
    return sql("select llmgw_task_create($1::jsonb)", CREATED, 1, 1);
}


/* The stored task as the submit answers it: renderers' view, or (api) the
   generic API's, with the result a retainResult false route did not store. */
json_t *
llmgw_tjob_s::created_view(bool api)
{
    json_t *row = json_object_get(created.get(), "task");
    json_t *v = api ? api_view(row) : task_view(row);

    if (unkept) {
        json_object_set(v, "data", unkept.get());
    }
    return v;
}


const llmgw_tstep_t *
llmgw_tjob_s::render_created()
{
    if (route_kind == LLMGW_TROUTE_PROTOCOL) {
        note_row(json_object_get(created.get(), "task"));
        return render_protocol(created_view(false));
    }

    if (route_kind == LLMGW_TROUTE_NATIVE) {
        return render_native(created_view(false));
    }

    Json v(created_view(true));
    return respond_json(200, v.get());
}


namespace {

/* The path a host protocol's create is posted to, for its messages. */
const char *
protocol_path(llmgw_tproto_e proto)
{
    switch (proto) {
    case LLMGW_TPROTO_IMAGE_GENERATE:
        return "/v1/images/generations";
    case LLMGW_TPROTO_IMAGE_EDIT:
        return "/v1/images/edits";
    case LLMGW_TPROTO_RESPONSES_CREATE:
        return "/v1/responses";
    default:
        return "/v1/videos";
    }
}

} /* namespace */


/*
 * Spec rule 7 and the README: every create takes JSON, image edits and
 * videos multipart too (files); never a form, which the parser reads for
 * /v1/tasks and native routes.
 */
bool
llmgw_tjob_s::protocol_takes(std::string_view kind) const
{
    return kind == "json"
           || (kind == "multipart"
               && (proto == LLMGW_TPROTO_IMAGE_EDIT
                   || proto == LLMGW_TPROTO_VIDEO_CREATE));
}


/* A body of a kind the protocol's create does not take: what it takes. */
const llmgw_tstep_t *
llmgw_tjob_s::protocol_body_refused()
{
    return fail(400, "gateway_error", "invalid_request",
                "POST " + std::string(protocol_path(proto)) + " takes a "
                + (protocol_takes("multipart")
                   ? "JSON or multipart/form-data body"
                   : "JSON body (Content-Type: application/json)"));
}


/*
 * A host protocol's request, before its body is read: the decode context
 * with the protocol's members; a retrieval looks the task up (the step),
 * else nullptr and the body is read.
 */
const llmgw_tstep_t *
llmgw_tjob_s::start_protocol()
{
    bool image = proto == LLMGW_TPROTO_IMAGE_GENERATE
                 || proto == LLMGW_TPROTO_IMAGE_EDIT;
    bool responses = proto == LLMGW_TPROTO_RESPONSES_CREATE
                     || proto == LLMGW_TPROTO_RESPONSES_GET;
    bool get = proto == LLMGW_TPROTO_VIDEO_GET
               || proto == LLMGW_TPROTO_RESPONSES_GET;

    protocol = image ? "host_image"
               : responses ? "host_responses" : "host_video";
    decode_ctx = Json(native_ctx());

    json_t *ctx = decode_ctx.get();
    json_object_set_new(ctx, "protocol", jstr(protocol));
    json_object_set_new(ctx, "operation",
                        json_string(proto == LLMGW_TPROTO_IMAGE_EDIT ? "edit"
                                    : get ? "retrieve"
                                    : responses ? "create" : "generate"));
    json_object_set_new(ctx, "model", json_string(""));
    json_object_set_new(ctx, "stream", json_false());

    if (get) {
        query_id = std::string(segments(path).back());
        json_object_set_new(json_object_get(ctx, "params"),
                            responses ? "response_id" : "video_id",
                            jstr(query_id));
        return lookup(query_id, LOOKED_UP_QUERY);
    }

    return nullptr;
}


/*
 * Whether the protocol's retrieval reads a task of the caller's (its
 * plugin and manifest already found): one made through this protocol, by
 * a plugin that still claims it for the task's model.  A task from before
 * sql/033 has no protocol recorded: the claim decides alone.
 */
bool
llmgw_tjob_s::protocol_reads(const json_t *row) const
{
    const json_t *made = json_object_get(row, "protocol");

    if (json_is_string(made) && json_string_value(made) != protocol) {
        return false;
    }
    return manifest != nullptr && snap_claims(manifest, protocol, model);
}


/*
 * The body read: the channel tried first decides the plugin (several may
 * claim one protocol for a model), whose decoder turns the request into a
 * submit intent; the model is the one the request named.
 */
const llmgw_tstep_t *
llmgw_tjob_s::protocol_decode(json_t *dbody)
{
    json_t *ctx = decode_ctx.get();

    if (!json_object_body(dbody)) {
        return fail(400, "gateway_error", "invalid_json",
                    "invalid JSON request body");
    }


    json_object_set(ctx, "body", dbody);

    const llmgw_tstep_t *refused = take_model(body_member(dbody, "model"));
    if (refused != nullptr) {
        return refused;
    }

    /* the key's model list first, as on the model endpoints: a key learns
       nothing of the channels of a model it may not use (the host keeps
       the request's model, so the check after the intent agrees) */
    llmgw_verdict_t v;
    if (llmgw_token_check_model(token, str(model), &v) != 0) {
        return fail(v.status, v.type, v.code, v.message);
    }

    plugin = snap_protocol_plugin(snap, protocol, model, group, seed);
    if (plugin == -2) {
        return fail(500, "gateway_error", "convert_request_failed",
                    "model " + shown(model)
                    + " is served only by channels that cannot take POST "
                    + std::string(protocol_path(proto)));
    }
    if (plugin < 0) {
        return fail(503, "gateway_error", "model_not_found",
                    "no available channel for model "
                    + shown(model) + " in group " + group + " ("
                    + protocol + ")");
    }

    manifest = snap_plugin(snap, static_cast<size_t>(plugin), &pinfo);
    sha = pinfo.sha;
    json_object_set_new(ctx, "model", jstr(model));

    if (protocol == "host_responses") {
        refused = responses_mode(dbody);
        if (refused != nullptr) {
            return refused;
        }
    }

    json_t *a = json_array();
    json_array_append(a, ctx);
    return call(("protocols." + protocol + ".decodeRequest").c_str(), a,
                DECODED);
}


/*
 * host_image with an asynchronous upstream: the request waits for its task,
 * polling it with the ordinary query hooks every few seconds (under a
 * lease, so never while a background poller does) until it ends or
 * llmgw_task_wait_timeout has passed: then 504 task_timeout, and the task
 * goes on and is settled by the background pollers, as it is when the
 * client leaves.
 */
const llmgw_tstep_t *
llmgw_tjob_s::image_wait()
{
    int64_t waited = waited_ms(&waiting, &wait_start);

    if (wait_over || waited >= conf.wait_ms) {
        return fail(504, "gateway_error", "task_timeout", wait_timeout());
    }

    return sleep_then(std::min<int64_t>({ conf.poll_interval_ms, 2000,
                                          conf.wait_ms - waited }),
                      WAIT_SLEPT);
}


std::string
llmgw_tjob_s::wait_timeout() const
{
    return "task " + task_id + " did not finish within "
           + std::to_string(conf.wait_ms / 1000) + " s; it goes on, and is "
           "settled when it ends";
}


/*
 * The wait ended while its poll's hook call is under way: the client is
 * answered 504 now (an image, a sync Response), and the poll goes on
 * without it (the hook's answer is saved as any poll's, and the lease
 * given back), then the job ends.
 */
const llmgw_tstep_t *
llmgw_tjob_s::answer_wait_now()
{
    /* an event stream under way ends with its error event, in order:
       after the hook */
    if (!in_request_poll || !busy || wait_answered || emitting
        || step.kind != LLMGW_TSTEP_HOOK)
    {
        return nullptr;
    }

    llmgw_buf_t b = llmgw_error_json(str(wait_timeout()),
                                     LLMGW_STR("gateway_error"),
                                     LLMGW_STR("task_timeout"),
                                     str(request_id));
    early_body.assign(b.data ? b.data : "", b.len);
    llmgw_buf_free(&b);

    wait_answered = true;
    wait_over = true;
    early_step = llmgw_tstep_t {};
    early_step.kind = LLMGW_TSTEP_RESPOND;
    early_step.status = 504;
    early_step.body = str(early_body);
    early_step.channel_id = channel_id();
    return &early_step;
}


const llmgw_tstep_t *
llmgw_tjob_s::wait_claimed()
{
    json_t *row = json_object_get(sql_result.get(), "task");

    if (!sql_error.empty() || !json_is_object(row)) {
        return image_wait();
    }

    if (terminal(json_str(row, "status"))) {
        note_row(row);
        return render_protocol(task_view(row));
    }

    if (!json_is_true(json_object_get(sql_result.get(), "claimed"))) {
        return image_wait();            /* a background poller has it */
    }

    tasks.clear();
    tasks.push_back(task_row(row));
    owner = "request:" + request_id;
    batch = json_str(manifest, "fetchMode") == "batch";
    usage_at = 0;
    save_at = 0;
    save_single = false;
    save_refused = false;
    mode = POLL;
    in_request_poll = true;
    return poll_build();
}


/* After a poll of its task: how it stands now. */
const llmgw_tstep_t *
llmgw_tjob_s::wait_look()
{
    return lookup(task_id, WAIT_LOOKED);
}


const llmgw_tstep_t *
llmgw_tjob_s::wait_looked()
{
    json_t *row = json_array_get(json_object_get(sql_result.get(), "tasks"),
                                 0);

    if (sql_error.empty() && json_is_object(row)
        && (terminal(json_str(row, "status")) || resp_stream))
    {
        note_row(row);
        return render_protocol(task_view(row));
    }

    return image_wait();
}


/* Renders a task through the protocol's render hook. */
const llmgw_tstep_t *
llmgw_tjob_s::render_protocol(json_t *view_steal)
{
    proto_view = Json(view_steal);

    if (protocol == "host_responses") {
        return responses_render();
    }

    if (protocol == "host_image") {
        std::string_view status = json_str(proto_view.get(), "status");

        if (status == "FAILURE") {
            std::string reason(json_str(proto_view.get(), "fail_reason"));
            return fail(400, "upstream_error", "task_failed",
                        reason.empty() ? "the image task failed" : reason);
        }
        if (status != "SUCCESS") {
            return image_wait();
        }
    }

    json_t *a = json_array();
    json_array_append(a, decode_ctx.get());
    json_array_append(a, proto_view.get());
    return call(("protocols." + protocol + ".render").c_str(), a, RENDERED);
}


namespace {

/* OpenAI's video statuses for the standard ones. */
const char *
video_status(std::string_view s)
{
    if (s == "SUCCESS") {
        return "completed";
    }
    if (s == "FAILURE") {
        return "failed";
    }
    if (s == "IN_PROGRESS") {
        return "in_progress";
    }
    return "queued";
}

/* "40%" -> 40; a finished task is at 100. */
json_int_t
progress_percent(const json_t *view)
{
    if (json_str(view, "status") == "SUCCESS") {
        return 100;
    }

    std::string_view p = json_str(view, "progress");
    json_int_t n = 0;
    size_t i = 0;

    while (i < p.size() && i < 3 && p[i] >= '0' && p[i] <= '9') {
        n = n * 10 + (p[i++] - '0');
    }
    return std::min<json_int_t>(n, 100);
}

json_t *
unix_seconds(const json_t *v)
{
    return json_is_number(v)
           ? json_integer(static_cast<json_int_t>(json_number_value(v)))
           : json_null();
}

} /* namespace */


/*
 * What a protocol's render returned, completed by the host.  Video: an
 * object whose standard members the host sets (and a legacy task_id
 * removed); a render that failed gives the host's own object, since the
 * task exists (and may be charged).
 */
const llmgw_tstep_t *
llmgw_tjob_s::protocol_rendered()
{
    const json_t *view = proto_view.get();
    json_t *r = hook.ok ? hook.result.get() : nullptr;

    if (proto == LLMGW_TPROTO_VIDEO_CREATE || proto == LLMGW_TPROTO_VIDEO_GET) {
        Json obj(json_is_object(r) ? json_incref(r) : json_object());
        json_t *o = obj.get();
        std::string_view status = json_str(view, "status");

        json_object_del(o, "task_id");
        json_object_set_new(o, "id", jstr(json_str(view, "task_id")));
        json_object_set_new(o, "object", json_string("video"));
        json_object_set_new(o, "model", jstr(model));
        json_object_set_new(o, "status", json_string(video_status(status)));
        json_object_set_new(o, "progress",
                            json_integer(progress_percent(view)));
        json_object_set_new(o, "created_at",
                            unix_seconds(json_object_get(view, "created_at")));
        json_object_set_new(o, "completed_at",
                            terminal(status)
                            ? unix_seconds(json_object_get(view,
                                                           "finished_at"))
                            : json_null());

        /* a render's error stands, unless it says nothing (null) */
        json_t *said = json_object_get(o, "error");

        if (status == "FAILURE" && (said == nullptr || json_is_null(said))) {
            json_t *e = json_object();
            json_object_set_new(e, "code", json_string("task_failed"));
            json_object_set_new(e, "message",
                                jstr(json_str(view, "fail_reason")));
            json_object_set_new(o, "error", e);
        }

        return respond_json(200, o);
    }

    /* host_image: {data: [{url} or {b64_json}, ...]}, created added; one
       that failed leaves the client nothing: its task is refunded */
    void_on_fail = true;

    if (!hook.ok) {
        return plugin_failed(nullptr);
    }

    json_t *data = json_object_get(r, "data");
    bool ok = json_is_object(r) && json_is_array(data);
    size_t i;
    json_t *e;

    json_array_foreach(data, i, e) {
        ok = ok && json_is_object(e)
             && (json_is_string(json_object_get(e, "url"))
                 || json_is_string(json_object_get(e, "b64_json")));
    }

    if (!ok) {
        return fail(500, "gateway_error", "plugin_error",
                    hook_name_ + " must return {data: [{url} or {b64_json}, "
                    "...]}");
    }

    void_on_fail = false;

    if (!json_is_number(json_object_get(r, "created"))) {
        json_object_set_new(r, "created",
                            json_integer(static_cast<json_int_t>(
                                std::time(nullptr))));
    }

    const json_t *rf = body_member(json_object_get(decode_ctx.get(), "body"),
                                   "response_format");

    if (json_is_string(rf)
        && std::string_view(json_string_value(rf)) == "b64_json")
    {
        image_out = Json(json_incref(r));
        download_at = 0;
        return image_download();
    }

    return respond_json(200, r);
}


/*
 * response_format b64_json: each image given by URL only is downloaded
 * (a GET without the channel's credentials, to whatever host the upstream
 * named) and its base64 added; the URL stays.  The downloads, one after
 * the other, end together within llmgw_task_http_timeout.  A download
 * that fails (or gives no bytes, or is not made in time) leaves the URL
 * alone, with a warning in the error log.
 */
const llmgw_tstep_t *
llmgw_tjob_s::image_download()
{
    json_t *data = json_object_get(image_out.get(), "data");

    for (; download_at < json_array_size(data); download_at++) {
        json_t *e = json_array_get(data, download_at);
        json_t *url = json_object_get(e, "url");

        if (!json_is_string(url)
            || json_is_string(json_object_get(e, "b64_json")))
        {
            continue;
        }

        int64_t left = download_left_ms();

        if (left <= 0) {
            download_failed("not made: the downloads took "
                            + std::to_string(conf.http_timeout_ms)
                            + " ms (llmgw_task_http_timeout) already");
            continue;
        }

        Json d(json_object());
        json_object_set(d.get(), "url", url);
        json_object_set_new(d.get(), "method", json_string("GET"));
        json_object_set_new(d.get(), "credentialless", json_true());
        hook.result = std::move(d);

        phase = DOWNLOADED;
        const llmgw_tstep_t *s = send("the image download", true);
        if (s != nullptr) {
            step.deadline_ms = left;
            return s;
        }
        download_failed(send_error);
    }

    return respond_json(200, image_out.get());
}


/* What is left of llmgw_task_http_timeout for the downloads: the first
   asks start it; without a bound, always some. */
int64_t
llmgw_tjob_s::download_left_ms()
{
    int64_t spent = waited_ms(&downloading, &download_start);

    return conf.http_timeout_ms > 0 ? conf.http_timeout_ms - spent
                                    : INT64_MAX;
}


void
llmgw_tjob_s::download_failed(const std::string &why)
{
    poll_log.push_back("downloading an image for b64_json failed (" + why
                       + "); the URL is answered as it is");
}


const llmgw_tstep_t *
llmgw_tjob_s::image_downloaded()
{
    json_t *e = json_array_get(json_object_get(image_out.get(), "data"),
                               download_at);

    const char *loc = json_string_value(json_array_get(
        json_object_get(http_headers.get(), "location"), 0));
    int64_t left = download_left_ms();

    if (transport_error.empty() && loc != nullptr
        && (http_status == 301 || http_status == 302 || http_status == 303
            || http_status == 307 || http_status == 308)
        && redirects < conf.max_redirects && left > 0)
    {
        /* followed as a content request's, each address checked again */
        std::string err;

        if (follow_redirect(http_status, loc, true, err)) {
            step = llmgw_tstep_t {};
            step.out = &out;
            step.channel_id = channel_id();
            step.resend = 1;
            phase = DOWNLOADED;
            step.deadline_ms = left;
            return emit(LLMGW_TSTEP_HTTP);
        }

        transport_error = err;
    }

    if (!transport_error.empty()) {
        download_failed(transport_error);
    } else if (http_status < 200 || http_status >= 300) {
        download_failed("HTTP " + std::to_string(http_status));
    } else if (http_body.empty()) {
        /* no image: as if it failed, rather than an empty b64_json */
        download_failed("HTTP " + std::to_string(http_status)
                        + " with no content");
    } else {
        std::string b64;
        append_base64(b64, http_body);
        json_object_set_new(e, "b64_json", jstr(b64));
    }

    download_at++;
    return image_download();
}


/* ------------------------------------------------------------------ */
/* host_responses                                                      */

namespace {

/* One event of renderEvents as SSE: {event?, id?, data} is framed as it
 * says; any other value is the data, named by its "type" when it has one. */
bool
sse_event(const json_t *e, std::string &out)
{
    const json_t *data = json_object_get(e, "data");
    bool framed = json_is_object(e) && data != nullptr;
    const char *k;
    json_t *v;

    json_object_foreach(const_cast<json_t *>(e), k, v) {
        std::string_view m(k);
        if (m != "event" && m != "id" && m != "data") {
            framed = false;
        }
    }

    std::string name, id, text;

    if (framed) {
        const json_t *ev = json_object_get(e, "event");
        const json_t *i = json_object_get(e, "id");
        if ((ev != nullptr && !json_is_string(ev))
            || (i != nullptr && !json_is_string(i)))
        {
            return false;
        }
        name = ev ? json_string_value(ev) : "";
        id = i ? json_string_value(i) : "";
        text = json_is_string(data) ? std::string(json_string_value(data))
                                    : json_dump(data);
    } else {
        if (json_is_object(e) && json_is_string(json_object_get(e, "type"))) {
            name = json_str(e, "type");
        }
        text = json_dump(e);
    }

    for (const std::string &f : { name, id }) {
        if (f.find_first_of("\r\n") != std::string::npos) {
            return false;
        }
    }

    if (!name.empty()) {
        out += "event: " + name + "\n";
    }
    if (!id.empty()) {
        out += "id: " + id + "\n";
    }

    /* one data line per line of the text, whatever ends it (CR LF, LF or
       a lone CR, as SSE readers split) */
    size_t at = 0;
    do {
        size_t nl = text.find_first_of("\r\n", at);
        out += "data: " + text.substr(at, nl == std::string::npos
                                              ? std::string::npos
                                              : nl - at) + "\n";
        if (nl == std::string::npos) {
            break;
        }
        at = nl + (text.compare(nl, 2, "\r\n") == 0 ? 2 : 1);
    } while (true);

    out += "\n";
    return true;
}

} /* namespace */


/*
 * POST /v1/responses: stream, background or sync, as the request asks;
 * one the plugin does not declare is refused naming those it does.
 */
const llmgw_tstep_t *
llmgw_tjob_s::responses_mode(const json_t *dbody)
{
    const json_t *supports = json_object_get(
        json_find_by(json_object_get(manifest, "protocols"), "name",
                     protocol),
        "supports");

    for (const char *flag : { "stream", "background" }) {
        const json_t *f = body_member(dbody, flag);
        if (f != nullptr && !json_is_null(f) && !json_is_boolean(f)) {
            return fail(400, "gateway_error", "invalid_request",
                        std::string(flag) + " must be a boolean");
        }
    }

    resp_stream = json_is_true(body_member(dbody, "stream"));
    resp_background = !resp_stream
                      && json_is_true(body_member(dbody, "background"));

    const char *mode = resp_stream ? "stream"
                       : resp_background ? "background" : "sync";

    json_object_set_new(decode_ctx.get(), "stream",
                        json_boolean(resp_stream));
    json_object_set_new(decode_ctx.get(), "background",
                        json_boolean(resp_background));

    if (json_is_true(json_object_get(supports, mode))) {
        return nullptr;
    }

    std::string forms;
    for (const char *m : { "sync", "stream", "background" }) {
        if (json_is_true(json_object_get(supports, m))) {
            forms += std::string(forms.empty() ? "" : ", ")
                     + (std::string_view(m) == "stream" ? "stream: true"
                        : std::string_view(m) == "background"
                          ? "background: true"
                          : "neither stream nor background");
        }
    }

    return fail(400, "gateway_error", "invalid_request",
                "model " + shown(model)
                + " does not support "
                + (resp_stream ? "stream: true"
                   : resp_background ? "background: true"
                                     : "requests without stream or "
                                       "background")
                + "; it supports " + forms);
}


/* The Response the host makes while a task runs (or when no hook can). */
json_t *
llmgw_tjob_s::pending_response()
{
    const json_t *view = proto_view.get();
    std::string_view status = json_str(view, "status");
    json_t *o = json_object();

    json_object_set_new(o, "id", jstr(json_str(view, "task_id")));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at",
                        unix_seconds(json_object_get(view, "created_at")));
    json_object_set_new(o, "status", json_string(video_status(status)));
    json_object_set_new(o, "model", jstr(model));
    json_object_set_new(o, "background",
                        json_boolean(resp_background || made_background));
    json_object_set_new(o, "output", json_array());

    if (status == "FAILURE") {
        json_t *e = json_object();
        json_object_set_new(e, "code", json_string("task_failed"));
        json_object_set_new(e, "message", jstr(json_str(view, "fail_reason")));
        json_object_set_new(o, "error", e);
    } else {
        json_object_set_new(o, "error", json_null());
    }

    json_object_set_new(o, "incomplete_details", json_null());
    return o;
}


/* listArtifacts' input for a task seen through its view. */
json_t *
llmgw_tjob_s::artifact_task_arg(const json_t *view)
{
    json_t *t = json_object();
    json_object_set_new(t, "taskId", jstr(json_str(view, "task_id")));
    json_object_set_new(t, "status", jstr(json_str(view, "status")));
    json_object_set_new(t, "action", jstr(action));
    json_t *d = json_object_get(view, "data");
    json_object_set_new(t, "data", d ? json_incref(d) : json_null());
    json_object_set_new(t, "producerVersion", jstr(producer_version));
    return t;
}


/*
 * A task to answer (proto_view): a retrieval or a background request
 * gets the host's pending Response until the task ends; a sync request
 * waits for the end; a stream renders every change.  A finished task's
 * artifacts are listed first, for ctx.artifacts.
 */
const llmgw_tstep_t *
llmgw_tjob_s::responses_render()
{
    const json_t *view = proto_view.get();
    bool term = terminal(json_str(view, "status"));

    if (resp_stream) {
        std::string now = json_dump(view);
        if (emitting && now == last_rendered) {
            return image_wait();                 /* nothing new */
        }
        last_rendered = now;

    } else if (!term) {
        if (proto == LLMGW_TPROTO_RESPONSES_GET || resp_background) {
            Json o(pending_response());
            return respond_json(200, o.get());
        }
        return image_wait();
    }

    if (json_str(view, "status") == "SUCCESS" && !arts_injected
        && exports_has(manifest, "listArtifacts"))
    {
        json_t *a = json_array();
        json_array_append_new(a, artifact_task_arg(view));
        return call("listArtifacts", a, RESP_ARTIFACTS);
    }

    return responses_hook();
}


const llmgw_tstep_t *
llmgw_tjob_s::responses_artifacts()
{
    std::string err;

    /* part of the render: a create's failing here leaves the client
       nothing, as its render's does */
    void_on_fail = proto == LLMGW_TPROTO_RESPONSES_CREATE;

    if (!hook.ok) {
        return plugin_failed(nullptr);
    }
    if (!artifact_list_check(hook.result.get(), err)) {
        return fail(500, "gateway_error", "plugin_error",
                    "listArtifacts " + err);
    }

    std::string_view base = sv(conf.public_address);
    if (base.empty()) {
        base = origin;
    }
    int64_t expires = static_cast<int64_t>(std::time(nullptr))
                      + conf.link_ttl_s;
    std::string id(json_str(proto_view.get(), "task_id"));

    json_t *arts = json_object();
    size_t i;
    json_t *a;

    json_array_foreach(hook.result.get(), i, a) {
        json_t *e = json_deep_copy(a);
        json_object_set_new(e, "url",
                            jstr(artifact_link(base, sv(conf.link_secret), id,
                                               json_str(a, "key"), expires)));
        json_object_set_new(arts, json_string_value(json_object_get(a, "key")),
                            e);
    }

    json_object_set_new(decode_ctx.get(), "artifacts", arts);
    arts_injected = true;
    return responses_hook();
}


/* renderFinal, or renderEvents for a stream (and for a retrieval from a
   plugin that only streams). */
const llmgw_tstep_t *
llmgw_tjob_s::responses_hook()
{
    bool events = resp_stream
                  || !exports_has(manifest,
                                  "protocols.host_responses.renderFinal");
    json_t *a = json_array();

    json_array_append(a, decode_ctx.get());
    json_array_append(a, proto_view.get());

    if (!events) {
        return call("protocols.host_responses.renderFinal", a, RESP_FINAL);
    }

    json_array_append(a, resp_stream && resp_state ? resp_state.get()
                                                   : json_null());
    return call("protocols.host_responses.renderEvents", a, RESP_EVENTS);
}


/* The host's members of a Response object: its id is the task's. */
void
llmgw_tjob_s::response_members(json_t *obj)
{
    const json_t *view = proto_view.get();
    std::string_view status = json_str(view, "status");

    json_object_set_new(obj, "id", jstr(json_str(view, "task_id")));
    json_object_set_new(obj, "object", json_string("response"));
    json_object_set_new(obj, "model", jstr(model));
    json_object_set_new(obj, "created_at",
                        unix_seconds(json_object_get(view, "created_at")));
    if (!json_is_string(json_object_get(obj, "status"))) {
        json_object_set_new(obj, "status", json_string(video_status(status)));
    }
}


const llmgw_tstep_t *
llmgw_tjob_s::responses_answer(json_t *obj)
{
    response_members(obj);
    return respond_json(200, obj);
}


const llmgw_tstep_t *
llmgw_tjob_s::responses_final()
{
    /* the create's own answer failing leaves the client nothing: its task
       is refunded (a retrieval's leaves the task as it is) */
    void_on_fail = proto == LLMGW_TPROTO_RESPONSES_CREATE;

    if (!hook.ok) {
        return plugin_failed(nullptr);
    }
    if (!json_is_object(hook.result.get())) {
        return fail(500, "gateway_error", "plugin_error",
                    hook_name_ + " must return a Response object");
    }
    return responses_answer(hook.result.get());
}


const llmgw_tstep_t *
llmgw_tjob_s::responses_events()
{
    /* a create's render failing leaves the client without its result (a
       stream: whatever it sent before was not the result, and it ends
       here), as renderFinal's does: its task fails and is refunded */
    void_on_fail = proto == LLMGW_TPROTO_RESPONSES_CREATE;

    if (!hook.ok) {
        return plugin_failed(nullptr);
    }

    const json_t *r = hook.result.get();
    const json_t *events = json_object_get(r, "events");
    const json_t *done = json_object_get(r, "done");

    if (!json_is_object(r) || !json_is_array(events)
        || !json_is_boolean(done) || json_object_get(r, "state") == nullptr)
    {
        return fail(500, "gateway_error", "plugin_error",
                    hook_name_ + " must return {events, state, done}");
    }

    std::string text;
    const json_t *last_response = nullptr;
    size_t i;
    json_t *e;

    json_array_foreach(events, i, e) {
        /* the Response an event carries (response.created, ...completed,
           its data's when framed) gets the host's members */
        json_t *resp = json_object_get(e, "response");
        if (!json_is_object(resp)) {
            resp = json_object_get(json_object_get(e, "data"), "response");
        }
        if (json_is_object(resp)) {
            response_members(resp);
            last_response = resp;
        }
        if (!sse_event(e, text)) {
            return fail(500, "gateway_error", "plugin_error",
                        hook_name_ + ": event " + std::to_string(i)
                        + " has an event name or id that is not one line");
        }
    }

    if (!resp_stream) {
        /* a retrieval from a plugin that only streams: the Response the
           events carry last, else the host's */
        Json obj(last_response ? json_deep_copy(last_response)
                               : pending_response());
        return responses_answer(obj.get());
    }

    /* rendered: what fails later on (the wait's timeout) leaves the task
       going */
    void_on_fail = false;
    resp_state = Json(json_incref(json_object_get(r, "state")));
    stream_done = json_is_true(done)
                  || terminal(json_str(proto_view.get(), "status"));

    if (text.empty() && emitting) {
        return responses_emitted();
    }

    step_body = text;
    step = llmgw_tstep_t {};
    step.status = 200;
    step.body = str(step_body);
    step.channel_id = channel_id();
    emitting = true;
    phase = EMITTED;
    return emit(LLMGW_TSTEP_EMIT);
}


/* Events sent: the stream ends, or waits for the task to move. */
const llmgw_tstep_t *
llmgw_tjob_s::responses_emitted()
{
    if (stream_done) {
        return respond(200, "");
    }
    return image_wait();
}


/* ------------------------------------------------------------------ */
/* artifacts                                                           */

namespace {

/* The client's headers a content request may pass on: ranges and
 * conditions, nothing that identifies the client. */
constexpr const char *kContentHeaders[] = {
    "range", "if-range", "if-none-match", "if-modified-since", "if-match",
    "if-unmodified-since",
};

/* The vendor's headers a content answer passes on to the client. */
constexpr const char *kContentAnswerHeaders[] = {
    "content-type", "content-length", "content-range", "accept-ranges",
    "etag", "last-modified", "cache-control", "content-disposition",
    "expires", "content-encoding",
};

bool
header_value_ok(std::string_view v)
{
    return v.find_first_of(std::string_view("\r\n\0", 3))
           == std::string_view::npos;
}

} /* namespace */


/*
 * GET /v1/tasks/{id}/artifacts, GET|HEAD /v1/tasks/{id}/artifacts/{key}/
 * content and GET|HEAD /v1/videos/{id}/content: the caller's task (or,
 * through a signed link, the task the link names).
 */
const llmgw_tstep_t *
llmgw_tjob_s::start_artifacts()
{
    auto seg = segments(path);

    query_id = std::string(seg.size() > 2 ? seg[2] : "");

    if (route_kind == LLMGW_TROUTE_CONTENT) {
        artifact_key = std::string(seg[4]);

    } else if (proto == LLMGW_TPROTO_VIDEO_CONTENT) {
        protocol = "host_video";
        llmgw_buf_t q = llmgw_query_json(str(args));
        Json qj = json_parse(q.data, q.len);
        llmgw_buf_free(&q);
        const char *v = json_string_value(
            json_array_get(json_object_get(qj.get(), "variant"), 0));
        artifact_key = v ? v : "";
    }

    if (signed_link) {
        /* the link names the task; it was checked before the job */
        param[0] = query_id;
        return sql("select jsonb_build_object('tasks', coalesce((select "
                   "jsonb_agg(llmgw_task_json(t)) from tasks t where "
                   "t.task_id = $1), '[]'::jsonb))", ART_LOOKED, 1, 0);
    }

    return lookup(query_id, ART_LOOKED);
}


const llmgw_tstep_t *
llmgw_tjob_s::artifacts_looked()
{
    if (!sql_error.empty()) {
        return fail(503, "gateway_error", "service_unavailable",
                    "tasks cannot be read right now; retry shortly");
    }

    json_t *row = json_array_get(json_object_get(sql_result.get(), "tasks"),
                                 0);

    if (row == nullptr
        || std::string_view(json_str(row, "task_id")) != query_id)
    {
        return task_not_found();
    }

    art_row = Json(json_incref(row));
    model = std::string(json_str(row, "model"));
    upstream_model = std::string(json_str(row, "upstream_model"));
    action = std::string(json_str(row, "action"));
    task_id = query_id;

    plugin = snap_poll_plugin_find(snap, json_str(row, "plugin_key"));
    manifest = plugin >= 0 ? snap_plugin(snap, static_cast<size_t>(plugin),
                                         &pinfo)
                           : nullptr;

    if (proto == LLMGW_TPROTO_VIDEO_CONTENT && !protocol_reads(row)) {
        return task_not_found();
    }

    if (manifest == nullptr || !exports_has(manifest, "listArtifacts")) {
        /* nothing lists artifacts for this task */
        Json none(json_array());
        return artifacts_listed(none.get());
    }

    sha = pinfo.sha;

    const llmgw_channel_t *c = snap_poll_channel(snap,
                                                 json_int(row, "channel_id",
                                                          0),
                                                 &base_url,
                                                 &channel_settings);
    channels[0] = c;
    nchannels = c != nullptr ? 1 : 0;
    current = 0;

    json_t *t = json_object();
    json_object_set_new(t, "taskId", jstr(query_id));
    json_object_set_new(t, "status", jstr(json_str(row, "status")));
    json_object_set_new(t, "action", jstr(action));
    json_t *d = json_object_get(row, "data");
    json_object_set_new(t, "data", d ? json_incref(d) : json_null());
    json_object_set_new(t, "producerVersion",
                        jstr(json_str(row, "plugin_version")));

    json_t *a = json_array();
    json_array_append_new(a, t);
    return call("listArtifacts", a, ART_LISTED);
}


/* The artifacts a plugin listed: the listing, or the content of one. */
const llmgw_tstep_t *
llmgw_tjob_s::artifacts_listed(const json_t *list)
{
    std::string err;

    if (!artifact_list_check(list, err)) {
        return fail(500, "gateway_error", "plugin_error",
                    "listArtifacts " + err);
    }

    if (route_kind == LLMGW_TROUTE_ARTIFACTS) {
        std::string_view base = sv(conf.public_address);
        if (base.empty()) {
            base = origin;
        }
        int64_t expires = static_cast<int64_t>(std::time(nullptr))
                          + conf.link_ttl_s;

        Json data(json_array());
        size_t i;
        json_t *a;

        json_array_foreach(list, i, a) {
            json_t *e = json_deep_copy(a);
            json_object_set_new(e, "url",
                                jstr(artifact_link(base, sv(conf.link_secret),
                                                   query_id,
                                                   json_str(a, "key"),
                                                   expires)));
            json_array_append_new(data.get(), e);
        }

        Json answer(json_object());
        json_object_set_new(answer.get(), "object", json_string("list"));
        json_object_set_new(answer.get(), "task_id", jstr(query_id));
        json_object_set(answer.get(), "data", data.get());
        return respond_json(200, answer.get());
    }

    /* the key asked for; for a video without a variant, its video */
    const json_t *chosen = nullptr;
    size_t i;
    json_t *a;

    json_array_foreach(list, i, a) {
        std::string_view k = json_str(a, "key");

        if (!artifact_key.empty() ? k == artifact_key
            : chosen == nullptr || (json_str(chosen, "type") != "video"
                                    && json_str(a, "type") == "video"))
        {
            chosen = a;
        }
    }

    if (chosen == nullptr) {
        return fail(404, "gateway_error", "artifact_not_found",
                    "task " + shown(utf8_prefix(query_id, 100))
                    + (artifact_key.empty()
                       ? std::string(" has no artifacts")
                       : " has no artifact "
                         + shown(utf8_prefix(artifact_key, 128))));
    }

    artifact_key = std::string(json_str(chosen, "key"));

    if (nchannels == 0) {
        return fail(404, "gateway_error", "artifact_not_found",
                    "the channel of task "
                    + std::string(utf8_prefix(query_id, 100))
                    + " no longer exists");
    }

    const json_t *row = art_row.get();
    json_t *ctx = channel_ctx(channels[0], base_url, channel_settings,
                              json_object());
    json_object_set_new(ctx, "model", jstr(model));
    json_object_set_new(ctx, "upstreamModel", jstr(upstream_model));
    json_object_set_new(ctx, "action", jstr(action));
    json_object_set_new(ctx, "publicTaskId", jstr(query_id));
    json_object_set_new(ctx, "artifactKey", jstr(artifact_key));
    json_t *d = json_object_get(row, "data");
    json_object_set_new(ctx, "data", d ? json_incref(d) : json_null());
    json_object_set_new(ctx, "upstreamTaskId",
                        jstr(json_str(row, "upstream_task_id")));
    json_object_set_new(ctx, "producerVersion",
                        jstr(json_str(row, "plugin_version")));

    Json hdrs = json_parse(headers_json.data(), headers_json.size());
    json_t *safe = json_object();
    for (const char *h : kContentHeaders) {
        json_t *v = json_object_get(hdrs.get(), h);
        if (json_is_string(v) && header_value_ok(json_string_value(v))) {
            json_object_set(safe, h, v);
        }
    }
    json_t *cr = json_object();
    json_object_set_new(cr, "method", jstr(method == "HEAD" ? "HEAD" : "GET"));
    json_object_set_new(cr, "headers", safe);
    json_object_set_new(ctx, "clientRequest", cr);

    json_t *args_ = json_array();
    json_array_append_new(args_, ctx);
    return call("buildContentRequest", args_, CONTENT_BUILT);
}


const llmgw_tstep_t *
llmgw_tjob_s::content_built()
{
    if (!hook.ok) {
        return plugin_failed(nullptr);
    }

    if (send("buildContentRequest", true) == nullptr) {
        return fail(500, "gateway_error", "invalid_descriptor", send_error);
    }

    /* a HEAD's answer has no body: the client's GET would get none */
    if (method != "HEAD" && std::strcmp(out.method, "HEAD") == 0) {
        return fail(500, "gateway_error", "invalid_descriptor",
                    "buildContentRequest: method HEAD answers no content; "
                    "a GET must be read with GET (or another method that "
                    "answers the bytes)");
    }

    if (out.credentialless) {
        /* a public address gets no plugin headers, but the client's own
           ranges and conditions still apply */
        Json hdrs = json_parse(headers_json.data(), headers_json.size());
        std::string lines(out.headers.data ? out.headers.data : "",
                          out.headers.len);

        for (const char *h : kContentHeaders) {
            json_t *v = json_object_get(hdrs.get(), h);
            if (json_is_string(v) && header_value_ok(json_string_value(v))) {
                lines.append(h).append(": ").append(json_string_value(v))
                     .append("\r\n");
            }
        }

        llmgw_buf_free(&out.headers);
        out.headers = make_buf(lines);
    }

    return pipe(false);
}


/* The content request goes out; its answer is the client's. */
const llmgw_tstep_t *
llmgw_tjob_s::pipe(bool again)
{
    if (again) {
        step = llmgw_tstep_t {};
        step.out = &out;
        step.channel_id = channel_id();
    }
    step.kind = LLMGW_TSTEP_PIPE;
    step.head_only = method == "HEAD";
    step.resend = 1;            /* nothing of it has reached the client */
    http_status = 0;
    transport_error.clear();
    phase = PIPED;
    busy = true;
    return &step;
}


int
llmgw_tjob_s::pipe_head(int status, const llmgw_str_t *names,
    const llmgw_str_t *values, size_t n, llmgw_tpipe_head_t *head)
{
    busy = false;
    http_status = status;

    if (status >= 301 && status <= 308 && status != 304 && status != 305
        && status != 306 && redirects < conf.max_redirects)
    {
        std::string_view loc;
        for (size_t i = 0; i < n; i++) {
            if (sv(names[i]) == "location") {
                loc = sv(values[i]);
            }
        }

        if (!loc.empty()) {
            pipe_redirect = follow_redirect(status, loc, true, pipe_error);
            return 0;
        }
    }

    if (!((status >= 200 && status <= 299) || status == 304 || status == 416))
    {
        return 0;
    }

    /* a length beside chunked framing is not the body's: not passed on */
    bool chunked = false;
    for (size_t i = 0; i < n; i++) {
        chunked = chunked || sv(names[i]) == "transfer-encoding";
    }

    pipe_hdrs.clear();
    for (const char *h : kContentAnswerHeaders) {
        if (chunked && std::string_view(h) == "content-length") {
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            if (sv(names[i]) == h && header_value_ok(sv(values[i]))) {
                pipe_hdrs.emplace_back(h);
                pipe_hdrs.emplace_back(sv(values[i]));
                break;
            }
        }
    }

    head->status = status;
    head->n = 0;
    for (size_t i = 0; i + 1 < pipe_hdrs.size()
                       && head->n < sizeof(head->names) / sizeof(head->names[0]);
         i += 2)
    {
        head->names[head->n] = str(pipe_hdrs[i]);
        head->values[head->n] = str(pipe_hdrs[i + 1]);
        head->n++;
    }

    phase = FINISHED;
    return 1;
}


/* The content request ended before its answer reached the client. */
const llmgw_tstep_t *
llmgw_tjob_s::piped()
{
    if (pipe_redirect) {
        pipe_redirect = false;
        return pipe(true);
    }

    if (!pipe_error.empty()) {
        return fail(502, "gateway_error", "invalid_descriptor", pipe_error);
    }

    if (!transport_error.empty()) {
        return fail(transport_timeout ? 504 : 502, "gateway_error",
                    "do_request_failed",
                    "the content request failed: " + transport_error);
    }

    if (http_status == 404 || http_status == 410) {
        return fail(404, "gateway_error", "artifact_not_found",
                    "the vendor no longer has artifact " + artifact_key
                    + " of task " + std::string(utf8_prefix(query_id, 100)));
    }

    return fail(502, "upstream_error", "bad_response_status_code",
                "the vendor answered HTTP " + std::to_string(http_status)
                + " to the content request");
}


const llmgw_tstep_t *
llmgw_tjob_s::answer_query(json_t *rows)
{
    if (multi_query) {
        json_t *views = json_array();
        size_t i;
        json_t *row;
        json_array_foreach(rows, i, row) {
            /* a route sees only its own plugin's tasks */
            if (json_str(row, "plugin_key") == pinfo.key) {
                json_array_append_new(views, task_view(row));
            }
        }
        return render_native(views);
    }

    json_t *row = json_array_get(rows, 0);

    if (row == nullptr
        || std::string_view(json_str(row, "task_id")) != query_id)
    {
        return task_not_found();
    }

    if (route_kind == LLMGW_TROUTE_PROTOCOL) {
        /* a task of a plugin that (still) claims the protocol for it */
        model = std::string(json_str(row, "model"));
        plugin = snap_poll_plugin_find(snap, json_str(row, "plugin_key"));
        manifest = plugin >= 0 ? snap_plugin(snap, static_cast<size_t>(plugin),
                                             &pinfo)
                               : nullptr;
        if (!protocol_reads(row)) {
            return task_not_found();
        }
        sha = pinfo.sha;
        json_object_set_new(decode_ctx.get(), "model", jstr(model));
        note_row(row);
        return render_protocol(task_view(row));
    }

    if (route_kind == LLMGW_TROUTE_NATIVE) {
        long p = snap_plugin_find(snap, json_str(row, "plugin_key"));
        if (p != plugin) {
            return task_not_found();
        }
        return render_native(task_view(row));
    }

    Json v(api_view(row));
    return respond_json(200, v.get());
}


/*
 * The next SSE event to give the plugin, or what ends the stream.  Events
 * received whole before the stream failed (a reset, a chunked body cut
 * short, a silence) still go to the plugin, in order: the failure counts
 * only when none of them is the one the plugin reports done at.
 */
const llmgw_tstep_t *
llmgw_tjob_s::stream_next()
{
    if (!stream_error.empty() && http_status == 0) {
        /* no answer at all: the vendor has not accepted the submit */
        return transport_failed();
    }

    if (!events.empty()) {
        std::string ev = std::move(events.front());
        events.pop_front();

        json_t *a = json_array();
        json_array_append(a, driver_ctx.get());
        Json e = json_parse(ev.data(), ev.size());
        json_array_append_new(a, e ? json_incref(e.get()) : json_null());
        json_array_append(a, sse_state ? sse_state.get() : json_null());
        return call(sse_delta ? "parseSubmitEventDelta" : "parseSubmitEvent",
                    a, EVENT);
    }

    if (!stream_error.empty()) {
        return fail(502, "upstream_error", "bad_response_status_code",
                    "the submit event stream failed: " + stream_error);
    }

    if (stream_ended) {
        if (!stream_ok) {
            /* a non-2xx answer to an SSE submit: its body is the error */
            if (another_channel(retryable_status(http_status))) {
                return next_channel();
            }
            return fail_upstream(http_status, http_body);
        }
        return fail(502, "upstream_error", "bad_response_status_code",
                    "the submit event stream ended before the plugin "
                    "reported done");
    }

    phase = STREAMING;
    return emit(LLMGW_TSTEP_WAIT);
}


const llmgw_tstep_t *
llmgw_tjob_s::next_request()
{
    char e[512];
    std::string err;

    switch (phase) {

    case START:
        return start_request();

    case REFUSED:
        decode_ctx = Json(native_ctx());
        return error_answer();

    case DECODED:
        if (!hook.ok) {
            return plugin_failed(nullptr);
        }
        intent = Json(json_incref(hook.result.get()));
        if (route_kind == LLMGW_TROUTE_PROTOCOL) {
            if (!json_is_object(intent.get())
                || json_str(intent.get(), "kind") != "submit")
            {
                return fail(500, "gateway_error", "plugin_error",
                            hook_name_ + " returned no submit intent");
            }
            /* the host fixes the model the request was routed by */
            json_object_set_new(intent.get(), "model", jstr(model));
        }
        return after_intent();

    case LOOKED_UP_QUERY:
        if (!sql_error.empty()) {
            return fail(503, "gateway_error", "service_unavailable",
                        "tasks cannot be read right now; retry shortly");
        }
        return answer_query(json_object_get(sql_result.get(), "tasks"));

    case ORIGINS: {
        /* each id the caller's, of this plugin, all on one enabled channel */
        if (!sql_error.empty()) {
            return fail(503, "gateway_error", "service_unavailable",
                        "tasks cannot be read right now; retry shortly");
        }
        json_t *rows = json_object_get(sql_result.get(), "tasks");
        size_t i;
        json_t *id;
        Json list(json_array());

        json_array_foreach(origin_ids.get(), i, id) {
            /* the whole id: one with a NUL in it names no task */
            std::string_view want(json_string_value(id),
                                  json_string_length(id));
            json_t *found = nullptr;
            size_t k;
            json_t *row;
            json_array_foreach(rows, k, row) {
                if (json_str(row, "task_id") == want) {
                    found = row;
                }
            }

            if (found == nullptr
                || json_str(found, "plugin_key") != pinfo.key)
            {
                return fail(400, "gateway_error",
                            "invalid_origin_task",
                            "origin task " + shown(utf8_prefix(want, 100))
                            + " not found");
            }

            int64_t ch = json_int(found, "channel_id", 0);
            if (pinned_channel != 0 && ch != pinned_channel) {
                return fail(400, "gateway_error",
                            "invalid_origin_task",
                            "origin tasks were made on different channels");
            }
            pinned_channel = ch;

            json_t *o = json_object();
            json_object_set_new(o, "taskId", jstr(json_str(found, "task_id")));
            json_object_set_new(o, "upstreamTaskId",
                                jstr(json_str(found, "upstream_task_id")));
            json_object_set_new(o, "action", jstr(json_str(found, "action")));
            json_object_set_new(o, "status", jstr(json_str(found, "status")));
            json_t *d = json_object_get(found, "data");
            json_object_set_new(o, "data", d ? json_incref(d) : json_null());
            json_array_append_new(list.get(), o);
        }

        if (snap_channel(snap, pinned_channel, nullptr, nullptr) == nullptr) {
            return fail(400, "gateway_error", "invalid_origin_task",
                        "the channel of the origin tasks is not available");
        }

        origins = std::move(list);
        return choose_channel();
    }

    case USAGE: {
        int64_t q = 0;
        const llmgw_tstep_t *refused = take_usage(&q);
        if (refused != nullptr) {
            return refused;
        }
        if (reserved) {
            /* another channel: the reservation stands */
            return build_submit();
        }
        quota_reserve = q;
        step = llmgw_tstep_t {};
        step.amount = q;
        phase = RESERVED;
        return emit(LLMGW_TSTEP_RESERVE);
    }

    case RESERVED:
        if (reserve_refusal.status != 0) {
            return fail(reserve_refusal.status, reserve_refusal.type,
                        reserve_refusal.code, reserve_refusal.message);
        }
        reserved = true;
        return build_submit();

    case BUILT: {
        if (!hook.ok) {
            return plugin_failed(nullptr);
        }
        phase = SENT;
        const llmgw_tstep_t *s = send("buildSubmitRequest");
        if (s == nullptr) {
            return fail(500, "gateway_error", "invalid_descriptor",
                        send_error);
        }
        if (sse) {
            phase = STREAMING;
        }
        return s;
    }

    case SENT:
        if (!transport_error.empty()) {
            return transport_failed();
        }
        return after_send();

    case STREAMING:
        return stream_next();

    case EVENT: {
        if (!hook.ok) {
            /* the vendor took the submit: its events wait for the runtime
               as its JSON answer does; the stream is read on meanwhile */
            const llmgw_tstep_t *again = await_runtime();
            return again != nullptr ? again : plugin_failed(nullptr);
        }
        runtime_waiting = false;
        std::string r = json_dump(hook.result.get());
        llmgw_buf_t state {};
        int done = 0;
        int rc = sse_delta
                 ? llmgw_sse_acc_apply(acc, r.data(), r.size(), &done, &state,
                                       e, sizeof(e))
                 : llmgw_sse_snapshot_result(r.data(), r.size(), &done,
                                             &state, e, sizeof(e));
        if (rc != 0) {
            /* the plugin's result, not the vendor's stream, broke a rule */
            return fail(500, "gateway_error", "plugin_error",
                        hook_name_ + " returned a result the contract does "
                        "not allow: " + e);
        }
        sse_state = json_any(state.data, state.len);
        llmgw_buf_free(&state);

        if (!done) {
            return stream_next();
        }

        /* the plugin has what it needs: stop reading */
        if (sse_delta) {
            llmgw_buf_t b = llmgw_sse_acc_body(acc);
            sse_body = json_any(b.data, b.len);
            llmgw_buf_free(&b);
        } else {
            sse_body = Json(json_incref(sse_state.get()));
        }

        if (!stream_ended && !stream_cancelled) {
            stream_cancelled = true;
            phase = PARSED;          /* set below by parse_submit */
            step = llmgw_tstep_t {};
            phase_after_cancel = true;
            return emit(LLMGW_TSTEP_HTTP_CANCEL);
        }

        return parse_submit(json_incref(sse_body.get()));
    }

    case PARSED:
        if (phase_after_cancel) {
            phase_after_cancel = false;
            return parse_submit(json_incref(sse_body.get()));
        }
        if (!hook.ok) {
            const llmgw_tstep_t *again = await_runtime();
            return again != nullptr ? again : plugin_failed(nullptr);
        }
        runtime_waiting = false;
        return after_parse();

    case RUNTIME_SLEPT:
        return send_hook(runtime_phase);

    case SUBMIT_USAGE:
    case FINAL_USAGE: {
        /* the vendor has the task: a runtime outage is waited out, as for
           parseSubmitResponse, rather than settle the task at its
           reservation */
        const llmgw_tstep_t *again = await_runtime();
        if (again != nullptr) {
            return again;
        }
        if (phase == SUBMIT_USAGE) {
            take_usage_after_submit(&quota_submit);
            return after_submit_usage();
        }
        take_usage_after_submit(&final_quota);
        return create_task();
    }

    case CREATED:
        if (!sql_error.empty()
            && (create_tries == 0
                || (create_tries < kCreateTries
                    && sql_error.rfind("ERROR:", 0) != 0)))
        {
            /*
             * The statement may have committed all the same (it ran past
             * llmgw_pg_timeout): the create is idempotent by task id, so
             * it is sent once more, and answers the task if it was saved.
             * The vendor has the task: while the database cannot be
             * reached (each try waits up to llmgw_pg_timeout for it) it
             * is sent again, rather than leave a task nobody polls or pays.
             */
            create_tries++;
            return sql("select llmgw_task_create($1::jsonb)", CREATED, 1, 1);
        }
        if (!sql_error.empty()) {
            return fail(500, "gateway_error", "task_store_failed",
                        "the task could not be saved");
        }
        charged = true;
        created = Json(json_incref(sql_result.get()));
        if (!json_is_object(json_object_get(created.get(), "task"))) {
            return fail(500, "gateway_error", "task_store_failed",
                        "the task store answered without the task");
        }
        return render_created();

    case WAIT_SLEPT:
        param[0] = "request:" + request_id;
        param[1] = task_id;
        param[2] = std::to_string(conf.lease_ms);
        return sql("select llmgw_task_claim_one($1, $2, $3::int)",
                   WAIT_CLAIMED, 3, 0);

    case WAIT_CLAIMED:
        return wait_claimed();

    case WAIT_LOOKED:
        return wait_looked();

    case WAIT_RELEASED:
        return image_wait();

    case DOWNLOADED:
        return image_downloaded();

    case ART_LOOKED:
        return artifacts_looked();

    case RESP_ARTIFACTS:
        return responses_artifacts();

    case RESP_FINAL:
        return responses_final();

    case VOIDED:
        if (sql_error.empty()
            && json_is_true(json_object_get(sql_result.get(), "voided")))
        {
            err_message += "; task " + task_id
                           + " was failed and refunded";
        }
        return error_answer();

    case RESP_EVENTS:
        return responses_events();

    case EMITTED:
        return responses_emitted();

    case ART_LISTED:
        if (!hook.ok) {
            return plugin_failed(nullptr);
        }
        return artifacts_listed(hook.result.get());

    case CONTENT_BUILT:
        return content_built();

    case PIPED:
        return piped();

    case RENDERED:
        if (route_kind == LLMGW_TROUTE_PROTOCOL) {
            return protocol_rendered();
        }
        if (!hook.ok && !created) {
            return plugin_failed(nullptr);          /* a query's render */
        }
        if (!hook.ok) {
            /* The vendor took the task and it is charged: a refusal now
               would be retried by the client (and paid twice), so the
               task is answered in the host's own view, which names it. */
            Json v(created_view(true));
            return respond_json(200, v.get());
        }
        return respond_json(200, hook.result.get());

    case ERROR_RENDERED:
        if (!hook.ok || !json_is_object(hook.result.get())) {
            return contract_error();
        }
        return respond_json(err_status, hook.result.get());

    default:
        return respond(500, "{}");
    }
}


/* ------------------------------------------------------------------ */
/* polling                                                             */

json_t *
llmgw_tjob_s::query_ctx(const TaskRow &t)
{
    json_t *ctx = json_object();
    const json_t *row = t.row.get();

    json_object_set_new(ctx, "taskId", jstr(t.upstream_id));
    json_object_set_new(ctx, "publicTaskId", jstr(t.task_id));
    json_object_set_new(ctx, "model", jstr(t.model));
    json_object_set_new(ctx, "upstreamModel", jstr(t.upstream_model));
    json_object_set_new(ctx, "action", jstr(t.action));

    json_t *d = json_object_get(row, "data");
    json_object_set_new(ctx, "data", d ? json_incref(d) : json_null());
    json_t *s = json_object_get(row, "state");
    json_object_set_new(ctx, "state", s ? json_incref(s) : json_null());

    std::string_view url;
    const json_t *settings = nullptr;
    const llmgw_channel_t *c = snap_poll_channel(snap, t.channel_id, &url,
                                                 &settings);
    return channel_ctx(c, url, settings, ctx);
}


void
llmgw_tjob_s::poll_terminal(size_t i, const char *status,
    const std::string &reason)
{
    json_t *u = json_array_get(updates.get(), i);

    json_object_set_new(u, "status", json_string(status));
    if (!reason.empty()) {
        json_object_set_new(u, "fail_reason",
                            jstr(utf8_prefix(reason, kMaxTaskText)));
    }
}


/* The update of a task this poll leaves as it was, polled again after
   llmgw_task_poll_interval. */
json_t *
llmgw_tjob_s::unchanged(const TaskRow &t) const
{
    json_t *u = json_object();

    json_object_set_new(u, "task_id", jstr(t.task_id));
    json_object_set_new(u, "poll_failures", json_integer(t.failures));
    json_object_set_new(u, "next_poll_ms", json_integer(conf.poll_interval_ms));
    return u;
}


/* One more failed poll; the task fails when they reach the limit. */
void
llmgw_tjob_s::poll_failure(size_t i, const std::string &reason)
{
    json_t *u = json_array_get(updates.get(), i);
    int64_t n = tasks[i].failures + 1;

    json_object_set_new(u, "poll_failures", json_integer(n));

    if (n >= conf.max_failures) {
        poll_terminal(i, "FAILURE",
                      "polling failed " + std::to_string(n)
                      + " times in a row: " + reason);
    }
}


/* A parse hook's answer for one task. */
void
llmgw_tjob_s::poll_result(size_t i, const json_t *r, bool parse_2xx)
{
    json_t *u = json_array_get(updates.get(), i);

    if (!json_is_object(r)) {
        poll_failure(i, "the parse hook returned no result object");
        return;
    }

    std::string_view status = json_str(r, "status");

    if (!known_status(status) || status == "UNKNOWN") {
        poll_failure(i, status.empty()
                        ? std::string("the parse hook returned no status")
                        : "the upstream status is "
                          + std::string(utf8_prefix(status, 64)));
        return;
    }

    /* the state changes only when the hook returns one */
    json_t *state = json_object_get(r, "state");
    if (state != nullptr) {
        json_object_set(u, "state", state);
    }

    Json progress(progress_of(json_object_get(r, "progress")));
    if (progress) {
        json_object_set(u, "progress", progress.get());
    }

    Json data(result_data(r, json_object_get(tasks[i].row.get(), "data")));
    if (data) {
        json_object_set(u, "data", data.get());
    }

    for (const char *what : { "data", "state" }) {
        if (over_task_limit(json_object_get(u, what))) {
            json_object_del(u, "data");
            json_object_del(u, "state");
            json_object_del(u, "progress");
            poll_failure(i, std::string("the parse hook's ") + what
                            + " is larger than 1 MiB");
            return;
        }
    }

    if (status == "FAILURE") {
        std::string reason(json_str(r, "reason"));
        poll_terminal(i, "FAILURE", reason.empty() ? "the task failed"
                                                   : reason);
        return;
    }

    if (status == "SUCCESS") {
        poll_terminal(i, "SUCCESS", "");
        json_object_set_new(u, "progress", json_string("100%"));
        json_array_set(results.get(), i, const_cast<json_t *>(r));
        return;
    }

    json_object_set_new(u, "status", jstr(status));

    if (parse_2xx) {
        json_object_set_new(u, "poll_failures", json_integer(0));
    } else {
        poll_failure(i, "the upstream answered HTTP "
                        + std::to_string(http_status));
    }
}


const llmgw_tstep_t *
llmgw_tjob_s::poll_build()
{
    updates = Json(json_array());
    results = Json(json_array());

    for (const TaskRow &t : tasks) {
        json_array_append_new(updates.get(), unchanged(t));
        json_array_append_new(results.get(), json_null());
    }

    plugin = snap_poll_plugin_find(snap, tasks[0].plugin);
    manifest = snap_plugin(snap, static_cast<size_t>(std::max(plugin, 0L)),
                           &pinfo);
    const llmgw_channel_t *c = snap_poll_channel(snap, tasks[0].channel_id,
                                                 &base_url, &channel_settings);

    if (plugin < 0 || c == nullptr) {
        std::string why = plugin < 0
                          ? "the plugin " + tasks[0].plugin
                            + " was deleted"
                          : std::string("the channel was deleted");
        return fail_all(why);
    }

    sha = pinfo.sha;

    if (batch) {
        json_t *list = json_array();
        for (const TaskRow &t : tasks) {
            json_array_append_new(list, query_ctx(t));
        }
        json_t *bctx = channel_ctx(c, base_url, channel_settings,
                                   json_object());
        json_t *a = json_array();
        json_array_append_new(a, bctx);
        json_array_append_new(a, list);
        return call("buildBatchQueryRequest", a, POLL_BUILT);
    }

    json_t *a = json_array();
    json_array_append_new(a, query_ctx(tasks[0]));
    return call("buildQueryRequest", a, POLL_BUILT);
}


const llmgw_tstep_t *
llmgw_tjob_s::poll_sent()
{
    if (in_request_poll && transport_timeout
        && wait_left_ms() < kWaitSlackMs)
    {
        /*
         * The request's wait ended while its poll was under way: the poll
         * is given up uncounted (the vendor was not given its time), its
         * lease given back so that the background pollers take the task at
         * once, and the request answers task_timeout.
         */
        wait_over = true;
        in_request_poll = false;
        mode = REQUEST;
        Json ids(json_array());
        json_array_append_new(ids.get(), jstr(task_id));
        param[0] = owner;
        param[1] = json_dump_pg(ids.get());
        return sql("select llmgw_task_release($1, $2::jsonb)", WAIT_RELEASED,
                   2, 0);
    }

    if (!transport_error.empty()) {
        return fail_all(transport_error);
    }

    if (http_status >= 301 && http_status <= 308 && http_status != 304
        && http_status != 305 && http_status != 306)
    {
        json_t *l = json_object_get(http_headers.get(), "location");
        const char *loc = json_is_array(l)
                          ? json_string_value(json_array_get(l, 0)) : nullptr;

        if (loc != nullptr && redirects < conf.max_redirects) {
            llmgw_desc_policy_t p;
            std::vector<llmgw_str_t> hosts;
            std::vector<llmgw_file_t> f;
            llmgw_outbound_t nxt {};
            char e[512];

            policy(p, hosts, f, false, false);

            if (llmgw_descriptor_redirect(&out, http_status,
                                          llmgw_str_t { loc, strlen(loc) },
                                          &p, &nxt, e, sizeof(e)) == 0)
            {
                llmgw_outbound_free(&out);
                out = nxt;
                redirects++;
                step = llmgw_tstep_t {};
                step.out = &out;
                step.channel_id = channel_id();
                step.resend = 1;
                phase = POLL_SENT;
                return emit(LLMGW_TSTEP_HTTP);
            }

            return fail_all(std::string("redirect refused: ") + e);
        }
    }

    int s = http_status;

    if ((s == 404 || s == 410) && !batch) {
        /* a batch query's URL that is not found (say a route the vendor
           moved) says nothing of its tasks: its answer is parsed as any
           other 4xx, and a task without a result counts one failure */
        for (size_t i = 0; i < tasks.size(); i++) {
            poll_terminal(i, "FAILURE", "the upstream no longer knows the "
                          "task (HTTP " + std::to_string(s) + ")");
        }
        return poll_save();
    }

    if (s == 401 || s == 403 || s == 429 || s >= 500 || s < 200
        || (s >= 300 && s < 400))
    {
        if (s == 401 || s == 403) {
            auth_warning = true;
        }
        return fail_all("the upstream answered HTTP " + std::to_string(s));
    }

    /* 2xx and other 4xx go to the parse hook */
    json_t *info = json_object();
    json_object_set_new(info, "status", json_integer(s));
    json_object_set(info, "headers",
                    http_headers ? http_headers.get() : json_object());

    json_t *a = json_array();

    if (batch) {
        json_array_append_new(a, channel_ctx(
            snap_poll_channel(snap, tasks[0].channel_id, nullptr, nullptr),
            base_url, channel_settings, json_object()));
    } else {
        json_array_append_new(a, query_ctx(tasks[0]));
    }

    json_array_append_new(a, body_value(http_body));
    json_array_append_new(a, info);
    return call(batch ? "parseBatchResult" : "parseTaskResult", a,
                POLL_PARSED);
}


const llmgw_tstep_t *
llmgw_tjob_s::poll_parsed()
{
    bool ok2xx = http_status >= 200 && http_status <= 299;

    if (!hook.ok) {
        return hook_failed_while_polling();
    }

    if (!batch) {
        poll_result(0, hook.result.get(), ok2xx);
        return poll_usage();
    }

    json_t *list = hook.result.get();

    if (!json_is_array(list)) {
        return fail_all("parseBatchResult must return an array");
    }

    std::vector<bool> seen(tasks.size(), false);
    size_t k;
    json_t *r;

    json_array_foreach(list, k, r) {
        std::string_view id = json_str(r, "taskId");
        for (size_t i = 0; i < tasks.size(); i++) {
            if (!seen[i] && tasks[i].upstream_id == id) {
                seen[i] = true;
                poll_result(i, r, ok2xx);
                break;
            }
        }
    }

    for (size_t i = 0; i < tasks.size(); i++) {
        if (!seen[i]) {
            poll_failure(i, ok2xx ? std::string("the batch answer did not "
                                                "mention the task")
                                  : "the upstream answered HTTP "
                                    + std::to_string(http_status)
                                    + " to the batch query");
        }
    }

    return poll_usage();
}


/* extractUsageOnComplete for each task that just succeeded, in turn. */
const llmgw_tstep_t *
llmgw_tjob_s::poll_usage()
{
    bool has = exports_has(manifest, "extractUsageOnComplete");

    while (usage_at < tasks.size()) {
        size_t i = usage_at;
        json_t *u = json_array_get(updates.get(), i);

        if (std::string_view(json_str(u, "status")) != "SUCCESS" || !has) {
            usage_at++;
            continue;
        }

        json_t *res = json_array_get(results.get(), i);
        json_t *row = tasks[i].row.get();
        Json view(task_view(row));
        json_object_set_new(view.get(), "status", json_string("SUCCESS"));
        json_t *data = json_object_get(u, "data");
        if (data == nullptr) {
            data = json_object_get(row, "data");
        }
        json_object_set(view.get(), "data", data ? data : json_null());

        json_t *a = json_array();
        json_array_append(a, view.get());
        json_array_append(a, res ? res : json_null());
        json_array_append_new(a, data ? json_incref(data) : json_null());
        return call("extractUsageOnComplete", a, POLL_USAGE);
    }

    return poll_save();
}


const llmgw_tstep_t *
llmgw_tjob_s::poll_save()
{
    param[0] = owner;
    param[1] = json_dump_pg(updates.get());
    return sql("select llmgw_task_update($1, $2::jsonb)", POLL_SAVED, 2, 1);
}


/* The update of task save_at alone (after the batch's was refused). */
const llmgw_tstep_t *
llmgw_tjob_s::poll_save_one()
{
    if (save_at >= tasks.size()) {
        phase = FINISHED;
        step = llmgw_tstep_t {};
        return emit(LLMGW_TSTEP_DONE);
    }

    Json one(json_array());
    json_array_append(one.get(), json_array_get(updates.get(), save_at));

    param[0] = owner;
    param[1] = json_dump_pg(one.get());
    return sql("select llmgw_task_update($1, $2::jsonb)", POLL_SAVED, 2, 1);
}


/*
 * The answer to a save.  A refused batch is saved task by task, so that
 * one task's update (a value the database cannot store) holds up no other;
 * a refused single update is replaced by one more failed poll, so that a
 * task whose results cannot be stored ends after llmgw_task_poll_max_failures
 * polls instead of at its deadline.  A database that refuses even that (it
 * is down) leaves the task to the next poller once the lease ends.
 */
const llmgw_tstep_t *
llmgw_tjob_s::poll_saved()
{
    if (sql_error.empty()) {
        if (save_single) {
            save_at++;
            save_refused = false;
            return poll_save_one();
        }
        phase = FINISHED;
        step = llmgw_tstep_t {};
        return emit(LLMGW_TSTEP_DONE);
    }

    /*
     * Only a statement the database ran and refused ("ERROR: ...") is about
     * the update itself; no answer in time, a full queue or a lost
     * connection is about the database, and every further statement would
     * wait as long: the tasks are left to the next pass after the lease.
     */
    if (sql_error.rfind("ERROR:", 0) != 0) {
        poll_log.push_back("saving polled tasks failed (" + sql_error
                           + "); they are polled again after the lease");
        phase = FINISHED;
        step = llmgw_tstep_t {};
        return emit(LLMGW_TSTEP_DONE);
    }

    if (!save_single) {
        if (tasks.size() > 1) {
            poll_log.push_back("saving " + std::to_string(tasks.size())
                               + " polled tasks together failed (" + sql_error
                               + "); saving them one by one");
        }
        save_single = true;
        save_at = 0;
        if (tasks.size() > 1) {
            return poll_save_one();
        }
    }

    if (save_at >= tasks.size()) {
        phase = FINISHED;
        step = llmgw_tstep_t {};
        return emit(LLMGW_TSTEP_DONE);
    }

    const TaskRow &t = tasks[save_at];
    poll_log.push_back(t.task_id + ": the poll result could not be saved: "
                       + sql_error);

    if (save_refused) {
        /* even the failure count was refused */
        save_at++;
        save_refused = false;
        return poll_save_one();
    }

    save_refused = true;

    json_array_set_new(updates.get(), save_at, unchanged(t));
    poll_failure(save_at, "the poll result could not be saved");

    return poll_save_one();
}


const llmgw_tstep_t *
llmgw_tjob_s::next_poll()
{
    switch (phase) {

    case START:
    case POLL_BUILD:
        return poll_build();

    case POLL_BUILT: {
        if (!hook.ok) {
            return hook_failed_while_polling();
        }
        phase = POLL_SENT;
        const llmgw_tstep_t *s = send(batch ? "buildBatchQueryRequest"
                                            : "buildQueryRequest");
        if (s == nullptr) {
            return fail_all(send_error);
        }
        return s;
    }

    case POLL_SENT:
        return poll_sent();

    case POLL_PARSED:
        return poll_parsed();

    case POLL_USAGE: {
        size_t i = usage_at++;
        json_t *u = json_array_get(updates.get(), i);
        std::string err;

        if (hook.ok && !json_is_null(hook.result.get())) {
            /* the stored price and schema of the task decide */
            price = json_object_get(tasks[i].row.get(), "price");
            group_ratio = tasks[i].group_ratio;
            schema = Json(usage_schema(manifest, tasks[i].upstream_model,
                                       tasks[i].model));

            int64_t q = 0;
            if (price != nullptr && usage_quota(hook.result.get(), &q, err)) {
                json_object_set_new(u, "final_quota", json_integer(q));
                json_object_set(u, "usage", hook.result.get());
            } else {
                poll_log.push_back(tasks[i].task_id
                                   + ": extractUsageOnComplete: "
                                   + (err.empty() ? "no price" : err));
            }
        } else if (!hook.ok && !hook.plugin_fault()) {
            /* the runtime's trouble, not the task's: it is left as it was
               (nor settled at its reservation) and polled again later */
            json_array_set_new(updates.get(), i, unchanged(tasks[i]));
            poll_log.push_back(tasks[i].task_id
                               + ": extractUsageOnComplete: the plugin "
                               "runtime is unavailable (" + hook.message
                               + "); polled again later");
        } else if (!hook.ok) {
            poll_log.push_back(tasks[i].task_id
                               + ": extractUsageOnComplete failed: "
                               + hook.message);
        }
        return poll_usage();
    }

    case POLL_SAVED:
        return poll_saved();

    default:
        step = llmgw_tstep_t {};
        return emit(LLMGW_TSTEP_DONE);
    }
}


const llmgw_tstep_t *
llmgw_tjob_s::next()
{
    if (phase == FINISHED) {
        step = llmgw_tstep_t {};
        return emit(mode == POLL ? LLMGW_TSTEP_DONE : LLMGW_TSTEP_RESPOND);
    }

    return mode == POLL ? next_poll() : next_request();
}


namespace {

struct HostRoute {
    llmgw_troute_e       kind = LLMGW_TROUTE_NONE;
    llmgw_tproto_e       proto = LLMGW_TPROTO_NONE;
    const char          *allow = "";
};


/*
 * The paths the host serves for every plugin, whatever the method: the
 * host protocols' and the task API's (SUBMIT stands for /v1/tasks/{x},
 * a submit with POST, else a query).
 */
HostRoute
host_route(const std::vector<std::string_view> &seg)
{
    size_t n = seg.size();

    if (n < 2 || seg[0] != "v1") {
        return {};
    }

    if (seg[1] == "videos" && n == 2) {
        return { LLMGW_TROUTE_PROTOCOL, LLMGW_TPROTO_VIDEO_CREATE, "POST" };
    }
    if (seg[1] == "videos" && n == 3) {
        return { LLMGW_TROUTE_PROTOCOL, LLMGW_TPROTO_VIDEO_GET, "GET" };
    }
    if (seg[1] == "videos" && n == 4 && seg[3] == "content") {
        return { LLMGW_TROUTE_PROTOCOL, LLMGW_TPROTO_VIDEO_CONTENT,
                 "GET, HEAD" };
    }
    if (seg[1] == "responses" && n == 2) {
        return { LLMGW_TROUTE_PROTOCOL, LLMGW_TPROTO_RESPONSES_CREATE,
                 "POST" };
    }
    if (seg[1] == "responses" && n == 3) {
        return { LLMGW_TROUTE_PROTOCOL, LLMGW_TPROTO_RESPONSES_GET, "GET" };
    }
    if (seg[1] == "images" && n == 3
        && (seg[2] == "generations" || seg[2] == "edits"))
    {
        return { LLMGW_TROUTE_PROTOCOL,
                 seg[2] == "edits" ? LLMGW_TPROTO_IMAGE_EDIT
                                   : LLMGW_TPROTO_IMAGE_GENERATE,
                 "POST" };
    }

    if (seg[1] != "tasks") {
        return {};
    }

    /* a task's artifacts, and the content of one */
    if (n == 4 && seg[3] == "artifacts") {
        return { LLMGW_TROUTE_ARTIFACTS, LLMGW_TPROTO_NONE, "GET" };
    }
    if (n == 6 && seg[3] == "artifacts" && seg[5] == "content") {
        return { LLMGW_TROUTE_CONTENT, LLMGW_TPROTO_NONE, "GET, HEAD" };
    }
    if (n == 3) {
        return { LLMGW_TROUTE_SUBMIT, LLMGW_TPROTO_NONE, "GET, POST" };
    }

    return {};
}


/* Whether a list such as "GET, HEAD" names the method. */
bool
allows(std::string_view allow, std::string_view method)
{
    for (size_t at = 0; at < allow.size(); ) {
        size_t end = std::min(allow.find(", ", at), allow.size());

        if (allow.substr(at, end - at) == method) {
            return true;
        }
        at = end + 2;
    }

    return false;
}

} /* namespace */


bool
llmgw::host_task_path(std::string_view path)
{
    return host_route(segments(path)).kind != LLMGW_TROUTE_NONE;
}


/* ------------------------------------------------------------------ */
/* the C API                                                           */

extern "C" void
llmgw_task_route(const llmgw_snapshot_t *s, llmgw_str_t method,
    llmgw_str_t path, llmgw_troute_t *out)
{
    *out = llmgw_troute_t { LLMGW_TROUTE_NONE, -1, -1, 0, {},
                            LLMGW_TPROTO_NONE };

    try {
        std::string_view p = sv(path);
        std::string m = upper(sv(method));
        auto seg = segments(p);

        HostRoute h = host_route(seg);

        if (h.kind == LLMGW_TROUTE_SUBMIT && m != "POST") {
            h.kind = LLMGW_TROUTE_GET;
        }

        if (h.kind != LLMGW_TROUTE_NONE) {
            out->kind = h.kind;
            out->proto = h.proto;
            out->method_ok = allows(h.allow, m);
            std::snprintf(out->allow, sizeof(out->allow), "%s", h.allow);

            if (h.kind == LLMGW_TROUTE_SUBMIT) {
                out->plugin = snap_plugin_find(s, seg[2]);
            }
            return;
        }

        /* the most specific match serves; equal shapes (only a forced
           upload has them): the first plugin by key, then route order */
        size_t n = snap_plugin_count(s);
        bool path_seen = false;
        std::string_view best, best_path;
        long path_plugin = -1, path_route = -1;
        std::vector<std::string> methods;

        for (size_t i = 0; i < n; i++) {
            const json_t *manifest = snap_plugin(s, i, nullptr);
            size_t   k;
            json_t  *r;

            json_array_foreach(json_object_get(manifest, "routes"), k, r) {
                std::string_view rp = json_str(r, "path");

                if (!path_match(rp, p, nullptr)) {
                    continue;
                }
                path_seen = true;
                if (path_route < 0 || more_specific(rp, best_path)) {
                    /* whose native.error shapes a 405 on the path */
                    path_plugin = static_cast<long>(i);
                    path_route = static_cast<long>(k);
                    best_path = rp;
                }
                std::string rm = upper(json_str(r, "method"));
                if (rm.empty()) {
                    rm = "GET";
                }
                if (std::find(methods.begin(), methods.end(), rm)
                    == methods.end())
                {
                    methods.push_back(rm);
                }
                if (rm == m && (out->route < 0 || more_specific(rp, best))) {
                    out->kind = LLMGW_TROUTE_NATIVE;
                    out->plugin = static_cast<long>(i);
                    out->route = static_cast<long>(k);
                    out->method_ok = 1;
                    best = rp;
                }
            }
        }

        if (path_seen && out->route < 0) {
            out->kind = LLMGW_TROUTE_NATIVE;
            out->method_ok = 0;
            out->plugin = path_plugin;
            out->route = path_route;

            std::sort(methods.begin(), methods.end());
            std::string allow;
            for (const std::string &am : methods) {
                allow += (allow.empty() ? "" : ", ") + am;
            }
            if (allow.size() < sizeof(out->allow)) {
                std::memcpy(out->allow, allow.c_str(), allow.size() + 1);
            }
        }

    } catch (...) {
        out->kind = LLMGW_TROUTE_NONE;
    }
}


extern "C" llmgw_tjob_t *
llmgw_tjob_request(const llmgw_snapshot_t *s, const llmgw_task_conf_t *conf,
    const llmgw_troute_t *route, const llmgw_treq_t *req)
{
    try {
        auto j = std::make_unique<llmgw_tjob_s>();

        j->mode = llmgw_tjob_s::REQUEST;
        j->snap = s;
        j->conf = *conf;
        j->route_kind = route->kind;
        j->proto = route->proto;
        j->plugin = route->plugin;
        j->method = upper(sv(req->method));
        j->path = std::string(sv(req->path));
        j->args = std::string(sv(req->args));
        j->content_type = std::string(sv(req->content_type));
        j->body = sv(req->body);
        j->headers_json = std::string(sv(req->headers_json));
        j->request_id = std::string(sv(req->request_id));
        j->token = req->token;
        j->group = std::string(sv(req->group));
        j->group_ratio = req->group_ratio;
        j->seed = req->seed;
        j->origin = std::string(sv(req->origin));
        j->signed_link = req->signed_link != 0;

        if (j->plugin >= 0) {
            j->manifest = snap_plugin(s, static_cast<size_t>(j->plugin),
                                      &j->pinfo);
            j->sha = j->pinfo.sha;
            if (route->route >= 0) {
                j->route = json_array_get(json_object_get(j->manifest,
                                                          "routes"),
                                          static_cast<size_t>(route->route));
            }
        }

        return j.release();

    } catch (...) {
        return nullptr;
    }
}


extern "C" llmgw_tjob_t *
llmgw_tjob_refusal(const llmgw_snapshot_t *s, const llmgw_task_conf_t *conf,
    const llmgw_troute_t *route, const llmgw_treq_t *req,
    const llmgw_verdict_t *v)
{
    if (route->kind != LLMGW_TROUTE_NATIVE || route->plugin < 0
        || route->route < 0)
    {
        return nullptr;
    }

    llmgw_treq_t q {};
    q.method = req->method;
    q.path = req->path;
    q.args = req->args;
    q.request_id = req->request_id;

    std::unique_ptr<llmgw_tjob_s> j(llmgw_tjob_request(s, conf, route, &q));

    try {
        if (!j || j->manifest == nullptr || j->route == nullptr
            || !exports_has(j->manifest, "native.error"))
        {
            return nullptr;
        }

        j->phase = llmgw_tjob_s::REFUSED;
        j->err_status = v->status;
        j->err_type = v->type ? v->type : "gateway_error";
        j->err_code = v->code ? v->code : "";
        j->err_message = v->message;
        return j.release();

    } catch (...) {
        return nullptr;
    }
}


extern "C" llmgw_tjob_t *
llmgw_tjob_poll(const llmgw_snapshot_t *s, const llmgw_task_conf_t *conf,
    const char *tasks_json, size_t len, llmgw_str_t owner)
{
    try {
        Json list = json_parse(tasks_json, len);

        if (!json_is_array(list.get()) || json_array_size(list.get()) == 0) {
            return nullptr;
        }

        auto j = std::make_unique<llmgw_tjob_s>();

        j->mode = llmgw_tjob_s::POLL;
        j->snap = s;
        j->conf = *conf;
        j->owner = std::string(sv(owner));

        size_t   i;
        json_t  *row;

        json_array_foreach(list.get(), i, row) {
            j->tasks.push_back(task_row(row));
        }

        long p = snap_poll_plugin_find(s, j->tasks[0].plugin);
        const json_t *m = p >= 0 ? snap_plugin(s, static_cast<size_t>(p),
                                               nullptr)
                                 : nullptr;
        j->batch = json_str(m, "fetchMode") == "batch";

        return j.release();

    } catch (...) {
        return nullptr;
    }
}


extern "C" size_t
llmgw_task_poll_jobs(const llmgw_snapshot_t *s, const llmgw_task_conf_t *conf,
    const char *claim_json, size_t len, llmgw_str_t owner,
    llmgw_balance_cb learn, void *arg, llmgw_tjob_t ***jobs, size_t *ntasks)
{
    *ntasks = 0;
    *jobs = nullptr;

    std::vector<llmgw_tjob_t *> out;

    try {
        Json claim = json_parse(claim_json, len);
        json_t *tasks = json_object_get(claim.get(), "tasks");

        if (learn != nullptr && json_is_object(claim.get())) {
            balances_answered(claim.get(), learn, arg);
        }
        Json plan(json_array());

        /* batch plugins: one open group per plugin and channel */
        std::vector<std::pair<std::string, json_t *>> open;

        size_t   i;
        json_t  *row;

        json_array_foreach(tasks, i, row) {
            (*ntasks)++;

            std::string_view key = json_str(row, "plugin_key");
            long p = snap_poll_plugin_find(s, key);
            const json_t *m = p >= 0 ? snap_plugin(s, static_cast<size_t>(p),
                                                   nullptr)
                                     : nullptr;

            if (json_str(m, "fetchMode") != "batch") {
                json_t *one = json_array();
                json_array_append(one, row);
                json_array_append_new(plan.get(), one);
                continue;
            }

            std::string group = std::string(key) + "\n"
                                + std::to_string(json_int(row, "channel_id",
                                                          0));
            json_t *g = nullptr;

            for (auto &o : open) {
                if (o.first == group
                    && json_array_size(o.second) < conf->batch_size)
                {
                    g = o.second;
                }
            }

            if (g == nullptr) {
                g = json_array();
                json_array_append_new(plan.get(), g);
                open.emplace_back(group, g);
            }

            json_array_append(g, row);
        }

        json_t *list;

        json_array_foreach(plan.get(), i, list) {
            std::string text = json_dump(list);
            llmgw_tjob_t *j = llmgw_tjob_poll(s, conf, text.data(),
                                              text.size(), owner);
            if (j != nullptr) {
                out.push_back(j);
            }
        }

        llmgw_tjob_t **arr = static_cast<llmgw_tjob_t **>(
                         std::malloc((out.size() + 1) * sizeof(*arr)));
        if (arr == nullptr) {
            throw std::bad_alloc();
        }

        std::copy(out.begin(), out.end(), arr);
        *jobs = arr;
        return out.size();

    } catch (...) {
        for (llmgw_tjob_t *j : out) {
            delete j;
        }
        return 0;
    }
}


extern "C" int64_t
llmgw_tjob_channel(const llmgw_tjob_t *j)
{
    return j->channel_id();
}


extern "C" size_t
llmgw_tjob_ntasks(const llmgw_tjob_t *j)
{
    return j->mode == llmgw_tjob_s::POLL ? j->tasks.size() : 0;
}


extern "C" llmgw_buf_t
llmgw_task_headers_json(const llmgw_str_t *names, const llmgw_str_t *values,
    size_t n)
{
    try {
        Json out(json_object());

        for (size_t i = 0; i < n; i++) {
            std::string name(sv(names[i]));
            std::transform(name.begin(), name.end(), name.begin(),
                           [](unsigned char c) {
                               return static_cast<char>(std::tolower(c));
                           });

            /* the client's credentials are not the plugin's business */
            if (name == "authorization" || name == "x-api-key"
                || name == "cookie" || name == "x-goog-api-key"
                || name == "proxy-authorization")
            {
                continue;
            }

            json_t *old = json_object_getn(out.get(), name.data(),
                                           name.size());
            std::string v(utf8_prefix(sv(values[i]), 8192));

            if (old != nullptr) {
                v = std::string(json_string_value(old)) + ", " + v;
            }

            json_object_setn_new(out.get(), name.data(), name.size(), jstr(v));
        }

        return make_buf(json_dump(out.get()));

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" void
llmgw_tjob_free(llmgw_tjob_t *j)
{
    delete j;
}


extern "C" const llmgw_tstep_t *
llmgw_tjob_next(llmgw_tjob_t *j)
{
    static llmgw_tstep_t  broken;

    try {
        return j->next();

    } catch (const std::exception &e) {
        /* a poll job has no client to answer: it ends (its lease lets
           another pass take its tasks) */
        if (j->in_request_poll) {
            j->in_request_poll = false;
            j->mode = llmgw_tjob_s::REQUEST;
        }
        if (j->mode != llmgw_tjob_s::POLL) {
            try {
                return j->fail(500, "gateway_error", "internal_error",
                               std::string("the task engine failed: ")
                               + e.what());
            } catch (...) {
            }
        }
    } catch (...) {
    }

    if (j->in_request_poll) {
        j->in_request_poll = false;
        j->mode = llmgw_tjob_s::REQUEST;
    }

    broken = llmgw_tstep_t {};
    broken.kind = j->mode == llmgw_tjob_s::POLL ? LLMGW_TSTEP_DONE
                                                 : LLMGW_TSTEP_RESPOND;
    broken.status = 500;
    broken.body = LLMGW_STR("{\"error\":{\"message\":\"internal error\","
                            "\"type\":\"gateway_error\",\"code\":"
                            "\"internal_error\"}}");
    return &broken;
}


namespace {

/* v with every copy of the credential in its strings and member names
   replaced (redact()); nullptr when it holds none */
json_t *
redacted_json(const json_t *v, std::string_view credential)
{
    if (json_is_string(v)) {
        std::string_view s(json_string_value(v), json_string_length(v));
        std::string r = redact(s, credential);
        return r == s ? nullptr : json_stringn(r.data(), r.size());
    }

    bool changed = false;
    Json out(json_is_array(v) ? json_array() : json_object());

    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            json_t *n = redacted_json(e, credential);
            changed = changed || n != nullptr;
            json_array_append_new(out.get(), n ? n : json_incref(e));
        }
    } else if (json_is_object(v)) {
        const char *k;
        json_t *e;
        json_object_foreach(const_cast<json_t *>(v), k, e) {
            json_t *n = redacted_json(e, credential);
            std::string name = redact(k, credential);
            changed = changed || n != nullptr || name != k;
            json_object_set_new(out.get(), name.c_str(),
                                n ? n : json_incref(e));
        }
    }

    return changed ? out.release() : nullptr;
}

} /* namespace */


/*
 * What a plugin returns is stored, shown to the client or billed: the
 * channel credential is taken out of it (a vendor answer that quotes the
 * key, or a plugin that copies ctx.apiKey), and so is the message of a
 * hook that failed.  Only what the build hooks return, the requests sent to
 * the vendor, carries it.
 */
void
llmgw_tjob_s::redact_hook_result()
{
    if (hook.ok && hook_name_.compare(0, 5, "build") == 0) {
        return;
    }

    const llmgw_channel_t *c = nullptr;
    if (mode == POLL) {
        std::string_view url;
        const json_t *settings = nullptr;
        if (!tasks.empty()) {
            c = snap_poll_channel(snap, tasks[0].channel_id, &url, &settings);
        }
    } else if (current < nchannels) {
        c = channels[current];
    }

    if (c == nullptr || std::strlen(c->key) < kCredentialMinBytes) {
        return;
    }

    if (!hook.ok) {
        /* a throw's message (any hook's, build's too) is logged and shown */
        hook.message = redact(hook.message, c->key);
        return;
    }

    std::string text = json_dump(hook.result.get());
    bool holds = false;
    for (const std::string &f : credential_forms(c->key)) {
        holds = holds || text.find(f) != std::string::npos;
    }

    if (holds) {
        json_t *r = redacted_json(hook.result.get(), c->key);
        if (r != nullptr) {
            hook.result = Json(r);
        }
    }
}


extern "C" void
llmgw_tjob_hook_done(llmgw_tjob_t *j, int rc, const char *reply, size_t len)
{
    j->busy = false;

    try {
        j->hook = hook_reply(rc, reply, len);
        j->redact_hook_result();
    } catch (...) {
        j->hook = HookReply {};
        j->hook.kind = "internal";
    }
}


extern "C" void
llmgw_tjob_http_done(llmgw_tjob_t *j, int rc, int flags, int status,
    const llmgw_str_t *names, const llmgw_str_t *values, size_t nheaders,
    const char *body, size_t len, const char *err)
{
    try {
        if (j->sse_mode_step) {
            /* the end of a stream (its header came through stream calls) */
            j->stream_ended = true;
            if (rc != 0 && !j->stream_cancelled && j->stream_error.empty()) {
                /* the first reason: a refusal of ours ends the call too */
                j->stream_error = (flags & LLMGW_THTTP_TIMED_OUT)
                                  ? "no event within the idle "
                                              "timeout"
                                            : std::string(err ? err
                                                              : "read failed");
                if (j->http_status == 0) {
                    /* no answer at all: judged as a JSON submit's is */
                    j->transport_error = err ? err : "the request failed";
                    j->transport_timeout =
                        (flags & LLMGW_THTTP_TIMED_OUT) != 0;
                    j->transport_sent = (flags & LLMGW_THTTP_SENT) != 0;
                }
            }
            return;
        }

        j->busy = false;
        j->transport_error.clear();
        j->transport_timeout = (flags & LLMGW_THTTP_TIMED_OUT) != 0;
        j->transport_sent = (flags & LLMGW_THTTP_SENT) != 0;

        if (rc != 0) {
            j->transport_error = err ? err : "the request failed";
            return;
        }

        j->http_status = status;
        llmgw_buf_t h = llmgw_headers_json(names, values, nheaders);
        j->http_headers = json_parse(h.data, h.len);
        llmgw_buf_free(&h);
        j->http_body.assign(body ? body : "", len);

    } catch (...) {
        j->transport_error = "out of memory";
    }
}


namespace {

void
queue_event(void *arg, const llmgw_sse_event_t *ev)
{
    auto *j = static_cast<llmgw_tjob_t *>(arg);
    llmgw_buf_t b = llmgw_sse_event_json(ev);

    if (b.data != nullptr) {
        j->events.emplace_back(b.data, b.len);
    }
    llmgw_buf_free(&b);
}

} /* namespace */


extern "C" int
llmgw_tjob_stream_headers(llmgw_tjob_t *j, int status,
    const llmgw_str_t *names, const llmgw_str_t *values, size_t nheaders)
{
    try {
        j->http_status = status;
        llmgw_buf_t h = llmgw_headers_json(names, values, nheaders);
        j->http_headers = json_parse(h.data, h.len);
        llmgw_buf_free(&h);

        if (status < 200 || status > 299) {
            j->stream_ok = false;
            return 0;                       /* read the error body */
        }

        bool es = false;
        for (size_t i = 0; i < nheaders; i++) {
            if (sv(names[i]) == "content-type"
                && llmgw_is_event_stream(values[i]))
            {
                es = true;
            }
        }

        if (!es) {
            j->stream_error = "the upstream did not answer with an event "
                              "stream";
            return j->busy ? -1 : 1;
        }

        j->stream_ok = true;
        j->submit_taken = true;
        return 0;

    } catch (...) {
        return -1;
    }
}


extern "C" int
llmgw_tjob_stream_data(llmgw_tjob_t *j, const char *data, size_t len)
{
    try {
        if (!j->stream_ok) {
            if (j->http_body.size() < kErrBody) {
                j->http_body.append(data, std::min(len, kErrBody
                                                   - j->http_body.size()));
            }
            return 0;
        }

        if (j->stream_cancelled) {
            return -1;
        }

        if (llmgw_sse_feed(j->sse_parser, data, len, queue_event, j) != 0) {
            j->stream_error = "an event is larger than 1 MiB";
            return j->busy ? -1 : 1;
        }

        return (!j->busy && j->phase == llmgw_tjob_s::STREAMING
                && !j->events.empty()) ? 1 : 0;

    } catch (...) {
        return -1;
    }
}


extern "C" int
llmgw_tjob_pipe_head(llmgw_tjob_t *j, int status, const llmgw_str_t *names,
    const llmgw_str_t *values, size_t nheaders, llmgw_tpipe_head_t *head)
{
    try {
        return j->pipe_head(status, names, values, nheaders, head);
    } catch (...) {
        j->pipe_error = "out of memory";
        return 0;
    }
}


extern "C" void
llmgw_tjob_sql_done(llmgw_tjob_t *j, const char *json, size_t len,
    const char *err)
{
    j->busy = false;
    j->sql_error.clear();
    j->sql_result.reset();

    try {
        if (err != nullptr) {
            j->sql_error = err;
            j->sql_result = Json(json_array());
            return;
        }

        j->sql_result = json_parse(json, len);
        if (!j->sql_result) {
            j->sql_error = "unreadable answer";
            j->sql_result = Json(json_array());
        }

    } catch (...) {
        j->sql_error = "out of memory";
    }
}


extern "C" void
llmgw_tjob_reserve_done(llmgw_tjob_t *j, const llmgw_verdict_t *v)
{
    j->busy = false;
    j->reserve_refusal = v ? *v : llmgw_verdict_t {};
}


extern "C" void
llmgw_tjob_log(const llmgw_tjob_t *j, llmgw_tjob_log_t *out)
{
    out->model = str(j->model);
    out->upstream_model = str(j->sent_model);
    out->channel = j->sent_channel;
    out->tries = j->tries;
    out->priced = j->price != nullptr;
    out->task_id = str(j->task_id);
    out->request_id = str(j->request_id);
}


extern "C" const llmgw_tstep_t *
llmgw_tjob_wait_over(llmgw_tjob_t *j)
{
    try {
        return j->answer_wait_now();
    } catch (...) {
        return nullptr;
    }
}


extern "C" int
llmgw_tjob_charged(const llmgw_tjob_t *j)
{
    return j->charged;
}


/* A job waiting to read a submit the vendor took goes on without its
   request, until the task is stored. */
extern "C" int
llmgw_tjob_must_go_on(const llmgw_tjob_t *j)
{
    return j->phase == llmgw_tjob_s::RUNTIME_SLEPT;
}


extern "C" int
llmgw_tjob_polling_for_request(const llmgw_tjob_t *j)
{
    return j->in_request_poll;
}


extern "C" int
llmgw_tjob_busy(const llmgw_tjob_t *j)
{
    return j->busy;
}


extern "C" void
llmgw_tjob_set_sse_idle(llmgw_tjob_t *j, int64_t ms)
{
    j->sse_idle_ms = ms;
}


extern "C" size_t
llmgw_tjob_poll_notes(const llmgw_tjob_t *j, int *auth_warning,
    const char **first)
{
    *auth_warning = j->auth_warning;
    *first = j->poll_log.empty() ? nullptr : j->poll_log[0].c_str();
    return j->poll_log.size();
}
