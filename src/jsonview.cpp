/*
 * JsonView: validation by jansson's rules, then walks without allocation.
 */

#include "jsonview.h"

#include <jansson.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "internal.h"

namespace llmgw {

namespace {

inline bool
is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

inline bool
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

inline int
hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* The four hex digits at p (all present and checked) as a number. */
inline uint32_t
hex4(const unsigned char *p)
{
    return (static_cast<uint32_t>(hex_value(p[0])) << 12)
           | (static_cast<uint32_t>(hex_value(p[1])) << 8)
           | (static_cast<uint32_t>(hex_value(p[2])) << 4)
           | static_cast<uint32_t>(hex_value(p[3]));
}

inline size_t
utf8_length(uint32_t cp)
{
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/* Whether an integer's text (a valid JSON integer) is within int64. */
bool
fits_int64(std::string_view t)
{
    static const char kMax[] = "9223372036854775807";
    static const char kMin[] = "9223372036854775808";
    bool negative = !t.empty() && t[0] == '-';
    std::string_view d = negative ? t.substr(1) : t;
    std::string_view limit(negative ? kMin : kMax, sizeof(kMax) - 1);

    if (d.size() != limit.size()) {
        return d.size() < limit.size();
    }
    return d.compare(limit) <= 0;
}

/* A real number's text parsed as strtod does (the text is a valid number). */
double
to_double(std::string_view text)
{
    std::string copy(text);
    return std::strtod(copy.c_str(), nullptr);
}


/*
 * The checker: accepts exactly what json_loadb(JSON_ALLOW_NUL) accepts (the
 * root an object or an array, nesting at most JSON_PARSER_MAX_DEPTH values
 * deep, integers within int64, reals that do not overflow a double, strings
 * of valid UTF-8 without control characters, \u escapes forming whole
 * surrogate pairs, no \u0000 in an object key).
 */
class Checker {
public:
    Checker(const unsigned char *p, const unsigned char *end)
        : p_(p), end_(end) {}

    bool document(JsonView::Kind &root)
    {
        space();
        if (p_ == end_ || (*p_ != '{' && *p_ != '[')) {
            return false;
        }
        root = *p_ == '{' ? JsonView::Kind::object : JsonView::Kind::array;
        if (!value(1)) {
            return false;
        }
        space();
        return p_ == end_;
    }

private:
    void space()
    {
        while (p_ < end_ && is_space(*p_)) {
            p_++;
        }
    }

    bool value(int depth)
    {
        if (depth > JSON_PARSER_MAX_DEPTH || p_ == end_) {
            return false;
        }

        switch (*p_) {
        case '{':
        case '[':
            return container(depth);
        case '"': {
            bool nul = false;
            return string(nul);
        }
        case 't':
            return literal("true");
        case 'f':
            return literal("false");
        case 'n':
            return literal("null");
        default:
            return number();
        }
    }

    bool literal(const char *word)
    {
        size_t n = std::strlen(word);

        if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, word, n) != 0) {
            return false;
        }
        p_ += n;
        /* jansson reads a whole identifier: "truex" is one bad token */
        return p_ == end_ || !((*p_ >= 'a' && *p_ <= 'z')
                               || (*p_ >= 'A' && *p_ <= 'Z'));
    }

    /* At '{' or '[': the members or elements up to the closing bracket. */
    bool container(int depth)
    {
        bool members = *p_ == '{';
        unsigned char close = members ? '}' : ']';

        p_++;
        space();
        if (p_ < end_ && *p_ == close) {
            p_++;
            return true;
        }

        for ( ;; ) {
            if ((members && !member_name()) || !value(depth + 1)) {
                return false;
            }
            space();
            if (p_ == end_) {
                return false;
            }
            if (*p_ == close) {
                p_++;
                return true;
            }
            if (*p_ != ',') {
                return false;
            }
            p_++;
            space();
        }
    }

    /* A member's name and colon; jansson keeps no U+0000 in a name. */
    bool member_name()
    {
        bool nul = false;

        if (p_ == end_ || *p_ != '"' || !string(nul) || nul) {
            return false;
        }
        space();
        if (p_ == end_ || *p_ != ':') {
            return false;
        }
        p_++;
        space();
        return true;
    }

    /* At the opening quote; nul tells whether the value holds U+0000. */
    bool string(bool &nul)
    {
        p_++;

        for ( ;; ) {
            /* the common run: printable ASCII */
            while (p_ < end_ && *p_ >= 0x20 && *p_ < 0x80 && *p_ != '"'
                   && *p_ != '\\')
            {
                p_++;
            }

            if (p_ == end_) {
                return false;
            }

            unsigned char c = *p_;

            if (c == '"') {
                p_++;
                return true;
            }

            if (c < 0x20) {
                return false;
            }

            if (c >= 0x80) {
                size_t n = utf8_seq(p_, static_cast<size_t>(end_ - p_));
                if (n == 0) {
                    return false;
                }
                p_ += n;
                continue;
            }

            if (!escape(nul)) {
                return false;
            }
        }
    }

    /* At a backslash inside a string. */
    bool escape(bool &nul)
    {
        if (end_ - p_ < 2) {
            return false;
        }

        switch (p_[1]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n':
        case 'r': case 't':
            p_ += 2;
            return true;
        case 'u':
            break;
        default:
            return false;
        }

        uint32_t cp;

        if (!unicode(cp)) {
            return false;
        }

        if (cp >= 0xdc00 && cp <= 0xdfff) {
            return false;
        }

        if (cp >= 0xd800 && cp <= 0xdbff) {
            uint32_t low;

            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u'
                || !unicode(low) || low < 0xdc00 || low > 0xdfff)
            {
                return false;
            }
        }

        if (cp == 0) {
            nul = true;
        }
        return true;
    }

    /* At "\u": reads the four hex digits. */
    bool unicode(uint32_t &cp)
    {
        if (end_ - p_ < 6) {
            return false;
        }
        for (int i = 2; i < 6; i++) {
            if (hex_value(p_[i]) < 0) {
                return false;
            }
        }
        cp = hex4(p_ + 2);
        p_ += 6;
        return true;
    }

    bool number()
    {
        const unsigned char *start = p_;

        if (*p_ == '-') {
            p_++;
        }

        if (p_ == end_ || !is_digit(*p_)) {
            return false;
        }

        const unsigned char *digits = p_;

        if (*p_ == '0') {
            p_++;
            if (p_ < end_ && is_digit(*p_)) {
                return false;
            }
        } else {
            while (p_ < end_ && is_digit(*p_)) {
                p_++;
            }
        }

        size_t int_digits = static_cast<size_t>(p_ - digits);

        if (p_ == end_ || (*p_ != '.' && *p_ != 'e' && *p_ != 'E')) {
            /* beyond int64 it is read as a real (json_parse does the
               same), which overflows only past about 309 digits */
            return int_digits < 300
                   || !std::isinf(to_double(std::string_view(
                          reinterpret_cast<const char *>(start),
                          static_cast<size_t>(p_ - start))));
        }

        bool exponent = false;

        if (*p_ == '.') {
            p_++;
            if (p_ == end_ || !is_digit(*p_)) {
                return false;
            }
            while (p_ < end_ && is_digit(*p_)) {
                p_++;
            }
        }

        if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
            exponent = true;
            p_++;
            if (p_ < end_ && (*p_ == '+' || *p_ == '-')) {
                p_++;
            }
            if (p_ == end_ || !is_digit(*p_)) {
                return false;
            }
            while (p_ < end_ && is_digit(*p_)) {
                p_++;
            }
        }

        /* only a large exponent or a long integer part can overflow */
        if (!exponent && int_digits < 300) {
            return true;
        }

        std::string_view text(reinterpret_cast<const char *>(start),
                              static_cast<size_t>(p_ - start));
        return !std::isinf(to_double(text));
    }

    const unsigned char *p_;
    const unsigned char *end_;
};


/* The end of the validated string starting at the quote at i. */
size_t
string_end(std::string_view t, size_t i)
{
    for (i++; i < t.size(); i++) {
        if (t[i] == '\\') {
            i++;
        } else if (t[i] == '"') {
            return i + 1;
        }
    }
    return t.size();
}


/* The end of the validated container starting at i. */
size_t
container_end(std::string_view t, size_t i)
{
    int depth = 0;

    for (; i < t.size(); i++) {
        char c = t[i];

        if (c == '"') {
            i = string_end(t, i) - 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            return i + 1;
        }
    }
    return t.size();
}


/*
 * Walks a validated string's body (between the quotes), calling out(cp)
 * for every escape and out_bytes(ptr, len) for every run of literal bytes.
 */
template <typename Bytes, typename Code>
void
decode(std::string_view body, Bytes out_bytes, Code out_code)
{
    size_t i = 0;

    while (i < body.size()) {
        size_t run = i;

        while (i < body.size() && body[i] != '\\') {
            i++;
        }
        if (i > run) {
            out_bytes(body.data() + run, i - run);
        }
        if (i == body.size()) {
            break;
        }

        char e = body[i + 1];

        if (e != 'u') {
            static const char from[] = "\"\\/bfnrt";
            static const char to[] = "\"\\/\b\f\n\r\t";
            out_code(static_cast<uint32_t>(
                         static_cast<unsigned char>(
                             to[std::strchr(from, e) - from])));
            i += 2;
            continue;
        }

        auto p = reinterpret_cast<const unsigned char *>(body.data() + i);
        uint32_t cp = hex4(p + 2);
        i += 6;

        if (cp >= 0xd800 && cp <= 0xdbff) {
            uint32_t low = hex4(p + 8);
            cp = ((cp - 0xd800) << 10) + (low - 0xdc00) + 0x10000;
            i += 6;
        }
        out_code(cp);
    }
}

void
append_utf8(std::string &out, uint32_t cp)
{
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
        out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
}

} /* namespace */


JsonView
JsonView::parse(std::string_view text)
{
    auto p = reinterpret_cast<const unsigned char *>(text.data());
    Checker c(p, p + text.size());
    Kind root = Kind::none;

    if (!c.document(root)) {
        return JsonView();
    }

    size_t b = 0;
    size_t e = text.size();

    while (is_space(static_cast<unsigned char>(text[b]))) {
        b++;
    }
    while (is_space(static_cast<unsigned char>(text[e - 1]))) {
        e--;
    }
    return JsonView(root, text.substr(b, e - b));
}


bool
JsonView::Walker::more()
{
    while (pos < text.size()
           && (is_space(static_cast<unsigned char>(text[pos]))
               || text[pos] == ','))
    {
        pos++;
    }
    return pos < text.size() && text[pos] != '}' && text[pos] != ']';
}


void
JsonView::Walker::colon()
{
    while (pos < text.size()
           && (is_space(static_cast<unsigned char>(text[pos]))
               || text[pos] == ':'))
    {
        pos++;
    }
}


JsonView
JsonView::Walker::next()
{
    size_t start = pos;
    Kind k;

    switch (text[pos]) {
    case '{':
        k = Kind::object;
        pos = container_end(text, pos);
        break;
    case '[':
        k = Kind::array;
        pos = container_end(text, pos);
        break;
    case '"':
        k = Kind::string;
        pos = string_end(text, pos);
        break;
    case 't':
        k = Kind::yes;
        pos += 4;
        break;
    case 'f':
        k = Kind::no;
        pos += 5;
        break;
    case 'n':
        k = Kind::null;
        pos += 4;
        break;
    default:
        k = Kind::integer;
        while (pos < text.size()) {
            char c = text[pos];
            if (c == '.' || c == 'e' || c == 'E') {
                k = Kind::real;
            } else if (!is_digit(static_cast<unsigned char>(c)) && c != '-'
                       && c != '+')
            {
                break;
            }
            pos++;
        }
        if (k == Kind::integer && !fits_int64(text.substr(start, pos - start))) {
            k = Kind::real;
        }
    }

    return JsonView(k, text.substr(start, pos - start));
}


void
JsonView::visit(JsonVisitor &v) const
{
    /* whether each open container is an object, and whether a name is due */
    std::vector<bool> object;
    bool name_due = false;

    for (size_t i = 0; i < raw_.size(); ) {
        char c = raw_[i];

        switch (c) {
        case ' ': case '\t': case '\n': case '\r': case ':':
            i++;
            continue;
        case ',':
            name_due = !object.empty() && object.back();
            i++;
            continue;
        case '{':
        case '[':
            object.push_back(c == '{');
            name_due = c == '{';
            v.open(c == '{');
            i++;
            continue;
        case '}':
        case ']':
            object.pop_back();
            name_due = false;
            v.close();
            i++;
            continue;
        default:
            break;
        }

        Walker w(raw_);
        w.pos = i;
        JsonView item = w.next();   /* a scalar or a string: no nesting */
        i = w.pos;

        if (name_due) {
            v.key(item);
            name_due = false;
        } else {
            v.value(item);
        }
    }
}


JsonView
JsonView::get(std::string_view name) const
{
    JsonView found;

    each_member([&](const JsonView &key, const JsonView &value) {
        if (key.string_equals(name)) {
            found = value;
        }
    });
    return found;
}


int64_t
JsonView::integer(int64_t dflt) const
{
    if (kind_ == Kind::real) {
        /* truncated as jansson's real is; clamped where int64 ends */
        double d = to_double(raw_);
        if (!(d > -9223372036854775808.0)) {
            return INT64_MIN;
        }
        if (!(d < 9223372036854775808.0)) {
            return INT64_MAX;
        }
        return static_cast<int64_t>(d);
    }

    if (kind_ != Kind::integer) {
        return dflt;
    }

    bool negative = raw_[0] == '-';
    uint64_t v = 0;

    for (size_t i = negative ? 1 : 0; i < raw_.size(); i++) {
        v = v * 10 + static_cast<uint64_t>(raw_[i] - '0');
    }
    /* in range: a longer integer is Kind::real */
    return negative ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
}


std::string
JsonView::string() const
{
    std::string out;

    if (kind_ != Kind::string) {
        return out;
    }

    std::string_view body = raw_.substr(1, raw_.size() - 2);

    out.reserve(body.size());
    decode(body,
           [&](const char *p, size_t n) { out.append(p, n); },
           [&](uint32_t cp) { append_utf8(out, cp); });
    return out;
}


size_t
JsonView::string_length() const
{
    size_t n = 0;

    if (kind_ != Kind::string) {
        return 0;
    }

    decode(raw_.substr(1, raw_.size() - 2),
           [&](const char *, size_t len) { n += len; },
           [&](uint32_t cp) { n += utf8_length(cp); });
    return n;
}


std::string_view
JsonView::text(std::string &scratch) const
{
    if (kind_ != Kind::string) {
        return {};
    }

    std::string_view body = raw_.substr(1, raw_.size() - 2);

    if (body.find('\\') == std::string_view::npos) {
        return body;
    }
    scratch = string();
    return scratch;
}


bool
JsonView::string_equals(std::string_view s) const
{
    std::string scratch;

    return kind_ == Kind::string && text(scratch) == s;
}

} /* namespace llmgw */
