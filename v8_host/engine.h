/*
 * One V8 isolate with the helper's limits: the heap cap (ResourceConstraints
 * plus a near-heap-limit callback that terminates the running call and
 * raises the limit so it can unwind), an ArrayBuffer allocator with the
 * same cap, no code generation from strings, explicit microtasks.
 *
 * An isolate that hit the heap cap is not trusted again: the runtime
 * replaces it after the call (memory_exceeded()).
 */

#ifndef V8HOST_ENGINE_H
#define V8HOST_ENGINE_H

#include <atomic>
#include <cstddef>
#include <memory>

#include <v8.h>

namespace v8host {

/* Once per process, after fork: flags, platform, V8::Initialize. */
void v8_process_init();

class CappedAllocator : public v8::ArrayBuffer::Allocator {
public:
    explicit CappedAllocator(size_t cap) : cap_(cap) {}

    void *Allocate(size_t length) override;
    void *AllocateUninitialized(size_t length) override;
    void Free(void *data, size_t length) override;

private:
    bool reserve(size_t n);

    size_t               cap_;
    std::atomic<size_t>  used_{0};      /* Free may run on GC threads */
};

class Engine {
public:
    explicit Engine(size_t heap_bytes);
    ~Engine();

    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;

    v8::Isolate *isolate() const { return isolate_; }
    bool memory_exceeded() const { return memory_hit_; }

private:
    static size_t near_heap_limit(void *data, size_t current,
                                  size_t initial);

    std::unique_ptr<CappedAllocator>  allocator_;
    v8::Isolate                      *isolate_ = nullptr;
    bool                              memory_hit_ = false;
};

}  // namespace v8host

#endif
