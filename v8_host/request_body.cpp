/*
 * A strict JSON reader for request envelopes (RFC 8259 grammar; strings
 * must be valid UTF-8 and their \u escapes well-formed).  Values it does
 * not need are skipped with an explicit bracket stack, so nesting depth
 * is not limited by the C++ stack.
 */

#include <cstdlib>
#include <vector>

#include "crypto_util.h"
#include "request_body.h"

namespace v8host {

namespace {

class Reader {
public:
    explicit Reader(std::string_view s) : s_(s) {}

    bool object_begin() { ws(); return take('{'); }
    bool string(std::string *out);
    bool number(double *out);
    bool skip_value();
    bool end() { ws(); return i_ == s_.size(); }
    size_t pos() { ws(); return i_; }

    /* Iterates the members of the object just opened: false at '}' or on
       an error (error() tells which). */
    bool next_key(std::string *key, bool *first);

    bool failed() const { return failed_; }
    void fail() { failed_ = true; }
    bool take(char c) {
        if (i_ < s_.size() && s_[i_] == c) { i_++; return true; }
        return false;
    }
    void ws() {
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t'
                                  || s_[i_] == '\n' || s_[i_] == '\r'))
        {
            i_++;
        }
    }
    char peek() { ws(); return i_ < s_.size() ? s_[i_] : '\0'; }

private:
    bool hex4(unsigned *out);
    bool skip_scalar();

    std::string_view  s_;
    size_t            i_ = 0;
    bool              failed_ = false;
};

bool
Reader::hex4(unsigned *out)
{
    if (i_ + 4 > s_.size()) {
        return false;
    }
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s_[i_++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return false;
    }
    *out = v;
    return true;
}

static void
put_utf8(std::string *out, unsigned cp)
{
    if (cp < 0x80) {
        out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
        out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
        out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
        out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
}

/* out may be nullptr: validate and skip. */
bool
Reader::string(std::string *out)
{
    ws();
    if (!take('"')) {
        return false;
    }

    size_t run = i_;        /* start of bytes copied verbatim */

    while (i_ < s_.size()) {
        unsigned char c = static_cast<unsigned char>(s_[i_]);

        if (c == '"' || c == '\\') {
            if (out != nullptr) {
                out->append(s_.substr(run, i_ - run));
            }
            if (c == '"') {
                if (!utf8_valid(s_.substr(run, i_ - run))) {
                    return false;
                }
                i_++;
                return true;
            }
            if (!utf8_valid(s_.substr(run, i_ - run))) {
                return false;
            }
            i_++;
            if (i_ >= s_.size()) {
                return false;
            }
            char e = s_[i_++];
            unsigned cp;
            switch (e) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                if (!hex4(&cp)) {
                    return false;
                }
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    unsigned lo;
                    if (!take('\\') || !take('u') || !hex4(&lo)
                        || lo < 0xdc00 || lo > 0xdfff)
                    {
                        return false;
                    }
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                    return false;
                }
                break;
            default:
                return false;
            }
            if (out != nullptr) {
                put_utf8(out, cp);
            }
            run = i_;
            continue;
        }

        if (c < 0x20) {
            return false;
        }
        i_++;
    }

    return false;
}

bool
Reader::number(double *out)
{
    ws();
    size_t start = i_;
    auto digits = [&]() {
        size_t d = i_;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
            i_++;
        }
        return i_ > d;
    };

    take('-');
    if (take('0')) {
        /* no leading zeros */
    } else if (!digits()) {
        return false;
    }
    if (take('.') && !digits()) {
        return false;
    }
    if (take('e') || take('E')) {
        if (!take('+')) {
            take('-');
        }
        if (!digits()) {
            return false;
        }
    }

    if (out != nullptr) {
        *out = std::strtod(std::string(s_.substr(start, i_ - start)).c_str(),
                           nullptr);
    }
    return true;
}

bool
Reader::skip_scalar()
{
    char c = peek();

    if (c == '"') {
        return string(nullptr);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        return number(nullptr);
    }
    for (std::string_view lit : { "true", "false", "null" }) {
        if (s_.substr(i_, lit.size()) == lit) {
            i_ += lit.size();
            return true;
        }
    }
    return false;
}

/* Any value; containers with an explicit stack of what closes them. */
bool
Reader::skip_value()
{
    std::vector<char> open;

    for (;;) {
        char c = peek();

        if (c == '{' || c == '[') {
            i_++;
            open.push_back(c == '{' ? '}' : ']');
            if (peek() == open.back()) {
                i_++;
                open.pop_back();
            } else {
                if (c == '{' && (!string(nullptr) || (ws(), !take(':')))) {
                    return false;
                }
                continue;       /* the first value inside */
            }
        } else if (!skip_scalar()) {
            return false;
        }

        /* After a value: a comma and the next, or the closing bracket(s). */
        for (;;) {
            if (open.empty()) {
                return true;
            }
            char close = open.back();
            if (peek() == ',') {
                i_++;
                if (close == '}' && (!string(nullptr) || (ws(), !take(':')))) {
                    return false;
                }
                break;
            }
            if (!take(close)) {
                return false;
            }
            open.pop_back();
        }
    }
}

bool
Reader::next_key(std::string *key, bool *first)
{
    if (peek() == '}' && *first) {
        i_++;
        return false;
    }
    if (!*first) {
        if (peek() == '}') {
            i_++;
            return false;
        }
        if (!take(',')) {
            fail();
            return false;
        }
    }
    *first = false;

    key->clear();
    if (!string(key) || (ws(), !take(':'))) {
        fail();
        return false;
    }
    return true;
}

}  // namespace

bool
read_load_body(std::string_view body, std::string *source, std::string *err)
{
    Reader r(body);
    std::string key;
    bool first = true, have = false;

    if (!r.object_begin()) {
        *err = "the body is not a JSON object";
        return false;
    }

    while (r.next_key(&key, &first)) {
        bool ok = key == "source" && r.peek() == '"'
                  ? (have = true, source->clear(), r.string(source))
                  : r.skip_value();
        if (!ok) {
            r.fail();
            break;
        }
    }

    if (r.failed() || !r.end()) {
        *err = "the body is not valid JSON";
        return false;
    }
    if (!have) {
        *err = "LOAD needs {\"source\": string}";
        return false;
    }
    return true;
}

bool
read_call_body(std::string_view body, CallRequest *req, std::string *err)
{
    Reader r(body);
    std::string key, sha;
    bool first = true, have_sha = false, have_hook = false;
    const char *bad = nullptr;

    if (!r.object_begin()) {
        *err = "the body is not a JSON object";
        return false;
    }

    req->args_json = "[]";

    while (!bad && r.next_key(&key, &first)) {
        char c = r.peek();
        bool ok;

        if (key == "sha" || key == "hook" || key == "source") {
            if (c != '"') {
                bad = key == "sha" ? "CALL \"sha\" must be a string"
                      : key == "hook" ? "CALL \"hook\" must be a string"
                      : "CALL \"source\" must be a string";
                break;
            }
            std::string *dst = key == "sha" ? &sha
                               : key == "hook" ? &req->hook : &req->source;
            dst->clear();
            ok = r.string(dst);
            have_sha = have_sha || key == "sha";
            have_hook = have_hook || key == "hook";
            req->has_source = req->has_source || key == "source";

        } else if (key == "args") {
            if (c != '[') {
                bad = "CALL \"args\" must be an array";
                break;
            }
            size_t start = r.pos();
            ok = r.skip_value();
            req->args_json.assign(body.substr(start, r.pos() - start));

        } else if (key == "deadline_ms") {
            double d = 0;
            if (c == 'n') {
                ok = r.skip_value();        /* null: the default */
            } else if (c != '-' && !(c >= '0' && c <= '9')) {
                bad = "CALL \"deadline_ms\" must be a number";
                break;
            } else {
                ok = r.number(&d);
            }
            req->deadline_ms = d >= 1 && d < 1e9 ? static_cast<int>(d) : 0;

        } else if (key == "capabilities") {
            if (!r.take('[')) {
                bad = "CALL \"capabilities\" must be an array of strings";
                break;
            }
            req->capabilities.clear();
            ok = true;
            if (r.peek() == ']') {
                r.take(']');
                continue;
            }
            do {
                std::string cap;
                if (r.peek() != '"') {
                    bad = "CALL \"capabilities\" must be an array of strings";
                    break;
                }
                ok = r.string(&cap);
                req->capabilities.push_back(std::move(cap));
                r.ws();
            } while (ok && r.take(','));
            if (bad) {
                break;
            }
            r.ws();
            ok = ok && r.take(']');

        } else {
            ok = r.skip_value();
        }

        if (!ok) {
            r.fail();
            break;
        }
    }

    if (bad != nullptr) {
        *err = bad;
        return false;
    }
    if (r.failed() || !r.end()) {
        *err = "the body is not valid JSON";
        return false;
    }
    if (!have_sha && !req->has_source) {
        *err = "CALL needs \"sha\" (or \"source\") as a string";
        return false;
    }
    if (!have_hook || req->hook.empty()) {
        *err = "CALL needs \"hook\" (string)";
        return false;
    }

    if (!req->has_source) {
        req->sha = std::move(sha);
    }
    return true;
}

}  // namespace v8host
