// The audit log: filters (actor, action, time, rollout, device) applied by the server, pages back in time, CSV export.

import { BASE, query, session } from "./api.js";
import { fill, fmtTime, h } from "./dom.js";

export const NAV = "audit";
export const PAGE = "audit";
export const TITLE = "Audit";
const PAGE_SIZE = 100;
const FILTERS = ["actor", "action", "since", "until", "rollout_id", "device_id"];

/** A datetime-local value (the browser's local time) as ISO 8601 with its UTC offset, for the API; "" stays "". */
function iso(local) {
  if (!local) return "";
  const when = new Date(local);
  return Number.isNaN(when.getTime()) ? local : when.toISOString();
}

export async function mount(main, _args, params, ctx) {
  const state = Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""]));
  let offset = Math.max(0, Number(params.get("offset")) || 0);
  const field = (name, el) => { el.name = name; el.value = state[name]; return el; };
  const form = h("form.filters#audit-filters", {
    onsubmit: (event) => {
      event.preventDefault();
      const data = new FormData(form);
      ctx.go(`#/audit${query(Object.fromEntries(FILTERS.map((k) => [k, String(data.get(k) || "").trim()])))}`);
    },
  },
  h("label", "Actor", field("actor", h("input", { size: 14, placeholder: "user:alice or user:*" }))),
  h("label", "Action", field("action", h("input", { size: 16, placeholder: "device decommissioned" }))),
  h("label", "Since", field("since", h("input", { type: "datetime-local" }))),
  h("label", "Until", field("until", h("input", { type: "datetime-local" }))),
  h("label", "Rollout", field("rollout_id", h("input", { size: 16 }))),
  h("label", "Device", field("device_id", h("input", { size: 12 }))),
  h("button.primary", { type: "submit" }, "Filter"),
  h("a", { href: "#/audit" }, "Clear"));
  const filters = () => ({ ...state, since: iso(state.since), until: iso(state.until) });
  const exporter = h("a#audit-csv", { href: "#", download: "edgectl-audit.csv", onclick: (event) => exportCsv(event, filters(), ctx) },
    "Export CSV");
  const table = h("div#audit-table");
  fill(main, h("h1", "Audit log"), form, h("p", exporter, h("span.muted", " every matching entry, as a spreadsheet opens it")),
    table);
  const refresh = async () => {
    const page = await ctx.api(`/audit${query({ ...filters(), limit: PAGE_SIZE, offset })}`);
    draw(table, page, offset, (next) => { offset = next; return refresh(); });
  };
  await refresh();
  return { refresh };
}

/** The CSV needs the bearer token, which a plain link cannot send: fetch it, then save it from a blob. */
async function exportCsv(event, filters, ctx) {
  const link = event.currentTarget;
  if (link.dataset.ready) { delete link.dataset.ready; return; } // the click below: let the browser save it
  event.preventDefault();
  const response = await fetch(`${BASE}/audit${query({ ...filters, format: "csv", limit: 100000 })}`,
    { headers: { Authorization: `Bearer ${session.token}` }, cache: "no-store" });
  if (!response.ok) {
    const data = await response.json().catch(() => ({}));
    ctx.flash((data.error && data.error.message) || `the server answered ${response.status}`);
    return;
  }
  const text = await response.text();
  if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href);
  link.href = URL.createObjectURL(new Blob([text], { type: "text/csv" }));
  link.dataset.rows = String(Math.max(0, text.split("\r\n").length - 2));
  link.dataset.ready = "1";
  link.click();
}

function draw(el, page, offset, goTo) {
  const items = [...(page.entries || [])].reverse(); // newest first on screen
  const total = page.total || 0;
  const last = Math.min(offset + items.length, total);
  fill(el,
    h("table",
      h("thead", h("tr", ["Time", "Actor", "Action", "Rollout", "Device", "Detail"].map((c) => h("th", c)))),
      h("tbody", items.map((e) => h("tr", { dataset: { entry: String(e.id), action: e.action } },
        h("td", fmtTime(e.ts)),
        h("td", e.actor),
        h("td", e.action),
        h("td", e.rollout_id ? h("a", { href: `#/rollouts/${encodeURIComponent(e.rollout_id)}` }, e.rollout_id) : "–"),
        h("td", e.device_id ? h("a", { href: `#/devices/${encodeURIComponent(e.device_id)}` }, e.device_id) : "–"),
        h("td.wrap", e.detail || ""))))),
    h("div.pager",
      h("button#audit-newer", { type: "button", disabled: offset <= 0, onclick: () => goTo(Math.max(0, offset - PAGE_SIZE)) },
        "← Newer"),
      h("span#audit-info", total ? `${offset + 1}–${last} of ${total.toLocaleString()} (newest first)` : "no entry matches"),
      h("button#audit-older", { type: "button", disabled: last >= total, onclick: () => goTo(offset + PAGE_SIZE) },
        "Older →")));
}
