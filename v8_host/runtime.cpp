/*
 * Plugin modules and hook calls.
 *
 * Each plugin gets its own context: its module globals, `utils` and a
 * private serializer live there and nowhere else.  Every entry into JS
 * runs under a TryCatch and the watchdog; afterwards settle() decides what
 * happened and clears a pending termination, so the isolate serves the
 * next call.  An isolate that hit the heap cap is replaced after the call
 * (its plugins must then be loaded again: CALL answers not_loaded).
 */

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

struct Runtime::Hook {
    v8::Global<v8::Function>  fn;
    v8::Global<v8::Value>     receiver;     /* `this`: native/protocol obj */
};

struct Runtime::Plugin {
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
 * drop or cannot hold, naming where it is: functions, symbols, BigInt and
 * cycles.  Returns the JSON text, or [message] for such a refusal.  The
 * builtins are captured before plugin code runs in the context.
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
    std::vector<Local<v8::Object>> todo;
    auto filter = static_cast<v8::PropertyFilter>(
        v8::ONLY_ENUMERABLE | v8::SKIP_SYMBOLS);

    if (root->IsObject()) {
        todo.push_back(root.As<v8::Object>());
    }

    while (!todo.empty()) {
        Local<v8::Object> o = todo.back();
        todo.pop_back();

        if (o->IsArray()) {
            Local<v8::Array> a = o.As<v8::Array>();
            for (uint32_t i = 0; i < a->Length(); i++) {
                Local<Value> v;
                if (!a->Get(ctx, i).ToLocal(&v)) {
                    return false;
                }
                if (v->IsObject()) {
                    todo.push_back(v.As<v8::Object>());
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
                    todo.push_back(v.As<v8::Object>());
                }
            }
        }

        if (o->SetIntegrityLevel(ctx, v8::IntegrityLevel::kFrozen).IsNothing()) {
            return false;
        }
    }

    return true;
}

/* A fresh context for one plugin: globals pruned, `utils` installed,
   the serializer compiled.  Runs no plugin code. */
bool
new_plugin_context(v8::Isolate *iso, Local<v8::Context> *out_ctx,
    Local<v8::Function> *out_serialize)
{
    Local<v8::Context> ctx = v8::Context::New(iso);
    v8::Context::Scope cs(ctx);

    ctx->AllowCodeGenerationFromStrings(false);

    for (const char *name : kRemovedGlobals) {
        if (ctx->Global()->Delete(ctx, v8str(iso, name)).IsNothing()) {
            return false;
        }
    }

    if (!install_utils(ctx)) {
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
Runtime::settle(bool fired, bool caught, bool terminated)
{
    v8::Isolate *iso = engine_->isolate();

    if (fired || terminated || engine_->memory_exceeded()
        || iso->IsExecutionTerminating())
    {
        iso->CancelTerminateExecution();
    }

    if (engine_->memory_exceeded()) {
        return Outcome::memory;
    }
    if (fired) {
        return Outcome::timeout;
    }
    if (terminated) {
        return Outcome::internal;
    }
    return caught ? Outcome::plugin : Outcome::ok;
}

void
Runtime::replace_engine_if_needed()
{
    if (!engine_->memory_exceeded()) {
        return;
    }

    size_t n = lru_.size();

    index_.clear();
    lru_.clear();
    engine_ = std::make_unique<Engine>(
        static_cast<size_t>(limits_.heap_mb) << 20);

    log(Level::warn, "isolate replaced after a call hit the heap limit of "
        "%d MiB (%zu plugin(s) dropped, loaded again on demand)",
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
load_ok_reply(const std::string &sha, const std::string &manifest,
    const std::string &exports)
{
    return "{\"ok\":true,\"sha\":\"" + sha + "\",\"manifest\":" + manifest
           + ",\"exports\":" + exports + "}";
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
        return load_ok_reply(sha, it->second->manifest, it->second->exports);
    }

    std::vector<std::string> issues = scan_forbidden(source);
    if (!issues.empty()) {
        *outcome = Outcome::plugin;
        return plugin_error(issues[0], issues);
    }

    std::string reply = load_in_isolate(source, sha, outcome);
    replace_engine_if_needed();

    if (*outcome == Outcome::ok && store_ != nullptr) {
        store_->put(sha, source);
    }
    return reply;
}

std::string
Runtime::load_in_isolate(std::string_view source, const std::string &sha,
    Outcome *outcome)
{
    v8::Isolate *iso = engine_->isolate();
    v8::Isolate::Scope is(iso);
    v8::HandleScope hs(iso);
    Local<v8::Context> ctx;
    Local<v8::Function> serialize;

    *outcome = Outcome::internal;

    if (!new_plugin_context(iso, &ctx, &serialize)) {
        log(Level::error, "LOAD: could not set up a plugin context");
        return error_reply("internal", kInternalMessage);
    }

    v8::Context::Scope cs(ctx);
    v8::TryCatch tc(iso);
    Plugin p;
    p.sha = sha;
    std::vector<std::string> paths;
    std::string meta_json, fail;        /* fail: the plugin's own error */
    Local<v8::Module> module;
    Local<Value> exception;
    bool fired = false;

    {
        DeadlineScope deadline(watchdog_, iso,
                               std::chrono::milliseconds(limits_.deadline_ms));

        auto evaluate = [&]() {
            v8::ScriptOrigin origin(iso, v8str(iso, "plugin.mjs"), 0, 0, false,
                                    -1, Local<Value>(), false, false, true);
            v8::ScriptCompiler::Source src(v8str(iso, source), origin);
            Local<Value> result, ns_value, meta;

            if (!v8::ScriptCompiler::CompileModule(iso, &src).ToLocal(&module)
                || !module->InstantiateModule(ctx, refuse_import).FromMaybe(false)
                || !module->Evaluate(ctx).ToLocal(&result))
            {
                return;
            }

            /* No top-level await (the scan refused it): the evaluation promise
               is already settled. */
            if (result->IsPromise()) {
                Local<v8::Promise> promise = result.As<v8::Promise>();
                if (promise->State() == v8::Promise::kRejected) {
                    exception = promise->Result();
                    return;
                }
                if (promise->State() == v8::Promise::kPending) {
                    fail = "the module did not finish evaluating synchronously";
                    return;
                }
            }
            iso->PerformMicrotaskCheckpoint();
            if (tc.HasCaught() || tc.HasTerminated()) {
                return;
            }

            Local<v8::Object> ns = module->GetModuleNamespace().As<v8::Object>();
            Local<v8::Array> names;
            if (!ns->GetOwnPropertyNames(ctx).ToLocal(&names)) {
                return;
            }

            auto add = [&](Local<v8::Object> holder, const std::string &prefix,
                           Local<Value> recv) -> bool {
                Local<v8::Array> keys;
                if (!holder->GetOwnPropertyNames(ctx).ToLocal(&keys)) {
                    return false;
                }
                for (uint32_t i = 0; i < keys->Length(); i++) {
                    Local<Value> k, v;
                    if (!keys->Get(ctx, i).ToLocal(&k)
                        || !holder->Get(ctx, k).ToLocal(&v))
                    {
                        return false;
                    }
                    if (!v->IsFunction()) {
                        continue;
                    }
                    std::string path = prefix + stdstr(iso, k);
                    Hook &h = p.hooks[path];
                    h.fn.Reset(iso, v.As<v8::Function>());
                    h.receiver.Reset(iso, recv);
                    paths.push_back(path);
                }
                return true;
            };

            for (uint32_t i = 0; i < names->Length(); i++) {
                Local<Value> k, v;
                if (!names->Get(ctx, i).ToLocal(&k) || !ns->Get(ctx, k).ToLocal(&v)) {
                    return;
                }
                std::string name = stdstr(iso, k);

                if (v->IsFunction()) {
                    Hook &h = p.hooks[name];
                    h.fn.Reset(iso, v.As<v8::Function>());
                    h.receiver.Reset(iso, v8::Undefined(iso));
                    paths.push_back(name);

                } else if (name == "native" && plain_object(v)) {
                    if (!add(v.As<v8::Object>(), "native.", v)) {
                        return;
                    }

                } else if (name == "protocols" && plain_object(v)) {
                    Local<v8::Object> protos = v.As<v8::Object>();
                    Local<v8::Array> pnames;
                    if (!protos->GetOwnPropertyNames(ctx).ToLocal(&pnames)) {
                        return;
                    }
                    for (uint32_t j = 0; j < pnames->Length(); j++) {
                        Local<Value> pk, pv;
                        if (!pnames->Get(ctx, j).ToLocal(&pk)
                            || !protos->Get(ctx, pk).ToLocal(&pv))
                        {
                            return;
                        }
                        if (plain_object(pv)
                            && !add(pv.As<v8::Object>(),
                                    "protocols." + stdstr(iso, pk) + ".", pv))
                        {
                            return;
                        }
                    }
                }
            }

            if (!ns->Get(ctx, v8str(iso, "meta")).ToLocal(&meta)) {
                return;
            }
            if (meta->IsUndefined()) {
                fail = "the plugin does not export `meta`";
                return;
            }
            if (!plain_object(meta) || meta->IsNull()) {
                fail = "`meta` must be an object";
                return;
            }

            Local<Value> argv[] = { meta, v8str(iso, "meta contains") };
            Local<Value> text;
            if (!serialize->Call(ctx, v8::Undefined(iso), 2, argv).ToLocal(&text)) {
                return;
            }
            if (text->IsArray()) {
                Local<Value> m;
                if (text.As<v8::Array>()->Get(ctx, 0).ToLocal(&m)) {
                    fail = stdstr(iso, m);
                }
                return;
            }
            if (!text->IsString()) {
                fail = "`meta` is not JSON";
                return;
            }
            meta_json = stdstr(iso, text);
        };

        evaluate();
        fired = deadline.disarm();
    }

    Outcome o = settle(fired, tc.HasCaught() || !exception.IsEmpty()
                              || !fail.empty(), tc.HasTerminated());
    *outcome = o;

    switch (o) {
    case Outcome::memory:
        return error_reply("memory", "loading the plugin exceeded the heap "
                           "limit of " + std::to_string(limits_.heap_mb)
                           + " MiB");
    case Outcome::timeout:
        return error_reply("timeout", "loading the plugin did not finish "
                           "within " + std::to_string(limits_.deadline_ms)
                           + " ms");
    case Outcome::plugin: {
        std::string msg = !fail.empty() ? clean_plugin_message(fail)
                          : exception_text(iso, ctx, tc.Message(),
                                           tc.HasCaught() ? tc.Exception()
                                                          : exception);
        return plugin_error(msg, { msg });
    }
    case Outcome::ok:
        if (!meta_json.empty()) {
            break;
        }
        [[fallthrough]];
    default:
        *outcome = Outcome::internal;
        log(Level::error, "LOAD: plugin module failed without an exception");
        return error_reply("internal", kInternalMessage);
    }

    std::string exports = "[";
    for (size_t i = 0; i < paths.size(); i++) {
        exports += (i > 0 ? "," : "") + json_string(paths[i]);
    }
    exports += "]";

    llmgw_buf_t normalized { nullptr, 0 }, errors { nullptr, 0 };
    int rc = llmgw_manifest_validate(meta_json.data(), meta_json.size(),
                                     exports.data(), exports.size(),
                                     &normalized, &errors);

    if (rc != 0) {
        json_t *arr = errors.data != nullptr
                      ? json_loadb(errors.data, errors.len, 0, nullptr)
                      : nullptr;
        std::vector<std::string> list;
        size_t i;
        json_t *e;

        json_array_foreach(arr, i, e) {
            if (json_is_string(e)) {
                list.emplace_back(json_string_value(e), json_string_length(e));
            }
        }
        json_decref(arr);
        llmgw_buf_free(&normalized);
        llmgw_buf_free(&errors);

        if (list.empty()) {
            list.push_back("the manifest is not valid");
        }

        std::string msg = "invalid manifest: " + list[0];
        if (list.size() > 1) {
            msg += " (and " + std::to_string(list.size() - 1) + " more)";
        }
        *outcome = Outcome::plugin;
        return plugin_error(msg, list);
    }

    if (normalized.data == nullptr) {
        llmgw_buf_free(&errors);
        *outcome = Outcome::internal;
        log(Level::error, "LOAD: manifest validator returned no manifest");
        return error_reply("internal", kInternalMessage);
    }

    p.manifest.assign(normalized.data, normalized.len);
    p.exports = exports;
    llmgw_buf_free(&normalized);
    llmgw_buf_free(&errors);

    p.context.Reset(iso, ctx);
    p.module.Reset(iso, module);
    p.serialize.Reset(iso, serialize);

    std::string reply = load_ok_reply(sha, p.manifest, p.exports);
    remember(std::move(p));
    return reply;
}

std::string
Runtime::call(const CallRequest &req, Outcome *outcome)
{
    std::string sha = req.sha;

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
            std::string msg = "capability " + json_string(cap)
                              + " is not supported by this host";
            return plugin_error(msg, { msg });
        }
    }

    lru_.splice(lru_.begin(), lru_, it->second);
    Plugin &p = *it->second;

    if (p.hooks.find(req.hook) == p.hooks.end()) {
        *outcome = Outcome::plugin;
        std::string msg = "the plugin does not export "
                          + clean_plugin_message(req.hook);
        return plugin_error(msg, { msg });
    }

    std::string reply = call_in_isolate(p, req, outcome);
    replace_engine_if_needed();
    return reply;
}

std::string
Runtime::call_in_isolate(Plugin &p, const CallRequest &req, Outcome *outcome)
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
    std::string fail, json;
    bool fired;

    {
        DeadlineScope deadline(watchdog_, iso, std::chrono::milliseconds(budget));
        auto run = [&]() {
            Local<Value> args, result, text;

            if (!v8::JSON::Parse(ctx, v8str(iso, req.args_json)).ToLocal(&args)
                || !args->IsArray() || !deep_freeze(ctx, args))
            {
                return;
            }

            {
                Local<v8::Array> a = args.As<v8::Array>();
                std::vector<Local<Value>> argv(a->Length());
                for (uint32_t i = 0; i < a->Length(); i++) {
                    if (!a->Get(ctx, i).ToLocal(&argv[i])) {
                        return;
                    }
                }

                if (!hook.fn.Get(iso)->Call(ctx, hook.receiver.Get(iso),
                                            static_cast<int>(argv.size()),
                                            argv.data()).ToLocal(&result))
                {
                    return;
                }
            }

            iso->PerformMicrotaskCheckpoint();
            if (tc.HasCaught() || tc.HasTerminated()) {
                return;
            }

            if (result->IsUndefined()) {
                fail = req.hook + " returned undefined";
                return;
            }

            {
                Local<Value> argv[] = { result, v8str(iso, req.hook + " returned") };
                if (!p.serialize.Get(iso)->Call(ctx, v8::Undefined(iso), 2, argv)
                         .ToLocal(&text))
                {
                    return;
                }
            }

            if (text->IsArray()) {
                Local<Value> m;
                if (text.As<v8::Array>()->Get(ctx, 0).ToLocal(&m)) {
                    fail = stdstr(iso, m);
                }
            } else if (text->IsString()) {
                json = stdstr(iso, text);
            } else {
                fail = req.hook + " returned a value that is not JSON";
            }
        };

        run();
        fired = deadline.disarm();
    }

    Outcome o = settle(fired, tc.HasCaught() || !fail.empty(),
                       tc.HasTerminated());
    *outcome = o;

    switch (o) {
    case Outcome::memory:
        return error_reply("memory", req.hook + " exceeded the heap limit of "
                           + std::to_string(limits_.heap_mb) + " MiB");
    case Outcome::timeout:
        return error_reply("timeout", req.hook + " did not finish within "
                           + std::to_string(budget) + " ms");
    case Outcome::plugin: {
        std::string msg = !fail.empty() ? clean_plugin_message(fail)
                          : exception_text(iso, ctx, tc.Message(),
                                           tc.Exception());
        return error_reply("plugin", msg);
    }
    case Outcome::ok:
        if (!json.empty()) {
            break;
        }
        [[fallthrough]];
    default:
        *outcome = Outcome::internal;
        log(Level::error, "CALL %s: failed without an exception",
            req.hook.c_str());
        return error_reply("internal", kInternalMessage);
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
