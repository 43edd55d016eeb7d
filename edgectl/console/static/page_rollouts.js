// Rollouts list, newest first, with progress; operators get a "New rollout" button.

import { fill, fmtTime, h, pill, progress } from "./dom.js";

export const NAV = "rollouts";
export const PAGE = "rollouts";
export const TITLE = "Rollouts";

const DONE = new Set(["ok"]);
const FAILED = new Set(["failed", "rolled-back", "rollback-sent"]);

/** {done, failed, total} devices of a rollout: from its ``progress`` if the server counted, else from its devices. */
export function rolloutProgress(r) {
  if (r.device_counts) { // the list's rows: counts by device status
    const c = r.device_counts;
    const total = Object.entries(c).reduce((n, [s, k]) => n + (s === "skipped" ? 0 : k), 0);
    return { done: c.ok || 0, failed: [...FAILED].reduce((n, s) => n + (c[s] || 0), 0), total };
  }
  if (Array.isArray(r.progress)) {
    const sum = (k) => r.progress.reduce((n, w) => n + (w[k] || 0), 0);
    return { done: sum("ok"), failed: sum("failed"), total: sum("devices") };
  }
  const devices = (r.devices || []).filter((d) => d.status !== "skipped");
  return {
    done: devices.filter((d) => DONE.has(d.status)).length,
    failed: devices.filter((d) => FAILED.has(d.status)).length,
    total: devices.length,
  };
}

export async function mount(main, _args, _params, ctx) {
  const table = h("div#rollouts-table");
  fill(main,
    h("h1", "Rollouts"),
    ctx.can("operator") ? h("p", h("a.button#new-rollout", { href: "#/rollouts/new" }, h("button.primary", { type: "button",
      tabindex: -1 }, "New rollout"))) : null,
    table);
  const refresh = async () => {
    const list = await ctx.api("/rollouts?limit=100");
    draw(table, list.rollouts || []);
  };
  await refresh();
  return { refresh };
}

function draw(el, items) {
  if (!items.length) {
    fill(el, h("p.muted", "No rollout yet."));
    return;
  }
  fill(el, h("table",
    h("thead", h("tr", ["Rollout", "Status", "Packages", "Selector", "Wave", "Progress", "Created", "Reason"].map((c) => h("th", c)))),
    h("tbody", items.map((r) => {
      const p = rolloutProgress(r);
      return h("tr", { dataset: { rollout: r.id } },
        h("td", h("a", { href: `#/rollouts/${encodeURIComponent(r.id)}` }, r.id)),
        h("td", pill(r.status)),
        h("td", (r.packages || []).join(", ")),
        h("td", h("code", r.selector || "all")),
        h("td", `${r.wave}/${r.waves}`),
        h("td", progress(p.done, p.total, p.failed), h("span.muted", ` ${p.done}/${p.total}`)),
        h("td", fmtTime(r.created)),
        h("td.wrap", r.reason || ""));
    }))));
}
