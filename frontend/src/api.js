// The coordinator's REST API, with the session cookie and Django's CSRF token.

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.message || `request failed (${status})`);
    this.status = status;
    this.code = body?.code || "error";
    this.details = body?.details || {};
  }
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

export async function api(path, { method = "GET", body, query } = {}) {
  const url = new URL(`/api/${path}`, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
  const response = await fetch(url, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data);
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
