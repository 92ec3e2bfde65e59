/*
 * The task engine: submit, query and poll flows of task plugins.
 *
 * The engine makes every decision and does no I/O.  A job is a small state
 * machine: the caller asks it for the next step (call a hook in v8_host,
 * send an HTTP request, run a SQL statement, reserve quota, answer the
 * client), performs that step however it likes (nginx does it on its event
 * loop), and hands the result back.  Unit tests drive the same machine with
 * canned results.
 */

#ifndef LLMGW_TASK_H
#define LLMGW_TASK_H

#include "llmgw.h"
#include "descriptor.h"

#ifdef __cplusplus
extern "C" {
#endif


/* The default of llmgw_task_wait_timeout: the spec's
   TASK_PLUGIN_PROTOCOL_TIMEOUT_SECONDS, 600 s. */
#define LLMGW_TASK_WAIT_DEFAULT_MS  (600 * 1000)

/* Limits and intervals (nginx directives). */
typedef struct {
    int64_t   poll_interval_ms;
    int64_t   timeout_ms;          /* outer deadline of a task */
    int64_t   max_failures;        /* TASK_POLL_MAX_FAILURES */
    size_t    batch_size;          /* tasks per batch query */
    size_t    max_file_bytes;
    size_t    max_total_bytes;
    int       max_redirects;
    int       max_tries;           /* channels tried by one submit */
    int64_t   wait_ms;             /* host_image: waiting for a task */
    int64_t   http_timeout_ms;     /* llmgw_task_http_timeout: a request's
                                      b64_json downloads, all together;
                                      0: no bound */
    int64_t   lease_ms;            /* a poller's hold on a task */
    /* artifact links: llmgw_crypto_secret (empty: links are not signed),
     * the address they start with (empty: the request's own), their life */
    llmgw_str_t  link_secret;
    llmgw_str_t  public_address;
    int64_t      link_ttl_s;
} llmgw_task_conf_t;


/* ---- what a request asks for ---- */

typedef enum {
    LLMGW_TROUTE_NONE = 0,
    LLMGW_TROUTE_SUBMIT,           /* POST /v1/tasks/{pluginKey} */
    LLMGW_TROUTE_GET,              /* GET /v1/tasks/{taskId} */
    LLMGW_TROUTE_NATIVE,           /* a plugin's meta.routes entry */
    LLMGW_TROUTE_PROTOCOL,         /* a host protocol's path */
    LLMGW_TROUTE_ARTIFACTS,        /* GET /v1/tasks/{taskId}/artifacts */
    LLMGW_TROUTE_CONTENT           /* GET|HEAD .../artifacts/{key}/content */
} llmgw_troute_e;

/* The host protocol paths served (meta.protocols). */
typedef enum {
    LLMGW_TPROTO_NONE = 0,
    LLMGW_TPROTO_VIDEO_CREATE,     /* POST /v1/videos */
    LLMGW_TPROTO_VIDEO_GET,        /* GET /v1/videos/{id} */
    LLMGW_TPROTO_VIDEO_CONTENT,    /* GET|HEAD /v1/videos/{id}/content */
    LLMGW_TPROTO_IMAGE_GENERATE,   /* POST /v1/images/generations */
    LLMGW_TPROTO_IMAGE_EDIT,       /* POST /v1/images/edits */
    LLMGW_TPROTO_RESPONSES_CREATE, /* POST /v1/responses */
    LLMGW_TPROTO_RESPONSES_GET     /* GET /v1/responses/{id} */
} llmgw_tproto_e;

typedef struct {
    llmgw_troute_e  kind;
    long            plugin;        /* index in the snapshot, -1 */
    long            route;         /* index in meta.routes, -1 */
    int             method_ok;
    char            allow[64];     /* the path's methods: "GET, POST" */
    llmgw_tproto_e  proto;         /* LLMGW_TROUTE_PROTOCOL's */
} llmgw_troute_t;

/* Which task route, if any, serves a request (no body needed yet). */
void llmgw_task_route(const llmgw_snapshot_t *s, llmgw_str_t method,
    llmgw_str_t path, llmgw_troute_t *out);


/* ---- jobs ---- */

typedef struct llmgw_tjob_s  llmgw_tjob_t;

typedef enum {
    LLMGW_TSTEP_HOOK = 1,          /* sha + body: llmgw_tjob_hook_done */
    LLMGW_TSTEP_HTTP,              /* out: llmgw_tjob_http_done, or the
                                      stream calls when out->sse */
    LLMGW_TSTEP_HTTP_CANCEL,       /* stop the stream, then go on */
    LLMGW_TSTEP_SQL,               /* sql + params: llmgw_tjob_sql_done */
    LLMGW_TSTEP_RESERVE,           /* amount: llmgw_tjob_reserve_done */
    LLMGW_TSTEP_WAIT,              /* nothing to do until a stream call */
    LLMGW_TSTEP_SLEEP,             /* amount ms, then llmgw_tjob_next */
    LLMGW_TSTEP_PIPE,              /* out: the answer to it is the client's
                                      (llmgw_tjob_pipe_head), head_only for
                                      HEAD; a failure before its head:
                                      llmgw_tjob_http_done */
    LLMGW_TSTEP_EMIT,              /* body: the next bytes of an event
                                      stream to the client (the first
                                      sends its head: status, text/event-
                                      stream); then llmgw_tjob_next.  A
                                      RESPOND after it ends the stream
                                      with its body */
    LLMGW_TSTEP_RESPOND,           /* status + body; the job is finished */
    LLMGW_TSTEP_DONE               /* a poll job is finished */
} llmgw_tstep_e;

typedef struct {
    llmgw_tstep_e            kind;
    const char              *sha;
    llmgw_str_t              body;       /* HOOK frame body, RESPOND body */
    const llmgw_outbound_t  *out;
    int64_t                  timeout_ms; /* HTTP: a stream's idle timeout,
                                           after its head */
    int                      resend;     /* HTTP: may be sent twice */
    int64_t                  deadline_ms; /* HTTP: the call ends within
                                             this many ms, whatever its
                                             timeouts (a request's wait
                                             for its task); HOOK: past
                                             it, llmgw_tjob_wait_over()
                                             answers the client; 0: none */
    const char              *sql;
    const char              *params[4];
    int                      nparams;
    int                      learn;      /* SQL answer carries balances */
    int64_t                  amount;
    int                      status;
    int64_t                  channel_id; /* the channel a step is for */
    int                      head_only;  /* PIPE: a HEAD request */
} llmgw_tstep_t;

/* The client request a submit or query job serves. */
typedef struct {
    llmgw_str_t               method;
    llmgw_str_t               path;
    llmgw_str_t               args;          /* query string */
    llmgw_str_t               content_type;
    llmgw_str_t               body;          /* borrowed: it must stay valid
                                                until the job is freed */
    llmgw_str_t               headers_json;  /* {"name": "value"} */
    llmgw_str_t               request_id;
    const llmgw_token_t      *token;
    llmgw_str_t               group;
    double                    group_ratio;
    uint64_t                  seed;
    llmgw_str_t               origin;        /* "scheme://host" it came to */
    int                       signed_link;   /* a content request allowed by
                                                its signed link: no token */
} llmgw_treq_t;

/* NULL only when out of memory.  The snapshot must outlive the job. */
llmgw_tjob_t *llmgw_tjob_request(const llmgw_snapshot_t *s,
    const llmgw_task_conf_t *conf, const llmgw_troute_t *route,
    const llmgw_treq_t *req);

/*
 * A refusal the gateway makes on a plugin's native route before a job
 * could start (the key, its address, group and quota, the rate limit, the
 * method), shaped by the plugin's native.error: a job whose steps call the
 * hook with the route's context (method, path, params, query; the body
 * none) and answer with its envelope, or in the error contract when the
 * hook fails or returns no JSON object.  NULL when the route's plugin
 * exports no native.error (or out of memory): the caller answers in the
 * contract.  The request's token and body are not used.
 */
llmgw_tjob_t *llmgw_tjob_refusal(const llmgw_snapshot_t *s,
    const llmgw_task_conf_t *conf, const llmgw_troute_t *route,
    const llmgw_treq_t *req, const llmgw_verdict_t *v);

/*
 * A poll job over tasks claimed by llmgw_task_claim() (their JSON rows), all
 * of one plugin and channel when the plugin polls in batches, else one task.
 */
llmgw_tjob_t *llmgw_tjob_poll(const llmgw_snapshot_t *s,
    const llmgw_task_conf_t *conf, const char *tasks_json, size_t len,
    llmgw_str_t owner);

/*
 * The poll jobs for an llmgw_task_claim() answer: one per task, or one per
 * batch of up to batch_size tasks of a batch plugin on one channel.  *jobs
 * is malloc'ed (free() it after taking the jobs); returns their number.
 * The balances the claim's refunds of expired tasks left go to learn (when
 * not NULL) with their revisions, as llmgw_flush_answer() gives them.
 */
size_t llmgw_task_poll_jobs(const llmgw_snapshot_t *s,
    const llmgw_task_conf_t *conf, const char *claim_json, size_t len,
    llmgw_str_t owner, llmgw_balance_cb learn, void *arg,
    llmgw_tjob_t ***jobs, size_t *ntasks);

/* The channel a job's current step is for. */
int64_t llmgw_tjob_channel(const llmgw_tjob_t *j);

/* The tasks a poll job holds (0 for a request job). */
size_t llmgw_tjob_ntasks(const llmgw_tjob_t *j);

/*
 * What the access log and the metrics say of a request job, as of a chat
 * request: the client's model (whether it has a price), the channel the
 * submit was last sent to (NULL: none) with the model name it was sent as,
 * and how many channels it was sent to.  The strings live as long as the
 * job, the channel as long as the snapshot.
 */
typedef struct {
    llmgw_str_t              model;
    llmgw_str_t              upstream_model;
    const llmgw_channel_t   *channel;
    unsigned                 tries;
    int                      priced;
    llmgw_str_t              task_id;       /* empty: none created */
    llmgw_str_t              request_id;
} llmgw_tjob_log_t;

void llmgw_tjob_log(const llmgw_tjob_t *j, llmgw_tjob_log_t *out);

/* A client's request headers as {name: value} for DriverContext, without
 * the client's credentials. */
llmgw_buf_t llmgw_task_headers_json(const llmgw_str_t *names,
    const llmgw_str_t *values, size_t n);

void llmgw_tjob_free(llmgw_tjob_t *j);

const llmgw_tstep_t *llmgw_tjob_next(llmgw_tjob_t *j);

/* rc 0: reply is the helper's JSON reply; else reply is the reason (rc 1:
   the reply was larger than the gateway takes: the plugin's doing). */
void llmgw_tjob_hook_done(llmgw_tjob_t *j, int rc, const char *reply,
    size_t len);

/* What is known of a failed call. */
#define LLMGW_THTTP_TIMED_OUT  1
#define LLMGW_THTTP_SENT       2      /* the request was written whole */

/* rc 0 and the response; else err says why and flags what happened. */
void llmgw_tjob_http_done(llmgw_tjob_t *j, int rc, int flags, int status,
    const llmgw_str_t *names, const llmgw_str_t *values, size_t nheaders,
    const char *body, size_t len, const char *err);

/*
 * A streamed (SSE) response: the header and body bytes as they come; the
 * end (or a failure) through llmgw_tjob_http_done.  Each returns -1 to stop
 * the stream, 0 to go on reading, 1 to go on and call llmgw_tjob_next now.
 */
int llmgw_tjob_stream_headers(llmgw_tjob_t *j, int status,
    const llmgw_str_t *names, const llmgw_str_t *values, size_t nheaders);
int llmgw_tjob_stream_data(llmgw_tjob_t *j, const char *data, size_t len);

/*
 * The head of the answer to a PIPE step.  1: it goes to the client as
 * *head says (status and the headers passed on, valid while the job
 * lives), and the body after it; the job is finished.  0: the call is
 * stopped, and llmgw_tjob_next says what follows (a redirect followed,
 * an error answered).
 */
typedef struct {
    int          status;
    llmgw_str_t  names[12];
    llmgw_str_t  values[12];
    size_t       n;
} llmgw_tpipe_head_t;

int llmgw_tjob_pipe_head(llmgw_tjob_t *j, int status,
    const llmgw_str_t *names, const llmgw_str_t *values, size_t nheaders,
    llmgw_tpipe_head_t *head);

/*
 * A signed artifact link (?expires=&signature=) on a content path: 1 the
 * query has neither (the API key decides), 0 valid, -1 not (*v: 403
 * invalid_signature or link_expired).
 */
int llmgw_artifact_link_check(llmgw_str_t secret, llmgw_str_t path,
    llmgw_str_t args, int64_t now, llmgw_verdict_t *v);

/* err NULL: the statement's single JSON value. */
void llmgw_tjob_sql_done(llmgw_tjob_t *j, const char *json, size_t len,
    const char *err);

/* v NULL: reserved. */
void llmgw_tjob_reserve_done(llmgw_tjob_t *j, const llmgw_verdict_t *v);

/*
 * The deadline_ms of a HOOK step passed while its answer is awaited: the
 * answer to give the client now (a RESPOND step, 504 task_timeout; the
 * request is then the job's no more), or NULL when there is none to give.
 * The job goes on: the hook's answer is handed to it as ever, and it ends
 * with a RESPOND that nobody is to be sent.
 */
const llmgw_tstep_t *llmgw_tjob_wait_over(llmgw_tjob_t *j);

/* Whether the job has charged the reservation into the database. */
int llmgw_tjob_charged(const llmgw_tjob_t *j);

/* Whether the job goes on without its request: it waits to read a submit
   the vendor took. */
int llmgw_tjob_must_go_on(const llmgw_tjob_t *j);

/* Whether the job polls its task for a request that waits for it: a poll
   holds the task's lease until its answer is saved. */
int llmgw_tjob_polling_for_request(const llmgw_tjob_t *j);

/* Whether a step is in flight (its result not handed back yet). */
int llmgw_tjob_busy(const llmgw_tjob_t *j);
void llmgw_tjob_set_sse_idle(llmgw_tjob_t *j, int64_t ms);
/* After a poll job: whether the vendor refused the channel's credentials
 * (401/403, worth a warning), and notes worth logging. */
size_t llmgw_tjob_poll_notes(const llmgw_tjob_t *j, int *auth_warning,
    const char **first);


#ifdef __cplusplus
}
#endif

#endif /* LLMGW_TASK_H */
