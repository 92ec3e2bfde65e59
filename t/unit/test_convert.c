/*
 * Format conversion: OpenAI chat <-> Anthropic messages, OpenAI chat ->
 * Gemini, their answers and streams, error bodies per client format, and
 * rerank requests and answers.
 *
 * JSON in this file is written with ' for " and ` for \" (a quote inside
 * a JSON string) so that the bodies stay readable.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "llmgw.h"
#include "convert.h"


#define MAX_EVENTS  32


typedef struct {
    char     name[64];
    json_t  *data;      /* NULL for [DONE] */
    int      done;
} ev_t;

typedef struct {
    ev_t  ev[MAX_EVENTS];
    int   n;
} evs_t;


/* ' -> ", ` -> \" */
static char *
unquote(const char *sq)
{
    size_t  n = strlen(sq);
    char   *out = malloc(2 * n + 1);
    char   *p = out;

    assert_non_null(out);

    for (size_t i = 0; i < n; i++) {
        if (sq[i] == '\'') {
            *p++ = '"';
        } else if (sq[i] == '`') {
            *p++ = '\\';
            *p++ = '"';
        } else {
            *p++ = sq[i];
        }
    }

    *p = '\0';
    return out;
}


/* Parses a successful output; fails the test on an "ERROR: " answer. */
static json_t *
take_json(llmgw_buf_t b)
{
    json_error_t  err;
    json_t       *j;

    assert_non_null(b.data);
    if (strncmp(b.data, "ERROR: ", 7) == 0) {
        fail_msg("unexpected refusal: %s", b.data);
    }

    j = json_loadb(b.data, b.len, 0, &err);
    if (j == NULL) {
        fail_msg("output is not JSON (%s): %s", err.text, b.data);
    }

    llmgw_buf_free(&b);
    return j;
}


static void
take_error(llmgw_buf_t b, const char *expected)
{
    assert_non_null(b.data);
    if (strncmp(b.data, "ERROR: ", 7) != 0) {
        fail_msg("expected a refusal, got: %s", b.data);
    }

    assert_string_equal(b.data + 7, expected);
    llmgw_buf_free(&b);
}


static json_t *
request(int from, int to, const char *sq)
{
    char        *body = unquote(sq);
    llmgw_buf_t  b = llmgw_test_convert_request(from, to, body, "up-model");

    free(body);
    return take_json(b);
}


static void
request_error(int from, int to, const char *sq, const char *expected)
{
    char        *body = unquote(sq);
    llmgw_buf_t  b = llmgw_test_convert_request(from, to, body, "up-model");

    free(body);
    take_error(b, expected);
}


static json_t *
response(int from, int to, const char *sq)
{
    char        *body = unquote(sq);
    llmgw_buf_t  b = llmgw_test_convert_response(from, to, body, "client-m");

    free(body);
    return take_json(b);
}


static json_t *
rerank_req(int to, const char *sq)
{
    char        *body = unquote(sq);
    llmgw_buf_t  b = llmgw_test_rerank_request(to, body, "up-rerank");

    free(body);
    return take_json(b);
}


static void
rerank_req_error(const char *sq, const char *expected)
{
    char        *body = unquote(sq);
    llmgw_buf_t  b = llmgw_test_rerank_request(34, body, "up-rerank");

    free(body);
    take_error(b, expected);
}


static json_t *
rerank_resp(int from, const char *up_sq, const char *client_sq)
{
    char        *up = unquote(up_sq);
    char        *client = unquote(client_sq);
    llmgw_buf_t  b = llmgw_test_rerank_response(from, up, client);

    free(up);
    free(client);
    return take_json(b);
}


static void
collect(void *arg, const llmgw_sse_event_t *e)
{
    evs_t         *evs = arg;
    ev_t          *ev;
    json_error_t   err;

    assert_true(evs->n < MAX_EVENTS);
    ev = &evs->ev[evs->n++];

    assert_true(e->event.len < sizeof(ev->name));
    memcpy(ev->name, e->event.data, e->event.len);
    ev->name[e->event.len] = '\0';

    if (e->data.len == 6 && memcmp(e->data.data, "[DONE]", 6) == 0) {
        ev->done = 1;
        ev->data = NULL;
        return;
    }

    ev->done = 0;
    ev->data = json_loadb(e->data.data, e->data.len, 0, &err);
    assert_non_null(ev->data);
}


/* Runs a whole upstream stream through the converter, events back. */
static void
stream(int from, int to, const char *sq, evs_t *evs)
{
    char         *text = unquote(sq);
    llmgw_buf_t   b = llmgw_test_convert_stream(from, to, text, "client-m");
    llmgw_sse_t  *p = llmgw_sse_new(0);

    free(text);
    assert_non_null(b.data);
    if (strncmp(b.data, "ERROR: ", 7) == 0) {
        fail_msg("unexpected refusal: %s", b.data);
    }

    evs->n = 0;
    assert_int_equal(llmgw_sse_feed(p, b.data, b.len, collect, evs), 0);
    llmgw_sse_free(p);
    llmgw_buf_free(&b);
}


static void
evs_free(evs_t *evs)
{
    for (int i = 0; i < evs->n; i++) {
        json_decref(evs->ev[i].data);
    }

    evs->n = 0;
}


/* j at a slash path: "messages/0/content/1/source/type" */
static json_t *
at(json_t *j, const char *path)
{
    char  buf[256];
    char *save = NULL;

    assert_true(strlen(path) < sizeof(buf));
    strcpy(buf, path);

    for (char *k = strtok_r(buf, "/", &save); k != NULL && j != NULL;
         k = strtok_r(NULL, "/", &save))
    {
        if (json_is_array(j)) {
            j = json_array_get(j, strtoul(k, NULL, 10));
        } else {
            j = json_object_get(j, k);
        }
    }

    return j;
}


static const char *
str_at(json_t *j, const char *path)
{
    json_t *v = at(j, path);

    if (!json_is_string(v)) {
        fail_msg("%s is not a string", path);
    }

    return json_string_value(v);
}


static json_int_t
int_at(json_t *j, const char *path)
{
    json_t *v = at(j, path);

    if (!json_is_integer(v)) {
        fail_msg("%s is not an integer", path);
    }

    return json_integer_value(v);
}


static double
num_at(json_t *j, const char *path)
{
    json_t *v = at(j, path);

    if (!json_is_number(v)) {
        fail_msg("%s is not a number", path);
    }

    return json_number_value(v);
}


static size_t
size_at(json_t *j, const char *path)
{
    json_t *v = at(j, path);

    if (json_is_array(v)) {
        return json_array_size(v);
    }

    if (json_is_object(v)) {
        return json_object_size(v);
    }

    fail_msg("%s is not an array or object", path);
    return 0;
}


/* ---- OpenAI chat -> Anthropic ---- */

static void
test_system_message_becomes_anthropic_system(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'gpt-x','messages':["
        "{'role':'system','content':'Be brief.'},"
        "{'role':'developer','content':[{'type':'text',"
        "'text':'Answer in French.'}]},"
        "{'role':'user','content':'Hi'}]}");
    (void) state;

    assert_string_equal(str_at(j, "system"), "Be brief.\nAnswer in French.");
    assert_int_equal(size_at(j, "messages"), 1);
    assert_string_equal(str_at(j, "messages/0/role"), "user");
    assert_string_equal(str_at(j, "messages/0/content/0/type"), "text");
    assert_string_equal(str_at(j, "messages/0/content/0/text"), "Hi");
    assert_string_equal(str_at(j, "model"), "up-model");
    json_decref(j);
}


static void
test_anthropic_max_tokens_defaults_to_4096(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':'Hi'}]}");
    (void) state;

    assert_int_equal(int_at(j, "max_tokens"), 4096);
    assert_null(json_object_get(j, "stream"));
    json_decref(j);
}


static void
test_max_completion_tokens_wins_over_max_tokens(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','max_tokens':50,'max_completion_tokens':100,"
        "'messages':[{'role':'user','content':'Hi'}]}");
    (void) state;

    assert_int_equal(int_at(j, "max_tokens"), 100);
    json_decref(j);
}


static void
test_image_urls_become_anthropic_image_sources(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':["
        "{'type':'text','text':'What is this?'},"
        "{'type':'image_url','image_url':{'url':'https://x.test/a.png'}},"
        "{'type':'image_url','image_url':"
        "{'url':'data:image/png;base64,iVBORw0'}}]}]}");
    (void) state;

    assert_int_equal(size_at(j, "messages/0/content"), 3);
    assert_string_equal(str_at(j, "messages/0/content/1/type"), "image");
    assert_string_equal(str_at(j, "messages/0/content/1/source/type"), "url");
    assert_string_equal(str_at(j, "messages/0/content/1/source/url"),
                        "https://x.test/a.png");
    assert_string_equal(str_at(j, "messages/0/content/2/source/type"),
                        "base64");
    assert_string_equal(str_at(j, "messages/0/content/2/source/media_type"),
                        "image/png");
    assert_string_equal(str_at(j, "messages/0/content/2/source/data"),
                        "iVBORw0");
    json_decref(j);

    /* image/jpg is sent as the image/jpeg Anthropic knows */
    j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':["
        "{'type':'image_url','image_url':"
        "{'url':'data:image/jpg;base64,/9j'}}]}]}");
    assert_string_equal(str_at(j, "messages/0/content/0/source/media_type"),
                        "image/jpeg");
    json_decref(j);
}


static void
test_what_an_anthropic_answer_cannot_give_is_refused(void **state)
{
    (void) state;
    request_error(LLMGW_EP_CHAT, 14,
        "{'model':'m','n':2,'messages':[{'role':'user','content':'a'}]}",
        "n: more than one choice cannot be sent to this channel");
    request_error(LLMGW_EP_CHAT, 14,
        "{'model':'m','logprobs':true,'messages':[{'role':'user','content':'a'}]}",
        "logprobs: log probabilities cannot be sent to this channel");
    request_error(LLMGW_EP_CHAT, 14,
        "{'model':'m','response_format':{'type':'json_schema','json_schema':"
        "{'name':'x','schema':{'type':'object'}}},"
        "'messages':[{'role':'user','content':'a'}]}",
        "response_format \"json_schema\" cannot be sent to this channel");

    /* what changes nothing is fine */
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','n':1,'logprobs':false,'response_format':{'type':'text'},"
        "'messages':[{'role':'user','content':'a'}]}");
    assert_null(json_object_get(j, "n"));
    json_decref(j);
}


static void
test_unusable_image_url_is_refused_with_its_position(void **state)
{
    (void) state;
    request_error(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':'a'},"
        "{'role':'assistant','content':'b'},{'role':'user','content':["
        "{'type':'text','text':'x'},"
        "{'type':'image_url','image_url':{'url':'ftp://x/a.png'}}]}]}",
        "messages[2].content[1]: only http(s) URLs and base64 data URLs "
        "can be sent");
}


static void
test_tool_calls_become_tool_use_and_tool_messages_tool_results(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':["
        "{'role':'user','content':'Weather in Paris and Rome?'},"
        "{'role':'assistant','content':null,'tool_calls':["
        "{'id':'call_1','type':'function','function':{'name':'get_weather',"
        "'arguments':'{`city`:`Paris`}'}},"
        "{'id':'call_2','type':'function','function':{'name':'get_weather',"
        "'arguments':'{`city`:'}}]},"
        "{'role':'tool','tool_call_id':'call_1','content':'18C'},"
        "{'role':'tool','tool_call_id':'call_2','content':'21C'}]}");
    (void) state;

    assert_int_equal(size_at(j, "messages"), 3);
    assert_string_equal(str_at(j, "messages/1/role"), "assistant");
    assert_string_equal(str_at(j, "messages/1/content/0/type"), "tool_use");
    assert_string_equal(str_at(j, "messages/1/content/0/id"), "call_1");
    assert_string_equal(str_at(j, "messages/1/content/0/name"),
                        "get_weather");
    assert_string_equal(str_at(j, "messages/1/content/0/input/city"),
                        "Paris");
    /* cut arguments become an empty input, not a failure */
    assert_true(json_is_object(at(j, "messages/1/content/1/input")));
    assert_int_equal(size_at(j, "messages/1/content/1/input"), 0);

    /* both results in one user turn: Anthropic wants alternation */
    assert_string_equal(str_at(j, "messages/2/role"), "user");
    assert_int_equal(size_at(j, "messages/2/content"), 2);
    assert_string_equal(str_at(j, "messages/2/content/0/type"),
                        "tool_result");
    assert_string_equal(str_at(j, "messages/2/content/0/tool_use_id"),
                        "call_1");
    assert_string_equal(str_at(j, "messages/2/content/0/content"), "18C");
    assert_string_equal(str_at(j, "messages/2/content/1/tool_use_id"),
                        "call_2");
    json_decref(j);
}


static void
test_tool_ids_are_made_valid_for_anthropic_on_both_sides(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':'q'},"
        "{'role':'assistant','tool_calls':[{'id':'functions.get:0',"
        "'type':'function','function':{'name':'get','arguments':'{}'}}]},"
        "{'role':'tool','tool_call_id':'functions.get:0','content':'r'}]}");
    (void) state;

    assert_string_equal(str_at(j, "messages/1/content/0/id"),
                        "functions_get_0");
    assert_string_equal(str_at(j, "messages/2/content/0/tool_use_id"),
                        "functions_get_0");
    json_decref(j);
}


static void
test_consecutive_same_role_messages_merge(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':'a'},"
        "{'role':'user','content':'b'},{'role':'assistant','content':'c'},"
        "{'role':'assistant','content':'d'},{'role':'user','content':'e'}]}");
    (void) state;

    assert_int_equal(size_at(j, "messages"), 3);
    assert_int_equal(size_at(j, "messages/0/content"), 2);
    assert_string_equal(str_at(j, "messages/0/content/1/text"), "b");
    assert_string_equal(str_at(j, "messages/1/role"), "assistant");
    assert_string_equal(str_at(j, "messages/1/content/1/text"), "d");
    json_decref(j);
}


static void
test_tool_results_open_the_merged_user_turn(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':'q'},"
        "{'role':'assistant','tool_calls':[{'id':'c1','type':'function',"
        "'function':{'name':'f','arguments':'{}'}}]},"
        "{'role':'user','content':'also this'},"
        "{'role':'tool','tool_call_id':'c1','content':'r'}]}");
    (void) state;

    assert_int_equal(size_at(j, "messages/2/content"), 2);
    assert_string_equal(str_at(j, "messages/2/content/0/type"),
                        "tool_result");
    assert_string_equal(str_at(j, "messages/2/content/1/text"), "also this");
    json_decref(j);
}


static void
test_tools_and_tool_choice_map_to_anthropic(void **state)
{
    const char *tools =
        "'tools':[{'type':'function','function':{'name':'f',"
        "'description':'d','parameters':{'type':'object',"
        "'properties':{'a':{'type':'string'}}}}}],";
    char        body[1024];
    json_t     *j;
    (void) state;

    snprintf(body, sizeof(body), "{'model':'m',%s'tool_choice':'required',"
             "'messages':[{'role':'user','content':'q'}]}", tools);
    j = request(LLMGW_EP_CHAT, 14, body);
    assert_string_equal(str_at(j, "tools/0/name"), "f");
    assert_string_equal(str_at(j, "tools/0/description"), "d");
    assert_string_equal(str_at(j, "tools/0/input_schema/properties/a/type"),
                        "string");
    assert_string_equal(str_at(j, "tool_choice/type"), "any");
    json_decref(j);

    snprintf(body, sizeof(body), "{'model':'m',%s'tool_choice':{'type':"
             "'function','function':{'name':'f'}},"
             "'messages':[{'role':'user','content':'q'}]}", tools);
    j = request(LLMGW_EP_CHAT, 14, body);
    assert_string_equal(str_at(j, "tool_choice/type"), "tool");
    assert_string_equal(str_at(j, "tool_choice/name"), "f");
    json_decref(j);

    snprintf(body, sizeof(body), "{'model':'m',%s'tool_choice':'auto',"
             "'parallel_tool_calls':false,"
             "'messages':[{'role':'user','content':'q'}]}", tools);
    j = request(LLMGW_EP_CHAT, 14, body);
    assert_string_equal(str_at(j, "tool_choice/type"), "auto");
    assert_true(json_is_true(at(j, "tool_choice/disable_parallel_tool_use")));
    json_decref(j);
}


static void
test_tool_choice_none_omits_tools_without_tool_history(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','tools':[{'type':'function','function':{'name':'f'}}],"
        "'tool_choice':'none','messages':[{'role':'user','content':'q'}]}");
    (void) state;

    assert_null(json_object_get(j, "tools"));
    assert_null(json_object_get(j, "tool_choice"));
    json_decref(j);
}


static void
test_tool_choice_none_keeps_tools_that_explain_tool_history(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','tools':[{'type':'function','function':{'name':'f'}}],"
        "'tool_choice':'none','messages':[{'role':'user','content':'q'},"
        "{'role':'assistant','tool_calls':[{'id':'c1','type':'function',"
        "'function':{'name':'f','arguments':'{}'}}]},"
        "{'role':'tool','tool_call_id':'c1','content':'r'}]}");
    (void) state;

    assert_int_equal(size_at(j, "tools"), 1);
    assert_string_equal(str_at(j, "tools/0/input_schema/type"), "object");
    assert_string_equal(str_at(j, "tool_choice/type"), "none");
    json_decref(j);
}


static void
test_sampling_fields_carry_over_to_anthropic(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','temperature':0.5,'top_p':0.9,'stop':'END',"
        "'stream':true,'messages':[{'role':'user','content':'q'}]}");
    (void) state;

    assert_true(num_at(j, "temperature") == 0.5);
    assert_true(num_at(j, "top_p") == 0.9);
    assert_int_equal(size_at(j, "stop_sequences"), 1);
    assert_string_equal(str_at(j, "stop_sequences/0"), "END");
    assert_true(json_is_true(at(j, "stream")));
    json_decref(j);

    /* top_p 1 is the same as none: not sent beside a temperature */
    j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','temperature':0.5,'top_p':1,"
        "'messages':[{'role':'user','content':'q'}]}");
    assert_true(num_at(j, "temperature") == 0.5);
    assert_null(at(j, "top_p"));
    json_decref(j);

    /* OpenAI's range is 0..2, Anthropic's 0..1 */
    j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','temperature':1.7,'stop':['a','b'],"
        "'messages':[{'role':'user','content':'q'}]}");
    assert_true(num_at(j, "temperature") == 1.0);
    assert_int_equal(size_at(j, "stop_sequences"), 2);
    json_decref(j);
}


static void
test_pairs_without_conversion_are_refused(void **state)
{
    const char *chat = "{'model':'m','messages':[]}";
    (void) state;

    request_error(LLMGW_EP_CHAT, 34, chat,
                  "no conversion from chat to channel type 34");
    request_error(LLMGW_EP_CHAT, 38, chat,
                  "no conversion from chat to channel type 38");
    request_error(LLMGW_EP_RERANK, 14, "{'model':'m','query':'q'}",
                  "no conversion from rerank to channel type 14");
    request_error(LLMGW_EP_MESSAGES, 24, chat,
                  "no conversion from messages to channel type 24");
}


static void
test_unknown_content_part_is_refused_with_its_position(void **state)
{
    (void) state;
    request_error(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':["
        "{'type':'input_audio','input_audio':{'data':'AA','format':'wav'}}"
        "]}]}",
        "messages[0].content[0]: part type \"input_audio\" cannot be sent "
        "to this channel");
}


/* ---- OpenAI chat -> Gemini ---- */

static void
test_openai_messages_become_gemini_contents(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','max_tokens':64,'temperature':0.2,'top_p':0.8,"
        "'stop':['x','y'],'messages':[{'role':'system','content':'S'},"
        "{'role':'user','content':'Hi'},{'role':'assistant','content':'Hello'},"
        "{'role':'user','content':'Bye'}]}");
    (void) state;

    assert_string_equal(str_at(j, "systemInstruction/parts/0/text"), "S");
    assert_int_equal(size_at(j, "contents"), 3);
    assert_string_equal(str_at(j, "contents/0/role"), "user");
    assert_string_equal(str_at(j, "contents/0/parts/0/text"), "Hi");
    assert_string_equal(str_at(j, "contents/1/role"), "model");
    assert_string_equal(str_at(j, "contents/2/parts/0/text"), "Bye");
    /* the model goes in the URL */
    assert_null(json_object_get(j, "model"));
    assert_int_equal(int_at(j, "generationConfig/maxOutputTokens"), 64);
    assert_true(num_at(j, "generationConfig/temperature") == 0.2);
    assert_true(num_at(j, "generationConfig/topP") == 0.8);
    assert_string_equal(str_at(j, "generationConfig/stopSequences/1"), "y");
    json_decref(j);
}


static void
test_openai_images_become_gemini_inline_and_file_data(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','messages':[{'role':'user','content':["
        "{'type':'image_url','image_url':{'url':'data:image/jpeg;base64,/9j'}},"
        "{'type':'image_url','image_url':{'url':'https://x.test/b.PNG?s=1'}}"
        "]}]}");
    (void) state;

    assert_string_equal(str_at(j, "contents/0/parts/0/inlineData/mimeType"),
                        "image/jpeg");
    assert_string_equal(str_at(j, "contents/0/parts/0/inlineData/data"),
                        "/9j");
    assert_string_equal(str_at(j, "contents/0/parts/1/fileData/fileUri"),
                        "https://x.test/b.PNG?s=1");
    assert_string_equal(str_at(j, "contents/0/parts/1/fileData/mimeType"),
                        "image/png");
    json_decref(j);
}


/* Gemini refuses {"text":""}; a message left empty goes as on Anthropic */
static void
test_empty_text_parts_are_not_sent_to_gemini(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','messages':[{'role':'user','content':["
        "{'type':'text','text':''},"
        "{'type':'image_url','image_url':{'url':'data:image/png;base64,iVBO'}}"
        "]},{'role':'assistant','content':[{'type':'text','text':'seen'}]},"
        "{'role':'user','content':[{'type':'text','text':'describe'},"
        "{'type':'text','text':''}]},"
        "{'role':'assistant','content':[{'type':'text','text':''}]},"
        "{'role':'user','content':[{'type':'text','text':''}]},"
        "{'role':'user','content':'more'}]}");
    (void) state;

    assert_int_equal(size_at(j, "contents"), 3);
    assert_int_equal(size_at(j, "contents/0/parts"), 1);
    assert_non_null(at(j, "contents/0/parts/0/inlineData"));
    assert_string_equal(str_at(j, "contents/1/role"), "model");
    assert_string_equal(str_at(j, "contents/2/role"), "user");
    assert_int_equal(size_at(j, "contents/2/parts"), 2);
    assert_string_equal(str_at(j, "contents/2/parts/0/text"), "describe");
    assert_string_equal(str_at(j, "contents/2/parts/1/text"), "more");
    json_decref(j);

    /* the Anthropic path reads the same request alike */
    j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':'q'},"
        "{'role':'assistant','content':[{'type':'text','text':''}]},"
        "{'role':'user','content':'r'}]}");
    assert_int_equal(size_at(j, "messages"), 1);
    assert_int_equal(size_at(j, "messages/0/content"), 2);
    json_decref(j);
}


static void
test_openai_tool_turns_become_gemini_function_call_and_response(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','messages':[{'role':'user','content':'Weather?'},"
        "{'role':'assistant','tool_calls':[{'id':'call_9','type':'function',"
        "'function':{'name':'get_weather','arguments':'{`city`:`Oslo`}'}}]},"
        "{'role':'tool','tool_call_id':'call_9','content':'-2C'}]}");
    (void) state;

    assert_string_equal(str_at(j, "contents/1/role"), "model");
    assert_string_equal(str_at(j, "contents/1/parts/0/functionCall/name"),
                        "get_weather");
    assert_string_equal(
        str_at(j, "contents/1/parts/0/functionCall/args/city"), "Oslo");
    /* Gemini 3 refuses replayed calls without a signature */
    assert_non_null(at(j, "contents/1/parts/0/thoughtSignature"));
    assert_string_equal(str_at(j, "contents/2/role"), "user");
    assert_string_equal(
        str_at(j, "contents/2/parts/0/functionResponse/name"), "get_weather");
    assert_string_equal(
        str_at(j, "contents/2/parts/0/functionResponse/response/content"),
        "-2C");
    json_decref(j);
}


/* as on Anthropic: routing then leaves the channel out of the tries */
static void
test_what_a_gemini_answer_cannot_give_is_refused(void **state)
{
    (void) state;
    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','n':3,'messages':[{'role':'user','content':'a'}]}",
        "n: more than one choice cannot be sent to this channel");
    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','logprobs':true,'messages':[{'role':'user','content':'a'}]}",
        "logprobs: log probabilities cannot be sent to this channel");
    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','top_logprobs':2,'messages':[{'role':'user','content':'a'}]}",
        "logprobs: log probabilities cannot be sent to this channel");
    /* an empty last turn left out would make the assistant's a prefill */
    request_error(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':[{'role':'user','content':'hi'},"
        "{'role':'assistant','content':'Hello, how'},"
        "{'role':'user','content':''}]}",
        "messages[2]: an empty message cannot end the conversation on this channel");
    /* what Anthropic refuses: a stop sequence of whitespace alone */
    request_error(LLMGW_EP_CHAT, 14,
        "{'model':'m','stop':['END','\\n'],'messages':[{'role':'user','content':'a'}]}",
        "stop: a stop sequence of whitespace alone cannot be sent to this channel");

    /* what changes nothing is fine, and JSON mode Gemini has */
    json_t *j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','n':1,'logprobs':false,'top_logprobs':0,"
        "'response_format':{'type':'json_object'},"
        "'messages':[{'role':'user','content':'a'}]}");
    assert_string_equal(str_at(j, "generationConfig/responseMimeType"),
                        "application/json");
    json_decref(j);
}


static void
test_gemini_tool_result_needs_a_matching_call(void **state)
{
    (void) state;
    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','messages':[{'role':'user','content':'q'},"
        "{'role':'tool','tool_call_id':'nope','content':'r'}]}",
        "messages[1].tool_call_id matches no earlier tool call");
}


static void
test_gemini_schema_formats_enums_consts_and_one_of(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','tools':[{'type':'function','function':{'name':'f',"
        "'parameters':{'type':'object','properties':{"
        "'u':{'type':'string','format':'uri'},"
        "'t':{'type':'string','format':'date-time'},"
        "'n':{'type':'integer','enum':[1,2],'description':'count'},"
        "'k':{'const':'x'},"
        "'o':{'oneOf':[{'type':'string'},{'type':'integer'}]}}}}}],"
        "'response_format':{'type':'json_schema','json_schema':{'name':'r',"
        "'schema':{'type':'object','properties':{'v':{'type':'string',"
        "'format':'email'}}}}},"
        "'messages':[{'role':'user','content':'q'}]}");
    json_t *p = at(j, "tools/0/functionDeclarations/0/parameters/properties");
    (void) state;

    assert_null(at(p, "u/format"));
    assert_string_equal(str_at(p, "t/format"), "date-time");
    assert_null(at(p, "n/enum"));
    assert_string_equal(str_at(p, "n/description"), "count (one of: 1, 2)");
    assert_string_equal(str_at(p, "k/enum/0"), "x");
    assert_string_equal(str_at(p, "k/type"), "string");
    assert_string_equal(str_at(p, "o/anyOf/1/type"), "integer");
    /* a JSON schema answer: its schema too */
    assert_string_equal(str_at(j, "generationConfig/responseMimeType"),
                        "application/json");
    assert_string_equal(
        str_at(j, "generationConfig/responseSchema/properties/v/type"),
        "string");
    assert_null(at(j, "generationConfig/responseSchema/properties/v/format"));
    json_decref(j);

    /* what Gemini's Schema cannot say (a free-form object, a reference):
       JSON mode alone */
    j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','response_format':{'type':'json_schema','json_schema':"
        "{'name':'r','schema':{'type':'object','properties':{"
        "'meta':{'type':'object'}}}}},"
        "'messages':[{'role':'user','content':'q'}]}");
    assert_string_equal(str_at(j, "generationConfig/responseMimeType"),
                        "application/json");
    assert_null(at(j, "generationConfig/responseSchema"));
    json_decref(j);

    j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','response_format':{'type':'json_schema','json_schema':"
        "{'name':'r','schema':{'type':'object','properties':{"
        "'a':{'$ref':'#/$defs/A'}},'$defs':{'A':{'type':'string'}}}}},"
        "'messages':[{'role':'user','content':'q'}]}");
    assert_null(at(j, "generationConfig/responseSchema"));
    json_decref(j);
}


static void
test_gemini_tool_schema_keeps_only_keys_gemini_knows(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','tool_choice':'required','tools':["
        "{'type':'function','function':{'name':'f','description':'d',"
        "'parameters':{'$schema':'http://json-schema.org/draft-07/schema#',"
        "'type':'object','additionalProperties':false,"
        "'properties':{'a':{'type':['string','null'],'description':'x'}},"
        "'required':['a']}}},"
        "{'type':'function','function':{'name':'g','parameters':"
        "{'type':'object','properties':{}}}}],"
        "'messages':[{'role':'user','content':'q'}]}");
    json_t *p = at(j, "tools/0/functionDeclarations/0/parameters");
    (void) state;

    assert_non_null(p);
    assert_null(json_object_get(p, "$schema"));
    assert_null(json_object_get(p, "additionalProperties"));
    assert_string_equal(str_at(p, "properties/a/type"), "string");
    assert_true(json_is_true(at(p, "properties/a/nullable")));
    assert_string_equal(str_at(p, "required/0"), "a");
    /* an object without properties is refused by Gemini: left out */
    assert_string_equal(str_at(j, "tools/0/functionDeclarations/1/name"),
                        "g");
    assert_null(at(j, "tools/0/functionDeclarations/1/parameters"));
    assert_string_equal(str_at(j, "toolConfig/functionCallingConfig/mode"),
                        "ANY");
    json_decref(j);
}


/* Gemini's Schema has no $ref: local references are put in place, an
   allOf is merged, and every schema gets a type */
static void
test_gemini_tool_schema_references_are_put_in_place(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','tools':[{'type':'function','function':{'name':'save',"
        "'parameters':{'type':'object','$defs':{'Address':{'type':'object',"
        "'description':'a postal address',"
        "'properties':{'street':{'type':'string'}},'required':['street']}},"
        "'properties':{"
        "'home':{'$ref':'#/$defs/Address'},"
        "'unit':{'enum':['c','f']},"
        "'count':{'enum':[1,2]},"
        "'anything':{'description':'any JSON value'},"
        "'both':{'allOf':[{'$ref':'#/$defs/Address'}],"
        "'description':'where to ship'}},"
        "'required':['home','unit','gone']}}}],"
        "'messages':[{'role':'user','content':'q'}]}");
    json_t *p = at(j, "tools/0/functionDeclarations/0/parameters");
    (void) state;

    assert_null(json_object_get(p, "$defs"));
    assert_string_equal(str_at(p, "properties/home/type"), "object");
    assert_string_equal(str_at(p, "properties/home/properties/street/type"),
                        "string");
    assert_string_equal(str_at(p, "properties/home/required/0"), "street");
    assert_null(at(p, "properties/home/$ref"));
    assert_string_equal(str_at(p, "properties/unit/type"), "string");
    assert_string_equal(str_at(p, "properties/unit/enum/1"), "f");
    assert_string_equal(str_at(p, "properties/count/type"), "integer");
    assert_string_equal(str_at(p, "properties/count/description"),
                        "one of: 1, 2");
    /* nothing to take a type from: a string, described */
    assert_string_equal(str_at(p, "properties/anything/type"), "string");
    assert_string_equal(str_at(p, "properties/anything/description"),
                        "any JSON value");
    /* the field's own description wins over its type's */
    assert_string_equal(str_at(p, "properties/both/type"), "object");
    assert_string_equal(str_at(p, "properties/both/description"),
                        "where to ship");
    assert_string_equal(str_at(p, "properties/both/properties/street/type"),
                        "string");
    assert_null(at(p, "properties/both/allOf"));
    /* required names only properties there are */
    assert_int_equal(size_at(p, "required"), 2);
    assert_string_equal(str_at(p, "required/1"), "unit");
    json_decref(j);

    /* definitions (draft 7), a $ref used twice, object allOfs merged */
    j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','tools':[{'type':'function','function':{'name':'f',"
        "'parameters':{'definitions':{'Id':{'type':'integer'}},"
        "'allOf':[{'type':'object','properties':{'a':{'$ref':"
        "'#/definitions/Id'}},'required':['a']},"
        "{'properties':{'b':{'$ref':'#/definitions/Id'},"
        "'c':{'type':'array','items':{'properties':{'d':{'type':'string'}}}}"
        "},'required':['b']}]}}}],"
        "'messages':[{'role':'user','content':'q'}]}");
    p = at(j, "tools/0/functionDeclarations/0/parameters");
    assert_string_equal(str_at(p, "type"), "object");
    assert_string_equal(str_at(p, "properties/a/type"), "integer");
    assert_string_equal(str_at(p, "properties/b/type"), "integer");
    assert_string_equal(str_at(p, "properties/c/items/type"), "object");
    assert_string_equal(str_at(p, "required/0"), "a");
    assert_string_equal(str_at(p, "required/1"), "b");
    json_decref(j);
}


/* what Gemini's Schema cannot say is refused, naming the tool and where */
static void
test_gemini_tool_schema_it_cannot_say_is_refused(void **state)
{
    char        body[4096];
    llmgw_buf_t b;
    (void) state;

    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','tools':[{'type':'function','function':{'name':'tree',"
        "'parameters':{'type':'object','$defs':{'Node':{'type':'object',"
        "'properties':{'name':{'type':'string'},'children':{'type':'array',"
        "'items':{'$ref':'#/$defs/Node'}}}}},"
        "'properties':{'root':{'$ref':'#/$defs/Node'}}}}}],"
        "'messages':[{'role':'user','content':'q'}]}",
        "tools[0] (\"tree\"): parameters.properties.root.properties.children"
        ".items: the recursive $ref \"#/$defs/Node\" cannot be sent to this "
        "channel");
    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','tools':[{'type':'function','function':{'name':'a'}},"
        "{'type':'function','function':{'name':'b','parameters':{"
        "'type':'object','properties':{'x':{'anyOf':[{'type':'string'},"
        "{'$ref':'https://x.test/s.json'}]}}}}}],"
        "'messages':[{'role':'user','content':'q'}]}",
        "tools[1] (\"b\"): parameters.properties.x.anyOf[1]: $ref "
        "\"https://x.test/s.json\" points at no schema in this one (only "
        "local references can be sent to this channel)");
    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','tools':[{'type':'function','function':{'name':'c',"
        "'parameters':{'type':'object','properties':{'x':{'$ref':"
        "'#/$defs/Missing'}}}}}],"
        "'messages':[{'role':'user','content':'q'}]}",
        "tools[0] (\"c\"): parameters.properties.x: $ref \"#/$defs/Missing\" "
        "points at no schema in this one (only local references can be sent "
        "to this channel)");
    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','tools':[{'type':'function','function':{'name':'d',"
        "'parameters':{'type':'object','properties':{'x':{'allOf':["
        "{'type':'string'},{'type':'integer'}]}}}}}],"
        "'messages':[{'role':'user','content':'q'}]}",
        "tools[0] (\"d\"): parameters.properties.x.allOf[1]: allOf parts "
        "that disagree on \"type\" cannot be sent to this channel");

    /* each definition used twice by the one before: 2^14 schemas */
    int n = snprintf(body, sizeof(body),
                     "{\"model\":\"m\",\"tools\":[{\"type\":\"function\","
                     "\"function\":{\"name\":\"e\",\"parameters\":{"
                     "\"$ref\":\"#/$defs/D0\",\"$defs\":{");
    for (int i = 0; i < 14; i++) {
        n += snprintf(body + n, sizeof(body) - n,
                      "\"D%d\":{\"properties\":{\"l\":{\"$ref\":"
                      "\"#/$defs/D%d\"},\"r\":{\"$ref\":\"#/$defs/D%d\"}}},",
                      i, i + 1, i + 1);
    }
    snprintf(body + n, sizeof(body) - n,
             "\"D14\":{\"type\":\"string\"}}}}}],"
             "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}");
    assert_true(strlen(body) < sizeof(body) - 1);
    b = llmgw_test_convert_request(LLMGW_EP_CHAT, 24, body, "up-model");
    assert_non_null(b.data);
    assert_non_null(strstr(b.data, "ERROR: tools[0] (\"e\"): parameters"));
    assert_non_null(strstr(b.data, ": a schema this large once its $refs "
                                   "are put in place cannot be sent to this "
                                   "channel"));
    llmgw_buf_free(&b);
}


/* ---- Anthropic messages -> OpenAI chat ---- */

static void
test_tool_result_images_follow_as_a_user_message(void **state)
{
    json_t *j = request(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':30,'messages':["
        "{'role':'user','content':'shoot'},"
        "{'role':'assistant','content':[{'type':'tool_use','id':'tu_1',"
        "'name':'screen','input':{}}]},"
        "{'role':'user','content':[{'type':'tool_result','tool_use_id':'tu_1',"
        "'content':[{'type':'text','text':'done'},{'type':'image','source':"
        "{'type':'base64','media_type':'image/png','data':'iVBORw0KGgo='}}]},"
        "{'type':'text','text':'what is on it?'}]}]}");
    (void) state;

    assert_string_equal(str_at(j, "messages/2/role"), "tool");
    assert_string_equal(str_at(j, "messages/2/tool_call_id"), "tu_1");
    assert_string_equal(str_at(j, "messages/2/content"), "done");
    assert_string_equal(str_at(j, "messages/3/role"), "user");
    assert_string_equal(str_at(j, "messages/3/content/0/type"), "image_url");
    assert_string_equal(str_at(j, "messages/3/content/0/image_url/url"),
                        "data:image/png;base64,iVBORw0KGgo=");
    assert_string_equal(str_at(j, "messages/3/content/1/text"),
                        "what is on it?");
    json_decref(j);
}


/* A failed tool says so; a result's documents follow like its images, and
   a document without a title gets the filename OpenAI requires. */
static void
test_tool_result_errors_and_documents(void **state)
{
    json_t *j = request(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':30,'messages':["
        "{'role':'user','content':'read'},"
        "{'role':'assistant','content':[{'type':'tool_use','id':'tu_1',"
        "'name':'open','input':{}},{'type':'tool_use','id':'tu_2',"
        "'name':'open','input':{}}]},"
        "{'role':'user','content':[{'type':'tool_result','tool_use_id':'tu_1',"
        "'is_error':true,'content':'ENOENT'},"
        "{'type':'tool_result','tool_use_id':'tu_2','content':["
        "{'type':'document','source':{'type':'base64',"
        "'media_type':'application/pdf','data':'JVBERi0='}}]},"
        "{'type':'document','source':{'type':'base64',"
        "'media_type':'application/pdf','data':'JVBERi0='},'title':'q.pdf'}]}]}");
    (void) state;

    assert_string_equal(str_at(j, "messages/2/role"), "tool");
    assert_string_equal(str_at(j, "messages/2/content"), "Error: ENOENT");
    assert_string_equal(str_at(j, "messages/3/role"), "tool");
    assert_string_equal(str_at(j, "messages/3/tool_call_id"), "tu_2");
    assert_string_equal(str_at(j, "messages/4/role"), "user");
    assert_string_equal(str_at(j, "messages/4/content/0/type"), "file");
    assert_string_equal(str_at(j, "messages/4/content/0/file/file_data"),
                        "data:application/pdf;base64,JVBERi0=");
    assert_string_equal(str_at(j, "messages/4/content/0/file/filename"),
                        "document.pdf");
    assert_string_equal(str_at(j, "messages/4/content/1/file/filename"),
                        "q.pdf");
    json_decref(j);
}


static void
test_anthropic_system_blocks_become_first_system_message(void **state)
{
    json_t *j = request(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':300,'system':["
        "{'type':'text','text':'A'},{'type':'text','text':'B'}],"
        "'messages':[{'role':'user','content':'Hi'}]}");
    (void) state;

    assert_string_equal(str_at(j, "model"), "up-model");
    assert_string_equal(str_at(j, "messages/0/role"), "system");
    assert_string_equal(str_at(j, "messages/0/content"), "A\nB");
    assert_string_equal(str_at(j, "messages/1/role"), "user");
    assert_string_equal(str_at(j, "messages/1/content"), "Hi");
    assert_int_equal(int_at(j, "max_tokens"), 300);
    assert_null(json_object_get(j, "stream_options"));
    json_decref(j);
}


/* some compatible servers refuse a user of more than 64 characters: a
   longer id (Claude Code's) goes as its SHA-256 */
static void
test_anthropic_user_id_becomes_openai_user_of_at_most_64(void **state)
{
    static const struct { const char *id; const char *user; } cases[] = {
        { "user_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
          "aaaa_account_00000000-1111-2222-3333-444444444444_session_"
          "55555555-6666-7777-8888-999999999999",
          "4b32c083b8b6689285f87a425a5d81368242b85fd30078b9a985ef452f8e0569" },
        /* the boundary: 65 characters are hashed, 64 go as they are */
        { "x-65-characters-abcdefghijklmnopqrstuvwxyz-0123456789-ABCDEFGHIJK",
          "3052667615dea752c6597543458f2638d7d915828e50e834c6450ea1dead2299" },
        { "x-64-characters-abcdefghijklmnopqrstuvwxyz-0123456789-ABCDEFGHIJ",
          "x-64-characters-abcdefghijklmnopqrstuvwxyz-0123456789-ABCDEFGHIJ" },
        { "u-42", "u-42" },
    };
    char   body[512];
    size_t i;
    (void) state;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(body, sizeof(body),
                 "{'model':'claude','max_tokens':10,"
                 "'metadata':{'user_id':'%s'},"
                 "'messages':[{'role':'user','content':'Hi'}]}",
                 cases[i].id);
        json_t *j = request(LLMGW_EP_MESSAGES, 1, body);
        assert_string_equal(str_at(j, "user"), cases[i].user);
        json_decref(j);
    }

    json_t *j = request(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':10,'metadata':{},"
        "'messages':[{'role':'user','content':'Hi'}]}");
    assert_null(json_object_get(j, "user"));
    json_decref(j);
}


/* OpenAI's reasoning models refuse max_tokens: they are sent
   max_completion_tokens; other models keep max_tokens */
static void
test_anthropic_max_tokens_to_reasoning_models(void **state)
{
    static const struct { const char *model; int completion; } cases[] = {
        { "o3-mini", 1 }, { "o1", 1 }, { "openai/o4-mini", 1 },
        { "gpt-5", 1 }, { "gpt-5-mini-2025-08-07", 1 },
        { "gpt-4o", 0 }, { "omni-moderation", 0 }, { "llama-3", 0 },
        { "o", 0 },
    };
    size_t i;
    (void) state;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char        *body = unquote("{'model':'claude','max_tokens':77,"
                                    "'messages':[{'role':'user','content':'q'}]}");
        llmgw_buf_t  b = llmgw_test_convert_request(LLMGW_EP_MESSAGES, 1, body,
                                                    cases[i].model);
        json_t      *j = take_json(b);

        free(body);
        if (cases[i].completion) {
            assert_int_equal(int_at(j, "max_completion_tokens"), 77);
            assert_null(json_object_get(j, "max_tokens"));
        } else {
            assert_int_equal(int_at(j, "max_tokens"), 77);
            assert_null(json_object_get(j, "max_completion_tokens"));
        }
        json_decref(j);
    }
}


static void
test_anthropic_tool_use_and_result_become_openai_tool_calls(void **state)
{
    json_t *j = request(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':10,'messages':["
        "{'role':'user','content':'q'},"
        "{'role':'assistant','content':[{'type':'text','text':'Let me check'},"
        "{'type':'tool_use','id':'toolu_1','name':'get_weather',"
        "'input':{'city':'Paris'}}]},"
        "{'role':'user','content':[{'type':'tool_result',"
        "'tool_use_id':'toolu_1','content':[{'type':'text','text':'18C'}]},"
        "{'type':'text','text':'thanks'}]}]}");
    (void) state;

    assert_int_equal(size_at(j, "messages"), 4);
    assert_string_equal(str_at(j, "messages/1/content"), "Let me check");
    assert_string_equal(str_at(j, "messages/1/tool_calls/0/id"), "toolu_1");
    assert_string_equal(str_at(j, "messages/1/tool_calls/0/type"),
                        "function");
    assert_string_equal(str_at(j, "messages/1/tool_calls/0/function/name"),
                        "get_weather");
    assert_string_equal(
        str_at(j, "messages/1/tool_calls/0/function/arguments"),
        "{\"city\":\"Paris\"}");
    /* the tool answer comes right after the call, before the user text */
    assert_string_equal(str_at(j, "messages/2/role"), "tool");
    assert_string_equal(str_at(j, "messages/2/tool_call_id"), "toolu_1");
    assert_string_equal(str_at(j, "messages/2/content"), "18C");
    assert_string_equal(str_at(j, "messages/3/role"), "user");
    assert_string_equal(str_at(j, "messages/3/content"), "thanks");
    json_decref(j);
}


static void
test_anthropic_images_become_openai_image_urls(void **state)
{
    json_t *j = request(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':10,'messages':[{'role':'user',"
        "'content':[{'type':'image','source':{'type':'base64',"
        "'media_type':'image/png','data':'AAA'}},"
        "{'type':'image','source':{'type':'url','url':'https://x.test/c.gif'}},"
        "{'type':'text','text':'compare'}]}]}");
    (void) state;

    assert_string_equal(str_at(j, "messages/0/content/0/type"), "image_url");
    assert_string_equal(str_at(j, "messages/0/content/0/image_url/url"),
                        "data:image/png;base64,AAA");
    assert_string_equal(str_at(j, "messages/0/content/1/image_url/url"),
                        "https://x.test/c.gif");
    assert_string_equal(str_at(j, "messages/0/content/2/text"), "compare");
    json_decref(j);
}


static void
test_anthropic_stream_request_asks_openai_for_usage(void **state)
{
    json_t *j = request(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':10,'stream':true,'temperature':0.3,"
        "'top_p':0.7,'stop_sequences':['###'],"
        "'messages':[{'role':'user','content':'q'}]}");
    (void) state;

    assert_true(json_is_true(at(j, "stream")));
    assert_true(json_is_true(at(j, "stream_options/include_usage")));
    assert_string_equal(str_at(j, "stop/0"), "###");
    assert_true(num_at(j, "temperature") == 0.3);
    assert_true(num_at(j, "top_p") == 0.7);
    json_decref(j);
}


static void
test_anthropic_tools_and_tool_choice_map_to_openai(void **state)
{
    json_t *j = request(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':10,'tools':[{'name':'f',"
        "'description':'d','input_schema':{'type':'object',"
        "'properties':{'a':{'type':'integer'}}}}],"
        "'tool_choice':{'type':'any','disable_parallel_tool_use':true},"
        "'messages':[{'role':'user','content':'q'}]}");
    (void) state;

    assert_string_equal(str_at(j, "tools/0/type"), "function");
    assert_string_equal(str_at(j, "tools/0/function/name"), "f");
    assert_string_equal(str_at(j, "tools/0/function/description"), "d");
    assert_string_equal(
        str_at(j, "tools/0/function/parameters/properties/a/type"),
        "integer");
    assert_string_equal(str_at(j, "tool_choice"), "required");
    assert_true(json_is_false(at(j, "parallel_tool_calls")));
    json_decref(j);

    j = request(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':10,'tools':[{'name':'f',"
        "'input_schema':{'type':'object'}}],"
        "'tool_choice':{'type':'tool','name':'f'},"
        "'messages':[{'role':'user','content':'q'}]}");
    assert_string_equal(str_at(j, "tool_choice/type"), "function");
    assert_string_equal(str_at(j, "tool_choice/function/name"), "f");
    json_decref(j);
}


static void
test_anthropic_server_tools_are_refused(void **state)
{
    (void) state;
    request_error(LLMGW_EP_MESSAGES, 1,
        "{'model':'claude','max_tokens':10,'tools':[{'type':"
        "'web_search_20250305','name':'web_search'}],"
        "'messages':[{'role':'user','content':'q'}]}",
        "tools[0]: tool type \"web_search_20250305\" is Anthropic's own and "
        "cannot be sent to this channel");
}


/* ---- answers ---- */

static void
test_an_integer_beyond_int64_in_tool_input_still_converts(void **state)
{
    json_t *j = response(14, LLMGW_EP_CHAT,
        "{'id':'msg_2','type':'message','role':'assistant','model':'claude',"
        "'content':[{'type':'tool_use','id':'tu_1','name':'order',"
        "'input':{'id':18446744073709551615,'n':3}}],"
        "'stop_reason':'tool_use','usage':{'input_tokens':10,"
        "'output_tokens':5}}");
    (void) state;

    assert_string_equal(str_at(j, "object"), "chat.completion");
    assert_string_equal(str_at(j, "choices/0/message/tool_calls/0/function/name"),
                        "order");
    /* the big id is kept as a number, the small one as an integer */
    assert_string_equal(
        str_at(j, "choices/0/message/tool_calls/0/function/arguments"),
        "{\"id\":1.8446744073709552e19,\"n\":3}");
    assert_int_equal(int_at(j, "usage/prompt_tokens"), 10);
    assert_int_equal(int_at(j, "usage/completion_tokens"), 5);
    json_decref(j);
}


static void
test_reals_in_tool_input_keep_their_shortest_form(void **state)
{
    json_t *j = response(14, LLMGW_EP_CHAT,
        "{'id':'msg_3','type':'message','role':'assistant','model':'claude',"
        "'content':[{'type':'tool_use','id':'tu_1','name':'pay',"
        "'input':{'amount':0.1,'big':1e30,'tiny':1.5e-7,'whole':3.0,"
        "'neg':-0.25,'sum':0.30000000000000004,'n':7,'hundred':100.0,"
        "'s':'0.10000000000000001 \\\" 2.50'}}],"
        "'stop_reason':'tool_use','usage':{'input_tokens':1,"
        "'output_tokens':1}}");
    (void) state;

    /* not 0.10000000000000001: the text a vendor wrote, as a double */
    assert_string_equal(
        str_at(j, "choices/0/message/tool_calls/0/function/arguments"),
        "{\"amount\":0.1,\"big\":1e30,\"tiny\":1.5e-7,\"whole\":3.0,"
        "\"neg\":-0.25,\"sum\":0.30000000000000004,\"n\":7,"
        "\"hundred\":100.0,\"s\":\"0.10000000000000001 \\\" 2.50\"}");
    json_decref(j);
}


static void
test_anthropic_answer_becomes_chat_completion(void **state)
{
    json_t *j = response(14, LLMGW_EP_CHAT,
        "{'id':'msg_1','type':'message','role':'assistant','model':'claude',"
        "'content':[{'type':'text','text':'Hel'},{'type':'text','text':'lo'}],"
        "'stop_reason':'end_turn','usage':{'input_tokens':10,"
        "'output_tokens':5,'cache_read_input_tokens':100,"
        "'cache_creation_input_tokens':20}}");
    (void) state;

    assert_string_equal(str_at(j, "object"), "chat.completion");
    assert_string_equal(str_at(j, "id"), "msg_1");
    assert_string_equal(str_at(j, "model"), "client-m");
    assert_true(int_at(j, "created") > 0);
    assert_string_equal(str_at(j, "choices/0/message/role"), "assistant");
    assert_string_equal(str_at(j, "choices/0/message/content"), "Hello");
    assert_null(at(j, "choices/0/message/tool_calls"));
    assert_string_equal(str_at(j, "choices/0/finish_reason"), "stop");
    /* OpenAI's prompt count includes the cached part */
    assert_int_equal(int_at(j, "usage/prompt_tokens"), 130);
    assert_int_equal(int_at(j, "usage/completion_tokens"), 5);
    assert_int_equal(int_at(j, "usage/total_tokens"), 135);
    assert_int_equal(int_at(j, "usage/prompt_tokens_details/cached_tokens"),
                     100);
    json_decref(j);
}


static void
test_anthropic_stop_reasons_map_to_finish_reasons(void **state)
{
    static const char *const map[][2] = {
        { "end_turn", "stop" }, { "stop_sequence", "stop" },
        { "max_tokens", "length" }, { "tool_use", "tool_calls" },
        { "model_context_window_exceeded", "length" },
        { "refusal", "content_filter" },
    };
    char body[256];
    (void) state;

    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        snprintf(body, sizeof(body), "{'id':'m','content':[],"
                 "'stop_reason':'%s','usage':{}}", map[i][0]);
        json_t *j = response(14, LLMGW_EP_CHAT, body);
        assert_string_equal(str_at(j, "choices/0/finish_reason"), map[i][1]);
        /* no text and no tool call: "", as OpenAI answers ("Successful
           but abnormal": a reasoning model cut short while thinking) */
        assert_string_equal(str_at(j, "choices/0/message/content"), "");
        json_decref(j);
    }
}


/*
 * A call made by Claude reaches an OpenAI client as tool_calls; the client
 * sends it back with the tool's answer; Claude must see its own id and
 * input again.
 */
static void
test_tool_call_round_trip(void **state)
{
    json_t       *answer, *message, *req, *j;
    const char   *id;
    char         *text;
    llmgw_buf_t   b;
    (void) state;

    answer = response(14, LLMGW_EP_CHAT,
        "{'id':'msg_2','content':[{'type':'tool_use','id':'toolu_77',"
        "'name':'lookup','input':{'q':'llmgw','n':3}}],"
        "'stop_reason':'tool_use','usage':{'input_tokens':1,"
        "'output_tokens':1}}");

    assert_string_equal(str_at(answer, "choices/0/finish_reason"),
                        "tool_calls");
    message = at(answer, "choices/0/message");
    id = str_at(message, "tool_calls/0/id");
    assert_string_equal(id, "toolu_77");
    assert_string_equal(str_at(message, "tool_calls/0/function/name"),
                        "lookup");

    req = json_pack("{s:s, s:[{s:s, s:s}, O, {s:s, s:s, s:s}]}",
                    "model", "gpt", "messages",
                    "role", "user", "content", "find it",
                    message,
                    "role", "tool", "tool_call_id", id, "content", "found");
    assert_non_null(req);
    text = json_dumps(req, JSON_COMPACT);
    b = llmgw_test_convert_request(LLMGW_EP_CHAT, 14, text, "claude-up");
    free(text);
    j = take_json(b);

    assert_string_equal(str_at(j, "messages/1/content/0/type"), "tool_use");
    assert_string_equal(str_at(j, "messages/1/content/0/id"), "toolu_77");
    assert_string_equal(str_at(j, "messages/1/content/0/input/q"), "llmgw");
    assert_int_equal(int_at(j, "messages/1/content/0/input/n"), 3);
    assert_string_equal(str_at(j, "messages/2/content/0/tool_use_id"),
                        "toolu_77");
    assert_string_equal(str_at(j, "messages/2/content/0/content"), "found");

    json_decref(j);
    json_decref(req);
    json_decref(answer);
}


static void
test_gemini_answer_becomes_chat_completion(void **state)
{
    json_t *j = response(24, LLMGW_EP_CHAT,
        "{'candidates':[{'content':{'role':'model','parts':["
        "{'text':'Hi '},{'text':'there'}]},'finishReason':'STOP'}],"
        "'usageMetadata':{'promptTokenCount':7,'candidatesTokenCount':3,"
        "'thoughtsTokenCount':4,'totalTokenCount':14}}");
    (void) state;

    assert_string_equal(str_at(j, "object"), "chat.completion");
    assert_string_equal(str_at(j, "model"), "client-m");
    assert_string_equal(str_at(j, "choices/0/message/content"), "Hi there");
    assert_string_equal(str_at(j, "choices/0/finish_reason"), "stop");
    assert_int_equal(int_at(j, "usage/prompt_tokens"), 7);
    /* thinking is billed as output */
    assert_int_equal(int_at(j, "usage/completion_tokens"), 7);
    assert_int_equal(int_at(j, "usage/total_tokens"), 14);
    json_decref(j);
}


/* Generated images come as the message's "images", whole or in chunks. */
static void
test_gemini_images_become_message_images(void **state)
{
    evs_t   evs;
    json_t *j = response(24, LLMGW_EP_CHAT,
        "{'candidates':[{'content':{'role':'model','parts':["
        "{'text':'Here'},{'inlineData':{'mimeType':'image/png','data':'iVBO'}}]},"
        "'finishReason':'STOP'}]}");
    (void) state;

    assert_string_equal(str_at(j, "choices/0/message/content"), "Here");
    assert_string_equal(str_at(j, "choices/0/message/images/0/type"),
                        "image_url");
    assert_string_equal(str_at(j, "choices/0/message/images/0/image_url/url"),
                        "data:image/png;base64,iVBO");
    json_decref(j);

    /* a failed turn is not told as a finished one */
    j = response(24, LLMGW_EP_CHAT,
        "{'candidates':[{'content':{'role':'model','parts':[]},"
        "'finishReason':'MALFORMED_FUNCTION_CALL'}]}");
    assert_string_equal(str_at(j, "choices/0/finish_reason"),
                        "malformed_function_call");
    json_decref(j);

    stream(24, LLMGW_EP_CHAT,
        "data: {'candidates':[{'content':{'role':'model','parts':"
        "[{'inlineData':{'mimeType':'image/jpeg','data':'/9j/'}}]},"
        "'finishReason':'STOP'}]}\n\n", &evs);
    int found = 0;
    for (int i = 0; i < evs.n; i++) {
        if (evs.ev[i].data != NULL
            && at(evs.ev[i].data, "choices/0/delta/images") != NULL)
        {
            assert_string_equal(str_at(evs.ev[i].data,
                                    "choices/0/delta/images/0/image_url/url"),
                                "data:image/jpeg;base64,/9j/");
            found++;
        }
    }
    assert_int_equal(found, 1);
    evs_free(&evs);
}


static void
test_gemini_function_call_answer_becomes_tool_calls(void **state)
{
    json_t       *j, *args;
    json_error_t  err;
    const char   *a;
    (void) state;

    j = response(24, LLMGW_EP_CHAT,
        "{'candidates':[{'content':{'role':'model','parts':["
        "{'functionCall':{'name':'f','args':{'a':1}}},"
        "{'functionCall':{'name':'g','args':{}}}]},"
        "'finishReason':'STOP'}]}");

    assert_string_equal(str_at(j, "choices/0/finish_reason"), "tool_calls");
    assert_true(json_is_null(at(j, "choices/0/message/content")));
    assert_int_equal(size_at(j, "choices/0/message/tool_calls"), 2);
    assert_memory_equal(str_at(j, "choices/0/message/tool_calls/0/id"),
                        "call_", 5);
    assert_string_not_equal(str_at(j, "choices/0/message/tool_calls/0/id"),
                            str_at(j, "choices/0/message/tool_calls/1/id"));
    assert_string_equal(
        str_at(j, "choices/0/message/tool_calls/0/function/name"), "f");
    a = str_at(j, "choices/0/message/tool_calls/0/function/arguments");
    args = json_loads(a, 0, &err);
    assert_non_null(args);
    assert_int_equal(int_at(args, "a"), 1);
    json_decref(args);
    json_decref(j);
}


static void
test_gemini_finish_reasons_map_to_finish_reasons(void **state)
{
    static const char *const map[][2] = {
        { "STOP", "stop" }, { "MAX_TOKENS", "length" },
        { "SAFETY", "content_filter" }, { "RECITATION", "content_filter" },
    };
    char body[256];
    (void) state;

    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        snprintf(body, sizeof(body), "{'candidates':[{'content':{'parts':"
                 "[{'text':'x'}]},'finishReason':'%s'}]}", map[i][0]);
        json_t *j = response(24, LLMGW_EP_CHAT, body);
        assert_string_equal(str_at(j, "choices/0/finish_reason"), map[i][1]);
        json_decref(j);
    }
}


static void
test_openai_answer_becomes_anthropic_message(void **state)
{
    json_t *j = response(1, LLMGW_EP_MESSAGES,
        "{'id':'chatcmpl-1','object':'chat.completion','choices':[{'index':0,"
        "'message':{'role':'assistant','content':'Hi','tool_calls':[{"
        "'id':'call_1','type':'function','function':{'name':'f',"
        "'arguments':'{`a`:1}'}}]},'finish_reason':'tool_calls'}],"
        "'usage':{'prompt_tokens':9,'completion_tokens':4,'total_tokens':13}}");
    (void) state;

    assert_string_equal(str_at(j, "type"), "message");
    assert_string_equal(str_at(j, "role"), "assistant");
    assert_string_equal(str_at(j, "model"), "client-m");
    assert_string_equal(str_at(j, "content/0/type"), "text");
    assert_string_equal(str_at(j, "content/0/text"), "Hi");
    assert_string_equal(str_at(j, "content/1/type"), "tool_use");
    assert_string_equal(str_at(j, "content/1/id"), "call_1");
    assert_string_equal(str_at(j, "content/1/name"), "f");
    assert_int_equal(int_at(j, "content/1/input/a"), 1);
    assert_string_equal(str_at(j, "stop_reason"), "tool_use");
    assert_true(json_is_null(at(j, "stop_sequence")));
    assert_int_equal(int_at(j, "usage/input_tokens"), 9);
    assert_int_equal(int_at(j, "usage/output_tokens"), 4);
    json_decref(j);
}


static void
test_openai_reasoning_refusal_and_cache_reach_a_messages_client(void **state)
{
    /* all tokens spent thinking: empty content, finish_reason length */
    json_t *j = response(1, LLMGW_EP_MESSAGES,
        "{'id':'c','choices':[{'index':0,'message':{'role':'assistant',"
        "'content':'','reasoning_content':'Let me think'},"
        "'finish_reason':'length'}],'usage':{'prompt_tokens':100,"
        "'completion_tokens':50,'prompt_tokens_details':"
        "{'cached_tokens':80}}}");
    (void) state;

    assert_int_equal(size_at(j, "content"), 1);
    assert_string_equal(str_at(j, "content/0/type"), "thinking");
    assert_string_equal(str_at(j, "content/0/thinking"), "Let me think");
    assert_string_equal(str_at(j, "stop_reason"), "max_tokens");
    assert_int_equal(int_at(j, "usage/input_tokens"), 20);
    assert_int_equal(int_at(j, "usage/cache_read_input_tokens"), 80);
    assert_int_equal(int_at(j, "usage/output_tokens"), 50);
    json_decref(j);

    j = response(1, LLMGW_EP_MESSAGES,
        "{'choices':[{'message':{'role':'assistant','content':null,"
        "'refusal':'I cannot help with that'},'finish_reason':'stop'}]}");
    assert_string_equal(str_at(j, "content/0/type"), "text");
    assert_string_equal(str_at(j, "content/0/text"), "I cannot help with that");
    assert_string_equal(str_at(j, "stop_reason"), "refusal");
    json_decref(j);
}


static void
test_openai_finish_reasons_map_to_stop_reasons(void **state)
{
    static const char *const map[][2] = {
        { "stop", "end_turn" }, { "length", "max_tokens" },
        { "tool_calls", "tool_use" }, { "content_filter", "refusal" },
    };
    char body[256];
    (void) state;

    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        snprintf(body, sizeof(body), "{'choices':[{'message':{'role':"
                 "'assistant','content':'x'},'finish_reason':'%s'}]}",
                 map[i][0]);
        json_t *j = response(1, LLMGW_EP_MESSAGES, body);
        assert_string_equal(str_at(j, "stop_reason"), map[i][1]);
        json_decref(j);
    }
}


/* ---- streams ---- */

#define A_START \
    "event: message_start\ndata: {'type':'message_start','message':{" \
    "'id':'msg_1','type':'message','role':'assistant','content':[]," \
    "'model':'claude','usage':{'input_tokens':10," \
    "'cache_read_input_tokens':5,'cache_creation_input_tokens':0," \
    "'output_tokens':1}}}\n\n"

#define A_TEXT_DELTA(i, t) \
    "event: content_block_delta\ndata: {'type':'content_block_delta'," \
    "'index':" #i ",'delta':{'type':'text_delta','text':'" t "'}}\n\n"

#define A_STOP(i) \
    "event: content_block_stop\ndata: {'type':'content_block_stop'," \
    "'index':" #i "}\n\n"


static void
test_anthropic_stream_to_openai_chunks_keeps_usage(void **state)
{
    evs_t evs;
    (void) state;

    stream(14, LLMGW_EP_CHAT,
        A_START
        "event: content_block_start\ndata: {'type':'content_block_start',"
        "'index':0,'content_block':{'type':'text','text':''}}\n\n"
        "event: ping\ndata: {'type':'ping'}\n\n"
        A_TEXT_DELTA(0, "Hel")
        A_TEXT_DELTA(0, "lo")
        A_STOP(0)
        "event: message_delta\ndata: {'type':'message_delta','delta':"
        "{'stop_reason':'end_turn','stop_sequence':null},"
        "'usage':{'output_tokens':7}}\n\n"
        "event: message_stop\ndata: {'type':'message_stop'}\n\n",
        &evs);

    assert_int_equal(evs.n, 6);

    for (int i = 0; i < evs.n; i++) {
        /* chat clients read plain data: lines */
        assert_string_equal(evs.ev[i].name, "message");
    }

    assert_string_equal(str_at(evs.ev[0].data, "object"),
                        "chat.completion.chunk");
    assert_string_equal(str_at(evs.ev[0].data, "id"), "msg_1");
    assert_string_equal(str_at(evs.ev[0].data, "model"), "client-m");
    assert_string_equal(str_at(evs.ev[0].data, "choices/0/delta/role"),
                        "assistant");
    assert_string_equal(str_at(evs.ev[1].data, "choices/0/delta/content"),
                        "Hel");
    assert_true(json_is_null(at(evs.ev[1].data, "choices/0/finish_reason")));
    assert_string_equal(str_at(evs.ev[2].data, "choices/0/delta/content"),
                        "lo");
    assert_string_equal(str_at(evs.ev[3].data, "choices/0/finish_reason"),
                        "stop");

    assert_int_equal(size_at(evs.ev[4].data, "choices"), 0);
    assert_int_equal(int_at(evs.ev[4].data, "usage/prompt_tokens"), 15);
    assert_int_equal(int_at(evs.ev[4].data, "usage/completion_tokens"), 7);
    assert_int_equal(int_at(evs.ev[4].data, "usage/total_tokens"), 22);

    assert_true(evs.ev[5].done);
    evs_free(&evs);
}


static void
test_anthropic_stream_tool_use_becomes_tool_call_deltas(void **state)
{
    evs_t evs;
    (void) state;

    stream(14, LLMGW_EP_CHAT,
        A_START
        "event: content_block_start\ndata: {'type':'content_block_start',"
        "'index':0,'content_block':{'type':'text','text':''}}\n\n"
        A_TEXT_DELTA(0, "ok")
        A_STOP(0)
        "event: content_block_start\ndata: {'type':'content_block_start',"
        "'index':1,'content_block':{'type':'tool_use','id':'toolu_1',"
        "'name':'f','input':{}}}\n\n"
        "event: content_block_delta\ndata: {'type':'content_block_delta',"
        "'index':1,'delta':{'type':'input_json_delta',"
        "'partial_json':'{`a`'}}\n\n"
        "event: content_block_delta\ndata: {'type':'content_block_delta',"
        "'index':1,'delta':{'type':'input_json_delta',"
        "'partial_json':':1}'}}\n\n"
        A_STOP(1)
        "event: message_delta\ndata: {'type':'message_delta','delta':"
        "{'stop_reason':'tool_use'},'usage':{'output_tokens':9}}\n\n"
        "event: message_stop\ndata: {'type':'message_stop'}\n\n",
        &evs);

    /* role, "ok", tool start, 2 argument pieces, finish, usage, DONE */
    assert_int_equal(evs.n, 8);
    json_t *call = at(evs.ev[2].data, "choices/0/delta/tool_calls/0");
    assert_int_equal(int_at(call, "index"), 0);
    assert_string_equal(str_at(call, "id"), "toolu_1");
    assert_string_equal(str_at(call, "type"), "function");
    assert_string_equal(str_at(call, "function/name"), "f");
    assert_string_equal(str_at(call, "function/arguments"), "");

    call = at(evs.ev[3].data, "choices/0/delta/tool_calls/0");
    assert_int_equal(int_at(call, "index"), 0);
    assert_string_equal(str_at(call, "function/arguments"), "{\"a\"");
    call = at(evs.ev[4].data, "choices/0/delta/tool_calls/0");
    assert_string_equal(str_at(call, "function/arguments"), ":1}");

    assert_string_equal(str_at(evs.ev[5].data, "choices/0/finish_reason"),
                        "tool_calls");
    assert_int_equal(int_at(evs.ev[6].data, "usage/completion_tokens"), 9);
    assert_true(evs.ev[7].done);
    evs_free(&evs);
}


#define A_TOOL_START(i, id, name) \
    "event: content_block_start\ndata: {'type':'content_block_start'," \
    "'index':" #i ",'content_block':{'type':'tool_use','id':'" id "'," \
    "'name':'" name "','input':{}}}\n\n"

#define A_JSON_DELTA(i, j) \
    "event: content_block_delta\ndata: {'type':'content_block_delta'," \
    "'index':" #i ",'delta':{'type':'input_json_delta'," \
    "'partial_json':'" j "'}}\n\n"


static void
test_anthropic_stream_tool_uses_become_tool_calls_in_order(void **state)
{
    evs_t  evs;
    char   args[2][64] = { "", "" };
    (void) state;

    stream(14, LLMGW_EP_CHAT,
        A_START
        A_TOOL_START(0, "toolu_1", "f")
        A_JSON_DELTA(0, "{`a`")
        A_JSON_DELTA(0, ":1}")
        A_STOP(0)
        A_TOOL_START(1, "toolu_2", "g")
        A_JSON_DELTA(1, "{`b`")
        A_JSON_DELTA(1, ":2}")
        A_STOP(1)
        "event: message_delta\ndata: {'type':'message_delta','delta':"
        "{'stop_reason':'tool_use'},'usage':{'output_tokens':9}}\n\n"
        "event: message_stop\ndata: {'type':'message_stop'}\n\n",
        &evs);

    /* role, 2 x (call, 2 argument pieces), finish, usage, DONE */
    assert_int_equal(evs.n, 10);

    int  last = -1;

    for (int i = 1; i <= 6; i++) {
        json_t *call = at(evs.ev[i].data, "choices/0/delta/tool_calls/0");
        int     n = (int) int_at(call, "index");

        /* calls come in turn, each announced once with its id */
        assert_true(n == last || n == last + 1);
        if (n == last + 1) {
            assert_string_equal(str_at(call, "id"),
                                n == 0 ? "toolu_1" : "toolu_2");
            assert_string_equal(str_at(call, "function/name"),
                                n == 0 ? "f" : "g");
            last = n;
        }
        strcat(args[n], str_at(call, "function/arguments"));
    }

    assert_int_equal(last, 1);
    assert_string_equal(args[0], "{\"a\":1}");
    assert_string_equal(args[1], "{\"b\":2}");
    assert_string_equal(str_at(evs.ev[7].data, "choices/0/finish_reason"),
                        "tool_calls");
    assert_true(evs.ev[9].done);
    evs_free(&evs);
}


static void
test_anthropic_stream_tool_without_arguments_gets_an_empty_object(void **state)
{
    evs_t evs;
    (void) state;

    /* a tool with no parameters: one empty partial_json, or none at all */
    stream(14, LLMGW_EP_CHAT,
        A_START
        "event: content_block_start\ndata: {'type':'content_block_start',"
        "'index':0,'content_block':{'type':'tool_use','id':'toolu_1',"
        "'name':'now','input':{}}}\n\n"
        "event: content_block_delta\ndata: {'type':'content_block_delta',"
        "'index':0,'delta':{'type':'input_json_delta','partial_json':''}}\n\n"
        A_STOP(0)
        "event: content_block_start\ndata: {'type':'content_block_start',"
        "'index':1,'content_block':{'type':'tool_use','id':'toolu_2',"
        "'name':'later','input':{}}}\n\n"
        "event: message_delta\ndata: {'type':'message_delta','delta':"
        "{'stop_reason':'tool_use'},'usage':{'output_tokens':3}}\n\n"
        "event: message_stop\ndata: {'type':'message_stop'}\n\n",
        &evs);

    /* role, start 0, "{}" for 0, start 1, "{}" for 1, finish, usage, DONE */
    assert_int_equal(evs.n, 8);
    json_t *call = at(evs.ev[2].data, "choices/0/delta/tool_calls/0");
    assert_int_equal(int_at(call, "index"), 0);
    assert_string_equal(str_at(call, "function/arguments"), "{}");
    call = at(evs.ev[4].data, "choices/0/delta/tool_calls/0");
    assert_int_equal(int_at(call, "index"), 1);
    assert_string_equal(str_at(call, "function/arguments"), "{}");
    assert_string_equal(str_at(evs.ev[5].data, "choices/0/finish_reason"),
                        "tool_calls");
    assert_true(evs.ev[7].done);
    evs_free(&evs);
}


static void
test_anthropic_stream_error_becomes_openai_error_chunk(void **state)
{
    evs_t evs;
    (void) state;

    stream(14, LLMGW_EP_CHAT,
        "event: error\ndata: {'type':'error','error':{"
        "'type':'overloaded_error','message':'Overloaded'}}\n\n",
        &evs);

    /* the error ends the stream: no [DONE] to say it is whole */
    assert_int_equal(evs.n, 1);
    assert_string_equal(str_at(evs.ev[0].data, "error/message"),
                        "Overloaded");
    /* the contract's type; the upstream's type is the code */
    assert_string_equal(str_at(evs.ev[0].data, "error/type"),
                        "upstream_error");
    assert_string_equal(str_at(evs.ev[0].data, "error/code"),
                        "overloaded_error");
    evs_free(&evs);
}


static void
test_stream_error_after_text_ends_without_usage_or_done(void **state)
{
    evs_t evs;
    (void) state;

    /* Anthropic, then Gemini: some text, then the upstream's error */
    stream(14, LLMGW_EP_CHAT,
        "event: message_start\ndata: {'type':'message_start','message':{"
        "'id':'msg_1','usage':{'input_tokens':5,'output_tokens':1}}}\n\n"
        "event: content_block_start\ndata: {'type':'content_block_start',"
        "'index':0,'content_block':{'type':'text','text':''}}\n\n"
        "event: content_block_delta\ndata: {'type':'content_block_delta',"
        "'index':0,'delta':{'type':'text_delta','text':'Hel'}}\n\n"
        "event: error\ndata: {'type':'error','error':{"
        "'type':'overloaded_error','message':'Overloaded'}}\n\n",
        &evs);

    assert_true(evs.n >= 2);
    assert_string_equal(str_at(evs.ev[evs.n - 1].data, "error/message"),
                        "Overloaded");
    for (int i = 0; i < evs.n; i++) {
        assert_false(evs.ev[i].done);
        assert_null(at(evs.ev[i].data, "usage"));
    }
    evs_free(&evs);

    stream(24, LLMGW_EP_CHAT,
        "data: {'candidates':[{'content':{'parts':[{'text':'Hel'}]}}],"
        "'usageMetadata':{'promptTokenCount':5,'candidatesTokenCount':1}}\n\n"
        "data: {'error':{'code':503,'message':'unavailable',"
        "'status':'UNAVAILABLE'}}\n\n",
        &evs);

    assert_true(evs.n >= 2);
    assert_non_null(at(evs.ev[evs.n - 1].data, "error"));
    for (int i = 0; i < evs.n; i++) {
        assert_false(evs.ev[i].done);
    }
    evs_free(&evs);
}


static void
test_openai_stream_without_chunks_is_an_anthropic_error(void **state)
{
    evs_t evs;
    (void) state;

    /* only [DONE], or nothing at all */
    stream(1, LLMGW_EP_MESSAGES, "data: [DONE]\n\n", &evs);
    assert_int_equal(evs.n, 1);
    assert_string_equal(str_at(evs.ev[0].data, "type"), "error");
    assert_string_equal(str_at(evs.ev[0].data, "error/type"), "api_error");
    evs_free(&evs);

    stream(1, LLMGW_EP_MESSAGES, "", &evs);
    assert_int_equal(evs.n, 1);
    assert_string_equal(str_at(evs.ev[0].data, "type"), "error");
    evs_free(&evs);
}


/*
 * A stream cut before its finish reason ends with an error chunk and no
 * [DONE]: a [DONE] would tell the client the answer was whole.
 */
static void
test_anthropic_stream_cut_short_ends_with_an_error_not_done(void **state)
{
    evs_t evs;
    (void) state;

    stream(14, LLMGW_EP_CHAT, A_START A_TEXT_DELTA(0, "partial"), &evs);

    /* role, text, error */
    assert_int_equal(evs.n, 3);
    assert_string_equal(str_at(evs.ev[2].data, "error/type"),
                        "upstream_error");
    assert_non_null(strstr(str_at(evs.ev[2].data, "error/message"),
                           "ended before its finish reason"));
    evs_free(&evs);
}


static void
test_gemini_stream_cut_short_ends_with_an_error_not_done(void **state)
{
    evs_t evs;
    (void) state;

    stream(24, LLMGW_EP_CHAT,
           "data: {'candidates':[{'content':{'parts':[{'text':'par'}]}}]}\n\n",
           &evs);

    assert_int_equal(evs.n, 3);
    assert_false(evs.ev[2].done);
    assert_string_equal(str_at(evs.ev[2].data, "error/type"),
                        "upstream_error");
    evs_free(&evs);
}


static void
test_gemini_stream_to_openai_chunks_sends_usage_at_end(void **state)
{
    evs_t evs;
    (void) state;

    stream(24, LLMGW_EP_CHAT,
        "data: {'candidates':[{'content':{'role':'model','parts':"
        "[{'text':'Hel'}]}}],'usageMetadata':{'promptTokenCount':5,"
        "'candidatesTokenCount':1},'responseId':'r1'}\n\n"
        "data: {'candidates':[{'content':{'role':'model','parts':"
        "[{'text':'lo'}]},'finishReason':'STOP'}],'usageMetadata':"
        "{'promptTokenCount':5,'candidatesTokenCount':2,"
        "'thoughtsTokenCount':3}}\n\n",
        &evs);

    assert_int_equal(evs.n, 6);
    assert_string_equal(str_at(evs.ev[0].data, "id"), "r1");
    assert_string_equal(str_at(evs.ev[0].data, "choices/0/delta/role"),
                        "assistant");
    assert_string_equal(str_at(evs.ev[1].data, "choices/0/delta/content"),
                        "Hel");
    assert_string_equal(str_at(evs.ev[2].data, "choices/0/delta/content"),
                        "lo");
    assert_string_equal(str_at(evs.ev[3].data, "choices/0/finish_reason"),
                        "stop");
    /* the last usageMetadata counts, thinking as output */
    assert_int_equal(int_at(evs.ev[4].data, "usage/prompt_tokens"), 5);
    assert_int_equal(int_at(evs.ev[4].data, "usage/completion_tokens"), 5);
    assert_true(evs.ev[5].done);
    evs_free(&evs);
}


static void
test_gemini_stream_function_call_becomes_whole_tool_call(void **state)
{
    evs_t evs;
    (void) state;

    stream(24, LLMGW_EP_CHAT,
        "data: {'candidates':[{'content':{'role':'model','parts':"
        "[{'functionCall':{'name':'f','args':{'a':1}}}]},"
        "'finishReason':'STOP'}]}\n\n",
        &evs);

    /* role, tool call, finish, DONE (no usage was reported) */
    assert_int_equal(evs.n, 4);
    json_t *call = at(evs.ev[1].data, "choices/0/delta/tool_calls/0");
    assert_int_equal(int_at(call, "index"), 0);
    assert_memory_equal(str_at(call, "id"), "call_", 5);
    assert_string_equal(str_at(call, "function/name"), "f");
    assert_string_equal(str_at(call, "function/arguments"), "{\"a\":1}");
    assert_string_equal(str_at(evs.ev[2].data, "choices/0/finish_reason"),
                        "tool_calls");
    assert_true(evs.ev[3].done);
    evs_free(&evs);
}


#define O_CHUNK(delta, finish) \
    "data: {'id':'chatcmpl-1','object':'chat.completion.chunk'," \
    "'created':1,'model':'gpt','choices':[{'index':0,'delta':" delta \
    ",'finish_reason':" finish "}]}\n\n"

#define O_USAGE(p, c) \
    "data: {'id':'chatcmpl-1','object':'chat.completion.chunk'," \
    "'created':1,'model':'gpt','choices':[],'usage':{'prompt_tokens':" \
    #p ",'completion_tokens':" #c ",'total_tokens':0}}\n\n"


static void
assert_event(evs_t *evs, int i, const char *type)
{
    assert_true(i < evs->n);
    assert_string_equal(evs->ev[i].name, type);
    assert_non_null(evs->ev[i].data);
    assert_string_equal(str_at(evs->ev[i].data, "type"), type);
}


static void
test_openai_stream_to_anthropic_events(void **state)
{
    evs_t evs;
    (void) state;

    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'role':'assistant','content':''}", "null")
        O_CHUNK("{'content':'Hel'}", "null")
        O_CHUNK("{'content':'lo'}", "null")
        O_CHUNK("{}", "'stop'")
        O_USAGE(9, 2)
        "data: [DONE]\n\n",
        &evs);

    assert_int_equal(evs.n, 7);
    assert_event(&evs, 0, "message_start");
    assert_string_equal(str_at(evs.ev[0].data, "message/id"), "chatcmpl-1");
    assert_string_equal(str_at(evs.ev[0].data, "message/type"), "message");
    assert_string_equal(str_at(evs.ev[0].data, "message/role"), "assistant");
    assert_string_equal(str_at(evs.ev[0].data, "message/model"), "client-m");
    assert_int_equal(size_at(evs.ev[0].data, "message/content"), 0);
    assert_true(json_is_null(at(evs.ev[0].data, "message/stop_reason")));

    assert_event(&evs, 1, "content_block_start");
    assert_int_equal(int_at(evs.ev[1].data, "index"), 0);
    assert_string_equal(str_at(evs.ev[1].data, "content_block/type"), "text");

    assert_event(&evs, 2, "content_block_delta");
    assert_string_equal(str_at(evs.ev[2].data, "delta/type"), "text_delta");
    assert_string_equal(str_at(evs.ev[2].data, "delta/text"), "Hel");
    assert_event(&evs, 3, "content_block_delta");
    assert_string_equal(str_at(evs.ev[3].data, "delta/text"), "lo");

    assert_event(&evs, 4, "content_block_stop");
    assert_int_equal(int_at(evs.ev[4].data, "index"), 0);

    /* held back until the usage chunk, so no count is lost */
    assert_event(&evs, 5, "message_delta");
    assert_string_equal(str_at(evs.ev[5].data, "delta/stop_reason"),
                        "end_turn");
    assert_true(json_is_null(at(evs.ev[5].data, "delta/stop_sequence")));
    assert_int_equal(int_at(evs.ev[5].data, "usage/output_tokens"), 2);
    assert_int_equal(int_at(evs.ev[5].data, "usage/input_tokens"), 9);

    assert_event(&evs, 6, "message_stop");
    evs_free(&evs);
}


static void
test_openai_stream_tool_calls_become_tool_use_blocks(void **state)
{
    evs_t evs;
    (void) state;

    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'role':'assistant','content':'Checking'}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'id':'call_1','type':'function',"
                "'function':{'name':'f','arguments':''}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'function':"
                "{'arguments':'{`a`'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'function':"
                "{'arguments':':1}'}}]}", "null")
        O_CHUNK("{}", "'tool_calls'")
        O_USAGE(20, 6)
        "data: [DONE]\n\n",
        &evs);

    assert_int_equal(evs.n, 10);
    assert_event(&evs, 0, "message_start");
    assert_event(&evs, 1, "content_block_start");
    assert_event(&evs, 2, "content_block_delta");
    assert_string_equal(str_at(evs.ev[2].data, "delta/text"), "Checking");
    assert_event(&evs, 3, "content_block_stop");
    assert_int_equal(int_at(evs.ev[3].data, "index"), 0);

    assert_event(&evs, 4, "content_block_start");
    assert_int_equal(int_at(evs.ev[4].data, "index"), 1);
    assert_string_equal(str_at(evs.ev[4].data, "content_block/type"),
                        "tool_use");
    assert_string_equal(str_at(evs.ev[4].data, "content_block/id"), "call_1");
    assert_string_equal(str_at(evs.ev[4].data, "content_block/name"), "f");
    assert_int_equal(size_at(evs.ev[4].data, "content_block/input"), 0);

    assert_event(&evs, 5, "content_block_delta");
    assert_int_equal(int_at(evs.ev[5].data, "index"), 1);
    assert_string_equal(str_at(evs.ev[5].data, "delta/type"),
                        "input_json_delta");
    assert_string_equal(str_at(evs.ev[5].data, "delta/partial_json"),
                        "{\"a\"");
    assert_event(&evs, 6, "content_block_delta");
    assert_string_equal(str_at(evs.ev[6].data, "delta/partial_json"), ":1}");

    assert_event(&evs, 7, "content_block_stop");
    assert_int_equal(int_at(evs.ev[7].data, "index"), 1);
    assert_event(&evs, 8, "message_delta");
    assert_string_equal(str_at(evs.ev[8].data, "delta/stop_reason"),
                        "tool_use");
    assert_int_equal(int_at(evs.ev[8].data, "usage/output_tokens"), 6);
    assert_event(&evs, 9, "message_stop");
    evs_free(&evs);
}


/*
 * What an Anthropic client needs of the content events: block indexes
 * 0, 1, 2, ... each started once, every delta and the stop for the open
 * block only.  Each tool_use block's partial_json pieces are joined into
 * args[index] (args may be NULL); returns the number of blocks.
 */
static int
assert_blocks_well_formed(evs_t *evs, char args[][128])
{
    int  open = -1;
    int  blocks = 0;

    for (int i = 0; i < evs->n; i++) {
        const char *name = evs->ev[i].name;
        json_t     *d = evs->ev[i].data;

        if (strcmp(name, "content_block_start") == 0) {
            assert_int_equal(open, -1);
            assert_int_equal(int_at(d, "index"), blocks);
            open = blocks++;
            if (args != NULL) {
                args[open][0] = '\0';
            }

        } else if (strcmp(name, "content_block_delta") == 0) {
            assert_int_equal(int_at(d, "index"), open);
            if (args != NULL && strcmp(str_at(d, "delta/type"),
                                       "input_json_delta") == 0)
            {
                const char *part = str_at(d, "delta/partial_json");
                assert_true(strlen(args[open]) + strlen(part) < 128);
                strcat(args[open], part);
            }

        } else if (strcmp(name, "content_block_stop") == 0) {
            assert_int_equal(int_at(d, "index"), open);
            open = -1;

        } else if (strcmp(name, "message_delta") == 0
                   || strcmp(name, "message_stop") == 0)
        {
            assert_int_equal(open, -1);
        }
    }

    return blocks;
}


static void
test_openai_interleaved_tool_calls_keep_each_block_whole(void **state)
{
    evs_t  evs;
    char   args[4][128];
    (void) state;

    /* parallel calls whose pieces take turns, after some text */
    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'role':'assistant','content':'Checking'}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'id':'call_1','type':'function',"
                "'function':{'name':'f','arguments':''}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':1,'id':'call_2','type':'function',"
                "'function':{'name':'g','arguments':''}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'function':"
                "{'arguments':'{`a`'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':1,'function':"
                "{'arguments':'{`b`'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'function':"
                "{'arguments':':1}'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':1,'function':"
                "{'arguments':':2}'}}]}", "null")
        O_CHUNK("{}", "'tool_calls'")
        O_USAGE(20, 6)
        "data: [DONE]\n\n",
        &evs);

    assert_int_equal(assert_blocks_well_formed(&evs, args), 3);
    assert_event(&evs, 0, "message_start");
    assert_event(&evs, 1, "content_block_start");
    assert_string_equal(str_at(evs.ev[1].data, "content_block/type"), "text");
    assert_string_equal(str_at(evs.ev[2].data, "delta/text"), "Checking");

    /* the first call streams as it comes */
    assert_event(&evs, 4, "content_block_start");
    assert_string_equal(str_at(evs.ev[4].data, "content_block/id"), "call_1");
    assert_string_equal(str_at(evs.ev[4].data, "content_block/name"), "f");
    assert_string_equal(str_at(evs.ev[5].data, "delta/partial_json"),
                        "{\"a\"");
    assert_string_equal(str_at(evs.ev[6].data, "delta/partial_json"), ":1}");
    assert_string_equal(args[1], "{\"a\":1}");

    assert_event(&evs, 7, "content_block_stop");
    assert_event(&evs, 8, "content_block_start");
    assert_string_equal(str_at(evs.ev[8].data, "content_block/type"),
                        "tool_use");
    assert_string_equal(str_at(evs.ev[8].data, "content_block/id"), "call_2");
    assert_string_equal(str_at(evs.ev[8].data, "content_block/name"), "g");
    assert_string_equal(args[2], "{\"b\":2}");

    assert_int_equal(evs.n, 13);
    assert_event(&evs, 10, "content_block_stop");
    assert_event(&evs, 11, "message_delta");
    assert_string_equal(str_at(evs.ev[11].data, "delta/stop_reason"),
                        "tool_use");
    assert_int_equal(int_at(evs.ev[11].data, "usage/output_tokens"), 6);
    assert_event(&evs, 12, "message_stop");
    evs_free(&evs);
}


static void
test_openai_tool_calls_wait_until_the_open_one_is_whole(void **state)
{
    evs_t  evs;
    char   args[4][128];
    (void) state;

    /* a brace inside a string does not end the first call's arguments;
       the third call's arguments end only after everything else */
    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'role':'assistant','tool_calls':["
                "{'index':0,'id':'call_1','type':'function','function':"
                "{'name':'f','arguments':'{`q`:`}\\\\`{`'}},"
                "{'index':1,'id':'call_2','type':'function','function':"
                "{'name':'g','arguments':''}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':2,'id':'call_3','type':'function',"
                "'function':{'name':'h','arguments':'{`x`:['}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':1,'function':"
                "{'arguments':'{}'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'function':"
                "{'arguments':',`n`:1}'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':2,'function':"
                "{'arguments':'1]'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':2,'function':"
                "{'arguments':'}'}}]}", "null")
        O_CHUNK("{}", "'tool_calls'")
        O_USAGE(20, 6)
        "data: [DONE]\n\n",
        &evs);

    assert_int_equal(assert_blocks_well_formed(&evs, args), 3);
    assert_string_equal(str_at(evs.ev[1].data, "content_block/id"), "call_1");
    assert_string_equal(args[0], "{\"q\":\"}\\\"{\",\"n\":1}");
    assert_string_equal(str_at(evs.ev[5].data, "content_block/id"), "call_2");
    assert_string_equal(args[1], "{}");
    assert_string_equal(str_at(evs.ev[8].data, "content_block/id"), "call_3");
    assert_string_equal(args[2], "{\"x\":[1]}");

    /* once the third call's block is open, its pieces stream */
    assert_int_equal(evs.n, 14);
    assert_string_equal(str_at(evs.ev[9].data, "delta/partial_json"),
                        "{\"x\":[1]");
    assert_string_equal(str_at(evs.ev[10].data, "delta/partial_json"), "}");
    assert_string_equal(str_at(evs.ev[12].data, "delta/stop_reason"),
                        "tool_use");
    assert_event(&evs, 13, "message_stop");
    evs_free(&evs);
}


static void
test_openai_tool_calls_one_after_another_stream_piece_by_piece(void **state)
{
    evs_t  evs;
    char   args[4][128];
    (void) state;

    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'role':'assistant','tool_calls':[{'index':0,'id':'call_1',"
                "'type':'function','function':{'name':'f','arguments':''}}]}",
                "null")
        O_CHUNK("{'tool_calls':[{'index':0,'function':"
                "{'arguments':'{`a`'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'function':"
                "{'arguments':':1}'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':1,'id':'call_2','type':'function',"
                "'function':{'name':'g','arguments':''}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':1,'function':"
                "{'arguments':'{`b`'}}]}", "null")
        O_CHUNK("{'tool_calls':[{'index':1,'function':"
                "{'arguments':':2}'}}]}", "null")
        O_CHUNK("{}", "'tool_calls'")
        O_USAGE(20, 6)
        "data: [DONE]\n\n",
        &evs);

    /* each piece its own delta, none held back */
    assert_int_equal(assert_blocks_well_formed(&evs, args), 2);
    assert_int_equal(evs.n, 11);
    assert_event(&evs, 1, "content_block_start");
    assert_string_equal(str_at(evs.ev[2].data, "delta/partial_json"),
                        "{\"a\"");
    assert_string_equal(str_at(evs.ev[3].data, "delta/partial_json"), ":1}");
    assert_event(&evs, 4, "content_block_stop");
    assert_event(&evs, 5, "content_block_start");
    assert_string_equal(str_at(evs.ev[5].data, "content_block/id"), "call_2");
    assert_string_equal(str_at(evs.ev[6].data, "delta/partial_json"),
                        "{\"b\"");
    assert_string_equal(str_at(evs.ev[7].data, "delta/partial_json"), ":2}");
    assert_event(&evs, 8, "content_block_stop");
    assert_string_equal(args[0], "{\"a\":1}");
    assert_string_equal(args[1], "{\"b\":2}");
    evs_free(&evs);
}


static void
test_openai_stream_without_usage_or_done_is_closed_at_finish(void **state)
{
    evs_t evs;
    (void) state;

    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'role':'assistant','content':'x'}", "null")
        O_CHUNK("{}", "'length'"),
        &evs);

    assert_int_equal(evs.n, 6);
    assert_event(&evs, 3, "content_block_stop");
    assert_event(&evs, 4, "message_delta");
    assert_string_equal(str_at(evs.ev[4].data, "delta/stop_reason"),
                        "max_tokens");
    assert_event(&evs, 5, "message_stop");
    evs_free(&evs);
}


static void
test_openai_stream_thinking_tools_and_cut_short_to_messages(void **state)
{
    evs_t evs;
    (void) state;

    /* reasoning first, then a tool call only: no empty text block */
    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'role':'assistant','reasoning_content':'Hm'}", "null")
        O_CHUNK("{'reasoning_content':'m.'}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'id':'call_1','type':'function',"
                "'function':{'name':'f','arguments':'{}'}}]}", "null")
        O_CHUNK("{}", "'tool_calls'")
        "data: {'id':'chatcmpl-1','object':'chat.completion.chunk',"
        "'created':1,'model':'gpt','choices':[],'usage':{'prompt_tokens':"
        "30,'completion_tokens':7,'prompt_tokens_details':"
        "{'cached_tokens':10}}}\n\n"
        "data: [DONE]\n\n",
        &evs);

    assert_int_equal(evs.n, 10);
    assert_event(&evs, 0, "message_start");
    assert_event(&evs, 1, "content_block_start");
    assert_int_equal(int_at(evs.ev[1].data, "index"), 0);
    assert_string_equal(str_at(evs.ev[1].data, "content_block/type"),
                        "thinking");
    assert_string_equal(str_at(evs.ev[2].data, "delta/type"),
                        "thinking_delta");
    assert_string_equal(str_at(evs.ev[2].data, "delta/thinking"), "Hm");
    assert_string_equal(str_at(evs.ev[3].data, "delta/thinking"), "m.");
    assert_event(&evs, 4, "content_block_stop");
    assert_event(&evs, 5, "content_block_start");
    assert_int_equal(int_at(evs.ev[5].data, "index"), 1);
    assert_string_equal(str_at(evs.ev[5].data, "content_block/type"),
                        "tool_use");
    assert_event(&evs, 6, "content_block_delta");
    assert_event(&evs, 7, "content_block_stop");
    assert_event(&evs, 8, "message_delta");
    assert_string_equal(str_at(evs.ev[8].data, "delta/stop_reason"),
                        "tool_use");
    assert_int_equal(int_at(evs.ev[8].data, "usage/input_tokens"), 20);
    assert_int_equal(int_at(evs.ev[8].data, "usage/cache_read_input_tokens"),
                     10);
    assert_event(&evs, 9, "message_stop");
    evs_free(&evs);

    /* cut off: no finish reason and no [DONE] */
    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'role':'assistant','content':'Hel'}", "null"),
        &evs);

    assert_int_equal(evs.n, 5);
    assert_event(&evs, 3, "content_block_stop");
    assert_event(&evs, 4, "error");
    assert_string_equal(str_at(evs.ev[4].data, "error/type"), "api_error");
    evs_free(&evs);
}


static void
test_openai_stream_error_becomes_anthropic_error_event(void **state)
{
    evs_t evs;
    (void) state;

    stream(1, LLMGW_EP_MESSAGES,
        "data: {'error':{'message':'boom','type':'server_error'}}\n\n",
        &evs);

    assert_int_equal(evs.n, 1);
    assert_event(&evs, 0, "error");
    assert_string_equal(str_at(evs.ev[0].data, "error/type"), "server_error");
    assert_string_equal(str_at(evs.ev[0].data, "error/message"), "boom");
    evs_free(&evs);

    /* after some text: the one error event ends it */
    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'role':'assistant','content':'Hel'}", "null")
        "data: {'error':{'message':'boom','type':'server_error'}}\n\n",
        &evs);

    assert_int_equal(evs.n, 4);
    assert_event(&evs, 3, "error");
    assert_string_equal(str_at(evs.ev[3].data, "error/message"), "boom");
    evs_free(&evs);
}


/* ---- error bodies ---- */

static void
test_error_for_messages_client_has_anthropic_shape(void **state)
{
    json_t *j = take_json(llmgw_test_convert_error(LLMGW_EP_MESSAGES, 401,
        "Invalid token (request id: r1)", "gateway_error", ""));
    (void) state;

    assert_int_equal(json_object_size(j), 2);
    assert_string_equal(str_at(j, "type"), "error");
    assert_int_equal(size_at(j, "error"), 2);
    assert_string_equal(str_at(j, "error/type"), "gateway_error");
    assert_string_equal(str_at(j, "error/message"),
                        "Invalid token (request id: r1)");
    json_decref(j);

    /* without a type, Anthropic's own type for the status */
    j = take_json(llmgw_test_convert_error(LLMGW_EP_MESSAGES, 429,
                                           "slow down", "", ""));
    assert_string_equal(str_at(j, "error/type"), "rate_limit_error");
    json_decref(j);
}


static void
test_error_for_chat_client_has_contract_shape(void **state)
{
    json_t *j = take_json(llmgw_test_convert_error(LLMGW_EP_CHAT, 503,
        "no channel (request id: r2)", "gateway_error", "model_not_found"));
    (void) state;

    assert_int_equal(json_object_size(j), 1);
    assert_int_equal(size_at(j, "error"), 3);
    assert_string_equal(str_at(j, "error/message"),
                        "no channel (request id: r2)");
    assert_string_equal(str_at(j, "error/type"), "gateway_error");
    assert_string_equal(str_at(j, "error/code"), "model_not_found");
    json_decref(j);
}


/* ---- rerank ---- */

static void
test_rerank_request_sends_documents_as_strings(void **state)
{
    static const int types[] = { 34, 38, 1 };
    (void) state;

    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        json_t *j = rerank_req(types[i],
            "{'model':'rerank-x','query':'q','documents':['a',{'text':'b'}],"
            "'return_documents':true}");

        assert_string_equal(str_at(j, "model"), "up-rerank");
        assert_string_equal(str_at(j, "query"), "q");
        assert_int_equal(size_at(j, "documents"), 2);
        assert_string_equal(str_at(j, "documents/0"), "a");
        assert_string_equal(str_at(j, "documents/1"), "b");
        assert_true(json_is_true(at(j, "return_documents")));
        json_decref(j);
    }
}


static void
test_top_n_not_defaulted(void **state)
{
    json_t *j = rerank_req(34,
        "{'model':'r','query':'q','documents':['a','b','c']}");
    (void) state;

    assert_null(json_object_get(j, "top_n"));
    assert_null(json_object_get(j, "return_documents"));
    json_decref(j);

    j = rerank_req(38,
        "{'model':'r','query':'q','documents':['a','b','c'],'top_n':2}");
    assert_int_equal(int_at(j, "top_n"), 2);
    json_decref(j);
}


static void
test_rerank_validation_names_the_field(void **state)
{
    (void) state;
    rerank_req_error("{'model':'r','documents':['a']}",
                     "field query is required");
    rerank_req_error("{'model':'r','query':'','documents':['a']}",
                     "query must be a non-empty string");
    rerank_req_error("{'model':'r','query':5,'documents':['a']}",
                     "query must be a non-empty string");
    rerank_req_error("{'model':'r','query':'q'}",
                     "field documents is required");
    rerank_req_error("{'model':'r','query':'q','documents':[]}",
                     "documents must be a non-empty array");
    rerank_req_error("{'model':'r','query':'q','documents':'a'}",
                     "documents must be a non-empty array");
    rerank_req_error("{'model':'r','query':'q','documents':['a','b',3]}",
                     "documents[2] must be a string or an object with text");
    rerank_req_error("{'model':'r','query':'q','documents':['a',{'t':1}]}",
                     "documents[1] must be a string or an object with text");
    rerank_req_error("{'model':'r','query':'q','documents':['a'],'top_n':0}",
                     "top_n must be a positive integer");
    rerank_req_error("{'model':'r','query':'q','documents':['a'],"
                     "'return_documents':'yes'}",
                     "return_documents must be a boolean");
    rerank_req_error("{'query':'q','documents':['a']}",
                     "field model is required");
}


static void
test_rerank_to_chat_channel_is_refused(void **state)
{
    llmgw_buf_t b = llmgw_test_rerank_request(14,
        "{\"model\":\"r\",\"query\":\"q\",\"documents\":[\"a\"]}", "r");
    (void) state;

    take_error(b, "no conversion from rerank to channel type 14");
}


static void
test_rerank_results_sorted_by_score(void **state)
{
    json_t *j = rerank_resp(38,
        "{'model':'jina','results':[{'index':0,'relevance_score':0.1},"
        "{'index':1,'relevance_score':0.9},{'index':2,'relevance_score':0.5}],"
        "'usage':{'total_tokens':30}}",
        "{'model':'r','query':'q','documents':['a','b','c']}");
    (void) state;

    assert_int_equal(size_at(j, "results"), 3);
    assert_int_equal(int_at(j, "results/0/index"), 1);
    assert_int_equal(int_at(j, "results/1/index"), 2);
    assert_int_equal(int_at(j, "results/2/index"), 0);
    assert_true(num_at(j, "results/0/relevance_score") == 0.9);
    json_decref(j);
}


static void
test_rerank_without_return_documents_has_no_document(void **state)
{
    static const char *const clients[] = {
        "{'model':'r','query':'q','documents':['a','b']}",
        "{'model':'r','query':'q','documents':['a','b'],"
        "'return_documents':false}",
    };
    (void) state;

    for (size_t i = 0; i < 2; i++) {
        /* even when the upstream sent the documents */
        json_t *j = rerank_resp(38,
            "{'results':[{'index':0,'relevance_score':0.3,"
            "'document':{'text':'a'}},{'index':1,'relevance_score':0.6,"
            "'document':{'text':'b'}}]}",
            clients[i]);

        assert_int_equal(size_at(j, "results"), 2);
        assert_null(at(j, "results/0/document"));
        assert_null(at(j, "results/1/document"));
        json_decref(j);
    }
}


static void
test_rerank_documents_come_from_upstream_or_client(void **state)
{
    json_t *j = rerank_resp(34,
        "{'id':'c1','results':[{'index':0,'relevance_score':0.8,"
        "'document':{'text':'from upstream'}},"
        "{'index':1,'relevance_score':0.2},"
        "{'index':2,'relevance_score':0.1,'document':'plain'}]}",
        "{'model':'r','query':'q','return_documents':true,"
        "'documents':['a',{'text':'from client'},'c']}");
    (void) state;

    assert_string_equal(str_at(j, "results/0/document/text"),
                        "from upstream");
    assert_string_equal(str_at(j, "results/1/document/text"), "from client");
    assert_string_equal(str_at(j, "results/2/document/text"), "plain");
    json_decref(j);
}


static void
test_rerank_request_passes_upstream_options_on(void **state)
{
    json_t *j = rerank_req(34,
        "{'model':'r','query':'q','documents':['a'],'max_tokens_per_doc':512,"
        "'rank_fields':['text'],'top_n':null}");
    (void) state;

    assert_int_equal(int_at(j, "max_tokens_per_doc"), 512);
    assert_string_equal(str_at(j, "rank_fields/0"), "text");
    assert_string_equal(str_at(j, "model"), "up-rerank");
    assert_null(json_object_get(j, "top_n"));
    json_decref(j);
}


static void
rerank_resp_error(const char *up_sq, const char *client_sq,
    const char *expected)
{
    char        *up = unquote(up_sq);
    char        *client = unquote(client_sq);
    llmgw_buf_t  b = llmgw_test_rerank_response(34, up, client);

    free(up);
    free(client);
    take_error(b, expected);
}


static void
test_rerank_results_name_each_document_once(void **state)
{
    (void) state;
    rerank_resp_error("{'results':[{'index':0,'relevance_score':0.5},"
                      "{'index':9,'relevance_score':0.4}]}",
                      "{'model':'r','query':'q','documents':['a','b']}",
                      "the upstream rerank answer names document 9 of 2 "
                      "documents");
    rerank_resp_error("{'results':[{'index':1,'relevance_score':0.5},"
                      "{'index':1,'relevance_score':0.4}]}",
                      "{'model':'r','query':'q','documents':['a','b']}",
                      "the upstream rerank answer names document 1 twice");
}


static void
test_rerank_meta_without_billed_counts_shows_the_usage(void **state)
{
    json_t *j = rerank_resp(34,
        "{'results':[{'index':0,'relevance_score':0.5}],"
        "'meta':{'billed_units':{}},'usage':{'total_tokens':44}}",
        "{'model':'r','query':'q','documents':['a']}");
    (void) state;

    assert_null(at(j, "meta/billed_units"));
    assert_int_equal(int_at(j, "meta/tokens/input_tokens"), 44);
    json_decref(j);
}


/* The meta shown says what is billed: a value refused for billing is not
   shown, and of search units and input tokens only the one billed. */
static void
test_rerank_meta_says_what_is_billed(void **state)
{
    static const char req[] = "{'model':'r','query':'q','documents':['a']}";
    json_t *j = rerank_resp(34,
        "{'results':[{'index':0,'relevance_score':0.5}],"
        "'meta':{'billed_units':{'search_units':-1}},"
        "'usage':{'total_tokens':2199023255552}}", req);
    (void) state;

    assert_int_equal(size_at(j, "meta"), 0);
    json_decref(j);

    j = rerank_resp(34,
        "{'results':[{'index':0,'relevance_score':0.5}],"
        "'meta':{'billed_units':{'search_units':-1}},"
        "'usage':{'total_tokens':7}}", req);
    assert_null(at(j, "meta/billed_units"));
    assert_int_equal(int_at(j, "meta/tokens/input_tokens"), 7);
    json_decref(j);

    j = rerank_resp(34,
        "{'results':[{'index':0,'relevance_score':0.5}],"
        "'meta':{'billed_units':{'search_units':2,'input_tokens':100,"
        "'classifications':-5}}}", req);
    assert_int_equal(int_at(j, "meta/billed_units/search_units"), 2);
    assert_int_equal(size_at(j, "meta/billed_units"), 1);
    json_decref(j);

    j = rerank_resp(34,
        "{'results':[{'index':0,'relevance_score':0.5}],"
        "'meta':{'billed_units':{'search_units':0,'input_tokens':100}}}",
        req);
    assert_int_equal(int_at(j, "meta/billed_units/input_tokens"), 100);
    assert_int_equal(size_at(j, "meta/billed_units"), 1);
    json_decref(j);
}


static void
test_rerank_meta_keeps_only_upstream_billed_units(void **state)
{
    json_t *j = rerank_resp(34,
        "{'id':'c1','results':[{'index':0,'relevance_score':0.5}],"
        "'meta':{'api_version':{'version':'1'},"
        "'billed_units':{'search_units':1}}}",
        "{'model':'r','query':'q','documents':['a']}");
    (void) state;

    assert_string_equal(str_at(j, "id"), "c1");
    assert_int_equal(int_at(j, "meta/billed_units/search_units"), 1);
    assert_int_equal(size_at(j, "meta"), 1);
    json_decref(j);

    /* an OpenAI-compatible server: data[] and score, tokens in usage */
    j = rerank_resp(1,
        "{'data':[{'index':0,'score':0.2},{'index':1,'score':0.7}],"
        "'usage':{'total_tokens':12}}",
        "{'model':'r','query':'q','documents':['a','b']}");
    assert_memory_equal(str_at(j, "id"), "rerank-", 7);
    assert_int_equal(int_at(j, "results/0/index"), 1);
    assert_null(at(j, "meta/billed_units"));
    assert_int_equal(int_at(j, "meta/tokens/input_tokens"), 12);
    json_decref(j);

    j = rerank_resp(38, "{'results':[{'index':0,'relevance_score':0.2}]}",
                    "{'model':'r','query':'q','documents':['a']}");
    assert_int_equal(size_at(j, "meta"), 0);
    json_decref(j);
}


static void
test_rerank_top_n_cuts_an_upstream_that_ignored_it(void **state)
{
    json_t *j = rerank_resp(1,
        "{'results':[{'index':0,'relevance_score':0.1},"
        "{'index':1,'relevance_score':0.3},{'index':2,'relevance_score':0.2}]}",
        "{'model':'r','query':'q','documents':['a','b','c'],'top_n':2}");
    (void) state;

    assert_int_equal(size_at(j, "results"), 2);
    assert_int_equal(int_at(j, "results/0/index"), 1);
    assert_int_equal(int_at(j, "results/1/index"), 2);
    json_decref(j);
}


static void
test_rerank_result_without_index_is_refused(void **state)
{
    llmgw_buf_t b = llmgw_test_rerank_response(38,
        "{\"results\":[{\"relevance_score\":0.1}]}",
        "{\"model\":\"r\",\"query\":\"q\",\"documents\":[\"a\"]}");
    (void) state;

    take_error(b, "upstream results[0] has no index");
}


/* Gemini refuses an array without items and an object without
   properties at any depth: the one holds strings, the other is JSON text */
static void
test_gemini_tool_schema_open_arrays_and_objects_become_what_it_takes(
    void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 24,
        "{'model':'m','tools':[{'type':'function','function':{'name':'f',"
        "'parameters':{'type':'object','properties':{"
        "'tags':{'type':'array'},"
        "'map':{'type':'object','description':'by name',"
        "'additionalProperties':{'type':'string'},'minProperties':1},"
        "'deep':{'type':'object','properties':{'rows':{'type':'array',"
        "'items':{'type':'object'}}}}},'required':['map']}}}],"
        "'messages':[{'role':'user','content':'q'}]}");
    json_t *p = at(j, "tools/0/functionDeclarations/0/parameters");
    (void) state;

    assert_non_null(p);
    assert_string_equal(str_at(p, "properties/tags/type"), "array");
    assert_string_equal(str_at(p, "properties/tags/items/type"), "string");
    assert_string_equal(str_at(p, "properties/map/type"), "string");
    assert_string_equal(str_at(p, "properties/map/description"),
                        "by name (a JSON object, written as text)");
    assert_null(at(p, "properties/map/minProperties"));
    assert_string_equal(str_at(p, "properties/deep/properties/rows/items/type"),
                        "string");
    assert_string_equal(str_at(p, "required/0"), "map");
    json_decref(j);
}


/* A Gemini conversation left without a user turn is refused, named */
static void
test_gemini_empty_last_message_is_refused(void **state)
{
    (void) state;

    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','messages':[{'role':'user','content':'hi'},"
        "{'role':'assistant','content':'yes?'},"
        "{'role':'user','content':''}]}",
        "messages[2]: an empty message cannot end the conversation on this "
        "channel");
    request_error(LLMGW_EP_CHAT, 24,
        "{'model':'m','messages':[{'role':'system','content':'s'}]}",
        "messages: a conversation without a message that has content cannot "
        "be sent to this channel");
}


/* Text between a tool call's argument pieces waits for the arguments to
   be whole: an Anthropic block takes no delta once stopped */
static void
test_openai_stream_text_between_argument_pieces_waits(void **state)
{
    evs_t evs;
    (void) state;

    stream(1, LLMGW_EP_MESSAGES,
        O_CHUNK("{'tool_calls':[{'index':0,'id':'call_1','type':'function',"
                "'function':{'name':'f','arguments':'{`a`:'}}]}", "null")
        O_CHUNK("{'content':'so'}", "null")
        O_CHUNK("{'tool_calls':[{'index':0,'function':"
                "{'arguments':'1}'}}]}", "null")
        O_CHUNK("{}", "'stop'")
        O_USAGE(3, 4)
        "data: [DONE]\n\n",
        &evs);

    assert_int_equal(evs.n, 10);
    assert_event(&evs, 1, "content_block_start");
    assert_string_equal(str_at(evs.ev[1].data, "content_block/type"),
                        "tool_use");
    assert_string_equal(str_at(evs.ev[2].data, "delta/partial_json"),
                        "{\"a\":");
    assert_string_equal(str_at(evs.ev[3].data, "delta/partial_json"), "1}");
    assert_int_equal(int_at(evs.ev[3].data, "index"), 0);
    assert_event(&evs, 4, "content_block_stop");
    assert_event(&evs, 5, "content_block_start");
    assert_string_equal(str_at(evs.ev[6].data, "delta/text"), "so");
    assert_int_equal(int_at(evs.ev[6].data, "index"), 1);
    assert_event(&evs, 7, "content_block_stop");
    /* "stop" beside a tool call: the client must run it */
    assert_event(&evs, 8, "message_delta");
    assert_string_equal(str_at(evs.ev[8].data, "delta/stop_reason"),
                        "tool_use");
    assert_int_equal(int_at(evs.ev[8].data, "usage/output_tokens"), 4);
    evs_free(&evs);
}


/* The last count is the one billed: message_delta waits for [DONE] */
static void
test_openai_stream_usage_in_every_chunk_takes_the_last(void **state)
{
    evs_t evs;
    (void) state;

    stream(1, LLMGW_EP_MESSAGES,
        "data: {'id':'c','choices':[{'index':0,'delta':{'content':'a'},"
        "'finish_reason':'stop'}],'usage':{'prompt_tokens':5,"
        "'completion_tokens':1}}\n\n"
        O_USAGE(5, 30)
        "data: [DONE]\n\n",
        &evs);

    assert_int_equal(evs.n, 6);
    assert_event(&evs, 4, "message_delta");
    assert_int_equal(int_at(evs.ev[4].data, "usage/output_tokens"), 30);
    assert_int_equal(int_at(evs.ev[4].data, "usage/input_tokens"), 5);
    evs_free(&evs);
}


static void
test_openai_stop_beside_tool_calls_is_tool_use(void **state)
{
    json_t *j = response(1, LLMGW_EP_MESSAGES,
        "{'id':'c','choices':[{'index':0,'finish_reason':'stop','message':"
        "{'role':'assistant','content':null,'tool_calls':[{'id':'call_1',"
        "'type':'function','function':{'name':'f','arguments':'{}'}}]}}]}");
    (void) state;

    assert_string_equal(str_at(j, "stop_reason"), "tool_use");
    json_decref(j);
}


/* message_stop without message_delta: whole, its reason unsaid */
static void
test_anthropic_stream_without_message_delta_still_finishes(void **state)
{
    evs_t evs;
    (void) state;

    stream(14, LLMGW_EP_CHAT,
        A_START
        A_TOOL_START(0, "toolu_1", "f")
        A_JSON_DELTA(0, "{}")
        A_STOP(0)
        "event: message_stop\ndata: {'type':'message_stop'}\n\n",
        &evs);

    /* role, tool start, arguments, finish, usage, DONE */
    assert_int_equal(evs.n, 6);
    assert_string_equal(str_at(evs.ev[3].data, "choices/0/finish_reason"),
                        "tool_calls");
    assert_non_null(at(evs.ev[4].data, "usage"));
    assert_true(evs.ev[5].done);
    evs_free(&evs);
}


/* cache_control hints reach Anthropic on system and assistant blocks;
   images a tool returns are blocks of its tool_result */
static void
test_cache_control_and_tool_images_reach_anthropic(void **state)
{
    json_t *j = request(LLMGW_EP_CHAT, 14,
        "{'model':'m','messages':["
        "{'role':'system','content':[{'type':'text','text':'S',"
        "'cache_control':{'type':'ephemeral'}}]},"
        "{'role':'user','content':'u'},"
        "{'role':'assistant','content':[{'type':'text','text':'A',"
        "'cache_control':{'type':'ephemeral'}}],'tool_calls':[{'id':'c1',"
        "'type':'function','function':{'name':'f','arguments':'{}'}}]},"
        "{'role':'tool','tool_call_id':'c1','content':[{'type':'text',"
        "'text':'T'},{'type':'image_url','image_url':{'url':"
        "'data:image/png;base64,AAAA'}}]}]}");
    (void) state;

    assert_string_equal(str_at(j, "system/0/text"), "S");
    assert_string_equal(str_at(j, "system/0/cache_control/type"),
                        "ephemeral");
    assert_string_equal(str_at(j, "messages/1/content/0/text"), "A");
    assert_string_equal(str_at(j, "messages/1/content/0/cache_control/type"),
                        "ephemeral");
    assert_string_equal(str_at(j, "messages/1/content/1/type"), "tool_use");
    assert_string_equal(str_at(j, "messages/2/content/0/type"),
                        "tool_result");
    assert_string_equal(str_at(j, "messages/2/content/0/content/0/text"),
                        "T");
    assert_string_equal(
        str_at(j, "messages/2/content/0/content/1/source/media_type"),
        "image/png");
    json_decref(j);
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_system_message_becomes_anthropic_system),
        cmocka_unit_test(
            test_gemini_tool_schema_open_arrays_and_objects_become_what_it_takes),
        cmocka_unit_test(test_gemini_empty_last_message_is_refused),
        cmocka_unit_test(test_openai_stream_text_between_argument_pieces_waits),
        cmocka_unit_test(test_openai_stream_usage_in_every_chunk_takes_the_last),
        cmocka_unit_test(test_openai_stop_beside_tool_calls_is_tool_use),
        cmocka_unit_test(
            test_anthropic_stream_without_message_delta_still_finishes),
        cmocka_unit_test(test_cache_control_and_tool_images_reach_anthropic),
        cmocka_unit_test(test_anthropic_max_tokens_defaults_to_4096),
        cmocka_unit_test(test_max_completion_tokens_wins_over_max_tokens),
        cmocka_unit_test(test_image_urls_become_anthropic_image_sources),
        cmocka_unit_test(
            test_unusable_image_url_is_refused_with_its_position),
        cmocka_unit_test(
            test_tool_calls_become_tool_use_and_tool_messages_tool_results),
        cmocka_unit_test(test_anthropic_max_tokens_to_reasoning_models),
        cmocka_unit_test(
            test_anthropic_user_id_becomes_openai_user_of_at_most_64),
        cmocka_unit_test(
            test_tool_ids_are_made_valid_for_anthropic_on_both_sides),
        cmocka_unit_test(test_consecutive_same_role_messages_merge),
        cmocka_unit_test(test_tool_results_open_the_merged_user_turn),
        cmocka_unit_test(test_tools_and_tool_choice_map_to_anthropic),
        cmocka_unit_test(
            test_tool_choice_none_omits_tools_without_tool_history),
        cmocka_unit_test(
            test_tool_choice_none_keeps_tools_that_explain_tool_history),
        cmocka_unit_test(test_sampling_fields_carry_over_to_anthropic),
        cmocka_unit_test(test_pairs_without_conversion_are_refused),
        cmocka_unit_test(
            test_unknown_content_part_is_refused_with_its_position),
        cmocka_unit_test(test_openai_messages_become_gemini_contents),
        cmocka_unit_test(
            test_openai_images_become_gemini_inline_and_file_data),
        cmocka_unit_test(
            test_openai_tool_turns_become_gemini_function_call_and_response),
        cmocka_unit_test(test_empty_text_parts_are_not_sent_to_gemini),
        cmocka_unit_test(test_gemini_tool_result_needs_a_matching_call),
        cmocka_unit_test(test_what_a_gemini_answer_cannot_give_is_refused),
        cmocka_unit_test(
            test_gemini_tool_schema_keeps_only_keys_gemini_knows),
        cmocka_unit_test(test_gemini_schema_formats_enums_consts_and_one_of),
        cmocka_unit_test(
            test_gemini_tool_schema_references_are_put_in_place),
        cmocka_unit_test(test_gemini_tool_schema_it_cannot_say_is_refused),
        cmocka_unit_test(
            test_anthropic_system_blocks_become_first_system_message),
        cmocka_unit_test(
            test_anthropic_tool_use_and_result_become_openai_tool_calls),
        cmocka_unit_test(
            test_an_integer_beyond_int64_in_tool_input_still_converts),
        cmocka_unit_test(test_anthropic_images_become_openai_image_urls),
        cmocka_unit_test(test_anthropic_stream_request_asks_openai_for_usage),
        cmocka_unit_test(test_anthropic_tools_and_tool_choice_map_to_openai),
        cmocka_unit_test(test_anthropic_server_tools_are_refused),
        cmocka_unit_test(test_reals_in_tool_input_keep_their_shortest_form),
        cmocka_unit_test(test_anthropic_answer_becomes_chat_completion),
        cmocka_unit_test(test_what_an_anthropic_answer_cannot_give_is_refused),
        cmocka_unit_test(test_tool_result_images_follow_as_a_user_message),
        cmocka_unit_test(test_tool_result_errors_and_documents),
        cmocka_unit_test(test_anthropic_stop_reasons_map_to_finish_reasons),
        cmocka_unit_test(test_tool_call_round_trip),
        cmocka_unit_test(test_gemini_answer_becomes_chat_completion),
        cmocka_unit_test(test_gemini_images_become_message_images),
        cmocka_unit_test(test_gemini_function_call_answer_becomes_tool_calls),
        cmocka_unit_test(test_gemini_finish_reasons_map_to_finish_reasons),
        cmocka_unit_test(test_openai_answer_becomes_anthropic_message),
        cmocka_unit_test(
            test_openai_reasoning_refusal_and_cache_reach_a_messages_client),
        cmocka_unit_test(
            test_openai_stream_thinking_tools_and_cut_short_to_messages),
        cmocka_unit_test(test_openai_finish_reasons_map_to_stop_reasons),
        cmocka_unit_test(test_anthropic_stream_to_openai_chunks_keeps_usage),
        cmocka_unit_test(
            test_anthropic_stream_tool_use_becomes_tool_call_deltas),
        cmocka_unit_test(
            test_anthropic_stream_tool_uses_become_tool_calls_in_order),
        cmocka_unit_test(
            test_anthropic_stream_tool_without_arguments_gets_an_empty_object),
        cmocka_unit_test(
            test_anthropic_stream_error_becomes_openai_error_chunk),
        cmocka_unit_test(
            test_stream_error_after_text_ends_without_usage_or_done),
        cmocka_unit_test(
            test_openai_stream_without_chunks_is_an_anthropic_error),
        cmocka_unit_test(
            test_anthropic_stream_cut_short_ends_with_an_error_not_done),
        cmocka_unit_test(
            test_gemini_stream_cut_short_ends_with_an_error_not_done),
        cmocka_unit_test(
            test_gemini_stream_to_openai_chunks_sends_usage_at_end),
        cmocka_unit_test(
            test_gemini_stream_function_call_becomes_whole_tool_call),
        cmocka_unit_test(test_openai_stream_to_anthropic_events),
        cmocka_unit_test(
            test_openai_stream_tool_calls_become_tool_use_blocks),
        cmocka_unit_test(
            test_openai_interleaved_tool_calls_keep_each_block_whole),
        cmocka_unit_test(
            test_openai_tool_calls_wait_until_the_open_one_is_whole),
        cmocka_unit_test(
            test_openai_tool_calls_one_after_another_stream_piece_by_piece),
        cmocka_unit_test(
            test_openai_stream_without_usage_or_done_is_closed_at_finish),
        cmocka_unit_test(
            test_openai_stream_error_becomes_anthropic_error_event),
        cmocka_unit_test(test_error_for_messages_client_has_anthropic_shape),
        cmocka_unit_test(test_error_for_chat_client_has_contract_shape),
        cmocka_unit_test(test_rerank_request_sends_documents_as_strings),
        cmocka_unit_test(test_top_n_not_defaulted),
        cmocka_unit_test(test_rerank_validation_names_the_field),
        cmocka_unit_test(test_rerank_to_chat_channel_is_refused),
        cmocka_unit_test(test_rerank_results_sorted_by_score),
        cmocka_unit_test(
            test_rerank_without_return_documents_has_no_document),
        cmocka_unit_test(test_rerank_documents_come_from_upstream_or_client),
        cmocka_unit_test(test_rerank_meta_keeps_only_upstream_billed_units),
        cmocka_unit_test(test_rerank_meta_says_what_is_billed),
        cmocka_unit_test(test_rerank_request_passes_upstream_options_on),
        cmocka_unit_test(test_rerank_results_name_each_document_once),
        cmocka_unit_test(test_rerank_meta_without_billed_counts_shows_the_usage),
        cmocka_unit_test(test_rerank_top_n_cuts_an_upstream_that_ignored_it),
        cmocka_unit_test(test_rerank_result_without_index_is_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
