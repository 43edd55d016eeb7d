// Fleet overview: devices by status, target and model version (counted by the server), recent rollouts.

import { breakdown } from "./charts.js";
import { fill, h, pill, progress } from "./dom.js";
import { rolloutProgress } from "./page_rollouts.js";

export const NAV = "fleet";
const ACTIVE = ["running", "paused", "rolling-back", "aborting"];
export const PAGE = "fleet";
export const TITLE = "Fleet";

export async function mount(main, _args, _params, ctx) {
  const body = h("div#fleet");
  fill(main, h("h1", "Fleet"), body);
  const refresh = async () => {
    const [summary, recent, active] = await Promise.all([ctx.api("/fleet/summary"), ctx.api("/rollouts?limit=6"),
      ctx.api(`/rollouts?${ACTIVE.map((s) => `status=${s}`).join("&")}&limit=1`)]);
    draw(body, summary, recent.rollouts || [], active.total || 0);
  };
  await refresh();
  return { refresh };
}

function count(map, key) { return (map && map[key]) || 0; }

function draw(body, s, rollouts, active) {
  const devicesLink = (key) => (value) => `#/devices?${new URLSearchParams({ [key]: value })}`;
  fill(body,
    h("div.cards",
      card("Devices", s.total, "#/devices", "total"),
      card("Online", count(s.by_status, "online"), "#/devices?status=online", "online"),
      card("Offline", count(s.by_status, "offline"), "#/devices?status=offline", "offline"),
      card("Active rollouts", active, "#/rollouts", "active-rollouts")),
    h("div.grid2",
      h("section.panel", breakdown("By status", s.by_status, devicesLink("status"))),
      h("section.panel", breakdown("By target", s.by_target, devicesLink("target"))),
      h("section.panel", breakdown("By model version", s.by_model,
        (label) => (label.includes("@") ? `#/devices?${versionQuery(label)}` : "#/devices"))),
      h("section.panel", h("h2", "Recent rollouts"), recentTable(rollouts))));
}

function versionQuery(label) {
  const [model, version] = label.split("@");
  return new URLSearchParams(version ? { model, version } : { model }).toString();
}

function card(title, value, href, test) {
  return h("a.card", { href, dataset: { card: test } }, h("div.muted", title), h("div.big", (value || 0).toLocaleString()));
}

function recentTable(recent) {
  if (!recent.length) return h("p.muted", "No rollout yet.");
  return h("table",
    h("thead", h("tr", h("th", "Rollout"), h("th", "Status"), h("th", "Wave"), h("th", "Progress"))),
    h("tbody", recent.map((r) => {
      const p = rolloutProgress(r);
      return h("tr",
        h("td", h("a", { href: `#/rollouts/${encodeURIComponent(r.id)}` }, r.id)),
        h("td", pill(r.status)),
        h("td", `${r.wave}/${r.waves}`),
        h("td", progress(p.done, p.total, p.failed)));
    })));
}
