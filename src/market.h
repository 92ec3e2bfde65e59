/*
 * Plugin marketplace sources (market.cpp): POST /api/plugin/task/marketplace.
 */

#ifndef LLMGW_MARKET_H
#define LLMGW_MARKET_H

#include "llmgw.h"
#include "descriptor.h"

#ifdef __cplusplus
extern "C" {
#endif


/* {url, key?, version?, enabled?, force?, remark?}: without key a listing. */
typedef struct {
    char  *url;
    char  *key;          /* NULL: list the index */
    char  *version;      /* NULL: the index's latest */
} llmgw_market_req_t;

int llmgw_market_parse(const char *body, size_t len, llmgw_market_req_t *m,
    llmgw_verdict_t *v);
void llmgw_market_req_free(llmgw_market_req_t *m);

/* 1 and the request of an http(s) address, 0 and the path of a local file,
 * or -1 and a verdict. */
int llmgw_market_locate(const char *url, llmgw_outbound_t *out,
    llmgw_buf_t *path, llmgw_verdict_t *v);

/* {url, name, plugins: [{key, name, ..., versions, installed}]} */
int llmgw_market_listing(const char *index, size_t len, const char *url,
    const llmgw_snapshot_t *s, llmgw_buf_t *out, llmgw_verdict_t *v);

/* The chosen version: where its source is, its sha256 and its version. */
int llmgw_market_pick(const char *index, size_t len, const char *index_url,
    const char *key, const char *version, llmgw_buf_t *src, char sha[65],
    llmgw_buf_t *ver, llmgw_verdict_t *v);

/* Checks the download against the sha256; the upload body to use. */
int llmgw_market_upload_body(const char *source, size_t len, const char *sha,
    const char *admin_body, size_t blen, llmgw_buf_t *out,
    llmgw_verdict_t *v);

/* The compiled manifest (a LOAD reply) has the index's key and version. */
int llmgw_market_check_manifest(const char *reply, size_t len,
    const char *key, const char *version, llmgw_verdict_t *v);

/* GET /api/plugin/task/{key}/icon: the manifest's icon ("text",
 * "text:<label>" or an icon-library name) as a small SVG. */
llmgw_buf_t llmgw_plugin_icon_svg(const char *icon, const char *name);


#ifdef __cplusplus
}
#endif

#endif /* LLMGW_MARKET_H */
