/*
 * Task pricing: which usage schema a task is billed under, whether the
 * facts a plugin's usage hook returned fit it, and the quota those facts
 * cost under a pricing entry of /api/pricing.
 *
 * Plugins report usage facts only, never prices (spec: Usage
 * declarations); the host turns them into quota here.  500,000 quota is
 * one USD.  No exception crosses this API.
 */

#ifndef LLMGW_TASKPRICE_H
#define LLMGW_TASKPRICE_H

#include "llmgw.h"

#ifdef __cplusplus
extern "C" {
#endif


/*
 * The usage schema for a task: the usageProfiles entry whose models list
 * the final upstream model, else the one listing the client model, else the
 * manifest's usageSchema (or {} when absent).  A profile replaces the
 * defaults entirely.  manifest is the compiled manifest object.  0 and a
 * malloc'ed JSON object in *schema (llmgw_buf_free), or -1 when the
 * manifest is not a JSON object.
 */
int llmgw_task_usage_schema(const char *manifest, size_t mlen,
    llmgw_str_t upstream_model, llmgw_str_t model, llmgw_buf_t *schema);

/*
 * Checks usage facts (a JSON object, or null / empty for none) against a
 * schema: number fields take finite numbers >= 0, boolean fields true or
 * false, enum fields one of the declared values; a fact the schema does not
 * declare is an error naming it.  Facts may leave fields out.  0, or -1 and
 * a message in err (NUL-terminated, cut to errlen).
 */
int llmgw_task_usage_check(const char *schema, size_t slen,
    const char *facts, size_t flen, char *err, size_t errlen);

/*
 * Quota for facts under a pricing entry (the JSON object stored by
 * /api/pricing for "<plugin>::<model>" or "<model>"), rounded to the
 * nearest integer (halves away from zero):
 *
 *   {"price": usd}             usd * 500000 * group_ratio
 *   {"unit_prices": {f: usd}, "multipliers": {f: {value: m}}}
 *                              sum(usd_f * facts_f) * prod(m for each
 *                              fact's enum value, booleans as "true" /
 *                              "false"; unlisted values 1) * 500000 *
 *                              group_ratio; a missing or non-numeric
 *                              fact counts 0
 *   {"ratio": r, ...}          sum of token facts * r * group_ratio
 *                              (completion_ratio and cache ratios ignored)
 *
 * Without a schema every numeric fact counts as a token fact for a ratio
 * entry; llmgw_task_quota_schema counts only number fields whose unit is
 * "token" (and is otherwise the same).  schema may be NULL there.
 *
 * 0 and *quota, or -1 and a message in err when the entry, the facts or
 * the group ratio are unusable or the quota would not fit in int64.
 */
int llmgw_task_quota(const char *entry, size_t elen, const char *facts,
    size_t flen, double group_ratio, int64_t *quota, char *err,
    size_t errlen);

int llmgw_task_quota_schema(const char *entry, size_t elen,
    const char *schema, size_t slen, const char *facts, size_t flen,
    double group_ratio, int64_t *quota, char *err, size_t errlen);


#ifdef __cplusplus
}

#include <jansson.h>
#include <string_view>

namespace llmgw {

/* The same choice as llmgw_task_usage_schema, from the manifest object:
   a new reference to the schema object ({} when there is none), or NULL
   when manifest is not an object. */
json_t *usage_schema(const json_t *manifest, std::string_view upstream_model,
    std::string_view model);

} /* namespace llmgw */
#endif

#endif /* LLMGW_TASKPRICE_H */
