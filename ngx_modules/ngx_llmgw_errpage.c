/*
 * One error contract everywhere: answers that nginx itself makes on llmgw
 * locations (413 for a body over client_max_body_size, 502/504 when every
 * channel failed or timed out, ...) are rewritten into the JSON contract,
 * and every answer carries the request id header.
 */

#include "ngx_llmgw.h"


static ngx_http_output_header_filter_pt  ngx_llmgw_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_llmgw_next_body_filter;


static void
ngx_llmgw_errpage_verdict(ngx_http_request_t *r, llmgw_verdict_t *v)
{
    ngx_uint_t                 status;
    ngx_llmgw_ctx_t           *ctx;
    ngx_http_core_loc_conf_t  *clcf;

    status = r->headers_out.status;

    switch (status) {

    case NGX_HTTP_REQUEST_ENTITY_TOO_LARGE:
        clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
        llmgw_verdict_set(v, status, "gateway_error", "request_too_large",
                          "request body is larger than %lld bytes",
                          (long long) clcf->client_max_body_size);
        return;

    case NGX_HTTP_BAD_GATEWAY:
        /* the upstream answered, with something that is no answer: an
           upstream_error (the spec's "type" row); only "no channel
           answered" is the gateway's own */
        ctx = ngx_llmgw_get_ctx(r);

        if (ctx != NULL && ctx->bad_status && !ctx->bad_answer
            && ctx->last_error.len == 0)
        {
            llmgw_verdict_set(v, status, "upstream_error",
                              "bad_response_status_code", "upstream answered "
                              "with a status that is no answer (%u)",
                              ctx->status ? (unsigned) ctx->status : 304);
            return;
        }

        if (ctx != NULL && ctx->bad_answer && ctx->too_large) {
            llmgw_verdict_set(v, status, "upstream_error",
                              "bad_response_body", "upstream answer is "
                              "larger than %zu bytes and cannot be "
                              "converted to this endpoint's format",
                              llmgw_resp_hold_max());
            return;
        }

        if (ctx != NULL && ctx->bad_answer) {
            llmgw_verdict_set(v, status, "upstream_error",
                              "bad_response_body", "upstream answered "
                              "without a valid response body");
            return;
        }

        llmgw_verdict_set(v, status, "gateway_error", "do_request_failed",
                          "upstream request failed: no channel answered");
        return;

    case NGX_HTTP_GATEWAY_TIME_OUT:
        llmgw_verdict_set(v, status, "gateway_error", "do_request_failed",
                          "upstream request timed out");
        return;

    case NGX_HTTP_SERVICE_UNAVAILABLE:
        llmgw_verdict_set(v, status, "gateway_error", "service_unavailable",
                          "service unavailable");
        return;

    case NGX_HTTP_NOT_ALLOWED:
        llmgw_verdict_set(v, status, "gateway_error", "method_not_allowed",
                          "method not allowed");
        return;

    case NGX_HTTP_REQUEST_TIME_OUT:
        llmgw_verdict_set(v, status, "gateway_error", "request_timeout",
                          "the request body did not arrive in time");
        return;

    case NGX_HTTP_REQUEST_URI_TOO_LARGE:
        llmgw_verdict_set(v, status, "gateway_error", "uri_too_long",
                          "the request URI is too long");
        return;

    case NGX_HTTP_NOT_IMPLEMENTED:
        llmgw_verdict_set(v, status, "gateway_error", "not_implemented",
                          "the request uses something the gateway does not "
                          "implement (a transfer encoding, say)");
        return;

    case NGX_HTTP_VERSION_NOT_SUPPORTED:
        llmgw_verdict_set(v, status, "gateway_error",
                          "http_version_not_supported",
                          "the HTTP version of the request is not "
                          "supported; use HTTP/1.1");
        return;

    case NGX_HTTP_BAD_REQUEST:
        llmgw_verdict_set(v, status, "gateway_error", "bad_request",
                          "the request is not valid HTTP, or its headers "
                          "are too large");
        return;

    default:
        llmgw_verdict_set(v, status, "gateway_error",
                          status >= 500 ? "internal_error" : "bad_request",
                          "request failed with HTTP %lu",
                          (unsigned long) status);
    }
}


/*
 * The request id header is the gateway's: one of that name from the
 * upstream (Anthropic's API answers its own Request-Id) is not sent.
 */
static void
ngx_llmgw_errpage_hide(ngx_http_request_t *r, ngx_str_t *name)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &r->headers_out.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].key.len == name->len
            && ngx_strncasecmp(h[i].key.data, name->data, name->len) == 0)
        {
            h[i].hash = 0;
        }
    }
}


static ngx_int_t
ngx_llmgw_header_filter(ngx_http_request_t *r)
{
    llmgw_buf_t            body;
    llmgw_verdict_t        v;
    ngx_llmgw_ctx_t       *ctx;
    ngx_llmgw_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_llmgw_module);

    /* an llmgw location, or an error nginx made before any location was
       chosen, in a server that has llmgw locations */
    if (r != r->main
        || (lcf->role == NGX_LLMGW_ROLE_NONE
            && !(lcf->server_errors
                 && r->headers_out.status >= NGX_HTTP_BAD_REQUEST)))
    {
        return ngx_llmgw_next_header_filter(r);
    }

    ctx = ngx_llmgw_get_ctx(r);
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    ngx_llmgw_errpage_hide(r, &lcf->request_id_header);

    if (ngx_llmgw_out_header(r, &lcf->request_id_header, ctx->request_id,
                             NGX_LLMGW_REQUEST_ID_LEN)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    /* an upstream head that was held, never sent, does not count */
    if (ctx->responded || (ctx->upstream_header && !ctx->holding)
        || r->headers_out.status < NGX_HTTP_BAD_REQUEST)
    {
        return ngx_llmgw_next_header_filter(r);
    }

    /* an answer nginx made: replace its page by the contract */

    /*
     * No channel reached on the last try, but an earlier one answered an
     * error: that error is the answer, as when it came last.
     */
    if (r->headers_out.status == NGX_HTTP_BAD_GATEWAY && !ctx->bad_answer
        && ctx->last_error.len > 0)
    {
        r->headers_out.status = ctx->last_error_status;
        r->headers_out.status_line.len = 0;
        ctx->own_body = ctx->last_error;
        goto own;
    }

    ngx_llmgw_errpage_verdict(r, &v);

    body = llmgw_error_json(
        (llmgw_str_t) { v.message, ngx_strlen(v.message) },
        (llmgw_str_t) { v.type, ngx_strlen(v.type) },
        (llmgw_str_t) { v.code, ngx_strlen(v.code) },
        (llmgw_str_t) { (char *) ctx->request_id, NGX_LLMGW_REQUEST_ID_LEN });

    if (body.data == NULL) {
        return ngx_llmgw_next_header_filter(r);
    }

    ctx->own_body.data = ngx_pnalloc(r->pool, body.len);
    if (ctx->own_body.data == NULL) {
        llmgw_buf_free(&body);
        return NGX_ERROR;
    }

    ngx_memcpy(ctx->own_body.data, body.data, body.len);
    ctx->own_body.len = body.len;
    llmgw_buf_free(&body);

own:

    ctx->errpage = 1;

    ngx_http_clear_content_length(r);
    ngx_http_clear_accept_ranges(r);
    ngx_http_clear_last_modified(r);
    ngx_http_clear_etag(r);

    r->headers_out.content_length_n = ctx->own_body.len;
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.charset.len = 0;

    return ngx_llmgw_next_header_filter(r);
}


static ngx_int_t
ngx_llmgw_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_buf_t        *b;
    ngx_chain_t       out;
    ngx_llmgw_ctx_t  *ctx;

    if (r != r->main) {
        return ngx_llmgw_next_body_filter(r, in);
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_llmgw_module);

    if (ctx == NULL || !ctx->errpage) {
        return ngx_llmgw_next_body_filter(r, in);
    }

    if (ctx->errpage_sent) {
        /* the rest of nginx's page is dropped */
        return NGX_OK;
    }

    ctx->errpage_sent = 1;

    if (r->header_only) {
        /* HEAD: the head says the length, and nothing follows it */
        return ngx_llmgw_next_body_filter(r, in);
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->pos = ctx->own_body.data;
    b->last = ctx->own_body.data + ctx->own_body.len;
    b->memory = 1;
    b->last_buf = 1;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_llmgw_next_body_filter(r, &out);
}


ngx_int_t
ngx_llmgw_errpage_init(ngx_conf_t *cf)
{
    ngx_llmgw_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_llmgw_header_filter;

    ngx_llmgw_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_llmgw_body_filter;

    return NGX_OK;
}
