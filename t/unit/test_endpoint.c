/*
 * Path classification and the 404 "Invalid URL" hints for the usual
 * base-URL mistakes.
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "llmgw.h"


static llmgw_endpoint_t
classify(const char *method, const char *path)
{
    llmgw_endpoint_t  ep;
    llmgw_str_t       m = { method, strlen(method) };
    llmgw_str_t       p = { path, strlen(path) };

    memset(&ep, 0x5a, sizeof(ep));
    llmgw_endpoint_classify(m, p, &ep);

    return ep;
}


static void
assert_model(const llmgw_endpoint_t *ep, const char *model)
{
    assert_int_equal(ep->model.len, strlen(model));
    assert_memory_equal(ep->model.data, model, ep->model.len);
}


static void
assert_plain_invalid(const char *method, const char *path)
{
    char              want[256];
    llmgw_endpoint_t  ep = classify(method, path);

    snprintf(want, sizeof(want), "Invalid URL (%s %s)", method, path);
    assert_int_equal(ep.ep, LLMGW_EP_INVALID_URL);
    assert_string_equal(ep.message, want);
    assert_int_equal(ep.method_ok, 0);
}


static void
test_chat_completions_is_chat(void **state)
{
    llmgw_endpoint_t ep = classify("POST", "/v1/chat/completions");

    assert_int_equal(ep.ep, LLMGW_EP_CHAT);
    assert_int_equal(ep.method_ok, 1);
    assert_int_equal(ep.stream, 0);
    assert_int_equal(ep.model.len, 0);
    assert_string_equal(ep.message, "");
}


static void
test_messages_is_messages(void **state)
{
    llmgw_endpoint_t ep = classify("POST", "/v1/messages");

    assert_int_equal(ep.ep, LLMGW_EP_MESSAGES);
    assert_int_equal(ep.method_ok, 1);
}


static void
test_v1_and_v2_rerank_are_rerank(void **state)
{
    llmgw_endpoint_t ep = classify("POST", "/v1/rerank");

    assert_int_equal(ep.ep, LLMGW_EP_RERANK);
    assert_int_equal(ep.method_ok, 1);

    ep = classify("POST", "/v2/rerank");
    assert_int_equal(ep.ep, LLMGW_EP_RERANK);
    assert_int_equal(ep.method_ok, 1);
}


static void
test_models_wants_get(void **state)
{
    llmgw_endpoint_t ep = classify("GET", "/v1/models");

    assert_int_equal(ep.ep, LLMGW_EP_MODELS);
    assert_int_equal(ep.method_ok, 1);

    ep = classify("HEAD", "/v1/models");
    assert_int_equal(ep.method_ok, 1);

    ep = classify("POST", "/v1/models");
    assert_int_equal(ep.ep, LLMGW_EP_MODELS);
    assert_int_equal(ep.method_ok, 0);
}


static void
test_post_endpoints_refuse_get(void **state)
{
    llmgw_endpoint_t ep = classify("GET", "/v1/chat/completions");

    assert_int_equal(ep.ep, LLMGW_EP_CHAT);
    assert_int_equal(ep.method_ok, 0);

    ep = classify("post", "/v1/messages");
    assert_int_equal(ep.ep, LLMGW_EP_MESSAGES);
    assert_int_equal(ep.method_ok, 0);
}


static void
test_gemini_generate_content_takes_model_from_path(void **state)
{
    llmgw_endpoint_t ep = classify("POST",
        "/v1beta/models/gemini-2.5-flash:generateContent");

    assert_int_equal(ep.ep, LLMGW_EP_GEMINI);
    assert_int_equal(ep.stream, 0);
    assert_int_equal(ep.method_ok, 1);
    assert_model(&ep, "gemini-2.5-flash");
}


static void
test_gemini_stream_generate_content_streams(void **state)
{
    llmgw_endpoint_t ep = classify("POST",
        "/v1beta/models/gemini-1.5-pro:streamGenerateContent");

    assert_int_equal(ep.ep, LLMGW_EP_GEMINI);
    assert_int_equal(ep.stream, 1);
    assert_model(&ep, "gemini-1.5-pro");
}


static void
test_gemini_empty_model_is_invalid_url(void **state)
{
    assert_plain_invalid("POST", "/v1beta/models/:generateContent");
}


static void
test_gemini_model_with_slash_is_invalid_url(void **state)
{
    assert_plain_invalid("POST", "/v1beta/models/a/b:generateContent");
}


static void
test_gemini_unknown_action_is_invalid_url(void **state)
{
    assert_plain_invalid("POST", "/v1beta/models/gemini-pro:countTokens");
    assert_plain_invalid("POST", "/v1beta/models/gemini-pro");
}


static void
test_trailing_slash_is_invalid_url_that_says_so(void **state)
{
    llmgw_endpoint_t ep = classify("POST", "/v1/chat/completions/");
    (void) state;

    assert_int_equal(ep.ep, LLMGW_EP_INVALID_URL);
    assert_string_equal(ep.message, "Invalid URL (POST /v1/chat/completions/)"
                        ": the path ends with a slash; leave it out");
    assert_plain_invalid("POST", "/v1/nothing/");
}


/* the Gemini and Cohere v2 clients add their own version to the base URL */
static void
test_gemini_and_v2_versions_doubled_or_bare_are_explained(void **state)
{
    static const struct { const char *path, *hint; } cases[] = {
        { "/v1/v1beta/models/m:generateContent",
          "the path has /v1 before /v1beta; set the base URL to the host only "
          "(the client adds /v1beta)" },
        { "/v1beta/v1beta/models/m:streamGenerateContent",
          "the path has /v1beta twice; set the base URL to the host only "
          "(the client adds /v1beta)" },
        { "/v2/v2/rerank",
          "the path has /v2 twice; set the base URL to the host only "
          "(the client adds /v2)" },
        { "/v1/v2/rerank",
          "the path has /v1 before /v2; set the base URL to the host only "
          "(the client adds /v2)" },
        { "/v1beta", "the path is only /v1beta; give the full endpoint address "
                     "such as /v1beta/models/{model}:generateContent" },
        { "/v1beta/", "the path is only /v1beta; give the full endpoint address "
                      "such as /v1beta/models/{model}:generateContent" },
        { "/v2", "the path is only /v2; give the full endpoint address such as "
                 "/v2/rerank" },
    };
    size_t i;
    (void) state;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char want[512];
        llmgw_endpoint_t ep = classify("POST", cases[i].path);

        snprintf(want, sizeof(want), "Invalid URL (POST %s): %s",
                 cases[i].path, cases[i].hint);
        assert_int_equal(ep.ep, LLMGW_EP_INVALID_URL);
        assert_string_equal(ep.message, want);
    }

    assert_plain_invalid("POST", "/v2/v2/nothing");
}


static void
test_unknown_path_is_plain_invalid_url(void **state)
{
    assert_plain_invalid("POST", "/v1/completions");
    assert_plain_invalid("GET", "/");
    assert_plain_invalid("POST", "");
}


static void
test_doubled_v1_is_invalid_url(void **state)
{
    llmgw_endpoint_t ep = classify("POST", "/v1/v1/chat/completions");

    assert_int_equal(ep.ep, LLMGW_EP_INVALID_URL);
    assert_string_equal(ep.message,
        "Invalid URL (POST /v1/v1/chat/completions): the path has /v1 "
        "twice; set the base URL to the host plus one /v1");

    ep = classify("GET", "/v1/v1");
    assert_string_equal(ep.message,
        "Invalid URL (GET /v1/v1): the path has /v1 twice; set the base URL "
        "to the host plus one /v1");
}


static void
test_v1_prefix_of_other_segment_is_not_doubled(void **state)
{
    assert_plain_invalid("POST", "/v1/v1beta/x");
}


static void
test_only_v1_is_invalid_url(void **state)
{
    llmgw_endpoint_t ep = classify("POST", "/v1");

    assert_int_equal(ep.ep, LLMGW_EP_INVALID_URL);
    assert_string_equal(ep.message,
        "Invalid URL (POST /v1): the path is only /v1; give the full "
        "endpoint address such as /v1/chat/completions");

    ep = classify("POST", "/v1/");
    assert_string_equal(ep.message,
        "Invalid URL (POST /v1/): the path is only /v1; give the full "
        "endpoint address such as /v1/chat/completions");
}


static void
test_missing_v1_is_invalid_url(void **state)
{
    static const char *paths[] = {
        "/chat/completions", "/messages", "/rerank", "/models",
        "/models/m:generateContent", "/videos", "/videos/video_1",
        "/videos/video_1/content", "/responses", "/responses/resp_1",
        "/images/generations", "/images/edits", "/tasks/my-plugin",
        "/tasks/task_1/artifacts", "/tasks/task_1/artifacts/video/content"
    };
    char              want[256];
    llmgw_endpoint_t  ep;

    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        ep = classify("POST", paths[i]);
        snprintf(want, sizeof(want), "Invalid URL (POST %s): the path is "
                 "missing /v1; add /v1 to the base URL", paths[i]);
        assert_int_equal(ep.ep, LLMGW_EP_INVALID_URL);
        assert_string_equal(ep.message, want);
    }
}


/* The host protocols' and the task API's paths are the gateway's too. */
static void
test_doubled_v1_before_a_task_path_says_so(void **state)
{
    static const char *paths[] = {
        "/v1/v1/videos", "/v1/v1/videos/video_1", "/v1/v1/responses",
        "/v1/v1/images/generations", "/v1/v1/images/edits",
        "/v1/v1/tasks/task_1"
    };
    char              want[256];
    llmgw_endpoint_t  ep;

    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        ep = classify("POST", paths[i]);
        snprintf(want, sizeof(want), "Invalid URL (POST %s): the path has "
                 "/v1 twice; set the base URL to the host plus one /v1",
                 paths[i]);
        assert_int_equal(ep.ep, LLMGW_EP_INVALID_URL);
        assert_string_equal(ep.message, want);
    }
}


static void
test_other_paths_of_a_known_name_have_no_hint(void **state)
{
    assert_plain_invalid("POST", "/videos/video_1/other");
    assert_plain_invalid("POST", "/images/variations");
    assert_plain_invalid("POST", "/tasks");
    assert_plain_invalid("POST", "/tasks/task_1/files");
}


static void
test_long_path_is_cut_to_128_chars_in_message(void **state)
{
    char              path[300];
    char              want[256];
    llmgw_endpoint_t  ep;

    path[0] = '/';
    memset(path + 1, 'x', sizeof(path) - 2);
    path[sizeof(path) - 1] = '\0';

    ep = classify("POST", path);
    snprintf(want, sizeof(want), "Invalid URL (POST %.128s...)", path);
    assert_int_equal(ep.ep, LLMGW_EP_INVALID_URL);
    assert_string_equal(ep.message, want);
}


static void
test_long_doubled_v1_path_keeps_hint(void **state)
{
    char              path[300];
    llmgw_endpoint_t  ep;

    strcpy(path, "/v1/v1/");
    memset(path + 7, 'y', sizeof(path) - 8);
    path[sizeof(path) - 1] = '\0';

    ep = classify("POST", path);
    assert_int_equal(ep.ep, LLMGW_EP_INVALID_URL);
    assert_non_null(strstr(ep.message, "...): the path has /v1 twice"));
}


int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_completions_is_chat),
        cmocka_unit_test(test_messages_is_messages),
        cmocka_unit_test(test_v1_and_v2_rerank_are_rerank),
        cmocka_unit_test(test_models_wants_get),
        cmocka_unit_test(test_post_endpoints_refuse_get),
        cmocka_unit_test(test_gemini_generate_content_takes_model_from_path),
        cmocka_unit_test(test_gemini_stream_generate_content_streams),
        cmocka_unit_test(test_gemini_empty_model_is_invalid_url),
        cmocka_unit_test(test_gemini_model_with_slash_is_invalid_url),
        cmocka_unit_test(test_gemini_unknown_action_is_invalid_url),
        cmocka_unit_test(test_trailing_slash_is_invalid_url_that_says_so),
        cmocka_unit_test(
            test_gemini_and_v2_versions_doubled_or_bare_are_explained),
        cmocka_unit_test(test_unknown_path_is_plain_invalid_url),
        cmocka_unit_test(test_doubled_v1_is_invalid_url),
        cmocka_unit_test(test_v1_prefix_of_other_segment_is_not_doubled),
        cmocka_unit_test(test_only_v1_is_invalid_url),
        cmocka_unit_test(test_missing_v1_is_invalid_url),
        cmocka_unit_test(test_doubled_v1_before_a_task_path_says_so),
        cmocka_unit_test(test_other_paths_of_a_known_name_have_no_hint),
        cmocka_unit_test(test_long_path_is_cut_to_128_chars_in_message),
        cmocka_unit_test(test_long_doubled_v1_path_keeps_hint),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
