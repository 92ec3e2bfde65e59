/*
 * SSE submit results (spec "Events", facts "SSE submit").
 *
 * Delta mode keeps the body in its own tree rather than in jansson: text
 * streams arrive as many small appendText changes, and a jansson string
 * would be copied whole on every one.  The tree knows its node count and
 * encoded size at all times (updated per change, never recounted), so the
 * limits cost nothing per event beyond the values that changed.  An event
 * is atomic: every change is recorded in an undo log and rolled back when
 * a later one (or a limit) fails.
 */

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ssedelta.h"
#include "internal.h"

using namespace llmgw;

namespace {

/* A refused result; caught at the C boundary and copied into err. */
struct Refusal {
    std::string  message;
};

[[noreturn]] void
refuse(std::string message)
{
    throw Refusal { std::move(message) };
}


/* ---- the body tree ---- */

enum class Type { null, boolean, number, string, array, object };

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
    Type                                     type = Type::null;
    std::string                              text;  /* string value, or the
                                                       literal of a number
                                                       or boolean */
    std::vector<NodePtr>                     items; /* elements, or member
                                                       values */
    std::vector<std::string>                 keys;  /* member names */
    std::unordered_map<std::string, size_t>  index; /* name -> position */
};

/* What a value adds to the body: values counted and bytes encoded. */
struct Measure {
    size_t  nodes = 0;
    size_t  bytes = 0;
    size_t  height = 0;     /* levels below the value itself */
};

const char *
type_name(Type t)
{
    switch (t) {
    case Type::null:    return "null";
    case Type::boolean: return "a boolean";
    case Type::number:  return "a number";
    case Type::string:  return "a string";
    case Type::array:   return "an array";
    case Type::object:  return "an object";
    }
    return "a value";
}

/* Encoded size of a string, by the encoder the body is written with. */
size_t
string_bytes(std::string_view s)
{
    std::string encoded;
    append_json_string(encoded, s);
    return encoded.size();
}

/* Numbers keep the shortest text that reads back to the same double, as
   JSON.stringify writes them. */
std::string
number_text(const json_t *j)
{
    if (json_is_integer(j)) {
        return std::to_string(json_integer_value(j));
    }

    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof(buf), json_real_value(j));
    return std::string(buf, r.ptr);
}

NodePtr
from_json(const json_t *j)
{
    auto n = std::make_unique<Node>();

    switch (json_typeof(j)) {
    case JSON_TRUE:
    case JSON_FALSE:
        n->type = Type::boolean;
        n->text = json_is_true(j) ? "true" : "false";
        break;

    case JSON_INTEGER:
    case JSON_REAL:
        n->type = Type::number;
        n->text = number_text(j);
        break;

    case JSON_STRING:
        n->type = Type::string;
        n->text.assign(json_string_value(j), json_string_length(j));
        break;

    case JSON_ARRAY: {
        size_t i;
        json_t *item;

        n->type = Type::array;
        json_array_foreach(j, i, item) {
            n->items.push_back(from_json(item));
        }
        break;
    }

    case JSON_OBJECT: {
        const char *key;
        json_t *item;

        n->type = Type::object;
        json_object_foreach(const_cast<json_t *>(j), key, item) {
            n->index.emplace(key, n->keys.size());
            n->keys.emplace_back(key);
            n->items.push_back(from_json(item));
        }
        break;
    }

    case JSON_NULL:
        break;
    }

    return n;
}

Measure
measure(const Node &n)
{
    Measure m;

    m.nodes = 1;

    switch (n.type) {
    case Type::null:
        m.bytes = 4;
        return m;
    case Type::boolean:
    case Type::number:
        m.bytes = n.text.size();
        return m;
    case Type::string:
        m.bytes = string_bytes(n.text);
        return m;
    case Type::array:
    case Type::object:
        break;
    }

    /* brackets and the commas between items */
    m.bytes = 2 + (n.items.empty() ? 0 : n.items.size() - 1);

    for (size_t i = 0; i < n.items.size(); i++) {
        Measure c = measure(*n.items[i]);

        m.nodes += c.nodes;
        m.bytes += c.bytes;
        m.height = std::max(m.height, c.height + 1);

        if (n.type == Type::object) {
            m.bytes += string_bytes(n.keys[i]) + 1;
        }
    }

    return m;
}

void
write(std::string &out, const Node &n)
{
    switch (n.type) {
    case Type::null:
        out += "null";
        return;
    case Type::boolean:
    case Type::number:
        out += n.text;
        return;
    case Type::string:
        append_json_string(out, n.text);
        return;
    case Type::array:
    case Type::object:
        break;
    }

    bool object = n.type == Type::object;

    out.push_back(object ? '{' : '[');

    for (size_t i = 0; i < n.items.size(); i++) {
        if (i > 0) {
            out.push_back(',');
        }
        if (object) {
            append_json_string(out, n.keys[i]);
            out.push_back(':');
        }
        write(out, *n.items[i]);
    }

    out.push_back(object ? '}' : ']');
}

std::string
encode(const json_t *j)
{
    std::string out;
    write(out, *from_json(j));
    return out;
}


/* ---- result shapes ---- */

/* The object's members must be exactly these names. */
void
exact_members(const json_t *obj, std::initializer_list<const char *> names,
    const std::string &what)
{
    std::string list;

    for (const char *name : names) {
        list += list.empty() ? name : std::string(", ") + name;
    }

    if (!json_is_object(obj)) {
        refuse(what + " is not an object with " + list);
    }

    for (const char *name : names) {
        if (json_object_get(obj, name) == nullptr) {
            refuse(what + " has no \"" + name + "\" (it needs exactly "
                   + list + ")");
        }
    }

    if (json_object_size(obj) != names.size()) {
        const char *key;
        json_t *value;

        json_object_foreach(const_cast<json_t *>(obj), key, value) {
            if (std::find_if(names.begin(), names.end(),
                             [key](const char *n) {
                                 return std::strcmp(n, key) == 0;
                             }) == names.end())
            {
                refuse(what + " has an unknown member \"" + key
                       + "\" (it needs exactly " + list + ")");
            }
        }
    }
}

bool
read_done(const json_t *result, const std::string &what)
{
    const json_t *done = json_object_get(result, "done");

    if (!json_is_boolean(done)) {
        refuse(what + ": \"done\" is not a boolean");
    }

    return json_is_true(done);
}

Json
parse_result(const char *json, size_t len, const std::string &what)
{
    json_error_t err;
    /* any value: a string or a number is refused for what it is */
    Json root(json_loadb(json, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err));

    if (!root) {
        refuse(what + " is not valid JSON");
    }

    return root;
}


enum class Op { set, append, append_text };

struct Segment {
    bool         is_index;
    size_t       pos;
    std::string  key;

    std::string describe() const
    {
        if (is_index) {
            return std::to_string(pos);
        }

        std::string quoted_key;
        append_json_string(quoted_key, key);
        return quoted_key;
    }
};

struct Change {
    size_t                number;
    Op                    op;
    std::vector<Segment>  path;
    const json_t         *value;

    std::string where() const
    {
        return "submit event change " + std::to_string(number);
    }

    std::string segment(size_t i) const
    {
        return "path segment " + std::to_string(i) + " ("
               + path[i].describe() + ")";
    }

    /* Segment i names a member of an object or an index of an array. */
    void expect_container(size_t i, Type found) const
    {
        bool index = path[i].is_index;

        if (found != (index ? Type::array : Type::object)) {
            refuse(where() + ": " + segment(i) + " is "
                   + (index ? "an index" : "a member name")
                   + " but the value there is " + type_name(found));
        }
    }
};

Op
read_op(const json_t *op, const std::string &where)
{
    std::string_view name = json_is_string(op)
        ? std::string_view(json_string_value(op), json_string_length(op))
        : std::string_view();

    if (name == "set") {
        return Op::set;
    }
    if (name == "append") {
        return Op::append;
    }
    if (name == "appendText") {
        return Op::append_text;
    }

    refuse(where + ": op is not \"set\", \"append\" or \"appendText\"");
}

std::vector<Segment>
read_path(const json_t *path, const std::string &where)
{
    if (!json_is_array(path)) {
        refuse(where + ": path is not an array");
    }

    if (json_array_size(path) > LLMGW_SSE_MAX_PATH) {
        refuse(where + ": path has " + std::to_string(json_array_size(path))
               + " segments (at most " + std::to_string(LLMGW_SSE_MAX_PATH)
               + ")");
    }

    std::vector<Segment> segs;
    size_t i;
    json_t *s;

    json_array_foreach(path, i, s) {
        if (json_is_string(s)) {
            segs.push_back(Segment { false, 0,
                std::string(json_string_value(s), json_string_length(s)) });

        } else if (json_is_integer(s) && json_integer_value(s) >= 0) {
            segs.push_back(Segment { true,
                static_cast<size_t>(json_integer_value(s)), {} });

        } else {
            refuse(where + ": path segment " + std::to_string(i)
                   + " is neither a string nor a non-negative integer");
        }
    }

    return segs;
}

std::vector<Change>
read_changes(const json_t *changes)
{
    if (!json_is_array(changes)) {
        refuse("submit event result: \"changes\" is not an array");
    }

    size_t n = json_array_size(changes);

    if (n > LLMGW_SSE_MAX_CHANGES) {
        refuse("submit event result has " + std::to_string(n)
               + " changes (at most " + std::to_string(LLMGW_SSE_MAX_CHANGES)
               + " per event)");
    }

    std::vector<Change> out;
    size_t i;
    json_t *c;

    json_array_foreach(changes, i, c) {
        Change ch { i, Op::set, {}, nullptr };
        std::string where = ch.where();

        exact_members(c, { "op", "path", "value" }, where);
        ch.op = read_op(json_object_get(c, "op"), where);
        ch.path = read_path(json_object_get(c, "path"), where);
        ch.value = json_object_get(c, "value");

        if (ch.op == Op::append_text && !json_is_string(ch.value)) {
            refuse(where + ": appendText needs a string value");
        }

        out.push_back(std::move(ch));
    }

    return out;
}

std::string
checked_state(const json_t *result, size_t max, const char *what)
{
    std::string state = encode(json_object_get(result, "state"));

    if (state.size() > max) {
        refuse(std::string(what) + " is " + std::to_string(state.size())
               + " bytes encoded (at most " + std::to_string(max) + ")");
    }

    return state;
}

void
set_error(char *err, size_t errlen, const std::string &message)
{
    if (err != nullptr && errlen > 0) {
        std::snprintf(err, errlen, "%s", message.c_str());
    }
}

} /* namespace */


struct llmgw_sse_acc_s {
    NodePtr  root = std::make_unique<Node>();
    size_t   nodes = 1;         /* of the body: null */
    size_t   bytes = 4;

    void apply(const std::vector<Change> &changes);

private:
    /* How to take one change back. */
    struct Undo {
        enum class Kind { root, replace, add_member, push, text } kind;
        Node     *target;
        size_t    pos;          /* replaced index or former text length */
        NodePtr   old;
    };

    std::vector<Undo>  undo_;

    void apply_one(const Change &c);
    Node *walk(const Change &c, size_t count);
    void set(const Change &c, NodePtr value);
    void rollback();
};


void
llmgw_sse_acc_s::apply(const std::vector<Change> &changes)
{
    size_t saved_nodes = nodes, saved_bytes = bytes;

    /* room for every undo record up front: recording one cannot fail */
    undo_.clear();
    undo_.reserve(changes.size());

    try {
        for (const Change &c : changes) {
            apply_one(c);
        }

        if (nodes > LLMGW_SSE_MAX_NODES) {
            refuse("submit event: the body would have "
                   + std::to_string(nodes) + " values (at most "
                   + std::to_string(LLMGW_SSE_MAX_NODES) + ")");
        }

        if (bytes > LLMGW_SSE_MAX_BODY) {
            refuse("submit event: the body would be "
                   + std::to_string(bytes) + " bytes encoded (at most "
                   + std::to_string(LLMGW_SSE_MAX_BODY) + ")");
        }

    } catch (...) {
        rollback();
        nodes = saved_nodes;
        bytes = saved_bytes;
        throw;
    }

    /* frees what the changes replaced */
    undo_.clear();
}


/* The node at the first count segments of the path; each must exist. */
Node *
llmgw_sse_acc_s::walk(const Change &c, size_t count)
{
    Node *n = root.get();

    for (size_t i = 0; i < count; i++) {
        const Segment &s = c.path[i];

        c.expect_container(i, n->type);

        if (s.is_index) {
            if (s.pos >= n->items.size()) {
                refuse(c.where() + ": " + c.segment(i) + " does not exist");
            }
            n = n->items[s.pos].get();

        } else {
            auto it = n->index.find(s.key);
            if (it == n->index.end()) {
                refuse(c.where() + ": " + c.segment(i) + " does not exist");
            }
            n = n->items[it->second].get();
        }
    }

    return n;
}


void
llmgw_sse_acc_s::apply_one(const Change &c)
{
    NodePtr value = from_json(c.value);

    if (c.op == Op::set) {
        set(c, std::move(value));
        return;
    }

    Node *target = walk(c, c.path.size());

    if (c.op == Op::append_text) {
        if (target->type != Type::string) {
            refuse(c.where() + ": appendText needs a string at the path, "
                   "found " + type_name(target->type));
        }
        undo_.push_back(Undo { Undo::Kind::text, target, target->text.size(),
                               nullptr });
        /* concatenated UTF-8 encodes as the sum of its parts */
        bytes += string_bytes(value->text) - 2;
        target->text += value->text;
        return;
    }

    if (target->type != Type::array) {
        refuse(c.where() + ": append needs an array at the path, found "
               + type_name(target->type));
    }

    Measure m = measure(*value);

    if (c.path.size() + 1 + m.height > LLMGW_SSE_MAX_DEPTH) {
        refuse(c.where() + ": the value would reach "
               + std::to_string(c.path.size() + 1 + m.height)
               + " levels below the root (at most "
               + std::to_string(LLMGW_SSE_MAX_DEPTH) + ")");
    }

    nodes += m.nodes;
    bytes += m.bytes + (target->items.empty() ? 0 : 1);
    target->items.push_back(std::move(value));
    undo_.push_back(Undo { Undo::Kind::push, target, 0, nullptr });
}


void
llmgw_sse_acc_s::set(const Change &c, NodePtr value)
{
    Measure m = measure(*value);
    size_t level = c.path.size();

    if (level + m.height > LLMGW_SSE_MAX_DEPTH) {
        refuse(c.where() + ": the value would reach "
               + std::to_string(level + m.height)
               + " levels below the root (at most "
               + std::to_string(LLMGW_SSE_MAX_DEPTH) + ")");
    }

    nodes += m.nodes;
    bytes += m.bytes;

    if (c.path.empty()) {
        Measure old = measure(*root);

        nodes -= old.nodes;
        bytes -= old.bytes;
        std::swap(root, value);
        undo_.push_back(Undo { Undo::Kind::root, nullptr, 0,
                               std::move(value) });
        return;
    }

    Node *parent = walk(c, level - 1);
    const Segment &last = c.path.back();
    size_t pos = last.pos;

    c.expect_container(level - 1, parent->type);

    if (!last.is_index) {
        auto it = parent->index.find(last.key);

        if (it == parent->index.end()) {
            bytes += string_bytes(last.key) + 1
                     + (parent->items.empty() ? 0 : 1);
            parent->index.emplace(last.key, parent->keys.size());
            parent->keys.push_back(last.key);
            parent->items.push_back(std::move(value));
            undo_.push_back(Undo { Undo::Kind::add_member, parent, 0,
                                   nullptr });
            return;
        }

        pos = it->second;

    } else if (pos >= parent->items.size()) {
        refuse(c.where() + ": " + c.segment(level - 1)
               + " does not exist (set replaces existing elements only)");
    }

    Measure old = measure(*parent->items[pos]);

    nodes -= old.nodes;
    bytes -= old.bytes;
    std::swap(parent->items[pos], value);
    undo_.push_back(Undo { Undo::Kind::replace, parent, pos,
                           std::move(value) });
}


/* Takes the recorded changes back, newest first. */
void
llmgw_sse_acc_s::rollback()
{
    while (!undo_.empty()) {
        Undo &u = undo_.back();

        switch (u.kind) {
        case Undo::Kind::root:
            root = std::move(u.old);
            break;
        case Undo::Kind::replace:
            u.target->items[u.pos] = std::move(u.old);
            break;
        case Undo::Kind::add_member:
            u.target->index.erase(u.target->keys.back());
            u.target->keys.pop_back();
            u.target->items.pop_back();
            break;
        case Undo::Kind::push:
            u.target->items.pop_back();
            break;
        case Undo::Kind::text:
            u.target->text.resize(u.pos);
            break;
        }

        undo_.pop_back();
    }
}


extern "C" int
llmgw_sse_snapshot_result(const char *json, size_t len, int *done,
    llmgw_buf_t *state, char *err, size_t errlen)
{
    const std::string what = "submit event result";

    *state = llmgw_buf_t { nullptr, 0 };

    try {
        Json result = parse_result(json, len, what);

        exact_members(result.get(), { "state", "done" }, what);
        *done = read_done(result.get(), what);
        /* the final state is the body: capped like one */
        *state = make_buf(checked_state(result.get(), LLMGW_SSE_MAX_BODY,
                                        "submit event state"));
        if (state->data == nullptr) {
            refuse("out of memory");
        }
        return 0;

    } catch (const Refusal &r) {
        set_error(err, errlen, r.message);

    } catch (...) {
        set_error(err, errlen, "submit event result could not be read");
    }

    return -1;
}


extern "C" llmgw_sse_acc_t *
llmgw_sse_acc_new(void)
{
    try {
        return std::make_unique<llmgw_sse_acc_t>().release();

    } catch (...) {
        return nullptr;
    }
}


extern "C" void
llmgw_sse_acc_free(llmgw_sse_acc_t *a)
{
    std::unique_ptr<llmgw_sse_acc_t> owned(a);
}


extern "C" int
llmgw_sse_acc_apply(llmgw_sse_acc_t *a, const char *json, size_t len,
    int *done, llmgw_buf_t *state, char *err, size_t errlen)
{
    const std::string what = "submit event result";

    *state = llmgw_buf_t { nullptr, 0 };

    try {
        Json result = parse_result(json, len, what);

        exact_members(result.get(), { "changes", "state", "done" }, what);

        bool is_done = read_done(result.get(), what);
        std::vector<Change> changes =
            read_changes(json_object_get(result.get(), "changes"));
        std::string st = checked_state(result.get(), LLMGW_SSE_MAX_STATE,
                                       "submit event state");
        llmgw_buf_t out = make_buf(st);

        if (out.data == nullptr) {
            refuse("out of memory");
        }

        try {
            a->apply(changes);

        } catch (...) {
            llmgw_buf_free(&out);
            throw;
        }

        *done = is_done;
        *state = out;
        return 0;

    } catch (const Refusal &r) {
        set_error(err, errlen, r.message);

    } catch (...) {
        set_error(err, errlen, "submit event result could not be applied");
    }

    return -1;
}


extern "C" llmgw_buf_t
llmgw_sse_acc_body(const llmgw_sse_acc_t *a)
{
    try {
        std::string out;

        out.reserve(a->bytes);
        write(out, *a->root);
        return make_buf(out);

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" llmgw_buf_t
llmgw_sse_event_json(const llmgw_sse_event_t *ev)
{
    try {
        std::string out = "{\"event\":";

        append_json_string(out, sv(ev->event));
        out += ",\"id\":";
        append_json_string(out, sv(ev->id));
        out += ",\"data\":";
        append_json_string(out, sv(ev->data));
        out.push_back('}');
        return make_buf(out);

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}
