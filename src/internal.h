/*
 * Helpers shared by the core's translation units (never by the glue).
 */

#ifndef LLMGW_INTERNAL_H
#define LLMGW_INTERNAL_H

#include <jansson.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include <cstdio>

#include "llmgw.h"

namespace llmgw {

struct JsonDeleter {
    void operator()(json_t *j) const { json_decref(j); }
};

/* An owning reference to a jansson value. */
using Json = std::unique_ptr<json_t, JsonDeleter>;

/*
 * The value of a JSON text, or null when it is not JSON.  An integer beyond
 * int64 (a 20-digit id a model wrote into tool arguments, say) is JSON: such
 * a text is read with every number as a real, and the reals that hold whole
 * numbers of up to 2^53 become integers again.
 */
Json json_parse(const char *data, size_t len);

inline std::string_view
sv(llmgw_str_t s)
{
    return std::string_view(s.data ? s.data : "", s.len);
}

/* s without the bytes of ws at either end */
inline std::string_view
trim(std::string_view s, const char *ws = " \t\r\n")
{
    size_t b = s.find_first_not_of(ws);

    if (b == std::string_view::npos) {
        return {};
    }

    return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

inline llmgw_str_t
str(std::string_view s)
{
    return llmgw_str_t { s.data(), s.size() };
}

/* Copies s into a malloc'ed llmgw_buf_t (data NULL on allocation failure). */
llmgw_buf_t make_buf(std::string_view s);

/* Compact JSON text of a value. */
std::string json_dump(const json_t *j);

/*
 * The same, for a jsonb parameter: PostgreSQL refuses the escape \u0000
 * (text cannot hold NUL), so a NUL in a string becomes U+FFFD.
 */
std::string json_dump_pg(const json_t *j);

/* A string member or "" (never NULL). */
std::string_view json_str(const json_t *obj, const char *key);

/* An integer member (or a real one truncated) or dflt. */
int64_t json_int(const json_t *obj, const char *key, int64_t dflt);

double json_num(const json_t *obj, const char *key, double dflt);

/* Length of the valid UTF-8 sequence at p (1..4), or 0 when invalid. */
size_t utf8_seq(const unsigned char *p, size_t avail);

/* Whether s is valid UTF-8 throughout. */
bool utf8_valid(std::string_view s);

/*
 * Appends the UTF-8 sequence at p, or U+FFFD when it is invalid; returns
 * the bytes of p consumed (at least 1).
 */
size_t append_utf8_char(std::string &out, const unsigned char *p,
    size_t avail);

/* Appends s as a JSON string literal; invalid UTF-8 becomes U+FFFD. */
void append_json_string(std::string &out, std::string_view s);

/* At most max bytes of s, never splitting a UTF-8 sequence. */
std::string_view utf8_prefix(std::string_view s, size_t max);

/* Each balance of a statement's answer ({tokens, users: {"<id>": balance},
   token_revs, user_revs: {"<id>": revision}}) to cb, the revision -1 when
   it has none. */
void balances_answered(json_t *root, llmgw_balance_cb cb, void *arg);

/*
 * Decodes %XX escapes (and "+" as a space when plus_space).  A bad escape
 * is an error when strict (form bodies), else kept as written (queries, as
 * browsers and most servers do).
 */
bool percent_decode(std::string_view in, bool plus_space, bool strict,
    std::string &out);

/* A name (a model's) as an error message shows it: llmgw_shown(). */
std::string shown(std::string_view name);

/* The lowercase hex SHA-256 of data (64 characters), "" if it failed. */
std::string sha256_hex(std::string_view data);

constexpr size_t kCredentialMinBytes = LLMGW_CREDENTIAL_MIN_BYTES;

/* The longest model name served (cloud resource names run to a few
   hundred bytes): it goes into the ledger, the logs and the shared zone. */
constexpr size_t kMaxModelName = 1024;

/* Whether channels of this type serve the endpoint (directly or through
 * conversion). */
bool endpoint_serves(llmgw_endpoint_e ep, int type);
/* A type the gateway proxies itself (its channels hold a vendor API key). */
bool proxied_type(int type);

/*
 * s with every copy of a channel credential replaced by "[credential]": as
 * is (which covers "Bearer <key>"), percent-encoded (an upstream that
 * echoes a URL holding ?key=) and in base64, standard or URL-safe, at any
 * byte alignment (an echoed "Basic " header of key + ":", a token holding
 * it).  Text that may quote what a vendor received passes here before it
 * is cut, logged or shown to a client.
 */
std::string redact(std::string_view s, std::string_view credential);
/* The spellings redact() looks for (none for a credential too short). */
std::vector<std::string> credential_forms(std::string_view credential);
/* Text cut short, without a credential's first bytes at its end: what
   redact() cannot find there, being only a part. */
std::string_view without_cut_credential(std::string_view s,
    std::string_view credential);

/* The first object of a JSON array whose string member is v, or nullptr. */
inline const json_t *
json_find_by(const json_t *arr, const char *member, std::string_view v)
{
    size_t   i;
    json_t  *e;

    json_array_foreach(arr, i, e) {
        if (json_str(e, member) == v) {
            return e;
        }
    }
    return nullptr;
}

/* Whether a JSON array holds the string v. */
inline bool
json_has_string(const json_t *arr, std::string_view v)
{
    size_t   i;
    json_t  *e;

    json_array_foreach(arr, i, e) {
        if (json_is_string(e)
            && std::string_view(json_string_value(e), json_string_length(e))
               == v)
        {
            return true;
        }
    }
    return false;
}

/*
 * The path the gateway serves itself that a plugin route path lies wholly
 * under ("/v1/tasks" for "/v1/tasks/:id"), or "" when the route can be
 * reached (endpoint.cpp).
 */
std::string_view gateway_path_prefix(std::string_view route_path);

/* A path the host serves for every plugin (task.cpp): a host protocol's,
   /v1/videos and the others, or the task API's. */
bool host_task_path(std::string_view path);

/* The parsed client body of a request (request.cpp). */
const json_t *req_json(const llmgw_req_t *r);
llmgw_endpoint_e req_endpoint(const llmgw_req_t *r);

/* A quota to the nearest unit, an exact decimal half up (snapshot.cpp). */
int64_t round_quota(double q);

/* What the task engine reads from a snapshot (snapshot.cpp). */
struct SnapPluginInfo {
    std::string_view  key, version;
    const char       *sha;
};

size_t snap_plugin_count(const llmgw_snapshot_t *s);
/* The manifest of the i-th published plugin (nullptr past the end). */
const json_t *snap_plugin(const llmgw_snapshot_t *s, size_t i,
    SnapPluginInfo *info);
long snap_plugin_find(const llmgw_snapshot_t *s, std::string_view key);
/* An enabled channel by id, or nullptr. */
const llmgw_channel_t *snap_channel(const llmgw_snapshot_t *s, int64_t id,
    std::string_view *base_url, const json_t **settings);
/*
 * For polling tasks that are already running: a plugin or channel that was
 * disabled since is still found (disabling stops new submits, not the work
 * a vendor already accepted); a deleted one is not.  A plugin's number is
 * for snap_plugin().
 */
long snap_poll_plugin_find(const llmgw_snapshot_t *s, std::string_view key);
const llmgw_channel_t *snap_poll_channel(const llmgw_snapshot_t *s,
    int64_t id, std::string_view *base_url, const json_t **settings);
/* Whether a channel is bound to a plugin (type 61, 60, or a legacy type). */
int snap_channel_binds(const llmgw_snapshot_t *s, int64_t channel_id,
    std::string_view plugin_key, const json_t *manifest);
/* The channels bound to a plugin that serve a model for a group, in the
 * order they are tried (priority, then weighted random). */
size_t snap_task_channels(const llmgw_snapshot_t *s,
    std::string_view plugin_key, const json_t *manifest,
    std::string_view model, std::string_view group, uint64_t seed,
    const llmgw_channel_t **out, size_t max);
/* Whether channel id is one of those snap_task_channels would choose from
   (enabled, serving model to group, binding the plugin). */
bool snap_task_channel_serves(const llmgw_snapshot_t *s,
    std::string_view plugin_key, const json_t *manifest,
    std::string_view model, std::string_view group, int64_t id);
/* Appends the base64 of in to out (descriptor.cpp). */
void append_base64(std::string &out, std::string_view in);
/* Whether a manifest claims a host protocol for a model. */
bool snap_claims(const json_t *manifest, std::string_view protocol,
    std::string_view model);
/*
 * The plugin a host protocol's request goes to: the one bound to the channel
 * tried first among those serving the model for the group whose plugin
 * claims the protocol for it; -1 when there is none, -2 when channels of
 * the group serve the model but none through this protocol.
 */
long snap_protocol_plugin(const llmgw_snapshot_t *s,
    std::string_view protocol, std::string_view model,
    std::string_view group, uint64_t seed);
/* The /api/pricing entry of a name, or nullptr. */
const json_t *snap_price_entry(const llmgw_snapshot_t *s,
    std::string_view name);

/*
 * The members of a plugin upload or marketplace body: each one of known,
 * enabled and force booleans, remark a string (as the database checks
 * PATCH and activate).  false and a 400 verdict naming the member.
 */
bool plugin_admin_members(const json_t *root,
    std::initializer_list<const char *> known, llmgw_verdict_t *v);

/* ---- task artifacts (artifact.cpp) ---- */

/* 1-128 characters of A-Z a-z 0-9 . _ - */
bool artifact_key_ok(std::string_view key);
/* A listArtifacts result: [{key, type, mimeType?}], keys unique, at most
 * 64; false with err saying what is wrong. */
bool artifact_list_check(const json_t *list, std::string &err);
/* base + "/v1/tasks/<id>/artifacts/<key>/content", signed (expires and
 * signature) when secret is not empty. */
std::string artifact_link(std::string_view base, std::string_view secret,
    std::string_view task_id, std::string_view key, int64_t expires);

} /* namespace llmgw */

#endif /* LLMGW_INTERNAL_H */
