/*
 * Format conversion between what a client speaks (OpenAI chat, Anthropic
 * messages, rerank) and what a channel speaks (OpenAI, Anthropic, Gemini,
 * Cohere, Jina): request bodies, answers, streams and error bodies.
 *
 * The C++ part is for the core; the extern "C" part at the end exists so
 * that CMocka tests written in C reach the same code.
 */

#ifndef LLMGW_CONVERT_H
#define LLMGW_CONVERT_H

#include "llmgw.h"

#ifdef __cplusplus

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "internal.h"

namespace llmgw {

/*
 * True when convert_request() turns the client's format into the channel's:
 * chat -> 14 and 24, messages -> 1.  Pairs that need no conversion (chat ->
 * 1, messages -> 14) are not conversions and answer false.
 */
bool can_convert(llmgw_endpoint_e from, int to_type);

/*
 * The upstream body for a channel of to_type, built from the client's body.
 * The model is upstream_model (Gemini takes it in the URL instead).  On
 * false, err names what could not be converted and where.
 */
bool convert_request(llmgw_endpoint_e from, int to_type, const json_t *in,
    std::string_view upstream_model, Json &out, std::string &err);

/* A non-stream upstream answer of from_type in the client's format. */
bool convert_response(int from_type, llmgw_endpoint_e to, const json_t *in,
    std::string_view client_model, Json &out, std::string &err);

/*
 * Puts in a converted answer (in the client's format: chat or messages)
 * the usage the gateway bills for it, so that it says what the ledger row
 * will, also when the upstream reported no usage.
 */
void show_billed_usage(llmgw_endpoint_e client, json_t *answer,
    const llmgw_usage_t &billed);

class StreamImpl;

/*
 * Re-frames an upstream stream for the client, one upstream SSE event at a
 * time: 14 -> chat, 24 -> chat, 1 -> messages.
 */
class StreamConverter {
public:
    StreamConverter(int from_type, llmgw_endpoint_e to,
                    std::string client_model);
    ~StreamConverter();

    StreamConverter(const StreamConverter &) = delete;
    StreamConverter &operator=(const StreamConverter &) = delete;

    /* False for a pair that has no conversion (or no memory). */
    bool usable() const;

    /*
     * Chat clients get the trailing usage chunk ({"choices":[],"usage":..})
     * unless this is turned off (the client did not ask for usage).
     */
    void include_usage(bool on);

    /* Errors the converter writes end with "(request id: <id>)". */
    void request_id(std::string id);

    /*
     * One upstream event in; appends the SSE text for the client (possibly
     * nothing).  False when the event was not understood (its data is not
     * JSON): it was dropped and the stream can go on.
     */
    bool event(std::string_view event_name, std::string_view data,
               std::string &out);

    /* At upstream end: what must still be sent ([DONE], message_stop). */
    void finish(std::string &out);

    /*
     * Where the counts the gateway bills come from (read when the usage
     * chunk of a chat client goes out, at the stream's end): that chunk
     * then says what the ledger row will, also when the upstream reported
     * nothing or only a partial count.
     */
    void billed_usage(std::function<llmgw_usage_t()> source);

    /* Whether finish() found the stream cut short (it ended before the
       upstream said why) and told the client so. */
    bool cut() const;

private:
    std::unique_ptr<StreamImpl> impl_;
};

/*
 * An answer the upstream sent whole although the client asked for a stream
 * (it ignored "stream"), as the stream the client expects: chat chunks and
 * [DONE], Messages events, or one Gemini event.  The answer is already in
 * the client's format.
 */
std::string stream_of_answer(llmgw_endpoint_e client, const json_t *answer,
    bool include_usage);

/*
 * An error body in the client's format.  message already ends with the
 * request id.  Messages clients get Anthropic's shape
 * {"type":"error","error":{"type","message"}}, everyone else
 * {"error":{"message","type","code"}}.
 */
std::string convert_error(llmgw_endpoint_e client, int status,
    std::string_view message, std::string_view type, std::string_view code);

/*
 * Validates a client rerank body and builds the upstream one for a channel
 * of to_type (34 Cohere, 38 Jina, 1 OpenAI-compatible rerank servers).
 */
bool rerank_request(int to_type, const json_t *in,
    std::string_view upstream_model, Json &out, std::string &err);

/*
 * The client's rerank answer {id, results, meta} from an upstream answer;
 * client_request decides top_n and return_documents.
 */
bool rerank_response(int from_type, const json_t *upstream,
    const json_t *client_request, Json &out, std::string &err);

/*
 * The count a rerank answer is billed by (usage.cpp): one of its
 * meta.billed_units (search_units, else input_tokens), else its usage
 * tokens (total_tokens, else prompt_tokens).  A value that is no count
 * (negative, fractional, past 2^40, a string) is not taken; false when
 * none is, and the answer is billed by the request's estimate.  The meta a
 * client is shown says that count and nothing else.
 */
struct RerankCount {
    bool         billed_units;  /* meta.billed_units, else meta.tokens */
    const char  *name;          /* search_units or input_tokens */
    int64_t      count;
};

class JsonView;

bool rerank_count(const JsonView &upstream, RerankCount &c);

} /* namespace llmgw */

extern "C" {
#endif /* __cplusplus */


/*
 * Test entry points.  Each returns the output text, or "ERROR: <message>"
 * when the conversion refused; release with llmgw_buf_free().
 */
llmgw_buf_t llmgw_test_convert_request(int from_ep, int to_type,
    const char *json, const char *model);
llmgw_buf_t llmgw_test_convert_response(int from_type, int to_ep,
    const char *json, const char *model);
/* sse_text is a whole upstream stream; the output includes finish(). */
llmgw_buf_t llmgw_test_convert_stream(int from_type, int to_ep,
    const char *sse_text, const char *model);
llmgw_buf_t llmgw_test_convert_error(int client_ep, int status,
    const char *message, const char *type, const char *code);
llmgw_buf_t llmgw_test_rerank_request(int to_type, const char *json,
    const char *model);
llmgw_buf_t llmgw_test_rerank_response(int from_type,
    const char *upstream_json, const char *client_json);


#ifdef __cplusplus
}
#endif

#endif /* LLMGW_CONVERT_H */
