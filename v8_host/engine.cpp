/*
 * Isolate set-up and the heap cap.
 */

#include <algorithm>
#include <cstdlib>
#include <unistd.h>

#include <libplatform/libplatform.h>

#include "engine.h"
#include "exit_status.h"
#include "log.h"

namespace v8host {

static std::unique_ptr<v8::Platform> platform_;

void
v8_process_init()
{
    /* WebAssembly is not installed at all; eval/new Function refuse. */
    static const char flags[] =
        "--no-expose-wasm --disallow-code-generation-from-strings";

    v8::V8::SetFlagsFromString(flags, sizeof(flags) - 1);
    v8::V8::InitializeICU();
    /* One background thread for GC tasks: a worker runs one call at a
       time and the machine is shared with nginx. */
    platform_ = v8::platform::NewDefaultPlatform(1);
    v8::V8::InitializePlatform(platform_.get());
    v8::V8::Initialize();
}

bool
CappedAllocator::reserve(size_t n)
{
    size_t cur = used_.load(std::memory_order_relaxed);

    do {
        if (n > cap_ - cur) {
            return false;
        }
    } while (!used_.compare_exchange_weak(cur, cur + n,
                                          std::memory_order_relaxed));

    return true;
}

void *
CappedAllocator::Allocate(size_t length)
{
    if (!reserve(length)) {
        return nullptr;
    }

    void *p = std::calloc(std::max<size_t>(length, 1), 1);
    if (p == nullptr) {
        used_.fetch_sub(length, std::memory_order_relaxed);
    }

    return p;
}

void *
CappedAllocator::AllocateUninitialized(size_t length)
{
    if (!reserve(length)) {
        return nullptr;
    }

    void *p = std::malloc(std::max<size_t>(length, 1));
    if (p == nullptr) {
        used_.fetch_sub(length, std::memory_order_relaxed);
    }

    return p;
}

void
CappedAllocator::Free(void *data, size_t length)
{
    std::free(data);
    used_.fetch_sub(length, std::memory_order_relaxed);
}

static void
on_oom(const char *location, bool is_heap_oom)
{
    /* The near-heap-limit callback failed to stop the call in time.  The
       process cannot continue; the supervisor starts a new worker. */
    log(Level::error, "V8 out of memory (%s, %s); worker exits",
        location != nullptr ? location : "?",
        is_heap_oom ? "heap" : "process");
    _exit(kExitOutOfMemory);
}

static void
on_fatal(const char *location, const char *message)
{
    log(Level::error, "V8 fatal error in %s: %s; worker exits",
        location != nullptr ? location : "?",
        message != nullptr ? message : "?");
    _exit(kExitFatal);
}

static v8::ModifyCodeGenerationFromStringsResult
refuse_codegen(v8::Local<v8::Context>, v8::Local<v8::Value>, bool)
{
    return { false, {} };
}

Engine::Engine(size_t heap_bytes)
    : allocator_(std::make_unique<CappedAllocator>(heap_bytes))
{
    v8::Isolate::CreateParams params;

    params.array_buffer_allocator = allocator_.get();
    params.constraints.ConfigureDefaultsFromHeapSize(0, heap_bytes);

    isolate_ = v8::Isolate::New(params);
    isolate_->AddNearHeapLimitCallback(&Engine::near_heap_limit, this);
    isolate_->SetOOMErrorHandler(on_oom);
    isolate_->SetFatalErrorHandler(on_fatal);
    isolate_->SetModifyCodeGenerationFromStringsCallback(refuse_codegen);
    isolate_->SetMicrotasksPolicy(v8::MicrotasksPolicy::kExplicit);
}

Engine::~Engine()
{
    isolate_->Dispose();
}

size_t
Engine::near_heap_limit(void *data, size_t current, size_t initial)
{
    auto *e = static_cast<Engine *>(data);

    e->memory_hit_ = true;
    e->isolate_->TerminateExecution();

    /* Room to unwind the terminated call, above what is in use (one large
       allocation can leave the heap well above the old limit); the isolate
       is replaced after it, so the raised limit never serves another call. */
    v8::HeapStatistics hs;
    e->isolate_->GetHeapStatistics(&hs);

    return std::max(current, hs.used_heap_size())
           + std::max<size_t>(initial / 2, 8u << 20);
}

}  // namespace v8host
