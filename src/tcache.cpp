/*
 * A worker's key cache.  Bounded: when full, it is emptied and refilled on
 * demand (keys are one indexed lookup away), which keeps it simple and
 * never lets a flood of wrong keys grow memory.
 */

#include <array>
#include <cstring>
#include <unordered_map>

#include "internal.h"

namespace {

/* A key's digest in hex, held by value: a lookup allocates nothing. */
using Digest = std::array<char, 64>;

struct DigestHash {
    size_t operator()(const Digest &d) const
    {
        /* the digest is uniform already: its first bytes are a hash */
        size_t h;
        std::memcpy(&h, d.data(), sizeof(h));
        return h;
    }
};

Digest
digest(const char hash[65])
{
    Digest d;
    std::memcpy(d.data(), hash, d.size());
    return d;
}

} /* namespace */

struct llmgw_tcache_s {
    size_t                                              max;
    std::unordered_map<Digest, llmgw_token_t *, DigestHash> map;

    ~llmgw_tcache_s() { clear(); }

    void clear()
    {
        for (auto &kv : map) {
            llmgw_token_free(kv.second);
        }
        map.clear();
    }

    template <typename Pred>
    void drop_if(Pred pred)
    {
        for (auto it = map.begin(); it != map.end(); ) {
            /* misses are dropped too: the key may exist now */
            if (it->second == nullptr || pred(it->second)) {
                llmgw_token_free(it->second);
                it = map.erase(it);
            } else {
                ++it;
            }
        }
    }
};


extern "C" llmgw_tcache_t *
llmgw_tcache_new(size_t max_entries)
{
    try {
        auto c = std::make_unique<llmgw_tcache_s>();
        c->max = max_entries ? max_entries : 1;
        return c.release();
    } catch (...) {
        return nullptr;
    }
}


extern "C" void
llmgw_tcache_free(llmgw_tcache_t *c)
{
    delete c;
}


extern "C" int
llmgw_tcache_get(llmgw_tcache_t *c, const char hash[65], llmgw_token_t **t)
{
    auto it = c->map.find(digest(hash));

    if (it == c->map.end()) {
        return 0;
    }

    *t = llmgw_token_ref(it->second);
    return 1;
}


extern "C" void
llmgw_tcache_put(llmgw_tcache_t *c, const char hash[65], llmgw_token_t *t)
{
    try {
        if (c->map.size() >= c->max) {
            c->clear();
        }

        auto &slot = c->map[digest(hash)];
        llmgw_token_free(slot);
        slot = llmgw_token_ref(t);

    } catch (...) {
        /* not caching is always correct */
    }
}


extern "C" void
llmgw_tcache_drop_token(llmgw_tcache_t *c, int64_t token_id)
{
    c->drop_if([token_id](llmgw_token_t *t) {
        return llmgw_token_id(t) == token_id;
    });
}


extern "C" void
llmgw_tcache_drop_user(llmgw_tcache_t *c, int64_t user_id)
{
    c->drop_if([user_id](llmgw_token_t *t) {
        return llmgw_token_user_id(t) == user_id;
    });
}


extern "C" void
llmgw_tcache_clear(llmgw_tcache_t *c)
{
    c->clear();
}
