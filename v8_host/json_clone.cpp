/*
 * json-clone@1.  A recursive copy (depth is capped at 32, so recursion is
 * bounded) that keeps the path for error messages, the open ancestors for
 * cycle detection, the node count and the exact JSON.stringify size in
 * UTF-8 bytes.  Errors: TypeError for a value that is not JSON, RangeError
 * for a limit.
 */

#include <cmath>
#include <vector>

#include "json_clone.h"
#include "json_text.h"
#include "v8util.h"

namespace v8host {

namespace {

using v8::Local;
using v8::Value;

/* UTF-8 bytes of JSON.stringify(s), quotes included. */
size_t
json_string_bytes(v8::Isolate *iso, Local<v8::String> s)
{
    v8::String::Value units(iso, s);
    const uint16_t *u = *units;
    size_t n = 2;

    for (int i = 0; i < units.length(); i++) {
        uint16_t c = u[i];

        if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n'
            || c == '\r' || c == '\t')
        {
            n += 2;
        } else if (c < 0x20) {
            n += 6;
        } else if (c < 0x80) {
            n += 1;
        } else if (c < 0x800) {
            n += 2;
        } else if (c >= 0xd800 && c <= 0xdbff && i + 1 < units.length()
                   && u[i + 1] >= 0xdc00 && u[i + 1] <= 0xdfff)
        {
            n += 4;
            i++;
        } else if (c >= 0xd800 && c <= 0xdfff) {
            n += 6;             /* a lone surrogate is written as \udXXX */
        } else {
            n += 3;
        }
    }

    return n;
}

class Cloner {
public:
    Cloner(v8::Isolate *iso, Local<v8::Context> ctx, Local<Value> obj_proto,
           Local<Value> arr_proto)
        : iso_(iso), ctx_(ctx), obj_proto_(obj_proto), arr_proto_(arr_proto)
    {}

    /* Empty with an exception pending on failure. */
    v8::MaybeLocal<Value> copy(Local<Value> v, int depth);

private:
    bool fail_type(const std::string &what);
    bool fail_range(const std::string &what);
    bool add_bytes(size_t n);
    std::string where() const;
    std::string describe_object(Local<v8::Object> o) const;

    v8::MaybeLocal<Value> copy_array(Local<v8::Array> a, int depth);
    v8::MaybeLocal<Value> copy_object(Local<v8::Object> o, int depth);

    v8::Isolate                    *iso_;
    Local<v8::Context>              ctx_;
    Local<Value>                    obj_proto_;
    Local<Value>                    arr_proto_;
    std::vector<std::string>        path_;
    std::vector<Local<v8::Object>>  open_;
    size_t                          nodes_ = 0;
    size_t                          bytes_ = 0;
};

std::string
Cloner::where() const
{
    std::string p;

    for (const std::string &seg : path_) {
        p += seg;
    }

    return p.empty() ? std::string() : " at " + p;
}

bool
Cloner::fail_type(const std::string &what)
{
    throw_type_error(iso_, "utils.json.clone: " + what + where()
                           + " is not JSON");
    return false;
}

bool
Cloner::fail_range(const std::string &what)
{
    throw_range_error(iso_, "utils.json.clone: " + what);
    return false;
}

bool
Cloner::add_bytes(size_t n)
{
    bytes_ += n;

    if (bytes_ > kCloneMaxBytes) {
        return fail_range("the value encodes to more than "
                          + std::to_string(kCloneMaxBytes) + " bytes");
    }

    return true;
}

std::string
Cloner::describe_object(Local<v8::Object> o) const
{
    std::string name = stdstr(iso_, o->GetConstructorName());

    if (name.empty() || name == "Object") {
        return "an object with a custom prototype";
    }

    bool vowel = std::string("AEIOU").find(name[0]) != std::string::npos;
    return std::string(vowel ? "an " : "a ") + name;
}

v8::MaybeLocal<Value>
Cloner::copy(Local<Value> v, int depth)
{
    if (++nodes_ > kCloneMaxNodes) {
        fail_range("the value has more than " + std::to_string(kCloneMaxNodes)
                   + " nodes");
        return {};
    }

    if (depth > kCloneMaxDepth) {
        fail_range("the value is nested more than "
                   + std::to_string(kCloneMaxDepth) + " levels deep"
                   + where());
        return {};
    }

    if (v->IsNull() || v->IsBoolean()) {
        return add_bytes(v->IsTrue() ? 4 : v->IsFalse() ? 5 : 4)
               ? v8::MaybeLocal<Value>(v) : v8::MaybeLocal<Value>();
    }

    if (v->IsString()) {
        Local<v8::String> s = v.As<v8::String>();
        /* Length() is a lower bound: refuse a huge string before
           measuring it. */
        if (!add_bytes(static_cast<size_t>(s->Length()) + 2)) {
            return {};
        }
        bytes_ -= static_cast<size_t>(s->Length()) + 2;
        return add_bytes(json_string_bytes(iso_, s))
               ? v8::MaybeLocal<Value>(v) : v8::MaybeLocal<Value>();
    }

    if (v->IsNumber()) {
        double d = v.As<v8::Number>()->Value();
        if (!std::isfinite(d)) {
            fail_type(std::isnan(d) ? "NaN" : "an infinite number");
            return {};
        }
        Local<v8::String> s;
        if (!v->ToString(ctx_).ToLocal(&s)) {
            return {};
        }
        return add_bytes(static_cast<size_t>(s->Length()))
               ? v8::MaybeLocal<Value>(v) : v8::MaybeLocal<Value>();
    }

    if (v->IsUndefined()) {
        fail_type("undefined");
        return {};
    }
    if (v->IsFunction()) {
        fail_type("a function");
        return {};
    }
    if (v->IsSymbol()) {
        fail_type("a symbol");
        return {};
    }
    if (v->IsBigInt()) {
        fail_type("a BigInt");
        return {};
    }
    if (!v->IsObject() || v->IsProxy()) {
        fail_type(v->IsProxy() ? "a Proxy" : "a value of an unknown type");
        return {};
    }

    Local<v8::Object> o = v.As<v8::Object>();

    for (Local<v8::Object> a : open_) {
        if (a->StrictEquals(o)) {
            fail_type("a cycle");
            return {};
        }
    }

    Local<Value> proto = o->GetPrototype();

    if (o->IsArray() && proto->StrictEquals(arr_proto_)) {
        return copy_array(o.As<v8::Array>(), depth);
    }

    bool exotic = o->IsArray() || o->IsDate() || o->IsRegExp() || o->IsMap()
                  || o->IsSet() || o->IsWeakMap() || o->IsWeakSet()
                  || o->IsPromise() || o->IsArrayBuffer()
                  || o->IsArrayBufferView() || o->IsSharedArrayBuffer()
                  || o->IsStringObject() || o->IsNumberObject()
                  || o->IsBooleanObject() || o->IsBigIntObject()
                  || o->IsSymbolObject() || o->IsNativeError()
                  || o->IsModuleNamespaceObject() || o->IsGeneratorObject()
                  || o->IsMapIterator() || o->IsSetIterator();

    if (exotic || !(proto->StrictEquals(obj_proto_) || proto->IsNull())) {
        fail_type(describe_object(o));
        return {};
    }

    return copy_object(o, depth);
}

v8::MaybeLocal<Value>
Cloner::copy_array(Local<v8::Array> a, int depth)
{
    uint32_t len = a->Length();

    if (len > kCloneMaxNodes) {
        fail_range("the value has more than " + std::to_string(kCloneMaxNodes)
                   + " nodes");
        return {};
    }
    if (!add_bytes(len > 0 ? len + 1 : 2)) {      /* [ ] and commas */
        return {};
    }

    Local<v8::Array> out = v8::Array::New(iso_, static_cast<int>(len));
    open_.push_back(a);

    for (uint32_t i = 0; i < len; i++) {
        path_.push_back("[" + std::to_string(i) + "]");

        bool own;
        if (!a->HasRealIndexedProperty(ctx_, i).To(&own)) {
            return {};
        }
        if (!own) {
            fail_type("a hole in a sparse array");
            return {};
        }

        Local<Value> item, copied;
        if (!a->Get(ctx_, i).ToLocal(&item)
            || !copy(item, depth + 1).ToLocal(&copied)
            || out->CreateDataProperty(ctx_, i, copied).IsNothing())
        {
            return {};
        }

        path_.pop_back();
    }

    open_.pop_back();
    return out;
}

v8::MaybeLocal<Value>
Cloner::copy_object(Local<v8::Object> o, int depth)
{
    Local<v8::Array> keys;
    auto filter = static_cast<v8::PropertyFilter>(
        v8::ONLY_ENUMERABLE | v8::SKIP_SYMBOLS);

    if (!o->GetOwnPropertyNames(ctx_, filter,
                                v8::KeyConversionMode::kConvertToString)
             .ToLocal(&keys))
    {
        return {};
    }

    uint32_t n = keys->Length();
    if (!add_bytes(n > 0 ? n + 1 : 2)) {          /* { } and commas */
        return {};
    }

    Local<v8::Object> out = v8::Object::New(iso_);
    open_.push_back(o);

    for (uint32_t i = 0; i < n; i++) {
        Local<Value> key, item, copied;

        if (!keys->Get(ctx_, i).ToLocal(&key)) {
            return {};
        }
        Local<v8::String> name = key.As<v8::String>();

        /* "key": */
        if (!add_bytes(json_string_bytes(iso_, name) + 1)) {
            return {};
        }

        path_.push_back(path_key(stdstr(iso_, name)));

        /* CreateDataProperty, not Set: "__proto__" becomes an own key of
           the copy instead of changing its prototype. */
        if (!o->Get(ctx_, name).ToLocal(&item)
            || !copy(item, depth + 1).ToLocal(&copied)
            || out->CreateDataProperty(ctx_, name, copied).IsNothing())
        {
            return {};
        }

        path_.pop_back();
    }

    open_.pop_back();
    return out;
}

}  // namespace

void
json_clone_callback(const v8::FunctionCallbackInfo<Value> &info)
{
    v8::Isolate *iso = info.GetIsolate();
    Local<v8::Context> ctx = iso->GetCurrentContext();
    Local<v8::Array> protos = info.Data().As<v8::Array>();
    Local<Value> obj_proto, arr_proto, out;

    if (!protos->Get(ctx, 0).ToLocal(&obj_proto)
        || !protos->Get(ctx, 1).ToLocal(&arr_proto))
    {
        return;
    }

    Cloner c(iso, ctx, obj_proto, arr_proto);

    if (c.copy(info[0], 0).ToLocal(&out)) {
        info.GetReturnValue().Set(out);
    }
}

}  // namespace v8host
