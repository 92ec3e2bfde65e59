/*
 * "At most M requests (and at most S successful ones) in any N ms", kept
 * exact with a log of timestamps rather than approximated with buckets:
 * users read the limit as a promise and compare it with their own counts.
 *
 * The state lives in nginx shared memory, used by every worker under the
 * zone mutex and moved or reused across reloads, so it is plain data with
 * no pointers: a header followed by two rings of int64 timestamps.  Each
 * ring is kept in time order, oldest at head, so expiry pops from the head
 * and the oldest entry gives the wait until a slot frees.
 */

#include "llmgw.h"

#include <cstddef>
#include <type_traits>

namespace {

struct Header {
    uint32_t  total;        /* capacity of the total ring, 0: unlimited */
    uint32_t  success;      /* capacity of the success ring, 0: unlimited */
    uint32_t  t_head;
    uint32_t  t_count;
    uint32_t  s_head;
    uint32_t  s_count;
};

static_assert(std::is_trivially_copyable_v<Header>
              && std::is_standard_layout_v<Header>,
              "the limiter state must be relocatable plain data");
static_assert(sizeof(Header) % alignof(int64_t) == 0,
              "the rings after the header must be aligned");

/* A view of one ring; built on each call, never stored. */
struct Ring {
    int64_t   *slots;
    uint32_t   cap;
    uint32_t  *head;
    uint32_t  *count;

    int64_t oldest() const { return slots[*head]; }

    int64_t newest() const { return slots[(*head + *count - 1) % cap]; }

    bool full() const { return *count >= cap; }

    void drop_before(int64_t edge)
    {
        while (*count > 0 && oldest() <= edge) {
            *head = (*head + 1) % cap;
            (*count)--;
        }
    }

    /* When full the oldest goes: only the newest cap entries decide. */
    void push(int64_t now)
    {
        /* a clock step back must not break the time order */
        if (*count > 0 && now < newest()) {
            now = newest();
        }

        if (full()) {
            slots[*head] = now;
            *head = (*head + 1) % cap;
            return;
        }

        slots[(*head + *count) % cap] = now;
        (*count)++;
    }
};


Header *
header(void *mem)
{
    return static_cast<Header *>(mem);
}


int64_t *
slots(void *mem)
{
    return reinterpret_cast<int64_t *>(static_cast<char *>(mem)
                                       + sizeof(Header));
}


Ring
total_ring(void *mem)
{
    Header *h = header(mem);
    return { slots(mem), h->total, &h->t_head, &h->t_count };
}


Ring
success_ring(void *mem)
{
    Header *h = header(mem);
    return { slots(mem) + h->total, h->success, &h->s_head, &h->s_count };
}


/* Milliseconds until the oldest entry leaves the window. */
int64_t
wait_for(const Ring &r, int64_t now, int64_t window)
{
    int64_t wait = r.oldest() + window - now;

    if (wait < 1) {
        return 1;
    }

    /* after a clock step back the log may lie in the future */
    return wait > window ? window : wait;
}

} // namespace


extern "C" size_t
llmgw_rl_size(uint32_t total, uint32_t success)
{
    return sizeof(Header)
           + (static_cast<size_t>(total) + success) * sizeof(int64_t);
}


extern "C" void
llmgw_rl_init(void *mem, uint32_t total, uint32_t success)
{
    *header(mem) = Header{ total, success, 0, 0, 0, 0 };
}


/* A refused request is not recorded: only admitted ones count. */
extern "C" int
llmgw_rl_acquire(void *mem, int64_t now_ms, int64_t window_ms,
    int64_t *retry_after_ms)
{
    Ring t = total_ring(mem);
    Ring s = success_ring(mem);
    int64_t unused;

    if (retry_after_ms == nullptr) {
        retry_after_ms = &unused;
    }

    *retry_after_ms = 0;

    if (window_ms <= 0) {
        return LLMGW_RL_OK;
    }

    if (t.cap > 0) {
        t.drop_before(now_ms - window_ms);
    }

    if (s.cap > 0) {
        s.drop_before(now_ms - window_ms);
    }

    if (t.cap > 0 && t.full()) {
        *retry_after_ms = wait_for(t, now_ms, window_ms);
        return LLMGW_RL_TOTAL;
    }

    if (s.cap > 0 && s.full()) {
        *retry_after_ms = wait_for(s, now_ms, window_ms);
        return LLMGW_RL_SUCCESS;
    }

    if (t.cap > 0) {
        t.push(now_ms);
    }

    return LLMGW_RL_OK;
}


/*
 * Without the window here expired entries cannot be told apart, and need
 * not be: acquire() drops them first, and when the ring is full the entry
 * overwritten is the oldest, which is exactly the one that no longer
 * decides when the next slot frees.
 */
extern "C" void
llmgw_rl_success(void *mem, int64_t now_ms)
{
    Ring s = success_ring(mem);

    if (s.cap > 0) {
        s.push(now_ms);
    }
}
