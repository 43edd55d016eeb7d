// Single sign-on (docs/sso.md): the authorization code flow with PKCE (S256), state and nonce. The browser makes the
// secrets and checks the state; the controller redeems the code (POST /api/v1/sso/token, where the nonce is checked)
// and hands back the provider's ID token, which then serves as this tab's bearer token like a pasted one.

import { BASE, session } from "./api.js";

const PENDING = "edgectl.sso"; // {state, verifier, nonce, next, redirectUri} while the browser is at the provider

/** The controller's single sign-on settings: {enabled, authorization_endpoint, client_id, scopes}. */
export async function ssoConfig() {
  const response = await fetch(`${BASE}/sso`, { headers: { Accept: "application/json" }, cache: "no-store" });
  return response.ok ? response.json() : { enabled: false };
}

function random(bytes) {
  return base64url(crypto.getRandomValues(new Uint8Array(bytes)));
}

function base64url(bytes) {
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

/** Send the browser to the provider's sign-in; it comes back to this page with ?code=…&state=…. */
export async function beginSignIn(config, next) {
  const verifier = random(32);
  const challenge = base64url(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier))));
  const pending = { state: random(16), verifier, nonce: random(16), next, redirectUri: location.origin + location.pathname };
  sessionStorage.setItem(PENDING, JSON.stringify(pending));
  const query = new URLSearchParams({
    response_type: "code", client_id: config.client_id, redirect_uri: pending.redirectUri, scope: config.scopes,
    state: pending.state, nonce: pending.nonce, code_challenge: challenge, code_challenge_method: "S256",
  });
  location.assign(`${config.authorization_endpoint}?${query}`);
}

/** On the way back from the provider: null when this load is no such return, else the route to go to next.
 * Throws an Error saying why when the provider refused, the state does not match, or the controller refused. */
export async function completeSignIn() {
  const params = new URLSearchParams(location.search);
  if (!params.has("code") && !params.has("error")) return null;
  const pending = JSON.parse(sessionStorage.getItem(PENDING) || "null");
  sessionStorage.removeItem(PENDING);
  if (params.has("error")) {
    throw new Error(`The provider refused the sign-in: ${params.get("error_description") || params.get("error")}`);
  }
  if (!pending || params.get("state") !== pending.state) {
    throw new Error("Single sign-on failed: the answer's state is not the one this tab sent (start again)");
  }
  const response = await fetch(`${BASE}/sso/token`, {
    method: "POST", headers: { "Content-Type": "application/json", Accept: "application/json" }, cache: "no-store",
    body: JSON.stringify({ code: params.get("code"), code_verifier: pending.verifier, redirect_uri: pending.redirectUri,
      nonce: pending.nonce }),
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new Error((data && data.error && data.error.message) || `the server answered ${response.status}`);
  session.token = data.token;
  return pending.next || "/";
}
