/*
 * Inbound request bodies of task routes (spec "Inbound request body"):
 * JSON, urlencoded forms and multipart/form-data (RFC 7578) turned into the
 * DecodedBody that hooks see.  File bytes are never copied: a file is a
 * view into the client body, which nginx keeps (or spools) for the request.
 */

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "inbound.h"
#include "jsonview.h"
#include "internal.h"

using namespace llmgw;

namespace {

constexpr std::string_view kRefPrefix = "request_file:";
constexpr std::string_view kDefaultFileType = "application/octet-stream";

/* RFC 2046: a boundary is 1 to 70 characters. */
constexpr size_t kBoundaryMax = 70;

enum class Kind { none, json, form, multipart };


/* A refusal of the body; caught at the C boundary and made a verdict. */
struct BadBody {
    int          status;
    const char  *code;
    std::string  message;
};

[[noreturn]] void
bad_request(std::string message)
{
    throw BadBody { 400, "invalid_request", std::move(message) };
}


/* ---- text helpers ---- */

char
lower(char c)
{
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

std::string
lowered(std::string_view s)
{
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(), lower);
    return out;
}

bool
iequals(std::string_view a, std::string_view b)
{
    return a.size() == b.size()
           && std::equal(a.begin(), a.end(), b.begin(),
                         [](char x, char y) { return lower(x) == lower(y); });
}

std::string_view
trim(std::string_view s)
{
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
        s.remove_prefix(1);
    }
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
        s.remove_suffix(1);
    }
    return s;
}

/* ISO-8859-1 bytes as UTF-8 (RFC 5987 allows that charset too). */
std::string
latin1_to_utf8(std::string_view s)
{
    std::string out;

    for (unsigned char c : s) {
        if (c < 0x80) {
            out.push_back(static_cast<char>(c));
        } else {
            out.push_back(static_cast<char>(0xc0 | (c >> 6)));
            out.push_back(static_cast<char>(0x80 | (c & 0x3f)));
        }
    }

    return out;
}


/* ---- header values with parameters (Content-Type, Content-Disposition) */

struct HeaderValue {
    std::string                                       value;  /* lowercased */
    std::vector<std::pair<std::string, std::string>>  params; /* names
                                                                 lowercased */

    const std::string *param(std::string_view name) const
    {
        for (const auto &p : params) {
            if (p.first == name) {
                return &p.second;
            }
        }
        return nullptr;
    }
};

/*
 * A quoted-string starting after the opening quote at s[i].  Only \" and
 * \\ are unescaped: browsers send a Windows path's backslashes bare.
 */
std::string
quoted(std::string_view s, size_t &i)
{
    std::string out;

    while (i < s.size() && s[i] != '"') {
        if (s[i] == '\\' && i + 1 < s.size()
            && (s[i + 1] == '"' || s[i + 1] == '\\'))
        {
            i++;
        }
        out.push_back(s[i++]);
    }

    if (i < s.size()) {
        i++;    /* the closing quote */
    }

    return out;
}

/* "type; a=b; c=\"d;e\"": the value and its parameters, leniently. */
HeaderValue
parse_header_value(std::string_view s)
{
    HeaderValue hv;
    size_t semi = s.find(';');

    hv.value = lowered(trim(s.substr(0, semi)));

    size_t i = semi == std::string_view::npos ? s.size() : semi + 1;

    while (i < s.size()) {
        size_t eq = s.find_first_of("=;", i);

        if (eq == std::string_view::npos || s[eq] == ';') {
            /* a parameter without a value: skip it */
            i = eq == std::string_view::npos ? s.size() : eq + 1;
            continue;
        }

        std::string name = lowered(trim(s.substr(i, eq - i)));
        std::string value;

        i = eq + 1;
        while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) {
            i++;
        }

        if (i < s.size() && s[i] == '"') {
            i++;
            value = quoted(s, i);
            i = std::min(s.find(';', i), s.size());

        } else {
            size_t end = std::min(s.find(';', i), s.size());
            value = std::string(trim(s.substr(i, end - i)));
            i = end;
        }

        if (i < s.size()) {
            i++;    /* the ';' */
        }

        hv.params.emplace_back(std::move(name), std::move(value));
    }

    return hv;
}

/* RFC 5987 ext-value "UTF-8''na%C3%AFve.txt"; false when malformed. */
bool
ext_value(std::string_view s, std::string &out)
{
    size_t q1 = s.find('\'');
    size_t q2 = q1 == std::string_view::npos ? q1 : s.find('\'', q1 + 1);

    if (q2 == std::string_view::npos
        || !percent_decode(s.substr(q2 + 1), false, true, out))
    {
        return false;
    }

    if (iequals(s.substr(0, q1), "iso-8859-1")) {
        out = latin1_to_utf8(out);
    }

    return true;
}


/* ---- the parsed body ---- */

/* Fields in first-seen order, each with its values in body order. */
class FieldMap {
public:
    void add(std::string name, std::string value)
    {
        auto [it, fresh] = index_.try_emplace(name, list_.size());

        if (fresh) {
            list_.emplace_back(std::move(name), std::vector<std::string>());
        }

        list_[it->second].second.push_back(std::move(value));
    }

    void write(std::string &out) const
    {
        out.push_back('{');

        for (size_t i = 0; i < list_.size(); i++) {
            if (i > 0) {
                out.push_back(',');
            }
            append_json_string(out, list_[i].first);
            out += ":[";
            for (size_t j = 0; j < list_[i].second.size(); j++) {
                if (j > 0) {
                    out.push_back(',');
                }
                append_json_string(out, list_[i].second[j]);
            }
            out.push_back(']');
        }

        out.push_back('}');
    }

private:
    std::vector<std::pair<std::string, std::vector<std::string>>>  list_;
    std::unordered_map<std::string, size_t>                        index_;
};


struct FilePart {
    std::string       ref;
    std::string       field;
    std::string       filename;
    std::string       mime;
    std::string_view  data;
};


/* One multipart part: its headers of interest and its content. */
struct Part {
    size_t            number;   /* 1-based, for messages */
    bool              has_disposition = false;
    HeaderValue       disposition;
    std::string       type;     /* Content-Type as sent, trimmed */
    std::string_view  content;
};


class MultipartReader {
public:
    MultipartReader(std::string_view body, std::string_view boundary,
        size_t max_file, size_t max_total)
        : body_(body), delim_("--" + std::string(boundary)),
          searcher_(delim_.begin(), delim_.end()),
          max_file_(max_file), max_total_(max_total)
    {}

    void read(FieldMap &fields, std::vector<FilePart> &files);

private:
    struct Delimiter {
        size_t  at;         /* where "--boundary" starts */
        size_t  next;       /* the first byte after its line */
        bool    close;      /* "--boundary--" */
    };

    bool find_delimiter(size_t from, Delimiter &d) const;
    bool delimiter_at(size_t at, Delimiter &d) const;
    size_t read_headers(size_t pos, Part &part) const;
    void take(const Part &part, FieldMap &fields,
        std::vector<FilePart> &files);
    void add_file(const Part &part, std::string field, std::string filename,
        std::vector<FilePart> &files);

    std::string_view  body_;
    std::string       delim_;
    std::boyer_moore_horspool_searcher<std::string::const_iterator>
                      searcher_;
    size_t            max_file_;
    size_t            max_total_;
    size_t            total_ = 0;
    std::unordered_map<std::string, size_t>  file_counts_;
};


void
MultipartReader::read(FieldMap &fields, std::vector<FilePart> &files)
{
    Delimiter d;

    /* anything before the first delimiter is a preamble (RFC 2046) */
    if (!find_delimiter(0, d)) {
        bad_request("multipart body has no boundary delimiter \"" + delim_
                    + "\"");
    }

    for (size_t number = 1; !d.close; number++) {
        Part part;
        part.number = number;

        size_t start = read_headers(d.next, part);

        if (!find_delimiter(start, d)) {
            bad_request("multipart body has no closing delimiter \""
                        + delim_ + "--\"");
        }

        /* the line end before a delimiter belongs to the delimiter */
        size_t end = std::max(start, d.at > 0 ? d.at - 1 : 0);
        if (end > start && body_[end - 1] == '\r') {
            end--;
        }
        part.content = body_.substr(start, end - start);

        take(part, fields, files);
    }
}


/*
 * The next delimiter line at or after from: "--boundary" at the start of a
 * line, then "--" (the close delimiter) or nothing, each followed only by
 * blanks up to the line end.  Other text after the boundary makes it
 * content (as Go's mime/multipart reads it), so file bytes that merely
 * resemble a delimiter survive.
 */
bool
MultipartReader::find_delimiter(size_t from, Delimiter &d) const
{
    const char *base = body_.data();
    const char *end = base + body_.size();

    while (from < body_.size()) {
        const char *hit = searcher_(base + from, end).first;

        if (hit == end) {
            return false;
        }

        size_t at = static_cast<size_t>(hit - base);

        if ((at == 0 || body_[at - 1] == '\n') && delimiter_at(at, d)) {
            return true;
        }

        from = at + 1;
    }

    return false;
}


bool
MultipartReader::delimiter_at(size_t at, Delimiter &d) const
{
    size_t p = at + delim_.size();
    bool close = body_.substr(p, 2) == "--";

    if (close) {
        p += 2;
    }

    while (p < body_.size() && (body_[p] == ' ' || body_[p] == '\t')) {
        p++;
    }

    if (p < body_.size() && body_[p] == '\n') {
        p++;

    } else if (body_.substr(p, 2) == "\r\n") {
        p += 2;

    } else if (!(close && p == body_.size())) {
        return false;
    }

    d = Delimiter { at, p, close };
    return true;
}


/* Reads the part's header lines; returns where its content starts. */
size_t
MultipartReader::read_headers(size_t pos, Part &part) const
{
    std::string where = "multipart part " + std::to_string(part.number);

    for ( ;; ) {
        size_t nl = body_.find('\n', pos);

        if (nl == std::string_view::npos) {
            bad_request(where + ": headers do not end with an empty line");
        }

        std::string_view line = body_.substr(pos, nl - pos);
        pos = nl + 1;

        if (!line.empty() && line.back() == '\r') {
            line.remove_suffix(1);
        }

        if (line.empty()) {
            return pos;
        }

        size_t colon = line.find(':');

        if (colon == std::string_view::npos) {
            bad_request(where + ": a header line has no colon");
        }

        std::string_view name = trim(line.substr(0, colon));
        std::string_view value = trim(line.substr(colon + 1));

        if (iequals(name, "content-disposition")) {
            part.has_disposition = true;
            part.disposition = parse_header_value(value);

        } else if (iequals(name, "content-type")) {
            part.type = std::string(value);
        }
    }
}


/* A part becomes a field, or a file when it names a filename (even ""). */
void
MultipartReader::take(const Part &part, FieldMap &fields,
    std::vector<FilePart> &files)
{
    std::string where = "multipart part " + std::to_string(part.number);

    if (!part.has_disposition) {
        bad_request(where + " has no Content-Disposition header");
    }

    if (part.disposition.value != "form-data") {
        bad_request(where + ": Content-Disposition is \""
                    + part.disposition.value + "\", not form-data");
    }

    const std::string *name = part.disposition.param("name");

    if (name == nullptr || name->empty()) {
        bad_request(where + ": Content-Disposition has no name");
    }

    const std::string *plain = part.disposition.param("filename");
    const std::string *ext = part.disposition.param("filename*");
    std::string filename;

    /* RFC 6266 4.3: filename* wins when it decodes */
    if (ext == nullptr || !ext_value(*ext, filename)) {
        filename = plain != nullptr ? *plain : ext != nullptr ? *ext : "";
    }

    /* names become C strings and file refs: no NUL inside */
    if (name->find('\0') != std::string::npos
        || filename.find('\0') != std::string::npos)
    {
        bad_request(where + ": a name or filename holds a NUL byte");
    }

    if (ext == nullptr && plain == nullptr) {
        fields.add(*name, std::string(part.content));
        return;
    }

    /* a file's field name is part of its reference, which the plugin sees
       as UTF-8 text and hands back as is; "#" is the reference's
       numbering ("a" twice would be "a" and "a#1", as is a field "a#1") */
    if (!utf8_valid(*name)) {
        bad_request(where + ": a file's field name is not valid UTF-8");
    }

    if (name->find('#') != std::string::npos) {
        bad_request(where + ": a file's field name may not hold \"#\" "
                    "(file references number a field's files with it)");
    }

    add_file(part, *name, std::move(filename), files);
}


void
MultipartReader::add_file(const Part &part, std::string field,
    std::string filename, std::vector<FilePart> &files)
{
    size_t len = part.content.size();

    if (max_file_ != 0 && len > max_file_) {
        throw BadBody { 413, "file_too_large",
                        "file in field \"" + field + "\" is "
                        + std::to_string(len) + " bytes, more than the "
                        "per-file limit of " + std::to_string(max_file_)
                        + " bytes" };
    }

    total_ += len;

    if (max_total_ != 0 && total_ > max_total_) {
        throw BadBody { 413, "file_too_large",
                        "the request's files are more than the total "
                        "limit of " + std::to_string(max_total_)
                        + " bytes (at field \"" + field + "\")" };
    }

    /* the first file of a field is <field>, the next ones <field>#1, ... */
    size_t &count = file_counts_[field];
    std::string ref = std::string(kRefPrefix) + field;

    if (count > 0) {
        ref += "#" + std::to_string(count);
    }
    count++;

    std::string mime = part.type.empty() ? std::string(kDefaultFileType)
                                         : part.type;

    files.push_back(FilePart { std::move(ref), std::move(field),
                               std::move(filename), std::move(mime),
                               part.content });
}


/* "a=1&b=x+y": pairs split on "&" and the first "=", empty pairs skipped. */
bool
read_pairs(std::string_view s, bool strict, FieldMap &fields)
{
    std::string name, value;

    while (!s.empty()) {
        size_t amp = s.find('&');
        std::string_view pair = s.substr(0, amp);

        s.remove_prefix(amp == std::string_view::npos ? s.size() : amp + 1);

        if (pair.empty()) {
            continue;
        }

        size_t eq = pair.find('=');
        std::string_view raw_value = eq == std::string_view::npos
                                     ? std::string_view()
                                     : pair.substr(eq + 1);

        if (!percent_decode(pair.substr(0, eq), true, strict, name)
            || !percent_decode(raw_value, true, strict, value))
        {
            return false;
        }

        fields.add(name, value);
    }

    return true;
}


bool
is_json_type(std::string_view type)
{
    constexpr std::string_view app = "application/";
    constexpr std::string_view suffix = "+json";

    return type == "application/json"
           || (type.size() > app.size() + suffix.size()
               && type.substr(0, app.size()) == app
               && type.substr(type.size() - suffix.size()) == suffix);
}

/* What a body of this media type (lowercased) is read as; none: refused. */
Kind
kind_of(std::string_view type)
{
    return is_json_type(type) ? Kind::json
           : type == "application/x-www-form-urlencoded" ? Kind::form
           : type == "multipart/form-data" ? Kind::multipart
           : Kind::none;
}

const char *
kind_name(Kind k)
{
    switch (k) {
    case Kind::json:
        return "json";
    case Kind::form:
        return "form";
    case Kind::multipart:
        return "multipart";
    case Kind::none:
        break;
    }

    return "none";
}

} /* namespace */


struct llmgw_inbound_s {
    Kind                       kind = Kind::none;
    std::string_view           json;    /* the validated body text */
    FieldMap                   fields;
    std::vector<FilePart>      parts;
    std::vector<llmgw_file_t>  files;   /* views of parts */

    void parse(std::string_view type_header, std::string_view body,
        size_t max_file, size_t max_total);
    std::string decoded() const;

private:
    void parse_json(std::string_view body);
    void parse_multipart(const HeaderValue &ct, std::string_view body,
        size_t max_file, size_t max_total);
};


void
llmgw_inbound_s::parse(std::string_view type_header, std::string_view body,
    size_t max_file, size_t max_total)
{
    if (body.empty()) {
        kind = Kind::none;
        return;
    }

    HeaderValue ct = parse_header_value(type_header);

    switch (kind_of(ct.value)) {
    case Kind::json:
        parse_json(body);
        return;

    case Kind::form:
        kind = Kind::form;
        if (!read_pairs(body, true, fields)) {
            bad_request("invalid percent escape in the form body");
        }
        return;

    case Kind::multipart:
        parse_multipart(ct, body, max_file, max_total);
        return;

    case Kind::none:
        break;
    }

    if (ct.value.empty()) {
        bad_request("a request body needs a Content-Type: application/json, "
                    "application/x-www-form-urlencoded or "
                    "multipart/form-data");

    } else {
        bad_request("unsupported Content-Type \"" + ct.value + "\": send "
                    "application/json, application/x-www-form-urlencoded "
                    "or multipart/form-data");
    }
}


void
llmgw_inbound_s::parse_json(std::string_view body)
{
    json_error_t err;
    /* any JSON value is a valid body; the text itself is what hooks get */
    Json value(json_loadb(body.data(), body.size(),
                          JSON_DECODE_ANY | JSON_ALLOW_NUL, &err));

    if (!value) {
        throw BadBody { 400, "invalid_json", "invalid JSON request body" };
    }

    /* hooks get the body inside their context, and the runtime hands back
       nothing nested deeper than this: a deeper body is refused here */
    constexpr int64_t max_depth = 512;
    JsonBytes bytes;

    for (char c : body) {
        if (bytes.step(c) == JsonBytes::Kind::open
            && bytes.depth() > max_depth)
        {
            throw BadBody { 400, "invalid_json",
                            "invalid JSON request body: nested more than "
                            + std::to_string(max_depth) + " levels deep" };
        }
    }

    kind = Kind::json;
    json = body;
}


void
llmgw_inbound_s::parse_multipart(const HeaderValue &ct, std::string_view body,
    size_t max_file, size_t max_total)
{
    const std::string *boundary = ct.param("boundary");

    if (boundary == nullptr || boundary->empty()) {
        bad_request("multipart/form-data Content-Type has no boundary");
    }

    if (boundary->size() > kBoundaryMax) {
        bad_request("multipart boundary is longer than "
                    + std::to_string(kBoundaryMax) + " characters");
    }

    kind = Kind::multipart;
    MultipartReader(body, *boundary, max_file, max_total).read(fields, parts);

    /* parts no longer change: their strings can be lent out */
    files.reserve(parts.size());
    for (const FilePart &p : parts) {
        files.push_back(llmgw_file_t {
            p.ref.c_str(), p.field.c_str(), p.filename.c_str(),
            p.mime.c_str(),
            reinterpret_cast<const unsigned char *>(p.data.data()),
            p.data.size() });
    }
}


std::string
llmgw_inbound_s::decoded() const
{
    std::string out;

    switch (kind) {
    case Kind::none:
        return "{\"kind\":\"none\"}";

    case Kind::json:
        out = "{\"kind\":\"json\",\"value\":";
        out.append(json);
        out.push_back('}');
        return out;

    case Kind::form:
        out = "{\"kind\":\"form\",\"fields\":";
        fields.write(out);
        out.push_back('}');
        return out;

    case Kind::multipart:
        break;
    }

    out = "{\"kind\":\"multipart\",\"fields\":";
    fields.write(out);
    out += ",\"files\":[";

    for (size_t i = 0; i < parts.size(); i++) {
        const FilePart &p = parts[i];

        out += i > 0 ? ",{\"ref\":" : "{\"ref\":";
        append_json_string(out, p.ref);
        out += ",\"field\":";
        append_json_string(out, p.field);
        out += ",\"filename\":";
        append_json_string(out, p.filename);
        out += ",\"mimeType\":";
        append_json_string(out, p.mime);
        out += ",\"size\":" + std::to_string(p.data.size()) + "}";
    }

    out += "]}";
    return out;
}


extern "C" llmgw_inbound_t *
llmgw_inbound_parse(llmgw_str_t content_type, const char *body, size_t len,
    size_t max_file, size_t max_total, llmgw_verdict_t *v)
{
    try {
        auto in = std::make_unique<llmgw_inbound_t>();

        in->parse(sv(content_type),
                  std::string_view(body ? body : "", body ? len : 0),
                  max_file, max_total);
        return in.release();

    } catch (const BadBody &e) {
        llmgw_verdict_set(v, e.status, "gateway_error", e.code, "%s",
                          e.message.c_str());

    } catch (...) {
        llmgw_verdict_set(v, 500, "gateway_error", "internal_error",
                          "could not read the request body");
    }

    return nullptr;
}


extern "C" void
llmgw_inbound_free(llmgw_inbound_t *in)
{
    std::unique_ptr<llmgw_inbound_t> owned(in);
}


extern "C" llmgw_buf_t
llmgw_inbound_json(const llmgw_inbound_t *in)
{
    try {
        return make_buf(in->decoded());

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}


extern "C" const char *
llmgw_inbound_kind(const llmgw_inbound_t *in)
{
    return kind_name(in->kind);
}


extern "C" const char *
llmgw_inbound_type_kind(llmgw_str_t content_type)
{
    try {
        Kind k = kind_of(parse_header_value(sv(content_type)).value);
        return k == Kind::none ? nullptr : kind_name(k);

    } catch (...) {
        return nullptr;
    }
}


extern "C" llmgw_buf_t
llmgw_inbound_value(const llmgw_inbound_t *in)
{
    if (in->kind != Kind::json) {
        return llmgw_buf_t { nullptr, 0 };
    }

    return make_buf(in->json);
}


extern "C" size_t
llmgw_inbound_files(const llmgw_inbound_t *in, const llmgw_file_t **files)
{
    *files = in->files.empty() ? nullptr : in->files.data();
    return in->files.size();
}


extern "C" llmgw_buf_t
llmgw_query_json(llmgw_str_t args)
{
    try {
        FieldMap fields;
        std::string out;

        read_pairs(sv(args), false, fields);
        fields.write(out);
        return make_buf(out);

    } catch (...) {
        return llmgw_buf_t { nullptr, 0 };
    }
}
