/*
 * llmgw-v8host: the out-of-process plugin runtime of llmgw.
 *
 *   llmgw-v8host --socket <path> [--workers N] [--plugin-workers N]
 *                [--deadline-ms MS] [--heap-mb MB] [--max-frame BYTES]
 *                [--pidfile path] [--source-cache-mb MB] [--max-memory-mb MB]
 *
 * Protocol and behaviour: v8_host/README.md.
 */

#include <cstdio>
#include <string>

#include "log.h"
#include "options.h"
#include "supervisor.h"

int
main(int argc, char **argv)
{
    v8host::Options o;
    std::string err;

    if (v8host::parse_options(argc, argv, &o, &err) != 0) {
        if (!err.empty()) {
            std::fprintf(stderr, "llmgw-v8host: %s\n", err.c_str());
        }
        std::fputs(v8host::usage_text, stderr);
        return err.empty() ? 0 : 2;
    }

    return v8host::run_supervisor(o);
}
