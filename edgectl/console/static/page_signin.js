// Sign in: paste a token from `edgectl tokens create`, or sign in with SSO when the controller has a provider
// (sso.js); the token stays in this tab's sessionStorage only.

import { api, session } from "./api.js";
import { fill, h } from "./dom.js";
import { beginSignIn, ssoConfig } from "./sso.js";

export const PAGE = "signin";
export const TITLE = "Sign in";

export async function mount(main, _args, params, ctx) {
  const token = h("input#token", { type: "password", autocomplete: "off", spellcheck: "false", required: true,
    placeholder: "edgectl_…", "aria-label": "API token" });
  const error = h("p.error#signin-error", { role: "alert" });
  const form = h("form.stack", {
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = "";
      const value = token.value.trim();
      try {
        session.me = await api("/me", { token: value });
        session.token = value;
        ctx.go(`#${params.get("next") || "/"}`);
      } catch (err) {
        error.textContent = err.status === 401 ? "That token was refused (wrong, expired or revoked)." : err.message;
      }
    },
  },
  h("label", "API token", token),
  h("button.primary#signin", { type: "submit" }, "Sign in"),
  error);
  const sso = await ssoConfig().catch(() => ({ enabled: false }));
  const ssoButton = sso.enabled ? h("button.primary#sso", { type: "button", onclick: () => {
    beginSignIn(sso, params.get("next") || "/").catch((err) => { error.textContent = err.message; });
  } }, "Sign in with SSO") : null;
  fill(main, h("section.panel.signin",
    h("h1", "Sign in to the edgectl console"),
    ssoButton, ssoButton && h("p.muted", "Or with a token:"),
    h("p.muted", "Paste a bearer token. An admin creates one with ",
      h("code", "edgectl tokens create USER"), ". It is kept in this browser tab only and sent with every API call."),
    form));
  token.focus();
  return {};
}
