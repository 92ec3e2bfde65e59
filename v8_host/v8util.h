/*
 * Small conversions between V8 values and std::string used by the
 * utilities and the runtime.
 */

#ifndef V8HOST_V8UTIL_H
#define V8HOST_V8UTIL_H

#include <string>
#include <string_view>

#include <v8.h>

namespace v8host {

inline v8::Local<v8::String>
v8str(v8::Isolate *iso, std::string_view s)
{
    v8::Local<v8::String> out;

    if (!v8::String::NewFromUtf8(iso, s.data(), v8::NewStringType::kNormal,
                                 static_cast<int>(s.size())).ToLocal(&out))
    {
        out = v8::String::Empty(iso);
    }

    return out;
}

/* Primitives only: never runs plugin code (no toString of objects). */
inline std::string
stdstr(v8::Isolate *iso, v8::Local<v8::Value> v)
{
    v8::String::Utf8Value s(iso, v);
    return *s != nullptr ? std::string(*s, s.length()) : std::string();
}

inline void
throw_type_error(v8::Isolate *iso, std::string_view msg)
{
    iso->ThrowException(v8::Exception::TypeError(v8str(iso, msg)));
}

inline void
throw_range_error(v8::Isolate *iso, std::string_view msg)
{
    iso->ThrowException(v8::Exception::RangeError(v8str(iso, msg)));
}

}  // namespace v8host

#endif
