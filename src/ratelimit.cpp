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
 *
 * A ring's capacity may exceed its limit: a limit lowered keeps the ring
 * and all it holds, so that one raised again within the window still
 * counts the requests made before.
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
    uint32_t  t_limit;      /* at most the capacity; 0: unlimited */
    uint32_t  s_limit;
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
    uint32_t   limit;
    uint32_t  *head;
    uint32_t  *count;

    int64_t oldest() const { return slots[*head]; }

    int64_t newest() const { return slots[(*head + *count - 1) % cap]; }

    /* no request more: as many in the window as the limit allows */
    bool full() const { return *count >= limit; }

    void drop_before(int64_t edge)
    {
        while (*count > 0 && oldest() <= edge) {
            *head = (*head + 1) % cap;
            (*count)--;
        }
    }

    int64_t at(uint32_t i) const { return slots[(*head + i) % cap]; }

    /* When full the oldest goes: only the newest cap entries decide.
       Returns the time recorded. */
    int64_t push(int64_t now)
    {
        /* a clock step back must not break the time order */
        if (*count > 0 && now < newest()) {
            now = newest();
        }

        if (*count >= cap) {
            slots[*head] = now;
            *head = (*head + 1) % cap;
            return now;
        }

        slots[(*head + *count) % cap] = now;
        (*count)++;
        return now;
    }

    /* Takes out one entry of time t, searched from the newest (a request
       ends soon after it was admitted); the newer ones move up. */
    bool remove(int64_t t)
    {
        for (uint32_t i = *count; i-- > 0; ) {
            int64_t v = at(i);

            if (v < t) {
                return false;
            }

            if (v == t) {
                for (uint32_t j = i; j + 1 < *count; j++) {
                    slots[(*head + j) % cap] = at(j + 1);
                }
                (*count)--;
                return true;
            }
        }

        return false;
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
    return { slots(mem), h->total, h->t_limit, &h->t_head, &h->t_count };
}


Ring
success_ring(void *mem)
{
    Header *h = header(mem);
    return { slots(mem) + h->total, h->success, h->s_limit, &h->s_head,
             &h->s_count };
}


/* Milliseconds until enough entries leave the window for one more (the
   oldest, unless a lowered limit left more entries than it allows). */
int64_t
wait_for(const Ring &r, int64_t now, int64_t window)
{
    int64_t wait = r.at(*r.count - r.limit) + window - now;

    if (wait < 1) {
        return 1;
    }

    /* after a clock step back the log may lie in the future */
    return wait > window ? window : wait;
}

} // namespace


extern "C" uint64_t
llmgw_rl_group_hash(llmgw_str_t group)
{
    uint64_t h = 0xcbf29ce484222325ULL;

    for (size_t i = 0; i < group.len; i++) {
        h = (h ^ static_cast<unsigned char>(group.data[i]))
            * 0x100000001b3ULL;
    }

    return h;
}


extern "C" size_t
llmgw_rl_size(uint32_t total, uint32_t success)
{
    return sizeof(Header)
           + (static_cast<size_t>(total) + success) * sizeof(int64_t);
}


extern "C" void
llmgw_rl_init(void *mem, uint32_t total, uint32_t success)
{
    *header(mem) = Header{ total, success, 0, 0, 0, 0, total, success };
}


/*
 * A refused request is not recorded: only admitted ones count.  An admitted
 * request also takes a success slot at once (*reserved: its time, -1 when
 * successes are not limited), so that requests still running cannot all
 * succeed past the limit; one that fails gives it back (llmgw_rl_release).
 */
extern "C" int
llmgw_rl_acquire(void *mem, int64_t now_ms, int64_t window_ms,
    int64_t *retry_after_ms, int64_t *reserved)
{
    Ring t = total_ring(mem);
    Ring s = success_ring(mem);
    int64_t unused, unused_reserved;

    if (retry_after_ms == nullptr) {
        retry_after_ms = &unused;
    }

    if (reserved == nullptr) {
        reserved = &unused_reserved;
    }

    *retry_after_ms = 0;
    *reserved = -1;

    if (window_ms <= 0) {
        return LLMGW_RL_OK;
    }

    if (t.cap > 0) {
        t.drop_before(now_ms - window_ms);
    }

    if (s.cap > 0) {
        s.drop_before(now_ms - window_ms);
    }

    if (t.limit > 0 && t.full()) {
        *retry_after_ms = wait_for(t, now_ms, window_ms);
        return LLMGW_RL_TOTAL;
    }

    if (s.limit > 0 && s.full()) {
        *retry_after_ms = wait_for(s, now_ms, window_ms);
        return LLMGW_RL_SUCCESS;
    }

    if (t.limit > 0) {
        t.push(now_ms);
    }

    if (s.limit > 0) {
        *reserved = s.push(now_ms);
    }

    return LLMGW_RL_OK;
}


/* An entry already gone (expired, or a limiter made anew) is no error. */
extern "C" void
llmgw_rl_release(void *mem, int64_t reserved)
{
    Ring s = success_ring(mem);

    if (s.cap > 0 && reserved >= 0) {
        (void) s.remove(reserved);
    }
}


/* A limit changed within the capacities: the rings stay, with all they
   hold; 0 when it fits, -1 when a limit is over its ring's capacity. */
extern "C" int
llmgw_rl_limit(void *mem, uint32_t total, uint32_t success)
{
    Header *h = header(mem);

    if (total > h->total || success > h->success) {
        return -1;
    }

    h->t_limit = total;
    h->s_limit = success;
    return 0;
}


/*
 * A limit changed: the history moves to a limiter of the new sizes, the
 * newest entries first (they decide when the next slot frees).
 */
extern "C" void
llmgw_rl_copy(void *dst, const void *src)
{
    void *from = const_cast<void *>(src);
    Ring rings_from[2] = { total_ring(from), success_ring(from) };
    Ring rings_to[2] = { total_ring(dst), success_ring(dst) };

    for (int k = 0; k < 2; k++) {
        Ring &f = rings_from[k];
        Ring &to = rings_to[k];

        if (to.cap == 0 || f.cap == 0) {
            continue;
        }

        uint32_t n = *f.count < to.cap ? *f.count : to.cap;

        for (uint32_t i = *f.count - n; i < *f.count; i++) {
            to.push(f.at(i));
        }
    }
}
