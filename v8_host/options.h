/*
 * Command line of llmgw-v8host.
 */

#ifndef V8HOST_OPTIONS_H
#define V8HOST_OPTIONS_H

#include <cstddef>
#include <string>

namespace v8host {

struct Options {
    std::string  socket_path;
    std::string  pidfile;
    int          workers = 4;
    int          plugin_workers = 0;     /* workers one plugin may occupy;
                                            0: workers - 1, at least 1 */
    int          deadline_ms = 5000;     /* per call; CALL may only lower it */
    int          heap_mb = 64;           /* V8 heap cap per isolate */
    size_t       max_frame = 16777216;   /* largest frame body, both ways */
    int          source_cache_mb = 64;   /* sources shared by the workers */
    long         max_memory_mb = 0;      /* a worker's data; 0: 8 x heap
                                            + 1024 */
};

/* Workers one plugin may occupy at once. */
int plugin_cap(const Options &o);

/* 0, or -1 with a message in err (the caller prints usage). */
int parse_options(int argc, char **argv, Options *o, std::string *err);

extern const char *const usage_text;

}  // namespace v8host

#endif
