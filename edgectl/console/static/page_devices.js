// Devices table: the server filters and pages (10,000 devices stay one page of rows in the browser).

import { query } from "./api.js";
import { fill, fmtAgo, h, pill } from "./dom.js";

export const NAV = "devices";
export const PAGE = "devices";
export const TITLE = "Devices";
const PAGE_SIZE = 50; // rows a page unless the address says ?limit=N
const FILTERS = ["status", "target", "model", "version", "selector", "q", "limit"];

export async function mount(main, _args, params, ctx) {
  const state = Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""]));
  let offset = Math.max(0, Number(params.get("offset")) || 0);
  const size = Math.min(500, Math.max(1, Number(params.get("limit")) || PAGE_SIZE));
  const field = (name, el) => { el.name = name; el.value = state[name]; return el; };
  const summary = await ctx.api("/fleet/summary");
  const targets = Object.keys(summary.by_target || {}).filter((t) => t !== "unknown").sort();
  const form = h("form.filters#device-filters", {
    onsubmit: (event) => {
      event.preventDefault();
      const data = new FormData(form);
      const next = Object.fromEntries(FILTERS.map((k) => [k, String(data.get(k) || "").trim()]));
      ctx.go(`#/devices${query(next)}`);
    },
  },
  h("label", "Status", field("status", h("select", h("option", { value: "" }, "any"),
    ["online", "offline", "unknown"].map((s) => h("option", { value: s }, s))))),
  h("label", "Target", field("target", h("select", h("option", { value: "" }, "any"),
    targets.map((t) => h("option", { value: t }, t))))),
  h("label", "Model", field("model", h("input", { size: 12, placeholder: "name" }))),
  h("label", "Version", field("version", h("input", { size: 5, inputmode: "numeric" }))),
  h("label", "Selector", field("selector", h("input", { size: 18, placeholder: "group=lab,id=cam-*" }))),
  h("label", "Search", field("q", h("input", { size: 14, placeholder: "id, target, tag…" }))),
  h("input", { type: "hidden", name: "limit", value: params.get("limit") || "" }),
  h("button.primary", { type: "submit" }, "Filter"),
  h("a", { href: "#/devices" }, "Clear"));
  const table = h("div#devices-table");
  fill(main, h("h1", "Devices"), form, table);

  const refresh = async () => {
    const page = await ctx.api(`/devices${query({ ...state, limit: size, offset })}`);
    draw(table, page, offset, size, (next) => { offset = next; return refresh(); });
  };
  await refresh();
  return { refresh };
}

function draw(el, page, offset, size, goTo) {
  const items = page.devices || page.items || [];
  const total = page.total || 0;
  const last = Math.min(offset + items.length, total);
  fill(el,
    h("table",
      h("thead", h("tr", ["Device", "Status", "Target", "Model", "Version", "Backend", "Agent", "Tags", "Last seen"]
        .map((c) => h("th", c)))),
      h("tbody", items.map((d) => h("tr", { dataset: { device: d.device_id } },
        h("td", h("a", { href: `#/devices/${encodeURIComponent(d.device_id)}` }, d.device_id)),
        h("td", pill(d.status)),
        h("td", d.target || "–"),
        h("td", d.model || "–"),
        h("td", d.version ?? "–"),
        h("td", (d.backend || "–").replace(/^onnxruntime\//, "")),
        h("td", d.agent_version || "–"),
        h("td.wrap", Object.entries(d.tags || {}).map(([k, v]) => `${k}=${v}`).join(", ")),
        h("td", fmtAgo(d.last_seen)))))),
    h("div.pager",
      h("button#prev", { type: "button", disabled: offset <= 0, onclick: () => goTo(Math.max(0, offset - size)) }, "← Previous"),
      h("span#page-info", total ? `${offset + 1}–${last} of ${total.toLocaleString()}` : "no device matches"),
      h("button#next", { type: "button", disabled: last >= total, onclick: () => goTo(offset + size) }, "Next →")));
}
