/*
 * Command line parsing: every value is range-checked so a typo fails at
 * start-up instead of producing a helper with absurd limits.
 */

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "options.h"

namespace v8host {

const char *const usage_text =
    "usage: llmgw-v8host --socket <path> [--workers N (4)]\n"
    "                    [--plugin-workers N (workers - 1)] "
    "[--deadline-ms MS (5000)]\n"
    "                    [--heap-mb MB (64)] [--max-frame BYTES (16777216)]\n"
    "                    [--pidfile path] [--source-cache-mb MB (64; 0: off)]\n"
    "                    [--max-memory-mb MB (8 x heap + 1024)]\n";

static bool
parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;

    errno = 0;
    long v = std::strtol(s, &end, 10);

    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        return false;
    }

    *out = v;
    return true;
}

struct IntOption {
    const char  *name;
    long         lo;
    long         hi;
};

static const IntOption int_options[] = {
    { "--workers", 1, 64 },
    { "--deadline-ms", 1, 600000 },
    { "--heap-mb", 16, 4096 },
    { "--max-frame", 4096, 1L << 30 },
    { "--source-cache-mb", 0, 4096 },
    { "--max-memory-mb", 128, 1L << 20 },
    { "--plugin-workers", 1, 64 },
};

int
plugin_cap(const Options &o)
{
    /* One worker stays free for the other plugins whenever there are two:
       a plugin whose hooks all run into the deadline slows only itself. */
    int cap = o.plugin_workers > 0 ? o.plugin_workers : o.workers - 1;

    return cap < 1 ? 1 : cap > o.workers ? o.workers : cap;
}

int
parse_options(int argc, char **argv, Options *o, std::string *err)
{
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];

        if (std::strcmp(name, "-h") == 0 || std::strcmp(name, "--help") == 0) {
            *err = "";
            return -1;
        }

        if (i + 1 >= argc) {
            *err = std::string("option ") + name + " needs a value";
            return -1;
        }

        const char *value = argv[++i];

        if (std::strcmp(name, "--socket") == 0) {
            o->socket_path = value;
            continue;
        }

        if (std::strcmp(name, "--pidfile") == 0) {
            o->pidfile = value;
            continue;
        }

        const IntOption *io = nullptr;
        for (const IntOption &c : int_options) {
            if (std::strcmp(name, c.name) == 0) {
                io = &c;
            }
        }

        if (io == nullptr) {
            *err = std::string("unknown option ") + name;
            return -1;
        }

        long v;
        if (!parse_long(value, io->lo, io->hi, &v)) {
            *err = std::string("invalid ") + name + " \"" + value
                   + "\" (expected " + std::to_string(io->lo) + ".."
                   + std::to_string(io->hi) + ")";
            return -1;
        }

        if (io == &int_options[0]) {
            o->workers = static_cast<int>(v);
        } else if (io == &int_options[1]) {
            o->deadline_ms = static_cast<int>(v);
        } else if (io == &int_options[2]) {
            o->heap_mb = static_cast<int>(v);
        } else if (io == &int_options[3]) {
            o->max_frame = static_cast<size_t>(v);
        } else if (io == &int_options[4]) {
            o->source_cache_mb = static_cast<int>(v);
        } else if (io == &int_options[5]) {
            o->max_memory_mb = v;
        } else {
            o->plugin_workers = static_cast<int>(v);
        }
    }

    if (o->socket_path.empty()) {
        *err = "--socket is required";
        return -1;
    }

    return 0;
}

}  // namespace v8host
