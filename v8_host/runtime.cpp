/*
 * Plugin modules and hook calls.
 *
 * Each plugin gets its own context: its module globals, `utils` and a
 * private serializer live there and nowhere else.  Every entry into JS
 * runs under a TryCatch and the watchdog; afterwards settle() decides what
 * happened and clears a pending termination, so the isolate serves the
 * next call.  An isolate that hit the heap cap is replaced after the call;
 * its plugins come back from the shared source store on their next call.
 */

#include <algorithm>
#include <chrono>
#include <map>

#include <jansson.h>

#include "crypto_util.h"
#include "host_utils.h"
#include "json_text.h"
#include "llmgw.h"
#include "log.h"
#include "redact.h"
#include "runtime.h"
#include "source_scan.h"
#include "v8util.h"

namespace v8host {

using v8::Local;
using v8::Value;

struct Hook {
    v8::Global<v8::Function>  fn;
    v8::Global<v8::Value>     receiver;     /* `this`: native/protocol obj */
};

struct Plugin {
    std::string                  sha;
    std::string                  manifest;      /* normalized JSON */
    std::string                  exports;       /* JSON array */
    v8::Global<v8::Context>      context;
    v8::Global<v8::Module>       module;
    v8::Global<v8::Function>     serialize;
    std::map<std::string, Hook>  hooks;
};

namespace {

/*
 * JSON.stringify with a replacer that refuses what JSON would silently
 * drop or cannot hold, naming where it is: functions, symbols, BigInt,
 * cycles, and nesting deeper than the gateway reads (its JSON parser stops
 * at 2048 levels; a result it cannot read would look like a runtime
 * fault, not the plugin's).  Returns the JSON text, or [message] for such
 * a refusal.  The builtins are captured before plugin code runs in the
 * context.
 */
const char kSerializerSource[] = R"JS((function () {
  'use strict';
  const stringify = JSON.stringify;
  const isArray = Array.isArray;
  const apply = Reflect.apply;
  const test = RegExp.prototype.test;
  const ident = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
  const refused = {};
  function seg(holder, key) {
    if (isArray(holder)) return '[' + key + ']';
    return apply(test, ident, [key]) ? '.' + key : '[' + stringify(key) + ']';
  }
  return function serialize(value, label) {
    const objs = [];
    const segs = [];
    let n = 0;
    let message = '';
    function at(holder, key) {
      let p = '';
      for (let i = 1; i < n; i++) p += segs[i];
      if (n > 0) p += seg(holder, key);
      return p === '' ? '' : ' at ' + p;
    }
    function replacer(key, v) {
      while (n > 0 && objs[n - 1] !== this) n--;
      const t = typeof v;
      if (t === 'function' || t === 'symbol' || t === 'bigint') {
        message = label + (t === 'function' ? ' a function'
                           : t === 'symbol' ? ' a symbol' : ' a BigInt')
                  + at(this, key);
        throw refused;
      }
      if (t === 'object' && v !== null) {
        if (n >= 512) {
          message = label + ' a value nested over 512 levels deep'
                    + at(this, key).slice(0, 200);
          throw refused;
        }
        for (let i = 0; i < n; i++) {
          if (objs[i] === v) {
            message = label + ' a cycle' + at(this, key);
            throw refused;
          }
        }
        segs[n] = n === 0 ? '' : seg(this, key);
        objs[n] = v;
        n++;
      }
      return v;
    }
    try {
      return stringify(value, replacer);
    } catch (e) {
      if (e === refused) return [message];
      throw e;
    }
  };
})())JS";

/* Globals that have no place in a sandboxed, synchronous plugin. */
const char *const kRemovedGlobals[] = {
    "WebAssembly", "SharedArrayBuffer", "Atomics",
};

v8::MaybeLocal<v8::Module>
refuse_import(Local<v8::Context> ctx, Local<v8::String> specifier,
    Local<v8::FixedArray>, Local<v8::Module>)
{
    v8::Isolate *iso = ctx->GetIsolate();

    iso->ThrowException(v8::Exception::Error(v8str(iso,
        "plugins cannot import modules: \"" + stdstr(iso, specifier)
        + "\" is not available")));
    return {};
}

/* The message of a thrown value without running plugin code: V8 formats
   it at throw time.  " (line N)" when V8 knows where. */
std::string
exception_text(v8::Isolate *iso, Local<v8::Context> ctx,
    Local<v8::Message> msg, Local<Value> exception)
{
    std::string text;

    if (msg.IsEmpty() && !exception.IsEmpty()) {
        msg = v8::Exception::CreateMessage(iso, exception);
    }

    if (!msg.IsEmpty()) {
        text = stdstr(iso, msg->Get());
        int line = msg->GetLineNumber(ctx).FromMaybe(0);
        if (line > 0) {
            text += " (line " + std::to_string(line) + ")";
        }
    } else {
        text = "unknown error";
    }

    static const char uncaught[] = "Uncaught ";
    if (text.compare(0, sizeof(uncaught) - 1, uncaught) == 0) {
        text.erase(0, sizeof(uncaught) - 1);
    }

    return clean_plugin_message(text);
}

std::string
plugin_error(std::string_view message, const std::vector<std::string> &errors)
{
    std::string out = "{\"ok\":false,\"error\":{\"kind\":\"plugin\",\"message\":";

    append_json_string(out, message);
    out += ",\"errors\":[";
    for (size_t i = 0; i < errors.size(); i++) {
        if (i > 0) {
            out += ',';
        }
        append_json_string(out, errors[i]);
    }
    out += "]}}";
    return out;
}

const char kInternalMessage[] = "internal error in the plugin runtime";

/* Args are read-only snapshots: frozen all the way down, so a strict-mode
   plugin that writes to them gets a TypeError.  Iterative: JSON nesting is
   not bounded by the C++ stack. */
bool
deep_freeze(Local<v8::Context> ctx, Local<Value> root)
{
    std::vector<Local<v8::Object>> to_freeze;
    auto filter = static_cast<v8::PropertyFilter>(
        v8::ONLY_ENUMERABLE | v8::SKIP_SYMBOLS);

    if (root->IsObject()) {
        to_freeze.push_back(root.As<v8::Object>());
    }

    while (!to_freeze.empty()) {
        Local<v8::Object> o = to_freeze.back();
        to_freeze.pop_back();

        if (o->IsArray()) {
            Local<v8::Array> a = o.As<v8::Array>();
            for (uint32_t i = 0; i < a->Length(); i++) {
                Local<Value> v;
                if (!a->Get(ctx, i).ToLocal(&v)) {
                    return false;
                }
                if (v->IsObject()) {
                    to_freeze.push_back(v.As<v8::Object>());
                }
            }
        } else {
            Local<v8::Array> keys;
            if (!o->GetOwnPropertyNames(ctx, filter).ToLocal(&keys)) {
                return false;
            }
            for (uint32_t i = 0; i < keys->Length(); i++) {
                Local<Value> k, v;
                if (!keys->Get(ctx, i).ToLocal(&k) || !o->Get(ctx, k).ToLocal(&v)) {
                    return false;
                }
                if (v->IsObject()) {
                    to_freeze.push_back(v.As<v8::Object>());
                }
            }
        }

        if (o->SetIntegrityLevel(ctx, v8::IntegrityLevel::kFrozen).IsNothing()) {
            return false;
        }
    }

    return true;
}

/* A fresh context for one plugin: globals pruned, `utils` installed
   (json.clone only with json_clone), the serializer compiled.  Runs no
   plugin code. */
bool
new_plugin_context(v8::Isolate *iso, bool json_clone,
    Local<v8::Context> *out_ctx, Local<v8::Function> *out_serialize)
{
    Local<v8::Context> ctx = v8::Context::New(iso);
    v8::Context::Scope cs(ctx);

    ctx->AllowCodeGenerationFromStrings(false);

    for (const char *name : kRemovedGlobals) {
        if (ctx->Global()->Delete(ctx, v8str(iso, name)).IsNothing()) {
            return false;
        }
    }

    if (!install_utils(ctx, json_clone)) {
        return false;
    }

    v8::ScriptOrigin origin(iso, v8str(iso, "llmgw:serializer"));
    Local<v8::Script> script;
    Local<Value> fn;

    if (!v8::Script::Compile(ctx, v8str(iso, kSerializerSource), &origin)
             .ToLocal(&script)
        || !script->Run(ctx).ToLocal(&fn) || !fn->IsFunction())
    {
        return false;
    }

    *out_ctx = ctx;
    *out_serialize = fn.As<v8::Function>();
    return true;
}

bool
plain_object(Local<Value> v)
{
    return v->IsObject() && !v->IsFunction() && !v->IsArray();
}


std::string
json_array_text(const std::vector<std::string> &items)
{
    std::string out = "[";

    for (size_t i = 0; i < items.size(); i++) {
        if (i > 0) {
            out += ',';
        }
        append_json_string(out, items[i]);
    }

    return out + "]";
}

/* Compiles, links (refusing every import) and evaluates the module.  false
   when it failed: an exception in the caller's TryCatch, a rejected
   evaluation in *rejection, or a message in *fail. */
bool
evaluate_module(v8::Isolate *iso, Local<v8::Context> ctx,
    std::string_view source, Local<v8::Module> *module,
    Local<Value> *rejection, std::string *fail)
{
    v8::ScriptOrigin origin(iso, v8str(iso, "plugin.mjs"), 0, 0, false, -1,
                            Local<Value>(), false, false, true);
    v8::ScriptCompiler::Source src(v8str(iso, source), origin);
    Local<Value> result;

    if (!v8::ScriptCompiler::CompileModule(iso, &src).ToLocal(module)
        || !(*module)->InstantiateModule(ctx, refuse_import).FromMaybe(false)
        || !(*module)->Evaluate(ctx).ToLocal(&result))
    {
        return false;
    }

    /* Without top-level await (the scan refused it) the evaluation
       promise is already settled. */
    if (result->IsPromise()) {
        Local<v8::Promise> promise = result.As<v8::Promise>();

        if (promise->State() == v8::Promise::kRejected) {
            *rejection = promise->Result();
            return false;
        }
        if (promise->State() == v8::Promise::kPending) {
            *fail = "the module did not finish evaluating synchronously";
            return false;
        }
    }

    iso->PerformMicrotaskCheckpoint();
    return !iso->IsExecutionTerminating();
}

/* Every function-valued own property of holder, as hook prefix + name. */
bool
add_functions(Local<v8::Context> ctx, Local<v8::Object> holder,
    const std::string &prefix, Local<Value> receiver, Plugin *p,
    std::vector<std::string> *paths)
{
    v8::Isolate *iso = ctx->GetIsolate();
    Local<v8::Array> keys;

    if (!holder->GetOwnPropertyNames(ctx).ToLocal(&keys)) {
        return false;
    }

    for (uint32_t i = 0; i < keys->Length(); i++) {
        Local<Value> k, v;

        if (!keys->Get(ctx, i).ToLocal(&k) || !holder->Get(ctx, k).ToLocal(&v)) {
            return false;
        }
        if (!v->IsFunction()) {
            continue;
        }

        std::string path = prefix + stdstr(iso, k);
        Hook &h = p->hooks[path];
        h.fn.Reset(iso, v.As<v8::Function>());
        h.receiver.Reset(iso, receiver);
        paths->push_back(path);
    }

    return true;
}

/* The exported functions: top-level ones by name, those of `native` as
   native.<fn> and of `protocols.<p>` as protocols.<p>.<fn>. */
bool
collect_exports(Local<v8::Context> ctx, Local<v8::Object> ns, Plugin *p,
    std::vector<std::string> *paths)
{
    v8::Isolate *iso = ctx->GetIsolate();
    Local<v8::Array> names;

    if (!ns->GetOwnPropertyNames(ctx).ToLocal(&names)) {
        return false;
    }

    for (uint32_t i = 0; i < names->Length(); i++) {
        Local<Value> k, v;

        if (!names->Get(ctx, i).ToLocal(&k) || !ns->Get(ctx, k).ToLocal(&v)) {
            return false;
        }

        std::string name = stdstr(iso, k);

        if (v->IsFunction()) {
            Hook &h = p->hooks[name];
            h.fn.Reset(iso, v.As<v8::Function>());
            h.receiver.Reset(iso, v8::Undefined(iso));
            paths->push_back(name);

        } else if (name == "native" && plain_object(v)) {
            if (!add_functions(ctx, v.As<v8::Object>(), "native.", v, p, paths)) {
                return false;
            }

        } else if (name == "protocols" && plain_object(v)) {
            Local<v8::Object> protocols = v.As<v8::Object>();
            Local<v8::Array> pnames;

            if (!protocols->GetOwnPropertyNames(ctx).ToLocal(&pnames)) {
                return false;
            }
            for (uint32_t j = 0; j < pnames->Length(); j++) {
                Local<Value> pk, pv;
                if (!pnames->Get(ctx, j).ToLocal(&pk)
                    || !protocols->Get(ctx, pk).ToLocal(&pv))
                {
                    return false;
                }
                if (plain_object(pv)
                    && !add_functions(ctx, pv.As<v8::Object>(),
                                      std::string("protocols.")
                                      + llmgw_protocol_name(
                                            stdstr(iso, pk).c_str())
                                      + ".",
                                      pv, p, paths))
                {
                    return false;
                }
            }
        }
    }

    return true;
}

/* serialize(value, label) in the plugin's context: true with the JSON in
   *json, or with the refusal in *fail; false with an exception pending. */
bool
serialize_value(Local<v8::Context> ctx, Local<v8::Function> serialize,
    Local<Value> value, const std::string &label, std::string *json,
    std::string *fail)
{
    v8::Isolate *iso = ctx->GetIsolate();
    Local<Value> argv[] = { value, v8str(iso, label) };
    Local<Value> text, refusal;

    if (!serialize->Call(ctx, v8::Undefined(iso), 2, argv).ToLocal(&text)) {
        return false;
    }

    if (text->IsString()) {
        *json = stdstr(iso, text);
    } else if (text->IsArray()
               && text.As<v8::Array>()->Get(ctx, 0).ToLocal(&refusal))
    {
        *fail = stdstr(iso, refusal);
    } else {
        *fail = label + " a value that is not JSON";
    }

    return true;
}

/* `meta`: an exported plain object, serialized as JSON. */
bool
read_meta(Local<v8::Context> ctx, Local<v8::Object> ns,
    Local<v8::Function> serialize, std::string *json, std::string *fail)
{
    Local<Value> meta;

    if (!ns->Get(ctx, v8str(ctx->GetIsolate(), "meta")).ToLocal(&meta)) {
        return false;
    }
    if (meta->IsUndefined()) {
        *fail = "the plugin does not export `meta`";
        return true;
    }
    if (!plain_object(meta)) {
        *fail = "`meta` must be an object";
        return true;
    }

    return serialize_value(ctx, serialize, meta, "meta contains", json, fail);
}

/* Whether a normalized manifest names a capability in
   requiredCapabilities. */
bool
declares(const std::string &manifest, std::string_view capability)
{
    json_t *m = json_loadb(manifest.data(), manifest.size(), 0, nullptr);
    json_t *c;
    size_t i;
    bool found = false;

    json_array_foreach(json_object_get(m, "requiredCapabilities"), i, c) {
        found = found || (json_is_string(c)
                          && capability == std::string_view(
                                 json_string_value(c), json_string_length(c)));
    }

    json_decref(m);
    return found;
}

/*
 * llmgw_manifest_validate (src/manifest.cpp): 0 with the normalized
 * manifest, 1 with the validation errors, -1 when it could not answer.
 */
int
validate_manifest(const std::string &meta, const std::string &exports,
    std::string *normalized, std::vector<std::string> *errors)
{
    llmgw_buf_t norm { nullptr, 0 }, errs { nullptr, 0 };
    int rc = llmgw_manifest_validate(meta.data(), meta.size(), exports.data(),
                                     exports.size(), &norm, &errs);

    if (rc == 0 && norm.data != nullptr) {
        normalized->assign(norm.data, norm.len);
    } else if (rc != 0 && errs.data != nullptr) {
        json_t *arr = json_loadb(errs.data, errs.len, 0, nullptr);
        size_t i;
        json_t *e;

        json_array_foreach(arr, i, e) {
            if (json_is_string(e)) {
                errors->emplace_back(json_string_value(e), json_string_length(e));
            }
        }
        json_decref(arr);
    }

    llmgw_buf_free(&norm);
    llmgw_buf_free(&errs);

    if (rc == 0) {
        return normalized->empty() ? -1 : 0;
    }
    if (errors->empty()) {
        errors->push_back("the manifest is not valid");
    }
    return 1;
}

}  // namespace

Runtime::Runtime(const Limits &limits, SourceStore *store)
    : limits_(limits), store_(store),
      engine_(std::make_unique<Engine>(
          static_cast<size_t>(limits.heap_mb) << 20))
{
}

Runtime::~Runtime()
{
    index_.clear();
    lru_.clear();
    engine_.reset();
}

/* How an entry into JS ended; clears a pending termination so the isolate
   can run the next call. */
Outcome
Runtime::settle(bool fired, bool failed, bool terminated)
{
    v8::Isolate *iso = engine_->isolate();

    if (fired || terminated || engine_->memory_exceeded()
        || iso->IsExecutionTerminating())
    {
        iso->CancelTerminateExecution();
    }

    /*
     * Microtasks the entry left queued (by a hook that threw, or by a
     * toJSON or getter run while its result was serialized) are dropped:
     * the queue is the isolate's, and the next entry may be another
     * plugin's.  A checkpoint entered while terminating empties the queue
     * without running what is in it.
     */
    iso->TerminateExecution();
    iso->PerformMicrotaskCheckpoint();
    iso->CancelTerminateExecution();

    if (engine_->memory_exceeded()) {
        return Outcome::memory;
    }
    if (fired) {
        return Outcome::timeout;
    }
    if (terminated) {
        return Outcome::internal;
    }
    return failed ? Outcome::plugin : Outcome::ok;
}

/* The reply for a failed entry into JS.  what: "loading the plugin" or the
   hook; message: the plugin's own error (kind plugin). */
std::string
Runtime::failure_reply(Outcome o, const std::string &what, int budget_ms,
    const std::string &message, bool list_errors)
{
    switch (o) {
    case Outcome::memory:
        return error_reply("memory", what + " exceeded the heap limit of "
                           + std::to_string(limits_.heap_mb) + " MiB");
    case Outcome::timeout:
        return error_reply("timeout", what + " did not finish within "
                           + std::to_string(budget_ms) + " ms");
    case Outcome::plugin:
        return list_errors ? plugin_error(message, { message })
                           : error_reply("plugin", message);
    default:
        log(Level::error, "%s: failed in the runtime without an exception",
            what.c_str());
        return error_reply("internal", kInternalMessage);
    }
}

void
Runtime::replace_engine_if_needed(bool after_call)
{
    size_t cap = static_cast<size_t>(limits_.heap_mb) << 20;
    bool kept = false;

    if (!engine_->memory_exceeded()) {
        /*
         * The heap is shared by every plugin of this worker: one that keeps
         * memory in its module's globals would leave the others too little
         * to run.  After a call (not a load, whose plugin is about to be
         * called), with other plugins loaded, over half the cap in use even
         * after a full collection: the isolate is replaced as if the cap
         * had been hit (the call that just ended has its answer).
         */
        if (!after_call || lru_.size() < 2) {
            return;
        }

        v8::Isolate *iso = engine_->isolate();
        v8::HeapStatistics hs;

        iso->GetHeapStatistics(&hs);
        if (hs.used_heap_size() <= cap / 2) {
            return;
        }

        iso->LowMemoryNotification();
        iso->GetHeapStatistics(&hs);
        if (hs.used_heap_size() <= cap / 2) {
            return;
        }

        kept = true;
    }

    size_t n = lru_.size();

    index_.clear();
    lru_.clear();
    engine_ = std::make_unique<Engine>(cap);

    log(Level::warn, "isolate replaced after %s the heap limit of %d MiB "
        "(%zu plugin(s) dropped, compiled again on demand)",
        kept ? "plugins kept more than half of" : "a call hit",
        limits_.heap_mb, n);
}

void
Runtime::remember(Plugin &&p)
{
    std::string sha = p.sha;

    lru_.push_front(std::move(p));
    index_[sha] = lru_.begin();

    while (lru_.size() > kMaxPlugins) {
        index_.erase(lru_.back().sha);
        lru_.pop_back();
    }
}

static std::string
load_ok_reply(const Plugin &p)
{
    return "{\"ok\":true,\"sha\":\"" + p.sha + "\",\"manifest\":" + p.manifest
           + ",\"exports\":" + p.exports + "}";
}

std::string
Runtime::load(std::string_view source, Outcome *outcome)
{
    std::string sha = hex(sha256(source));
    auto it = index_.find(sha);

    if (it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        *outcome = Outcome::ok;
        if (store_ != nullptr) {
            store_->put(sha, source);       /* it may have been evicted */
        }
        return load_ok_reply(*it->second);
    }

    std::vector<std::string> issues = scan_forbidden(source);
    if (!issues.empty()) {
        *outcome = Outcome::plugin;
        return plugin_error(issues[0], issues);
    }

    std::string reply = load_in_isolate(source, sha, outcome);
    replace_engine_if_needed(false);

    if (*outcome == Outcome::ok && store_ != nullptr) {
        store_->put(sha, source);
    }
    return reply;
}

/*
 * utils.json.clone is there only for a plugin that declares json-clone@1,
 * and what a plugin declares is known only once its module has run: the
 * source's own text is the guess, and a wrong one runs the module again
 * in a context with the utilities its manifest declares.
 */
std::string
Runtime::load_in_isolate(std::string_view source, const std::string &sha,
    Outcome *outcome)
{
    bool clone = source.find(kJsonCloneCapability) != std::string_view::npos;

    for (int run = 0; run < 2; run++, clone = !clone) {
        Plugin p;
        std::string reply = load_once(source, sha, clone, &p, outcome);

        if (*outcome != Outcome::ok) {
            return reply;
        }

        if (declares(p.manifest, kJsonCloneCapability) == clone) {
            remember(std::move(p));
            return reply;
        }
    }

    *outcome = Outcome::plugin;
    std::string msg = "meta.requiredCapabilities differs from one run of "
                      "the module to the next";
    return plugin_error(msg, { msg });
}

/* One run of the module in a new context; *p is the plugin loaded. */
std::string
Runtime::load_once(std::string_view source, const std::string &sha,
    bool json_clone, Plugin *out, Outcome *outcome)
{
    v8::Isolate *iso = engine_->isolate();
    v8::Isolate::Scope is(iso);
    v8::HandleScope hs(iso);
    Local<v8::Context> ctx;
    Local<v8::Function> serialize;

    if (!new_plugin_context(iso, json_clone, &ctx, &serialize)) {
        *outcome = Outcome::internal;
        log(Level::error, "LOAD: could not set up a plugin context");
        return error_reply("internal", kInternalMessage);
    }

    v8::Context::Scope cs(ctx);
    v8::TryCatch tc(iso);
    Plugin p;
    std::vector<std::string> paths;
    std::string meta, fail;             /* fail: the plugin's own error */
    Local<v8::Module> module;
    Local<Value> rejection;
    bool fired;

    {
        DeadlineScope deadline(watchdog_, iso,
                               std::chrono::milliseconds(limits_.deadline_ms));

        if (evaluate_module(iso, ctx, source, &module, &rejection, &fail)) {
            Local<v8::Object> ns = module->GetModuleNamespace().As<v8::Object>();

            if (collect_exports(ctx, ns, &p, &paths)) {
                read_meta(ctx, ns, serialize, &meta, &fail);
            }
        }

        fired = deadline.disarm();
    }

    bool failed = tc.HasCaught() || !rejection.IsEmpty() || !fail.empty();
    *outcome = settle(fired, failed, tc.HasTerminated());

    if (*outcome != Outcome::ok || meta.empty()) {
        if (*outcome == Outcome::ok) {
            *outcome = Outcome::internal;
        }
        std::string msg = !fail.empty() ? clean_plugin_message(fail)
                          : exception_text(iso, ctx, tc.Message(),
                                           tc.HasCaught() ? tc.Exception()
                                                          : rejection);
        return failure_reply(*outcome, "loading the plugin",
                             limits_.deadline_ms, msg, true);
    }

    p.sha = sha;
    p.exports = json_array_text(paths);

    std::vector<std::string> errors;
    int rc = validate_manifest(meta, p.exports, &p.manifest, &errors);

    if (rc != 0) {
        *outcome = rc > 0 ? Outcome::plugin : Outcome::internal;
        if (rc < 0) {
            log(Level::error, "LOAD: the manifest validator gave no answer");
            return error_reply("internal", kInternalMessage);
        }

        std::string msg = "invalid manifest: " + errors[0];
        if (errors.size() > 1) {
            msg += " (and " + std::to_string(errors.size() - 1) + " more)";
        }
        return plugin_error(msg, errors);
    }

    p.context.Reset(iso, ctx);
    p.module.Reset(iso, module);
    p.serialize.Reset(iso, serialize);

    *out = std::move(p);
    return load_ok_reply(*out);
}

std::string
Runtime::call(const CallRequest &req, Outcome *outcome)
{
    std::string sha = req.sha;
    auto started = std::chrono::steady_clock::now();

    /* A dry run sends the source itself; a published hook sends its sha
       and the source is compiled from the shared store when this worker
       has not seen it. */
    if (req.has_source) {
        sha = hex(sha256(req.source));
        std::string reply = load(req.source, outcome);
        if (*outcome != Outcome::ok) {
            return reply;
        }
    }

    auto it = index_.find(sha);
    std::string stored;

    if (it == index_.end() && store_ != nullptr && store_->get(sha, &stored)) {
        std::string reply = load(stored, outcome);
        if (*outcome != Outcome::ok) {
            return reply;
        }
        it = index_.find(sha);
    }

    if (it == index_.end()) {
        *outcome = Outcome::not_loaded;
        return error_reply("not_loaded", "plugin " + clean_plugin_message(
                               sha.substr(0, 64)) + " is not loaded");
    }

    for (const std::string &cap : req.capabilities) {
        if (!host_has_capability(cap)) {
            *outcome = Outcome::plugin;
            return error_reply("plugin", "capability "
                               + clean_plugin_message(json_string(cap))
                               + " is not supported by this host");
        }
    }

    lru_.splice(lru_.begin(), lru_, it->second);
    Plugin &p = *it->second;

    if (p.hooks.find(req.hook) == p.hooks.end()) {
        *outcome = Outcome::plugin;
        return error_reply("plugin", "the plugin does not export "
                                     + clean_plugin_message(req.hook));
    }

    /* one deadline for the frame: compiling on the way counts */
    auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::steady_clock::now() - started).count();
    std::string reply = call_in_isolate(p, req, outcome,
                                        static_cast<int>(spent));
    replace_engine_if_needed(true);
    return reply;
}

/* Frozen arguments from the JSON text, in the plugin's context. */
static bool
make_args(Local<v8::Context> ctx, const std::string &json,
    std::vector<Local<Value>> *argv)
{
    Local<Value> args;

    if (!v8::JSON::Parse(ctx, v8str(ctx->GetIsolate(), json)).ToLocal(&args)
        || !args->IsArray() || !deep_freeze(ctx, args))
    {
        return false;
    }

    Local<v8::Array> a = args.As<v8::Array>();
    argv->resize(a->Length());

    for (uint32_t i = 0; i < a->Length(); i++) {
        if (!a->Get(ctx, i).ToLocal(&(*argv)[i])) {
            return false;
        }
    }

    return true;
}

std::string
Runtime::call_in_isolate(Plugin &p, const CallRequest &req, Outcome *outcome,
    int spent_ms)
{
    v8::Isolate *iso = engine_->isolate();
    v8::Isolate::Scope is(iso);
    v8::HandleScope hs(iso);
    Local<v8::Context> ctx = p.context.Get(iso);
    v8::Context::Scope cs(ctx);
    v8::TryCatch tc(iso);
    const Hook &hook = p.hooks.find(req.hook)->second;
    int budget = (req.deadline_ms > 0 && req.deadline_ms < limits_.deadline_ms)
                 ? req.deadline_ms : limits_.deadline_ms;
    budget = std::max(1, budget - spent_ms);
    std::vector<Local<Value>> argv;
    Local<Value> result;
    std::string fail, json;
    bool fired;

    {
        DeadlineScope deadline(watchdog_, iso, std::chrono::milliseconds(budget));

        if (make_args(ctx, req.args_json, &argv)
            && hook.fn.Get(iso)->Call(ctx, hook.receiver.Get(iso),
                                      static_cast<int>(argv.size()),
                                      argv.data()).ToLocal(&result))
        {
            iso->PerformMicrotaskCheckpoint();

            if (result->IsUndefined()) {
                fail = req.hook + " returned undefined";
            } else if (!iso->IsExecutionTerminating() && !tc.HasCaught()) {
                serialize_value(ctx, p.serialize.Get(iso), result,
                                req.hook + " returned", &json, &fail);
            }
        }

        fired = deadline.disarm();
    }

    *outcome = settle(fired, tc.HasCaught() || !fail.empty(),
                      tc.HasTerminated());

    if (*outcome != Outcome::ok || json.empty()) {
        if (*outcome == Outcome::ok) {
            *outcome = Outcome::internal;
        }
        std::string msg = !fail.empty() ? clean_plugin_message(fail)
                          : exception_text(iso, ctx, tc.Message(),
                                           tc.Exception());
        return failure_reply(*outcome, req.hook, budget, msg, false);
    }

    /* The reply wraps the result in {"ok":true,"result":...}. */
    if (json.size() + 32 > limits_.max_frame) {
        *outcome = Outcome::plugin;
        return error_reply("plugin", req.hook + " returned "
                           + std::to_string(json.size()) + " bytes of JSON, "
                           "over the frame limit of "
                           + std::to_string(limits_.max_frame));
    }

    return "{\"ok\":true,\"result\":" + json + "}";
}

}  // namespace v8host
