/*
 * Plugin sources shared by all workers: a MAP_SHARED region the supervisor
 * creates before forking.  A LOAD answered by one worker puts the source
 * here; a CALL that reaches another worker (nginx keeps several
 * connections, each served by whichever worker accepted it), a restarted
 * worker, or a worker whose isolate was replaced compiles it from here
 * instead of answering not_loaded.  not_loaded then means the helper
 * itself restarted or the source was evicted.
 *
 * A ring of source texts plus a small index, under a process-shared robust
 * mutex: a worker killed while holding it leaves the store consistent
 * (entries become valid only after their bytes are written, and every
 * text read back is checked against its sha).
 */

#ifndef V8HOST_SOURCE_STORE_H
#define V8HOST_SOURCE_STORE_H

#include <cstddef>
#include <string>
#include <string_view>

namespace v8host {

class SourceStore {
public:
    /* nullptr when mmap or the mutex set-up fails. */
    static SourceStore *create(size_t bytes);

    /* Keeps source under sha (64 lowercase hex); the oldest texts make
       room.  A text larger than the store is not kept. */
    void put(std::string_view sha, std::string_view source);

    /* false when absent (or damaged: the sha does not match). */
    bool get(std::string_view sha, std::string *source);

    size_t count();

private:
    SourceStore() = default;
    struct Header;
    Header *h_ = nullptr;
    char   *data_ = nullptr;
    size_t  cap_ = 0;

    bool lock();
    void unlock();
    int find(std::string_view sha) const;
};

}  // namespace v8host

#endif
