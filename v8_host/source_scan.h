/*
 * Plugins are synchronous and self-contained: the contract rejects
 * `async`, `await`, `import` and dynamic `import()`.  A token scan finds
 * them outside strings, template literals, comments and regex literals.
 */

#ifndef V8HOST_SOURCE_SCAN_H
#define V8HOST_SOURCE_SCAN_H

#include <string>
#include <string_view>
#include <vector>

namespace v8host {

/*
 * Messages such as "plugins are synchronous: `await` is not allowed
 * (line 12)", in source order; at most max of them.
 */
std::vector<std::string> scan_forbidden(std::string_view src,
    size_t max = 10);

}  // namespace v8host

#endif
