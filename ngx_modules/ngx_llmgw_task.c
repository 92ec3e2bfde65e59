/*
 * The task engine's glue: runs the jobs of src/task.cpp on nginx's event
 * loop (client requests on task routes, and the poller), performing each
 * step they ask for: a hook call in v8_host, an HTTP request through the
 * internal client, a PostgreSQL statement, a reservation, the answer.
 *
 * A job lives in a runner allocated outside any pool: a client request may
 * end while a step is in flight, and a poll job has no request at all.  The
 * runner holds its own references to the snapshot and the key record.
 */

#include "ngx_llmgw.h"
#include "ngx_llmgw_http.h"
#include "task.h"

#include <sys/mman.h>


typedef struct {
    u_char                    *body;
    size_t                     body_len;
    unsigned                   body_mapped:1;
} ngx_llmgw_task_body_t;


typedef struct ngx_llmgw_runner_s  ngx_llmgw_runner_t;

/* how often a worker with polls under way looks whether it is stopping */
#define NGX_LLMGW_POLL_STOP_WATCH  200       /* ms */
/* before a statement the pool could not take is answered as failed */
#define NGX_LLMGW_SQL_PAUSE        1000      /* ms */
/* a poll's call to the vendor times out this long before the lease's 7/8 */
#define NGX_LLMGW_LEASE_MARGIN     100       /* ms */
/* content passed to a client: buffers, and the bytes not yet sent to it
 * above which the vendor is not read (and below which it is again) */
#define NGX_LLMGW_PIPE_BUFFER      (32 * 1024)
#define NGX_LLMGW_PIPE_HIGH        (512 * 1024)
#define NGX_LLMGW_PIPE_LOW         (128 * 1024)

struct ngx_llmgw_runner_s {
    llmgw_tjob_t              *job;
    llmgw_snapshot_t          *snapshot;
    llmgw_token_t             *token;
    ngx_http_request_t        *request;     /* NULL for a poll job */
    ngx_llmgw_http_t          *http;        /* an HTTP call in flight */
    ngx_llmgw_hook_t          *hook;        /* a hook call in flight */
    int64_t                    channel_id;
    ngx_msec_t                 claimed;     /* a poll job's claim */
    ngx_msec_t                 first_try;   /* a submit's first send */
    ngx_uint_t                 tries;       /* channels it was sent to */
    ngx_uint_t                 sent;        /* the HTTP request is out */
    void                      *busy;        /* its channel's poll count */
    ngx_uint_t                 ntasks;      /* a poll job's tasks */
    ngx_queue_t                queue;       /* the poller's lists */
    ngx_pool_cleanup_t        *cleanup;     /* on the request's pool */
    ngx_llmgw_task_body_t      body;        /* the client's, owned */
    ngx_event_t                lease_end;   /* a poll job's: no call to the
                                             * vendor outlives its lease */
    ngx_event_t                sql_later;   /* a statement the pool took
                                             * not: answered after a pause */
    ngx_event_t                sleep;       /* a request waiting for its
                                             * task, between two looks */
    ngx_event_t                wait_end;    /* a request's wait for its
                                             * task, ending while a hook
                                             * call is under way */
    unsigned                   inflight:1;  /* a step's callback pending */
    unsigned                   streaming:1; /* an SSE response is read */
    unsigned                   learn:1;     /* the SQL answer has balances */
    unsigned                   gone:1;      /* the request ended */
    unsigned                   driving:1;
    unsigned                   poll:1;      /* a poll job */
    unsigned                   lease_over:1;
    unsigned                   pipe:1;      /* a content request out */
    unsigned                   piping:1;    /* its answer is the client's */
    unsigned                   pipe_paused:1;
    unsigned                   emitting:1;  /* an event stream's head sent */
    ngx_chain_t               *pipe_free;   /* buffers, of the request */
    ngx_chain_t               *pipe_busy;
};


static void ngx_llmgw_task_drive(ngx_llmgw_runner_t *rn);
static void ngx_llmgw_task_watch(ngx_http_request_t *r);
static void ngx_llmgw_task_finish(ngx_llmgw_runner_t *rn,
    ngx_http_request_t *r, const llmgw_tstep_t *st);
static void ngx_llmgw_poll_tick(ngx_event_t *ev);
static void ngx_llmgw_poll_job_done(ngx_llmgw_runner_t *rn);
static void ngx_llmgw_poll_lease_end(ngx_event_t *ev);
static void ngx_llmgw_poll_left(ngx_llmgw_runner_t *rn, const char *why);
static void ngx_llmgw_poll_stop_watch(ngx_event_t *ev);
static void ngx_llmgw_task_sql_later(ngx_event_t *ev);
static void ngx_llmgw_poll_schedule(ngx_msec_t delay);
static void ngx_llmgw_task_body_free(ngx_llmgw_task_body_t *b);
static ngx_llmgw_runner_t *ngx_llmgw_task_runner(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, llmgw_tjob_t *job, ngx_llmgw_task_body_t *body);
static llmgw_str_t ngx_llmgw_task_args(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx);
static void ngx_llmgw_task_respond(ngx_http_request_t *r,
    const llmgw_tstep_t *st);
static void ngx_llmgw_task_tried(ngx_llmgw_runner_t *rn);
static void ngx_llmgw_task_log_vars(ngx_llmgw_runner_t *rn,
    ngx_http_request_t *r);
static void ngx_llmgw_task_detach(ngx_llmgw_runner_t *rn,
    ngx_http_request_t *r);
static ngx_int_t ngx_llmgw_pipe_headers(void *data,
    ngx_llmgw_http_resp_t *resp);
static ngx_int_t ngx_llmgw_pipe_data(void *data, u_char *p, size_t len);
static void ngx_llmgw_pipe_done(void *data, ngx_int_t rc,
    ngx_llmgw_http_resp_t *resp, const char *err);
static void ngx_llmgw_pipe_write(ngx_http_request_t *r);
static void ngx_llmgw_pipe_flow(ngx_llmgw_runner_t *rn,
    ngx_http_request_t *r);
static void ngx_llmgw_emit_release(ngx_llmgw_runner_t *rn,
    ngx_http_request_t *r);
static ngx_int_t ngx_llmgw_task_emit(ngx_llmgw_runner_t *rn,
    ngx_http_request_t *r, const llmgw_tstep_t *st, ngx_uint_t last);


static ngx_llmgw_main_conf_t  *ngx_llmgw_task_mcf;
static ngx_log_t              *ngx_llmgw_task_log;
static llmgw_task_conf_t       ngx_llmgw_task_conf;
static ngx_uint_t              ngx_llmgw_pipe_tag;    /* its buffers' tag */
static ngx_event_t             ngx_llmgw_poll_ev;
static ngx_event_t             ngx_llmgw_poll_stop_ev;
static u_char                  ngx_llmgw_poll_owner[128];

/* the poller: jobs waiting for their channel, jobs running */
static ngx_queue_t             ngx_llmgw_poll_waiting;
static ngx_queue_t             ngx_llmgw_poll_active;
static ngx_uint_t              ngx_llmgw_poll_running;
static ngx_uint_t              ngx_llmgw_poll_abandoned;
static ngx_uint_t              ngx_llmgw_poll_held;      /* their tasks */
static ngx_uint_t              ngx_llmgw_poll_claiming;
static ngx_uint_t              ngx_llmgw_poll_go_on;     /* right away */
static ngx_msec_t              ngx_llmgw_poll_last;      /* last claim */


ngx_int_t
ngx_llmgw_task_init_process(ngx_cycle_t *cycle, ngx_llmgw_main_conf_t *mcf)
{
    u_char  *p;

    ngx_llmgw_task_mcf = mcf;
    ngx_llmgw_task_log = cycle->log;

    ngx_llmgw_task_conf.poll_interval_ms = (int64_t) mcf->task_poll_interval;
    ngx_llmgw_task_conf.timeout_ms = (int64_t) mcf->task_timeout;
    ngx_llmgw_task_conf.max_failures = (int64_t) mcf->task_poll_max_failures;
    ngx_llmgw_task_conf.batch_size = mcf->task_batch_size;
    ngx_llmgw_task_conf.max_file_bytes = mcf->task_max_file_size;
    ngx_llmgw_task_conf.max_total_bytes = mcf->task_max_files_total;
    ngx_llmgw_task_conf.max_redirects = 5;
    ngx_llmgw_task_conf.max_tries = 3;
    ngx_llmgw_task_conf.wait_ms = (int64_t) mcf->task_wait_timeout;
    ngx_llmgw_task_conf.http_timeout_ms = (int64_t) mcf->task_http_timeout;
    ngx_llmgw_task_conf.lease_ms = (int64_t) mcf->task_lease;
    ngx_llmgw_task_conf.link_secret = (llmgw_str_t) {
        (char *) mcf->crypto_secret.data, mcf->crypto_secret.len };
    ngx_llmgw_task_conf.public_address = mcf->task_public_address.len
        ? (llmgw_str_t) { (char *) mcf->task_public_address.data,
                          mcf->task_public_address.len }
        : (llmgw_str_t) { (char *) mcf->server_address.data,
                          mcf->server_address.len };
    ngx_llmgw_task_conf.link_ttl_s =
        (int64_t) ngx_max(mcf->artifact_link_ttl / 1000, 1);

    ngx_queue_init(&ngx_llmgw_poll_waiting);
    ngx_queue_init(&ngx_llmgw_poll_active);

    /* the lease owner: this node and process, unique across restarts */
    p = ngx_snprintf(ngx_llmgw_poll_owner, sizeof(ngx_llmgw_poll_owner) - 1,
                     "%V:%P:%08xD", &cycle->hostname, ngx_pid,
                     (uint32_t) ngx_random());
    *p = '\0';

    if (ngx_llmgw_http_init_process(cycle, mcf) != NGX_OK) {
        return NGX_ERROR;
    }

    if (!ngx_llmgw_v8host_enabled()) {
        return NGX_OK;
    }

    ngx_llmgw_poll_ev.handler = ngx_llmgw_poll_tick;
    ngx_llmgw_poll_ev.data = &ngx_llmgw_no_connection;
    ngx_llmgw_poll_ev.log = cycle->log;
    ngx_llmgw_poll_ev.cancelable = 1;

    ngx_llmgw_poll_stop_ev.handler = ngx_llmgw_poll_stop_watch;
    ngx_llmgw_poll_stop_ev.data = &ngx_llmgw_no_connection;
    ngx_llmgw_poll_stop_ev.log = cycle->log;
    ngx_llmgw_poll_stop_ev.cancelable = 1;

    /* spread the workers' first passes over the interval */
    ngx_add_timer(&ngx_llmgw_poll_ev,
                  200 + ngx_random() % ngx_max(mcf->task_poll_interval, 1));

    return NGX_OK;
}


void
ngx_llmgw_task_exit_process(ngx_cycle_t *cycle)
{
    if (ngx_llmgw_poll_ev.timer_set) {
        ngx_del_timer(&ngx_llmgw_poll_ev);
    }

    if (ngx_llmgw_poll_stop_ev.timer_set) {
        ngx_del_timer(&ngx_llmgw_poll_stop_ev);
    }

    /* tasks claimed but not finished are due again at once elsewhere */
    if (ngx_llmgw_poll_running > 0 || ngx_llmgw_poll_abandoned
        || ngx_llmgw_poll_claiming
        || (ngx_llmgw_poll_waiting.next != NULL
            && !ngx_queue_empty(&ngx_llmgw_poll_waiting)))
    {
        (void) ngx_llmgw_pg_exec_at_exit(
                   "select llmgw_task_release_owner($1)",
                   (const char *) ngx_llmgw_poll_owner, NULL, 0, NULL, NULL);
    }

    ngx_llmgw_http_exit_process(cycle);
}


/* ------------------------------------------------------------------ */
/* runners                                                             */

static ngx_llmgw_runner_t *
ngx_llmgw_runner_new(llmgw_tjob_t *job, llmgw_snapshot_t *snapshot)
{
    ngx_llmgw_runner_t  *rn;

    rn = ngx_calloc(sizeof(ngx_llmgw_runner_t), ngx_llmgw_task_log);
    if (rn == NULL) {
        llmgw_tjob_free(job);
        return NULL;
    }

    ngx_queue_init(&rn->queue);

    rn->job = job;
    rn->snapshot = snapshot;

    llmgw_tjob_set_sse_idle(job,
                            (int64_t) ngx_llmgw_task_mcf->task_sse_idle_timeout);

    return rn;
}


static void
ngx_llmgw_runner_free(ngx_llmgw_runner_t *rn)
{
    if (rn->http != NULL) {
        ngx_llmgw_http_cancel(rn->http);
    }

    if (rn->hook != NULL) {
        ngx_llmgw_hook_cancel(rn->hook);
    }

    if (rn->lease_end.timer_set) {
        ngx_del_timer(&rn->lease_end);
    }

    if (rn->sql_later.timer_set) {
        ngx_del_timer(&rn->sql_later);
    }

    if (rn->sleep.timer_set) {
        ngx_del_timer(&rn->sleep);
    }

    if (rn->wait_end.timer_set) {
        ngx_del_timer(&rn->wait_end);
    }

    llmgw_tjob_free(rn->job);
    llmgw_token_free(rn->token);

    ngx_llmgw_task_body_free(&rn->body);

    ngx_llmgw_cache_release(rn->snapshot);
    ngx_free(rn);
}


/* The request's pool is going away: the job runs on without it. */
static void
ngx_llmgw_task_request_gone(void *data)
{
    ngx_llmgw_runner_t  *rn = data;

    rn->request = NULL;
    rn->gone = 1;
    /* the cleanup lives in the request's pool, freed after this */
    rn->cleanup = NULL;

    if (rn->pipe && !rn->driving) {
        /* content for nobody: the call is stopped */
        ngx_llmgw_runner_free(rn);
        return;
    }

    /*
     * A stream being read (an SSE submit the vendor accepted) goes on, as
     * a JSON submit would, until the task is stored: the vendor's task
     * must not be left without a row and its charge; so does one waiting
     * for the plugin runtime to read the vendor's answer to a submit.
     */
    if (!rn->inflight && !rn->driving && rn->http == NULL
        && !llmgw_tjob_must_go_on(rn->job))
    {
        ngx_llmgw_runner_free(rn);
    }
}


/* A step's result arrived: go on, or free a runner nobody waits for. */
static void
ngx_llmgw_task_resume(ngx_llmgw_runner_t *rn)
{
    ngx_connection_t  *c;

    rn->inflight = 0;

    /*
     * The task is stored: nobody is left to answer.  A poll made for the
     * request goes on until its answer is saved and the task's lease given
     * back, so that the background pollers need not wait for the lease to
     * run out (nor ask the vendor again what it already said).
     */
    if (rn->request == NULL && rn->gone && llmgw_tjob_charged(rn->job)
        && !llmgw_tjob_polling_for_request(rn->job))
    {
        ngx_llmgw_runner_free(rn);
        return;
    }

    c = rn->request ? rn->request->connection : NULL;

    ngx_llmgw_task_drive(rn);

    if (c != NULL) {
        ngx_http_run_posted_requests(c);
    }
}


/*
 * Once its task is stored, a request has nothing left that must outlive its
 * client: one that leaves is noticed from then on (an image or sync
 * Responses wait ends then, not at llmgw_task_wait_timeout), and the job
 * goes on without it only as far as a poll under way must (request_gone).
 */
static void
ngx_llmgw_task_watch(ngx_http_request_t *r)
{
    ngx_event_t  *rev;

    if (r->read_event_handler == ngx_http_test_reading) {
        return;
    }

    r->read_event_handler = ngx_http_test_reading;

    /* a client that left before is told by an event already gone by */
    rev = r->connection->read;

    if (rev->ready || rev->pending_eof || rev->eof) {
        ngx_post_event(rev, &ngx_posted_events);
    }
}


static void
ngx_llmgw_task_hook_done(void *data, ngx_int_t rc, u_char *body, size_t len)
{
    ngx_llmgw_runner_t  *rn = data;

    rn->hook = NULL;

    if (rn->wait_end.timer_set) {
        ngx_del_timer(&rn->wait_end);
    }

    llmgw_tjob_hook_done(rn->job, rc == NGX_OK ? 0 : rc == NGX_ABORT ? 1 : -1,
                         (char *) body, len);
    ngx_llmgw_task_resume(rn);
}


/*
 * A request's wait for its task ended while its poll calls a hook: the
 * client is answered 504 at once, and the job goes on without it, as a
 * poll job would (the hook's answer saved, then the job ends).
 */
static void
ngx_llmgw_task_wait_end(ngx_event_t *ev)
{
    ngx_connection_t      *c;
    ngx_llmgw_runner_t    *rn = ev->data;
    ngx_http_request_t    *r = rn->request;
    const llmgw_tstep_t   *st;

    if (r == NULL || !rn->inflight || rn->emitting) {
        return;
    }

    st = llmgw_tjob_wait_over(rn->job);
    if (st == NULL) {
        return;
    }

    c = r->connection;
    ngx_llmgw_task_detach(rn, r);
    ngx_llmgw_task_respond(r, st);      /* copies the body */
    ngx_http_run_posted_requests(c);
}


static void
ngx_llmgw_task_sql_done(void *data, PGresult *res, const char *err)
{
    ngx_llmgw_runner_t  *rn = data;
    const char          *val;

    if (err == NULL && (res == NULL || PQntuples(res) != 1
                        || PQgetisnull(res, 0, 0)))
    {
        err = "the statement returned no value";
    }

    if (err != NULL) {
        ngx_log_error(NGX_LOG_ERR, ngx_llmgw_task_log, 0,
                      "llmgw: task statement failed: %s", err);
        llmgw_tjob_sql_done(rn->job, NULL, 0, err);

    } else {
        val = PQgetvalue(res, 0, 0);

        if (rn->learn) {
            ngx_llmgw_billing_learn(val, ngx_strlen(val));

            if (rn->request != NULL) {
                /* the charge is in the database: the hold has done its job */
                ngx_llmgw_billing_release(ngx_llmgw_get_ctx(rn->request));
            }
        }

        llmgw_tjob_sql_done(rn->job, val, ngx_strlen(val), NULL);
    }

    ngx_llmgw_task_resume(rn);
}


static void
ngx_llmgw_task_slept(ngx_event_t *ev)
{
    ngx_llmgw_task_resume(ev->data);
}


static void
ngx_llmgw_task_sql_later(ngx_event_t *ev)
{
    ngx_llmgw_runner_t  *rn = ev->data;

    llmgw_tjob_sql_done(rn->job, NULL, 0, "the database queue is full");
    ngx_llmgw_task_resume(rn);
}


static void
ngx_llmgw_task_headers(ngx_llmgw_http_resp_t *resp, llmgw_str_t **names,
    llmgw_str_t **values, size_t *n, ngx_pool_t *pool)
{
    ngx_uint_t                i;
    ngx_llmgw_http_header_t  *h;

    *n = 0;
    *names = NULL;
    *values = NULL;

    if (resp == NULL || resp->headers.nelts == 0) {
        return;
    }

    *names = ngx_palloc(pool, resp->headers.nelts * sizeof(llmgw_str_t));
    *values = ngx_palloc(pool, resp->headers.nelts * sizeof(llmgw_str_t));

    if (*names == NULL || *values == NULL) {
        return;
    }

    h = resp->headers.elts;

    for (i = 0; i < resp->headers.nelts; i++) {
        (*names)[i].data = (char *) h[i].name.data;
        (*names)[i].len = h[i].name.len;
        (*values)[i].data = (char *) h[i].value.data;
        (*values)[i].len = h[i].value.len;
    }

    *n = resp->headers.nelts;
}


static void
ngx_llmgw_task_http_done(void *data, ngx_int_t rc,
    ngx_llmgw_http_resp_t *resp, const char *err)
{
    ngx_llmgw_runner_t  *rn = data;
    size_t               n;
    ngx_pool_t          *pool;
    llmgw_str_t         *names, *values;

    rn->http = NULL;

    pool = ngx_create_pool(1024, ngx_llmgw_task_log);
    if (pool == NULL) {
        llmgw_tjob_http_done(rn->job, -1, 0, 0, NULL, NULL, 0, NULL, 0,
                             "out of memory");
        ngx_llmgw_task_resume(rn);
        return;
    }

    ngx_llmgw_task_headers(resp, &names, &values, &n, pool);

    if (rc == NGX_OK) {
        llmgw_tjob_http_done(rn->job, 0, 0, (int) resp->status, names, values,
                             n, (char *) resp->body.data, resp->body.len,
                             NULL);
    } else {
        llmgw_tjob_http_done(rn->job, -1,
                             (rc == NGX_ETIMEDOUT ? LLMGW_THTTP_TIMED_OUT : 0)
                             | (rn->sent ? LLMGW_THTTP_SENT : 0),
                             0, NULL, NULL, 0, NULL, 0,
                             err ? err : "the request failed");
    }

    ngx_destroy_pool(pool);

    if (rn->streaming) {
        rn->streaming = 0;

        /* a stream's end while the plugin works on an event, or while the
           job waits for the plugin runtime, waits for that */
        if (llmgw_tjob_busy(rn->job) || rn->sleep.timer_set) {
            return;
        }
    }

    ngx_llmgw_task_resume(rn);
}


static ngx_int_t
ngx_llmgw_task_stream_headers(void *data, ngx_llmgw_http_resp_t *resp)
{
    int                  rc;
    size_t               n;
    ngx_pool_t          *pool;
    llmgw_str_t         *names, *values;
    ngx_llmgw_runner_t  *rn = data;

    pool = ngx_create_pool(1024, ngx_llmgw_task_log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    ngx_llmgw_task_headers(resp, &names, &values, &n, pool);
    rc = llmgw_tjob_stream_headers(rn->job, (int) resp->status, names, values,
                                   n);
    ngx_destroy_pool(pool);

    if (rc == 1) {
        /* the runner may be gone afterwards (and the call cancelled) */
        ngx_llmgw_task_resume(rn);
        return NGX_OK;
    }

    return rc < 0 ? NGX_ERROR : NGX_OK;
}


static ngx_int_t
ngx_llmgw_task_stream_data(void *data, u_char *p, size_t len)
{
    int                  rc;
    ngx_llmgw_runner_t  *rn = data;

    rc = llmgw_tjob_stream_data(rn->job, (char *) p, len);

    if (rc == 1) {
        ngx_llmgw_task_resume(rn);
        return NGX_OK;
    }

    return rc < 0 ? NGX_ERROR : NGX_OK;
}


static ngx_int_t
ngx_llmgw_task_http(ngx_llmgw_runner_t *rn, const llmgw_tstep_t *st,
    ngx_uint_t pipe)
{
    ngx_msec_t               lease, wait;
    ngx_llmgw_http_opts_t    opts;
    const llmgw_outbound_t  *o = st->out;

    ngx_memzero(&opts, sizeof(opts));

    opts.method.data = (u_char *) o->method;
    opts.method.len = ngx_strlen(o->method);
    opts.tls = o->tls;
    opts.host.data = (u_char *) o->host;
    opts.host.len = ngx_strlen(o->host);
    opts.port = o->port;
    opts.host_header.data = (u_char *) o->host_header;
    opts.host_header.len = ngx_strlen(o->host_header);
    opts.uri.data = (u_char *) o->uri;
    opts.uri.len = ngx_strlen(o->uri);
    opts.headers.data = (u_char *) o->headers.data;
    opts.headers.len = o->headers.len;
    opts.body.data = (u_char *) o->body.data;
    opts.body.len = o->body.len;
    opts.done = ngx_llmgw_task_http_done;
    opts.data = rn;
    opts.sent = &rn->sent;
    rn->sent = 0;
    /* a poll may be asked twice; a submit must not be */
    opts.resend = st->resend;
    opts.public_only = o->public_only;

    if (pipe) {
        /* the content streams to the client, whatever its size */
        opts.on_headers = ngx_llmgw_pipe_headers;
        opts.on_data = ngx_llmgw_pipe_data;
        opts.done = ngx_llmgw_pipe_done;
        opts.max_body = NGX_MAX_SIZE_T_VALUE / 2;

    } else if (o->sse) {
        /* connecting, sending and the head: llmgw_task_http_timeout */
        opts.body_timeout = (ngx_msec_t) st->timeout_ms;
        opts.on_headers = ngx_llmgw_task_stream_headers;
        opts.on_data = ngx_llmgw_task_stream_data;
        rn->streaming = 1;
    }

    if (rn->poll) {
        /*
         * A vendor that does not answer a poll times out (every wait of
         * the call: resolving, connecting, TLS, sending, reading) before
         * 7/8 of the lease, where the poll would be given up uncounted: a
         * timeout is a polling failure, and a vendor that hangs ends its
         * tasks after llmgw_task_poll_max_failures polls instead of never.
         */
        lease = ngx_llmgw_task_mcf->task_lease;
        opts.deadline = rn->claimed + (lease - lease / 8)
                        - NGX_LLMGW_LEASE_MARGIN;
    }

    if (st->deadline_ms > 0) {
        /* a request's poll ends with its wait for the task */
        wait = ngx_current_msec + (ngx_msec_t) st->deadline_ms;
        if (opts.deadline == 0 || (ngx_msec_int_t) (wait - opts.deadline) < 0)
        {
            opts.deadline = wait;
        }
    }

    rn->http = ngx_llmgw_http_start(&opts, ngx_llmgw_task_log);

    return rn->http != NULL ? NGX_OK : NGX_ERROR;
}


/* Runs steps until one is in flight or the job has finished. */
static void
ngx_llmgw_task_drive(ngx_llmgw_runner_t *rn)
{
    ngx_int_t             rc;
    llmgw_verdict_t       v;
    ngx_llmgw_ctx_t      *ctx;
    ngx_http_request_t   *r;
    const char           *why;
    const llmgw_tstep_t  *st;

    rn->driving = 1;

    for ( ;; ) {
        st = llmgw_tjob_next(rn->job);

        if (rn->request != NULL && llmgw_tjob_charged(rn->job)) {
            ngx_llmgw_task_watch(rn->request);
        }

        switch (st->kind) {

        case LLMGW_TSTEP_HOOK:
            rn->inflight = 1;
            rc = ngx_llmgw_hook(st->sha, (u_char *) st->body.data,
                                st->body.len, ngx_llmgw_task_hook_done, rn,
                                &rn->hook);
            if (rc == NGX_OK) {
                if (st->deadline_ms > 0 && rn->request != NULL) {
                    rn->wait_end.handler = ngx_llmgw_task_wait_end;
                    rn->wait_end.data = rn;
                    rn->wait_end.log = ngx_llmgw_task_log;
                    ngx_add_timer(&rn->wait_end,
                                  (ngx_msec_t) st->deadline_ms);
                }
                rn->driving = 0;
                return;
            }
            rn->inflight = 0;
            why = rc == NGX_ABORT ? "its arguments are larger than "
                                    "llmgw_v8host_max_frame"
                  : rc == NGX_BUSY ? "the plugin runtime is busy"
                  : "the plugin runtime is not available";
            /* arguments too large to send (a vendor's answer, say) fail
               the call as a result too large to read would */
            llmgw_tjob_hook_done(rn->job, rc == NGX_ABORT ? 1 : -1, why,
                                 ngx_strlen(why));
            continue;

        case LLMGW_TSTEP_HTTP:
            if (rn->poll && rn->lease_over) {
                rn->driving = 0;
                ngx_llmgw_poll_left(rn, "reached 7/8 of llmgw_task_lease "
                                    "or its worker is stopping");
                return;
            }
            if (rn->request != NULL) {
                ngx_llmgw_task_tried(rn);
            }
            if (ngx_llmgw_task_http(rn, st, 0) != NGX_OK) {
                llmgw_tjob_http_done(rn->job, -1, 0, 0, NULL, NULL, 0, NULL,
                                     0, "out of memory");
                continue;
            }
            rn->inflight = !rn->streaming;
            if (rn->streaming) {
                /* stream calls and the end drive the job */
                continue;
            }
            rn->driving = 0;
            return;

        case LLMGW_TSTEP_PIPE:
            if (rn->request == NULL) {
                rn->driving = 0;
                ngx_llmgw_runner_free(rn);
                return;
            }
            if (ngx_llmgw_task_http(rn, st, 1) != NGX_OK) {
                llmgw_tjob_http_done(rn->job, -1, 0, 0, NULL, NULL, 0, NULL,
                                     0, "out of memory");
                continue;
            }
            rn->pipe = 1;
            rn->inflight = 1;
            rn->driving = 0;
            return;

        case LLMGW_TSTEP_EMIT:
            r = rn->request;
            if (r == NULL) {
                /* the stream's reader left: the task goes on without it */
                rn->driving = 0;
                ngx_llmgw_runner_free(rn);
                return;
            }
            if (ngx_llmgw_task_emit(rn, r, st, 0) != NGX_OK) {
                rn->driving = 0;
                ngx_llmgw_task_detach(rn, r);
                ngx_llmgw_runner_free(rn);
                ngx_http_finalize_request(r, NGX_ERROR);
                return;
            }
            continue;

        case LLMGW_TSTEP_HTTP_CANCEL:
            if (rn->http != NULL) {
                ngx_llmgw_http_cancel(rn->http);
                rn->http = NULL;
                rn->streaming = 0;
            }
            continue;

        case LLMGW_TSTEP_SQL:
            rn->inflight = 1;
            rn->learn = st->learn;
            if (ngx_llmgw_pg_query(st->sql, st->nparams, st->params, NULL,
                                   ngx_llmgw_task_sql_done, rn)
                == NGX_OK)
            {
                rn->driving = 0;
                return;
            }
            /*
             * The pool took it not (its queue full): answered as failed
             * after a pause, so that a statement the job sends again (a
             * task's create) is not sent again at once.
             */
            rn->sql_later.handler = ngx_llmgw_task_sql_later;
            rn->sql_later.data = rn;
            rn->sql_later.log = ngx_llmgw_task_log;
            ngx_add_timer(&rn->sql_later, NGX_LLMGW_SQL_PAUSE);
            rn->driving = 0;
            return;

        case LLMGW_TSTEP_RESERVE:
            ctx = rn->request ? ngx_llmgw_get_ctx(rn->request) : NULL;
            if (ctx == NULL) {
                llmgw_verdict_set(&v, 499, "gateway_error", "client_closed",
                                  "the client went away");
                llmgw_tjob_reserve_done(rn->job, &v);
                continue;
            }
            v.status = 0;
            if (ngx_llmgw_billing_reserve(ctx, st->amount, &v) != NGX_OK) {
                if (v.status == 0) {
                    llmgw_verdict_set(&v, 503, "gateway_error",
                                      "service_unavailable",
                                      "billing is unavailable; retry shortly");
                }
                llmgw_tjob_reserve_done(rn->job, &v);
                continue;
            }
            llmgw_tjob_reserve_done(rn->job, NULL);
            continue;

        case LLMGW_TSTEP_SLEEP:
            /* a client that leaves ends the wait (the runner is freed) */
            rn->sleep.handler = ngx_llmgw_task_slept;
            rn->sleep.data = rn;
            rn->sleep.log = ngx_llmgw_task_log;
            ngx_add_timer(&rn->sleep, (ngx_msec_t) ngx_max(st->amount, 1));
            rn->driving = 0;
            return;

        case LLMGW_TSTEP_WAIT:
            rn->driving = 0;
            if (rn->gone && rn->http == NULL) {
                ngx_llmgw_runner_free(rn);
            }
            return;

        case LLMGW_TSTEP_RESPOND:
            if (rn->http != NULL) {
                ngx_llmgw_http_cancel(rn->http);
                rn->http = NULL;
            }
            /* detached first: finalizing may free the request's pool */
            r = rn->request;
            ngx_llmgw_task_finish(rn, r, st);
            return;

        case LLMGW_TSTEP_DONE:
        default:
            rn->driving = 0;
            ngx_llmgw_poll_job_done(rn);
            return;
        }
    }
}



static void
ngx_llmgw_task_respond(ngx_http_request_t *r, const llmgw_tstep_t *st)
{
    ngx_int_t  rc;

    rc = ngx_llmgw_send_json(r, (ngx_uint_t) st->status,
                             (u_char *) st->body.data, st->body.len);
    ngx_http_finalize_request(r, rc);
}


/* A submit sent to another channel than before (not a redirect) is a try,
   timed and counted as a chat request's. */
static void
ngx_llmgw_task_tried(ngx_llmgw_runner_t *rn)
{
    llmgw_tjob_log_t  l;

    llmgw_tjob_log(rn->job, &l);

    if (l.tries == rn->tries) {
        return;
    }

    if (rn->tries == 0) {
        rn->first_try = ngx_current_msec;
    } else {
        ngx_llmgw_metrics_retry();
    }

    rn->tries = l.tries;
}


/*
 * The job's model, channel and tries go into the request's context before
 * the answer, so that the $llmgw_* variables and the metrics record them as
 * they do a chat request's.  The channel is of ctx->snapshot, which the job
 * was made with and the request holds to its end.
 */
static void
ngx_llmgw_task_log_vars(ngx_llmgw_runner_t *rn, ngx_http_request_t *r)
{
    u_char            *p;
    llmgw_tjob_log_t   l;
    ngx_llmgw_ctx_t   *ctx;

    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return;
    }

    llmgw_tjob_log(rn->job, &l);

    /* the job and its strings are freed before the log phase */
    p = ngx_pnalloc(r->pool, l.model.len + l.upstream_model.len + 1);
    if (p == NULL) {
        return;
    }

    ctx->model.data = p;
    ctx->model.len = l.model.len;
    p = ngx_cpymem(p, l.model.data, l.model.len);

    ctx->upstream_model.data = p;
    ctx->upstream_model.len = l.upstream_model.len;
    ngx_memcpy(p, l.upstream_model.data, l.upstream_model.len);

    ctx->model_priced = l.priced ? 1 : 0;

    if (l.channel != NULL) {
        ctx->channels[0] = l.channel;
        ctx->nchannels = 1;
        ctx->current = 0;
        ctx->tried = l.tries;
        ctx->upstream_start = rn->first_try;
    }
}


/* Answers the client (if still there) and frees the runner. */
static void
ngx_llmgw_task_finish(ngx_llmgw_runner_t *rn, ngx_http_request_t *r,
    const llmgw_tstep_t *st)
{
    int               auth;
    size_t            notes;
    ngx_int_t         rc;
    ngx_str_t         task, request;
    const char       *first;
    llmgw_tjob_log_t  l;

    /* what a request's own polls and downloads had to say, named by the
       request and its task */
    notes = llmgw_tjob_poll_notes(rn->job, &auth, &first);
    if (notes > 0) {
        llmgw_tjob_log(rn->job, &l);
        task.data = (u_char *) l.task_id.data;
        task.len = l.task_id.len;
        request.data = (u_char *) l.request_id.data;
        request.len = l.request_id.len;
        ngx_log_error(NGX_LOG_WARN, ngx_llmgw_task_log, 0,
                      "llmgw: request %V%s%V: %s (%uz notes)", &request,
                      task.len ? ", task " : "", &task, first, notes);
    }

    if (r != NULL && rn->emitting) {
        /* an event stream: the answer is its last bytes */
        rc = ngx_llmgw_task_emit(rn, r, st, 1);
        ngx_llmgw_task_detach(rn, r);
        ngx_llmgw_runner_free(rn);
        ngx_http_finalize_request(r, rc);
        return;
    }

    ngx_llmgw_task_detach(rn, r);

    if (r != NULL) {
        ngx_llmgw_task_respond(r, st);    /* copies the body */
    }

    ngx_llmgw_runner_free(rn);
}


/*
 * The next bytes of an event stream (host_responses): the first send the
 * head.  Flushed at once; a slow reader's bytes wait in nginx's output,
 * written as the connection takes them.
 */
static ngx_int_t
ngx_llmgw_task_emit(ngx_llmgw_runner_t *rn, ngx_http_request_t *r,
    const llmgw_tstep_t *st, ngx_uint_t last)
{
    ngx_int_t         rc;
    ngx_buf_t        *b;
    ngx_chain_t      *cl, *out;
    ngx_table_elt_t  *h;

    if (!rn->emitting) {
        r->headers_out.status = NGX_HTTP_OK;
        r->headers_out.content_length_n = -1;
        ngx_str_set(&r->headers_out.content_type, "text/event-stream");
        r->headers_out.content_type_len = r->headers_out.content_type.len;

        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_ERROR;
        }
        h->hash = 1;
        ngx_str_set(&h->key, "Cache-Control");
        ngx_str_set(&h->value, "no-cache");

        rc = ngx_http_send_header(r);
        if (rc == NGX_ERROR || rc > NGX_OK) {
            return NGX_ERROR;
        }

        rn->emitting = 1;
        r->write_event_handler = ngx_llmgw_pipe_write;
        r->read_event_handler = ngx_http_test_reading;
    }

    cl = ngx_chain_get_free_buf(r->pool, &rn->pipe_free);
    if (cl == NULL) {
        return NGX_ERROR;
    }

    b = cl->buf;
    ngx_memzero(b, sizeof(ngx_buf_t));
    b->tag = (ngx_buf_tag_t) &ngx_llmgw_pipe_tag;

    if (st->body.len > 0) {
        b->start = ngx_pnalloc(r->pool, st->body.len);
        if (b->start == NULL) {
            return NGX_ERROR;
        }
        b->pos = b->start;
        b->last = ngx_cpymem(b->start, st->body.data, st->body.len);
        b->end = b->last;
        b->temporary = 1;
    }

    b->flush = 1;
    b->last_buf = last ? 1 : 0;
    if (last) {
        r->write_event_handler = ngx_http_request_empty_handler;
    }

    out = cl;
    rc = ngx_http_output_filter(r, out);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    if (!last) {
        ngx_chain_update_chains(r->pool, &rn->pipe_free, &rn->pipe_busy,
                                &out, (ngx_buf_tag_t) &ngx_llmgw_pipe_tag);
        ngx_llmgw_emit_release(rn, r);
        ngx_llmgw_pipe_flow(rn, r);
    }

    return last ? rc : NGX_OK;
}


/* The request and the runner part: what the log needs goes with it. */
static void
ngx_llmgw_task_detach(ngx_llmgw_runner_t *rn, ngx_http_request_t *r)
{
    ngx_llmgw_ctx_t  *ctx;

    if (r != NULL) {
        ctx = ngx_llmgw_get_ctx(r);
        if (ctx != NULL && ctx->task == rn) {
            ctx->task = NULL;
        }
    }

    if (rn->cleanup != NULL) {
        rn->cleanup->handler = NULL;
        rn->cleanup = NULL;
    }

    rn->request = NULL;

    if (r != NULL) {
        ngx_llmgw_task_log_vars(rn, r);
    }
}


/* ------------------------------------------------------------------ */
/* content passed from a vendor to the client                          */

/* The answer's head: the client's now, or the job goes on without it. */
static ngx_int_t
ngx_llmgw_pipe_headers(void *data, ngx_llmgw_http_resp_t *resp)
{
    int                  pass;
    size_t               n, i;
    u_char              *p;
    ngx_int_t            rc;
    ngx_pool_t          *pool;
    llmgw_str_t         *names, *values;
    ngx_table_elt_t     *h;
    ngx_llmgw_ctx_t     *ctx;
    ngx_http_request_t  *r;
    ngx_llmgw_runner_t  *rn = data;
    llmgw_tpipe_head_t   head;

    pool = ngx_create_pool(1024, ngx_llmgw_task_log);
    if (pool == NULL) {
        return NGX_ERROR;
    }

    ngx_llmgw_task_headers(resp, &names, &values, &n, pool);
    pass = llmgw_tjob_pipe_head(rn->job, (int) resp->status, names, values,
                                n, &head);
    ngx_destroy_pool(pool);

    if (!pass) {
        /* a redirect to follow, or an error to answer */
        ngx_llmgw_http_cancel(rn->http);
        rn->http = NULL;
        ngx_llmgw_task_resume(rn);
        return NGX_OK;
    }

    r = rn->request;
    if (r == NULL) {
        return NGX_ERROR;
    }

    r->headers_out.status = head.status;
    r->headers_out.content_length_n = -1;
    /* the vendor's validators and ranges are answered as the vendor did */
    r->disable_not_modified = 1;

    for (i = 0; i < head.n; i++) {
        p = ngx_pnalloc(r->pool, head.values[i].len);
        if (p == NULL) {
            return NGX_ERROR;
        }
        ngx_memcpy(p, head.values[i].data, head.values[i].len);

        if (head.names[i].len == sizeof("content-type") - 1
            && ngx_strncmp(head.names[i].data, "content-type",
                           head.names[i].len) == 0)
        {
            r->headers_out.content_type.data = p;
            r->headers_out.content_type.len = head.values[i].len;
            r->headers_out.content_type_len = head.values[i].len;
            continue;
        }

        if (head.names[i].len == sizeof("content-length") - 1
            && ngx_strncmp(head.names[i].data, "content-length",
                           head.names[i].len) == 0)
        {
            r->headers_out.content_length_n = ngx_atoof(p,
                                                        head.values[i].len);
            continue;
        }

        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_ERROR;
        }

        /* the job's strings go with the job, before the log phase */
        h->hash = 1;
        h->key.data = ngx_pstrdup(r->pool, &(ngx_str_t) {
                                      head.names[i].len,
                                      (u_char *) head.names[i].data });
        if (h->key.data == NULL) {
            return NGX_ERROR;
        }
        h->key.len = head.names[i].len;
        h->value.data = p;
        h->value.len = head.values[i].len;

        /* nginx's filters must know these (gzip, not_modified) */
        if (head.names[i].len == sizeof("content-encoding") - 1
            && ngx_strncmp(head.names[i].data, "content-encoding",
                           head.names[i].len) == 0)
        {
            r->headers_out.content_encoding = h;

        } else if (head.names[i].len == sizeof("etag") - 1
                   && ngx_strncmp(head.names[i].data, "etag",
                                  head.names[i].len) == 0)
        {
            r->headers_out.etag = h;
        }
    }

    rn->piping = 1;
    r->write_event_handler = ngx_llmgw_pipe_write;

    /* the vendor's answer as it came, not a page of the gateway's own */
    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }
    ctx->responded = 1;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK) {
        return NGX_ERROR;
    }

    /* HEAD: the head is the whole answer */
    return r->header_only ? NGX_DONE : NGX_OK;
}


static size_t
ngx_llmgw_pipe_unsent(ngx_llmgw_runner_t *rn)
{
    size_t        n;
    ngx_chain_t  *cl;

    n = 0;
    for (cl = rn->pipe_busy; cl; cl = cl->next) {
        n += ngx_buf_size(cl->buf);
    }

    return n;
}


/* The client's connection: the vendor is read only as fast as it takes. */
static void
ngx_llmgw_pipe_flow(ngx_llmgw_runner_t *rn, ngx_http_request_t *r)
{
    size_t                     unsent;
    ngx_connection_t          *c;
    ngx_http_core_loc_conf_t  *clcf;

    c = r->connection;
    unsent = ngx_llmgw_pipe_unsent(rn);

    if (unsent >= NGX_LLMGW_PIPE_HIGH && !rn->pipe_paused
        && rn->http != NULL)
    {
        rn->pipe_paused = 1;
        ngx_llmgw_http_pause(rn->http);

    } else if (unsent <= NGX_LLMGW_PIPE_LOW && rn->pipe_paused) {
        rn->pipe_paused = 0;
        if (rn->http != NULL) {
            ngx_llmgw_http_resume(rn->http);
        }
    }

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    /* a write delayed by limit_rate has its own timer: it stays */
    if (c->write->delayed) {
        if (ngx_handle_write_event(c->write, clcf->send_lowat) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
        }
        return;
    }

    if (unsent > 0 || c->buffered) {
        if (!c->write->ready && !c->write->timer_set) {
            ngx_add_timer(c->write, clcf->send_timeout);
        }
        if (ngx_handle_write_event(c->write, clcf->send_lowat) != NGX_OK) {
            ngx_http_finalize_request(r, NGX_ERROR);
        }

    } else if (c->write->timer_set) {
        ngx_del_timer(c->write);
    }
}


static ngx_int_t
ngx_llmgw_pipe_data(void *data, u_char *p, size_t len)
{
    size_t               n;
    ngx_buf_t           *b;
    ngx_int_t            rc;
    ngx_chain_t         *out, **last, *cl;
    ngx_http_request_t  *r;
    ngx_llmgw_runner_t  *rn = data;

    r = rn->request;
    if (r == NULL || !rn->piping) {
        return NGX_ERROR;
    }

    out = NULL;
    last = &out;

    while (len > 0) {
        cl = ngx_chain_get_free_buf(r->pool, &rn->pipe_free);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        b = cl->buf;

        if (b->start == NULL) {
            b->start = ngx_palloc(r->pool, NGX_LLMGW_PIPE_BUFFER);
            if (b->start == NULL) {
                return NGX_ERROR;
            }
            b->end = b->start + NGX_LLMGW_PIPE_BUFFER;
            b->temporary = 1;
            b->tag = (ngx_buf_tag_t) &ngx_llmgw_pipe_tag;
        }

        b->pos = b->start;
        n = ngx_min(len, (size_t) (b->end - b->start));
        b->last = ngx_cpymem(b->start, p, n);
        b->flush = 1;

        p += n;
        len -= n;

        *last = cl;
        last = &cl->next;
    }

    rc = ngx_http_output_filter(r, out);

    if (rc == NGX_ERROR) {
        return NGX_ERROR;
    }

    ngx_chain_update_chains(r->pool, &rn->pipe_free, &rn->pipe_busy, &out,
                            (ngx_buf_tag_t) &ngx_llmgw_pipe_tag);

    ngx_llmgw_pipe_flow(rn, r);

    return NGX_OK;
}


/* Sent events give their memory back (a large block goes to the system;
   content buffers are reused as they are). */
static void
ngx_llmgw_emit_release(ngx_llmgw_runner_t *rn, ngx_http_request_t *r)
{
    ngx_chain_t  *cl;

    for (cl = rn->pipe_free; cl; cl = cl->next) {
        if (cl->buf->start != NULL) {
            (void) ngx_pfree(r->pool, cl->buf->start);
            cl->buf->start = NULL;
        }
    }
}


static void
ngx_llmgw_pipe_write(ngx_http_request_t *r)
{
    ngx_int_t            rc;
    ngx_chain_t         *out;
    ngx_connection_t    *c;
    ngx_llmgw_ctx_t     *ctx;
    ngx_llmgw_runner_t  *rn;

    c = r->connection;
    ctx = ngx_llmgw_get_ctx(r);
    rn = ctx ? ctx->task : NULL;

    if (c->write->timedout) {
        c->timedout = 1;
        ngx_log_error(NGX_LOG_INFO, c->log, NGX_ETIMEDOUT,
                      "llmgw: client timed out while content was sent");
        ngx_http_finalize_request(r, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }

    rc = ngx_http_output_filter(r, NULL);

    if (rc == NGX_ERROR) {
        ngx_http_finalize_request(r, NGX_ERROR);
        return;
    }

    if (rn == NULL) {
        return;
    }

    out = NULL;
    ngx_chain_update_chains(r->pool, &rn->pipe_free, &rn->pipe_busy, &out,
                            (ngx_buf_tag_t) &ngx_llmgw_pipe_tag);

    if (rn->emitting) {
        ngx_llmgw_emit_release(rn, r);
    }

    ngx_llmgw_pipe_flow(rn, r);
}


static void
ngx_llmgw_pipe_done(void *data, ngx_int_t rc, ngx_llmgw_http_resp_t *resp,
    const char *err)
{
    ngx_connection_t    *c;
    ngx_http_request_t  *r;
    ngx_llmgw_runner_t  *rn = data;

    if (!rn->piping) {
        /* it failed before its head: the job answers */
        ngx_llmgw_task_http_done(data, rc, resp, err);
        return;
    }

    rn->http = NULL;
    rn->inflight = 0;
    r = rn->request;

    ngx_llmgw_task_detach(rn, r);
    ngx_llmgw_runner_free(rn);

    if (r == NULL) {
        return;
    }

    c = r->connection;

    if (rc != NGX_OK) {
        /* the head went out: a cut body can only end the connection */
        ngx_log_error(NGX_LOG_WARN, c->log, 0,
                      "llmgw: content cut short: %s",
                      err ? err : "the request failed");
        ngx_http_finalize_request(r, NGX_ERROR);

    } else {
        r->write_event_handler = ngx_http_request_empty_handler;
        ngx_http_finalize_request(r, ngx_http_send_special(r,
                                                           NGX_HTTP_LAST));
    }

    ngx_http_run_posted_requests(c);
}


/* ------------------------------------------------------------------ */
/* client requests                                                     */

/* The request's headers as {name: value}, credentials left out. */
static ngx_int_t
ngx_llmgw_task_request_headers(ngx_http_request_t *r, llmgw_buf_t *out)
{
    size_t            n;
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;
    llmgw_str_t      *names, *values;

    n = 0;
    for (part = &r->headers_in.headers.part; part; part = part->next) {
        n += part->nelts;
    }

    names = ngx_palloc(r->pool, (n + 1) * sizeof(llmgw_str_t));
    values = ngx_palloc(r->pool, (n + 1) * sizeof(llmgw_str_t));
    if (names == NULL || values == NULL) {
        return NGX_ERROR;
    }

    n = 0;
    for (part = &r->headers_in.headers.part; part; part = part->next) {
        h = part->elts;
        for (i = 0; i < part->nelts; i++) {
            names[n].data = (char *) h[i].key.data;
            names[n].len = h[i].key.len;
            values[n].data = (char *) h[i].value.data;
            values[n].len = h[i].value.len;
            n++;
        }
    }

    *out = llmgw_task_headers_json(names, values, n);

    return out->data != NULL ? NGX_OK : NGX_ERROR;
}


/*
 * The client's body for a job that may outlive the request.  A body nginx
 * spooled to its temp file is mapped from there (the file bytes stay in
 * the file's pages, also after nginx removed it); a body in memory is
 * copied.  Nothing of it reaches v8_host but file references.
 */
static void
ngx_llmgw_task_body_free(ngx_llmgw_task_body_t *rn)
{
    if (rn->body_mapped) {
        munmap(rn->body, rn->body_len);
    } else if (rn->body != NULL) {
        ngx_free(rn->body);
    }

    rn->body = NULL;
    rn->body_mapped = 0;
}


static ngx_int_t
ngx_llmgw_task_body(ngx_http_request_t *r, ngx_llmgw_task_body_t *rn)
{
    off_t         len, next;
    u_char       *p;
    ssize_t       n;
    ngx_fd_t      fd;
    ngx_buf_t    *b;
    ngx_uint_t    whole_file;
    ngx_chain_t  *cl;

    if (r->request_body == NULL || r->request_body->bufs == NULL) {
        return NGX_OK;
    }

    len = 0;
    next = 0;
    fd = NGX_INVALID_FILE;
    whole_file = 1;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;
        len += ngx_buf_size(b);

        /* one file, in order, from its start */
        if (!b->in_file || b->file_pos != next
            || (fd != NGX_INVALID_FILE && b->file->fd != fd))
        {
            whole_file = 0;
        } else {
            fd = b->file->fd;
            next = b->file_last;
        }
    }

    if (len == 0) {
        return NGX_OK;
    }

    rn->body_len = (size_t) len;

    if (whole_file && fd != NGX_INVALID_FILE) {
        p = mmap(NULL, rn->body_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p != MAP_FAILED) {
            rn->body = p;
            rn->body_mapped = 1;
            return NGX_OK;
        }
    }

    rn->body = ngx_alloc(rn->body_len, r->connection->log);
    if (rn->body == NULL) {
        return NGX_ERROR;
    }

    p = rn->body;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if (b->in_file) {
            n = ngx_read_file(b->file, p, b->file_last - b->file_pos,
                              b->file_pos);
            if (n == NGX_ERROR) {
                return NGX_ERROR;
            }
            p += n;

        } else {
            p = ngx_cpymem(p, b->pos, b->last - b->pos);
        }
    }

    rn->body_len = p - rn->body;

    return NGX_OK;
}


/*
 * The runner of request r's job, which takes the job and *body (may be
 * empty; the job reads it in place); NULL when out of memory (the job and
 * the body freed).
 */
static ngx_llmgw_runner_t *
ngx_llmgw_task_runner(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    llmgw_tjob_t *job, ngx_llmgw_task_body_t *body)
{
    ngx_llmgw_runner_t  *rn;
    ngx_pool_cleanup_t  *cln;

    /* the job keeps its own references: it may outlive the request */
    ngx_llmgw_cache_ref(ctx->snapshot);

    rn = ngx_llmgw_runner_new(job, ctx->snapshot);
    if (rn == NULL) {
        ngx_llmgw_task_body_free(body);
        ngx_llmgw_cache_release(ctx->snapshot);
        return NULL;
    }

    rn->body = *body;

    rn->token = llmgw_token_ref(ctx->token);
    rn->request = r;

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        ngx_llmgw_runner_free(rn);
        return NULL;
    }

    cln->handler = ngx_llmgw_task_request_gone;
    cln->data = rn;
    rn->cleanup = cln;
    ctx->task = rn;

    return rn;
}


/*
 * A refusal of the gateway's own on a plugin's native route, before its
 * job (the key, its address, group and quota, the rate limit, the
 * method), shaped by the plugin's native.error when it has one: NGX_DONE,
 * the answer sent when the hook has answered (the request held till
 * then); NGX_DECLINED, the caller answers in the contract.  Headers set
 * before (Retry-After, Allow) stay.
 */
ngx_int_t
ngx_llmgw_task_refuse(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    const llmgw_verdict_t *v)
{
    llmgw_treq_t            req;
    llmgw_tjob_t           *job;
    ngx_llmgw_runner_t     *rn;
    ngx_llmgw_task_body_t   body;

    if (ctx->endpoint.ep != LLMGW_EP_TASK
        || ctx->troute.kind != LLMGW_TROUTE_NATIVE
        || ctx->snapshot == NULL || ctx->task != NULL || ctx->responded)
    {
        return NGX_DECLINED;
    }

    ngx_memzero(&req, sizeof(req));
    req.method = (llmgw_str_t) { (char *) r->method_name.data,
                                 r->method_name.len };
    req.path = (llmgw_str_t) { (char *) r->uri.data, r->uri.len };
    req.args = ngx_llmgw_task_args(r, ctx);
    req.request_id = (llmgw_str_t) { (char *) ctx->request_id,
                                     ngx_strlen(ctx->request_id) };

    job = llmgw_tjob_refusal(ctx->snapshot, &ngx_llmgw_task_conf,
                             &ctx->troute, &req, v);
    if (job == NULL) {
        return NGX_DECLINED;
    }

    ngx_memzero(&body, sizeof(body));

    rn = ngx_llmgw_task_runner(r, ctx, job, &body);
    if (rn == NULL) {
        return NGX_DECLINED;
    }

    /* the answer comes with the hook's: the request is held till then */
    r->main->count++;
    ngx_llmgw_task_drive(rn);

    return NGX_DONE;
}


/* The query as it came: a ?key= in it was masked for the logs. */
static llmgw_str_t
ngx_llmgw_task_args(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    return ctx->args.data
           ? (llmgw_str_t) { (char *) ctx->args.data, ctx->args.len }
           : (llmgw_str_t) { (char *) r->args.data, r->args.len };
}


void
ngx_llmgw_task_start(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    u_char                 *p;
    ngx_str_t               host;
    llmgw_buf_t             headers;
    llmgw_treq_t            req;
    llmgw_tjob_t           *job;
    ngx_llmgw_runner_t     *rn;
    ngx_llmgw_task_body_t   body;

    ngx_memzero(&body, sizeof(body));

    if (ngx_llmgw_task_body(r, &body) != NGX_OK) {
        ngx_llmgw_task_body_free(&body);
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (ngx_llmgw_task_request_headers(r, &headers) != NGX_OK) {
        ngx_llmgw_task_body_free(&body);
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ngx_memzero(&req, sizeof(req));
    req.method = (llmgw_str_t) { (char *) r->method_name.data,
                                 r->method_name.len };
    req.path = (llmgw_str_t) { (char *) r->uri.data, r->uri.len };
    req.args = ngx_llmgw_task_args(r, ctx);
    if (r->headers_in.content_type != NULL) {
        req.content_type = (llmgw_str_t) {
            (char *) r->headers_in.content_type->value.data,
            r->headers_in.content_type->value.len };
    }
    req.body = (llmgw_str_t) { (char *) body.body, body.body_len };
    req.headers_json = (llmgw_str_t) { headers.data, headers.len };
    req.request_id = (llmgw_str_t) { (char *) ctx->request_id,
                                     ngx_strlen(ctx->request_id) };
    req.token = ctx->token;
    req.group = (llmgw_str_t) { (char *) ctx->group.data, ctx->group.len };
    req.group_ratio = ctx->group_ratio;
    req.seed = ((uint64_t) ngx_random() << 32) ^ (uint64_t) ngx_random();
    req.signed_link = ctx->signed_link;

    /* where the client reached us: artifact links lead back there unless
       llmgw_task_public_address (or llmgw_server_address) says otherwise */
    host = r->headers_in.server;
    if (r->headers_in.host != NULL) {
        host = r->headers_in.host->value;
    }
    p = ngx_pnalloc(r->pool, sizeof("https://") - 1 + host.len);
    if (p != NULL) {
        req.origin.data = (char *) p;
#if (NGX_HTTP_SSL)
        if (r->connection->ssl != NULL) {
            p = ngx_cpymem(p, "https://", sizeof("https://") - 1);
        } else
#endif
        {
            p = ngx_cpymem(p, "http://", sizeof("http://") - 1);
        }
        p = ngx_cpymem(p, host.data, host.len);
        req.origin.len = p - (u_char *) req.origin.data;
    }

    job = llmgw_tjob_request(ctx->snapshot, &ngx_llmgw_task_conf,
                             &ctx->troute, &req);
    llmgw_buf_free(&headers);

    if (job == NULL) {
        ngx_llmgw_task_body_free(&body);
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    rn = ngx_llmgw_task_runner(r, ctx, job, &body);
    if (rn == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    if (ctx->troute.kind == LLMGW_TROUTE_CONTENT
        || (ctx->troute.kind == LLMGW_TROUTE_PROTOCOL
            && ctx->troute.proto == LLMGW_TPROTO_VIDEO_CONTENT))
    {
        /*
         * Content is for its client alone: one that leaves is noticed from
         * now on, while the request to the vendor is built, sent and read,
         * and the job ends (its request_gone).  Other requests go on
         * without their client: a submit's task must be stored.
         */
        r->read_event_handler = ngx_http_test_reading;
    }

    ngx_llmgw_task_drive(rn);
}


/* ------------------------------------------------------------------ */
/* the poller                                                          */

/*
 * Each worker looks every second (or every interval, when shorter) whether
 * its interval has passed, or whether some poller of this node flagged a
 * backlog in the shared zone: then every worker helps until it is gone.
 */
static ngx_msec_t
ngx_llmgw_poll_period(void)
{
    return ngx_min(ngx_llmgw_task_mcf->task_poll_interval, 1000);
}


static ngx_uint_t
ngx_llmgw_poll_due(void)
{
    ngx_llmgw_shm_ctx_t  *shm;

    if (ngx_llmgw_poll_go_on
        || ngx_current_msec - ngx_llmgw_poll_last
           >= ngx_llmgw_task_mcf->task_poll_interval)
    {
        return 1;
    }

    shm = ngx_llmgw_shm();

    return shm != NULL
           && (ngx_msec_int_t) (shm->sh->task_backlog_until
                                - ngx_current_msec) > 0;
}


/*
 * A claim was answered.  A full one means more tasks may be due right now:
 * this worker claims again as soon as it has room, and a full claim of a
 * whole batch flags the backlog for the node's other workers.
 */
static void
ngx_llmgw_poll_claim_done(ngx_uint_t ntasks, ngx_uint_t limit)
{
    ngx_llmgw_shm_ctx_t  *shm;

    if (ntasks < limit) {
        ngx_llmgw_poll_schedule(ngx_llmgw_poll_period());
        return;
    }

    if (limit == ngx_llmgw_task_mcf->task_poll_batch) {
        shm = ngx_llmgw_shm();
        if (shm != NULL) {
            shm->sh->task_backlog_until =
                ngx_current_msec + ngx_llmgw_task_mcf->task_poll_interval;
        }
    }

    ngx_llmgw_poll_go_on = 1;
    ngx_llmgw_poll_schedule(1);
}


static void
ngx_llmgw_poll_schedule(ngx_msec_t delay)
{
    if (ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    if (ngx_llmgw_poll_ev.timer_set) {
        ngx_del_timer(&ngx_llmgw_poll_ev);
    }

    ngx_add_timer(&ngx_llmgw_poll_ev, delay);
}


/* A poll job leaves the poller: its tasks are no longer held. */
static void
ngx_llmgw_poll_runner_free(ngx_llmgw_runner_t *rn)
{
    ngx_llmgw_poll_held -= ngx_min(rn->ntasks, ngx_llmgw_poll_held);
    ngx_llmgw_runner_free(rn);
}


/* Poll jobs running per channel: channels are few, a short array serves. */
typedef struct {
    int64_t     channel_id;
    ngx_uint_t  running;
} ngx_llmgw_poll_busy_t;

static ngx_llmgw_poll_busy_t  ngx_llmgw_poll_busy[64];
static ngx_uint_t             ngx_llmgw_poll_nbusy;


static ngx_llmgw_poll_busy_t *
ngx_llmgw_poll_channel(int64_t channel_id)
{
    ngx_uint_t  i;

    for (i = 0; i < ngx_llmgw_poll_nbusy; i++) {
        if (ngx_llmgw_poll_busy[i].channel_id == channel_id) {
            return &ngx_llmgw_poll_busy[i];
        }
    }

    /* reuse an idle entry, else take a new one; past 64 busy channels
     * they share the last entry (a tighter bound, never a looser one) */
    for (i = 0; i < ngx_llmgw_poll_nbusy; i++) {
        if (ngx_llmgw_poll_busy[i].running == 0) {
            ngx_llmgw_poll_busy[i].channel_id = channel_id;
            return &ngx_llmgw_poll_busy[i];
        }
    }

    if (ngx_llmgw_poll_nbusy
        < sizeof(ngx_llmgw_poll_busy) / sizeof(ngx_llmgw_poll_busy[0]))
    {
        i = ngx_llmgw_poll_nbusy++;
        ngx_llmgw_poll_busy[i].channel_id = channel_id;
        ngx_llmgw_poll_busy[i].running = 0;
        return &ngx_llmgw_poll_busy[i];
    }

    return &ngx_llmgw_poll_busy[ngx_llmgw_poll_nbusy - 1];
}


/*
 * Starts waiting jobs whose channel has room.  A job can end inside its
 * first step (the database queue full, the plugin runtime busy), and its
 * end asks for more starts: that request is noted and served by another
 * scan here, never by a second scan running inside this one's walk.
 */
static void
ngx_llmgw_poll_start_more(void)
{
    ngx_msec_t              lease;
    ngx_uint_t              dropped;
    ngx_queue_t            *q, *next;
    ngx_msec_int_t          left;
    ngx_llmgw_runner_t     *rn;
    ngx_llmgw_poll_busy_t  *b;
    static ngx_uint_t       starting, again;

    if (starting) {
        again = 1;
        return;
    }

    starting = 1;
    dropped = 0;

    do {
        again = 0;

        for (q = ngx_queue_head(&ngx_llmgw_poll_waiting);
             q != ngx_queue_sentinel(&ngx_llmgw_poll_waiting);
             q = next)
        {
            next = ngx_queue_next(q);
            rn = ngx_queue_data(q, ngx_llmgw_runner_t, queue);

            /* a stopping worker starts no poll: its claims are released
               at exit, for another worker or node to take at once */
            if (ngx_exiting || ngx_terminate || ngx_quit) {
                ngx_queue_remove(q);
                ngx_llmgw_poll_runner_free(rn);
                ngx_llmgw_poll_abandoned = 1;
                continue;
            }

            /*
             * A job that waited through most of its lease is left alone:
             * once the lease ends another pass (of any worker or node)
             * claims its tasks, and polling them now could make two polls
             * of one task at once.
             */
            if (ngx_current_msec - rn->claimed
                >= ngx_llmgw_task_mcf->task_lease / 4 * 3)
            {
                ngx_queue_remove(q);
                ngx_llmgw_poll_runner_free(rn);
                dropped++;
                continue;
            }

            b = ngx_llmgw_poll_channel(rn->channel_id);
            if (b->running >= ngx_llmgw_task_mcf->task_poll_concurrency) {
                continue;
            }

            b->running++;
            rn->busy = b;
            ngx_queue_remove(q);
            ngx_queue_insert_tail(&ngx_llmgw_poll_active, q);
            ngx_llmgw_poll_running++;

            /* its lease began before the claim's answer came: 1/8 of it
               is left for that */
            lease = ngx_llmgw_task_mcf->task_lease;
            left = (ngx_msec_int_t) (rn->claimed + (lease - lease / 8)
                                     - ngx_current_msec);
            rn->lease_end.handler = ngx_llmgw_poll_lease_end;
            rn->lease_end.data = rn;
            rn->lease_end.log = ngx_llmgw_task_log;
            rn->lease_end.cancelable = 1;
            if (left > 0) {
                ngx_add_timer(&rn->lease_end, (ngx_msec_t) left);
            } else {
                rn->lease_over = 1;
            }

            if (!ngx_llmgw_poll_stop_ev.timer_set) {
                ngx_add_timer(&ngx_llmgw_poll_stop_ev,
                              NGX_LLMGW_POLL_STOP_WATCH);
            }

            ngx_llmgw_task_drive(rn);
        }

    } while (again);

    starting = 0;

    if (dropped) {
        ngx_log_error(NGX_LOG_INFO, ngx_llmgw_task_log, 0,
                      "llmgw: %ui poll jobs waited through 3/4 of "
                      "llmgw_task_lease and are left to a later pass",
                      dropped);
    }
}


/*
 * Near the end of a poll job's lease another pass may claim its tasks: a
 * call to the vendor still under way is given up (the next pass polls
 * again; nothing is counted), and none starts after.  A hook or statement
 * under way goes on: what it saves is checked against the lease.
 */
static void
ngx_llmgw_poll_lease_end(ngx_event_t *ev)
{
    ngx_llmgw_runner_t  *rn = ev->data;

    rn->lease_over = 1;

    if (rn->http != NULL && rn->inflight && !rn->driving) {
        ngx_llmgw_poll_left(rn, "reached 7/8 of llmgw_task_lease before its "
                            "call to the vendor ended");
    }
}


/*
 * A stopping worker waits for no vendor and no plugin: its polls with a
 * call to the vendor or a hook under way are given up (the result of
 * either is dropped, nothing is counted), and their claims given back at
 * exit.  A statement under way goes on: it may settle a charge.  Nothing
 * tells a module that its worker was told to stop, so this looks while
 * polls run (a cancelable timer: it keeps no worker alive).
 */
static void
ngx_llmgw_poll_stop_watch(ngx_event_t *ev)
{
    ngx_queue_t         *q, *next;
    ngx_llmgw_runner_t  *rn;

    if (ngx_exiting || ngx_terminate || ngx_quit) {
        for (q = ngx_queue_head(&ngx_llmgw_poll_active);
             q != ngx_queue_sentinel(&ngx_llmgw_poll_active);
             q = next)
        {
            /* ending a job at exit starts none: only this one goes */
            next = ngx_queue_next(q);
            rn = ngx_queue_data(q, ngx_llmgw_runner_t, queue);

            rn->lease_over = 1;

            if ((rn->http != NULL || rn->hook != NULL) && rn->inflight
                && !rn->driving)
            {
                ngx_llmgw_poll_left(rn, "was under way when its worker was "
                                    "told to stop");
            }
        }
    }

    if (ngx_llmgw_poll_running > 0) {
        ngx_add_timer(ev, NGX_LLMGW_POLL_STOP_WATCH);
    }
}


static void
ngx_llmgw_poll_left(ngx_llmgw_runner_t *rn, const char *why)
{
    ngx_log_error(NGX_LOG_INFO, ngx_llmgw_task_log, 0,
                  "llmgw: a poll job of channel %L %s and is left to a later "
                  "pass", rn->channel_id, why);

    /* given back at exit, if this worker is leaving */
    ngx_llmgw_poll_abandoned = 1;

    ngx_llmgw_poll_job_done(rn);
}


static void
ngx_llmgw_poll_job_done(ngx_llmgw_runner_t *rn)
{
    int          auth;
    size_t       notes;
    const char  *first;

    notes = llmgw_tjob_poll_notes(rn->job, &auth, &first);

    if (auth) {
        ngx_log_error(NGX_LOG_WARN, ngx_llmgw_task_log, 0,
                      "llmgw: the task upstream of channel %L refused the "
                      "channel's credentials while polling",
                      rn->channel_id);
    }

    if (notes > 0) {
        ngx_log_error(NGX_LOG_WARN, ngx_llmgw_task_log, 0,
                      "llmgw: polling: %s (%uz notes)", first, notes);
    }

    ngx_queue_remove(&rn->queue);
    ngx_llmgw_poll_running--;
    if (rn->busy != NULL) {
        ((ngx_llmgw_poll_busy_t *) rn->busy)->running--;
    }
    ngx_llmgw_poll_runner_free(rn);

    ngx_llmgw_poll_start_more();

    /* a backlog is claimed into the room this job left */
    if (ngx_llmgw_poll_go_on) {
        ngx_llmgw_poll_schedule(1);
    }
}


static void
ngx_llmgw_poll_claimed_cb(void *data, PGresult *res, const char *err)
{
    size_t               ntasks, njobs, i;
    ngx_uint_t           limit;
    const char          *val;
    llmgw_tjob_t       **jobs;
    llmgw_snapshot_t    *snap;
    ngx_llmgw_runner_t  *rn;

    limit = (ngx_uint_t) (uintptr_t) data;
    ngx_llmgw_poll_claiming = 0;

    if (err != NULL || res == NULL || PQntuples(res) != 1
        || PQgetisnull(res, 0, 0))
    {
        if (err != NULL) {
            ngx_log_error(NGX_LOG_ERR, ngx_llmgw_task_log, 0,
                          "llmgw: claiming due tasks failed: %s", err);
        }
        ngx_llmgw_poll_schedule(ngx_llmgw_poll_period());
        return;
    }

    val = PQgetvalue(res, 0, 0);
    snap = ngx_llmgw_cache_snapshot();

    if (snap == NULL) {
        ngx_llmgw_poll_schedule(ngx_llmgw_poll_period());
        return;
    }

    /* the refunds of expired tasks are learned with the jobs' reading */
    njobs = llmgw_task_poll_jobs(snap, &ngx_llmgw_task_conf, val,
                                 ngx_strlen(val),
                                 (llmgw_str_t) {
                                     (char *) ngx_llmgw_poll_owner,
                                     ngx_strlen(ngx_llmgw_poll_owner) },
                                 ngx_llmgw_billing_learned, NULL,
                                 &jobs, &ntasks);

    ngx_log_debug2(NGX_LOG_DEBUG_HTTP, ngx_llmgw_task_log, 0,
                   "llmgw: polling %uz tasks in %uz jobs", ntasks, njobs);

    for (i = 0; i < njobs; i++) {
        /* each runner holds its own reference to the jobs' snapshot */
        ngx_llmgw_cache_ref(snap);

        rn = ngx_llmgw_runner_new(jobs[i], snap);
        if (rn == NULL) {
            ngx_llmgw_cache_release(snap);
            continue;
        }

        rn->channel_id = llmgw_tjob_channel(jobs[i]);
        rn->ntasks = llmgw_tjob_ntasks(jobs[i]);
        rn->claimed = ngx_current_msec;
        rn->poll = 1;
        ngx_llmgw_poll_held += rn->ntasks;
        ngx_queue_insert_tail(&ngx_llmgw_poll_waiting, &rn->queue);
    }

    free(jobs);
    ngx_llmgw_cache_release(snap);

    ngx_llmgw_poll_start_more();

    ngx_llmgw_poll_claim_done(ntasks, limit);
}


/*
 * A pass claims due tasks while earlier ones may still be polled: up to
 * llmgw_task_poll_batch tasks held in all, none of a channel whose polls
 * already fill llmgw_task_poll_concurrency (its tasks would only wait), so
 * one channel's slow polls hold up no other channel's.
 */
static void
ngx_llmgw_poll_tick(ngx_event_t *ev)
{
    u_char                 *p, *last;
    ngx_uint_t              i, room, nskip;
    const char             *params[4];
    u_char                  limit[NGX_INT_T_LEN + 1], lease[NGX_INT_T_LEN + 1];
    static u_char           skip[64 * (NGX_INT64_LEN + 1) + 3];

    if (ngx_exiting || ngx_terminate || ngx_quit) {
        return;
    }

    if (ngx_llmgw_poll_claiming) {
        /* the claim's answer schedules the next tick */
        return;
    }

    room = ngx_llmgw_task_mcf->task_poll_batch > ngx_llmgw_poll_held
           ? ngx_llmgw_task_mcf->task_poll_batch - ngx_llmgw_poll_held : 0;

    if (room == 0 || !ngx_llmgw_poll_due()) {
        ngx_llmgw_poll_schedule(ngx_llmgw_poll_period());
        return;
    }

    ngx_llmgw_poll_go_on = 0;
    ngx_llmgw_poll_last = ngx_current_msec;

    p = skip;
    last = skip + sizeof(skip) - 2;
    *p++ = '{';
    nskip = 0;

    for (i = 0; i < ngx_llmgw_poll_nbusy; i++) {
        if (ngx_llmgw_poll_busy[i].running
            < ngx_llmgw_task_mcf->task_poll_concurrency)
        {
            continue;
        }

        p = ngx_slprintf(p, last, "%s%L", nskip++ ? "," : "",
                         ngx_llmgw_poll_busy[i].channel_id);
    }

    *p++ = '}';
    *p = '\0';

    *ngx_sprintf(limit, "%ui", room) = '\0';
    *ngx_sprintf(lease, "%M", ngx_llmgw_task_mcf->task_lease) = '\0';

    params[0] = (char *) ngx_llmgw_poll_owner;
    params[1] = (char *) limit;
    params[2] = (char *) lease;
    params[3] = (char *) skip;

    ngx_llmgw_poll_claiming = 1;

    if (ngx_llmgw_pg_query("select llmgw_task_claim($1, $2::int, $3::int, "
                           "$4::bigint[])",
                           4, params, NULL, ngx_llmgw_poll_claimed_cb,
                           (void *) (uintptr_t) room)
        != NGX_OK)
    {
        ngx_llmgw_poll_claiming = 0;
        ngx_llmgw_poll_schedule(ngx_llmgw_poll_period());
    }
}
