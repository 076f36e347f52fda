// The coordinator's REST API, with the session cookie and Django's CSRF token.

export class ApiError extends Error {
  constructor(status, body, retryAfter = null) {
    super(body?.message || `request failed (${status})`);
    this.status = status;
    this.code = body?.code || "error";
    this.details = body?.details || {};
    // Seconds the coordinator asked to wait (Retry-After of a 429), or null.
    this.retryAfter = retryAfter;
  }
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

/** No answer from the coordinator (down, or a proxy in front of it says it is away). */
export class CoordinatorUnreachable extends Error {
  constructor(detail) {
    super(`The coordinator at ${window.location.origin} is not answering; retrying…`);
    this.status = 0;
    this.code = "unreachable";
    this.detail = detail;
  }
}

// Whoever shows the coordinator's reachability (app.js's banner) listens here.
const listeners = new Set();
let reachable = true;
export function onReachability(listener) {
  listeners.add(listener);
}
export function setReachable(now) {
  if (now === reachable) return;
  reachable = now;
  for (const listener of listeners) listener(now);
}
export const isReachable = () => reachable;

// A proxy in front of a stopped coordinator answers these itself.
const AWAY = new Set([502, 503, 504]);

export async function api(path, { method = "GET", body, query } = {}) {
  const url = new URL(`/api/${path}`, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    // fetch rejects only when no answer came at all ("Failed to fetch").
    setReachable(false);
    throw new CoordinatorUnreachable(error.message);
  }
  const data = response.status === 204 ? null : await response.json().catch(() => null);
  if (AWAY.has(response.status) && !data?.code) {
    setReachable(false);
    throw new CoordinatorUnreachable(`${response.status} ${response.statusText}`);
  }
  setReachable(true);
  if (response.status === 204) return null;
  if (!response.ok) {
    const wait = Number.parseInt(response.headers.get("Retry-After") || "", 10);
    throw new ApiError(response.status, data, Number.isFinite(wait) ? wait : null);
  }
  return data;
}

/** Every page of a paginated list (the API pages with ?page=). */
export async function apiAll(path, query = {}) {
  const first = await api(path, { query });
  if (!first || !Array.isArray(first.results)) return first;
  const items = [...first.results];
  let next = first.next;
  let page = 2;
  while (next && page < 50) {
    const more = await api(path, { query: { ...query, page } });
    items.push(...more.results);
    next = more.next;
    page += 1;
  }
  return items;
}
