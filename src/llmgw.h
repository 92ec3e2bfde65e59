/*
 * llmgw core library: the C API over the C++ core.
 *
 * Everything that decides (error contract, key checks, routing, request
 * rewriting, usage extraction, rate-limit arithmetic) lives behind this
 * header so that unit tests reach it without a server.  No nginx headers.
 * No exception ever crosses this boundary.
 */

#ifndef LLMGW_H
#define LLMGW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif


typedef struct {
    const char  *data;
    size_t       len;
} llmgw_str_t;

/* A buffer owned by the caller once returned; release with llmgw_buf_free. */
typedef struct {
    char        *data;
    size_t       len;
} llmgw_buf_t;

void llmgw_buf_free(llmgw_buf_t *b);

#define LLMGW_STR(s)  ((llmgw_str_t) { (s), sizeof(s) - 1 })


/*
 * A decision that refuses a request: HTTP status, error type and code, and a
 * message without the request-id suffix.  status == 0 means "allowed".
 */
typedef struct {
    int          status;
    const char  *type;          /* static string */
    const char  *code;          /* static string, may be "" */
    char         message[512];
} llmgw_verdict_t;

void llmgw_verdict_set(llmgw_verdict_t *v, int status, const char *type,
    const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* A name as an error message shows it, NUL-terminated in buf: its first 200
   bytes (whole UTF-8 characters), control characters (NUL among them) as
   a backslash, "u" and four hex digits, so a message names exactly what
   was asked for. */
#define LLMGW_SHOWN_SIZE  1201
const char *llmgw_shown(const char *data, size_t len,
    char buf[LLMGW_SHOWN_SIZE]);

/* A client request, parsed (request.cpp). */
typedef struct llmgw_req_s  llmgw_req_t;


/* ---- error contract (errors.cpp) ---- */

/*
 * {"error":{"message":"<message> (request id: <id>)","type":..,"code":..}}
 */
llmgw_buf_t llmgw_error_json(llmgw_str_t message, llmgw_str_t type,
    llmgw_str_t code, llmgw_str_t request_id);

/*
 * The most of an upstream error body kept to rewrite it: a longer one is
 * cut here, and a body of this length is taken as cut (a credential
 * across the cut is dropped whole, not left as its first bytes).
 */
#define LLMGW_ERROR_BODY_MAX  (64 * 1024)

/*
 * Turns an upstream error body into the error contract: the upstream's own
 * message (error.message, message, error as a string, or the raw text cut to
 * 512 bytes), type "upstream_error", the upstream's code when it is a string
 * or number, else "bad_response_status_code".  The credential the upstream
 * was sent (the channel key of the try) is replaced by "[credential]"
 * wherever the message or code repeats it.
 */
llmgw_buf_t llmgw_upstream_error_json(int status, const char *body,
    size_t len, llmgw_str_t credential, llmgw_str_t request_id);

/* The same, in the client's format (Anthropic's shape on /v1/messages). */
llmgw_buf_t llmgw_upstream_error_for(int client_ep, int status,
    const char *body, size_t len, llmgw_str_t credential,
    llmgw_str_t request_id);


/* ---- endpoints (endpoint.cpp) ---- */

typedef enum {
    LLMGW_EP_NONE = 0,
    LLMGW_EP_CHAT,          /* POST /v1/chat/completions */
    LLMGW_EP_MESSAGES,      /* POST /v1/messages */
    LLMGW_EP_GEMINI,        /* POST /v1beta/models/{m}:generateContent */
    LLMGW_EP_RERANK,        /* POST /v1/rerank, /v2/rerank */
    LLMGW_EP_MODELS,        /* GET /v1/models */
    LLMGW_EP_INVALID_URL,   /* 404 Invalid URL, message says why */
    LLMGW_EP_TASK           /* a task route (task.h) */
} llmgw_endpoint_e;

typedef struct {
    llmgw_endpoint_e  ep;
    llmgw_str_t       model;    /* from the path (Gemini), else empty */
    int               stream;   /* :streamGenerateContent */
    int               method_ok;
    char              message[384];
} llmgw_endpoint_t;

void llmgw_endpoint_classify(llmgw_str_t method, llmgw_str_t path,
    llmgw_endpoint_t *out);


/* ---- keys (keys.cpp) ---- */

/*
 * sha256 hex (64 chars + NUL) of the key with any "sk-" prefix removed.
 * Returns -1 for an empty key or one with bytes outside [!-~].
 */
int llmgw_key_hash(llmgw_str_t key, char out[65]);

/*
 * llmgw_key_hash() of a client's API key, which has the shape of every key
 * the admin API makes: 48 lowercase hex digits after an optional "sk-".
 * Returns -1 for anything else, which no key can be: it is refused without
 * asking the database (or filling the key cache with misses).
 */
int llmgw_client_key_hash(llmgw_str_t key, char out[65]);

/* Constant-time equality of two n-byte strings. */
int llmgw_ct_equal(const void *a, const void *b, size_t n);

/* A new key "sk-" + 48 random alphanumerics; out must hold 52 bytes. */
int llmgw_key_generate(char out[52]);

/*
 * Overwrites with '*' the value of every "key" parameter of a query string
 * (the part after '?', a fragment included); returns how many.  A key
 * parameter is one whose name, percent-decoded, is "key" in any case,
 * after the start, a '&', a ';' or a '#': the ones ngx_http_arg() finds
 * and every other spelling that plainly carries a key.  A key sent in the
 * query must not reach the logs.
 */
size_t llmgw_query_key_mask(char *query, size_t len);

/* How many key parameters with a value llmgw_query_key_mask() would mask. */
size_t llmgw_query_key_count(const char *query, size_t len);


/* ---- IP allow lists (cidr.cpp) ---- */

typedef struct llmgw_iplist_s  llmgw_iplist_t;

/* Parses a JSON array of IPs / CIDRs (IPv4, IPv6). NULL + err on error. */
llmgw_iplist_t *llmgw_iplist_parse(const char *json, size_t len, char *err,
    size_t errlen);
void llmgw_iplist_free(llmgw_iplist_t *l);
/* family is AF_INET or AF_INET6; addr is 4 or 16 bytes. */
int llmgw_iplist_match(const llmgw_iplist_t *l, int family,
    const uint8_t *addr);

/*
 * A list of "address[/prefix]" words (a directive's arguments); NULL with
 * *bad the index of the word that is none, or with *bad == n when out of
 * memory.
 */
llmgw_iplist_t *llmgw_iplist_from(const llmgw_str_t *words, size_t n,
    size_t *bad);

/*
 * Whether a content fetch a plugin chose may connect to addr (the resolved
 * address, as for llmgw_iplist_match): any public unicast address; a
 * loopback, private, shared, link-local, unspecified, multicast, reserved
 * or documentation one (IPv4-mapped, NAT64 and 6to4 forms judged by the
 * IPv4 address inside) only when it is in allow (NULL: none is).
 */
int llmgw_content_addr_ok(const llmgw_iplist_t *allow, int family,
    const uint8_t *addr);


/* ---- configuration snapshot and routing (snapshot.cpp) ---- */

typedef struct llmgw_snapshot_s  llmgw_snapshot_t;
typedef struct llmgw_token_s     llmgw_token_t;

typedef struct {
    int64_t       id;
    int           type;         /* 1 OpenAI, 14 Anthropic, 24 Gemini, ... */
    const char   *name;
    int           tls;
    const char   *host;         /* host name or IP literal, no brackets */
    const char   *host_header;  /* "host" or "host:port" as sent */
    uint16_t      port;
    const char   *base_path;    /* "" or "/prefix" without trailing slash */
    const char   *key;          /* the channel credential */
    int64_t       priority;
    int64_t       weight;
    const void   *key_forms;    /* the spellings of key an answer may carry
                                   (llmgw_resp_secret_channel) */
} llmgw_channel_t;

/* Whether text holds the channel's key in any spelling an answer may give
   it (as is, with "\/", percent-encoded, in base64); keys under
   LLMGW_CREDENTIAL_MIN_BYTES are never looked for. */
int llmgw_channel_quotes_key(const llmgw_channel_t *ch, const char *data,
    size_t len);

typedef struct {
    int64_t       window_ms;    /* 0: no limit */
    uint32_t      total;        /* 0: no total limit */
    uint32_t      success;      /* 0: no success limit */
} llmgw_rate_limit_t;

/*
 * NULL and the reason in err when the text is no snapshot.  A snapshot may
 * leave channels out (a base_url it cannot use, a control character in the
 * key, a model name or model_mapping): err then says which and why, else
 * it is "".  The key itself is never repeated.
 */
llmgw_snapshot_t *llmgw_snapshot_parse(const char *json, size_t len,
    char *err, size_t errlen);
void llmgw_snapshot_free(llmgw_snapshot_t *s);
int64_t llmgw_snapshot_revision(const llmgw_snapshot_t *s);
int llmgw_snapshot_is_admin(const llmgw_snapshot_t *s, const char hash[65]);

/* 403 for a group that is unknown or deprecated; sets *ratio otherwise. */
int llmgw_snapshot_group_check(const llmgw_snapshot_t *s, llmgw_str_t group,
    double *ratio, llmgw_verdict_t *v);
void llmgw_snapshot_rate_limit(const llmgw_snapshot_t *s, llmgw_str_t group,
    llmgw_rate_limit_t *rl);
/* The window of the limit in force for the group whose
   llmgw_rl_group_hash() this is (its own, else the default; 0: none):
   how long a log of the group's users still counts. */
int64_t llmgw_snapshot_rate_limit_window(const llmgw_snapshot_t *s,
    uint64_t group_hash);

/*
 * Candidate channels for a model in the order they are tried: enabled
 * channels serving the model for the group, highest priority first,
 * weighted random inside a priority (seeded).  Only channels that can serve
 * the endpoint are returned; *incompatible counts those left out for that.
 * With req, only channels whose format can carry that request (see
 * llmgw_req_check) are returned; when that leaves none, *unfit holds the
 * refusal of the first one left out (unfit->status is 0 otherwise).
 */
size_t llmgw_route(const llmgw_snapshot_t *s, llmgw_endpoint_e ep,
    llmgw_str_t model, llmgw_str_t group, uint64_t seed,
    const llmgw_channel_t **out, size_t max, size_t *incompatible,
    const llmgw_req_t *req, llmgw_verdict_t *unfit);

/* A model's price: per token (ratios) or per call (USD). */
typedef struct {
    int      known;
    int      per_call;
    double   ratio;             /* quota per prompt token */
    double   completion_ratio;  /* completion tokens cost this many more */
    double   cache_ratio;       /* cache reads, as a multiple of the prompt */
    double   cache_creation_ratio;
    double   price;             /* USD per call */
} llmgw_price_t;

#define LLMGW_QUOTA_PER_USD  500000
/* The most one request, call or task is charged (2,000,000,000 USD): the
   1,000 rows of a ledger batch still sum inside int64. */
#define LLMGW_QUOTA_MAX      1000000000000000LL

/* 0 and *p, or -1 when the model has no price. */
int llmgw_snapshot_price(const llmgw_snapshot_t *s, llmgw_str_t model,
    llmgw_price_t *p);

/*
 * GET /v1/models: the models a key may use, as an OpenAI model list (those
 * served by an enabled channel in the group and allowed by the key).
 */
llmgw_buf_t llmgw_models_json(const llmgw_snapshot_t *s, llmgw_str_t group,
    const llmgw_token_t *t);

/* The model name sent upstream after the channel's model_mapping. */
llmgw_str_t llmgw_channel_map_model(const llmgw_snapshot_t *s,
    const llmgw_channel_t *c, llmgw_str_t model);


/* ---- tokens (token.cpp) ---- */

/*
 * Parses the JSON answer of llmgw_token_lookup(); NULL on bad input.  A
 * token is reference counted (one worker, one thread): parse gives one
 * reference, llmgw_token_ref adds one, llmgw_token_free drops one.
 */
llmgw_token_t *llmgw_token_parse(const char *json, size_t len);
llmgw_token_t *llmgw_token_ref(llmgw_token_t *t);
void llmgw_token_free(llmgw_token_t *t);

int64_t llmgw_token_id(const llmgw_token_t *t);
int64_t llmgw_token_user_id(const llmgw_token_t *t);

/* Balances as the database had them when the record was read. */
int64_t llmgw_token_remain_quota(const llmgw_token_t *t);
int llmgw_token_unlimited(const llmgw_token_t *t);
int64_t llmgw_token_user_quota(const llmgw_token_t *t);

/* When (a worker's msec clock) the lookup that read the record was sent. */
void llmgw_token_set_loaded_at(llmgw_token_t *t, uint64_t msec);
uint64_t llmgw_token_loaded_at(const llmgw_token_t *t);
/* The revisions of the key's and its user's balances as read. */
int64_t llmgw_token_bal_rev(const llmgw_token_t *t);
int64_t llmgw_token_user_bal_rev(const llmgw_token_t *t);
/* The effective group: the token's, else the user's, else "default". */
llmgw_str_t llmgw_token_group(const llmgw_token_t *t);

/*
 * 401 Invalid token: disabled, expired, user disabled; with exhausted, also
 * when the record shows no quota left.  The gateway leaves that to the
 * balance in the shared zone, which may know a later one (a refund).
 */
int llmgw_token_check_standing(const llmgw_token_t *t, int64_t now,
    llmgw_verdict_t *v);
int llmgw_token_check(const llmgw_token_t *t, int64_t now,
    llmgw_verdict_t *v);
/* 403 access_denied when the address is outside the allow list. */
int llmgw_token_check_ip(const llmgw_token_t *t, int family,
    const uint8_t *addr, const char *addr_text, llmgw_verdict_t *v);
/* 403 when the model is outside the key's list. */
int llmgw_token_check_model(const llmgw_token_t *t, llmgw_str_t model,
    llmgw_verdict_t *v);


/*
 * A worker's key cache: key hash -> token (or a remembered miss, t == NULL).
 * Entries are dropped by token id, by user id, or all at once when the
 * configuration revision moved in a way the worker could not follow.
 */
typedef struct llmgw_tcache_s  llmgw_tcache_t;

llmgw_tcache_t *llmgw_tcache_new(size_t max_entries);
void llmgw_tcache_free(llmgw_tcache_t *c);
/* 1 and *t (a new reference, or NULL for a known miss) when cached. */
int llmgw_tcache_get(llmgw_tcache_t *c, const char hash[65],
    llmgw_token_t **t);
/* Takes its own reference of t; t may be NULL (a miss). */
void llmgw_tcache_put(llmgw_tcache_t *c, const char hash[65],
    llmgw_token_t *t);
void llmgw_tcache_drop_token(llmgw_tcache_t *c, int64_t token_id);
void llmgw_tcache_drop_user(llmgw_tcache_t *c, int64_t user_id);
void llmgw_tcache_clear(llmgw_tcache_t *c);


/* ---- admin answers (admin.cpp) ---- */

/*
 * Reads the answer of llmgw_api(): {"status": n, "body": ...} or
 * {"status": n, "message": m, "code": c}.  On success *body is the JSON text
 * to send; on failure v holds the error.  Returns the HTTP status.
 */
int llmgw_admin_answer(const char *json, size_t len, llmgw_buf_t *body,
    llmgw_verdict_t *v);

/*
 * The admin paths the gateway answers itself (the plugin runtime, or the
 * plugin store read directly); the others go to llmgw_api().
 */
typedef enum {
    LLMGW_ADMIN_DATABASE = 0,   /* llmgw_api() answers */
    LLMGW_ADMIN_UPLOAD,         /* POST /plugin/task */
    LLMGW_ADMIN_MARKETPLACE,    /* POST /plugin/task/marketplace */
    LLMGW_ADMIN_DRYRUN,         /* POST /plugin/task/dryrun */
    LLMGW_ADMIN_STATUS,         /* GET /plugin/task/runtime/status */
    LLMGW_ADMIN_ICON,           /* GET /plugin/task/{key}/icon */
    LLMGW_ADMIN_REFUSED         /* a 405 in v */
} llmgw_admin_route_e;

/*
 * Which of them an admin request is (path without the "/api" prefix), with
 * the {key} of an icon in *key.  Paths are read as llmgw_api() reads them:
 * trailing slashes do not count.  A path only the gateway answers, taken
 * with another method, is a 405 naming the methods it takes.
 */
llmgw_admin_route_e llmgw_admin_route(llmgw_str_t method, llmgw_str_t path,
    llmgw_str_t *key, llmgw_verdict_t *v);

/*
 * Whether an admin request of that route (not REFUSED) may be served: 0, or
 * -1 with a 400 in v.  The path and query must be UTF-8 (the database
 * refuses anything else), and a body, when object is set and the body is
 * not empty, one JSON object by jansson's rules (no NUL byte, no number
 * beyond a double).  A route the gateway answers takes no query parameter
 * but an upload's force; llmgw_api() checks those of the others.
 */
int llmgw_admin_check(llmgw_admin_route_e route, llmgw_str_t path,
    llmgw_str_t args, llmgw_str_t body, int object, llmgw_verdict_t *v);

/* The notification payload {"rev":n,"kind":"token","id":7}. */
typedef struct {
    int64_t  rev;
    int64_t  id;
    char     kind[16];
} llmgw_notice_t;

int llmgw_notice_parse(const char *json, size_t len, llmgw_notice_t *n);


/* ---- client requests (request.cpp) ---- */

/* llmgw_req_t is declared at the top: routing reads it too */

/*
 * Parses and validates a request body for an endpoint (the body must stay
 * valid while the request lives): 400 invalid JSON,
 * 400 "Model name not specified", 400 invalid_request naming a missing
 * field.  path_model is the model from the URL (Gemini), may be empty.
 */
llmgw_req_t *llmgw_req_parse(llmgw_endpoint_e ep, llmgw_str_t path_model,
    const char *body, size_t len, llmgw_verdict_t *v);
void llmgw_req_free(llmgw_req_t *r);

llmgw_str_t llmgw_req_model(const llmgw_req_t *r);
/* The "model" string of a body that was refused, as a view into it (empty
   when it has none, or one with escapes or over 1024 bytes): what its
   refusal is logged under. */
llmgw_str_t llmgw_req_model_in(const char *body, size_t len);
int llmgw_req_stream(const llmgw_req_t *r);
/* The most output tokens the client allowed an answer (max_tokens or an
   equivalent above 0; of two given, the larger), or -1; 0 for a rerank,
   which is never billed for output. */
int64_t llmgw_req_max_tokens(const llmgw_req_t *r);
/* How many answers the request asks for (n, candidateCount): 1 to 128. */
int64_t llmgw_req_choices(const llmgw_req_t *r);
/* The max_tokens a chat request that set none is sent with when converted
   for an Anthropic channel, which requires one. */
#define LLMGW_CONVERTED_MAX_TOKENS  4096
/* A token estimate of the prompt (text length based). */
int64_t llmgw_req_prompt_estimate(const llmgw_req_t *r);

/*
 * The body sent to a channel: the model replaced by upstream_model; for an
 * OpenAI stream without stream_options.include_usage it is added and
 * *usage_injected set, so that the extra usage chunk is held back from the
 * client.
 */
llmgw_buf_t llmgw_req_upstream_body(const llmgw_req_t *r,
    const llmgw_channel_t *c, llmgw_str_t upstream_model,
    int *usage_injected);

/*
 * Builds the body llmgw_req_upstream_body() gives for this channel and
 * model ahead of time (in a thread: a large converted body takes a
 * while) and keeps it in the request, once per channel type and model.
 * Nothing else may use the request meanwhile.
 */
void llmgw_req_prepare(const llmgw_req_t *r, const llmgw_channel_t *c,
    llmgw_str_t upstream_model);
/* 0 and that body (valid while the request is), or -1 when none was. */
int llmgw_req_prepared_body(const llmgw_req_t *r, const llmgw_channel_t *c,
    llmgw_str_t upstream_model, llmgw_str_t *body, int *usage_injected);

/*
 * Whether the request can be sent to a channel of this type (a conversion
 * exists and accepts it): 0, or -1 with a 400 invalid_request in v.
 */
int llmgw_req_check(const llmgw_req_t *r, int channel_type,
    llmgw_verdict_t *v);


/* ---- upstream responses and usage (usage.cpp) ---- */

typedef struct {
    int64_t  prompt_tokens;
    int64_t  completion_tokens;
    int64_t  cache_read_tokens;
    int64_t  cache_creation_tokens;
    int      cache_in_prompt;   /* prompt_tokens counts the cache tokens too
                                   (OpenAI, Gemini); Anthropic's does not */
    int      known;             /* the upstream reported usage */
} llmgw_usage_t;

typedef struct llmgw_resp_s  llmgw_resp_t;

/*
 * Observes an upstream 2xx body as it streams (JSON or SSE) to read usage
 * and, when usage was injected, to drop the usage-only chunk the client did
 * not ask for.
 */
llmgw_resp_t *llmgw_resp_new(llmgw_endpoint_e ep, int channel_type,
    int stream, int usage_injected);
void llmgw_resp_free(llmgw_resp_t *r);
/* The try's channel credential: no copy of it reaches the client (an
   upstream error event or body may quote it); "[credential]" instead.  And
   the request id, which errors written into a converted stream end with. */
void llmgw_resp_secret(llmgw_resp_t *r, const char *key, size_t len,
    const char *request_id, size_t id_len);
/* The same for a channel of a snapshot, with the spellings of its key the
   snapshot worked out once: the channel (its snapshot) and request_id must
   outlive r. */
void llmgw_resp_secret_channel(llmgw_resp_t *r, const llmgw_channel_t *ch,
    const char *request_id, size_t id_len);
/* Shorter credentials would be "found" in unrelated text by chance. */
#define LLMGW_CREDENTIAL_MIN_BYTES  8

/*
 * Feeds upstream bytes.  Returns what must reach the client for them:
 * either the same bytes (out->data == NULL, pass through) or a replacement
 * in *out (possibly empty), owned by the caller.
 */
int llmgw_resp_feed(llmgw_resp_t *r, const char *data, size_t len,
    llmgw_buf_t *out);
/*
 * Makes the client's format out of the channel's: converted chat/messages
 * answers and streams, normalised rerank answers.  Call after
 * llmgw_resp_new; then llmgw_resp_rewrites() tells whether the body
 * changes (its length is no longer the upstream's).
 */
int llmgw_resp_convert(llmgw_resp_t *resp, const llmgw_req_t *req);
/*
 * Before llmgw_resp_convert, for a resp made with stream 0: the client asked
 * for a stream but the upstream answers with one whole JSON body; it is
 * held and sent as the stream the client expects at llmgw_resp_finish.
 */
void llmgw_resp_whole_for_stream(llmgw_resp_t *resp);
/*
 * Before llmgw_resp_convert, for a Gemini stream the client asked for
 * without alt=sse: what it gets is one JSON array of the stream's answers,
 * written as they come (closed unless the stream was cut short).
 */
void llmgw_resp_array(llmgw_resp_t *resp);
int llmgw_resp_rewrites(const llmgw_resp_t *resp);

/* End of the upstream body; may return trailing bytes for the client. */
int llmgw_resp_finish(llmgw_resp_t *r, llmgw_buf_t *out);
/*
 * After llmgw_resp_finish: whether a JSON answer was one (a JSON object);
 * streams and answers too large to hold count as answers.
 */
int llmgw_resp_valid(const llmgw_resp_t *r);
/*
 * A JSON answer is held whole (at most llmgw_resp_hold_max() bytes): the
 * bytes held so far; llmgw_resp_release() hands them out and passes the
 * rest on as it comes, billed by its size, as for an answer too large.
 */
int llmgw_resp_holds(const llmgw_resp_t *r);
size_t llmgw_resp_held(const llmgw_resp_t *r);
size_t llmgw_resp_hold_max(void);
int llmgw_resp_release(llmgw_resp_t *r, llmgw_buf_t *out);
/* Whether the held answer is to be put in another shape (the client's
   format, or the stream the client asked for): one too large to hold cannot
   be, and is no answer for the client. */
int llmgw_resp_reshapes(const llmgw_resp_t *r);
/* After llmgw_resp_finish(): a stream that ended before the upstream said
   it was done (a converted one told the client so in an error event). */
int llmgw_resp_cut(const llmgw_resp_t *r);
/* Usage as reported, or estimated from the delivered text. */
void llmgw_resp_usage(const llmgw_resp_t *r, llmgw_usage_t *u);
/* A failure, whatever status its head had: a stream that delivered no
   text and opened with the upstream's error event, or that the upstream
   ended without any event (client_gone: the client left first, which is
   no failure of the upstream); or a JSON answer that only the upstream's
   closing ended (so not checked before its head) and that, read whole,
   is no answer. */
int llmgw_resp_failed(const llmgw_resp_t *r, int client_gone);


/*
 * Quota for a usage: (prompt + cache reads x cache_ratio + cache writes x
 * cache_creation_ratio + completion x completion_ratio) x ratio x
 * group_ratio, prompt meaning the tokens not read from or written to a
 * cache; or price x 500,000 x group_ratio per call.  Rounded to the nearest
 * unit.
 */
int64_t llmgw_quota(const llmgw_price_t *p, double group_ratio,
    const llmgw_usage_t *u);


/*
 * Reads the answer of llmgw_flush_apply() and llmgw_flush_staged() (also
 * llmgw_flush() and the task statements): {"inserted": n, "tokens": {"<id>":
 * remain_quota}, "users": {"<id>": quota}, "token_revs": {"<id>": bal_rev},
 * "user_revs": {...}} and reports each balance with its revision (-1 when
 * the answer has none: sql/015_balance_revisions.sql).
 */
typedef void (*llmgw_balance_cb)(void *arg, int is_user, int64_t id,
    int64_t balance, int64_t rev);

int llmgw_flush_answer(const char *json, size_t len, llmgw_balance_cb cb,
    void *arg);


/* ---- ledger rows (ledger.cpp) ---- */

typedef struct {
    const char     *request_id;
    const char     *type;          /* consume, refund, error, reserve */
    int64_t         user_id;
    int64_t         token_id;
    int64_t         channel_id;    /* 0: none */
    llmgw_str_t     model;         /* the client's name */
    llmgw_str_t     upstream_model;
    llmgw_str_t     endpoint;
    const int64_t  *tried;
    size_t          ntried;
    llmgw_usage_t   usage;
    int64_t         quota;
    int             is_stream;
    int             status;
    int64_t         latency_ms;
    double          created_at;    /* unix seconds */
} llmgw_ledger_row_t;

/* The columns of a ledger row in COPY's text format, in order. */
#define LLMGW_LEDGER_COLUMNS                                                  \
    "request_id, type, user_id, token_id, channel_id, model_name, "          \
    "upstream_model, endpoint, channels_tried, prompt_tokens, "              \
    "completion_tokens, cache_read_tokens, cache_creation_tokens, quota, "   \
    "is_stream, status, latency_ms, created_at"

/* One row as a line of COPY's text format (LLMGW_LEDGER_COLUMNS). */
llmgw_buf_t llmgw_ledger_row_copy(const llmgw_ledger_row_t *row);

/* What one row of a batch charges (0 ids: none). */
typedef struct {
    int64_t         token_id;
    int64_t         user_id;
    int64_t         quota;
} llmgw_charge_t;

/*
 * The statement for a batch never sent before: COPY straight into logs, then
 * llmgw_flush_apply() with its charges summed per token and per user.
 */
llmgw_buf_t llmgw_flush_new_sql(const llmgw_charge_t *c, size_t n);

/* The statement for a batch that may have been written before. */
#define LLMGW_FLUSH_AGAIN_SQL                                                 \
    "SELECT llmgw_flush_stage(); "                                            \
    "COPY pg_temp.llmgw_flush_in (" LLMGW_LEDGER_COLUMNS ") FROM STDIN; "    \
    "SELECT llmgw_flush_staged()::text"


/* ---- rate limiting arithmetic (ratelimit.cpp) ---- */

/*
 * A sliding-log limiter over caller memory (nginx puts it in shared memory
 * under the zone mutex): "at most total requests, and at most success
 * successful ones, in any window_ms".  Exact: timestamps, not buckets.
 */
/* The group of a limiter, by name (64-bit FNV-1a). */
uint64_t llmgw_rl_group_hash(llmgw_str_t group);
size_t llmgw_rl_size(uint32_t total, uint32_t success);
void llmgw_rl_init(void *mem, uint32_t total, uint32_t success);

enum { LLMGW_RL_OK = 0, LLMGW_RL_TOTAL = 1, LLMGW_RL_SUCCESS = 2 };

/*
 * Admits and records one request, or refuses it with the limit that was hit
 * and the milliseconds until a slot frees.  An admitted request holds a
 * success slot from then on (*reserved, -1 when none was taken; may be
 * NULL): a request that did not succeed gives it back with
 * llmgw_rl_release().
 */
int llmgw_rl_acquire(void *mem, int64_t now_ms, int64_t window_ms,
    int64_t *retry_after_ms, int64_t *reserved);
void llmgw_rl_release(void *mem, int64_t reserved);
/* A changed limit within the capacities a limiter was made with (0), or
   not (-1: a larger one is made and the history copied into it). */
int llmgw_rl_limit(void *mem, uint32_t total, uint32_t success);
/* Moves the history into a limiter of other sizes (llmgw_rl_init'ed). */
void llmgw_rl_copy(void *dst, const void *src);


/* ---- incremental SSE framing (sse.cpp) ---- */

typedef struct llmgw_sse_s  llmgw_sse_t;

typedef struct {
    llmgw_str_t  event;         /* "message" when absent */
    llmgw_str_t  id;
    llmgw_str_t  data;          /* data lines joined with "\n" */
} llmgw_sse_event_t;

typedef void (*llmgw_sse_cb)(void *arg, const llmgw_sse_event_t *ev);

/* max_event: the largest event accepted (bytes); 0 = 1 MiB. */
llmgw_sse_t *llmgw_sse_new(size_t max_event);
void llmgw_sse_free(llmgw_sse_t *p);
/* Returns 0, or -1 when an event exceeds the limit. CRLF, LF, CR accepted. */
int llmgw_sse_feed(llmgw_sse_t *p, const char *data, size_t len,
    llmgw_sse_cb cb, void *arg);
/* Where in the last feed's data its last complete event ended (just past
   the blank line), or SIZE_MAX when no event ended in it. */
size_t llmgw_sse_boundary(const llmgw_sse_t *p);
/* Whether a Content-Type value says text/event-stream: its media type
   (before any parameter, without white space around it) compared exactly,
   ignoring case ("Text/Event-Stream; charset=utf-8" is one,
   "text/event-streamx" is not). */
int llmgw_is_event_stream(llmgw_str_t content_type);


/* ---- plugin management (plugin.cpp) ---- */

/* The LOAD body {"source": ...} for a stored source text. */
int llmgw_plugin_source_request(const char *source, size_t len,
    llmgw_buf_t *frame, llmgw_verdict_t *v);

/*
 * The LOAD body {"source": ...} from an admin body; 400 without source.
 * An upload's body (upload 1) takes source, remark (a string), enabled and
 * force (booleans) only: anything else is a 400 verdict naming it.
 */
int llmgw_plugin_load_request(const char *body, size_t len, int upload,
    llmgw_buf_t *frame, llmgw_verdict_t *v);

/*
 * Reads a LOAD reply: 0 and the source's sha, or -1 and a verdict (400
 * invalid_plugin listing every validation error, 502 for a helper fault).
 */
int llmgw_plugin_load_reply(const char *reply, size_t len, char sha[65],
    llmgw_verdict_t *v);

/*
 * The llmgw_plugin_upload() argument: the admin body, the LOAD reply and
 * the request's query string (which may say force, as on the other plugin
 * calls).
 */
llmgw_buf_t llmgw_plugin_upload_arg(const char *body, size_t blen,
    const char *reply, size_t rlen, llmgw_str_t query);

/*
 * The CALL body {sha, hook, args} of a dry run from the admin body {hook,
 * args}; 400 when hook is not a string or args not an array.
 */
int llmgw_plugin_call_request(const char *body, size_t len, const char *sha,
    llmgw_buf_t *frame, llmgw_verdict_t *v);

/*
 * The deadline_ms every CALL frame carries, for nginx waiting wait_ms
 * (llmgw_v8host_timeout) for its answer: the runtime ends a hook that runs
 * longer (a timeout, the plugin's fault, which a poll counts) before nginx
 * gives up on the call (the runtime unavailable, which counts nothing).
 * wait_ms less 2.5 s (the 2 s in which the runtime ends a worker whose hook
 * ignores termination, and time for the queue and the way), at least half
 * of wait_ms, at most the runtime's largest --deadline-ms; the runtime's
 * own deadline applies when it is lower.
 */
int64_t llmgw_plugin_call_deadline(int64_t wait_ms);

/* A CALL body for a hook with its arguments (a JSON array text). */
llmgw_buf_t llmgw_plugin_call_body(const char *sha, const char *hook,
    const char *args, size_t args_len);

/*
 * The CALL body of a dry run on a source that is not stored:
 * {source, hook, args}; the helper loads the source for that call.
 */
llmgw_buf_t llmgw_plugin_dryrun_body(const char *body, size_t len);

/* GET /runtime/status: the helper's STATUS reply and this node's view. */
llmgw_buf_t llmgw_plugin_status_json(const char *helper, size_t hlen,
    const char *node, size_t nlen);

/*
 * "key" of a dry run's body that names no source, into key (NUL-ended;
 * empty when longer than keylen allows, a key no plugin has): 0; 1 when the
 * body names a source or no key (a source's dry run); -1 with v set when
 * the key is not a string.
 */
int llmgw_plugin_body_key(const char *body, size_t len, char *key,
    size_t keylen, llmgw_verdict_t *v);

/* 1 when a CALL reply says the helper has not loaded that source. */
int llmgw_plugin_not_loaded(const char *reply, size_t len);

/* The sha of the published version of a plugin, or NULL. */
const char *llmgw_snapshot_plugin_sha(const llmgw_snapshot_t *s,
    llmgw_str_t key);

/* The published plugins as {generation, plugins: [{key, version, sha}]}. */
llmgw_buf_t llmgw_snapshot_plugins_json(const llmgw_snapshot_t *s);


/* ---- plugin manifests (manifest.cpp) ---- */

/*
 * Validates a plugin's meta export against the contract, given the plugin's
 * exported function paths (a JSON array like ["buildSubmitRequest",
 * "parseSubmitResponse", "native.decodeX", "protocols.host_video.render"]).
 * 0 and the normalised manifest JSON in *normalized, or -1 and a JSON array
 * of messages in *errors ("meta.key: at most 30 characters",
 * "meta.protocols[0]: \"stream\" needs export protocols.host_responses.renderEvents").
 */
int llmgw_manifest_validate(const char *meta_json, size_t meta_len,
    const char *exports_json, size_t exports_len, llmgw_buf_t *normalized,
    llmgw_buf_t *errors);

/* The spec's name of a host protocol for its marketplace spelling
 * ("openai_video" -> "host_video"); any other name as given. */
const char *llmgw_protocol_name(const char *name);


/* ---- frames between nginx and v8_host (frame.cpp) ---- */

/*
 * Every message is a 12-byte header in network byte order followed by a
 * JSON body: version (1), type, reserved (0), request id, body length.
 * The length is capped on both sides; a reply carries the request id of
 * its call and is matched against it.
 */
#define LLMGW_FRAME_VERSION     1
#define LLMGW_FRAME_HEADER_LEN  12
#define LLMGW_FRAME_MAX_BODY    (16 * 1024 * 1024)

typedef enum {
    LLMGW_FRAME_LOAD = 1,       /* {source} -> manifest or errors */
    LLMGW_FRAME_CALL = 2,       /* {plugin, sha, hook, args} -> result */
    LLMGW_FRAME_STATUS = 3,     /* {} -> workers, plugins, counters */
    LLMGW_FRAME_REPLY = 0x80,   /* body {ok: true, ...} or {ok: false,
                                   error: {kind, message}} */
} llmgw_frame_type_e;

typedef struct {
    uint8_t   version;
    uint8_t   type;
    uint32_t  request_id;
    uint32_t  length;
} llmgw_frame_t;

/* Writes the 12 header bytes. */
void llmgw_frame_encode(const llmgw_frame_t *f, uint8_t out[12]);

/*
 * Reads a header: 0, or -1 with a reason in err for a wrong version, an
 * unknown type or a length over max_body.
 */
int llmgw_frame_decode(const uint8_t in[12], size_t max_body,
    llmgw_frame_t *f, char *err, size_t errlen);


#ifdef __cplusplus
}
#endif

#endif /* LLMGW_H */
