/*
 * The ledger writer.  Every request leaves one row, queued in the node's
 * shared zone (so a worker killed with -9 loses none) and written behind
 * the responses in batches with COPY (sql/008_ledger_copy.sql).  A batch of
 * rows never sent goes straight into logs, with the balance changes summed
 * here; rows that may have been written before (their batch failed, timed
 * out, or its worker died or exited) go the idempotent way, by (request id,
 * type), so they never count twice.  Any worker writes any row; batches go
 * out every llmgw_flush_interval and at worker exit.
 */

#include "ngx_llmgw.h"


#define NGX_LLMGW_BATCH_MAX  1000


typedef struct {
    u_char                    *copy;       /* the rows, COPY text */
    size_t                     len;
    llmgw_charge_t            *charges;
    ngx_uint_t                 n;
    ngx_uint_t                 again;      /* may have been written before */
} ngx_llmgw_batch_t;


static void ngx_llmgw_ledger_tick(ngx_event_t *ev);
static void ngx_llmgw_ledger_next(ngx_event_t *ev);
static void ngx_llmgw_ledger_kick(void);
static void ngx_llmgw_ledger_flush(void);
static void ngx_llmgw_ledger_flushed(void *data, PGresult *res,
    const char *err);
static ngx_int_t ngx_llmgw_ledger_take(ngx_llmgw_batch_t *b);
static void ngx_llmgw_ledger_free(ngx_llmgw_batch_t *b);


static ngx_event_t             ngx_llmgw_flush_ev;
static ngx_event_t             ngx_llmgw_flush_next;
static ngx_llmgw_main_conf_t  *ngx_llmgw_ledger_mcf;
static ngx_log_t              *ngx_llmgw_ledger_log;


ngx_int_t
ngx_llmgw_ledger_init_process(ngx_cycle_t *cycle, ngx_llmgw_main_conf_t *mcf)
{
    ngx_llmgw_ledger_mcf = mcf;
    ngx_llmgw_ledger_log = cycle->log;

    ngx_llmgw_flush_ev.handler = ngx_llmgw_ledger_tick;
    ngx_llmgw_flush_ev.data = &ngx_llmgw_no_connection;
    ngx_llmgw_flush_ev.log = cycle->log;
    ngx_llmgw_flush_ev.cancelable = 1;

    ngx_llmgw_flush_next.handler = ngx_llmgw_ledger_next;
    ngx_llmgw_flush_next.data = &ngx_llmgw_no_connection;
    ngx_llmgw_flush_next.log = cycle->log;

    ngx_add_timer(&ngx_llmgw_flush_ev, mcf->flush_interval);

    return NGX_OK;
}


void
ngx_llmgw_ledger_record(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_uint_t           status;
    ngx_time_t          *tp;
    llmgw_buf_t          line;
    llmgw_ledger_row_t   row;

    static const char  *ep_names[] = {
        "", "chat", "messages", "gemini", "rerank", "models", "invalid_url",
        "task"
    };

    ngx_memzero(&row, sizeof(row));

    status = r->headers_out.status;
    tp = ngx_timeofday();

    row.request_id = (char *) ctx->request_id;
    row.type = ngx_llmgw_succeeded(r, ctx) ? "consume" : "error";
    row.user_id = ctx->user_id;
    row.token_id = ctx->token_id;
    row.channel_id = ctx->current >= 0 ? ctx->channels[ctx->current]->id : 0;
    row.model = (llmgw_str_t) { (char *) ctx->model.data, ctx->model.len };
    row.upstream_model = (llmgw_str_t) { (char *) ctx->upstream_model.data,
                                         ctx->upstream_model.len };
    row.endpoint.data = ep_names[ctx->endpoint.ep
                                 < sizeof(ep_names) / sizeof(ep_names[0])
                                 ? ctx->endpoint.ep : 0];
    row.endpoint.len = ngx_strlen(row.endpoint.data);
    row.tried = ctx->tried_ids;
    row.ntried = ctx->tried;
    row.is_stream = ctx->endpoint.stream
                    || (ctx->req && llmgw_req_stream(ctx->req));
    /* a 2xx that was cut short is charged for what it delivered, and its
       row shows how it ended (499 client gone, 502 upstream cut, 504) */
    if (ctx->end_status) {
        row.status = (int) ctx->end_status;

    } else if (row.type[0] == 'e' && status >= 200 && status < 300) {
        /* an answer that failed under a 200 head */
        row.status = NGX_HTTP_BAD_GATEWAY;

    } else if (r->connection->error && r->connection->sent == 0) {
        /* the client left before it got a byte (nginx calls one that
           leaves during its body's upload a 400) */
        row.status = NGX_HTTP_CLIENT_CLOSED_REQUEST;

    } else {
        row.status = (int) status;
    }

    row.latency_ms = (int64_t) (ngx_current_msec - ctx->start_msec);
    row.created_at = (double) tp->sec + (double) tp->msec / 1000;

    if (ctx->resp) {
        llmgw_resp_usage(ctx->resp, &row.usage);

        /* no usage came (a stream cut before its usage chunk, an answer
           without one): the prompt is what the reservation estimated, as
           the upstream will have read it all (a rerank's query and
           documents too) */
        if (!row.usage.known && ctx->req != NULL) {
            row.usage.prompt_tokens = llmgw_req_prompt_estimate(ctx->req);
        }
    }

    /* a success is charged; a failure only gives its reservation back */
    if (row.type[0] == 'c'
        && !(ctx->price.per_call && (ctx->end_status == NGX_HTTP_BAD_GATEWAY
                                     || ctx->end_status
                                        == NGX_HTTP_GATEWAY_TIME_OUT)))
    {
        /* a per-call price is for a call the upstream completed: one it
           cut or let time out costs nothing (a client that left pays) */
        row.quota = llmgw_quota(&ctx->price, ctx->group_ratio, &row.usage);
    }

    /*
     * A refusal made before any reservation, while the ledger is full (it
     * was refused for that), leaves no row: there is no room for one and
     * nothing was charged.
     */
    if (ctx->hold == NULL && ngx_llmgw_ledger_has_room() != NGX_OK) {
        return;
    }

    line = llmgw_ledger_row_copy(&row);

    if (line.data == NULL
        || ngx_llmgw_billing_settle(ctx, row.quota, (u_char *) line.data,
                                    line.len)
           != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "llmgw: the ledger row of %s could not be queued "
                      "(raise llmgw_zone_size)", ctx->request_id);
    }

    llmgw_buf_free(&line);

    ngx_llmgw_ledger_kick();
}


/*
 * A full batch waiting starts a write at once rather than at the next
 * tick: under load, a flush interval's worth of rows would otherwise pile
 * up before the first batch goes out.  The counters are read without the
 * mutex: a stale reading only moves the write to the next request or tick.
 */
static void
ngx_llmgw_ledger_kick(void)
{
    ngx_llmgw_proc_t     *me;
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();
    me = ngx_llmgw_billing_me();

    if (shm == NULL || me == NULL || ngx_llmgw_flush_next.posted
        || me->batch_rows > 0 || shm->sh->ledger_rows < NGX_LLMGW_BATCH_MAX
        || ngx_exiting || ngx_terminate)
    {
        return;
    }

    ngx_post_event(&ngx_llmgw_flush_next, &ngx_posted_events);
}


/* A request waits for room in a worker told to stop, whose flushes may
   have ended: they go on while it waits. */
void
ngx_llmgw_ledger_wake(void)
{
    if (ngx_exiting && !ngx_terminate && ngx_llmgw_flush_ev.handler != NULL
        && !ngx_llmgw_flush_ev.timer_set)
    {
        ngx_add_timer(&ngx_llmgw_flush_ev,
                      ngx_llmgw_ledger_mcf->flush_interval);
    }
}


static void
ngx_llmgw_ledger_tick(ngx_event_t *ev)
{
    ngx_llmgw_ledger_flush();

    /* a worker told to stop writes at exit, and before only for requests
       that wait for room */
    if (!ngx_terminate && (!ngx_exiting || ngx_llmgw_admit_waiters())) {
        ngx_add_timer(ev, ngx_llmgw_ledger_mcf->flush_interval);
    }
}


/*
 * Moves up to a batch of rows into this process's slot and copies them out
 * (heap memory, freed with ngx_llmgw_ledger_free()).  NGX_DECLINED: nothing
 * to send.
 */
static ngx_int_t
ngx_llmgw_ledger_take(ngx_llmgw_batch_t *b)
{
    size_t                size;
    u_char               *p;
    ngx_int_t             rc;
    ngx_uint_t            n;
    ngx_queue_t          *q;
    ngx_llmgw_row_t      *row;
    ngx_llmgw_proc_t     *me;
    ngx_llmgw_shm_ctx_t  *shm;

    ngx_memzero(b, sizeof(ngx_llmgw_batch_t));

    shm = ngx_llmgw_shm();
    me = ngx_llmgw_billing_me();
    rc = NGX_DECLINED;

    if (shm == NULL || me == NULL) {
        return rc;
    }

    ngx_shmtx_lock(&shm->shpool->mutex);

    ngx_llmgw_billing_reap_locked(shm);

    if (me->batch_rows > 0 || shm->sh->ledger_rows == 0) {
        goto done;
    }

    size = 0;
    n = 0;

    for (q = ngx_queue_head(&shm->sh->ledger);
         q != ngx_queue_sentinel(&shm->sh->ledger) && n < NGX_LLMGW_BATCH_MAX;
         q = ngx_queue_next(q))
    {
        row = ngx_queue_data(q, ngx_llmgw_row_t, queue);
        size += row->len;
        n++;
    }

    b->copy = ngx_alloc(size + 1, ngx_llmgw_ledger_log);
    b->charges = ngx_alloc(n * sizeof(llmgw_charge_t), ngx_llmgw_ledger_log);

    if (b->copy == NULL || b->charges == NULL) {
        ngx_llmgw_ledger_free(b);
        rc = NGX_ERROR;
        goto done;
    }

    p = b->copy;

    while (n--) {
        q = ngx_queue_head(&shm->sh->ledger);
        ngx_queue_remove(q);
        shm->sh->ledger_rows--;

        ngx_queue_insert_tail(&me->batch, q);
        me->batch_rows++;

        row = ngx_queue_data(q, ngx_llmgw_row_t, queue);

        p = ngx_cpymem(p, row->data, row->len);

        b->charges[b->n].token_id = row->token_id;
        b->charges[b->n].user_id = row->user_id;
        b->charges[b->n].quota = row->quota;
        b->n++;

        /* a token's owner is looked up the idempotent way */
        if (row->again || (row->token_id != 0 && row->user_id == 0)) {
            b->again = 1;
        }
    }

    *p = '\0';
    b->len = p - b->copy;
    rc = NGX_OK;

done:

    ngx_shmtx_unlock(&shm->shpool->mutex);

    return rc;
}


static void
ngx_llmgw_ledger_free(ngx_llmgw_batch_t *b)
{
    if (b->copy) {
        ngx_free(b->copy);
        b->copy = NULL;
    }

    if (b->charges) {
        ngx_free(b->charges);
        b->charges = NULL;
    }
}


static void
ngx_llmgw_ledger_flush(void)
{
    ngx_int_t          rc;
    llmgw_buf_t        sql;
    ngx_llmgw_batch_t  b;

    if (ngx_llmgw_ledger_take(&b) != NGX_OK) {
        return;
    }

    sql.data = NULL;

    if (b.again) {
        rc = ngx_llmgw_pg_copy(LLMGW_FLUSH_AGAIN_SQL, b.copy, b.len,
                               ngx_llmgw_ledger_flushed, NULL);

    } else {
        sql = llmgw_flush_new_sql(b.charges, b.n);

        rc = sql.data == NULL
             ? NGX_ERROR
             : ngx_llmgw_pg_copy(sql.data, b.copy, b.len,
                                 ngx_llmgw_ledger_flushed, NULL);
    }

    if (rc != NGX_OK) {
        ngx_llmgw_ledger_flushed(NULL, NULL, "the database queue is full");
    }

    llmgw_buf_free(&sql);
    ngx_llmgw_ledger_free(&b);
}


static void
ngx_llmgw_ledger_balance(void *arg, int is_user, int64_t id, int64_t balance,
    int64_t rev)
{
    ngx_llmgw_billing_learned_locked(arg, is_user, id, balance, rev);
}


/* The zone mutex is held. */
static void
ngx_llmgw_ledger_done_locked(ngx_llmgw_shm_ctx_t *shm, ngx_uint_t written)
{
    ngx_queue_t       *q;
    ngx_llmgw_row_t   *row;
    ngx_llmgw_proc_t  *me;

    me = ngx_llmgw_billing_me();

    while (!ngx_queue_empty(&me->batch)) {
        q = written ? ngx_queue_head(&me->batch) : ngx_queue_last(&me->batch);
        ngx_queue_remove(q);
        row = ngx_queue_data(q, ngx_llmgw_row_t, queue);

        if (written) {
            ngx_llmgw_billing_written_locked(shm, row->token_id,
                                             row->user_id, row->quota);
            ngx_slab_free_locked(shm->shpool, row);
            shm->sh->ledger_held--;

        } else {
            /* first in line again, in their order, the idempotent way */
            row->again = 1;
            ngx_queue_insert_head(&shm->sh->ledger, q);
            shm->sh->ledger_rows++;
        }
    }

    me->batch_rows = 0;
}


static void
ngx_llmgw_ledger_flushed(void *data, PGresult *res, const char *err)
{
    ngx_uint_t            more;
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();

    if (ngx_llmgw_billing_me() == NULL) {
        return;
    }

    ngx_shmtx_lock(&shm->shpool->mutex);

    ngx_llmgw_ledger_done_locked(shm, err == NULL);

    if (err == NULL) {
        (void) llmgw_flush_answer(PQgetvalue(res, 0, 0),
                                  PQgetlength(res, 0, 0),
                                  ngx_llmgw_ledger_balance, shm);
    }

    /* a partial batch waits for more rows, or for the next tick */
    more = shm->sh->ledger_rows >= NGX_LLMGW_BATCH_MAX;

    ngx_shmtx_unlock(&shm->shpool->mutex);

    if (err != NULL) {
        ngx_log_error(NGX_LOG_ERR, ngx_llmgw_ledger_log, 0,
                      "llmgw: writing the ledger failed, the rows are kept "
                      "and sent again: %s", err);
        return;
    }

    /* a backlog is written batch after full batch, not one per interval */
    if (more && !ngx_exiting && !ngx_terminate
        && !ngx_llmgw_flush_next.posted)
    {
        ngx_post_event(&ngx_llmgw_flush_next, &ngx_posted_events);
    }
}


static void
ngx_llmgw_ledger_next(ngx_event_t *ev)
{
    ngx_llmgw_ledger_flush();
}


/*
 * Whether the ledger can take more rows: when the database falls so far
 * behind that rows would no longer fit, requests are refused rather than
 * served without a record.
 */
ngx_int_t
ngx_llmgw_ledger_has_room(void)
{
    ngx_uint_t            max;
    ngx_llmgw_shm_ctx_t  *shm;

    shm = ngx_llmgw_shm();

    if (shm == NULL) {
        return NGX_OK;
    }

    /* never more rows than half the zone holds (a row takes a 1 KB slot) */
    max = ngx_min(ngx_llmgw_ledger_mcf->ledger_backlog,
                  (ngx_uint_t) ngx_llmgw_ledger_mcf->shm_size / 2048);

    return shm->sh->ledger_held < max ? NGX_OK : NGX_DECLINED;
}


void
ngx_llmgw_ledger_exit_process(ngx_cycle_t *cycle)
{
    ngx_int_t             rc;
    ngx_uint_t            left;
    ngx_llmgw_batch_t     b;
    ngx_llmgw_shm_ctx_t  *shm;

    if (ngx_llmgw_flush_ev.timer_set) {
        ngx_del_timer(&ngx_llmgw_flush_ev);
    }

    if (ngx_llmgw_flush_next.posted) {
        ngx_delete_posted_event(&ngx_llmgw_flush_next);
    }

    shm = ngx_llmgw_shm();

    if (shm == NULL || ngx_llmgw_billing_me() == NULL) {
        return;
    }

    /*
     * At exit nothing else runs here, so blocking statements are allowed:
     * a batch still being written is written again (idempotently), then
     * whatever is queued, so that the last process to leave leaves none.
     */
    ngx_shmtx_lock(&shm->shpool->mutex);
    ngx_llmgw_ledger_done_locked(shm, 0);
    ngx_shmtx_unlock(&shm->shpool->mutex);

    for ( ;; ) {
        if (ngx_llmgw_ledger_take(&b) != NGX_OK) {
            return;
        }

        /* the balances it answers are learned with the batch's end: the
           charges leave pending as the zone learns them */
        rc = ngx_llmgw_pg_exec_at_exit(LLMGW_FLUSH_AGAIN_SQL, NULL, b.copy,
                                       b.len, ngx_llmgw_ledger_flushed, NULL);
        ngx_llmgw_ledger_free(&b);

        if (rc != NGX_OK) {
            ngx_shmtx_lock(&shm->shpool->mutex);
            ngx_llmgw_ledger_done_locked(shm, 0);
            left = shm->sh->ledger_rows;
            ngx_shmtx_unlock(&shm->shpool->mutex);

            /* said loudly: when this is the last process, they are lost */
            ngx_log_error(NGX_LOG_CRIT, cycle->log, 0,
                          "llmgw: %ui ledger rows left queued at exit, the "
                          "database did not take them: a worker still "
                          "running writes them, else they are lost with the "
                          "zone", left);
            return;
        }
    }
}
