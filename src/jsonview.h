/*
 * A read-only view of JSON text, without building a tree.
 *
 * The hot path reads a few fields of a request (model, stream, max_tokens)
 * and of an answer (usage) and passes the bytes on unchanged; a jansson
 * tree costs dozens of allocations for that.  JsonView::parse() validates
 * a whole text by jansson's rules (the same texts are accepted and refused
 * as json_loadb(JSON_ALLOW_NUL), except that jansson skips a NUL byte right
 * after a number or a literal, where this refuses it), and views into it are
 * then walked without further checks.  The text must outlive every view.
 */

#ifndef LLMGW_JSONVIEW_H
#define LLMGW_JSONVIEW_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace llmgw {

class JsonView;

/* What JsonView::visit() reports, in the text's order. */
class JsonVisitor {
public:
    virtual ~JsonVisitor() = default;
    virtual void open(bool object) { (void) object; }  /* '{' or '[' */
    virtual void close() {}
    virtual void key(const JsonView &name) { (void) name; }
    virtual void value(const JsonView &v) { (void) v; }  /* not containers */
};

class JsonView {
public:
    enum class Kind : char {
        none, object, array, string, integer, real, yes, no, null
    };

    JsonView() = default;

    /* The root value of text, or a view of Kind::none when text is not JSON. */
    static JsonView parse(std::string_view text);

    Kind kind() const { return kind_; }
    explicit operator bool() const { return kind_ != Kind::none; }
    bool is_object() const { return kind_ == Kind::object; }
    bool is_array() const { return kind_ == Kind::array; }
    bool is_string() const { return kind_ == Kind::string; }
    bool is_number() const
    {
        return kind_ == Kind::integer || kind_ == Kind::real;
    }
    bool is_true() const { return kind_ == Kind::yes; }

    /* The value's own text, quotes and brackets included. */
    std::string_view raw() const { return raw_; }

    /* An object's member (the last one of that name, as jansson keeps). */
    JsonView get(std::string_view name) const;

    /* A number as jansson's json_integer_value / a real truncated; else dflt. */
    int64_t integer(int64_t dflt) const;

    /* A string's decoded value ("" for other kinds). */
    std::string string() const;

    /*
     * A string's decoded value, without a copy when it has no escapes
     * (then a view into the text; else decoded into scratch).
     */
    std::string_view text(std::string &scratch) const;

    /* Bytes of a string's decoded value (0 for other kinds). */
    size_t string_length() const;

    /* Whether a string's decoded value equals s. */
    bool string_equals(std::string_view s) const;

    /*
     * Calls f(name, value) for each member of an object, name a string view
     * (quotes included), in the text's order, duplicates included.
     */
    template <typename F>
    void each_member(F f) const
    {
        walk(Kind::object, [&](Walker &w) {
            JsonView name = w.next();
            w.colon();
            f(name, w.next());
        });
    }

    /*
     * Every container, member name and value below (and including) this
     * one, in one pass over the text: linear in its length however deep
     * it nests, where walking with get() and each_*() would pass over
     * nested text once per level.
     */
    void visit(JsonVisitor &v) const;

    /* Calls f(value) for each element of an array. */
    template <typename F>
    void each_element(F f) const
    {
        walk(Kind::array, [&](Walker &w) { f(w.next()); });
    }

private:
    JsonView(Kind k, std::string_view raw) : kind_(k), raw_(raw) {}

    /* Steps through a validated container's items. */
    struct Walker {
        explicit Walker(std::string_view t) : text(t) {}
        bool more();            /* skips space and ','; false at the end */
        void colon();           /* skips space and ':' */
        JsonView next();        /* the value at pos; pos moves past it */

        std::string_view text;
        size_t pos = 0;
    };

    /* step(walker) for each item of a container of kind k */
    template <typename Step>
    void walk(Kind k, Step step) const
    {
        if (kind_ != k) {
            return;
        }
        Walker w(raw_);
        w.pos = 1;
        while (w.more()) {
            step(w);
        }
    }

    Kind kind_ = Kind::none;
    std::string_view raw_;
};

/*
 * JSON text followed one byte at a time, for text that arrives in pieces:
 * whether a byte is inside a string (escapes included), and the nesting
 * depth of the structure outside strings.  It checks nothing.
 */
class JsonBytes {
public:
    enum class Kind {
        string,         /* inside a string, or the quote that ends it */
        string_start,   /* the quote that begins a string */
        open,           /* '{' or '[' (depth() is the new depth) */
        close,          /* '}' or ']' (depth() is the new depth) */
        other           /* anything else outside strings */
    };

    Kind step(char c)
    {
        if (in_string_) {
            if (escaped_) {
                escaped_ = false;
            } else if (c == '\\') {
                escaped_ = true;
            } else if (c == '"') {
                in_string_ = false;
            }
            return Kind::string;
        }

        switch (c) {
        case '"':
            in_string_ = true;
            return Kind::string_start;
        case '{':
        case '[':
            depth_++;
            return Kind::open;
        case '}':
        case ']':
            if (depth_ > 0) {
                depth_--;
            }
            return Kind::close;
        default:
            return Kind::other;
        }
    }

    bool in_string() const { return in_string_; }
    /* inside a string, after a backslash: the next byte is escaped */
    bool escaped() const { return escaped_; }
    int64_t depth() const { return depth_; }

private:
    int64_t  depth_ = 0;
    bool     in_string_ = false;
    bool     escaped_ = false;
};

} /* namespace llmgw */

#endif /* LLMGW_JSONVIEW_H */
