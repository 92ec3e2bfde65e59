/*
 * A small JavaScript tokenizer, just precise enough to tell keywords from
 * the same words inside strings, templates, comments, regex literals,
 * property accesses (`x.import`) and object keys (`{ async: true }`).
 *
 * Where JavaScript is ambiguous (a `/` after `)` or `}`) it guesses the
 * usual way; a wrong guess can only hide or invent a forbidden word, and
 * V8 itself refuses top-level await in a non-async context and every
 * import (the module resolver refuses everything, eval is disabled).
 */

#include <cstring>

#include "source_scan.h"

namespace v8host {

namespace {

enum class Prev {
    none,           /* start of source */
    regex_ok,       /* punctuator or keyword after which `/` starts a regex */
    value,          /* identifier, number, string, `)` `]`: `/` divides */
    dot,            /* `.` or `?.`: the next identifier is a property name */
};

bool
ident_start(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'
           || c == '$' || c == '\\' || c >= 0x80;
}

bool
ident_part(unsigned char c)
{
    return ident_start(c) || (c >= '0' && c <= '9');
}

/* Keywords after which a `/` begins a regular expression. */
bool
keyword_before_expression(std::string_view w)
{
    static const char *const words[] = {
        "return", "typeof", "instanceof", "in", "of", "new", "delete",
        "void", "throw", "case", "do", "else", "yield", "await",
    };

    for (const char *k : words) {
        if (w == k) {
            return true;
        }
    }

    return false;
}

class Scanner {
public:
    Scanner(std::string_view src, size_t max) : s_(src), max_(max) {}

    std::vector<std::string> run();

private:
    std::string_view          s_;
    size_t                    max_;
    size_t                    i_ = 0;
    int                       line_ = 1;
    Prev                      prev_ = Prev::none;
    std::vector<int>          templ_;   /* open braces per ${ } level */
    std::vector<std::string>  found_;

    unsigned char at(size_t k) const {
        return k < s_.size() ? static_cast<unsigned char>(s_[k]) : 0;
    }

    bool skip_comment();
    void skip_string(char quote);
    void skip_template();
    bool skip_regex();
    void word();
    size_t next_significant(size_t k, bool *newline) const;
    void report(const char *what, int line);
};

void
Scanner::report(const char *what, int line)
{
    if (found_.size() < max_) {
        found_.push_back(std::string(what) + " (line " + std::to_string(line)
                         + ")");
    }
}

/* At a '/': skips a // or block comment; false when it is not one. */
bool
Scanner::skip_comment()
{
    if (at(i_ + 1) == '/') {
        while (i_ < s_.size() && s_[i_] != '\n') {
            i_++;
        }
        return true;
    }

    if (at(i_ + 1) == '*') {
        i_ += 2;
        while (i_ < s_.size() && !(s_[i_] == '*' && at(i_ + 1) == '/')) {
            if (s_[i_] == '\n') {
                line_++;
            }
            i_++;
        }
        i_ += 2;
        return true;
    }

    return false;
}

void
Scanner::skip_string(char quote)
{
    i_++;
    while (i_ < s_.size() && s_[i_] != quote) {
        if (s_[i_] == '\\') {
            i_++;
            if (at(i_) == '\n') {
                line_++;
            }
        } else if (s_[i_] == '\n') {
            return;     /* unterminated: V8 reports the syntax error */
        }
        i_++;
    }
    i_++;
}

/* From just after a '`' or a closing '}' of ${ }: to the end or to a ${. */
void
Scanner::skip_template()
{
    while (i_ < s_.size()) {
        char c = s_[i_];

        if (c == '\\') {
            i_ += 2;
            continue;
        }
        if (c == '\n') {
            line_++;
        }
        if (c == '`') {
            i_++;
            prev_ = Prev::value;
            return;
        }
        if (c == '$' && at(i_ + 1) == '{') {
            i_ += 2;
            templ_.push_back(0);
            prev_ = Prev::regex_ok;
            return;
        }
        i_++;
    }
}

/* At a '/' that starts a regex: skips it; false (nothing consumed) if the
   literal does not end on this line, so the '/' is taken as division. */
bool
Scanner::skip_regex()
{
    size_t k = i_ + 1;
    bool in_class = false;

    while (k < s_.size() && s_[k] != '\n') {
        char c = s_[k];

        if (c == '\\') {
            k += 2;
            continue;
        }
        if (c == '[') {
            in_class = true;
        } else if (c == ']') {
            in_class = false;
        } else if (c == '/' && !in_class) {
            k++;
            while (ident_part(at(k))) {
                k++;
            }
            i_ = k;
            return true;
        }
        k++;
    }

    return false;
}

/* The index of the next character that is not blank or a comment. */
size_t
Scanner::next_significant(size_t k, bool *newline) const
{
    *newline = false;

    while (k < s_.size()) {
        char c = s_[k];

        if (c == '\n') {
            *newline = true;
            k++;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f'
                   || c == '\v')
        {
            k++;
        } else if (c == '/' && at(k + 1) == '/') {
            while (k < s_.size() && s_[k] != '\n') {
                k++;
            }
        } else if (c == '/' && at(k + 1) == '*') {
            k += 2;
            while (k < s_.size() && !(s_[k] == '*' && at(k + 1) == '/')) {
                if (s_[k] == '\n') {
                    *newline = true;
                }
                k++;
            }
            k += 2;
        } else {
            break;
        }
    }

    return k;
}

void
Scanner::word()
{
    size_t start = i_;

    while (i_ < s_.size() && ident_part(at(i_))) {
        if (s_[i_] == '\\') {
            i_++;
        }
        i_++;
    }

    std::string_view w = s_.substr(start, i_ - start);
    bool after_dot = (prev_ == Prev::dot);

    prev_ = keyword_before_expression(w) ? Prev::regex_ok : Prev::value;

    if (after_dot || (w != "async" && w != "await" && w != "import")) {
        return;
    }

    bool nl;
    size_t k = next_significant(i_, &nl);
    unsigned char next = at(k);

    if (next == ':' && at(k + 1) != ':') {
        return;     /* an object key such as { async: true } */
    }

    if (w == "await") {
        report("plugins are synchronous: `await` is not allowed", line_);

    } else if (w == "import") {
        if (next == '(') {
            report("plugins cannot import modules: dynamic `import()` is "
                   "not allowed", line_);
        } else {
            report("plugins cannot import modules: `import` is not allowed",
                   line_);
        }

    } else if (!nl && (ident_start(next) || next == '(' || next == '*'
                       || next == '[' || next == '"' || next == '\''
                       || next == '#' || (next >= '0' && next <= '9')))
    {
        /* `async` is a keyword only before a function, an arrow's
           parameters or a method name on the same line. */
        report("plugins are synchronous: `async` functions are not allowed",
               line_);
    }
}

std::vector<std::string>
Scanner::run()
{
    if (s_.substr(0, 2) == "#!") {
        while (i_ < s_.size() && s_[i_] != '\n') {
            i_++;
        }
    }

    while (i_ < s_.size() && found_.size() < max_) {
        unsigned char c = at(i_);

        if (c == '\n') {
            line_++;
            i_++;
        } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f'
                   || c == '\v')
        {
            i_++;
        } else if (c == '/') {
            if (skip_comment()) {
                continue;
            }
            if (prev_ != Prev::value && skip_regex()) {
                prev_ = Prev::value;
                continue;
            }
            i_++;
            prev_ = Prev::regex_ok;
        } else if (c == '"' || c == '\'') {
            skip_string(static_cast<char>(c));
            prev_ = Prev::value;
        } else if (c == '`') {
            i_++;
            skip_template();
        } else if (ident_start(c)) {
            word();
        } else if (c >= '0' && c <= '9') {
            while (ident_part(at(i_)) || at(i_) == '.') {
                i_++;
            }
            prev_ = Prev::value;
        } else if (c == '.' && at(i_ + 1) >= '0' && at(i_ + 1) <= '9') {
            i_++;
            while (ident_part(at(i_)) || at(i_) == '.') {
                i_++;
            }
            prev_ = Prev::value;
        } else if (c == '.' || (c == '?' && at(i_ + 1) == '.'
                                && !(at(i_ + 2) >= '0' && at(i_ + 2) <= '9')))
        {
            if (c == '.' && at(i_ + 1) == '.' && at(i_ + 2) == '.') {
                i_ += 3;
                prev_ = Prev::regex_ok;     /* spread: an expression follows */
            } else {
                i_ += (c == '.') ? 1 : 2;
                prev_ = Prev::dot;
            }
        } else if (c == '#') {
            i_++;
            prev_ = Prev::dot;              /* #name is a private name */
        } else if (c == '{') {
            if (!templ_.empty()) {
                templ_.back()++;
            }
            i_++;
            prev_ = Prev::regex_ok;
        } else if (c == '}') {
            i_++;
            if (!templ_.empty()) {
                if (templ_.back() == 0) {
                    templ_.pop_back();
                    skip_template();
                    continue;
                }
                templ_.back()--;
            }
            prev_ = Prev::regex_ok;
        } else if (c == ')' || c == ']') {
            i_++;
            prev_ = Prev::value;
        } else {
            i_++;
            prev_ = Prev::regex_ok;
        }
    }

    return found_;
}

}  // namespace

std::vector<std::string>
scan_forbidden(std::string_view src, size_t max)
{
    return Scanner(src, max).run();
}

}  // namespace v8host
