/*
 * Small pieces every part of the core uses: owned buffers, verdicts and
 * JSON accessors.
 */

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "internal.h"

namespace llmgw {

llmgw_buf_t
make_buf(std::string_view s)
{
    llmgw_buf_t b { static_cast<char *>(std::malloc(s.size() + 1)), 0 };

    if (b.data != nullptr) {
        std::memcpy(b.data, s.data(), s.size());
        b.data[s.size()] = '\0';
        b.len = s.size();
    }

    return b;
}

namespace {

int
hex_value(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

} // namespace

/*
 * Decodes %XX escapes (and "+" as a space when plus_space).  A bad escape
 * is an error when strict (form bodies), else kept as written (queries, as
 * browsers and most servers do).
 */
bool
percent_decode(std::string_view in, bool plus_space, bool strict,
    std::string &out)
{
    out.clear();
    out.reserve(in.size());

    for (size_t i = 0; i < in.size(); i++) {
        char c = in[i];

        if (c == '+' && plus_space) {
            out.push_back(' ');
            continue;
        }

        if (c == '%') {
            int hi = i + 2 < in.size() ? hex_value(in[i + 1]) : -1;
            int lo = hi >= 0 ? hex_value(in[i + 2]) : -1;

            if (lo >= 0) {
                out.push_back(static_cast<char>(hi * 16 + lo));
                i += 2;
                continue;
            }

            if (strict) {
                return false;
            }
        }

        out.push_back(c);
    }

    return true;
}

namespace {

/* A whole number that a double holds exactly (|d| <= 2^53). */
bool
whole(double d)
{
    return d >= -9007199254740992.0 && d <= 9007199254740992.0
           && d == static_cast<double>(static_cast<int64_t>(d));
}

/* Reals of a text read with JSON_DECODE_INT_AS_REAL back to integers. */
void
integers_again(json_t *j)
{
    const char *k;
    json_t *v;
    size_t i;
    void *tmp;

    if (json_is_object(j)) {
        json_object_foreach_safe(j, tmp, k, v) {
            if (json_is_real(v) && whole(json_real_value(v))) {
                json_object_set_new(j, k, json_integer(
                    static_cast<json_int_t>(json_real_value(v))));
            } else {
                integers_again(v);
            }
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v) {
            if (json_is_real(v) && whole(json_real_value(v))) {
                json_array_set_new(j, i, json_integer(
                    static_cast<json_int_t>(json_real_value(v))));
            } else {
                integers_again(v);
            }
        }
    }
}

/*
 * Overwrites the number that ends at byte end of text (where jansson reports
 * a real overflow) with the largest power of ten a double holds, of the same
 * sign, padded with spaces: an overflowing number has at least 5 bytes
 * ("1e309"), as "1e308" has.
 */
bool
clamp_number(std::string &text, size_t end)
{
    size_t start = end;

    while (start > 0
           && std::strchr("0123456789+-.eE", text[start - 1]) != nullptr
           && text[start - 1] != '\0')
    {
        start--;
    }

    bool negative = start < end && text[start] == '-';
    std::string_view big = negative ? "-1e308" : "1e308";

    if (end - start < big.size()) {
        return false;
    }

    text.replace(start, end - start,
                 std::string(big) + std::string(end - start - big.size(), ' '));
    return true;
}

}  // namespace

Json
json_parse(const char *data, size_t len)
{
    json_error_t err;
    Json j(json_loadb(data, len, JSON_ALLOW_NUL, &err));

    if (j || json_error_code(&err) != json_error_numeric_overflow) {
        return j;
    }

    const size_t flags = JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL;
    j = Json(json_loadb(data, len, flags, &err));

    /* a number beyond any double (stored by the database before the admin
       API refused them) is read as the largest one, not as unreadable
       text: a bounded number of them, each a reparse */
    std::string text;

    for (int n = 0; !j && n < 64
                    && json_error_code(&err) == json_error_numeric_overflow;
         n++)
    {
        if (text.empty()) {
            text.assign(data, len);
        }

        if (err.position <= 0 || static_cast<size_t>(err.position) > len
            || !clamp_number(text, static_cast<size_t>(err.position)))
        {
            break;
        }

        j = Json(json_loadb(text.data(), text.size(), flags, &err));
    }

    if (j) {
        integers_again(j.get());
    }

    return j;
}

namespace {

/* A real in the fewest digits that read back as the same double. */
void
shortest_real(std::string_view tok, std::string &out)
{
    char   num[40];
    char   buf[40];
    double v;

    if (tok.size() >= sizeof(num)) {
        out.append(tok);
        return;
    }

    std::memcpy(num, tok.data(), tok.size());
    num[tok.size()] = '\0';
    v = std::strtod(num, nullptr);

    /* the fewest digits; an exponent only where a number is written with
       one anyway (100.0 stays 100.0, not 1e2) */
    bool plain = std::fabs(v) >= 1e-4 && std::fabs(v) < 1e17;

    for (int p = 1; p <= 17; p++) {
        std::snprintf(buf, sizeof(buf), "%.*g", p, v);
        if (std::strtod(buf, nullptr) == v
            && (!plain || std::strchr(buf, 'e') == nullptr || p == 17))
        {
            break;
        }
    }

    /* the exponent as jansson writes it: 1e19, 1e-5 (not 1e+19, 1e-05) */
    char *e = std::strchr(buf, 'e');

    if (e != nullptr) {
        char *d = e + 1;
        char *from = d;

        if (*from == '+') {
            from++;
        } else if (*from == '-') {
            d++;
            from++;
        }

        while (*from == '0' && from[1] != '\0') {
            from++;
        }

        std::memmove(d, from, std::strlen(from) + 1);
    }

    out.append(buf);

    /* still a real: 3.0 stays 3.0 */
    if (std::strpbrk(buf, ".e") == nullptr) {
        out.append(".0");
    }
}

/*
 * jansson writes every real with 17 significant digits, so a 0.1 read from
 * a vendor's answer would leave as 0.10000000000000001: each real of the
 * text is written again in its shortest form.  Strings are skipped whole.
 */
void
shortest_reals(std::string &s)
{
    std::string out;
    size_t      i = 0, copied = 0, n = s.size();

    while (i < n) {
        char c = s[i];

        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++) {
                i = s.find_first_of("\"\\", i);
                if (i == std::string::npos) {
                    return;
                }
                if (s[i] == '"') {
                    break;
                }
                i++;    /* the escaped character */
            }
            i++;
            continue;
        }

        if (c != '-' && (c < '0' || c > '9')) {
            i++;
            continue;
        }

        size_t start = i;
        bool   real = false;

        for (; i < n; i++) {
            c = s[i];
            if (c == '.' || c == 'e' || c == 'E') {
                real = true;
            } else if (c != '-' && c != '+' && (c < '0' || c > '9')) {
                break;
            }
        }

        if (!real) {
            continue;
        }

        std::string_view tok(s.data() + start, i - start);
        size_t mark = out.size();

        out.append(s, copied, start - copied);
        size_t at = out.size();
        shortest_real(tok, out);

        if (std::string_view(out).substr(at) == tok) {
            out.resize(mark);   /* unchanged: copied later with the rest */
            continue;
        }

        copied = i;
    }

    if (copied > 0) {
        out.append(s, copied, std::string::npos);
        s.swap(out);
    }
}

} // namespace

std::string
json_dump(const json_t *j)
{
    /* a plugin's answer may be any JSON value, "hello" or 42 too */
    size_t n = json_dumpb(j, nullptr, 0, JSON_COMPACT | JSON_ENCODE_ANY);
    std::string out(n, '\0');

    if (n > 0) {
        json_dumpb(j, out.data(), n, JSON_COMPACT | JSON_ENCODE_ANY);
        shortest_reals(out);
    }

    return out;
}

std::string
json_dump_pg(const json_t *j)
{
    std::string out = json_dump(j);

    /* backslashes appear only inside strings, each starting an escape */
    for (size_t i = 0; i + 1 < out.size(); i++) {
        if (out[i] != '\\') {
            continue;
        }

        if (out.compare(i + 1, 5, "u0000") == 0) {
            out.replace(i + 2, 4, "fffd");
        }

        i++;
    }

    return out;
}

std::string_view
json_str(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);

    if (!json_is_string(v)) {
        return {};
    }

    return std::string_view(json_string_value(v), json_string_length(v));
}

int64_t
json_int(const json_t *obj, const char *key, int64_t dflt)
{
    json_t *v = json_object_get(obj, key);

    if (json_is_integer(v)) {
        return json_integer_value(v);
    }

    if (json_is_real(v)) {
        return static_cast<int64_t>(json_real_value(v));
    }

    return dflt;
}

double
json_num(const json_t *obj, const char *key, double dflt)
{
    json_t *v = json_object_get(obj, key);

    return json_is_number(v) ? json_number_value(v) : dflt;
}

size_t
utf8_seq(const unsigned char *p, size_t avail)
{
    unsigned char c = p[0];
    size_t n;
    uint32_t cp;

    if (c < 0x80) {
        return 1;
    }

    if (c >= 0xc2 && c <= 0xdf) {
        n = 2; cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3; cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4; cp = c & 0x07;
    } else {
        return 0;
    }

    if (avail < n) {
        return 0;
    }

    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }
        cp = (cp << 6) | (p[i] & 0x3f);
    }

    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)))
        || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
    {
        return 0;
    }

    return n;
}

bool
utf8_valid(std::string_view s)
{
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());

    for (size_t i = 0, n; i < s.size(); i += n) {
        n = utf8_seq(p + i, s.size() - i);
        if (n == 0) {
            return false;
        }
    }
    return true;
}

size_t
append_utf8_char(std::string &out, const unsigned char *p, size_t avail)
{
    size_t n = utf8_seq(p, avail);

    if (n == 0) {
        out += "\xef\xbf\xbd";
        return 1;
    }

    out.append(reinterpret_cast<const char *>(p), n);
    return n;
}


void
append_json_string(std::string &out, std::string_view s)
{
    const unsigned char *p = reinterpret_cast<const unsigned char *>(s.data());
    size_t len = s.size();

    out.push_back('"');

    for (size_t i = 0; i < len; ) {
        unsigned char c = p[i];

        if (c == '"' || c == '\\') {
            out.push_back('\\');
            out.push_back(static_cast<char>(c));
            i++;
        } else if (c < 0x20) {
            char esc[8];
            switch (c) {
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                std::snprintf(esc, sizeof(esc), "\\u%04x", c);
                out += esc;
            }
            i++;
        } else if (c < 0x80) {
            out.push_back(static_cast<char>(c));
            i++;
        } else {
            i += append_utf8_char(out, p + i, len - i);
        }
    }

    out.push_back('"');
}

std::string_view
utf8_prefix(std::string_view s, size_t max)
{
    if (s.size() <= max) {
        return s;
    }

    size_t n = max;

    /* step back over continuation bytes to the start of a character */
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) {
        n--;
    }

    return s.substr(0, n);
}

std::string
shown(std::string_view name)
{
    char buf[LLMGW_SHOWN_SIZE];

    return llmgw_shown(name.data(), name.size(), buf);
}

namespace {

/* s as a URI component: unreserved characters as is (RFC 3986 2.3). */
std::string
percent_encoded(std::string_view s, const char *hex)
{
    std::string out;

    for (char ch : s) {
        unsigned char c = static_cast<unsigned char>(ch);

        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
            || (c >= '0' && c <= '9')
            || std::string_view("-._~").find(ch) != std::string_view::npos)
        {
            out += ch;
        } else {
            out += '%';
            out += hex[c >> 4];
            out += hex[c & 0x0f];
        }
    }

    return out;
}

void
replace_all(std::string &s, std::string_view what, std::string_view with)
{
    for (size_t at = s.find(what); at != std::string::npos;
         at = s.find(what, at + with.size()))
    {
        s.replace(at, what.size(), with);
    }
}

/*
 * The base64 characters a copy of s decides alone inside a longer base64
 * text ("Basic " + base64(key + ":"), a token that wraps the key): one
 * spelling for each of the three places s can start in a 3-byte group,
 * without the characters the bytes around it share.  URL-safe alphabet
 * when url.
 */
std::vector<std::string>
base64_spellings(std::string_view s, bool url)
{
    std::vector<std::string> out;

    for (size_t lead = 0; lead < 3; lead++) {
        std::string text;
        append_base64(text, std::string(lead, '\0') + std::string(s));

        size_t from = (8 * lead + 5) / 6;           /* touch the lead */
        size_t to = 8 * (lead + s.size()) / 6;      /* s's bits only */
        std::string f = text.substr(from, to - from);

        if (url) {
            for (char &c : f) {
                c = c == '+' ? '-' : c == '/' ? '_' : c;
            }
        }
        out.push_back(std::move(f));
    }

    return out;
}

}  // namespace

std::vector<std::string>
credential_forms(std::string_view credential)
{
    std::vector<std::string> forms;

    if (credential.size() < kCredentialMinBytes) {
        return forms;
    }

    std::string escaped(credential);
    replace_all(escaped, "/", "\\/");       /* as JSON may write it */

    std::vector<std::string> all = { std::string(credential), escaped,
                                     percent_encoded(credential,
                                                     "0123456789ABCDEF"),
                                     percent_encoded(credential,
                                                     "0123456789abcdef") };

    for (bool url : { false, true }) {
        for (std::string &f : base64_spellings(credential, url)) {
            all.push_back(std::move(f));
        }
    }

    for (std::string &f : all) {
        if (std::find(forms.begin(), forms.end(), f) == forms.end()) {
            forms.push_back(std::move(f));
        }
    }

    return forms;
}

std::string_view
without_cut_credential(std::string_view s, std::string_view credential)
{
    size_t drop = 0;

    for (const std::string &f : credential_forms(credential)) {
        for (size_t k = std::min(f.size() - 1, s.size()); k > drop; k--) {
            if (s.compare(s.size() - k, k, f, 0, k) == 0) {
                drop = k;
                break;
            }
        }
    }

    return s.substr(0, s.size() - drop);
}

std::string
redact(std::string_view s, std::string_view credential)
{
    static constexpr std::string_view redacted = "[credential]";
    std::string out(s);

    for (const std::string &f : credential_forms(credential)) {
        replace_all(out, f, redacted);
    }

    return out;
}

} /* namespace llmgw */


extern "C" void
llmgw_buf_free(llmgw_buf_t *b)
{
    if (b != nullptr) {
        std::free(b->data);
        b->data = nullptr;
        b->len = 0;
    }
}


extern "C" const char *
llmgw_shown(const char *data, size_t len, char buf[LLMGW_SHOWN_SIZE])
{
    size_t n = std::min<size_t>(len, 200), o = 0;

    /* not into a UTF-8 character cut at the end */
    if (n < len) {
        while (n > 0 && (static_cast<unsigned char>(data[n]) & 0xc0) == 0x80) {
            n--;
        }
    }

    for (size_t i = 0; i < n; i++) {
        unsigned char c = static_cast<unsigned char>(data[i]);

        if (c < 0x20 || c == 0x7f) {
            o += static_cast<size_t>(std::snprintf(buf + o, 7, "\\u%04x", c));
        } else {
            buf[o++] = static_cast<char>(c);
        }
    }

    buf[o] = '\0';
    return buf;
}


extern "C" void
llmgw_verdict_set(llmgw_verdict_t *v, int status, const char *type,
    const char *code, const char *fmt, ...)
{
    va_list  ap;

    v->status = status;
    v->type = type;
    v->code = code;

    va_start(ap, fmt);
    std::vsnprintf(v->message, sizeof(v->message), fmt, ap);
    va_end(ap);
}
