/*
 * Credential redaction by hand-written scanning (bounded input, no regex
 * engine): three passes over the message.
 *
 *   1. fields whose name says secret: `"api_key": "..."`, `token=...`,
 *      `Authorization: Bearer ...` -> the value goes;
 *   2. `Bearer <token>` anywhere;
 *   3. runs of key characters: `sk-...`, AWS access key ids (AKIA/ASIA +
 *      16), and any run of 24 or more that mixes letters and digits.
 */

#include <cctype>
#include <cstring>

#include "json_text.h"
#include "redact.h"

namespace v8host {

static const char kRedacted[] = "[redacted]";

/* Read at most this much of a raw message before redacting it. */
static const size_t kMaxRawMessage = 8192;

static bool
name_char(unsigned char c)
{
    return std::isalnum(c) || c == '_' || c == '-';
}

static bool
key_char(unsigned char c)
{
    return std::isalnum(c) || c == '_' || c == '-' || c == '+' || c == '/'
           || c == '=';
}

static bool
secret_name(std::string_view name)
{
    static const char *const parts[] = {
        "apikey", "api_key", "api-key", "accesskey", "access_key",
        "access-key", "secret", "token", "password", "passwd",
        "authorization", "credential", "signature", "private_key",
    };
    std::string lower(name);

    for (char &c : lower) {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }

    for (const char *p : parts) {
        if (lower.find(p) != std::string::npos) {
            return true;
        }
    }

    return false;
}

static bool
starts_with_ci(std::string_view s, size_t at, const char *word)
{
    size_t n = std::strlen(word);

    if (at + n > s.size()) {
        return false;
    }

    for (size_t i = 0; i < n; i++) {
        if (std::tolower(static_cast<unsigned char>(s[at + i])) != word[i]) {
            return false;
        }
    }

    return true;
}

/* Pass 1: name [quote] [ws] (:|=) [ws] value */
static std::string
redact_fields(std::string_view s)
{
    std::string out;
    size_t i = 0;

    while (i < s.size()) {
        if (!name_char(s[i]) || (i > 0 && name_char(s[i - 1]))) {
            out.push_back(s[i++]);
            continue;
        }

        size_t start = i;
        while (i < s.size() && name_char(s[i])) {
            i++;
        }
        out.append(s.substr(start, i - start));

        if (!secret_name(s.substr(start, i - start))) {
            continue;
        }

        size_t k = i;
        if (k < s.size() && (s[k] == '"' || s[k] == '\'')) {
            k++;
        }
        while (k < s.size() && s[k] == ' ') {
            k++;
        }
        if (k >= s.size() || (s[k] != ':' && s[k] != '=')) {
            continue;
        }
        k++;
        while (k < s.size() && s[k] == ' ') {
            k++;
        }

        out.append(s.substr(i, k - i));
        i = k;

        if (i < s.size() && (s[i] == '"' || s[i] == '\'')) {
            char q = s[i];
            size_t end = i + 1;
            while (end < s.size() && s[end] != q) {
                end += (s[end] == '\\') ? 2 : 1;
            }
            if (end > s.size()) {
                end = s.size();
            }
            out.push_back(q);
            out += kRedacted;
            i = end;        /* the closing quote is copied next */
            continue;
        }

        size_t end = i;
        /* "Authorization: Bearer xyz": the scheme and its token go. */
        if (starts_with_ci(s, end, "bearer ") || starts_with_ci(s, end, "basic ")) {
            end = s.find(' ', end) + 1;
            while (end < s.size() && s[end] == ' ') {
                end++;
            }
        }
        while (end < s.size() && !std::isspace(static_cast<unsigned char>(s[end]))
               && std::strchr(",;&}])\"'", s[end]) == nullptr)
        {
            end++;
        }
        if (end > i) {
            out += kRedacted;
            i = end;
        }
    }

    return out;
}

/* Pass 2: Bearer <token> */
static std::string
redact_bearer(std::string_view s)
{
    std::string out;
    size_t i = 0;

    while (i < s.size()) {
        if (starts_with_ci(s, i, "bearer")
            && (i == 0 || !name_char(s[i - 1])))
        {
            size_t k = i + 6;
            size_t sp = k;
            while (k < s.size() && (s[k] == ' ' || s[k] == '\t')) {
                k++;
            }
            size_t end = k;
            while (end < s.size() && (key_char(s[end]) || s[end] == '.'
                                      || s[end] == '~'))
            {
                end++;
            }
            if (k > sp && end > k && s.substr(k, end - k) != kRedacted) {
                out.append(s.substr(i, k - i));
                out += kRedacted;
                i = end;
                continue;
            }
        }
        out.push_back(s[i++]);
    }

    return out;
}

static bool
key_like(std::string_view run)
{
    if (run.size() >= 11 && run.substr(0, 3) == "sk-") {
        return true;
    }

    if (run.size() == 20 && (run.substr(0, 4) == "AKIA"
                             || run.substr(0, 4) == "ASIA"))
    {
        bool all = true;
        for (char c : run) {
            all = all && (std::isupper(static_cast<unsigned char>(c))
                          || std::isdigit(static_cast<unsigned char>(c)));
        }
        if (all) {
            return true;
        }
    }

    if (run.size() < 24) {
        return false;
    }

    bool digit = false, alpha = false;
    for (char c : run) {
        digit = digit || std::isdigit(static_cast<unsigned char>(c));
        alpha = alpha || std::isalpha(static_cast<unsigned char>(c));
    }

    return digit && alpha;
}

/* Pass 3: key-like runs */
static std::string
redact_runs(std::string_view s)
{
    std::string out;
    size_t i = 0;

    while (i < s.size()) {
        if (!key_char(s[i])) {
            out.push_back(s[i++]);
            continue;
        }

        size_t start = i;
        while (i < s.size() && key_char(s[i])) {
            i++;
        }

        std::string_view run = s.substr(start, i - start);
        out.append(key_like(run) ? std::string_view(kRedacted) : run);
    }

    return out;
}

std::string
redact_secrets(std::string_view s)
{
    return redact_runs(redact_bearer(redact_fields(s)));
}

std::string
clean_plugin_message(std::string_view raw)
{
    std::string_view head = utf8_prefix(raw, kMaxRawMessage);
    bool cut_key = false;

    /*
     * A run of key characters the limit cuts could be part of a key that
     * what is left no longer looks like (too short, or no digit yet): it
     * goes, and a long one is shown as redacted (unless it is one
     * character repeated, which is no key).
     */
    if (head.size() < raw.size()
        && key_char(static_cast<unsigned char>(raw[head.size()])))
    {
        size_t n = head.size();
        while (n > 0 && key_char(static_cast<unsigned char>(head[n - 1]))) {
            n--;
        }
        std::string_view run = head.substr(n);
        if (run.size() < 24
            || run.find_first_not_of(run[0]) != std::string_view::npos)
        {
            head = head.substr(0, n);
            cut_key = run.size() >= 24;
        }
    }

    std::string s = redact_secrets(head);

    if (cut_key) {
        s += kRedacted;
    }

    if (s.size() > kMaxPluginMessage) {
        std::string cut(utf8_prefix(s, kMaxPluginMessage - 3));
        return cut + "...";
    }

    return s;
}

}  // namespace v8host
