/*
 * SSE submit (spec "Events", facts "SSE submit"): the host checks what the
 * plugin returns for each upstream event and builds the body handed to
 * parseSubmitResponse.  Snapshot mode takes the whole state from every
 * event; delta mode (submit-sse-delta@1) applies set/append/appendText
 * changes to a body the host keeps, under the contract's limits.
 */

#ifndef LLMGW_SSEDELTA_H
#define LLMGW_SSEDELTA_H

#include "llmgw.h"

#ifdef __cplusplus
extern "C" {
#endif


#define LLMGW_SSE_MAX_CHANGES   256             /* per event */
#define LLMGW_SSE_MAX_PATH      32              /* path segments */
#define LLMGW_SSE_MAX_DEPTH     32              /* levels below the root */
#define LLMGW_SSE_MAX_NODES     32768           /* values in the body */
#define LLMGW_SSE_MAX_BODY      (1024 * 1024)   /* body, encoded */
#define LLMGW_SSE_MAX_STATE     (64 * 1024)     /* delta-mode state, encoded */

/*
 * Snapshot mode: a parseSubmitEvent result, exactly {state, done (a
 * boolean)}.  The state becomes the body, so it is capped like the body
 * (LLMGW_SSE_MAX_BODY encoded).  0, *done and the state's JSON text in
 * *state; -1 and a message in err.
 */
int llmgw_sse_snapshot_result(const char *json, size_t len, int *done,
    llmgw_buf_t *state, char *err, size_t errlen);


typedef struct llmgw_sse_acc_s  llmgw_sse_acc_t;

/* A delta-mode body; it starts as null. */
llmgw_sse_acc_t *llmgw_sse_acc_new(void);
void llmgw_sse_acc_free(llmgw_sse_acc_t *a);

/*
 * Delta mode: applies a parseSubmitEventDelta result, exactly {changes,
 * state, done}, each change exactly {op, path, value}:
 *   set         empty path: replaces the body; else an existing array
 *               index or an object member (added when missing) under an
 *               existing parent;
 *   append      adds value to the existing array at path;
 *   appendText  appends the string value to the existing string at path.
 * Path segments are strings (members) or non-negative integers (indices).
 * All changes apply or none does (the body is unchanged after an error).
 * 0, *done and the state's JSON text in *state; -1 and a message naming
 * the change and the rule in err ("submit event change 3: path segment 2
 * (\"items\") does not exist"; changes and segments counted from 0).
 */
int llmgw_sse_acc_apply(llmgw_sse_acc_t *a, const char *json, size_t len,
    int *done, llmgw_buf_t *state, char *err, size_t errlen);

/* The body's JSON text: response.body for parseSubmitResponse. */
llmgw_buf_t llmgw_sse_acc_body(const llmgw_sse_acc_t *a);

/* The event argument of the hooks: {"event":...,"id":...,"data":...}, all
   strings ("" for no id). */
llmgw_buf_t llmgw_sse_event_json(const llmgw_sse_event_t *ev);


#ifdef __cplusplus
}
#endif

#endif /* LLMGW_SSEDELTA_H */
