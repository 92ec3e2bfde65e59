/*
 * Ledger rows in COPY's text format, and the statement that applies a
 * batch's charges (see sql/008_ledger_copy.sql).
 */

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <utility>
#include <vector>

#include "internal.h"

using namespace llmgw;


namespace {

void
tab(std::string &out)
{
    out.push_back('\t');
}

void
num(std::string &out, int64_t v)
{
    char buf[24];

    out.append(buf, static_cast<size_t>(
                   std::snprintf(buf, sizeof(buf), "%lld", (long long) v)));
}

/* 0 stands for "none": written as NULL */
void
id_or_null(std::string &out, int64_t v)
{
    if (v) {
        num(out, v);
    } else {
        out += "\\N";
    }
}

/*
 * A text field of COPY's text format: backslash, tab, newline and carriage
 * return escaped; NUL (which text cannot hold) dropped; invalid UTF-8
 * replaced by U+FFFD, so that no row can make its batch fail for ever.
 */
void
text(std::string &out, std::string_view s)
{
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());

    for (size_t i = 0; i < s.size(); ) {
        unsigned char c = p[i];

        if (c >= 0x80) {
            size_t n = utf8_seq(p + i, s.size() - i);

            if (n == 0) {
                out += "\xef\xbf\xbd";
                i++;
            } else {
                out.append(s.data() + i, n);
                i += n;
            }
            continue;
        }

        switch (c) {
        case '\\': out += "\\\\"; break;
        case '\t': out += "\\t"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\0': break;
        default: out.push_back(static_cast<char>(c));
        }

        i++;
    }
}

} /* namespace */


/*
 * Written by hand: one row per request is on the hot path.  The columns are
 * LLMGW_LEDGER_COLUMNS, in that order.
 */
extern "C" llmgw_buf_t
llmgw_ledger_row_copy(const llmgw_ledger_row_t *row)
{
    try {
        std::string out;
        char buf[48];

        out.reserve(256);

        text(out, row->request_id);
        tab(out);
        text(out, row->type);
        tab(out);
        num(out, row->user_id);
        tab(out);
        num(out, row->token_id);
        tab(out);
        id_or_null(out, row->channel_id);
        tab(out);
        text(out, sv(row->model));
        tab(out);
        text(out, sv(row->upstream_model));
        tab(out);
        text(out, sv(row->endpoint));
        tab(out);

        out += "[";
        for (size_t i = 0; i < row->ntried; i++) {
            if (i) {
                out += ",";
            }
            num(out, row->tried[i]);
        }
        out += "]";
        tab(out);

        num(out, row->usage.prompt_tokens);
        tab(out);
        num(out, row->usage.completion_tokens);
        tab(out);
        num(out, row->usage.cache_read_tokens);
        tab(out);
        num(out, row->usage.cache_creation_tokens);
        tab(out);
        num(out, row->quota);
        tab(out);
        out += row->is_stream ? "t" : "f";
        tab(out);
        num(out, row->status);
        tab(out);
        num(out, row->latency_ms);
        tab(out);

        /* milliseconds are all the ledger keeps, in UTC */
        long long ms = std::llround(row->created_at * 1000);
        time_t sec = static_cast<time_t>(ms / 1000);
        struct tm tm;

        gmtime_r(&sec, &tm);
        out.append(buf, static_cast<size_t>(std::snprintf(
                       buf, sizeof(buf), "%04d-%02d-%02d %02d:%02d:%02d.%03d+00",
                       tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                       tm.tm_hour, tm.tm_min, tm.tm_sec,
                       static_cast<int>(ms % 1000))));

        out.push_back('\n');

        return make_buf(out);

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


namespace {

/* "'{1,2}','{30,0}'": the ids with their summed charges, in id order */
void
sums(std::string &out, std::vector<std::pair<int64_t, int64_t>> &v)
{
    std::sort(v.begin(), v.end());

    std::string ids = "'{", deltas = "'{";

    for (size_t i = 0; i < v.size(); ) {
        int64_t id = v[i].first, d = 0;

        for (; i < v.size() && v[i].first == id; i++) {
            d += v[i].second;
        }

        if (ids.size() > 2) {
            ids += ",";
            deltas += ",";
        }
        num(ids, id);
        num(deltas, d);
    }

    out += ids;
    out += "}','";
    out += deltas.substr(1);
    out += "}'";
}

} /* namespace */


extern "C" llmgw_buf_t
llmgw_flush_new_sql(const llmgw_charge_t *c, size_t n)
{
    try {
        std::vector<std::pair<int64_t, int64_t>> tok, usr;
        std::string out = "COPY logs (" LLMGW_LEDGER_COLUMNS ") FROM STDIN; "
                          "SELECT llmgw_flush_apply(";

        tok.reserve(n);
        usr.reserve(n);

        for (size_t i = 0; i < n; i++) {
            if (c[i].token_id) {
                tok.emplace_back(c[i].token_id, c[i].quota);
            }
            if (c[i].user_id) {
                usr.emplace_back(c[i].user_id, c[i].quota);
            }
        }

        sums(out, tok);
        out += ",";
        sums(out, usr);
        out += ")::text";

        return make_buf(out);

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" int
llmgw_flush_answer(const char *json, size_t len, llmgw_balance_cb cb,
    void *arg)
{
    try {
        Json root = json_parse(json, len);

        if (!json_is_object(root.get())) {
            return -1;
        }

        const char *const kinds[] = { "tokens", "users" };

        for (int is_user = 0; is_user < 2; is_user++) {
            const char  *k;
            json_t      *v;

            json_object_foreach(json_object_get(root.get(), kinds[is_user]),
                                k, v)
            {
                if (json_is_integer(v)) {
                    cb(arg, is_user, std::strtoll(k, nullptr, 10),
                       json_integer_value(v));
                }
            }
        }

        return 0;

    } catch (...) {
        return -1;
    }
}
