/*
 * Which API a request path names.  Paths are matched exactly (no trailing
 * slash, no case folding) because the upstream protocols are exact too; a
 * miss is a 404 "Invalid URL" whose message names the usual base-URL
 * mistake, so a user can fix the client setting without asking.
 */

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "internal.h"

namespace {

struct Match {
    llmgw_endpoint_e  ep = LLMGW_EP_NONE;
    std::string_view  model;
    int               stream = 0;
};

/* Keeps the message inside llmgw_endpoint_t.message (256 bytes). */
constexpr size_t kPathShown = 128;
constexpr size_t kMethodShown = 16;

/* the official @google/genai client speaks v1 by default, v1beta too */
constexpr std::string_view kGeminiPrefixes[] = { "/v1beta/models/",
                                                 "/v1/models/" };
constexpr std::string_view kGenerate = ":generateContent";
constexpr std::string_view kStreamGenerate = ":streamGenerateContent";


bool
ends_with(std::string_view s, std::string_view suffix)
{
    return s.size() >= suffix.size()
           && s.substr(s.size() - suffix.size()) == suffix;
}


bool
starts_with(std::string_view s, std::string_view prefix)
{
    return s.substr(0, prefix.size()) == prefix;
}


/* "<model>:generateContent"; the model is one path segment, never empty. */
bool
match_gemini(std::string_view path, Match *m)
{
    std::string_view rest;
    bool found = false;

    for (std::string_view prefix : kGeminiPrefixes) {
        if (starts_with(path, prefix)) {
            rest = path.substr(prefix.size());
            found = true;
        }
    }

    if (!found) {
        return false;
    }

    std::string_view model;
    int stream;

    if (ends_with(rest, kStreamGenerate)) {
        model = rest.substr(0, rest.size() - kStreamGenerate.size());
        stream = 1;

    } else if (ends_with(rest, kGenerate)) {
        model = rest.substr(0, rest.size() - kGenerate.size());
        stream = 0;

    } else {
        return false;
    }

    if (model.empty() || model.find('/') != std::string_view::npos) {
        return false;
    }

    m->ep = LLMGW_EP_GEMINI;
    m->model = model;
    m->stream = stream;

    return true;
}


Match
match_path(std::string_view path)
{
    Match m;

    if (path == "/v1/chat/completions") {
        m.ep = LLMGW_EP_CHAT;

    } else if (path == "/v1/messages") {
        m.ep = LLMGW_EP_MESSAGES;

    } else if (path == "/v1/rerank" || path == "/v2/rerank") {
        m.ep = LLMGW_EP_RERANK;

    } else if (path == "/v1/models") {
        m.ep = LLMGW_EP_MODELS;

    } else {
        match_gemini(path, &m);
    }

    return m;
}


/* The hint for the base-URL mistake the path shows, or "" when none. */
std::string
invalid_url_hint(std::string_view path)
{
    std::string hint;

    if (path == "/v1/v1" || starts_with(path, "/v1/v1/")) {
        return ": the path has /v1 twice; set the base URL to the host plus "
               "one /v1";
    }

    if (path == "/v1" || path == "/v1/") {
        return ": the path is only /v1; give the full endpoint address such "
               "as /v1/chat/completions";
    }

    /* the Gemini and Cohere v2 clients add their own version to a base
       URL that should be the host alone */
    static const struct {
        std::string_view version, example;
    } others[] = {
        { "/v1beta", "/v1beta/models/{model}:generateContent" },
        { "/v2", "/v2/rerank" },
    };

    for (const auto &o : others) {
        if (path == o.version
            || (path.size() == o.version.size() + 1
                && starts_with(path, o.version) && path.back() == '/'))
        {
            hint = ": the path is only " + std::string(o.version)
                   + "; give the full endpoint address such as "
                   + std::string(o.example);
            return hint;
        }
    }

    for (std::string_view first : { "/v1", "/v1beta", "/v2" }) {
        if (!starts_with(path, first)
            || !starts_with(path.substr(first.size()), "/v"))
        {
            continue;
        }
        std::string_view rest = path.substr(first.size());
        for (const auto &o : others) {
            if (match_path(rest).ep != LLMGW_EP_NONE
                && starts_with(rest, o.version))
            {
                hint = ": the path has "
                       + (first == o.version
                          ? std::string(first) + " twice"
                          : std::string(first) + " before "
                            + std::string(o.version))
                       + "; set the base URL to the host only (the client "
                         "adds " + std::string(o.version) + ")";
                return hint;
            }
        }
    }

    if (starts_with(path, "/")
        && (match_path("/v1" + std::string(path)).ep != LLMGW_EP_NONE
            || llmgw::host_task_path("/v1" + std::string(path))))
    {
        return ": the path is missing /v1; add /v1 to the base URL";
    }

    if (path.size() > 1 && path.back() == '/'
        && match_path(path.substr(0, path.size() - 1)).ep != LLMGW_EP_NONE)
    {
        return ": the path ends with a slash; leave it out";
    }

    return "";
}


void
set_invalid_url(std::string_view method, std::string_view path,
    llmgw_endpoint_t *out)
{
    std::string_view shown = path.substr(0, kPathShown);
    const char *cut = path.size() > kPathShown ? "..." : "";

    method = method.substr(0, kMethodShown);
    std::string hint = invalid_url_hint(path);

    out->ep = LLMGW_EP_INVALID_URL;
    std::snprintf(out->message, sizeof(out->message),
                  "Invalid URL (%.*s %.*s%s)%s",
                  static_cast<int>(method.size()), method.data(),
                  static_cast<int>(shown.size()), shown.data(), cut,
                  hint.c_str());
}

} // namespace


/*
 * Reserved as whole leading segments: nginx's /api/ and /metrics locations
 * (the configuration the README gives), the endpoints above with what may
 * grow under them, and the task API with the paths the spec keeps under it
 * (artifacts).  Elsewhere only a path the classifier takes (a Gemini
 * generateContent) is the gateway's: "/v1beta/operations/:id" is a
 * plugin's to have.  A parameter segment never equals a reserved one, so
 * "/:ver/chat/completions" stays too: it is reachable on other paths.
 */
std::string_view
llmgw::gateway_path_prefix(std::string_view route_path)
{
    static constexpr std::string_view prefixes[] = {
        "/api", "/metrics", "/v1/chat/completions", "/v1/messages",
        "/v1/rerank", "/v2/rerank", "/v1/models", "/v1/tasks",
    };

    for (std::string_view prefix : prefixes) {
        if (starts_with(route_path, prefix)
            && (route_path.size() == prefix.size()
                || route_path[prefix.size()] == '/'))
        {
            return prefix;
        }
    }

    /* a route matches its path with a trailing slash or without */
    std::string_view p = route_path;

    while (p.size() > 1 && p.back() == '/') {
        p.remove_suffix(1);
    }

    return match_path(p).ep != LLMGW_EP_NONE ? p : std::string_view();
}


extern "C" void
llmgw_endpoint_classify(llmgw_str_t method, llmgw_str_t path,
    llmgw_endpoint_t *out)
{
    std::memset(out, 0, sizeof(*out));
    out->model.data = "";

    try {
        std::string_view m = llmgw::sv(method);
        std::string_view p = llmgw::sv(path);
        Match match = match_path(p);

        if (match.ep == LLMGW_EP_NONE) {
            set_invalid_url(m, p, out);
            return;
        }

        out->ep = match.ep;
        out->stream = match.stream;

        if (!match.model.empty()) {
            out->model.data = match.model.data();
            out->model.len = match.model.size();
        }

        /* the list is read with GET, or HEAD for its head alone */
        out->method_ok = match.ep == LLMGW_EP_MODELS
                         ? (m == "GET" || m == "HEAD") : m == "POST";

    } catch (...) {
        /* only the hint's string can throw (allocation): fail closed */
        out->ep = LLMGW_EP_INVALID_URL;
        std::snprintf(out->message, sizeof(out->message), "Invalid URL");
    }
}
