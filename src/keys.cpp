/*
 * API keys are stored only as SHA-256 hashes, so a database leak does not
 * leak usable keys, and are compared in constant time so response timing
 * does not reveal how much of a guess was right.
 */

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <cstring>
#include <strings.h>
#include <memory>
#include <string>
#include <string_view>

#include "internal.h"

namespace {

constexpr std::string_view kKeyPrefix = "sk-";

/* 24 random bytes: 192 bits, 48 hex characters after "sk-". */
constexpr size_t kKeyRandomBytes = 24;

const char kHex[] = "0123456789abcdef";


void
hex_encode(const unsigned char *in, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = kHex[in[i] >> 4];
        out[2 * i + 1] = kHex[in[i] & 0x0f];
    }

    out[2 * n] = '\0';
}


/* Printable ASCII without space: what a header value can carry unquoted. */
bool
key_bytes_ok(std::string_view key)
{
    if (key.empty()) {
        return false;
    }

    for (unsigned char c : key) {
        if (c < 0x21 || c > 0x7e) {
            return false;
        }
    }

    return true;
}

/*
 * The digest fetched once and a context reused: the one-shot SHA256()
 * looks the digest up, and EVP_Digest() allocates a context, on every
 * call, which costs more than hashing a key.
 */
bool
sha256(std::string_view data, unsigned char digest[SHA256_DIGEST_LENGTH])
{
    static EVP_MD *md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    thread_local std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX *)> ctx(
        EVP_MD_CTX_new(), EVP_MD_CTX_free);

    return md != nullptr && ctx != nullptr
           && EVP_DigestInit_ex2(ctx.get(), md, nullptr) == 1
           && EVP_DigestUpdate(ctx.get(), data.data(), data.size()) == 1
           && EVP_DigestFinal_ex(ctx.get(), digest, nullptr) == 1;
}

} // namespace


std::string
llmgw::sha256_hex(std::string_view data)
{
    unsigned char digest[SHA256_DIGEST_LENGTH];
    char hex[2 * SHA256_DIGEST_LENGTH + 1];

    if (!sha256(data, digest)) {
        return {};
    }

    hex_encode(digest, sizeof(digest), hex);

    return hex;
}


extern "C" int
llmgw_key_hash(llmgw_str_t key, char out[65])
{
    std::string_view k = llmgw::sv(key);
    unsigned char digest[SHA256_DIGEST_LENGTH];

    /* clients send the key with or without "sk-": both must hash alike */
    if (k.substr(0, kKeyPrefix.size()) == kKeyPrefix) {
        k.remove_prefix(kKeyPrefix.size());
    }

    if (!key_bytes_ok(k) || !sha256(k, digest)) {
        return -1;
    }

    hex_encode(digest, sizeof(digest), out);

    return 0;
}


extern "C" int
llmgw_client_key_hash(llmgw_str_t key, char out[65])
{
    std::string_view k = llmgw::sv(key);

    if (k.substr(0, kKeyPrefix.size()) == kKeyPrefix) {
        k.remove_prefix(kKeyPrefix.size());
    }

    if (k.size() != 2 * kKeyRandomBytes
        || k.find_first_not_of(kHex) != std::string_view::npos)
    {
        return -1;
    }

    return llmgw_key_hash(key, out);
}


extern "C" int
llmgw_ct_equal(const void *a, const void *b, size_t n)
{
    return CRYPTO_memcmp(a, b, n) == 0;
}


extern "C" int
llmgw_key_generate(char out[52])
{
    unsigned char raw[kKeyRandomBytes];

    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        return -1;
    }

    std::memcpy(out, kKeyPrefix.data(), kKeyPrefix.size());
    hex_encode(raw, sizeof(raw), out + kKeyPrefix.size());
    OPENSSL_cleanse(raw, sizeof(raw));

    return 0;
}


namespace {

bool
starts_parameter(char c)
{
    return c == '&' || c == ';' || c == '#';
}


/*
 * Where the '=' of a parameter starting at q[at] is when its name, percent-
 * decoded, is "key" in any case; else npos.  "%6Bey" and "k%65y" name what
 * any URL parser reads as key.
 */
size_t
key_name_end(std::string_view q, size_t at)
{
    /* the longest spelling: every letter escaped, "%6B%65%79" */
    constexpr size_t kLongestName = 9;
    std::string name;
    size_t eq = at;

    while (eq < q.size() && eq - at <= kLongestName && q[eq] != '='
           && !starts_parameter(q[eq]))
    {
        eq++;
    }

    if (eq == q.size() || q[eq] != '='
        || !llmgw::percent_decode(q.substr(at, eq - at), false, false, name))
    {
        return std::string_view::npos;
    }

    return name.size() == 3 && strncasecmp(name.data(), "key", 3) == 0
           ? eq : std::string_view::npos;
}


/*
 * Calls f(from, to) for the value of every key parameter.  A value runs to
 * the next '&', as ngx_http_arg() reads it.  Besides the '&' that
 * ngx_http_arg() knows, a ';' (the old form separator) starts a parameter,
 * and so does a '#': nginx ends $args at a '#', but $request and
 * $request_uri keep what follows as the client sent it ("?alt=sse#&key=").
 * A key the gateway does not read there is a key still.
 */
template <typename F>
size_t
for_each_key_value(std::string_view q, F f)
{
    size_t n = 0;

    for (size_t at = 0; at < q.size(); ) {
        size_t eq = key_name_end(q, at);

        if (eq != std::string_view::npos) {
            size_t end = q.find('&', eq + 1);

            end = end == std::string_view::npos ? q.size() : end;

            if (end > eq + 1) {
                f(eq + 1, end);
                n++;
            }

            at = end;
            continue;
        }

        while (at < q.size() && !starts_parameter(q[at])) {
            at++;
        }

        at++;
    }

    return n;
}

} // namespace


extern "C" size_t
llmgw_query_key_count(const char *query, size_t len)
{
    return for_each_key_value(std::string_view(query, len),
                              [](size_t, size_t) {});
}


extern "C" size_t
llmgw_query_key_mask(char *query, size_t len)
{
    return for_each_key_value(std::string_view(query, len),
                              [query](size_t from, size_t to) {
                                  std::memset(query + from, '*', to - from);
                              });
}
