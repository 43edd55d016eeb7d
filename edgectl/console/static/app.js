// The console's shell: sign-in state, hash routes, the live-update loop, flash messages and confirmations.

import { api, can, onUnauthorized, session } from "./api.js";
import { fill, h } from "./dom.js";
import * as audit from "./page_audit.js";
import * as devices from "./page_devices.js";
import * as device from "./page_device.js";
import * as fleet from "./page_fleet.js";
import * as groups from "./page_groups.js";
import * as group from "./page_group.js";
import * as packages from "./page_packages.js";
import * as rollouts from "./page_rollouts.js";
import * as rollout from "./page_rollout.js";
import * as newRollout from "./page_new_rollout.js";
import * as signin from "./page_signin.js";
import * as webhooks from "./page_webhooks.js";
import { completeSignIn } from "./sso.js";

const ROUTES = [
  [/^\/$/, fleet],
  [/^\/devices$/, devices],
  [/^\/devices\/(.+)$/, device],
  [/^\/rollouts$/, rollouts],
  [/^\/rollouts\/new$/, newRollout],
  [/^\/rollouts\/(.+)$/, rollout],
  [/^\/packages$/, packages],
  [/^\/groups$/, groups],
  [/^\/groups\/(.+)$/, group],
  [/^\/webhooks$/, webhooks],
  [/^\/webhooks\/([^/]+)$/, webhooks],
  [/^\/audit$/, audit],
  [/^\/signin$/, signin],
];

// Live updates: every page's refresh() runs this often (?poll=MS in the address overrides it).
const POLL_MS = Number(new URLSearchParams(location.search).get("poll")) || 3000;

const main = document.getElementById("main");
let current = null; // {page, view, generation}
let generation = 0;
let timer = null;
let pendingFlash = ""; // shown by the next page drawn (a refused token's message on the sign-in page)

export const ctx = {
  api, can, session,
  /** Show a message above the page: kind "error" (default) or "info". */
  flash(text, kind = "error") {
    const el = document.getElementById("flash");
    el.textContent = text;
    el.className = `flash ${kind === "info" ? "info" : ""}`;
    el.hidden = !text;
  },
  /** Ask before a consequential action; resolves true when confirmed. */
  confirm(title, text, okLabel = "Confirm") {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-text").textContent = text;
    document.getElementById("confirm-ok").textContent = okLabel;
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    });
  },
  go(hash) { location.hash = hash; },
};

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, search = ""] = raw.split("?");
  return { path, params: new URLSearchParams(search) };
}

async function whoami() {
  if (!session.token) return false;
  try {
    session.me = await api("/me");
    return true;
  } catch (err) {
    if (err.status === 401) session.token = "";
    else ctx.flash(`Cannot reach the API: ${err.message}`);
    return false;
  }
}

function chrome() {
  const signedIn = Boolean(session.me);
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("signout").hidden = !signedIn;
  document.getElementById("live").hidden = !signedIn;
  document.getElementById("who").textContent = signedIn ? `${session.me.user} (${session.me.role})` : "";
  document.body.dataset.role = signedIn ? session.me.role : "";
}

async function route() {
  const { path, params } = parseHash();
  if (!session.me && path !== "/signin") {
    if (!(await whoami())) {
      ctx.go(`#/signin?next=${encodeURIComponent(location.hash.replace(/^#/, "") || "/")}`);
      return;
    }
  }
  chrome();
  let page = signin;
  let args = [];
  for (const [pattern, candidate] of ROUTES) {
    const m = path.match(pattern);
    if (m) { page = candidate; args = m.slice(1).map(decodeURIComponent); break; }
  }
  if (page === signin && session.me) { ctx.go("#/"); return; }
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("current", a.dataset.nav === page.NAV);
  generation += 1;
  const mine = generation;
  if (current && current.view && current.view.unmount) current.view.unmount();
  current = null;
  document.body.dataset.ready = "";
  document.body.dataset.page = page.PAGE;
  ctx.flash(pendingFlash);
  pendingFlash = "";
  fill(main, h("p.muted", "Loading…"));
  try {
    const view = await page.mount(main, args, params, ctx);
    if (mine !== generation) return; // the operator moved on meanwhile
    current = { page, view, generation: mine };
    document.title = `${page.TITLE || "edgectl"} · edgectl console`;
    document.body.dataset.ready = page.PAGE; // tests and the benchmark wait for this: the page has drawn its data
    // After the next paint: the first full render, in ms since navigation start (./scripts/bench console reads it).
    requestAnimationFrame(() => setTimeout(() => { window.edgectlRendered = { page: page.PAGE, ms: performance.now() }; }));
  } catch (err) {
    if (mine !== generation) return;
    fill(main, h("h1", "Something went wrong"), h("p.error", err.message));
    if (err.status !== 401) ctx.flash(err.message);
  }
}

let busy = false;
async function tick() {
  if (busy || !current || !current.view || !current.view.refresh || document.hidden) return;
  busy = true;
  const live = document.getElementById("live");
  const mine = current.generation;
  try {
    await current.view.refresh();
    if (mine === generation) {
      live.classList.remove("stale");
      live.title = `updated ${new Date().toLocaleTimeString()}`;
      document.body.dataset.refreshed = String(Date.now());
    }
  } catch (err) {
    live.classList.add("stale");
    live.title = `last update failed: ${err.message}`;
  } finally {
    busy = false;
  }
}

onUnauthorized.add((err) => {
  session.token = "";
  session.me = null;
  chrome();
  pendingFlash = err.message;
  if (parseHash().path !== "/signin") ctx.go("#/signin");
  else ctx.flash(err.message);
});

document.getElementById("signout").addEventListener("click", () => {
  session.token = "";
  session.me = null;
  chrome();
  ctx.go("#/signin");
});

async function start() {
  try {
    const next = await completeSignIn(); // back from the provider's sign-in page (single sign-on)
    // The code is used once: never left in the address bar. No hashchange: route() below draws the page.
    if (next) history.replaceState(null, "", `${location.pathname}#${next}`);
  } catch (err) {
    pendingFlash = err.message;
    history.replaceState(null, "", `${location.pathname}#/signin`);
  }
  window.addEventListener("hashchange", route);
  route();
}

timer = setInterval(tick, POLL_MS);
start();
window.edgectlConsole = { ctx, pollMs: POLL_MS, stop: () => clearInterval(timer) };
