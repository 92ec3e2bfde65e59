/*
 * Task pricing: the usage schema a task is billed under (usageProfiles
 * before usageSchema), the check of a usage hook's facts against it, and
 * the quota of those facts under a pricing entry.
 */

#include <cmath>
#include <cstring>
#include <string>

#include "internal.h"
#include "taskprice.h"

using namespace llmgw;

namespace {

constexpr double kQuotaPerUsd = LLMGW_QUOTA_PER_USD;

constexpr double kQuotaMax = static_cast<double>(LLMGW_QUOTA_MAX);


/* A failure with its message; the C entry points copy it into err. */
struct Fail {
    std::string message;
};


void
set_err(char *err, size_t errlen, const std::string &msg)
{
    if (err == nullptr || errlen == 0) {
        return;
    }

    size_t n = utf8_prefix(msg, errlen - 1).size();
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
}


std::string
quote(std::string_view s)
{
    std::string out;
    append_json_string(out, s);
    return out;
}


/* NULL, empty or "null" text is no facts at all: an empty object. */
Json
parse_facts(const char *facts, size_t flen)
{
    if (facts == nullptr || flen == 0) {
        return Json(json_object());
    }

    /* DECODE_ANY: a bare null is not a JSON text to jansson otherwise */
    json_error_t jerr;
    Json f(json_loadb(facts, flen, JSON_DECODE_ANY, &jerr));

    if (f != nullptr && json_is_null(f.get())) {
        return Json(json_object());
    }

    if (!json_is_object(f.get())) {
        throw Fail { "usage facts must be a JSON object or null" };
    }

    return f;
}


Json
parse_object(const char *text, size_t len, const char *what)
{
    Json j = text != nullptr ? json_parse(text, len) : nullptr;

    if (!json_is_object(j.get())) {
        throw Fail { std::string(what) + " is not a JSON object" };
    }

    return j;
}


bool
non_negative(const json_t *v)
{
    return json_is_number(v) && std::isfinite(json_number_value(v))
           && json_number_value(v) >= 0;
}


/* A member that, when present and not null, must be a number >= 0. */
const json_t *
member_number(const json_t *obj, const char *key, const std::string &path)
{
    const json_t *v = json_object_get(obj, key);

    if (v == nullptr || json_is_null(v)) {
        return nullptr;
    }

    if (!non_negative(v)) {
        throw Fail { path + " must be a number >= 0" };
    }

    return v;
}


bool
list_has(const json_t *list, std::string_view s)
{
    size_t i;
    json_t *item;

    json_array_foreach(list, i, item) {
        if (json_is_string(item)
            && std::string_view(json_string_value(item),
                                json_string_length(item)) == s)
        {
            return true;
        }
    }

    return false;
}


/*
 * The first profile whose models list the model: true and its schema in
 * *schema (NULL, read as {}, should a profile lack one).
 */
bool
find_profile(const json_t *profiles, std::string_view model,
    const json_t **schema)
{
    if (model.empty()) {
        return false;
    }

    size_t i;
    json_t *p;

    json_array_foreach(profiles, i, p) {
        if (list_has(json_object_get(p, "models"), model)) {
            *schema = json_object_get(p, "schema");
            return true;
        }
    }

    return false;
}


void
check_fact(const json_t *schema, const char *name, const json_t *v)
{
    const json_t *field = json_object_get(schema, name);
    std::string what = "usage fact " + quote(name);

    if (!json_is_object(field)) {
        throw Fail { what + " is not declared in the usage schema" };
    }

    const json_t *values = json_object_get(field, "enum");

    if (json_is_array(values)) {
        if (!json_is_string(v)
            || !list_has(values, std::string_view(json_string_value(v),
                                                  json_string_length(v))))
        {
            std::string list;
            size_t i;
            json_t *x;

            json_array_foreach(values, i, x) {
                list += (list.empty() ? "" : ", ")
                        + quote(json_is_string(x) ? json_string_value(x)
                                                  : "");
            }

            throw Fail { what + " must be one of " + list };
        }
        return;
    }

    std::string_view type = json_str(field, "type");

    if (type == "number") {
        if (!non_negative(v)) {
            throw Fail { what + " must be a finite number >= 0" };
        }
    } else if (type == "boolean") {
        if (!json_is_boolean(v)) {
            throw Fail { what + " must be true or false" };
        }
    } else {
        throw Fail { "usage schema field " + quote(name)
                     + " has no usable type" };
    }
}


/* sum(usd_f * facts_f) * prod(multipliers) in USD. */
double
unit_price_usd(const json_t *entry, const json_t *facts)
{
    const json_t *units = json_object_get(entry, "unit_prices");
    double usd = 0;
    const char *k;
    json_t *price;

    json_object_foreach(const_cast<json_t *>(units), k, price) {
        if (!non_negative(price)) {
            throw Fail { std::string("unit_prices.") + k
                         + " must be a number >= 0" };
        }

        const json_t *fact = json_object_get(facts, k);

        if (fact == nullptr || !json_is_number(fact)) {
            continue;                   /* a missing fact counts 0 */
        }

        if (!non_negative(fact)) {
            throw Fail { "usage fact " + quote(k)
                         + " must be a finite number >= 0" };
        }

        usd += json_number_value(price) * json_number_value(fact);
    }

    const json_t *mults = json_object_get(entry, "multipliers");

    if (mults == nullptr || json_is_null(mults)) {
        return usd;
    }

    if (!json_is_object(mults)) {
        throw Fail { "multipliers must be an object" };
    }

    json_t *table;

    json_object_foreach(const_cast<json_t *>(mults), k, table) {
        if (!json_is_object(table)) {
            throw Fail { std::string("multipliers.") + k
                         + " must be an object of value to factor" };
        }

        const json_t *fact = json_object_get(facts, k);
        std::string value;

        if (json_is_string(fact)) {
            value.assign(json_string_value(fact), json_string_length(fact));
        } else if (json_is_boolean(fact)) {
            value = json_is_true(fact) ? "true" : "false";
        } else {
            continue;                   /* no fact, no factor */
        }

        const json_t *m = member_number(table, value.c_str(),
                                        std::string("multipliers.") + k
                                        + "." + value);
        if (m != nullptr) {
            usd *= json_number_value(m);
        }
    }

    return usd;
}


bool
is_token_field(const json_t *schema, const char *name)
{
    if (schema == nullptr) {
        return true;
    }

    const json_t *f = json_object_get(schema, name);

    return json_str(f, "type") == "number" && json_str(f, "unit") == "token";
}


double
token_count(const json_t *facts, const json_t *schema)
{
    double tokens = 0;
    const char *k;
    json_t *v;

    json_object_foreach(const_cast<json_t *>(facts), k, v) {
        if (!json_is_number(v) || !is_token_field(schema, k)) {
            continue;
        }

        if (!non_negative(v)) {
            throw Fail { "usage fact " + quote(k)
                         + " must be a finite number >= 0" };
        }

        tokens += json_number_value(v);
    }

    return tokens;
}


int64_t
quota_of(const json_t *entry, const json_t *facts, const json_t *schema,
    double group_ratio)
{
    if (!std::isfinite(group_ratio) || group_ratio < 0) {
        throw Fail { "group ratio must be a finite number >= 0" };
    }

    double q;
    const json_t *price = member_number(entry, "price", "price");
    const json_t *units = json_object_get(entry, "unit_prices");
    const json_t *ratio = member_number(entry, "ratio", "ratio");

    if (price != nullptr) {
        q = json_number_value(price) * kQuotaPerUsd * group_ratio;

    } else if (units != nullptr && !json_is_null(units)) {
        if (!json_is_object(units) || json_object_size(units) == 0) {
            throw Fail { "unit_prices must be a non-empty object" };
        }
        q = unit_price_usd(entry, facts) * kQuotaPerUsd * group_ratio;

    } else if (ratio != nullptr) {
        q = token_count(facts, schema) * json_number_value(ratio)
            * group_ratio;

    } else {
        throw Fail { "the pricing entry has no price, unit_prices or ratio" };
    }

    if (!std::isfinite(q) || q > kQuotaMax) {
        throw Fail { "the quota is out of range" };
    }

    return round_quota(q);
}


int
quota_entry(const char *entry, size_t elen, const char *schema, size_t slen,
    const char *facts, size_t flen, double group_ratio, int64_t *quota,
    char *err, size_t errlen)
{
    try {
        Json e = parse_object(entry, elen, "the pricing entry");
        Json s = schema != nullptr
                 ? parse_object(schema, slen, "the usage schema") : nullptr;
        Json f = parse_facts(facts, flen);

        *quota = quota_of(e.get(), f.get(), s.get(), group_ratio);
        return 0;

    } catch (const Fail &x) {
        set_err(err, errlen, x.message);
    } catch (...) {
        set_err(err, errlen, "out of memory");
    }

    *quota = 0;
    return -1;
}

} /* namespace */


json_t *
llmgw::usage_schema(const json_t *manifest, std::string_view upstream_model,
    std::string_view model)
{
    if (!json_is_object(manifest)) {
        return nullptr;
    }

    /* a profile replaces the defaults entirely, even when empty */
    const json_t *profiles = json_object_get(manifest, "usageProfiles");
    const json_t *s = nullptr;

    if (!find_profile(profiles, upstream_model, &s)
        && !find_profile(profiles, model, &s))
    {
        s = json_object_get(manifest, "usageSchema");
    }

    return json_is_object(s) ? json_incref(const_cast<json_t *>(s))
                             : json_object();
}


extern "C" int
llmgw_task_usage_schema(const char *manifest, size_t mlen,
    llmgw_str_t upstream_model, llmgw_str_t model, llmgw_buf_t *schema)
{
    *schema = llmgw_buf_t { nullptr, 0 };

    try {
        Json m = manifest != nullptr ? json_parse(manifest, mlen) : nullptr;
        Json s(usage_schema(m.get(), sv(upstream_model), sv(model)));

        if (!s) {
            return -1;
        }

        *schema = make_buf(json_dump(s.get()));
        return schema->data != nullptr ? 0 : -1;

    } catch (...) {
        return -1;
    }
}


extern "C" int
llmgw_task_usage_check(const char *schema, size_t slen, const char *facts,
    size_t flen, char *err, size_t errlen)
{
    try {
        Json s = parse_object(schema, slen, "the usage schema");
        Json f = parse_facts(facts, flen);
        const char *k;
        json_t *v;

        json_object_foreach(f.get(), k, v) {
            check_fact(s.get(), k, v);
        }

        return 0;

    } catch (const Fail &x) {
        set_err(err, errlen, x.message);
    } catch (...) {
        set_err(err, errlen, "out of memory");
    }

    return -1;
}


extern "C" int
llmgw_task_quota(const char *entry, size_t elen, const char *facts,
    size_t flen, double group_ratio, int64_t *quota, char *err,
    size_t errlen)
{
    return quota_entry(entry, elen, nullptr, 0, facts, flen, group_ratio,
                       quota, err, errlen);
}


extern "C" int
llmgw_task_quota_schema(const char *entry, size_t elen, const char *schema,
    size_t slen, const char *facts, size_t flen, double group_ratio,
    int64_t *quota, char *err, size_t errlen)
{
    return quota_entry(entry, elen, schema, slen, facts, flen, group_ratio,
                       quota, err, errlen);
}
