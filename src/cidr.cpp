/*
 * IP address lists: a key's allow list, and which addresses a content
 * fetch a plugin chose may reach.  Every entry and every address is held in
 * one 16-byte form, IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d, prefix + 96),
 * so that a dual-stack listener reporting ::ffff:10.0.0.1 matches an entry
 * written as 10.0.0.0/8 with one comparison path, and a URL that spells
 * 127.0.0.1 as ::ffff:127.0.0.1 is still loopback.
 */

#include <arpa/inet.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "internal.h"

namespace {

struct Net {
    uint8_t   addr[16];     /* masked to the prefix */
    unsigned  prefix;       /* 0..128 */
};

/* Entries are echoed in errors; a pasted blob must not flood the message. */
constexpr size_t kEntryShown = 64;

const uint8_t kMappedPrefix[12] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff
};


void
map_ipv4(const uint8_t *v4, uint8_t *v6)
{
    std::memcpy(v6, kMappedPrefix, sizeof(kMappedPrefix));
    std::memcpy(v6 + 12, v4, 4);
}


void
mask(uint8_t *addr, unsigned prefix)
{
    for (unsigned i = 0; i < 16; i++) {
        unsigned bits = prefix > 8 * i ? prefix - 8 * i : 0;

        if (bits < 8) {
            addr[i] &= static_cast<uint8_t>(0xff00u >> bits);
        }
    }
}


/* "/N" with N decimal and at most max; anything else is a malformed entry. */
bool
parse_prefix(std::string_view s, unsigned max, unsigned *prefix)
{
    if (s.empty() || s.size() > 3) {
        return false;
    }

    unsigned n = 0;

    for (char c : s) {
        if (c < '0' || c > '9') {
            return false;
        }
        n = n * 10 + static_cast<unsigned>(c - '0');
    }

    if (n > max) {
        return false;
    }

    *prefix = n;
    return true;
}


bool
parse_entry(std::string_view text, Net *net)
{
    size_t slash = text.find('/');
    std::string host(text.substr(0, slash));
    uint8_t v4[4];
    unsigned max;

    /* inet_pton() wants a C string; an embedded NUL would cut it short */
    if (host.find('\0') != std::string::npos) {
        return false;
    }

    if (inet_pton(AF_INET, host.c_str(), v4) == 1) {
        map_ipv4(v4, net->addr);
        max = 32;

    } else if (inet_pton(AF_INET6, host.c_str(), net->addr) == 1) {
        max = 128;

    } else {
        return false;
    }

    net->prefix = max;

    if (slash != std::string_view::npos
        && !parse_prefix(text.substr(slash + 1), max, &net->prefix))
    {
        return false;
    }

    if (max == 32) {
        net->prefix += 96;
    }

    /* "10.1.2.3/8" is what people write; it means 10.0.0.0/8 */
    mask(net->addr, net->prefix);

    return true;
}



void
set_err(char *err, size_t errlen, const char *msg, size_t index,
    std::string_view entry)
{
    if (err == nullptr || errlen == 0) {
        return;
    }

    bool cut = entry.size() > kEntryShown;
    auto shown = static_cast<int>(cut ? kEntryShown : entry.size());

    std::snprintf(err, errlen, "allow_ips[%zu]: \"%.*s%s\" %s", index, shown,
                  entry.data(), cut ? "..." : "", msg);
}


void
set_err(char *err, size_t errlen, const char *msg)
{
    if (err != nullptr && errlen > 0) {
        std::snprintf(err, errlen, "allow_ips: %s", msg);
    }
}


bool
in_net(const Net &net, const uint8_t *addr)
{
    unsigned full = net.prefix / 8;
    unsigned bits = net.prefix % 8;

    if (std::memcmp(net.addr, addr, full) != 0) {
        return false;
    }

    if (bits == 0) {
        return true;
    }

    auto m = static_cast<uint8_t>(0xff00u >> bits);

    return (addr[full] & m) == net.addr[full];
}

/* addr (4 or 16 bytes of family) in the 16-byte form; false: no such. */
bool
to16(int family, const uint8_t *addr, uint8_t *a)
{
    if (addr == nullptr) {
        return false;
    }

    if (family == AF_INET) {
        map_ipv4(addr, a);
        return true;
    }

    if (family == AF_INET6) {
        std::memcpy(a, addr, 16);
        return true;
    }

    return false;
}


bool
in_any(const std::vector<Net> &nets, const uint8_t *a)
{
    for (const Net &net : nets) {
        if (in_net(net, a)) {
            return true;
        }
    }

    return false;
}


/*
 * Not a public unicast address: this host, private and shared networks,
 * link-local (cloud metadata at 169.254.169.254), multicast, reserved,
 * benchmarking and documentation ranges (IANA special-purpose registries).
 * IPv4-mapped addresses fall under the IPv4 entries by the 16-byte form.
 */
const char *const kSpecial[] = {
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8",
    "169.254.0.0/16", "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24",
    "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
    "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    "::/96",    /* unspecified, loopback, IPv4-compatible */
    "64:ff9b:1::/48", "100::/64", "2001::/32", "2001:2::/48",
    "2001:db8::/32", "3fff::/20", "fc00::/7", "fe80::/10", "fec0::/10",
    "ff00::/8",
};


const std::vector<Net> &
special_nets()
{
    static const std::vector<Net> nets = [] {
        std::vector<Net> v;

        for (const char *e : kSpecial) {
            Net net;

            if (parse_entry(e, &net)) {
                v.push_back(net);
            }
        }

        return v;
    }();

    return nets;
}


/* NAT64 (64:ff9b::/96) and 6to4 (2002::/16) lead to the IPv4 inside. */
bool
embedded_ipv4(const uint8_t *a, uint8_t *inner)
{
    static const uint8_t nat64[12] = { 0, 0x64, 0xff, 0x9b };

    if (std::memcmp(a, nat64, sizeof(nat64)) == 0) {
        map_ipv4(a + 12, inner);
        return true;
    }

    if (a[0] == 0x20 && a[1] == 0x02) {
        map_ipv4(a + 2, inner);
        return true;
    }

    return false;
}


bool
special(const uint8_t *a)
{
    uint8_t inner[16];

    return in_any(special_nets(), a)
           || (embedded_ipv4(a, inner) && in_any(special_nets(), inner));
}

} // namespace


struct llmgw_iplist_s {
    std::vector<Net>  nets;
};


namespace {

std::unique_ptr<llmgw_iplist_t>
parse_list(const json_t *array, char *err, size_t errlen)
{
    auto list = std::make_unique<llmgw_iplist_t>();
    size_t i;
    const json_t *v;

    json_array_foreach(array, i, v) {
        if (!json_is_string(v)) {
            std::snprintf(err, errlen, "allow_ips[%zu]: not a string", i);
            return nullptr;
        }

        std::string_view raw(json_string_value(v), json_string_length(v));
        Net net;

        if (!parse_entry(llmgw::trim(raw), &net)) {
            set_err(err, errlen, "is not an IP address or CIDR", i, raw);
            return nullptr;
        }

        list->nets.push_back(net);
    }

    return list;
}

} // namespace


extern "C" llmgw_iplist_t *
llmgw_iplist_parse(const char *json, size_t len, char *err, size_t errlen)
{
    char scratch[1];

    /* parse_list() writes err unconditionally; give it somewhere to write */
    if (err == nullptr || errlen == 0) {
        err = scratch;
        errlen = sizeof(scratch);
    }

    try {
        llmgw::Json root = llmgw::json_parse(json ? json : "",
                                             json ? len : 0);

        if (!json_is_array(root.get())) {
            set_err(err, errlen, "not a JSON array of IP addresses or CIDRs");
            return nullptr;
        }

        return parse_list(root.get(), err, errlen).release();

    } catch (...) {
        set_err(err, errlen, "out of memory");
        return nullptr;
    }
}


extern "C" void
llmgw_iplist_free(llmgw_iplist_t *l)
{
    std::unique_ptr<llmgw_iplist_t> owned(l);
}


extern "C" llmgw_iplist_t *
llmgw_iplist_from(const llmgw_str_t *words, size_t n, size_t *bad)
{
    *bad = n;

    try {
        auto list = std::make_unique<llmgw_iplist_t>();

        for (size_t i = 0; i < n; i++) {
            Net net;

            if (!parse_entry(llmgw::trim(std::string_view(words[i].data,
                                                          words[i].len)),
                             &net))
            {
                *bad = i;
                return nullptr;
            }

            list->nets.push_back(net);
        }

        return list.release();

    } catch (...) {
        return nullptr;
    }
}


/* No list, or an empty one, means the key is not restricted by address. */
extern "C" int
llmgw_iplist_match(const llmgw_iplist_t *l, int family, const uint8_t *addr)
{
    uint8_t a[16];

    if (l == nullptr || l->nets.empty()) {
        return 1;
    }

    return to16(family, addr, a) && in_any(l->nets, a);
}


/* Here no list means nothing special is allowed: the safe default. */
extern "C" int
llmgw_content_addr_ok(const llmgw_iplist_t *allow, int family,
    const uint8_t *addr)
{
    uint8_t a[16];

    if (!to16(family, addr, a)) {
        return 0;
    }

    return !special(a) || (allow != nullptr && in_any(allow->nets, a));
}
