/*
 * The ledger writer: one row per request, queued in the worker and written
 * behind the response in batches through llmgw_flush(), which is idempotent
 * by (request id, type): a batch that failed or timed out is sent again and
 * never counts twice.  Batches go out every llmgw_flush_interval and at
 * worker exit.
 */

#include "ngx_llmgw.h"


#define NGX_LLMGW_LEDGER_MAX  (64 * 1024 * 1024)


typedef struct {
    u_char                    *data;
    size_t                     len;
    size_t                     size;
    ngx_uint_t                 rows;
} ngx_llmgw_batch_t;


static void ngx_llmgw_ledger_tick(ngx_event_t *ev);
static void ngx_llmgw_ledger_flush(void);
static void ngx_llmgw_ledger_flushed(void *data, PGresult *res,
    const char *err);


static ngx_llmgw_batch_t       ngx_llmgw_queue;     /* rows not yet sent */
static ngx_llmgw_batch_t       ngx_llmgw_inflight;  /* rows being written */
static ngx_event_t             ngx_llmgw_flush_ev;
static ngx_llmgw_main_conf_t  *ngx_llmgw_ledger_mcf;
static ngx_log_t              *ngx_llmgw_ledger_log;


ngx_int_t
ngx_llmgw_ledger_init_process(ngx_cycle_t *cycle, ngx_llmgw_main_conf_t *mcf)
{
    ngx_llmgw_ledger_mcf = mcf;
    ngx_llmgw_ledger_log = cycle->log;

    ngx_llmgw_flush_ev.handler = ngx_llmgw_ledger_tick;
    ngx_llmgw_flush_ev.log = cycle->log;
    ngx_llmgw_flush_ev.cancelable = 1;

    ngx_add_timer(&ngx_llmgw_flush_ev, mcf->flush_interval);

    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_batch_append(ngx_llmgw_batch_t *b, u_char *data, size_t len)
{
    size_t   size;
    u_char  *p;

    /* room is kept for the separator, the closing ']' and a NUL */
    if (b->len + len + 3 > b->size) {
        size = ngx_max(b->size * 2, b->len + len + 4096);

        if (size > NGX_LLMGW_LEDGER_MAX) {
            return NGX_DECLINED;
        }

        p = ngx_alloc(size, ngx_llmgw_ledger_log);
        if (p == NULL) {
            return NGX_ERROR;
        }

        if (b->data) {
            ngx_memcpy(p, b->data, b->len);
            ngx_free(b->data);
        }

        b->data = p;
        b->size = size;
    }

    b->data[b->len++] = b->rows ? ',' : '[';
    b->len = ngx_cpymem(b->data + b->len, data, len) - b->data;
    b->rows++;

    return NGX_OK;
}


void
ngx_llmgw_ledger_record(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    ngx_uint_t           status;
    ngx_time_t          *tp;
    llmgw_buf_t          json;
    llmgw_price_t        price;
    llmgw_ledger_row_t   row;

    static const char  *ep_names[] = {
        "", "chat", "messages", "gemini", "rerank", "models", "invalid_url"
    };

    ngx_memzero(&row, sizeof(row));

    status = r->headers_out.status;
    tp = ngx_timeofday();

    row.request_id = (char *) ctx->request_id;
    row.type = (status >= 200 && status < 300) ? "consume" : "error";
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
    row.is_stream = ctx->req ? llmgw_req_stream(ctx->req) : 0;
    row.status = (int) status;
    row.latency_ms = (int64_t) (ngx_current_msec - ctx->start_msec);
    row.created_at = (double) tp->sec + (double) tp->msec / 1000;

    if (ctx->resp) {
        llmgw_resp_usage(ctx->resp, &row.usage);
    }

    /* only a success is charged */
    if (row.type[0] == 'c'
        && llmgw_snapshot_price(ctx->snapshot, row.model, &price) == 0)
    {
        row.quota = llmgw_quota(&price, ctx->group_ratio, &row.usage);
    }

    json = llmgw_ledger_row_json(&row);

    if (json.data == NULL) {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "llmgw: ledger row of %s could not be built",
                      ctx->request_id);
        return;
    }

    if (ngx_llmgw_batch_append(&ngx_llmgw_queue, (u_char *) json.data,
                               json.len)
        != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                      "llmgw: ledger queue is full, row of %s dropped",
                      ctx->request_id);
    }

    llmgw_buf_free(&json);
}


static void
ngx_llmgw_ledger_tick(ngx_event_t *ev)
{
    ngx_llmgw_ledger_flush();

    if (!ngx_exiting && !ngx_terminate) {
        ngx_add_timer(ev, ngx_llmgw_ledger_mcf->flush_interval);
    }
}


static void
ngx_llmgw_ledger_flush(void)
{
    int          len;
    const char  *params[1];

    if (ngx_llmgw_inflight.rows || ngx_llmgw_queue.rows == 0) {
        return;
    }

    ngx_llmgw_inflight = ngx_llmgw_queue;
    ngx_memzero(&ngx_llmgw_queue, sizeof(ngx_llmgw_batch_t));

    ngx_llmgw_inflight.data[ngx_llmgw_inflight.len++] = ']';
    ngx_llmgw_inflight.data[ngx_llmgw_inflight.len] = '\0';

    params[0] = (char *) ngx_llmgw_inflight.data;
    len = (int) ngx_llmgw_inflight.len;

    if (ngx_llmgw_pg_query("select llmgw_flush($1::jsonb)::text", 1, params,
                           &len, ngx_llmgw_ledger_flushed, NULL)
        != NGX_OK)
    {
        ngx_llmgw_ledger_flushed(NULL, NULL, "the database queue is full");
    }
}


static void
ngx_llmgw_ledger_flushed(void *data, PGresult *res, const char *err)
{
    ngx_llmgw_batch_t  failed;

    if (err == NULL) {
        ngx_free(ngx_llmgw_inflight.data);
        ngx_memzero(&ngx_llmgw_inflight, sizeof(ngx_llmgw_batch_t));
        return;
    }

    ngx_log_error(NGX_LOG_ERR, ngx_llmgw_ledger_log, 0,
                  "llmgw: ledger flush of %ui rows failed, kept for the "
                  "next one: %s", ngx_llmgw_inflight.rows, err);

    /* the failed rows go first: the batch is sent again, idempotently */
    failed = ngx_llmgw_inflight;
    ngx_memzero(&ngx_llmgw_inflight, sizeof(ngx_llmgw_batch_t));

    failed.len--;      /* the closing bracket */

    if (ngx_llmgw_queue.rows) {
        if (ngx_llmgw_batch_append(&failed, ngx_llmgw_queue.data + 1,
                                   ngx_llmgw_queue.len - 1) == NGX_OK)
        {
            failed.rows += ngx_llmgw_queue.rows - 1;
        }
        ngx_free(ngx_llmgw_queue.data);
    }

    ngx_llmgw_queue = failed;
}


void
ngx_llmgw_ledger_exit_process(ngx_cycle_t *cycle)
{
    if (ngx_llmgw_flush_ev.timer_set) {
        ngx_del_timer(&ngx_llmgw_flush_ev);
    }

    /* at exit nothing else runs: one blocking statement is allowed */
    if (ngx_llmgw_inflight.rows) {
        (void) ngx_llmgw_pg_exec_at_exit("select llmgw_flush($1::jsonb)",
                                         (char *) ngx_llmgw_inflight.data);
    }

    if (ngx_llmgw_queue.rows) {
        ngx_llmgw_queue.data[ngx_llmgw_queue.len++] = ']';
        ngx_llmgw_queue.data[ngx_llmgw_queue.len] = '\0';
        (void) ngx_llmgw_pg_exec_at_exit("select llmgw_flush($1::jsonb)",
                                         (char *) ngx_llmgw_queue.data);
    }
}
