/*
 * Task artifacts: the lists plugins project (listArtifacts), and the host's
 * links to an artifact's content, signed with llmgw_crypto_secret so that
 * whoever holds a link may read that one artifact until it expires, without
 * the API key.  Every node that shares the secret accepts the links of the
 * others; a new secret invalidates every link issued before.
 */

#include "internal.h"
#include "inbound.h"
#include "task.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <charconv>
#include <cstring>
#include <set>

using namespace llmgw;


namespace {

constexpr size_t kMaxArtifacts = 64;
constexpr size_t kMaxKey = 128;

bool
key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

/* What a link signs: the task, the artifact and the end of its life. */
std::string
signature(std::string_view secret, std::string_view task_id,
    std::string_view key, int64_t expires)
{
    std::string msg = "llmgw-artifact-v1\n";
    msg.append(task_id).append("\n").append(key).append("\n")
       .append(std::to_string(expires));

    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int n = 0;

    if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
             reinterpret_cast<const unsigned char *>(msg.data()), msg.size(),
             mac, &n) == nullptr)
    {
        return "";
    }

    static const char hex[] = "0123456789abcdef";
    std::string out;

    for (unsigned int i = 0; i < n; i++) {
        out += hex[mac[i] >> 4];
        out += hex[mac[i] & 15];
    }
    return out;
}

/*
 * The first value of a query parameter, whole (a NUL in it ends nothing);
 * one that is absent has no data.
 */
std::string_view
query_value(const json_t *q, const char *name)
{
    const json_t *v = json_array_get(json_object_get(q, name), 0);

    return json_is_string(v)
           ? std::string_view(json_string_value(v), json_string_length(v))
           : std::string_view();
}

} /* namespace */


bool
llmgw::artifact_key_ok(std::string_view key)
{
    /* "." and ".." would be path segments nginx folds away */
    if (key.empty() || key.size() > kMaxKey || key == "." || key == "..") {
        return false;
    }
    for (char c : key) {
        if (!key_char(c)) {
            return false;
        }
    }
    return true;
}


bool
llmgw::artifact_list_check(const json_t *list, std::string &err)
{
    if (!json_is_array(list)) {
        err = "must return an array of {key, type, mimeType?}";
        return false;
    }

    if (json_array_size(list) > kMaxArtifacts) {
        err = "returned more than " + std::to_string(kMaxArtifacts)
              + " artifacts";
        return false;
    }

    std::set<std::string, std::less<>> keys;
    size_t i;
    json_t *a;

    json_array_foreach(list, i, a) {
        std::string at = "artifact " + std::to_string(i);

        if (!json_is_object(a)) {
            err = at + " is not an object";
            return false;
        }

        const char *k;
        json_t *v;
        json_object_foreach(a, k, v) {
            std::string_view name(k);
            if (name != "key" && name != "type" && name != "mimeType") {
                err = at + " has an unknown member " + std::string(
                          utf8_prefix(name, 64))
                      + " (key, type, mimeType)";
                return false;
            }
        }

        const json_t *key = json_object_get(a, "key");
        if (!json_is_string(key)
            || !artifact_key_ok(std::string_view(json_string_value(key),
                                                 json_string_length(key))))
        {
            err = at + ": key must be 1-128 characters of A-Z a-z 0-9 . _ -";
            return false;
        }

        if (!keys.emplace(json_string_value(key)).second) {
            err = at + ": key " + json_string_value(key) + " is listed twice";
            return false;
        }

        std::string_view type = json_str(a, "type");
        if (type != "video" && type != "audio" && type != "image"
            && type != "file")
        {
            err = at + ": type must be video, audio, image or file";
            return false;
        }

        const json_t *mime = json_object_get(a, "mimeType");
        if (mime != nullptr
            && (!json_is_string(mime) || json_string_length(mime) == 0
                || json_string_length(mime) > 255))
        {
            err = at + ": mimeType must be a non-empty string";
            return false;
        }
    }

    return true;
}


std::string
llmgw::artifact_link(std::string_view base, std::string_view secret,
    std::string_view task_id, std::string_view key, int64_t expires)
{
    while (!base.empty() && base.back() == '/') {
        base.remove_suffix(1);
    }

    std::string url(base);
    url.append("/v1/tasks/").append(task_id).append("/artifacts/")
       .append(key).append("/content");

    if (!secret.empty()) {
        url.append("?expires=").append(std::to_string(expires))
           .append("&signature=")
           .append(signature(secret, task_id, key, expires));
    }

    return url;
}


extern "C" int
llmgw_artifact_link_check(llmgw_str_t secret, llmgw_str_t path,
    llmgw_str_t args, int64_t now, llmgw_verdict_t *v)
{
    try {
        llmgw_buf_t qb = llmgw_query_json(args);
        Json q = json_parse(qb.data, qb.len);
        llmgw_buf_free(&qb);

        std::string_view sig = query_value(q.get(), "signature");
        std::string_view exp = query_value(q.get(), "expires");

        if (sig.data() == nullptr && exp.data() == nullptr) {
            return 1;
        }

        /* /v1/tasks/{id}/artifacts/{key}/content */
        std::string_view p = sv(path);
        std::vector<std::string_view> seg;
        size_t at = 0;

        while (at < p.size()) {
            if (p[at] == '/') {
                at++;
                continue;
            }
            size_t end = p.find('/', at);
            end = end == std::string_view::npos ? p.size() : end;
            seg.push_back(p.substr(at, end - at));
            at = end;
        }

        bool shape = seg.size() == 6 && seg[0] == "v1" && seg[1] == "tasks"
                     && seg[3] == "artifacts" && seg[5] == "content";

        /* only the digits the link was issued with: no sign, space,
           leading zero or NUL, which would be another spelling of it */
        int64_t expires = 0;
        bool number = !exp.empty() && exp[0] >= '1' && exp[0] <= '9';
        if (number) {
            auto r = std::from_chars(exp.data(), exp.data() + exp.size(),
                                     expires);
            number = r.ec == std::errc() && r.ptr == exp.data() + exp.size();
        }

        std::string want = shape && number && secret.len > 0
                           ? signature(sv(secret), seg[2], seg[4], expires)
                           : std::string();

        if (want.empty() || sig.size() != want.size()
            || CRYPTO_memcmp(sig.data(), want.data(), want.size()) != 0)
        {
            llmgw_verdict_set(v, 403, "gateway_error", "invalid_signature",
                              "the link's signature is not valid for this "
                              "artifact");
            return -1;
        }

        if (expires <= now) {
            llmgw_verdict_set(v, 403, "gateway_error", "link_expired",
                              "the link expired; list the task's artifacts "
                              "again for a new one");
            return -1;
        }

        return 0;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "out of memory");
        return -1;
    }
}
