/*
 * POST /api/plugin/task/marketplace: reads a marketplace index over
 * http(s) (the task engine's HTTP client) or from a local file, lists it, or
 * downloads the chosen version, checks its sha256 and hands it to the
 * ordinary upload (load in v8_host, validate, store, publish), which also
 * checks that the compiled manifest has the index's key and version.
 *
 * Local files are small and read with one open/read like nginx's own static
 * files; http(s) goes through the event loop.
 */

#include "ngx_llmgw.h"
#include "ngx_llmgw_http.h"
#include "market.h"


#define NGX_LLMGW_MARKET_MAX  (8 * 1024 * 1024)


typedef struct {
    ngx_http_request_t        *request;
    llmgw_market_req_t         m;
    ngx_llmgw_http_t          *http;
    llmgw_outbound_t           out;
    unsigned                   have_out:1;
    unsigned                   source:1;     /* fetching the source */
    ngx_str_t                  index;
    llmgw_buf_t                src_url;
    llmgw_buf_t                version;
    char                       sha[65];
} ngx_llmgw_market_t;


static void ngx_llmgw_market_fetched(ngx_llmgw_market_t *mk, ngx_int_t rc,
    u_char *data, size_t len, const char *err);


static void
ngx_llmgw_market_cleanup(void *data)
{
    ngx_llmgw_market_t  *mk = data;

    if (mk->http != NULL) {
        ngx_llmgw_http_cancel(mk->http);
        mk->http = NULL;
    }

    if (mk->have_out) {
        llmgw_outbound_free(&mk->out);
        mk->have_out = 0;
    }

    llmgw_market_req_free(&mk->m);
    llmgw_buf_free(&mk->src_url);
    llmgw_buf_free(&mk->version);
}


static void
ngx_llmgw_market_http_done(void *data, ngx_int_t rc,
    ngx_llmgw_http_resp_t *resp, const char *err)
{
    ngx_llmgw_market_t  *mk = data;
    ngx_connection_t    *c;

    mk->http = NULL;
    c = mk->request->connection;

    if (rc == NGX_OK && (resp->status < 200 || resp->status > 299)) {
        rc = NGX_ERROR;
        err = "the marketplace answered with an error status";
    }

    if (rc == NGX_OK) {
        ngx_llmgw_market_fetched(mk, NGX_OK, resp->body.data, resp->body.len,
                                 NULL);
    } else {
        ngx_llmgw_market_fetched(mk, NGX_ERROR, NULL, 0,
                                 err ? err : "the download failed");
    }

    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_llmgw_market_read_file(ngx_llmgw_market_t *mk, const char *path,
    ngx_str_t *out, const char **err)
{
    ssize_t           n;
    ngx_fd_t          fd;
    ngx_file_info_t   fi;
    size_t            size, got;

    /* without O_NONBLOCK, opening a FIFO would wait for a writer and
       hold the worker; a regular file reads as without it */
    fd = ngx_open_file(path, NGX_FILE_RDONLY | NGX_FILE_NONBLOCK,
                       NGX_FILE_OPEN, 0);
    if (fd == NGX_INVALID_FILE) {
        *err = "the local file cannot be opened";
        return NGX_ERROR;
    }

    if (ngx_fd_info(fd, &fi) == NGX_FILE_ERROR || !ngx_is_file(&fi)
        || ngx_file_size(&fi) > NGX_LLMGW_MARKET_MAX)
    {
        ngx_close_file(fd);
        *err = "the local file is not a regular file of at most 8 MB";
        return NGX_ERROR;
    }

    size = (size_t) ngx_file_size(&fi);
    out->data = ngx_pnalloc(mk->request->pool, size + 1);
    if (out->data == NULL) {
        ngx_close_file(fd);
        *err = "out of memory";
        return NGX_ERROR;
    }

    for (got = 0; got < size; got += (size_t) n) {
        n = ngx_read_fd(fd, out->data + got, size - got);
        if (n <= 0) {
            ngx_close_file(fd);
            *err = "the local file cannot be read";
            return NGX_ERROR;
        }
    }

    ngx_close_file(fd);
    out->len = size;
    out->data[size] = '\0';

    return NGX_OK;
}


/* Reads an address: answers through ngx_llmgw_market_fetched. */
static void
ngx_llmgw_market_fetch(ngx_llmgw_market_t *mk, const char *url)
{
    int                     kind;
    ngx_str_t               text;
    const char             *err;
    llmgw_buf_t             path;
    llmgw_verdict_t         v;
    ngx_llmgw_http_opts_t   opts;

    if (mk->have_out) {
        llmgw_outbound_free(&mk->out);
        mk->have_out = 0;
    }

    kind = llmgw_market_locate(url, &mk->out, &path, &v);

    if (kind < 0) {
        ngx_http_finalize_request(mk->request,
            ngx_llmgw_send_error(mk->request, ngx_llmgw_get_ctx(mk->request),
                                 &v));
        return;
    }

    if (kind == 0) {
        err = NULL;
        if (ngx_llmgw_market_read_file(mk, path.data, &text, &err) == NGX_OK) {
            llmgw_buf_free(&path);
            ngx_llmgw_market_fetched(mk, NGX_OK, text.data, text.len, NULL);
        } else {
            llmgw_buf_free(&path);
            ngx_llmgw_market_fetched(mk, NGX_ERROR, NULL, 0, err);
        }
        return;
    }

    mk->have_out = 1;

    ngx_memzero(&opts, sizeof(opts));
    opts.method.data = (u_char *) mk->out.method;
    opts.method.len = ngx_strlen(mk->out.method);
    opts.tls = mk->out.tls;
    opts.host.data = (u_char *) mk->out.host;
    opts.host.len = ngx_strlen(mk->out.host);
    opts.port = mk->out.port;
    opts.host_header.data = (u_char *) mk->out.host_header;
    opts.host_header.len = ngx_strlen(mk->out.host_header);
    opts.uri.data = (u_char *) mk->out.uri;
    opts.uri.len = ngx_strlen(mk->out.uri);
    opts.max_body = NGX_LLMGW_MARKET_MAX;
    opts.resend = 1;
    opts.done = ngx_llmgw_market_http_done;
    opts.data = mk;

    mk->http = ngx_llmgw_http_start(&opts, mk->request->connection->log);

    if (mk->http == NULL) {
        ngx_http_finalize_request(mk->request, NGX_HTTP_INTERNAL_SERVER_ERROR);
    }
}


static void
ngx_llmgw_market_fetched(ngx_llmgw_market_t *mk, ngx_int_t rc, u_char *data,
    size_t len, const char *err)
{
    ngx_int_t            status;
    llmgw_buf_t          out;
    llmgw_verdict_t      v;
    ngx_llmgw_ctx_t     *ctx;
    llmgw_snapshot_t    *s;
    ngx_http_request_t  *r;

    r = mk->request;
    ctx = ngx_llmgw_get_ctx(r);

    if (rc != NGX_OK) {
        llmgw_verdict_set(&v, NGX_HTTP_BAD_GATEWAY, "gateway_error",
                          "marketplace_unavailable", "%s %s: %s",
                          mk->source ? "the plugin source" : "the index",
                          mk->source ? "could not be read"
                                     : "could not be read",
                          err ? err : "failed");
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
        return;
    }

    if (mk->source) {
        /* the download must be what the index promised */
        if (llmgw_market_upload_body((char *) data, len, mk->sha,
                                     (char *) ctx->body.data, ctx->body.len,
                                     &out, &v)
            != 0)
        {
            ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
            return;
        }

        ctx->body.data = ngx_pnalloc(r->pool, out.len);
        if (ctx->body.data == NULL) {
            llmgw_buf_free(&out);
            ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
            return;
        }

        ngx_memcpy(ctx->body.data, out.data, out.len);
        ctx->body.len = out.len;
        llmgw_buf_free(&out);

        status = ngx_llmgw_admin_upload(r, ctx, mk->m.key, mk->version.data);
        if (status != NGX_DONE) {
            ngx_http_finalize_request(r, status);
        }
        return;
    }

    /* the index: keep it, then list it or pick a version */
    mk->index.data = ngx_pnalloc(r->pool, len + 1);
    if (mk->index.data == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }
    ngx_memcpy(mk->index.data, data, len);
    mk->index.len = len;

    if (mk->m.key == NULL) {
        s = ngx_llmgw_cache_snapshot();
        if (s == NULL) {
            ngx_http_finalize_request(r, NGX_HTTP_SERVICE_UNAVAILABLE);
            return;
        }

        rc = llmgw_market_listing((char *) mk->index.data, mk->index.len,
                                  mk->m.url, s, &out, &v);
        ngx_llmgw_cache_release(s);

        if (rc != 0) {
            ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
            return;
        }

        status = ngx_llmgw_send_json(r, NGX_HTTP_OK, (u_char *) out.data,
                                     out.len);
        llmgw_buf_free(&out);
        ngx_http_finalize_request(r, status);
        return;
    }

    if (llmgw_market_pick((char *) mk->index.data, mk->index.len, mk->m.url,
                          mk->m.key, mk->m.version, &mk->src_url, mk->sha,
                          &mk->version, &v)
        != 0)
    {
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
        return;
    }

    mk->source = 1;
    ngx_llmgw_market_fetch(mk, mk->src_url.data);
}


/* The request's body is read; answers (now or later) itself. */
void
ngx_llmgw_market_start(ngx_http_request_t *r, ngx_llmgw_ctx_t *ctx)
{
    llmgw_verdict_t       v;
    ngx_pool_cleanup_t   *cln;
    ngx_llmgw_market_t   *mk;

    mk = ngx_pcalloc(r->pool, sizeof(ngx_llmgw_market_t));
    cln = ngx_pool_cleanup_add(r->pool, 0);

    if (mk == NULL || cln == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    mk->request = r;
    cln->handler = ngx_llmgw_market_cleanup;
    cln->data = mk;

    if (llmgw_market_parse((char *) ctx->body.data, ctx->body.len, &mk->m, &v)
        != 0)
    {
        ngx_http_finalize_request(r, ngx_llmgw_send_error(r, ctx, &v));
        return;
    }

    ngx_llmgw_market_fetch(mk, mk->m.url);
}
