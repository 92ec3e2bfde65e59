/*
 * Hashing, encoding and request signing behind the plugin utilities
 * (OpenSSL).  Plain C++ without V8, so the V8 bindings stay thin.
 */

#ifndef V8HOST_CRYPTO_UTIL_H
#define V8HOST_CRYPTO_UTIL_H

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace v8host {

std::string hex(std::string_view bytes);
std::string sha256(std::string_view data);                 /* raw 32 bytes */
std::string hmac_sha256(std::string_view key, std::string_view data);
std::string base64(std::string_view bytes);                 /* padded */
std::string base64url(std::string_view bytes);              /* no padding */

/* URL alphabet, padding optional; false on any other input. */
bool base64url_decode(std::string_view text, std::string *out);

bool utf8_valid(std::string_view s);

/* A random version 4 UUID, lowercase. */
std::string uuid4();

/* HS256 JWT over an already serialized claims object. */
std::string jwt_hs256(std::string_view claims_json, std::string_view secret);

/*
 * Volcengine V4 signing: SigV4's canonical request with algorithm
 * "HMAC-SHA256", scope <date>/<region>/<service>/request and the secret key
 * used as is for the first HMAC.  Signed headers: content-type (when
 * present), host, x-content-sha256, x-date.
 */
struct VolcRequest {
    std::string  method;
    std::string  path;
    std::vector<std::pair<std::string, std::string>>  query;
    std::string  host;
    std::string  content_type;
    bool         has_content_type = false;
    std::string  body;
    std::string  access_key_id;
    std::string  secret_access_key;
    std::string  region;
    std::string  service;
    std::string  x_date;            /* YYYYMMDDTHHMMSSZ */
};

struct VolcSigned {
    std::string  authorization;
    std::string  x_date;
    std::string  content_sha256;
};

VolcSigned volc_sign_v4(const VolcRequest &r);

/* "YYYYMMDDTHHMMSSZ" for now (UTC); is_x_date checks that shape. */
std::string x_date_now();
bool is_x_date(std::string_view s);

}  // namespace v8host

#endif
