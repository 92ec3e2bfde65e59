/*
 * Outbound HTTP descriptors: the JSON a plugin's build hook returns, turned
 * into one concrete request the host may send, or refused with a message
 * that names the rule (nothing is sent then).
 *
 * The rules: an absolute http(s) URL whose host is the channel host or in
 * the manifest's allowedHosts (credentialless content requests excepted,
 * which are marked public_only when they leave the channel host); safe
 * methods and headers; JSON, multipart, form or text bodies with file
 * references resolved on the host under per-file and total caps; redirects
 * re-checked against the same rules.  No nginx headers.
 */

#ifndef LLMGW_DESCRIPTOR_H
#define LLMGW_DESCRIPTOR_H

#include "llmgw.h"

#ifdef __cplusplus
extern "C" {
#endif


/* 64 MiB: the host's default per-file and per-request file caps. */
#define LLMGW_DESC_DEFAULT_FILE_BYTES  ((size_t) 64 * 1024 * 1024)


/*
 * An uploaded file of the inbound request; its bytes stay on the host.
 * Also defined by inbound.h (same members): both may be included together.
 */
#ifndef LLMGW_FILE_T_DEFINED
#define LLMGW_FILE_T_DEFINED
typedef struct {
    const char           *ref;      /* "request_file:<field>[#<n>]" */
    const char           *field;
    const char           *filename; /* may be NULL or "" */
    const char           *mime;     /* may be NULL or "" */
    const unsigned char  *data;
    size_t                len;
} llmgw_file_t;
#endif

typedef struct {
    /* scheme://host[:port] of the channel's base URL is "the channel host" */
    llmgw_str_t           base_url;
    /* the channel key (may be empty); never sent to any other host */
    llmgw_str_t           credential;
    /* manifest allowedHosts as normalised: "host" or "host:port",
     * lowercase, IPv6 in brackets */
    const llmgw_str_t    *allowed_hosts;
    size_t                nallowed;
    int                   allow_sse;            /* submit, sse declared */
    int                   allow_credentialless; /* content requests only */
    const llmgw_file_t   *files;
    size_t                nfiles;
    size_t                max_file_bytes;   /* 0: the default */
    size_t                max_total_bytes;  /* 0: the default */
} llmgw_desc_policy_t;

/* A validated request; release with llmgw_outbound_free(). */
typedef struct {
    char          method[16];
    int           tls;
    char         *host;         /* no brackets for IPv6 */
    uint16_t      port;
    char         *host_header;  /* host[:port], port only when not default */
    char         *uri;          /* path + query, starting with "/" */
    llmgw_buf_t   url;          /* the absolute URL, without fragment */
    /* "Name: value\r\n" lines, Content-Type included when there is a body;
     * never Host, Content-Length, Connection or Transfer-Encoding */
    llmgw_buf_t   headers;
    llmgw_buf_t   body;
    int           sse;          /* responseType "sse" */
    int           credentialless;
    /* credentialless and not to the channel host: the URL is the plugin's
     * (or a vendor's answer's), so it may connect only to addresses
     * llmgw_content_addr_ok() admits, checked on every resolved address */
    int           public_only;
} llmgw_outbound_t;

/*
 * Validates the descriptor json and builds *out (0), or returns -1 with a
 * message in err ("descriptor: ...") that holds no header value, body or
 * credential.  *out needs no release after -1.
 */
int llmgw_descriptor_build(const char *json, size_t len,
    const llmgw_desc_policy_t *p, llmgw_outbound_t *out, char *err,
    size_t errlen);

/*
 * The request that follows a redirect answer of cur (status 301, 302, 303,
 * 307 or 308; location as received, maybe relative), checked against the
 * same rules.  303, and 301/302 of a method other than GET and HEAD, become
 * GET without body.  A redirect to another origin drops Authorization,
 * Cookie and every header that carries the credential.  The caller counts
 * hops.  0 and *next, or -1 and err.
 */
int llmgw_descriptor_redirect(const llmgw_outbound_t *cur, int status,
    llmgw_str_t location, const llmgw_desc_policy_t *p,
    llmgw_outbound_t *next, char *err, size_t errlen);

void llmgw_outbound_free(llmgw_outbound_t *o);

/*
 * {"name": ["v1", "v2"], ...} of response headers for parse hooks: names
 * lowercased, repeated names merged in order.  data NULL when out of memory.
 */
llmgw_buf_t llmgw_headers_json(const llmgw_str_t *names,
    const llmgw_str_t *values, size_t n);


#ifdef __cplusplus
}
#endif

#endif /* LLMGW_DESCRIPTOR_H */
