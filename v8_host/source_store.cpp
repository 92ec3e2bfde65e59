/*
 * The shared source store.
 */

#include <cerrno>
#include <cstring>
#include <new>

#include <pthread.h>
#include <sys/mman.h>

#include "crypto_util.h"
#include "log.h"
#include "source_store.h"

namespace v8host {

namespace {

constexpr int kEntries = 512;

struct Entry {
    char      sha[64];
    uint64_t  off;
    uint64_t  len;
    uint64_t  seq;          /* 0: free */
};

}  // namespace

struct SourceStore::Header {
    pthread_mutex_t  mu;
    uint64_t         seq;
    uint64_t         write_pos;
    Entry            entries[kEntries];
};

SourceStore *
SourceStore::create(size_t bytes)
{
    size_t total = sizeof(Header) + bytes;
    void *p = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED) {
        return nullptr;
    }

    auto *h = new (p) Header();
    pthread_mutexattr_t attr;

    if (pthread_mutexattr_init(&attr) != 0
        || pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) != 0
        || pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) != 0
        || pthread_mutex_init(&h->mu, &attr) != 0)
    {
        munmap(p, total);
        return nullptr;
    }
    pthread_mutexattr_destroy(&attr);

    /* Lives as long as the process and its forks; never freed. */
    auto *s = new SourceStore();
    s->h_ = h;
    s->data_ = static_cast<char *>(p) + sizeof(Header);
    s->cap_ = bytes;
    return s;
}

bool
SourceStore::lock()
{
    int rc = pthread_mutex_lock(&h_->mu);

    if (rc == EOWNERDEAD) {
        /* A worker died holding the lock: the index is still consistent
           (see the header), so mark the mutex usable again. */
        pthread_mutex_consistent(&h_->mu);
        return true;
    }

    return rc == 0;
}

void
SourceStore::unlock()
{
    pthread_mutex_unlock(&h_->mu);
}

int
SourceStore::find(std::string_view sha) const
{
    for (int i = 0; i < kEntries; i++) {
        const Entry &e = h_->entries[i];
        if (e.seq != 0 && std::memcmp(e.sha, sha.data(), 64) == 0) {
            return i;
        }
    }
    return -1;
}

void
SourceStore::put(std::string_view sha, std::string_view source)
{
    if (sha.size() != 64 || source.size() > cap_ || !lock()) {
        return;
    }

    int found = find(sha);
    if (found >= 0) {
        h_->entries[found].seq = ++h_->seq;     /* recently used */
        unlock();
        return;
    }

    uint64_t off = h_->write_pos;
    if (off + source.size() > cap_) {
        off = 0;
    }
    uint64_t end = off + source.size();

    /* Free every text the new bytes overwrite, before writing them. */
    int slot = -1;
    for (int i = 0; i < kEntries; i++) {
        Entry &e = h_->entries[i];
        if (e.seq != 0 && e.off < end && off < e.off + e.len) {
            e.seq = 0;
        }
    }
    for (int i = 0; i < kEntries; i++) {
        Entry &e = h_->entries[i];
        if (e.seq == 0) {
            slot = i;
            break;
        }
        if (slot < 0 || e.seq < h_->entries[slot].seq) {
            slot = i;
        }
    }

    Entry &e = h_->entries[slot];
    e.seq = 0;
    std::memcpy(data_ + off, source.data(), source.size());
    std::memcpy(e.sha, sha.data(), 64);
    e.off = off;
    e.len = source.size();
    __atomic_store_n(&e.seq, ++h_->seq, __ATOMIC_RELEASE);
    h_->write_pos = end;

    unlock();
}

bool
SourceStore::get(std::string_view sha, std::string *source)
{
    if (sha.size() != 64 || !lock()) {
        return false;
    }

    int i = find(sha);
    if (i >= 0) {
        const Entry &e = h_->entries[i];
        try {
            source->assign(data_ + e.off, e.len);
        } catch (...) {
            /* the lock is every process's: never left held */
            unlock();
            throw;
        }
    }

    unlock();

    return i >= 0 && hex(sha256(*source)) == sha;
}

/* Without the lock: the supervisor asks it for STATUS, and must never
   wait for a worker (a count read while a text is put may be off by one). */
size_t
SourceStore::count()
{
    size_t n = 0;

    for (int i = 0; i < kEntries; i++) {
        n += __atomic_load_n(&h_->entries[i].seq, __ATOMIC_ACQUIRE) != 0;
    }
    return n;
}

}  // namespace v8host
