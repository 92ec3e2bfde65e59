/**
 * Task Plugin API v1: type declarations of the contract between the
 * gateway (the host) and a task plugin.
 *
 * A plugin is one synchronous ES module (no async, await, import or dynamic
 * import). It exports `meta` (the manifest, see Meta) and the hooks below;
 * the host authenticates, checks ownership, persists, polls, settles and
 * refunds. Structural rules of the manifest are also published as JSON
 * Schema in manifest.schema.json beside this file; the host's validator
 * enforces those and the cross-field rules noted here.
 *
 * Spec names are used throughout. Plugins published for the existing
 * marketplace load unchanged: their spellings are accepted as aliases and
 * the host normalises them (see the Marketplace* types).
 */

/* ======================================================================
 * JSON
 * ==================================================================== */

export type JSONPrimitive = null | boolean | number | string;
export type JSONValue = JSONPrimitive | JSONValue[] | { [key: string]: JSONValue };
/** Inputs given to hooks are read-only. */
export type ReadonlyJSON =
    | JSONPrimitive
    | readonly ReadonlyJSON[]
    | { readonly [key: string]: ReadonlyJSON };

/* ======================================================================
 * Manifest (export const meta)
 * ==================================================================== */

/**
 * A string (normalised to `{ en: string }`) or a map of BCP 47 locale to
 * text that contains `en`. Locale keys match
 * `^[a-zA-Z]{2,3}(-[a-zA-Z0-9]{2,8})*$` and are normalised to canonical
 * casing (`EN` -> `en`, `zh-tw` -> `zh-TW`); keys equal after that are
 * rejected. At most 16 locales; values are trimmed, non-empty and free of
 * control characters. Lookup: current language, primary language, English.
 */
export type LocalizedText = string | LocaleMap;
export type LocaleMap = { readonly en: string } & { readonly [locale: string]: string };

/** Host-managed protocols a plugin may claim. */
export type ProtocolName = "host_video" | "host_responses" | "host_image";
/** Marketplace spellings, aliases of ProtocolName (also in export paths). */
export type MarketplaceProtocolName = "openai_video" | "openai_responses" | "openai_image";

/** Request modes of host_responses. */
export type ResponsesMode = "stream" | "sync" | "background";

/**
 * Modes a host_responses plugin serves, checked both ways against its
 * exports: `stream` needs `renderEvents`; `sync` or `background` needs
 * `renderFinal`; an exported hook no declared mode uses is rejected. At
 * least one mode is true. A list of modes (`["stream", "sync"]`) is
 * refused: `supports` is an object.
 */
export interface ResponsesSupports {
    readonly stream?: boolean;
    readonly sync?: boolean;
    readonly background?: boolean;
}

/**
 * A protocol claim: a bare name (only for protocols without request
 * modes) or an object with optional model restrictions. Normalised to
 * `{ name, models?, supports? }` on spec names. One claim per protocol.
 */
export type ProtocolClaim =
    | "host_video"
    | "host_image"
    | "openai_video"
    | "openai_image"
    | {
          readonly name: "host_video" | "host_image" | "openai_video" | "openai_image";
          /** Non-empty; each spelled as in meta.models. */
          readonly models?: readonly string[];
          readonly supports?: never;
      }
    | {
          readonly name: "host_responses" | "openai_responses";
          readonly models?: readonly string[];
          readonly supports: ResponsesSupports;
      };

export type RouteMethod = "GET" | "POST" | "PUT" | "PATCH" | "DELETE";

interface NativeRouteBase {
    readonly method: RouteMethod;
    /**
     * Plugin-owned path starting with `/`; parameters are `:name` segments.
     * Host protocol paths (/v1/videos..., /v1/responses..., /v1/images...)
     * belong to meta.protocols and are rejected here. So are the paths the
     * gateway serves itself, which no route could ever reach: /api,
     * /metrics, /v1/chat/completions, /v1/messages, /v1/rerank, /v2/rerank,
     * /v1/models and /v1/tasks with everything under them, and the Gemini
     * endpoints /v1beta/models/{model}:generateContent and
     * :streamGenerateContent (the rest of /v1beta is free). Two routes with
     * the same method and path shape conflict; so do two plugins' routes
     * that one request path can match (a parameter matches any segment),
     * unless the upload is forced. Of several routes matching a request the
     * most specific serves: left to right, a literal segment beats a
     * parameter.
     */
    readonly path: string;
    /** Name of a synchronous function in the plugin's `native` export. */
    readonly render: string;
    /** Standardised operation persisted with the task (marketplace field). */
    readonly action?: string;
}

/** A route that creates a task. */
export interface SubmitRoute extends NativeRouteBase {
    readonly type: "submit" | "dynamic";
    /** Name of a synchronous function in `native`; returns a TaskIntent. */
    readonly decode: string;
    /** Restricts top-level models; each spelled as in meta.models. */
    readonly models?: readonly string[];
    /**
     * Default true. false only when every successful submit completes
     * immediately: task.data is then not persisted (the record stays for
     * billing and logs). Additive extension: older hosts reject it.
     */
    readonly retainResult?: boolean;
    readonly taskIdParam?: never;
}

/** A route that reads a task; its path carries `:<taskIdParam>`. */
export interface QueryRoute extends NativeRouteBase {
    readonly type: "query";
    /** Path parameter holding the public task ID; default `task_id`. */
    readonly taskIdParam?: string;
    readonly decode?: never;
    readonly models?: never;
    readonly retainResult?: never;
}

export type NativeRoute = SubmitRoute | QueryRoute;

/** `vendor` is always supported; `peer_gateway` binds type-60 channels. */
export type UpstreamKind = "vendor" | "peer_gateway";
/** Marketplace spelling of peer_gateway. */
export type MarketplaceUpstreamKind = "new_api";

/**
 * Upstream authentication. The marketplace's `vertex_oauth` (and
 * `oauth2_jwt`) are accepted and normalised to `{ type: "oauth2_jwt" }`.
 * For type-60 channels the host sets authHeader/apiKey from the channel
 * key and runs no vendor OAuth/JWT flow.
 */
export type AuthConfig =
    | "none"
    | "api_key"
    | "vendor_oauth"
    | "vertex_oauth"
    | "oauth2_jwt"
    | AuthObject;

export interface AuthObject {
    readonly type: string;
    readonly [setting: string]: ReadonlyJSON;
}

export type UsageUnit = "second" | "count" | "token" | "credit";

/**
 * A usage field. Descriptions name the billing subject (numbers) or the
 * action, true state or condition (booleans, enums); they hold no prices,
 * no protocol details and no trailing punctuation. Texts at most 256
 * characters per locale. Enforced at upload: a text ending in . ! ? , ; :
 * (or their full-width forms, or an ellipsis), and a price (a currency
 * sign before a number, or USD, EUR, GBP, CNY, RMB, JPY, cent(s), 元, 美元,
 * 美分 after one) are refused.
 */
export type UsageFieldSchema =
    | {
          readonly type: "number";
          readonly unit: "count";
          /** Count display word, e.g. { en: "image" }. */
          readonly unitLabel?: LocalizedText;
          readonly description?: LocalizedText;
      }
    | {
          readonly type: "number";
          readonly unit: "second" | "token" | "credit";
          readonly unitLabel?: never;
          readonly description?: LocalizedText;
      }
    | {
          readonly type: "boolean";
          readonly description?: LocalizedText;
      }
    | {
          /** Non-empty, unique raw values; they stay stable. */
          readonly enum: readonly string[];
          /** Display names; every key is one of the enum values. */
          readonly enumLabels?: { readonly [value: string]: LocalizedText };
          readonly description?: LocalizedText;
      };

/** Field name -> field. Names start with a letter or `_`. */
export type UsageSchema = { readonly [field: string]: UsageFieldSchema };

/** A usage quantity, boolean or enum value; never a price. */
export type UsageFactValue = number | boolean | string;
export type UsageFacts = { readonly [field: string]: UsageFactValue };

/**
 * `facts` is a complete vector over its schema: every field, nothing
 * else, each of its field's type (numbers non-negative). A schema with a
 * `token` field needs at least one example.
 */
export interface UsageExample {
    readonly label: string;
    readonly facts: UsageFacts;
}

/**
 * A complete usage schema for some models; replaces the defaults entirely
 * (no merge). Selection: the final upstream model's profile, else the
 * client-facing model's, else meta.usageSchema.
 */
export interface UsageProfile {
    /** Non-empty, spelled as in meta.models; a model is in one profile at most. */
    readonly models: readonly string[];
    /** Required; may be {}. */
    readonly schema: UsageSchema;
    readonly examples?: readonly UsageExample[];
}

/** Versioned capabilities, named exactly; unknown or repeated ones are rejected. */
export type HostCapability = "json-clone@1" | "submit-sse-delta@1";

export type SubmitResponseType = "json" | "sse";

/**
 * The manifest. Fields not listed here are rejected (older hosts reject
 * unrecognised fields), as are the legacy `endpoints`, `resolveRequest`,
 * `renderError`, `renderers` and `routes[].renderer`.
 */
export interface Meta {
    readonly apiVersion: 1;
    /** At most 30 characters of letters, digits, `-`, `_`; the marketplace directory name. */
    readonly key: string;
    readonly name: string;
    /** Semantic version, equal to the version directory. */
    readonly version: string;
    /** Self-declared; url is an absolute http(s) URL. */
    readonly author: { readonly name: string; readonly url?: string };
    /** Non-empty list of non-empty model names. */
    readonly models: readonly string[];
    readonly fetchMode: "per_task" | "batch";
    /** At most 512 characters per locale. */
    readonly description?: LocalizedText;
    /** Icon-library name, `text` or `text:<label>`; at most 128 characters; no URLs or inline images. */
    readonly icon?: string;
    /** Empty, or an absolute HTTPS URL: ASCII host, no credentials, whitespace, control characters or backslashes. */
    readonly website?: string;
    /** Signed 32-bit display order, larger first; default 0; ties by key. Not routing priority. */
    readonly sortPriority?: number;
    /**
     * Default upstream address for type-61 channels: absolute http(s), at
     * most 191 characters, no credentials, query or fragment, ASCII host.
     * Private addresses and plain HTTP are allowed. Normalised: host
     * lowercased, trailing slash stripped.
     */
    readonly baseUrl?: string;
    /**
     * Hosts reachable beyond the channel host: `host` or `host:port`
     * (IPv6 in brackets), no scheme, path, credentials or query; unique
     * after lowercasing. A port matches only that port; 80/443 match a URL
     * without one. baseUrl does not widen this set.
     */
    readonly allowedHosts?: readonly string[];
    /** Unique values; default ["vendor"]. Additive extension: older hosts reject it. */
    readonly upstreams?: readonly (UpstreamKind | MarketplaceUpstreamKind)[];
    readonly auth?: AuthConfig;
    /** Legacy channel types adapted (positive integers, never 60 or 61). */
    readonly channelTypes?: readonly number[];
    readonly routes?: readonly NativeRoute[];
    readonly protocols?: readonly ProtocolClaim[];
    readonly usageSchema?: UsageSchema;
    readonly usageExamples?: readonly UsageExample[];
    readonly usageProfiles?: readonly UsageProfile[];
    readonly requiredCapabilities?: readonly HostCapability[];
    /**
     * Default ["json"]. With "sse": `parseSubmitEvent` (snapshot mode), or
     * with submit-sse-delta@1 `parseSubmitEventDelta` (incremental mode).
     */
    readonly submitResponseTypes?: readonly SubmitResponseType[];
}

/** The manifest as the host keeps it after validation. */
export interface NormalizedMeta
    extends Omit<Meta, "description" | "upstreams" | "auth" | "protocols" | "usageSchema" | "usageProfiles" | "routes"> {
    readonly description?: LocaleMap;
    readonly sortPriority: number;
    readonly upstreams: readonly UpstreamKind[];
    readonly auth?: "none" | "api_key" | "vendor_oauth" | AuthObject;
    readonly routes?: readonly (
        | (SubmitRoute & { readonly retainResult: boolean })
        | (QueryRoute & { readonly taskIdParam: string })
    )[];
    readonly protocols?: readonly {
        readonly name: ProtocolName;
        readonly models?: readonly string[];
        readonly supports?: Required<ResponsesSupports>;
    }[];
    readonly usageSchema?: UsageSchema;
    readonly usageProfiles?: readonly UsageProfile[];
    readonly submitResponseTypes: readonly SubmitResponseType[];
}

/* ======================================================================
 * Inbound requests (parsed by the host)
 * ==================================================================== */

/**
 * A file of the client request. Plugins never read the bytes and never
 * treat `ref` as a path: `ref` is copied as is into multipart parts or
 * placeholders. The first file of a field is `request_file:<field>`, later
 * ones `request_file:<field>#<index>` (zero-based: the second is `#1`).
 */
export interface FileReference {
    readonly ref: string;
    readonly field: string;
    readonly filename: string;
    readonly mimeType: string;
    readonly size: number;
}

export type DecodedBody =
    | { readonly kind: "json"; readonly value: ReadonlyJSON }
    | { readonly kind: "form"; readonly fields: { readonly [name: string]: readonly string[] } }
    | {
          readonly kind: "multipart";
          readonly fields: { readonly [name: string]: readonly string[] };
          readonly files: readonly FileReference[];
      }
    | { readonly kind: "none" };

/** Given to `native.<decode>` and `native.<render>` functions. */
export interface NativeDecodeContext {
    readonly method: string;
    readonly path: string;
    readonly params: { readonly [name: string]: string };
    readonly query: { readonly [name: string]: readonly string[] };
    readonly body: DecodedBody;
}

/** Given to `protocols.<p>.decodeRequest`; decoders must be deterministic (they may run several times). */
export interface ProtocolDecodeContext extends NativeDecodeContext {
    readonly protocol: ProtocolName;
    /** host_image: "generate" or "edit"; host_video: "generate" (POST /v1/videos) or "retrieve" (GET /v1/videos/{id}); host_responses: "create" (POST /v1/responses) or "retrieve" (GET /v1/responses/{id}). */
    readonly operation: string;
    /** Fixed by the host. */
    readonly model: string;
    /** host_responses: the request asked for an event stream. */
    readonly stream: boolean;
    /** host_responses: the request asked for background: true (and no stream). */
    readonly background?: boolean;
}

/** Given to protocol render hooks. */
export interface ProtocolRenderContext extends ProtocolDecodeContext {
    /** host_responses: artifact links injected by the host; absent for host_image. */
    readonly artifacts?: { readonly [key: string]: { readonly key: string; readonly type: ArtifactType; readonly mimeType?: string; readonly url: string } };
}

export interface SubmitIntent {
    readonly kind: "submit";
    readonly model: string;
    readonly action?: string;
    readonly requestBody?: JSONValue;
    /** Public task IDs; the host checks ownership and injects originTasks. */
    readonly originTaskIds?: readonly string[];
}

export interface QueryIntent {
    readonly kind: "query";
    readonly taskIds: readonly string[];
}

export type TaskIntent = SubmitIntent | QueryIntent;

/* ======================================================================
 * Contexts given to driver hooks
 * ==================================================================== */

/** Missing means vendor. With peer_gateway the host has set Bearer credentials. */
export interface UpstreamContext {
    readonly kind: UpstreamKind;
}

/** The channel's authentication information. */
export interface ChannelAuth {
    readonly authHeader?: string;
    readonly apiKey?: string;
    readonly projectId?: string;
    readonly [field: string]: ReadonlyJSON | undefined;
}

interface ChannelContext {
    /** The channel's base URL (meta.baseUrl for type 61 when unset). */
    readonly baseUrl: string;
    readonly auth: ChannelAuth;
    readonly apiKey?: string;
    readonly authHeader?: string;
    readonly upstream: UpstreamContext;
}

/** A task named by originTaskIds, after ownership checks; never given to external renderers. */
export interface OriginTask {
    readonly taskId: string;
    readonly upstreamTaskId: string;
    readonly action: string;
    readonly status: TaskStatus;
    readonly data: ReadonlyJSON;
}

export interface DriverContext extends ChannelContext {
    /**
     * Normalised request body: what a route's decoder returned as
     * requestBody; for POST /v1/tasks/{pluginKey}, a JSON body as the value
     * itself, and a form or multipart body as
     * `{kind: "form" | "multipart", fields: {name: string[]}}` (files are in
     * `files`).
     */
    readonly requestBody: ReadonlyJSON;
    readonly requestHeaders: { readonly [name: string]: string };
    readonly action: string;
    readonly model: string;
    /** Name after channel model mapping. */
    readonly upstreamModel: string;
    readonly files: readonly FileReference[];
    readonly publicTaskId: string;
    readonly originTasks?: readonly OriginTask[];
}

/** Rebuilt from the saved task; there is no requestBody and no `raw` alias. */
export interface TaskQueryContext extends ChannelContext {
    /** Upstream task ID. */
    readonly taskId: string;
    readonly publicTaskId: string;
    /** Client-facing model name. */
    readonly model: string;
    readonly upstreamModel: string;
    /** Persisted standardised operation. */
    readonly action: string;
    /** Snapshot of the task data. */
    readonly data: ReadonlyJSON;
    /** Plugin-private state kept across polls. */
    readonly state: ReadonlyJSON;
}

export interface BatchQueryContext extends ChannelContext {}

/** Input of listArtifacts. */
export interface ArtifactTask {
    readonly taskId: string;
    readonly status: TaskStatus;
    readonly action: string;
    readonly data: ReadonlyJSON;
    readonly producerVersion: string;
}

/** Input of buildContentRequest: the driver context plus the selected artifact. */
export interface ContentRequestContext extends DriverContext {
    readonly artifactKey: string;
    readonly data: ReadonlyJSON;
    readonly upstreamTaskId: string;
    /** The plugin version that made the task. */
    readonly producerVersion: string;
    /** Only safe Range and conditional headers are passed on. */
    readonly clientRequest: {
        readonly method: "GET" | "HEAD";
        readonly headers: { readonly [name: string]: string };
    };
}

/* ======================================================================
 * Outbound HTTP descriptors (validated and sent by the host)
 * ==================================================================== */

/**
 * Placed anywhere in a JSON body; the host replaces it with the file's
 * content (its own per-file and total limits apply in any case).
 */
export type FilePlaceholder =
    | { readonly __fileRef: string; readonly encoding: "base64"; readonly maxBytes?: number }
    | { readonly __fileRef: string; readonly encoding: "dataUrl"; readonly mimeType: string; readonly maxBytes?: number };

export interface MultipartPart {
    readonly name: string;
    readonly value?: string;
    /** A FileReference.ref, copied as is. */
    readonly fileRef?: string;
    readonly filename?: string;
    readonly mimeType?: string;
}

export interface RequestDescriptor {
    readonly url: string;
    readonly method?: string;
    readonly headers?: { readonly [name: string]: string };
    /** JSON by default; may hold FilePlaceholder objects at any depth. */
    readonly body?: JSONValue;
    readonly bodyType?: "json" | "multipart";
    readonly parts?: readonly MultipartPart[];
    /** "sse" when the submit response is an event stream (needs submitResponseTypes "sse"). */
    readonly responseType?: "json" | "sse";
}

/**
 * May reach only the channel host or allowedHosts when it carries channel
 * credentials. credentialless (public CDNs): GET or HEAD only, no plugin
 * headers or body; the host checks the address and each redirect, and off
 * the channel's origin connects only to public addresses (no loopback,
 * private or link-local ones unless the operator's
 * llmgw_content_allow_private lists them).
 */
export interface ContentRequestDescriptor extends RequestDescriptor {
    readonly credentialless?: boolean;
}

/* ======================================================================
 * Results
 * ==================================================================== */

export type TaskStatus =
    | "NOT_START"
    | "SUBMITTED"
    | "QUEUED"
    | "IN_PROGRESS"
    | "SUCCESS"
    | "FAILURE"
    /** The plugin cannot interpret the upstream status; never taken as in progress. */
    | "UNKNOWN";

/** Upstream submit response given to parseSubmitResponse (any 2xx). */
export interface UpstreamResponse {
    readonly statusCode: number;
    readonly headers: { readonly [name: string]: readonly string[] };
    /** Parsed JSON, or the final state of an SSE submit. */
    readonly body: ReadonlyJSON;
}

/** HTTP information given to result parsers. */
export interface HTTPInfo {
    readonly status: number;
    readonly headers: { readonly [name: string]: readonly string[] };
}

/**
 * What a parse hook says of one task.  The host stores it like this:
 * `status` must be one of TaskStatus (UNKNOWN, or a missing one, counts as a
 * failed poll); `progress` as given, a number n becoming "n%"; `reason` is
 * the fail reason of a FAILURE (both cut to their first 1024 bytes); `data`, when present, replaces the task's
 * data, otherwise the result's other members (`url`, ...) are merged into
 * it.  After a non-2xx poll answer only SUCCESS or FAILURE count as a
 * successful poll.
 */
export interface TaskResult {
    readonly status: TaskStatus;
    readonly progress?: string | number;
    readonly reason?: string;
    readonly url?: string;
    /** Replaces the task's data (see above). */
    readonly data?: JSONValue;
    /** Replaces the plugin state; omitted keeps the old one. */
    readonly state?: JSONValue;
    readonly [extra: string]: JSONValue | undefined;
}

export interface BatchTaskResult extends TaskResult {
    readonly taskId: string;
}

/**
 * parseSubmitResponse result. `immediate` with a terminal status settles
 * at submit time and the task is not polled. `clientResponse` is legacy
 * and rejected.
 */
export interface SubmitResult {
    readonly taskId: string;
    readonly taskData?: JSONValue;
    readonly immediate?: TaskResult;
    readonly state?: JSONValue;
    readonly clientResponse?: never;
}

/** What renderers see of a task. */
export interface TaskView {
    /** Public task ID. */
    readonly task_id: string;
    readonly status: TaskStatus;
    readonly progress?: string;
    readonly fail_reason?: string;
    readonly created_at?: number;
    readonly updated_at?: number;
    readonly finished_at?: number;
    readonly data?: ReadonlyJSON;
    readonly properties?: { readonly [name: string]: ReadonlyJSON };
}

export type ArtifactType = "video" | "audio" | "image" | "file";

/** Stable list; no second persisted record, no temporary download URL. */
export interface Artifact {
    readonly key: string;
    readonly type: ArtifactType;
    readonly mimeType?: string;
}

/** One upstream SSE event (framing by the host; event defaults to "message"). */
export interface SubmitEvent {
    readonly event: string;
    readonly id: string;
    readonly data: string;
}

/** Snapshot mode: the complete state; at done it becomes the response body. */
export interface SubmitEventResult {
    readonly state: JSONValue;
    readonly done: boolean;
}

/** Keys, or indices of existing array elements; at most 32 segments. */
export type JSONPath = readonly (string | number)[];

/**
 * set: replace the root (empty path), an existing array element or an
 * object member (parents must exist); append: add one value to an
 * existing array; appendText: append to an existing string.
 */
export type JSONChange =
    | { readonly op: "set"; readonly path: JSONPath; readonly value: JSONValue }
    | { readonly op: "append"; readonly path: JSONPath; readonly value: JSONValue }
    | { readonly op: "appendText"; readonly path: JSONPath; readonly value: string };

/**
 * Incremental mode (submit-sse-delta@1): exactly these three members; at
 * most 256 changes per event; state at most 64 KiB; the body is formed at
 * completion from the changes.
 */
export interface SubmitEventDeltaResult {
    readonly changes: readonly JSONChange[];
    readonly state: JSONValue;
    readonly done: boolean;
}

/** Given to the optional native.error renderer. */
export interface HostError {
    readonly code: string;
    readonly message: string;
    readonly httpStatus: number;
    readonly retryable: boolean;
}

/** host_responses renderEvents: events to send, the state for the next call, end of stream. */
export interface RenderEventsResult {
    /** Each sent as one SSE event: `{event?, id?, data}` framed as it says (data a string, or JSON), any other value as JSON data named by its `type`. */
    readonly events: readonly JSONValue[];
    readonly state: JSONValue;
    readonly done: boolean;
}

/** One image of a host_image result: a URL or Base64 data, optionally the revised prompt. */
export type ImageDataEntry =
    | { readonly url: string; readonly b64_json?: string; readonly revised_prompt?: string }
    | { readonly b64_json: string; readonly url?: string; readonly revised_prompt?: string };

/**
 * host_image render result. The host adds `created` when absent; with
 * response_format b64_json it downloads the URLs and adds Base64.
 */
export interface ImageResponse {
    readonly created?: number;
    readonly data: readonly ImageDataEntry[];
}

/** Usage facts fitting the chosen schema; never prices or quotas. */
export type UsageResult = UsageFacts | null;

/* ======================================================================
 * Host utilities (global `utils`)
 * ==================================================================== */

export interface HostUtils {
    /** Unix time in seconds. */
    unixNow(): number;
    uuid(): string;
    hmacSHA256(key: string, data: string): string;
    jwtSignHS256(claims: { readonly [claim: string]: ReadonlyJSON }, secret: string): string;
    base64(value: string): string;
    base64URL(value: string): string;
    base64URLDecode(value: string): string;
    /** Cloud-vendor request signing; returns the headers to add. */
    volcSignV4(request: {
        readonly method: string;
        readonly url: string;
        readonly headers?: { readonly [name: string]: string };
        readonly body?: string;
        readonly accessKey: string;
        readonly secretKey: string;
        readonly region?: string;
        readonly service?: string;
        readonly timestamp?: number;
    }): { [name: string]: string };
    hasCapability(name: HostCapability | string): boolean;
    /**
     * Only when meta.requiredCapabilities names json-clone@1 (undefined
     * otherwise): an independent mutable snapshot of plain objects,
     * arrays, null, booleans, finite numbers and strings (undefined,
     * functions, BigInt, dates, sparse arrays and cycles are rejected;
     * `__proto__` stays an ordinary key); at most 1 MiB encoded, 32
     * levels below the root and 32,768 nodes.
     */
    readonly json?: { clone<T extends ReadonlyJSON>(value: T): JSONValue };
}

declare global {
    const utils: HostUtils;
}

/* ======================================================================
 * Hook signatures (named exports of the plugin module)
 * ==================================================================== */

export type BuildSubmitRequest = (ctx: DriverContext) => RequestDescriptor;
export type ParseSubmitResponse = (ctx: DriverContext, response: UpstreamResponse) => SubmitResult;
export type BuildQueryRequest = (ctx: TaskQueryContext) => RequestDescriptor;
export type BuildBatchQueryRequest = (ctx: BatchQueryContext, tasks: readonly TaskQueryContext[]) => RequestDescriptor;
export type ParseTaskResult = (ctx: TaskQueryContext, body: ReadonlyJSON, http: HTTPInfo) => TaskResult;
export type ParseBatchResult = (ctx: BatchQueryContext, body: ReadonlyJSON, http: HTTPInfo) => readonly BatchTaskResult[];
export type ExtractUsage = (ctx: DriverContext) => UsageResult;
export type ExtractUsageOnSubmit = (ctx: DriverContext, taskData: ReadonlyJSON) => UsageResult;
export type ExtractUsageOnComplete = (task: TaskView, result: TaskResult, data: ReadonlyJSON) => UsageResult;
export type ListArtifacts = (task: ArtifactTask) => readonly Artifact[];
export type BuildContentRequest = (ctx: ContentRequestContext) => ContentRequestDescriptor;
export type ParseSubmitEvent = (ctx: DriverContext, event: SubmitEvent, previousState: JSONValue | null) => SubmitEventResult;
export type ParseSubmitEventDelta = (ctx: DriverContext, event: SubmitEvent, previousState: JSONValue | null) => SubmitEventDeltaResult;

export type NativeDecode = (ctx: NativeDecodeContext) => TaskIntent;
/** Returns the vendor envelope; gets an array for multi-task queries. */
export type NativeRender = (ctx: NativeDecodeContext, task: TaskView | readonly TaskView[]) => JSONValue;
export type NativeErrorRender = (ctx: NativeDecodeContext, error: HostError) => JSONValue;

export type ProtocolDecodeRequest = (ctx: ProtocolDecodeContext) => SubmitIntent;
/** host_video: a JSON object; the host overwrites id, object, model, status, progress, created_at, completed_at. */
export type VideoRender = (ctx: ProtocolRenderContext, task: TaskView) => { [field: string]: JSONValue };
export type ImageRender = (ctx: ProtocolRenderContext, task: TaskView) => ImageResponse;
/** host_responses with `stream`; called once without previous state to render a retrieval for stream-only plugins. */
export type ResponsesRenderEvents = (ctx: ProtocolRenderContext, task: TaskView, previousState?: JSONValue | null) => RenderEventsResult;
/** host_responses with `sync` or `background`: the Response object at a terminal status. */
export type ResponsesRenderFinal = (ctx: ProtocolRenderContext, task: TaskView) => { [field: string]: JSONValue };

/**
 * The module a plugin is. Export paths given to the host's validator are
 * the names below, `native.<name>` and `protocols.<protocol>.<hook>`
 * (marketplace protocol names count as their spec names).
 */
export interface PluginModule {
    readonly meta: Meta;

    /** Required for all plugins. */
    readonly buildSubmitRequest: BuildSubmitRequest;
    readonly parseSubmitResponse: ParseSubmitResponse;
    readonly parseTaskResult: ParseTaskResult;

    /** Required when fetchMode is per_task. */
    readonly buildQueryRequest?: BuildQueryRequest;
    /** Both required when fetchMode is batch. */
    readonly buildBatchQueryRequest?: BuildBatchQueryRequest;
    readonly parseBatchResult?: ParseBatchResult;

    readonly extractUsage?: ExtractUsage;
    readonly extractUsageOnSubmit?: ExtractUsageOnSubmit;
    readonly extractUsageOnComplete?: ExtractUsageOnComplete;

    /** Exported as a pair or not at all. */
    readonly listArtifacts?: ListArtifacts;
    readonly buildContentRequest?: BuildContentRequest;

    /** Required with submitResponseTypes "sse" (snapshot mode). */
    readonly parseSubmitEvent?: ParseSubmitEvent;
    /** Required with "sse" and submit-sse-delta@1 (incremental mode). */
    readonly parseSubmitEventDelta?: ParseSubmitEventDelta;

    /** Every routes[].decode and routes[].render names a function here. */
    readonly native?: {
        readonly [name: string]: NativeDecode | NativeRender | NativeErrorRender | undefined;
        readonly error?: NativeErrorRender;
    };

    /** One member per claimed protocol, with exactly the hooks its claim uses. */
    readonly protocols?: {
        readonly host_video?: { readonly decodeRequest: ProtocolDecodeRequest; readonly render: VideoRender };
        readonly host_image?: { readonly decodeRequest: ProtocolDecodeRequest; readonly render: ImageRender };
        readonly host_responses?: {
            readonly decodeRequest: ProtocolDecodeRequest;
            readonly renderEvents?: ResponsesRenderEvents;
            readonly renderFinal?: ResponsesRenderFinal;
        };
        readonly openai_video?: { readonly decodeRequest: ProtocolDecodeRequest; readonly render: VideoRender };
        readonly openai_image?: { readonly decodeRequest: ProtocolDecodeRequest; readonly render: ImageRender };
        readonly openai_responses?: {
            readonly decodeRequest: ProtocolDecodeRequest;
            readonly renderEvents?: ResponsesRenderEvents;
            readonly renderFinal?: ResponsesRenderFinal;
        };
    };
}
