/*
 * Inbound request bodies of task routes, parsed by the host (spec
 * "Inbound request body"): json, form, multipart or none.  Plugins see the
 * DecodedBody JSON; file bytes stay here and are only referenced by
 * "request_file:<field>[#<index>]".
 */

#ifndef LLMGW_INBOUND_H
#define LLMGW_INBOUND_H

#include "llmgw.h"

#ifdef __cplusplus
extern "C" {
#endif


typedef struct llmgw_inbound_s  llmgw_inbound_t;

/* Also defined by descriptor.h: both headers may be included together. */
#ifndef LLMGW_FILE_T_DEFINED
#define LLMGW_FILE_T_DEFINED
typedef struct {
    const char           *ref;       /* "request_file:<field>[#<n>]" */
    const char           *field;
    const char           *filename;
    const char           *mime;
    const unsigned char  *data;
    size_t                len;
} llmgw_file_t;
#endif

/*
 * Parses a client body by its Content-Type: application/json or
 * application/<x>+json -> json; application/x-www-form-urlencoded -> form;
 * multipart/form-data -> multipart; an empty body -> none.  Other types,
 * bad JSON, bad percent escapes and malformed multipart are 400
 * (gateway_error); a file over max_file or files over max_total in all
 * are 413 file_too_large (0: no cap).  File bytes are referenced in place:
 * body must outlive the object.  NULL and v on failure.
 */
llmgw_inbound_t *llmgw_inbound_parse(llmgw_str_t content_type,
    const char *body, size_t len, size_t max_file, size_t max_total,
    llmgw_verdict_t *v);
void llmgw_inbound_free(llmgw_inbound_t *in);

/*
 * The DecodedBody given to hooks: {"kind":"json","value":...} |
 * {"kind":"form","fields":{"k":["v",...]}} |
 * {"kind":"multipart","fields":{...},"files":[{"ref","field","filename",
 * "mimeType","size"}]} | {"kind":"none"}.  Text that is not UTF-8 has
 * U+FFFD in place of the bad bytes.
 */
llmgw_buf_t llmgw_inbound_json(const llmgw_inbound_t *in);

/* "json", "form", "multipart" or "none". */
const char *llmgw_inbound_kind(const llmgw_inbound_t *in);

/* What a non-empty body sent with this Content-Type is read as: "json",
   "form" or "multipart"; NULL when it is refused. */
const char *llmgw_inbound_type_kind(llmgw_str_t content_type);

/* The JSON text of a json body (requestBody of /v1/tasks); data NULL for
   other kinds. */
llmgw_buf_t llmgw_inbound_value(const llmgw_inbound_t *in);

/* The files of a multipart body in body order; *files lives as long as in. */
size_t llmgw_inbound_files(const llmgw_inbound_t *in,
    const llmgw_file_t **files);

/* A URL query "a=1&a=2&b=x%20y" -> {"a":["1","2"],"b":["x y"]}; "+" is a
   space, a bad escape is kept as written. */
llmgw_buf_t llmgw_query_json(llmgw_str_t args);


#ifdef __cplusplus
}
#endif

#endif /* LLMGW_INBOUND_H */
