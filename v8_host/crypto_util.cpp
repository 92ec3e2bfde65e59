/*
 * OpenSSL-backed primitives for the plugin utilities.
 */

#include <algorithm>
#include <cctype>
#include <ctime>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "crypto_util.h"

namespace v8host {

std::string
hex(std::string_view bytes)
{
    static const char digits[] = "0123456789abcdef";
    std::string out;

    out.reserve(bytes.size() * 2);
    for (unsigned char c : bytes) {
        out.push_back(digits[c >> 4]);
        out.push_back(digits[c & 15]);
    }

    return out;
}

std::string
sha256(std::string_view data)
{
    unsigned char md[SHA256_DIGEST_LENGTH];

    SHA256(reinterpret_cast<const unsigned char *>(data.data()), data.size(),
           md);
    return std::string(reinterpret_cast<char *>(md), sizeof(md));
}

std::string
hmac_sha256(std::string_view key, std::string_view data)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;

    HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
         reinterpret_cast<const unsigned char *>(data.data()), data.size(),
         md, &len);
    return std::string(reinterpret_cast<char *>(md), len);
}

std::string
base64(std::string_view bytes)
{
    std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
    int n = EVP_EncodeBlock(reinterpret_cast<unsigned char *>(out.data()),
                            reinterpret_cast<const unsigned char *>(bytes.data()),
                            static_cast<int>(bytes.size()));
    out.resize(n < 0 ? 0 : static_cast<size_t>(n));
    return out;
}

std::string
base64url(std::string_view bytes)
{
    std::string out = base64(bytes);

    while (!out.empty() && out.back() == '=') {
        out.pop_back();
    }
    for (char &c : out) {
        c = (c == '+') ? '-' : (c == '/') ? '_' : c;
    }

    return out;
}

static int
b64url_value(char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
}

bool
base64url_decode(std::string_view text, std::string *out)
{
    size_t pad = 0;

    while (!text.empty() && text.back() == '=' && pad < 2) {
        text.remove_suffix(1);
        pad++;
    }
    if (text.size() % 4 == 1 || (pad > 0 && (text.size() + pad) % 4 != 0)) {
        return false;
    }

    out->clear();
    uint32_t acc = 0;
    int bits = 0;

    for (char c : text) {
        int v = b64url_value(c);
        if (v < 0) {
            return false;
        }
        acc = (acc << 6) | static_cast<uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out->push_back(static_cast<char>((acc >> bits) & 0xff));
        }
    }

    return true;
}

bool
utf8_valid(std::string_view s)
{
    const unsigned char *p = reinterpret_cast<const unsigned char *>(s.data());
    size_t n = s.size();

    for (size_t i = 0; i < n; ) {
        unsigned char c = p[i];
        size_t len;
        uint32_t cp;

        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; }
        else return false;

        if (i + len > n) {
            return false;
        }
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80) {
                return false;
            }
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)))
            || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        {
            return false;
        }
        i += len;
    }

    return true;
}

std::string
uuid4()
{
    unsigned char b[16];

    if (RAND_bytes(b, sizeof(b)) != 1) {
        return "";
    }
    b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
    b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);

    std::string h = hex(std::string_view(reinterpret_cast<char *>(b), 16));
    return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-"
           + h.substr(16, 4) + "-" + h.substr(20);
}

std::string
jwt_hs256(std::string_view claims_json, std::string_view secret)
{
    std::string input = base64url("{\"alg\":\"HS256\",\"typ\":\"JWT\"}") + "."
                        + base64url(claims_json);

    return input + "." + base64url(hmac_sha256(secret, input));
}

/* RFC 3986: unreserved characters stay, everything else is %XX
   (uppercase); '/' stays when keep_slash (paths). */
static std::string
uri_encode(std::string_view s, bool keep_slash)
{
    static const char digits[] = "0123456789ABCDEF";
    std::string out;

    for (unsigned char c : s) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~'
            || (keep_slash && c == '/'))
        {
            out.push_back(static_cast<char>(c));
        } else {
            out.push_back('%');
            out.push_back(digits[c >> 4]);
            out.push_back(digits[c & 15]);
        }
    }

    return out;
}

static std::string
trim(std::string_view s)
{
    size_t b = 0, e = s.size();

    while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) b++;
    while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) e--;
    return std::string(s.substr(b, e - b));
}

VolcSigned
volc_sign_v4(const VolcRequest &r)
{
    VolcSigned out;
    out.x_date = r.x_date;
    out.content_sha256 = hex(sha256(r.body));

    std::vector<std::pair<std::string, std::string>> q;
    for (const auto &kv : r.query) {
        q.emplace_back(uri_encode(kv.first, false), uri_encode(kv.second, false));
    }
    std::sort(q.begin(), q.end());

    std::string query;
    for (const auto &kv : q) {
        if (!query.empty()) {
            query += '&';
        }
        query += kv.first + "=" + kv.second;
    }

    std::string headers, signed_headers;
    if (r.has_content_type) {
        headers += "content-type:" + trim(r.content_type) + "\n";
        signed_headers += "content-type;";
    }
    headers += "host:" + trim(r.host) + "\n"
               + "x-content-sha256:" + out.content_sha256 + "\n"
               + "x-date:" + r.x_date + "\n";
    signed_headers += "host;x-content-sha256;x-date";

    std::string path = r.path.empty() ? "/" : uri_encode(r.path, true);
    std::string canonical = r.method + "\n" + path + "\n" + query + "\n"
                            + headers + "\n" + signed_headers + "\n"
                            + out.content_sha256;

    std::string date = r.x_date.substr(0, 8);
    std::string scope = date + "/" + r.region + "/" + r.service + "/request";
    std::string to_sign = "HMAC-SHA256\n" + r.x_date + "\n" + scope + "\n"
                          + hex(sha256(canonical));

    std::string k = hmac_sha256(r.secret_access_key, date);
    k = hmac_sha256(k, r.region);
    k = hmac_sha256(k, r.service);
    k = hmac_sha256(k, "request");

    out.authorization = "HMAC-SHA256 Credential=" + r.access_key_id + "/"
                        + scope + ", SignedHeaders=" + signed_headers
                        + ", Signature=" + hex(hmac_sha256(k, to_sign));
    return out;
}

std::string
x_date_now()
{
    char buf[32];
    time_t now = time(nullptr);
    struct tm tm;

    gmtime_r(&now, &tm);
    strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
    return buf;
}

bool
is_x_date(std::string_view s)
{
    if (s.size() != 16 || s[8] != 'T' || s[15] != 'Z') {
        return false;
    }
    for (size_t i = 0; i < 15; i++) {
        if (i != 8 && !std::isdigit(static_cast<unsigned char>(s[i]))) {
            return false;
        }
    }
    return true;
}

}  // namespace v8host
