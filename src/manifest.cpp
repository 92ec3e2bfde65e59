/*
 * Plugin manifest validation (Task Plugin API v1).
 *
 * Checks a plugin's `meta` export against the contract together with the
 * list of functions the plugin exports, collects every violation as
 * "<field path>: <rule>", and on success returns the manifest normalised
 * onto the specification's names (marketplace aliases mapped, localized
 * text as locale maps, URLs and hosts canonical, defaults filled in).
 */

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <strings.h>

#include "internal.h"

namespace llmgw {
namespace {

/* Top-level manifest fields, in the order of the normalised manifest. */
const char *const KNOWN_FIELDS[] = {
    "apiVersion", "key", "name", "version", "author", "description", "icon",
    "website", "sortPriority", "models", "fetchMode", "baseUrl",
    "allowedHosts", "upstreams", "auth", "channelTypes", "routes",
    "protocols", "usageSchema", "usageExamples", "usageProfiles",
    "requiredCapabilities", "submitResponseTypes",
};

struct Legacy {
    const char *name;
    const char *hint;
};

/* Fields (and exports) of the pre-v1 plugin API. */
const Legacy LEGACY[] = {
    { "endpoints", "declare host protocols in meta.protocols" },
    { "resolveRequest", "routes name a decode function exported in native" },
    { "renderError", "export native.error" },
    { "renderers", "routes and protocols name their render functions" },
};

const char *const CAPABILITIES[] = { "json-clone@1", "submit-sse-delta@1" };

const char *const ROUTE_METHODS[] = { "GET", "POST", "PUT", "PATCH", "DELETE" };

const char *const USAGE_UNITS[] = { "second", "count", "token", "credit" };

const size_t KEY_MAX = 30;
const size_t ICON_MAX = 128;
const size_t DESCRIPTION_MAX = 512;
const size_t USAGE_TEXT_MAX = 256;
const size_t LOCALES_MAX = 16;
const size_t BASE_URL_MAX = 191;

const char *const LOCALE_RULE = "^[a-zA-Z]{2,3}(-[a-zA-Z0-9]{2,8})*$";

/* Semantic Versioning 2.0.0 (semver.org's regular expression). */
const char *const SEMVER_RE =
    "^(0|[1-9]\\d*)\\.(0|[1-9]\\d*)\\.(0|[1-9]\\d*)"
    "(?:-((?:0|[1-9]\\d*|\\d*[a-zA-Z-][0-9a-zA-Z-]*)"
    "(?:\\.(?:0|[1-9]\\d*|\\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    "(?:\\+([0-9a-zA-Z-]+(?:\\.[0-9a-zA-Z-]+)*))?$";


/* ---- text helpers ---- */

/* The next code point of valid UTF-8 (jansson validated it). */
uint32_t
next_cp(std::string_view s, size_t &i)
{
    unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    size_t n;

    if (c < 0x80) {
        i++;
        return c;
    }

    if ((c & 0xE0) == 0xC0) {
        cp = c & 0x1F;
        n = 1;
    } else if ((c & 0xF0) == 0xE0) {
        cp = c & 0x0F;
        n = 2;
    } else {
        cp = c & 0x07;
        n = 3;
    }

    i++;

    while (n-- > 0 && i < s.size()) {
        cp = (cp << 6) | (static_cast<unsigned char>(s[i++]) & 0x3F);
    }

    return cp;
}

size_t
cp_len(std::string_view s)
{
    size_t n = 0;

    for (char c : s) {
        if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) {
            n++;
        }
    }

    return n;
}

/* White space as ECMAScript's String.prototype.trim and \s see it. */
bool
is_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0xA0
        || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028
        || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000
        || cp == 0xFEFF;
}

bool
is_control(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F);
}

std::string_view
trim(std::string_view s)
{
    size_t start = 0;

    while (start < s.size()) {
        size_t i = start;

        if (!is_space(next_cp(s, i))) {
            break;
        }

        start = i;
    }

    size_t end = start;

    for (size_t i = start; i < s.size();) {
        if (!is_space(next_cp(s, i))) {
            end = i;
        }
    }

    return s.substr(start, end - start);
}

bool
has_control(std::string_view s)
{
    for (size_t i = 0; i < s.size();) {
        if (is_control(next_cp(s, i))) {
            return true;
        }
    }

    return false;
}

/* Whitespace, control characters or backslashes anywhere. */
bool
has_unsafe(std::string_view s)
{
    for (size_t i = 0; i < s.size();) {
        uint32_t cp = next_cp(s, i);

        if (is_space(cp) || is_control(cp) || cp == '\\') {
            return true;
        }
    }

    return false;
}

bool
is_ascii(std::string_view s)
{
    for (char c : s) {
        if (static_cast<unsigned char>(c) >= 0x80) {
            return false;
        }
    }

    return true;
}

bool
is_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

bool
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

bool
is_alnum(char c)
{
    return is_alpha(c) || is_digit(c);
}

char
lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

char
upper(char c)
{
    return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
}

std::string
lowercase(std::string_view s)
{
    std::string out(s);

    for (char &c : out) {
        c = lower(c);
    }

    return out;
}

/* A JavaScript-style identifier without '$' (function and parameter names). */
bool
is_identifier(std::string_view s, bool dollar)
{
    if (s.empty()) {
        return false;
    }

    for (size_t i = 0; i < s.size(); i++) {
        char c = s[i];

        if (!(is_alpha(c) || c == '_' || (dollar && c == '$')
              || (i > 0 && is_digit(c))))
        {
            return false;
        }
    }

    return true;
}

/* A JSON string literal. */
std::string
quote(std::string_view s)
{
    std::string out = "\"";

    for (char c : s) {
        unsigned char u = static_cast<unsigned char>(c);

        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
        } else if (u < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", u);
            out += buf;
        } else {
            out += c;
        }
    }

    return out + "\"";
}

/* path.key, or path["key"] when the key is not a plain name. */
std::string
member(const std::string &path, std::string_view key)
{
    bool plain = !key.empty();

    for (char c : key) {
        if (!(is_alnum(c) || c == '_' || c == '-')) {
            plain = false;
        }
    }

    if (plain) {
        return path + "." + std::string(key);
    }

    return path + "[" + quote(key) + "]";
}

std::string
index(const std::string &path, size_t i)
{
    return path + "[" + std::to_string(i) + "]";
}

std::string
sv_of(const json_t *v)
{
    return std::string(json_string_value(v), json_string_length(v));
}

Json
jstr(std::string_view s)
{
    return Json(json_stringn(s.data(), s.size()));
}

/* Integer value of an integer or an integral real. */
bool
integral(const json_t *v, int64_t &out)
{
    if (json_is_integer(v)) {
        out = json_integer_value(v);
        return true;
    }

    if (json_is_real(v)) {
        double d = json_real_value(v);

        if (d >= -9.2e18 && d <= 9.2e18 && static_cast<double>(
                static_cast<int64_t>(d)) == d)
        {
            out = static_cast<int64_t>(d);
            return true;
        }
    }

    return false;
}

template <size_t N>
bool
one_of(std::string_view s, const char *const (&list)[N])
{
    for (const char *x : list) {
        if (s == x) {
            return true;
        }
    }

    return false;
}


/* ---- locales ---- */

bool
locale_ok(std::string_view k)
{
    size_t i = 0;

    while (i < k.size() && is_alpha(k[i])) {
        i++;
    }

    if (i < 2 || i > 3) {
        return false;
    }

    while (i < k.size()) {
        if (k[i] != '-') {
            return false;
        }

        size_t start = ++i;

        while (i < k.size() && is_alnum(k[i])) {
            i++;
        }

        if (i - start < 2 || i - start > 8) {
            return false;
        }
    }

    return true;
}

/*
 * BCP 47 casing: language lower case, two-letter regions upper case,
 * four-letter scripts title case, everything else lower case.
 */
std::string
locale_canonical(std::string_view k)
{
    std::string out;
    size_t start = 0;
    bool first = true;

    while (start <= k.size()) {
        size_t end = k.find('-', start);

        if (end == std::string_view::npos) {
            end = k.size();
        }

        std::string_view sub = k.substr(start, end - start);
        bool alpha = true;

        for (char c : sub) {
            alpha = alpha && is_alpha(c);
        }

        if (!first) {
            out += '-';
        }

        for (size_t i = 0; i < sub.size(); i++) {
            if (!first && alpha && sub.size() == 2) {
                out += upper(sub[i]);
            } else if (!first && alpha && sub.size() == 4 && i == 0) {
                out += upper(sub[i]);
            } else {
                out += lower(sub[i]);
            }
        }

        first = false;
        start = end + 1;
    }

    return out;
}


/* ---- URLs and hosts ---- */

struct Url {
    std::string scheme;
    std::string host;           /* without brackets */
    std::string port;
    std::string path;
    bool        userinfo = false;
    bool        query = false;
    bool        fragment = false;
    bool        bracketed = false;
    bool        has_port = false;
};

/* scheme "://" [userinfo "@"] host [":" port] [path] ["?" query] ["#" f]. */
bool
parse_url(std::string_view s, Url &u)
{
    size_t sep = s.find("://");

    if (sep == std::string_view::npos || sep == 0 || !is_alpha(s[0])) {
        return false;
    }

    for (size_t i = 0; i < sep; i++) {
        char c = s[i];

        if (!(is_alnum(c) || c == '+' || c == '-' || c == '.')) {
            return false;
        }
    }

    u.scheme = lowercase(s.substr(0, sep));
    std::string_view rest = s.substr(sep + 3);
    size_t end = rest.find_first_of("/?#");

    if (end == std::string_view::npos) {
        end = rest.size();
    }

    std::string_view auth = rest.substr(0, end);
    std::string_view tail = rest.substr(end);
    size_t at = auth.rfind('@');

    if (at != std::string_view::npos) {
        u.userinfo = true;
        auth = auth.substr(at + 1);
    }

    if (!auth.empty() && auth[0] == '[') {
        size_t close = auth.find(']');

        if (close == std::string_view::npos) {
            return false;
        }

        u.bracketed = true;
        u.host = std::string(auth.substr(1, close - 1));
        auth = auth.substr(close + 1);

        if (!auth.empty()) {
            if (auth[0] != ':') {
                return false;
            }

            u.has_port = true;
            u.port = std::string(auth.substr(1));
        }

    } else {
        size_t colon = auth.rfind(':');

        if (colon != std::string_view::npos) {
            u.has_port = true;
            u.port = std::string(auth.substr(colon + 1));
            auth = auth.substr(0, colon);
        }

        u.host = std::string(auth);
    }

    size_t q = tail.find_first_of("?#");
    u.path = std::string(tail.substr(0, q));

    if (q != std::string_view::npos) {
        size_t hash = tail.find('#');
        u.query = tail[q] == '?';
        u.fragment = hash != std::string_view::npos;
    }

    return true;
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

        if (!(is_alnum(c) || c == '-' || c == '_')) {
            return false;
        }

        label++;
    }

    return true;
}

bool
ipv6_ok(const std::string &h)
{
    unsigned char buf[16];

    return !h.empty() && inet_pton(AF_INET6, h.c_str(), buf) == 1;
}

/* 1-65535 without leading zeros. */
bool
port_ok(std::string_view p)
{
    if (p.empty() || p.size() > 5 || p[0] == '0') {
        return false;
    }

    for (char c : p) {
        if (!is_digit(c)) {
            return false;
        }
    }

    return std::stol(std::string(p)) <= 65535;
}


/* ---- the validator ---- */

struct UsageField {
    enum Kind { NUMBER, BOOLEAN, ENUM, INVALID } kind = INVALID;
    std::string unit;
    std::vector<std::string> values;
};

using UsageFields = std::vector<std::pair<std::string, UsageField>>;

struct Claim {
    std::string name;
    size_t      index = 0;
    bool        stream = false;
    bool        sync = false;
    bool        background = false;
    bool        supports_ok = true;
};

class Validator {
public:
    std::vector<std::string> errors;

    int run(const char *meta, size_t meta_len, const char *exports,
        size_t exports_len, std::string &normalized);

private:
    std::set<std::string> exports_;
    bool exports_ok_ = true;
    std::set<std::string> models_;
    bool models_ok_ = false;
    std::set<std::string> capabilities_;

    void err(const std::string &path, const std::string &msg)
    {
        errors.push_back(path + ": " + msg);
    }

    bool exported(const std::string &name) const
    {
        return exports_.count(name) > 0;
    }

    void need_export(const std::string &path, const std::string &prefix,
        const std::string &name)
    {
        if (exports_ok_ && !exported(name)) {
            err(path, prefix + "needs export " + name);
        }
    }

    void parse_exports(const char *data, size_t len);
    bool text_value(const std::string &path, const json_t *v, size_t max,
        std::string &out);
    Json localized(const std::string &path, const json_t *v, size_t max);
    void usage_description(const std::string &path, const json_t *written,
                           const json_t *texts);
    void unknown_fields(const std::string &path, const json_t *obj,
        std::initializer_list<const char *> known);
    Json string_list(const std::string &path, const json_t *v,
        bool require_known_models, bool non_empty);

    void check_url(const std::string &path, const std::string &s,
        bool https_only, bool origin_only, const char *what);

    Json check_author(const json_t *v);
    Json check_icon(const json_t *v);
    Json check_base_url(const json_t *v);
    Json check_allowed_hosts(const json_t *v);
    Json check_upstreams(const json_t *v);
    Json check_auth(const json_t *v);
    Json check_channel_types(const json_t *v);
    Json check_routes(const json_t *v);
    Json check_route(const std::string &path, const json_t *r,
        std::map<std::string, std::string> &shapes);
    bool check_route_path(const std::string &path, std::string_view p);
    Json check_protocols(const json_t *v, std::vector<Claim> &claims);
    Json check_usage_schema(const std::string &path, const json_t *v,
        UsageFields &fields);
    Json check_usage_field(const std::string &path, const json_t *f,
        UsageField &out);
    Json check_usage_examples(const std::string &path, const json_t *v,
        const UsageFields &fields);
    void check_token_examples(const std::string &path,
        const UsageFields &fields, const json_t *examples);
    Json check_usage_profiles(const json_t *v);
    Json check_capabilities(const json_t *v);
    Json check_response_types(const json_t *v, bool &sse);
    void check_protocol_exports(const std::vector<Claim> &claims);
    bool no_control(const std::string &path, const json_t *v);
};


/* Marketplace spellings of the host protocols. */
std::string
protocol_alias(std::string_view name)
{
    if (name == "openai_video") {
        return "host_video";
    }

    if (name == "openai_responses") {
        return "host_responses";
    }

    if (name == "openai_image") {
        return "host_image";
    }

    return std::string(name);
}

bool
protocol_known(std::string_view name)
{
    return name == "host_video" || name == "host_responses"
        || name == "host_image";
}

/* protocols.openai_video.render -> protocols.host_video.render */
std::string
export_alias(std::string_view name)
{
    const std::string_view prefix = "protocols.";

    if (name.substr(0, prefix.size()) != prefix) {
        return std::string(name);
    }

    std::string_view rest = name.substr(prefix.size());
    size_t dot = rest.find('.');
    std::string_view proto = rest.substr(0, dot);
    std::string out = std::string(prefix) + protocol_alias(proto);

    if (dot != std::string_view::npos) {
        out += std::string(rest.substr(dot));
    }

    return out;
}


void
Validator::parse_exports(const char *data, size_t len)
{
    if (data == nullptr) {
        return;
    }

    Json list = json_parse(data, len);

    if (!json_is_array(list.get())) {
        err("exports", "must be a JSON array of export paths");
        exports_ok_ = false;
        return;
    }

    size_t i;
    json_t *v;

    json_array_foreach(list.get(), i, v) {
        if (!json_is_string(v)) {
            err(index("exports", i), "must be a string");
            continue;
        }

        exports_.insert(export_alias(sv_of(v)));
    }

    for (const Legacy &l : LEGACY) {
        std::string prefix = std::string(l.name) + ".";

        for (const std::string &e : exports_) {
            if (e == l.name || e.compare(0, prefix.size(), prefix) == 0) {
                err("exports." + e, std::string("legacy export, no longer "
                    "supported (") + l.hint + ")");
            }
        }
    }
}


/* A trimmed, non-empty text without control characters. */
bool
Validator::text_value(const std::string &path, const json_t *v, size_t max,
    std::string &out)
{
    if (!json_is_string(v)) {
        err(path, "must be a string");
        return false;
    }

    std::string_view t = trim(std::string_view(json_string_value(v),
                                               json_string_length(v)));

    if (t.empty()) {
        err(path, "must not be empty");
        return false;
    }

    if (has_control(t)) {
        err(path, "must not contain control characters");
        return false;
    }

    if (cp_len(t) > max) {
        err(path, "at most " + std::to_string(max) + " characters");
        return false;
    }

    out = std::string(t);
    return true;
}


/*
 * Usage declarations: "descriptions hold no numeric prices ... and no
 * trailing punctuation".  Prices live in /api/pricing; a description
 * that quotes one goes stale the day the price changes.  texts is the
 * normalised map; written what the manifest said (a string, or the map).
 */
void
Validator::usage_description(const std::string &path, const json_t *written,
    const json_t *texts)
{
    static const char *const trailing[] = {
        ".", "!", "?", ",", ";", ":", "\u3002", "\uff01", "\uff1f",
        "\uff0c", "\uff1b", "\uff1a", "\u2026",
    };
    static const char *const currencies[] = {
        "usd", "eur", "gbp", "cny", "rmb", "jpy", "cents", "cent", "\u5143",
        "\u7f8e\u5143", "\u7f8e\u5206",
    };

    const char *k;
    json_t *v;

    json_object_foreach(const_cast<json_t *>(texts), k, v) {
        std::string t = sv_of(v);
        std::string p = json_is_string(written) ? path : member(path, k);

        for (const char *x : trailing) {
            if (t.size() >= std::strlen(x)
                && t.compare(t.size() - std::strlen(x), std::string::npos, x)
                   == 0)
            {
                err(p, "no trailing punctuation (" + quote(x) + ")");
                break;
            }
        }

        /* a currency sign before a digit, or a currency after one */
        bool price = false;

        for (size_t i = 0; i < t.size() && !price; i++) {
            unsigned char c = t[i];

            if (c == '$' || t.compare(i, 3, "\u20ac") == 0
                || t.compare(i, 2, "\u00a3") == 0
                || t.compare(i, 2, "\u00a5") == 0)
            {
                size_t j = t.find_first_not_of(' ',
                               i + (c == '$' ? 1 : c == 0xe2 ? 3 : 2));
                price = j != std::string::npos && std::isdigit(
                            static_cast<unsigned char>(t[j]));

            } else if (std::isdigit(c)) {
                size_t j = t.find_first_not_of(' ', i + 1);

                for (const char *cur : currencies) {
                    size_t n = std::strlen(cur);

                    /* a word: "5 centimeters" names no price */
                    if (j != std::string::npos && j + n <= t.size()
                        && strncasecmp(t.c_str() + j, cur, n) == 0
                        && (static_cast<unsigned char>(cur[0]) >= 0x80
                            || j + n == t.size()
                            || !std::isalpha(static_cast<unsigned char>(
                                   t[j + n]))))
                    {
                        price = true;
                        break;
                    }
                }
            }
        }

        if (price) {
            err(p, "no prices: they are set with /api/pricing");
        }
    }
}


/* LocalizedText -> {"en": ..., "<locale>": ...} */
Json
Validator::localized(const std::string &path, const json_t *v, size_t max)
{
    std::string t;

    if (json_is_string(v)) {
        if (!text_value(path, v, max, t)) {
            return nullptr;
        }

        Json out(json_object());
        json_object_set_new(out.get(), "en", jstr(t).release());
        return out;
    }

    if (!json_is_object(v)) {
        err(path, "must be a string or a map of locale to text");
        return nullptr;
    }

    bool ok = true;

    if (json_object_size(v) > LOCALES_MAX) {
        err(path, "at most " + std::to_string(LOCALES_MAX) + " locales");
        ok = false;
    }

    Json out(json_object());
    std::set<std::string> seen;
    const char *k;
    json_t *val;

    json_object_foreach(const_cast<json_t *>(v), k, val) {
        std::string kp = member(path, k);

        if (!locale_ok(k)) {
            err(kp, std::string("locale must match ") + LOCALE_RULE);
            ok = false;
            continue;
        }

        std::string canon = locale_canonical(k);

        if (!seen.insert(canon).second) {
            err(kp, "duplicate locale " + quote(canon)
                + " after canonical casing");
            ok = false;
            continue;
        }

        if (!text_value(kp, val, max, t)) {
            ok = false;
            continue;
        }

        json_object_set_new(out.get(), canon.c_str(), jstr(t).release());
    }

    if (seen.count("en") == 0) {
        err(path, "\"en\" is required");
        ok = false;
    }

    return ok ? std::move(out) : nullptr;
}


void
Validator::unknown_fields(const std::string &path, const json_t *obj,
    std::initializer_list<const char *> known)
{
    const char *k;
    json_t *v;

    json_object_foreach(const_cast<json_t *>(obj), k, v) {
        bool found = false;

        for (const char *x : known) {
            found = found || std::strcmp(x, k) == 0;
        }

        if (!found) {
            err(member(path, k), "unknown field");
        }
    }
}


/* An array of non-empty strings, optionally each one of meta.models. */
Json
Validator::string_list(const std::string &path, const json_t *v,
    bool require_known_models, bool non_empty)
{
    if (!json_is_array(v)) {
        err(path, "must be an array of strings");
        return nullptr;
    }

    if (non_empty && json_array_size(v) == 0) {
        err(path, "must not be empty");
        return nullptr;
    }

    bool ok = true;
    size_t i;
    json_t *item;

    json_array_foreach(v, i, item) {
        if (!json_is_string(item) || json_string_length(item) == 0) {
            err(index(path, i), "must be a non-empty string");
            ok = false;
            continue;
        }

        if (require_known_models && models_ok_
            && models_.count(sv_of(item)) == 0)
        {
            err(index(path, i), quote(sv_of(item))
                + " is not in meta.models (spell it as in meta.models)");
            ok = false;
        }
    }

    return ok ? Json(json_deep_copy(v)) : nullptr;
}


/*
 * Absolute URL checks shared by website, author.url and baseUrl.
 * origin_only: no query string or fragment (baseUrl).
 */
void
Validator::check_url(const std::string &path, const std::string &s,
    bool https_only, bool origin_only, const char *what)
{
    Url u;

    if (has_unsafe(s)) {
        err(path, "must not contain whitespace, control characters or "
            "backslashes");
        return;
    }

    if (!parse_url(s, u) || (u.scheme != "https"
                             && (https_only || u.scheme != "http")))
    {
        err(path, std::string("must be ") + what);
        return;
    }

    if (u.userinfo) {
        err(path, "must not contain credentials");
    }

    if (!is_ascii(u.host)) {
        err(path, "host must be ASCII (use the punycode form)");
    } else if (u.bracketed ? !ipv6_ok(u.host) : !hostname_ok(u.host)) {
        err(path, "host is not a valid host name or address");
    }

    if (u.has_port && !port_ok(u.port)) {
        err(path, "port must be a number from 1 to 65535");
    }

    if (origin_only && u.query) {
        err(path, "must not contain a query string");
    }

    if (origin_only && u.fragment) {
        err(path, "must not contain a fragment");
    }
}


Json
Validator::check_author(const json_t *v)
{
    const std::string path = "meta.author";

    if (!json_is_object(v)) {
        err(path, "must be an object {name, url?}");
        return nullptr;
    }

    size_t before = errors.size();
    unknown_fields(path, v, { "name", "url" });

    const json_t *name = json_object_get(v, "name");

    if (name == nullptr) {
        err(path + ".name", "required");
    } else if (!json_is_string(name) || trim(sv_of(name)).empty()) {
        err(path + ".name", "must be a non-empty string");
    }

    const json_t *url = json_object_get(v, "url");

    if (url != nullptr) {
        if (!json_is_string(url)) {
            err(path + ".url", "must be a string");
        } else {
            check_url(path + ".url", sv_of(url), false, false,
                      "an absolute http(s) URL");
        }
    }

    return errors.size() == before ? Json(json_deep_copy(v)) : nullptr;
}


/* An icon-library name, "text" or "text:<label>"; never a URL or image. */
Json
Validator::check_icon(const json_t *v)
{
    const std::string path = "meta.icon";

    if (!json_is_string(v)) {
        err(path, "must be a string");
        return nullptr;
    }

    std::string s = sv_of(v);

    if (s.empty()) {
        err(path, "must not be empty");
        return nullptr;
    }

    if (cp_len(s) > ICON_MAX) {
        err(path, "at most " + std::to_string(ICON_MAX) + " characters");
        return nullptr;
    }

    std::string l = lowercase(s);

    if (s.compare(0, 5, "text:") == 0) {
        std::string_view label = trim(std::string_view(s).substr(5));

        if (label.empty()) {
            err(path, "\"text:\" needs a label");
            return nullptr;
        }

        if (has_control(label)) {
            err(path, "must not contain control characters");
            return nullptr;
        }

        return Json(json_deep_copy(v));
    }

    if (l.find("://") != std::string::npos || l.compare(0, 5, "data:") == 0
        || l.compare(0, 5, "http:") == 0 || l.compare(0, 6, "https:") == 0
        || l.compare(0, 2, "//") == 0)
    {
        err(path, "remote URLs and inline images are rejected; use an icon "
            "library name, \"text\" or \"text:<label>\"");
        return nullptr;
    }

    bool ok = is_alnum(s[0]);

    for (char c : s) {
        ok = ok && (is_alnum(c) || c == '.' || c == '_' || c == '-'
                    || c == ':');
    }

    if (!ok) {
        err(path, "must be an icon library name (letters, digits, '.', '_', "
            "'-', ':'), \"text\" or \"text:<label>\"");
        return nullptr;
    }

    return Json(json_deep_copy(v));
}


/* Host lowercased, trailing slashes stripped. */
Json
Validator::check_base_url(const json_t *v)
{
    const std::string path = "meta.baseUrl";

    if (!json_is_string(v)) {
        err(path, "must be a string");
        return nullptr;
    }

    std::string s = sv_of(v);

    if (cp_len(s) > BASE_URL_MAX) {
        err(path, "at most " + std::to_string(BASE_URL_MAX) + " characters");
        return nullptr;
    }

    size_t before = errors.size();
    check_url(path, s, false, true, "an absolute http(s) URL");

    if (errors.size() != before) {
        return nullptr;
    }

    Url u;
    parse_url(s, u);

    std::string out = u.scheme + "://";
    out += u.bracketed ? "[" + lowercase(u.host) + "]" : lowercase(u.host);

    if (u.has_port) {
        out += ":" + u.port;
    }

    std::string p = u.path;

    while (!p.empty() && p.back() == '/') {
        p.pop_back();
    }

    return jstr(out + p);
}


Json
Validator::check_allowed_hosts(const json_t *v)
{
    const std::string path = "meta.allowedHosts";

    if (!json_is_array(v)) {
        err(path, "must be an array of strings (host or host:port)");
        return nullptr;
    }

    Json out(json_array());
    std::map<std::string, size_t> seen;
    bool ok = true;
    size_t i;
    json_t *item;

    json_array_foreach(v, i, item) {
        std::string ip = index(path, i);

        if (!json_is_string(item)) {
            err(ip, "must be a string");
            ok = false;
            continue;
        }

        std::string s = sv_of(item);
        std::string host, port;
        bool has_port = false;
        const char *why = nullptr;

        if (s.empty()) {
            why = "must not be empty";
        } else if (has_unsafe(s)) {
            why = "must not contain whitespace, control characters or "
                  "backslashes";
        } else if (s.find("://") != std::string::npos) {
            why = "must not contain a scheme (use host or host:port)";
        } else if (s.find('@') != std::string::npos) {
            why = "must not contain credentials";
        } else if (s.find_first_of("?#") != std::string::npos) {
            why = "must not contain a query or fragment";
        } else if (s.find('/') != std::string::npos) {
            why = "must not contain a path (use host or host:port)";
        } else if (!is_ascii(s)) {
            why = "host must be ASCII (use the punycode form)";
        } else if (s[0] == '[') {
            size_t close = s.find(']');

            if (close == std::string::npos) {
                why = "IPv6 address is not valid";
            } else {
                host = s.substr(1, close - 1);
                std::string rest = s.substr(close + 1);

                if (!ipv6_ok(host)) {
                    why = "IPv6 address is not valid";
                } else if (!rest.empty()) {
                    if (rest[0] != ':') {
                        why = "must be host or host:port";
                    } else {
                        has_port = true;
                        port = rest.substr(1);
                    }
                }

                host = "[" + host + "]";
            }

        } else if (std::count(s.begin(), s.end(), ':') > 1) {
            why = "IPv6 addresses must be written in brackets ([::1]:443)";
        } else {
            size_t colon = s.find(':');
            host = s.substr(0, colon);

            if (colon != std::string::npos) {
                has_port = true;
                port = s.substr(colon + 1);
            }

            if (!hostname_ok(host)) {
                why = "not a valid host name";
            }
        }

        if (why == nullptr && has_port && !port_ok(port)) {
            why = "port must be a number from 1 to 65535";
        }

        if (why != nullptr) {
            err(ip, why);
            ok = false;
            continue;
        }

        std::string norm = lowercase(host) + (has_port ? ":" + port : "");
        auto dup = seen.find(norm);

        if (dup != seen.end()) {
            err(ip, "duplicate host " + quote(norm) + " (also "
                + index(path, dup->second) + ")");
            ok = false;
            continue;
        }

        seen.emplace(norm, i);
        json_array_append_new(out.get(), jstr(norm).release());
    }

    return ok ? std::move(out) : nullptr;
}


/* Unique values; new_api is the marketplace spelling of peer_gateway. */
Json
Validator::check_upstreams(const json_t *v)
{
    const std::string path = "meta.upstreams";

    if (!json_is_array(v)) {
        err(path, "must be an array of \"vendor\" / \"peer_gateway\"");
        return nullptr;
    }

    std::set<std::string> seen;
    bool ok = true;
    size_t i;
    json_t *item;

    json_array_foreach(v, i, item) {
        std::string s = json_is_string(item) ? sv_of(item) : "";

        if (s == "new_api") {
            s = "peer_gateway";
        }

        if (s != "vendor" && s != "peer_gateway") {
            err(index(path, i), "must be \"vendor\" or \"peer_gateway\" "
                "(marketplace alias \"new_api\")");
            ok = false;
            continue;
        }

        if (!seen.insert(s).second) {
            err(index(path, i), "duplicate value " + quote(s));
            ok = false;
        }
    }

    if (!ok) {
        return nullptr;
    }

    /* vendor is always supported */
    Json out(json_array());
    json_array_append_new(out.get(), json_string("vendor"));

    if (seen.count("peer_gateway")) {
        json_array_append_new(out.get(), json_string("peer_gateway"));
    }

    return out;
}


/*
 * "none", "api_key", "vendor_oauth", or an object with a string type.
 * Marketplace: "vertex_oauth" and "oauth2_jwt" (string or type) become
 * {type: "oauth2_jwt", ...}.
 */
Json
Validator::check_auth(const json_t *v)
{
    const std::string path = "meta.auth";

    if (json_is_string(v)) {
        std::string s = sv_of(v);

        if (s == "none" || s == "api_key" || s == "vendor_oauth") {
            return jstr(s);
        }

        if (s == "vertex_oauth" || s == "oauth2_jwt") {
            return Json(json_pack("{s:s}", "type", "oauth2_jwt"));
        }

        err(path, "must be \"none\", \"api_key\", \"vendor_oauth\" "
            "(marketplace: \"vertex_oauth\") or an object with a type");
        return nullptr;
    }

    if (!json_is_object(v)) {
        err(path, "must be a string or an object with a type");
        return nullptr;
    }

    const json_t *type = json_object_get(v, "type");

    if (!json_is_string(type) || trim(sv_of(type)).empty()) {
        err(path + ".type", "must be a non-empty string");
        return nullptr;
    }

    Json out(json_deep_copy(v));

    if (sv_of(type) == "vertex_oauth") {
        json_object_set_new(out.get(), "type", json_string("oauth2_jwt"));
    }

    return out;
}


Json
Validator::check_channel_types(const json_t *v)
{
    const std::string path = "meta.channelTypes";

    if (!json_is_array(v)) {
        err(path, "must be an array of channel type numbers");
        return nullptr;
    }

    bool ok = true;
    size_t i;
    json_t *item;

    json_array_foreach(v, i, item) {
        int64_t n;

        if (!integral(item, n) || n < 1 || n > INT32_MAX) {
            err(index(path, i), "must be a positive integer");
            ok = false;
        } else if (n == 60 || n == 61) {
            err(index(path, i), "must not be 60 or 61 (those channel types "
                "bind plugins by key)");
            ok = false;
        }
    }

    if (!ok) {
        return nullptr;
    }

    Json out(json_array());

    json_array_foreach(v, i, item) {
        int64_t n = 0;
        integral(item, n);
        json_array_append_new(out.get(), json_integer(n));
    }

    return out;
}


/*
 * "/" then segments: a literal (first character not ':') or ":<name>";
 * only the last segment may be empty (a trailing slash).
 */
bool
Validator::check_route_path(const std::string &path, std::string_view p)
{
    if (p.empty() || p[0] != '/') {
        err(path, "must start with /");
        return false;
    }

    std::string_view rest = p.substr(1);
    size_t start = 0;

    for (;;) {
        size_t end = rest.find('/', start);
        bool last = end == std::string_view::npos;
        std::string_view seg = rest.substr(start, last ? std::string_view::npos
                                                       : end - start);

        if (seg.empty() && !last) {
            err(path, "must not contain empty segments (//)");
            return false;
        }

        if (!seg.empty() && seg[0] == ':') {
            if (!is_identifier(seg.substr(1), false)) {
                err(path, "path parameter " + quote(seg)
                    + " must be ':' and an identifier");
                return false;
            }

        } else {
            /* nginx decodes %XX and resolves dot segments before the
               gateway matches a request path: such a route is never met */
            if (seg == "." || seg == "..") {
                err(path, "must not contain \".\" or \"..\" segments (a "
                    "request path is resolved before it is matched; the "
                    "route could never be reached)");
                return false;
            }

            for (char c : seg) {
                if (c == '%') {
                    err(path, "must not contain '%' (a request path is "
                        "percent-decoded before it is matched; write the "
                        "character itself)");
                    return false;
                }

                if (!(is_alnum(c) || std::strchr("-._~!$&'()*+,;=:@", c))) {
                    err(path, "must be a plain path (letters, digits and "
                        "-._~!$&'()*+,;=:@; no query, fragment or "
                        "whitespace)");
                    return false;
                }
            }
        }

        if (last) {
            break;
        }

        start = end + 1;
    }

    /* host-managed protocol paths belong to meta.protocols */
    struct {
        const char *prefix;
        const char *proto;
    } host[] = {
        { "/v1/videos", "host_video" },
        { "/v1/responses", "host_responses" },
        { "/v1/images", "host_image" },
    };

    for (const auto &h : host) {
        size_t n = std::strlen(h.prefix);

        if (p.compare(0, n, h.prefix) == 0 && (p.size() == n || p[n] == '/')) {
            err(path, std::string(h.prefix) + " is a host protocol path; "
                "declare " + h.proto + " in meta.protocols instead");
            return false;
        }
    }

    /* the gateway's own endpoints win before plugin routes are looked at */
    std::string_view gw = gateway_path_prefix(p);

    if (!gw.empty()) {
        std::string where = gw.size() == p.size()
                            ? " is"
                            : " is under " + std::string(gw) + ",";

        err(path, quote(p) + where + " a path the gateway serves itself; "
            "the route could never be reached");
        return false;
    }

    return true;
}


Json
Validator::check_route(const std::string &path, const json_t *r,
    std::map<std::string, std::string> &shapes)
{
    if (!json_is_object(r)) {
        err(path, "must be an object");
        return nullptr;
    }

    size_t before = errors.size();
    const char *k;
    json_t *v;

    json_object_foreach(const_cast<json_t *>(r), k, v) {
        static const char *const known[] = {
            "method", "path", "type", "action", "decode", "render", "models",
            "taskIdParam", "retainResult",
        };

        if (std::strcmp(k, "renderer") == 0) {
            err(path + ".renderer", "legacy field, no longer supported "
                "(use render)");
        } else if (!one_of(k, known)) {
            err(member(path, k), "unknown field");
        }
    }

    /* method */
    const json_t *method = json_object_get(r, "method");
    bool method_ok = false;

    if (method == nullptr) {
        err(path + ".method", "required");
    } else if (!json_is_string(method)
               || !one_of(sv_of(method), ROUTE_METHODS))
    {
        err(path + ".method", "must be one of GET, POST, PUT, PATCH, DELETE");
    } else {
        method_ok = true;
    }

    /* type */
    const json_t *type = json_object_get(r, "type");
    std::string t;

    if (type == nullptr) {
        err(path + ".type", "required");
    } else if (!json_is_string(type)
               || (sv_of(type) != "submit" && sv_of(type) != "dynamic"
                   && sv_of(type) != "query"))
    {
        err(path + ".type", "must be \"submit\", \"dynamic\" or \"query\"");
    } else {
        t = sv_of(type);
    }

    bool query = t == "query";
    bool submit = t == "submit" || t == "dynamic";

    /* path */
    const json_t *p = json_object_get(r, "path");
    bool path_ok = false;

    if (p == nullptr) {
        err(path + ".path", "required");
    } else if (!json_is_string(p)) {
        err(path + ".path", "must be a string");
    } else {
        path_ok = check_route_path(path + ".path", sv_of(p));
    }

    /* decode and render: functions of the native export */
    const json_t *decode = json_object_get(r, "decode");

    if (query && decode != nullptr) {
        err(path + ".decode", "not allowed on query routes");
    } else if (submit && decode == nullptr) {
        err(path + ".decode", "required for submit and dynamic routes");
    } else if (decode != nullptr) {
        if (!json_is_string(decode) || !is_identifier(sv_of(decode), true)) {
            err(path + ".decode", "must be the name of a function in native");
        } else {
            need_export(path + ".decode", "", "native." + sv_of(decode));
        }
    }

    const json_t *render = json_object_get(r, "render");

    if (render == nullptr) {
        err(path + ".render", "required");
    } else if (!json_is_string(render) || !is_identifier(sv_of(render), true)) {
        err(path + ".render", "must be the name of a function in native");
    } else {
        need_export(path + ".render", "", "native." + sv_of(render));
    }

    /* models, retainResult: submit and dynamic only */
    const json_t *models = json_object_get(r, "models");

    if (models != nullptr) {
        if (query) {
            err(path + ".models", "not allowed on query routes");
        } else {
            string_list(path + ".models", models, true, true);
        }
    }

    const json_t *retain = json_object_get(r, "retainResult");

    if (retain != nullptr) {
        if (query) {
            err(path + ".retainResult", "not allowed on query routes");
        } else if (!json_is_boolean(retain)) {
            err(path + ".retainResult", "must be a boolean");
        }
    }

    /* taskIdParam: query only; the path must carry it */
    const json_t *param = json_object_get(r, "taskIdParam");
    std::string param_name = "task_id";

    if (param != nullptr) {
        if (submit) {
            err(path + ".taskIdParam", "only allowed on query routes");
        } else if (!json_is_string(param)
                   || !is_identifier(sv_of(param), false))
        {
            err(path + ".taskIdParam", "must be an identifier (letters, "
                "digits, '_')");
            param = nullptr;
            query = false;      /* nothing to look for in the path */
        } else {
            param_name = sv_of(param);
        }
    }

    if (query && path_ok) {
        std::string seg = ":" + param_name;
        std::string ps = sv_of(p) + "/";

        if (ps.find("/" + seg + "/") == std::string::npos) {
            err(path + ".path", "query routes need the path parameter "
                + seg);
        }
    }

    const json_t *action = json_object_get(r, "action");

    if (action != nullptr
        && (!json_is_string(action) || trim(sv_of(action)).empty()))
    {
        err(path + ".action", "must be a non-empty string");
    }

    /* one route per method and path shape */
    if (method_ok && path_ok) {
        std::string shape;
        std::string pstr = sv_of(p);
        std::string_view ps = pstr;

        while (ps.size() > 1 && ps.back() == '/') {
            ps.remove_suffix(1);
        }

        for (size_t i = 0; i < ps.size();) {
            if (ps[i] == ':' && (i == 0 || ps[i - 1] == '/')) {
                shape += ':';

                while (i < ps.size() && ps[i] != '/') {
                    i++;
                }

            } else {
                shape += ps[i++];
            }
        }

        std::string key = sv_of(method) + " " + shape;
        auto it = shapes.find(key);

        if (it != shapes.end()) {
            err(path, "conflicts with " + it->second
                + " (same method and path shape)");
        } else {
            shapes.emplace(key, path);
        }
    }

    if (errors.size() != before) {
        return nullptr;
    }

    Json out(json_deep_copy(r));

    if (query && param == nullptr) {
        json_object_set_new(out.get(), "taskIdParam", json_string("task_id"));
    }

    if (submit && retain == nullptr) {
        json_object_set_new(out.get(), "retainResult", json_true());
    }

    return out;
}


Json
Validator::check_routes(const json_t *v)
{
    if (!json_is_array(v)) {
        err("meta.routes", "must be an array of routes");
        return nullptr;
    }

    Json out(json_array());
    std::map<std::string, std::string> shapes;
    bool ok = true;
    size_t i;
    json_t *r;

    json_array_foreach(v, i, r) {
        Json route = check_route(index("meta.routes", i), r, shapes);

        if (route == nullptr) {
            ok = false;
        } else {
            json_array_append_new(out.get(), route.release());
        }
    }

    return ok ? std::move(out) : nullptr;
}


Json
Validator::check_protocols(const json_t *v, std::vector<Claim> &claims)
{
    const std::string path = "meta.protocols";
    const char *known = " (host_video, host_responses, host_image)";

    if (!json_is_array(v)) {
        err(path, "must be an array of protocol claims");
        return nullptr;
    }

    Json out(json_array());
    std::map<std::string, std::string> seen;
    size_t before = errors.size();
    size_t i;
    json_t *c;

    json_array_foreach(v, i, c) {
        std::string cp = index(path, i);
        Claim claim;
        claim.index = i;
        const json_t *name = json_is_object(c) ? json_object_get(c, "name") : c;

        if (!json_is_string(c) && !json_is_object(c)) {
            err(cp, "must be a protocol name or an object {name, models?, "
                "supports?}");
            continue;
        }

        std::string np = json_is_object(c) ? cp + ".name" : cp;

        if (name == nullptr) {
            err(np, "required");
            continue;
        }

        if (!json_is_string(name)) {
            err(np, "must be a string");
            continue;
        }

        claim.name = protocol_alias(sv_of(name));

        if (!protocol_known(claim.name)) {
            err(np, "unknown protocol " + quote(sv_of(name)) + known);
            continue;
        }

        bool modes = claim.name == "host_responses";
        Json norm(json_object());
        json_object_set_new(norm.get(), "name", jstr(claim.name).release());

        if (json_is_string(c)) {
            if (modes) {
                err(cp, "host_responses needs an object with supports (a "
                    "bare string is valid only for protocols without "
                    "modes)");
                claim.supports_ok = false;
            }

        } else {
            unknown_fields(cp, c, { "name", "models", "supports" });

            const json_t *models = json_object_get(c, "models");

            if (models != nullptr) {
                Json m = string_list(cp + ".models", models, true, true);

                if (m != nullptr) {
                    json_object_set_new(norm.get(), "models", m.release());
                }
            }

            const json_t *supports = json_object_get(c, "supports");
            std::string sp = cp + ".supports";

            if (!modes && supports != nullptr) {
                err(sp, claim.name + " has no request modes; remove "
                    "supports");
            } else if (modes && supports == nullptr) {
                err(sp, "required for host_responses (an object of modes: "
                    "stream, sync, background)");
                claim.supports_ok = false;
            } else if (modes) {
                size_t mark = errors.size();
                std::set<std::string> declared;

                if (json_is_object(supports)) {
                    const char *k;
                    json_t *b;

                    json_object_foreach(const_cast<json_t *>(supports), k, b) {
                        std::string mode = k;

                        if (mode != "stream" && mode != "sync"
                            && mode != "background")
                        {
                            err(member(sp, k), "unknown mode (stream, sync, "
                                "background)");
                        } else if (!json_is_boolean(b)) {
                            err(member(sp, k), "must be a boolean");
                        } else if (json_is_true(b)) {
                            declared.insert(mode);
                        }
                    }

                } else {
                    err(sp, "must be an object of modes (stream, sync, "
                        "background)");
                }

                if (errors.size() == mark && declared.empty()) {
                    err(sp, "declare at least one of stream, sync, "
                        "background");
                }

                claim.supports_ok = errors.size() == mark;
                claim.stream = declared.count("stream") > 0;
                claim.sync = declared.count("sync") > 0;
                claim.background = declared.count("background") > 0;

                json_object_set_new(norm.get(), "supports",
                    json_pack("{s:b,s:b,s:b}", "stream", claim.stream,
                              "sync", claim.sync, "background",
                              claim.background));
            }
        }

        auto dup = seen.find(claim.name);

        if (dup != seen.end()) {
            err(cp, "duplicate claim for " + claim.name + " (also "
                + dup->second + ")");
            continue;
        }

        seen.emplace(claim.name, cp);
        claims.push_back(claim);
        json_array_append_new(out.get(), norm.release());
    }

    return errors.size() == before ? std::move(out) : nullptr;
}


/*
 * Both ways: every hook a declared mode needs is exported, and every
 * exported protocol hook is used by a declared claim and mode.
 */
void
Validator::check_protocol_exports(const std::vector<Claim> &claims)
{
    if (!exports_ok_) {
        return;
    }

    std::map<std::string, const Claim *> by_name;

    for (const Claim &c : claims) {
        std::string cp = index("meta.protocols", c.index);
        std::string base = "protocols." + c.name + ".";
        by_name[c.name] = &c;

        need_export(cp, "", base + "decodeRequest");

        if (c.name != "host_responses") {
            need_export(cp, "", base + "render");
            continue;
        }

        if (!c.supports_ok) {
            continue;
        }

        if (c.stream) {
            need_export(cp, "\"stream\" ", base + "renderEvents");
        }

        if (c.sync && c.background) {
            if (!exported(base + "renderFinal")) {
                err(cp, "\"sync\" and \"background\" need export "
                    + base + "renderFinal");
            }
        } else if (c.sync) {
            need_export(cp, "\"sync\" ", base + "renderFinal");
        } else if (c.background) {
            need_export(cp, "\"background\" ", base + "renderFinal");
        }
    }

    const std::string prefix = "protocols.";

    for (const std::string &e : exports_) {
        if (e.compare(0, prefix.size(), prefix) != 0) {
            continue;
        }

        std::string rest = e.substr(prefix.size());
        size_t dot = rest.find('.');

        if (dot == std::string::npos) {
            continue;           /* the protocols.<p> object itself */
        }

        std::string proto = rest.substr(0, dot);
        std::string hook = rest.substr(dot + 1);
        std::string ep = "exports." + e;

        if (!protocol_known(proto)) {
            err(ep, "unknown protocol " + quote(proto)
                + " (host_video, host_responses, host_image)");
            continue;
        }

        auto it = by_name.find(proto);

        if (it == by_name.end()) {
            err(ep, proto + " is not claimed in meta.protocols");
            continue;
        }

        const Claim &c = *it->second;
        std::string cp = index("meta.protocols", c.index);

        if (proto != "host_responses") {
            if (hook != "decodeRequest" && hook != "render") {
                err(ep, "not a hook of " + proto + " (decodeRequest, "
                    "render)");
            }

            continue;
        }

        if (hook != "decodeRequest" && hook != "renderEvents"
            && hook != "renderFinal")
        {
            err(ep, "not a hook of host_responses (decodeRequest, "
                "renderEvents, renderFinal)");
        } else if (!c.supports_ok) {
            continue;
        } else if (hook == "renderEvents" && !c.stream) {
            err(ep, "no declared mode uses it (needs \"stream\" in "
                + cp + ".supports)");
        } else if (hook == "renderFinal" && !c.sync && !c.background) {
            err(ep, "no declared mode uses it (needs \"sync\" or "
                "\"background\" in " + cp + ".supports)");
        }
    }
}


Json
Validator::check_usage_field(const std::string &path, const json_t *f,
    UsageField &out)
{
    if (!json_is_object(f)) {
        err(path, "must be an object");
        return nullptr;
    }

    size_t before = errors.size();
    unknown_fields(path, f, { "type", "unit", "unitLabel", "description",
                              "enum", "enumLabels" });

    const json_t *type = json_object_get(f, "type");
    const json_t *values = json_object_get(f, "enum");
    const json_t *unit = json_object_get(f, "unit");
    const json_t *unit_label = json_object_get(f, "unitLabel");
    const json_t *labels = json_object_get(f, "enumLabels");
    const json_t *desc = json_object_get(f, "description");
    Json norm(json_object());

    if (type != nullptr && values != nullptr) {
        err(path, "declare either type or enum, not both");
    } else if (type == nullptr && values == nullptr) {
        err(path, "needs type (\"number\" or \"boolean\") or enum");
    } else if (type != nullptr) {
        std::string t = json_is_string(type) ? sv_of(type) : "";

        if (t == "number") {
            out.kind = UsageField::NUMBER;
        } else if (t == "boolean") {
            out.kind = UsageField::BOOLEAN;
        } else {
            err(path + ".type", "must be \"number\" or \"boolean\"");
        }

        if (out.kind != UsageField::INVALID) {
            json_object_set_new(norm.get(), "type", jstr(t).release());
        }

    } else if (!json_is_array(values) || json_array_size(values) == 0) {
        err(path + ".enum", "must be a non-empty array of strings");
    } else {
        size_t mark = errors.size();
        size_t i;
        json_t *item;

        json_array_foreach(values, i, item) {
            if (!json_is_string(item) || json_string_length(item) == 0) {
                err(index(path + ".enum", i), "must be a non-empty string");
                continue;
            }

            std::string s = sv_of(item);

            for (const std::string &x : out.values) {
                if (x == s) {
                    err(index(path + ".enum", i), "duplicate value "
                        + quote(s));
                }
            }

            out.values.push_back(s);
        }

        if (errors.size() == mark) {
            out.kind = UsageField::ENUM;
            json_object_set_new(norm.get(), "enum", json_deep_copy(values));
        }
    }

    /* unit: number fields only, and required there */
    bool is_number = json_is_string(type) && sv_of(type) == "number";

    if (unit == nullptr) {
        if (is_number) {
            err(path + ".unit", "required for number fields (second, count, "
                "token or credit)");
        }

    } else if (!is_number) {
        err(path + ".unit", "only allowed on number fields");
    } else if (!json_is_string(unit) || !one_of(sv_of(unit), USAGE_UNITS)) {
        err(path + ".unit", "must be second, count, token or credit");
    } else {
        out.unit = sv_of(unit);
        json_object_set_new(norm.get(), "unit", jstr(out.unit).release());
    }

    if (desc != nullptr) {
        Json d = localized(path + ".description", desc, USAGE_TEXT_MAX);

        if (d != nullptr) {
            usage_description(path + ".description", desc, d.get());
            json_object_set_new(norm.get(), "description", d.release());
        }
    }

    if (unit_label != nullptr) {
        bool count = is_number && json_is_string(unit)
                     && sv_of(unit) == "count";

        if (!count) {
            err(path + ".unitLabel", "only allowed on number fields with "
                "unit count");
        } else {
            Json l = localized(path + ".unitLabel", unit_label,
                               USAGE_TEXT_MAX);

            if (l != nullptr) {
                json_object_set_new(norm.get(), "unitLabel", l.release());
            }
        }
    }

    if (labels != nullptr) {
        std::string lp = path + ".enumLabels";

        if (values == nullptr) {
            err(lp, "only allowed on enum fields");
        } else if (!json_is_object(labels)) {
            err(lp, "must be an object of enum value to text");
        } else {
            Json nl(json_object());
            const char *k;
            json_t *l;

            json_object_foreach(const_cast<json_t *>(labels), k, l) {
                bool declared = false;

                for (const std::string &x : out.values) {
                    declared = declared || x == k;
                }

                if (!declared) {
                    err(member(lp, k), quote(k)
                        + " is not a declared enum value");
                    continue;
                }

                Json t = localized(member(lp, k), l, USAGE_TEXT_MAX);

                if (t != nullptr) {
                    json_object_set_new(nl.get(), k, t.release());
                }
            }

            json_object_set_new(norm.get(), "enumLabels", nl.release());
        }
    }

    if (errors.size() != before) {
        out.kind = UsageField::INVALID;
        return nullptr;
    }

    return norm;
}


Json
Validator::check_usage_schema(const std::string &path, const json_t *v,
    UsageFields &fields)
{
    if (!json_is_object(v)) {
        err(path, "must be an object of usage fields");
        return nullptr;
    }

    size_t before = errors.size();
    Json out(json_object());
    const char *k;
    json_t *f;

    json_object_foreach(const_cast<json_t *>(v), k, f) {
        std::string fp = member(path, k);
        std::string_view name = k;
        bool ok = !name.empty() && (is_alpha(name[0]) || name[0] == '_');

        for (char c : name) {
            ok = ok && (is_alnum(c) || c == '_' || c == '-');
        }

        if (!ok) {
            err(fp, "field name must start with a letter or '_' and hold "
                "only letters, digits, '_' and '-'");
            continue;
        }

        UsageField uf;
        Json nf = check_usage_field(fp, f, uf);

        if (nf != nullptr) {
            json_object_set_new(out.get(), k, nf.release());
        }

        fields.emplace_back(k, uf);
    }

    return errors.size() == before ? std::move(out) : nullptr;
}


/* Each example's facts: exactly the schema's fields, each of its type. */
Json
Validator::check_usage_examples(const std::string &path, const json_t *v,
    const UsageFields &fields)
{
    if (!json_is_array(v)) {
        err(path, "must be an array of {label, facts}");
        return nullptr;
    }

    size_t before = errors.size();
    size_t i;
    json_t *ex;

    json_array_foreach(v, i, ex) {
        std::string ep = index(path, i);

        if (!json_is_object(ex)) {
            err(ep, "must be an object {label, facts}");
            continue;
        }

        unknown_fields(ep, ex, { "label", "facts" });

        const json_t *label = json_object_get(ex, "label");

        if (!json_is_string(label) || trim(sv_of(label)).empty()) {
            err(ep + ".label", "must be a non-empty string");
        }

        const json_t *facts = json_object_get(ex, "facts");
        std::string fp = ep + ".facts";

        if (!json_is_object(facts)) {
            err(fp, "must be an object of usage facts");
            continue;
        }

        for (const auto &[name, f] : fields) {
            if (json_object_get(facts, name.c_str()) == nullptr) {
                err(fp, "missing " + quote(name) + " (examples are complete "
                    "vectors over the usage schema)");
            }
        }

        const char *k;
        json_t *val;

        json_object_foreach(const_cast<json_t *>(facts), k, val) {
            const UsageField *f = nullptr;

            for (const auto &[name, uf] : fields) {
                if (name == k) {
                    f = &uf;
                }
            }

            std::string vp = member(fp, k);

            if (f == nullptr) {
                err(vp, "not declared in the usage schema");
            } else if (f->kind == UsageField::NUMBER) {
                if (!json_is_number(val) || json_number_value(val) < 0) {
                    err(vp, "must be a non-negative number");
                }
            } else if (f->kind == UsageField::BOOLEAN) {
                if (!json_is_boolean(val)) {
                    err(vp, "must be a boolean");
                }
            } else if (f->kind == UsageField::ENUM) {
                bool found = false;

                for (const std::string &x : f->values) {
                    found = found || (json_is_string(val) && sv_of(val) == x);
                }

                if (!found) {
                    std::string list;

                    for (const std::string &x : f->values) {
                        list += (list.empty() ? "" : ", ") + quote(x);
                    }

                    err(vp, "must be one of " + list);
                }
            }
        }
    }

    return errors.size() == before ? Json(json_deep_copy(v)) : nullptr;
}


/* A schema with a token field needs at least one example. */
void
Validator::check_token_examples(const std::string &path,
    const UsageFields &fields, const json_t *examples)
{
    if (json_is_array(examples) && json_array_size(examples) > 0) {
        return;
    }

    if (examples != nullptr && !json_is_array(examples)) {
        return;                 /* already reported */
    }

    for (const auto &[name, f] : fields) {
        if (f.kind == UsageField::NUMBER && f.unit == "token") {
            err(path, "the token field " + quote(name)
                + " needs at least one example");
            return;
        }
    }
}


Json
Validator::check_usage_profiles(const json_t *v)
{
    const std::string path = "meta.usageProfiles";

    if (!json_is_array(v)) {
        err(path, "must be an array of {models, schema, examples?}");
        return nullptr;
    }

    size_t before = errors.size();
    Json out(json_array());
    std::map<std::string, std::string> owner;
    size_t i;
    json_t *p;

    json_array_foreach(v, i, p) {
        std::string pp = index(path, i);

        if (!json_is_object(p)) {
            err(pp, "must be an object {models, schema, examples?}");
            continue;
        }

        unknown_fields(pp, p, { "models", "schema", "examples" });

        const json_t *models = json_object_get(p, "models");

        if (!json_is_array(models) || json_array_size(models) == 0) {
            err(pp + ".models", "must be a non-empty array of model names");
        } else if (string_list(pp + ".models", models, true, true)
                   != nullptr)
        {
            size_t j;
            json_t *m;

            json_array_foreach(models, j, m) {
                auto it = owner.find(sv_of(m));

                if (it != owner.end()) {
                    err(index(pp + ".models", j), quote(sv_of(m))
                        + " is already in " + it->second
                        + " (a model belongs to at most one profile)");
                } else {
                    owner.emplace(sv_of(m), pp);
                }
            }
        }

        const json_t *schema = json_object_get(p, "schema");
        const json_t *examples = json_object_get(p, "examples");
        UsageFields fields;
        Json np(json_object());

        if (schema == nullptr) {
            err(pp + ".schema", "required (may be {})");
        } else {
            Json s = check_usage_schema(pp + ".schema", schema, fields);

            if (s != nullptr) {
                json_object_set_new(np.get(), "models",
                                    json_deep_copy(models));
                json_object_set_new(np.get(), "schema", s.release());
            }
        }

        if (examples != nullptr) {
            Json e = check_usage_examples(pp + ".examples", examples, fields);

            if (e != nullptr) {
                json_object_set_new(np.get(), "examples", e.release());
            }
        }

        check_token_examples(pp + ".examples", fields, examples);
        json_array_append_new(out.get(), np.release());
    }

    return errors.size() == before ? std::move(out) : nullptr;
}


Json
Validator::check_capabilities(const json_t *v)
{
    const std::string path = "meta.requiredCapabilities";

    if (!json_is_array(v)) {
        err(path, "must be an array of capability names");
        return nullptr;
    }

    bool ok = true;
    size_t i;
    json_t *item;

    json_array_foreach(v, i, item) {
        std::string s = json_is_string(item) ? sv_of(item) : "";

        if (!one_of(s, CAPABILITIES)) {
            err(index(path, i), "unknown capability "
                + (json_is_string(item) ? quote(s) : std::string("(not a "
                   "string)")) + " (supported: json-clone@1, "
                "submit-sse-delta@1; name the exact version)");
            ok = false;
        } else if (!capabilities_.insert(s).second) {
            err(index(path, i), "duplicate capability " + quote(s));
            ok = false;
        }
    }

    return ok ? Json(json_deep_copy(v)) : nullptr;
}


Json
Validator::check_response_types(const json_t *v, bool &sse)
{
    const std::string path = "meta.submitResponseTypes";

    if (!json_is_array(v)) {
        err(path, "must be an array of \"json\" / \"sse\"");
        return nullptr;
    }

    if (json_array_size(v) == 0) {
        err(path, "must not be empty");
        return nullptr;
    }

    std::set<std::string> seen;
    bool ok = true;
    size_t i;
    json_t *item;

    json_array_foreach(v, i, item) {
        std::string s = json_is_string(item) ? sv_of(item) : "";

        if (s != "json" && s != "sse") {
            err(index(path, i), "must be \"json\" or \"sse\"");
            ok = false;
        } else if (!seen.insert(s).second) {
            err(index(path, i), "duplicate value " + quote(s));
            ok = false;
        }
    }

    sse = seen.count("sse") > 0;
    return ok ? Json(json_deep_copy(v)) : nullptr;
}


int
Validator::run(const char *meta, size_t meta_len, const char *exports,
    size_t exports_len, std::string &normalized)
{
    parse_exports(exports, exports_len);

    Json root = meta != nullptr ? json_parse(meta, meta_len) : nullptr;

    if (root == nullptr) {
        err("meta", "not valid JSON");
        return -1;
    }

    const json_t *m = root.get();

    if (!json_is_object(m)) {
        err("meta", "must be an object");
        return -1;
    }

    /* unknown and legacy fields */
    {
        const char *k;
        json_t *v;

        json_object_foreach(const_cast<json_t *>(m), k, v) {
            if (one_of(k, KNOWN_FIELDS)) {
                continue;
            }

            const Legacy *legacy = nullptr;

            for (const Legacy &l : LEGACY) {
                if (std::strcmp(l.name, k) == 0) {
                    legacy = &l;
                }
            }

            if (legacy != nullptr) {
                err(member("meta", k), std::string("legacy field, no longer "
                    "supported (") + legacy->hint + ")");
                continue;
            }

            std::string list;

            for (const char *f : KNOWN_FIELDS) {
                list += (list.empty() ? "" : ", ") + std::string(f);
            }

            err(member("meta", k), "unknown field (older hosts reject "
                "unrecognized fields; known fields: " + list + ")");
        }
    }

    std::map<std::string, Json> out;
    auto get = [m](const char *k) { return json_object_get(m, k); };
    auto keep = [&out](const char *k, Json v) {
        if (v != nullptr) {
            out[k] = std::move(v);
        }
    };

    /* apiVersion */
    {
        const json_t *v = get("apiVersion");
        int64_t n;

        if (v == nullptr) {
            err("meta.apiVersion", "required");
        } else if (!integral(v, n) || n != 1) {
            err("meta.apiVersion", "must be 1");
        } else {
            keep("apiVersion", Json(json_integer(1)));
        }
    }

    /* key */
    {
        const json_t *v = get("key");

        if (v == nullptr) {
            err("meta.key", "required");
        } else if (!json_is_string(v)) {
            err("meta.key", "must be a string");
        } else if (json_string_length(v) == 0) {
            err("meta.key", "must not be empty");
        } else {
            std::string s = sv_of(v);
            bool safe = true;

            for (char c : s) {
                safe = safe && (is_alnum(c) || c == '-' || c == '_');
            }

            if (cp_len(s) > KEY_MAX) {
                err("meta.key", "at most " + std::to_string(KEY_MAX)
                    + " characters");
            }

            if (!safe) {
                err("meta.key", "must be a safe identifier (letters, digits, "
                    "'-' and '_' only)");
            }

            if (safe && cp_len(s) <= KEY_MAX) {
                keep("key", jstr(s));
            }
        }
    }

    /* name */
    {
        const json_t *v = get("name");

        if (v == nullptr) {
            err("meta.name", "required");
        } else if (!json_is_string(v) || trim(sv_of(v)).empty()) {
            err("meta.name", "must be a non-empty string");
        } else if (has_control(sv_of(v))) {
            err("meta.name", "must not contain control characters");
        } else {
            keep("name", jstr(trim(sv_of(v))));
        }
    }

    /* version */
    {
        static const std::regex semver(SEMVER_RE);
        const json_t *v = get("version");

        if (v == nullptr) {
            err("meta.version", "required");
        } else if (!json_is_string(v)
                   || !std::regex_match(sv_of(v), semver))
        {
            err("meta.version", "must be a semantic version "
                "(MAJOR.MINOR.PATCH, e.g. 1.0.0)");
        } else {
            keep("version", Json(json_deep_copy(v)));
        }
    }

    /* author */
    if (get("author") == nullptr) {
        err("meta.author", "required");
    } else {
        keep("author", check_author(get("author")));
    }

    /* description */
    if (get("description") != nullptr) {
        keep("description",
             localized("meta.description", get("description"),
                       DESCRIPTION_MAX));
    }

    if (get("icon") != nullptr) {
        keep("icon", check_icon(get("icon")));
    }

    /* website: empty or https */
    if (const json_t *v = get("website"); v != nullptr) {
        if (!json_is_string(v)) {
            err("meta.website", "must be a string");
        } else if (json_string_length(v) == 0) {
            keep("website", jstr(""));
        } else {
            size_t before = errors.size();
            check_url("meta.website", sv_of(v), true, false,
                      "empty or an absolute https URL");

            if (errors.size() == before) {
                keep("website", Json(json_deep_copy(v)));
            }
        }
    }

    /* sortPriority: signed 32-bit, default 0 */
    {
        const json_t *v = get("sortPriority");
        int64_t n = 0;

        if (v != nullptr && (!integral(v, n) || n < INT32_MIN
                             || n > INT32_MAX))
        {
            err("meta.sortPriority", "must be a signed 32-bit integer");
        } else {
            keep("sortPriority", Json(json_integer(n)));
        }
    }

    /* models */
    if (const json_t *v = get("models"); v == nullptr) {
        err("meta.models", "required");
    } else {
        Json models = string_list("meta.models", v, false, true);

        if (models != nullptr) {
            size_t i;
            json_t *item;

            json_array_foreach(v, i, item) {
                models_.insert(sv_of(item));
            }

            models_ok_ = true;
            keep("models", std::move(models));
        }
    }

    /* fetchMode */
    std::string fetch_mode;

    if (const json_t *v = get("fetchMode"); v == nullptr) {
        err("meta.fetchMode", "required");
    } else if (!json_is_string(v)
               || (sv_of(v) != "per_task" && sv_of(v) != "batch"))
    {
        err("meta.fetchMode", "must be \"per_task\" or \"batch\"");
    } else {
        fetch_mode = sv_of(v);
        keep("fetchMode", jstr(fetch_mode));
    }

    if (get("baseUrl") != nullptr) {
        keep("baseUrl", check_base_url(get("baseUrl")));
    }

    if (get("allowedHosts") != nullptr) {
        keep("allowedHosts", check_allowed_hosts(get("allowedHosts")));
    }

    if (get("upstreams") != nullptr) {
        keep("upstreams", check_upstreams(get("upstreams")));
    } else {
        keep("upstreams", Json(json_pack("[s]", "vendor")));
    }

    if (get("auth") != nullptr) {
        keep("auth", check_auth(get("auth")));
    }

    if (get("channelTypes") != nullptr) {
        keep("channelTypes", check_channel_types(get("channelTypes")));
    }

    if (get("routes") != nullptr) {
        keep("routes", check_routes(get("routes")));
    }

    std::vector<Claim> claims;

    if (get("protocols") != nullptr) {
        keep("protocols", check_protocols(get("protocols"), claims));
    }

    /* usage declarations */
    {
        UsageFields fields;
        const json_t *schema = get("usageSchema");
        const json_t *examples = get("usageExamples");

        if (schema != nullptr) {
            keep("usageSchema",
                 check_usage_schema("meta.usageSchema", schema, fields));
        }

        if (examples != nullptr) {
            keep("usageExamples",
                 check_usage_examples("meta.usageExamples", examples,
                                      fields));
        }

        check_token_examples("meta.usageExamples", fields, examples);

        if (get("usageProfiles") != nullptr) {
            keep("usageProfiles", check_usage_profiles(get("usageProfiles")));
        }
    }

    if (get("requiredCapabilities") != nullptr) {
        keep("requiredCapabilities",
             check_capabilities(get("requiredCapabilities")));
    }

    bool sse = false;

    if (get("submitResponseTypes") != nullptr) {
        keep("submitResponseTypes",
             check_response_types(get("submitResponseTypes"), sse));
    } else {
        keep("submitResponseTypes", Json(json_pack("[s]", "json")));
    }

    /* exports the declarations call for */
    if (exports_ok_) {
        for (const char *hook : { "buildSubmitRequest", "parseSubmitResponse",
                                  "parseTaskResult" })
        {
            if (!exported(hook)) {
                err("exports", std::string("missing ") + hook
                    + " (required for all plugins)");
            }
        }

        if (fetch_mode == "per_task") {
            need_export("meta.fetchMode", "\"per_task\" ",
                        "buildQueryRequest");
        } else if (fetch_mode == "batch") {
            need_export("meta.fetchMode", "\"batch\" ",
                        "buildBatchQueryRequest");
            need_export("meta.fetchMode", "\"batch\" ", "parseBatchResult");
        }

        if (exported("listArtifacts") && !exported("buildContentRequest")) {
            err("exports.listArtifacts", "needs buildContentRequest "
                "(exported as a pair)");
        }

        if (exported("buildContentRequest") && !exported("listArtifacts")) {
            err("exports.buildContentRequest", "needs listArtifacts "
                "(exported as a pair)");
        }

        if (sse && capabilities_.count("submit-sse-delta@1")) {
            need_export("meta.submitResponseTypes", "\"sse\" with "
                        "submit-sse-delta@1 ", "parseSubmitEventDelta");
        } else if (sse) {
            need_export("meta.submitResponseTypes", "\"sse\" ",
                        "parseSubmitEvent");
        }

        check_protocol_exports(claims);
    }

    if (!errors.empty()) {
        return -1;
    }

    Json norm(json_object());

    for (const char *f : KNOWN_FIELDS) {
        auto it = out.find(f);

        if (it != out.end()) {
            no_control(member("meta", f), it->second.get());
            json_object_set_new(norm.get(), f, it->second.release());
        }
    }

    if (!errors.empty()) {
        return -1;
    }

    normalized = json_dump(norm.get());
    return 0;
}


/*
 * Every text the gateway stores and serves is free of control characters,
 * whichever field holds it (the fields with a rule of their own said so
 * before; a NUL cannot even be stored).  The first one found is named.
 */
bool
Validator::no_control(const std::string &path, const json_t *v)
{
    if (json_is_string(v)) {
        if (has_control(sv_of(v))) {
            err(path, "must not contain control characters");
            return false;
        }

        return true;
    }

    if (json_is_array(v)) {
        size_t i;
        json_t *x;

        json_array_foreach(const_cast<json_t *>(v), i, x) {
            if (!no_control(index(path, i), x)) {
                return false;
            }
        }

        return true;
    }

    const char *k;
    json_t *x;

    json_object_foreach(const_cast<json_t *>(v), k, x) {
        std::string kp = member(path, k);

        if (has_control(k)) {
            err(kp, "the name must not contain control characters");
            return false;
        }

        if (!no_control(kp, x)) {
            return false;
        }
    }

    return true;
}

} /* namespace */
} /* namespace llmgw */


extern "C" const char *
llmgw_protocol_name(const char *name)
{
    static const char *const spec[] = { "host_video", "host_responses",
                                        "host_image" };

    for (const char *n : spec) {
        if (llmgw::protocol_alias(name) == n) {
            return n;
        }
    }
    return name;
}


extern "C" int
llmgw_manifest_validate(const char *meta_json, size_t meta_len,
    const char *exports_json, size_t exports_len, llmgw_buf_t *normalized,
    llmgw_buf_t *errors)
{
    if (normalized != nullptr) {
        *normalized = llmgw_buf_t { nullptr, 0 };
    }

    if (errors != nullptr) {
        *errors = llmgw_buf_t { nullptr, 0 };
    }

    try {
        llmgw::Validator v;
        std::string norm;
        int rc = v.run(meta_json, meta_len,
                       exports_json != nullptr ? exports_json : "[]",
                       exports_json != nullptr ? exports_len : 2, norm);

        if (rc == 0) {
            if (normalized != nullptr) {
                *normalized = llmgw::make_buf(norm);
            }

            return 0;
        }

        if (errors != nullptr) {
            llmgw::Json list(json_array());

            for (const std::string &e : v.errors) {
                json_array_append_new(list.get(),
                                      json_stringn(e.data(), e.size()));
            }

            *errors = llmgw::make_buf(llmgw::json_dump(list.get()));
        }

    } catch (...) {
        if (errors != nullptr) {
            llmgw_buf_free(errors);
            *errors = llmgw::make_buf("[\"meta: validation failed "
                                      "(out of memory)\"]");
        }
    }

    return -1;
}
