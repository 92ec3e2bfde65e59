/*
 * Plugin marketplace sources: reading an index (indexVersion 1), listing
 * what it offers, choosing a version, and checking what was downloaded
 * against the index (sha256, then key and version of the compiled
 * manifest) before it goes the way of an ordinary upload.
 *
 * A source is an http(s) URL or a local file (file:///path or /path).  A
 * remote index may only point at remote sources, a local one only at local
 * files next to it: a published index cannot make the gateway read its own
 * disk.
 */

#include "market.h"

#include <cstring>
#include <string>

#include "internal.h"

using namespace llmgw;

namespace {

constexpr size_t kMaxUrl = 2048;

bool
is_remote(std::string_view url)
{
    return url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0;
}

/* A local file's path: file:///abs or /abs; empty when it is neither. */
std::string
local_path(std::string_view url)
{
    if (url.rfind("file://", 0) == 0) {
        url.remove_prefix(7);
        if (url.rfind("localhost/", 0) == 0) {
            url.remove_prefix(9);
        }
    }
    if (url.empty() || url.front() != '/') {
        return {};
    }
    return std::string(url);
}

/* The folder part of a URL or path, with its trailing slash. */
std::string_view
folder_of(std::string_view url)
{
    size_t q = url.find_first_of("?#");
    if (q != std::string_view::npos) {
        url = url.substr(0, q);
    }
    size_t slash = url.rfind('/');
    return slash == std::string_view::npos ? url : url.substr(0, slash + 1);
}

bool
has_dot_segment(std::string_view p)
{
    size_t i = 0;

    while (i <= p.size()) {
        size_t j = p.find('/', i);
        if (j == std::string_view::npos) {
            j = p.size();
        }
        std::string_view seg = p.substr(i, j - i);
        if (seg == "..") {
            return true;
        }
        i = j + 1;
    }
    return false;
}

/* Where an index's "path" points, resolved against the index's URL. */
bool
resolve(std::string_view index_url, std::string_view path, std::string &out,
    std::string &err)
{
    if (path.empty() || path.size() > kMaxUrl) {
        err = "has no usable path";
        return false;
    }

    for (unsigned char c : path) {
        if (c < 0x21 || c == 0x7f || c == '\\') {
            err = "path has spaces, control characters or backslashes";
            return false;
        }
    }

    bool remote = is_remote(index_url);

    if (is_remote(path)) {
        if (!remote) {
            err = "a local index may only name files next to it";
            return false;
        }
        out = std::string(path);
        return true;
    }

    if (path.find("://") != std::string_view::npos || path.front() == '/') {
        err = "path must be relative to the index";
        return false;
    }

    if (has_dot_segment(path)) {
        err = "path must not leave the index's folder";
        return false;
    }

    out = std::string(folder_of(index_url)) + std::string(path);
    return true;
}

/* How deep an index is read for credentials; its own fields sit at 4. */
constexpr int kMaxIndexDepth = 16;

/* A member name that says it holds a secret (apiKey, client_secret,
   accessToken, password, ...); not "key", the plugin's key. */
bool
secret_name(std::string_view name)
{
    static constexpr std::string_view kParts[] = {
        "password", "passwd", "secret", "apikey", "accesskey", "privatekey",
        "credential", "authorization", "cookie"
    };
    std::string n;

    for (char c : name) {
        if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')) {
            n += c;
        } else if (c >= 'A' && c <= 'Z') {
            n += static_cast<char>(c - 'A' + 'a');
        }
    }

    for (std::string_view p : kParts) {
        if (n.find(p) != std::string::npos) {
            return true;
        }
    }

    return n == "auth" || n == "pwd"
           || (n.size() >= 5 && n.compare(n.size() - 5, 5, "token") == 0);
}

/* A URL whose authority holds user:pass@. */
bool
has_userinfo(std::string_view s)
{
    size_t at = s.find("://");

    if (at == std::string_view::npos) {
        return false;
    }

    std::string_view auth = s.substr(at + 3);
    auth = auth.substr(0, auth.find_first_of("/?#"));

    return auth.find('@') != std::string_view::npos;
}

/*
 * Where in an index a credential is published (a secret-looking member, a
 * URL with user:pass@), as "plugins[0].versions[1].path", with why; false
 * when there is none.  What is nested deeper than any index field is
 * refused too: it is listed as it came, unread.
 */
bool
find_credential(const json_t *j, std::string &where, const char *&why,
    int depth)
{
    if (depth > kMaxIndexDepth) {
        why = "nested too deeply to be checked for credentials";
        return true;
    }

    if (json_is_string(j)) {
        why = "a URL with a user name or password";
        return has_userinfo(std::string_view(json_string_value(j),
                                             json_string_length(j)));
    }

    size_t      mark = where.size();
    const char *k;
    json_t     *x;
    size_t      i;

    json_object_foreach(const_cast<json_t *>(j), k, x) {
        where += '.';
        where += utf8_prefix(k, 64);
        if (secret_name(k)) {
            why = "a member named like a secret";
            return true;
        }
        if (find_credential(x, where, why, depth + 1)) {
            return true;
        }
        where.resize(mark);
    }

    json_array_foreach(const_cast<json_t *>(j), i, x) {
        where += '[' + std::to_string(i) + ']';
        if (find_credential(x, where, why, depth + 1)) {
            return true;
        }
        where.resize(mark);
    }

    return false;
}

/* The index as a JSON object, or a verdict. */
Json
read_index(const char *index, size_t len, llmgw_verdict_t *v)
{
    Json root = json_parse(index, len);

    if (!json_is_object(root.get())) {
        llmgw_verdict_set(v, 502, "gateway_error", "invalid_marketplace",
                          "the marketplace index is not a JSON object");
        return nullptr;
    }

    /* a listing shows the index's fields, and a source is fetched from
       its path: neither may carry a secret (the value is not repeated) */
    std::string where;
    const char *why = "";

    if (find_credential(root.get(), where, why, 0)) {
        llmgw_verdict_set(v, 502, "gateway_error", "invalid_marketplace",
                          "the marketplace index carries a credential at "
                          "%s (%s); an index is public and must not",
                          where.empty() ? "its root" : where.c_str() + 1,
                          why);
        return nullptr;
    }

    if (json_int(root.get(), "indexVersion", 0) != 1) {
        llmgw_verdict_set(v, 502, "gateway_error", "invalid_marketplace",
                          "the marketplace index is not indexVersion 1");
        return nullptr;
    }

    if (!json_is_array(json_object_get(root.get(), "plugins"))) {
        llmgw_verdict_set(v, 502, "gateway_error", "invalid_marketplace",
                          "the marketplace index has no plugins list");
        return nullptr;
    }

    return root;
}

const json_t *
find_plugin(const json_t *root, std::string_view key)
{
    return json_find_by(json_object_get(root, "plugins"), "key", key);
}

char *
dup(std::string_view s)
{
    char *p = static_cast<char *>(std::malloc(s.size() + 1));
    if (p == nullptr) {
        throw std::bad_alloc();
    }
    std::memcpy(p, s.data(), s.size());
    p[s.size()] = '\0';
    return p;
}

} /* namespace */


extern "C" int
llmgw_market_parse(const char *body, size_t len, llmgw_market_req_t *m,
    llmgw_verdict_t *v)
{
    std::memset(m, 0, sizeof(*m));

    try {
        Json root = json_parse(body, len);

        if (!json_is_object(root.get())) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "the body must be a JSON object with url");
            return -1;
        }

        if (!plugin_admin_members(root.get(), { "url", "key", "version",
                                                "remark", "enabled", "force" },
                                  v))
        {
            return -1;
        }

        json_t *url = json_object_get(root.get(), "url");

        if (!json_is_string(url) || json_string_length(url) == 0
            || json_string_length(url) > kMaxUrl)
        {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "url: the marketplace index address is "
                              "required (http(s)://..., file:///... or an "
                              "absolute path)");
            return -1;
        }

        std::string_view u = json_string_value(url);

        if (!is_remote(u) && local_path(u).empty()) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "url: must be http(s)://..., file:///... or "
                              "an absolute path");
            return -1;
        }

        for (const char *k : { "key", "version" }) {
            json_t *x = json_object_get(root.get(), k);
            if (x != nullptr && !json_is_null(x)
                && (!json_is_string(x) || json_string_length(x) == 0))
            {
                llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                                  "%s: must be a non-empty string", k);
                return -1;
            }
        }

        m->url = dup(u);
        json_t *key = json_object_get(root.get(), "key");
        if (json_is_string(key)) {
            m->key = dup(json_string_value(key));
        }
        json_t *ver = json_object_get(root.get(), "version");
        if (json_is_string(ver)) {
            m->version = dup(json_string_value(ver));
        }
        return 0;

    } catch (...) {
        llmgw_market_req_free(m);
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "out of memory");
        return -1;
    }
}


extern "C" void
llmgw_market_req_free(llmgw_market_req_t *m)
{
    std::free(m->url);
    std::free(m->key);
    std::free(m->version);
    std::memset(m, 0, sizeof(*m));
}


extern "C" int
llmgw_market_locate(const char *url, llmgw_outbound_t *out, llmgw_buf_t *path,
    llmgw_verdict_t *v)
{
    std::string_view u(url);

    *path = llmgw_buf_t { nullptr, 0 };

    try {
        if (is_remote(u)) {
            /* the descriptor rules of a public download */
            Json d(json_object());
            json_object_set_new(d.get(), "url", json_stringn(u.data(),
                                                             u.size()));
            json_object_set_new(d.get(), "method", json_string("GET"));
            json_object_set_new(d.get(), "credentialless", json_true());
            std::string text = json_dump(d.get());

            llmgw_desc_policy_t p;
            std::memset(&p, 0, sizeof(p));
            p.base_url = str(u);
            p.allow_credentialless = 1;

            char err[512];

            if (llmgw_descriptor_build(text.data(), text.size(), &p, out, err,
                                       sizeof(err)) != 0)
            {
                llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                                  "url: %s", err);
                return -1;
            }
            return 1;
        }

        std::string p = local_path(u);

        if (p.empty()) {
            llmgw_verdict_set(v, 400, "gateway_error", "invalid_request",
                              "url: not an http(s) address or a local file");
            return -1;
        }

        *path = make_buf(p);
        return 0;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "out of memory");
        return -1;
    }
}


extern "C" int
llmgw_market_listing(const char *index, size_t len, const char *url,
    const llmgw_snapshot_t *s, llmgw_buf_t *out, llmgw_verdict_t *v)
{
    try {
        Json root = read_index(index, len, v);
        if (!root) {
            return -1;
        }

        Json list(json_array());
        size_t   i;
        json_t  *p;

        json_array_foreach(json_object_get(root.get(), "plugins"), i, p) {
            if (!json_is_object(p) || json_str(p, "key").empty()) {
                continue;
            }

            json_t *o = json_object();
            for (const char *k : { "key", "name", "description", "channelTypes",
                                   "models", "latest", "icon" })
            {
                json_t *x = json_object_get(p, k);
                if (x != nullptr) {
                    json_object_set(o, k, x);
                }
            }

            json_t *versions = json_array();
            size_t   k;
            json_t  *ver;
            json_array_foreach(json_object_get(p, "versions"), k, ver) {
                json_t *e = json_object();
                for (const char *f : { "version", "sha256", "minApiVersion",
                                       "kind" })
                {
                    json_t *x = json_object_get(ver, f);
                    if (x != nullptr) {
                        json_object_set(e, f, x);
                    }
                }
                json_array_append_new(versions, e);
            }
            json_object_set_new(o, "versions", versions);

            /* the version this gateway stores as active, also for a
               disabled plugin (whose tasks it still polls) */
            std::string key(json_str(p, "key"));
            long idx = snap_poll_plugin_find(s, key);
            SnapPluginInfo info {};
            if (idx >= 0) {
                snap_plugin(s, static_cast<size_t>(idx), &info);
            }
            json_object_set_new(o, "installed",
                                idx >= 0 ? json_stringn(info.version.data(),
                                                        info.version.size())
                                         : json_null());
            json_array_append_new(list.get(), o);
        }

        Json res(json_object());
        json_object_set_new(res.get(), "url", json_string(url));
        json_t *name = json_object_get(root.get(), "name");
        json_object_set_new(res.get(), "name",
                            json_is_string(name) ? json_incref(name)
                                                 : json_string(""));
        json_object_set(res.get(), "plugins", list.get());

        *out = make_buf(json_dump(res.get()));
        return out->data ? 0 : -1;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "out of memory");
        return -1;
    }
}


extern "C" int
llmgw_market_pick(const char *index, size_t len, const char *index_url,
    const char *key, const char *version, llmgw_buf_t *src, char sha[65],
    llmgw_buf_t *ver, llmgw_verdict_t *v)
{
    *src = llmgw_buf_t { nullptr, 0 };
    *ver = llmgw_buf_t { nullptr, 0 };

    try {
        Json root = read_index(index, len, v);
        if (!root) {
            return -1;
        }

        const json_t *p = find_plugin(root.get(), key);

        if (p == nullptr) {
            llmgw_verdict_set(v, 404, "gateway_error", "not_found",
                              "the marketplace offers no plugin %.64s", key);
            return -1;
        }

        std::string want = version ? version
                                   : std::string(json_str(p, "latest"));
        const json_t *entry = nullptr;
        size_t   i;
        json_t  *e;

        json_array_foreach(json_object_get(p, "versions"), i, e) {
            if (json_str(e, "version") == want) {
                entry = e;
            }
        }

        if (entry == nullptr) {
            llmgw_verdict_set(v, 404, "gateway_error", "not_found",
                              "the marketplace offers no version %.64s of "
                              "plugin %.64s", want.empty() ? "(latest)"
                                                           : want.c_str(),
                              key);
            return -1;
        }

        if (json_int(entry, "minApiVersion", 1) > 1) {
            llmgw_verdict_set(v, 400, "gateway_error", "unsupported_plugin",
                              "plugin %.64s %.64s needs plugin API version "
                              "%lld; this gateway speaks version 1", key,
                              want.c_str(),
                              (long long) json_int(entry, "minApiVersion", 1));
            return -1;
        }

        std::string_view digest = json_str(entry, "sha256");

        if (digest.size() != 64
            || digest.find_first_not_of("0123456789abcdefABCDEF")
               != std::string_view::npos)
        {
            llmgw_verdict_set(v, 502, "gateway_error", "invalid_marketplace",
                              "the index gives plugin %.64s %.64s no valid "
                              "sha256", key, want.c_str());
            return -1;
        }

        std::string url, err;

        if (!resolve(index_url, json_str(entry, "path"), url, err)) {
            llmgw_verdict_set(v, 502, "gateway_error", "invalid_marketplace",
                              "plugin %.64s %.64s: %s", key, want.c_str(),
                              err.c_str());
            return -1;
        }

        for (size_t k = 0; k < 64; k++) {
            char c = digest[k];
            sha[k] = (c >= 'A' && c <= 'F') ? static_cast<char>(c - 'A' + 'a')
                                            : c;
        }
        sha[64] = '\0';

        *src = make_buf(url);
        *ver = make_buf(want);
        return 0;

    } catch (...) {
        llmgw_buf_free(src);
        llmgw_buf_free(ver);
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "out of memory");
        return -1;
    }
}


extern "C" int
llmgw_market_upload_body(const char *source, size_t len, const char *sha,
    const char *admin_body, size_t blen, llmgw_buf_t *out, llmgw_verdict_t *v)
{
    try {
        std::string got = sha256_hex(std::string_view(source, len));

        if (got != sha) {
            llmgw_verdict_set(v, 502, "gateway_error", "checksum_mismatch",
                              "the downloaded plugin does not match the "
                              "index's sha256 (got %s)", got.c_str());
            return -1;
        }

        Json src = Json(json_stringn(source, len));

        if (!src) {
            llmgw_verdict_set(v, 502, "gateway_error", "invalid_plugin",
                              "the downloaded plugin is not UTF-8 text");
            return -1;
        }

        Json admin = json_parse(admin_body, blen);
        Json body(json_object());

        json_object_set(body.get(), "source", src.get());

        for (const char *k : { "remark", "enabled", "force" }) {
            json_t *x = json_object_get(admin.get(), k);
            if (x != nullptr) {
                json_object_set(body.get(), k, x);
            }
        }

        *out = make_buf(json_dump(body.get()));
        return out->data ? 0 : -1;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "out of memory");
        return -1;
    }
}


extern "C" int
llmgw_market_check_manifest(const char *reply, size_t len, const char *key,
    const char *version, llmgw_verdict_t *v)
{
    try {
        Json r = json_parse(reply, len);
        json_t *m = json_object_get(r.get(), "manifest");

        if (json_str(m, "key") != key || json_str(m, "version") != version) {
            llmgw_verdict_set(v, 502, "gateway_error", "invalid_marketplace",
                              "the index lists %.64s %.64s but the plugin "
                              "says %.64s %.64s", key, version,
                              std::string(json_str(m, "key")).c_str(),
                              std::string(json_str(m, "version")).c_str());
            return -1;
        }
        return 0;

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "out of memory");
        return -1;
    }
}


namespace {

void
append_xml(std::string &out, std::string_view s)
{
    for (char c : s) {
        switch (c) {
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '&': out += "&amp;"; break;
        case '"': out += "&quot;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
        }
    }
}

/* Up to two initials of the words of a name. */
std::string
initials(std::string_view name)
{
    std::string out;
    bool start = true;

    for (char c : name) {
        bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z')
                     || (c >= 'A' && c <= 'Z');
        if (alnum && start && out.size() < 2) {
            out += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : c;
        }
        start = !alnum;
    }

    return out.empty() ? std::string("?") : out;
}

} /* namespace */


extern "C" llmgw_buf_t
llmgw_plugin_icon_svg(const char *icon, const char *name)
{
    try {
        std::string_view ic(icon ? icon : "");
        std::string label, library;

        if (ic.rfind("text:", 0) == 0) {
            label = std::string(utf8_prefix(ic.substr(5), 12));
        } else if (ic.empty() || ic == "text") {
            label = initials(name ? name : "");
        } else {
            /* an icon-library name: the client draws it; we show initials */
            library = std::string(ic);
            size_t colon = ic.rfind(':');
            label = initials(colon == std::string_view::npos
                             ? ic : ic.substr(colon + 1));
        }

        std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" "
                          "width=\"64\" height=\"64\" viewBox=\"0 0 64 64\"";
        if (!library.empty()) {
            out += " data-icon=\"";
            append_xml(out, library);
            out += "\"";
        }
        out += "><rect width=\"64\" height=\"64\" rx=\"12\" fill=\"#4b5563\"/>"
               "<text x=\"32\" y=\"32\" dominant-baseline=\"central\" "
               "text-anchor=\"middle\" font-family=\"sans-serif\" "
               "font-size=\"";
        out += label.size() > 3 ? "14" : "24";
        out += "\" fill=\"#ffffff\">";
        append_xml(out, label);
        out += "</text></svg>\n";

        return make_buf(out);

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}
