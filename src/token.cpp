/*
 * Key records (as llmgw_token_lookup() returns them) and the checks the
 * spec's Authentication section asks of every request.
 */

#include <string>
#include <unordered_set>

#include "internal.h"

using namespace llmgw;

struct llmgw_token_s {
    unsigned                         refs = 1;
    int64_t                          id = 0;
    int64_t                          user_id = 0;
    bool                             enabled = false;
    bool                             user_enabled = false;
    int64_t                          expired_time = -1;
    int64_t                          remain_quota = 0;
    int64_t                          user_quota = 0;
    uint64_t                         loaded_at = 0;
    int64_t                          bal_rev = 0;
    int64_t                          user_bal_rev = 0;
    bool                             unlimited = false;
    bool                             all_models = true;
    std::unordered_set<std::string>  models;
    llmgw_iplist_t                  *ips = nullptr;
    std::string                      group;

    ~llmgw_token_s() { llmgw_iplist_free(ips); }
};


extern "C" llmgw_token_t *
llmgw_token_parse(const char *json, size_t len)
{
    try {
        Json root = json_parse(json, len);
        const json_t *j = root.get();

        if (!json_is_object(j)) {
            return nullptr;
        }

        auto t = std::make_unique<llmgw_token_s>();
        const json_t *user = json_object_get(j, "user");

        t->id = json_int(j, "id", 0);
        t->user_id = json_int(j, "user_id", 0);
        t->enabled = json_str(j, "status") == "enabled";
        t->user_enabled = json_str(user, "status") == "enabled";
        t->expired_time = json_int(j, "expired_time", -1);
        t->remain_quota = json_int(j, "remain_quota", 0);
        t->unlimited = json_is_true(json_object_get(j, "unlimited_quota"));
        t->user_quota = json_int(user, "quota", 0);
        t->bal_rev = json_int(j, "bal_rev", 0);
        t->user_bal_rev = json_int(user, "bal_rev", 0);

        json_t *models = json_object_get(j, "models");

        if (json_is_array(models)) {
            size_t   i;
            json_t  *m;

            t->all_models = false;
            json_array_foreach(models, i, m) {
                if (json_is_string(m)) {
                    t->models.emplace(json_string_value(m),
                                      json_string_length(m));
                }
            }
        }

        json_t *ips = json_object_get(j, "allow_ips");

        if (json_is_array(ips) && json_array_size(ips) > 0) {
            std::string text = json_dump(ips);
            char err[256];

            t->ips = llmgw_iplist_parse(text.data(), text.size(), err,
                                        sizeof(err));
            if (t->ips == nullptr) {
                /* an unreadable list admits nobody rather than everybody */
                static constexpr std::string_view nobody = "[\"0.0.0.0/32\"]";

                t->ips = llmgw_iplist_parse(nobody.data(), nobody.size(), err,
                                            sizeof(err));
                if (t->ips == nullptr) {
                    return nullptr;
                }
            }
        }

        t->group = json_str(j, "group");

        if (t->group.empty()) {
            t->group = json_str(user, "group");
        }

        if (t->group.empty()) {
            t->group = "default";
        }

        return t.release();

    } catch (...) {
        return nullptr;
    }
}


extern "C" llmgw_token_t *
llmgw_token_ref(llmgw_token_t *t)
{
    if (t != nullptr) {
        t->refs++;
    }

    return t;
}


extern "C" void
llmgw_token_free(llmgw_token_t *t)
{
    if (t != nullptr && --t->refs == 0) {
        delete t;
    }
}


extern "C" int64_t
llmgw_token_id(const llmgw_token_t *t)
{
    return t->id;
}


extern "C" int64_t
llmgw_token_user_id(const llmgw_token_t *t)
{
    return t->user_id;
}


extern "C" int64_t
llmgw_token_remain_quota(const llmgw_token_t *t)
{
    return t->remain_quota;
}


extern "C" int
llmgw_token_unlimited(const llmgw_token_t *t)
{
    return t->unlimited;
}


extern "C" int64_t
llmgw_token_user_quota(const llmgw_token_t *t)
{
    return t->user_quota;
}


extern "C" void
llmgw_token_set_loaded_at(llmgw_token_t *t, uint64_t msec)
{
    t->loaded_at = msec;
}


extern "C" int64_t
llmgw_token_bal_rev(const llmgw_token_t *t)
{
    return t->bal_rev;
}


extern "C" int64_t
llmgw_token_user_bal_rev(const llmgw_token_t *t)
{
    return t->user_bal_rev;
}


extern "C" uint64_t
llmgw_token_loaded_at(const llmgw_token_t *t)
{
    return t->loaded_at;
}


extern "C" llmgw_str_t
llmgw_token_group(const llmgw_token_t *t)
{
    return str(t->group);
}


static int
token_refused(const llmgw_token_t *t, int64_t now, bool exhausted,
    llmgw_verdict_t *v)
{
    bool expired = t->expired_time != -1 && t->expired_time <= now;

    /* one message for every reason: the caller learns nothing about keys */
    if (!t->enabled || !t->user_enabled || expired || exhausted) {
        llmgw_verdict_set(v, 401, "gateway_error", "invalid_token",
                          "Invalid token");
        return -1;
    }

    return 0;
}


extern "C" int
llmgw_token_check_standing(const llmgw_token_t *t, int64_t now,
    llmgw_verdict_t *v)
{
    return token_refused(t, now, false, v);
}


extern "C" int
llmgw_token_check(const llmgw_token_t *t, int64_t now, llmgw_verdict_t *v)
{
    return token_refused(t, now, !t->unlimited && t->remain_quota <= 0, v);
}


extern "C" int
llmgw_token_check_ip(const llmgw_token_t *t, int family, const uint8_t *addr,
    const char *addr_text, llmgw_verdict_t *v)
{
    if (t->ips == nullptr || llmgw_iplist_match(t->ips, family, addr)) {
        return 0;
    }

    llmgw_verdict_set(v, 403, "gateway_error", "access_denied",
                      "IP %s is not allowed to use this key", addr_text);
    return -1;
}


extern "C" int
llmgw_token_check_model(const llmgw_token_t *t, llmgw_str_t model,
    llmgw_verdict_t *v)
{
    if (t->all_models) {
        return 0;
    }

    if (t->models.empty()) {
        llmgw_verdict_set(v, 403, "gateway_error", "model_not_allowed",
                          "no access to any model");
        return -1;
    }

    if (t->models.count(std::string(sv(model))) == 0) {
        char shown[LLMGW_SHOWN_SIZE];

        llmgw_verdict_set(v, 403, "gateway_error", "model_not_allowed",
                          "no access to model %s",
                          llmgw_shown(model.data, model.len, shown));
        return -1;
    }

    return 0;
}
