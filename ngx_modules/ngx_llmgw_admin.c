/*
 * The root-only admin API under /api/.  The glue only authenticates the
 * root token and hands method, path, query and body to llmgw_api() in
 * PostgreSQL, where validation and storage live; a change is applied to
 * this worker's view before the answer leaves, and reaches the others (and
 * other nodes) through the notice it makes.
 */

#include "ngx_llmgw.h"
#include "market.h"


static void ngx_llmgw_admin_body(ngx_http_request_t *r);
static ngx_int_t ngx_llmgw_admin_plugin(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, llmgw_admin_route_e route, llmgw_str_t *icon);
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
    int                  lengths[4];
    ngx_str_t            body, path;
    llmgw_str_t          icon;
    const char          *params[4];
    llmgw_verdict_t      v;
    ngx_llmgw_ctx_t     *ctx;
    llmgw_admin_route_e  route;

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

    ctx->body = body;

    route = llmgw_admin_route((llmgw_str_t) { (char *) r->method_name.data,
                                              r->method_name.len },
                              (llmgw_str_t) { (char *) path.data, path.len },
                              &icon, &v);

    /* a 405 first; then what the database would refuse as text, bodies
       that are not one JSON object (the same 400s as the client API's),
       for the calls the gateway answers as for the others */
    if (route == LLMGW_ADMIN_REFUSED
        || llmgw_admin_check(route,
                             (llmgw_str_t) { (char *) path.data, path.len },
                             (llmgw_str_t) { (char *) r->args.data,
                                             r->args.len },
                             (llmgw_str_t) { (char *) body.data, body.len },
                             (r->method & (NGX_HTTP_POST | NGX_HTTP_PUT
                                           | NGX_HTTP_PATCH
                                           | NGX_HTTP_DELETE)) != 0, &v)
           != 0)
    {
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
        return;
    }

    /* what the gateway answers itself is answered here, the rest by
       llmgw_api() */
    if (route != LLMGW_ADMIN_DATABASE) {
        ngx_llmgw_admin_plugin(r, ctx, route, &icon);
        return;
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

    /* a data exception (SQLSTATE class 22) is about the request's values,
       such as a NUL character (\u0000), which text cannot hold: sent again
       it fails again (the server's message may quote them: not logged) */
    if (err != NULL
        && ngx_strncmp(ngx_llmgw_pg_error_state(), "22", 2) == 0)
    {
        ngx_log_error(NGX_LOG_INFO, c->log, 0,
                      "llmgw: admin statement refused the request's data "
                      "(SQLSTATE %s)", ngx_llmgw_pg_error_state());
        ngx_http_finalize_request(r, ngx_llmgw_admin_refuse(r, ctx,
                                  NGX_HTTP_BAD_REQUEST, "invalid_request",
                                  "the request holds a value the database "
                                  "cannot store (such as a NUL character, "
                                  "\\u0000)"));
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
    if (ngx_llmgw_cache_refresh_now(r, ngx_llmgw_admin_refreshed)
        == NGX_ERROR)
    {
        /* the change is made: answer without waiting to see it here */
        ngx_llmgw_admin_refreshed(r);
    }

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
    llmgw_verdict_t  v;

    /* 403 only for a key that works on the client API: a disabled, expired
       or exhausted one is as unknown here as it is there */
    if (t == NULL || llmgw_token_check(t, (int64_t) ngx_time(), &v) != 0) {
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


/* ---- plugins: upload, dry run and runtime status go through v8_host ---- */


static void ngx_llmgw_admin_loaded(void *data, ngx_int_t rc, u_char *body,
    size_t len);
static void ngx_llmgw_admin_ran(void *data, ngx_int_t rc, u_char *body,
    size_t len);
static ngx_int_t ngx_llmgw_admin_icon(ngx_http_request_t *r,
    ngx_llmgw_ctx_t *ctx, llmgw_str_t *key);
static void ngx_llmgw_admin_status(void *data, ngx_int_t rc, u_char *body,
    size_t len);


static ngx_int_t
ngx_llmgw_admin_v8_refused(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    ngx_int_t rc)
{
    if (rc == NGX_DECLINED) {
        return ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      "plugin_runtime_unavailable",
                                      "no plugin runtime is configured "
                                      "(llmgw_v8host)");
    }

    if (rc == NGX_ABORT) {
        return ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                      "request_too_large",
                                      "the source or the arguments are "
                                      "larger than llmgw_v8host_max_frame");
    }

    return ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                  "plugin_runtime_busy",
                                  "the plugin runtime is busy; retry "
                                  "shortly");
}


static ngx_int_t
ngx_llmgw_admin_plugin(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    llmgw_admin_route_e route, llmgw_str_t *icon)
{
    char               key[64];
    ngx_int_t          rc;
    llmgw_buf_t        frame;
    const char        *sha;
    llmgw_verdict_t    v;
    llmgw_snapshot_t  *s;

    frame.data = NULL;

    switch (route) {

    case LLMGW_ADMIN_UPLOAD:
        rc = ngx_llmgw_admin_upload(r, ctx, NULL, NULL);
        if (rc != NGX_DONE) {
            ngx_http_finalize_request(r, rc);
        }
        return NGX_OK;

    case LLMGW_ADMIN_MARKETPLACE:
        ngx_llmgw_market_start(r, ctx);
        return NGX_OK;

    case LLMGW_ADMIN_ICON:
        rc = ngx_llmgw_admin_icon(r, ctx, icon);
        if (rc != NGX_DONE) {
            ngx_http_finalize_request(r, rc);
        }
        return NGX_OK;

    case LLMGW_ADMIN_STATUS:
        rc = ngx_llmgw_v8_call(LLMGW_FRAME_STATUS, (u_char *) "{}", 2,
                               ngx_llmgw_admin_status, r);
        break;

    case LLMGW_ADMIN_DRYRUN:
        rc = llmgw_plugin_body_key((char *) ctx->body.data, ctx->body.len,
                                   key, sizeof(key), &v);

        if (rc == -1) {
            rc = ngx_llmgw_send_error(r, ctx, &v);
            goto done;
        }

        if (rc == 0) {
            s = ngx_llmgw_cache_snapshot();
            sha = s ? llmgw_snapshot_plugin_sha(s,
                          (llmgw_str_t) { key, ngx_strlen(key) })
                    : NULL;

            if (sha == NULL) {
                if (s) {
                    ngx_llmgw_cache_release(s);
                }
                rc = ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_NOT_FOUND,
                                            "not_found", "no enabled plugin "
                                            "has that key");
                goto done;
            }

            if (llmgw_plugin_call_request((char *) ctx->body.data,
                                          ctx->body.len, sha, &frame, &v)
                != 0)
            {
                ngx_llmgw_cache_release(s);
                rc = ngx_llmgw_send_error(r, ctx, &v);
                goto done;
            }

            rc = ngx_llmgw_hook(sha, (u_char *) frame.data, frame.len,
                                ngx_llmgw_admin_ran, r, NULL);
            ngx_llmgw_cache_release(s);

        } else {
            /* a source: the helper loads it for this one call; hook,
             * args and source are checked first */
            rc = llmgw_plugin_call_request((char *) ctx->body.data,
                                           ctx->body.len, "", &frame, &v);
            llmgw_buf_free(&frame);

            if (rc == 0) {
                rc = llmgw_plugin_load_request((char *) ctx->body.data,
                                               ctx->body.len, 0, &frame, &v);
                llmgw_buf_free(&frame);
            }

            if (rc != 0) {
                rc = ngx_llmgw_send_error(r, ctx, &v);
                goto done;
            }

            frame = llmgw_plugin_dryrun_body((char *) ctx->body.data,
                                             ctx->body.len);
            if (frame.data == NULL) {
                rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
                goto done;
            }

            rc = ngx_llmgw_v8_call(LLMGW_FRAME_CALL, (u_char *) frame.data,
                                   frame.len, ngx_llmgw_admin_ran, r);
        }

        break;

    default: /* the database's and refused calls never come here */
        rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        goto done;
    }

    if (rc != NGX_OK) {
        rc = ngx_llmgw_admin_v8_refused(r, ctx, rc);
        goto done;
    }

    llmgw_buf_free(&frame);
    return NGX_OK;

done:

    llmgw_buf_free(&frame);
    ngx_http_finalize_request(r, rc);
    return NGX_OK;
}


static ngx_int_t
ngx_llmgw_admin_v8_failed(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    ngx_int_t rc, u_char *body, size_t len)
{
    llmgw_verdict_t  v;

    if (rc == NGX_DECLINED) {
        llmgw_verdict_set(&v, NGX_HTTP_SERVICE_UNAVAILABLE, "gateway_error",
                          "plugin_runtime_unavailable", "the plugin runtime "
                          "is not running; retry when it is back");

    } else if (rc == NGX_ETIMEDOUT) {
        llmgw_verdict_set(&v, NGX_HTTP_GATEWAY_TIME_OUT, "gateway_error",
                          "plugin_runtime_timeout", "the plugin runtime did "
                          "not answer in time");
    } else {
        llmgw_verdict_set(&v, NGX_HTTP_BAD_GATEWAY, "gateway_error",
                          "plugin_runtime_error", "the plugin runtime "
                          "failed: %.*s", (int) ngx_min(len, 300), body);
    }

    return ngx_llmgw_send_error(r, ctx, &v);
}


static void
ngx_llmgw_admin_loaded(void *data, ngx_int_t rc, u_char *body, size_t len)
{
    ngx_http_request_t *r = data;

    int                lengths[1];
    char               sha[65];
    const char        *params[1];
    llmgw_buf_t        arg;
    llmgw_verdict_t    v;
    ngx_connection_t  *c;
    ngx_llmgw_ctx_t   *ctx;

    c = r->connection;
    ctx = ngx_llmgw_get_ctx(r);

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r,
            ngx_llmgw_admin_v8_failed(r, ctx, rc, body, len));
        goto done;
    }

    if (llmgw_plugin_load_reply((char *) body, len, sha, &v) != 0
        || (ctx->market_key.len > 0
            && llmgw_market_check_manifest((char *) body, len,
                                           (char *) ctx->market_key.data,
                                           (char *) ctx->market_version.data,
                                           &v)
               != 0))
    {
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
        goto done;
    }

    arg = llmgw_plugin_upload_arg((char *) ctx->body.data, ctx->body.len,
                                  (char *) body, len,
                                  (llmgw_str_t) { (char *) r->args.data,
                                                  r->args.len });
    if (arg.data == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        goto done;
    }

    params[0] = arg.data;
    lengths[0] = (int) arg.len;

    rc = ngx_llmgw_pg_query("select llmgw_plugin_upload($1::jsonb)::text", 1,
                            params, lengths, ngx_llmgw_admin_done, r);
    llmgw_buf_free(&arg);

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r, ngx_llmgw_admin_refuse(r, ctx,
                                  NGX_HTTP_SERVICE_UNAVAILABLE,
                                  "service_unavailable",
                                  "the database queue is full"));
    }

done:

    ngx_http_run_posted_requests(c);
}


/*
 * An upload of ctx->body ({source, remark, enabled, force}; force may also
 * be in the query); a marketplace install also names the key and version
 * the compiled manifest must have.
 * NGX_DONE when the runtime was asked (the answer finalizes the request),
 * else what to finalize the request with now.
 */
ngx_int_t
ngx_llmgw_admin_upload(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    const char *key, const char *version)
{
    ngx_int_t        rc;
    llmgw_buf_t      frame;
    llmgw_verdict_t  v;

    if (key != NULL && version != NULL) {
        ctx->market_key.len = ngx_strlen(key);
        ctx->market_key.data = ngx_pnalloc(r->pool, ctx->market_key.len + 1);
        ctx->market_version.len = ngx_strlen(version);
        ctx->market_version.data = ngx_pnalloc(r->pool,
                                               ctx->market_version.len + 1);
        if (ctx->market_key.data == NULL || ctx->market_version.data == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
        ngx_cpystrn(ctx->market_key.data, (u_char *) key,
                    ctx->market_key.len + 1);
        ngx_cpystrn(ctx->market_version.data, (u_char *) version,
                    ctx->market_version.len + 1);
    }

    if (llmgw_plugin_load_request((char *) ctx->body.data, ctx->body.len,
                                  1, &frame, &v)
        != 0)
    {
        return ngx_llmgw_send_error(r, ctx, &v);
    }

    rc = ngx_llmgw_v8_call(LLMGW_FRAME_LOAD, (u_char *) frame.data,
                           frame.len, ngx_llmgw_admin_loaded, r);
    llmgw_buf_free(&frame);

    if (rc != NGX_OK) {
        return ngx_llmgw_admin_v8_refused(r, ctx, rc);
    }

    return NGX_DONE;
}


/* GET /api/plugin/task/{key}/icon: the plugin's icon as an SVG image. */
static void
ngx_llmgw_admin_icon_found(void *data, PGresult *res, const char *err)
{
    ngx_http_request_t *r = data;

    ngx_int_t          rc;
    llmgw_buf_t        svg;
    ngx_buf_t         *b;
    ngx_chain_t        out;
    ngx_connection_t  *c;
    ngx_llmgw_ctx_t   *ctx;

    c = r->connection;
    ctx = ngx_llmgw_get_ctx(r);

    if (err != NULL) {
        rc = ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                    "service_unavailable", "the plugin store "
                                    "cannot be read right now");
        goto done;
    }

    if (PQntuples(res) != 1) {
        rc = ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_NOT_FOUND, "not_found",
                                    "no plugin has that key");
        goto done;
    }

    svg = llmgw_plugin_icon_svg(PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1));
    if (svg.data == NULL) {
        rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        goto done;
    }

    b = ngx_create_temp_buf(r->pool, svg.len);
    if (b == NULL) {
        llmgw_buf_free(&svg);
        rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        goto done;
    }

    b->last = ngx_cpymem(b->pos, svg.data, svg.len);
    b->last_buf = 1;
    b->last_in_chain = 1;
    llmgw_buf_free(&svg);

    ctx->responded = 1;
    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type, "image/svg+xml");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    rc = ngx_http_send_header(r);

    if (rc != NGX_ERROR && rc <= NGX_OK && !r->header_only) {
        out.buf = b;
        out.next = NULL;
        rc = ngx_http_output_filter(r, &out);
    }

done:

    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_llmgw_admin_icon(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx,
    llmgw_str_t *key)
{
    u_char      *p;
    const char  *params[1];

    p = ngx_pnalloc(r->pool, key->len + 1);
    if (p == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_cpystrn(p, (u_char *) key->data, key->len + 1);
    params[0] = (char *) p;

    if (ngx_llmgw_pg_query("select v.manifest ->> 'icon', "
                           "coalesce(v.manifest ->> 'name', p.key) "
                           "from task_plugins p join task_plugin_versions v "
                           "on v.key = p.key and v.version = p.active_version "
                           "where p.key = $1", 1, params, NULL,
                           ngx_llmgw_admin_icon_found, r)
        != NGX_OK)
    {
        return ngx_llmgw_admin_refuse(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      "service_unavailable",
                                      "the database queue is full");
    }

    return NGX_DONE;
}


/* A dry run answers what the hook gave, result or error, as it came. */
static void
ngx_llmgw_admin_ran(void *data, ngx_int_t rc, u_char *body, size_t len)
{
    ngx_http_request_t *r = data;

    ngx_connection_t  *c;
    ngx_llmgw_ctx_t   *ctx;

    c = r->connection;
    ctx = ngx_llmgw_get_ctx(r);

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r,
            ngx_llmgw_admin_v8_failed(r, ctx, rc, body, len));
    } else {
        ngx_http_finalize_request(r,
            ngx_llmgw_send_json(r, NGX_HTTP_OK, body, len));
    }

    ngx_http_run_posted_requests(c);
}


static void
ngx_llmgw_admin_status(void *data, ngx_int_t rc, u_char *body, size_t len)
{
    ngx_http_request_t *r = data;

    llmgw_buf_t        node, out;
    ngx_connection_t  *c;
    ngx_llmgw_ctx_t   *ctx;
    llmgw_snapshot_t  *s;

    c = r->connection;
    ctx = ngx_llmgw_get_ctx(r);

    if (rc != NGX_OK) {
        ngx_http_finalize_request(r,
            ngx_llmgw_admin_v8_failed(r, ctx, rc, body, len));
        goto done;
    }

    s = ngx_llmgw_cache_snapshot();
    node = s ? llmgw_snapshot_plugins_json(s) : (llmgw_buf_t) { NULL, 0 };

    if (s) {
        ngx_llmgw_cache_release(s);
    }

    out = llmgw_plugin_status_json((char *) body, len,
                                   node.data, node.len);
    llmgw_buf_free(&node);

    if (out.data == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        goto done;
    }

    ngx_http_finalize_request(r,
        ngx_llmgw_send_json(r, NGX_HTTP_OK, (u_char *) out.data, out.len));
    llmgw_buf_free(&out);

done:

    ngx_http_run_posted_requests(c);
}
