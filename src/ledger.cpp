/*
 * Ledger rows in COPY's text format, and the statement that applies a
 * batch's charges (see sql/008_ledger_copy.sql).
 */

#include <algorithm>
#include <charconv>
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

    out.append(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
}

/* n as exactly width digits, zero-padded (0 <= n < 10^width) */
void
digits(std::string &out, int n, int width)
{
    char buf[8];

    for (int i = width - 1; i >= 0; i--) {
        buf[i] = static_cast<char>('0' + n % 10);
        n /= 10;
    }
    out.append(buf, static_cast<size_t>(width));
}

/* "YYYY-MM-DD HH:MM:SS.mmm+00" in UTC: milliseconds are all the ledger keeps */
void
timestamp(std::string &out, double at)
{
    /* rows of one second share their date and time: computed once */
    thread_local time_t last = -1;
    thread_local std::string prefix;

    long long ms = std::llround(at * 1000);
    time_t sec = static_cast<time_t>(ms / 1000);

    if (sec != last) {
        struct tm tm;

        gmtime_r(&sec, &tm);
        prefix.clear();
        digits(prefix, tm.tm_year + 1900, 4);
        prefix.push_back('-');
        digits(prefix, tm.tm_mon + 1, 2);
        prefix.push_back('-');
        digits(prefix, tm.tm_mday, 2);
        prefix.push_back(' ');
        digits(prefix, tm.tm_hour, 2);
        prefix.push_back(':');
        digits(prefix, tm.tm_min, 2);
        prefix.push_back(':');
        digits(prefix, tm.tm_sec, 2);
        last = sec;
    }

    out += prefix;
    out.push_back('.');
    digits(out, static_cast<int>(ms % 1000), 3);
    out += "+00";
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
            i += append_utf8_char(out, p + i, s.size() - i);
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
        timestamp(out, row->created_at);
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


void
llmgw::balances_answered(json_t *root, llmgw_balance_cb cb, void *arg)
{
    const char *const kinds[] = { "tokens", "users" };
    const char *const revs[] = { "token_revs", "user_revs" };

    for (int is_user = 0; is_user < 2; is_user++) {
        const char  *k;
        json_t      *v;
        json_t      *rev_of = json_object_get(root, revs[is_user]);

        json_object_foreach(json_object_get(root, kinds[is_user]), k, v) {
            json_t *rev = json_object_get(rev_of, k);

            if (json_is_integer(v)) {
                cb(arg, is_user, std::strtoll(k, nullptr, 10),
                   json_integer_value(v),
                   json_is_integer(rev) ? json_integer_value(rev) : -1);
            }
        }
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

        balances_answered(root.get(), cb, arg);
        return 0;

    } catch (...) {
        return -1;
    }
}
