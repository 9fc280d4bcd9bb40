// The API client of the console: fetch with the API key as a bearer token, and the SSE URL
// (an EventSource cannot send headers, so the key goes as ?access_token= on that route).

const KEY = "treadle.key";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function getKey() {
  return localStorage.getItem(KEY) || "";
}

export function setKey(value) {
  if (value) localStorage.setItem(KEY, value);
  else localStorage.removeItem(KEY);
}

// ?key=… in the page URL: remember it, then take it out of the address bar.
export function adoptKeyFromUrl() {
  const url = new URL(window.location.href);
  const key = url.searchParams.get("key");
  if (key === null) return;
  setKey(key);
  url.searchParams.delete("key");
  history.replaceState(null, "", url.pathname + url.search + url.hash);
}

export async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const key = getKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  let resp;
  try {
    resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (err) {
    throw new ApiError(0, "unreachable", `cannot reach the API: ${err.message}`);
  }
  if (!resp.ok) {
    let err = {};
    try { err = (await resp.json()).error || {}; } catch { /* not JSON */ }
    throw new ApiError(resp.status, err.code || "http_error", err.message || resp.statusText);
  }
  return resp.status === 204 ? null : resp.json();
}

export function eventsUrl(runId) {
  const key = getKey();
  const base = `/v1/runs/${encodeURIComponent(runId)}/events`;
  return key ? `${base}?access_token=${encodeURIComponent(key)}` : base;
}

export const runs = {
  list: (status) => api(`/v1/runs?limit=100${status ? `&status=${encodeURIComponent(status)}` : ""}`),
  get: (id) => api(`/v1/runs/${id}`),
  messages: (id) => api(`/v1/runs/${id}/messages`).then((r) => r.messages),
  toolCalls: (id) => api(`/v1/runs/${id}/tool-calls`).then((r) => r.tool_calls),
  usage: (id) => api(`/v1/runs/${id}/usage`).then((r) => r.usage),
  memory: (id) => api(`/v1/runs/${id}/memory`).then((r) => r.events),
  submit: (body) => api("/v1/runs", { method: "POST", body }),
  answer: (id, askId, answers) => api(`/v1/runs/${id}/answer`, { method: "POST", body: { ask_id: askId, answers } }),
  approve: (id, body) => api(`/v1/runs/${id}/approval`, { method: "POST", body }),
  cancel: (id) => api(`/v1/runs/${id}/cancel`, { method: "POST" }),
  resume: (id) => api(`/v1/runs/${id}/resume`, { method: "POST" }),
};

export const agents = () => api("/v1/agents").then((r) => r.agents);

export const spend = () => api("/v1/spend").then((r) => r.envelopes);
