// Device groups kept by the server: static (a member list) or dynamic (a stored selector, evaluated when used).
// Operators create them here; a rollout targets one as group:NAME.

import { fill, fmtTime, h } from "./dom.js";

export const NAV = "groups";
export const PAGE = "groups";
export const TITLE = "Groups";

export async function mount(main, _args, _params, ctx) {
  const table = h("div#groups-table");
  const create = ctx.can("operator") ? createForm(ctx, () => refresh()) : h("p.muted", "Viewers can list groups; operators create them.");
  fill(main, h("h1", "Device groups"), create, table);
  const refresh = async () => {
    const list = await ctx.api("/groups");
    draw(table, list.groups || []);
  };
  await refresh();
  return { refresh };
}

/** Device ids typed one per line, or separated by commas or spaces. */
export function deviceIds(text) {
  return String(text || "").split(/[\s,]+/).map((d) => d.trim()).filter(Boolean);
}

function createForm(ctx, done) {
  const kind = h("select", { name: "kind" }, h("option", { value: "static" }, "static (members)"),
    h("option", { value: "dynamic" }, "dynamic (query)"));
  const members = h("label#members-field", "Members (device ids)", h("textarea", { name: "members", rows: 2, placeholder: "cam-01, cam-02" }));
  const queryField = h("label#query-field", "Query (selector)", h("input", { name: "query", placeholder: "target=jetson-orin,site=lobby" }));
  const shown = () => { members.hidden = kind.value !== "static"; queryField.hidden = kind.value !== "dynamic"; };
  kind.addEventListener("change", shown);
  const form = h("form.stack.panel#group-form", {
    onsubmit: async (event) => {
      event.preventDefault();
      const data = new FormData(form);
      const body = { name: String(data.get("name") || "").trim(), kind: kind.value,
        description: String(data.get("description") || "").trim() };
      if (kind.value === "static") body.members = deviceIds(data.get("members"));
      else body.query = String(data.get("query") || "").trim();
      try {
        const group = await ctx.api("/groups", { method: "POST", body });
        ctx.flash(`Group ${group.name} created.`, "info");
        form.reset();
        shown();
        await done();
      } catch (err) {
        ctx.flash(err.message);
      }
    },
  },
  h("div.row",
    h("label", "Name", h("input", { name: "name", required: true, placeholder: "lobby-cameras" })),
    h("label", "Kind", kind)),
  members, queryField,
  h("label", "Description", h("input", { name: "description" })),
  h("div.actions", h("button.primary", { type: "submit" }, "Create group")));
  shown();
  return form;
}

function draw(el, groups) {
  if (!groups.length) {
    fill(el, h("p.muted", "No device group yet."));
    return;
  }
  fill(el, h("table",
    h("thead", h("tr", ["Group", "Kind", "Definition", "Devices now", "Description", "Created", "By"].map((c) => h("th", c)))),
    h("tbody", groups.map((g) => h("tr", { dataset: { group: g.name } },
      h("td", h("a", { href: `#/groups/${encodeURIComponent(g.name)}` }, g.name)),
      h("td", g.kind),
      h("td.wrap", g.kind === "dynamic" ? g.query : `${g.members.length} member(s)`),
      h("td", { dataset: { resolved: g.resolved ?? "" } }, g.resolved ?? "unknown"),
      h("td", g.description || ""),
      h("td", fmtTime(g.created_at)),
      h("td", g.created_by || "–"))))));
}
