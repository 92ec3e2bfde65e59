/*
 * The frame header shared by nginx and v8_host.
 */

#include <cstdio>

#include "llmgw.h"


extern "C" void
llmgw_frame_encode(const llmgw_frame_t *f, uint8_t out[12])
{
    out[0] = f->version;
    out[1] = f->type;
    out[2] = 0;
    out[3] = 0;

    for (int i = 0; i < 4; i++) {
        out[4 + i] = static_cast<uint8_t>(f->request_id >> (24 - 8 * i));
        out[8 + i] = static_cast<uint8_t>(f->length >> (24 - 8 * i));
    }
}


extern "C" int
llmgw_frame_decode(const uint8_t in[12], size_t max_body, llmgw_frame_t *f,
    char *err, size_t errlen)
{
    f->version = in[0];
    f->type = in[1];
    f->request_id = 0;
    f->length = 0;

    for (int i = 0; i < 4; i++) {
        f->request_id = (f->request_id << 8) | in[4 + i];
        f->length = (f->length << 8) | in[8 + i];
    }

    if (f->version != LLMGW_FRAME_VERSION) {
        std::snprintf(err, errlen, "frame version %u, expected %u",
                      f->version, LLMGW_FRAME_VERSION);
        return -1;
    }

    uint8_t base = f->type & 0x7f;

    if (base < LLMGW_FRAME_LOAD || base > LLMGW_FRAME_STATUS) {
        std::snprintf(err, errlen, "unknown frame type %u", f->type);
        return -1;
    }

    if (f->length > max_body) {
        std::snprintf(err, errlen, "frame body of %u bytes is over the "
                      "limit of %zu", f->length, max_body);
        return -1;
    }

    return 0;
}
