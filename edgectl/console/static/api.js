// The REST API as the console uses it: bearer token from sessionStorage, JSON in and out, errors as ApiError.

const KEY = "edgectl.token";
export const BASE = "/api/v1";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export const session = {
  get token() { return sessionStorage.getItem(KEY) || ""; },
  set token(value) {
    if (value) sessionStorage.setItem(KEY, value);
    else sessionStorage.removeItem(KEY);
  },
  me: null, // {user, role} once signed in
};

/** Listeners called with the ApiError when the server answers 401 (token wrong, expired or revoked). */
export const onUnauthorized = new Set();

export async function api(path, { method = "GET", body, raw, token, signal } = {}) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${token ?? session.token}` };
  let payload;
  if (raw !== undefined) {
    headers["Content-Type"] = "application/octet-stream";
    payload = raw;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const response = await fetch(BASE + path, { method, headers, body: payload, signal, cache: "no-store" });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { error: text.slice(0, 200) }; }
  if (!response.ok) {
    const err = new ApiError(response.status, errorText(response.status, data));
    if (response.status === 401 && token === undefined) onUnauthorized.forEach((f) => f(err));
    throw err;
  }
  return data;
}

function errorText(status, data) {
  // The API answers {"error": {"status", "message", "field"}}.
  const detail = data && (data.error || data.detail || data.message);
  const message = typeof detail === "string" ? detail : detail && detail.message ? detail.message : detail ? JSON.stringify(detail) : "";
  if (status === 403) return message || "your role may not do this";
  if (status === 401) return message || "sign in again: the token was refused";
  return message || `the server answered ${status}`;
}

/** A query string from an object, leaving out empty values. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : "";
}

const ORDER = ["viewer", "operator", "admin"];

/** Whether the signed-in role is at least ``role``. */
export function can(role) {
  const mine = session.me ? ORDER.indexOf(session.me.role) : -1;
  return mine >= ORDER.indexOf(role);
}
