/*
 * Incremental text/event-stream framing after the WHATWG HTML "event stream
 * interpretation" rules.  Upstream bytes arrive in arbitrary pieces, so a
 * line (and a CR LF pair) may be split across feeds; only the unfinished
 * line is buffered, complete lines are read in place.
 *
 * One deliberate difference from WHATWG: an event that names itself
 * ("event: ping") is dispatched even without data lines, because some
 * vendors send exactly that and the observers want to see it.
 */

#include "llmgw.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace {

constexpr size_t kDefaultMaxEvent = 1024 * 1024;

/* Room for a field name around the largest allowed value on one line. */
constexpr size_t kLineOverhead = 64;

constexpr std::string_view kBom = "\xef\xbb\xbf";

bool
is_eol(char c)
{
    return c == '\r' || c == '\n';
}

} // namespace


struct llmgw_sse_s {
    size_t       max_event;
    size_t       max_line;
    std::string  line;          /* the unfinished line of the last feed */
    std::string  data;
    std::string  event;
    std::string  id;            /* the last event id, kept across events */
    bool         has_data = false;
    bool         after_cr = false;
    bool         first_line = true;
    bool         failed = false;
    /* of the last feed: where its last event ended (SIZE_MAX: none did),
       and the byte a CR before it made part of the last line end */
    size_t       boundary = SIZE_MAX;
    size_t       base = 0;

    explicit llmgw_sse_s(size_t max)
        : max_event(max ? max : kDefaultMaxEvent),
          max_line(max_event > SIZE_MAX - kLineOverhead
                   ? SIZE_MAX : max_event + kLineOverhead)
    {}

    bool feed(std::string_view in, llmgw_sse_cb cb, void *arg);

private:
    size_t take_lines(std::string_view in, llmgw_sse_cb cb, void *arg);
    bool line_done(std::string_view l, llmgw_sse_cb cb, void *arg);
    bool field(std::string_view name, std::string_view value);
    void dispatch(llmgw_sse_cb cb, void *arg);
};


bool
llmgw_sse_s::feed(std::string_view in, llmgw_sse_cb cb, void *arg)
{
    boundary = SIZE_MAX;
    base = 0;

    /* a CR ending the last feed and an LF starting this one: one line end */
    if (after_cr && !in.empty()) {
        after_cr = false;

        if (in[0] == '\n') {
            in.remove_prefix(1);
            base = 1;
        }
    }

    size_t used = take_lines(in, cb, arg);

    if (failed) {
        return false;
    }

    in.remove_prefix(used);

    if (line.size() + in.size() > max_line) {
        failed = true;
        return false;
    }

    line.append(in);
    return true;
}


/* Handles every complete line of in; returns the bytes consumed. */
size_t
llmgw_sse_s::take_lines(std::string_view in, llmgw_sse_cb cb, void *arg)
{
    size_t pos = 0;

    for ( ;; ) {
        auto it = std::find_if(in.begin() + pos, in.end(), is_eol);

        if (it == in.end()) {
            return pos;
        }

        auto eol = static_cast<size_t>(it - in.begin());
        std::string_view piece = in.substr(pos, eol - pos);
        bool blank = line.empty() && piece.empty();
        bool ok;

        if (line.empty()) {
            ok = line_done(piece, cb, arg);

        } else {
            line.append(piece);
            ok = line_done(line, cb, arg);
            line.clear();
        }

        if (!ok) {
            failed = true;
            return pos;
        }

        pos = eol + 1;

        if (in[eol] == '\r') {
            if (pos == in.size()) {
                after_cr = true;

            } else if (in[pos] == '\n') {
                pos++;
            }
        }

        if (blank) {
            boundary = base + pos;
        }
    }
}


bool
llmgw_sse_s::line_done(std::string_view l, llmgw_sse_cb cb, void *arg)
{
    if (l.size() > max_line) {
        return false;
    }

    if (first_line) {
        first_line = false;

        if (l.substr(0, kBom.size()) == kBom) {
            l.remove_prefix(kBom.size());
        }
    }

    if (l.empty()) {
        dispatch(cb, arg);
        return true;
    }

    if (l[0] == ':') {
        return true;
    }

    size_t colon = l.find(':');

    if (colon == std::string_view::npos) {
        return field(l, {});
    }

    std::string_view value = l.substr(colon + 1);

    if (!value.empty() && value[0] == ' ') {
        value.remove_prefix(1);
    }

    return field(l.substr(0, colon), value);
}


bool
llmgw_sse_s::field(std::string_view name, std::string_view value)
{
    if (name == "data") {
        size_t grown = data.size() + (has_data ? 1 : 0) + value.size();

        if (grown > max_event) {
            return false;
        }

        if (has_data) {
            data.push_back('\n');
        }

        data.append(value);
        has_data = true;

    } else if (name == "event") {
        event.assign(value);

    } else if (name == "id") {
        /* WHATWG: an id holding NUL is ignored, not truncated */
        if (value.find('\0') == std::string_view::npos) {
            id.assign(value);
        }
    }

    /* "retry" and unknown fields: nothing a proxy needs */
    return true;
}


void
llmgw_sse_s::dispatch(llmgw_sse_cb cb, void *arg)
{
    if (has_data || !event.empty()) {
        llmgw_sse_event_t ev;
        /* both arms views: a std::string arm would make a dead temporary */
        std::string_view name = event.empty() ? std::string_view("message")
                                              : std::string_view(event);

        ev.event = { name.data(), name.size() };
        ev.id = { id.data(), id.size() };
        ev.data = { data.data(), data.size() };

        if (cb != nullptr) {
            cb(arg, &ev);
        }
    }

    data.clear();
    event.clear();
    has_data = false;
}


extern "C" size_t
llmgw_sse_boundary(const llmgw_sse_t *p)
{
    return p->boundary;
}


extern "C" llmgw_sse_t *
llmgw_sse_new(size_t max_event)
{
    try {
        return std::make_unique<llmgw_sse_t>(max_event).release();

    } catch (...) {
        return nullptr;
    }
}


extern "C" void
llmgw_sse_free(llmgw_sse_t *p)
{
    std::unique_ptr<llmgw_sse_t> owned(p);
}


extern "C" int
llmgw_sse_feed(llmgw_sse_t *p, const char *data, size_t len,
    llmgw_sse_cb cb, void *arg)
{
    if (p->failed) {
        return -1;
    }

    try {
        if (!p->feed(std::string_view(data ? data : "", data ? len : 0),
                     cb, arg))
        {
            return -1;
        }

    } catch (...) {
        p->failed = true;
        return -1;
    }

    return 0;
}


extern "C" int
llmgw_is_event_stream(llmgw_str_t content_type)
{
    constexpr std::string_view want = "text/event-stream";
    std::string_view v(content_type.data ? content_type.data : "",
                       content_type.data ? content_type.len : 0);

    v = v.substr(0, v.find(';'));

    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) {
        v.remove_prefix(1);
    }
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) {
        v.remove_suffix(1);
    }

    return v.size() == want.size()
           && std::equal(v.begin(), v.end(), want.begin(),
                         [](char a, char b) {
                             return (a >= 'A' && a <= 'Z' ? a - 'A' + 'a' : a)
                                    == b;
                         });
}
