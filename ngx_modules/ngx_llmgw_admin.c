/*
 * The root-only admin API under /api/.  The glue only authenticates the
 * root token and hands method, path, query and body to llmgw_api() in
 * PostgreSQL, where validation and storage live; a change is applied to
 * this worker's view before the answer leaves, and reaches the others (and
 * other nodes) through the notice it makes.
 */

#include "ngx_llmgw.h"


static void ngx_llmgw_admin_body(ngx_http_request_t *r);
static void ngx_llmgw_admin_done(void *data, PGresult *res, const char *err);
static void ngx_llmgw_admin_refreshed(ngx_http_request_t *r);
static ngx_int_t ngx_llmgw_admin_refuse(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, int status, const char *code, const char *msg);
static ngx_int_t ngx_llmgw_admin_not_root(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, llmgw_token_t *t);
static void ngx_llmgw_admin_key_found(ngx_http_request_t *r,
    llmgw_token_t *t, const char *err);


typedef struct {
    int          status;
    llmgw_buf_t  body;
} ngx_llmgw_admin_answer_t;


ngx_int_t
ngx_llmgw_admin_handler(ngx_http_request_t *r)
{
    char               hash[65];
    ngx_int_t          rc;
    ngx_str_t          v;
    ngx_table_elt_t   *h;
    llmgw_token_t     *t;
    llmgw_snapshot_t  *s;
    ngx_llmgw_ctx_t   *ctx;

    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    h = r->headers_in.authorization;

    if (h == NULL || h->value.len <= 7
        || ngx_strncasecmp(h->value.data, (u_char *) "Bearer ", 7) != 0)
    {
        return ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_UNAUTHORIZED,
                                      "invalid_token", "the admin API needs "
                                      "Authorization: Bearer <root token>");
    }

    v.data = h->value.data + 7;
    v.len = h->value.len - 7;

    s = ngx_llmgw_cache_snapshot();

    if (s == NULL) {
        return ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      "service_unavailable", "the gateway "
                                      "has not loaded its configuration yet; "
                                      "retry shortly");
    }

    rc = llmgw_key_hash((llmgw_str_t) { (char *) v.data, v.len }, hash) == 0
         && llmgw_snapshot_is_admin(s, hash);

    ngx_llmgw_cache_release(s);

    if (!rc) {
        /* a client key is known but not enough (403); anything else 401 */
        if (llmgw_key_hash((llmgw_str_t) { (char *) v.data, v.len }, hash)
            != 0)
        {
            return ngx_llmgw_admin_not_root(r, ctx, NULL);
        }

        t = NULL;
        rc = ngx_llmgw_cache_token(r, hash, &t, ngx_llmgw_admin_key_found);

        if (rc == NGX_AGAIN) {
            r->main->count++;
            return NGX_DONE;
        }

        rc = ngx_llmgw_admin_not_root(r, ctx, t);
        llmgw_token_free(t);
        return rc;
    }

    rc = ngx_http_read_client_request_body(r, ngx_llmgw_admin_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static void
ngx_llmgw_admin_body(ngx_http_request_t *r)
{
    int               lengths[4];
    ngx_str_t         body, path;
    const char       *params[4];
    ngx_llmgw_ctx_t  *ctx;

    ctx = ngx_llmgw_get_ctx(r);

    if (ctx == NULL || ngx_llmgw_read_body(r, &body) != NGX_OK) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    path = r->uri;

    if (path.len >= 4 && ngx_strncmp(path.data, "/api", 4) == 0) {
        path.data += 4;
        path.len -= 4;
    }

    params[0] = (char *) r->method_name.data;
    lengths[0] = (int) r->method_name.len;
    params[1] = (char *) path.data;
    lengths[1] = (int) path.len;
    params[2] = r->args.len ? (char *) r->args.data : "";
    lengths[2] = (int) r->args.len;
    params[3] = body.len ? (char *) body.data : "";
    lengths[3] = (int) body.len;

    if (ngx_llmgw_pg_query("select llmgw_api($1, $2, $3, $4)::text", 4,
                           params, lengths, ngx_llmgw_admin_done, r)
        != NGX_OK)
    {
        ngx_http_finalize_request(r, ngx_llmgw_admin_refuse(r, ctx,
                                  NGX_HTTP_SERVICE_UNAVAILABLE,
                                  "service_unavailable",
                                  "the database queue is full"));
    }
}


static void
ngx_llmgw_admin_done(void *data, PGresult *res, const char *err)
{
    ngx_http_request_t *r = data;

    int                        status;
    llmgw_verdict_t            v;
    ngx_connection_t          *c;
    ngx_llmgw_ctx_t           *ctx;
    ngx_llmgw_admin_answer_t  *a;

    c = r->connection;
    ctx = ngx_llmgw_get_ctx(r);

    if (ctx == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        goto done;
    }

    if (err != NULL) {
        ngx_log_error(NGX_LOG_ERR, c->log, 0,
                      "llmgw: admin statement failed: %s", err);
        ngx_http_finalize_request(r, ngx_llmgw_admin_refuse(r, ctx,
                                  NGX_HTTP_SERVICE_UNAVAILABLE,
                                  "service_unavailable",
                                  "the database could not be reached"));
        goto done;
    }

    a = ngx_pcalloc(r->pool, sizeof(ngx_llmgw_admin_answer_t));
    if (a == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        goto done;
    }

    status = llmgw_admin_answer(PQgetvalue(res, 0, 0),
                                PQgetlength(res, 0, 0), &a->body, &v);

    if (v.status != 0 || status >= 300) {
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
        goto done;
    }

    a->status = status;
    ctx->admin = a;

    if (r->method == NGX_HTTP_GET) {
        ngx_llmgw_admin_refreshed(r);
        goto done;
    }

    /* this worker applies the change before it answers */
    (void) ngx_llmgw_cache_refresh_now(r, ngx_llmgw_admin_refreshed);

done:

    ngx_http_run_posted_requests(c);
}


static void
ngx_llmgw_admin_refreshed(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    ngx_llmgw_ctx_t           *ctx;
    ngx_llmgw_admin_answer_t  *a;

    ctx = ngx_llmgw_get_ctx(r);
    a = ctx->admin;
    ctx->admin = NULL;

    rc = ngx_llmgw_send_json(r, a->status, (u_char *) a->body.data,
                             a->body.len);
    llmgw_buf_free(&a->body);

    ngx_http_finalize_request(r, rc);
}


static ngx_int_t
ngx_llmgw_admin_refuse(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    int status, const char *code, const char *msg)
{
    llmgw_verdict_t  v;

    llmgw_verdict_set(&v, status, "gateway_error", code, "%s", msg);

    return ngx_llmgw_send_error(r, ctx, &v);
}


static ngx_int_t
ngx_llmgw_admin_not_root(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    llmgw_token_t *t)
{
    if (t == NULL) {
        return ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_UNAUTHORIZED,
                                      "invalid_token", "Invalid token: the "
                                      "admin API needs the root token");
    }

    return ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_FORBIDDEN, "forbidden",
                                  "a client key cannot use the admin API; "
                                  "it needs the root token");
}


static void
ngx_llmgw_admin_key_found(ngx_http_request_t *r, llmgw_token_t *t,
    const char *err)
{
    ngx_int_t         rc;
    ngx_llmgw_ctx_t  *ctx;

    ctx = ngx_llmgw_get_ctx(r);

    if (ctx == NULL) {
        rc = NGX_HTTP_INTERNAL_SERVER_ERROR;

    } else if (err != NULL) {
        rc = ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                    "service_unavailable",
                                    "the key could not be checked right now");
    } else {
        rc = ngx_llmgw_admin_not_root(r, ctx, t);
    }

    llmgw_token_free(t);
    ngx_http_finalize_request(r, rc);
}
