/*
 * The configuration snapshot a worker routes with: channels, groups, rate
 * limits and admin token hashes, parsed once per revision from the JSON that
 * llmgw_snapshot() returns.
 */

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "internal.h"

using namespace llmgw;

namespace {

struct Channel {
    llmgw_channel_t                               pub {};
    std::string                                   name, host, host_header;
    std::string                                   base_path, key, base_url;
    std::vector<std::string>                      key_forms;
    Json                                          settings;
    std::unordered_set<std::string>               groups;
    std::unordered_map<std::string, std::string>  mapping;
};

struct Group {
    double  ratio = 1.0;
    bool    deprecated = false;
};

/* A published plugin version of this generation. */
struct Plugin {
    std::string  key, version, sha, manifest;
    Json         parsed;
};

} /* namespace */

struct llmgw_snapshot_s {
    int64_t                                                revision = 0;
    std::deque<Channel>                                    channels;
    std::unordered_map<std::string, std::vector<Channel *>> by_model;
    std::unordered_map<int64_t, const Channel *>           by_id;
    /* disabled channels: their running tasks are still polled */
    std::unordered_map<int64_t, const Channel *>           poll_by_id;
    std::unordered_map<std::string, Group>                 groups;
    std::unordered_map<std::string, llmgw_price_t>         prices;
    Json                                                   price_entries;
    llmgw_rate_limit_t                                     rl_default {};
    std::unordered_map<std::string, llmgw_rate_limit_t>    rl_groups;
    /* the groups' windows by llmgw_rl_group_hash(): what the shared
       zone, which keeps no names, asks about */
    std::unordered_map<uint64_t, int64_t>                  rl_windows;
    std::vector<std::string>                               admin_hashes;
    std::vector<Plugin>                                    plugins;
    /* disabled plugins (after plugins in snap_plugin's numbering) */
    std::vector<Plugin>                                    poll_plugins;
};

namespace {

/* Splits "https://host:port/path" into the channel's address fields. */
bool
parse_base_url(std::string_view url, Channel &c)
{
    bool tls;

    if (url.rfind("https://", 0) == 0) {
        tls = true;
        url.remove_prefix(8);
    } else if (url.rfind("http://", 0) == 0) {
        tls = false;
        url.remove_prefix(7);
    } else {
        return false;
    }

    size_t slash = url.find('/');
    std::string_view authority = url.substr(0, slash);
    std::string_view path = slash == std::string_view::npos
                            ? std::string_view() : url.substr(slash);

    while (!path.empty() && path.back() == '/') {
        path.remove_suffix(1);
    }

    if (authority.empty() || authority.find('@') != std::string_view::npos) {
        return false;
    }

    std::string_view host = authority;
    std::string_view port;

    if (authority.front() == '[') {
        size_t close = authority.find(']');
        if (close == std::string_view::npos) {
            return false;
        }
        host = authority.substr(1, close - 1);
        if (close + 1 < authority.size()) {
            if (authority[close + 1] != ':') {
                return false;
            }
            port = authority.substr(close + 2);
        }

    } else {
        size_t colon = authority.rfind(':');
        if (colon != std::string_view::npos) {
            host = authority.substr(0, colon);
            port = authority.substr(colon + 1);
        }
    }

    long p = tls ? 443 : 80;

    if (!port.empty()) {
        p = 0;
        for (char ch : port) {
            if (ch < '0' || ch > '9' || p > 65535) {
                return false;
            }
            p = p * 10 + (ch - '0');
        }
        if (p < 1 || p > 65535) {
            return false;
        }
    }

    if (host.empty()) {
        return false;
    }

    c.host.assign(host);
    c.host_header.assign(authority);
    c.base_path.assign(path);
    c.pub.tls = tls;
    c.pub.port = static_cast<uint16_t>(p);
    return true;
}

void
add_strings(const json_t *arr, std::unordered_set<std::string> &out)
{
    size_t   i;
    json_t  *v;

    json_array_foreach(arr, i, v) {
        if (json_is_string(v)) {
            out.emplace(json_string_value(v), json_string_length(v));
        }
    }
}

bool
has_control(std::string_view s)
{
    return std::any_of(s.begin(), s.end(), [](char ch) {
        unsigned char c = static_cast<unsigned char>(ch);
        return c < 0x20 || c == 0x7f;
    });
}

std::string_view
string_of(const json_t *v)
{
    return json_is_string(v)
           ? std::string_view(json_string_value(v), json_string_length(v))
           : std::string_view();
}

/*
 * Why a channel's text cannot go into a request head, or nullptr: its key
 * is a header value and its upstream model names go into the request line
 * or body, where a CR or LF would start a header of its own.  The admin API
 * refuses such values; rows written before it did, or by hand, stay out.
 */
const char *
unsafe_text(const json_t *j)
{
    size_t       i;
    const char  *k;
    json_t      *v;

    if (has_control(json_str(j, "key"))) {
        return "its key holds a control character";
    }

    json_array_foreach(json_object_get(j, "models"), i, v) {
        if (has_control(string_of(v))) {
            return "a model name holds a control character";
        }
    }

    json_object_foreach(json_object_get(j, "model_mapping"), k, v) {
        if (has_control(k) || has_control(string_of(v))) {
            return "a model_mapping entry holds a control character";
        }
    }

    return nullptr;
}

/* A channel of the snapshot, or a line added to left_out saying why not. */
bool
parse_channel(const json_t *j, llmgw_snapshot_s &s, std::string &left_out,
    bool routable = true)
{
    Channel &c = s.channels.emplace_back();
    const char *why = parse_base_url(json_str(j, "base_url"), c)
                      ? unsafe_text(j)
                      : "its base_url is not http(s)://host[:port][/path]";

    if (why != nullptr) {
        s.channels.pop_back();
        left_out += left_out.empty() ? "left out " : "; ";
        left_out += "channel " + std::to_string(json_int(j, "id", 0)) + ": "
                    + why;
        return false;
    }

    c.name = json_str(j, "name");
    c.key = json_str(j, "key");
    c.base_url = json_str(j, "base_url");
    c.settings = Json(json_incref(json_object_get(j, "settings")));
    c.pub.id = json_int(j, "id", 0);
    c.pub.type = static_cast<int>(json_int(j, "type", 0));
    c.pub.priority = json_int(j, "priority", 0);
    /* bounded so that a level's total cannot overflow */
    c.pub.weight = std::clamp<int64_t>(json_int(j, "weight", 1), 0, 1000000);

    add_strings(json_object_get(j, "groups"), c.groups);

    const char  *k;
    json_t      *v;

    json_object_foreach(json_object_get(j, "model_mapping"), k, v) {
        if (json_is_string(v) && json_string_length(v) > 0) {
            c.mapping.emplace(k, json_string_value(v));
        }
    }

    /* pointers into the owned strings: a deque never moves its elements */
    c.pub.name = c.name.c_str();
    c.pub.host = c.host.c_str();
    c.pub.host_header = c.host_header.c_str();
    c.pub.base_path = c.base_path.c_str();
    c.pub.key = c.key.c_str();
    c.key_forms = credential_forms(c.key);
    c.pub.key_forms = &c.key_forms;

    if (!routable) {
        s.poll_by_id[c.pub.id] = &c;
        return true;
    }

    std::unordered_set<std::string> models;
    add_strings(json_object_get(j, "models"), models);

    for (const auto &m : models) {
        s.by_model[m].push_back(&c);
    }

    s.by_id[c.pub.id] = &c;

    return true;
}

llmgw_rate_limit_t
parse_rate_limit(const json_t *j)
{
    llmgw_rate_limit_t rl {};

    if (!json_is_object(j)) {
        return rl;
    }

    /* as the admin API bounds them, whatever else wrote the option */
    auto count = [&](const char *name) {
        int64_t v = json_int(j, name, 0);
        return static_cast<uint32_t>(v < 0 ? 0 : std::min<int64_t>(v, 100000));
    };

    rl.window_ms = json_int(j, "duration_minutes", 0) * 60000;
    rl.total = count("total");
    rl.success = count("success");

    if (rl.window_ms <= 0 || (rl.total == 0 && rl.success == 0)) {
        rl = llmgw_rate_limit_t {};
    }

    return rl;
}

uint64_t
splitmix(uint64_t &x)
{
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Weighted sampling without replacement inside one priority level. */
void
weighted_order(std::vector<Channel *> &level, uint64_t &seed,
    const llmgw_channel_t **out, size_t &n, size_t max)
{
    while (!level.empty() && n < max) {
        uint64_t total = 0;

        for (Channel *c : level) {
            total += static_cast<uint64_t>(std::max<int64_t>(c->pub.weight, 0));
        }

        size_t pick = 0;

        if (total == 0) {
            pick = splitmix(seed) % level.size();

        } else {
            uint64_t r = splitmix(seed) % total;

            for (pick = 0; pick < level.size(); pick++) {
                uint64_t w = static_cast<uint64_t>(
                                 std::max<int64_t>(level[pick]->pub.weight, 0));
                if (r < w) {
                    break;
                }
                r -= w;
            }
        }

        out[n++] = &level[pick]->pub;
        level.erase(level.begin() + static_cast<long>(pick));
    }
}

/* The order channels are tried in: highest priority first, weighted random
 * inside a priority. */
size_t
try_order(std::vector<Channel *> &cand, uint64_t seed,
    const llmgw_channel_t **out, size_t max)
{
    std::stable_sort(cand.begin(), cand.end(),
                     [](const Channel *a, const Channel *b) {
                         return a->pub.priority > b->pub.priority;
                     });

    size_t n = 0;

    for (size_t i = 0; i < cand.size() && n < max; ) {
        size_t j = i;
        while (j < cand.size()
               && cand[j]->pub.priority == cand[i]->pub.priority)
        {
            j++;
        }

        std::vector<Channel *> level(cand.begin() + static_cast<long>(i),
                                     cand.begin() + static_cast<long>(j));
        weighted_order(level, seed, out, n, max);
        i = j;
    }

    return n;
}


/*
 * Leaves out the candidates whose format cannot carry the request (a
 * converted request holding a part the other format has no place for).
 * Each channel type is checked once.  When none is left, *unfit holds the
 * refusal for the one of the highest priority.
 */
void
keep_fit(std::vector<Channel *> &cand, const llmgw_req_t *req,
    llmgw_verdict_t *unfit)
{
    std::vector<std::pair<int, bool>> checked;
    std::vector<Channel *> fit;
    llmgw_verdict_t v;

    /* the first unfit one met is then of the highest priority */
    std::stable_sort(cand.begin(), cand.end(),
                     [](const Channel *a, const Channel *b) {
                         return a->pub.priority > b->pub.priority;
                     });

    for (Channel *c : cand) {
        auto tc = std::find_if(checked.begin(), checked.end(),
                               [c](const std::pair<int, bool> &p) {
                                   return p.first == c->pub.type;
                               });

        if (tc == checked.end()) {
            v.status = 0;
            bool ok = llmgw_req_check(req, c->pub.type, &v) == 0;

            if (!ok && unfit != nullptr && unfit->status == 0) {
                *unfit = v;
            }

            tc = checked.insert(checked.end(), { c->pub.type, ok });
        }

        if (tc->second) {
            fit.push_back(c);
        }
    }

    cand.swap(fit);

    if (!cand.empty() && unfit != nullptr) {
        unfit->status = 0;
    }
}

} /* namespace */


namespace llmgw {

bool
endpoint_serves(llmgw_endpoint_e ep, int type)
{
    switch (ep) {
    /* chat and messages reach the other formats through conversion */
    case LLMGW_EP_CHAT:
        return type == 1 || type == 14 || type == 24;
    case LLMGW_EP_MESSAGES:
        return type == 14 || type == 1;
    case LLMGW_EP_GEMINI:
        return type == 24;
    case LLMGW_EP_RERANK:
        return type == 1 || type == 34 || type == 38;
    default:
        return false;
    }
}

/* A type the gateway proxies itself (its channels hold a vendor API key). */
bool
proxied_type(int type)
{
    for (auto ep : { LLMGW_EP_CHAT, LLMGW_EP_MESSAGES, LLMGW_EP_GEMINI,
                     LLMGW_EP_RERANK })
    {
        if (endpoint_serves(ep, type)) {
            return true;
        }
    }

    return false;
}

} /* namespace llmgw */


extern "C" llmgw_snapshot_t *
llmgw_snapshot_parse(const char *json, size_t len, char *err, size_t errlen)
{
    try {
        Json root = json_parse(json, len);

        if (!json_is_object(root.get())) {
            std::snprintf(err, errlen, "snapshot is not a JSON object");
            return nullptr;
        }

        auto s = std::make_unique<llmgw_snapshot_s>();
        s->revision = json_int(root.get(), "revision", 0);

        size_t       i;
        json_t      *v;
        std::string  left_out;

        json_array_foreach(json_object_get(root.get(), "channels"), i, v) {
            parse_channel(v, *s, left_out);
        }

        json_array_foreach(json_object_get(root.get(), "poll_channels"), i, v) {
            parse_channel(v, *s, left_out, false);
        }

        if (errlen > 0) {
            std::snprintf(err, errlen, "%s", left_out.c_str());
        }

        const char *k;

        json_object_foreach(json_object_get(root.get(), "groups"), k, v) {
            Group g;
            if (json_is_number(v)) {
                g.ratio = json_number_value(v);
            } else {
                g.ratio = json_num(v, "ratio", 1.0);
                g.deprecated = json_is_true(json_object_get(v, "deprecated"));
            }
            s->groups[k] = g;
        }

        s->groups.try_emplace("default", Group {});

        s->price_entries = Json(json_incref(
                               json_object_get(root.get(), "pricing")));

        json_object_foreach(json_object_get(root.get(), "pricing"), k, v) {
            if (json_object_get(v, "unit_prices") != nullptr) {
                continue;                   /* a task price (taskprice.h) */
            }

            llmgw_price_t p {};
            p.known = 1;
            if (json_is_number(json_object_get(v, "price"))) {
                p.per_call = 1;
                p.price = json_num(v, "price", 0);
            } else {
                p.ratio = json_num(v, "ratio", 0);
                p.completion_ratio = json_num(v, "completion_ratio", 1);
                p.cache_ratio = json_num(v, "cache_ratio", 1);
                p.cache_creation_ratio = json_num(v, "cache_creation_ratio",
                                                  1);
            }
            s->prices[k] = p;
        }

        json_t *rl = json_object_get(root.get(), "rate_limit");
        s->rl_default = parse_rate_limit(json_object_get(rl, "default"));

        json_object_foreach(json_object_get(rl, "groups"), k, v) {
            s->rl_groups[k] = parse_rate_limit(v);
            s->rl_windows[llmgw_rl_group_hash({ k, strlen(k) })] =
                s->rl_groups[k].window_ms;
        }

        std::pair<const char *, std::vector<Plugin> *> lists[] = {
            { "plugins", &s->plugins }, { "poll_plugins", &s->poll_plugins },
        };

        for (auto &[name, list] : lists) {
            json_array_foreach(json_object_get(root.get(), name), i, v) {
                Plugin p;
                p.key = json_str(v, "key");
                p.version = json_str(v, "version");
                p.sha = json_str(v, "sha");
                p.manifest = json_dump(json_object_get(v, "manifest"));
                p.parsed = Json(json_incref(json_object_get(v, "manifest")));
                list->push_back(std::move(p));
            }
        }

        json_array_foreach(json_object_get(root.get(), "admin_hashes"), i, v) {
            if (json_is_string(v) && json_string_length(v) == 64) {
                s->admin_hashes.emplace_back(json_string_value(v));
            }
        }

        return s.release();

    } catch (const std::exception &e) {
        std::snprintf(err, errlen, "snapshot: %s", e.what());
        return nullptr;
    }
}


extern "C" void
llmgw_snapshot_free(llmgw_snapshot_t *s)
{
    delete s;
}


extern "C" int64_t
llmgw_snapshot_revision(const llmgw_snapshot_t *s)
{
    return s->revision;
}


extern "C" int
llmgw_snapshot_is_admin(const llmgw_snapshot_t *s, const char hash[65])
{
    int found = 0;

    /* no early exit: the time taken does not tell which hash matched */
    for (const auto &h : s->admin_hashes) {
        found |= llmgw_ct_equal(h.data(), hash, 64);
    }

    return found;
}


extern "C" int
llmgw_snapshot_group_check(const llmgw_snapshot_t *s, llmgw_str_t group,
    double *ratio, llmgw_verdict_t *v)
{
    auto it = s->groups.find(std::string(sv(group)));

    if (it == s->groups.end()) {
        llmgw_verdict_set(v, 403, "gateway_error", "group_unavailable",
                          "no access to group %.*s", (int) group.len,
                          group.data);
        return -1;
    }

    if (it->second.deprecated) {
        llmgw_verdict_set(v, 403, "gateway_error", "group_deprecated",
                          "group %.*s deprecated", (int) group.len,
                          group.data);
        return -1;
    }

    *ratio = it->second.ratio;
    return 0;
}


extern "C" void
llmgw_snapshot_rate_limit(const llmgw_snapshot_t *s, llmgw_str_t group,
    llmgw_rate_limit_t *rl)
{
    auto it = s->rl_groups.find(std::string(sv(group)));

    *rl = it != s->rl_groups.end() ? it->second : s->rl_default;
}


extern "C" int64_t
llmgw_snapshot_rate_limit_window(const llmgw_snapshot_t *s,
    uint64_t group_hash)
{
    auto it = s->rl_windows.find(group_hash);

    return it != s->rl_windows.end() ? it->second : s->rl_default.window_ms;
}


extern "C" size_t
llmgw_route(const llmgw_snapshot_t *s, llmgw_endpoint_e ep, llmgw_str_t model,
    llmgw_str_t group, uint64_t seed, const llmgw_channel_t **out,
    size_t max, size_t *incompatible, const llmgw_req_t *req,
    llmgw_verdict_t *unfit)
{
    *incompatible = 0;

    if (unfit != nullptr) {
        unfit->status = 0;
    }

    auto it = s->by_model.find(std::string(sv(model)));

    if (it == s->by_model.end()) {
        return 0;
    }

    std::string g(sv(group));
    std::vector<Channel *> cand;

    for (Channel *c : it->second) {
        if (c->groups.count(g) == 0) {
            continue;
        }
        if (!endpoint_serves(ep, c->pub.type)) {
            (*incompatible)++;
            continue;
        }
        cand.push_back(c);
    }

    if (req != nullptr && !cand.empty()) {
        keep_fit(cand, req, unfit);
    }

    return try_order(cand, seed, out, max);
}


extern "C" llmgw_buf_t
llmgw_models_json(const llmgw_snapshot_t *s, llmgw_str_t group,
    const llmgw_token_t *t)
{
    try {
        std::string g(sv(group));
        std::vector<std::string> names;

        for (const auto &kv : s->by_model) {
            bool served = false, task = false;

            for (const Channel *c : kv.second) {
                if (c->groups.count(g) > 0) {
                    served = true;
                    task = task || c->pub.type == 61;
                }
            }

            /* a model without a price is refused (model_price_error), so
               not listed; task models are priced per plugin */
            served = served && (task || s->prices.count(kv.first) > 0);

            llmgw_verdict_t v;

            if (served && llmgw_token_check_model(t, str(kv.first), &v) == 0) {
                names.push_back(kv.first);
            }
        }

        std::sort(names.begin(), names.end());

        Json list(json_array());

        for (const auto &n : names) {
            json_t *m = json_object();
            json_object_set_new(m, "id", json_stringn(n.data(), n.size()));
            json_object_set_new(m, "object", json_string("model"));
            json_object_set_new(m, "created", json_integer(0));
            json_object_set_new(m, "owned_by", json_string("llmgw"));
            json_array_append_new(list.get(), m);
        }

        Json out(json_object());
        json_object_set_new(out.get(), "object", json_string("list"));
        json_object_set(out.get(), "data", list.get());

        return make_buf(json_dump(out.get()));

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" int
llmgw_snapshot_price(const llmgw_snapshot_t *s, llmgw_str_t model,
    llmgw_price_t *p)
{
    auto it = s->prices.find(std::string(sv(model)));

    if (it == s->prices.end()) {
        *p = llmgw_price_t {};
        return -1;
    }

    *p = it->second;
    return 0;
}


namespace llmgw {

/*
 * A quota to the nearest unit, half a unit away from zero.  Ratios given in
 * decimals are not exact in binary: (30 + 60 x 2) x 0.3 x 0.7 is 31.5 but
 * comes out 31.499999999999996, so the fraction is taken to 9 decimal
 * places (far finer than any price, far coarser than that error) first.
 */
int64_t
round_quota(double q)
{
    if (q < 0) {
        return -round_quota(-q);
    }

    double whole = std::floor(q);
    double frac = std::round((q - whole) * 1e9) / 1e9;

    return static_cast<int64_t>(whole) + (frac >= 0.5 ? 1 : 0);
}

} /* namespace llmgw */


extern "C" int64_t
llmgw_quota(const llmgw_price_t *p, double group_ratio,
    const llmgw_usage_t *u)
{
    double q;

    if (!p->known) {
        return 0;
    }

    if (p->per_call) {
        q = p->price * LLMGW_QUOTA_PER_USD * group_ratio;
    } else {
        double read = static_cast<double>(u->cache_read_tokens);
        double write = static_cast<double>(u->cache_creation_tokens);
        double prompt = static_cast<double>(u->prompt_tokens);

        if (u->cache_in_prompt) {
            prompt = std::max(prompt - read - write, 0.0);
        }

        q = (prompt + read * p->cache_ratio + write * p->cache_creation_ratio
             + static_cast<double>(u->completion_tokens) * p->completion_ratio)
            * p->ratio * group_ratio;
    }

    /* never a credit; bounded whatever the prices and counts */
    if (!(q > 0)) {
        return 0;
    }
    return round_quota(std::min(q, static_cast<double>(LLMGW_QUOTA_MAX)));
}


extern "C" llmgw_str_t
llmgw_channel_map_model(const llmgw_snapshot_t *s, const llmgw_channel_t *c,
    llmgw_str_t model)
{
    auto ch = s->by_id.find(c->id);

    if (ch == s->by_id.end()) {
        return model;
    }

    auto it = ch->second->mapping.find(std::string(sv(model)));

    if (it == ch->second->mapping.end()) {
        return model;
    }

    return str(it->second);
}


extern "C" const char *
llmgw_snapshot_plugin_sha(const llmgw_snapshot_t *s, llmgw_str_t key)
{
    for (const auto &p : s->plugins) {
        if (p.key == sv(key)) {
            return p.sha.c_str();
        }
    }

    return nullptr;
}


extern "C" llmgw_buf_t
llmgw_snapshot_plugins_json(const llmgw_snapshot_t *s)
{
    try {
        Json list(json_array());

        for (const auto &p : s->plugins) {
            json_t *o = json_object();
            json_object_set_new(o, "key", json_string(p.key.c_str()));
            json_object_set_new(o, "version", json_string(p.version.c_str()));
            json_object_set_new(o, "sha", json_string(p.sha.c_str()));
            json_array_append_new(list.get(), o);
        }

        Json out(json_object());
        json_object_set_new(out.get(), "generation",
                            json_integer(s->revision));
        json_object_set(out.get(), "plugins", list.get());

        return make_buf(json_dump(out.get()));

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


/* ---- what the task engine reads (internal.h) ---- */

namespace llmgw {

size_t
snap_plugin_count(const llmgw_snapshot_t *s)
{
    return s->plugins.size();
}


const json_t *
snap_plugin(const llmgw_snapshot_t *s, size_t i, SnapPluginInfo *info)
{
    if (i >= s->plugins.size() + s->poll_plugins.size()) {
        return nullptr;
    }

    const Plugin &p = i < s->plugins.size()
                      ? s->plugins[i]
                      : s->poll_plugins[i - s->plugins.size()];

    if (info != nullptr) {
        info->key = p.key;
        info->version = p.version;
        info->sha = p.sha.c_str();
    }

    return p.parsed.get();
}


long
snap_plugin_find(const llmgw_snapshot_t *s, std::string_view key)
{
    for (size_t i = 0; i < s->plugins.size(); i++) {
        if (s->plugins[i].key == key) {
            return static_cast<long>(i);
        }
    }

    return -1;
}


long
snap_poll_plugin_find(const llmgw_snapshot_t *s, std::string_view key)
{
    long i = snap_plugin_find(s, key);

    for (size_t k = 0; i < 0 && k < s->poll_plugins.size(); k++) {
        if (s->poll_plugins[k].key == key) {
            i = static_cast<long>(s->plugins.size() + k);
        }
    }

    return i;
}


const llmgw_channel_t *
snap_poll_channel(const llmgw_snapshot_t *s, int64_t id,
    std::string_view *base_url, const json_t **settings)
{
    const llmgw_channel_t *c = snap_channel(s, id, base_url, settings);
    auto it = s->poll_by_id.find(id);

    if (c != nullptr || it == s->poll_by_id.end()) {
        return c;
    }

    if (base_url != nullptr) {
        *base_url = it->second->base_url;
    }

    if (settings != nullptr) {
        *settings = it->second->settings.get();
    }

    return &it->second->pub;
}


const llmgw_channel_t *
snap_channel(const llmgw_snapshot_t *s, int64_t id, std::string_view *base_url,
    const json_t **settings)
{
    auto it = s->by_id.find(id);

    if (it == s->by_id.end()) {
        return nullptr;
    }

    if (base_url != nullptr) {
        *base_url = it->second->base_url;
    }

    if (settings != nullptr) {
        *settings = it->second->settings.get();
    }

    return &it->second->pub;
}


namespace {

/* The upstream kinds a manifest allows ("new_api" is the marketplace's
 * name for a peer gateway). */
bool
allows_peer(const json_t *manifest)
{
    const json_t *ups = json_object_get(manifest, "upstreams");

    return json_has_string(ups, "peer_gateway") || json_has_string(ups, "new_api");
}

} /* namespace */


int
snap_channel_binds(const llmgw_snapshot_t *s, int64_t channel_id,
    std::string_view plugin_key, const json_t *manifest)
{
    const json_t *settings = nullptr;
    const llmgw_channel_t *c = snap_channel(s, channel_id, nullptr, &settings);

    if (c == nullptr) {
        return 0;
    }

    if (c->type == 61) {
        return json_str(settings, "task_plugin_key") == plugin_key;
    }

    const bool named = json_str(settings, "task_plugin_key") == plugin_key
                       || json_has_string(json_object_get(settings,
                                              "task_extend_plugin_keys"),
                                          plugin_key);

    if (c->type == 60) {
        return allows_peer(manifest) && named;
    }

    /* A channel the gateway proxies itself holds a key the operator gave
     * for that vendor's API: a plugin claiming its type in channelTypes
     * gets it only where the channel names the plugin. */
    if (!named && proxied_type(c->type)) {
        return 0;
    }

    size_t   i;
    json_t  *t;

    json_array_foreach(json_object_get(manifest, "channelTypes"), i, t) {
        if (json_is_integer(t) && json_integer_value(t) == c->type) {
            return 1;
        }
    }

    return 0;
}


size_t
snap_task_channels(const llmgw_snapshot_t *s, std::string_view plugin_key,
    const json_t *manifest, std::string_view model, std::string_view group,
    uint64_t seed, const llmgw_channel_t **out, size_t max)
{
    auto it = s->by_model.find(std::string(model));

    if (it == s->by_model.end()) {
        return 0;
    }

    std::string g(group);
    std::vector<Channel *> cand;

    for (Channel *c : it->second) {
        if (c->groups.count(g) > 0
            && snap_channel_binds(s, c->pub.id, plugin_key, manifest))
        {
            cand.push_back(c);
        }
    }

    return try_order(cand, seed, out, max);
}


bool
snap_task_channel_serves(const llmgw_snapshot_t *s,
    std::string_view plugin_key, const json_t *manifest,
    std::string_view model, std::string_view group, int64_t id)
{
    auto it = s->by_model.find(std::string(model));

    if (it == s->by_model.end()) {
        return false;
    }

    for (Channel *c : it->second) {
        if (c->pub.id == id) {
            return c->groups.count(std::string(group)) > 0
                   && snap_channel_binds(s, id, plugin_key, manifest);
        }
    }

    return false;
}


bool
snap_claims(const json_t *manifest, std::string_view protocol,
    std::string_view model)
{
    const json_t *c = json_find_by(json_object_get(manifest, "protocols"),
                                   "name", protocol);
    if (c == nullptr) {
        return false;
    }

    const json_t *models = json_object_get(c, "models");
    return models == nullptr || json_has_string(models, model);
}


long
snap_protocol_plugin(const llmgw_snapshot_t *s, std::string_view protocol,
    std::string_view model, std::string_view group, uint64_t seed)
{
    auto it = s->by_model.find(std::string(model));

    if (it == s->by_model.end()) {
        return -1;
    }

    std::string g(group);
    std::vector<Channel *> cand;
    std::unordered_map<int64_t, long> owner;
    bool in_group = false;

    for (Channel *c : it->second) {
        if (c->groups.count(g) == 0) {
            continue;
        }
        in_group = true;
        for (size_t i = 0; i < s->plugins.size(); i++) {
            const Plugin &p = s->plugins[i];
            if (snap_claims(p.parsed.get(), protocol, model)
                && snap_channel_binds(s, c->pub.id, p.key, p.parsed.get()))
            {
                cand.push_back(c);
                owner[c->pub.id] = static_cast<long>(i);
                break;
            }
        }
    }

    if (cand.empty() && in_group) {
        return -2;
    }

    const llmgw_channel_t *first = nullptr;

    if (try_order(cand, seed, &first, 1) == 0) {
        return -1;
    }

    return owner[first->id];
}


const json_t *
snap_price_entry(const llmgw_snapshot_t *s, std::string_view name)
{
    return json_object_getn(s->price_entries.get(), name.data(), name.size());
}

} /* namespace llmgw */


extern "C" int
llmgw_channel_quotes_key(const llmgw_channel_t *ch, const char *data,
    size_t len)
{
    if (ch->key_forms == nullptr) {
        return 0;
    }

    std::string_view text(data, len);

    for (const std::string &f :
         *static_cast<const std::vector<std::string> *>(ch->key_forms))
    {
        if (text.find(f) != std::string_view::npos) {
            return 1;
        }
    }

    return 0;
}
