/*
 * Bindings of the plugin utilities.  Errors are thrown as TypeErrors that
 * name the utility and the argument; no C++ exception reaches V8.
 */

#include <cctype>
#include <ctime>

#include "crypto_util.h"
#include "host_utils.h"
#include "json_clone.h"
#include "v8util.h"

namespace v8host {

namespace {

using v8::FunctionCallbackInfo;
using v8::Local;
using v8::Value;

const std::string_view kCapabilities[] = { kJsonCloneCapability,
                                           "submit-sse-delta@1" };

/* Strings, and numbers or booleans in their string form. */
bool
string_arg(const FunctionCallbackInfo<Value> &info, int i, const char *fn,
    const char *what, std::string *out)
{
    Local<Value> v = info[i];

    if (!v->IsString() && !v->IsNumber() && !v->IsBoolean()) {
        throw_type_error(info.GetIsolate(), std::string("utils.") + fn + ": "
                                            + what + " must be a string");
        return false;
    }

    *out = stdstr(info.GetIsolate(), v);
    return true;
}

void
ret_string(const FunctionCallbackInfo<Value> &info, std::string_view s)
{
    info.GetReturnValue().Set(v8str(info.GetIsolate(), s));
}

void
unix_now(const FunctionCallbackInfo<Value> &info)
{
    info.GetReturnValue().Set(static_cast<double>(time(nullptr)));
}

void
uuid(const FunctionCallbackInfo<Value> &info)
{
    ret_string(info, uuid4());
}

void
hmac(const FunctionCallbackInfo<Value> &info)
{
    std::string key, data;

    if (string_arg(info, 0, "hmacSHA256", "key", &key)
        && string_arg(info, 1, "hmacSHA256", "data", &data))
    {
        ret_string(info, hex(hmac_sha256(key, data)));
    }
}

void
b64(const FunctionCallbackInfo<Value> &info)
{
    std::string s;

    if (string_arg(info, 0, "base64", "the argument", &s)) {
        ret_string(info, base64(s));
    }
}

void
b64url(const FunctionCallbackInfo<Value> &info)
{
    std::string s;

    if (string_arg(info, 0, "base64URL", "the argument", &s)) {
        ret_string(info, base64url(s));
    }
}

void
b64url_decode(const FunctionCallbackInfo<Value> &info)
{
    std::string s, bytes;

    if (!string_arg(info, 0, "base64URLDecode", "the argument", &s)) {
        return;
    }

    if (!base64url_decode(s, &bytes)) {
        throw_type_error(info.GetIsolate(),
                         "utils.base64URLDecode: the argument is not "
                         "base64url");
        return;
    }

    if (!utf8_valid(bytes)) {
        throw_type_error(info.GetIsolate(),
                         "utils.base64URLDecode: the decoded bytes are not "
                         "UTF-8 text");
        return;
    }

    ret_string(info, bytes);
}

void
jwt(const FunctionCallbackInfo<Value> &info)
{
    v8::Isolate *iso = info.GetIsolate();
    Local<v8::Context> ctx = iso->GetCurrentContext();
    std::string secret;

    if (!info[0]->IsObject() || info[0]->IsArray() || info[0]->IsFunction()) {
        throw_type_error(iso, "utils.jwtSignHS256: claims must be an object");
        return;
    }
    if (!string_arg(info, 1, "jwtSignHS256", "secret", &secret)) {
        return;
    }

    Local<v8::String> claims;
    if (!v8::JSON::Stringify(ctx, info[0]).ToLocal(&claims)) {
        return;
    }

    ret_string(info, jwt_hs256(stdstr(iso, claims), secret));
}

void
has_capability(const FunctionCallbackInfo<Value> &info)
{
    bool yes = info[0]->IsString()
               && host_has_capability(stdstr(info.GetIsolate(), info[0]));
    info.GetReturnValue().Set(yes);
}

/* ---- volcSignV4 ---- */

/* opts[name] as a string: "" when absent and optional. */
bool
volc_field(Local<v8::Context> ctx, Local<v8::Object> opts, const char *name,
    bool required, std::string *out)
{
    v8::Isolate *iso = ctx->GetIsolate();
    Local<Value> v;

    if (!opts->Get(ctx, v8str(iso, name)).ToLocal(&v)) {
        return false;
    }

    if (v->IsUndefined() || v->IsNull()) {
        if (required) {
            throw_type_error(iso, std::string("utils.volcSignV4: ") + name
                                  + " is required");
            return false;
        }
        out->clear();
        return true;
    }

    if (!v->IsString() && !v->IsNumber() && !v->IsBoolean()) {
        throw_type_error(iso, std::string("utils.volcSignV4: ") + name
                              + " must be a string");
        return false;
    }

    *out = stdstr(iso, v);
    return true;
}

/* A header or query value: a primitive, or an array of primitives. */
bool
volc_values(Local<v8::Context> ctx, Local<Value> v, const std::string &name,
    std::vector<std::string> *out)
{
    v8::Isolate *iso = ctx->GetIsolate();

    if (v->IsUndefined() || v->IsNull()) {
        return true;
    }

    auto primitive = [&](Local<Value> x) {
        if (!x->IsString() && !x->IsNumber() && !x->IsBoolean()) {
            throw_type_error(iso, "utils.volcSignV4: " + name
                                  + " must be a string or an array of strings");
            return false;
        }
        out->push_back(stdstr(iso, x));
        return true;
    };

    if (!v->IsArray()) {
        return primitive(v);
    }

    /* one level only: an array inside is refused, not walked */
    Local<v8::Array> a = v.As<v8::Array>();
    if (a->Length() > 1000) {
        throw_type_error(iso, "utils.volcSignV4: " + name
                              + " has more than 1000 values");
        return false;
    }
    for (uint32_t i = 0; i < a->Length(); i++) {
        Local<Value> item;
        if (!a->Get(ctx, i).ToLocal(&item)) {
            return false;
        }
        if (item->IsUndefined() || item->IsNull()) {
            continue;
        }
        if (!primitive(item)) {
            return false;
        }
    }
    return true;
}

/* Calls fn(key, values) for each own enumerable key of opts[field]. */
template <typename Fn>
bool
volc_each(Local<v8::Context> ctx, Local<v8::Object> opts, const char *field,
    Fn fn)
{
    v8::Isolate *iso = ctx->GetIsolate();
    Local<Value> v;
    Local<v8::Array> keys;

    if (!opts->Get(ctx, v8str(iso, field)).ToLocal(&v)) {
        return false;
    }
    if (v->IsUndefined() || v->IsNull()) {
        return true;
    }
    if (!v->IsObject() || v->IsArray()) {
        throw_type_error(iso, std::string("utils.volcSignV4: ") + field
                              + " must be an object");
        return false;
    }

    Local<v8::Object> o = v.As<v8::Object>();
    auto filter = static_cast<v8::PropertyFilter>(
        v8::ONLY_ENUMERABLE | v8::SKIP_SYMBOLS);

    if (!o->GetOwnPropertyNames(ctx, filter,
                                v8::KeyConversionMode::kConvertToString)
             .ToLocal(&keys))
    {
        return false;
    }

    for (uint32_t i = 0; i < keys->Length(); i++) {
        Local<Value> key, item;
        std::vector<std::string> values;

        if (!keys->Get(ctx, i).ToLocal(&key) || !o->Get(ctx, key).ToLocal(&item)) {
            return false;
        }

        std::string name = stdstr(iso, key);
        if (!volc_values(ctx, item, std::string(field) + "." + name, &values)) {
            return false;
        }
        fn(name, values);
    }

    return true;
}

std::string
lower(std::string s)
{
    for (char &c : s) {
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return s;
}

void
volc_sign(const FunctionCallbackInfo<Value> &info)
{
    v8::Isolate *iso = info.GetIsolate();
    Local<v8::Context> ctx = iso->GetCurrentContext();
    VolcRequest r;
    bool have_host = false;

    if (!info[0]->IsObject() || info[0]->IsArray()) {
        throw_type_error(iso, "utils.volcSignV4: the argument must be an "
                              "object");
        return;
    }
    Local<v8::Object> opts = info[0].As<v8::Object>();

    if (!volc_field(ctx, opts, "method", true, &r.method)
        || !volc_field(ctx, opts, "path", false, &r.path)
        || !volc_field(ctx, opts, "body", false, &r.body)
        || !volc_field(ctx, opts, "accessKeyId", true, &r.access_key_id)
        || !volc_field(ctx, opts, "secretAccessKey", true,
                       &r.secret_access_key)
        || !volc_field(ctx, opts, "region", true, &r.region)
        || !volc_field(ctx, opts, "service", true, &r.service)
        || !volc_field(ctx, opts, "date", false, &r.x_date))
    {
        return;
    }

    for (char &c : r.method) {
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }

    if (r.x_date.empty()) {
        r.x_date = x_date_now();
    } else if (!is_x_date(r.x_date)) {
        throw_type_error(iso, "utils.volcSignV4: date must look like "
                              "20240102T150405Z");
        return;
    }

    bool ok = volc_each(ctx, opts, "query",
        [&](const std::string &k, const std::vector<std::string> &vals) {
            for (const std::string &v : vals) {
                r.query.emplace_back(k, v);
            }
        });

    ok = ok && volc_each(ctx, opts, "headers",
        [&](const std::string &k, const std::vector<std::string> &vals) {
            std::string joined;
            for (const std::string &v : vals) {
                joined += (joined.empty() ? "" : ",") + v;
            }
            std::string name = lower(k);
            if (name == "host") {
                r.host = joined;
                have_host = true;
            } else if (name == "content-type") {
                r.content_type = joined;
                r.has_content_type = true;
            }
        });

    if (!ok) {
        return;
    }

    if (!have_host || r.host.empty()) {
        throw_type_error(iso, "utils.volcSignV4: headers.Host is required");
        return;
    }

    VolcSigned s = volc_sign_v4(r);
    Local<v8::Object> out = v8::Object::New(iso);

    if (out->CreateDataProperty(ctx, v8str(iso, "Authorization"),
                                v8str(iso, s.authorization)).IsNothing()
        || out->CreateDataProperty(ctx, v8str(iso, "X-Date"),
                                   v8str(iso, s.x_date)).IsNothing()
        || out->CreateDataProperty(ctx, v8str(iso, "X-Content-Sha256"),
                                   v8str(iso, s.content_sha256)).IsNothing())
    {
        return;
    }

    info.GetReturnValue().Set(out);
}

bool
set_fn(Local<v8::Context> ctx, Local<v8::Object> target, const char *name,
    v8::FunctionCallback cb, Local<Value> data = Local<Value>())
{
    v8::Isolate *iso = ctx->GetIsolate();
    Local<v8::Function> fn;

    /* kThrow: `new utils.uuid()` is a TypeError, as for builtins. */
    if (!v8::Function::New(ctx, cb, data, 0,
                           v8::ConstructorBehavior::kThrow).ToLocal(&fn))
    {
        return false;
    }
    fn->SetName(v8str(iso, name));

    return target->CreateDataProperty(ctx, v8str(iso, name), fn).FromMaybe(false);
}

/* utils.json: { clone }, frozen. */
bool
install_json(Local<v8::Context> ctx, Local<v8::Object> utils)
{
    v8::Isolate *iso = ctx->GetIsolate();
    Local<v8::Object> json = v8::Object::New(iso);

    /* The pristine prototypes, captured before plugin code can touch the
       globals: what json.clone calls a plain object or array. */
    Local<v8::Array> protos = v8::Array::New(iso, 2);
    if (protos->Set(ctx, 0, v8::Object::New(iso)->GetPrototype()).IsNothing()
        || protos->Set(ctx, 1, v8::Array::New(iso)->GetPrototype()).IsNothing())
    {
        return false;
    }

    return set_fn(ctx, json, "clone", json_clone_callback, protos)
           && utils->CreateDataProperty(ctx, v8str(iso, "json"), json)
                  .FromMaybe(false)
           && json->SetIntegrityLevel(ctx, v8::IntegrityLevel::kFrozen)
                  .FromMaybe(false);
}

}  // namespace

bool
host_has_capability(std::string_view name)
{
    for (std::string_view c : kCapabilities) {
        if (name == c) {
            return true;
        }
    }
    return false;
}

bool
install_utils(Local<v8::Context> ctx, bool json_clone)
{
    v8::Isolate *iso = ctx->GetIsolate();
    Local<v8::Object> utils = v8::Object::New(iso);

    bool ok = set_fn(ctx, utils, "unixNow", unix_now)
              && set_fn(ctx, utils, "uuid", uuid)
              && set_fn(ctx, utils, "hmacSHA256", hmac)
              && set_fn(ctx, utils, "jwtSignHS256", jwt)
              && set_fn(ctx, utils, "base64", b64)
              && set_fn(ctx, utils, "base64URL", b64url)
              && set_fn(ctx, utils, "base64URLDecode", b64url_decode)
              && set_fn(ctx, utils, "volcSignV4", volc_sign)
              && set_fn(ctx, utils, "hasCapability", has_capability)
              && (!json_clone || install_json(ctx, utils))
              && utils->SetIntegrityLevel(ctx, v8::IntegrityLevel::kFrozen)
                     .FromMaybe(false);

    auto attrs = static_cast<v8::PropertyAttribute>(v8::ReadOnly
                                                    | v8::DontDelete);

    return ok && ctx->Global()->DefineOwnProperty(ctx, v8str(iso, "utils"),
                                                  utils, attrs)
                     .FromMaybe(false);
}

}  // namespace v8host
