// An example task plugin: the `my-video` plugin of the README's Tasks
// section.  It adapts a video vendor with a submit-and-poll API:
//
//   POST {baseUrl}/v1/videos       {model, prompt, duration}  -> {id}
//   GET  {baseUrl}/v1/videos/{id}  -> {id, status, progress, duration?,
//                                      video_url?, error?}
//   status: queued, running, succeeded or failed; progress 0-100.
//
// docs/examples/video-vendor.mjs serves that API on 127.0.0.1 for trying it.
// Tasks are priced by the seconds of video: {"my-video::video-1":
// {"unit_prices": {"seconds": 0.05}}} reserves duration x 0.05 USD at the
// submit and settles to the seconds the vendor reports.

export const meta = {
  apiVersion: 1,
  key: 'my-video',
  name: 'My video vendor',
  version: '1.0.0',
  author: { name: 'llmgw example' },
  description: 'Submits text-to-video tasks and polls them until they end',
  icon: 'text:MV',
  models: ['video-1'],
  fetchMode: 'per_task',
  auth: 'api_key',
  usageSchema: {
    seconds: { type: 'number', unit: 'second', description: 'Seconds of generated video' },
  },
};

/* The client's body (POST /v1/tasks/my-video): a JSON body is the object
   itself; a form or multipart body comes as {kind, fields: {name: [values]}},
   of which the first value of each field is taken. */
function input(ctx) {
  const b = ctx.requestBody;
  if (b && (b.kind === 'form' || b.kind === 'multipart') && b.fields) {
    const o = {};
    for (const k of Object.keys(b.fields)) o[k] = b.fields[k][0];
    return o;
  }
  return b && typeof b === 'object' && !Array.isArray(b) ? b : {};
}

function duration(ctx) {
  const d = Number(input(ctx).duration);
  return Number.isFinite(d) && d > 0 ? d : 5;
}

export function buildSubmitRequest(ctx) {
  const v = input(ctx);
  return {
    url: ctx.baseUrl + '/v1/videos',
    method: 'POST',
    headers: { Authorization: ctx.authHeader || ('Bearer ' + ctx.apiKey),
               'Content-Type': 'application/json' },
    body: { model: ctx.upstreamModel || ctx.model, prompt: String(v.prompt || ''),
            duration: duration(ctx) },
  };
}

export function parseSubmitResponse(ctx, res) {
  if (!res.body || typeof res.body.id !== 'string') {
    throw new Error('the vendor answered without a task id');
  }
  return { taskId: res.body.id };
}

/* What the task is reserved for: the seconds the client asked for. */
export function extractUsage(ctx) {
  return { seconds: duration(ctx) };
}

export function buildQueryRequest(ctx) {
  return {
    url: ctx.baseUrl + '/v1/videos/' + encodeURIComponent(ctx.taskId),
    method: 'GET',
    headers: { Authorization: ctx.authHeader || ('Bearer ' + ctx.apiKey) },
  };
}

const STATUS = { queued: 'QUEUED', running: 'IN_PROGRESS', succeeded: 'SUCCESS',
                 failed: 'FAILURE' };

export function parseTaskResult(ctx, body) {
  const out = { status: STATUS[body && body.status] || 'UNKNOWN' };
  if (typeof body.progress === 'number') out.progress = body.progress + '%';
  if (out.status === 'FAILURE') out.reason = String(body.error || 'the vendor failed the task');
  if (out.status === 'SUCCESS') {
    out.data = { video_url: body.video_url };
    if (typeof body.duration === 'number') out.seconds = body.duration;
  }
  return out;
}

/* What the task is settled to: the seconds the vendor made. */
export function extractUsageOnComplete(task, result) {
  return result && typeof result.seconds === 'number' ? { seconds: result.seconds } : null;
}
