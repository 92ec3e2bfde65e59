/*
 * Outbound HTTP descriptors (descriptor.h): a plugin's request checked
 * before anything is sent.  Sections: messages, URLs, host matching,
 * headers, file references, JSON bodies with placeholders, multipart and
 * form bodies, assembly, redirects, the C API.
 */

#include <arpa/inet.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "internal.h"
#include "descriptor.h"

using namespace llmgw;


void
llmgw::append_base64(std::string &out, std::string_view in)
{
    /* EVP_EncodeBlock takes an int length: encode in whole 3-byte groups */
    constexpr size_t kChunk = 3 * 65536;
    size_t start = out.size();

    /* one more byte for the NUL EVP_EncodeBlock writes */
    out.resize(start + 4 * ((in.size() + 2) / 3) + 1);

    auto *dst = reinterpret_cast<unsigned char *>(&out[start]);
    auto *src = reinterpret_cast<const unsigned char *>(in.data());

    for (size_t off = 0; off < in.size(); off += kChunk) {
        size_t n = std::min(kChunk, in.size() - off);
        dst += EVP_EncodeBlock(dst, src + off, static_cast<int>(n));
    }

    out.pop_back();
}

namespace {

/* A request line longer than this is not a plugin's honest URL. */
constexpr size_t kMaxUrlBytes = 16384;

/* How much of a plugin's string a message repeats. */
constexpr size_t kShownBytes = 64;


/* ---- messages ---- */

/*
 * The policy of one call and its refusal message.  Every piece of plugin
 * text that goes into a message passes shown(), which removes the channel
 * credential first: messages reach logs and, through hooks, callers.
 */
struct Ctx {
    const llmgw_desc_policy_t  &p;
    std::string_view            cred;
    std::string                 err;

    explicit Ctx(const llmgw_desc_policy_t &policy)
        : p(policy), cred(sv(policy.credential)) {}

    bool
    fail(std::string msg)
    {
        err = std::move(msg);
        return false;
    }

    std::string shown(std::string_view s) const;
};

/* Redacted, at most kShownBytes, control characters as '?'. */
std::string
Ctx::shown(std::string_view s) const
{
    std::string clean = redact(s, cred);
    std::string out(utf8_prefix(clean, kShownBytes));

    for (char &c : out) {
        unsigned char u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            c = '?';
        }
    }

    if (clean.size() > out.size()) {
        out += "...";
    }

    return out;
}

std::string
lowercase(std::string_view s)
{
    std::string out(s);

    for (char &c : out) {
        if (c >= 'A' && c <= 'Z') {
            c = static_cast<char>(c - 'A' + 'a');
        }
    }

    return out;
}

bool
iequals(std::string_view a, std::string_view b)
{
    return a.size() == b.size() && lowercase(a) == lowercase(b);
}

bool
starts_with(std::string_view s, std::string_view prefix)
{
    return s.substr(0, prefix.size()) == prefix;
}

std::string_view
jsv(const json_t *v)
{
    return std::string_view(json_string_value(v), json_string_length(v));
}


/* ---- URLs ---- */

struct Url {
    bool         tls = false;
    std::string  host;          /* lowercase, IPv6 without brackets */
    bool         ipv6 = false;
    uint16_t     port = 0;      /* explicit or the scheme's default */
    std::string  uri;           /* path + query, at least "/" */

    uint16_t default_port() const { return tls ? 443 : 80; }

    std::string
    host_header() const
    {
        std::string h = ipv6 ? "[" + host + "]" : host;

        if (port != default_port()) {
            h += ":" + std::to_string(port);
        }

        return h;
    }

    std::string
    text() const
    {
        return (tls ? "https://" : "http://") + host_header() + uri;
    }

    std::string
    path() const
    {
        return uri.substr(0, uri.find('?'));
    }
};

bool
ipv6_ok(std::string_view s)
{
    unsigned char addr[16];

    /* zone ids ("%25eth0") name an interface of this host: never wanted */
    if (s.empty() || s.size() > 45 || s.find('%') != std::string_view::npos) {
        return false;
    }

    return inet_pton(AF_INET6, std::string(s).c_str(), addr) == 1;
}

/* Dot-separated labels of letters, digits, '-' and '_' (1-63 each). */
bool
hostname_ok(std::string_view h)
{
    if (h.empty() || h.size() > 253) {
        return false;
    }

    size_t label = 0;

    for (size_t i = 0; i <= h.size(); i++) {
        if (i == h.size() || h[i] == '.') {
            if (label == 0 || label > 63) {
                return false;
            }
            label = 0;
            continue;
        }

        char c = h[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
              || (c >= '0' && c <= '9') || c == '-' || c == '_'))
        {
            return false;
        }

        label++;
    }

    return true;
}

/*
 * URL parsers that follow WHATWG read a host whose last label is a number
 * as IPv4 in decimal, octal ("0177.0.0.1") or hex ("0x7f.1"), and
 * "2130706433" or "127.1" as 127.0.0.1, where nginx's resolver reads a name
 * or other numbers: one URL, two addresses.  Only the dotted-quad form is
 * taken.
 */
bool
ipv4_form_ok(std::string_view h)
{
    size_t dot = h.rfind('.');
    std::string_view last = h.substr(dot == std::string_view::npos ? 0
                                                                   : dot + 1);
    bool hex = last.size() >= 2 && last[0] == '0'
               && (last[1] == 'x' || last[1] == 'X');
    std::string_view digits = hex ? last.substr(2) : last;

    for (char c : digits) {
        if (!(c >= '0' && c <= '9')
            && !(hex && ((c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))))
        {
            return true;
        }
    }

    unsigned char a[4];

    return inet_pton(AF_INET, std::string(h).c_str(), a) == 1;
}

bool
parse_port(std::string_view s, uint16_t &port)
{
    if (s.empty() || s.size() > 5) {
        return false;
    }

    unsigned v = 0;

    for (char c : s) {
        if (c < '0' || c > '9') {
            return false;
        }
        v = v * 10 + static_cast<unsigned>(c - '0');
    }

    if (v == 0 || v > 65535) {
        return false;
    }

    port = static_cast<uint16_t>(v);
    return true;
}

/* Splits "host", "host:port", "[v6]" or "[v6]:port"; false when malformed. */
bool
split_host_port(std::string_view s, std::string_view &host, bool &ipv6,
    std::string_view &port, bool &has_port)
{
    ipv6 = false;
    has_port = false;

    if (!s.empty() && s[0] == '[') {
        size_t close = s.find(']');

        if (close == std::string_view::npos) {
            return false;
        }

        ipv6 = true;
        host = s.substr(1, close - 1);
        s = s.substr(close + 1);

        if (s.empty()) {
            return true;
        }

        if (s[0] != ':') {
            return false;
        }

        has_port = true;
        port = s.substr(1);
        return true;
    }

    size_t colon = s.find(':');
    host = s.substr(0, colon);

    if (colon != std::string_view::npos) {
        has_port = true;
        port = s.substr(colon + 1);
    }

    return true;
}

bool
parse_authority(std::string_view auth, Url &u, Ctx &c, const char *what)
{
    std::string_view host, port;
    bool has_port;

    if (auth.find('@') != std::string_view::npos) {
        return c.fail(std::string(what)
                      + " must not contain credentials (user:pass@)");
    }

    if (!split_host_port(auth, host, u.ipv6, port, has_port)) {
        return c.fail(std::string(what) + " host is not valid");
    }

    for (char ch : host) {
        if (static_cast<unsigned char>(ch) >= 0x80) {
            return c.fail(std::string(what)
                          + " host must be ASCII (use the punycode form)");
        }
    }

    if (u.ipv6 ? !ipv6_ok(host) : !hostname_ok(host)) {
        return c.fail(std::string(what) + " host \"" + c.shown(host)
                      + "\" is not valid");
    }

    if (!u.ipv6 && !ipv4_form_ok(host)) {
        return c.fail(std::string(what) + " host \"" + c.shown(host)
                      + "\" is not valid (an IPv4 address is four decimal "
                      "numbers, a.b.c.d)");
    }

    u.host = lowercase(host);
    u.port = u.default_port();

    if (has_port && !parse_port(port, u.port)) {
        return c.fail(std::string(what) + " port \"" + c.shown(port)
                      + "\" is not valid");
    }

    return true;
}

/* Path and query as sent: bytes outside ASCII percent-encoded. */
std::string
encode_path_query(std::string_view s)
{
    static const char hex[] = "0123456789ABCDEF";
    std::string out;

    if (s.empty() || s[0] == '?') {
        out = "/";
    }

    for (char ch : s) {
        unsigned char b = static_cast<unsigned char>(ch);

        if (b >= 0x80) {
            out += '%';
            out += hex[b >> 4];
            out += hex[b & 0xf];
        } else {
            out += ch;
        }
    }

    return out;
}

/*
 * An absolute http(s) URL: ASCII host, no userinfo, no whitespace, control
 * characters or backslashes (parsers disagree about those, which is how
 * allow-lists are bypassed).  The fragment is dropped.
 */
bool
parse_url(std::string_view s, Url &u, Ctx &c, const char *what)
{
    if (s.empty()) {
        return c.fail(std::string(what) + " is empty");
    }

    if (s.size() > kMaxUrlBytes) {
        return c.fail(std::string(what) + " is longer than "
                      + std::to_string(kMaxUrlBytes) + " bytes");
    }

    for (char ch : s) {
        unsigned char b = static_cast<unsigned char>(ch);

        if (b <= 0x20 || b == 0x7f) {
            return c.fail(std::string(what) + " must not contain whitespace "
                          "or control characters");
        }

        if (ch == '\\') {
            return c.fail(std::string(what)
                          + " must not contain backslashes");
        }
    }

    size_t sep = s.find("://");
    std::string scheme = sep == std::string_view::npos
                         ? "" : lowercase(s.substr(0, sep));

    if (scheme != "http" && scheme != "https") {
        return c.fail(std::string(what) + " must be an absolute http(s) URL");
    }

    u.tls = scheme == "https";

    std::string_view rest = s.substr(sep + 3);
    size_t end = rest.find_first_of("/?#");

    if (end == std::string_view::npos) {
        end = rest.size();
    }

    if (!parse_authority(rest.substr(0, end), u, c, what)) {
        return false;
    }

    std::string_view tail = rest.substr(end);
    u.uri = encode_path_query(tail.substr(0, tail.find('#')));
    return true;
}


/* ---- host matching ---- */

bool
same_host(const std::string &a, bool a6, std::string_view b, bool b6)
{
    if (a6 != b6) {
        return false;
    }

    if (!a6) {
        return iequals(a, b);
    }

    /* "::1" and "0:0::1" are one address */
    unsigned char x[16], y[16];

    return ipv6_ok(a) && ipv6_ok(b)
           && inet_pton(AF_INET6, a.c_str(), x) == 1
           && inet_pton(AF_INET6, std::string(b).c_str(), y) == 1
           && std::memcmp(x, y, sizeof(x)) == 0;
}

/* Scheme, host and port of the channel's base URL. */
bool
is_channel_host(const Url &u, Ctx &c)
{
    Ctx quiet(c.p);
    Url ch;

    if (c.p.base_url.len == 0
        || !parse_url(sv(c.p.base_url), ch, quiet, "base url"))
    {
        return false;
    }

    return ch.tls == u.tls && ch.port == u.port
           && same_host(u.host, u.ipv6, ch.host, ch.ipv6);
}

/*
 * allowedHosts (contract facts): "h" matches h on the scheme's default
 * port; "h:p" matches h on port p only, which includes a URL that omits
 * the port when p is that scheme's default.
 */
bool
entry_matches(std::string_view entry, const Url &u)
{
    std::string_view host, port;
    bool ipv6, has_port;
    uint16_t want = u.default_port();

    if (!split_host_port(entry, host, ipv6, port, has_port)
        || (has_port && !parse_port(port, want)))
    {
        return false;
    }

    return u.port == want && same_host(u.host, u.ipv6, host, ipv6);
}

bool
is_allowed_host(const Url &u, const llmgw_desc_policy_t &p)
{
    for (size_t i = 0; i < p.nallowed; i++) {
        if (entry_matches(sv(p.allowed_hosts[i]), u)) {
            return true;
        }
    }

    return false;
}

/* The credential as is or percent-encoded anywhere in s. */
bool
carries_credential(std::string_view s, const Ctx &c)
{
    if (c.cred.size() < kCredentialMinBytes) {
        return false;
    }

    std::string decoded;

    return s.find(c.cred) != std::string_view::npos
           || (percent_decode(s, false, false, decoded)
               && decoded.find(c.cred) != std::string::npos);
}

/* A request that may carry credentials goes to the channel or allowedHosts. */
bool
check_host(const Url &u, Ctx &c, const char *what)
{
    if (is_channel_host(u, c) || is_allowed_host(u, c.p)) {
        return true;
    }

    return c.fail(std::string(what) + " host " + c.shown(u.host_header())
                  + " is neither the channel host nor in allowedHosts");
}


/* ---- headers ---- */

struct Header {
    std::string  name;
    std::string  value;
};

using Headers = std::vector<Header>;

bool
is_tchar(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')
           || (ch >= '0' && ch <= '9')
           || std::strchr("!#$%&'*+-.^_`|~", ch) != nullptr;
}

bool
is_token(std::string_view s)
{
    if (s.empty()) {
        return false;
    }

    for (char ch : s) {
        if (ch == '\0' || !is_tchar(ch)) {
            return false;
        }
    }

    return true;
}

/* Framing and hop-by-hop headers belong to the host's HTTP client. */
bool
is_host_header(std::string_view name)
{
    static const char *const names[] = {
        "host", "content-length", "transfer-encoding", "connection",
        "upgrade", "te", "trailer", "keep-alive",
    };
    std::string l = lowercase(name);

    for (const char *n : names) {
        if (l == n) {
            return true;
        }
    }

    return starts_with(l, "proxy-");
}

/* HTAB is the only control character a field value may hold. */
bool
value_ok(std::string_view v)
{
    for (char ch : v) {
        unsigned char b = static_cast<unsigned char>(ch);

        if ((b < 0x20 && ch != '\t') || b == 0x7f) {
            return false;
        }
    }

    return true;
}

bool
add_header(Headers &h, std::string_view name, const json_t *v, Ctx &c)
{
    if (!json_is_string(v)) {
        return c.fail("headers." + c.shown(name)
                      + " must be a string or an array of strings");
    }

    if (!value_ok(jsv(v))) {
        /* the value itself may be a secret: never repeated */
        return c.fail("headers." + c.shown(name)
                      + " value must not contain CR, LF, NUL or other "
                        "control characters");
    }

    h.push_back(Header { std::string(name), std::string(jsv(v)) });
    return true;
}

bool
parse_headers(const json_t *obj, Headers &h, Ctx &c)
{
    if (obj == nullptr || json_is_null(obj)) {
        return true;
    }

    if (!json_is_object(obj)) {
        return c.fail("headers must be an object of strings");
    }

    const char *key;
    size_t klen;
    json_t *v;

    json_object_keylen_foreach(const_cast<json_t *>(obj), key, klen, v) {
        std::string_view name(key, klen);

        if (!is_token(name)) {
            return c.fail("headers: \"" + c.shown(name)
                          + "\" is not a valid header name");
        }

        if (is_host_header(name)) {
            return c.fail("headers: " + c.shown(name)
                          + " is set by the host and may not be sent by a "
                            "plugin");
        }

        if (!json_is_array(v)) {
            if (!add_header(h, name, v, c)) {
                return false;
            }
            continue;
        }

        size_t i;
        json_t *item;

        json_array_foreach(v, i, item) {
            if (!add_header(h, name, item, c)) {
                return false;
            }
        }
    }

    return true;
}

bool
has_header(const Headers &h, std::string_view name)
{
    for (const Header &x : h) {
        if (iequals(x.name, name)) {
            return true;
        }
    }

    return false;
}

void
drop_header(Headers &h, std::string_view name)
{
    Headers keep;

    for (Header &x : h) {
        if (!iequals(x.name, name)) {
            keep.push_back(std::move(x));
        }
    }

    h.swap(keep);
}

std::string
render_headers(const Headers &h)
{
    std::string out;

    for (const Header &x : h) {
        out += x.name + ": " + x.value + "\r\n";
    }

    return out;
}

/* The lines render_headers() made, back into a list (for redirects). */
Headers
parse_header_lines(const llmgw_buf_t &b)
{
    Headers h;
    std::string_view s(b.data ? b.data : "", b.len);

    while (!s.empty()) {
        size_t eol = s.find("\r\n");
        std::string_view line = s.substr(0, eol);
        size_t colon = line.find(':');

        if (colon != std::string_view::npos) {
            std::string_view v = line.substr(colon + 1);
            if (!v.empty() && v[0] == ' ') {
                v.remove_prefix(1);
            }
            h.push_back(Header { std::string(line.substr(0, colon)),
                                 std::string(v) });
        }

        s = eol == std::string_view::npos ? "" : s.substr(eol + 2);
    }

    return h;
}


/* ---- file references ---- */

/*
 * Resolves refs to the request's files and counts every inlined or
 * attached byte, so one file referenced twice counts twice.
 */
class FileBudget {
public:
    explicit FileBudget(const llmgw_desc_policy_t &p)
        : p_(p),
          max_file_(p.max_file_bytes ? p.max_file_bytes
                                     : LLMGW_DESC_DEFAULT_FILE_BYTES),
          max_total_(p.max_total_bytes ? p.max_total_bytes
                                       : LLMGW_DESC_DEFAULT_FILE_BYTES) {}

    /* The file, or nullptr and c.err; limit 0: no placeholder limit. */
    const llmgw_file_t *take(std::string_view ref, size_t limit, Ctx &c);

private:
    const llmgw_desc_policy_t  &p_;
    size_t                      max_file_;
    size_t                      max_total_;
    size_t                      total_ = 0;
};

const llmgw_file_t *
FileBudget::take(std::string_view ref, size_t limit, Ctx &c)
{
    const llmgw_file_t *f = nullptr;

    for (size_t i = 0; i < p_.nfiles && f == nullptr; i++) {
        if (p_.files[i].ref != nullptr && ref == p_.files[i].ref) {
            f = &p_.files[i];
        }
    }

    std::string name = c.shown(ref);

    if (f == nullptr) {
        c.fail("unknown file reference \"" + name + "\"");
        return nullptr;
    }

    if (limit > 0 && f->len > limit) {
        c.fail("file " + name + " is " + std::to_string(f->len)
               + " bytes, more than its maxBytes " + std::to_string(limit));
        return nullptr;
    }

    if (f->len > max_file_) {
        c.fail("file " + name + " is " + std::to_string(f->len)
               + " bytes, more than the per-file limit of "
               + std::to_string(max_file_) + " bytes");
        return nullptr;
    }

    if (f->len > max_total_ - total_) {
        c.fail("files of this request exceed the total limit of "
               + std::to_string(max_total_) + " bytes (at " + name + ")");
        return nullptr;
    }

    total_ += f->len;
    return f;
}

std::string_view
file_bytes(const llmgw_file_t *f)
{
    return std::string_view(reinterpret_cast<const char *>(f->data),
                            f->data ? f->len : 0);
}

std::string_view
or_default(const char *s, std::string_view dflt)
{
    return s != nullptr && *s != '\0' ? std::string_view(s) : dflt;
}



/* ---- JSON bodies with file placeholders ---- */

bool write_json(const json_t *v, std::string &out, FileBudget &files,
    Ctx &c);

/* Shortest form that reads back as the same double (as JavaScript does). */
void
append_real(std::string &out, double d)
{
    char buf[32];

    for (int prec = 1; prec <= 17; prec++) {
        std::snprintf(buf, sizeof(buf), "%.*g", prec, d);
        if (std::strtod(buf, nullptr) == d) {
            break;
        }
    }

    out += buf;
}

/*
 * {"__fileRef": ref, "encoding": "base64"|"dataUrl", "mimeType"?,
 * "maxBytes"?} becomes the file's base64 text or a data: URL.
 */
bool
write_placeholder(const json_t *obj, std::string &out, FileBudget &files,
    Ctx &c)
{
    const char *key;
    size_t klen;
    json_t *v;

    json_object_keylen_foreach(const_cast<json_t *>(obj), key, klen, v) {
        std::string_view k(key, klen);

        if (k != "__fileRef" && k != "encoding" && k != "mimeType"
            && k != "maxBytes")
        {
            return c.fail("file placeholder: member \"" + c.shown(k)
                          + "\" is not allowed (only __fileRef, encoding, "
                            "mimeType, maxBytes)");
        }
    }

    const json_t *ref = json_object_get(obj, "__fileRef");
    const json_t *enc = json_object_get(obj, "encoding");
    const json_t *mime = json_object_get(obj, "mimeType");
    const json_t *max = json_object_get(obj, "maxBytes");

    if (!json_is_string(ref)) {
        return c.fail("file placeholder: __fileRef must be a string");
    }

    std::string where = "file placeholder " + c.shown(jsv(ref));

    if (!json_is_string(enc)
        || (jsv(enc) != "base64" && jsv(enc) != "dataUrl"))
    {
        return c.fail(where + ": encoding must be \"base64\" or \"dataUrl\"");
    }

    if (mime != nullptr && !json_is_string(mime)) {
        return c.fail(where + ": mimeType must be a string");
    }

    if (max != nullptr
        && (!json_is_integer(max) || json_integer_value(max) <= 0))
    {
        return c.fail(where + ": maxBytes must be a positive integer");
    }

    const llmgw_file_t *f = files.take(
        jsv(ref), max ? static_cast<size_t>(json_integer_value(max)) : 0, c);

    if (f == nullptr) {
        return false;
    }

    std::string open;

    if (jsv(enc) == "dataUrl") {
        std::string_view type = mime ? jsv(mime) : std::string_view();

        if (type.empty()) {
            type = or_default(f->mime, "application/octet-stream");
        }

        append_json_string(open, "data:" + std::string(type) + ";base64,");
    } else {
        append_json_string(open, "");
    }

    open.pop_back();            /* the string stays open for the payload */
    out += open;
    append_base64(out, file_bytes(f));
    out += '"';
    return true;
}

bool
write_object(const json_t *obj, std::string &out, FileBudget &files, Ctx &c)
{
    if (json_object_get(obj, "__fileRef") != nullptr) {
        return write_placeholder(obj, out, files, c);
    }

    const char *key;
    size_t klen;
    json_t *v;
    bool first = true;

    out += '{';

    json_object_keylen_foreach(const_cast<json_t *>(obj), key, klen, v) {
        if (!first) {
            out += ',';
        }
        first = false;

        append_json_string(out, std::string_view(key, klen));
        out += ':';

        if (!write_json(v, out, files, c)) {
            return false;
        }
    }

    out += '}';
    return true;
}

/* Compact JSON of v with every placeholder replaced. */
bool
write_json(const json_t *v, std::string &out, FileBudget &files, Ctx &c)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return write_object(v, out, files, c);

    case JSON_ARRAY: {
        size_t i;
        json_t *item;

        out += '[';

        json_array_foreach(v, i, item) {
            if (i > 0) {
                out += ',';
            }
            if (!write_json(item, out, files, c)) {
                return false;
            }
        }

        out += ']';
        return true;
    }

    case JSON_STRING:
        append_json_string(out, jsv(v));
        return true;

    case JSON_INTEGER:
        out += std::to_string(json_integer_value(v));
        return true;

    case JSON_REAL:
        append_real(out, json_real_value(v));
        return true;

    case JSON_TRUE:
        out += "true";
        return true;

    case JSON_FALSE:
        out += "false";
        return true;

    default:
        out += "null";
        return true;
    }
}


/* ---- multipart (RFC 7578) and form bodies ---- */

struct Part {
    std::string       name;
    bool              has_filename = false;
    std::string       filename;
    std::string       type;         /* "" : no Content-Type line */
    std::string_view  data;         /* into the descriptor or a file */
};

bool
optional_string(const json_t *part, const char *key, std::string &out,
    bool &present, const std::string &where, Ctx &c)
{
    const json_t *v = json_object_get(part, key);

    present = v != nullptr && !json_is_null(v);

    if (!present) {
        return true;
    }

    if (!json_is_string(v)) {
        return c.fail(where + "." + key + " must be a string");
    }

    out = std::string(jsv(v));
    return true;
}

/* {name, value} or {name, fileRef, filename?, contentType?}. */
bool
read_part(const json_t *item, size_t i, FileBudget &files, Part &part,
    Ctx &c)
{
    std::string where = "parts[" + std::to_string(i) + "]";

    if (!json_is_object(item)) {
        return c.fail(where + " must be an object");
    }

    const json_t *name = json_object_get(item, "name");
    const json_t *value = json_object_get(item, "value");
    const json_t *ref = json_object_get(item, "fileRef");
    bool has_type;

    if (!json_is_string(name) || json_string_length(name) == 0) {
        return c.fail(where + ".name must be a non-empty string");
    }

    if ((value != nullptr) == (ref != nullptr)) {
        return c.fail(where + " needs exactly one of value and fileRef");
    }

    part.name = std::string(jsv(name));

    if (!optional_string(item, "filename", part.filename, part.has_filename,
                         where, c)
        || !optional_string(item, "contentType", part.type, has_type, where,
                            c))
    {
        return false;
    }

    if (has_type && !value_ok(part.type)) {
        return c.fail(where + ".contentType must not contain control "
                              "characters");
    }

    if (value != nullptr) {
        if (!json_is_string(value)) {
            return c.fail(where + ".value must be a string");
        }
        part.data = jsv(value);
        return true;
    }

    if (!json_is_string(ref)) {
        return c.fail(where + ".fileRef must be a string");
    }

    const llmgw_file_t *f = files.take(jsv(ref), 0, c);

    if (f == nullptr) {
        return false;
    }

    part.data = file_bytes(f);

    if (!part.has_filename) {
        part.has_filename = true;
        /* the name browsers give a nameless Blob */
        part.filename = std::string(or_default(f->filename, "blob"));
    }

    /* the client named this type: it must not open a header line */
    if (!has_type) {
        part.type = std::string(or_default(f->mime, ""));
        if (part.type.empty() || !value_ok(part.type)) {
            part.type = "application/octet-stream";
        }
    }

    return true;
}

bool
read_parts(const json_t *arr, FileBudget &files, std::vector<Part> &parts,
    Ctx &c)
{
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        return c.fail("parts must be a non-empty array");
    }

    size_t i;
    json_t *item;

    json_array_foreach(arr, i, item) {
        parts.emplace_back();

        if (!read_part(item, i, files, parts.back(), c)) {
            return false;
        }
    }

    return true;
}

/*
 * A quoted-string of Content-Disposition, escaped as HTML forms do ('"'
 * as %22, CR as %0D, LF as %0A); other control bytes too, since a client's
 * filename reaches this line.
 */
std::string
disposition_quote(std::string_view s)
{
    static const char hex[] = "0123456789ABCDEF";
    std::string out = "\"";

    for (char ch : s) {
        unsigned char b = static_cast<unsigned char>(ch);

        if (ch == '"' || b < 0x20 || b == 0x7f) {
            out += '%';
            out += hex[b >> 4];
            out += hex[b & 0xf];
        } else {
            out += ch;
        }
    }

    return out + "\"";
}

/* A random boundary that occurs in no part. */
bool
pick_boundary(const std::vector<Part> &parts, std::string &boundary, Ctx &c)
{
    static const char hex[] = "0123456789abcdef";

    for (int attempt = 0; attempt < 4; attempt++) {
        unsigned char raw[16];

        if (RAND_bytes(raw, sizeof(raw)) != 1) {
            return c.fail("no randomness for a multipart boundary");
        }

        boundary = "----llmgw";
        for (unsigned char b : raw) {
            boundary += hex[b >> 4];
            boundary += hex[b & 0xf];
        }

        bool clash = false;
        for (const Part &part : parts) {
            clash = clash || part.data.find(boundary) != std::string::npos;
        }

        if (!clash) {
            return true;
        }
    }

    return c.fail("no multipart boundary found that the parts do not "
                  "contain");
}

std::string
render_multipart(const std::vector<Part> &parts, const std::string &boundary)
{
    size_t size = 0;

    for (const Part &part : parts) {
        size += part.data.size() + 256;
    }

    std::string out;
    out.reserve(size);

    for (const Part &part : parts) {
        out += "--" + boundary + "\r\n"
               "Content-Disposition: form-data; name="
               + disposition_quote(part.name);

        if (part.has_filename) {
            out += "; filename=" + disposition_quote(part.filename);
        }

        out += "\r\n";

        if (!part.type.empty()) {
            out += "Content-Type: " + part.type + "\r\n";
        }

        out += "\r\n";
        out += part.data;
        out += "\r\n";
    }

    out += "--" + boundary + "--\r\n";
    return out;
}

void
append_form_encoded(std::string &out, std::string_view s)
{
    static const char hex[] = "0123456789ABCDEF";

    for (char ch : s) {
        unsigned char b = static_cast<unsigned char>(ch);

        if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')
            || (b >= '0' && b <= '9') || std::strchr("*-._", ch) != nullptr)
        {
            out += ch;
        } else if (ch == ' ') {
            out += '+';
        } else {
            out += '%';
            out += hex[b >> 4];
            out += hex[b & 0xf];
        }
    }
}

void
append_form_pair(std::string &out, std::string_view k, std::string_view v)
{
    if (!out.empty()) {
        out += '&';
    }

    append_form_encoded(out, k);
    out += '=';
    append_form_encoded(out, v);
}

/* An object of strings (or arrays of strings, repeated) -> urlencoded. */
bool
write_form(const json_t *obj, std::string &out, Ctx &c)
{
    if (!json_is_object(obj)) {
        return c.fail("bodyType form needs body as an object of strings");
    }

    const char *key;
    size_t klen;
    json_t *v;

    json_object_keylen_foreach(const_cast<json_t *>(obj), key, klen, v) {
        std::string_view k(key, klen);

        if (json_is_string(v)) {
            append_form_pair(out, k, jsv(v));
            continue;
        }

        size_t i;
        json_t *item;
        bool ok = json_is_array(v);

        json_array_foreach(v, i, item) {
            ok = ok && json_is_string(item);
            if (ok) {
                append_form_pair(out, k, jsv(item));
            }
        }

        if (!ok) {
            return c.fail("body." + c.shown(k) + " must be a string or an "
                          "array of strings (bodyType form)");
        }
    }

    return true;
}


/* ---- the descriptor ---- */

struct Options {
    bool         credentialless = false;
    bool         sse = false;
    std::string  method;            /* uppercase; "" when not given */
    std::string  body_type = "json";
    bool         has_body = false;
};

bool
method_ok(std::string_view m)
{
    static const char *const methods[] = {
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS",
    };

    for (const char *x : methods) {
        if (m == x) {
            return true;
        }
    }

    return false;
}

bool
read_method(const json_t *d, Options &o, Ctx &c)
{
    const json_t *v = json_object_get(d, "method");

    if (v == nullptr || json_is_null(v)) {
        return true;
    }

    std::string m = json_is_string(v) ? std::string(jsv(v)) : "";

    for (char &ch : m) {
        if (ch >= 'a' && ch <= 'z') {
            ch = static_cast<char>(ch - 'a' + 'A');
        }
    }

    if (!method_ok(m)) {
        return c.fail("method \"" + c.shown(json_is_string(v) ? jsv(v) : "")
                      + "\" is not allowed (GET, HEAD, POST, PUT, PATCH, "
                        "DELETE, OPTIONS)");
    }

    o.method = m;
    return true;
}

bool
read_flags(const json_t *d, Options &o, Ctx &c)
{
    const json_t *cl = json_object_get(d, "credentialless");
    const json_t *rt = json_object_get(d, "responseType");

    if (cl != nullptr && !json_is_null(cl) && !json_is_boolean(cl)) {
        return c.fail("credentialless must be a boolean");
    }

    o.credentialless = json_is_true(cl);

    if (o.credentialless && !c.p.allow_credentialless) {
        return c.fail("credentialless is allowed only in content requests");
    }

    if (rt == nullptr || json_is_null(rt)) {
        return true;
    }

    if (!json_is_string(rt)
        || (jsv(rt) != "json" && jsv(rt) != "sse"))
    {
        return c.fail("responseType must be \"json\" or \"sse\"");
    }

    o.sse = jsv(rt) == "sse";

    if (o.sse && !c.p.allow_sse) {
        return c.fail("responseType \"sse\" is not allowed here (the plugin "
                      "must declare sse in submitResponseTypes; only submit "
                      "requests may stream)");
    }

    return true;
}

/* bodyType and which of body / parts carries the body. */
bool
read_body_shape(const json_t *d, Options &o, Ctx &c)
{
    const json_t *bt = json_object_get(d, "bodyType");
    const json_t *body = json_object_get(d, "body");
    const json_t *parts = json_object_get(d, "parts");
    bool has_body = body != nullptr && !json_is_null(body);
    bool has_parts = parts != nullptr && !json_is_null(parts);

    if (bt != nullptr && !json_is_null(bt)) {
        std::string_view t = json_is_string(bt) ? jsv(bt) : "";

        if (t != "json" && t != "multipart" && t != "form" && t != "text"
            && t != "raw")
        {
            return c.fail("bodyType \"" + c.shown(t) + "\" is not supported "
                          "(json, multipart, form, text, raw)");
        }

        o.body_type = std::string(t);
    }

    if (o.body_type == "multipart") {
        if (has_body) {
            return c.fail("bodyType multipart takes parts, not body");
        }
        if (!has_parts) {
            return c.fail("bodyType multipart needs parts");
        }
        o.has_body = has_parts;
        return true;
    }

    if (has_parts) {
        return c.fail("parts is used only with bodyType \"multipart\"");
    }

    o.has_body = has_body;
    return true;
}

/* Spec: credentialless is GET/HEAD with no plugin headers and no body. */
bool
check_credentialless(const json_t *d, const Url &u, const Options &o, Ctx &c)
{
    const json_t *h = json_object_get(d, "headers");

    if (o.method != "GET" && o.method != "HEAD") {
        return c.fail("credentialless requests must use GET or HEAD");
    }

    if (h != nullptr && !json_is_null(h)
        && !(json_is_object(h) && json_object_size(h) == 0))
    {
        return c.fail("credentialless requests may not carry plugin "
                      "headers");
    }

    if (o.has_body) {
        return c.fail("credentialless requests may not carry a body");
    }

    if (carries_credential(u.text(), c)) {
        return c.fail("credentialless url contains the channel credential");
    }

    return true;
}

/* The body as bytes, and the Content-Type it implies. */
bool
build_body(const json_t *d, const Options &o, Headers &h, std::string &body,
    Ctx &c)
{
    const json_t *v = json_object_get(d, "body");
    FileBudget files(c.p);
    std::string type;

    if (o.body_type == "multipart") {
        std::vector<Part> parts;
        std::string boundary;

        if (!read_parts(json_object_get(d, "parts"), files, parts, c)
            || !pick_boundary(parts, boundary, c))
        {
            return false;
        }

        body = render_multipart(parts, boundary);
        /* the boundary is ours: a plugin's Content-Type cannot name it */
        drop_header(h, "content-type");
        type = "multipart/form-data; boundary=" + boundary;

    } else if (o.body_type == "form") {
        if (!write_form(v, body, c)) {
            return false;
        }
        type = "application/x-www-form-urlencoded";

    } else if (o.body_type == "text" || o.body_type == "raw") {
        if (!json_is_string(v)) {
            return c.fail("bodyType " + o.body_type
                          + " needs body as a string");
        }
        body = std::string(jsv(v));
        type = o.body_type == "text" ? "text/plain; charset=utf-8"
                                     : "application/octet-stream";

    } else {
        if (!write_json(v, body, files, c)) {
            return false;
        }
        type = "application/json";
    }

    if (!has_header(h, "content-type")) {
        h.push_back(Header { "Content-Type", type });
    }

    return true;
}

char *
dup_cstr(const std::string &s)
{
    char *p = static_cast<char *>(std::malloc(s.size() + 1));

    if (p == nullptr) {
        throw std::bad_alloc();
    }

    std::memcpy(p, s.c_str(), s.size() + 1);
    return p;
}

llmgw_buf_t
dup_buf(std::string_view s)
{
    llmgw_buf_t b = make_buf(s);

    if (b.data == nullptr) {
        throw std::bad_alloc();
    }

    return b;
}

/* body nullptr: no body (a present empty body is still sent as one). */
void
fill_outbound(const Url &u, const std::string &method, const Headers &h,
    const std::string_view *body, bool sse, bool credentialless,
    llmgw_outbound_t *out, Ctx &c)
{
    std::snprintf(out->method, sizeof(out->method), "%s", method.c_str());
    out->tls = u.tls;
    out->port = u.port;
    out->sse = sse;
    out->credentialless = credentialless;
    /* the channel's base URL is the operator's choice, private or not */
    out->public_only = credentialless && !is_channel_host(u, c);
    out->host = dup_cstr(u.host);
    out->host_header = dup_cstr(u.host_header());
    out->uri = dup_cstr(u.uri);
    out->url = dup_buf(u.text());
    out->headers = dup_buf(render_headers(h));

    if (body != nullptr) {
        out->body = dup_buf(*body);
    }
}

bool
build(std::string_view json, llmgw_outbound_t *out, Ctx &c)
{
    Json root = json_parse(json.data(), json.size());
    const json_t *d = root.get();

    if (!json_is_object(d)) {
        return c.fail("must be a JSON object");
    }

    const json_t *url = json_object_get(d, "url");
    Url u;
    Options o;

    if (!json_is_string(url)) {
        return c.fail("url is required (an absolute http(s) URL)");
    }

    if (!parse_url(jsv(url), u, c, "url")
        || !read_flags(d, o, c)
        || !read_method(d, o, c)
        || !read_body_shape(d, o, c))
    {
        return false;
    }

    if (o.method.empty()) {
        o.method = o.has_body ? "POST" : "GET";
    }

    if (o.credentialless ? !check_credentialless(d, u, o, c)
                         : !check_host(u, c, "url"))
    {
        return false;
    }

    if (o.has_body && (o.method == "GET" || o.method == "HEAD")) {
        return c.fail("method " + o.method + " may not carry a body");
    }

    Headers h;
    std::string body;

    if (!parse_headers(json_object_get(d, "headers"), h, c)
        || (o.has_body && !build_body(d, o, h, body, c)))
    {
        return false;
    }

    std::string_view b(body);
    fill_outbound(u, o.method, h, o.has_body ? &b : nullptr, o.sse,
                  o.credentialless, out, c);
    return true;
}


/* ---- redirects ---- */

/* RFC 3986 5.2.4: "." and ".." segments resolved. */
std::string
remove_dot_segments(std::string in)
{
    std::string out;

    auto drop_last = [&out]() {
        size_t slash = out.rfind('/');
        out.erase(slash == std::string::npos ? 0 : slash);
    };

    while (!in.empty()) {
        if (starts_with(in, "../")) {
            in.erase(0, 3);
        } else if (starts_with(in, "./")) {
            in.erase(0, 2);
        } else if (starts_with(in, "/./")) {
            in.erase(0, 2);
        } else if (in == "/.") {
            in = "/";
        } else if (starts_with(in, "/../")) {
            in.erase(0, 3);
            drop_last();
        } else if (in == "/..") {
            in = "/";
            drop_last();
        } else if (in == "." || in == "..") {
            in.clear();
        } else {
            size_t next = in.find('/', 1);
            out += in.substr(0, next);
            in.erase(0, next == std::string::npos ? in.size() : next);
        }
    }

    return out;
}

bool
has_scheme(std::string_view s)
{
    size_t colon = s.find(':');

    if (colon == std::string_view::npos || colon == 0
        || s.find_first_of("/?#") < colon)
    {
        return false;
    }

    return (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z');
}

/* The absolute URL of a Location value relative to base (RFC 3986 5.2). */
std::string
resolve_location(const Url &base, std::string_view ref)
{
    if (has_scheme(ref)) {
        return std::string(ref);
    }

    std::string scheme = base.tls ? "https:" : "http:";

    if (starts_with(ref, "//")) {
        return scheme + std::string(ref);
    }

    std::string origin = scheme + "//" + base.host_header();

    if (ref.empty() || ref[0] == '#') {
        return base.text();
    }

    if (ref[0] == '?') {
        return origin + base.path() + std::string(ref);
    }

    size_t q = ref.find_first_of("?#");
    std::string path(ref.substr(0, q));
    std::string rest(q == std::string_view::npos ? "" : ref.substr(q));

    if (path[0] != '/') {
        std::string dir = base.path();
        path = dir.substr(0, dir.rfind('/') + 1) + path;
    }

    return origin + remove_dot_segments(path) + rest;
}

bool
same_origin(const Url &a, const Url &b)
{
    return a.tls == b.tls && a.port == b.port
           && same_host(a.host, a.ipv6, b.host, b.ipv6);
}

/*
 * Fetch's rule: credentials are for the origin the plugin addressed; a
 * signed CDN URL also refuses a second Authorization.
 */
void
drop_credentials(Headers &h, const Ctx &c)
{
    Headers keep;

    for (Header &x : h) {
        if (!iequals(x.name, "authorization") && !iequals(x.name, "cookie")
            && !carries_credential(x.value, c))
        {
            keep.push_back(std::move(x));
        }
    }

    h.swap(keep);
}

bool
redirect(const llmgw_outbound_t &cur, int status, std::string_view location,
    llmgw_outbound_t *next, Ctx &c)
{
    if (status != 301 && status != 302 && status != 303 && status != 307
        && status != 308)
    {
        return c.fail("status " + std::to_string(status)
                      + " is not a redirect");
    }

    Url base, u;

    if (!parse_url(std::string_view(cur.url.data ? cur.url.data : "",
                                    cur.url.len), base, c, "current url"))
    {
        return false;
    }

    while (!location.empty()
           && (location.front() == ' ' || location.front() == '\t'))
    {
        location.remove_prefix(1);
    }
    while (!location.empty()
           && (location.back() == ' ' || location.back() == '\t'))
    {
        location.remove_suffix(1);
    }

    if (location.empty()) {
        return c.fail("redirect without a Location");
    }

    if (!parse_url(resolve_location(base, location), u, c,
                   "redirect location"))
    {
        return false;
    }

    if (cur.credentialless) {
        if (carries_credential(u.text(), c)) {
            return c.fail("redirect location contains the channel "
                          "credential");
        }
    } else if (!check_host(u, c, "redirect")) {
        return false;
    }

    std::string method = cur.method;
    bool keep_body = cur.body.data != nullptr;
    Headers h = parse_header_lines(cur.headers);

    /* RFC 9110 15.4: 303, and 301/302 after POST in practice, become GET */
    if ((status == 303 && method != "HEAD")
        || ((status == 301 || status == 302) && method != "GET"
            && method != "HEAD"))
    {
        method = "GET";
        keep_body = false;
        for (const char *n : { "content-type", "content-encoding",
                               "content-language", "content-location" })
        {
            drop_header(h, n);
        }
    }

    if (!same_origin(base, u)) {
        drop_credentials(h, c);
    }

    std::string_view body(cur.body.data ? cur.body.data : "", cur.body.len);
    fill_outbound(u, method, h, keep_body ? &body : nullptr, cur.sse,
                  cur.credentialless, next, c);
    return true;
}


/* ---- C API helpers ---- */

void
set_err(char *err, size_t errlen, const Ctx &c)
{
    if (err != nullptr && errlen > 0) {
        std::snprintf(err, errlen, "descriptor: %s",
                      redact(c.err, c.cred).c_str());
    }
}

template <typename F>
int
guarded(llmgw_outbound_t *out, Ctx &c, char *err, size_t errlen, F f)
{
    bool ok = false;

    try {
        ok = f();
    } catch (const std::bad_alloc &) {
        c.err = "out of memory";
    } catch (...) {
        c.err = "internal error";
    }

    if (ok) {
        return 0;
    }

    llmgw_outbound_free(out);
    set_err(err, errlen, c);
    return -1;
}

const llmgw_desc_policy_t kNoPolicy {};

} /* namespace */


extern "C" int
llmgw_descriptor_build(const char *json, size_t len,
    const llmgw_desc_policy_t *p, llmgw_outbound_t *out, char *err,
    size_t errlen)
{
    Ctx c(p ? *p : kNoPolicy);

    if (out == nullptr) {
        return -1;
    }

    std::memset(out, 0, sizeof(*out));

    return guarded(out, c, err, errlen, [&]() {
        if (json == nullptr || p == nullptr) {
            return c.fail("no descriptor");
        }
        return build(std::string_view(json, len), out, c);
    });
}

extern "C" int
llmgw_descriptor_redirect(const llmgw_outbound_t *cur, int status,
    llmgw_str_t location, const llmgw_desc_policy_t *p,
    llmgw_outbound_t *next, char *err, size_t errlen)
{
    Ctx c(p ? *p : kNoPolicy);

    if (next == nullptr) {
        return -1;
    }

    std::memset(next, 0, sizeof(*next));

    return guarded(next, c, err, errlen, [&]() {
        if (cur == nullptr || p == nullptr) {
            return c.fail("no request to redirect");
        }
        return redirect(*cur, status, sv(location), next, c);
    });
}

extern "C" void
llmgw_outbound_free(llmgw_outbound_t *o)
{
    if (o == nullptr) {
        return;
    }

    std::free(o->host);
    std::free(o->host_header);
    std::free(o->uri);
    llmgw_buf_free(&o->url);
    llmgw_buf_free(&o->headers);
    llmgw_buf_free(&o->body);
    std::memset(o, 0, sizeof(*o));
}

extern "C" llmgw_buf_t
llmgw_headers_json(const llmgw_str_t *names, const llmgw_str_t *values,
    size_t n)
{
    try {
        std::vector<std::pair<std::string, std::vector<std::string_view>>>
            groups;
        std::unordered_map<std::string, size_t> index;

        for (size_t i = 0; i < n; i++) {
            std::string name = lowercase(sv(names[i]));
            auto it = index.find(name);

            if (it == index.end()) {
                it = index.emplace(name, groups.size()).first;
                groups.emplace_back(name, std::vector<std::string_view>());
            }

            groups[it->second].second.push_back(sv(values[i]));
        }

        std::string out = "{";

        for (const auto &g : groups) {
            if (out.size() > 1) {
                out += ',';
            }

            append_json_string(out, g.first);
            out += ":[";

            for (size_t i = 0; i < g.second.size(); i++) {
                if (i > 0) {
                    out += ',';
                }
                append_json_string(out, g.second[i]);
            }

            out += ']';
        }

        out += '}';
        return make_buf(out);

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}
